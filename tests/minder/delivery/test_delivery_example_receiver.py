"""The example receiver of docs/webhooks.md verifies what Minder sends, and refuses forgeries."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from minder.core.alert import Alert, AlertKind
from minder.delivery.webhook import WebhookSender
from minder.delivery.worker import DeliveryError
from minder.storage.outbox import Delivery, DeliveryStatus, alert_event_data, event_payload
from minder.stream.broker import free_port

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "webhook_receiver.py"
SECRET = "whsec_" + base64.b64encode(b"example-receiver-secret-32bytes!").decode()


def _delivery(delivery_id: str) -> Delivery:
    alert = Alert(job="j", machine="n7", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                  first_ts=time.time(), detected_ts=time.time())  # fmt: skip
    now = time.time()
    return Delivery(
        id=1, delivery_id=delivery_id, destination="webhook:ops", event="alert.opened",
        alert_id=alert.id, job="j",
        payload=event_payload("alert.opened", alert_event_data(alert), now),
        status=DeliveryStatus.PENDING, attempts=0, created_at=now, next_attempt_at=now,
        expires_at=now + 60, delivered_at=None, last_error=None,
    )  # fmt: skip


def test_the_documented_receiver_accepts_minder_and_refuses_forgeries() -> None:
    port = free_port()
    env = {**os.environ, "MINDER_WEBHOOK_SECRET": SECRET}
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/hook"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.post(url, content=b"{}")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        sender = WebhookSender("ops", url, secrets=[SECRET])
        sender.send(_delivery("msg_a"))
        sender.send(_delivery("msg_a"))  # a retry: the receiver keeps it once
        forger = WebhookSender(
            "ops", url, secrets=["whsec_" + base64.b64encode(b"x" * 32).decode()]
        )
        try:
            forger.send(_delivery("msg_b"))
        except DeliveryError as exc:
            assert exc.status == 401 and exc.transient  # retried until fixed or expired
        else:
            raise AssertionError("a forged delivery was accepted")
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [
        {"id": "msg_a", "type": "alert.opened", "job": "j", "machine": "n7", "kind": "rule",
         "status": "open"}
    ]  # fmt: skip
