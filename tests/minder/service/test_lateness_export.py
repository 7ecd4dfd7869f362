"""``minder_rank_lateness_seconds``: the job's latest ranks, bounded like the machine scores
(here with ``machine_series_per_job=0``: the top-k only; every rank up to the bound is
test_machine_score_export.py's), gone with the job."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from detectors.methods import default_factory
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService, ServiceLimits
from minder.service.telemetry import ServiceMetrics

NOW = 1_800_000_000.0
STEP_S, BUSY_S = 1.0, 0.7
LATE = ("n05", "rank2")


def lateness_series(s: DetectionService) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["machine"], sample.labels["device"]): sample.value
        for metric in s.metrics.registry.collect()
        if metric.name == "minder_rank_lateness_seconds"
        for sample in metric.samples
    }


def test_the_late_rank_is_exported_first_for_the_top_k_only_and_forgotten_with_the_job() -> None:
    s = DetectionService(
        default_factory(),
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=lambda: NOW,
        limits=ServiceLimits(top_k_scores=5, machine_series_per_job=0),
    )
    s.persist_every_s = 1
    nodes = [f"n{i:02d}" for i in range(16)]
    step_time = BUSY_S * 1.2 + (STEP_S - BUSY_S)  # everyone waits for the late rank
    for t in range(40):
        s.clock = lambda t=t: NOW + t
        batches = []
        for i, node in enumerate(nodes):
            samples = []
            for r in range(4):
                jitter = 1 + 0.002 * ((i * 4 + r) % 5 - 2)
                busy = BUSY_S * (1.2 if (node, f"rank{r}") == LATE else jitter)
                samples += [
                    ("train_step_seconds", f"rank{r}", step_time),
                    ("nccl_collective_seconds", f"rank{r}", step_time - busy),
                    ("train_step_number", f"rank{r}", float(t + 1)),
                ]
            batches.append(NodeBatch("j", node, NOW + t, samples=samples))
        s.ingest(batches)
        s.tick()
    exported = lateness_series(s)
    assert 0 < len(exported) <= 5
    latest = max(exported, key=lambda key: exported[key])
    assert latest == LATE
    assert abs(exported[LATE] - 0.2 * BUSY_S) < 0.01
    assert all(v < 0.01 for key, v in exported.items() if key != LATE)
    s._retire("j")
    assert lateness_series(s) == {}
