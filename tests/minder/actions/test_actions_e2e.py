"""From a fault to a drained node and back, end to end, on real servers.

A simulated job with an injected GPU fault goes through Kafka (Tansu) into the detection service;
its alert drains the faulty node in a real ``slurmctld`` (where a real job of that id runs on the
node, as the scheduler's check requires) and shows in a real Alertmanager; marking the alert a
false positive through the API resumes the node and ends the Alertmanager alert. A fault reported
for a node outside the job (``demo-n0024``, first) is not acted on: it raises a
``suspicious_source`` alert, shown by the API and Alertmanager, and does not spend the breaker's
one machine per hour (2 % of 32 machines).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from alertmanager_server import alertmanager_server
from prometheus_client import CollectorRegistry
from server_process import wait_for
from service_settings import isolated_settings, send_scenario

from collectors.sim.scenario import Scenario
from minder.service.stack import build_stack
from minder.stream import EmbeddedBroker

# The Alertmanager harness lives beside the delivery tests; pytest puts only this folder on
# sys.path for these tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "delivery"))

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FAULTY = "demo-n0023"
OUTSIDE = "demo-n0024"
"""A node of the cluster that does not run the job: its reports claim a job it is not in."""


def _scenario(job_id: str) -> Scenario:
    """The simulated job under the id of a real Slurm job, its machines named as the cluster's
    nodes (``demo-n0023``)."""
    return Scenario.model_validate(
        {
            "seed": 7,
            "duration_s": 60,
            "jobs": [
                {
                    "name": job_id,
                    "machine_prefix": "demo-n",
                    "machines": 32,
                    "machines_per_domain": 8,
                    "step_time_s": 3.0,
                }
            ],
            "faults": [
                {"type": "gpu_xid", "machine": 24, "device": "gpu1", "start_s": 10},
                {"type": "gpu_xid", "machine": 23, "device": "gpu5", "start_s": 20},
            ],
        }
    )


def test_a_fault_drains_its_node_and_a_false_positive_resumes_it(
    slurm_cluster: Any, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # the job the agents' SLURM_JOB_ID names, running on the faulty node
    job_id = slurm_cluster.submit_sleep(FAULTY, seconds=600)
    with alertmanager_server(tmp_path / "am") as am:
        # batches must be signed (the cluster key of isolated_settings), as the agents sign them
        settings = isolated_settings(
            broker.bootstrap, f"sqlite:///{tmp_path / 'minder.db'}", partitions=4
        )
        settings.api.token = "operator-token"
        settings.api.external_url = f"http://127.0.0.1:{settings.api.port}"
        settings.alertmanager.url = am.url
        settings.actions.target = "slurm"
        settings.actions.enforce = True
        settings.actions.scontrol = slurm_cluster.scontrol_path
        settings.actions.slurm_conf = slurm_cluster.conf_path
        stack = build_stack(settings, registry=CollectorRegistry())
        stack.start()
        try:
            send_scenario(settings, _scenario(job_id))

            def drained() -> tuple[frozenset[str], str] | None:
                flags, reason = slurm_cluster.node_state(FAULTY)
                return (flags, reason) if "DRAIN" in flags else None

            _, reason = wait_for(drained, 60, f"{FAULTY} drained")
            [alert] = [a for a in stack.service.alerts if a.machine == FAULTY]
            assert alert.job == job_id
            assert reason.startswith(f"minder:{alert.id}") and "gpu_xid_count" in reason
            # only the faulty node of the job, no other
            for node in (OUTSIDE, "demo-n0025"):
                assert "DRAIN" not in slurm_cluster.node_state(node)[0]

            # the report from outside the job: a suspicious_source alert instead of a drain
            operator = {"authorization": "Bearer operator-token"}  # reads need it too
            api = f"{stack.api_url}/api/v1"
            [claimed] = [a for a in stack.service.alerts if a.machine == OUTSIDE]

            def suspicious() -> list[dict[str, Any]]:
                page = httpx.get(
                    f"{api}/alerts", params={"kind": "suspicious_source"}, headers=operator
                ).json()
                return list(page["items"])

            [raised] = wait_for(suspicious, 30, "the suspicious_source alert")
            assert (raised["machine"], raised["job"]) == (OUTSIDE, job_id)
            assert raised["evidence"]["original_alert_id"] == claimed.id
            assert raised["evidence"]["reason"].startswith(
                f"node {OUTSIDE} is not running job {job_id} per slurm"
            )
            skipped = httpx.get(
                f"{api}/actions", params={"alert_id": claimed.id}, headers=operator
            ).json()["items"]
            assert [(e["operation"], e["outcome"]) for e in skipped] == [
                ("drain", "skipped_not_in_job")
            ]
            assert "DRAIN" not in slurm_cluster.node_state(OUTSIDE)[0]
            breaker = httpx.get(f"{api}/breaker", headers=operator)
            assert breaker.status_code == 200 and breaker.json()["tripped"] is False

            def in_alertmanager() -> list[dict[str, Any]]:
                return [a for a in am.alerts(active="true") if a["labels"].get("machine") == FAULTY]

            [shown] = wait_for(in_alertmanager, 30, "the alert in Alertmanager")
            assert shown["labels"]["alert_id"] == alert.id
            assert shown["labels"]["alertname"] == "MinderRule"
            assert shown["annotations"]["minder_url"].endswith(f"/api/v1/alerts/{alert.id}")

            def suspicious_in_alertmanager() -> list[dict[str, Any]]:
                return [
                    a
                    for a in am.alerts(active="true")
                    if a["labels"].get("alertname") == "MinderSuspiciousSource"
                ]

            [flagged] = wait_for(suspicious_in_alertmanager, 30, "MinderSuspiciousSource")
            assert flagged["labels"]["machine"] == OUTSIDE
            assert flagged["labels"]["alert_id"] == raised["id"]

            refused = httpx.patch(f"{api}/alerts/{alert.id}", json={"status": "false_positive"})
            assert refused.status_code == 401
            changed = httpx.patch(
                f"{api}/alerts/{alert.id}",
                json={"status": "false_positive", "by": "ops"},
                headers=operator,
            )
            assert changed.status_code == 200, changed.text

            def resumed() -> bool:
                flags, _ = slurm_cluster.node_state(FAULTY)
                return "DRAIN" not in flags and "ALLOCATED" in flags  # the job runs on

            wait_for(resumed, 60, f"{FAULTY} resumed")
            wait_for(lambda: not in_alertmanager(), 30, "the alert to end in Alertmanager")

            audit = httpx.get(
                f"{api}/actions", params={"alert_id": alert.id}, headers=operator
            ).json()["items"]
            assert [(e["operation"], e["outcome"], e["mode"]) for e in reversed(audit)] == [
                ("drain", "started", "enforce"),
                ("drain", "applied", "enforce"),
                ("resume", "applied", "enforce"),
            ]
            deliveries = httpx.get(
                f"{api}/deliveries", params={"alert_id": alert.id}, headers=operator
            ).json()
            by_destination = {(d["destination"], d["event"]): d["status"]
                              for d in deliveries["items"]}  # fmt: skip
            assert by_destination[("action:slurm", "alert.opened")] == "delivered"
            assert by_destination[("alertmanager", "alert.false_positive")] == "delivered"
            assert by_destination[("kafka", "alert.false_positive")] == "delivered"
        finally:
            stack.stop()
            slurm_cluster.reset(FAULTY)
