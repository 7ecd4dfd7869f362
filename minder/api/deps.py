"""Dependencies of the routes: the app's context (settings), a DB session, bearer-token auth."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry

from minder.api.schemas import InvalidInput, Problem
from minder.api.security import (
    MISSING_CHECK_TOKEN_DETAIL,
    MISSING_TOKEN_DETAIL,
    NO_TOKEN_DETAIL,
    WRONG_TOKEN_DETAIL,
    foreign_origin,
)
from minder.service.whatif_inputs import ScratchSpace, relative_to_roots
from minder.service.whatif_runner import WhatIfRunner
from minder.storage import Session, SessionFactory
from minder.storage.engine import read_only
from minder.storage.outbox import Destination


@dataclass(frozen=True, slots=True)
class WhatIfContext:
    """How the what-if endpoints take traces and where they run them.

    Attributes
    ----------
    runner
        Runs the analyses in the background and stores their reports.
    roots
        Directories whose files ``{"path": …}`` submissions may name (resolved); ``None``
        disables server paths.
    scratch
        Where uploads are saved until their analysis is over.
    max_upload_bytes
        Largest upload request body accepted.
    shown_roots
        The roots as configured and resolved: paths under them are shown to clients relative
        to them (:meth:`relative`).
    """

    runner: WhatIfRunner
    roots: tuple[Path, ...] | None
    scratch: ScratchSpace
    max_upload_bytes: int
    shown_roots: tuple[Path, ...] = ()

    def relative(self, message: str) -> str:
        """``message`` with the server paths under the roots written relative to them."""
        return relative_to_roots(message, self.shown_roots)


@dataclass(frozen=True, slots=True)
class ApiContext:
    """What :func:`~minder.api.app.create_app` was given; the routes' settings.

    Attributes
    ----------
    api_token
        The bearer token of changes and of the ``/api/v1`` reads (``/health``, ``/ready``,
        ``/metrics`` need none); ``None``: changes are refused (403) unless ``open_access``, and
        reads are served to loopback clients only unless ``open_reads``.
    open_access
        Without a token, changes and reads are allowed to anyone (the operator's explicit
        choice).
    open_reads
        Without a token, reads are served to any client, not only to loopback ones.
    cors_origins
        Browser origins allowed cross-origin requests; a change from another origin is refused.
    selfcheck_wake
        Called after a request changed a self-check (a node's report, an operator's request or
        cancel, committed): wakes the service's self-check loop to act on it now.
    """

    session_factory: SessionFactory
    registry: CollectorRegistry
    readiness: Callable[[], Mapping[str, bool]] | None
    api_token: str | None
    version: str
    whatif: WhatIfContext
    destinations: tuple[Destination, ...] = ()
    on_enqueued: Callable[[], None] | None = None
    open_access: bool = False
    open_reads: bool = False
    cors_origins: tuple[str, ...] = ()
    selfcheck_wake: Callable[[], None] | None = None

    def enqueued(self) -> None:
        """Outbox rows were committed: wake the delivery workers."""
        if self.on_enqueued is not None:
            self.on_enqueued()

    def wake_selfchecks(self) -> None:
        """A self-check changed (committed): wake the service's self-check loop."""
        if self.selfcheck_wake is not None:
            self.selfcheck_wake()


def get_context(request: Request) -> ApiContext:
    """The context of the app serving ``request``."""
    context: ApiContext = request.app.state.minder
    return context


Context = Annotated[ApiContext, Depends(get_context)]


def get_session(context: Context, request: Request) -> Iterator[Session]:
    """A session for one request; routes that write commit it themselves.

    Reads (GET, HEAD) get a read-only session, which on SQLite never holds the write lock.
    """
    with context.session_factory() as session:
        if request.method in ("GET", "HEAD"):
            read_only(session)
        yield session


DbSession = Annotated[Session, Depends(get_session)]

MAX_OFFSET = 2**63 - 1
"""Largest ``offset`` of a listing: what a database's 64-bit integer holds."""
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="items to skip")]
"""The ``offset`` query parameter of the paged listings."""

