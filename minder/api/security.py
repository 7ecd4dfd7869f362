"""What guards the API at the HTTP level: Host allow-list, CORS, the request-body read timeout.

The token checks of the routes are in :mod:`minder.api.deps`; docs/operations.md (*API security*)
says how the settings map onto these.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi import FastAPI, HTTPException, status
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minder.core.errors import ValidationError

logger = logging.getLogger(__name__)

DEFAULT_BODY_TIMEOUT_S = 30.0
"""How long a request body may stall (no bytes at all) before the request gets 408."""

DEFAULT_BODY_MIN_RATE = 1024
"""Bytes per second a request body must average once its first ``DEFAULT_BODY_TIMEOUT_S`` are
over (its deadline moves a second later per this many bytes received)."""

CORS_METHODS = ("GET", "POST", "PUT", "PATCH")
CORS_HEADERS = ("authorization", "content-type")


class BodyTimeoutError(HTTPException):
    """The request body stalled (no part of it for ``timeout_s`` seconds), or came slower than
    the minimum rate allows (HTTP 408).

    A FastAPI :class:`~fastapi.HTTPException`, so that a route reading a JSON body answers it as
    it is rather than as a body it could not parse; ``Connection: close`` makes the server drop
    the connection, whose body was left half read.
    """

    def __init__(self, timeout_s: float, *, slow: tuple[int, float, int] | None = None) -> None:
        if slow is None:
            detail = (
                f"the request body stalled: no data for {timeout_s:g} s "
                "(MINDER_API__BODY_TIMEOUT_S); send the complete body without pausing"
            )
        else:
            received, elapsed_s, min_rate = slow
            detail = (
                f"the request body came too slowly: {received} bytes in {elapsed_s:.0f} s, "
                f"expected {min_rate} bytes/s after the first {timeout_s:g} s "
                "(MINDER_API__BODY_MIN_RATE, MINDER_API__BODY_TIMEOUT_S)"
            )
        super().__init__(status.HTTP_408_REQUEST_TIMEOUT, detail, headers={"Connection": "close"})


class BodyTimeoutMiddleware:
    """Bound the wait for a request body: each chunk within ``timeout_s`` seconds, and the whole
    body within ``timeout_s`` plus one second per ``min_rate`` bytes received.

    The server (uvicorn) has no such timeout: a client that declares a body and stops sending it,
    or sends it a byte at a time, would hold a request, and on an upload a scratch file, for as
    long as it keeps the connection open. Only the body is bounded; what the app awaits after it
    (a disconnect) is not.
    """

    def __init__(
        self,
        app: ASGIApp,
        timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        min_rate: int = DEFAULT_BODY_MIN_RATE,
    ) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.min_rate = min_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False
        started = False
        began: float | None = None
        received = 0

        async def timed_receive() -> Message:
            nonlocal body_done, began, received
            if body_done:
                return await receive()
            now = time.monotonic()
            if began is None:
                began = now
            # the body's deadline moves one second later for every min_rate bytes received
            left = began + self.timeout_s + received / self.min_rate - now
            try:
                message = await asyncio.wait_for(receive(), min(self.timeout_s, max(left, 0.0)))
            except TimeoutError:
                elapsed = time.monotonic() - began
                slow = None if left >= self.timeout_s else (received, elapsed, self.min_rate)
                logger.warning(
                    "%s %s: the request body %s; answering 408",
                    scope.get("method"),
                    scope.get("path"),
                    f"stalled for {self.timeout_s:g} s"
                    if slow is None
                    else f"came too slowly ({received} bytes in {elapsed:.0f} s)",
                )
                raise BodyTimeoutError(self.timeout_s, slow=slow) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, watched_send)
        except BodyTimeoutError as exc:
            # raised where no exception handler answers it (outside a route): answer here
            if started:
                raise
            await _plain_error(send, exc)


NO_TOKEN_DETAIL = (
    "changes are disabled on this server: it has no API token. Set MINDER_API__TOKEN on the "
    "server and send 'Authorization: Bearer <token>', or set MINDER_API__OPEN=true to allow "
    "changes without a token"
)
MISSING_TOKEN_DETAIL = "this endpoint needs 'Authorization: Bearer <token>'"
WRONG_TOKEN_DETAIL = "the bearer token is not valid"
MISSING_CHECK_TOKEN_DETAIL = (
    "a self-check report needs 'Authorization: Bearer <the check's token>' "
    "(MINDER_SELFCHECK_TOKEN of the check)"
)
CHANGE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CHECK_TOKEN_PATH = re.compile(r"/api/v1/selfchecks/[^/]+/report")
"""Where a node posts its self-check report: authenticated by the check's own token (compared
by storage), not by the API token, so :class:`EarlyTokenMiddleware` only asks for a bearer
token there."""


def foreign_origin(origin: str | None, host: str, cors_origins: Sequence[str]) -> str | None:
    """Why a change from browser ``origin`` is refused (CSRF), or None: no Origin, an allowed
    one, or the API's own pages (same host)."""
    if origin is None or origin in cors_origins:
        return None
    if origin != "null" and urlsplit(origin).netloc.lower() == host.lower():
        return None  # same origin: the API's own pages (/docs)
    shown = origin if len(origin) <= 80 else origin[:77] + "..."
    return (
        f"cross-origin change from origin {shown!r} refused: expected a request without an "
        "Origin, from this server's own pages, or from an origin of MINDER_API__CORS_ORIGINS"
    )


