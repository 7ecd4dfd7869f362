"""The API's HTTP server: uvicorn (h11) with the bounds a client must not get past.

uvicorn has no timeout for a request head, and counts a connection against its
``limit_concurrency`` only once its request is complete: a client that opens connections and
trickles header bytes holds one file descriptor each for as long as it likes. Past the process's
open-file limit ``accept`` fails with EMFILE, and asyncio reports that through the log handler,
which itself needs a file to import the module that formats tracebacks: the exception escaped the
event loop and ended the API thread, with the process still running. This module adds:

- a **header timeout**: a connection whose request head (request line and headers) is not
  complete ``header_timeout_s`` after it opened, or after the first byte of its next request
  on a kept-alive connection, gets 408 and is closed;
- a **connection bound** below the open-file limit (:func:`resolve_max_connections`): past it, a
  new connection closes the one that has waited longest for its request head (a trickling client,
  or an idle kept-alive one), and gets 503 itself only when every connection is busy with a
  request, so that ``/health`` keeps answering while slow clients hold the rest;
- an **event-loop exception handler** that reports a failed ``accept`` in one rate-limited line
  and never raises (asyncio retries the accept a second later).

docs/operations.md (*API security*) says how the settings map onto these.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from minder.core.errors import ValidationError

logger = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 10.0
"""How long a connection may take to send its request head."""

MAX_CONNECTIONS_CAP = 4096
"""Most connections the default bound allows, whatever the open-file limit: the API serves
operators, Prometheus and probes, a few dozen clients; each idle connection costs memory."""

FILE_RESERVE_MIN = 64
"""Fewest open files the connection bound leaves to the rest of the process (the database
pool, Kafka clients, webhooks, what-if uploads, the files Python itself opens)."""

LISTEN_BACKLOG = 2048
"""Connections the kernel queues for the server to accept (at most ``net.core.somaxconn``): a
queued connection holds no file of the process, and a longer queue spares a client arriving
in a flood the seconds of a dropped handshake."""

REPORT_EVERY_S = 60.0
"""Connections closed by the bounds are logged at most once per this many seconds."""

_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def open_file_limit() -> int | None:
    """The process's soft limit of open files (``ulimit -n``), ``None`` when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def file_reserve(limit: int) -> int:
    """Open files the connection bound leaves to the rest of the process: a quarter of the
    limit, at least :data:`FILE_RESERVE_MIN`."""
    return max(FILE_RESERVE_MIN, limit // 4)


def resolve_max_connections(configured: int | None, limit: int | None) -> int:
    """The connection bound: ``configured`` when given, else derived from the open-file ``limit``
    (the limit less :func:`file_reserve`, at most :data:`MAX_CONNECTIONS_CAP`).

    Raises
    ------
    ValidationError
        For a ``configured`` bound that leaves fewer than :data:`FILE_RESERVE_MIN` files of the
        limit, or a limit too low to leave any connection.
    """
    if limit is None:
        return configured if configured is not None else MAX_CONNECTIONS_CAP
    room = limit - FILE_RESERVE_MIN
    if configured is not None:
        if configured > room:
            raise ValidationError(
                f"API max connections {configured} (MINDER_API__MAX_CONNECTIONS): expected at "
                f"most {max(room, 0)} with this process's open-file limit {limit} (ulimit -n, "
                f"LimitNOFILE=), which leaves {FILE_RESERVE_MIN} files to the database, Kafka "
                "and uploads; raise the limit or lower the setting"
            )
        return configured
    derived = min(MAX_CONNECTIONS_CAP, limit - file_reserve(limit))
    if derived < 1:
        raise ValidationError(
            f"open-file limit {limit} (ulimit -n, LimitNOFILE=): expected at least "
            f"{FILE_RESERVE_MIN + 1} so that the API can hold a connection; raise the limit"
        )
    return derived


def _raw_response(status: int, reason: str, detail: str) -> bytes:
    """A complete HTTP/1.1 response closing its connection, written without h11 (whose state
    does not allow a response before a request head)."""
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass(eq=False)
class ConnectionGuard:
    """The bounds shared by the connections of one server.

    Attributes
    ----------
    max_connections
        Connections held at once (open, not yet closed).
    header_timeout_s
        Seconds a connection may take to send a request head.
    """

    max_connections: int
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    waiting: OrderedDict[GuardedH11Protocol, None] = field(default_factory=OrderedDict)
    """The connections waiting for a request head, longest waiting first."""
    closed: dict[str, int] = field(
        default_factory=lambda: {"timed_out": 0, "evicted": 0, "refused": 0}
    )
    """Connections closed by the bounds since the last report, by reason."""
    _report: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValidationError(
                f"API max connections {self.max_connections}: expected at least 1"
            )
        if not self.header_timeout_s > 0:
            raise ValidationError(
                f"API header timeout {self.header_timeout_s:g} s: expected a positive duration"
            )

    def admit(self, newcomer: GuardedH11Protocol) -> bool:
        """Whether ``newcomer`` (already counted among the connections) may stay: yes under the
        bound; past it, yes after closing the connection that has waited longest for its
        request head; no when every other connection is busy with a request."""
        if len(newcomer.connections) <= self.max_connections:
            return True
        while self.waiting:
            oldest, _ = self.waiting.popitem(last=False)
            if oldest.close_with(
                503,
                "Service Unavailable",
                "the API is at its connection limit (MINDER_API__MAX_CONNECTIONS="
                f"{self.max_connections}) and this connection had sent no complete request",
            ):
                self.count("evicted")
                return True
        self.count("refused")
        return False

    def count(self, reason: str) -> None:
        """Note a connection closed by the bounds; the first is logged at once, the others
        in one line per :data:`REPORT_EVERY_S`."""
        self.closed[reason] += 1
        if self._report is None:
            self.report()
            loop = asyncio.get_running_loop()
            self._report = loop.call_later(REPORT_EVERY_S, self._report_again)

    def _report_again(self) -> None:
        self._report = None
        if any(self.closed.values()):
            self.report()
            self._report = asyncio.get_running_loop().call_later(REPORT_EVERY_S, self._report_again)

    def report(self) -> None:
        counts = self.closed
        if not any(counts.values()):
            return
        logger.warning(
            "API connections closed: %d whose request head took over %g s "
            "(MINDER_API__HEADER_TIMEOUT_S), %d still without a request when the %d-connection "
            "limit was reached (MINDER_API__MAX_CONNECTIONS), %d refused with 503 while every "
            "connection was busy",
            counts["timed_out"],
            self.header_timeout_s,
            counts["evicted"],
            self.max_connections,
            counts["refused"],
        )
        self.closed = dict.fromkeys(counts, 0)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header timeout and the connection bound of
    :attr:`guard` (set on the subclass :func:`guarded_protocol` makes per server).

    A connection waits for a request head from when it opens, and again from when its last
    response is complete (idle keep-alive). The header timer starts when it opens, and after a
    response at the first byte of the next request (uvicorn's keep-alive timeout closes a
    connection that stays silent). A waiting connection is the first to go past the bound.
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle = False
        """A response was complete and no byte of a next request has come since."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.guard.admit(self):
            self.close_with(
                503,
                "Service Unavailable",
                "the API is at its connection limit (MINDER_API__MAX_CONNECTIONS="
                f"{self.guard.max_connections}) with every connection busy; retry",
            )
            return
        self._await_head()
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        self._idle = False
        if self in self.guard.waiting and self._head_timer is None:
            self._arm_head_timer()
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head arrived: its request/response cycle
            self._head_received()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._idle = True
            self._await_head()  # before uvicorn handles a pipelined request
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_received()
        super().connection_lost(exc)

    def close_with(self, status: int, reason: str, detail: str) -> bool:
        """Answer ``status`` and close the connection; ``False`` when it was closing already.

        An idle kept-alive connection is closed without an answer, as its keep-alive timeout
        would: a request the client sends meanwhile must not read it as its response.
        """
        self._head_received()
        if self.transport.is_closing():
            return False
        if self._idle:
            self.transport.close()
            return True
        self.transport.write(_raw_response(status, reason, detail))
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # a client that reads nothing keeps no buffer here
        else:
            self.transport.close()
        return True

    def _await_head(self) -> None:
        self.guard.waiting[self] = None

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.guard.header_timeout_s, self._head_timeout)

    def _head_received(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        timeout = self.guard.header_timeout_s
        if self.close_with(
            408,
            "Request Timeout",
            f"the request head did not arrive within {timeout:g} s "
            "(MINDER_API__HEADER_TIMEOUT_S); send the request line and headers at once",
        ):
            self.guard.count("timed_out")


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    """A protocol class whose connections share ``guard`` (one per server)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


class _AcceptFailures:
    """Logs a failed ``accept`` (out of files) at most once per :data:`REPORT_EVERY_S`."""

    def __init__(self) -> None:
        self.last = -REPORT_EVERY_S
        self.missed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
            now = time.monotonic()
            if now - self.last < REPORT_EVERY_S:
                self.missed += 1
                return
            self.last, missed, self.missed = now, self.missed, 0
            logger.warning(
                "the API cannot accept a connection: %s (open-file limit %s; %d more since the "
                "last report); it retries every second: lower MINDER_API__MAX_CONNECTIONS or "
                "raise the limit (LimitNOFILE=)",
                exc,
                open_file_limit() or "unlimited",
                missed,
            )
            return
        # a log handler that fails (out of files) must not end the loop
        with contextlib.suppress(Exception):
            loop.default_exception_handler(context)


class ApiServer(uvicorn.Server):
    """uvicorn's server whose event loop survives running out of files (``accept`` retries),
    listening with a queue of :data:`LISTEN_BACKLOG` connections while it accepts only
    ``config.backlog`` of them per pass of its loop."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(_AcceptFailures())
        await super().startup(sockets=sockets)
        for server in getattr(self, "servers", ()):
            for listening in server.sockets:
                # asyncio gives one number for both; the kernel's queue costs no file
                with socket.fromfd(listening.fileno(), listening.family, listening.type) as dup:
                    dup.listen(LISTEN_BACKLOG)

    def bound_port(self) -> int | None:
        """The TCP port listened on (the one the system chose for port 0), once started."""
        for server in getattr(self, "servers", ()):
            for listening in server.sockets:
                return int(listening.getsockname()[1])
        return None


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How the server bounds its clients (docs/operations.md, *API security*)."""

    max_connections: int
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: int = 5
    accept_batch: int = 2048
    """The most connections asyncio accepts in one pass of its loop, before their protocols
    can close any (:func:`accept_batch`)."""


def accept_batch(max_connections: int, limit: int | None) -> int:
    """Connections accepted per pass of the loop, few enough that a burst accepted before any
    is closed stays within the files the bound leaves free: an eighth of them (8 to 2048), as a
    connection closed past the bound frees its file about three passes after it was accepted."""
    free = 2**20 if limit is None else max(limit - max_connections, 0)
    return max(8, min(2048, free // 8))


def api_server(app: Any, *, host: str, port: int, limits: ServerLimits) -> ApiServer:
    """The server of ``app`` on ``host:port``, with ``limits``."""
    guard = ConnectionGuard(limits.max_connections, limits.header_timeout_s)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(guard),
        ws="none",  # the API has no WebSocket route
        log_level="warning",
        access_log=False,
        log_config=None,  # uvicorn's loggers go through Minder's handler (minder.logging_setup)
        # idle keep-alive connections close; a stalled request body is the app's 408
        # (MINDER_API__BODY_TIMEOUT_S)
        timeout_keep_alive=limits.keep_alive_s,
        # asyncio accepts this many per pass; ApiServer lengthens the kernel's queue after
        backlog=limits.accept_batch,
        server_header=False,
    )
    return ApiServer(config)
