"""What the API tests share: the token of their apps, and a real server on a loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

TOKEN = "test-api-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def uvicorn_serving(app: Any, **config: Any) -> Iterator[int]:
    """Serve ``app`` with uvicorn on a free loopback port (in a thread); yields the port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config)
    )
    with running(server):
        yield port


@contextmanager
def running(server: uvicorn.Server) -> Iterator[None]:
    """Run ``server`` in a thread until the block ends; fail if it does not start in 10 s."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
