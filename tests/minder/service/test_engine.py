"""The detection loop without Kafka: data time, grace, idle jobs, metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from collectors.sim import Scenario, iter_batches
from detectors.base import default_factory
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.service.telemetry import ServiceMetrics

SCENARIO = Scenario.model_validate(
    {
        "seed": 2,
        "duration_s": 60,
        "jobs": [
            {"name": "a", "machines": 8, "step_time_s": 3.0},
            {"name": "b", "machines": 8, "step_time_s": 4.0},
        ],
        "faults": [{"type": "gpu_xid", "job": "b", "machine": 5, "device": "gpu0", "start_s": 20}],
    }
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _service(clock: Clock) -> DetectionService:
    metrics = ServiceMetrics(CollectorRegistry())
    return DetectionService(default_factory(), grace_s=2, metrics=metrics, clock=clock,
                            idle_job_s=60)  # fmt: skip


def test_each_second_is_evaluated_once_after_the_grace_period() -> None:
    clock = Clock()
    service = _service(clock)
    alerts = []
    for _, batches in iter_batches(SCENARIO):
        service.ingest(batches)
        alerts += service.tick()
        for state in service.jobs.values():
            assert state.evaluated_sec == state.window.newest_sec - 2
    assert [(a.job, a.machine) for a in alerts] == [("b", "b-n0005")]
    assert set(service.jobs) == {"a", "b"}
    # Replaying the same tick changes nothing: every second was evaluated exactly once.
    assert service.tick() == []
    registry = service.metrics.registry
    assert registry.get_sample_value("minder_alerts_total", {"kind": "rule"}) == 1
    assert registry.get_sample_value("minder_jobs") == 2
    assert registry.get_sample_value("minder_machines") == 16
    assert (
        registry.get_sample_value("minder_machine_score", {"job": "a", "machine": "a-n0001"}) >= 0
    )


def test_samples_older_than_the_window_are_counted() -> None:
    service = _service(Clock())
    service.ingest([NodeBatch("j", "n1", 1000.5, samples=[("cpu_util_ratio", "", 0.5)])])
    service.ingest([NodeBatch("j", "n1", 900.5, samples=[("cpu_util_ratio", "", 0.5)])])
    assert service.metrics.registry.get_sample_value("minder_samples_too_old_total") == 1


def test_idle_jobs_are_dropped_with_their_series() -> None:
    clock = Clock()
    service = _service(clock)
    service.ingest([NodeBatch("j", f"n{i}", 1000.5, samples=[("cpu_util_ratio", "", 0.5)])
                    for i in range(5)])  # fmt: skip
    service.tick()
    assert "j" in service.jobs
    clock.now += 61
    service.tick()
    assert service.jobs == {}
    assert service.metrics.registry.get_sample_value("minder_jobs") == 0


def test_processing_lag_is_wall_clock_minus_newest_sample() -> None:
    clock = Clock()
    service = _service(clock)
    service.ingest([NodeBatch("j", "n1", clock.now - 3.5, samples=[("cpu_util_ratio", "", 0.5)])])
    assert service.metrics.registry.get_sample_value("minder_processing_lag_seconds") == 3.5
