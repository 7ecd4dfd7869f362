"""The dependency model and the replay on hand-computed and synthetic traces."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from minder.core.errors import TraceError
from whatif import JobMeta, analyze, build_model, make_trace
from whatif.scenarios import Replayer, Scenario
from whatif.synth import SynthJob, synthesize


def _dp2_rows(rs_dp0: float = 0.34) -> list[tuple[int, str, int, float, float]]:
    """pp 1 × dp 2, 2 microbatches, one step; times by hand (dp_rank, optype, seq, start, dur)."""
    rows = [
        (0, "params-all-gather", 0, 0.000, 0.012),
        (1, "params-all-gather", 0, 0.002, 0.010),
    ]
    for dp, (f, b) in enumerate(((0.1, 0.2), (0.15, 0.3))):
        t = 0.012
        for kind, mb, dur in (
            ("forward-compute", 0, f),
            ("backward-compute", 0, b),
            ("forward-compute", 1, f),
            ("backward-compute", 1, b),
        ):
            rows.append((dp, kind, mb, t, dur))
            t += dur
    rows += [
        (0, "grads-reduce-scatter", 0, 0.612, rs_dp0),
        (1, "grads-reduce-scatter", 0, 0.912, 0.040),
        (0, "optimizer-clip-main-grad", 0, 0.952, 0.004),
        (1, "optimizer-clip-main-grad", 0, 0.952, 0.004),
        (0, "optimizer", 0, 0.956, 0.05),
        (1, "optimizer", 0, 0.956, 0.05),
    ]
    return rows


def _frame(rows: list[tuple[int, str, int, float, float]], step: int = 0) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["dp_rank", "optype", "seq_id", "start_ts", "duration"])
    frame["stage"] = 0
    frame["step"] = step
    return frame


def test_hand_computed_dp2_job() -> None:
    trace = make_trace(_frame(_dp2_rows()), JobMeta(dp_size=2, pp_size=1))
    model = build_model(trace)
    t = model.template
    rs = int(t.ops_of(["grads-reduce-scatter"])[0])
    pag = int(t.ops_of(["params-all-gather"])[0])
    # transfer = end − latest start over the DP group; launch delay from the step's first start.
    assert model.transfer[rs, 0] == pytest.approx([0.04, 0.04])
    assert model.transfer[pag, 0] == pytest.approx([0.010, 0.010])
    assert model.launch_delay[pag, 0] == pytest.approx([0.0, 0.002])
    report = analyze(trace)
    assert report.t_actual == pytest.approx(1.006)
    assert report.t_original == pytest.approx(1.004)  # PAG no longer waits for dp 1's delay
    assert report.t_ideal == pytest.approx(0.854)  # F 0.125, B 0.25 everywhere
    assert report.slowdown == pytest.approx(1.004 / 0.854)
    assert report.model_error == pytest.approx(1.006 / 1.004 - 1)
    assert report.by_dp_rank[1] == pytest.approx(1.004 / 0.854)
    assert report.by_dp_rank[0] == pytest.approx(1.0)
    assert report.by_optype["forward-compute"] == pytest.approx(0.904 / 0.854)
    assert report.mw.value == pytest.approx(1.0)
    assert report.mw.target["workers"] == [{"stage": 0, "dp_rank": 1}]
    assert report.ms.value == pytest.approx(1.0)


def test_clock_skew_is_clamped_and_counted() -> None:
    # dp 0's reduce-scatter "ends" 100 ms before dp 1 starts it: clock error, transfer set to 0.
    trace = make_trace(_frame(_dp2_rows(rs_dp0=0.2)), JobMeta(dp_size=2, pp_size=1))
    model = build_model(trace)
    rs = int(model.template.ops_of(["grads-reduce-scatter"])[0])
    assert model.transfer[rs, 0, 0] == 0.0
    assert any("clock skew" in note and note.startswith("1 comm op") for note in model.notes)


def test_incomplete_step_is_dropped_with_a_count() -> None:
    frames = [_frame(_dp2_rows(), step=s) for s in range(4)]
    frame = pd.concat(frames, ignore_index=True)
    missing = frame.index[(frame["step"] == 2) & (frame["optype"] == "optimizer")][0]
    trace = make_trace(frame.drop(index=missing), JobMeta(dp_size=2, pp_size=1))
    model = build_model(trace)
    assert list(model.steps) == [0, 1, 3]
    assert any("dropped 1 of 4 steps (steps 2)" in n and "missing" in n for n in model.notes)


def test_exact_duplicates_are_dropped_conflicting_ones_spoil_the_step() -> None:
    frame = pd.concat([_frame(_dp2_rows(), step=s) for s in range(3)], ignore_index=True)
    dup = frame.iloc[[5]]
    model = build_model(make_trace(pd.concat([frame, dup]), JobMeta(dp_size=2, pp_size=1)))
    assert model.n_steps == 3 and any("1 exact duplicate" in n for n in model.notes)
    conflicting = dup.assign(start_ts=dup["start_ts"] + 0.5)
    model = build_model(make_trace(pd.concat([frame, conflicting]), JobMeta(dp_size=2, pp_size=1)))
    assert model.n_steps == 2 and any("twice with different times" in n for n in model.notes)


def test_too_many_broken_steps_are_refused() -> None:
    frame = pd.concat([_frame(_dp2_rows(), step=s) for s in range(3)], ignore_index=True)
    broken = frame[
        ~((frame["step"] > 0) & (frame["optype"] == "optimizer") & (frame["dp_rank"] == 1))
    ]
    with pytest.raises(TraceError, match="2 of 3 steps cannot be modelled"):
        build_model(make_trace(broken, JobMeta(dp_size=2, pp_size=1)))


def test_observed_order_contradicting_the_schedule_is_a_cycle() -> None:
    rows = _dp2_rows()
    # The reduce-scatter recorded before the parameter all-gather: DP stream order vs. compute.
    rows = [(d, k, s, -0.5 if k == "grads-reduce-scatter" else t, u) for d, k, s, t, u in rows]
    with pytest.raises(TraceError, match="cycle"):
        build_model(make_trace(_frame(rows), JobMeta(dp_size=2, pp_size=1)))


def test_unmatched_send_recv_is_refused() -> None:
    trace = synthesize(SynthJob(dp=1, pp=2, microbatches=2, steps=2))
    ops = trace.ops.to_frame()
    keep = ~((ops["optype"] == "forward-recv") & (ops["seq_id"] == 1))
    with pytest.raises(TraceError, match=r"unmatched send/recv pairs.*forward-recv"):
        build_model(trace.with_ops(ops[keep].reset_index(drop=True)))


def test_surplus_zero_duration_p2p_is_dropped_as_noop() -> None:
    trace = synthesize(SynthJob(dp=1, pp=2, microbatches=2, steps=2))
    ops = trace.ops.to_frame()
    stage0 = ops[(ops["stage"] == 0) & (ops["optype"] == "forward-compute")]
    noop = stage0.assign(optype="forward-recv", duration=0.0)  # stage 0 never receives forward
    model = build_model(trace.with_ops(pd.concat([ops, noop], ignore_index=True)))
    assert any("no-op p2p" in n for n in model.notes)
    assert model.template.n_ops == build_model(trace).template.n_ops


def test_replay_reproduces_synthetic_trace_and_is_batch_invariant() -> None:
    trace = synthesize(SynthJob(dp=4, pp=4, microbatches=6, steps=5, seq_cv=0.3, seed=3))
    model = build_model(trace)
    scenarios = [
        Scenario("actual", launch_delay=True),
        Scenario("original"),
        Scenario("ideal", keep=np.zeros((model.template.n_ops, 1), dtype=bool)),
        Scenario("dp 2", keep=(np.arange(4) == 2)[None, :]),
        Scenario("stage 1", keep=(model.template.stage == 1)[:, None]),
    ]
    one_batch = Replayer(model).step_times(scenarios)
    tiny = Replayer(model, memory_budget=1)  # one scenario per pass
    assert tiny.batch_size() == 1
    np.testing.assert_allclose(tiny.step_times(scenarios), one_batch, rtol=0, atol=1e-12)
    ops = trace.ops.to_frame()
    recorded = (ops["start_ts"] + ops["duration"]).groupby(ops["step"]).max()
    first = ops.groupby("step")["start_ts"].min()
    np.testing.assert_allclose(one_batch[0], (recorded - first).to_numpy(), atol=1e-9)
    start, end = Replayer(model).timeline(Scenario("actual", launch_delay=True))
    np.testing.assert_allclose(start, model.start, atol=1e-9)
    np.testing.assert_allclose(end, model.end, atol=1e-9)


def test_ideal_durations_are_mean_compute_and_median_transfer() -> None:
    trace = synthesize(SynthJob(dp=2, pp=2, microbatches=4, steps=3, noise=0.2, seed=5))
    model = build_model(trace)
    t = model.template
    fwd = t.ops_of(["forward-compute"])
    send = t.ops_of(["forward-send"])
    assert model.ideal[fwd[0]] == pytest.approx(model.duration[fwd].mean())
    assert model.ideal[send[0]] == pytest.approx(np.median(model.transfer[send]))


def test_dp_ranks_all_ideal_replay_as_one_stand_in() -> None:
    trace = synthesize(SynthJob(dp=6, pp=2, microbatches=4, steps=3, seq_cv=0.3, seed=9))
    model = build_model(trace)
    replayer = Replayer(model)
    keep = np.zeros((model.template.n_ops, 6), dtype=bool)
    keep[:, 4] = True
    keep[model.template.stage == 1, 1] = True
    compressed = Scenario("dp 4 and stage 1 of dp 1", keep=keep)
    assert list(replayer.columns(compressed)) == [0, 1, 4]
    # A neutral scale forces every DP rank to be replayed.
    full = Scenario("same, every rank", keep=keep, scale=np.ones((1, 6)))
    assert len(replayer.columns(full)) == 6
    times = replayer.step_times([compressed, full])
    np.testing.assert_allclose(times[0], times[1], rtol=0, atol=1e-12)


def _arrays(model: object) -> dict[str, np.ndarray]:
    names = ("start", "duration", "transfer", "launch_delay", "ideal", "steps", "worker_rank")
    return {name: np.asarray(getattr(model, name)) for name in names}


def test_the_model_does_not_depend_on_row_order() -> None:
    # The layout is a dense lookup of each row's cell, not a sort: shuffled rows give the same
    # model to the bit.
    trace = synthesize(SynthJob(dp=3, pp=3, microbatches=4, steps=4, seq_cv=0.2, seed=11))
    shuffled = trace.ops.to_frame().sample(frac=1.0, random_state=7).reset_index(drop=True)
    a, b = build_model(trace), build_model(trace.with_ops(shuffled))
    for name, value in _arrays(a).items():
        np.testing.assert_array_equal(_arrays(b)[name], value, err_msg=name)
    assert a.template.deps == b.template.deps
    np.testing.assert_array_equal(a.template.mc, b.template.mc)


def test_sparse_step_and_sequence_ids_are_numbered_by_sorting() -> None:
    # Ids spread over a range far larger than the trace take the np.unique path; the model is
    # the same up to the ids themselves.
    trace = synthesize(SynthJob(dp=2, pp=2, microbatches=3, steps=3, seed=2))
    sparse = trace.ops.to_frame().assign(
        step=trace.ops["step"].astype(np.int64) * 10**9 + 5,
        seq_id=trace.ops["seq_id"].astype(np.int64) * 10**7,
        mb_id=trace.ops["mb_id"].astype(np.int64) * 10**7,
    )
    a, b = build_model(trace), build_model(trace.with_ops(sparse))
    assert b.steps.tolist() == [5, 10**9 + 5, 2 * 10**9 + 5]
    assert b.template.seq_id.tolist() == (a.template.seq_id * 10**7).tolist()
    for name in ("start", "duration", "transfer", "launch_delay", "ideal"):
        np.testing.assert_array_equal(_arrays(b)[name], _arrays(a)[name], err_msg=name)


def test_a_scenario_over_the_budget_replays_a_few_steps_per_pass() -> None:
    trace = synthesize(SynthJob(dp=4, pp=2, microbatches=4, steps=6, seq_cv=0.3, seed=4))
    model = build_model(trace)
    scenarios = [
        Scenario("actual", launch_delay=True),
        Scenario("stage 1", keep=(model.template.stage == 1)[:, None]),
        Scenario("worker 0,1", keep=np.eye(model.template.n_ops, 4, dtype=bool)),
    ]
    whole = Replayer(model).step_times(scenarios)
    assert Replayer(model).steps_per_pass() == 6
    for budget in (1, 3 * Replayer(model)._step_bytes()):
        chunked = Replayer(model, memory_budget=budget)
        assert chunked.steps_per_pass() == max(1, budget // chunked._step_bytes())
        np.testing.assert_array_equal(chunked.step_times(scenarios), whole)
