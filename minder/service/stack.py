"""Assembles the running service: storage, detection worker, alert sinks, HTTP API.

Used by ``minder serve`` and ``minder demo``; the only place that turns :class:`Settings` into
objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from minder.actions.policy import SelfCheckPolicy
from minder.actions.selfcheck import LauncherOptions, SelfCheckLauncher
from minder.api.app import create_app
from minder.api.server import (
    ApiServer,
    ServerLimits,
    accept_batch,
    api_server,
    open_file_limit,
    resolve_max_connections,
)
from minder.config import Settings
from minder.core.alert import Alert
from minder.core.codec import layout_cache
from minder.core.errors import MinderError
from minder.core.records import NodeBatch
from minder.service.admission import JobConfirmations
from minder.service.delivery import Delivery, action_policy, build_delivery
from minder.service.engine import DetectionService
from minder.service.persistence import StateWriter
from minder.service.prometheus_source import PrometheusPoller
from minder.service.runner import DetectionWorker
from minder.service.selfcheck import SelfCheckMetrics, SelfCheckService
from minder.service.sinks import SqlStateStore
from minder.service.source import SOURCES, Source
from minder.service.telemetry import ServiceMetrics
from minder.storage.engine import Engine, SessionFactory, create_engine_for, session_factory
from minder.storage.layouts import SqlLayoutStore
from minder.storage.migrate import upgrade_database
from minder.stream.auth import BatchAuthenticator
from minder.stream.consumer import BatchConsumer
from minder.stream.topics import check_reachable, ensure_topics

logger = logging.getLogger(__name__)


class SharedDetectionService(DetectionService):
    """A :class:`DetectionService` fed by two threads (Kafka worker and Prometheus poller):
    one lock around ``ingest`` and ``tick``, so their windows are never changed concurrently."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.RLock()

    def ingest(self, batches: Iterable[NodeBatch]) -> int:
        with self._lock:
            return super().ingest(batches)

    def tick(self) -> list[Alert]:
        with self._lock:
            return super().tick()

    def release(self, reason: str = "the service stopped") -> None:
        with self._lock:
            super().release(reason)


