"""The API of a running service, secure by default: changes need a token, reads need it too
or come from this machine, foreign origins and Host names are refused, a stalled or truncated
body is answered, errors keep server paths to themselves; the agent's ``/metrics`` listens on
loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from fault_harness import FAULTY, FaultService, Figures, wait_until

from minder.stream import EmbeddedBroker
from minder.stream.broker import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOKEN = "fault-suite-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BOUNDARY = "fault-boundary"
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
EVIL = "https://evil.example"


def multipart(data: bytes = b"PAR1", *, closed: bool = True) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; '
        'filename="trace.parquet"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    return head + data + (f"\r\n--{BOUNDARY}--\r\n".encode() if closed else b"")


def test_with_the_default_settings_changes_foreign_origins_and_hosts_are_refused(
    make_service: Any, figures: Figures
) -> None:
    service: FaultService = make_service()  # no token: the default
    service.warm_up()
    healthy = service.fault_then_alert(figures, timeout_s=30)
    assert healthy.on_time(), healthy
    alert = service.alert_on(FAULTY)
    assert alert is not None
    api = f"{service.api}/api/v1"

    def stored_alert_status() -> str:
        return str(httpx.get(f"{api}/alerts/{alert.id}", timeout=10).json()["status"])

    assert wait_until(lambda: stored_alert_status() == "open", 10) is not None
    answers = {
        "PATCH alert": httpx.patch(
            f"{api}/alerts/{alert.id}", json={"status": "resolved"}, timeout=30
        ),
        "POST whatif": httpx.post(
            f"{api}/whatif", content=multipart(), headers=MULTIPART, timeout=30
        ),
        "cross-origin POST whatif": httpx.post(
            f"{api}/whatif", content=multipart(), headers={**MULTIPART, "origin": EVIL}
        ),
        "rebound Host": httpx.get(f"{api}/alerts", headers={"host": "evil.example"}, timeout=30),
    }
    for name, response in answers.items():
        figures.record(f"{name}: status", response.status_code, "HTTP")
    assert answers["PATCH alert"].status_code == 403
    assert answers["POST whatif"].status_code == 403
    cross = answers["cross-origin POST whatif"]
    assert cross.status_code == 403 and "access-control-allow-origin" not in cross.headers
    assert answers["rebound Host"].status_code == 400
    assert stored_alert_status() == "open"
    assert httpx.get(f"{api}/whatif", timeout=10).json()["total"] == 0


def own_address() -> str | None:
    """This machine's address on its default route (not loopback), ``None`` without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the route
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_without_a_token_only_this_machine_reads_and_probes_stay_open(
    make_service: Any, figures: Figures
) -> None:
    address = own_address()
    if address is None:
        pytest.skip("no network address other than loopback")
    service: FaultService = make_service(api={"host": "0.0.0.0"})
    port = service.settings.api.port
    remote = f"http://{address}:{port}"
    refused = httpx.get(f"{remote}/api/v1/alerts", timeout=10)
    figures.record("read from another address without a token: status", refused.status_code, "HTTP")
    assert refused.status_code == 403, refused.text
    assert "MINDER_API__OPEN_READS=true" in refused.json()["detail"]
    assert httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=10).status_code == 200
    for path in ("/health", "/metrics"):
        assert httpx.get(f"{remote}{path}", timeout=10).status_code == 200, path
    assert httpx.get(f"{remote}/ready", timeout=10).status_code in (200, 503)


def test_with_a_token_every_read_needs_it(guarded: tuple[FaultService, Path]) -> None:
    service, _ = guarded
    api = f"{service.api}/api/v1"
    for path in ("alerts", "jobs", "deliveries", "actions", "breaker", "whatif"):
        assert httpx.get(f"{api}/{path}", timeout=10).status_code == 401, path
        assert httpx.get(f"{api}/{path}", headers=AUTH, timeout=10).status_code == 200, path
    assert httpx.get(f"{service.api}/health", timeout=10).status_code == 200


