"""Where alerts go: the database (with dedup), the alerts topic, scheduler webhooks."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

import httpx

from minder.core.alert import Alert
from minder.service.engine import JobSnapshot
from minder.service.telemetry import ServiceMetrics
from minder.storage.alerts import record_alert
from minder.storage.engine import SessionFactory
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
        self._queue: queue.Queue[Alert | None] = queue.Queue(maxsize=max_queue)
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
                if dropped is not None:
                    logger.error("webhook queue full: alert %s dropped", dropped.id)
                    self._count("dropped")

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout_s``) and stop."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._client.close()

    def _run(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            for url in self.urls:
                self._post(url, alert)

    def _post(self, url: str, alert: Alert) -> None:
        payload = alert.to_dict()
        for attempt in range(1, self.retries + 1):
            try:
                response = self._client.post(url, json=payload)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                logger.warning(
                    "webhook %s attempt %d for alert %s: %s", url, attempt, alert.id, exc
                )
                time.sleep(min(0.5 * 2**attempt, 5.0))
            else:
                self._count("delivered")
                return
        logger.error("webhook %s gave up on alert %s after %d attempts", url, alert.id, attempt)
        self._count("failed")

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.alert_deliveries.labels(sink=self.name, outcome=outcome).inc()
