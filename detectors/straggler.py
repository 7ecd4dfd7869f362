"""Streaming straggler detection, indexed by training step (docs/detection-method.md §9).

In a synchronous job every rank's step takes the same wall time: they all wait for each other in
the collectives. A straggler shows in its *busy* time (outside blocking collectives), which the
step probe reports (``train_busy_seconds``), or, without it, as the rank the others wait for:
the one with the shortest collective time (its busy time is the step time minus its collective
time, from NCCL Inspector's ``nccl_collective_seconds``). In an asynchronous or
parameter-server job each worker's step time is its own, and a slow worker shows in
``train_step_seconds`` directly. The detector reads whichever the job has.

It is iteration-indexed: a rank's observation is a new step (``train_step_number`` advanced, or,
without step numbers, a new sample), whatever the wall-clock spacing: from several steps per
sample to one step a minute. Runs and windows count steps, not seconds, so a slow rank whose
samples are far apart is still followed.

The reference is the balanced job, robustly: the median busy time of the rank's peer group
(pipeline stage) over the ranks' latest steps. It does not flip when a few ranks change for a
moment, and a rank slow for the whole job stays slow against it. A rank is a straggler when

- persistent: its busy time is at least ``1 + persistent_excess`` of the reference on average
  over its last ``persistent_steps`` steps (and most of those steps agree), or
- transient: at least ``transient_factor`` of the reference for ``transient_steps`` steps in a
  row, or
- intermittent: the excess it accumulates over ``intermittent_allowance`` reaches
  ``intermittent_threshold``: a one-sided CUSUM of its log ratio to the reference, which names a
  worker that loses the job a lot of time in bursts although single steps dip back to normal
  (the transient run breaks at every dip, and the persistent agreement is not there).

Several ranks can be stragglers at once. Groups are compared with each other as well: a stage
that becomes slower than the others is one ``stage`` alert, not one per rank; a stage that was
heavier from the start (the model's partition) is the job's design and shows in its verdict and
live slowdown, not as an alert. Everyone slow together is no straggler (``job-wide``).

Each alert carries its cost: the job's live slowdown S (observed step time over the step time
with that worker at the reference), the share of the job's slowdown that worker explains (a live
M_W) and the GPU-hours it costs per hour; an intermittent straggler's over the steps its excess
accumulated over (its latest step may be a dip back to normal).

Where all ranks meet, the detector also derives each rank's *lateness* in a synchronous job
(``train_lateness_seconds``): how long its peers waited for it per step, its peer group's median
collective time less its own (from ``nccl_collective_seconds``; a rank without it: its busy time
less the group's median). A node cannot: it sees only its own ranks. The alerts carry it, and
:meth:`StragglerDetector.late_ranks` gives the latest ranks for export.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind

logger = logging.getLogger(__name__)

MIN_OBSERVATIONS = 3
"""A straggler is named on several observations: one sample covering many steps is not enough."""
STEP = "train_step_seconds"
BUSY = "train_busy_seconds"
NUMBER = "train_step_number"
COLLECTIVE = "nccl_collective_seconds"
LATENESS = "train_lateness_seconds"


@dataclass(frozen=True, slots=True)
class LateRank:
    """One rank's lateness at the last evaluation (``train_lateness_seconds``)."""

    machine: str
    device: str
    seconds: float


