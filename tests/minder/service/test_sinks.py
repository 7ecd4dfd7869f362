"""Alert sinks: webhooks against a real HTTP server on loopback, the SQL state store."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from minder.core.alert import Alert, AlertKind
from minder.service.engine import DetectionService, JobSnapshot, MachineSnapshot
from minder.service.sinks import SqlStateStore, WebhookSink
from minder.service.telemetry import ServiceMetrics
from minder.storage import create_engine_for, session_factory, upgrade_database
from minder.storage.alerts import list_alerts
from minder.storage.jobs import current_scores, list_machines


class Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []
    fail_first: ClassVar[int] = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if Receiver.fail_first > 0:
            Receiver.fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        Receiver.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.received = []
    Receiver.fail_first = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def _alert(machine: str = "n1") -> Alert:
    return Alert("j", machine, AlertKind.RULE, "gpu_xid_count", 1.0, 100.0, 100.0, ("gpu1",))


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_webhook_posts_each_alert_and_retries_failures(receiver: str) -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    Receiver.fail_first = 1  # the first attempt gets a 503
    sink = WebhookSink([receiver], metrics=metrics, retries=3)
    try:
        sink.deliver(_alert("n1"))
        sink.deliver(_alert("n2"))
        _wait(lambda: len(Receiver.received) == 2)
    finally:
        sink.close()
    assert [r["machine"] for r in Receiver.received] == ["n1", "n2"]
    assert Receiver.received[0]["kind"] == "rule" and Receiver.received[0]["devices"] == ["gpu1"]
    delivered = metrics.alert_deliveries.labels(sink="webhook", outcome="delivered")._value.get()
    assert delivered == 2


def test_webhook_gives_up_and_counts_after_retries() -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    sink = WebhookSink(["http://127.0.0.1:9/unreachable"], metrics=metrics, retries=2)
    sink.deliver(_alert())
    sink.close(timeout_s=20)
    assert metrics.alert_deliveries.labels(sink="webhook", outcome="failed")._value.get() == 1


def test_store_dedups_so_the_service_raises_a_fault_once(tmp_path: Path) -> None:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade_database(engine)
    sessions = session_factory(engine)
    store = SqlStateStore(sessions)
    seen: list[Alert] = []

    class Collect:
        name = "collect"

        def deliver(self, alert: Alert) -> None:
            seen.append(alert)

    service = DetectionService(lambda: None, store=store, sinks=[Collect()])  # type: ignore[arg-type,return-value]
    first = service._deliver(_alert())
    again = service._deliver(_alert())  # the same fault reported again (e.g. after a replay)
    assert first is not None and again is None and len(seen) == 1
    store.save_job(
        JobSnapshot(
            job="j",
            ts=100.0,
            machines=[
                MachineSnapshot(
                    "n1",
                    "pp0",
                    "leaf-1",
                    99.0,
                    7.5,
                    "gpu_power_watts",
                    "gpu3",
                    {"gpu_power_watts": (7.5, "gpu3"), "cpu_util_ratio": (0.4, "")},
                ),
                MachineSnapshot("n2", "pp0", "leaf-1", 99.0, 0.0, "", "", {}),
            ],
        )
    )
    with sessions() as session:
        alerts, total = list_alerts(session, job="j")
        machines = {m.name: m for m in list_machines(session, "j")}
        scores = current_scores(session, "j")
    assert total == 1 and alerts[0].id == first.id
    assert machines["n1"].top_metric == "gpu_power_watts" and machines["n1"].top_device == "gpu3"
    assert {(s.machine, s.metric) for s in scores} == {
        ("n1", "gpu_power_watts"),
        ("n1", "cpu_util_ratio"),
    }


def test_a_bad_url_or_payload_does_not_stop_later_deliveries(receiver: str) -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    sink = WebhookSink(["http://[::1/bad", receiver], metrics=metrics, retries=1)
    odd = _alert("n1")
    odd.evidence = {"z": float("nan"), "when": [1.0, float("inf")]}
    try:
        sink.deliver(odd)
        sink.deliver(_alert("n2"))
        _wait(lambda: len(Receiver.received) == 2)
    finally:
        sink.close()
    assert Receiver.received[0]["evidence"] == {"z": None, "when": [1.0, None]}
    assert metrics.alert_deliveries.labels(sink="webhook", outcome="failed")._value.get() == 2


def test_close_returns_in_time_with_a_dead_webhook_and_counts_the_undelivered() -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    sink = WebhookSink(["http://127.0.0.1:9/dead"], metrics=metrics, retries=5, max_queue=50)
    for i in range(50):
        sink.deliver(_alert(f"n{i}"))
    began = time.monotonic()
    sink.close(timeout_s=1.0)
    assert time.monotonic() - began < 5.0
    failed = metrics.alert_deliveries.labels(sink="webhook", outcome="failed")._value.get()
    dropped = metrics.alert_deliveries.labels(sink="webhook", outcome="dropped")._value.get()
    assert failed + dropped == 50
