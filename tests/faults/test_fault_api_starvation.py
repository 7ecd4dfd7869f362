"""The API cannot be starved: ``minder serve`` under a low open-file limit, held by 2,000
connections that trickle their request headers, keeps answering ``/health``, closes every slow
connection once its header timeout is over, and is whole after the attack.

Before the header timeout and the connection bound, 1,100 such connections under the systemd
default of 1,024 files ended the API thread (EMFILE) with the process still running.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from fault_harness import Figures, broker_unavailable
from server_process import log_tail, stop_process, wait_http_ready

from minder.core.signing import init_cluster_keys
from minder.stream.broker import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FILE_LIMIT = 256
"""The service's open-file limit (soft and hard)."""
BOUND = 192
"""The connections it holds at that limit by default: three quarters."""
ATTACKERS = 2000
HEADER_TIMEOUT_S = 4.0
CHURN_S = 1.5 * HEADER_TIMEOUT_S
"""How long closed connections are replaced; then those held are left to time out."""
SLACK_S = 3.0
"""Beyond the header timeout, how late a slow connection may be closed (a loaded machine)."""
HOLD_S = HEADER_TIMEOUT_S + SLACK_S


@dataclass
class Slow:
    """One attacking connection: when it connected, when it was closed and by whom, what the
    server answered."""

    sock: socket.socket
    connected: float | None = None
    closed: float | None = None
    by_server: bool = False
    answer: bytes = b""


@dataclass
class SlowClients:
    """``count`` connections that each send a request line and then one header line a second,
    never ending their head. While :attr:`reconnect` holds, one the server closes is replaced a
    second later (an attacker keeping the pressure on)."""

    port: int
    count: int
    reconnect: bool = True
    done: list[Slow] = field(default_factory=list)
    live: dict[int, Slow] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def _open(self, selector: selectors.BaseSelector) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", self.port))
        self.live[sock.fileno()] = Slow(sock)
        selector.register(sock, selectors.EVENT_WRITE)

    def _close(self, selector: selectors.BaseSelector, slow: Slow, *, by_server: bool) -> None:
        selector.unregister(slow.sock)
        del self.live[slow.sock.fileno()]
        slow.sock.close()
        slow.closed, slow.by_server = time.monotonic(), by_server
        self.done.append(slow)

    def _send(self, selector: selectors.BaseSelector, slow: Slow, data: bytes) -> None:
        try:
            slow.sock.send(data)
        except OSError:
            self._close(selector, slow, by_server=True)  # reset by the server

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        reopen: list[float] = []
        for _ in range(self.count):
            self._open(selector)
        last_line = time.monotonic()
        while not self.stop.is_set():
            for key, _ in selector.select(timeout=0.1):
                slow = self.live.get(key.fd)
                if slow is None:
                    continue
                if slow.connected is None:
                    if slow.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self._close(selector, slow, by_server=True)  # refused
                    else:
                        slow.connected = time.monotonic()
                        selector.modify(slow.sock, selectors.EVENT_READ)
                        self._send(selector, slow, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                else:
                    with contextlib.suppress(OSError):  # reset: no answer
                        slow.answer += slow.sock.recv(4096)
                    self._close(selector, slow, by_server=True)
                if slow.closed is not None:
                    reopen.append(time.monotonic() + 1)
            now = time.monotonic()
            if now - last_line >= 1:
                last_line = now
                for slow in [s for s in self.live.values() if s.connected is not None]:
                    self._send(selector, slow, b"X-Trickle: 1\r\n")
            due = [at for at in reopen if at <= now]
            reopen = [at for at in reopen if at > now]
            for _ in due if self.reconnect else ():
                self._open(selector)
        for slow in list(self.live.values()):
            self._close(selector, slow, by_server=False)
        selector.close()


@pytest.fixture
def client_files() -> object:
    """This test process's own open-file limit raised for its thousands of client sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * ATTACKERS
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the open-file hard limit {hard} is below the {wanted} the clients need")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield None
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def api_connections(pid: int, port: int) -> int:
    """The connections process ``pid`` holds on its port ``port`` (each a file)."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN
    )


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


