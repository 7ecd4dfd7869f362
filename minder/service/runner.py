"""The detection worker: Kafka consumer → detection service, in a background thread."""

from __future__ import annotations

import logging
import threading
from collections import Counter

from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.stream.consumer import BatchConsumer
from minder.stream.deadletter import REASON_CLASSES

logger = logging.getLogger(__name__)


class DetectionWorker:
    """Consumes the metrics topic and runs detection after every poll.

    Offsets are committed only after a poll's batches are in the job windows and the seconds they
    completed have been evaluated, so a crash replays them (at-least-once); the alert store's
    dedup turns a replayed alert into the same alert.
    """

    def __init__(self, consumer: BatchConsumer, service: DetectionService) -> None:
        self.consumer = consumer
        self.service = service
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen_consumed = 0
        self._seen_dead: Counter[str] = Counter()
        self._seen_failed: Counter[str] = Counter()
        self._seen_retries = (0, 0, 0)
        self._lag_keys: set[tuple[str, int]] = set()
        self._offset_keys: set[tuple[str, int]] = set()
        service.metrics.init_reasons(REASON_CLASSES)
        self._seen_auth: Counter[str] = Counter()
        self._seen_verified: Counter[str] = Counter()
        if consumer.authenticator is not None:
            service.metrics.init_auth(self._auth_action())
        self.polls = 0

    def _handle(self, batches: list[NodeBatch]) -> None:
        self.service.ingest(batches)
        self.service.tick()

    def poll(self, timeout_ms: int = 500) -> None:
        """One poll: consume, detect, commit, and bring the exported counters up to date."""
        self.consumer.poll_once(self._handle, timeout_ms)
        # Also when the poll brought nothing: idle jobs retire, stored-alert retries run, and a
        # job whose data stopped gets its last seconds evaluated.
        self.service.tick()
        self.polls += 1
        self._export_counters()

    def _export_counters(self) -> None:
        stats = self.consumer.stats
        metrics = self.service.metrics
        metrics.messages.inc(stats.consumed - self._seen_consumed)
        self._seen_consumed = stats.consumed
        for reason, count in stats.dead_lettered_by_reason.items():
            delta = count - self._seen_dead[reason]
            if delta:
                metrics.dead_letters.labels(reason=reason).inc(delta)
                self._seen_dead[reason] = count
        for reason, count in stats.decode_failures_by_reason.items():
            delta = count - self._seen_failed[reason]
            if delta:
                metrics.decode_failures.labels(reason=reason).inc(delta)
                self._seen_failed[reason] = count
        auth = self.consumer.authenticator
        if auth is not None:
            action = self._auth_action()
            for reason, count in auth.failures.items():
                delta = count - self._seen_auth[reason]
                if delta:
                    metrics.unauthenticated.labels(reason=reason, action=action).inc(delta)
                    self._seen_auth[reason] = count
            for kid, count in list(auth.verified_by_kid.items()):
                delta = count - self._seen_verified[kid]
                if delta:
                    metrics.batches_verified.labels(kid=kid).inc(delta)
                    self._seen_verified[kid] = count
        dead_failed, handler_failed, skipped = self._seen_retries
        metrics.deadletter_failures.inc(stats.deadletter_failures - dead_failed)
        metrics.handler_failures.inc(stats.handler_failures - handler_failed)
        metrics.messages_skipped.inc(stats.skipped - skipped)
        self._seen_retries = (stats.deadletter_failures, stats.handler_failures, stats.skipped)
        backlog, offsets = stats.backlog_by_partition, stats.offset_by_partition
        for (topic, partition), count in backlog.items():
            metrics.consumer_lag.labels(topic, str(partition)).set(count)
        for (topic, partition), offset in offsets.items():
            metrics.consumer_offset.labels(topic, str(partition)).set(offset)
        for topic, partition in self._lag_keys - set(backlog):
            metrics.consumer_lag.remove(topic, str(partition))
        for topic, partition in self._offset_keys - set(offsets):
            metrics.consumer_offset.remove(topic, str(partition))
        self._lag_keys, self._offset_keys = set(backlog), set(offsets)
        metrics.assigned_partitions.set(stats.assigned_partitions)

    def _auth_action(self) -> str:
        auth = self.consumer.authenticator
        return "dead_lettered" if auth is None or auth.mode == "required" else "accepted"

    @property
    def ready(self) -> bool:
        """True once the worker has partitions assigned (it is part of the group)."""
        return self.consumer.stats.assigned_partitions > 0

    def _run(self) -> None:
        logger.info("detection worker started")
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:
                logger.exception("detection poll failed; retrying in 1 s")
                self._stop.wait(1.0)
        logger.info("detection worker stopped")

    def start(self) -> None:
        """Run in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="minder-detect", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and close the consumer."""
        self._stop.set()
        self.consumer.stop_waiting()  # a poll waiting for a group join returns within 0.5 s
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.consumer.close()
