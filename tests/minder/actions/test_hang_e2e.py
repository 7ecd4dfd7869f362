"""A hang, end to end, on real servers: real flight-recorder dumps of a real hung gloo job, two
real ``minder agent`` processes that find them in their dump directories, Kafka (Tansu), the
detection service, a ``hang`` alert naming the rank that never joined the collective, and a
Slurm drain of its node in log-only mode, checked with a real ``slurmctld``.

The job: 4 ranks, rank 1 skips one ``all_reduce`` (the others wait in it). Ranks 0 and 2 run on
``demo-n0023``, ranks 1 and 3 on ``demo-n0024``; each node's agent sees only its own ranks'
dumps, as on a real cluster, and the service puts them together.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from server_process import wait_for
from service_settings import isolated_settings

from minder.core.signing import format_node_key, load_cluster_keys
from minder.service.stack import build_stack
from minder.stream import EmbeddedBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

NODES = {"demo-n0023": (0, 2), "demo-n0024": (1, 3)}
CULPRIT_NODE = "demo-n0024"


def _agent(
    node: str, job: str, bootstrap: str, topic: str, key_file: Path, prefix: Path, tmp: Path
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MINDER_"))}
    env["MINDER_KAFKA__METRICS_TOPIC"] = topic
    args = [
        sys.executable,
        "-m",
        "minder.cli",
        "agent",
        "--job",
        job,
        "--node",
        node,
        "--interval",
        "1",
        "--no-nvml",
        "--probe-address",
        "off",
        "--ethtool-command",
        "off",
        "--sysfs-root",
        str(tmp / "no-sys"),
        "--kafka",
        bootstrap,
        "--spool-dir",
        str(tmp / f"spool-{node}"),
        "--metrics-port",
        "0",
        "--signing-key",
        str(key_file),
        "--fr-prefix",
        str(prefix),
        "--fr-poll",
        "1",
    ]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{node}.log", "wb")
    )


def test_a_hung_rank_found_in_real_dumps_drains_its_node_in_log_only_mode(
    slurm_cluster: Any, broker: EmbeddedBroker, real_hang_dumps: Any, tmp_path: Path
) -> None:
    case = real_hang_dumps["skip"]
    assert case.culprit_ranks == [1]
    job_id = slurm_cluster.submit_sleep(list(NODES), seconds=600)
    settings = isolated_settings(broker.bootstrap, f"sqlite:///{tmp_path / 'minder.db'}")
    settings.api.token = "operator-token"
    settings.actions.target = "slurm"
    settings.actions.enforce = False  # log-only: audited as a dry run, nothing drained
    settings.actions.scontrol = slurm_cluster.scontrol_path
    settings.actions.slurm_conf = slurm_cluster.conf_path
    assert settings.auth.keys_file is not None
    cluster_key = load_cluster_keys(settings.auth.keys_file)[-1]
    stack = build_stack(settings, registry=CollectorRegistry())
    stack.start()
    agents: list[subprocess.Popen[bytes]] = []
    try:
        dump_dirs = {}
        for node in NODES:
            key_file = tmp_path / f"{node}.key"
            key_file.write_text(format_node_key(cluster_key.node_key(node)))
            key_file.chmod(0o600)
            dump_dirs[node] = tmp_path / f"dumps-{node}"
            dump_dirs[node].mkdir()
            agents.append(
                _agent(
                    node,
                    job_id,
                    broker.bootstrap,
                    settings.kafka.metrics_topic,
                    key_file,
                    dump_dirs[node] / case.prefix,
                    tmp_path,
                )
            )
        service = stack.service
        wait_for(lambda: job_id in service.jobs, 60, "the agents' job at the service")
        # The watchdog's dumps land on each node while the agents run.
        for node, ranks in NODES.items():
            for rank in ranks:
                shutil.copy(case.pickle_dir / f"{case.prefix}{rank}", dump_dirs[node])

        def culprit_alert() -> list[Any]:
            return [a for a in service.alerts if a.kind.value == "hang" and a.machine]

        try:
            [alert] = wait_for(culprit_alert, 60, "the hang alert of the culprit's node")
        except AssertionError:
            window = service.jobs[job_id].window
            consumer = stack.worker.consumer.stats if stack.worker else None
            raise AssertionError(
                f"no hang alert: window {window.stats}, consumer {consumer}, "
                f"agents' logs in {tmp_path}"
            ) from None
        assert (alert.job, alert.machine) == (job_id, CULPRIT_NODE)
        assert alert.evidence["culprit_ranks"] == [1]

        operator = {"authorization": f"Bearer {settings.api.token}"}
        api = f"{stack.api_url}/api/v1"
        hang = httpx.get(f"{api}/jobs/{job_id}/hang", headers=operator)
        assert hang.status_code == 200, hang.text
        analysis = hang.json()["analysis"]
        assert analysis["hung"] is True and analysis["culprit_ranks"] == [1]
        assert analysis["culprit_machines"] == [CULPRIT_NODE]

        def audited() -> list[dict[str, Any]]:
            page = httpx.get(f"{api}/actions", params={"alert_id": alert.id}, headers=operator)
            return [e for e in page.json()["items"] if e["outcome"] == "dry_run"]

        [entry] = wait_for(audited, 60, "the log-only drain of the culprit's node")
        assert (entry["operation"], entry["node"], entry["mode"]) == (
            "drain",
            CULPRIT_NODE,
            "dry_run",
        )
        assert f"{CULPRIT_NODE} runs job {job_id} per slurm" in entry["detail"]
        # log-only: no node of the job was drained
        for node in NODES:
            assert "DRAIN" not in slurm_cluster.node_state(node)[0]
        # the job-level alert holds the analysis and is never acted on itself
        [job_alert] = [a for a in service.alerts if a.kind.value == "hang" and not a.machine]
        assert job_alert.evidence["analysis"]["culprit_ranks"] == [1]
    finally:
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
        stack.stop()
        for node in NODES:
            slurm_cluster.reset(node)