class EarlyTokenMiddleware:
    """Refuse a change without the right token before its body is read.

    The routes check the token (:func:`minder.api.deps.require_token`), but FastAPI reads a
    request's body before its dependencies run: a client without the token could otherwise
    hold a connection for as long as it trickles a body at the minimum rate. This answers such
    a request at once (401, or 403 when the server has no token and is not open) and closes the
    connection; the routes keep their full check (origin and all).

    A node's self-check report (:data:`CHECK_TOKEN_PATH`) carries its check's own token, not the
    API token: there only a bearer token is required (401 without one); the route has storage
    compare it with the check's.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        open_access: bool,
        cors_origins: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.token = None if token is None else token.encode()
        self.open_access = open_access
        self.cors_origins = list(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in CHANGE_METHODS
            or not scope["path"].startswith("/api/")
        ):
            await self.app(scope, receive, send)
            return
        headers = {k: v for k, v in scope["headers"] if k in (b"origin", b"host", b"authorization")}
        origin = headers.get(b"origin")
        refused = foreign_origin(
            None if origin is None else origin.decode("latin-1"),
            headers.get(b"host", b"").decode("latin-1"),
            self.cors_origins,
        )
        if refused is not None:  # as the route would answer, first (CSRF)
            await _plain_error(send, HTTPException(403, refused))
            return
        given = headers.get(b"authorization")
        scheme, _, credentials = (given or b"").partition(b" ")
        if scope["method"] == "POST" and CHECK_TOKEN_PATH.fullmatch(scope["path"]):
            # a node's report: its check's own token, which the route has storage compare
            if scheme.lower() != b"bearer" or not credentials.strip():
                challenge = {"WWW-Authenticate": "Bearer"}
                await _plain_error(send, HTTPException(401, MISSING_CHECK_TOKEN_DETAIL, challenge))
                return
            await self.app(scope, receive, send)
            return
        if self.token is None and self.open_access:
            await self.app(scope, receive, send)
            return
        if self.token is None:
            await _plain_error(send, HTTPException(403, NO_TOKEN_DETAIL))
            return
        if given is None or scheme.lower() != b"bearer":
            challenge = {"WWW-Authenticate": "Bearer"}
            await _plain_error(send, HTTPException(401, MISSING_TOKEN_DETAIL, challenge))
            return
        if not secrets.compare_digest(credentials.strip(), self.token):
            challenge = {"WWW-Authenticate": 'Bearer error="invalid_token"'}
            await _plain_error(send, HTTPException(401, WRONG_TOKEN_DETAIL, challenge))
            return
        await self.app(scope, receive, send)


async def _plain_error(send: Send, exc: HTTPException) -> None:
    body = json.dumps({"detail": exc.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *((k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def check_host_patterns(allowed_hosts: Sequence[str]) -> list[str]:
    """The Host patterns as :class:`TrustedHostMiddleware` takes them.

    Raises
    ------
    ValidationError
        For an empty list, or a pattern other than ``*``, ``*.domain`` or a host without ``*``.
    """
    if not allowed_hosts:
        raise ValidationError("allowed hosts []: expected at least one host, or '*' for any")
    for pattern in allowed_hosts:
        wildcard = "*" in pattern[1:] or (pattern.startswith("*") and pattern[:2] != "*.")
        if not pattern or (pattern != "*" and wildcard):
            raise ValidationError(
                f"allowed host {pattern!r}: expected a host name or address, a wildcard "
                "'*.example.org', or '*' for any"
            )
    return list(allowed_hosts)


def install_http_guards(
    app: FastAPI,
    *,
    allowed_hosts: Sequence[str] | None,
    cors_origins: Sequence[str],
    body_timeout_s: float,
    body_min_rate: int = DEFAULT_BODY_MIN_RATE,
    api_token: str | None = None,
    open_access: bool = False,
) -> None:
    """Add the middlewares, outermost first: Host check, CORS, body timeout, the early token
    check of changes.

    ``allowed_hosts`` ``None`` checks no Host; ``cors_origins`` empty allows no cross-origin
    request (a preflight gets 400 and no ``Access-Control-Allow-Origin``).
    """
    if body_timeout_s <= 0:
        raise ValidationError(f"body timeout {body_timeout_s:g} s: expected a positive duration")
    if body_min_rate < 1:
        raise ValidationError(f"body minimum rate {body_min_rate}: expected at least 1 byte/s")
    hosts = None if allowed_hosts is None else check_host_patterns(allowed_hosts)
    # add_middleware puts each one outside those added before
    app.add_middleware(
        EarlyTokenMiddleware, token=api_token, open_access=open_access, cors_origins=cors_origins
    )
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=body_timeout_s, min_rate=body_min_rate)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(cors_origins),
        allow_methods=list(CORS_METHODS),
        allow_headers=list(CORS_HEADERS),
        allow_credentials=False,
        max_age=600,
    )
    if hosts is not None and "*" not in hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False)
