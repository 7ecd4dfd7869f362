"""The outbox and its delivery workers: signed webhooks to a real HTTP receiver on loopback,
retries with backoff, expiry, per-alert order, leases, restarts, slow receivers."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from standardwebhooks.webhooks import Webhook

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.delivery.webhook import WebhookSender
from minder.delivery.worker import (
    Backoff,
    Deferred,
    DeliveryError,
    DeliveryHub,
    DeliveryMetrics,
    DeliveryWorker,
)
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database
from minder.storage.outbox import (
    Delivery,
    DeliveryStatus,
    Destination,
    change_alert_status,
    claim_due,
    list_deliveries,
    mark_delivered,
    mark_failed,
    purge_finished,
    record_alert_with_events,
)

SECRET_NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
SECRET_OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
EVENTS = frozenset({"alert.opened", "alert.acknowledged", "alert.resolved", "alert.false_positive"})
FAST = Backoff(base_s=0.05, cap_s=0.2, floor_s=0.01)


class Receiver:
    """A webhook receiver on loopback whose answers the test scripts."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[int] = []  # statuses to answer next (then 204)
        self.hang_s = 0.0
        self.retry_after: str | None = None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if owner.hang_s:
                    time.sleep(owner.hang_s)
                status = owner.answers.pop(0) if owner.answers else 204
                owner.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(status)
                if owner.retry_after and status == 429:
                    self.send_header("Retry-After", owner.retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def sessions(tmp_path: Path) -> SessionFactory:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'outbox.db'}")
    upgrade_database(engine)
    return session_factory(engine)


def _alert(machine: str = "n1", first_ts: float = 1000.0) -> Alert:
    return Alert(job="j", machine=machine, kind=AlertKind.RULE, metric="gpu_xid_count",
                 score=1.0, first_ts=first_ts, detected_ts=first_ts + 1, devices=("gpu2",))  # fmt: skip


def _record(sessions: SessionFactory, dest: Destination, alert: Alert) -> Alert:
    with sessions.begin() as session:
        stored, _ = record_alert_with_events(session, alert, [dest])
    return stored


def _rows(sessions: SessionFactory, **filters: Any) -> list[Delivery]:
    with sessions() as session:
        rows, _ = list_deliveries(session, limit=500, **filters)
    return rows


def _drain(worker: DeliveryWorker, until: float = 10.0) -> None:
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        worker.run_once()
        if not _rows(worker.sessions, status="pending"):
            return
        time.sleep(0.02)


def test_backoff_grows_exponentially_with_full_jitter_and_a_cap() -> None:
    backoff = Backoff(base_s=1.0, cap_s=60.0, floor_s=0.2)
    assert backoff.delay(1, rng=lambda: 1.0) == 2.0
    assert backoff.delay(3, rng=lambda: 1.0) == 8.0
    assert backoff.delay(20, rng=lambda: 1.0) == 60.0
    assert backoff.delay(5, rng=lambda: 0.0) == 0.2
    assert backoff.delay(10_000, rng=lambda: 0.5) == 30.0  # no overflow


def test_signed_deliveries_verify_with_every_rotated_secret(
    sessions: SessionFactory, receiver: Receiver
) -> None:
    dest = Destination("webhook:ops", EVENTS)
    stored = _record(sessions, dest, _alert())
    sender = WebhookSender("ops", receiver.url, secrets=[SECRET_NEW, SECRET_OLD])
    _drain(DeliveryWorker(sender, sessions, backoff=FAST))
    [(headers, body)] = receiver.received
    [row] = _rows(sessions)
    assert row.status is DeliveryStatus.DELIVERED and row.attempts == 1
    assert headers["webhook-id"] == row.delivery_id
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
    # Receivers holding either secret verify, with the library the spec publishes.
    for secret in (SECRET_NEW, SECRET_OLD):
        payload = Webhook(secret).verify(body, headers)
        assert payload["type"] == "alert.opened" and payload["version"] == 1
        assert payload["data"]["alert"]["id"] == stored.id
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(body, headers)
    tampered = body.replace(b'"n1"', b'"n2"')
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET_NEW).verify(tampered, headers)


def test_failures_are_retried_with_the_same_delivery_id(
    sessions: SessionFactory, receiver: Receiver
) -> None:
    dest = Destination("webhook:ops", EVENTS)
    _record(sessions, dest, _alert())
    receiver.answers = [500, 503, 502]
    registry = CollectorRegistry()
    metrics = DeliveryMetrics(registry)
    metrics.init(["webhook:ops"])
    worker = DeliveryWorker(WebhookSender("ops", receiver.url, secrets=[SECRET_NEW]), sessions,
                            metrics=metrics, backoff=FAST)  # fmt: skip
    _drain(worker)
    ids = {headers["webhook-id"] for headers, _ in receiver.received}
    assert len(receiver.received) == 4 and len(ids) == 1
    [row] = _rows(sessions)
    assert row.status is DeliveryStatus.DELIVERED and row.attempts == 4 and row.last_error is None
    value = registry.get_sample_value
    assert value("minder_outbox_deliveries_total", {"destination": "webhook:ops",
                                                    "outcome": "retry"}) == 3  # fmt: skip
    assert value("minder_outbox_deliveries_total", {"destination": "webhook:ops",
                                                    "outcome": "delivered"}) == 1  # fmt: skip