_bearer = HTTPBearer(auto_error=False, description="the API token (MINDER_API__TOKEN)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


MUTATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "a body that cannot be read (not UTF-8 JSON)"},
    401: {"model": Problem, "description": "missing or wrong bearer token"},
    403: {
        "model": Problem,
        "description": "changes disabled (the server has no token and is not open), or a "
        "cross-origin request from an origin not allowed",
    },
}
"""The answers of :func:`require_token`, for the OpenAPI document of a mutating route."""

NO_TOKEN_READ_DETAIL = (
    "reads from other hosts are disabled on this server: it has no API token. Set "
    "MINDER_API__TOKEN on the server and send 'Authorization: Bearer <token>', or set "
    "MINDER_API__OPEN_READS=true to serve reads to any client"
)

READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {
        "model": Problem,
        "description": "missing or wrong bearer token (the server has a token)",
    },
    403: {
        "model": Problem,
        "description": "a client other than loopback, and the server has no token and does not "
        "open its reads",
    },
    422: {"model": InvalidInput, "description": "a parameter or body the API cannot take"},
}
"""The answers every resource operation may give: :func:`require_read_access`'s, and 422 in
both its forms (FastAPI's list of bad fields, Minder's one message)."""


def _check_bearer(token: str, credentials: HTTPAuthorizationCredentials | None) -> None:
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            MISSING_TOKEN_DETAIL,
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            WRONG_TOKEN_DETAIL,
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


def _refuse_foreign_origin(request: Request, context: ApiContext) -> None:
    """A browser's change from another site (its ``Origin``) is refused unless allowed (CSRF)."""
    refused = foreign_origin(
        request.headers.get("origin"), request.headers.get("host", ""), context.cors_origins
    )
    if refused is not None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, refused)


def require_token(request: Request, context: Context, credentials: Credentials) -> None:
    """Guard a mutating endpoint.

    With a token, ``Authorization: Bearer <token>`` is needed (401 otherwise); without one, the
    change is refused (403) unless the server is open. Either way a browser request from an
    origin other than the API's own or an allowed one is refused (403).
    """
    _refuse_foreign_origin(request, context)
    if context.api_token is not None:
        _check_bearer(context.api_token, credentials)
    elif not context.open_access:
        raise HTTPException(status.HTTP_403_FORBIDDEN, NO_TOKEN_DETAIL)


def is_loopback(request: Request) -> bool:
    """Whether ``request`` comes from this machine (127.0.0.0/8, ``::1``, ``::ffff:127.x``).

    Behind a proxy on the same machine that sets ``X-Forwarded-For``, the server (uvicorn)
    puts the forwarded client address here; docs/operations.md (*API security*) says more.
    """
    client = request.client
    if client is None:
        return False
    try:
        address = ipaddress.ip_address(client.host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def require_read_access(request: Request, context: Context, credentials: Credentials) -> None:
    """Guard a read: with a token, ``Authorization: Bearer <token>`` is needed (401 otherwise);
    without one, a client other than loopback is refused (403) unless reads are open.

    It guards every route of the resource routers, changes too (which :func:`require_token`
    guards after it): a change from a foreign origin is refused as such first.
    """
    if request.method not in ("GET", "HEAD"):
        _refuse_foreign_origin(request, context)
    if context.api_token is not None:
        _check_bearer(context.api_token, credentials)
    elif not context.open_reads and not is_loopback(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, NO_TOKEN_READ_DETAIL)


_check_bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="SelfCheckToken",
    description="a self-check's one-time token (MINDER_SELFCHECK_TOKEN of the check), not the "
    "API token",
)


def check_token(
    request: Request,
    context: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_check_bearer_scheme)],
) -> str:
    """The bearer token of a self-check's report: the check's own one-time secret, not the API
    token (storage compares it with the check's, :func:`~minder.storage.selfchecks.accept_report`).

    Only its presence is checked here (401 without one), and a browser's request from a foreign
    origin is refused (403), before the body is read. The token is never logged.
    """
    _refuse_foreign_origin(request, context)
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            MISSING_CHECK_TOKEN_DETAIL,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return credentials.credentials


CheckToken = Annotated[str, Depends(check_token)]
"""The self-check token of a report (:func:`check_token`)."""
