"""Alert-to-drain latency on real servers, and webhook delivery through a receiver outage.

A healthy job publishes one batch per machine per second, in real time, through the
embedded Kafka broker (Tansu) into the detection service (in process, enforcing Slurm actions);
every few seconds another machine's batch carries an XID (the fault; each machine faults once,
since a fault recurring within the rules' re-arm time is the same episode). The bench measures,
per fault: onset (the XID's timestamp) → alert stored → node DRAIN visible in a real one-host
``slurmctld``
(``scontrol show node``, polled every 20 ms). The job is a real Slurm job (a ``sleep`` on every
faulty node) whose id the batches carry, since Minder drains only a node the scheduler says runs
the alert's job. Each fault is then resolved through the API, and the node must be back out of
DRAIN before the next fault on it. A signed webhook receiver answers 500 for
the first half of the faults and 204 after: the bench reports how long each alert took to
reach it and how many attempts it took.

Run as root with Slurm and MUNGE installed (``.ci/install-slurm.sh``)::

    python bench/alert_to_drain.py --faults 24 [--json]
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import statistics
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from collectors.sim.output import iter_batches
from collectors.sim.scenario import Scenario
from minder.config import Settings, WebhookEndpoint
from minder.core.records import Event, EventKind
from minder.core.signing import FleetSigner, init_cluster_keys
from minder.service.stack import build_stack
from minder.stream import BatchProducer, EmbeddedBroker
from minder.stream.broker import free_port

_TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(_TESTS), str(_TESTS / "minder" / "actions")]  # the test harness of slurmctld
from slurm_cluster import SlurmCluster, skip_reason  # noqa: E402

SECRET = "whsec_" + base64.b64encode(b"bench-secret-0123456789abcdefghij").decode()


class Receiver:
    """Answers 500 until :attr:`healthy`, then 204; records when each alert arrived."""

    def __init__(self) -> None:
        self.healthy = False
        self.first_seen: dict[str, float] = {}
        self.attempts: dict[str, int] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                alert_id = body["data"].get("alert", {}).get("id", "")
                if body["type"] == "alert.opened":
                    owner.attempts[alert_id] = owner.attempts.get(alert_id, 0) + 1
                status = 204 if owner.healthy else 500
                if status == 204 and body["type"] == "alert.opened":
                    owner.first_seen.setdefault(alert_id, time.time())
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(faults: int, gap_s: float) -> dict[str, Any]:
    duration_s = int(faults * (gap_s + 6) + 60)
    nodes = [f"lat-n{i:04d}" for i in range(1, faults + 1)]
    receiver = Receiver()
    with (
        TemporaryDirectory() as tmp,
        EmbeddedBroker() as broker,
        SlurmCluster(nodes=nodes) as slurm,
    ):
        # the job the batches name, running on every faulty node (the scheduler's check)
        job_id = slurm.submit_sleep(nodes, seconds=duration_s + 600)
        scenario = Scenario.model_validate(
            {
                "seed": 3,
                "duration_s": duration_s,
                "jobs": [
                    {
                        "name": job_id,
                        "machine_prefix": "lat-n",
                        "machines": faults + 8,
                        "machines_per_domain": 8,
                        "step_time_s": 3.0,
                    }
                ],
            }
        )
        settings = Settings()
        suffix = uuid.uuid4().hex[:8]
        settings.kafka.bootstrap = broker.bootstrap
        settings.kafka.metrics_topic = f"metrics-{suffix}"
        settings.kafka.group_id = f"bench-{suffix}"
        settings.database.url = f"sqlite:///{tmp}/minder.db"
        settings.api.port = free_port()
        settings.api.token = "bench-token"  # the resolves below are changes
        auth = {"authorization": "Bearer bench-token"}
        settings.auth.keys_file = Path(tmp) / "cluster.keys"  # batches signed, as agents sign
        signer = FleetSigner(init_cluster_keys(settings.auth.keys_file, "bench"))
        settings.actions.target = "slurm"
        settings.actions.enforce = True
        settings.actions.max_per_job = 1000
        settings.actions.max_fraction = 1.0
        settings.actions.scontrol = slurm.scontrol_path
        settings.actions.slurm_conf = slurm.conf_path
        settings.webhook.endpoints = [WebhookEndpoint(name="bench", url=receiver.url,
                                                      secrets=[SECRET])]  # fmt: skip
        settings.delivery.backoff_cap_s = 5.0
        stack = build_stack(settings, registry=CollectorRegistry())
        stack.start()
        api = f"{stack.api_url}/api/v1"
        pending: dict[str, tuple[int, float]] = {}  # node -> (fault number, onset)
        lock = threading.Lock()
        stop = threading.Event()
        schedule = [(time.time() + 20 + i * gap_s, nodes[i]) for i in range(faults)]

        def publish() -> None:
            with BatchProducer(
                broker.bootstrap, topic=settings.kafka.metrics_topic, signer=signer
            ) as producer:
                for ts, batches in iter_batches(scenario, start_ts=time.time() + 1):
                    if stop.is_set():
                        return
                    if ts > time.time():
                        time.sleep(ts - time.time())
                    for batch in batches:
                        with lock:
                            due = [(i, n) for i, (at, n) in enumerate(schedule)
                                   if n == batch.node and at <= ts and i not in done]  # fmt: skip
                            if due:
                                index, node = due[0]
                                done.add(index)
                                batch.events.append(Event(EventKind.XID, "gpu0", ts, 79, "bench"))
                                pending[node] = (index, ts)
                        producer.send(batch)
                    producer.flush()

        done: set[int] = set()
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        results: list[dict[str, Any]] = []
        deadline = time.time() + 20 + faults * gap_s + 120
        try:
            while len(results) < faults and time.time() < deadline:
                with lock:
                    waiting = dict(pending)
                for node, (index, onset) in waiting.items():
                    flags, reason = slurm.node_state(node)
                    if "DRAIN" not in flags:
                        continue
                    drained_at = time.time()
                    alert_id = reason.split()[0].removeprefix("minder:")
                    alert = httpx.get(f"{api}/alerts/{alert_id}", headers=auth).json()
                    results.append({
                        "fault": index,
                        "node": node,
                        "alert_id": alert_id,
                        "onset": onset,
                        "onset_to_drain_s": drained_at - onset,
                        "onset_to_stored_s": alert["created_at"] - onset,
                    })  # fmt: skip
                    if index == faults // 2:
                        receiver.healthy = True
                    print(
                        f"fault {index + 1}/{faults}: {node} drained "
                        f"{drained_at - onset:.2f} s after onset",
                        file=sys.stderr,
                    )
                    resolved = httpx.patch(
                        f"{api}/alerts/{alert_id}", json={"status": "resolved"}, headers=auth
                    )
                    resolved.raise_for_status()
                    slurm.wait_for_state(node, lambda f: "DRAIN" not in f, timeout_s=30)
                    with lock:
                        pending.pop(node, None)
                time.sleep(0.02)
            deadline = time.time() + 60
            while len(receiver.first_seen) < faults and time.time() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            stack.stop()
    drains = [r["onset_to_drain_s"] for r in results]
    stored = [r["onset_to_stored_s"] for r in results]
    created = {r["alert_id"]: r for r in results}
    outage, after = [], []
    for alert_id, seen in receiver.first_seen.items():
        row = created.get(alert_id)
        if row is None:
            continue
        delay = seen - (row["onset"] + row["onset_to_stored_s"])
        (outage if row["fault"] < faults // 2 else after).append(delay)
    return {
        "faults": len(results),
        "onset_to_drain_s": {
            "median": statistics.median(drains),
            "p95": _percentile(drains, 0.95),
            "max": max(drains),
        },
        "onset_to_alert_stored_s": {
            "median": statistics.median(stored),
            "p95": _percentile(stored, 0.95),
        },
        "webhook": {
            "delivered": len(receiver.first_seen),
            "of": faults,
            "attempts_during_outage_max": max(
                (
                    n
                    for a, n in receiver.attempts.items()
                    if a in created and created[a]["fault"] < faults // 2
                ),
                default=0,
            ),
            "alerts_raised_during_outage": len(outage),
            "stored_to_received_s_after_outage": {
                "median": statistics.median(after) if after else None,
                "max": max(after) if after else None,
            },
            "stored_to_received_s_during_outage_max": max(outage) if outage else None,
        },
        "per_fault": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=24)
    parser.add_argument("--gap", type=float, default=3.0, help="seconds between fault onsets")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # A SIGTERM (e.g. `timeout`) unwinds the context managers: no orphaned slurmd or broker.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = skip_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    result = run(args.faults, args.gap)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    d, s, w = result["onset_to_drain_s"], result["onset_to_alert_stored_s"], result["webhook"]
    print(f"faults: {result['faults']}")
    print(f"onset -> alert stored: median {s['median']:.2f} s, p95 {s['p95']:.2f} s")
    print(f"onset -> node DRAIN in slurmctld: median {d['median']:.2f} s, p95 {d['p95']:.2f} s, "
          f"max {d['max']:.2f} s")  # fmt: skip
    print(f"webhook: {w['delivered']}/{w['of']} delivered; receiver answered 500 for the first "
          f"{w['alerts_raised_during_outage']} alerts (up to {w['attempts_during_outage_max']} "
          "attempts each), all delivered once it recovered")  # fmt: skip


if __name__ == "__main__":
    main()