def test_a_permanent_refusal_expires_at_once_and_later_rows_go_on(
    sessions: SessionFactory, receiver: Receiver
) -> None:
    dest = Destination("webhook:ops", EVENTS)
    _record(sessions, dest, _alert("n1"))
    _record(sessions, dest, _alert("n2"))
    receiver.answers = [401, 410]  # a wrong secret is retried (being fixed); Gone is final
    _drain(DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST))
    rows = {r.alert_id: r for r in _rows(sessions)}
    statuses = sorted(r.status.value for r in rows.values())
    assert statuses == ["delivered", "expired"]
    expired = next(r for r in rows.values() if r.status is DeliveryStatus.EXPIRED)
    assert "answered 410" in (expired.last_error or "")
    assert len(receiver.received) == 3


def test_retry_after_is_honoured(sessions: SessionFactory, receiver: Receiver) -> None:
    dest = Destination("webhook:ops", EVENTS)
    _record(sessions, dest, _alert())
    receiver.answers = [429]
    receiver.retry_after = "30"
    worker = DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST)
    worker.run_once()
    [row] = _rows(sessions)
    assert row.status is DeliveryStatus.PENDING and row.next_attempt_at > time.time() + 25


def test_rows_expire_after_their_time_to_live(sessions: SessionFactory, receiver: Receiver) -> None:
    dest = Destination("webhook:ops", EVENTS, ttl_s=0.3)
    _record(sessions, dest, _alert())
    receiver.answers = [500] * 100
    worker = DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST)
    deadline = time.monotonic() + 5
    while _rows(sessions, status="pending") and time.monotonic() < deadline:
        worker.run_once()
        time.sleep(0.05)
    [row] = _rows(sessions)
    assert row.status is DeliveryStatus.EXPIRED and row.attempts >= 1


def test_an_alert_s_events_arrive_in_order(sessions: SessionFactory, receiver: Receiver) -> None:
    dest = Destination("webhook:ops", EVENTS)
    stored = _record(sessions, dest, _alert())
    with sessions.begin() as session:
        change_alert_status(session, stored.id, AlertStatus.ACKNOWLEDGED, [dest])
        change_alert_status(session, stored.id, AlertStatus.FALSE_POSITIVE, [dest])
    receiver.answers = [500, 500]  # the opened event fails twice: the others must wait for it
    _drain(DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST))
    delivered = [json.loads(body)["type"] for headers, body in receiver.received]
    assert delivered == [
        "alert.opened",
        "alert.opened",
        "alert.opened",
        "alert.acknowledged",
        "alert.false_positive",
    ]


def test_a_claimed_row_is_leased_and_freed_when_its_lease_runs_out(
    sessions: SessionFactory,
) -> None:
    dest = Destination("webhook:ops", EVENTS)
    _record(sessions, dest, _alert())
    now = time.time()
    with sessions.begin() as session:
        first = claim_due(session, "webhook:ops", now=now, owner="a", lease_s=60)
    with sessions.begin() as session:
        second = claim_due(session, "webhook:ops", now=now + 1, owner="b", lease_s=60)
    with sessions.begin() as session:
        after_lease = claim_due(session, "webhook:ops", now=now + 61, owner="b", lease_s=60)
    assert len(first) == 1 and second == [] and [r.id for r in after_lease] == [first[0].id]
    # the first worker's lease ran out: its late marks are ignored, the new owner's count
    with sessions.begin() as session:
        assert not mark_delivered(session, first[0].id, owner="a")
        assert mark_failed(session, first[0].id, error="x", retry_at=None, owner="a") == (
            DeliveryStatus.PENDING
        )
        assert mark_delivered(session, first[0].id, owner="b")


def test_held_rows_do_not_starve_due_ones(sessions: SessionFactory) -> None:
    held = Destination("action:slurm", EVENTS, hold_s={"similarity": 120.0})
    with sessions.begin() as session:
        for i in range(600):
            alert = _alert(f"s{i}")
            alert.kind = AlertKind.SIMILARITY
            record_alert_with_events(session, alert, [held])
        stored, _ = record_alert_with_events(session, _alert("xid"), [held])
    with sessions.begin() as session:
        due = claim_due(session, "action:slurm", now=time.time(), owner="w", limit=50)
    assert [d.alert_id for d in due] == [stored.id]