@dataclass(frozen=True, slots=True)
class StragglerConfig:
    """Parameters of :class:`StragglerDetector`, with the reason behind each default.

    Attributes
    ----------
    persistent_excess, persistent_steps
        A persistent straggler is this much slower (5 %) over this many steps (50): below 5 %
        the ranks' own step-to-step jitter and a job's normal spread dominate.
    persistent_share
        Of the observations over those steps, at least this share must be slower than half the
        excess: one very slow step does not make a slow rank.
    transient_factor, transient_steps
        A transient straggler is this many times slower (1.5) for this many steps in a row (10).
    intermittent_allowance, intermittent_threshold, intermittent_clip
        The intermittent rule: per rank, ``S = max(0, S + r - k)`` over its new observations
        (each once, however many steps it covers), ``r = log(signal / reference)`` clipped to
        ``±log(intermittent_clip)``, ``k = log(1 + intermittent_allowance)``; a
        straggler when ``S >= intermittent_threshold`` (``h``) with at least
        ``MIN_OBSERVATIONS`` observations above ``k`` and ``transient_steps`` steps in the
        accumulation (see :func:`accumulate_excess`). ``S`` is reset when it signals.

        *Ordinary jitter* (the noise model these are calibrated on): a rank's log step (busy)
        time around its reference varies by up to 5 % (standard deviation) from step to step,
        with heavy tails (Student-t, 3 degrees of freedom: at 5 %, a step 1.25x the reference
        about once in 450, 1.5x once in 2,600), plus single-step hiccups (a collection pause, a
        slow batch) of 1.2-2.5x on up to 1 % of a rank's steps.

        ``k = log 1.15`` sits above the persistent rule's territory on purpose. A steady rank
        5-15 % slower is the persistent rule's (50 steps, 70 % of them agreeing), and below
        5 % the job's normal spread dominates; an allowance there would make the sum drift
        upwards on ordinary ranks (``k`` about one jitter standard deviation), so it would need
        a far larger ``h`` to stay quiet and would be slower on bursts, which is what it is
        for. At 15 % a rank 6-8 % slower drifts down by about 0.07 a step: the persistent rule
        names it, once; a steady rank more than 15 % slower is named by this rule too,
        after ``h / (log ratio - k)`` steps (about 18 at 1.25x), sooner than the persistent
        window, with its excess in the evidence.

        ``h = 1.5`` (a sum of log ratios over steps): the in-control average run length of the
        sum (the recursion alone, without the count and span guards, which only lengthen it),
        computed by the Markov-chain method under the noise model, is about 2 * 10^11 rank-steps
        per false alarm at 5 % jitter, 2 * 10^6 with hiccups on 1 % of the steps, and still
        4 * 10^7 at 12 % jitter without hiccups (``tests/detectors/test_straggler_intermittent.py``
        computes it); the transient and persistent rules are practically never met by
        that noise either. A bursty rank averaging 1.5x over 14 steps with single steps back at
        1.0-1.3x accumulates about 2.2 by its 10th step and 3.1 by its 14th; one averaging 1.4x
        over 12 steps with a quarter of them back at 1.0x, about 2.1. A single burst is named
        when it loses about as much time as the transient rule's smallest case (10 steps at
        1.5x accumulate 2.65): 5 steps at 2x are (2.8, 2.1 by the 10th step), 4 are not.

        ``intermittent_clip = 2``: a step counts at most as twice (or half) the reference, so
        one stall (up to ``max_factor``; beyond, skipped) adds no more than a 2x step: ``h`` is
        at least 2.7 such steps, and the count guard needs three steps above ``k`` anyway.
    stage_excess
        A stage (``group``) whose median is this much slower than the others' (after it was
        not) is a stage straggler.
    min_ranks
        Fewer ranks than this: no reference worth the name; nothing is judged.
    max_factor
        A step this many times longer than the job's reference (a restore from checkpoint, a
        stall) is skipped and counted, never alerted.
    sync_spread
        Step times within this relative spread across ranks mark a synchronous job.
    baseline_steps
        Steps over which each stage's normal share is learnt (a designed imbalance).
    rearm_steps
        A rank alerted again only after this many steps back at the reference.
    ring
        Observations kept per rank.
    """

    persistent_excess: float = 0.05
    persistent_steps: int = 50
    persistent_share: float = 0.7
    transient_factor: float = 1.5
    transient_steps: int = 10
    intermittent_allowance: float = 0.15
    intermittent_threshold: float = 1.5
    intermittent_clip: float = 2.0
    stage_excess: float = 0.05
    min_ranks: int = 4
    max_factor: float = 20.0
    sync_spread: float = 0.03
    baseline_steps: int = 30
    rearm_steps: int = 200
    ring: int = 128

    def __post_init__(self) -> None:
        if not 0 < self.persistent_excess < 1 or self.transient_factor <= 1:
            raise ValueError(
                f"persistent_excess={self.persistent_excess!r}, transient_factor="
                f"{self.transient_factor!r}: expected 0 < excess < 1 and a factor above 1"
            )
        if not (
            self.intermittent_allowance > 0
            and self.intermittent_threshold > 0
            and self.intermittent_clip > 1 + self.intermittent_allowance
        ):
            raise ValueError(
                f"intermittent_allowance={self.intermittent_allowance!r}, intermittent_threshold="
                f"{self.intermittent_threshold!r}, intermittent_clip={self.intermittent_clip!r}: "
                "expected an allowance and a threshold above 0 and a clip above 1 + allowance"
            )
        for name in ("persistent_steps", "transient_steps", "min_ranks", "ring"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)!r}: expected at least 1")


@dataclass(slots=True)
class Excess:
    """Each rank's accumulated excess (the intermittent rule's CUSUM), ``(machines, ranks)``.

    ``total`` is the sum S; ``steps`` the steps it has accumulated over since it last left 0;
    ``above`` how many of those observations were above the allowance; ``ratio_steps`` their
    ratios to the reference times the steps each covers (the episode's mean ratio is
    ``ratio_steps / steps``)."""

    total: np.ndarray
    steps: np.ndarray
    above: np.ndarray
    ratio_steps: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, int]) -> Excess:
        return cls(np.zeros(shape), np.zeros(shape), np.zeros(shape, np.int64), np.zeros(shape))


def accumulate_excess(
    excess: Excess, ratio: np.ndarray, steps: np.ndarray, config: StragglerConfig
) -> np.ndarray:
    """Add one observation per rank where ``ratio`` (its signal over its reference) is finite,
    in place: ``S = max(0, S + clip(log ratio) - k)``. An observation counts once however many
    steps it covers: a scrape every minute of a job stepping every second reads one step's time
    (``train_step_seconds`` is the last step's), and weighting its noise by the 60 steps would
    turn one hiccup into a straggler. ``steps`` still counts the steps the accumulation spans.
    Ranks whose ratio is NaN (no new step, or a bad one) are left as they were: bad steps are
    never accumulated. Returns which ranks started a new accumulation (S left 0)."""
    cap = math.log(config.intermittent_clip)
    allowance = math.log1p(config.intermittent_allowance)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.log(ratio)
    seen = np.isfinite(r)
    r = np.clip(np.where(seen, r, 0.0), -cap, cap)
    n = np.where(seen, steps, 0.0)
    total = np.maximum(0.0, excess.total + np.where(seen, r - allowance, 0.0))
    going = seen & (total > 0)
    started = going & (excess.total <= 0)
    excess.total[...] = np.where(seen, total, excess.total)
    # Ranks back at 0 start afresh; the others add this observation.
    keep = ~seen | going
    excess.steps[...] = np.where(keep, excess.steps + n, 0.0)
    excess.above[...] = np.where(keep, excess.above + (going & (r > allowance)), 0)
    excess.ratio_steps[...] = np.where(
        keep, excess.ratio_steps + np.where(seen, n * np.nan_to_num(ratio), 0.0), 0.0
    )
    return np.asarray(started)


