"""The true slowdown S of a simulated straggler, replayed by the what-if analysis on the
simulator's op trace: what ``whatif.analysis.analyze`` measures, per span, with the labels' S
as a cross-check."""

from __future__ import annotations

from typing import Any

import pytest

from collectors.sim import Scenario, scenario_labels
from collectors.sim.optrace import op_table
from minder.benchmark.truth import replayed_slowdown, slowdown_replay
from whatif.analysis import analyze
from whatif.trace import JobMeta, make_trace

ONSET = 60.0
STEP_S = 1.5


def scenario(fault: dict[str, Any], **job: Any) -> Scenario:
    spec = {
        "name": "j",
        "machines": 8,
        "gpus_per_machine": 4,
        "step_time_s": STEP_S,
        "comm_fraction": 0.3,
        "metrics": ["train_step_seconds", "train_busy_seconds"],
        **job,
    }
    return Scenario.model_validate(
        {"seed": 3, "duration_s": 300, "jobs": [spec], "faults": [{**fault, "start_s": ONSET}]}
    )


def test_the_replayed_slowdown_is_the_what_if_analysis_s_of_the_same_steps() -> None:
    scen = scenario({"type": "slow_worker", "machine": 2, "factor": 1.3})
    frame = op_table(scen, start_s=ONSET, end_s=200.0)
    full = analyze(make_trace(frame, JobMeta(dp_size=32, pp_size=1))).slowdown
    assert replayed_slowdown(scen, ONSET, 200.0) == pytest.approx(full, rel=1e-9)
    assert full == pytest.approx(scenario_labels(scen)["slowdown"].iloc[0], rel=0.01)
    # Before the onset the job is balanced (the ideal communication is its median, not its
    # mean: within a few 0.1 %).
    assert replayed_slowdown(scen, 0.0, ONSET) == pytest.approx(1.0, abs=0.005)
    # An alert matched at its onset judged no step: no S, not an error
    assert replayed_slowdown(scen, ONSET, ONSET) is None
    assert replayed_slowdown(scen, ONSET, ONSET - 1.0) is None


def test_a_flapping_worker_costs_its_slow_turns_not_its_whole_span() -> None:
    period = 30.0
    scen = scenario({"type": "flapping_worker", "machine": 5, "factor": 1.5, "period_s": period})
    label = scenario_labels(scen)["slowdown"].iloc[0]
    slow_turn = replayed_slowdown(scen, ONSET, ONSET + period)
    normal_turn = replayed_slowdown(scen, ONSET + period + 2 * STEP_S, ONSET + 2 * period)
    whole = replayed_slowdown(scen, ONSET, 300.0)
    assert slow_turn == pytest.approx(label, rel=0.01)
    assert normal_turn == pytest.approx(1.0, abs=0.005)
    assert whole is not None and 1.05 < whole < label - 0.05


def test_the_last_steps_of_a_span_are_those_an_alert_judged() -> None:
    scen = scenario({"type": "transient_straggler", "machine": 1, "duration_s": 15 * STEP_S})
    # The 10 steps before 60 s after the onset: the transient ended long before, S = 1.
    assert replayed_slowdown(scen, ONSET, ONSET + 60, last_steps=10) == pytest.approx(
        1.0, abs=0.005
    )
    assert replayed_slowdown(scen, ONSET, ONSET + 60) > 1.05


def test_unix_times_of_the_benchmark_map_to_scenario_seconds() -> None:
    scen = scenario({"type": "slow_worker", "machine": 2, "factor": 1.3})
    replay = slowdown_replay(scen)
    assert replay(scen.start_ts + ONSET, scen.start_ts + 200.0, None) == replayed_slowdown(
        scen, ONSET, 200.0
    )


def test_no_replayed_slowdown_for_an_asynchronous_job_or_an_empty_span() -> None:
    fault = {"type": "slow_worker", "machine": 2, "factor": 1.3}
    assert replayed_slowdown(scenario(fault, sync=False), ONSET, 200.0) is None
    assert replayed_slowdown(scenario(fault), ONSET, ONSET + 0.5) is None