def test_rows_past_their_time_to_live_are_never_sent_late(
    sessions: SessionFactory, receiver: Receiver
) -> None:
    dest = Destination("webhook:ops", EVENTS, ttl_s=0.2)
    _record(sessions, dest, _alert())
    time.sleep(0.3)  # the service was down longer than the time to live
    DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST).run_once()
    assert receiver.received == []
    [row] = _rows(sessions)
    assert row.status is DeliveryStatus.EXPIRED and row.attempts == 0


def test_the_end_of_an_alert_is_never_held(sessions: SessionFactory) -> None:
    held = Destination("action:slurm", EVENTS, hold_s={"rule": 300.0})
    stored = _record(sessions, held, _alert())
    [opened] = _rows(sessions)
    assert opened.next_attempt_at > time.time() + 200
    with sessions.begin() as session:
        change_alert_status(session, stored.id, AlertStatus.RESOLVED, [held])
    # the held action became due (the executor then finds the alert over), and the end too
    rows = {r.event: r for r in _rows(sessions)}
    assert rows["alert.opened"].next_attempt_at <= time.time()
    assert rows["alert.resolved"].next_attempt_at <= time.time()


def test_a_new_process_delivers_what_the_last_one_left(
    sessions: SessionFactory, receiver: Receiver, tmp_path: Path
) -> None:
    dest = Destination("webhook:ops", EVENTS)
    for machine in ("n1", "n2", "n3"):
        _record(sessions, dest, _alert(machine))
    receiver.answers = [500] * 3
    DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST).run_once()
    assert len(_rows(sessions, status="pending")) == 3
    # a "restarted" process: a new engine on the same database file
    engine = create_engine_for(f"sqlite:///{tmp_path / 'outbox.db'}")
    fresh = session_factory(engine)
    time.sleep(0.3)
    _drain(DeliveryWorker(WebhookSender("ops", receiver.url), fresh, backoff=FAST))
    delivered = {json.loads(b)["data"]["alert"]["machine"] for h, b in receiver.received[3:]}
    assert delivered == {"n1", "n2", "n3"}


def test_a_hanging_receiver_delays_only_its_own_destination(
    sessions: SessionFactory, receiver: Receiver
) -> None:
    slow, fast = Receiver(), receiver
    slow.hang_s = 3.0
    try:
        dests = [Destination("webhook:slow", EVENTS), Destination("webhook:fast", EVENTS)]
        with sessions.begin() as session:
            for machine in ("n1", "n2", "n3"):
                record_alert_with_events(session, _alert(machine), dests)
        hub = DeliveryHub(
            [
                DeliveryWorker(
                    WebhookSender("slow", slow.url, timeout_s=1.0), sessions, backoff=FAST
                ),
                DeliveryWorker(WebhookSender("fast", fast.url), sessions, backoff=FAST),
            ],
            sessions,
        )
        started = time.monotonic()
        hub.start()
        try:
            while len(fast.received) < 3 and time.monotonic() - started < 10:
                time.sleep(0.02)
            took = time.monotonic() - started
        finally:
            hub.stop()
        assert len(fast.received) == 3
        assert took < 2.0, f"the fast receiver waited {took:.1f} s behind the hanging one"
        pending_slow = _rows(sessions, destination="webhook:slow", status="pending")
        assert pending_slow and all("ReadTimeout" in (r.last_error or "") or r.attempts == 0
                                    for r in pending_slow)  # fmt: skip
    finally:
        slow.close()


def test_a_sender_bug_is_retried_and_a_hold_costs_no_attempt(sessions: SessionFactory) -> None:
    dest = Destination("webhook:ops", EVENTS)
    _record(sessions, dest, _alert())

    class Flaky:
        destination = "webhook:ops"
        timeout_s = 1.0
        calls = 0

        def send(self, delivery: Delivery) -> None:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("bug")
            if Flaky.calls == 2:
                raise Deferred(time.time() + 0.05, "held")
            if Flaky.calls == 3:
                raise DeliveryError("down", transient=True)

        def close(self) -> None:
            pass

    _drain(DeliveryWorker(Flaky(), sessions, backoff=FAST))
    [row] = _rows(sessions)
    assert Flaky.calls == 4 and row.status is DeliveryStatus.DELIVERED
    assert row.attempts == 3  # the bug and the failure counted, the hold did not


def test_finished_rows_are_purged_after_their_retention(
    sessions: SessionFactory, receiver: Receiver
) -> None:
    dest = Destination("webhook:ops", EVENTS)
    _record(sessions, dest, _alert("n1"))
    _drain(DeliveryWorker(WebhookSender("ops", receiver.url), sessions, backoff=FAST))
    _record(sessions, dest, _alert("n2"))  # still pending: never purged
    with sessions.begin() as session:
        assert purge_finished(session, before=time.time() - 3600) == 0
        assert purge_finished(session, before=time.time() + 1) == 1
    assert [r.status for r in _rows(sessions)] == [DeliveryStatus.PENDING]
