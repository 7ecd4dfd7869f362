"""What guards the API at the HTTP level: Host allow-list, CORS, the request-body read timeout.

The token checks of the routes are in :mod:`minder.api.deps`; docs/operations.md (*API security*)
says how the settings map onto these.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from fastapi import FastAPI, HTTPException, status
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minder.core.errors import ValidationError

logger = logging.getLogger(__name__)

DEFAULT_BODY_TIMEOUT_S = 30.0
"""How long a request body may stall (no bytes at all) before the request gets 408."""

CORS_METHODS = ("GET", "POST", "PUT", "PATCH")
CORS_HEADERS = ("authorization", "content-type")


class BodyTimeoutError(HTTPException):
    """No part of the request body arrived for ``timeout_s`` seconds (HTTP 408).

    A FastAPI :class:`~fastapi.HTTPException`, so that a route reading a JSON body answers it as
    it is rather than as a body it could not parse; ``Connection: close`` makes the server drop
    the connection, whose body was left half read.
    """

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            status.HTTP_408_REQUEST_TIMEOUT,
            f"the request body stalled: no data for {timeout_s:g} s "
            "(MINDER_API__BODY_TIMEOUT_S); send the complete body without pausing",
            headers={"Connection": "close"},
        )


class BodyTimeoutMiddleware:
    """Bound the wait for each chunk of a request body to ``timeout_s`` seconds.

    The server (uvicorn) has no such timeout: a client that declares a body and stops sending it
    would hold a request, and on an upload a scratch file, for as long as it keeps the connection
    open. Only the body is bounded; what the app awaits after it (a disconnect) is not.
    """

    def __init__(self, app: ASGIApp, timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                logger.warning(
                    "%s %s: the request body stalled for %g s; answering 408",
                    scope.get("method"),
                    scope.get("path"),
                    self.timeout_s,
                )
                raise BodyTimeoutError(self.timeout_s) from None
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


async def _plain_error(send: Send, exc: HTTPException) -> None:
    body = json.dumps({"detail": exc.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
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
) -> None:
    """Add the middlewares, outermost first: Host check, CORS, body timeout.

    ``allowed_hosts`` ``None`` checks no Host; ``cors_origins`` empty allows no cross-origin
    request (a preflight gets 400 and no ``Access-Control-Allow-Origin``).
    """
    if body_timeout_s <= 0:
        raise ValidationError(f"body timeout {body_timeout_s:g} s: expected a positive duration")
    hosts = None if allowed_hosts is None else check_host_patterns(allowed_hosts)
    # add_middleware puts each one outside those added before
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=body_timeout_s)
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
