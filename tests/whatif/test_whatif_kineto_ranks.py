"""Kineto inputs: per-rank attribution blames the rank that made the others wait, all-to-alls are
matched across ranks, per-rank measurements are reported, unreliable tables are marked.

The traces are simulated multi-rank jobs written in the Kineto JSON format
(:mod:`kineto_builder`): a rank that arrives early at a collective waits inside its NCCL kernel.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from conftest import KINETO, need
from kineto_builder import KinetoJob, Op, RankPlan, recsys_script
from rich.console import Console
from typer.testing import CliRunner

from minder.cli.whatif import whatif_app
from minder.core.errors import TraceError
from whatif import JobMeta, Trace, analyze, build_model, load_trace, write_canonical
from whatif.kineto import arrival_stats
from whatif.render import render_html, render_table
from whatif.replay import run
from whatif.report import TRUSTED_TABLES, WhatIfReport
from whatif.scenarios import Replayer, Scenario

STEPS = 4
STALL_US = 15_000.0


def _analyze(job: KinetoJob, tmp_path: Path) -> WhatIfReport:
    job.write(tmp_path)
    return analyze(load_trace(tmp_path))


def _s_r(report: WhatIfReport) -> dict[int, float]:
    return {r.rank: r.slowdown for r in report.by_rank}


def _stats(trace: Trace) -> dict[int, dict[str, Any]]:
    """``trace.rank_stats`` by rank."""
    assert trace.rank_stats is not None
    records = trace.rank_stats.to_dict("records")
    return {int(row["rank"]): {str(k): v for k, v in row.items()} for row in records}


def _text(report: WhatIfReport) -> str:
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render_table(report))
    return console.export_text()


# -- (a) a rank that launches late is blamed, not the ranks that wait for it -----------------


@pytest.mark.parametrize(
    "stall_at",
    [0, 1],
    ids=["late-at-step-start", "late-before-all-to-all"],
)
def test_late_launch_blames_the_late_rank(tmp_path: Path, stall_at: int) -> None:
    job = KinetoJob(4, recsys_script(), steps=STEPS).plan(
        2, RankPlan(stall_before={stall_at: STALL_US})
    )
    job.write(tmp_path)
    trace = load_trace(tmp_path)
    report = analyze(trace)
    s_r = _s_r(report)
    assert max(s_r, key=lambda r: s_r[r]) == 2
    assert s_r[2] > 1.3
    for waiter in (0, 1, 3):
        assert s_r[waiter] < 1.01, s_r
        # Waiting inside the all-to-all kernel is not the waiter's work.
        assert report.by_dp_rank[waiter] < 1.01, report.by_dp_rank
    assert report.by_dp_rank[2] >= max(report.by_dp_rank[w] for w in (0, 1, 3)) - 1e-9
    # Lateness is CPU-side: no verdict, and the arrivals say who came last and that it was the CPU.
    assert report.verdict.cause == "unreliable"
    rows = _stats(trace)
    assert rows[2]["last_arrivals"] == STEPS  # the first collective of every step
    assert all(rows[w]["last_arrivals"] == 0 for w in (0, 1, 3))
    assert rows[2]["caused_wait_s"] > 0.010
    assert rows[2]["caused_wait_cpu_s"] == pytest.approx(rows[2]["caused_wait_s"])
    assert rows[2]["waited_s"] < 1e-4
    for w in (0, 1, 3):
        assert rows[w]["waited_s"] == pytest.approx(rows[2]["caused_wait_s"], rel=1e-3)
    # The model keeps only the transfer of each all-to-all, on every rank.
    model = build_model(trace)
    a2a = model.template.ops_of(["all-to-all"])
    assert len(a2a) == 1
    np.testing.assert_allclose(model.transfer[a2a], 800e-6, atol=2e-6)
    assert model.template.group_dp_synced[model.template.group[a2a[0]]]


# -- (b) a rank with slower compute kernels is blamed -----------------------------------------


def test_slow_gpu_rank_is_blamed(tmp_path: Path) -> None:
    job = KinetoJob(4, recsys_script(), steps=STEPS).plan(1, RankPlan(compute_factor=1.5))
    report = _analyze(job, tmp_path)
    assert report.verdict.cause == "worker"
    assert report.verdict.target["workers"][0]["dp_rank"] == 1
    assert max(report.by_dp_rank, key=lambda d: report.by_dp_rank[d]) == 1
    assert report.by_dp_rank[1] > 1.2
    assert all(report.by_dp_rank[d] < 1.01 for d in (0, 2, 3)), report.by_dp_rank
    s_r = _s_r(report)
    assert max(s_r, key=lambda r: s_r[r]) == 1
    rows = {r.rank: r for r in report.by_rank}
    assert rows[1].busy_s == pytest.approx(1.5 * rows[0].busy_s, rel=1e-6)
    assert rows[1].durations == pytest.approx(report.by_dp_rank[1], rel=1e-9)
    # It arrives last at every collective because its GPU is slow, not its CPU.
    assert rows[1].last_arrivals == rows[1].collectives == 2 * STEPS
    assert rows[1].caused_wait_cpu_s == 0.0
    assert report.trusted and "NOT TRUSTED" not in _text(report)


# -- (c) CPU-side stalls: no verdict, and the tables beneath it are marked --------------------


@pytest.fixture
def stalled(tmp_path: Path) -> WhatIfReport:
    # Rank 3's CPU pauses 2 ms between kernels: its GPU starves, its kernels are not slower.
    job = KinetoJob(4, recsys_script(), steps=STEPS).plan(3, RankPlan(stall_inside_us=2000.0))
    return _analyze(job, tmp_path)


def test_cpu_stalls_give_an_unreliable_verdict(stalled: WhatIfReport) -> None:
    assert stalled.verdict.cause == "unreliable"
    assert not stalled.trusted
    rows = {r.rank: r for r in stalled.by_rank}
    # Idle GPU time is not work: every rank's busy time and durations-only S are the same...
    assert {round(r.busy_s, 9) for r in rows.values()} == {0.013}
    assert all(r.durations == pytest.approx(1.0, abs=1e-6) for r in rows.values())
    # ...while the lateness-inclusive S_r and the arrivals point at rank 3.
    assert max(rows, key=lambda r: rows[r].slowdown) == 3
    assert rows[3].last_arrivals == rows[3].collectives


def test_unreliable_tables_are_marked_in_json(stalled: WhatIfReport) -> None:
    data = json.loads(json.dumps(stalled.to_dict()))
    trust = data["trust"]
    assert trust["trusted"] is False and "unreliable" in trust["reason"]
    assert set(trust["tables"]) == set(TRUSTED_TABLES)
    for name in TRUSTED_TABLES:
        assert trust["tables"][name] == {"trusted": False, "reason": trust["reason"]}
    assert data["by_rank"]["trusted"] is False and data["by_rank"]["reason"] == trust["reason"]
    assert len(data["by_rank"]["ranks"]) == 4
    assert set(data["by_rank"]["ranks"][0]) >= {"slowdown", "step_s", "busy_s", "nccl_s"}


def test_unreliable_tables_are_marked_in_the_table_view(stalled: WhatIfReport) -> None:
    text = _text(stalled)
    assert "The tables below are NOT to be trusted" in text
    for title in ("per rank", "S by op type", "S by PP stage", "S by DP rank", "top workers"):
        line = next(row for row in text.splitlines() if title in row)
        assert "[NOT TRUSTED]" in line, line


def test_unreliable_tables_are_marked_in_html(stalled: WhatIfReport) -> None:
    page = render_html(stalled)
    assert page.count('class="untrusted-banner"') == 1
    assert '<div class="untrusted" data-trusted="false">' in page
    # Every heading of the replayed sections carries the tag; the notes do not.
    tagged = page.count('<span class="untrusted-tag">not trusted</span>')
    assert tagged == page.count("<h2>") - 1
    untrusted = page.split('<div class="untrusted" data-trusted="false">')[1]
    assert "Per rank" in untrusted and "S by DP rank" in untrusted


def test_trusted_reports_are_not_marked(tmp_path: Path) -> None:
    report = _analyze(KinetoJob(4, recsys_script(), steps=STEPS), tmp_path)
    assert report.trusted and report.untrusted_reason is None
    data = report.to_dict()
    assert data["trust"]["trusted"] is True and data["by_rank"]["trusted"] is True
    page = render_html(report)
    assert 'class="untrusted-banner"' not in page and 'data-trusted="false"' not in page
    assert 'class="untrusted-tag"' not in page
    assert "Per rank" in page  # the measured table is there for every Kineto input


# -- (d) all-to-all collectives are matched across ranks ---------------------------------------


@pytest.mark.parametrize(
    ("param_comms", "prefix", "method"),
    [
        (True, "ncclDevKernel_", "sequence number"),
        (False, "ncclKernel_", "kind order"),
    ],
    ids=["record_param_comms-new-names", "nccl-op-only-old-names"],
)
def test_all_to_all_is_matched_across_ranks(
    tmp_path: Path, param_comms: bool, prefix: str, method: str
) -> None:
    job = KinetoJob(
        4,
        recsys_script(two_all_to_all=True),
        steps=STEPS,
        nccl_prefix=prefix,
        param_comms=param_comms,
    ).plan(0, RankPlan(stall_before={3: STALL_US}))  # rank 0 is late at the second all-to-all
    job.write(tmp_path)
    trace = load_trace(tmp_path)
    note = next(n for n in trace.notes if n.startswith("matched "))
    assert note.startswith(
        f"matched {3 * STEPS} collective(s) across ranks (alltoall ×{2 * STEPS}, "
        f"allreduce ×{STEPS})"
    )
    assert f"({method}: {3 * STEPS * 4} rank-op(s))" in note
    frame = trace.ops.to_frame()
    a2a = frame[frame["optype"] == "all-to-all"]
    assert len(a2a) == 2 * STEPS * 4
    assert set(a2a["seq_id"]) == {0, 1}
    model = build_model(trace)
    assert model.n_steps == STEPS
    ops = model.template.ops_of(["all-to-all"])
    assert len(ops) == 2 and all(model.template.group_dp_synced[model.template.group[ops]])
    np.testing.assert_allclose(model.transfer[ops], 800e-6, atol=2e-6)
    row = _stats(trace)[0]
    assert row["last_arrivals"] == STEPS and row["collectives"] == 3 * STEPS


def test_sequence_numbers_keep_instances_apart(tmp_path: Path) -> None:
    # Rank 3 lost the first all-to-all kernel of step 11: matched by sequence number, its second
    # all-to-all keeps its place, so step 11 is dropped instead of pairing different collectives.
    KinetoJob(4, recsys_script(two_all_to_all=True), steps=STEPS).write(tmp_path)
    path = tmp_path / "rank-3.json"
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    step = next(e for e in events if e["name"] == "ProfilerStep#11")
    lost = next(
        e
        for e in events
        if e["cat"] == "kernel"
        and "SendRecv" in e["name"]
        and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
    )
    events.remove(lost)
    path.write_text(json.dumps(data))
    trace = load_trace(tmp_path)
    ops = trace.ops.to_frame()
    mine = ops[(ops["rank"] == 3) & (ops["step"] == 11)]
    assert list(mine.loc[mine["optype"] == "all-to-all", "seq_id"]) == [1]
    model = build_model(trace)
    assert 11 not in model.steps.tolist() and model.n_steps == STEPS - 1


def test_a_different_collective_in_the_same_instance_is_refused(tmp_path: Path) -> None:
    KinetoJob(4, recsys_script(), steps=2).write(tmp_path)
    path = tmp_path / "rank-1.json"
    data = json.loads(path.read_text())
    record = next(
        e
        for e in data["traceEvents"]
        if e["name"] == "record_param_comms" and e["args"]["Collective name"] == "all_to_all"
    )
    record["args"]["Collective name"] = "all_gather"
    path.write_text(json.dumps(data))
    with pytest.raises(
        TraceError,
        match=r"collective with sequence number 0 of process group '0' in step 10 differs "
        r"across ranks \(rank 0: alltoall, rank 1: allgather, rank 2: alltoall, rank 3: alltoall\)",
    ):
        load_trace(tmp_path)


# -- the pieces ----------------------------------------------------------------------------------


def test_rank_stats_measure_steps_busy_and_nccl(tmp_path: Path) -> None:
    job = KinetoJob(2, recsys_script(), steps=STEPS).plan(1, RankPlan(stall_before={1: 5000.0}))
    job.write(tmp_path)
    rows = _stats(load_trace(tmp_path))
    # 3 + 3 forward, 6 backward, 2 × 0.5 optimizer kernels of 1 ms.
    assert [rows[r]["busy_s"] for r in (0, 1)] == pytest.approx([0.013, 0.013], rel=1e-9)
    # Rank 1's NCCL kernels are the transfers; rank 0's all-to-all also holds its wait.
    assert rows[1]["nccl_s"] == pytest.approx(0.0023, abs=1e-6)
    assert rows[0]["nccl_s"] == pytest.approx(0.0023 + rows[0]["waited_s"], abs=1e-6)
    events = json.loads((tmp_path / "rank-0.json").read_text())["traceEvents"]
    spans = [e["dur"] * 1e-6 for e in events if e["name"].startswith("ProfilerStep#")]
    assert rows[0]["step_s"] == pytest.approx(float(np.mean(spans)))
    assert rows[0]["steps"] == rows[1]["steps"] == STEPS


def test_arrival_stats_of_two_ranks_balance(tmp_path: Path) -> None:
    files = [
        need(KINETO / "trace_filter_sampled_rank-0.json.gz"),
        need(KINETO / "trace_filter_sampled_rank-1.json.gz"),
    ]
    trace = load_trace(files)
    stats = trace.rank_stats
    assert stats is not None and list(stats["rank"]) == [0, 1]
    # With two ranks, what one waits is what the other made it wait (leads under 50 µs aside).
    assert stats["caused_wait_s"].sum() == pytest.approx(stats["waited_s"].sum(), abs=1e-3)
    assert (stats["collectives"] == 10).all()
    report = analyze(trace)
    assert report.verdict.cause == "unreliable" and not report.trusted
    assert {r.rank for r in report.by_rank} == {0, 1}


def test_arrival_stats_of_no_instances_are_empty() -> None:
    import pandas as pd

    empty = pd.DataFrame(
        columns=["key", "rank", "step", "collective", "start", "end", "launch", "enqueue"]
    )
    assert arrival_stats(empty).empty


def test_one_rank_replay_with_a_stand_in_equals_the_full_replay(tmp_path: Path) -> None:
    job = KinetoJob(4, recsys_script(), steps=STEPS).plan(2, RankPlan(stall_before={1: STALL_US}))
    job.write(tmp_path)
    model = build_model(load_trace(tmp_path))
    replayer = Replayer(model)
    keep = np.zeros((model.template.n_ops, model.dp_size), dtype=bool)
    keep[:, 2] = True
    scenario = Scenario("rank 2", keep=keep, launch_delay=True, delay_keep=keep)
    assert replayer.columns(scenario).tolist() == [0, 2]
    fast = replayer.step_times([scenario])[0]
    # By hand, every column: rank 2 as recorded, the others ideal without launch delay.
    program = replayer.program
    weights = np.where(keep[:, None, :], model.transfer, model.ideal[:, None, None])
    delays = np.where(keep[:, None, :], model.launch_delay, 0.0)
    full, _ = run(program, weights[program.end_order], delays[program.start_order])
    np.testing.assert_allclose(fast, full, rtol=1e-12)
    assert (fast > replayer.step_times([Scenario("ideal", keep=keep & False)])[0]).all()


def test_kineto_meta_keeps_per_op_ideals_through_convert(tmp_path: Path) -> None:
    KinetoJob(3, recsys_script(), steps=STEPS).plan(1, RankPlan(compute_factor=1.3)).write(
        tmp_path / "in"
    )
    trace = load_trace(tmp_path / "in")
    assert trace.meta.ideal_pooling == "op"
    parquet, meta_path = write_canonical(trace, tmp_path / "trace-job.parquet")
    assert "ideal_pooling: op" in meta_path.read_text()
    back = load_trace(parquet)
    assert back.meta.ideal_pooling == "op" and back.rank_stats is None
    assert analyze(back).slowdown == pytest.approx(analyze(trace).slowdown, rel=1e-12)


def test_bad_ideal_pooling_is_refused() -> None:
    with pytest.raises(TraceError, match=r"ideal_pooling must be one of \['type', 'op'\], got 'x'"):
        JobMeta(dp_size=1, pp_size=1, ideal_pooling="x")


def test_cli_json_and_table_carry_the_per_rank_table(tmp_path: Path) -> None:
    job = KinetoJob(4, [Op("forward", 2), Op("alltoall"), Op("forward", 2)], steps=3)
    job.plan(3, RankPlan(stall_before={1: STALL_US})).write(tmp_path, gzip_files=True)
    app = typer.Typer()
    app.add_typer(whatif_app, name="whatif")
    runner = CliRunner()
    result = runner.invoke(app, ["whatif", "analyze", str(tmp_path), "-f", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    ranks = data["by_rank"]["ranks"]
    assert max(ranks, key=lambda r: r["slowdown"])["rank"] == 3
    assert data["trust"]["trusted"] is False
    out = tmp_path / "report.txt"
    result = runner.invoke(app, ["whatif", "analyze", str(tmp_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "per rank" in text and "NOT TRUSTED" in text
