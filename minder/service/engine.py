"""The detection loop: per-job windows fed from batches, one evaluation per second of data.

Time is the data's own: a job's watermark is its newest second minus the grace for late samples,
and every second up to the watermark is evaluated once, in order. Replaying a topic faster than
real time therefore gives the same alerts as the live run.

The service also keeps each job's lifecycle (docs/operations.md, "Job lifecycle"): a job is
``active`` while it has a window here, ``idle`` once its window is dropped (no data for
``idle_job_s``, or its place taken at the jobs bound), ``ended`` when its last machine said
goodbye or it stayed idle past ``idle_retention_s``. The status and the machines in the job go
to the store through the writer when they change, and every ``report_every_s`` for every job
held (so a job whose worker stopped is seen as idle after ``6 x report_every_s``); the
``minder_jobs``, ``minder_machines`` and ``minder_job_*`` series show the active jobs only, so
the API and the gauges say the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from prometheus_client import Gauge

from detectors.base import DetectorFactory, JobDetector, finish_of
from detectors.window import NEVER, JobWindow, WindowLimits
from minder.core.alert import Alert, AlertKind
from minder.core.errors import ValidationError
from minder.core.hang import HangAnalysis
from minder.core.records import EventKind, NodeBatch
from minder.service.admission import (
    CONFIRMED,
    MAX_NODES_KEPT,
    ONE_SHOT_BATCHES,
    ONE_SHOT_IDLE_S,
    SINGLE_MACHINE,
    Confirmation,
    Digest,
    JobConfirmations,
    LogDigest,
    RefusedJob,
    RefusedJobs,
    job_key,
    rank_of,
)
from minder.service.persistence import JobCapture, JobSnapshot, MachineSnapshot, StateWriter
from minder.service.telemetry import HANG_CULPRIT_SERIES, ServiceMetrics
from minder.storage.records import JobFinding, JobReport, JobStatus

__all__ = [
    "AlertSink",
    "DetectionService",
    "JobSnapshot",
    "JobState",
    "MachineSnapshot",
    "ServiceLimits",
    "StateStore",
]

logger = logging.getLogger(__name__)

JOB_STOPPED_S = 10.0
"""Wall seconds (at least three of its sampling intervals, and more than the grace) without a
batch of a job, while other jobs' batches still arrive, after which its data ended: the detector
is told once (:func:`detectors.base.finish_of`)."""
_OPEN_ALERT_QUERIES = 8
"""New jobs in one ingest call whose open alerts are read one query each; more: one query."""
_NAMING_KINDS = frozenset({AlertKind.RULE.value, AlertKind.SILENCE.value})
"""Open alerts of these kinds name a machine's fault: a similarity alert on it adds nothing."""
NOT_PEER_COMPARABLE = "not_peer_comparable"
"""The finding of a metric on which a job's machines are not peers (docs/detection-method.md)."""
_LOGGED_BY_DETECTOR = frozenset(
    {(NOT_PEER_COMPARABLE, True), (NOT_PEER_COMPARABLE, False), ("too_few_machines", True)}
)
"""``(finding, began)``: the transitions the default engine (detectors.engine) already logs at
info level, with the numbers behind them; the service logs these at debug only, and every
other beginning or end of a job-level finding at info."""
TOO_MANY_JOBS = "too_many_jobs"
_VICTIMS_EVERY_S = 1.0
"""The order in which jobs would give their place to a newcomer is rebuilt at most this often
(wall seconds): not once per refused batch of a flood."""
_CONFIRM_EVERY_S = 10.0
"""How often (wall seconds) the live jobs whose scheduler answer is missing or old are queued
for a lookup."""
_VictimKey = tuple[int, int, float]
"""``(rank, 0 when one-shot else 1, last batch wall time)``: the lowest gives its place first."""


class AlertSink(Protocol):
    """Somewhere an alert goes (Kafka topic, webhook, console)."""

    name: str

    def deliver(self, alert: Alert) -> None:
        """Send one alert; raise on failure (the service counts and logs it)."""
        ...


class StateStore(Protocol):
    """Durable state: alerts (with dedup), jobs, machines, current scores."""

    def record_alert(self, alert: Alert) -> tuple[Alert, bool]:
        """Store ``alert``; return the stored alert and whether it is a new fault."""
        ...

    def save_job(self, job: JobSnapshot) -> None:
        """Replace the stored machines and current scores of one job."""
        ...

    def open_alert_counts(self, job: str | None = None) -> dict[tuple[str, str, str], int]:
        """Alerts not yet resolved per ``(job, machine, kind)`` (of ``job``, or of every job)."""
        ...


@dataclass(frozen=True, slots=True)
class ServiceLimits:
    """Bounds on the state one detection worker keeps, against hostile or broken producers;
    each counted when hit (``minder_batches_rejected_total``, ``minder_rejected_total``)."""

    max_jobs: int = 1_000
    """Jobs per worker; a batch of a new job beyond it is refused, unless the job may take the
    place of one worth less (:mod:`minder.service.admission`)."""
    new_job_max_age_s: float = math.inf
    """A batch older than this does not start a job (a replay, a broken clock); the service's
    settings default to a day."""
    top_k_scores: int = 20
    """Machines per job exported in ``minder_machine_score`` (the highest scores)."""
    machine_series_per_job: int = 4_096
    """Machines per job exported in ``minder_machine_score_all`` (every machine up to it, the
    highest scores beyond), and ranks per job in ``minder_rank_lateness_seconds`` (the latest
    beyond it); never fewer than ``top_k_scores`` (0: only the top-k of each)."""
    window: WindowLimits = field(default_factory=WindowLimits)


@dataclass(slots=True)
class JobState:
    """A job's window, its detector and how far it has been evaluated."""

    window: JobWindow
    detector: JobDetector
    evaluated_sec: int = NEVER
    last_batch_wall: float = 0.0
    last_evaluation_wall: float = 0.0
    first_batch_wall: float = 0.0
    batches: int = 0
    """Batches placed (admission: a job of one machine with a few batches, then silent, is a
    one-shot job)."""
    rejected_exported: dict[str, int] = field(default_factory=dict)
    """The window's refusals already counted in ``minder_rejected_total``."""
    newest_ts: float = -math.inf
    findings: dict[tuple[str, str], JobFinding] = field(default_factory=dict)
    """The detector's current job-level findings, by ``(finding, metric or "")``."""
    findings_written: tuple[JobFinding, ...] | None = None
    """The set last handed to the writer (``None``: none yet on this worker)."""
    findings_written_sec: int = NEVER
    findings_refused: bool = False
    """A malformed finding of the detector was logged (once per job)."""
    hang: HangAnalysis | None = None
    """The detector's latest hang analysis of the job (None: none made on this worker)."""
    hang_refused: bool = False
    """A malformed hang analysis of the detector was logged (once per job)."""
    finished: bool = False
    """Its data ended and the detector was told (:func:`detectors.base.finish_of`): its machines
    all said goodbye or stopped reporting; a batch that arrives clears it."""
    ended: bool = False
    """Its last machine said goodbye: the job ended (its window is kept for late data until
    ``idle_job_s``; a machine that reports again makes it active)."""
    active_machines: int = 0
    """Machines in the job at the last evaluation (``minder_job_machines``)."""
    last_departure: str = ""
    """How the latest machine(s) left: ``left`` (goodbye) or ``left_together``."""
    reported: tuple[JobStatus, int] | None = None
    """The status and machine count last handed to the writer (None: none yet)."""


