"""Runs submitted what-if analyses in the background and stores their reports.

A small thread pool, owned by the API's app (``minder.api.app``) and off its request threads: an
analysis is mostly numpy work (the ST trace takes about 0.1 s, the SE trace 0.2 s), and while one
runs the request threads' latency stays within the interpreter's 5 ms switch interval (measured:
a 1 ms sleep took 4.5 ms at p99 during the SE analysis), so a process pool's start-up, pickling
and crash handling would buy nothing yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge

from minder.core.errors import MinderError, ValidationError
from minder.service.whatif_inputs import relative_to_roots
from minder.storage import (
    SessionFactory,
    WhatIfStatus,
    WhatIfSummary,
    create_report,
    fail_report,
    finish_report,
    list_reports,
    mark_running,
)
from whatif import WhatIfReport, analyze_path

logger = logging.getLogger(__name__)

JOB_NAME_MAX_LEN = 255
"""Longest job name stored (and used as the gauge's label)."""

AnalyzeFn = Callable[..., WhatIfReport]
"""``analyze_path(source, meta, what_ifs=...)``: what the runner calls."""


class WhatIfMetrics:
    """The what-if collectors of one registry: S per job and reports per status.

    Use :meth:`on`: apps built on the same registry (tests, reloads) share one instance instead of
    registering the names twice.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.slowdown = Gauge(
            "minder_whatif_slowdown",
            "S = T_orig / T_ideal of the job's latest what-if report (1 = no straggling)",
            ["job_id"],
            registry=registry,
        )
        self.waste = Gauge(
            "minder_whatif_waste_ratio",
            "Share of the job's GPU time lost to stragglers, 1 - 1/S, of its latest report",
            ["job_id"],
            registry=registry,
        )
        self.verdict = Gauge(
            "minder_whatif_verdict_info",
            "1 for the root cause named by the job's latest what-if report",
            ["job_id", "verdict"],
            registry=registry,
        )
        self._verdicts: dict[str, str] = {}
        self._lock = threading.Lock()
        self.reports = Counter(
            "minder_whatif_reports",
            "What-if reports that reached each status",
            ["status"],
            registry=registry,
        )
        for status in WhatIfStatus:
            self.reports.labels(status=status.value)

    def set_job(self, job: str, slowdown: float, verdict: str | None) -> None:
        """Export a job's latest S, waste and verdict (its previous verdict's series goes)."""
        self.slowdown.labels(job).set(slowdown)
        self.waste.labels(job).set(1.0 - 1.0 / slowdown if slowdown > 0 else 0.0)
        with self._lock:
            previous = self._verdicts.pop(job, None)
            if previous is not None and previous != verdict:
                with contextlib.suppress(KeyError):
                    self.verdict.remove(job, previous)
            if verdict:
                self.verdict.labels(job, verdict).set(1)
                self._verdicts[job] = verdict

    @classmethod
    def on(cls, registry: CollectorRegistry) -> WhatIfMetrics:
        """The collectors registered on ``registry``, registering them the first time.

        Raises
        ------
        MinderError
            When another collector of ``registry`` already uses one of the names.
        """
        with _REGISTRY_LOCK:
            metrics = _BY_REGISTRY.get(registry)
            if metrics is None:
                try:
                    metrics = cls(registry)
                except ValueError as exc:
                    raise MinderError(
                        f"cannot register the what-if metrics on this registry: {exc}"
                    ) from None
                _BY_REGISTRY[registry] = metrics
            return metrics


_BY_REGISTRY: WeakKeyDictionary[CollectorRegistry, WhatIfMetrics] = WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class AnalysisTask:
    """One submitted analysis.

    Attributes
    ----------
    report_id
        The stored report it fills.
    traces, meta
        The files, as :func:`whatif.analyze_path` takes them.
    what_ifs
        Custom what-if specs (``"pp-comm:free"``), already parsed once to check them.
    job
        The job named by the client; the trace's name when ``None``.
    scratch
        A directory of uploaded files to remove once the analysis is over.
    """

    report_id: str
    traces: tuple[Path, ...]
    meta: Path | None = None
    what_ifs: tuple[str, ...] = ()
    job: str | None = None
    scratch: Path | None = None


class RunnerStoppedError(MinderError):
    """The runner is shut down and takes no analysis (HTTP 503)."""


class RunnerBusyError(MinderError):
    """Too many analyses are running or waiting to take another one (HTTP 503)."""


class WhatIfRunner:
    """Stores submitted analyses as ``pending`` and runs them on a bounded thread pool.

    Parameters
    ----------
    session_factory
        Opens the sessions that record each status change.
    metrics
        Where S and the status counts go.
    workers
        Analyses run at once (1–4); the rest wait in submission order.
    max_backlog
        Analyses running or waiting at once; more are refused (each may hold an upload on disk).
    analyze
        The analysis (:func:`whatif.analyze_path`; replaceable in tests).
    shown_roots
        Directories whose paths a stored error names relative to them (the what-if roots).
    """

    def __init__(
        self,
        session_factory: SessionFactory,
        metrics: WhatIfMetrics,
        *,
        workers: int = 1,
        max_backlog: int = 32,
        analyze: AnalyzeFn = analyze_path,
        shown_roots: Sequence[Path] = (),
    ) -> None:
        if not 1 <= workers <= 4:
            raise ValidationError(f"what-if workers {workers} out of range: expected 1..4")
        if max_backlog < workers:
            raise ValidationError(
                f"what-if backlog {max_backlog} is smaller than the {workers} worker(s)"
            )
        self._max_backlog = max_backlog
        self._sessions = session_factory
        self._metrics = metrics
        self._workers = workers
        self._analyze = analyze
        self._shown_roots = tuple(shown_roots)
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._queued: dict[Future[None], AnalysisTask] = {}

    def start(self) -> None:
        """Open the pool (again after :meth:`shutdown`); a no-op while it is open."""
        with self._lock:
            if self._executor is not None:
                return
            self._executor = ThreadPoolExecutor(
                max_workers=self._workers, thread_name_prefix="minder-whatif"
            )
        self.restore_gauges()

    def restore_gauges(self, limit: int = 500) -> int:
        """Set each job's S gauge from its newest stored report, so a restart loses none.

        Returns the number of jobs restored; a database that cannot be read is logged, not
        raised (the API still starts and ``/ready`` reports the database).
        """
        try:
            with self._sessions() as session:
                done, _ = list_reports(session, status=WhatIfStatus.DONE, limit=limit)
        except Exception:
            logger.exception("cannot restore the what-if gauges from the database")
            return 0
        restored: set[str] = set()
        for summary in done:  # newest first: the first report of a job is its latest
            if summary.job and summary.slowdown is not None and summary.job not in restored:
                self._metrics.set_job(summary.job, summary.slowdown, summary.verdict)
                restored.add(summary.job)
        return len(restored)

    def check_capacity(self) -> None:
        """Raise :class:`RunnerBusyError` when the backlog is full (before receiving an upload)."""
        with self._lock:
            backlog = len(self._queued)
        if backlog >= self._max_backlog:
            raise RunnerBusyError(
                f"{backlog} what-if analyses are running or waiting, the most this server "
                "holds: submit again later"
            )

    def submit(self, task: AnalysisTask, source: str) -> WhatIfSummary:
        """Store the report as ``pending`` (committed) and queue its analysis.

        Raises
        ------
        RunnerBusyError
            When the backlog is full; nothing is stored.
        RunnerStoppedError
            When the runner is shut down; the report is then stored as ``failed``.
        """
        self.check_capacity()
        with self._sessions.begin() as session:
            summary = create_report(session, source, job=task.job, report_id=task.report_id)
        self._metrics.reports.labels(status=WhatIfStatus.PENDING.value).inc()
        with self._lock:
            executor = self._executor
            if executor is not None:
                future = executor.submit(self._run, task)
                self._queued[future] = task
                future.add_done_callback(self._forget)
        if executor is None:
            message = "the server is shutting down and took no new analysis: submit it again"
            self._fail(task, message)
            raise RunnerStoppedError(message)
        return summary

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._queued.pop(future, None)

    def shutdown(self) -> None:
        """Stop taking analyses, let the running ones finish, fail the queued ones.

        A queued report becomes ``failed`` with a message saying the server stopped, so no
        submission stays ``pending`` forever.
        """
        with self._lock:
            executor, self._executor = self._executor, None
            queued = list(self._queued.items())
        if executor is None:
            return
        cancelled = [task for future, task in queued if future.cancel()]
        executor.shutdown(wait=True)
        for task in cancelled:
            self._fail(task, "the server stopped before the analysis ran: submit it again")

    def _run(self, task: AnalysisTask) -> None:
        try:
            with self._sessions.begin() as session:
                mark_running(session, task.report_id)
        except Exception as exc:
            logger.exception("what-if report %s cannot start", task.report_id)
            self._fail(task, f"the analysis could not start: {exc}")
            return
        self._metrics.reports.labels(status=WhatIfStatus.RUNNING.value).inc()
        logger.info("what-if report %s: analysing %s", task.report_id, task.traces[0])
        try:
            report = self._analyze(list(task.traces), task.meta, what_ifs=list(task.what_ifs))
            job = (task.job or report.job or task.report_id)[:JOB_NAME_MAX_LEN]
            with self._sessions.begin() as session:
                finish_report(
                    session,
                    task.report_id,
                    report.to_dict(),
                    report.slowdown,
                    report.verdict.cause,
                    job,
                )
        except (MinderError, OSError) as exc:  # bad input: TraceError, missing file, …
            self._fail(task, str(exc) or type(exc).__name__)
        except Exception as exc:
            logger.exception("what-if report %s: the analysis raised", task.report_id)
            self._fail(task, f"internal error ({type(exc).__name__}): {exc}")
        else:
            self._metrics.set_job(job, report.slowdown, report.verdict.cause)
            self._metrics.reports.labels(status=WhatIfStatus.DONE.value).inc()
            logger.info(
                "what-if report %s: job %s S=%.4f verdict %s",
                task.report_id,
                job,
                report.slowdown,
                report.verdict.cause,
            )
        finally:
            self._remove_scratch(task)

    def _fail(self, task: AnalysisTask, message: str) -> None:
        if task.scratch is not None:
            # uploaded files are known to the client by name: the server's directory is noise
            message = message.replace(f"{task.scratch}{os.sep}", "")
        # a server file by its path under its root: the server's layout is not the client's
        message = relative_to_roots(message, self._shown_roots)
        logger.warning("what-if report %s failed: %s", task.report_id, message)
        try:
            with self._sessions.begin() as session:
                fail_report(session, task.report_id, message)
        except Exception:
            logger.exception("what-if report %s: cannot store its failure", task.report_id)
        else:
            self._metrics.reports.labels(status=WhatIfStatus.FAILED.value).inc()
        self._remove_scratch(task)

    @staticmethod
    def _remove_scratch(task: AnalysisTask) -> None:
        if task.scratch is not None:
            shutil.rmtree(task.scratch, ignore_errors=True)
