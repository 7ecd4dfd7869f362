"""The detection engine: hard-fault rules, per-metric denoising, peer scoring, incremental
continuity and learned metric priorities (Minder, NSDI'25, streamed).

Every second, per job and metric, each machine's window (``window_s`` seconds) is denoised
(:mod:`detectors.denoisers`; the window mean unless configured or trained otherwise) and compared
with its peers (its ``group``, or the whole job when the group is small) by distance to the
peers' median window on a robust scale (:mod:`detectors.scoring`), giving a signed z that one
threshold serves across job sizes. A machine that stays above the threshold long enough for its
severity (:mod:`detectors.continuity`) is alerted, naming the highest-priority metric that
confirms it (:mod:`detectors.priority`); several machines can be alerted at once. Hard faults fire
at once through :mod:`detectors.rules`, and machines of one ``domain`` that fail together are
reported as one domain alert (:mod:`detectors.episodes`).

Time follows the job's sampling interval (the window's *tick*, learnt from the data): the engine
evaluates once per tick, and window, continuity and silence are counted in samples with a floor
in seconds (:meth:`DetectorConfig.at_interval`). A metric sampled more coarsely than the tick (a
15 s scrape beside 1 s agent data) holds each sample for its interval and gets its own, longer,
window and continuity. Machines that left the job are neither scored nor peers; a machine that
(re)joined is scored once it has a full window.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from detectors.coherence import CoherenceState, PeerCoherence
from detectors.config import (
    ABOVE_WITH_WORK_BELOW,
    FAULT_BELOW_ONLY,
    METRIC_REL_FLOORS,
    SEVERE_LOSS,
    Cadence,
    DetectorConfig,
)
from detectors.continuity import ContinuityTracker, Severity
from detectors.denoisers import Denoiser, denoiser_class
from detectors.episodes import DOMAIN_FAMILIES, Episodes, merge_devices
from detectors.evidence import similarity_evidence
from detectors.findings import Finding
from detectors.halts import LOW_METRICS, HaltWatch
from detectors.priority import MetricPriority
from detectors.rules import cadence_for, evaluate_rules, job_quiet
from detectors.scoring import (
    BlockScores,
    ScoreBucket,
    ScoreLayout,
    above_idle_peers,
    gpu_activity,
    lag_tolerant_means,
    median_scores,
    pairwise_scores,
    peer_comparisons,
    score_layout,
)
from detectors.standing import StandingOffsets
from detectors.window import JobWindow, hold_forward
from minder.core.alert import Alert, AlertKind
from minder.core.errors import ModelError

if TYPE_CHECKING:
    from detectors.model import DetectorModel

logger = logging.getLogger(__name__)

LAG_SAMPLES = 1
"""Samples of phase tolerance at coarse sampling (``lag_tolerant_means``)."""
HALT_LEAD_S = 5
HALT_LEAD_SAMPLES = 3
"""A machine named for stopping before its job halted was below its peers this long first."""
WORKED_S = 120
WORKED_SAMPLES = 4
"""A job works once most of its GPUs worked this long in a row (4 samples at coarse sampling):
then its own recent past is a busy reference, and peers' idle GPUs excuse nothing."""
END_LEAD_S = 5
END_LEAD_SAMPLES = 3
"""When a job's data ends (or it goes idle), a machine apart from its peers at least this long up
to the end (3 samples at coarse sampling), with a confirmation's evidence, is named without the
continuity the end cut short (:meth:`MinderDetector._apart_at_end`)."""
END_SHORTEST_FAULT_SAMPLES = 8
"""A fail-stop fault shows for about this many samples before its job ends. Where continuity
confirms a shorter run (at 10 s and coarser: 6 evaluations), such a fault is confirmed before
the end, which adds nothing and is not read: there a run shorter still is a burst as often as a
fault."""
HALT_CONFIRM_S = 30
"""A job idle this long (3 samples at coarse sampling) halted; a shorter lull (a data-loading
phase of a step, a short checkpoint) names nobody."""
_RULE_FAMILIES = frozenset({"gpu_fatal", "nic", "pcie", "nvlink", "silence"})
SCORERS: tuple[str, ...] = ("median", "pairwise")
_COLLAPSING = frozenset({"mean", "median"})
"""Filters whose output is one value per window: scored without the time axis."""


