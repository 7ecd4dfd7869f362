"""Dependencies of the routes: the app's context (settings), a DB session, bearer-token auth."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry

from minder.api.whatif_inputs import ScratchSpace
from minder.api.whatif_runner import WhatIfRunner
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
    """

    runner: WhatIfRunner
    roots: tuple[Path, ...] | None
    scratch: ScratchSpace
    max_upload_bytes: int


@dataclass(frozen=True, slots=True)
class ApiContext:
    """What :func:`~minder.api.app.create_app` was given; the routes' settings."""

    session_factory: SessionFactory
    registry: CollectorRegistry
    readiness: Callable[[], Mapping[str, bool]] | None
    api_token: str | None
    version: str
    whatif: WhatIfContext
    destinations: tuple[Destination, ...] = ()
    on_enqueued: Callable[[], None] | None = None

    def enqueued(self) -> None:
        """Outbox rows were committed: wake the delivery workers."""
        if self.on_enqueued is not None:
            self.on_enqueued()


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

_bearer = HTTPBearer(auto_error=False, description="the API token, when the server has one")


def require_token(
    context: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Refuse a mutating request without ``Authorization: Bearer <token>`` when a token is set."""
    if context.api_token is None:
        return
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "this endpoint needs 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(credentials.credentials.encode(), context.api_token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "the bearer token is not valid",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
