"""Job state written off the poll loop: only the machines whose state changed, from a thread.

The detection loop captures a job's state every few data seconds (:class:`JobCapture`: names,
labels, last-seen times and the score matrix, copied as numpy arrays: a few milliseconds for
10,000 machines) and hands it to a :class:`StateWriter`. The writer keeps the latest capture per
job (a newer one replaces a capture not yet written: counted in
``minder_state_captures_superseded_total``), compares it with what it last wrote, and writes
only what changed:

- a score (machine, metric) that moved by at least ``score_tolerance`` from the value last
  written, changed device, appeared or disappeared: that score row is upserted or deleted;
- a machine whose top score (value, metric or device, by the same tolerance) changed, or
  whose ``last_seen_ts`` moved by at least ``last_seen_every_s``: its machine row;
- the job's machines, labels, metrics or devices changed (the first write of a job on this
  worker too): the whole job is written, replacing its stored state.

A stored score is therefore within ``score_tolerance`` of the live one (its ``score_ts`` says
when it was written), and a stored ``last_seen_ts`` within ``last_seen_every_s``.

A job's job-level findings (:class:`~minder.storage.records.JobFinding`: a metric on which its
machines are not peers, a job too small to have peers) go the same way, through
:meth:`StateWriter.submit_findings`: the detection loop hands over a job's whole set only when
it changed (:class:`~minder.service.engine.DetectionService` decides), and the writer replaces
the stored set. A set that could not be written is tried again with the job's next capture.
A job's latest hang analysis (:class:`~minder.core.hang.HangAnalysis`) goes the same way,
through :meth:`StateWriter.submit_hang`, whenever the detector makes a new one: the store keeps
one per job.

The jobs' lifecycle (docs/operations.md, "Job lifecycle") goes the same way too: the detection
loop reports each job's status and the machines in it now (:meth:`StateWriter.submit_job_states`:
when they change, and every few seconds for the jobs it holds, so the store knows the worker is
alive), and asks for the stored jobs to be aged (:meth:`StateWriter.submit_sweep`). Reports are
written after the captures handed over before them, the latest per job; a report that could not
be written is tried again.

Writes are
timed and counted (``minder_state_writes_total{outcome}``, ``minder_state_write_seconds``,
``minder_state_machines_written_total``); a failed write is logged and the next capture of the
job carries its changes (they are compared with the last write that succeeded). :meth:`close`
writes what is pending before it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import isnan
from typing import Protocol

import numpy as np

from minder.core.hang import HangAnalysis
from minder.service.telemetry import ServiceMetrics
from minder.storage.records import JobFinding, JobReport

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class MachineSnapshot:
    """A machine's current top score and the metric/device behind it."""

    machine: str
    group: str
    domain: str
    last_seen_ts: float
    score: float
    metric: str
    device: str
    per_metric: dict[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(slots=True)
class JobSnapshot:
    """What the service knows of one job at one second."""

    job: str
    ts: float
    machines: list[MachineSnapshot]


class JobStateStore(Protocol):
    """Where job state goes: the whole job, or some of its machines."""

    def save_job(self, job: JobSnapshot) -> None:
        """Replace the stored machines and current scores of one job."""
        ...


class ChangeStateStore(JobStateStore, Protocol):
    """A store that can also write what changed in a job and leave the rest."""

    def save_changes(
        self,
        job: str,
        ts: float,
        machines: Sequence[MachineSnapshot],
        scores: Sequence[tuple[str, str, float, str]],
        removed: Sequence[tuple[str, str]],
    ) -> None:
        """Upsert ``machines`` of ``job`` (labels, last seen, top score: their ``per_metric``
        is empty), upsert the ``(machine, metric, score, device)`` ``scores`` and delete the
        ``(machine, metric)`` scores ``removed``, as of ``ts``."""
        ...


class FindingsStateStore(Protocol):
    """A store that also keeps each job's current job-level findings."""

    def save_job_findings(self, job: str, findings: Sequence[JobFinding], ts: float) -> None:
        """Replace the stored findings of ``job`` with ``findings`` (possibly none), as of data
        time ``ts``."""
        ...


class HangStateStore(Protocol):
    """A store that also keeps each job's latest hang analysis."""

    def save_hang_analysis(self, job: str, analysis: HangAnalysis, ts: float) -> None:
        """Keep ``analysis`` as ``job``'s latest, as of data time ``ts`` (replacing the one
        before)."""
        ...


class JobStatesStore(Protocol):
    """A store that also keeps each job's lifecycle status."""

    def report_job_states(self, reports: Sequence[JobReport], now: float) -> None:
        """Store the ``reports`` of the jobs' status at wall time ``now``
        (:func:`minder.storage.jobs.report_job_states`)."""
        ...

    def sweep_jobs(
        self, now: float, stale_after_s: float, retention_s: float
    ) -> tuple[list[str], list[str]]:
        """Age the stored jobs (:func:`minder.storage.jobs.sweep_jobs`); the jobs that became
        idle, and those that ended."""
        ...


_Findings = tuple[float, tuple[JobFinding, ...]]
"""A job's findings to write: ``(data time, the whole set)``."""
_Hang = tuple[float, HangAnalysis]
"""A job's latest hang analysis to write: ``(data time, the analysis)``."""
_Report = tuple[float, JobReport]
"""A job's status to write: ``(wall time of the report, the report)``."""
_Sweep = tuple[float, float, float]
"""An ageing of the stored jobs: ``(wall time, stale_after_s, retention_s)``."""


@dataclass(slots=True)
class JobCapture:
    """A job's state at one evaluated second, detached from the live window.

    ``scores`` is ``(metrics, machines)``, NaN where a machine has no score on a metric;
    ``devices`` the index into ``device_names[metric]`` of the device behind each score (-1:
    none); ``last_seen`` 0 for a machine never seen.
    """

    job: str
    ts: float
    names: list[str]
    groups: list[str]
    domains: list[str]
    last_seen: np.ndarray
    metrics: tuple[str, ...]
    scores: np.ndarray
    devices: np.ndarray
    device_names: tuple[tuple[str, ...], ...]

    @classmethod
    def build(
        cls,
        job: str,
        ts: float,
        machines: Sequence[tuple[str, str, str]],
        last_seen: np.ndarray,
        scores: dict[str, tuple[list[float], list[int]]],
        device_names: dict[str, Sequence[str]],
    ) -> JobCapture:
        """From the window's ``(name, group, domain)`` of every machine, their last-seen times
        and the detector's per-metric scores (shorter lists: machines without a score)."""
        n = len(machines)
        metrics = tuple(sorted(scores))
        matrix = np.full((len(metrics), n), np.nan)
        devs = np.full((len(metrics), n), -1, dtype=np.int64)
        for i, metric in enumerate(metrics):
            tops, idx = scores[metric]
            k = min(len(tops), n)
            matrix[i, :k] = np.asarray(tops[:k], dtype=np.float64)
            devs[i, :k] = np.asarray(idx[:k], dtype=np.int64)
        return cls(
            job=job,
            ts=ts,
            names=[m[0] for m in machines],
            groups=[m[1] for m in machines],
            domains=[m[2] for m in machines],
            last_seen=np.asarray(last_seen, dtype=np.float64).copy(),
            metrics=metrics,
            scores=matrix,
            devices=devs,
            device_names=tuple(tuple(device_names.get(m, ())) for m in metrics),
        )

    def tops(self) -> tuple[np.ndarray, np.ndarray]:
        """Each machine's highest score over its metrics (0 when it has none) and the metric's
        row (0 when it has none)."""
        n = len(self.names)
        if not self.metrics:
            return np.zeros(n), np.zeros(n, dtype=np.int64)
        filled = np.where(np.isnan(self.scores), -np.inf, self.scores)
        arg = np.argmax(filled, axis=0)
        top = filled[arg, np.arange(n)]
        return np.where(np.isfinite(top), top, 0.0), arg

    def best(self) -> np.ndarray:
        """Each machine's highest score over its metrics (0 when it has none)."""
        return self.tops()[0]

    def top_devices(self, arg: np.ndarray) -> np.ndarray:
        """The device index behind each machine's top score (``arg``: its metric row)."""
        return self.devices[arg, np.arange(arg.size)] if self.metrics else arg

    def _device(self, row: int, d: int) -> str:
        """The name of device ``d`` of metric row ``row`` ("" for none)."""
        names = self.device_names[row]
        return names[d] if 0 <= d < len(names) else ""

    def cells(self, mask: np.ndarray) -> list[tuple[str, str, float, str]]:
        """``(machine, metric, score, device)`` of the scores in ``mask``."""
        rows, cols = np.nonzero(mask)
        out = []
        for r, c, score, d in zip(
            rows.tolist(),
            cols.tolist(),
            self.scores[rows, cols].tolist(),
            self.devices[rows, cols].tolist(),
            strict=True,
        ):
            out.append((self.names[c], self.metrics[r], score, self._device(r, d)))
        return out

    def pairs(self, mask: np.ndarray) -> list[tuple[str, str]]:
        """``(machine, metric)`` of the cells in ``mask``."""
        rows, cols = np.nonzero(mask)
        return [
            (self.names[c], self.metrics[r])
            for r, c in zip(rows.tolist(), cols.tolist(), strict=True)
        ]

    def top(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` machines with the highest scores, highest first."""
        best = self.best()
        k = min(k, best.size)
        if k <= 0:
            return []
        idx = np.argpartition(-best, k - 1)[:k]
        idx = idx[np.argsort(-best[idx], kind="stable")]
        return [(self.names[i], float(best[i])) for i in idx]

    def machine_tops(
        self, idx: np.ndarray, top: np.ndarray, arg: np.ndarray
    ) -> list[MachineSnapshot]:
        """Machines ``idx`` with their top score only (``top``, ``arg``: :meth:`tops`) and an
        empty ``per_metric``."""
        out = []
        for i in idx.tolist():
            row = int(arg[i])
            has = bool(self.metrics) and not np.isnan(self.scores[row, i])
            device = self._device(row, int(self.devices[row, i])) if has else ""
            out.append(
                MachineSnapshot(
                    machine=self.names[i],
                    group=self.groups[i],
                    domain=self.domains[i],
                    last_seen_ts=float(self.last_seen[i]),
                    score=float(top[i]) if has else 0.0,
                    metric=self.metrics[row] if has else "",
                    device=device,
                )
            )
        return out

    def machine(self, i: int) -> MachineSnapshot:
        """Machine ``i`` as the store takes it."""
        per_metric: dict[str, tuple[float, str]] = {}
        for row, metric in enumerate(self.metrics):
            score = self.scores[row, i]
            if np.isnan(score):
                continue
            per_metric[metric] = (float(score), self._device(row, int(self.devices[row, i])))
        return self._machine_of(i, per_metric)

    def _machine_of(self, i: int, per_metric: dict[str, tuple[float, str]]) -> MachineSnapshot:
        """Machine ``i`` with its scores, summarised by its highest."""
        best = max(per_metric.items(), key=lambda kv: kv[1][0], default=("", (0.0, "")))
        return MachineSnapshot(
            machine=self.names[i],
            group=self.groups[i],
            domain=self.domains[i],
            last_seen_ts=float(self.last_seen[i]),
            score=best[1][0],
            metric=best[0],
            device=best[1][1],
            per_metric=per_metric,
        )

    def snapshot(self) -> JobSnapshot:
        """Every machine of the job (as :meth:`machine` gives each, the matrices read once)."""
        scores = self.scores.T.tolist()  # machine -> its score on each metric (NaN: none)
        devices = self.devices.T.tolist()
        metrics = list(enumerate(self.metrics))
        names = self.device_names
        machines = []
        for i, (row, devs) in enumerate(zip(scores, devices, strict=True)):
            per_metric: dict[str, tuple[float, str]] = {}
            for r, metric in metrics:
                score = row[r]
                if isnan(score):  # no score on this metric
                    continue
                d = devs[r]
                per_metric[metric] = (score, names[r][d] if 0 <= d < len(names[r]) else "")
            machines.append(self._machine_of(i, per_metric))
        return JobSnapshot(self.job, self.ts, machines)

    def same_layout(self, other: JobCapture) -> bool:
        """Same machines, labels, metrics and devices: machine ``i`` is the same in both."""
        return (
            self.metrics == other.metrics
            and self.device_names == other.device_names
            and self.names == other.names
            and self.groups == other.groups
            and self.domains == other.domains
        )


@dataclass(slots=True)
class JobChanges:
    """What changed in a job since its last write.

    ``machines``: indices of the machines whose labels, last-seen time or top score changed
    (their machine row is written); ``scores``/``removed``: ``(metrics, machines)`` masks of
    the scores that moved (upserted) or disappeared (deleted); ``top``, ``top_arg``,
    ``top_dev``: every machine's top score, its metric row and device now.
    """

    machines: np.ndarray
    scores: np.ndarray
    removed: np.ndarray
    top: np.ndarray
    top_arg: np.ndarray
    top_dev: np.ndarray

    @property
    def count(self) -> int:
        """Machines with anything to write."""
        touched = np.zeros(self.top.size, dtype=bool)
        touched[self.machines] = True
        if self.scores.size:
            touched |= (self.scores | self.removed).any(axis=0)
        return int(touched.sum())


@dataclass(slots=True)
class _Written:
    """A job as last written: its capture (cells updated as written) and machine tops."""

    capture: JobCapture
    top: np.ndarray
    top_arg: np.ndarray
    top_dev: np.ndarray
    full_ts: float  # data time of the last whole-job write
    seen_ts: float  # data time of the last capture written


class StateWriter:
    """Writes job captures to ``store``, only what changed, in a thread of its own.

    Parameters
    ----------
    store
        Where the state goes; without ``save_machines`` every write replaces the whole job.
    metrics
        Where writes are counted and timed; ``None`` counts nothing.
    background
        ``False`` writes in :meth:`submit` itself (tests, tools); the service runs it in a
        thread (:meth:`start`).
    score_tolerance
        A score is rewritten when it moved by at least this much (robust z units).
    last_seen_every_s
        A machine's last-seen time is rewritten when it moved by at least this much.
    full_after_gap_s
        A capture more than this many data seconds after the last one written is written whole:
        the job was away (its partition with another worker, which wrote rows of its own).
    full_every_s
        The whole job is written again at least this often (data seconds), so rows that another
        writer changed unseen are put right.
    """

    def __init__(
        self,
        store: JobStateStore,
        metrics: ServiceMetrics | None = None,
        *,
        background: bool = True,
        score_tolerance: float = 0.5,
        last_seen_every_s: float = 60.0,
        full_after_gap_s: float = 30.0,
        full_every_s: float = 600.0,
    ) -> None:
        if not (
            score_tolerance >= 0
            and last_seen_every_s >= 0
            and full_after_gap_s >= 0
            and full_every_s >= 0
        ):
            raise ValueError(
                f"score_tolerance={score_tolerance!r}, last_seen_every_s={last_seen_every_s!r}, "
                f"full_after_gap_s={full_after_gap_s!r}, full_every_s={full_every_s!r}: "
                "expected numbers >= 0"
            )
        self.store = store
        self.metrics = metrics
        self.background = background
        self.score_tolerance = score_tolerance
        self.last_seen_every_s = last_seen_every_s
        self.full_after_gap_s = full_after_gap_s
        self.full_every_s = full_every_s
        self._pending: dict[str, JobCapture | None] = {}  # None: forget the job
        self._pending_findings: dict[str, _Findings] = {}
        # sets whose write failed: handed back with the job's next capture
        self._findings_retry: dict[str, _Findings] = {}
        self._findings_failing: set[str] = set()
        self._pending_hangs: dict[str, _Hang] = {}
        self._hang_retry: dict[str, _Hang] = {}  # as _findings_retry
        self._hang_failing: set[str] = set()
        self._pending_reports: dict[str, _Report] = {}
        self._pending_sweep: _Sweep | None = None
        self._states_failing = False
        self._written: dict[str, _Written] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()
        self.writes = 0
        self.failures = 0
        self.machines_written = 0

    # -- the detection loop's side ---------------------------------------------------------
    def start(self) -> None:
        """Start the writer thread (``background`` writers only)."""
        if not self.background or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="minder-state-writer", daemon=True)
        self._thread.start()

    def submit(self, capture: JobCapture) -> None:
        """Hand over ``capture``; a capture of the same job not yet written is replaced. A
        findings set of the job whose write failed is handed over again with it."""
        if not self.background:
            retry = self._findings_retry.pop(capture.job, None)
            hang = self._hang_retry.pop(capture.job, None)
            self._write(capture)
            if retry is not None:
                self._write_findings(capture.job, *retry)
            if hang is not None:
                self._write_hang(capture.job, *hang)
            return
        with self._lock:
            if self._pending.get(capture.job) is not None and self.metrics is not None:
                self.metrics.state_captures_superseded.inc()
            self._pending[capture.job] = capture
            retry = self._findings_retry.pop(capture.job, None)
            if retry is not None:
                self._pending_findings.setdefault(capture.job, retry)
            hang = self._hang_retry.pop(capture.job, None)
            if hang is not None:
                self._pending_hangs.setdefault(capture.job, hang)
        self._wake.set()

    def submit_findings(self, job: str, ts: float, findings: Sequence[JobFinding]) -> None:
        """Hand over ``job``'s whole set of current findings (as of data time ``ts``) to replace
        the stored one; a set of the same job not yet written is replaced. Nothing is written
        when the store keeps no findings."""
        if getattr(self.store, "save_job_findings", None) is None:
            return
        entry = (float(ts), tuple(findings))
        if not self.background:
            self._findings_retry.pop(job, None)
            self._write_findings(job, *entry)
            return
        with self._lock:
            self._findings_retry.pop(job, None)
            self._pending_findings[job] = entry
        self._wake.set()

    def submit_hang(self, job: str, ts: float, analysis: HangAnalysis) -> None:
        """Hand over ``job``'s latest hang analysis (as of data time ``ts``) to replace the
        stored one; an analysis of the same job not yet written is replaced. Nothing is written
        when the store keeps no hang analyses."""
        if getattr(self.store, "save_hang_analysis", None) is None:
            return
        entry = (float(ts), analysis)
        if not self.background:
            self._hang_retry.pop(job, None)
            self._write_hang(job, *entry)
            return
        with self._lock:
            self._hang_retry.pop(job, None)
            self._pending_hangs[job] = entry
        self._wake.set()

    def submit_job_states(self, reports: Sequence[JobReport], now: float) -> None:
        """Hand over the ``reports`` of jobs' status, made at wall time ``now``; they are
        written after everything handed over before them, the latest per job. Nothing is
        written when the store keeps no job status."""
        if getattr(self.store, "report_job_states", None) is None or not reports:
            return
        if not self.background:
            self._write_reports({r.job: (float(now), r) for r in reports})
            return
        with self._lock:
            for report in reports:
                self._pending_reports[report.job] = (float(now), report)
        self._wake.set()

    def submit_sweep(self, now: float, stale_after_s: float, retention_s: float) -> None:
        """Ask for the stored jobs to be aged at wall time ``now`` (after the reports handed
        over before): :meth:`JobStatesStore.sweep_jobs`."""
        if getattr(self.store, "sweep_jobs", None) is None:
            return
        sweep = (float(now), float(stale_after_s), float(retention_s))
        if not self.background:
            self._write_sweep(sweep)
            return
        with self._lock:
            self._pending_sweep = sweep
        self._wake.set()

    def forget(self, job: str) -> None:
        """``job`` left this worker: drop what is pending and what was written of it (an
        analysis or a status report handed over is still written: it is the job's latest,
        whoever takes it)."""
        if not self.background:
            self._written.pop(job, None)
            self._findings_retry.pop(job, None)
            self._hang_retry.pop(job, None)
            return
        with self._lock:
            self._pending[job] = None
            self._pending_findings.pop(job, None)
            self._findings_retry.pop(job, None)
            self._hang_retry.pop(job, None)
        self._wake.set()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far is written (or failed); False on timeout."""
        if not self.background or self._thread is None:
            return not self._has_pending()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._busy or self._has_pending():
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(left, 0.1))
        return True

    def _has_pending(self) -> bool:
        return bool(
            self._pending
            or self._pending_findings
            or self._pending_hangs
            or self._pending_reports
            or self._pending_sweep is not None
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is pending (for up to ``timeout_s``), then stop the thread."""
        if self._thread is None:
            return
        if not self.flush(timeout_s):
            with self._lock:
                left = [job for job, c in self._pending.items() if c is not None]
                left += [job for job in self._pending_findings if job not in left]
                left += [job for job in self._pending_hangs if job not in left]
                left += [job for job in self._pending_reports if job not in left]
            logger.error("job state of %d job(s) not written at shutdown: %s", len(left),
                         ", ".join(job[:64] for job in left[:8]))  # fmt: skip
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._thread = None

    # -- the writer's side -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, {}
                findings, self._pending_findings = self._pending_findings, {}
                hangs, self._pending_hangs = self._pending_hangs, {}
                reports, self._pending_reports = self._pending_reports, {}
                sweep, self._pending_sweep = self._pending_sweep, None
                self._busy = bool(pending or findings or hangs or reports or sweep)
            try:
                for job, capture in pending.items():
                    if capture is None:
                        self._written.pop(job, None)
                        continue
                    try:
                        self._write(capture)
                    except Exception:  # the thread must outlive any one job's trouble
                        self.failures += 1
                        self._written.pop(job, None)  # its next capture is written whole
                        logger.exception("state writer failed on job %s", job[:64])
                # after the captures: a job's first findings follow its machines
                for job, (ts, found) in findings.items():
                    self._write_findings(job, ts, found)
                for job, (ts, analysis) in hangs.items():
                    self._write_hang(job, ts, analysis)
                # after what was handed over before them: a job's status is the last word
                if reports:
                    self._write_reports(reports)
                if sweep is not None:
                    self._write_sweep(sweep)
            finally:
                with self._idle:
                    self._busy = False
                    self._idle.notify_all()

    def changes(self, capture: JobCapture) -> JobChanges | None:
        """What to write of ``capture`` against the last write (``None``: the whole job)."""
        last = self._written.get(capture.job)
        if (
            last is None
            or not capture.same_layout(last.capture)
            or capture.ts - last.seen_ts > self.full_after_gap_s
            or capture.ts - last.full_ts >= self.full_every_s
        ):
            return None
        old = last.capture
        new_scores = capture.scores
        missing = np.isnan(new_scores)
        with np.errstate(invalid="ignore"):
            cells = np.abs(new_scores - old.scores) >= self.score_tolerance
        cells |= missing != np.isnan(old.scores)
        cells |= capture.devices != old.devices
        top, arg = capture.tops()
        dev = capture.top_devices(arg)
        machines = np.abs(top - last.top) >= self.score_tolerance
        machines |= (arg != last.top_arg) | (dev != last.top_dev)
        machines |= np.abs(capture.last_seen - old.last_seen) >= max(self.last_seen_every_s, 1e-9)
        return JobChanges(
            np.flatnonzero(machines), cells & ~missing, cells & missing, top, arg, dev
        )

    def _write(self, capture: JobCapture) -> None:
        job = capture.job
        began = time.perf_counter()
        save_changes = getattr(self.store, "save_changes", None)
        try:
            changes = self.changes(capture) if save_changes is not None else None
            if changes is None:
                self.store.save_job(capture.snapshot())
                count = len(capture.names)
            else:
                count = changes.count
                if count:
                    assert save_changes is not None
                    save_changes(
                        job,
                        capture.ts,
                        capture.machine_tops(changes.machines, changes.top, changes.top_arg),
                        capture.cells(changes.scores),
                        capture.pairs(changes.removed),
                    )
        except Exception as exc:
            self.failures += 1
            self._count("error", time.perf_counter() - began, 0)
            if job not in self._failing:
                self._failing.add(job)
                logger.exception("could not save the state of job %s", job[:64])
            else:
                logger.warning("could not save the state of job %s: %s", job[:64], str(exc)[:200])
            return
        if job in self._failing:
            self._failing.discard(job)
            logger.info("state of job %s saved again", job[:64])
        self.writes += 1
        self.machines_written += count
        self._count("ok", time.perf_counter() - began, count)
        last = self._written.get(job)
        if changes is None or last is None:
            top, arg = capture.tops()
            dev = capture.top_devices(arg)
            self._written[job] = _Written(capture, top, arg, dev, capture.ts, capture.ts)
            return
        last.seen_ts = capture.ts
        cells = changes.scores | changes.removed
        last.capture.scores[cells] = capture.scores[cells]
        last.capture.devices[cells] = capture.devices[cells]
        idx = changes.machines
        last.capture.last_seen[idx] = capture.last_seen[idx]
        last.top[idx], last.top_arg[idx], last.top_dev[idx] = (
            changes.top[idx],
            changes.top_arg[idx],
            changes.top_dev[idx],
        )

    def _write_findings(self, job: str, ts: float, findings: tuple[JobFinding, ...]) -> None:
        """Replace ``job``'s stored findings; on failure keep them for the job's next capture
        (unless a newer set is pending by then)."""
        save = getattr(self.store, "save_job_findings", None)
        if save is None:
            return
        began = time.perf_counter()
        try:
            save(job, findings, ts)
        except Exception as exc:
            self.failures += 1
            self._count("error", time.perf_counter() - began, 0)
            with self._lock:
                if job not in self._pending_findings:
                    self._findings_retry[job] = (ts, findings)
            if job not in self._findings_failing:
                self._findings_failing.add(job)
                logger.exception("could not save the findings of job %s", job[:64])
            else:
                logger.warning(
                    "could not save the findings of job %s: %s", job[:64], str(exc)[:200]
                )
            return
        if job in self._findings_failing:
            self._findings_failing.discard(job)
            logger.info("findings of job %s saved again", job[:64])
        self.writes += 1
        self._count("ok", time.perf_counter() - began, 0)

    def _write_hang(self, job: str, ts: float, analysis: HangAnalysis) -> None:
        """Keep ``analysis`` as ``job``'s latest; on failure keep it for the job's next capture
        (unless a newer one is pending by then)."""
        save = getattr(self.store, "save_hang_analysis", None)
        if save is None:
            return
        began = time.perf_counter()
        try:
            save(job, analysis, ts)
        except Exception as exc:
            self.failures += 1
            self._count("error", time.perf_counter() - began, 0)
            with self._lock:
                if job not in self._pending_hangs:
                    self._hang_retry[job] = (ts, analysis)
            if job not in self._hang_failing:
                self._hang_failing.add(job)
                logger.exception("could not save the hang analysis of job %s", job[:64])
            else:
                logger.warning(
                    "could not save the hang analysis of job %s: %s", job[:64], str(exc)[:200]
                )
            return
        if job in self._hang_failing:
            self._hang_failing.discard(job)
            logger.info("hang analysis of job %s saved again", job[:64])
        self.writes += 1
        self._count("ok", time.perf_counter() - began, 0)

    def _write_reports(self, reports: dict[str, _Report]) -> None:
        """Write the jobs' status reports (those of one wall time together); on failure keep
        them to try again (unless a newer report of the job is pending by then)."""
        save = getattr(self.store, "report_job_states", None)
        if save is None:
            return
        by_time: dict[float, list[JobReport]] = {}
        for now, report in reports.values():
            by_time.setdefault(now, []).append(report)
        began = time.perf_counter()
        try:
            for now in sorted(by_time):
                save(by_time[now], now)
        except Exception as exc:
            self.failures += 1
            self._count("error", time.perf_counter() - began, 0)
            if self.background:
                with self._lock:
                    for job, entry in reports.items():
                        self._pending_reports.setdefault(job, entry)
            if not self._states_failing:
                self._states_failing = True
                logger.exception("could not save the status of %d job(s); tried again",
                                 len(reports))  # fmt: skip
            else:
                logger.warning("could not save the status of %d job(s): %s", len(reports),
                               str(exc)[:200])  # fmt: skip
            return
        if self._states_failing:
            self._states_failing = False
            logger.info("job status saved again")
        self.writes += 1
        self._count("ok", time.perf_counter() - began, 0)

    def _write_sweep(self, sweep: _Sweep) -> None:
        """Age the stored jobs and say which became idle or ended (a failure is logged: the
        next sweep does the same)."""
        run = getattr(self.store, "sweep_jobs", None)
        if run is None:
            return
        now, stale_after_s, retention_s = sweep
        try:
            idle, ended = run(now, stale_after_s, retention_s)
        except Exception as exc:
            self.failures += 1
            logger.warning("could not age the stored jobs: %s", str(exc)[:200])
            return
        if idle:
            logger.info("%d job(s) idle: no word for %.0f s from the worker that held them (it "
                        "stopped or restarted): %s", len(idle), stale_after_s,
                        _names(idle))  # fmt: skip
        if ended:
            logger.info("%d job(s) ended: idle for the retention of %.0f s: %s", len(ended),
                        retention_s, _names(ended))  # fmt: skip

    def _count(self, outcome: str, seconds: float, machines: int) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        metrics.state_writes.labels(outcome=outcome).inc()
        metrics.state_write_seconds.observe(seconds)
        metrics.state_machines_written.inc(machines)


def _names(jobs: Sequence[str], shown: int = 8) -> str:
    """The first ``shown`` job names (each cut at 64 characters), then how many more."""
    out = ", ".join(job[:64] for job in jobs[:shown])
    return out + (f" and {len(jobs) - shown} more" if len(jobs) > shown else "")
