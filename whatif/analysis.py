"""The full what-if analysis of one job trace: S, attribution, M_W, M_S, verdict.

Definitions follow ``docs/whatif-method.md`` §3:

* ``T_actual``, ``T_orig``, ``T_ideal``: mean step time replayed with recorded launch delays, with
  original durations and no launch delay, and with ideal durations (no launch delay).
* ``S = T_orig / T_ideal`` (Eq. 1); waste ``1 − 1/S``; model error ``T_actual / T_orig − 1``.
* ``S_g = T(g original, rest ideal) / T_ideal`` for each op-type group (Eq. 2), DP rank and stage.
* ``S_w(p, d) ≈ min(S_dp[d], S_pp[p])`` (Eq. 4), with an exact replay for the top candidates.
* ``M = (T_orig − T(X ideal)) / (T_orig − T_ideal)`` (Eq. 5) with X the top ⌈3 %⌉ of workers by
  S_w (M_W) or the last stage (M_S).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from whatif import optypes
from whatif.loading import load_trace
from whatif.model import JobModel, build_model
from whatif.report import (
    RankScore,
    Removal,
    StepResult,
    WhatIfReport,
    WhatIfResult,
    WorkerScore,
)
from whatif.scenarios import ProgressFn, Replayer, Scenario
from whatif.trace import JobMeta, Trace
from whatif.verdict import Evidence, Thresholds, decide
from whatif.whatifs import WhatIf

logger = logging.getLogger(__name__)

TOP_WORKER_FRACTION = 0.03
"""M_W restores the top ⌈3 % × workers⌉ workers by S_w (the paper's choice)."""

EXACT_WORKERS = 8
"""Workers (top by approximate S_w) that also get an exact "only this worker original" replay."""


@dataclass(frozen=True)
class _Plan:
    """What the first replay pass attributes: op-type groups, DP ranks and stages."""

    groups: list[str]
    dp_ranks: list[int]
    stages: list[int]


def analyze(
    trace: Trace,
    *,
    what_ifs: Sequence[WhatIf | str] = (),
    progress: ProgressFn | None = None,
    thresholds: Thresholds | None = None,
    top_fraction: float = TOP_WORKER_FRACTION,
    exact_workers: int = EXACT_WORKERS,
    memory_budget: int | None = None,
) -> WhatIfReport:
    """Run the what-if analysis of ``trace``.

    Parameters
    ----------
    trace
        A validated trace (see :func:`whatif.load_trace`).
    what_ifs
        Custom what-ifs to evaluate (objects or CLI specs such as ``"pp-comm:free"``).
    progress
        Called as ``progress(phase, done, total)`` while replaying.
    thresholds
        Verdict thresholds (defaults: :class:`whatif.verdict.Thresholds`).
    top_fraction
        Share of workers M_W restores.
    exact_workers
        How many top workers get an exact S_w replay.
    memory_budget
        Bytes of replay state one pass may use (default
        :func:`whatif.scenarios.default_budget`: 64 MiB or 32 bytes per op, the larger).

    Raises
    ------
    minder.core.errors.TraceError
        The trace cannot be laid out on the dependency model (see :func:`whatif.model.build_model`).
    minder.core.errors.ValidationError
        A what-if spec is malformed or selects nothing.
    """
    clock = time.perf_counter()
    timings: dict[str, float] = {}
    model = build_model(trace)
    timings["model_s"] = time.perf_counter() - clock
    parsed = [w if isinstance(w, WhatIf) else WhatIf.parse(w) for w in what_ifs]
    replayer = Replayer(model, memory_budget=memory_budget)
    tpl = model.template
    pp, dp = model.pp_size, model.dp_size
    n_workers = pp * dp
    n_top = max(1, math.ceil(top_fraction * n_workers))
    n_exact = min(n_workers, max(exact_workers, n_top))
    what_if_masks = [w.selection(model, model.worker_rank) for w in parsed]

    group_of_op = np.array([optypes.attribution_group(str(t)) for t in tpl.optype])
    plan = _Plan(
        groups=list(dict.fromkeys(group_of_op.tolist())),
        dp_ranks=list(range(dp)),
        stages=list(range(pp)),
    )
    none = np.zeros((tpl.n_ops, 1), dtype=bool)
    first: list[Scenario] = [
        Scenario("actual", launch_delay=True),
        Scenario("original"),
        Scenario("ideal", keep=none),
    ]
    first += [Scenario(f"optype {g}", keep=(group_of_op == g)[:, None]) for g in plan.groups]
    first += [Scenario(f"dp {d}", keep=(np.arange(dp) == d)[None, :]) for d in plan.dp_ranks]
    first += [Scenario(f"stage {p}", keep=(tpl.stage == p)[:, None]) for p in plan.stages]
    first += [
        Scenario("stage ideal", keep=none, ideal=stage_ideal_durations(model)),
        Scenario("comm ideal", keep=~tpl.is_comm[:, None]),
        Scenario("last stage ideal", keep=(tpl.stage != pp - 1)[:, None]),
    ]
    for w, mask in zip(parsed, what_if_masks, strict=True):
        first.append(_what_if_scenario(w, mask))
    n_second = n_exact + 2 + (2 * n_workers if trace.rank_stats is not None else 0)
    total = len(first) + n_second

    def phase_progress(offset: int) -> ProgressFn | None:
        if progress is None:
            return None
        callback = progress
        return lambda phase, done, _total: callback(phase, offset + done, total)

    clock = time.perf_counter()
    times = replayer.step_times(first, progress=phase_progress(0), phase="replay")
    by_name = {s.name: times[i] for i, s in enumerate(first)}
    t_act, t_orig, t_ideal = by_name["actual"], by_name["original"], by_name["ideal"]
    ideal_mean = float(t_ideal.mean())
    orig_mean = float(t_orig.mean())

    def ratio(values: np.ndarray) -> float:
        return float(values.mean()) / ideal_mean if ideal_mean > 0 else math.nan

    by_optype = {g: ratio(by_name[f"optype {g}"]) for g in plan.groups}
    by_dp = {d: ratio(by_name[f"dp {d}"]) for d in plan.dp_ranks}
    by_stage = {p: ratio(by_name[f"stage {p}"]) for p in plan.stages}
    s_dp = np.array([by_dp[d] for d in plan.dp_ranks])
    s_pp = np.array([by_stage[p] for p in plan.stages])
    approx = np.minimum(s_pp[:, None], s_dp[None, :])  # (pp, dp)
    # Rank by S_w, ties broken by stage then DP rank (stable order of the flattened matrix).
    ranking = np.argsort(-approx.ravel(), kind="stable")
    top = ranking[:n_top]
    candidates = ranking[:n_exact]
    workers_x = np.zeros((pp, dp), dtype=bool)
    workers_x.ravel()[top] = True
    worker_ops = workers_x[tpl.stage]  # (ops, dp)

    second: list[Scenario] = []
    for flat in candidates:
        p, d = divmod(int(flat), dp)
        keep = np.zeros((tpl.n_ops, dp), dtype=bool)
        keep[tpl.stage == p, d] = True
        second.append(Scenario(f"worker {p},{d}", keep=keep))
    second += [
        Scenario("top workers ideal", keep=~worker_ops),
        Scenario("top workers original", keep=worker_ops),
    ]
    if trace.rank_stats is not None:
        second += _rank_scenarios(model)
    times2 = replayer.step_times(second, progress=phase_progress(len(first)), phase="workers")
    timings["replay_s"] = time.perf_counter() - clock
    by_name.update({s.name: times2[i] for i, s in enumerate(second)})
    exact = {int(flat): ratio(times2[i]) for i, flat in enumerate(candidates)}

    by_worker = [
        WorkerScore(
            stage=p,
            dp_rank=d,
            rank=int(model.worker_rank[p, d]),
            slowdown=float(approx[p, d]),
            exact=exact.get(p * dp + d),
        )
        for p in range(pp)
        for d in range(dp)
    ]
    top_list = [(int(f) // dp, int(f) % dp) for f in top]
    mw = _removal(
        orig_mean,
        ideal_mean,
        float(by_name["top workers ideal"].mean()),
        float(by_name["top workers original"].mean()),
        {"workers": [{"stage": p, "dp_rank": d} for p, d in top_list]},
    )
    ms = _removal(
        orig_mean,
        ideal_mean,
        float(by_name["last stage ideal"].mean()),
        float(by_name[f"stage {pp - 1}"].mean()),
        {"stage": pp - 1},
    )
    span = orig_mean - ideal_mean
    stage_share = (float(by_name["stage ideal"].mean()) - ideal_mean) / span if span > 0 else None
    comm_share = (orig_mean - float(by_name["comm ideal"].mean())) / span if span > 0 else None
    correlation, forward_cv = sequence_evidence(model)
    slowdown = orig_mean / ideal_mean if ideal_mean > 0 else math.nan
    model_error = float(t_act.mean()) / orig_mean - 1 if orig_mean > 0 else math.nan
    worst = int(np.argmax(s_pp))
    evidence = Evidence(
        slowdown=slowdown,
        model_error=model_error,
        mw=mw.value,
        ms=ms.value,
        comm_share=comm_share,
        stage_share=stage_share,
        fwd_bwd_correlation=correlation,
        forward_cv=forward_cv,
        worst_stage=worst,
        worst_stage_slowdown=float(s_pp[worst]),
        top_workers=[(p, d, exact.get(p * dp + d, float(approx[p, d]))) for p, d in top_list],
    )
    verdict = decide(evidence, thresholds)

    recorded = recorded_step_times(model)
    ideal_step = np.where(t_ideal > 0, t_ideal, np.nan)

    def per_step_ratios(names: list[str], keys: list[Any]) -> list[dict[Any, float]]:
        matrix = (np.stack([by_name[n] for n in names]) / ideal_step).T.tolist()
        return [dict(zip(keys, row, strict=True)) for row in matrix]

    step_optype = per_step_ratios([f"optype {g}" for g in plan.groups], plan.groups)
    step_dp = per_step_ratios([f"dp {d}" for d in plan.dp_ranks], plan.dp_ranks)
    step_stage = per_step_ratios([f"stage {p}" for p in plan.stages], plan.stages)
    per_step = [
        StepResult(
            step=int(model.steps[i]),
            recorded=float(recorded[i]),
            actual=float(t_act[i]),
            original=float(t_orig[i]),
            ideal=float(t_ideal[i]),
            by_optype=step_optype[i],
            by_dp_rank=step_dp[i],
            by_stage=step_stage[i],
        )
        for i in range(model.n_steps)
    ]
    results = [
        WhatIfResult(
            name=w.name,
            step_time=float(by_name[f"what-if {w.name}"].mean()),
            speedup=orig_mean / float(by_name[f"what-if {w.name}"].mean()),
            slowdown_after=float(by_name[f"what-if {w.name}"].mean()) / ideal_mean,
            ops_changed=int(mask.sum()) * model.n_steps,
        )
        for w, mask in zip(parsed, what_if_masks, strict=True)
    ]
    by_rank = _rank_scores(model, trace, by_name, ratio)
    timings["replays"] = int(replayer.replays)  # a count: an integer in the JSON
    report = WhatIfReport(
        job=trace.name,
        source=trace.source,
        meta=trace.meta,
        n_ops=model.n_ops_total,
        steps=[int(s) for s in model.steps],
        slowdown=slowdown,
        waste=1 - 1 / slowdown if slowdown > 0 else math.nan,
        model_error=model_error,
        t_actual=float(t_act.mean()),
        t_original=orig_mean,
        t_ideal=ideal_mean,
        replay_error=float(np.max(np.abs(t_act - recorded))),
        by_optype=by_optype,
        by_dp_rank=by_dp,
        by_stage=by_stage,
        by_worker=by_worker,
        mw=mw,
        ms=ms,
        stage_share=stage_share,
        comm_share=comm_share,
        fwd_bwd_correlation=correlation,
        forward_cv=forward_cv,
        verdict=verdict,
        per_step=per_step,
        whatifs=results,
        notes=[*trace.notes, *model.notes],
        timings=timings,
        by_rank=by_rank,
    )
    logger.info(
        "what-if %s: S=%.4f verdict=%s (%d replays, %.2fs)",
        report.job,
        slowdown,
        verdict.cause,
        replayer.replays,
        timings["model_s"] + timings["replay_s"],
    )
    return report


def analyze_path(
    source: str | Path | Sequence[str | Path],
    meta: JobMeta | str | Path | None = None,
    **options: Any,
) -> WhatIfReport:
    """Load a trace (see :func:`whatif.load_trace`) and analyse it (options of :func:`analyze`).

    The entry point for services: give it a path the process can read (an uploaded file saved
    to disk, a directory of Kineto traces, a glob) and store ``report.to_dict()``.
    """
    return analyze(load_trace(source, meta), **options)


def what_if(trace_or_model: Trace | JobModel, spec: WhatIf | str) -> WhatIfResult:
    """Evaluate one custom what-if against the original replay (no launch delay)."""
    model = trace_or_model if isinstance(trace_or_model, JobModel) else build_model(trace_or_model)
    w = spec if isinstance(spec, WhatIf) else WhatIf.parse(spec)
    mask = w.selection(model, model.worker_rank)
    replayer = Replayer(model)
    times = replayer.step_times(
        [
            Scenario("original"),
            Scenario("ideal", keep=np.zeros((model.template.n_ops, 1), dtype=bool)),
            _what_if_scenario(w, mask),
        ]
    )
    orig, ideal, changed = (float(t.mean()) for t in times)
    return WhatIfResult(
        name=w.name,
        step_time=changed,
        speedup=orig / changed,
        slowdown_after=changed / ideal,
        ops_changed=int(mask.sum()) * model.n_steps,
    )


def _rank_scenarios(model: JobModel) -> list[Scenario]:
    """Per worker: it alone as recorded (durations and launch delays) and it alone original
    (durations only), every other worker ideal without launch delays (§3.9)."""
    tpl = model.template
    out = []
    for p in range(model.pp_size):
        for d in range(model.dp_size):
            keep = np.zeros((tpl.n_ops, model.dp_size), dtype=bool)
            keep[tpl.stage == p, d] = True
            out.append(Scenario(f"rank {p},{d}", keep=keep, launch_delay=True, delay_keep=keep))
            out.append(Scenario(f"rank durations {p},{d}", keep=keep))
    return out


def _rank_scores(
    model: JobModel,
    trace: Trace,
    by_name: dict[str, np.ndarray],
    ratio: Callable[[np.ndarray], float],
) -> list[RankScore]:
    """The per-rank table of a Kineto input (empty for other inputs)."""
    stats = trace.rank_stats
    if stats is None:
        return []
    rows: dict[int, dict[str, Any]] = {
        int(rec["rank"]): {str(k): v for k, v in rec.items()} for rec in stats.to_dict("records")
    }
    out = []
    for p in range(model.pp_size):
        for d in range(model.dp_size):
            rank = int(model.worker_rank[p, d])
            row = rows.get(rank)
            if row is None:
                continue
            out.append(
                RankScore(
                    rank=rank,
                    dp_rank=d,
                    stage=p,
                    slowdown=ratio(by_name[f"rank {p},{d}"]),
                    durations=ratio(by_name[f"rank durations {p},{d}"]),
                    steps=int(row["steps"]),
                    step_s=float(row["step_s"]),
                    busy_s=float(row["busy_s"]),
                    nccl_s=float(row["nccl_s"]),
                    waited_s=float(row["waited_s"]),
                    collectives=int(row["collectives"]),
                    last_arrivals=int(row["last_arrivals"]),
                    caused_wait_s=float(row["caused_wait_s"]),
                    caused_wait_cpu_s=float(row["caused_wait_cpu_s"]),
                )
            )
    return out


def _what_if_scenario(w: WhatIf, mask: np.ndarray) -> Scenario:
    scale = np.where(mask, w.factor, 1.0)
    keep = ~mask if w.to_ideal else None
    return Scenario(f"what-if {w.name}", keep=keep, scale=scale)


def _removal(
    t_orig: float, t_ideal: float, t_removed: float, t_added: float, target: dict[str, object]
) -> Removal:
    span = t_orig - t_ideal
    return Removal(
        value=(t_orig - t_removed) / span if span > 0 else None,
        add=(t_added - t_ideal) / span if span > 0 else None,
        t_original=t_orig,
        t_removed=t_removed,
        t_added=t_added,
        t_ideal=t_ideal,
        target=target,
    )


def recorded_step_times(model: JobModel) -> np.ndarray:
    """Per step: the latest recorded end of the finishing ops (the optimizer), step-relative."""
    finish = model.template.ops_of([optypes.OPTIMIZER])
    if not len(finish):
        finish = np.arange(model.template.n_ops)
    return np.asarray((model.start[finish] + model.duration[finish]).max(axis=(0, 2)))


def stage_ideal_durations(model: JobModel) -> np.ndarray:
    """Ideal durations pooled per (op type, stage) instead of per op type.

    Replaying them keeps the designed differences between stages and removes only the variation
    within a stage, which separates stage imbalance from run-time stragglers.
    """
    tpl = model.template
    if model.ideal_pooling == "op":  # the ideal already keeps every op's (and stage's) own mean
        return np.asarray(model.ideal, dtype=np.float64).copy()
    out = np.zeros(tpl.n_ops)
    for t in np.unique(tpl.optype):
        for p in np.unique(tpl.stage):
            ops = np.flatnonzero((tpl.optype == t) & (tpl.stage == p))
            if len(ops):
                values = model.transfer[ops].ravel()
                out[ops] = np.median(values) if optypes.is_comm(str(t)) else values.mean()
    return out


def sequence_evidence(model: JobModel) -> tuple[float | None, float | None]:
    """Correlation of forward and backward compute durations across microbatches, and the
    coefficient of variation of forward durations, both within each (stage, chunk).

    Sequence-length imbalance makes a microbatch's forward and backward slow together (both
    scale with Σ s²); Python GC pauses or a slow kernel hit one of the two.
    """
    tpl = model.template
    fwd = tpl.ops_of([optypes.FORWARD_COMPUTE])
    bwd = tpl.ops_of([optypes.BACKWARD_COMPUTE])
    backward = {(int(tpl.stage[o]), int(tpl.mc[o]), int(tpl.seq_id[o])): int(o) for o in bwd}
    pairs = [
        (int(o), backward[key])
        for o in fwd
        if (key := (int(tpl.stage[o]), int(tpl.mc[o]), int(tpl.seq_id[o]))) in backward
    ]
    if len(pairs) < 2:
        return None, None
    f_ops = np.array([p[0] for p in pairs])
    b_ops = np.array([p[1] for p in pairs])
    f = model.duration[f_ops].reshape(len(pairs), -1)
    b = model.duration[b_ops].reshape(len(pairs), -1)
    _, cell = np.unique(
        tpl.stage[f_ops] * (int(tpl.mc.max()) + 2) + tpl.mc[f_ops], return_inverse=True
    )
    n_cells = int(cell.max()) + 1
    per_cell = np.bincount(cell, minlength=n_cells) * f.shape[1]
    f_mean = np.bincount(cell, weights=f.sum(axis=1), minlength=n_cells) / per_cell
    b_mean = np.bincount(cell, weights=b.sum(axis=1), minlength=n_cells) / per_cell
    fx = f
    fx -= f_mean[cell][:, None]  # in place: the trace's compute durations are copied once
    bx = b
    bx -= b_mean[cell][:, None]
    f_var = np.bincount(cell, weights=(fx * fx).sum(axis=1), minlength=n_cells) / per_cell
    denominator = math.sqrt(float((fx * fx).sum()) * float((bx * bx).sum()))
    correlation = float((fx * bx).sum()) / denominator if denominator > 0 else None
    positive = f_mean > 0
    cv = float(np.mean(np.sqrt(f_var[positive]) / f_mean[positive])) if positive.any() else None
    return correlation, cv
