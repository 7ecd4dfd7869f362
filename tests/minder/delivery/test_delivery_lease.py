"""Outbox leases under real workers, on SQLite and PostgreSQL: a delivery slower than the lease
is never sent by a second worker at the same time (the heartbeat renews it), and the rows of a
worker killed mid-delivery are redelivered by another one soon after its lease runs out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minder.core.alert import Alert, AlertKind
from minder.delivery.worker import DeliveryWorker
from minder.storage import SessionFactory, session_factory
from minder.storage.outbox import (
    Delivery,
    DeliveryStatus,
    Destination,
    list_deliveries,
    record_alert_with_events,
)
from minder.storage.testing import postgres_unavailable, scratch_database

DEST = Destination("webhook:ops", frozenset({"alert.opened"}))
CRASH_WORKER = Path(__file__).with_name("lease_crash_worker.py")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, SessionFactory]]:
    if request.param == "postgresql" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    with scratch_database(request.param, tmp_path) as engine:
        yield engine.url.render_as_string(hide_password=False), session_factory(engine)


def _enqueue(sessions: SessionFactory, *machines: str) -> None:
    with sessions.begin() as session:
        for machine in machines:
            alert = Alert(job="j", machine=machine, kind=AlertKind.RULE, metric="gpu_xid_count",
                          score=1.0, first_ts=1000.0, detected_ts=1001.0)  # fmt: skip
            record_alert_with_events(session, alert, [DEST])


def _rows(sessions: SessionFactory) -> list[Delivery]:
    with sessions() as session:
        rows, _ = list_deliveries(session, limit=100)
    return rows


class SlowSender:
    """Takes ``delay_s`` per delivery; records every send and whether two overlapped."""

    destination = DEST.name
    timeout_s = 10.0

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.sent: list[tuple[str, float]] = []
        self.in_flight: set[str] = set()
        self.overlaps: list[str] = []
        self._lock = threading.Lock()

    def send(self, delivery: Delivery) -> None:
        with self._lock:
            if delivery.delivery_id in self.in_flight:
                self.overlaps.append(delivery.delivery_id)
            self.in_flight.add(delivery.delivery_id)
            self.sent.append((delivery.delivery_id, time.monotonic()))
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight.discard(delivery.delivery_id)

    def close(self) -> None:
        pass


def test_a_delivery_slower_than_its_lease_is_not_sent_twice(
    database: tuple[str, SessionFactory],
) -> None:
    _, sessions = database
    _enqueue(sessions, "n1", "n2")
    sender = SlowSender(delay_s=2.5)  # each send outlasts the 1 s lease more than twice
    workers = [DeliveryWorker(sender, sessions, lease_s=1.0, idle_s=0.05) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(r.status is DeliveryStatus.DELIVERED for r in _rows(sessions)):
                break
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.stop()
    rows = _rows(sessions)
    assert [r.status for r in rows] == [DeliveryStatus.DELIVERED] * 2
    assert sender.overlaps == []
    # each row sent once (the second row of the batch waited 2.5 s, its lease renewed too)
    assert sorted(d for d, _ in sender.sent) == sorted(r.delivery_id for r in rows)
    assert [r.attempts for r in rows] == [1, 1]


def test_a_killed_worker_s_rows_are_redelivered_once_its_lease_runs_out(
    database: tuple[str, SessionFactory],
) -> None:
    url, sessions = database
    _enqueue(sessions, "n1")
    lease_s = 2.5
    crashing = subprocess.Popen(
        [sys.executable, str(CRASH_WORKER), url, str(lease_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    survivor = SlowSender(delay_s=0.0)
    worker = DeliveryWorker(survivor, sessions, lease_s=lease_s, idle_s=0.05)
    try:
        assert crashing.stdout is not None
        line = crashing.stdout.readline()
        if not line.startswith("sending "):
            crashing.kill()
            stderr = crashing.stderr.read() if crashing.stderr is not None else ""
            pytest.fail(f"the crashing worker did not start: {line!r} {stderr!r}")
        delivery_id = line.split()[1]
        worker.start()
        # the other process hangs mid-send for twice the lease, renewing it: nothing is resent
        time.sleep(2 * lease_s)
        assert survivor.sent == []
        crashing.send_signal(signal.SIGKILL)
        crashing.wait(10)
        killed_at = time.monotonic()
        deadline = killed_at + lease_s + 10
        while not survivor.sent and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
        if crashing.poll() is None:
            crashing.kill()
            crashing.wait(10)
    [(sent_id, sent_at)] = survivor.sent
    assert sent_id == delivery_id
    took = sent_at - killed_at
    assert took < lease_s + 1.5, f"redelivered {took:.1f} s after the crash (lease {lease_s} s)"
    [row] = _rows(sessions)
    assert row.status is DeliveryStatus.DELIVERED and row.attempts == 1
