"""Assembles the running service: storage, detection worker, alert sinks, HTTP API.

Used by ``minder serve`` and ``minder demo``; the only place that turns :class:`Settings` into
objects.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from minder.api.app import create_app
from minder.config import Settings
from minder.core.errors import MinderError
from minder.service.delivery import Delivery, build_delivery
from minder.service.engine import DetectionService
from minder.service.runner import DetectionWorker
from minder.service.sinks import SqlStateStore
from minder.service.telemetry import ServiceMetrics
from minder.storage.engine import Engine, create_engine_for, session_factory
from minder.storage.migrate import upgrade_database
from minder.stream.consumer import BatchConsumer
from minder.stream.topics import check_reachable, ensure_topics

logger = logging.getLogger(__name__)


@dataclass
class Stack:
    """Every running part of one Minder service process."""

    settings: Settings
    metrics: ServiceMetrics
    service: DetectionService
    worker: DetectionWorker
    app: Any
    delivery: Delivery
    engine: Engine | None = None
    server: uvicorn.Server | None = None
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api.host}:{self.settings.api.port}"

    def start(self, *, api: bool = True, wait_ready_s: float = 30.0) -> None:
        """Start the outbox workers, the detection worker and (optionally) the HTTP API; wait
        until the API answers."""
        self.delivery.start()
        self.worker.start()
        if not api:
            return
        config = uvicorn.Config(
            self.app,
            host=self.settings.api.host,
            port=self.settings.api.port,
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        thread = threading.Thread(target=self.server.run, name="minder-api", daemon=True)
        thread.start()
        self._threads.append(thread)
        deadline = time.monotonic() + wait_ready_s
        while not self.server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise MinderError(
                    f"the API did not start on {self.api_url} (port in use?); see the log"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the API, the worker and the sinks, flushing what is pending."""
        if self.server is not None:
            self.server.should_exit = True
        for thread in self._threads:
            thread.join(10)
        self.worker.stop()
        self.delivery.stop()
        if self.engine is not None:
            self.engine.dispose()


def build_stack(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    *,
    actuator: object | None = None,
) -> Stack:
    """Connect storage and Kafka per ``settings`` and wire the service together.

    ``actuator`` replaces the configured scheduler target (tests).
    """
    # First: a bad method or model directory should stop start-up before anything connects.
    factory = settings.detection.detector_factory()
    kafka = settings.kafka
    # One line within seconds when nothing listens, not kafka-python's retries for 30 s.
    check_reachable(kafka.bootstrap)
    metrics = ServiceMetrics(registry)
    engine = create_engine_for(settings.database.url, echo=settings.database.echo)
    upgrade_database(engine)
    sessions = session_factory(engine)
    ensure_topics(
        kafka.bootstrap,
        {
            kafka.metrics_topic: kafka.partitions,
            kafka.alerts_topic: kafka.partitions,
            kafka.deadletter_topic: 1,
        },
    )
    try:
        delivery = build_delivery(settings, sessions, metrics.registry, actuator=actuator)
    except Exception:
        engine.dispose()
        raise
    try:
        consumer = BatchConsumer.from_settings(kafka)
    except Exception:
        # Nothing is running yet but these: close them rather than leak threads and sockets.
        delivery.stop()
        engine.dispose()
        raise
    store = SqlStateStore(sessions, delivery.destinations, on_enqueued=delivery.hub.wake)
    service = DetectionService(
        factory,
        grace_s=settings.detection.grace_s,
        metrics=metrics,
        store=store,
    )
    worker = DetectionWorker(consumer, service)
    app = create_app(
        sessions,
        registry=metrics.registry,
        readiness=lambda: {"kafka_group_joined": worker.ready},
        api_token=settings.api.token,
        whatif_roots=settings.whatif.roots or None,
        whatif_workdir=settings.whatif.workdir,
        max_upload_bytes=settings.whatif.max_upload_bytes,
        whatif_workers=settings.whatif.workers,
        destinations=delivery.destinations,
        on_enqueued=delivery.hub.wake,
    )
    return Stack(settings, metrics, service, worker, app, delivery, engine)