def stalled_answer(port: int, head: bytes, partial: bytes, wait_s: float) -> tuple[float, bytes]:
    """Send a request head and part of its body, hold the connection open: the seconds until
    the server answered and closed it (``wait_s`` when it did not), and the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(head + partial)
        started = time.monotonic()
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return wait_s, answer
        return time.monotonic() - started, answer


@pytest.fixture(scope="module")
def guarded(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A service with a token, a 2 s body timeout and a what-if root holding a broken trace and
    a link to a file outside it; ``(service, the directory above the root)``."""
    outside = tmp_path_factory.mktemp("guarded")
    roots = outside / "traces"
    (roots / "st").mkdir(parents=True)
    (roots / "st" / "rank-0.json").write_text("{not json")
    (outside / "secret.parquet").write_bytes(b"x")
    (roots / "link.parquet").symlink_to(outside / "secret.parquet")
    (outside / "service").mkdir()
    service = FaultService(
        broker,
        outside / "service",
        api={"token": TOKEN, "body_timeout_s": 2.0},
        whatif={"roots": [str(roots)], "workdir": str(outside / "work")},
    ).start()
    try:
        yield service, outside
    finally:
        service.close()


def test_a_body_cut_short_with_the_connection_held_open_gets_408(
    guarded: tuple[FaultService, Path], figures: Figures
) -> None:
    service, _ = guarded
    body = multipart(b"\0" * 4096)
    head = (
        f"POST /api/v1/whatif HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: {MULTIPART['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    port = service.settings.api.port
    elapsed, answer = stalled_answer(port, head, body[: len(body) // 2], wait_s=15.0)
    figures.record("stalled body answered after", elapsed, "s")
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert elapsed < 6.0
    assert httpx.get(f"{service.api}/health", timeout=5).status_code == 200


def test_multipart_without_its_closing_boundary_gets_422(
    guarded: tuple[FaultService, Path], figures: Figures
) -> None:
    service, _ = guarded
    cut = httpx.post(
        f"{service.api}/api/v1/whatif",
        content=multipart(closed=False),
        headers={**MULTIPART, **AUTH},
    )
    figures.record("multipart without its closing boundary: status", cut.status_code, "HTTP")
    assert cut.status_code == 422, cut.text


def test_errors_name_no_path_outside_the_roots(
    guarded: tuple[FaultService, Path], figures: Figures
) -> None:
    service, outside = guarded
    api = f"{service.api}/api/v1"
    shown: list[str] = []
    for path in ("link.parquet", str(outside / "secret.parquet"), "../secret.parquet"):
        refused = httpx.post(f"{api}/whatif", json={"path": path}, headers=AUTH, timeout=30)
        shown.append(refused.text.replace(repr(path), "").replace(path, ""))
    submitted = httpx.post(f"{api}/whatif", json={"path": "st"}, headers=AUTH, timeout=30)
    report = f"{api}/whatif/{submitted.json().get('id')}"

    def finished() -> dict[str, Any] | None:
        found: dict[str, Any] = httpx.get(report, headers=AUTH, timeout=10).json()
        return found if found.get("status") in ("done", "failed") else None

    wait_until(finished, 60)
    failed = finished()
    shown.append(str(failed))
    leaks = [text for text in shown if str(outside) in text]
    figures.record("errors naming a path outside the roots", len(leaks), "errors")
    assert leaks == [], leaks
    assert failed is not None and failed["status"] == "failed"
    assert failed["error"].startswith("st/rank-0.json: ")


def test_the_agents_metrics_listen_on_loopback_by_default(
    make_service: Any, tmp_path: Path
) -> None:
    service: FaultService = make_service()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    args = ["agent", "--job", "agent-job", "--node", "a0", "--no-nvml", "--probe-address", "off"]
    args += ["--ethtool-command", "off", "--sysfs-root", str(tmp_path / "no-sys")]
    args += ["--spool-dir", str(tmp_path / "spool"), "--kafka", service.broker.bootstrap]
    agent = subprocess.Popen(
        [sys.executable, "-m", "minder.cli", *args, "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def listening() -> list[str]:
            return [
                c.laddr.ip
                for c in psutil.Process(agent.pid).net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            ]

        assert wait_until(lambda: listening() or agent.poll() is not None, 60) is not None
        assert agent.poll() is None, agent.communicate()[1].decode()[-2000:]
        assert listening() == ["127.0.0.1"]
    finally:
        agent.terminate()
        agent.wait(20)
