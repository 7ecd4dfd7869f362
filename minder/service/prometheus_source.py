"""Prometheus as a live source of the detection service (docs/sources.md §8).

Where dcgm-exporter and node_exporter are already scraped into Prometheus, ``minder serve
--source prometheus`` needs no agent and no Kafka: :class:`PrometheusPoller` reads the newest
step(s) every ``step_s`` through :class:`collectors.prometheus.PrometheusReader`, builds one
:class:`~minder.core.records.NodeBatch` per machine and step (``interval_s = step_s``, ``ts`` the
step's time) and hands them to :meth:`DetectionService.ingest` and :meth:`~DetectionService.tick`,
as the Kafka worker does with the batches it consumes.

It reads ``lag_s`` behind now, so that the step's scrapes have landed. Nothing is lost silently:
a failed poll (Prometheus unreachable, a refused query, partial data) leaves the range unread and
the next poll reads it again together with the new steps, up to ``max_catchup_s`` back; steps
older than that are skipped, logged and counted (``minder_source_skipped_seconds_total``), and
every failure is counted by reason (``minder_source_errors_total{source="prometheus"}``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from collectors.prometheus import PrometheusError, PrometheusReader
from minder.service.engine import DetectionService

if TYPE_CHECKING:
    from minder.config import PrometheusSourceSettings

logger = logging.getLogger(__name__)

SOURCE = "prometheus"
"""The ``source`` label of this source's series."""


