"""``bench/ingest_e2e.py`` stays runnable: a tiny end-to-end run through Tansu and real
``minder serve`` workers, and its helpers."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from kafka.partitioner.default import murmur2

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "ingest_e2e.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ingest_e2e", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ingest_e2e", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_job_names_fill_every_partition_alike() -> None:
    names = _bench().balanced_job_names(8, 4)
    partitions = [(murmur2(name.encode()) & 0x7FFFFFFF) % 4 for name in names]
    assert len(set(names)) == 8 and sorted(partitions) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_tree_that_does_not_hold_minder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="minder is imported from"):
        _bench().check_root(tmp_path)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_tiny_run_drains_everything_it_produced(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, str(BENCH), "--machines", "12", "--seconds", "3"]
    command += ["--scale-jobs", "2", "--workers", "2", "--live-seconds", "4"]
    command += ["--live-machines", "12", "--timeout-s", "90", "--out", str(out)]
    result = subprocess.run(
        command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    tree = report["trees"]["current"]
    assert Path(tree["minder_file"]).is_relative_to(ROOT)
    assert tree["fill"]["sent"] == 12 * 3
    assert sum(tree["drain"]["per_worker_batches"]) >= 12 * 3
    [two] = tree["scale"]["runs"]
    assert two["workers"] == 2 and len(two["per_worker_batches"]) == 2
    assert sum(two["per_worker_batches"]) >= 2 * 6 * 3
    live = tree["live"]
    assert live["batches_sent"] == 12 * 4 and live["batches_ingested"] >= live["batches_sent"]
    assert 0 <= live["lag_p99_s"] < 30 and live["producer"]["max_slip_s"] is not None


def test_the_series_it_reads_are_the_services_own() -> None:
    """What the bench reads from a worker: each series of the service's real ``/metrics``
    page, summed over its labels; a series the page lacks (an older tree's) reads 0."""
    from prometheus_client import CollectorRegistry, generate_latest

    from minder.service.telemetry import ServiceMetrics

    metrics = ServiceMetrics(CollectorRegistry())
    metrics.batches.inc(12)
    metrics.lag.set(0.25)
    metrics.assigned_partitions.set(3)
    metrics.consumer_lag.labels("m", "0").set(5)
    metrics.consumer_lag.labels("m", "1").set(2)
    metrics.state_machines_written.inc(40)
    metrics.state_write_seconds.observe(0.5)
    metrics.state_write_seconds.observe(0.25)
    metrics.state_captures_superseded.inc()
    for cpu in (0.01, 0.02, 0.03):
        metrics.evaluation_seconds.observe(cpu)
    values = _bench().read_series(generate_latest(metrics.registry).decode())
    assert values == {
        "batches": 12,
        "lag_s": 0.25,
        "assigned": 3,
        "backlog": 7,
        "state_machines": 40,
        "state_write_s": 0.75,
        "state_superseded": 1,
        "evaluations": 3,
        "evaluation_cpu_s": pytest.approx(0.06),
    }
    assert set(_bench().read_series("# HELP nothing\n").values()) == {0.0}
