"""The service's /metrics: the series dashboards and rules read, label hygiene, promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.sim import Scenario, iter_batches
from detectors.methods import default_factory
from minder.service.engine import DetectionService
from minder.service.sinks import SqlStateStore
from minder.service.telemetry import ServiceMetrics
from minder.service.whatif_runner import WhatIfMetrics
from minder.storage import create_engine_for, session_factory
from minder.storage.migrate import upgrade_database

SCENARIO = Scenario.model_validate(
    {
        "seed": 3,
        "duration_s": 40,
        "jobs": [
            {"name": "a", "machines": 8, "step_time_s": 3.0},
            {"name": "b", "machines": 8, "step_time_s": 4.0},
        ],
        "faults": [{"type": "gpu_xid", "job": "b", "machine": 5, "device": "gpu0", "start_s": 10}],
    }
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _run(tmp_path: Path) -> tuple[DetectionService, Clock]:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade_database(engine)
    metrics = ServiceMetrics(CollectorRegistry())
    clock = Clock()
    service = DetectionService(
        default_factory(),
        grace_s=2,
        metrics=metrics,
        store=SqlStateStore(session_factory(engine)),
        clock=clock,
        idle_job_s=60,
    )
    service.open_alerts_every_s = 0.0
    for ts, batches in iter_batches(SCENARIO, start_ts=clock.now):
        clock.now = ts + 0.5
        service.ingest(batches)
        service.tick()
    return service, clock


def _exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_series_of_the_dashboards_exist_per_job(tmp_path: Path) -> None:
    service, clock = _run(tmp_path)
    r = service.metrics.registry
    assert r.get_sample_value("minder_open_alerts", {"job_id": "b", "kind": "rule"}) == 1
    assert r.get_sample_value("minder_open_alerts", {"job_id": "a", "kind": "rule"}) == 0
    assert r.get_sample_value("minder_open_alerts", {"job_id": "a", "kind": "silence"}) == 0
    for job in ("a", "b"):
        assert r.get_sample_value("minder_job_machines", {"job_id": job}) == 8
        last = r.get_sample_value("minder_job_last_sample_timestamp_seconds", {"job_id": job})
        assert last is not None and clock.now - 2 <= last <= clock.now
        evaluated = r.get_sample_value(
            "minder_job_last_evaluation_timestamp_seconds", {"job_id": job}
        )
        assert evaluated is not None and evaluated <= clock.now
    assert r.get_sample_value("minder_build_info", {"version": "0.1.0"}) == 1
    # counters exist at 0 from the start, so their first increment shows in rate()
    assert r.get_sample_value("minder_alert_deliveries_total", {"sink": "store",
                                                                "outcome": "dropped"}) == 0  # fmt: skip
    assert r.get_sample_value("minder_batches_rejected_total", {"reason": "future_timestamp"}) == 0

    # a retired job takes its series with it
    clock.now += 3600
    service.tick()
    text = _exposition(r)
    assert service.jobs == {}
    assert 'job_id="a"' not in text  # no alert open: every series of the job is gone
    assert 'minder_machine_score{job_id="b"' not in text
    assert 'minder_job_machines{job_id="b"}' not in text
    # the job's alert is still open, so the operator still sees it
    assert r.get_sample_value("minder_open_alerts", {"job_id": "b", "kind": "rule"}) == 1


def test_no_label_is_named_job_or_instance(tmp_path: Path) -> None:
    service, _ = _run(tmp_path)
    WhatIfMetrics.on(service.metrics.registry).set_job("b", 1.25, "worker")
    families = list(text_string_to_metric_families(_exposition(service.metrics.registry)))
    labels = {name for f in families for s in f.samples for name in s.labels}
    assert {"job_id", "machine", "kind"} <= labels
    assert not labels & {"job", "instance", "exported_job"}


def test_what_if_gauges_keep_only_the_latest_verdict() -> None:
    registry = CollectorRegistry()
    metrics = WhatIfMetrics.on(registry)
    metrics.set_job("llm", 1.25, "worker")
    metrics.set_job("llm", 2.0, "stage")
    assert registry.get_sample_value("minder_whatif_waste_ratio", {"job_id": "llm"}) == 0.5
    assert registry.get_sample_value("minder_whatif_verdict_info", {"job_id": "llm",
                                                                    "verdict": "stage"}) == 1  # fmt: skip
    assert (
        registry.get_sample_value(
            "minder_whatif_verdict_info", {"job_id": "llm", "verdict": "worker"}
        )
        is None
    )


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian 'prometheus') absent"
)
def test_promtool_accepts_the_service_metrics(tmp_path: Path) -> None:
    service, _ = _run(tmp_path)
    WhatIfMetrics.on(service.metrics.registry).set_job("b", 1.25, "worker")
    text = _exposition(service.metrics.registry)
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
