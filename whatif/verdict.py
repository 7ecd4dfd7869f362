"""The automatic root-cause verdict of a what-if analysis, with its thresholds.

Rules, checked in this order (the first that holds wins):

1. ``unreliable`` — the replay with original durations and no launch delay is off the actual
   replay by more than ``max_model_error`` (5 %, the paper's cut-off): untraced CPU work dominates
   and no verdict is given.
2. ``none`` — ``S < straggling_slowdown`` (1.10, the paper's "straggling" cut-off).
3. ``worker`` — ``M_W ≥ share`` (0.5): restoring the top 3 % of workers (by S_w) to ideal removes
   at least half of the slowdown (paper §5, Eq. 5).
4. ``communication`` — restoring every comm op to its ideal transfer removes at least ``share`` of
   the slowdown.
5. ``stage`` — at least ``share`` of the slowdown remains when every op takes the mean of its
   (type, stage) instead of its type: the stages differ by design (partitioning), not at run
   time. The stage named is the one with the largest S_pp; M_S of the last stage is evidence.
6. ``sequence_length`` — at least ``share`` of the slowdown is variation within a stage, the
   microbatches' forward and backward durations are correlated (Pearson ≥ ``seq_correlation``,
   0.9: both scale with the same Σ s²), and the forward durations vary (coefficient of variation
   ≥ ``seq_min_cv``, 5 %).
7. ``undetermined`` — straggling without one dominant cause; the evidence lists every share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """Thresholds of the verdict (see the module docstring)."""

    max_model_error: float = 0.05
    straggling_slowdown: float = 1.10
    share: float = 0.5
    seq_correlation: float = 0.9
    seq_min_cv: float = 0.05

    def to_dict(self) -> dict[str, float]:
        """The thresholds by name."""
        return asdict(self)


@dataclass(frozen=True)
class Evidence:
    """The measurements a verdict is drawn from (shares are of ``T_orig − T_ideal``)."""

    slowdown: float
    model_error: float
    mw: float | None
    ms: float | None
    comm_share: float | None
    stage_share: float | None
    fwd_bwd_correlation: float | None
    forward_cv: float | None
    worst_stage: int
    worst_stage_slowdown: float
    top_workers: list[tuple[int, int, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready evidence."""
        out = asdict(self)
        out["top_workers"] = [
            {"stage": p, "dp_rank": d, "slowdown": s} for p, d, s in self.top_workers
        ]
        return out


@dataclass(frozen=True)
class Verdict:
    """A root cause, who it points at, why, and the evidence and thresholds behind it."""

    cause: str
    summary: str
    target: dict[str, Any]
    evidence: Evidence
    thresholds: Thresholds

    @property
    def reliable(self) -> bool:
        """Whether a verdict was given (the model error is within bounds)."""
        return self.cause != "unreliable"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready verdict."""
        return {
            "cause": self.cause,
            "summary": self.summary,
            "target": self.target,
            "reliable": self.reliable,
            "evidence": self.evidence.to_dict(),
            "thresholds": self.thresholds.to_dict(),
        }


CAUSES = (
    "unreliable",
    "none",
    "worker",
    "communication",
    "stage",
    "sequence_length",
    "undetermined",
)


def _at_least(value: float | None, threshold: float) -> bool:
    return value is not None and value >= threshold


def decide(evidence: Evidence, thresholds: Thresholds | None = None) -> Verdict:
    """Apply the rules of the module docstring to ``evidence``."""
    th = thresholds or Thresholds()
    e = evidence
    s_text = f"S = {e.slowdown:.3f} ({(1 - 1 / e.slowdown) * 100:.1f} % of GPU time wasted)"
    if abs(e.model_error) > th.max_model_error:
        return Verdict(
            "unreliable",
            f"No verdict: replaying recorded durations without launch delays is "
            f"{e.model_error * 100:+.1f} % off the actual replay (limit ±"
            f"{th.max_model_error * 100:.0f} %); untraced CPU work (data loading, Python, kernel "
            "launch stalls) dominates and the dependency model does not explain the step time.",
            {},
            e,
            th,
        )
    if e.slowdown < th.straggling_slowdown:
        return Verdict(
            "none",
            f"No significant straggling: {s_text}, below the {th.straggling_slowdown:.2f} cut-off.",
            {},
            e,
            th,
        )
    if _at_least(e.mw, th.share):
        workers = [{"stage": p, "dp_rank": d, "slowdown": s} for p, d, s in e.top_workers]
        names = ", ".join(f"(stage {p}, dp {d}: S_w {s:.2f})" for p, d, s in e.top_workers)
        return Verdict(
            "worker",
            f"Individual slow worker(s) {names}: setting them to ideal removes "
            f"{(e.mw or 0.0) * 100:.0f} % of the slowdown (M_W). {s_text}. Check or evict the "
            "machine.",
            {"workers": workers},
            e,
            th,
        )
    if _at_least(e.comm_share, th.share):
        return Verdict(
            "communication",
            f"Communication: ideal transfer times for every comm op remove "
            f"{(e.comm_share or 0) * 100:.0f} % of the slowdown. {s_text}. Check the network "
            "(links, congestion) and collective placement.",
            {},
            e,
            th,
        )
    if _at_least(e.stage_share, th.share):
        return Verdict(
            "stage",
            f"Stage imbalance: stage {e.worst_stage} is the slowest (S_pp "
            f"{e.worst_stage_slowdown:.2f}); {(e.stage_share or 0) * 100:.0f} % of the slowdown "
            f"is the difference between stages (M_S of the last stage "
            f"{_fmt(e.ms)}). {s_text}. Re-partition layers across pipeline stages.",
            {"stage": e.worst_stage},
            e,
            th,
        )
    within = None if e.stage_share is None else 1.0 - e.stage_share
    if (
        _at_least(within, th.share)
        and _at_least(e.fwd_bwd_correlation, th.seq_correlation)
        and _at_least(e.forward_cv, th.seq_min_cv)
    ):
        return Verdict(
            "sequence_length",
            f"Sequence-length imbalance: {(within or 0) * 100:.0f} % of the slowdown is variation "
            f"between microbatches of a stage, and their forward and backward durations move "
            f"together (correlation {_fmt(e.fwd_bwd_correlation)}, forward CV "
            f"{_fmt(e.forward_cv)}). {s_text}. Balance Σ s² of sequences across microbatches "
            "and DP ranks.",
            {},
            e,
            th,
        )
    return Verdict(
        "undetermined",
        f"Straggling without one dominant cause: {s_text}; M_W {_fmt(e.mw)}, communication share "
        f"{_fmt(e.comm_share)}, stage share {_fmt(e.stage_share)}, forward/backward correlation "
        f"{_fmt(e.fwd_bwd_correlation)}. Forward-only spikes that move between workers suggest "
        "Python garbage collection.",
        {},
        e,
        th,
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