def test_slow_headers_under_a_low_file_limit_neither_starve_nor_kill_the_api(
    tmp_path: Path, client_files: object, figures: Figures
) -> None:
    reason = broker_unavailable()
    if reason is not None:
        pytest.skip(f"no embedded Kafka broker: {reason}")
    keys = tmp_path / "cluster.keys"
    init_cluster_keys(keys, "starvation")
    api_port, broker_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env |= {
        "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'minder.db'}",
        "MINDER_AUTH__KEYS_FILE": str(keys),
        "MINDER_API__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "COLUMNS": "400",  # one log record a line
    }
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "minder.cli", "serve", "--embedded-broker"]
    command += ["--broker-port", str(broker_port), "--port", str(api_port)]
    api = f"http://127.0.0.1:{api_port}"
    with log.open("wb") as out:
        service = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_low_file_limit,  # noqa: PLW1509  (no lock taken between fork and exec)
        )
    try:
        wait_http_ready(service, f"{api}/ready", "minder serve", log, timeout=90)
        bound = re.search(
            r"holds at most (\d+) connections \(open-file limit (\d+)\)", log.read_text()
        )
        assert bound is not None, log_tail(log)
        assert (int(bound.group(1)), int(bound.group(2))) == (BOUND, FILE_LIMIT)

        attack = SlowClients(api_port, ATTACKERS)
        attacker = threading.Thread(target=attack.run, daemon=True)
        attacker.start()
        began = time.monotonic()
        health: list[tuple[float, int | str]] = []
        held: list[int] = []  # the service's connections on its API port, each half second
        while (elapsed := time.monotonic() - began) < CHURN_S + HOLD_S:
            # first closed connections come back; then those held are left to time out
            attack.reconnect = elapsed < CHURN_S
            asked = time.monotonic()
            try:  # a new connection each time, as a Kubernetes probe
                status: int | str = httpx.get(f"{api}/health", timeout=5.0).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            health.append((time.monotonic() - asked, status))
            held.append(api_connections(service.pid, api_port))
            time.sleep(0.5)
        attack.stop.set()
        attacker.join(30)
        assert service.poll() is None, log_tail(log)
        slow = [s for s in attack.done if s.connected is not None and s.closed is not None]
        figures.record("slow connections made", len(slow), "connections")
        figures.record("/health slowest answer under attack", max(t for t, _ in health), "s")
        figures.record("most connections the service held", max(held), "connections")
        failed = [(round(t, 2), status) for t, status in health if status != 200]
        assert failed == [], f"/health did not answer 200 under attack: {failed}"
        assert max(held) <= BOUND + 1, held  # the probe's own among them
        # The last held ones timed out; the probe's own may still be closing server-side.
        assert held[-1] <= 1, held

        # every slow connection was closed by the server, by its header timeout at the latest
        left_open = [s for s in slow if not s.by_server]
        lifetimes = [s.closed - s.connected for s in slow]  # type: ignore[operator]
        timed_out = [s for s in slow if s.answer.startswith(b"HTTP/1.1 408 ")]
        evicted = [s for s in slow if s.answer.startswith(b"HTTP/1.1 503 ")]
        figures.record(
            "slow connections closed at the header timeout", len(timed_out), "connections"
        )
        figures.record("slow connections closed for the bound", len(evicted), "connections")
        figures.record("longest slow connection", max(lifetimes), "s")
        assert len(slow) > ATTACKERS
        assert left_open == [], f"{len(left_open)} slow connections outlived the attack"
        assert max(lifetimes) < HEADER_TIMEOUT_S + SLACK_S, sorted(lifetimes)[-5:]
        assert len(evicted) >= ATTACKERS - BOUND, "connections past the bound were not closed"
        assert len(timed_out) >= 100, "the connections held were not closed by the timeout"
        assert all(
            s.closed - s.connected > HEADER_TIMEOUT_S - 0.5  # type: ignore[operator]
            for s in timed_out
        )
        # after the attack: the API answers, its reads too, and the service stops cleanly
        assert httpx.get(f"{api}/health", timeout=5).status_code == 200
        assert httpx.get(f"{api}/api/v1/alerts", timeout=5).status_code == 200
        stop_process(service, grace_s=30)
        assert service.returncode == 0, log_tail(log)
        text = log.read_text()
        assert "Traceback" not in text, log_tail(log, 60)
    finally:
        stop_process(service, grace_s=30)