def excess_due(excess: Excess, config: StragglerConfig) -> np.ndarray:
    """Ranks the intermittent rule names: S at the threshold, accumulated over at least
    ``MIN_OBSERVATIONS`` observations above the allowance (never one step, however long) and
    ``transient_steps`` steps (a shorter burst is the transient rule's to judge; a burst is named
    here when it lost as much time as the transient rule's smallest case)."""
    return np.asarray(
        (excess.total >= config.intermittent_threshold)
        & (excess.above >= MIN_OBSERVATIONS)
        & (excess.steps >= config.transient_steps)
    )


def reset_excess(excess: Excess, where: np.ndarray) -> None:
    """Start the ranks ``where`` afresh (after the rule signalled on them)."""
    for a in (excess.total, excess.steps, excess.above, excess.ratio_steps):
        a[where] = 0


@dataclass(slots=True)
class StragglerStats:
    """What the detector read, and what it skipped (never silently)."""

    observations: int = 0
    skipped: int = 0
    """Steps whose time was zero, negative, not a number, or beyond ``max_factor``."""


@dataclass(slots=True)
class JobCost:
    """The job's live slowdown and its explanation at the last evaluation."""

    slowdown: float = 1.0
    verdict: str = "none"
    sync: bool = True
    signal: str = ""
    step_s: float = math.nan
    ideal_step_s: float = math.nan
    stages: dict[str, float] = field(default_factory=dict)


