"""Live hang detection: a job whose ranks all stopped stepping while its machines still report
(docs/hangs.md).

A hung synchronous job does not crash: every rank waits in a collective that one of them never
joins, until the collective's timeout (ten minutes and more) kills it. Its machines keep
reporting; nothing in their metrics stands apart. What stops is the step counter the training
loop reports through the step probe (``train_step_number``, or new ``train_step_seconds``
samples where the probe sends no numbers).

**The rule.** The job's *last step* is the latest second at which any of its ranks advanced (a
sample whose step number moved on; a step number that went back, a restart from a checkpoint,
counts as progress too). Its stall is how long its machines have reported since without a rank
advancing: the earliest, over the machines holding ranks, of the latest second each reported
(a machine whose report carries no new step is evidence that its ranks did not step), less the
last step. The job hangs when that stall reaches the threshold

    ``bound = min(max(3 x median step time, 30 s), 60 s)`` (never under 2 x the median step)
    ``threshold = max(bound - interval + 1, 1)``

where *interval* is the sampling interval of the ranks' machines (the slowest of them): the stall
can only be seen when a machine reports, once per interval, so the first report at or beyond the
threshold comes at most ``bound`` seconds after the last step. The alert's ``detected_ts`` is
then at most ``bound`` (60 s at most) after the last step, at any interval from 1 to 60 s with
regular sampling; at 60 s the first report without progress fires (a whole interval without a
step is the least a 60 s interval can tell). A job whose median step is longer than 30 s gets
twice its median step instead of 60 s (its ordinary steps would otherwise look like hangs).
With ``own_pause_factor`` set (off by default: the bound above holds whatever the job did
before), once a stall of the job ended by itself with no rank stopped first (an unreported
checkpoint), a later stall with no rank stopped first is a hang only past that many times the
longest such stall, and never later than the bound's cap (60 s): a job that pauses up to about
40 s without saying so then pages once, not at every pause.

The evidence names the ranks that *stopped first*: those whose step number is behind the job's
highest, or (without that) whose last step came clearly before the others' (by two median steps
or two intervals, at least 5 s), as long as they are fewer than half the ranks (more is the
job's own pattern, an asynchronous job, not a culprit). When every rank stopped at the same step
the counters cannot tell who stopped first; the list is empty and the evidence says so (the
flight recorder can). Each machine holding such a rank gets its own ``hang`` alert: what the
scheduler actions act on.

**Not a hang.** A job whose machines left (goodbye, or a batch of them gone: the window's
membership) or stopped reporting (silence, the rules' business: fewer than half the machines
holding ranks still reporting) is not hung; nor a job before its first steps (the rule is armed
after ``min_advances`` samples with progress, so a long first step of compilation is not a
hang), nor a job whose ranks report a pause (``train_paused_seconds``, from ``probe.pause``:
each paused report counts as activity, so the stall starts when the pause ends). A pause hides
a hang for at most ``max_pause_s`` after the last step (30 min by default): a pause that never
ends (a checkpoint writer stuck on a dead file system) is a hang then.

**The flight recorder.** Summaries of the ranks' flight-recorder dumps arrive in node batches
(:meth:`detectors.window.JobWindow.take_flight_records`). Once they settle (no new one for
``settle_s`` seconds of data, or one from every rank their groups name), they are analysed
(:func:`detectors.hangs.analyze`). A hung verdict raises the job-level alert again, with the same
key, score 2 and the analysis in its evidence (the store folds it into the open one and keeps
the evidence of the higher score), and one ``hang`` alert per culprit machine. Ranks are placed
on machines by their dumps, else by the step probe's ``rank<N>`` devices. In a job that reports
its steps, dumps alone make no hang (an on-demand dump of a working job nearly always catches a
rank not yet in the next collective): they wait until the step counters say the job is stalled,
and are dropped if it steps on. A summary of a rank the step probe places on another machine
than the one that sent it is refused (a node speaks for its own ranks).

**Episodes.** One job-level alert per hang: it ends when a rank steps again; a later hang is a
new alert (a new ``first_ts``). An analysis raises again only when it names new culprits.
:meth:`HangDetector.hang_analysis` holds the latest verdict: the flight recorder's, else the
live one (culprits ``stopped_first``), and a ``hung=False`` one once the hang is over.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detectors.config import OWN_PAUSE_FACTORS, own_pause_factor_ok
from detectors.window import NEVER, JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.hang import (
    MAX_REPORTED,
    Culprit,
    CulpritReason,
    HangAnalysis,
    RankSummary,
    expand_runs,
)

logger = logging.getLogger(__name__)

NUMBER = "train_step_number"
STEP = "train_step_seconds"
PAUSED = "train_paused_seconds"
METRIC = "hang"
"""The alerts' ``metric``: one key per job (machine ``""``) and per culprit machine."""
LIVE_SCORE = 1.0
RECORDER_SCORE = 2.0
MAX_LISTED = 64
"""Ranks and machines listed in one alert's evidence (the rest counted)."""
_RANK = re.compile(r"rank(\d{1,10})")

