"""The result of a what-if analysis and its JSON form (docs/architecture.md §3.5)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from whatif.trace import JobMeta
from whatif.verdict import Verdict

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Removal:
    """A root-cause metric M (Eq. 5) for one op set X.

    ``value = rem = (T_orig − T_removed) / (T_orig − T_ideal)`` where ``T_removed`` replays X at
    ideal and the rest original; ``add = (T_added − T_ideal) / (T_orig − T_ideal)`` where
    ``T_added`` replays X original and the rest ideal. ``None`` when ``T_orig = T_ideal``.
    """

    value: float | None
    add: float | None
    t_original: float
    t_removed: float
    t_added: float
    t_ideal: float
    target: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready metric."""
        return {
            "value": _num(self.value),
            "rem": _num(self.value),
            "add": _num(self.add),
            "t_original": self.t_original,
            "t_removed": self.t_removed,
            "t_added": self.t_added,
            "t_ideal": self.t_ideal,
            **self.target,
        }


@dataclass(frozen=True)
class WorkerScore:
    """S_w of one worker: ``min(S_dp, S_pp)`` and, for the top candidates, the exact replay."""

    stage: int
    dp_rank: int
    rank: int
    slowdown: float
    exact: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready score."""
        return {
            "stage": self.stage,
            "dp_rank": self.dp_rank,
            "rank": self.rank,
            "slowdown": self.slowdown,
            "exact": _num(self.exact),
        }


@dataclass(frozen=True)
class RankScore:
    """One rank of a Kineto input: its replayed slowdowns and what its trace measures.

    ``slowdown`` (S_r) replays this rank as recorded, its launch delays included, with every
    other rank ideal and without launch delays: the lateness that made the others wait at
    collectives counts, the time it spent waiting for them does not (``docs/whatif-method.md``
    §3.9). ``durations`` is the same without its launch delays (the exact S_w). The measured
    columns are means per step (``whatif.trace.RANK_STATS_COLUMNS``).
    """

    rank: int
    dp_rank: int
    stage: int
    slowdown: float
    durations: float
    steps: int
    step_s: float
    busy_s: float
    nccl_s: float
    waited_s: float
    collectives: int
    last_arrivals: int
    caused_wait_s: float
    caused_wait_cpu_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready row."""
        return {
            "rank": self.rank,
            "dp_rank": self.dp_rank,
            "stage": self.stage,
            "slowdown": _num(self.slowdown),
            "durations": _num(self.durations),
            "steps": self.steps,
            "step_s": self.step_s,
            "busy_s": self.busy_s,
            "nccl_s": self.nccl_s,
            "waited_s": self.waited_s,
            "collectives": self.collectives,
            "last_arrivals": self.last_arrivals,
            "caused_wait_s": self.caused_wait_s,
            "caused_wait_cpu_s": self.caused_wait_cpu_s,
        }


TRUSTED_TABLES = (
    "by_optype",
    "by_dp_rank",
    "by_stage",
    "by_worker",
    "by_rank",
    "mw",
    "ms",
    "per_step",
    "whatifs",
)
"""The replayed tables a report shows beneath its verdict (all untrusted when it is
``unreliable``)."""


@dataclass(frozen=True)
class StepResult:
    """One step: simulated step times and its S, overall and by group."""

    step: int
    recorded: float
    actual: float
    original: float
    ideal: float
    by_optype: dict[str, float]
    by_dp_rank: dict[int, float]
    by_stage: dict[int, float]

    @property
    def slowdown(self) -> float:
        """``original / ideal`` of this step."""
        return self.original / self.ideal if self.ideal > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready step."""
        return {
            "step": self.step,
            "slowdown": _num(self.slowdown),
            "recorded": self.recorded,
            "actual": self.actual,
            "original": self.original,
            "ideal": self.ideal,
            "by_optype": self.by_optype,
            "by_dp_rank": {str(k): v for k, v in self.by_dp_rank.items()},
            "by_stage": {str(k): v for k, v in self.by_stage.items()},
        }


@dataclass(frozen=True)
class WhatIfResult:
    """The outcome of one custom what-if."""

    name: str
    step_time: float
    speedup: float
    slowdown_after: float
    ops_changed: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready outcome."""
        return {
            "name": self.name,
            "step_time": self.step_time,
            "speedup": self.speedup,
            "slowdown_after": self.slowdown_after,
            "ops_changed": self.ops_changed,
        }


