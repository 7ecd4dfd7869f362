"""Where alerts go: the database (with dedup), the alerts topic, scheduler webhooks."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

import httpx
import orjson

from minder.core.alert import Alert
from minder.service.engine import JobSnapshot
from minder.service.telemetry import ServiceMetrics
from minder.storage.alerts import count_active_alerts_by_kind, record_alert
from minder.storage.engine import SessionFactory, read_only
from minder.storage.jobs import save_scores, upsert_job_machines
from minder.storage.records import MachineInfo, ScoreRow
from minder.stream.producer import AlertPublisher

logger = logging.getLogger(__name__)


class SqlStateStore:
    """The service's durable state in the SQL database (see ``minder.storage``)."""

    def __init__(self, sessions: SessionFactory) -> None:
        self.sessions = sessions

    def record_alert(self, alert: Alert) -> tuple[Alert, bool]:
        with self.sessions.begin() as session:
            return record_alert(session, alert)

    def open_alert_counts(self) -> dict[tuple[str, str], int]:
        with self.sessions() as session:
            return count_active_alerts_by_kind(read_only(session))

    def save_job(self, job: JobSnapshot) -> None:
        machines = [
            MachineInfo(
                name=m.machine,
                group=m.group,
                domain=m.domain,
                last_seen_ts=m.last_seen_ts or None,
            )
            for m in job.machines
        ]
        rows = [
            ScoreRow(machine=m.machine, metric=metric, score=score, device=device)
            for m in job.machines
            for metric, (score, device) in m.per_metric.items()
        ]
        with self.sessions.begin() as session:
            upsert_job_machines(session, job.job, machines, job.ts)
            save_scores(session, job.job, rows, job.ts)


class KafkaAlertSink:
    """Publishes each new alert to ``minder.alerts.v1`` (key = job)."""

    name = "kafka"

    def __init__(self, publisher: AlertPublisher) -> None:
        self.publisher = publisher

    def deliver(self, alert: Alert) -> None:
        self.publisher.publish_alert(alert)


class WebhookSink:
    """POSTs each new alert as JSON to the scheduler's webhooks, off the detection thread.

    Deliveries are retried with back-off; the queue is bounded so a dead webhook cannot grow
    memory without bound: when full, the oldest alert waiting is dropped, logged and counted.
    """

    name = "webhook"

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        metrics: ServiceMetrics | None = None,
        max_queue: int = 1000,
        client: httpx.Client | None = None,
    ) -> None:
        self.urls = list(urls)
        self.retries = retries
        self.metrics = metrics
        self._queue: queue.Queue[Alert] = queue.Queue(maxsize=max_queue)
        self._stopping = threading.Event()
        self._deadline: float | None = None
        self._client = client or httpx.Client(timeout=timeout_s)
        self._thread = threading.Thread(target=self._run, name="minder-webhooks", daemon=True)
        self._thread.start()

    def deliver(self, alert: Alert) -> None:
        while True:
            try:
                self._queue.put_nowait(alert)
                return
            except queue.Full:
                try:
                    dropped = self._queue.get_nowait()
                except queue.Empty:
                    continue
                logger.error("webhook queue full: alert %s dropped", dropped.id)
                self._count("dropped")

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued within ``timeout_s``, then stop; the rest is dropped, counted."""
        self._deadline = time.monotonic() + timeout_s
        self._stopping.set()
        self._thread.join(timeout_s + 1.0)
        left = self._queue.qsize()
        if left:
            logger.error("webhook sink stopped with %d alert(s) undelivered", left)
            for _ in range(left):
                self._count("dropped")
        if not self._thread.is_alive():
            self._client.close()

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _run(self) -> None:
        while not (self._stopping.is_set() and (self._queue.empty() or self._past_deadline())):
            try:
                alert = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            for url in self.urls:
                try:
                    self._post(url, alert)
                except Exception:  # a bad URL or payload must not kill the delivery thread
                    logger.exception("webhook %s: alert %s not delivered", url, alert.id)
                    self._count("failed")

    def _post(self, url: str, alert: Alert) -> None:
        # orjson writes NaN as null and takes numpy values: evidence is not always sanitised.
        payload = orjson.dumps(alert.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY)
        headers = {"Content-Type": "application/json"}
        for attempt in range(1, self.retries + 1):
            try:
                response = self._client.post(url, content=payload, headers=headers)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                logger.warning(
                    "webhook %s attempt %d for alert %s: %s", url, attempt, alert.id, exc
                )
                if attempt < self.retries and not self._past_deadline():
                    self._stopping.wait(min(0.5 * 2**attempt, 5.0))
                    continue
                break
            else:
                self._count("delivered")
                return
        logger.error("webhook %s gave up on alert %s after %d attempt(s)", url, alert.id, attempt)
        self._count("failed")

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.alert_deliveries.labels(sink=self.name, outcome=outcome).inc()