class SourceMetrics:
    """The counters of a polled metrics source, on the service's registry.

    No label is named ``job`` or ``instance`` (docs/metrics.md): ``source`` names the source.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.errors = Counter(
            "minder_source_errors_total",
            "Failed polls of a metrics source, by source and reason (unreachable, refused, "
            "too_big, partial_data, bad_answer); the range is read again at the next poll",
            ["source", "reason"],
            registry=registry,
        )
        self.skipped = Counter(
            "minder_source_skipped_seconds_total",
            "Seconds of data a source did not read back after failed polls (beyond its "
            "catch-up bound)",
            ["source"],
            registry=registry,
        )
        self.batches = Counter(
            "minder_source_batches_total",
            "Node batches a polled source handed to detection",
            ["source"],
            registry=registry,
        )
        self.last = Gauge(
            "minder_source_last_timestamp_seconds",
            "Data time of the newest step a polled source has read",
            ["source"],
            registry=registry,
        )


class PrometheusPoller:
    """Polls Prometheus every step and feeds the detection service.

    Parameters
    ----------
    reader
        Reads the steps (its ``step_s`` is the poll interval and the batches' interval).
    service
        Receives the batches; ``ingest`` then ``tick`` after each poll.
    lag_s
        Read the steps up to ``now - lag_s``: scrapes of the last seconds may not have landed.
    max_catchup_s
        After failed polls, at most this much of the missed range is read again.
    clock
        Wall-clock seconds (tests pass a clock they move).
    """

    def __init__(
        self,
        reader: PrometheusReader,
        service: DetectionService,
        *,
        lag_s: float = 30.0,
        max_catchup_s: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (math.isfinite(lag_s) and lag_s >= 0):
            raise ValueError(f"lag_s {lag_s!r}: expected seconds >= 0")
        if not (math.isfinite(max_catchup_s) and max_catchup_s > 0):
            raise ValueError(f"max_catchup_s {max_catchup_s!r}: expected positive seconds")
        self.reader = reader
        self.service = service
        self.step_s = reader.step_s
        self.lag_s = float(lag_s)
        self.max_steps = max(1, math.floor(max_catchup_s / self.step_s))
        self.clock = clock
        self.metrics = SourceMetrics(service.metrics.registry)
        for reason in ("unreachable", "refused", "too_big", "partial_data", "bad_answer"):
            self.metrics.errors.labels(source=SOURCE, reason=reason)  # exported at 0
        self.metrics.skipped.labels(source=SOURCE)
        self.metrics.batches.labels(source=SOURCE)
        self._next: float | None = None
        self._failures = 0
        self._ok = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    @classmethod
    def from_settings(
        cls, settings: PrometheusSourceSettings, service: DetectionService
    ) -> PrometheusPoller:
        """A poller per the ``MINDER_PROMETHEUS__*`` settings.

        Raises
        ------
        ValidationError
            No URL, or a bad matcher or label.
        """
        from minder.core.errors import ValidationError  # noqa: PLC0415

        if settings.url is None:
            raise ValidationError(
                "the Prometheus source needs MINDER_PROMETHEUS__URL, e.g. http://prometheus:9090"
            )
        reader = PrometheusReader(
            settings.url,
            step_s=settings.step_s,
            matchers=settings.match,
            job_labels=settings.job_labels,
            machine_labels=settings.machine_labels,
            default_job=settings.default_job,
            rate_window_s=settings.rate_window_s,
            timeout_s=settings.timeout_s,
            bearer_token=settings.bearer_token,
        )
        return cls(reader, service, lag_s=settings.lag_s, max_catchup_s=settings.max_catchup_s)

    @property
    def ready(self) -> bool:
        """True when the last poll read Prometheus successfully."""
        return self._ok

    @property
    def next_step(self) -> float | None:
        """Data time of the oldest step not read yet (None before the first poll)."""
        return self._next

    def poll_once(self) -> int:
        """Read the steps due since the last successful poll and feed them to detection;
        return the number of batches handed over (0 after a failure, which is counted)."""
        self.polls += 1
        newest = math.floor((self.clock() - self.lag_s) / self.step_s) * self.step_s
        if self._next is None:
            self._next = newest  # start with the newest complete step
        if newest < self._next:
            self.service.tick()  # nothing new: idle jobs still retire, late seconds evaluate
            return 0
        start = self._next
        oldest = newest - (self.max_steps - 1) * self.step_s
        if start < oldest:
            skipped = oldest - start
            self.metrics.skipped.labels(source=SOURCE).inc(skipped)
            logger.warning(
                "Prometheus source: %.0f s of data (from %.0f) could not be read in time and are "
                "skipped; reading from %.0f",
                skipped,
                start,
                oldest,
            )
            start = self._next = oldest  # given up for good: counted once
        try:
            result = self.reader.read(start, newest, cached_discovery=True)
        except PrometheusError as exc:
            self.metrics.errors.labels(source=SOURCE, reason=exc.reason).inc()
            self._failures += 1
            self._ok = False
            log = logger.warning if self._failures == 1 else logger.debug
            log("Prometheus source: poll failed (%s); the range is read again next time", exc)
            self.service.tick()
            return 0
        if self._failures:
            logger.info("Prometheus source: read again after %d failed poll(s)", self._failures)
        self._failures = 0
        batches = result.batches(self.step_s)
        self.service.ingest(batches)
        self._next = newest + self.step_s
        self.metrics.batches.labels(source=SOURCE).inc(len(batches))
        self.metrics.last.labels(source=SOURCE).set(newest)
        # Ready once what was read is handed over and counted (a check of /ready, then of the
        # counters, must not see the read without its batches).
        self._ok = True
        self.service.tick()
        return len(batches)

    def _run(self) -> None:
        logger.info(
            "Prometheus source: polling %s every %g s, %g s behind now",
            self.reader.url,
            self.step_s,
            self.lag_s,
        )
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                logger.exception("Prometheus source: poll failed unexpectedly; retrying")
            # Wake just after the next step is due (its time plus the lag).
            now = self.clock()
            due = (math.floor((now - self.lag_s) / self.step_s) + 1) * self.step_s + self.lag_s
            self._stop.wait(min(self.step_s, max(0.05, due - now)))
        logger.info("Prometheus source stopped")

    def start(self) -> None:
        """Poll in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="minder-prometheus", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and close the HTTP connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.reader.close()