@dataclass(frozen=True, slots=True)
class MetricDenoiser:
    """How one metric's windows are denoised: a filter in units, or a model on scaled values."""

    denoiser: Denoiser
    low: float = 0.0
    span: float = 1.0
    learned: bool = False

    @property
    def collapses(self) -> bool:
        """The output is constant along the window (one value per window)."""
        return self.denoiser.kind in _COLLAPSING

    def apply(self, windows: np.ndarray) -> np.ndarray:
        """Denoise ``(..., w)`` windows in units."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows stay NaN
            if not self.learned:
                out = self.denoiser.transform(windows)
            else:
                # Learned denoisers fill gaps themselves (fill_nearest).
                out = self.denoiser.transform((windows - self.low) / self.span)
                out = out * self.span + self.low
        return out[..., :1] if self.collapses else out


class MinderDetector:
    """Streaming detector of one job; keep one instance per job.

    Call :meth:`evaluate` once per second of data, in increasing order; it returns the alerts
    that fired at that second (each fault once per episode).

    Parameters
    ----------
    config
        Thresholds, windows and durations.
    model
        Trained per-metric denoisers and metric priorities (``minder train``); without one,
        every metric uses ``config.denoiser`` and the paper's priority order.
    scorer
        ``median`` (O(N) distance to the peers' median window) or ``pairwise`` (the paper's
        O(N^2) sum of distances, for reference).
    denoise
        False scores the raw window (ablation).
    prioritise
        False names the strongest metric and trusts every metric alike (ablation).
    """

    def __init__(
        self,
        config: DetectorConfig | None = None,
        *,
        model: DetectorModel | None = None,
        scorer: str = "median",
        denoise: bool = True,
        prioritise: bool = True,
    ) -> None:
        cfg = config or DetectorConfig()
        if scorer not in SCORERS:
            raise ValueError(f"unknown scorer {scorer!r}: expected one of {', '.join(SCORERS)}")
        if model is not None and model.window != cfg.window_s:
            cfg = replace(cfg, window_s=model.window)
        self.config = cfg
        self.model = model
        self.scorer = scorer
        self.denoise = denoise
        self.prioritise = prioritise
        default_kind = "raw" if not denoise else cfg.denoiser
        default_cls = denoiser_class(default_kind)
        if default_cls.needs_fit:
            raise ModelError(
                f"denoiser {default_kind!r} must be trained: run 'minder train' and pass the "
                "model directory, or pick one of the filters (mean, median, ewma)"
            )
        self._default = MetricDenoiser(default_cls(window=cfg.window_s))
        self._denoisers: dict[str, MetricDenoiser] = {}
        trained = model.priority if model is not None else None
        self.priority = trained if trained is not None else MetricPriority.default()
        self.episodes = Episodes(cfg)
        self.cadence: Cadence = cfg.at_interval(1.0)
        """Durations at the job's tick."""
        self.continuity = self._tracker(self.cadence)
        self._cadence_key: tuple[int, int] | None = None
        self._metric_every: dict[str, int] = {}
        self._last_tick: int | None = None
        self._quiet = False
        self._last_scored: int | None = None
        self._skipped_logged = False
        self._layout_cache: ScoreLayout | None = None
        self._too_few: tuple[int, int] | None = None
        self.coherence = self._coherence(self.cadence)
        self.halts = self._halt_watch(self.cadence)
        self.standing = self._standing(self.cadence)
        self._halt_pending: list[Finding] = []
        """Chosen as the job went idle, named once it stayed idle (:meth:`_apart_at_halt`)."""
        self._last_blocks: dict[str, tuple[ScoreBucket, BlockScores, int, int]] = {}
        """Per metric, where its last scores are (bucket, result, index in the bucket) and the
        run the mildest level needs to confirm."""
        self._run_sides: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """Per metric, each machine's side of its peers (+1 above, -1 below) and the device
        behind its top score at its latest evaluation above the threshold."""
        self.last_scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """Per metric: (top |z| per machine, index of the device behind it) at the last second."""

    # -- public -----------------------------------------------------------------------------
    @property
    def horizon_s(self) -> int:
        """Seconds of history the job window must keep."""
        return self.config.horizon_s

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        """Per metric, the latest top |z| of each machine and the device index behind it."""
        return {m: (top.tolist(), dev.tolist()) for m, (top, dev) in self.last_scores.items()}

    def _tracker(self, cadence: Cadence) -> ContinuityTracker:
        """Runs of both severities; at coarse sampling one evaluation longer, since the phase
        tolerance (:func:`detectors.scoring.lag_tolerant_means`) reads one more sample, so one
        short event stays in a machine's means one evaluation longer."""
        severe_z = self.config.severe_level[0]
        lag = LAG_SAMPLES if cadence.interval_s > 1 else 0
        return ContinuityTracker(
            [
                Severity(self.config.threshold, cadence.continuity + lag),
                Severity(severe_z, cadence.severe_continuity + lag),
            ],
            memory=cadence.window + 2,  # the halt watch's: a run may end that long before a halt
        )

    def _standing(self, cadence: Cadence) -> StandingOffsets:
        """Offsets, apart at half the threshold (a machine that sits near the threshold from its
        start would cross it on noise)."""
        return StandingOffsets(
            self.config.threshold / 2, self.config.severe_level[0], _birth_ticks(cadence)
        )

    def _coherence(self, cadence: Cadence) -> PeerCoherence:
        cfg = self.config
        ticks = max(
            math.ceil(cfg.coherence_horizon_s / cadence.interval_s), cfg.coherence_horizon_samples
        )
        # Machines failing together become outliers within an evaluation or two of each other;
        # an event does not chain on (a rotating fleet's onsets come every few evaluations).
        return PeerCoherence(cfg.coherence_share, cfg.coherence_min_outliers, ticks, 2)

    def _halt_watch(self, cadence: Cadence) -> HaltWatch:
        """A machine must have stopped 5 s (3 samples at coarse sampling) before its peers: its
        window mean is apart from theirs for that long plus the window less one evaluation (the
        peers' means take a window to follow it), and that run may end up to a window (plus two
        ticks) before they read idle."""
        lead = max(math.ceil(HALT_LEAD_S / cadence.interval_s - 1e-9), HALT_LEAD_SAMPLES)
        confirm = max(math.ceil(HALT_CONFIRM_S / cadence.interval_s - 1e-9), HALT_LEAD_SAMPLES)
        worked = max(math.ceil(WORKED_S / cadence.interval_s - 1e-9), WORKED_SAMPLES)
        return HaltWatch(lead + cadence.window - 1, cadence.window + 2, confirm, worked)

    def _follow_cadence(self, window: JobWindow) -> None:
        """Take up the window's tick and series intervals when they change."""
        key = (window.tick_s, window.cadence_version)
        if key == self._cadence_key:
            return
        tick_changed = self._cadence_key is None or self._cadence_key[0] != window.tick_s
        self._cadence_key = key
        self.cadence = cadence_for(self.config, float(window.tick_s))
        self.episodes.cadence = self.cadence
        self._metric_every = {}
        for i, (metric, _) in enumerate(window.series):
            every = int(window.series_every[i])
            self._metric_every[metric] = max(self._metric_every.get(metric, 1), every)
        longest = max([self._metric_window(m) for m in self._metric_every] + [self.cadence.window])
        window.ensure_slots(2 * longest)
        if tick_changed:
            self.continuity = self._tracker(self.cadence)
            self.coherence = self._coherence(self.cadence)
            self.halts = self._halt_watch(self.cadence)
            self.standing.rebase(_birth_ticks(self.cadence))
            self._last_tick = self._last_scored = None

    def _metric_window(self, metric: str) -> int:
        """Ticks in ``metric``'s window: its own interval's window, held over its ticks."""
        every = self._metric_every.get(metric, 1)
        if every == 1:
            return self.cadence.window
        return every * cadence_for(self.config, every * self.cadence.interval_s).window

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        """Run rules and peer scoring at second ``now``; return the alerts that fire.

        The engine evaluates each tick once, at the first call at or after its last second;
        until the window knows the job's sampling interval nothing is evaluated.
        """
        if not window.cadence_known:
            return []
        self._follow_cadence(window)
        due = (now + 1) // window.tick_s - 1
        if self._last_tick is not None and due <= self._last_tick:
            return []
        self._last_tick = due
        now = window.tick_end(due)
        cfg = self.config
        quiet = job_quiet(window, now)
        stopped = quiet and not self._quiet
        if stopped:
            window.note("quiet", float(now), "most of the job's machines stopped reporting")
        self._quiet = quiet
        in_job = int(window.active().sum())
        with_peers = in_job >= cfg.min_machines
        if not with_peers and in_job > 0:
            if self._too_few is None:
                self._too_few = (in_job, now)
        elif with_peers:
            self._too_few = None
        if not with_peers and not self._skipped_logged:
            logger.info(
                "job %s has %d machine(s): fewer than %d, so no peers to compare; only the "
                "hard-fault rules that need no peers run",
                window.job,
                window.n_machines,
                cfg.min_machines,
            )
            self._skipped_logged = True
        episodes = self.episodes
        fired: list[Finding] = []
        for finding in merge_devices(evaluate_rules(window, now, cfg, with_peers=with_peers)):
            if not episodes.touch((finding.machine, finding.family), now):
                continue
            if finding.family in DOMAIN_FAMILIES:
                episodes.hold(finding, now)
            else:
                fired.append(finding)
        fired += episodes.settle(window, now)
        busy = episodes.machines_in(_RULE_FAMILIES)
        scored = self._choose(self._score(window, now)) if with_peers else []
        if stopped and with_peers:
            # Most machines stopped reporting: the job ended. Who stood apart up to its end? (A
            # machine scored already keeps that finding: its episode takes the first.)
            scored += self._apart_at_end(window, window.tick_of(now))
        fired += self._fire(window, now, scored, busy)
        episodes.expire(now)
        return [self._to_alert(window, f, now) for f in merge_devices(fired)]

    def finish(self, window: JobWindow, now: int) -> list[Alert]:
        """The job's data ended at second ``now``, the last one evaluated (the end of an offline
        table; a job whose machines all stopped reporting): alerts for the machines that stood
        apart from their peers up to the end (:meth:`_apart_at_end`), and for those chosen as
        the job went idle if it ended before it stayed idle long enough to name them."""
        last = self._last_scored
        if last is None or window.tick_of(now) - last > 1:
            return []  # nothing scored at the end (too few machines left): no evidence of it
        found = self._apart_at_end(window, last)
        if self._halt_pending and self.halts.idle_for > 0:
            chosen = {f.machine for f in found}
            found += [f for f in self._halt_pending if f.machine not in chosen]
        self._halt_pending = []
        fired = self._fire(window, now, found, self.episodes.machines_in(_RULE_FAMILIES))
        return [self._to_alert(window, f, now) for f in merge_devices(fired)]

    def _fire(
        self, window: JobWindow, now: int, findings: list[Finding], busy: set[int]
    ) -> list[Finding]:
        """The similarity findings that start an episode, with their evidence. One fault, one
        alert: a machine a rule already named (in ``busy``) is not named again."""
        fired = []
        for finding in findings:
            new = self.episodes.touch((finding.machine, finding.family), now)
            if new and finding.machine not in busy:
                self._add_evidence(window, now, finding)
                fired.append(finding)
        return fired

    def _apart_at_end(
        self, window: JobWindow, at: int, within: int = 0, how: str = "apart_at_end"
    ) -> list[Finding]:
        """Machines apart from their peers for :data:`END_LEAD_S` up to tick ``at`` (the last
        one the continuity tracker took) with the evidence a confirmation needs, on a metric
        still peer-comparable: what a job killed by its fault leaves (docs/detection-method.md
        §10, "A job whose data ends").

        A fail-stop fault often ends the job within seconds: the process dies, the other ranks'
        collectives fail, the launcher tears the job down, and its data ends 8 or so samples
        after the onset, before the run a similarity alert needs. A machine is then named when
        its run's sum of |z| reaches what the mildest level's confirmation holds at least
        (the threshold times its run length): a process at zero is 40 thresholds apart within
        seconds, a throttled clock gathers it over a longer run. At most the coherence
        allowance of machines is named; more apart at once is no one culprit.

        ``within``: a run whose last evaluation above the threshold was at most this many
        evaluations before ``at`` counts too (a job that went idle: the peers' means have
        followed the machine by the time they read idle); ``how`` is the evidence key that
        says which end it was.
        """
        if not self._last_blocks:
            return []
        # A job killed by its fault: its other ranks worked (or spun in the collective that
        # waits) up to its end, for WORKED_S in a row. A fleet that never worked as one (a
        # serving fleet, its busy machines rotating) has no such end to read.
        if self.halts.last_working != at:
            return []
        n = window.n_machines
        scored = self._scored[:n]
        lead = max(math.ceil(END_LEAD_S / self.cadence.interval_s - 1e-9), END_LEAD_SAMPLES)
        found: list[Finding] = []
        for metric, (bucket, result, j, mild) in self._last_blocks.items():
            # What a fault that ends its job leaves is a machine doing less than its peers (a
            # dead process, a link down, a throttled clock): work metrics only. A surge (pause
            # frames, CPU) at the end is a burst that continuity would have seen pass.
            if not bucket.below_only[j] or mild < END_SHORTEST_FAULT_SAMPLES:
                continue
            if not self.coherence.comparable(metric):
                continue
            factor = self._threshold_factor(metric)
            run, peak, total, ago = self.continuity.runs(metric, n, within)
            side, device_idx = self._run_sides[metric]
            if how == "apart_at_end":  # the data ended: its last window was cut short
                total = total + self._unseen_evidence(result.z[:n, j, :], device_idx[:n], ago)
            enough = total >= self.config.threshold * factor * mild
            for m in np.flatnonzero(scored & (run >= lead) & enough).tolist():
                col = int(bucket.columns[j, device_idx[m]])
                device = window.series[col][1]
                end = at - int(ago[m])
                found.append(
                    Finding(
                        machine=m,
                        kind=AlertKind.SIMILARITY,
                        family="similarity",
                        metric=metric,
                        score=float(peak[m]),
                        first_sec=int((end - int(run[m]) + 1) * window.tick_s),
                        devices=(device,) if device else (),
                        evidence={
                            "col": col,
                            "z": round(float(side[m]) * float(peak[m]), 3),
                            "peer_median": float(result.medians[m, j]),
                            "scale": float(result.scales[m, j]),
                            "threshold": self.config.threshold * factor,
                            how: True,
                            "lead_s": int(run[m]) * window.tick_s,
                        },
                    )
                )
        chosen = self._choose(found)
        if len(chosen) > self.coherence.allowance(int(scored.sum())):
            return []
        return chosen

    def _unseen_evidence(self, z: np.ndarray, device: np.ndarray, ago: np.ndarray) -> np.ndarray:
        """What the samples of the last window would still add to a run's sum of |z| that goes
        on up to the end (``ago`` 0), had the data gone on.

        Each evaluation judges a window mean, so a sample counts in as many evaluations as
        windows take it: ``window`` times over a long run, once per evaluation so far for the
        last window's samples. For a steady deviation what they lack is the last window's |z|
        times ``(window - 1) / 2``; for one still growing into its window, a little less than
        that (at 5 s, a window of three samples: the last |z|).
        """
        extra = np.zeros(z.shape[0])
        width = self.cadence.window
        if width <= 1 or z.size == 0 or device.shape[0] < z.shape[0]:
            return extra
        last = np.abs(np.nan_to_num(np.take_along_axis(z, device[:, None], axis=1)[:, 0]))
        return np.where(ago == 0, last * (width - 1) / 2.0, extra)

    # -- denoising --------------------------------------------------------------------------
    def denoiser_for(self, metric: str) -> MetricDenoiser:
        """The denoiser of ``metric``: the model's where it has one, else the default filter."""
        found = self._denoisers.get(metric)
        if found is None:
            found = self._default
            if self.denoise and self.model is not None and metric in self.model.denoisers:
                scaler, denoiser = self.model.denoisers[metric]
                found = MetricDenoiser(denoiser, scaler.low, scaler.span, learned=True)
            self._denoisers[metric] = found
        return found

    # -- peer scoring -----------------------------------------------------------------------
    def _layout(self, window: JobWindow) -> ScoreLayout:
        if self._layout_cache is None or self._layout_cache.n_series != window.n_series:
            self._layout_cache = score_layout(window)
        return self._layout_cache

    def _score(self, window: JobWindow, now: int) -> list[Finding]:
        cfg = self.config
        n = window.n_machines
        layout = self._layout(window)
        findings: list[Finding] = []
        scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if not layout.buckets:
            self.last_scores = {}
            return findings
        tick = window.tick_of(now)
        if self._last_scored is not None and tick - self._last_scored != 1:
            # The replay jumped a gap (or time went back): runs are not continuous any more.
            self.continuity.reset()
            self.coherence.reset()
            self.halts = self._halt_watch(self.cadence)
        self._last_scored = tick
        active = window.active()
        comparisons = [(t, m) for t, m in peer_comparisons(window, cfg.min_group, active) if m.size]
        length = max(self._metric_window(m) for b in layout.buckets for m in b.metrics)
        all_means = all(
            self.denoiser_for(m).denoiser.kind == "mean" for b in layout.buckets for m in b.metrics
        )
        # Coarse sampling, one cadence: window means judged instant by instant with one
        # sample of phase tolerance (one more sample back for the lag).
        lagged = all_means and window.tick_s > 1 and length == self.cadence.window
        raw_values = window.window(now, length + int(lagged), layout.all_cols)
        if length > self.cadence.window:
            raw_values = self._hold_coarse(window, layout.all_cols, raw_values)
        values = _impute_missing(raw_values, comparisons)
        # Scored: part of the job, and in it for a full window (and the lag sample before it:
        # a sample from before the machine joined is imputed from its peers, and would let the
        # lag tolerance read it as one of them).
        full = (tick - (window.joined_sec[:n] // window.tick_s) + 1) >= (
            self.cadence.window + int(lagged)
        )
        self._scored = active & full
        own_means = None
        if lagged:
            means, own_means = lag_tolerant_means(values, comparisons)
        elif all_means:
            # The default: one nan-mean over the whole window instead of one per metric.
            counts = np.count_nonzero(np.isfinite(values), axis=0)
            # nansum's sum, without its copy of the window (NaN -> 0): the NaNs are skipped.
            sums = np.sum(values, axis=0, where=~np.isnan(values))
            with np.errstate(invalid="ignore", divide="ignore"):
                means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        score = median_scores if self.scorer == "median" else pairwise_scores
        results: list[tuple[ScoreBucket, BlockScores]] = []
        raw_tops: list[np.ndarray] = []
        self.standing.born(self._scored, tick)
        offset = 0
        for bucket in layout.buckets:
            k, width = bucket.columns.shape
            cols = slice(offset, offset + k * width)
            offset += k * width
            if all_means:
                block = means[:, cols].reshape(n, k, width, 1)
            else:
                # Trained denoisers take windows of the job's own length.
                tail = values[-self.cadence.window :, :, cols]
                raw = tail.reshape(-1, n, k, width).transpose(1, 2, 3, 0)
                parts = [
                    self.denoiser_for(m).apply(raw[:, j]) for j, m in enumerate(bucket.metrics)
                ]
                length = max(p.shape[-1] for p in parts)
                block = np.stack([np.broadcast_to(p, (n, width, length)) for p in parts], axis=1)
            rel_floor = np.maximum(cfg.rel_floor, bucket.rel_floors)
            if own_means is not None and self.scorer == "median":
                own = own_means[:, cols].reshape(n, k, width, 1)
                result = median_scores(block, comparisons, rel_floor, bucket.floors, own)
            else:
                result = score(block, comparisons, rel_floor, bucket.floors)
            result.z[~self._scored] = np.nan
            # Coherence counts who was apart as measured; standing offsets only excuse.
            raw_tops.append(_top(result.z)[0])
            for j, metric in enumerate(bucket.metrics):
                self.standing.apply(
                    metric,
                    result.z[:, j, :],
                    self._scored,
                    tick,
                    work=bool(bucket.below_only[j]),
                )
            results.append((bucket, result))
        idle, busy = gpu_activity(results, n)
        findings += self._halt_culprits(window, now, results, idle, busy)
        findings += self._apart_at_halt(window)
        # A job that was working within the coherence horizon has a busy reference, its own
        # recent past: a machine still busy after the others halted is a suspect there (a hung
        # kernel), so its peers' idle GPUs excuse nothing. A fleet that never worked as one
        # (a serving fleet) keeps the excuse.
        self._uncorroborated_above(results, n)
        last = self.halts.last_working
        worked = last is not None and tick - last <= self.coherence.horizon_ticks
        for (bucket, result), raw_top in zip(results, raw_tops, strict=True):
            findings += self._confirm(
                window, now, bucket, result, raw_top, scores, None if worked else idle, idle
            )
        self.last_scores = scores
        return findings

    def _halt_culprits(
        self,
        window: JobWindow,
        now: int,
        results: list[tuple[ScoreBucket, BlockScores]],
        idle: np.ndarray,
        busy: np.ndarray,
    ) -> list[Finding]:
        """Machines apart from their peers shortly before the whole job went idle
        (:mod:`detectors.halts`): named at the halt, without waiting for continuity."""
        cfg = self.config
        low: list[tuple[str, np.ndarray, np.ndarray, float]] = []
        where: dict[str, tuple[ScoreBucket, BlockScores, int]] = {}
        for bucket, result in results:
            for j, metric in enumerate(bucket.metrics):
                if metric in LOW_METRICS:
                    z = result.z[:, j, :]
                    device = np.where(np.isfinite(z), np.abs(z), -1.0).argmax(axis=1)
                    top = np.take_along_axis(z, device[:, None], axis=1)[:, 0]
                    low.append((metric, top, device, self._threshold_factor(metric)))
                    where[metric] = (bucket, result, j)
        allowance = self.coherence.allowance(int(self._scored.sum()))
        culprits = self.halts.update(
            window.tick_of(now),
            low,
            cfg.threshold,
            self._scored,
            idle,
            allowance,
            busy,
        )
        out = []
        for c in culprits:
            if not self.coherence.comparable(c.metric):
                continue
            bucket, result, j = where[c.metric]
            col = int(bucket.columns[j, c.device])
            device = window.series[col][1]
            out.append(
                Finding(
                    machine=c.machine,
                    kind=AlertKind.SIMILARITY,
                    family="similarity",
                    metric=c.metric,
                    score=abs(c.z),
                    first_sec=int(
                        (c.end_tick - c.run + 1 - self.cadence.window // 2) * window.tick_s
                    ),
                    devices=(device,) if device else (),
                    evidence={
                        "col": col,
                        "z": round(c.z, 3),
                        "peer_median": float(result.medians[c.machine, j]),
                        "scale": float(result.scales[c.machine, j]),
                        "threshold": cfg.threshold,
                        "stopped_before_halt": True,
                        "lead_s": c.run * window.tick_s,
                    },
                )
            )
        return out

    def _uncorroborated_above(self, results: list[tuple[ScoreBucket, BlockScores]], n: int) -> None:
        """Zero the scores above the peers on :data:`detectors.config.ABOVE_WITH_WORK_BELOW`
        metrics of the machines that are not below their peers on a work metric now."""
        if not any(m in ABOVE_WITH_WORK_BELOW for b, _ in results for m in b.metrics):
            return
        behind = np.zeros(n, dtype=bool)
        for bucket, result in results:
            for j, metric in enumerate(bucket.metrics):
                if bucket.below_only[j]:
                    limit = -self.config.threshold * self._threshold_factor(metric)
                    behind |= (np.nan_to_num(result.z[:, j, :], nan=0.0) <= limit).any(axis=1)
        for bucket, result in results:
            for j, metric in enumerate(bucket.metrics):
                if metric in ABOVE_WITH_WORK_BELOW:
                    z = result.z[:, j, :]
                    result.z[:, j, :] = np.where((z > 0) & ~behind[:, None], 0.0, z)

    def _apart_at_halt(self, window: JobWindow) -> list[Finding]:
        """A job that went idle: the machines whose run up to the halt (or ending at most the
        halt watch's memory before it) held a confirmation's evidence (:meth:`_apart_at_end`)
        are chosen as it goes idle and named once it stayed idle, as the halt watch names the
        machines that stopped first on GPU activity (a fault on any metric that halted the job
        before continuity could confirm it: an NVLink at a tenth of its peers' traffic)."""
        halts = self.halts
        if halts.just_halted and self._last_scored is not None:
            # The tracker has taken the evaluations before this one; the halt watch's memory
            # counts from this one.
            at = self._last_scored - 1
            self._halt_pending = self._apart_at_end(
                window, at, halts.memory - 1, "stopped_before_halt"
            )
        elif halts.idle_for == 0:
            self._halt_pending = []
        if self._halt_pending and halts.idle_for >= halts.confirm:
            out, self._halt_pending = self._halt_pending, []
            return out
        return []

    def _hold_coarse(self, window: JobWindow, cols: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Mixed cadences: each coarse series' sample stands for its whole interval (held
        forward up to ``every - 1`` ticks), and each series keeps only its own window's ticks."""
        length = values.shape[0]
        every = window.series_every[cols]
        out = values.copy()
        for step in np.unique(every[every > 1]).tolist():
            sel = np.flatnonzero(every == step)
            out[:, :, sel] = hold_forward(out[:, :, sel], step)
        spans = np.asarray(
            [self._metric_window(window.series[c][0]) for c in cols.tolist()], dtype=np.int64
        )
        old = np.arange(length)[:, None] < (length - spans)[None, :]  # time, column
        out[np.broadcast_to(old[:, None, :], out.shape)] = np.nan
        return out

    def _confirm(
        self,
        window: JobWindow,
        now: int,
        bucket: ScoreBucket,
        result: BlockScores,
        raw_top: np.ndarray,
        scores: dict[str, tuple[np.ndarray, np.ndarray]],
        idle: np.ndarray | None,
        peers_idle: np.ndarray,
    ) -> list[Finding]:
        """Advance continuity for a block's metrics; findings for the confirmed machines.

        Every outlier counts towards the metric's peer coherence; a machine above idle peers
        (:func:`detectors.scoring.above_idle_peers`) is not alerted, nor one above working
        peers on a work metric (:data:`detectors.config.FAULT_BELOW_ONLY`), and a metric that is
        not peer-comparable in this job (:mod:`detectors.coherence`) raises no finding.
        """
        cfg = self.config
        metrics, columns = bucket.metrics, bucket.columns
        result.z[above_idle_peers(result, bucket, idle)] = 0.0
        if bucket.below_only.any():
            # Doing more work than the peers is no fault on these metrics; above peers whose GPUs
            # sit idle after the job worked it is (a hung kernel), and above idle peers of a job
            # that never worked ``above_idle_peers`` has already excused it.
            part = result.z[:, bucket.below_only, :]
            above = (part > 0) & ~peers_idle[:, None, None]
            result.z[:, bucket.below_only, :] = np.where(above, 0.0, part)
        top, device_idx = _top(result.z)
        tick = window.tick_of(now)
        findings = []
        for j, metric in enumerate(metrics):
            scores[metric] = (np.nan_to_num(top[:, j], nan=0.0), device_idx[:, j])
            factor = self._threshold_factor(metric)
            changed = self.coherence.update(
                metric, raw_top[:, j], cfg.threshold * factor, self._scored, tick, now
            )
            if changed is not None:
                self._coherence_changed(window, changed)
            every = self._metric_every.get(metric, 1)
            lengths = None
            if every > 1:
                own = cadence_for(cfg, every * self.cadence.interval_s)
                lengths = (every * own.continuity, every * own.severe_continuity)
            confirmed = self.continuity.update(
                metric, top[:, j], self._level_factors(metric, factor), lengths
            )
            mild = self.continuity.severities[0].seconds if lengths is None else lengths[0]
            self._last_blocks[metric] = (bucket, result, j, mild)
            self._note_sides(metric, result.z[:, j, :], top[:, j], device_idx[:, j], factor)
            if not self.coherence.comparable(metric):
                continue
            for m, run, peak in zip(
                confirmed.machines.tolist(),
                confirmed.run_s.tolist(),
                confirmed.peak.tolist(),
                strict=True,
            ):
                col = int(columns[j, device_idx[m, j]])
                device = window.series[col][1]
                signed = float(result.z[m, j, device_idx[m, j]])
                findings.append(
                    Finding(
                        machine=int(m),
                        kind=AlertKind.SIMILARITY,
                        family="similarity",
                        metric=metric,
                        score=float(peak),
                        first_sec=int(
                            (window.tick_of(now) - run + 1 - self.cadence.window // 2)
                            * window.tick_s
                        ),
                        devices=(device,) if device else (),
                        # Evidence is built only for findings that fire (see evaluate).
                        evidence={
                            "col": col,
                            "z": round(signed, 3),
                            "peer_median": float(result.medians[m, j]),
                            "scale": float(result.scales[m, j]),
                            "threshold": cfg.threshold * factor,
                            "standing_offset": round(
                                self.standing.offset(metric, m, int(device_idx[m, j])), 3
                            ),
                        },
                    )
                )
        return findings

    def _note_sides(
        self, metric: str, z: np.ndarray, top: np.ndarray, device: np.ndarray, factor: float
    ) -> None:
        """Keep, for the machines above the threshold on ``metric`` now, their side of the peers
        and their top device: a finished run is reported as it was (:meth:`_apart_at_end`)."""
        n = z.shape[0]
        side, where = self._run_sides.get(metric, (np.ones(0), np.zeros(0, dtype=np.int64)))
        if side.shape[0] < n:
            side = np.concatenate([side, np.ones(n - side.shape[0])])
            where = np.concatenate([where, np.zeros(n - where.shape[0], dtype=np.int64)])
        now_apart = np.nan_to_num(top, nan=0.0) > self.config.threshold * factor
        signed = np.take_along_axis(z, device[:, None], axis=1)[:, 0]
        side[:n] = np.where(now_apart, np.where(signed < 0, -1.0, 1.0), side[:n])
        where[:n] = np.where(now_apart, device, where[:n])
        self._run_sides[metric] = (side, where)

    def _coherence_changed(self, window: JobWindow, state: CoherenceState) -> None:
        """Say once, in the log, that a metric stopped (or started again) being comparable."""
        if state.comparable:
            logger.info(
                "job %s: %s is peer-comparable again (coherence %.2f, %d outlier events)",
                window.job[:64],
                state.metric,
                state.coherence,
                state.outliers,
            )
        else:
            logger.info(
                "job %s: machines are not alike on %s (coherence %.2f: %d outlier events among "
                "%d machines, more than the %d faults could explain, or too many apart at "
                "once); no similarity alerts on it while this holds",
                window.job[:64],
                state.metric,
                state.coherence,
                state.outliers,
                state.machines,
                state.allowance,
            )

    def job_findings(self) -> list[dict[str, Any]]:
        """What the engine found about the job as a whole, not about one machine: metrics on
        which its machines are not peers (``not_peer_comparable``, with the measured
        coherence), and a job too small to have peers (``too_few_machines``)."""
        out: list[dict[str, Any]] = []
        if self._too_few is not None:
            out.append(
                {
                    "finding": "too_few_machines",
                    "metric": None,
                    "machines": self._too_few[0],
                    "since_ts": float(self._too_few[1]),
                    "detail": f"fewer than {self.config.min_machines} machines: no peers to "
                    "compare, only the hard-fault rules run",
                }
            )
        horizon_s = round(self.coherence.horizon_ticks * self.cadence.interval_s)
        for state in self.coherence.states():
            if state.comparable:
                continue
            out.append(
                {
                    "finding": "not_peer_comparable",
                    "metric": state.metric,
                    "coherence": state.coherence,
                    "outliers": state.outliers,
                    "allowance": state.allowance,
                    "machines": state.machines,
                    "since_ts": float(state.since_sec),
                    "detail": f"{state.outliers} distinct outlier events on "
                    f"{state.metric} within {horizon_s} s (at most "
                    f"{state.allowance} for peers), or over a quarter of the machines apart at "
                    "once: no similarity alerts on it",
                }
            )
        return out

    def _level_factors(self, metric: str, factor: float) -> float | np.ndarray:
        """What multiplies the continuity levels of ``metric``: ``factor``, and for the severe
        level of a work metric with a relative floor no more than puts a machine that lost
        :data:`~detectors.config.SEVERE_LOSS` of its peers' level at it (the floor's z never
        reaches 4 x the threshold otherwise)."""
        rel = METRIC_REL_FLOORS.get(metric, 0.0)
        if rel <= self.config.rel_floor or metric not in FAULT_BELOW_ONLY:
            return factor
        severe = self.config.severe_level[0] * factor
        reachable = SEVERE_LOSS / rel
        return np.array([factor, factor * min(1.0, reachable / severe)])

    def _threshold_factor(self, metric: str) -> float:
        if not self.prioritise or self.priority.trusts(metric):
            return 1.0
        return self.config.untrusted_factor

    def _choose(self, findings: list[Finding]) -> list[Finding]:
        """One similarity finding per machine: the first metric in priority order that
        confirms it (checking stops there), or the strongest without prioritisation."""
        best: dict[int, Finding] = {}
        for finding in findings:
            current = best.get(finding.machine)
            if current is None or self._before(finding, current):
                best[finding.machine] = finding
        return list(best.values())

    def _before(self, a: Finding, b: Finding) -> bool:
        if self.prioritise:
            rank_a, rank_b = self.priority.rank(a.metric), self.priority.rank(b.metric)
            if rank_a != rank_b:
                return rank_a < rank_b
        return a.score > b.score

    # -- alerts -----------------------------------------------------------------------------
    def _add_evidence(self, window: JobWindow, now: int, finding: Finding) -> None:
        cfg = self.config
        detail = finding.evidence
        peers = next(
            (
                members
                for targets, members in peer_comparisons(window, cfg.min_group, window.active())
                if finding.machine in targets
            ),
            np.arange(window.n_machines),
        )
        evidence = similarity_evidence(
            window, now, int(detail["col"]), finding.machine, peers, self.cadence
        )
        lag = LAG_SAMPLES if self.cadence.interval_s > 1 else 0
        evidence.update(
            {
                "method": f"peer_{self.scorer}",
                "denoiser": self.denoiser_for(finding.metric).denoiser.kind,
                "metric": finding.metric,
                "z": detail["z"],
                "direction": "above" if detail["z"] > 0 else "below",
                "threshold": detail["threshold"],
                "continuity_s": (self.cadence.continuity + lag) * window.tick_s,
                "severe_continuity_s": (self.cadence.severe_continuity + lag) * window.tick_s,
                "peer_median": detail["peer_median"],
                "scale": detail["scale"],
                # z is beyond this: where the machine stood apart from its first evaluations
                "standing_offset": detail.get("standing_offset", 0.0),
                "priority_rank": self.priority.rank(finding.metric) if self.prioritise else None,
                "other_metrics": sorted(
                    metric
                    for metric, (top, _) in self.last_scores.items()
                    if metric != finding.metric and top[finding.machine] > cfg.threshold
                ),
            }
        )
        for key in ("stopped_before_halt", "apart_at_end", "lead_s"):
            if key in detail:
                evidence[key] = detail[key]
        finding.evidence = evidence

    def _to_alert(self, window: JobWindow, finding: Finding, now: int) -> Alert:
        members = finding.evidence.get("domain_members")
        if members:
            machine = finding.evidence["domain"]
            domain = machine
        else:
            info = window.machines[finding.machine]
            machine, domain = info.name, info.domain
        evidence = dict(finding.evidence)
        evidence.setdefault("group", "" if members else window.machines[finding.machine].group)
        return Alert(
            job=window.job,
            machine=machine,
            kind=finding.kind,
            metric=finding.metric,
            score=finding.score,
            # Never before the job's first data (an event with a broken clock, a window that
            # reaches back further than the job).
            first_ts=float(max(finding.first_sec, window.first_sec)),
            detected_ts=float(now),
            devices=finding.devices,
            domain=domain,
            evidence=evidence,
        )


def _birth_ticks(cadence: Cadence) -> int:
    """A machine's first run: the mild continuity run, so that a machine apart from its first
    evaluation is never confirmed before its standing offset is known."""
    return cadence.continuity + (LAG_SAMPLES if cadence.interval_s > 1 else 0)


def _top(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per ``(machine, metric)`` of ``z[machine, metric, device]``: the largest |z| (NaN where
    nothing is scored) and the device index behind it."""
    absz = np.where(np.isfinite(z), np.abs(z), -1.0)
    device_idx = absz.argmax(axis=2)
    top = np.take_along_axis(absz, device_idx[..., None], axis=2)[..., 0]
    return np.where(top < 0, np.nan, top), device_idx


def _impute_missing(
    values: np.ndarray, comparisons: list[tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """Fill a machine's missing seconds with its peers' mean of that series at that second.

    Training traffic is bursty (a few seconds at 10x the rest of a step): a window mean over
    the present samples only would drop far below the peers' when the missing second was a
    burst. Filled from the machine's own peers (its group) at the same second, a missing sample
    adds no deviation, so the window is scored on what is present. A series a machine never
    sent in the window stays NaN.
    """
    present = np.isfinite(values)
    if present.all():
        return values
    live = present.any(axis=(1, 2))
    if not live.all():
        # Seconds in which nothing was reported (a window reaching back before the job's
        # first second) have no peers to fill from: only the others are imputed.
        out = values.copy()
        if live.any():
            out[live] = _impute_missing(values[live], comparisons)
        return out
    fill = ~present & present.any(axis=0)[None]  # time, machine, column
    out = values.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a second no peer reported stays NaN
        for targets, members in comparisons:
            per_second = np.nanmean(values[:, members], axis=1, keepdims=True)
            part = out[:, targets]
            out[:, targets] = np.where(fill[:, targets], per_second, part)
    return out
