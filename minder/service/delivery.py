"""Assembles the outbox's destinations, their senders and workers from the settings."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from minder.actions.executor import BREAKER, ActionExecutor, ActionMetrics
from minder.actions.policy import ActionPolicy
from minder.config import Settings
from minder.core.errors import MinderError
from minder.delivery.alertmanager import AlertmanagerClient, AlertmanagerSender
from minder.delivery.kafka import KafkaSender
from minder.delivery.webhook import WebhookSender
from minder.delivery.worker import (
    Backoff,
    DeliveryHub,
    DeliveryMetrics,
    DeliveryWorker,
    Periodic,
    Sender,
)
from minder.storage import SessionFactory, open_alerts
from minder.storage.actions import get_breaker
from minder.storage.alerts import closed_alerts_since
from minder.storage.outbox import AlertEvent, Destination, purge_finished
from minder.stream.producer import AlertPublisher

logger = logging.getLogger(__name__)

ALL_EVENTS = frozenset(e.value for e in AlertEvent)


@dataclass
class Delivery:
    """The outbox's destinations (what the store and the API enqueue to) and their workers."""

    destinations: list[Destination]
    hub: DeliveryHub
    executor: ActionExecutor | None = None
    refresher: Periodic | None = None
    retention: Periodic | None = None

    def start(self) -> None:
        """Start the workers, the Alertmanager refresher and the outbox's retention."""
        self.hub.start()
        for periodic in (self.refresher, self.retention):
            if periodic is not None:
                periodic.start()

    def stop(self) -> None:
        """Stop the workers (each finishes the row it is sending) and the periodic tasks."""
        for periodic in (self.refresher, self.retention):
            if periodic is not None:
                periodic.stop()
        self.hub.stop()


def action_policy(settings: Settings) -> ActionPolicy:
    """The policy of the ``actions`` settings."""
    a = settings.actions
    return ActionPolicy(
        enforce=a.enforce,
        act_on=dict(a.act_on),
        opt_out_jobs=frozenset(a.opt_out_jobs),
        max_per_job=a.max_per_job,
        max_fraction=a.max_fraction,
        window_s=a.window_s,
        node_template=a.node_template,
    )


def build_actuator(settings: Settings) -> object:
    """The scheduler target of the settings (imported only when configured).

    Raises
    ------
    MinderError
        The target cannot be configured (no kubeconfig, …).
    """
    a = settings.actions
    if a.target == "slurm":
        from minder.actions.slurm import SlurmActuator  # noqa: PLC0415

        return SlurmActuator(scontrol=a.scontrol, slurm_conf=a.slurm_conf)
    if a.target == "kubernetes":
        from minder.actions.kubernetes import KubernetesActuator  # noqa: PLC0415

        in_cluster = a.kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
        try:
            return KubernetesActuator.from_config(
                a.kubeconfig,
                a.kube_context,
                in_cluster,
                job_label=a.kube_job_label,
                job_namespace=a.kube_job_namespace,
            )
        except ValueError as exc:  # a job label or namespace that cannot be one
            raise MinderError(f"actions: {exc}") from None
    raise MinderError(f"actions target {a.target!r}: expected slurm or kubernetes")


def build_delivery(
    settings: Settings,
    sessions: SessionFactory,
    registry: CollectorRegistry,
    *,
    actuator: object | None = None,
    kafka_alerts: bool = True,
) -> Delivery:
    """Destinations, senders and workers of the settings.

    ``actuator`` overrides the configured scheduler target (tests); ``kafka_alerts`` False
    leaves out the Kafka alerts topic (a service fed by Prometheus alone, without a broker).
    """
    ttl = settings.delivery.ttl_s
    backoff = Backoff(
        base_s=settings.delivery.backoff_base_s, cap_s=settings.delivery.backoff_cap_s
    )
    senders: list[tuple[Destination, Sender]] = []
    closables: list[Callable[[], None]] = []
    try:
        if kafka_alerts:
            publisher = AlertPublisher.from_settings(settings.kafka)
            closables.append(publisher.close)
            senders.append((Destination("kafka", ALL_EVENTS, ttl), KafkaSender(publisher)))
        for endpoint in settings.webhook.all_endpoints():
            sender = WebhookSender(
                endpoint.name,
                endpoint.url,
                secrets=endpoint.secrets,
                timeout_s=settings.webhook.timeout_s,
            )
            closables.append(sender.close)
            senders.append((Destination(sender.destination, frozenset(endpoint.events), ttl),
                            sender))  # fmt: skip
        am: AlertmanagerSender | None = None
        if settings.alertmanager.url:
            client = AlertmanagerClient(
                settings.alertmanager.url,
                timeout_s=settings.alertmanager.timeout_s,
                bearer_token=settings.alertmanager.bearer_token,
            )
            am = AlertmanagerSender(
                client,
                external_url=settings.api.external_url,
                refresh_s=settings.alertmanager.refresh_s,
            )
            closables.append(am.close)
            senders.append((Destination(am.destination, am.events, ttl), am))
        notify = [destination for destination, _ in senders]
        executor = None
        delivery_metrics = DeliveryMetrics(registry)
        if actuator is not None or settings.actions.target != "none":
            target = actuator if actuator is not None else build_actuator(settings)
            executor = ActionExecutor(
                target,  # type: ignore[arg-type]
                action_policy(settings),
                sessions,
                notify=notify,
                metrics=ActionMetrics(registry),
            )
            senders.append((executor.destination_spec(ttl_s=ttl), executor))
            mode = "ENFORCING" if settings.actions.enforce else "log-only (dry run)"
            logger.warning("scheduler actions on %s: %s", executor.target, mode)
    except Exception:
        for close in closables:
            close()
        raise
    workers = [
        DeliveryWorker(
            sender,
            sessions,
            metrics=delivery_metrics,
            backoff=backoff,
            lease_s=settings.delivery.lease_s,
        )
        for _, sender in senders
    ]
    gauges = [executor.refresh_gauges] if executor is not None else []
    hub = DeliveryHub(workers, sessions, delivery_metrics, gauges=gauges)
    if executor is not None:
        executor.on_enqueued = hub.wake  # breaker events: their workers look at once
    refresher = None
    if am is not None:
        sender_am = am

        def refresh() -> None:
            # Closed alerts are read after the open ones: one resolved in between is in both,
            # and its end is pushed after its re-send.
            with sessions() as session:
                alerts = open_alerts(session)
                breaker = get_breaker(session, BREAKER)
                closed = closed_alerts_since(session, time.time() - sender_am.valid_for_s)
            record_of = {alert.id: alert for alert in closed}
            sender_am.refresh(
                [alert for alert in alerts if alert.id not in record_of],
                breaker.reason if breaker.tripped else None,
                breaker.tripped_at,
                [(alert, time.time()) for alert in closed],
            )

        refresher = Periodic("alertmanager-refresh", settings.alertmanager.refresh_s, refresh)
    retain_s = settings.delivery.retain_s

    def purge() -> None:
        with sessions.begin() as session:
            removed = purge_finished(session, before=time.time() - retain_s)
        if removed:
            logger.info("outbox: %d delivered or expired event(s) older than %.0f s removed",
                        removed, retain_s)  # fmt: skip

    return Delivery(
        destinations=[destination for destination, _ in senders],
        hub=hub,
        executor=executor,
        refresher=refresher,
        retention=Periodic("outbox-retention", min(3600.0, retain_s), purge),
    )
