"""``minder_machine_score_all``: every machine of a job (a silent one too) up to
``machine_series_per_job``, the highest beyond it, beside the top-k ``minder_machine_score``;
the per-rank lateness of every rank up to the same bound; all gone with the job."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from detectors.methods import default_factory
from minder.config import DetectionSettings, SettingsError
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService, ServiceLimits
from minder.service.telemetry import ServiceMetrics

NOW = 1_800_000_000.0
MACHINES = [f"n{i:02d}" for i in range(24)]
SILENT = "n23"
"""Reports for the first seconds, then never again (its agent died)."""


def series(s: DetectionService, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for k, v in sorted(sample.labels.items()) if k != "job_id"): sample.value
        for metric in s.metrics.registry.collect()
        if metric.name == name
        for sample in metric.samples
    }


def run(**limits: int) -> DetectionService:
    s = DetectionService(
        default_factory(),
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=lambda: NOW,
        limits=ServiceLimits(**limits),  # type: ignore[arg-type]
    )
    s.persist_every_s = 1
    for t in range(30):
        s.clock = lambda t=t: NOW + t
        batches = []
        for i, node in enumerate(MACHINES):
            if node == SILENT and t >= 3:
                continue
            samples = [("gpu_util_ratio", f"gpu{g}", 0.9 + i / 1000 + g / 10_000) for g in range(2)]
            for r in range(2):
                busy = 0.7 * (1.3 if (node, r) == ("n05", 1) else 1.0)
                samples += [
                    ("train_step_seconds", f"rank{r}", 1.0 + 0.3 * 0.7),
                    ("nccl_collective_seconds", f"rank{r}", 1.0 + 0.3 * 0.7 - busy),
                    ("train_step_number", f"rank{r}", float(t + 1)),
                ]
            batches.append(NodeBatch("j", node, NOW + t, samples=samples))
        s.ingest(batches)
        s.tick()
    return s


def test_every_machine_of_the_job_is_exported_and_the_top_k_too() -> None:
    s = run(top_k_scores=3)

    whole = series(s, "minder_machine_score_all")
    assert {m for (m,) in whole} == set(MACHINES)  # the silent machine can be picked
    assert whole[(SILENT,)] >= 0.0
    top = series(s, "minder_machine_score")
    assert len(top) == 3
    highest = sorted(whole.values(), reverse=True)[:3]
    assert sorted(top.values(), reverse=True) == pytest.approx(highest)
    assert all(whole[key] == value for key, value in top.items())
    # Every rank of the synchronous job, the late one latest.
    lateness = series(s, "minder_rank_lateness_seconds")
    assert set(lateness) == {(f"rank{r}", m) for m in MACHINES for r in range(2)}
    assert max(lateness, key=lambda key: lateness[key]) == ("rank1", "n05")

    s._retire("j")
    assert series(s, "minder_machine_score_all") == {}
    assert series(s, "minder_machine_score") == {}
    assert series(s, "minder_rank_lateness_seconds") == {}


def test_beyond_the_bound_the_highest_scores_are_exported() -> None:
    s = run(top_k_scores=3, machine_series_per_job=10)

    whole = series(s, "minder_machine_score_all")
    assert len(whole) == 10
    everyone = s.capture("j").top(len(MACHINES))
    assert sorted(whole.values(), reverse=True) == pytest.approx([v for _, v in everyone[:10]])
    assert len(series(s, "minder_rank_lateness_seconds")) == 10
    assert len(series(s, "minder_machine_score")) == 3


def test_a_bound_of_zero_keeps_the_top_k_only() -> None:
    s = run(top_k_scores=3, machine_series_per_job=0)

    assert series(s, "minder_machine_score_all") == series(s, "minder_machine_score")
    assert len(series(s, "minder_machine_score")) == 3
    assert len(series(s, "minder_rank_lateness_seconds")) == 3


def test_the_setting_can_lower_the_bound_but_not_raise_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert DetectionSettings().service_limits().machine_series_per_job == 4_096
    lowered = DetectionSettings(machine_series_per_job=512).service_limits()
    assert lowered.machine_series_per_job == 512
    with pytest.raises(ValueError, match="4096"):
        DetectionSettings(machine_series_per_job=10_000)
    from minder.config import Settings

    monkeypatch.setenv("MINDER_DETECTION__MACHINE_SERIES_PER_JOB", "100000")
    with pytest.raises(SettingsError, match="MINDER_DETECTION__MACHINE_SERIES_PER_JOB"):
        Settings.load()