class StragglerDetector:
    """Streaming straggler detector of one job (the :class:`~detectors.base.JobDetector`
    interface); evaluates once per tick of the job's window."""

    def __init__(self, config: StragglerConfig | None = None, *, horizon_s: int = 64) -> None:
        self.config = config or StragglerConfig()
        self._horizon = horizon_s
        self.stats = StragglerStats()
        self.cost = JobCost()
        self._last_tick: int | None = None
        self._tick_s = 0
        self._shape = (0, 0)
        b = self.config.ring
        self._number = np.full((0, 0), np.nan)
        self._latest = np.full((0, 0), np.nan)
        self._latest_step = np.full((0, 0), np.nan)
        self._latest_coll = np.full((0, 0), np.nan)
        self._lateness = np.full((0, 0), np.nan)
        self._names: list[str] = []
        self._devices: list[str] = []
        self._ring = np.full((0, 0, b), np.nan)
        self._ring_k = np.zeros((0, 0, b))
        self._ring_tick = np.zeros((0, 0, b), dtype=np.int64)
        self._pos = np.zeros((0, 0), dtype=np.int64)
        self._run = np.zeros((0, 0))
        self._run_start = np.zeros((0, 0), dtype=np.int64)
        self._run_obs = np.zeros((0, 0), dtype=np.int64)
        self._calm = np.zeros((0, 0))
        self._alerted = np.zeros((0, 0), dtype=bool)
        self._excess = Excess.zeros((0, 0))
        self._excess_start = np.zeros((0, 0), dtype=np.int64)
        self._steps_seen = 0.0
        self._k_median = 1.0
        self._async_until = -math.inf
        self._sync = True
        self._stage_base: dict[str, list[float]] = {}
        self._stage_run: dict[str, float] = {}
        self._stage_calm: dict[str, float] = {}
        self._stage_alerted: set[str] = set()
        self._scores: dict[str, tuple[list[float], list[int]]] = {}

    # -- JobDetector ------------------------------------------------------------------------
    @property
    def horizon_s(self) -> int:
        return self._horizon

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        """``straggler``: each machine's worst rank's busy time over its reference."""
        return dict(self._scores)

    @property
    def live_slowdown(self) -> float:
        """The job's live slowdown S (1 when balanced or not measured)."""
        return self.cost.slowdown

    def late_ranks(self, k: int) -> list[LateRank]:
        """The ``k`` latest ranks of the job at the last evaluation, latest first
        (``train_lateness_seconds``; none in an asynchronous job, where nobody waits)."""
        late = self._lateness
        if k <= 0 or not late.size:
            return []
        flat = np.where(np.isfinite(late), late, -1.0).ravel()
        k = min(k, int((flat >= 0).sum()))
        if k == 0:
            return []
        top = np.argpartition(-flat, k - 1)[:k]
        top = top[np.argsort(-flat[top], kind="stable")]
        d = late.shape[1]
        return [
            LateRank(self._names[i // d], self._devices[i % d], float(flat[i]))
            for i in top.tolist()
            if i // d < len(self._names) and i % d < len(self._devices)
        ]

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        """Read the ranks' newest steps at the tick ending at or before ``now``; the alerts."""
        if not window.cadence_known:
            return []
        if window.tick_s != self._tick_s:
            # The window learnt (another) sampling interval: ticks are counted anew.
            self._tick_s, self._last_tick = window.tick_s, None
        due = (now + 1) // window.tick_s - 1
        if self._last_tick is not None and due <= self._last_tick:
            return []
        self._last_tick = due
        cols, devices = window.columns_of(STEP)
        if cols.size == 0:
            return []
        end = window.tick_end(due)
        step = window.at(end)[:, cols]
        busy, number, coll = (
            self._aligned(window, end, name, devices) for name in (BUSY, NUMBER, COLLECTIVE)
        )
        self._grow(step.shape)
        return self._observe(window, due, step, busy, number, coll, devices)

    # -- state ------------------------------------------------------------------------------
    def _aligned(self, window: JobWindow, end: int, metric: str, devices: list[str]) -> np.ndarray:
        """``metric``'s values at the tick, in the columns of ``devices`` (NaN where absent)."""
        cols, names = window.columns_of(metric)
        out = np.full((window.n_machines, len(devices)), np.nan)
        if cols.size:
            where = {name: i for i, name in enumerate(names)}
            pick = [(j, where[d]) for j, d in enumerate(devices) if d in where]
            if pick:
                values = window.at(end)[:, cols]
                out[:, [j for j, _ in pick]] = values[:, [i for _, i in pick]]
        return out

    def _grow(self, shape: tuple[int, int]) -> None:
        if shape[0] <= self._shape[0] and shape[1] <= self._shape[1]:
            return
        m = max(shape[0], self._shape[0])
        d = max(shape[1], self._shape[1])
        b = self.config.ring

        def grown(a: np.ndarray, fill: Any, *tail: int) -> np.ndarray:
            if fill == 0:  # zeroed memory is not touched until written (the rings are large)
                out = np.zeros((m, d, *tail), dtype=a.dtype)
            else:
                out = np.full((m, d, *tail), fill, dtype=a.dtype)
            out[: a.shape[0], : a.shape[1]] = a
            return out

        self._number = grown(self._number, np.nan)
        self._latest = grown(self._latest, np.nan)
        self._latest_step = grown(self._latest_step, np.nan)
        self._latest_coll = grown(self._latest_coll, np.nan)
        self._lateness = grown(self._lateness, np.nan)
        self._ring = grown(self._ring, np.nan, b)
        self._ring_k = grown(self._ring_k, 0.0, b)
        self._ring_tick = grown(self._ring_tick, 0, b)
        self._pos = grown(self._pos, 0)
        self._run = grown(self._run, 0.0)
        self._run_start = grown(self._run_start, 0)
        self._run_obs = grown(self._run_obs, 0)
        self._calm = grown(self._calm, 0.0)
        self._alerted = grown(self._alerted, False)
        e = self._excess
        self._excess = Excess(
            grown(e.total, 0.0),
            grown(e.steps, 0.0),
            grown(e.above, 0),
            grown(e.ratio_steps, 0.0),
        )
        self._excess_start = grown(self._excess_start, 0)
        self._shape = (m, d)

    # -- one tick ---------------------------------------------------------------------------
    def _observe(
        self,
        window: JobWindow,
        tick: int,
        step: np.ndarray,
        busy: np.ndarray,
        number: np.ndarray,
        coll: np.ndarray,
        devices: list[str],
    ) -> list[Alert]:
        cfg = self.config
        n_m, n_d = step.shape
        present = np.isfinite(step)
        last_number = self._number[:n_m, :n_d]
        # A new step: the step number moved on (or, without numbers, a new sample).
        has_number = np.isfinite(number)
        advanced = np.where(has_number, number - np.nan_to_num(last_number, nan=-1.0), 1.0)
        # A step whose number moved on but whose time is not a number (NaN, infinite: the
        # window holds both as absent) is a bad step: skipped and counted, once.
        lost = has_number & np.isfinite(last_number) & (advanced > 0) & ~present
        if lost.any():
            self.stats.skipped += int(lost.sum())
            self._number[:n_m, :n_d] = np.where(lost, number, last_number)
        if not present.any():
            return []
        new = present & (advanced > 0)
        k = np.where(has_number & np.isfinite(last_number), advanced, 1.0)
        self._number[:n_m, :n_d] = np.where(has_number, number, last_number)
        if not new.any():
            return []
        # Which signal: busy time where reported; in a synchronous job without it, the step
        # time less the collective time (the rank the others wait for waits least); else the
        # step time itself (asynchronous jobs).
        sync = self._synchronous(step, new, tick * window.tick_s, window.tick_s)
        use_busy = np.isfinite(busy) & (busy > 0)
        with np.errstate(invalid="ignore"):  # infinite step and collective times: bad below
            from_coll = sync & ~use_busy & np.isfinite(coll) & (step - coll > 0)
            x = np.where(use_busy, busy, np.where(from_coll, step - coll, step))
        if use_busy[new].any():
            signal = BUSY
        elif from_coll[new].any():
            signal = COLLECTIVE
        else:
            signal = STEP
        # Bad steps: skipped and counted.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            known = self._latest[:n_m, :n_d]
            scale = float(np.nanmedian(known if np.isfinite(known).any() else x[new]))
        too_long = np.isfinite(scale) & (x > cfg.max_factor * scale)
        bad = new & (~np.isfinite(x) | (x <= 0) | (step <= 0) | too_long)
        self.stats.skipped += int(bad.sum())
        new &= ~bad
        if not new.any():
            return []
        self.stats.observations += int(new.sum())
        self._latest[:n_m, :n_d] = np.where(new, x, self._latest[:n_m, :n_d])
        self._latest_coll[:n_m, :n_d] = np.where(new, coll, self._latest_coll[:n_m, :n_d])
        self._steps_seen += float(np.median(k[new]))
        self._k_median = 0.9 * self._k_median + 0.1 * float(np.median(k[new]))

        active = window.active()[:n_m]
        latest = self._latest[:n_m, :n_d]
        counted = active[:, None] & np.isfinite(latest)
        if int(counted.sum()) < cfg.min_ranks:
            return []
        groups = [window.machines[m].group for m in range(n_m)]
        ref, stage_ratio, medians = self._references(latest, counted, groups)
        self._names = [window.machines[m].name for m in range(n_m)]
        self._devices = list(devices)
        lateness = self._rank_lateness(latest, counted, ref, groups, sync)
        ratio = np.where(new, x / ref, np.nan)

        # Rings of per-step ratios, runs of transient slowness.
        m_idx, d_idx = np.nonzero(new)
        pos = self._pos[m_idx, d_idx]
        self._ring[m_idx, d_idx, pos] = ratio[m_idx, d_idx]
        self._ring_k[m_idx, d_idx, pos] = k[m_idx, d_idx]
        start_s = tick * window.tick_s  # seconds: the tick may change later
        self._ring_tick[m_idx, d_idx, pos] = start_s
        self._pos[m_idx, d_idx] = (pos + 1) % cfg.ring
        run = self._run[:n_m, :n_d]
        slow_now = new & (ratio >= cfg.transient_factor)
        starting = slow_now & (run == 0)
        self._run_start[:n_m, :n_d] = np.where(starting, start_s, self._run_start[:n_m, :n_d])
        self._run[:n_m, :n_d] = np.where(new, np.where(slow_now, run + k, 0.0), run)
        # Several observations, not one sample that covers many steps, make a run.
        obs = self._run_obs[:n_m, :n_d]
        self._run_obs[:n_m, :n_d] = np.where(new, np.where(slow_now, obs + 1, 0), obs)

        # Accumulated excess (intermittent stragglers): indexed by step like the runs.
        excess = self._excess_of(n_m, n_d)
        started = accumulate_excess(excess, ratio, k, cfg)
        self._excess_start[:n_m, :n_d] = np.where(started, start_s, self._excess_start[:n_m, :n_d])

        persistent, mean_ratio, slow_parts = self._persistent(n_m, n_d)
        transient = (self._run[:n_m, :n_d] >= cfg.transient_steps) & (
            self._run_obs[:n_m, :n_d] >= MIN_OBSERVATIONS
        )
        intermittent = excess_due(excess, cfg) & active[:, None]
        flagged = (persistent | transient | intermittent) & active[:, None]
        calm = new & ~flagged & (np.nan_to_num(ratio, nan=1.0) < 1 + cfg.persistent_excess / 2)
        quiet = self._calm[:n_m, :n_d]
        self._calm[:n_m, :n_d] = np.where(calm, quiet + k, np.where(flagged, 0.0, quiet))
        rearm = self._alerted[:n_m, :n_d] & (self._calm[:n_m, :n_d] >= cfg.rearm_steps)
        self._alerted[:n_m, :n_d] &= ~rearm

        self._job_cost(window, step, latest, counted, ref, sync, signal)
        rel = np.where(counted, latest / ref, 0.0)
        self._scores = {"straggler": (rel.max(axis=1).tolist(), rel.argmax(axis=1).tolist())}
        alerts = self._stage_alerts(window, tick, stage_ratio, medians, groups)
        stage_machines = {m for m, g in enumerate(groups) if g and g in self._stage_alerted}
        alerted = self._alerted[:n_m, :n_d]
        fire = flagged & ~alerted
        # One straggling machine, one alert: ranks that join its episode later join silently.
        in_episode: np.ndarray = np.asarray(alerted.any(axis=1))[:, None]
        alerted |= fire & in_episode
        fire &= ~in_episode
        firing = sorted(set(np.flatnonzero(fire.any(axis=1)).tolist()) - stage_machines)
        # The second each rank's slowness started (its oldest slow observation counted), of the
        # machines alerted only.
        never = np.iinfo(np.int64).max
        onset = np.full((n_m, n_d), never)
        if firing:
            rows = np.asarray(firing)
            for slow, second in slow_parts:
                first = np.where(slow[rows], second[rows], never).min(axis=2)
                onset[rows] = np.minimum(onset[rows], first)
        for m in firing:
            ranks = np.flatnonzero(fire[m])
            self._alerted[m, ranks] = True
            if persistent[m, ranks].any():
                rule = "persistent"
            elif transient[m, ranks].any():
                rule = "transient"
            else:
                rule = "intermittent"
            alerts.append(
                self._worker_alert(
                    window,
                    tick,
                    m,
                    ranks,
                    devices,
                    (latest, ref, mean_ratio, onset, lateness),
                    rule,
                    signal,
                    sync,
                )
            )
        # The sum starts afresh where it signalled: alerted now, joining its machine's episode,
        # or in an alerted stage (a rank that keeps bursting signals again and holds its alert).
        reset_excess(excess, intermittent)
        return alerts

    def _excess_of(self, n_m: int, n_d: int) -> Excess:
        """The accumulated excess of the job's current ranks (views: updates are kept)."""
        e = self._excess
        return Excess(
            e.total[:n_m, :n_d],
            e.steps[:n_m, :n_d],
            e.above[:n_m, :n_d],
            e.ratio_steps[:n_m, :n_d],
        )

    def _synchronous(self, step: np.ndarray, new: np.ndarray, now_s: int, tick_s: int) -> bool:
        """A synchronous job: the ranks that reported this tick are at the same step (within the
        steps one sample covers), or, without step numbers, their latest step times are equal
        within ``sync_spread``.

        One tick sees only the ranks that reported in it, and a worker that fell behind in an
        asynchronous job reports once per (longer) step of its own: a job found asynchronous
        stays so for three of its steps, so the ticks without that worker do not make it
        synchronous again (and the job's cost is not taken for a synchronous one's). A tick in
        which fewer than two ranks stepped keeps the last verdict."""
        n_m, n_d = step.shape
        self._latest_step[:n_m, :n_d] = np.where(new, step, self._latest_step[:n_m, :n_d])
        # The ranks that reported this tick: one that left long ago keeps an old number.
        numbers = self._number[:n_m, :n_d][new]
        numbers = numbers[np.isfinite(numbers)]
        times = self._latest_step[:n_m, :n_d]
        times = times[np.isfinite(times)]
        if numbers.size >= 2:
            # Within a sample's worth of steps (ranks sampled at slightly different moments).
            sync = bool(numbers.max() - numbers.min() <= max(2.0, 2.0 * self._k_median))
            if not sync:
                # The slowest rank's step, but no more than 10 typical ones: a rank that left
                # after one very long step (a restore) must not hold the verdict for an hour.
                typical = (
                    min(float(np.max(times)), 10.0 * float(np.median(times)))
                    if times.size
                    else float(tick_s)
                )
                self._async_until = now_s + 3.0 * max(typical, float(tick_s)) + tick_s
            self._sync = sync and now_s > self._async_until
        elif np.isfinite(self._number[:n_m, :n_d]).any():
            # The job reports step numbers, but fewer than two ranks stepped this tick: no news
            # (step times right after a change differ between ranks that reported it and ranks
            # that did not yet, in a synchronous job too).
            self._sync = self._sync and now_s > self._async_until
        elif times.size < 2:
            self._sync = True
        else:
            spread = times.max() - times.min()
            self._sync = bool(spread <= self.config.sync_spread * np.median(times))
        return self._sync

    def _references(
        self, latest: np.ndarray, counted: np.ndarray, groups: list[str]
    ) -> tuple[np.ndarray, dict[str, float], dict[str, float]]:
        """Each rank's reference (its group's median where the group is big enough, else the
        job's), each group's median over the other groups' (its stage ratio), and the groups'
        medians."""
        ref, medians = self._group_median(np.where(counted, latest, np.nan), groups)
        stage_ratio: dict[str, float] = {}
        if len(medians) > 1:
            for g, med in medians.items():
                others = [v for h, v in medians.items() if h != g]
                stage_ratio[g] = med / float(np.median(others))
        return ref, stage_ratio, medians

    def _group_median(
        self, values: np.ndarray, groups: list[str]
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Per rank, the median of ``values`` (NaN: not counted) over its group where the group
        has ``min_ranks`` values and the job has several groups, else over the job; and the
        medians of those groups."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = np.full(values.shape, float(np.nanmedian(values)))
            medians: dict[str, float] = {}
            members: dict[str, list[int]] = {}
            for m, g in enumerate(groups):
                members.setdefault(g, []).append(m)
            for g, ms in members.items():
                part = values[ms]
                if np.isfinite(part).sum() >= self.config.min_ranks:
                    medians[g] = float(np.nanmedian(part))
                    if len(members) > 1:
                        ref[ms] = medians[g]
        return ref, medians

    def _rank_lateness(
        self,
        latest: np.ndarray,
        counted: np.ndarray,
        ref: np.ndarray,
        groups: list[str],
        sync: bool,
    ) -> np.ndarray:
        """Each rank's lateness per step (``train_lateness_seconds``), NaN where unknown.

        In a synchronous job the rank the others wait for waits least in the collective: its
        peer group's median collective time less its own is how long the group's typical rank
        waited for it. A rank without collective times: its signal (busy time) less its
        reference, the same in a synchronous job. Never below 0 (an early rank is not late). In
        an asynchronous job (the ranks' step numbers apart) nobody waits: NaN."""
        n_m, n_d = latest.shape
        out = np.full((n_m, n_d), np.nan)
        if sync:
            coll = np.where(counted, self._latest_coll[:n_m, :n_d], np.nan)
            out = np.where(counted, latest - ref, np.nan)
            if np.isfinite(coll).sum() >= self.config.min_ranks:
                typical, _ = self._group_median(coll, groups)
                out = np.where(np.isfinite(coll), typical - coll, out)
            out = np.where(np.isfinite(out), np.maximum(out, 0.0), np.nan)
        self._lateness[:n_m, :n_d] = out
        self._lateness[n_m:, :] = np.nan
        self._lateness[:, n_d:] = np.nan
        return out

    def _persistent(
        self, n_m: int, n_d: int
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Ranks slower by the excess over their last ``persistent_steps`` steps; their mean
        ratio; and of the observations counted, in parts, ``(slow, second)``: which were slow
        (by half the excess), and when each was made (the slowness started at the oldest slow
        one)."""
        cfg = self.config
        # Observations that cover the last persistent_steps steps, at the job's steps per sample.
        n_obs = min(cfg.ring, max(1, math.ceil(cfg.persistent_steps / max(self._k_median, 1.0))))
        steps = weighted = n_use = n_slow = 0.0
        slow_parts, tick_parts = [], []
        # One part, or two where the newest observations wrap around the end of the rings.
        for ratios, ring_k, ring_tick in self._newest(n_m, n_d, n_obs):
            use = np.isfinite(ratios)
            k = np.where(use, ring_k, 0.0)
            slow = use & (ratios >= 1 + cfg.persistent_excess / 2)
            product = np.where(use, ratios, 0.0)
            product *= k
            steps = steps + k.sum(axis=2)
            weighted = weighted + product.sum(axis=2)
            n_use = n_use + np.count_nonzero(use, axis=2)
            n_slow = n_slow + np.count_nonzero(slow, axis=2)
            slow_parts.append(slow)
            tick_parts.append(ring_tick)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.asarray(weighted / steps)
            share = np.asarray(n_slow / n_use)
        persistent = (
            (steps >= cfg.persistent_steps)
            & (n_use >= MIN_OBSERVATIONS)
            & (mean >= 1 + cfg.persistent_excess)
            & (share >= cfg.persistent_share)
        )
        return (
            persistent,
            np.nan_to_num(mean, nan=1.0),
            list(zip(slow_parts, tick_parts, strict=True)),
        )

    def _newest(
        self, n_m: int, n_d: int, n_obs: int
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rings' ``n_obs`` newest observations of each rank (ratio, steps, second) as
        ``(n_m, n_d, ·)`` parts, oldest first: slices of the rings where every rank is at the
        same position (ranks that step together; two where they wrap around the rings' end),
        else gathered rank by rank."""
        b = self.config.ring
        rings = (self._ring[:n_m, :n_d], self._ring_k[:n_m, :n_d], self._ring_tick[:n_m, :n_d])
        if n_obs >= b:
            # The whole ring: its order does not matter to the sums, minima and counts.
            return [rings]
        pos = self._pos[:n_m, :n_d]
        first = int(pos.flat[0]) if pos.size else 0
        if not (pos == first).all():
            idx = (pos[..., None] - n_obs + np.arange(n_obs)) % b
            ratio, k, tick = (np.take_along_axis(r, idx, axis=2) for r in rings)
            return [(ratio, k, tick)]
        lo = (first - n_obs) % b
        if lo + n_obs <= b:
            ratio, k, tick = (r[..., lo : lo + n_obs] for r in rings)
            return [(ratio, k, tick)]
        head = lo + n_obs - b
        ratio, k, tick = (r[..., lo:] for r in rings)
        ratio2, k2, tick2 = (r[..., :head] for r in rings)
        return [(ratio, k, tick), (ratio2, k2, tick2)]

    # -- cost and alerts --------------------------------------------------------------------
    def _job_cost(
        self,
        window: JobWindow,
        step: np.ndarray,
        latest: np.ndarray,
        counted: np.ndarray,
        ref: np.ndarray,
        sync: bool,
        signal: str,
    ) -> None:
        """The job's live slowdown: observed step time over the balanced step time (every rank
        at the mean busy time: the what-if ideal)."""
        values = latest[counted]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            observed = float(np.nanmedian(step))
        if not values.size or not math.isfinite(observed) or observed <= 0:
            return
        if sync:
            # Every rank waits for the slowest: step = slowest busy + communication.
            comm = max(0.0, observed - float(values.max())) if signal != STEP else 0.0
            if signal == STEP:
                observed = float(values.max())
            ideal = float(values.mean()) + comm
        else:
            # Asynchronous: each worker's pace is its own; the job's throughput (steps per
            # second over workers) against every worker at its reference or faster.
            rate = float(np.sum(1.0 / values))
            balanced = float(np.sum(1.0 / np.minimum(values, ref[counted])))
            observed, ideal = float(values.size / rate), float(values.size / balanced)
        slowdown = max(1.0, observed / ideal) if ideal > 0 else 1.0
        self.cost = JobCost(
            slowdown=slowdown,
            verdict=self._verdict(slowdown, values, ref[counted]),
            sync=sync,
            signal=signal,
            step_s=observed,
            ideal_step_s=ideal,
        )

    def _verdict(self, slowdown: float, values: np.ndarray, ref: np.ndarray) -> str:
        if slowdown < 1 + self.config.persistent_excess:
            return "none"
        ratio = values / ref
        if (ratio >= 1 + self.config.persistent_excess).mean() >= 0.5:
            return "job-wide"
        if self._stage_alerted:
            return "stage"
        return "worker"

    def _stage_alerts(
        self,
        window: JobWindow,
        tick: int,
        stage_ratio: dict[str, float],
        medians: dict[str, float],
        groups: list[str],
    ) -> list[Alert]:
        """A stage slower than the others by ``stage_excess`` beyond its normal share."""
        cfg = self.config
        out = []
        for g, r in stage_ratio.items():
            base = self._stage_base.setdefault(g, [])
            if len(base) < cfg.baseline_steps:
                base.append(r)
                continue
            normal = float(np.median(base))
            if r >= normal * (1 + cfg.stage_excess):
                self._stage_run[g] = self._stage_run.get(g, 0.0) + self._k_median
                self._stage_calm[g] = 0.0
            else:
                self._stage_run[g] = 0.0
                self._stage_calm[g] = self._stage_calm.get(g, 0.0) + self._k_median
                if g in self._stage_alerted and self._stage_calm[g] >= cfg.rearm_steps:
                    self._stage_alerted.discard(g)  # back to normal: its workers are judged again
                continue
            if g in self._stage_alerted or self._stage_run[g] < cfg.persistent_steps:
                continue
            self._stage_alerted.add(g)
            machines = [window.machines[m].name for m, h in enumerate(groups) if h == g]
            others = float(np.median([v for h, v in medians.items() if h != g]))
            out.append(
                Alert(
                    job=window.job,
                    machine=g,
                    kind=AlertKind.STRAGGLER,
                    metric=self.cost.signal or BUSY,
                    score=round(r / normal, 4),
                    first_ts=float(
                        max(
                            window.tick_end(tick) - self._stage_run[g] * self.cost.step_s,
                            window.first_sec,
                        )
                    ),
                    detected_ts=float(window.tick_end(tick)),
                    domain="",
                    evidence={
                        "rule": "straggler",
                        "verdict": "stage",
                        "group": g,
                        "stage_ratio": round(r, 4),
                        "normal_ratio": round(normal, 4),
                        # How long the other stages wait for it per step (its median signal
                        # over theirs); a stage's ranks are not late against one another.
                        "lateness_s": round(max(0.0, medians[g] - others), 6)
                        if self.cost.sync
                        else None,
                        "members": machines[:64],
                        "slowdown": round(self.cost.slowdown, 4),
                        "job_slowdown": round(self.cost.slowdown, 4),
                        "steps": int(self._stage_run[g]),
                    },
                )
            )
        return out

    def _worker_alert(
        self,
        window: JobWindow,
        tick: int,
        m: int,
        ranks: np.ndarray,
        devices: list[str],
        arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        rule: str,
        signal: str,
        sync: bool,
    ) -> Alert:
        """One machine's straggling ranks, with what they cost the job; ``rule`` the rule that
        named them (``persistent``, ``transient`` or ``intermittent``).

        The cost is the job's at its latest steps, except for an intermittent straggler, whose
        latest step may be a dip back to normal: its ranks' pace is then their mean over the
        steps the rule accumulated (dips included), and the job's step time (its ``job_slowdown``
        too) what it is with them at that pace: the cost over the steps the alert judged."""
        latest, ref, mean_ratio, onset, lateness = arrays
        info = window.machines[m]
        cost = self.cost
        excess = self._excess
        pace = latest
        if rule == "intermittent":
            # Its worst rank is the one that lost most, not the one slowest at this step.
            worst = int(ranks[np.argmax(excess.total[m, ranks])])
            span = excess.steps[m, ranks]
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = excess.ratio_steps[m, ranks] / span * ref[m, ranks]
            pace = latest.copy()
            pace[m, ranks] = np.where(span > 0, mean, latest[m, ranks])
        else:
            worst = int(ranks[np.argmax(latest[m, ranks] / ref[m, ranks])])
        own = float(pace[m, worst])
        reference = float(ref[m, worst])
        mask = np.isfinite(latest)
        mask[m, :] = False  # the worker is the machine: all its ranks go to the reference
        others = latest[mask]
        observed, ideal = cost.step_s, cost.ideal_step_s
        if sync:
            # The job's step time with this worker at the reference.
            slowest_other = max(float(others.max()) if others.size else reference, reference)
            if pace is latest:
                without = observed - max(0.0, own - slowest_other)
            else:
                # Its ranks' excess now out, their excess at their mean pace in.
                now = float(np.nanmax(latest[m, ranks]))
                without = observed - max(0.0, now - slowest_other)
                observed = without + max(0.0, own - slowest_other)
        else:
            rate = float(np.sum(1.0 / latest[np.isfinite(latest)]))
            own_ranks = latest[m][np.isfinite(latest[m])]
            fixed = rate - float(np.sum(1.0 / own_ranks)) + own_ranks.size / reference
            without = observed * rate / fixed
            if pace is not latest:
                own_pace = pace[m][np.isfinite(latest[m])]
                paced = rate - float(np.sum(1.0 / own_ranks)) + float(np.sum(1.0 / own_pace))
                observed = observed * rate / paced
        slowdown = observed / without if without > 0 else 1.0
        job_slowdown = (
            cost.slowdown if pace is latest else max(1.0, observed / ideal if ideal > 0 else 1.0)
        )
        explained = (observed - without) / (observed - ideal) if observed > ideal else 0.0
        ranks_in_job = int(np.isfinite(latest).sum())
        lost = ranks_in_job * (1 - 1 / slowdown)
        if rule == "persistent":
            start = int(onset[m, ranks].min())
        elif rule == "transient":
            start = int(self._run_start[m, ranks].min())
        else:
            start = int(self._excess_start[m, worst])
        if start >= 2**62:
            start = tick * window.tick_s
        ratio = own / reference if reference > 0 else math.nan
        late = float(lateness[m, worst])
        if rule == "persistent":
            steps = self.config.persistent_steps
        elif rule == "transient":
            steps = int(self._run[m, ranks].max())
        else:
            steps = int(excess.steps[m, worst])
        evidence: dict[str, Any] = {
            "rule": "straggler",
            "verdict": "worker",
            "straggler": rule,
            "ratio": round(ratio, 4),
            "mean_ratio": round(float(mean_ratio[m, worst]), 4),
            "busy_s": round(own, 6),
            "reference_s": round(reference, 6),
            # How long its peers waited for its worst rank per step (None: asynchronous).
            "lateness_s": round(late, 6) if math.isfinite(late) else None,
            "steps": steps,
            "slowdown": round(slowdown, 4),
            "share": round(min(1.0, max(0.0, explained)), 4),
            "gpu_hours_lost_per_hour": round(max(0.0, lost), 4),
            "job_slowdown": round(job_slowdown, 4),
            "sync": sync,
            "group": info.group,
        }
        if rule == "intermittent":
            # The accumulated excess at the alert and its threshold; the mean ratio over the
            # steps it accumulated over (``steps``), dips included.
            evidence["cusum"] = round(float(excess.total[m, worst]), 4)
            evidence["cusum_threshold"] = self.config.intermittent_threshold
            evidence["cusum_allowance"] = self.config.intermittent_allowance
            span = float(excess.steps[m, worst])
            evidence["episode_ratio"] = (
                round(float(excess.ratio_steps[m, worst]) / span, 4) if span > 0 else None
            )
        return Alert(
            job=window.job,
            machine=info.name,
            kind=AlertKind.STRAGGLER,
            metric=signal,
            score=round(ratio, 4),
            first_ts=float(max(start, window.first_sec)),
            detected_ts=float(window.tick_end(tick)),
            devices=tuple(devices[int(r)] for r in ranks),
            domain=info.domain,
            evidence=evidence,
        )
