"""The API's HTTP server cannot be starved: a request head must arrive within the header
timeout, connections are bounded below the open-file limit (the one waiting longest for its head
makes room, 503 when all are busy), and running out of files does not end its event loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from api_testing import free_port, running
from fastapi import FastAPI

from minder.api.server import (
    FILE_RESERVE_MIN,
    MAX_CONNECTIONS_CAP,
    ApiServer,
    ServerLimits,
    accept_batch,
    api_server,
    resolve_max_connections,
)
from minder.core.errors import ValidationError

HEADER_TIMEOUT_S = 0.6


def small_app() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/wait")
    async def wait() -> dict[str, str]:
        await asyncio.sleep(2.0)
        return {"status": "waited"}

    return app


@contextmanager
def serving(limits: ServerLimits) -> Iterator[int]:
    """:func:`api_server` of :func:`small_app` on a free loopback port, in a thread."""
    port = free_port()
    server = api_server(small_app(), host="127.0.0.1", port=port, limits=limits)
    with running(server):
        yield port


def read_until_closed(sock: socket.socket, wait_s: float) -> tuple[float, bytes]:
    """Everything ``sock`` receives until the server closes it, and the seconds that took
    (``wait_s`` when it did not)."""
    sock.settimeout(wait_s)
    started = time.monotonic()
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except TimeoutError:
        return wait_s, answer
    except ConnectionResetError:
        pass
    return time.monotonic() - started, answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def detail_of(answer: bytes) -> str:
    return str(json.loads(answer.partition(b"\r\n\r\n")[2])["detail"])


# -- the bound derived from the open-file limit ----------------------------------------------


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(256, 192), (1024, 768), (4096, 3072), (65536, MAX_CONNECTIONS_CAP), (None, 4096), (100, 36)],
)
def test_the_default_bound_leaves_a_quarter_of_the_files(limit: int | None, expected: int) -> None:
    assert resolve_max_connections(None, limit) == expected


def test_a_configured_bound_is_kept_when_it_leaves_the_reserve() -> None:
    assert resolve_max_connections(900, 1024) == 900
    assert resolve_max_connections(1024 - FILE_RESERVE_MIN, 1024) == 1024 - FILE_RESERVE_MIN
    assert resolve_max_connections(50_000, None) == 50_000


def test_a_configured_bound_past_the_file_limit_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError) as refused:
        resolve_max_connections(1000, 1024)
    message = str(refused.value)
    assert "MINDER_API__MAX_CONNECTIONS" in message and "1000" in message
    assert "open-file limit 1024" in message and "at most 960" in message


def test_a_file_limit_too_low_for_any_connection_is_refused() -> None:
    with pytest.raises(
        ValidationError,
        match=r"open-file limit 64 \(ulimit -n, LimitNOFILE=\): expected at least 65",
    ):
        resolve_max_connections(None, 64)


def test_the_accept_batch_fits_the_files_left_free() -> None:
    assert accept_batch(192, 256) == 8
    assert accept_batch(768, 1024) == 32
    assert accept_batch(4096, 65536) == 2048
    assert accept_batch(960, 1024) == 8  # at least 8


# -- the header timeout ----------------------------------------------------------------------


def trickle_header_lines(sock: socket.socket, lines: int = 3, every_s: float = 0.3) -> None:
    """A header line every ``every_s`` seconds, never the blank line that ends the head (until
    the server closes the connection)."""
    for _ in range(lines):
        time.sleep(every_s)
        try:
            sock.sendall(b"X-Trickle: 1\r\n")
        except OSError:
            break


def test_a_head_that_trickles_gets_408_at_the_header_timeout() -> None:
    limits = ServerLimits(max_connections=16, header_timeout_s=HEADER_TIMEOUT_S)
    with serving(limits) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        trickle_header_lines(sock)
        elapsed, answer = read_until_closed(sock, 5.0)
    assert status_of(answer) == 408, answer
    assert "MINDER_API__HEADER_TIMEOUT_S" in detail_of(answer)
    assert elapsed < 1.0  # counted from the connection, not from the last line


def test_a_connection_that_sends_nothing_gets_408() -> None:
    limits = ServerLimits(max_connections=16, header_timeout_s=HEADER_TIMEOUT_S)
    with serving(limits) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        elapsed, answer = read_until_closed(sock, 5.0)
    assert status_of(answer) == 408
    assert HEADER_TIMEOUT_S - 0.1 < elapsed < HEADER_TIMEOUT_S + 1.0


def test_requests_on_a_kept_alive_connection_each_get_their_own_header_timeout() -> None:
    limits = ServerLimits(max_connections=16, header_timeout_s=HEADER_TIMEOUT_S)
    with serving(limits) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        answers = []
        for _ in range(4):  # 4 x 0.4 s: longer than one header timeout on one connection
            answers.append(client.get("/health").status_code)
            time.sleep(0.4)
        assert answers == [200] * 4
        assert client.get("/wait").json() == {"status": "waited"}  # a slow app is not a slow head


def test_the_next_head_trickled_on_a_kept_alive_connection_gets_408() -> None:
    limits = ServerLimits(max_connections=16, header_timeout_s=HEADER_TIMEOUT_S, keep_alive_s=5)
    with serving(limits) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(5)
        response = b""
        while not response.endswith(b'{"status":"ok"}'):
            response += sock.recv(65536)
        assert response.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        trickle_header_lines(sock)
        elapsed, answer = read_until_closed(sock, 5.0)
    assert status_of(answer) == 408, answer
    assert elapsed < 1.0


# -- the connection bound --------------------------------------------------------------------


def test_past_the_bound_the_connection_waiting_longest_for_its_head_makes_room() -> None:
    limits = ServerLimits(max_connections=4, header_timeout_s=30.0)
    with serving(limits) as port:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            time.sleep(0.2)  # all four accepted, oldest first
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            assert health.status_code == 200
            _, evicted = read_until_closed(silent[0], 2.0)
            assert status_of(evicted) == 503
            assert "MINDER_API__MAX_CONNECTIONS=4" in detail_of(evicted)
            assert "no complete request" in detail_of(evicted)
            for kept in silent[1:]:
                kept.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    kept.recv(1)
        finally:
            for sock in silent:
                sock.close()


def test_an_idle_kept_alive_connection_making_room_is_closed_without_an_answer() -> None:
    limits = ServerLimits(max_connections=2, header_timeout_s=30.0, keep_alive_s=30)
    with serving(limits) as port, socket.create_connection(("127.0.0.1", port)) as kept:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        kept.settimeout(5)
        response = b""
        while not response.endswith(b'{"status":"ok"}'):
            response += kept.recv(65536)
        assert response.startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(("127.0.0.1", port)) as silent:
            time.sleep(0.2)
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            assert health.status_code == 200
            _, answer = read_until_closed(kept, 2.0)
            assert answer == b""  # closed, as its keep-alive timeout would
            silent.settimeout(0.2)
            with pytest.raises(TimeoutError):
                silent.recv(1)


def test_past_the_bound_with_every_connection_busy_a_new_one_gets_503() -> None:
    limits = ServerLimits(max_connections=3, header_timeout_s=30.0)
    with serving(limits) as port:
        url = f"http://127.0.0.1:{port}"
        busy = [threading.Thread(target=httpx.get, args=(f"{url}/wait",)) for _ in range(3)]
        for thread in busy:
            thread.start()
        time.sleep(0.5)  # the three requests are in the app
        with socket.create_connection(("127.0.0.1", port)) as sock:
            elapsed, answer = read_until_closed(sock, 5.0)
        assert status_of(answer) == 503, answer
        assert "every connection busy" in detail_of(answer)
        assert elapsed < 0.5
        for thread in busy:
            thread.join(10)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_the_bounds_are_logged_once_then_summarised(caplog: pytest.LogCaptureFixture) -> None:
    limits = ServerLimits(max_connections=2, header_timeout_s=30.0)
    with caplog.at_level(logging.WARNING, "minder.api.server"), serving(limits) as port:
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        time.sleep(0.5)
        for sock in socks:
            sock.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "minder.api.server"]
    assert len(lines) == 1, lines  # the others wait for the next report, a minute later
    assert "1 still without a request when the 2-connection limit was reached" in lines[0]


def test_the_server_has_no_websocket_protocol_and_a_long_listen_queue() -> None:
    server = api_server(small_app(), host="127.0.0.1", port=0, limits=ServerLimits(8))
    assert isinstance(server, ApiServer)
    assert server.config.ws == "none" and server.config.backlog == 2048
    batch = api_server(
        small_app(), host="127.0.0.1", port=0, limits=ServerLimits(8, accept_batch=8)
    )
    assert batch.config.backlog == 8


# -- out of files ----------------------------------------------------------------------------

OUT_OF_FILES_SERVER = """
import logging
import sys
from fastapi import FastAPI
from minder.api.server import ServerLimits, api_server
from minder.logging_setup import configure_logging

