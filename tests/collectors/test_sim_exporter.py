"""The simulated machines' ``/metrics`` (collectors/sim/exporter.py): what their agents would
serve, scraped over HTTP and parsed as Prometheus does."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from collectors.sim import Scenario, iter_batches
from collectors.sim.exporter import SimulationExporter
from collectors.sim.scenario import STRAGGLER_METRICS
from minder.core.records import Event, EventKind, NodeBatch

MACHINES = 8
METRICS = [*STRAGGLER_METRICS, "gpu_util_ratio", "cpu_util_ratio", "gpu_xid_count"]


def scenario(**faults: object) -> Scenario:
    return Scenario.model_validate(
        {
            "seed": 3,
            "duration_s": 40,
            "jobs": [
                {
                    "name": "sim",
                    "machines": MACHINES,
                    "gpus_per_machine": 2,
                    "pp_stages": 2,
                    "machines_per_domain": 4,
                    "step_time_s": 2.0,
                    "metrics": METRICS,
                }
            ],
            "faults": [faults] if faults else [],
        }
    )


def scrape(exporter: SimulationExporter) -> dict[str, dict[tuple[str, str, str], float]]:
    port = exporter.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        exporter.close()
    result: dict[str, dict[tuple[str, str, str], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            key = (labels["job_id"], labels["machine"], labels["device"])
            result.setdefault(sample.name, {})[key] = sample.value
    return result


def test_every_machine_serves_its_newest_batch_as_its_agent_would() -> None:
    exporter = SimulationExporter()
    last: dict[str, NodeBatch] = {}
    for _, batches in iter_batches(scenario(type="gpu_xid", machine=2, device="gpu1", start_s=5)):
        exporter.update(batches)
        for batch in batches:
            if batch.ts >= last.get(batch.node, batch).ts:
                last[batch.node] = batch

    exposition = scrape(exporter)

    machines = {f"sim-n{i:04d}" for i in range(MACHINES)}
    assert {m for _, m, _ in exposition["minder_node_gpu_util_ratio"]} == machines
    for metric in ("train_step_seconds", "train_busy_seconds", "nccl_collective_seconds"):
        series = exposition[f"minder_node_{metric}"]
        assert {d for _, _, d in series} == {"rank0", "rank1"}, metric
    assert set(exposition["minder_node_cpu_util_ratio"]) == {("sim", m, "") for m in machines}
    node = "sim-n0003"
    for metric, device, value in last[node].samples:
        if not metric.endswith("_count"):
            assert exposition[f"minder_node_{metric}"][("sim", node, device)] == pytest.approx(
                value
            )
    # The XID count is a counter of the events since the start, as the agent's.
    xids = exposition["minder_node_gpu_xid_total"]
    assert xids[("sim", "sim-n0002", "gpu1")] >= 1
    assert xids[("sim", node, "gpu1")] == 0
    assert not any(name.startswith("minder_agent_") for name in exposition)


def test_a_silent_machine_and_one_that_said_goodbye_leave_the_exposition() -> None:
    exporter = SimulationExporter(stale_s=10)
    for _, batches in iter_batches(scenario(type="machine_unreachable", machine=4, start_s=5)):
        exporter.update(batches)
    last_ts = max(ts for ts, _ in iter_batches(scenario()))
    exporter.update(
        [NodeBatch("sim", "sim-n0005", last_ts, events=[Event(EventKind.LEAVE, "", last_ts)])]
    )

    served = {m for _, m in exporter.machines()}
    assert "sim-n0004" not in served  # silent since 5 s in
    assert "sim-n0005" not in served  # goodbye
    assert len(served) == MACHINES - 2
    assert {m for _, m, _ in scrape(exporter)["minder_node_gpu_util_ratio"]} == served


def test_metrics_port_needs_kafka() -> None:
    from minder.cli import app

    result = CliRunner().invoke(app, ["simulate", "demo", "--metrics-port", "9479"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: --metrics-port 9479 without --kafka: expected --kafka BOOTSTRAP too"]
