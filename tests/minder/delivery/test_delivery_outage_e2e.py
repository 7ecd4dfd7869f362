"""Every alert reaches a webhook receiver that fails, hangs and is down, across a SIGKILL.

The receiver first answers 500, then hangs, then is down; the service is killed with SIGKILL
while deliveries are failing and started again on the same database and consumer group. Every
injected fault must reach the receiver at least once, signed so that the ``standardwebhooks``
verifier accepts it, and no fault may be alerted twice.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import wait_for
from service_settings import cluster_keys
from standardwebhooks.webhooks import Webhook

from collectors.sim.output import iter_batches
from collectors.sim.scenario import Scenario
from minder.core.signing import FleetSigner, load_cluster_keys
from minder.stream import BatchProducer, EmbeddedBroker
from minder.stream.broker import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SECRET = "whsec_" + base64.b64encode(b"outage-test-secret-0123456789abc").decode()
JOBS = 8


def _scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "seed": 11,
            "duration_s": 60,
            "jobs": [
                {"name": f"r{j}", "machines": 8, "machines_per_domain": 8, "step_time_s": 3.0}
                for j in range(JOBS)
            ],
            "faults": [
                {
                    "type": "gpu_xid",
                    "job": f"r{j}",
                    "machine": j % 8,
                    "device": "gpu1",
                    "start_s": 8 + 5 * j,
                    "duration_s": 60,
                }
                for j in range(JOBS)
            ],
        }
    )


class Receiver:
    """A webhook receiver whose behaviour the test switches: error, hang, ok; stop/start."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.mode = "error"
        self.calls: dict[str, int] = {"error": 0, "hang": 0, "ok": 0}
        self.accepted: list[tuple[dict[str, str], bytes]] = []
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                mode = owner.mode
                owner.calls[mode] += 1
                if mode == "hang":
                    time.sleep(3.0)  # far past the service's 1 s timeout
                    status = 500
                elif mode == "error":
                    status = 500
                else:
                    owner.accepted.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    status = 204
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client gave up on a hung request

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


def test_every_alert_arrives_signed_once_per_fault_through_outages_and_a_kill(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    receiver = Receiver(free_port())
    receiver.start()
    suffix = uuid.uuid4().hex[:8]
    api_port = free_port()
    keys_file = cluster_keys()
    signer = FleetSigner(load_cluster_keys(keys_file)[-1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env.update(
        {
            "MINDER_KAFKA__BOOTSTRAP": broker.bootstrap,
            "MINDER_KAFKA__METRICS_TOPIC": f"metrics-{suffix}",
            "MINDER_KAFKA__ALERTS_TOPIC": f"alerts-{suffix}",
            "MINDER_KAFKA__DEADLETTER_TOPIC": f"dead-{suffix}",
            "MINDER_KAFKA__GROUP_ID": f"detect-{suffix}",
            "MINDER_KAFKA__PARTITIONS": "2",
            "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'minder.db'}",
            "MINDER_AUTH__KEYS_FILE": str(keys_file),
            "MINDER_WEBHOOK__ENDPOINTS": json.dumps(
                [
                    {
                        "name": "ops",
                        "url": f"http://127.0.0.1:{receiver.port}/hook",
                        "secrets": [SECRET],
                    }
                ]
            ),
            "MINDER_WEBHOOK__TIMEOUT_S": "1",
            "MINDER_DELIVERY__BACKOFF_CAP_S": "2",
            "MINDER_LOG_LEVEL": "WARNING",
        }
    )
    logs = tmp_path / "serve.log"

    def start_service() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "minder.cli", "serve", "--port", str(api_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=logs.open("ab"),
        )
        wait_for(lambda: process.poll() is not None or _ready(api_port), 90, "the service")
        assert process.poll() is None, logs.read_text()[-3000:]
        return process

    api = f"http://127.0.0.1:{api_port}/api/v1"

    def stored_alerts() -> list[dict[str, Any]]:
        return httpx.get(f"{api}/alerts", params={"limit": 500}, timeout=5).json()["items"]

    scenario = _scenario()
    seconds = list(iter_batches(scenario, start_ts=time.time() - scenario.duration_s))
    service = start_service()
    try:
        with BatchProducer(broker.bootstrap, topic=f"metrics-{suffix}", signer=signer) as producer:
            for _, batches in seconds[:32]:  # faults of r0..r4 start before second 32
                for batch in batches:
                    producer.send(batch)
            producer.flush()
            wait_for(lambda: len(stored_alerts()) >= 4, 60, "the first alerts")
            wait_for(lambda: receiver.calls["error"] >= 4, 30, "failed deliveries")
            receiver.mode = "hang"
            wait_for(lambda: receiver.calls["hang"] >= 2, 30, "hung deliveries")
            receiver.stop()  # down
            time.sleep(1.0)
            service.send_signal(signal.SIGKILL)
            service.wait(10)
            service = start_service()
            for _, batches in seconds[32:]:
                for batch in batches:
                    producer.send(batch)
            producer.flush()
            wait_for(lambda: len(stored_alerts()) >= JOBS, 60, "every alert stored")
        receiver.mode = "ok"
        receiver.start()  # back up, same address

        def opened_machines() -> set[tuple[str, str]]:
            found = set()
            for _headers, body in list(receiver.accepted):
                event = json.loads(body)
                if event["type"] == "alert.opened":
                    alert = event["data"]["alert"]
                    found.add((alert["job"], alert["machine"]))
            return found

        expected = {(f"r{j}", f"r{j}-n{j % 8:04d}") for j in range(JOBS)}
        wait_for(lambda: expected <= opened_machines(), 90, "every alert at the receiver")

        # every delivery verifies with the published verifier
        verifier = Webhook(SECRET)
        ids_by_fault: dict[tuple[str, str], set[str]] = {}
        for headers, body in receiver.accepted:
            event = verifier.verify(body, headers)
            if event["type"] == "alert.opened":
                alert = event["data"]["alert"]
                ids_by_fault.setdefault((alert["job"], alert["machine"]), set()).add(alert["id"])
        assert set(ids_by_fault) == expected, "an alert on a healthy machine"
        # no fault alerted twice: one alert id per faulty machine, stored and delivered
        assert all(len(ids) == 1 for ids in ids_by_fault.values()), ids_by_fault
        stored = stored_alerts()
        assert sorted((a["job"], a["machine"]) for a in stored) == sorted(expected)
        pending = httpx.get(f"{api}/deliveries", params={"status": "expired"}).json()["total"]
        assert pending == 0
        assert receiver.calls["error"] >= 4 and receiver.calls["hang"] >= 2
    finally:
        receiver.stop()
        if service.poll() is None:
            service.send_signal(signal.SIGTERM)
            try:
                service.wait(20)
            except subprocess.TimeoutExpired:
                service.kill()


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
