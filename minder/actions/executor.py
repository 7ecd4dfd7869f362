"""Carries out the action rows of the outbox: policy, opt-out, circuit breaker, audit, actuator.

An ``alert.opened`` row asks to take the alert's machine out of scheduling; ``alert.resolved``
and ``alert.false_positive`` rows ask to give it back. Every decision — acted, unchanged, dry
run, failed, or skipped with the reason — is one row of the audit trail. The circuit breaker
(at most ``max_per_job`` machines of one job and ``max_fraction`` of the watched fleet within
``window_s``) trips instead of acting past its bound; then nothing is applied until an operator
resets it (``POST /api/v1/breaker/reset``, ``minder breaker reset``), its trip is an event of its
own for the notification destinations, and ``minder_actions_breaker_tripped`` is 1. Undos are
always allowed: giving a node back is safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from minder.actions.base import ActionError, ActionOutcome, NodeActuator
from minder.actions.policy import ActionPolicy
from minder.core.alert import Alert, AlertStatus
from minder.delivery.worker import DeliveryError
from minder.storage import Session, SessionFactory
from minder.storage.actions import (
    ACTIONS_BREAKER,
    ActionOutcomeKind,
    actions_enabled,
    apply_modes,
    audit,
    get_breaker,
    machines_acted_on,
    trip_breaker,
    watched_machines,
)
from minder.storage.alerts import get_alert
from minder.storage.outbox import AlertEvent, Delivery, Destination, enqueue

logger = logging.getLogger(__name__)

BREAKER = ACTIONS_BREAKER
"""Name of the breaker in front of every scheduler action."""

APPLY_EVENTS = frozenset({AlertEvent.OPENED.value})
UNDO_EVENTS = frozenset({AlertEvent.RESOLVED.value, AlertEvent.FALSE_POSITIVE.value})


class ActionMetrics:
    """Scheduler actions by target, operation and outcome; the breaker's state."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.actions = Counter(
            "minder_actions",
            "Scheduler action decisions by target, operation and outcome (applied, unchanged, "
            "dry_run, failed, skipped_*)",
            ["target", "operation", "outcome"],
            registry=registry,
        )
        self.breaker = Gauge(
            "minder_actions_breaker_tripped",
            "1 while the actions circuit breaker is tripped (no action until an operator reset)",
            registry=registry,
        )


