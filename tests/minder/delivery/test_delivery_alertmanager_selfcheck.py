"""A self-check's verdict in Alertmanager: a confirmed alert stays firing with the verdict in its
annotations, a cleared one ends, an inconclusive check re-sends the alert still firing; against
the payload functions and a real Alertmanager (skipped, saying so, without one)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from alertmanager_server import alertmanager_server

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.delivery.alertmanager import (
    AlertmanagerClient,
    AlertmanagerSender,
    alert_annotations,
    alert_labels,
    to_alertmanager,
)
from minder.storage.outbox import Delivery, DeliveryStatus, event_payload

EVIDENCE = {
    "check_id": "5f0c2a9e11d04b7a",
    "state": "failed",
    "verdict": "fail",
    "reason": "failed: gpu.matmul",
    "failing": ["gpu.matmul"],
    "node": "n03",
    "attempt": 1,
    "partners": ["n01", "n02"],
    "outcome": "kept out: reservation removed; kept drained",
}


def _alert(status: AlertStatus, **evidence: Any) -> Alert:
    now = time.time()
    return Alert(job="j", machine="n03", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                 first_ts=round(now - 120, 3), detected_ts=now - 118, status=status,
                 evidence={"rule": "event:xid", "code": 79, **evidence})  # fmt: skip


def _delivery(event: str, alert: Alert, at: float | None = None) -> Delivery:
    now = time.time() if at is None else at
    payload = event_payload(event, {"alert": alert.to_dict()}, now)
    return Delivery(1, "msg_1", "alertmanager", event, alert.id, alert.job, payload,
                    DeliveryStatus.PENDING, 0, now, now, now + 60, None, None)  # fmt: skip


def test_a_confirmed_alert_fires_with_its_verdict() -> None:
    alert = _alert(AlertStatus.CONFIRMED, selfcheck=EVIDENCE)
    annotations = alert_annotations(alert, None)
    assert annotations["minder_status"] == "confirmed"
    assert annotations["selfcheck_verdict"] == "fail"
    assert annotations["selfcheck_reason"] == "failed: gpu.matmul"
    assert annotations["selfcheck_failing"] == "gpu.matmul"
    assert annotations["selfcheck_id"] == "5f0c2a9e11d04b7a"
    assert annotations["summary"].endswith("(confirmed by a self-check: gpu.matmul failed)")
    assert "self-check fail: failed: gpu.matmul" in annotations["description"]
    # still firing: no end, and the labels are the open alert's (the same Alertmanager alert)
    assert "endsAt" not in to_alertmanager(alert, ended_at=None, external_url=None)
    assert alert_labels(alert) == alert_labels(_alert(AlertStatus.OPEN))


def test_an_alert_without_a_check_has_no_selfcheck_annotations() -> None:
    assert not any(key.startswith("selfcheck") for key in alert_annotations(_alert(
        AlertStatus.OPEN), None))  # fmt: skip


def test_alertmanager_keeps_a_confirmed_alert_and_ends_a_cleared_one(tmp_path: Path) -> None:
    with alertmanager_server(tmp_path) as am:
        sender = AlertmanagerSender(AlertmanagerClient(am.url), refresh_s=5.0)
        opened = _alert(AlertStatus.OPEN)
        sender.send(_delivery("alert.opened", opened))
        confirmed = _alert(AlertStatus.CONFIRMED, selfcheck=EVIDENCE)
        sender.send(_delivery("alert.confirmed", confirmed))
        [active] = am.alerts(active="true")
        assert active["labels"]["alert_id"] == opened.id == confirmed.id
        assert active["annotations"]["minder_status"] == "confirmed"
        assert active["annotations"]["selfcheck_verdict"] == "fail"
        # the refresh re-sends it (a confirmed alert is open in Minder's store)
        sender.refresh([confirmed])
        assert len(am.alerts(active="true")) == 1

        other = Alert(job="j", machine="n04", kind=AlertKind.RULE, metric="gpu_xid_count",
                      score=1.0, first_ts=round(time.time() - 60, 3),
                      detected_ts=time.time() - 59)  # fmt: skip
        sender.send(_delivery("alert.opened", other))
        inconclusive = Alert.from_dict({**other.to_dict(), "evidence": {"selfcheck": {
            **EVIDENCE, "state": "timed_out", "verdict": None, "reason": "no verdict within "
            "600 s"}}})  # fmt: skip
        sender.send(_delivery("selfcheck.inconclusive", inconclusive))
        [still] = am.alerts(filter=f'alert_id="{other.id}"', active="true")
        assert still["annotations"]["selfcheck_verdict"] == "timed_out"

        cleared = Alert.from_dict({**other.to_dict(), "status": "cleared_by_selfcheck",
                                   "evidence": {"selfcheck": {**EVIDENCE, "verdict": "pass"}}})  # fmt: skip
        sender.send(_delivery("alert.cleared_by_selfcheck", cleared))
        assert am.alerts(filter=f'alert_id="{other.id}"', active="true") == []
        assert [a["labels"]["alert_id"] for a in am.alerts(active="true")] == [opened.id]
        sender.close()