@dataclass
class Stack:
    """Every running part of one Minder service process."""

    settings: Settings
    metrics: ServiceMetrics
    service: DetectionService
    worker: DetectionWorker | None
    app: Any
    delivery: Delivery
    engine: Engine | None = None
    poller: PrometheusPoller | None = None
    server: ApiServer | None = None
    writer: StateWriter | None = None
    layout_store: SqlLayoutStore | None = None
    """The store the module-wide decoder's layout cache uses (while Kafka is a source)."""
    confirmations: JobConfirmations | None = None
    """The scheduler's answers for the admission of new jobs (with a scheduler target)."""
    selfchecks: SelfCheckService | None = None
    """Self-checks of the drained nodes (``MINDER_SELFCHECK__ENABLED``)."""
    _threads: list[threading.Thread] = field(default_factory=list)
    _api_error: BaseException | None = None
    _stopping: bool = False

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api.host}:{self.settings.api.port}"

    def start(self, *, api: bool = True, wait_ready_s: float = 30.0) -> None:
        """Start the outbox workers, the sources (Kafka worker, Prometheus poller) and
        (optionally) the HTTP API; wait until the API answers.

        Raises
        ------
        MinderError
            When the API does not start, or its connection bound does not fit the open-file
            limit (checked before anything starts).
        """
        limits = self._server_limits() if api else None
        self.delivery.start()
        if self.selfchecks is not None:
            self.selfchecks.start()
        if self.writer is not None:
            self.writer.start()
        if self.confirmations is not None:
            self.confirmations.start()
        if self.worker is not None:
            self.worker.start()
        if self.poller is not None:
            self.poller.start()
        if limits is None:
            return
        api_settings = self.settings.api
        if "protect_reads" in api_settings.model_fields_set:
            logger.warning(
                "MINDER_API__PROTECT_READS is deprecated and has no effect: with a token every "
                "/api/v1 read needs it, without one only loopback clients read "
                "(MINDER_API__OPEN_READS); remove the setting"
            )
        self.server = api_server(
            self.app, host=api_settings.host, port=api_settings.port, limits=limits
        )
        thread = threading.Thread(target=self._serve_api, name="minder-api", daemon=True)
        thread.start()
        self._threads.append(thread)
        deadline = time.monotonic() + wait_ready_s
        while not self.server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                why = "port in use?" if self._api_error is None else _why(self._api_error)
                raise MinderError(f"the API did not start on {self.api_url} ({why}); see the log")
            time.sleep(0.05)
        if api_settings.port == 0:  # the port the system chose: api_url and the start line
            api_settings.port = self.server.bound_port() or 0
        logger.info(
            "the API holds at most %d connections (open-file limit %s), a request head must "
            "arrive within %g s",
            limits.max_connections,
            open_file_limit() or "unlimited",
            limits.header_timeout_s,
        )

    def api_failure(self) -> str | None:
        """Why the API stopped serving while the stack runs (its thread ended: an exception
        or an exit of its event loop), or ``None`` while it serves (or was never started)."""
        if self.server is None or self._stopping:
            return None
        thread = next((t for t in self._threads if t.name == "minder-api"), None)
        if thread is None or thread.is_alive():
            return None
        if self._api_error is not None:
            return _why(self._api_error)
        return "its server stopped on its own"

    def _server_limits(self) -> ServerLimits:
        api_settings = self.settings.api
        limit = open_file_limit()
        max_connections = resolve_max_connections(api_settings.max_connections, limit)
        return ServerLimits(
            max_connections=max_connections,
            header_timeout_s=api_settings.header_timeout_s,
            keep_alive_s=api_settings.keep_alive_s,
            accept_batch=accept_batch(max_connections, limit),
        )

    def _serve_api(self) -> None:
        """The API thread: runs the server, keeping what ended it for :meth:`api_failure`."""
        assert self.server is not None
        try:
            self.server.run()
        except BaseException as exc:  # SystemExit too: uvicorn's start failure
            self._api_error = exc
            logger.debug("the API thread ended", exc_info=exc)

    def stop(self) -> None:
        """Stop the API, the worker and the sinks, flushing what is pending."""
        self._stopping = True
        if self.server is not None:
            self.server.should_exit = True
        for thread in self._threads:
            thread.join(10)
        if self.poller is not None:
            self.poller.stop()
        if self.worker is not None:
            self.worker.stop()
        if self.confirmations is not None:
            self.confirmations.close()
        # Nothing feeds the service now: its jobs are idle until a worker holds them again.
        self.service.release()
        if self.writer is not None:
            self.writer.close()  # writes the job state still pending
        if self.selfchecks is not None:
            self.selfchecks.stop()
        self.delivery.stop()
        if self.engine is not None:
            if self.layout_store is not None and layout_cache().store is self.layout_store:
                layout_cache().store = None  # its engine is going; another stack sets its own
            self.engine.dispose()


def _why(exc: BaseException) -> str:
    """What ended the API thread, in one line."""
    if isinstance(exc, SystemExit):
        return f"its server exited with status {exc.code}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def build_selfchecks(
    settings: Settings,
    sessions: SessionFactory,
    delivery: Delivery,
    registry: CollectorRegistry,
    *,
    launcher: SelfCheckLauncher | None = None,
) -> SelfCheckService:
    """The self-check service of ``settings.selfcheck`` (enabled), on the actions' scheduler.

    ``launcher`` replaces the one built for the actions target (tests).

    Raises
    ------
    MinderError
        One line naming the setting: no scheduler target, a target that cannot run checks, or
        a bad self-check setting.
    """
    executor = delivery.executor
    if executor is None:
        raise MinderError(
            "self-checks are enabled (MINDER_SELFCHECK__ENABLED=true) without a scheduler target: "
            "set MINDER_ACTIONS__TARGET to slurm or kubernetes, or turn self-checks off"
        )
    sc = settings.selfcheck
    if launcher is None:
        # imported only when self-checks are on: the targets' launchers and their clients
        from minder.actions.selfcheck_targets import build_selfcheck_launcher  # noqa: PLC0415

        options = LauncherOptions(
            check_user=sc.check_user,
            image=sc.image,
            namespace=sc.namespace,
            master_port=sc.master_port,
            partition=sc.partition,
            sbatch_args=tuple(sc.sbatch_args),
        )
        try:
            launcher = build_selfcheck_launcher(executor.actuator, options)
        except ValueError as exc:
            raise MinderError(f"MINDER_SELFCHECK__*: {exc}") from None
        if launcher is None:
            raise MinderError(
                f"self-checks are enabled (MINDER_SELFCHECK__ENABLED=true) but the actions target "
                f"{executor.target!r} (MINDER_ACTIONS__TARGET) cannot run them: expected slurm or "
                "kubernetes, or turn self-checks off"
            )
    assert sc.report_url is not None  # SelfCheckSettings requires it when enabled
    kinds = sc.kinds if sc.kinds is not None else list(settings.actions.act_on)
    policy = SelfCheckPolicy(
        report_url=sc.report_url,
        enforce=settings.actions.enforce,
        kinds=frozenset(kinds),
        max_concurrent=sc.max_concurrent,
        timeout_s=sc.timeout_s,
        retries=sc.retries,
        max_failures_per_node=sc.max_failures_per_node,
        partners=sc.partners,
        command=tuple(sc.command),
        ready_timeout_s=sc.ready_timeout_s,
        report_grace_s=sc.report_grace_s,
        interval_s=sc.interval_s,
    )
    service = SelfCheckService(
        launcher,
        policy,
        action_policy(settings),
        sessions,
        destinations=delivery.destinations,
        metrics=SelfCheckMetrics(registry),
        on_enqueued=delivery.hub.wake,
    )
    executor.on_applied = service.wake  # a node just drained: decide its check now
    logger.warning(
        "self-checks of drained nodes on %s: %s (kinds %s, at most %d at once, reports to %s)",
        launcher.name,
        "enforcing" if policy.enforce else "dry run (MINDER_ACTIONS__ENFORCE is false)",
        ", ".join(sorted(policy.kinds)) or "none",
        policy.max_concurrent,
        policy.report_url,
    )
    return service


