"""Run a detector over a simulated scenario as the stream delivers it, without building a table.

The simulator's chunks (120 s each) are generated and delivered one at a time
(:func:`collectors.sim.plan.compile_scenario`, :func:`~collectors.sim.engine.generate_chunk`,
:class:`~collectors.sim.delivery.Deliverer`), so a 2048-machine job needs the memory of one
chunk, not of its whole table. Each delivery second's batches go into a :class:`JobWindow` in
delivery order, exactly as :func:`collectors.sim.output.iter_batches` would hand them to the
service: samples at their own (measured) second, ``ts = start_ts + 1 + second``, events as
:class:`~minder.core.records.Event` objects with ``ts = start_ts + offset``. Every second is then
evaluated in order once its grace for late samples has passed, as
:class:`minder.service.engine.DetectionService` does. With ``grace_s=0``, no late samples and
``events=False`` the alerts are those of :func:`detectors.offline.detect_table` on the
simulated table.

With ``interval_s`` above 1, the job is seen as a Prometheus scrape of the same exporters every
``interval_s`` seconds would show it (:class:`Resampler`): one sample per series and interval,
gauges at their last value, rates (``rate()``) at their mean over the interval, counts
(``increase()``) summed; the agents' events (XIDs, goodbyes) still reach the window.

CPU time (``time.process_time``) is measured around ingestion and evaluation only; simulation
is timed apart.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from collectors.sim import Scenario
from collectors.sim.delivery import Deliverer
from collectors.sim.engine import CHUNK_S, chunk_count, generate_chunk
from collectors.sim.layout import build_layout
from collectors.sim.plan import JobPlan, compile_scenario
from detectors.base import DetectorFactory, JobDetector, finish_of
from detectors.window import JobWindow
from minder.core.alert import Alert
from minder.core.metrics import METRICS, MetricKind
from minder.core.records import Event, NodeBatch

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 2
"""Seconds a second stays open for late samples before it is evaluated (the service's default)."""

Progress = Callable[[int, int], None]
"""``progress(seconds_done, seconds_total)`` of one job."""


@dataclass(frozen=True, slots=True)
class EventRow:
    """A batch that carries events: its delivery and measured second, machine and events."""

    deliver: int
    second: int
    machine: int
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class ChunkData:
    """The batches one chunk delivers, in delivery order.

    Attributes
    ----------
    first, stop
        Delivery seconds ``first … stop - 1``.
    bounds
        ``(stop - first + 1,)``: the batches delivered in second ``first + i`` are
        ``order[bounds[i]:bounds[i + 1]]``.
    order
        Batch rows in delivery order (a duplicated batch appears twice).
    values, present
        ``(R, S)`` each row's samples (float32, as the window keeps them) and which were sent.
    second, machine
        ``(R,)`` the second each row was measured in, and its machine.
    event_rows
        Batches with events, in delivery order.
    """

    first: int
    stop: int
    bounds: np.ndarray
    order: np.ndarray
    values: np.ndarray
    present: np.ndarray
    second: np.ndarray
    machine: np.ndarray
    event_rows: tuple[EventRow, ...]

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays."""
        arrays = (self.bounds, self.order, self.values, self.present, self.second, self.machine)
        return sum(a.nbytes for a in arrays)

    def batches(
        self, second: int, counters: np.ndarray | None = None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """``(measured second, machines, series, values)`` of the samples delivered in
        ``second``: on-time ones first, then late ones by their own second, each batch's samples
        in series order.

        ``counters`` (a mask of series) marks counter-based rates: a scrape reads the counter,
        which kept counting through a lost sample, so those series count wherever the machine
        sent anything in that second.
        """
        i = second - self.first
        rows = self.order[self.bounds[i] : self.bounds[i + 1]]
        if not len(rows):
            return
        measured = self.second[rows]
        cuts = np.flatnonzero(np.diff(measured)) + 1
        for block in np.split(rows, cuts):
            sent = self.present[block]
            if counters is not None:
                sent = sent | (counters[None, :] & sent.any(axis=1)[:, None])
            r, series = np.nonzero(sent)
            row = block[r]
            yield int(self.second[block[0]]), self.machine[row], series, self.values[row, series]


def chunk_bytes_estimate(scenario: Scenario) -> int:
    """Bytes the :class:`ChunkData` of the whole scenario hold (5 per series a second, plus
    late batches carried over)."""
    total = 0
    for job in scenario.jobs:
        series = len(build_layout(job).series_metric)
        total += job.machines * scenario.duration_s * (series * 5 + 12)
    return int(total * 1.05)


def job_chunks(plan: JobPlan, origin: float) -> Iterator[ChunkData]:
    """Generate and deliver ``plan``'s chunks one at a time."""
    deliverer = Deliverer(plan)
    for index in range(chunk_count(plan.duration_s)):
        chunk = generate_chunk(plan, index)
        delivery = deliverer.deliver(chunk, index)
        del chunk
        first = index * CHUNK_S
        stop = min(first + CHUNK_S, plan.duration_s)
        order = delivery.order
        with_events = np.flatnonzero(np.isin(order, list(delivery.events)))
        event_rows = tuple(
            EventRow(
                deliver=int(delivery.deliver[i]),
                second=int(delivery.second[order[i]]),
                machine=int(delivery.machine[order[i]]),
                events=tuple(
                    Event(e.kind, e.device, origin + e.offset_s, e.code, e.message)
                    for e in delivery.events[int(order[i])]
                ),
            )
            for i in with_events.tolist()
        )
        yield ChunkData(
            first=first,
            stop=stop,
            bounds=np.searchsorted(delivery.deliver, np.arange(first, stop + 1)),
            order=order.astype(np.int32),
            values=delivery.values.astype(np.float32),
            present=delivery.present,
            second=delivery.second.astype(np.int32),
            machine=delivery.machine.astype(np.int32),
            event_rows=event_rows,
        )


class Resampler:
    """One sample per series every ``interval_s`` seconds, as a scrape of the exporters sees
    the job: gauges at the interval's last value, rates at their mean, counts summed.

    Rates come from counters, which keep counting through a sample the agent lost: they are
    read wherever the machine sent anything in a second (:meth:`ChunkData.batches`). Samples
    are grouped by the interval they were measured in; an interval is handed over
    (:meth:`due`) once ``grace_s`` seconds past its end have been delivered, as the sample of
    its last second. A machine that did not report in that last second (the scrape instant)
    has no sample for the interval, as a scrape of a machine that is down or gone has none. A
    sample delivered after its interval was handed over is counted in :attr:`too_late`.
    """

    def __init__(
        self, machines: int, series_metric: tuple[str, ...], interval_s: int, grace_s: int
    ) -> None:
        if interval_s < 1:
            raise ValueError(f"interval_s is {interval_s!r}: expected at least 1 second")
        kinds = [METRICS[name].kind for name in series_metric]
        self.gauge = np.asarray([k is MetricKind.GAUGE for k in kinds])
        self.rate = np.asarray([k is MetricKind.RATE for k in kinds])
        self.shape = (machines, len(series_metric))
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.open: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.flushed = -1
        self.too_late = 0

    def add(
        self, measured: int, machines: np.ndarray, series: np.ndarray, values: np.ndarray
    ) -> None:
        """Take the samples of simulator second ``measured``."""
        k = measured // self.interval_s
        if k <= self.flushed:
            self.too_late += len(values)
            return
        acc = self.open.get(k)
        if acc is None:
            acc = (
                np.zeros(self.shape),
                np.zeros(self.shape, dtype=np.int32),
                np.full(self.shape, np.nan, dtype=np.float32),
                np.zeros(self.shape[0], dtype=bool),
            )
            self.open[k] = acc
        total, count, last, at_end = acc
        if measured == (k + 1) * self.interval_s - 1:
            at_end[machines] = True
        flat = machines.astype(np.int64) * self.shape[1] + series
        size = total.size
        total += np.bincount(flat, weights=values, minlength=size).reshape(self.shape)
        count += np.bincount(flat, minlength=size).reshape(self.shape).astype(np.int32)
        last[machines, series] = values

    def due(
        self, delivered: int, final: bool = False
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """``(second, machines, series, values)`` of each interval complete by delivery second
        ``delivered`` (every open one when ``final``), oldest first."""
        for k in sorted(self.open):
            end = (k + 1) * self.interval_s - 1
            if not final and delivered < end + self.grace_s:
                break
            total, count, last, at_end = self.open.pop(k)
            self.flushed = max(self.flushed, k)
            machines, series = np.nonzero(count * at_end[:, None])
            n = count[machines, series]
            sums = total[machines, series]
            values = np.where(
                self.gauge[series],
                last[machines, series],
                np.where(self.rate[series], sums / n, sums),
            ).astype(np.float32)
            yield end, machines, series, values


@dataclass(slots=True)
class SimulatedJob:
    """One job of a scenario, ready to replay: its plan and, when cached, its chunks."""

    plan: JobPlan
    origin: float
    chunks: list[ChunkData] | None = None
    simulate_cpu_s: float = 0.0

    def iter_chunks(self) -> Iterator[ChunkData]:
        """The cached chunks, or freshly generated ones (the simulator is deterministic)."""
        if self.chunks is not None:
            yield from self.chunks
            return
        began = time.process_time()
        for chunk in job_chunks(self.plan, self.origin):
            self.simulate_cpu_s += time.process_time() - began
            yield chunk
            began = time.process_time()
        self.simulate_cpu_s += time.process_time() - began


@dataclass(slots=True)
class SimulatedScenario:
    """A compiled scenario whose deliveries are cached in memory when they are small."""

    scenario: Scenario
    jobs: list[SimulatedJob]

    @property
    def cached(self) -> bool:
        """All deliveries are held in memory."""
        return all(job.chunks is not None for job in self.jobs)

    @property
    def simulate_cpu_s(self) -> float:
        """CPU seconds spent simulating so far."""
        return sum(job.simulate_cpu_s for job in self.jobs)


def simulate(scenario: Scenario, cache_bytes: int = 0) -> SimulatedScenario:
    """Compile ``scenario``; generate and keep its deliveries when they fit ``cache_bytes``."""
    began = time.process_time()
    plans = compile_scenario(scenario)
    jobs = [SimulatedJob(plan, scenario.start_ts) for plan in plans]
    jobs[0].simulate_cpu_s += time.process_time() - began
    if chunk_bytes_estimate(scenario) <= cache_bytes:
        for job in jobs:
            chunks = list(job.iter_chunks())
            job.chunks = chunks
    return SimulatedScenario(scenario, jobs)


@dataclass(slots=True)
class ReplayResult:
    """Alerts of one replay and what it covered.

    Attributes
    ----------
    alerts
        Every alert, in the order the detector raised them.
    seconds
        Seconds evaluated (all jobs).
    job_seconds
        Seconds of the scenario times its jobs.
    machine_seconds
        Machines times scenario seconds, over the jobs.
    samples, events
        Samples and events placed in the windows.
    detect_cpu_s
        CPU seconds of ingestion and evaluation only.
    simulate_cpu_s
        CPU seconds of simulation during this replay (0 when the deliveries were cached).
    """

    alerts: list[Alert] = field(default_factory=list)
    seconds: int = 0
    job_seconds: int = 0
    machine_seconds: float = 0.0
    samples: int = 0
    events: int = 0
    detect_cpu_s: float = 0.0
    simulate_cpu_s: float = 0.0


def replay(
    simulated: SimulatedScenario | Scenario,
    factory: DetectorFactory,
    *,
    grace_s: int = DEFAULT_GRACE_S,
    events: bool = True,
    progress: Progress | None = None,
    interval_s: int = 1,
) -> ReplayResult:
    """Run a fresh detector from ``factory`` over each job of the scenario.

    Parameters
    ----------
    simulated
        A scenario, or one already compiled (and maybe cached) by :func:`simulate`.
    factory
        Builds the detector of each job.
    grace_s
        Seconds each second waits for late samples before it is evaluated.
    events
        Hand the agents' events (XID, link down …) to the window; False drops them, as a
        canonical table does.
    progress
        Called after each chunk with the seconds done and the total of all jobs.
    interval_s
        Sampling interval the detector sees (:class:`Resampler`); 1 replays every second.
    """
    if grace_s < 0:
        raise ValueError(f"grace_s is {grace_s!r}: expected 0 or more seconds")
    if isinstance(simulated, Scenario):
        simulated = simulate(simulated)
    result = ReplayResult()
    total = sum(job.plan.duration_s for job in simulated.jobs)
    done = 0
    for job in simulated.jobs:
        before = job.simulate_cpu_s
        _replay_job(job, factory, grace_s, events, result, progress, done, total, interval_s)
        result.simulate_cpu_s += job.simulate_cpu_s - before
        done += job.plan.duration_s
    return result


class _JobReplay:
    """Window, detector and evaluation clock of one job."""

    def __init__(
        self, job: SimulatedJob, detector: JobDetector, grace_s: int, interval_s: int = 1
    ) -> None:
        plan = job.plan
        layout = plan.layout
        self.resampler = (
            Resampler(len(layout.machines), layout.series_metric, interval_s, grace_s)
            if interval_s > 1
            else None
        )
        self.plan = plan
        self.detector = detector
        self.grace_s = grace_s
        self.window = JobWindow(plan.spec.name, horizon_s=detector.horizon_s)
        # Machines in index order and series in (metric, device) order: the order
        # detectors.offline registers them from a table's sorted categories.
        for i, name in enumerate(layout.machines):
            self.window.machine_id(name, layout.groups[i], layout.domains[i])
        self.series_ids = np.empty(layout.n_series, dtype=np.int64)
        pairs = list(zip(layout.series_metric, layout.series_device, strict=True))
        for s in sorted(range(len(pairs)), key=lambda i: pairs[i]):
            self.series_ids[s] = self.window.series_id(*pairs[s])
        self.sec0 = math.floor(job.origin) + 1  # window second of simulator second 0
        self.data_secs: list[int] = []  # delivery seconds that brought data, increasing
        self.next_eval: int | None = None
        self.alerts: list[Alert] = []
        self.evaluated = 0
        self.cpu = 0.0  # process seconds of the window and the detector

    def ingest(self, chunk: ChunkData, second: int, event_rows: list[EventRow]) -> int:
        """Place what second ``second`` delivers; returns the samples placed.

        Only the window's own work is timed (``self.cpu``), not unpacking the simulator's rows.
        """
        window = self.window
        clock = time.process_time
        placed = 0
        began = clock()
        for row in event_rows:
            # A batch that carries events: add_batch takes them (and marks its machine seen,
            # which matters when the batch holds nothing else).
            window.add_batch(
                NodeBatch(
                    job=window.job,
                    node=self.plan.layout.machines[row.machine],
                    ts=float(self.sec0 + row.second),
                    labels=self.plan.layout.labels(row.machine),
                    events=list(row.events),
                )
            )
        self.cpu += clock() - began
        samples: Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]
        if self.resampler is None:
            samples = chunk.batches(second)
        else:
            for measured, machines, series, values in chunk.batches(second, self.resampler.rate):
                self.resampler.add(measured, machines, series, values)
            samples = self.resampler.due(second, final=second == self.plan.duration_s - 1)
        for measured, machines, series, values in samples:
            cols = self.series_ids[series]
            began = clock()
            window.add_arrays(self.sec0 + measured, machines, cols, values)
            self.cpu += clock() - began
            placed += len(values)
        if placed or event_rows:
            self.data_secs.append(second)
            if self.next_eval is None:
                self.next_eval = second
        return placed

    def advance(self, up_to: int) -> None:
        """Evaluate the due seconds up to ``up_to`` (simulator seconds), in order.

        As :func:`detectors.offline.detect_table` does: a second is evaluated when data came in
        it, or when data came less than ``horizon_s`` seconds before it and more data followed
        (a job that went quiet is evaluated until its data resumes, or not past its last data);
        a longer gap is jumped.
        """
        horizon = self.window.horizon_s
        while self.next_eval is not None and self.next_eval <= up_to:
            now = self.next_eval
            i = bisect.bisect_right(self.data_secs, now) - 1
            last = self.data_secs[i]
            if now != last:
                if now - last >= horizon:
                    has_next = i + 1 < len(self.data_secs)
                    self.next_eval = self.data_secs[i + 1] if has_next else up_to + 1
                    continue
                if self.data_secs[-1] <= now:
                    return  # evaluated only if more data comes
            began = time.process_time()
            self.alerts.extend(self.detector.evaluate(self.window, self.sec0 + now))
            self.cpu += time.process_time() - began
            self.evaluated += 1
            self.next_eval = now + 1

    def finish(self) -> None:
        """The job's data ended: tell the detector at its last evaluated second, as the
        service does when a job stops reporting (:func:`detectors.base.finish_of`)."""
        if self.next_eval is None or self.evaluated == 0:
            return
        began = time.process_time()
        self.alerts.extend(finish_of(self.detector, self.window, self.sec0 + self.next_eval - 1))
        self.cpu += time.process_time() - began


def _replay_job(
    job: SimulatedJob,
    factory: DetectorFactory,
    grace_s: int,
    events: bool,
    result: ReplayResult,
    progress: Progress | None,
    done_before: int,
    total: int,
    interval_s: int = 1,
) -> None:
    began = time.process_time()
    state = _JobReplay(job, factory(), grace_s, interval_s)
    state.cpu += time.process_time() - began
    samples = 0
    n_events = 0
    for chunk in job.iter_chunks():
        by_second: dict[int, list[EventRow]] = {}
        if events:
            for row in chunk.event_rows:
                by_second.setdefault(row.deliver, []).append(row)
        for second in range(chunk.first, chunk.stop):
            rows = by_second.get(second, [])
            n_events += sum(len(r.events) for r in rows)
            samples += state.ingest(chunk, second, rows)
            state.advance(second - grace_s)
        if progress is not None:
            progress(done_before + chunk.stop, total)
    state.advance(job.plan.duration_s - 1)
    state.finish()
    result.alerts.extend(state.alerts)
    result.seconds += state.evaluated
    result.job_seconds += job.plan.duration_s
    result.machine_seconds += float(job.plan.spec.machines * job.plan.duration_s)
    result.samples += samples
    result.events += n_events
    result.detect_cpu_s += state.cpu