class ActionExecutor:
    """The outbox sender of destination ``action:<target>``.

    Parameters
    ----------
    actuator
        The scheduler target (Slurm, Kubernetes).
    policy
        What acts, and the breaker's bounds.
    notify
        Destinations that hear of the breaker (webhooks, Kafka, Alertmanager).
    on_enqueued
        Called after breaker events were written (wakes their workers).
    """

    def __init__(
        self,
        actuator: NodeActuator,
        policy: ActionPolicy,
        sessions: SessionFactory,
        *,
        notify: Sequence[Destination] = (),
        metrics: ActionMetrics | None = None,
        on_enqueued: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.actuator = actuator
        # scontrol's timeout (30 s by default); the Kubernetes client's requests take less
        self.timeout_s = float(getattr(actuator, "timeout_s", 30.0))
        self.target = actuator.name
        self.destination = f"action:{actuator.name}"
        self.policy = policy
        self.sessions = sessions
        self.notify = list(notify)
        self.metrics = metrics
        self.on_enqueued = on_enqueued
        self.clock = clock
        if metrics is not None:
            for operation in (self._operation(undo=False), self._operation(undo=True)):
                for outcome in ActionOutcomeKind:
                    metrics.actions.labels(self.target, operation, outcome.value)
            self.refresh_gauges()

    def refresh_gauges(self) -> None:
        """``minder_actions_breaker_tripped`` from the database: a reset through the API (or a
        trip by another replica) shows within one refresh."""
        if self.metrics is None:
            return
        with self.sessions() as session:
            self.metrics.breaker.set(1 if get_breaker(session, BREAKER).tripped else 0)

    def destination_spec(self, *, ttl_s: float = 24 * 3600.0) -> Destination:
        """What this executor subscribes to, with the policy's holds per alert kind."""
        return Destination(
            name=self.destination,
            events=APPLY_EVENTS | UNDO_EVENTS,
            ttl_s=ttl_s,
            hold_s=dict(self.policy.act_on),
        )

    # -- the Sender protocol ---------------------------------------------------------------
    def send(self, delivery: Delivery) -> None:
        alert = Alert.from_dict(delivery.payload["data"]["alert"])
        if delivery.event in APPLY_EVENTS:
            self._apply(alert, delivery)
        elif delivery.event in UNDO_EVENTS:
            self._undo(alert, delivery)

    def close(self) -> None:
        close = getattr(self.actuator, "close", None)
        if callable(close):
            close()

    # -- apply ---------------------------------------------------------------------------------
    def _apply(self, alert: Alert, delivery: Delivery) -> None:
        node = self.policy.node_of(alert.machine)
        operation = self._operation(undo=False)
        with self.sessions.begin() as session:
            current = get_alert(session, alert.id).status
            why = self.policy.why_not(alert)
            outcome = ActionOutcomeKind.SKIPPED_POLICY
            if why is None and current not in (AlertStatus.OPEN, AlertStatus.ACKNOWLEDGED):
                why = f"the alert is {current.value} already: nothing to take out"
            if why is None and alert.job in self.policy.opt_out_jobs:
                why = f"job {alert.job} opted out of actions (MINDER_ACTIONS__OPT_OUT_JOBS)"
                outcome = ActionOutcomeKind.SKIPPED_OPT_OUT
            if why is None and not actions_enabled(session, alert.job):
                why = f"job {alert.job} opted out of actions (job settings)"
                outcome = ActionOutcomeKind.SKIPPED_OPT_OUT
            if why is None:
                why = self._breaker_refuses(session, alert)
                outcome = ActionOutcomeKind.SKIPPED_BREAKER
            if why is not None:
                self._audit(session, alert, node, operation, outcome, why, delivery)
                return
            if not self.policy.enforce:
                detail = f"dry run: would {operation} {node} ({self._reason(alert)})"
                self._audit(session, alert, node, operation, ActionOutcomeKind.DRY_RUN, detail,
                            delivery)  # fmt: skip
                logger.info("%s", detail)
                return
            # Counted by every replica's breaker from now on, before the target answers.
            self._audit(session, alert, node, operation, ActionOutcomeKind.STARTED,
                        f"{operation} {node} ({self._reason(alert)})", delivery)  # fmt: skip
        self._act(alert, node, operation, delivery, undo=False)

    def _breaker_refuses(self, session: Session, alert: Alert) -> str | None:
        """Why the breaker refuses this apply (tripping it now if this one would pass a bound)."""
        state = get_breaker(session, BREAKER, for_update=True)
        if state.tripped:
            return f"circuit breaker tripped ({state.reason}); reset it to act again"
        # An operator's reset starts a new window: what was counted before it is forgiven.
        since = max(self.clock() - self.policy.window_s, state.reset_at or 0.0)
        operation = self._operation(undo=False)
        acted = machines_acted_on(session, since=since, operation=operation)
        key = (alert.job, alert.machine)
        if key in acted:
            return None  # the same machine again: no new machine out
        in_job = sum(1 for job, _ in acted if job == alert.job)
        fleet = watched_machines(session)
        fleet_bound = self.policy.fleet_bound(fleet)
        reason = None
        if in_job + 1 > self.policy.max_per_job:
            reason = (
                f"{in_job + 1} machines of job {alert.job} within {self.policy.window_s:.0f} s "
                f"would pass the bound of {self.policy.max_per_job}"
            )
        elif len(acted) + 1 > fleet_bound:
            reason = (
                f"{len(acted) + 1} machines within {self.policy.window_s:.0f} s would pass "
                f"{self.policy.max_fraction:.1%} of the {fleet} watched machines ({fleet_bound})"
            )
        if reason is None:
            return None
        if trip_breaker(session, BREAKER, reason, now=self.clock()):
            logger.error("actions circuit breaker tripped: %s; no action until it is reset",
                         reason)  # fmt: skip
            if self.metrics is not None:
                self.metrics.breaker.set(1)
            enqueue(
                session,
                self.notify,
                event=AlertEvent.BREAKER_TRIPPED,
                data={
                    "breaker": BREAKER,
                    "reason": reason,
                    "target": self.target,
                    "mode": self.policy.mode,
                    "refused": {"alert_id": alert.id, "job": alert.job, "machine": alert.machine},
                },
                now=self.clock(),
            )
            if self.on_enqueued is not None:
                self.on_enqueued()
        return f"circuit breaker tripped: {reason}"

    # -- undo ----------------------------------------------------------------------------------
    def _undo(self, alert: Alert, delivery: Delivery) -> None:
        node = self.policy.node_of(alert.machine)
        operation = self._operation(undo=True)
        with self.sessions.begin() as session:
            modes = apply_modes(session, alert.id, self._operation(undo=False))
            if not modes:
                self._audit(session, alert, node, operation, ActionOutcomeKind.SKIPPED_POLICY,
                            "no action was taken for this alert: nothing to undo",
                            delivery)  # fmt: skip
                return
            if "enforce" not in modes or not self.policy.enforce:
                detail = f"dry run: would {operation} {node} (alert {alert.status.value})"
                self._audit(session, alert, node, operation, ActionOutcomeKind.DRY_RUN, detail,
                            delivery)  # fmt: skip
                return
        # An apply was sent in enforce mode (even one recorded as failed may have taken effect):
        # the target returns the node only if Minder's mark for this alert is on it.
        self._act(alert, node, operation, delivery, undo=True)

    # -- the target ----------------------------------------------------------------------------
    def _act(self, alert: Alert, node: str, operation: str, delivery: Delivery, *,
             undo: bool) -> None:  # fmt: skip
        try:
            if undo:
                done: ActionOutcome = self.actuator.undo(node, alert_id=alert.id)
            else:
                done = self.actuator.apply(node, alert_id=alert.id, reason=self._reason(alert))
        except ActionError as exc:
            with self.sessions.begin() as session:
                self._audit(session, alert, node, operation, ActionOutcomeKind.FAILED,
                            f"{exc}{' (retried)' if exc.transient else ''}", delivery)  # fmt: skip
            raise DeliveryError(str(exc), transient=exc.transient) from None
        outcome = ActionOutcomeKind.APPLIED if done.changed else ActionOutcomeKind.UNCHANGED
        with self.sessions.begin() as session:
            self._audit(session, alert, node, operation, outcome, done.detail, delivery)
        logger.info("%s %s for alert %s: %s", done.operation, node, alert.id, done.detail)

    def _operation(self, *, undo: bool) -> str:
        if self.target == "kubernetes":
            return "uncordon" if undo else "cordon"
        return "resume" if undo else "drain"

    @staticmethod
    def _reason(alert: Alert) -> str:
        devices = ",".join(alert.devices)
        return " ".join(p for p in (alert.kind.value, alert.metric, devices) if p)

    def _audit(
        self,
        session: Session,
        alert: Alert,
        node: str,
        operation: str,
        outcome: ActionOutcomeKind,
        detail: str,
        delivery: Delivery,
    ) -> None:
        audit(
            session,
            target=self.target,
            operation=operation,
            mode=self.policy.mode,
            outcome=outcome,
            detail=detail,
            alert_id=alert.id,
            job=alert.job,
            machine=alert.machine,
            node=node,
            delivery_id=delivery.delivery_id,
            now=self.clock(),
        )
        if self.metrics is not None:
            self.metrics.actions.labels(self.target, operation, outcome.value).inc()
