"""Root-cause verdicts on synthetic jobs with a known cause, and the thresholds themselves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from whatif import Thresholds, analyze
from whatif.synth import SynthJob, synthesize
from whatif.verdict import Evidence, decide


def _verdict(job: SynthJob) -> tuple[str, dict[str, object], Evidence]:
    report = analyze(synthesize(job))
    assert abs(report.model_error) < 0.05
    assert report.replay_error < 1e-9
    return report.verdict.cause, report.verdict.target, report.verdict.evidence


def test_individual_slow_worker() -> None:
    cause, target, evidence = _verdict(SynthJob(dp=8, pp=4, slow_workers={(1, 5): 2.5}))
    assert cause == "worker"
    assert target["workers"][0]["stage"] == 1 and target["workers"][0]["dp_rank"] == 5
    assert evidence.mw is not None and evidence.mw >= 0.5


def test_stage_imbalance_names_the_stage() -> None:
    cause, target, evidence = _verdict(SynthJob(dp=4, pp=4, stage_factor={2: 1.8}))
    assert cause == "stage"
    assert target == {"stage": 2}
    assert evidence.stage_share is not None and evidence.stage_share >= 0.5


def test_sequence_length_imbalance() -> None:
    cause, _, evidence = _verdict(SynthJob(dp=8, pp=2, microbatches=8, seq_cv=0.4))
    assert cause == "sequence_length"
    assert evidence.fwd_bwd_correlation is not None and evidence.fwd_bwd_correlation >= 0.9


def test_communication() -> None:
    cause, _, evidence = _verdict(SynthJob(dp=8, pp=4, comm_spike=30, comm_spike_rate=0.05))
    assert cause == "communication"
    assert evidence.comm_share is not None and evidence.comm_share >= 0.5


def test_no_significant_straggling() -> None:
    cause, _, evidence = _verdict(SynthJob(dp=4, pp=4))
    assert cause == "none"
    assert evidence.slowdown < 1.10


def test_forward_only_spikes_are_undetermined() -> None:
    # Python GC pauses hit forward only: straggling, but no single cause of the list.
    cause, _, evidence = _verdict(SynthJob(dp=8, pp=4, gc_rate=0.1, gc_pause=0.3))
    assert cause == "undetermined"
    assert evidence.fwd_bwd_correlation is not None and evidence.fwd_bwd_correlation < 0.9


def test_large_untraced_cpu_gaps_refuse_a_verdict() -> None:
    report = analyze(synthesize(SynthJob(dp=2, pp=2, launch_delay=0.05, stage_factor={1: 2.0})))
    assert report.model_error > 0.05
    assert report.verdict.cause == "unreliable"
    assert not report.verdict.reliable
    assert "untraced CPU work" in report.verdict.summary


BASE = Evidence(
    slowdown=1.3,
    model_error=0.01,
    mw=0.1,
    ms=0.2,
    comm_share=0.1,
    stage_share=0.2,
    fwd_bwd_correlation=0.5,
    forward_cv=0.2,
    worst_stage=3,
    worst_stage_slowdown=1.2,
    top_workers=[(3, 1, 1.25)],
)


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"model_error": 0.0501}, "unreliable"),
        ({"model_error": -0.0501}, "unreliable"),
        ({"model_error": 0.05, "slowdown": 1.0999}, "none"),
        ({"slowdown": 1.10, "mw": 0.5}, "worker"),
        ({"mw": 0.4999, "comm_share": 0.5}, "communication"),
        ({"stage_share": 0.5}, "stage"),
        ({"stage_share": 0.4999, "fwd_bwd_correlation": 0.9}, "sequence_length"),
        ({"fwd_bwd_correlation": 0.8999}, "undetermined"),
        ({"fwd_bwd_correlation": 0.95, "forward_cv": 0.0499}, "undetermined"),
        ({"fwd_bwd_correlation": 0.95, "stage_share": 0.51}, "stage"),
        ({"mw": None, "comm_share": None, "stage_share": None}, "undetermined"),
    ],
)
def test_thresholds_at_their_boundaries(change: dict[str, object], cause: str) -> None:
    assert decide(replace(BASE, **change)).cause == cause  # type: ignore[arg-type]


def test_thresholds_are_configurable_and_reported() -> None:
    strict = Thresholds(straggling_slowdown=1.5)
    verdict = decide(BASE, strict)
    assert verdict.cause == "none"
    assert verdict.to_dict()["thresholds"]["straggling_slowdown"] == 1.5