Analyzer = Callable[..., HangAnalysis]
"""``analyze(summaries, machines, *, now)``: :func:`detectors.hangs.analyze`."""


@dataclass(frozen=True, slots=True)
class HangConfig:
    """Parameters of :class:`HangDetector`, with the reason behind each default.

    Attributes
    ----------
    step_factor, floor_s, cap_s
        The bound: ``min(max(step_factor x median step, floor_s), cap_s)``: three steps
        without progress is no jitter, 30 s no garbage collection or slow batch, and past a
        minute a hung job wastes the whole fleet's time.
    min_step_factor
        The bound is never under this many median steps (jobs stepping slower than
        ``cap_s / min_step_factor`` get this instead of ``cap_s``).
    min_advances
        Samples with progress before the rule is armed (before its first steps a job is
        loading, compiling: not hung).
    max_pause_s
        Longest a reported pause hides a stall, counted from the last step.
    own_pause_factor
        After a stall that ended by itself (no rank stopped first, no restart, no
        flight-recorder culprit: a checkpoint or an evaluation the loop did not report as a
        pause), a later stall in which no rank stopped first is a hang only past this many
        times the longest such stall, and never later than the bound's cap (``cap_s``, or
        twice the median step for slow-stepping jobs). 0 (the default) turns it off: the
        bound then holds whatever the job did before. The service's setting is
        ``MINDER_DETECTION__HANG_OWN_PAUSE_FACTOR``.
    settle_s
        Seconds of data without a new flight-recorder summary before the ones received are
        analysed, unless every rank their groups name has sent one. The dumps of one hang are
        written within seconds of each other, but each agent takes a dump only once it stood
        still for two of its polls (5 s each by default) and sends it with its next batch: a
        rank whose summary is merely late must not be named for having written none.
    max_summaries
        Ranks whose summaries the detector holds for one job; a further rank's is refused
        and counted.
    alive_intervals, alive_min_s
        A machine still reports when its latest report is at most this many of its sampling
        intervals old (and at most ``alive_min_s``, whichever is longer).
    min_alive_share
        Share of the machines holding ranks that must still report for a stall to be a hang
        (fewer: the job stopped reporting, which silence and membership handle).
    """

    step_factor: float = 3.0
    floor_s: float = 30.0
    cap_s: float = 60.0
    min_step_factor: float = 2.0
    min_advances: int = 3
    max_pause_s: float = 1800.0
    own_pause_factor: float = 0.0
    settle_s: float = 30.0
    max_summaries: int = 65_536
    alive_intervals: float = 3.0
    alive_min_s: float = 10.0
    min_alive_share: float = 0.5

    def __post_init__(self) -> None:
        for name in ("step_factor", "floor_s", "cap_s", "alive_intervals", "min_step_factor"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"hang {name} is {value!r}: expected a number > 0")
        if self.floor_s > self.cap_s:
            raise ValueError(
                f"hang floor_s={self.floor_s!r} and cap_s={self.cap_s!r}: expected floor <= cap"
            )
        for name in ("max_pause_s", "settle_s", "alive_min_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"hang {name} is {value!r}: expected seconds >= 0")
        factor = self.own_pause_factor
        if not own_pause_factor_ok(factor):
            raise ValueError(f"hang own_pause_factor is {factor!r}: expected {OWN_PAUSE_FACTORS}")
        if isinstance(self.min_advances, bool) or self.min_advances < 1:
            raise ValueError(f"hang min_advances is {self.min_advances!r}: expected >= 1")
        if not 0 < self.min_alive_share <= 1:
            raise ValueError(f"hang min_alive_share is {self.min_alive_share!r}: expected 0..1")

    def bound_s(self, median_step_s: float) -> float:
        """Seconds after the last step by which a hang is alerted (with regular sampling)."""
        step = median_step_s if math.isfinite(median_step_s) and median_step_s > 0 else 0.0
        bound = min(max(self.step_factor * step, self.floor_s), self.cap_s)
        return max(bound, self.min_step_factor * step)


@dataclass(slots=True)
class _Ranks:
    """Per rank device (``rank<N>``) of the job: what the step probe said last."""

    names: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    rank: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    number: np.ndarray = field(default_factory=lambda: np.zeros(0))
    advanced: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Second of the sample in which it last advanced."""
    step_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    owner: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Machine (window index) that reported it last; -1 before."""
    paused: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pause_seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Last second it reported a pause, or the end of one."""

    def add(self, name: str) -> int:
        found = self.index.get(name)
        if found is not None:
            return found
        i = len(self.names)
        self.names.append(name)
        self.index[name] = i
        if i >= self.rank.size:
            cap = max(16, 2 * self.rank.size)

            def grown(a: np.ndarray, fill: Any) -> np.ndarray:
                out = np.full(cap, fill, dtype=a.dtype)
                out[: a.size] = a
                return out

            self.rank = grown(self.rank, -1)
            self.number = grown(self.number, np.nan)
            self.advanced = grown(self.advanced, NEVER)
            self.step_s = grown(self.step_s, np.nan)
            self.owner = grown(self.owner, -1)
            self.paused = grown(self.paused, np.nan)
            self.pause_seen = grown(self.pause_seen, NEVER)
        match = _RANK.fullmatch(name)
        self.rank[i] = int(match.group(1)) if match else -1
        return i

    def __len__(self) -> int:
        return len(self.names)


@dataclass(slots=True)
class _Episode:
    """One hang of the job, from the alert that opened it to the step that ends it."""

    first_ts: float
    last_step_ts: int
    job_alert_id: str
    live: dict[str, Any] = field(default_factory=dict)
    """The live evidence (steps), when the step rule fired."""
    recorder_culprits: frozenset[int] = frozenset()
    """Culprit ranks of the flight-recorder alerts raised."""
    recorder_machines: dict[str, frozenset[int]] = field(default_factory=dict)
    """Culprit ranks of each machine's flight-recorder alert raised."""
    machines: set[str] = field(default_factory=set)
    """Machines alerted in this episode."""
    restarts: int = 0
    """The detector's restart count when the episode opened."""


@dataclass(slots=True)
class HangStats:
    """What the detector did (reported, never silent)."""

    analyses: int = 0
    summaries: int = 0
    restarts: int = 0
    """Step numbers that went back (a restart from a checkpoint), counted as progress."""
    refused_summaries: int = 0
    """Summaries refused: of a rank the step probe places on another machine than the one that
    sent it, or beyond ``max_summaries`` ranks."""
    stale_summaries: int = 0
    """Summaries dropped because the job stepped on after they arrived (a snapshot of a job
    that works: no hang)."""


class HangDetector:
    """Live hang detector of one job (the :class:`~detectors.base.JobDetector` interface).

    Evaluates at every second it is called with (the stall is measured to the machines'
    latest reports, whatever the sampling interval), reading the window's newest ticks.

    Parameters
    ----------
    config
        Thresholds (:class:`HangConfig`).
    analyze
        The cross-rank analysis of flight-recorder summaries, ``analyze(summaries, machines,
        *, now) -> HangAnalysis``; default :func:`detectors.hangs.analyze`.
    horizon_s
        Seconds of history the detector asks the window to keep.
    """

    def __init__(
        self,
        config: HangConfig | None = None,
        *,
        analyze: Analyzer | None = None,
        horizon_s: int = 16,
    ) -> None:
        self.config = config or HangConfig()
        self._analyze = analyze
        self._horizon = horizon_s
        self.stats = HangStats()
        self._ranks = _Ranks()
        self._n_series = -1
        self._cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """Per metric: its series indices and their rank indices."""
        self._seen: dict[str, np.ndarray] = {}
        """Per metric, per series: second of the last sample read."""
        self._tick_s = 0
        self._done_sec = NEVER
        """Ticks ending at or before this second were read whole."""
        self._partial: tuple[int, int] = (NEVER, 0)
        """(tick, machines whose report in it was read) of the tick being read as it fills."""
        self._advances = 0
        """Times the job's step went on (its highest step number rose, or steps of ranks
        without numbers came in a new tick): the rule is armed at ``min_advances``."""
        self._top = -math.inf
        self._bare_tick = NEVER
        self._known: np.ndarray = np.zeros(0, dtype=np.int64)
        """Per machine, its latest report at or before the second evaluated, as seen then."""
        self._episode: _Episode | None = None
        self._summaries: dict[int, RankSummary] = {}
        self._expected: set[int] = set()
        """Every rank the held summaries' groups name (kept as they arrive)."""
        self._summaries_at = NEVER
        """Data second the latest summary was taken."""
        self._analysed = True
        self._analysis: HangAnalysis | None = None
        self._own_pause_s = 0.0
        """The longest stall of this job's run that ended by itself, as the reports could see
        it (see ``own_pause_factor``)."""

    # -- JobDetector ------------------------------------------------------------------------
    @property
    def horizon_s(self) -> int:
        return self._horizon

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        """None: a hang is the job's, not a machine's score."""
        return {}

    def hang_analysis(self) -> HangAnalysis | None:
        """The latest verdict on the job: the flight recorder's analysis, else the live one of
        the step counters; ``hung=False`` once a hang is over; None before any hang."""
        return self._analysis

    @property
    def in_hang(self) -> bool:
        """A hang episode is open."""
        return self._episode is not None

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        """Read the samples up to second ``now``; the hang alerts that fire."""
        self._take_summaries(window, now)
        if window.n_machines == 0:
            return []
        self._ingest(window, now)
        out = self._live(window, now)
        out += self._recorder(window, now)
        return out

    # -- reading the window -----------------------------------------------------------------
    def _columns(self, window: JobWindow) -> None:
        if window.n_series == self._n_series:
            return
        self._n_series = window.n_series
        for metric in (NUMBER, STEP, PAUSED):
            cols, devices = window.columns_of(metric)
            idx = np.asarray([self._ranks.add(d) for d in devices], dtype=np.int64)
            old = self._seen.get(metric, np.zeros(0, dtype=np.int64))
            seen = np.full(cols.size, NEVER, dtype=np.int64)
            seen[: old.size] = old  # series are only ever appended
            self._cols[metric] = (cols, idx)
            self._seen[metric] = seen

    def _ingest(self, window: JobWindow, now: int) -> None:
        """Read every tick not yet read whole up to ``now``; the tick holding ``now`` as its
        machines report in it (at a coarse tick, a report is read the second it is made)."""
        self._columns(window)
        if not any(cols.size for cols, _ in self._cols.values()):
            return
        tick_s = window.tick_s
        if tick_s != self._tick_s:
            self._tick_s = tick_s
            self._partial = (NEVER, 0)
        cur = window.tick_of(now)
        first = cur - window.slots + 1
        if self._done_sec != NEVER:
            first = max(first, (self._done_sec + 1) // tick_s)
        for tick in range(first, cur):
            self._read(window, tick, now)
        if window.tick_end(cur) <= now:
            self._read(window, cur, now)
            self._done_sec = window.tick_end(cur)
            return
        self._done_sec = max(self._done_sec, window.tick_end(cur - 1))
        secs = self._report_secs(window, cur)
        ready = int(np.count_nonzero((secs != NEVER) & (secs <= now)))
        tick, read = self._partial
        if tick != cur or ready > read:
            self._partial = (cur, ready)
            if ready:
                self._read(window, cur, now)

    def _report_secs(self, window: JobWindow, tick: int) -> np.ndarray:
        """Per machine, the second of its report in ``tick`` (NEVER where it has none): its
        last report if that falls in the tick, else the same phase of its interval."""
        last = window.machine_last_seen()
        start = tick * window.tick_s
        end = window.tick_end(tick)
        phase = start + (last - start) % window.tick_s
        return np.where(last < start, NEVER, np.where(last <= end, last, phase))

    def _read(self, window: JobWindow, tick: int, now: int) -> None:
        """Take the ranks' samples of ``tick`` made up to ``now`` that were not read yet."""
        blocks = [(m, *self._cols[m]) for m in (NUMBER, STEP, PAUSED) if self._cols[m][0].size]
        cols = np.concatenate([c for _, c, _ in blocks])
        values = window.window(window.tick_end(tick), 1, cols)[0]
        secs = self._report_secs(window, tick)
        ranks = self._ranks
        at = 0
        for metric, mcols, idx in blocks:
            block = values[:, at : at + mcols.size]
            at += mcols.size
            present = np.isfinite(block)
            # Nearly always one machine per rank: the first that reported it.
            owner = present.argmax(axis=0)
            width = np.arange(mcols.size)
            value = block[owner, width].astype(np.float64)
            value[~present[owner, width]] = np.nan
            several = np.flatnonzero(np.count_nonzero(present, axis=0) > 1)
            if several.size:
                # A rank reported by two machines (it moved): the higher value, its machine.
                best = np.where(present[:, several], block[:, several], -np.inf)
                owner[several] = best.argmax(axis=0)
                value[several] = best.max(axis=0)
            sec = secs[owner]
            seen = self._seen[metric]
            new = np.isfinite(value) & (sec != NEVER) & (sec <= now) & (sec > seen)
            if not new.any():
                continue
            seen[new] = sec[new]
            which, value, sec, owner = idx[new], value[new], sec[new], owner[new]
            ranks.owner[which] = owner
            if metric == NUMBER:
                self._numbers(which, value, sec)
            elif metric == STEP:
                ranks.step_s[which] = value
                # Without step numbers, a new step time is a new step (the agent sends one
                # only for an interval in which the rank stepped).
                bare = np.isnan(ranks.number[which])
                if bare.any():
                    ranks.advanced[which[bare]] = np.maximum(ranks.advanced[which[bare]], sec[bare])
                    if tick != self._bare_tick:
                        self._bare_tick = tick
                        self._advances += 1
            else:
                was = ranks.paused[which]
                on = value > 0
                ended = ~on & (was > 0)
                mark = on | ended
                ranks.pause_seen[which[mark]] = np.maximum(ranks.pause_seen[which[mark]], sec[mark])
                ranks.paused[which] = value

    def _numbers(self, which: np.ndarray, value: np.ndarray, sec: np.ndarray) -> None:
        ranks = self._ranks
        last = ranks.number[which]
        back = np.isfinite(last) & (value < last)
        if back.any():
            self.stats.restarts += int(back.sum())
            logger.info(
                "%d rank(s) stepped back to an earlier step number (a restart from a "
                "checkpoint): counted as progress",
                int(back.sum()),
            )
        moved = np.isnan(last) | (value != last)
        ranks.number[which] = value
        if not moved.any():
            return
        ranks.advanced[which[moved]] = np.maximum(ranks.advanced[which[moved]], sec[moved])
        top = float(value.max())
        if top > self._top:
            self._top = top
            self._advances += 1

    # -- the live rule ----------------------------------------------------------------------
    def _live(self, window: JobWindow, now: int) -> list[Alert]:
        ranks = self._ranks
        n = len(ranks)
        if n == 0:
            return []
        owner = ranks.owner[:n]
        stepped = (owner >= 0) & (ranks.advanced[:n] != NEVER)
        active = window.active()
        in_job = stepped & np.where(owner >= 0, active[np.maximum(owner, 0)], False)
        if not in_job.any():
            if stepped.any():
                self._job_left(window, now)
            return []
        machines = np.unique(owner[in_job])
        covered = self._covered(window, machines, now)
        intervals = np.maximum(window.machine_interval_s[machines], float(window.tick_s))
        limit = np.maximum(self.config.alive_intervals * intervals, self.config.alive_min_s)
        alive = now - covered <= limit
        last_step = int(ranks.advanced[:n][in_job].max())
        episode = self._episode
        if episode is not None and last_step > episode.last_step_ts:
            self._end_episode(window, now, last_step)
            episode = None
        if episode is not None or self._advances < self.config.min_advances:
            return []
        if alive.sum() < self.config.min_alive_share * machines.size:
            return []
        cfg = self.config
        # A reported pause is activity, up to max_pause_s after the last step.
        pause = ranks.pause_seen[:n][in_job]
        paused_until = int(pause.max()) if pause.size else NEVER
        activity = last_step
        if paused_until != NEVER:
            activity = max(last_step, min(paused_until, last_step + int(cfg.max_pause_s)))
        through = int(covered[alive].min())
        stalled = through - activity
        median = self._median_step(in_job)
        interval = float(intervals[alive].max())
        bound = cfg.bound_s(median)
        threshold = max(bound - interval + 1.0, 1.0)
        if stalled < threshold:
            return []
        # The job's own pauses hold a stall, never past the bound.
        own = min(cfg.own_pause_factor * self._own_pause_s, max(bound, cfg.cap_s) - interval + 1)
        if own > threshold:
            if stalled < own and not self._stopped_first(in_job, median, interval)[0].size:
                return []  # within the job's own pauses, and no rank stopped first
            if stalled >= own:
                threshold = own
        return self._open_live(
            window, now, in_job, last_step, activity, stalled, median, bound, threshold, interval
        )

    def _covered(self, window: JobWindow, machines: np.ndarray, now: int) -> np.ndarray:
        """Per machine, the latest second up to ``now`` at which it reported: its last report,
        or, when a later one is in the window already (data ahead of the evaluation), the one
        a sampling interval before it once the window knows the interval; else the latest
        report seen at or before an earlier evaluation."""
        last_all = window.machine_last_seen()
        if self._known.size < last_all.size:
            known = np.full(last_all.size, NEVER, dtype=np.int64)
            known[: self._known.size] = self._known
            self._known = known
        seen = np.where(last_all <= now, last_all, NEVER)
        self._known[: last_all.size] = np.maximum(self._known[: last_all.size], seen)
        out = self._known[machines]
        if window.cadence_known:
            last = last_all[machines]
            iv = np.maximum(np.rint(window.machine_interval_s[machines]), 1).astype(np.int64)
            back = np.ceil(np.maximum(last - now, 0) / iv).astype(np.int64) * iv
            out = np.maximum(out, last - back)
        return np.asarray(out)

    def _median_step(self, in_job: np.ndarray) -> float:
        n = len(self._ranks)
        steps = self._ranks.step_s[:n][in_job]
        steps = steps[np.isfinite(steps) & (steps > 0)]
        if not steps.size:
            return math.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(np.median(steps))

    def _stopped_first(
        self, in_job: np.ndarray, median: float, interval: float
    ) -> tuple[np.ndarray, str]:
        """Indices of the ranks that stopped first, and how they were told apart."""
        ranks = self._ranks
        n = len(ranks)
        idx = np.flatnonzero(in_job)
        half = idx.size / 2
        number = ranks.number[:n][idx]
        numbered = np.isfinite(number)
        if numbered.sum() >= 2:
            top = number[numbered].max()
            behind = numbered & (number < top)
            if 0 < behind.sum() < half:
                return idx[behind], "behind"
        advanced = ranks.advanced[:n][idx].astype(np.float64)
        step = median if math.isfinite(median) else 0.0
        margin = max(2.0 * step, 2.0 * interval, 5.0)
        earlier = advanced < float(np.median(advanced)) - margin
        if 0 < earlier.sum() < half:
            return idx[earlier], "earlier"
        return idx[:0], "same_step" if numbered.all() else "together"

    def _open_live(
        self,
        window: JobWindow,
        now: int,
        in_job: np.ndarray,
        last_step: int,
        activity: int,
        stalled: int,
        median: float,
        bound: float,
        threshold: float,
        interval: float,
    ) -> list[Alert]:
        ranks = self._ranks
        n = len(ranks)
        first, how = self._stopped_first(in_job, median, interval)
        first = first[np.argsort(ranks.rank[first], kind="stable")]
        number = ranks.number[:n]
        top = number[in_job]
        top = top[np.isfinite(top)]
        last_number = float(top.max()) if top.size else None
        by_machine: dict[int, list[int]] = {}
        for i in first.tolist():
            by_machine.setdefault(int(ranks.owner[i]), []).append(i)
        names = [window.machines[m].name for m in sorted(by_machine)]
        listed = [self._rank_entry(window, i) for i in first[:MAX_LISTED].tolist()]
        evidence: dict[str, Any] = {
            "source": "steps",
            "last_step": _number(last_number),
            "last_step_ts": float(last_step),
            "stalled_s": float(stalled),
            "median_step_s": round(median, 6) if math.isfinite(median) else None,
            "ranks": int(in_job.sum()),
            "machines": int(np.unique(ranks.owner[:n][in_job]).size),
            "stopped_first": listed,
            "stopped_first_ranks": [e["rank"] for e in listed],
            "stopped_first_machines": names[:MAX_LISTED],
            "stopped_first_dropped": max(0, first.size - MAX_LISTED),
            "stopped_first_by": how if first.size else None,
            "same_step": how == "same_step",
            "threshold_s": float(threshold),
            "bound_s": float(bound),
            "own_pause_s": round(self._own_pause_s, 3) if self._own_pause_s else None,
            "interval_s": float(interval),
            "detail": _live_detail(first.size, how, last_number),
        }
        if activity > last_step:
            evidence["paused_until_ts"] = float(activity)
        first_ts = float(max(activity, window.first_sec))
        job_alert = Alert(
            job=window.job,
            machine="",
            kind=AlertKind.HANG,
            metric=METRIC,
            score=LIVE_SCORE,
            first_ts=first_ts,
            detected_ts=float(now),
            evidence=evidence,
        )
        episode = _Episode(
            first_ts, last_step, job_alert.id, live=evidence, restarts=self.stats.restarts
        )
        self._episode = episode
        out = [job_alert]
        culprits = []
        for m in sorted(by_machine):
            info = window.machines[m]
            members = by_machine[m]
            rank_ids = [int(ranks.rank[i]) for i in members]
            culprits += [
                Culprit(
                    rank=r,
                    reason=CulpritReason.STOPPED_FIRST,
                    machine=info.name,
                    detail=_stopped_detail(number[i], last_number, int(ranks.advanced[i])),
                )
                for r, i in zip(rank_ids, members, strict=True)
                if r >= 0
            ]
            episode.machines.add(info.name)
            out.append(
                Alert(
                    job=window.job,
                    machine=info.name,
                    kind=AlertKind.HANG,
                    metric=METRIC,
                    score=LIVE_SCORE,
                    first_ts=first_ts,
                    detected_ts=float(now),
                    devices=tuple(ranks.names[i] for i in members[:MAX_LISTED]),
                    domain=info.domain,
                    evidence={
                        "source": "steps",
                        "reason": CulpritReason.STOPPED_FIRST.value,
                        "culprit_ranks": rank_ids[:MAX_LISTED],
                        "ranks": [self._rank_entry(window, i) for i in members[:MAX_LISTED]],
                        "job_alert": job_alert.id,
                        "job_last_step": _number(last_number),
                        "last_step_ts": float(last_step),
                        "stalled_s": float(stalled),
                        "group": info.group,
                    },
                )
            )
        logger.warning(
            "job %s: hung: no rank stepped for %d s (last step %s at %d; threshold %.0f s)%s",
            window.job[:64],
            stalled,
            _number(last_number),
            last_step,
            threshold,
            f"; stopped first: {', '.join(n[:64] for n in names[:8])}" if names else "",
        )
        if self._analysis is None or not self._analysis.hung:
            ordered = sorted(culprits, key=lambda c: c.rank)
            self._analysis = HangAnalysis(
                hung=True,
                culprits=tuple(ordered[:MAX_REPORTED]),
                culprits_dropped=max(0, len(ordered) - MAX_REPORTED),
                ranks_seen=0,
                ranks_expected=int(in_job.sum()),
                analysed_ts=float(now),
                notes=(f"live: {evidence['detail']}"[:512],),
            )
        return out

    def _rank_entry(self, window: JobWindow, i: int) -> dict[str, Any]:
        ranks = self._ranks
        owner = int(ranks.owner[i])
        return {
            "rank": int(ranks.rank[i]),
            "device": ranks.names[i],
            "machine": window.machines[owner].name if owner >= 0 else "",
            "last_step": _number(float(ranks.number[i])),
            "last_step_ts": float(ranks.advanced[i]),
        }

    def _end_episode(self, window: JobWindow, now: int, last_step: int) -> None:
        episode = self._episode
        assert episode is not None
        self._learn_own_pause(window, episode, last_step)
        logger.info(
            "job %s: steps advance again at %d: the hang of %.0f is over",
            window.job[:64],
            last_step,
            episode.first_ts,
        )
        self._episode = None
        # Dumps of that hang say nothing about the next one.
        self._drop_summaries()
        if self._analysis is not None and self._analysis.hung:
            self._analysis = HangAnalysis(
                hung=False,
                analysed_ts=float(now),
                notes=(f"steps advance again at {last_step}: the hang is over",),
            )

    def _learn_own_pause(self, window: JobWindow, episode: _Episode, last_step: int) -> None:
        """Keep the length of a stall that ended by itself: no rank stopped first, no restart,
        no flight-recorder culprit, with steps counted since (the live rule opened it): the
        job's own unreported pause, a checkpoint or an eval. Its length is the longest stall
        the reports could show, the same measure the threshold is compared with: from the
        activity the episode counted from (the last step, or the end of a reported pause) to a
        sampling interval before the report that showed the job stepping again."""
        live = episode.live
        if (
            not self.config.own_pause_factor
            or not live
            or live.get("stopped_first_ranks")
            or episode.recorder_culprits
            or self.stats.restarts != episode.restarts
        ):
            return
        stall = last_step - episode.first_ts - float(live.get("interval_s") or 0.0)
        if stall <= self._own_pause_s:
            return
        self._own_pause_s = stall
        logger.info(
            "job %s: a stall of %.0f s ended by itself, no rank first: later stalls with no "
            "rank first are hangs past %.0f s (report such pauses with probe.pause)",
            window.job[:64],
            stall,
            self.config.own_pause_factor * stall,
        )

    def _job_left(self, window: JobWindow, now: int) -> None:
        """No machine holding ranks is in the job any more: it ended (or scaled to zero); the
        rule is armed again by the next run's steps."""
        if self._episode is not None:
            logger.info("job %s: its machines left during a hang", window.job[:64])
            self._episode = None
        self._advances = 0
        self._own_pause_s = 0.0  # the next run learns its own
        self._top = -math.inf
        self._drop_summaries()
        if self._analysis is not None and self._analysis.hung:
            self._analysis = HangAnalysis(
                hung=False, analysed_ts=float(now), notes=("the job's machines left",)
            )

    # -- the flight recorder ----------------------------------------------------------------
    def _drop_summaries(self) -> None:
        self._summaries = {}
        self._expected = set()
        self._analysed = True

    def _take_summaries(self, window: JobWindow, now: int) -> None:
        fresh = window.take_flight_records()
        if not fresh:
            return
        self.stats.summaries += len(fresh)
        placed = self._rank_machines(window)
        for summary in fresh:
            where = placed.get(summary.rank)
            if where is not None and summary.node and summary.node != where:
                # A node speaks for its own ranks only: the step probe puts this one elsewhere.
                self._refuse(window, summary, f"the step probe places rank {summary.rank} on "
                                              f"{where[:64]}")  # fmt: skip
                continue
            old = self._summaries.get(summary.rank)
            if old is None and len(self._summaries) >= self.config.max_summaries:
                self._refuse(window, summary, f"over {self.config.max_summaries} ranks held")
                continue
            if old is None or summary.dumped_ts >= old.dumped_ts:
                self._summaries[summary.rank] = summary
                for group in summary.groups:
                    self._expected.update(expand_runs(group.ranks))
        self._summaries_at = now
        self._analysed = False

    def _refuse(self, window: JobWindow, summary: RankSummary, why: str) -> None:
        self.stats.refused_summaries += 1
        if self.stats.refused_summaries == 1 or self.stats.refused_summaries % 1000 == 0:
            logger.warning(
                "job %s: flight-recorder summary of rank %d from %s refused (%s); %d refused "
                "so far",
                window.job[:64],
                summary.rank,
                summary.node[:64],
                why,
                self.stats.refused_summaries,
            )

    def _settled(self, now: int) -> bool:
        if now - self._summaries_at >= self.config.settle_s:
            return True
        return bool(self._expected) and self._expected <= self._summaries.keys()

    def _recorder(self, window: JobWindow, now: int) -> list[Alert]:
        if self._analysed or not self._summaries or not self._settled(now):
            return []
        n = len(self._ranks)
        advanced = self._ranks.advanced[:n]
        stepped = advanced[advanced != NEVER]
        if stepped.size and self._episode is None:
            # The job reports its steps: dumps alone do not make a hang (an on-demand dump of
            # a working job nearly always catches a rank not yet in the next collective). They
            # wait for the step counters to say the job is stalled.
            if int(stepped.max()) > self._summaries_at:
                self.stats.stale_summaries += len(self._summaries)
                logger.info(
                    "job %s: %d flight-recorder summaries dropped: the job stepped on after "
                    "they came (no hang)",
                    window.job[:64],
                    len(self._summaries),
                )
                self._drop_summaries()
            return []
        self._analysed = True
        summaries = [self._summaries[r] for r in sorted(self._summaries)]
        machines = self._rank_machines(window)
        machines.update({s.rank: s.node for s in summaries if s.node})
        if self._analyze is None:
            # Imported on first use: the analysis is needed only once dumps arrive.
            from detectors.hangs import analyze  # noqa: PLC0415

            self._analyze = analyze
        analysis = self._analyze(summaries, machines, now=float(now))
        self.stats.analyses += 1
        episode = self._episode
        if not analysis.hung:
            if episode is not None and episode.live:
                # The step counters still say hung: keep that verdict, with the recorder's.
                live = self._analysis
                if live is not None and live.hung:
                    notes = (*live.notes, "flight recorder: no collective waits on a rank")
                    self._analysis = HangAnalysis(
                        hung=True,
                        culprits=live.culprits,
                        ranks_seen=analysis.ranks_seen,
                        ranks_expected=max(live.ranks_expected, analysis.ranks_expected),
                        analysed_ts=float(now),
                        notes=tuple(n[:512] for n in notes[:64]),
                    )
                    return []
            if episode is not None:
                # A hang only the flight recorder saw, and its latest dumps wait on nobody.
                self._episode = None
            self._analysis = analysis
            return []
        self._analysis = analysis
        culprits = frozenset(analysis.culprit_ranks)
        if episode is None:
            episode = self._open_recorder_episode(window, now, summaries)
        elif culprits <= episode.recorder_culprits:
            return []
        episode.recorder_culprits = episode.recorder_culprits | culprits
        evidence: dict[str, Any] = {
            "source": "flight_recorder",
            "analysis": analysis.to_dict(),
            "culprit_ranks": analysis.culprit_ranks[:MAX_LISTED],
            "culprit_machines": analysis.culprit_machines[:MAX_LISTED],
        }
        if episode.live:
            evidence["live"] = episode.live
        out = [
            Alert(
                job=window.job,
                machine="",
                kind=AlertKind.HANG,
                metric=METRIC,
                score=RECORDER_SCORE,
                first_ts=episode.first_ts,
                detected_ts=float(now),
                evidence=evidence,
            )
        ]
        by_machine: dict[str, list[Culprit]] = {}
        for culprit in analysis.culprits:
            if culprit.machine:
                by_machine.setdefault(culprit.machine, []).append(culprit)
        for name in sorted(by_machine):
            found = sorted(by_machine[name], key=lambda c: c.rank)
            named = frozenset(c.rank for c in found)
            before = episode.recorder_machines.get(name, frozenset())
            if named <= before:
                continue  # this machine's alert already names them
            episode.recorder_machines[name] = before | named
            lead = found[0]
            m = window.machine_index.get(name)
            info = window.machines[m] if m is not None else None
            episode.machines.add(name)
            out.append(
                Alert(
                    job=window.job,
                    machine=name,
                    kind=AlertKind.HANG,
                    metric=METRIC,
                    score=RECORDER_SCORE,
                    first_ts=episode.first_ts,
                    detected_ts=float(now),
                    devices=tuple(dict.fromkeys(f"rank{c.rank}" for c in found[:MAX_LISTED])),
                    domain=info.domain if info is not None else "",
                    evidence={
                        "source": "flight_recorder",
                        "culprit_ranks": sorted({c.rank for c in found})[:MAX_LISTED],
                        "reason": lead.reason.value,
                        "group": lead.group,
                        "group_desc": lead.group_desc,
                        "op": lead.op,
                        "seq": lead.seq,
                        "detail": lead.detail,
                        "culprits": [c.to_dict() for c in found[:MAX_LISTED]],
                        "job_alert": episode.job_alert_id,
                    },
                )
            )
        logger.warning(
            "job %s: flight recorder: hung, waiting on rank(s) %s (%d dump(s) analysed)",
            window.job[:64],
            ", ".join(str(r) for r in analysis.culprit_ranks[:16]) or "none named",
            len(summaries),
        )
        return out

    def _open_recorder_episode(
        self, window: JobWindow, now: int, summaries: Sequence[RankSummary]
    ) -> _Episode:
        """A hang of a job without step counters (in a job with them, dumps wait for the live
        rule, which opens the episode): it began at the first dump."""
        dumped = [s.dumped_ts for s in summaries if s.dumped_ts > 0]
        start = math.floor(min(dumped)) if dumped else now
        first_ts = float(min(max(start, window.first_sec), now))
        probe = Alert(
            job=window.job,
            machine="",
            kind=AlertKind.HANG,
            metric=METRIC,
            score=RECORDER_SCORE,
            first_ts=first_ts,
            detected_ts=float(now),
        )
        self._episode = _Episode(first_ts, NEVER, probe.id)
        return self._episode

    def _rank_machines(self, window: JobWindow) -> dict[int, str]:
        """Rank -> machine from the step probe's ``rank<N>`` devices."""
        ranks = self._ranks
        n = len(ranks)
        out: dict[int, str] = {}
        for i in np.flatnonzero((ranks.owner[:n] >= 0) & (ranks.rank[:n] >= 0)).tolist():
            out[int(ranks.rank[i])] = window.machines[int(ranks.owner[i])].name
        return out


def _number(value: float | None) -> int | None:
    if value is None or not math.isfinite(value):
        return None
    return int(value)


def _live_detail(stopped: int, how: str, last_number: float | None) -> str:
    step = f"step {_number(last_number)}" if last_number is not None else "their last step"
    if stopped and how == "behind":
        return f"{stopped} rank(s) stopped behind the others' {step}"
    if stopped:
        return f"{stopped} rank(s) stopped stepping clearly before the others"
    if how == "same_step":
        return (
            f"every rank stopped at {step}: the step counters cannot tell which stopped first "
            "(the flight recorder can)"
        )
    return "every rank stopped at about the same time: the step counters cannot tell which first"


def _stopped_detail(number: float, last_number: float | None, advanced: int) -> str:
    if math.isfinite(number) and last_number is not None and number < last_number:
        return f"last step {int(number)}, the job's {int(last_number)}"
    return f"last step at {advanced}, before the others"