class DetectionService:
    """Feeds batches into per-job windows and runs detection every second of data.

    Parameters
    ----------
    factory
        Builds the detector of a new job.
    grace_s
        Seconds a second stays open for late samples before it is evaluated.
    sinks
        Where new alerts go, after ``store`` (if any) has decided they are new.
    store
        Durable state; when given, only alerts it reports as new reach the sinks.
    persist_every_s
        How often (data seconds) a job's state is captured for ``store``.
    writer
        Writes the captured state (only the machines that changed): the service stack runs
        one in a thread of its own, so no database write happens in the poll loop. ``None``
        with a ``store``: one that writes at once, in the loop (tests, tools).
    idle_job_s
        A job silent this long (wall clock) is dropped from memory.
    findings_refresh_s
        A job's findings are handed to the writer when their set changes (one begins or
        ends); when only their numbers move (coherence, outliers) at most this often (data
        seconds), so a fleet whose outliers keep rotating is not rewritten every second.
    confirmations
        The scheduler's answers about jobs (looked up in a thread of their own): a job it
        confirms may take the place of an unconfirmed one at ``limits.max_jobs``. None: no
        scheduler; jobs are ranked by the machines that report for them.
    refusal_log_every_s
        Refused and evicted jobs are named in one log line per this many seconds (wall clock)
        at most, per refusal reason.
    idle_retention_s
        An idle job (its window dropped) is ended after this long (wall clock) without data.
    report_every_s
        How often (wall clock) the status of every job held is reported to the store, and the
        stored jobs are aged; an active job without a report for ``6 x report_every_s`` is
        taken for one whose worker stopped, and becomes idle.
    """

    def __init__(
        self,
        factory: DetectorFactory,
        *,
        grace_s: float = 2.0,
        metrics: ServiceMetrics | None = None,
        sinks: Iterable[AlertSink] = (),
        store: StateStore | None = None,
        persist_every_s: int = 5,
        idle_job_s: float = 900.0,
        max_future_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        limits: ServiceLimits | None = None,
        writer: StateWriter | None = None,
        findings_refresh_s: float = 60.0,
        confirmations: JobConfirmations | None = None,
        refusal_log_every_s: float = 10.0,
        idle_retention_s: float = 3_600.0,
        report_every_s: float = 10.0,
    ) -> None:
        if not findings_refresh_s >= 0:
            raise ValueError(f"findings_refresh_s={findings_refresh_s!r}: expected seconds >= 0")
        if not (idle_retention_s >= 0 and report_every_s > 0):
            raise ValueError(
                f"idle_retention_s={idle_retention_s!r}, report_every_s={report_every_s!r}: "
                "expected seconds >= 0 and > 0"
            )
        self.idle_retention_s = float(idle_retention_s)
        self.report_every_s = float(report_every_s)
        self.stale_after_s = 6.0 * self.report_every_s
        self._lifecycle_at = -math.inf
        self.factory = factory
        self.grace_s = grace_s
        self.metrics = metrics or ServiceMetrics()
        self.sinks = list(sinks)
        self.store = store
        if writer is None and store is not None:
            writer = StateWriter(store, self.metrics, background=False)
        self.writer = writer
        self.persist_every_s = persist_every_s
        self.findings_refresh_s = findings_refresh_s
        self.idle_job_s = idle_job_s
        self.max_future_s = max_future_s
        self.clock = clock
        self.limits = limits or ServiceLimits()
        # The label values (after job_id) of the top-k series exported per job, to remove those
        # that left the top.
        self._exported_scores: dict[str, set[tuple[str, ...]]] = {}
        self._exported_coherence: dict[str, set[tuple[str, ...]]] = {}
        self._exported_culprits: dict[str, set[tuple[str, ...]]] = {}
        self.confirmations = confirmations
        self.refusal_log_every_s = refusal_log_every_s
        # New jobs refused lately (minder_refused_jobs_total counts each once) and the machines
        # that reported for them: a refused job of several machines may take a place.
        self._refused = RefusedJobs(memory_s=idle_job_s if idle_job_s > 0 else 1.0)
        self._refusal_logs: dict[str, LogDigest] = {}
        self._eviction_log = LogDigest(refusal_log_every_s, names=3)
        self._victims: deque[tuple[_VictimKey, str]] = deque()
        self._victims_at = -math.inf
        self._victims_call = -1
        self._ingest_calls = 0
        self._confirmed_at = -math.inf
        # Alerts the store could not take yet: retried every tick, so none is lost to a
        # passing database outage (the detector raises each fault once).
        self._unstored: list[Alert] = []
        self.max_unstored = 10_000
        self._future_nodes: set[tuple[str, str]] = set()
        self._detector_errors: set[tuple[str, str]] = set()
        self.jobs: dict[str, JobState] = {}
        # Alerts raised while a long ingest call was evaluated part-way (see ingest), returned
        # by the next tick.
        self._caught_up: list[Alert] = []
        self._last_batch_wall = -math.inf
        """Wall time of the newest batch placed, of any job: the stream is alive."""
        self.alerts: list[Alert] = []
        """Every new alert this service raised, oldest first (bounded by ``max_kept``)."""
        self.max_kept = 10_000
        self._last_persist: dict[str, int] = {}
        self.open_alerts_every_s = float(persist_every_s)
        self._open_alerts_at = -math.inf
        self._open_alert_series: set[tuple[str, str]] = set()
        # job -> machine -> kinds of its alerts not yet resolved: loaded from the store when a
        # worker takes a job over (restart, rebalance), kept current as alerts are raised, and
        # refreshed with the operators' resolutions, so one fault is never alerted twice.
        self._open_by_machine: dict[str, dict[str, set[str]]] = {}

    # -- ingest -----------------------------------------------------------------------------
    def ingest(self, batches: Iterable[NodeBatch]) -> int:
        """Place decoded batches in their job windows; returns how many were placed.

        Each job's batches of the call go to its window at once (:meth:`JobWindow.add_batches`:
        one ``add_arrays`` per second and layout), in the order they came.
        """
        placed = 0
        samples = 0
        self._ingest_calls += 1
        now_wall = self.clock()
        newest_ts = -math.inf
        newest_of: dict[str, float] = {}
        of_job: dict[str, list[NodeBatch]] = {}
        new_jobs: list[str] = []
        for batch in batches:
            if batch.ts > now_wall + self.max_future_s:
                # One node with a clock far ahead would drag its job's watermark forward and make
                # every other node's samples "too old": refuse it, count it, say so once.
                self.metrics.batches_rejected.labels(reason="future_timestamp").inc()
                if (batch.job, batch.node) not in self._future_nodes:
                    self._future_nodes.add((batch.job, batch.node))
                    logger.warning(
                        "job %s node %s sent ts %.0f, %.0f s ahead of this clock (more than %.0f):"
                        " refused until its clock is fixed",
                        batch.job,
                        batch.node,
                        batch.ts,
                        batch.ts - now_wall,
                        self.max_future_s,
                    )
                continue
            state = self.jobs.get(batch.job)
            if state is None:
                refused = self._refuse_new_job(batch, now_wall, of_job)
                if refused:
                    self.metrics.batches_rejected.labels(reason=refused).inc()
                    continue
                detector = self.factory()
                window = JobWindow(batch.job, detector.horizon_s, limits=self.limits.window)
                state = JobState(window, detector, first_batch_wall=now_wall)
                self.jobs[batch.job] = state
                new_jobs.append(batch.job)
                logger.info("new job %s", batch.job[:64], extra={"job": batch.job})
            job_batches = of_job.get(batch.job)
            if job_batches is None:
                of_job[batch.job] = job_batches = []
            job_batches.append(batch)
            samples += batch.sample_count
            newest_ts = max(newest_ts, batch.ts)
            if batch.ts > newest_of.get(batch.job, -math.inf):
                newest_of[batch.job] = batch.ts
            placed += 1
        self._load_open_alerts(new_jobs)
        too_old = 0
        for job, job_batches in of_job.items():
            state = self.jobs[job]
            window = state.window
            before = window.stats.too_old
            state.last_batch_wall = self._last_batch_wall = now_wall
            state.finished = False
            state.batches += len(job_batches)
            self._add_to_window(state, job_batches, newest_of[job])
            too_old += window.stats.too_old - before
        if too_old:
            self.metrics.samples_too_old.inc(too_old)
        self.metrics.samples.inc(samples)
        self.metrics.batches.inc(placed)
        for job, ts in newest_of.items():
            state = self.jobs[job]
            # What the window refused, counted once per call rather than per batch.
            for reason, count in state.window.stats.rejected.items():
                seen = state.rejected_exported.get(reason, 0)
                if count != seen:
                    self.metrics.rejected.labels(reason=reason).inc(count - seen)
                    state.rejected_exported[reason] = count
            if ts > state.newest_ts:
                state.newest_ts = ts
                if not state.ended:  # an ended job has no series until it reports again
                    self.metrics.job_last_sample.labels(job).set(ts)
        if placed:
            self.metrics.lag.set(max(0.0, now_wall - newest_ts))
        return placed

    def _add_to_window(self, state: JobState, batches: list[NodeBatch], newest: float) -> None:
        """Place one job's batches of an ingest call. When they hold the goodbyes of every
        machine still in the job, the rest is placed first, the job evaluated to its newest
        second (no late data follows a goodbye) and the detector told its data ended
        (:meth:`_finish`), before the goodbyes take the machines out of the comparison."""
        before, goodbyes = self._split_last_goodbyes(state, batches)
        if not goodbyes:
            self._place(state, batches, newest)
            return
        if before:
            self._place(state, before, newest)
        self._caught_up.extend(self._advance(state, final=True))
        self._caught_up.extend(self._finish(state))
        state.window.add_batches(goodbyes)

    def _place(self, state: JobState, batches: list[NodeBatch], newest: float) -> None:
        """Place batches; evaluate part-way through a call whose data spans more than half the
        job's window (a backlog drained in large polls: a small job's packed batches can fill a
        poll with minutes of data), so no second falls out of the window before it was
        evaluated. Alerts raised then come with the next tick."""
        window = state.window
        half = max(1, window.horizon_s // 2)
        base = window.newest_sec if window.newest_sec != NEVER else math.floor(batches[0].ts)
        if newest - base <= half:
            window.add_batches(batches)
            return
        start = 0
        for i, batch in enumerate(batches):
            if batch.ts - base > half:
                if i > start:
                    window.add_batches(batches[start:i])
                    self._caught_up.extend(self._advance(state))
                start, base = i, math.floor(batch.ts)
        window.add_batches(batches[start:])

    @staticmethod
    def _split_last_goodbyes(
        state: JobState, batches: list[NodeBatch]
    ) -> tuple[list[NodeBatch], list[NodeBatch]]:
        """``(batches, [])``, or, when ``batches`` hold the goodbyes of every machine still in
        the job, everything but the goodbyes (a goodbye may share its batch with the last data)
        and the goodbyes alone."""
        leaving = {b.node for b in batches if any(e.kind is EventKind.LEAVE for e in b.events)}
        window = state.window
        active = window.active()
        if not leaving or not active.any():
            return batches, []
        machines = window.machines[: active.shape[0]]
        if any(active[i] and info.name not in leaving for i, info in enumerate(machines)):
            return batches, []
        before, goodbyes = [], []
        for b in batches:
            leave = [e for e in b.events if e.kind is EventKind.LEAVE]
            if not leave:
                before.append(b)
                continue
            rest = [e for e in b.events if e.kind is not EventKind.LEAVE]
            if b.sample_count or rest or b.flight_recorder:
                before.append(dataclasses.replace(b, events=rest))
            goodbyes.append(
                NodeBatch(b.job, b.node, b.ts, b.interval_s, dict(b.labels), events=leave)
            )
        return before, goodbyes

    def _refuse_new_job(
        self, batch: NodeBatch, now_wall: float, busy: Collection[str]
    ) -> str | None:
        """Why a batch may not start a new job (None: it may): a job id too long, data too old
        to be a live job (a replay or a broken clock), or too many jobs on this worker and none
        this job may take the place of (:mod:`minder.service.admission`; ``busy``: jobs with
        batches in this ingest call, which keep their place)."""
        lim = self.limits
        if len(batch.job) > lim.window.max_name_length:
            reason = "name_too_long"
        elif batch.ts < now_wall - lim.new_job_max_age_s:
            reason = "too_old_for_new_job"
        elif len(self.jobs) < lim.max_jobs:
            return None
        else:
            reason = TOO_MANY_JOBS
        entry = self._refused.note(reason, batch.job, batch.node, now_wall)
        if reason == TOO_MANY_JOBS and self._take_a_place(batch.job, entry, now_wall, busy):
            self._refused.forget(reason, batch.job)
            return None
        if not entry.counted:
            entry.counted = True
            self.metrics.refused_jobs.labels(reason=reason).inc()
        log = self._refusal_logs.get(reason)
        if log is None:
            log = self._refusal_logs[reason] = LogDigest(self.refusal_log_every_s)
        machines = len(entry.nodes)
        more = "+" if machines >= MAX_NODES_KEPT else ""
        detail = f"{machines}{more} machine(s), {entry.batches} batch(es)"
        said = log.add(entry.job, machines, detail, now_wall)
        if said is not None:
            self._say_refused(reason, said)
        return reason

    def _say_refused(self, reason: str, digest: Digest) -> None:
        why = {
            "name_too_long": f"job id over {self.limits.window.max_name_length} characters",
            "too_old_for_new_job": f"data older than {self.limits.new_job_max_age_s:.0f} s",
            TOO_MANY_JOBS: f"this worker holds its {self.limits.max_jobs} jobs and none of them "
            "is worth less",
        }.get(reason, reason)
        logger.warning(
            "new jobs refused (%s: %s): %d batch(es) of %d job(s) in %.0f s: %s; counted in "
            "minder_refused_jobs_total",
            reason,
            why,
            digest.events,
            digest.subjects,
            digest.span_s,
            digest.names(),
        )

    # -- admission at the bound (minder.service.admission) -----------------------------------
    def _rank(self, job: str, state: JobState, now_wall: float) -> _VictimKey:
        """Where ``job`` stands when a newcomer needs a place (the lowest gives it first)."""
        confirmed = (
            self.confirmations is not None
            and self.confirmations.states([job])[0] is Confirmation.CONFIRMED
        )
        return self._victim_key(confirmed, state, now_wall)

    @staticmethod
    def _victim_key(confirmed: bool, state: JobState, now_wall: float) -> _VictimKey:
        if state.ended:  # a job that ended gives its place before any other
            return (SINGLE_MACHINE - 1, 0, state.last_batch_wall)
        machines = state.window.n_machines
        one_shot = (
            not confirmed
            and machines <= 1
            and state.batches <= ONE_SHOT_BATCHES
            and now_wall - state.last_batch_wall >= ONE_SHOT_IDLE_S
        )
        return (rank_of(confirmed, machines), 0 if one_shot else 1, state.last_batch_wall)

    def _victim_order(self, now_wall: float) -> deque[tuple[_VictimKey, str]]:
        """The jobs in the order they would give their place, rebuilt at most every
        :data:`_VICTIMS_EVERY_S`, or once per ingest call when it ran out (one sort of the
        jobs, not one per refused batch)."""
        stale = now_wall - self._victims_at >= _VICTIMS_EVERY_S
        if stale or (not self._victims and self._victims_call != self._ingest_calls):
            self._victims_at = now_wall
            self._victims_call = self._ingest_calls
            jobs = list(self.jobs)
            confirmed = (
                [c is Confirmation.CONFIRMED for c in self.confirmations.states(jobs)]
                if self.confirmations is not None
                else [False] * len(jobs)
            )
            keyed = [
                (self._victim_key(ok, self.jobs[job], now_wall), job)
                for job, ok in zip(jobs, confirmed, strict=True)
            ]
            keyed.sort()
            self._victims = deque(keyed)
        return self._victims

    def _take_a_place(
        self, job: str, entry: RefusedJob, now_wall: float, busy: Collection[str]
    ) -> bool:
        """Evict the job ``job`` may take the place of, if any: one of a lower rank, or a
        one-shot job; True when one was evicted."""
        machines = len(entry.nodes)
        confirmed = (
            self.confirmations is not None
            and self.confirmations.state(job, priority=machines) is Confirmation.CONFIRMED
        )
        rank = rank_of(confirmed, machines)
        order = self._victim_order(now_wall)
        while order:
            cached, victim = order[0]
            state = self.jobs.get(victim)
            if state is None or victim in busy:
                order.popleft()
                continue
            if state.ended:  # the window of a job that ended: no eviction of a live job
                order.popleft()
                self._drop(victim)
                logger.debug("job %s (ended) gave its window to %s", victim[:64], job[:64])
                return True
            fresh = self._rank(victim, state, now_wall)
            one_shot = fresh[1] == 0
            if one_shot or fresh[0] < rank:
                order.popleft()
                if one_shot:
                    reason = "one_shot"
                elif rank == CONFIRMED:
                    reason = "for_confirmed_job"
                else:
                    reason = "for_several_machines"
                self._evict(victim, state, reason, job, entry, rank, now_wall)
                return True
            if fresh != cached:  # it changed since the order was built: placed at the next
                order.popleft()
                continue
            return False  # the order is by rank, one-shot first: no job gives its place
        return False

    def _evict(
        self,
        victim: str,
        state: JobState,
        reason: str,
        newcomer: str,
        entry: RefusedJob,
        rank: int,
        now_wall: float,
    ) -> None:
        """Drop ``victim``'s window for ``newcomer``'s; count it and say it (rate-limited). The
        victim is idle from then on."""
        self._report(state, JobStatus.IDLE, f"its window gave its place to a new job ({reason})")
        self._drop(victim)
        self.metrics.evicted_jobs.labels(reason=reason).inc()
        standing = (
            "confirmed by the scheduler" if rank == CONFIRMED else f"{len(entry.nodes)} machine(s)"
        )
        detail = (
            f"{state.window.n_machines} machine(s), {state.batches} batch(es), idle "
            f"{now_wall - state.last_batch_wall:.0f} s; {reason}: for {job_key(newcomer)[:64]!r}, "
            f"{standing}"
        )
        said = self._eviction_log.add(
            job_key(victim), rank * 100 + min(len(entry.nodes), 99), detail, now_wall
        )
        if said is not None:
            self._say_evicted(said)

    def _say_evicted(self, digest: Digest) -> None:
        logger.warning(
            "%d job(s) evicted in %.0f s to admit new ones at the bound of %d jobs per worker "
            "(minder_evicted_jobs_total): %s",
            digest.events,
            digest.span_s,
            self.limits.max_jobs,
            digest.names(),
        )

    def _admission_housekeeping(self, now_wall: float) -> None:
        """Say the refusals and evictions not said yet, and queue lookups of the live jobs the
        scheduler has not answered for lately."""
        for reason, log in self._refusal_logs.items():
            said = log.due(now_wall)
            if said is not None:
                self._say_refused(reason, said)
        said = self._eviction_log.due(now_wall)
        if said is not None:
            self._say_evicted(said)
        if self.confirmations is not None and now_wall - self._confirmed_at >= _CONFIRM_EVERY_S:
            self._confirmed_at = now_wall
            live = {j: s.window.n_machines for j, s in self.jobs.items() if not s.ended}
            self.confirmations.refresh(live)

    def stalled_jobs(self, stall_s: float = 60.0) -> list[str]:
        """Jobs whose data keeps arriving while their evaluation has not advanced for
        ``stall_s`` seconds (or three of the job's sampling intervals; wall clock): detection
        is stalled for them."""
        now = self.clock()
        out = []
        for job, state in self.jobs.items():
            if state.ended:
                continue
            limit = max(stall_s, 3.0 * state.window.tick_s)  # a coarse job reports seldom
            if now - state.last_batch_wall < limit and (
                now - max(state.last_evaluation_wall, state.first_batch_wall) > limit
            ):
                out.append(job)
        return sorted(out)

    # -- detection --------------------------------------------------------------------------
    def tick(self) -> list[Alert]:
        """Evaluate every job up to its watermark; return the new alerts."""
        self._retry_unstored()
        self._admission_housekeeping(self.clock())
        new_alerts, self._caught_up = self._caught_up, []
        for job, state in list(self.jobs.items()):
            if self.clock() - state.last_batch_wall > self.idle_job_s:
                self._retire(job)
                continue
            new_alerts.extend(self._advance(state))
        active = [s for s in self.jobs.values() if not s.ended]
        self.metrics.jobs.set(len(active))
        self.metrics.stalled_jobs.set(len(self.stalled_jobs()))
        self.metrics.machines.set(sum(s.active_machines for s in active))
        self._export_open_alerts()
        self._lifecycle(self.clock())
        return new_alerts

    # -- lifecycle (docs/operations.md, "Job lifecycle") -------------------------------------
    def _report(self, state: JobState, status: JobStatus, reason: str = "") -> None:
        """Hand the job's status (and its machines now, when active) to the writer; a job
        never reported active is not stored idle or ended (a one-shot or evicted job id would
        stay in the store for ever)."""
        if status is not JobStatus.ACTIVE and state.reported is None:
            return
        machines = state.active_machines if status is JobStatus.ACTIVE else 0
        state.reported = (status, machines)
        if self.writer is None:
            return
        seen = state.newest_ts if math.isfinite(state.newest_ts) else 0.0
        report = JobReport(state.window.job, status, machines, seen, reason)
        self.writer.submit_job_states([report], self.clock())

    def _lifecycle(self, now: float) -> None:
        """Every ``report_every_s``: report every active job held (the store's sign that this
        worker is alive) and have the stored jobs aged (idle ones past the retention end, active
        ones no worker reports become idle)."""
        if self.writer is None or now - self._lifecycle_at < self.report_every_s:
            return
        self._lifecycle_at = now
        reports = []
        for job, state in self.jobs.items():
            if state.ended or state.reported is None:
                continue
            seen = state.newest_ts if math.isfinite(state.newest_ts) else 0.0
            reports.append(JobReport(job, JobStatus.ACTIVE, state.active_machines, seen))
        self.writer.submit_job_states(reports, now)
        self.writer.submit_sweep(now, self.stale_after_s, self.idle_retention_s)

    def release(self, reason: str = "the service stopped") -> None:
        """Give every job up (the service stops): each active one is reported idle, with
        ``reason``, and its window and series dropped. Call it once nothing feeds the service
        any more, before the writer is closed (it writes the reports)."""
        for job, state in list(self.jobs.items()):
            if not state.ended:
                self._report(state, JobStatus.IDLE, reason)
            # What is pending for the job (its last capture, findings) is still written at close.
            self._drop(job, forget_pending=False)
        self.metrics.jobs.set(0)
        self.metrics.machines.set(0)
        self.metrics.stalled_jobs.set(0)

    def _no_machine_in(self, state: JobState) -> None:
        """The job's window holds no machine now: when its last one said goodbye, the job
        ended; else (machines silent, not departed: they count until the job is idle) it stays
        active with no machine."""
        if state.ended:
            return
        self._take_membership(state)
        if state.last_departure == "left":
            self._end(state)
        elif state.active_machines or state.reported is None:
            state.active_machines = 0
            self.metrics.job_machines.labels(state.window.job).set(0)
            self._report(state, JobStatus.ACTIVE)

    def _end(self, state: JobState) -> None:
        """The job's last machine said goodbye: it ended. Its series go; its window stays for
        late data until ``idle_job_s`` (a machine reporting again makes it active)."""
        job = state.window.job
        state.ended = True
        state.active_machines = 0
        self._forget_series(job)
        self._report(state, JobStatus.ENDED, "its last machine said goodbye")
        logger.info("job %s ended: its last machine said goodbye", job[:64])

    def _export_open_alerts(self) -> None:
        """Refresh ``minder_open_alerts`` from the store (operators resolve alerts through the
        API, so the store is the truth), at most every ``open_alerts_every_s`` seconds."""
        now = time.monotonic()
        if self.store is None or now - self._open_alerts_at < self.open_alerts_every_s:
            return
        self._open_alerts_at = now
        try:
            by_machine = self.store.open_alert_counts()
        except Exception as exc:
            logger.warning("cannot count open alerts: %s", exc)
            return
        # Operators resolve alerts through the API: a resolved machine may be alerted again.
        by_job: dict[str, dict[str, set[str]]] = {job: {} for job in self.jobs}
        counts: dict[tuple[str, str], int] = {}
        for (job, machine, kind), count in by_machine.items():
            counts[(job, kind)] = counts.get((job, kind), 0) + count
            if job in by_job:
                by_job[job].setdefault(machine, set()).add(kind)
        self._open_by_machine = by_job
        # Every live job shows every kind (0 when none), so "no open alert" is a value, not a gap.
        live = [job for job, state in self.jobs.items() if not state.ended]
        keys = set(counts) | {(job, kind.value) for job in live for kind in AlertKind}
        for job, kind in keys:
            self.metrics.open_alerts.labels(job, kind).set(counts.get((job, kind), 0))
        for job, kind in self._open_alert_series - keys:
            with contextlib.suppress(KeyError):
                self.metrics.open_alerts.remove(job, kind)
        self._open_alert_series = keys

    def _advance(self, state: JobState, *, final: bool = False) -> list[Alert]:
        """Evaluate the job up to its watermark (``final``: to its newest second, nothing late
        coming)."""
        window = state.window
        if window.newest_sec == NEVER:
            return []
        # The job's "now" is where most machines are, not the newest timestamp seen: a node whose
        # clock runs ahead must not drag the evaluation (and the others' samples) behind it.
        last_seen = window.machine_last_seen()
        # Machines in the job: those that left (a scale-down) must not hold the clock back.
        known = last_seen[window.active()]
        if not known.size:
            finished = self._finish(state)  # its machines said goodbye: its data ended
            self._no_machine_in(state)
            return finished
        if state.ended:
            state.ended = False
            state.last_departure = ""
            logger.info("job %s: a machine reports again after the job ended: active",
                        window.job[:64])  # fmt: skip
            if math.isfinite(state.newest_ts):
                self.metrics.job_last_sample.labels(window.job).set(state.newest_ts)
        newest = min(window.newest_sec, int(np.percentile(known, 90)))
        if newest == NEVER:
            return []
        watermark = newest - math.ceil(self.grace_s)
        if final or self.clock() - state.last_batch_wall > self.grace_s + 1.0:
            # Nothing arrived for longer than the grace: nothing late is coming either, so the
            # job's last seconds are evaluated now instead of waiting for data that may never come.
            watermark = newest
        start = state.evaluated_sec + 1
        if state.evaluated_sec == NEVER or watermark - start >= window.horizon_s:
            # First evaluation, or a gap longer than the window: nothing older is still held.
            start = watermark
        out: list[Alert] = []
        if start <= watermark:
            state.last_evaluation_wall = self.clock()
            self.metrics.job_last_evaluation.labels(window.job).set(state.last_evaluation_wall)
        for sec in range(start, watermark + 1):
            began = time.process_time()
            try:
                raised = state.detector.evaluate(window, sec)
            except Exception as exc:
                # One job's bad data must not stop every other job's detection: this second of
                # this job is skipped, said once per job and kind of error.
                raised = []
                said = (window.job, type(exc).__name__)
                if said not in self._detector_errors:
                    self._detector_errors.add(said)
                    logger.exception("job %s: detection failed at %d and that second is "
                                     "skipped (said once per job and error type)",
                                     window.job[:64], sec, extra={"job": window.job})  # fmt: skip
            self.metrics.evaluation_seconds.observe(time.process_time() - began)
            state.evaluated_sec = sec
            out.extend(self._deliver_all(raised))
            if sec - self._last_persist.get(window.job, NEVER) >= self.persist_every_s:
                self._persist(state, sec)
        stop_s = max(JOB_STOPPED_S, 3.0 * window.tick_s, self.grace_s + 1.0)
        now_wall = self.clock()
        if (
            start > watermark
            and now_wall - state.last_batch_wall > stop_s
            and now_wall - self._last_batch_wall <= stop_s / 2
        ):
            # The whole job stopped reporting while the stream still brings other jobs' data:
            # its data ended. A stream that stalled as a whole (a broker outage, a consumer
            # rebalance) ends no job.
            out.extend(self._finish(state))
        if start <= watermark:
            self._job_state(state)
        elif window.membership:  # a goodbye, a return: said now, not at the next evaluation
            self._job_members(state)
        return out

    def _finish(self, state: JobState) -> list[Alert]:
        """Tell the detector, once, that the job's data ended at its last evaluated second: the
        alerts of a machine that stopped before the job did (a fail-stop fault that killed it,
        docs/detection-method.md, "A job whose data ends")."""
        if state.finished or state.evaluated_sec == NEVER:
            return []
        state.finished = True
        try:
            raised = finish_of(state.detector, state.window, state.evaluated_sec)
        except Exception:
            logger.exception("job %s: detection at the end of its data failed",
                             state.window.job[:64], extra={"job": state.window.job})  # fmt: skip
            return []
        return self._deliver_all(raised)

    def _job_state(self, state: JobState) -> None:
        """Log and count the job's membership changes (machines that joined or left: not
        faults); export how many machines are in it, the interval it is sampled at, its
        live slowdown and its job-level findings."""
        window = state.window
        self._job_members(state)
        if window.cadence_known:
            self.metrics.job_interval.labels(window.job).set(window.tick_s)
        slowdown = getattr(state.detector, "live_slowdown", None)
        if slowdown is not None:
            self.metrics.job_slowdown.labels(window.job).set(float(slowdown))
        self._job_findings(state)
        self._job_hang(state)

    def _job_members(self, state: JobState) -> None:
        """Take the job's membership changes; export and report the machines in it now."""
        self._take_membership(state)
        state.active_machines = int(state.window.active().sum())
        self.metrics.job_machines.labels(state.window.job).set(state.active_machines)
        if state.reported != (JobStatus.ACTIVE, state.active_machines):
            self._report(state, JobStatus.ACTIVE)

    def _take_membership(self, state: JobState) -> None:
        """Log and count the job's membership changes; keep how the latest machines left."""
        window = state.window
        for change in window.take_membership():
            self.metrics.membership_changes.labels(change=change.change).inc()
            if change.change in ("left", "left_together"):
                state.last_departure = change.change
            names = ", ".join(name[:64] for name in change.machines[:8])
            more = f" and {len(change.machines) - 8} more" if len(change.machines) > 8 else ""
            logger.info(
                "job %s: %s %s%s%s",
                window.job[:64],
                change.change.replace("_", " "),
                names or "(job-wide)",
                more,
                f" ({change.reason[:160]})" if change.reason else "",
            )

    def _job_hang(self, state: JobState) -> None:
        """Take the detector's latest hang analysis of the job: when it is a new one, log it,
        export its culprits (``minder_hang_culprit``, while hung) and hand it to the writer;
        export ``minder_job_hang`` either way.

        Detectors without ``hang_analysis`` have none; the job is then
        hung only while its job-level hang alert is open.
        """
        job = state.window.job
        # The default composite passes its hang detector's analysis through; detectors
        # without one (the baselines) have none.
        found = getattr(state.detector, "hang_analysis", None)
        latest = found() if callable(found) else None
        if latest is not None and not isinstance(latest, HangAnalysis):
            try:
                latest = HangAnalysis.from_dict(latest)
            except ValidationError as exc:
                if not state.hang_refused:
                    state.hang_refused = True
                    logger.warning("job %s: malformed hang analysis of the detector dropped "
                                   "(said once per job): %s", job[:64], exc)  # fmt: skip
                latest = None
        if latest is not None and latest is not state.hang and latest != state.hang:
            _log_hang(job, state.hang, latest)
            state.hang = latest
            _export_top(
                self.metrics.hang_culprit,
                job,
                self._exported_culprits,
                _culprit_series(latest),
            )
            if self.writer is not None:
                self.writer.submit_hang(job, float(state.evaluated_sec), latest)
        if state.hang is not None:
            hung = state.hang.hung
        else:
            hung = AlertKind.HANG.value in self._open_by_machine.get(job, {}).get("", ())
        self.metrics.job_hang.labels(job).set(1.0 if hung else 0.0)

    def _job_findings(self, state: JobState) -> None:
        """Take the detector's current job-level findings: log those that began or ended,
        export the coherence of each metric that is not peer-comparable
        (``minder_job_peer_coherence``), and hand the set to the writer when it changed.

        Detectors without ``job_findings`` (the baselines) have none.
        """
        found = getattr(state.detector, "job_findings", None)
        if found is None:
            return
        job = state.window.job
        current: dict[tuple[str, str], JobFinding] = {}
        for entry in found():
            try:
                finding = JobFinding.coerce(entry)
            except ValidationError as exc:
                if not state.findings_refused:
                    state.findings_refused = True
                    logger.warning("job %s: malformed job finding of the detector dropped (said"
                                   " once per job): %s", job[:64], exc)  # fmt: skip
                continue
            current.setdefault(finding.key, finding)
        _log_findings(job, state.findings, current)
        state.findings = current
        _export_top(
            self.metrics.job_peer_coherence,
            job,
            self._exported_coherence,
            {
                (f.metric,): f.coherence
                for f in current.values()
                if f.finding == NOT_PEER_COMPARABLE and f.metric and f.coherence is not None
            },
        )
        self._submit_findings(state)

    def _submit_findings(self, state: JobState) -> None:
        """Hand the job's findings to the writer: at once when the set changed (a finding
        began or ended, or this worker has written none for the job yet, so rows another
        worker left are replaced); when only their numbers moved, every
        ``findings_refresh_s`` data seconds at most."""
        if self.writer is None:
            return
        ordered = tuple(sorted(state.findings.values(), key=lambda f: f.key))
        written = state.findings_written
        sec = state.evaluated_sec
        if written is not None:
            if ordered == written:
                return
            same_set = [(f.key, f.since_ts) for f in ordered] == [
                (f.key, f.since_ts) for f in written
            ]
            if same_set and sec - state.findings_written_sec < self.findings_refresh_s:
                return
        state.findings_written = ordered
        state.findings_written_sec = sec
        self.writer.submit_findings(state.window.job, float(sec), ordered)

    def _load_open_alerts(self, jobs: list[str]) -> None:
        """What the store knows is open for the new ``jobs``: no second alert for those
        machines. One query per job, or one for every job when many start at once (a worker
        taking partitions over, or a flood of job ids), so the loop does not wait for
        thousands of queries."""
        if self.store is None or not jobs:
            return
        try:
            if len(jobs) <= _OPEN_ALERT_QUERIES:
                keys = {k: n for job in jobs for k, n in self.store.open_alert_counts(job).items()}
            else:
                keys = self.store.open_alert_counts()
        except Exception as exc:
            logger.warning("cannot load the open alerts of %d new job(s): %s", len(jobs), exc)
            return
        by_job: dict[str, dict[str, set[str]]] = {job: {} for job in jobs}
        for job, machine, kind in keys:
            if job in by_job:
                by_job[job].setdefault(machine, set()).add(kind)
        for job, by_machine in by_job.items():
            self._open_by_machine[job] = by_machine
            if by_machine:
                logger.info("job %s: %d machine(s) already alerted, not alerted again while open",
                            job[:64], len(by_machine))  # fmt: skip

    def _already_alerted(self, alert: Alert) -> bool:
        """A similarity alert on a machine that a hard-fault rule or silence alert already
        names, still open: the same fault seen by its side effects, not a new one.

        This is the detector's own "one fault, one alert" (a machine a rule named is not named
        again by similarity), kept across restarts and takeovers through the store. Any other
        alert goes to the store, which folds a report of an open alert's key into it.
        """
        if alert.kind is not AlertKind.SIMILARITY:
            return False
        kinds = self._open_by_machine.get(alert.job, {}).get(alert.machine)
        return bool(kinds and kinds & _NAMING_KINDS)

    def _deliver_all(self, raised: list[Alert]) -> list[Alert]:
        """Deliver each alert the detector raised; the new ones, as stored."""
        out = []
        for alert in raised:
            stored = self._deliver(alert)
            if stored is not None:
                out.append(stored)
        return out

    def _deliver(self, alert: Alert) -> Alert | None:
        if self._already_alerted(alert):
            self.metrics.alerts_suppressed.inc()
            logger.debug("job %s machine %s: %s alert on %s suppressed (already alerted)",
                         alert.job, alert.machine, alert.kind.value, alert.metric)  # fmt: skip
            return None
        if self.store is not None:
            try:
                alert, created = self.store.record_alert(alert)
            except Exception:
                logger.exception(
                    "could not store alert %s (%s); delivering it and retrying the store",
                    alert.id,
                    alert.key,
                )
                self.metrics.alert_deliveries.labels(sink="store", outcome="error").inc()
                self._keep_unstored(alert)
                created = True  # better a duplicate downstream than a lost alert
            else:
                self.metrics.alert_deliveries.labels(sink="store", outcome="ok").inc()
            if not created:
                return None
        self.metrics.alerts.labels(kind=alert.kind.value).inc()
        self._open_by_machine.setdefault(alert.job, {}).setdefault(alert.machine, set()).add(
            alert.kind.value
        )
        self.alerts.append(alert)
        del self.alerts[: -self.max_kept]
        logger.info(
            "ALERT %s job=%s machine=%s kind=%s metric=%s devices=%s score=%.2f",
            alert.id,
            alert.job,
            alert.machine,
            alert.kind.value,
            alert.metric,
            ",".join(alert.devices) or "-",
            alert.score,
            extra={"job": alert.job, "machine": alert.machine},
        )
        for sink in self.sinks:
            try:
                sink.deliver(alert)
            except Exception:
                logger.exception("alert sink %s failed for alert %s", sink.name, alert.id)
                self.metrics.alert_deliveries.labels(sink=sink.name, outcome="error").inc()
            else:
                self.metrics.alert_deliveries.labels(sink=sink.name, outcome="accepted").inc()
        return alert

    def _keep_unstored(self, alert: Alert) -> None:
        self._unstored.append(alert)
        if len(self._unstored) > self.max_unstored:
            dropped = self._unstored.pop(0)
            logger.error("too many alerts waiting for the store: alert %s dropped", dropped.id)
            self.metrics.alert_deliveries.labels(sink="store", outcome="dropped").inc()

    def _retry_unstored(self) -> None:
        if not self._unstored or self.store is None:
            return
        waiting, self._unstored = self._unstored, []
        for index, alert in enumerate(waiting):
            try:
                self.store.record_alert(alert)
            except Exception as exc:
                logger.warning("store still failing (%s); %d alert(s) wait", exc, len(waiting))
                self._unstored = waiting[index:] + self._unstored
                return
            self.metrics.alert_deliveries.labels(sink="store", outcome="ok").inc()

    # -- state ------------------------------------------------------------------------------
    def snapshot(self, job: str) -> JobSnapshot:
        """Current machines and scores of ``job`` (KeyError if unknown)."""
        return self.capture(job).snapshot()

    def capture(self, job: str) -> JobCapture:
        """``job``'s machines and scores now, detached from its window (KeyError if unknown):
        numpy copies, a few milliseconds for 10,000 machines."""
        state = self.jobs[job]
        window = state.window
        scores = state.detector.machine_scores()
        last_seen = window.machine_last_seen().astype(np.float64)
        last_seen[last_seen == NEVER] = 0.0
        return JobCapture.build(
            job,
            float(state.evaluated_sec),
            [(m.name, m.group, m.domain) for m in window.machines],
            last_seen,
            scores,
            {metric: window.columns_of(metric)[1] for metric in scores},
        )

    def _persist(self, state: JobState, sec: int) -> None:
        """Export the job's top scores and hand its state to the writer (no database write
        here: the service's writer runs in a thread of its own)."""
        job = state.window.job
        self._last_persist[job] = sec
        capture = self.capture(job)
        # Every machine of the job up to a bound (the heatmap, the machine picker), built at
        # scrape time; and the top-k machines as series of their own, cheap to alert on. A
        # series per machine of a 10,000-machine job would swamp Prometheus; the store keeps
        # every machine's score.
        limits = self.limits
        whole = capture.top(max(limits.top_k_scores, limits.machine_series_per_job))
        self.metrics.machine_score_all.set_job(job, [((name,), score) for name, score in whole])
        _export_top(
            self.metrics.machine_score,
            job,
            self._exported_scores,
            {(name,): score for name, score in whole[: limits.top_k_scores]},
        )
        self._export_lateness(state)
        if self.writer is not None:
            self.writer.submit(capture)

    def _export_lateness(self, state: JobState) -> None:
        """``minder_rank_lateness_seconds``: every rank of the job up to
        ``machine_series_per_job`` (the latest beyond it; at least the top-k), so the per-rank
        heatmap shows the whole job and a job of 100,000 ranks stays bounded."""
        job = state.window.job
        late_ranks = getattr(state.detector, "late_ranks", None)
        ranks = max(self.limits.top_k_scores, self.limits.machine_series_per_job)
        late = late_ranks(ranks) if late_ranks is not None else []
        self.metrics.rank_lateness.set_job(
            job, [((rank.machine, rank.device), rank.seconds) for rank in late]
        )

    def _retire(self, job: str) -> None:
        state = self.jobs[job]
        if state.ended:
            self._drop(job)
            logger.debug("job %s (ended) without data for %.0f s: window dropped", job[:64],
                         self.idle_job_s)  # fmt: skip
            return
        self._report(state, JobStatus.IDLE, f"no data for {self.idle_job_s:.0f} s")
        self._drop(job)
        logger.info("job %s idle: no data for %.0f s, window dropped (ended after %.0f s more "
                    "without data)", job[:64], self.idle_job_s,
                    self.idle_retention_s)  # fmt: skip

    def _drop(self, job: str, *, forget_pending: bool = True) -> None:
        """Forget ``job``: its window, its series, what is kept for it (and, unless
        ``forget_pending`` is False, what the writer still holds of it)."""
        self.jobs.pop(job)
        self._forget_series(job)
        self._open_by_machine.pop(job, None)
        self._detector_errors = {e for e in self._detector_errors if e[0] != job}
        self._last_persist.pop(job, None)
        if self.writer is not None and forget_pending:
            self.writer.forget(job)

    def _forget_series(self, job: str) -> None:
        """Remove ``job``'s own series (it is no longer active)."""
        self.metrics.forget_job(job)
        self._open_alerts_at = -math.inf  # its zero minder_open_alerts go at the next refresh
        _export_top(self.metrics.machine_score, job, self._exported_scores, {})
        self.metrics.machine_score_all.forget(job)
        self.metrics.rank_lateness.forget(job)
        _export_top(self.metrics.job_peer_coherence, job, self._exported_coherence, {})
        _export_top(self.metrics.hang_culprit, job, self._exported_culprits, {})
        self._exported_scores.pop(job, None)
        self._exported_culprits.pop(job, None)
        self._exported_coherence.pop(job, None)


def _export_top(
    gauge: Gauge,
    job: str,
    exported: dict[str, set[tuple[str, ...]]],
    values: dict[tuple[str, ...], float],
) -> None:
    """Set ``job``'s series of ``gauge`` to ``values`` (label values after ``job_id``) and
    remove those it exported before that are not among them (``exported``: what each job
    shows)."""
    for labels in exported.get(job, set()) - values.keys():
        with contextlib.suppress(KeyError):
            gauge.remove(job, *labels)
    for labels, value in values.items():
        gauge.labels(job, *labels).set(value)
    exported[job] = set(values)


def _culprit_series(analysis: HangAnalysis) -> dict[tuple[str, ...], float]:
    """``minder_hang_culprit``'s label values after ``job_id`` (rank, machine, group, reason)
    for the first :data:`HANG_CULPRIT_SERIES` culprits by rank, while the job is hung."""
    if not analysis.hung:
        return {}
    out: dict[tuple[str, ...], float] = {}
    for c in sorted(analysis.culprits, key=lambda c: (c.rank, c.group, c.reason.value)):
        labels = (str(c.rank), c.machine, (c.group_desc or c.group)[:64], c.reason.value)
        out[labels] = 1.0
        if len(out) >= HANG_CULPRIT_SERIES:
            break
    return out


def _log_hang(job: str, before: HangAnalysis | None, now: HangAnalysis) -> None:
    """Log a new hang analysis of the job: at warning level when it says hung (at debug when
    the hang goes on with the same culprits), at info when it says a hang is over, at debug
    when nothing changed for an operator."""
    if now.hung and before is not None and before.hung:
        level = logging.DEBUG if before.culprit_ranks == now.culprit_ranks else logging.WARNING
    else:
        level = logging.WARNING
    if now.hung:
        ranks = now.culprit_ranks
        shown = ", ".join(str(r) for r in ranks[:16]) + (" ..." if len(ranks) > 16 else "")
        machines = now.culprit_machines
        names = ", ".join(m[:64] for m in machines[:8]) + (" ..." if len(machines) > 8 else "")
        logger.log(level, "job %s: hung: it waits on rank(s) %s on %s (%d of %d ranks' dumps "
                       "analysed; GET /api/v1/jobs/{job}/hang)", job[:64], shown or "none named",
                       names or "unknown machines", now.ranks_seen,
                       now.ranks_expected)  # fmt: skip
    elif before is not None and before.hung:
        logger.info("job %s: the hang is over (latest analysis at %.0f)", job[:64],
                    now.analysed_ts)  # fmt: skip
    else:
        logger.debug("job %s: hang analysis at %.0f: not hung", job[:64], now.analysed_ts)


def _log_findings(
    job: str, before: dict[tuple[str, str], JobFinding], now: dict[tuple[str, str], JobFinding]
) -> None:
    """Log each job-level finding once when it begins and once when it ends (a finding whose
    ``since_ts`` moved ended and began again); at debug level what the detector already said
    (:data:`_LOGGED_BY_DETECTOR`)."""
    for key, ended in before.items():
        still = now.get(key)
        if still is None or still.since_ts != ended.since_ts:
            level = logging.DEBUG if (ended.finding, False) in _LOGGED_BY_DETECTOR else logging.INFO
            logger.log(level, "job %s: %s%s ended (it held since %.0f)", job[:64], ended.finding,
                       f" on {ended.metric}" if ended.metric else "", ended.since_ts)  # fmt: skip
    for key, began in now.items():
        held = before.get(key)
        if held is None or held.since_ts != began.since_ts:
            level = logging.DEBUG if (began.finding, True) in _LOGGED_BY_DETECTOR else logging.INFO
            logger.log(level, "job %s: %s%s since %.0f: %s", job[:64], began.finding,
                       f" on {began.metric}" if began.metric else "", began.since_ts,
                       began.detail[:300])  # fmt: skip