def selfcheck_wake_of(selfchecks: SelfCheckService | None) -> Callable[[], None] | None:
    """The API's hook to the self-check service: its ``wake``, or None when no enforcing service
    runs (self-checks disabled, or a dry run). None also tells the API to refuse an operator's
    request for a check (``POST /api/v1/selfchecks``): nothing would launch it. In a dry run the
    service still follows the checks launched before to their end: their reports are taken and
    found at its next pass (every ``interval_s``)."""
    if selfchecks is None or not selfchecks.policy.enforce:
        return None
    return selfchecks.wake


def build_stack(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    *,
    actuator: object | None = None,
    source: Source = "kafka",
    selfcheck_launcher: SelfCheckLauncher | None = None,
) -> Stack:
    """Connect storage and the metrics source(s) per ``settings`` and wire the service together.

    ``source``: batches from Kafka (the agents), from Prometheus (``settings.prometheus``,
    polled every step), or from both; alerts are published on Kafka when Kafka is a source
    (or ``kafka.publish_alerts`` says so), and go to the store, webhooks, Alertmanager and the
    scheduler in every case.
    ``actuator`` replaces the configured scheduler target (tests), ``selfcheck_launcher`` the
    self-check launcher built for it (tests; used when ``settings.selfcheck.enabled``).
    """
    if source not in SOURCES:
        raise MinderError(f"source {source!r}: expected one of {', '.join(SOURCES)}")
    use_kafka = source in ("kafka", "both")
    use_prometheus = source in ("prometheus", "both")
    # First: a bad method or model directory should stop start-up before anything connects.
    factory = settings.detection.detector_factory()
    # So is a missing or bad key file: batches are verified before they touch any state.
    authenticator = (
        BatchAuthenticator.from_key_file(
            settings.auth.keys_file,
            settings.auth.mode,
            max_age_s=settings.auth.max_age_s,
            max_skew_s=settings.auth.max_skew_s,
        )
        if use_kafka
        else None
    )
    kafka = settings.kafka
    # Alerts go to the Kafka alerts topic when Kafka is a source, or when asked to.
    kafka_alerts = use_kafka if kafka.publish_alerts is None else kafka.publish_alerts
    if use_kafka or kafka_alerts:
        # One line within seconds when nothing listens, not kafka-python's retries for 30 s.
        check_reachable(kafka.bootstrap)
    metrics = ServiceMetrics(registry)
    engine = create_engine_for(settings.database.url, echo=settings.database.echo)
    upgrade_database(engine)
    sessions = session_factory(engine)
    topics = {kafka.alerts_topic: kafka.partitions} if kafka_alerts else {}
    if use_kafka:
        topics |= {kafka.metrics_topic: kafka.partitions, kafka.deadletter_topic: 1}
    if topics:
        ensure_topics(kafka.bootstrap, topics, client_options=kafka.client_options())
    try:
        delivery = build_delivery(
            settings, sessions, metrics.registry, actuator=actuator, kafka_alerts=kafka_alerts
        )
    except Exception:
        engine.dispose()
        raise
    selfchecks: SelfCheckService | None = None
    if settings.selfcheck.enabled:
        try:
            selfchecks = build_selfchecks(
                settings, sessions, delivery, metrics.registry, launcher=selfcheck_launcher
            )
        except Exception:
            delivery.stop()
            engine.dispose()
            raise
    store = SqlStateStore(sessions, delivery.destinations, on_enqueued=delivery.hub.wake)
    # Job state (machines, current scores) is written by a thread of its own, never in the
    # poll loop, and only for the machines that changed.
    writer = StateWriter(store, metrics)
    # With a scheduler target, new jobs at the jobs bound are ranked by the scheduler's word:
    # the executor's own view (the Slurm or Kubernetes target), asked in a thread of its own.
    confirmations: JobConfirmations | None = None
    if delivery.executor is not None:
        detection = settings.detection
        confirmations = JobConfirmations(
            delivery.executor.scheduler,
            confirmed_ttl_s=detection.admission_confirmed_ttl_s,
            not_found_ttl_s=detection.admission_not_found_ttl_s,
            lookups_per_s=detection.admission_lookups_per_s,
            on_outcome=metrics.scheduler_lookup,
        )
        metrics.init_scheduler_lookups()
    service_type = SharedDetectionService if source == "both" else DetectionService
    service = service_type(
        factory,
        limits=settings.detection.service_limits(),
        grace_s=settings.detection.grace_s,
        metrics=metrics,
        store=store,
        writer=writer,
        confirmations=confirmations,
        idle_retention_s=settings.detection.job_retention_s,
    )
    worker: DetectionWorker | None = None
    poller: PrometheusPoller | None = None
    try:
        if use_prometheus:
            poller = PrometheusPoller.from_settings(settings.prometheus, service)
            # One line at once when the URL is wrong, as for Kafka above.
            poller.reader.check()
        if use_kafka:
            consumer = BatchConsumer.from_settings(kafka, authenticator=authenticator)
            worker = DetectionWorker(consumer, service)
    except Exception:
        # Nothing is running yet but these: close them rather than leak threads and sockets.
        if poller is not None:
            poller.reader.close()
        delivery.stop()
        engine.dispose()
        raise
    layout_store: SqlLayoutStore | None = None
    if worker is not None:
        # Wire layouts go through the shared database: a worker that restarts or takes a
        # partition over decodes the nodes' packed batches at once (docs/architecture.md §3.2).
        # A new layout is saved synchronously in the poll loop: that happens once per distinct
        # layout per process (nodes alike share one), so it is rare.
        layout_store = SqlLayoutStore(sessions)
        layout_cache().store = layout_store

    def readiness() -> dict[str, bool]:
        # Detection stalled for a job whose data still arrives: not ready (a frozen clock, a
        # handler stuck behind a lock).
        checks: dict[str, bool] = {"detection_not_stalled": not service.stalled_jobs()}
        if worker is not None:
            checks["kafka_group_joined"] = worker.ready
        if poller is not None:
            checks["prometheus_polled"] = poller.ready
        return checks

    app = create_app(
        sessions,
        registry=metrics.registry,
        readiness=readiness,
        api_token=settings.api.token,
        open_access=settings.api.open,
        open_reads=settings.api.open_reads,
        allowed_hosts=settings.api.effective_allowed_hosts(),
        cors_origins=settings.api.cors_origins,
        body_timeout_s=settings.api.body_timeout_s,
        body_min_rate=settings.api.body_min_rate,
        whatif_roots=settings.whatif.roots or None,
        whatif_workdir=settings.whatif.workdir,
        max_upload_bytes=settings.whatif.max_upload_bytes,
        whatif_workers=settings.whatif.workers,
        destinations=delivery.destinations,
        on_enqueued=delivery.hub.wake,
        selfcheck_wake=selfcheck_wake_of(selfchecks),
    )
    return Stack(
        settings,
        metrics,
        service,
        worker,
        app,
        delivery,
        engine,
        poller=poller,
        writer=writer,
        layout_store=layout_store,
        confirmations=confirmations,
        selfchecks=selfchecks,
    )