@dataclass
class WhatIfReport:
    """Everything a what-if analysis found about one job trace.

    Times are mean step times in seconds over the modelled steps: ``t_actual`` replays recorded
    launch delays (it reproduces the trace), ``t_original`` drops them, ``t_ideal`` uses ideal
    durations. ``slowdown = t_original / t_ideal`` (Eq. 1), ``waste = 1 − 1/slowdown``,
    ``model_error = t_actual / t_original − 1``.
    """

    job: str
    source: str
    meta: JobMeta
    n_ops: int
    steps: list[int]
    slowdown: float
    waste: float
    model_error: float
    t_actual: float
    t_original: float
    t_ideal: float
    replay_error: float
    by_optype: dict[str, float]
    by_dp_rank: dict[int, float]
    by_stage: dict[int, float]
    by_worker: list[WorkerScore]
    mw: Removal
    ms: Removal
    stage_share: float | None
    comm_share: float | None
    fwd_bwd_correlation: float | None
    forward_cv: float | None
    verdict: Verdict
    per_step: list[StepResult]
    whatifs: list[WhatIfResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    by_rank: list[RankScore] = field(default_factory=list)

    @property
    def trusted(self) -> bool:
        """Whether the replayed tables beneath the verdict can be acted on."""
        return self.verdict.reliable

    @property
    def untrusted_reason(self) -> str | None:
        """Why the replayed tables are not to be trusted, or ``None`` when they are."""
        if self.trusted:
            return None
        return (
            f"verdict unreliable: the replay without launch delays is "
            f"{self.model_error * 100:+.1f} % off the actual replay, so untraced CPU-side time "
            "dominates and S, its attributions and the what-ifs do not explain the step time; "
            "the measured per-rank columns (step, busy, NCCL, waits, arrivals) come from the "
            "trace itself"
        )

    def worker_matrix(self) -> list[list[float]]:
        """S_w as a ``pp × dp`` matrix (rows: stages)."""
        matrix = [[math.nan] * self.meta.dp_size for _ in range(self.meta.pp_size)]
        for w in self.by_worker:
            matrix[w.stage][w.dp_rank] = w.slowdown
        return matrix

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (docs/architecture.md §3.5 keys first, then details)."""
        return {
            "slowdown": self.slowdown,
            "waste": self.waste,
            "model_error": self.model_error,
            "by_optype": self.by_optype,
            "by_dp_rank": {str(k): v for k, v in self.by_dp_rank.items()},
            "by_stage": {str(k): v for k, v in self.by_stage.items()},
            "by_worker": [w.to_dict() for w in self.by_worker],
            "mw": self.mw.to_dict(),
            "ms": self.ms.to_dict(),
            "verdict": self.verdict.to_dict(),
            "per_step": [s.to_dict() for s in self.per_step],
            "schema": SCHEMA_VERSION,
            "job": self.job,
            "source": self.source,
            "meta": self.meta.to_dict(),
            "ops": self.n_ops,
            "steps": self.steps,
            "step_time": {
                "actual": self.t_actual,
                "original": self.t_original,
                "ideal": self.t_ideal,
            },
            "replay_error": self.replay_error,
            "stage_share": _num(self.stage_share),
            "comm_share": _num(self.comm_share),
            "fwd_bwd_correlation": _num(self.fwd_bwd_correlation),
            "forward_cv": _num(self.forward_cv),
            "whatifs": [w.to_dict() for w in self.whatifs],
            "by_rank": {
                "trusted": self.trusted,
                "reason": self.untrusted_reason,
                "ranks": [r.to_dict() for r in self.by_rank],
            },
            "trust": {
                "trusted": self.trusted,
                "reason": self.untrusted_reason,
                "tables": {
                    name: {"trusted": self.trusted, "reason": self.untrusted_reason}
                    for name in TRUSTED_TABLES
                },
            },
            "notes": list(self.notes),
            "timings": self.timings,
        }


def _num(value: float | None) -> float | None:
    """``None`` for missing or non-finite numbers (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)
