"""A fault to a checked and returned node, through the whole running service, on real servers.

A simulated job with an injected GPU fault (an XID) goes through Kafka (Tansu) into the service
that ``minder serve`` builds (``build_stack``) with self-checks on: its rule alert drains the
faulty node in a real ``slurmctld``; the job dies; the service's self-check holds the node in a
``MAINT`` reservation with two idle partners and runs the real ``minder selfcheck run`` there
(the gloo collective, the CPU matmul, the disks); the suspect posts its verdict to the service's
own API with the check's token; the node goes back to ``IDLE`` and the alert is
``cleared_by_selfcheck``. tests/minder/actions/test_selfcheck_e2e.py drives the same loop part
by part, many times, and the failing verdict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from server_process import wait_for
from service_settings import isolated_settings, send_scenario
from slurm_cluster import ONE_HOST_COLLECTIVE

from collectors.sim.scenario import Scenario
from minder.service.stack import build_stack
from minder.stream import EmbeddedBroker
from minder.stream.broker import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FAULTY = "demo-n0023"
PARTNERS = ("demo-n0024", "demo-n0025")


def _scenario(job_id: str) -> Scenario:
    """The simulated job under the id of a real Slurm job, its machines named as the cluster's
    nodes; an XID on the faulty node's GPU."""
    return Scenario.model_validate(
        {
            "seed": 11,
            "duration_s": 40,
            "jobs": [
                {
                    "name": job_id,
                    "machine_prefix": "demo-n",
                    "machines": 32,
                    "machines_per_domain": 8,
                    "step_time_s": 3.0,
                }
            ],
            "faults": [{"type": "gpu_xid", "machine": 23, "device": "gpu2", "start_s": 10}],
        }
    )


def test_a_faulty_node_is_drained_checked_and_returned_by_the_running_service(
    slurm_cluster: Any, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    job_id = slurm_cluster.submit_sleep(FAULTY, seconds=600)
    baselines = tmp_path / "baselines.json"
    baselines.write_text(json.dumps({"no such device model": 1.0}))  # the CPU has no baseline
    work = tmp_path / "jobs"
    work.mkdir()
    work.chmod(0o777)
    settings = isolated_settings(
        broker.bootstrap, f"sqlite:///{tmp_path / 'minder.db'}", partitions=4
    )
    settings.api.token = "operator-token"
    settings.actions.target = "slurm"
    settings.actions.enforce = True
    settings.actions.scontrol = slurm_cluster.scontrol_path
    settings.actions.slurm_conf = slurm_cluster.conf_path
    settings.selfcheck.enabled = True
    settings.selfcheck.report_url = f"http://127.0.0.1:{settings.api.port}"
    settings.selfcheck.partners = 2
    settings.selfcheck.master_port = free_port()
    settings.selfcheck.interval_s = 0.5
    settings.selfcheck.command = [
        *ONE_HOST_COLLECTIVE,
        str(Path(sys.executable).with_name("minder")),
        "selfcheck",
        "run",
        *("--check", "collective.allreduce", "--check", "gpu.matmul", "--check", "host.disk"),
        *("--baseline-file", str(baselines), "--format", "json"),
    ]
    stack = build_stack(settings, registry=CollectorRegistry())
    stack.start()
    operator = {"authorization": "Bearer operator-token"}
    api = f"{stack.api_url}/api/v1"
    try:
        send_scenario(settings, _scenario(job_id))

        wait_for(lambda: "DRAIN" in slurm_cluster.node_state(FAULTY)[0] or None, 60, "the drain")
        [alert] = [a for a in stack.service.alerts if a.machine == FAULTY]
        assert alert.job == job_id
        slurm_cluster.cancel_job(job_id)  # the fault killed the job: the node is DRAINED

        def cleared() -> dict[str, Any] | None:
            found = httpx.get(f"{api}/alerts/{alert.id}", headers=operator).json()
            return found if found["status"] == "cleared_by_selfcheck" else None

        shown = wait_for(cleared, 240, "the alert cleared by its self-check")
        assert shown["evidence"]["selfcheck"]["verdict"] == "pass"
        flags, reason = slurm_cluster.wait_idle(FAULTY, timeout_s=60)
        assert flags == {"IDLE"} and reason == ""
        [check] = httpx.get(
            f"{api}/selfchecks", params={"alert_id": alert.id}, headers=operator
        ).json()["items"]
        assert check["state"] == "passed" and check["node"] == FAULTY
        assert tuple(check["partners"]) == PARTNERS
        names = {c["name"]: c["status"] for c in check["report"]["checks"]}
        assert names == {"collective.allreduce": "pass", "gpu.matmul": "pass", "host.disk": "pass"}
        assert check["returned_ts"] is not None and check["drained_ts"] is not None
        job = check["scheduler_ref"].split(":")[0]
        assert slurm_cluster.job_state(job) == "COMPLETED"  # the check really ran there
        audit = httpx.get(f"{api}/actions", params={"alert_id": alert.id}, headers=operator)
        operations = [(e["operation"], e["outcome"]) for e in audit.json()["items"]]
        assert ("drain", "applied") in operations
        breaker = httpx.get(f"{api}/breaker", headers=operator).json()
        assert breaker["tripped"] is False  # the default bounds: out and back is one machine
    finally:
        stack.stop()
        slurm_cluster.reset(FAULTY)