configure_logging("INFO")
logging.getLogger("server").info("starting")  # as minder serve logs before serving
app = FastAPI()

@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}

# a bound far past the file limit: accept runs out of files
limits = ServerLimits(max_connections=10_000, header_timeout_s=3.0, accept_batch=64)
api_server(app, host="127.0.0.1", port=int(sys.argv[1]), limits=limits).run()
"""


def _files(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


@pytest.mark.slow
def test_running_out_of_files_does_not_end_the_server(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-c", OUT_OF_FILES_SERVER, str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "400"},
            preexec_fn=lambda: _files(128),  # noqa: PLW1509  (setrlimit only)
        )
    clients: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        for _ in range(300):  # more than the server has files for
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            clients.append(sock)
        time.sleep(2.0)
        for sock in clients:
            sock.close()
        # the held connections time out (3 s); accept resumes within a second of a free file
        answered = None
        deadline = time.monotonic() + 15
        while answered != 200 and time.monotonic() < deadline:
            try:
                answered = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            except httpx.HTTPError:
                time.sleep(0.2)
        text = log.read_text()
        assert server.poll() is None, text
        assert answered == 200, text
        assert "the API cannot accept a connection: [Errno 24]" in text
        assert text.count("cannot accept a connection") == 1  # then once a minute at most
        assert "Traceback" not in text, text
    finally:
        for sock in clients:
            sock.close()
        server.terminate()
        server.wait(10)
