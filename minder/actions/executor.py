"""Carries out the action rows of the outbox: policy, opt-out, the scheduler's check, circuit
breaker, audit, actuator.

An ``alert.opened`` row asks to take the alert's machine out of scheduling; ``alert.resolved``,
``alert.false_positive`` and ``alert.cleared_by_selfcheck`` rows ask to give it back (after a
passed self-check the launcher has returned the node already, so that undo finds no mark of
Minder's and is audited ``unchanged``; it matters only where a launcher left part of the mark).
Every decision — acted, unchanged, dry run, failed, or skipped with the reason — is one row of
the audit trail.

Before an apply, the scheduler is asked whether the alert's node runs the alert's job
(:class:`~minder.actions.base.SchedulerView`): an agent's report is not proof of where a job
runs, and one forged report must not drain a healthy node. When the scheduler says no, nothing is
done, the audit row says ``skipped_not_in_job``, and a ``suspicious_source`` alert (naming the
machine, the job, the original alert and the reason) goes to the notification destinations; it
is never acted on. When the scheduler cannot be asked, the row fails transiently and is retried:
Minder does not act blind. The check runs in dry run too, so what a dry run audits is what
enforcing would do.

The circuit breaker (at most ``max_per_job`` machines of one job and ``max_fraction`` of the
watched fleet within ``window_s``) counts applies that passed the check, once per machine, and
the nodes a passed self-check returned, once per alert (:func:`breaker_refusal`: the self-check
service asks it before each return), and trips instead of acting past its bound; then nothing
is applied until an operator resets it (``POST /api/v1/breaker/reset``, ``minder breaker
reset``), its trip is an event of its own for the notification destinations, and
``minder_actions_breaker_tripped`` is 1. Undos are always allowed, without the check: giving a
node back is safe (and only Minder's own mark for the alert is undone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import cast

from prometheus_client import CollectorRegistry, Counter, Gauge

from minder.actions.base import ActionError, ActionOutcome, NodeActuator, SchedulerView
from minder.actions.policy import ActionPolicy
from minder.core.alert import Alert, AlertKind
from minder.delivery.worker import DeliveryError
from minder.storage import Session, SessionFactory
from minder.storage.actions import (
    ACTIONS_BREAKER,
    ActionOutcomeKind,
    actions_enabled,
    alerts_acted_on,
    alerts_resumed,
    apply_modes,
    audit,
    get_breaker,
    machines_acted_on,
    trip_breaker,
    watched_machines,
)
from minder.storage.alerts import ACTIVE_STATUSES, get_alert
from minder.storage.outbox import (
    AlertEvent,
    Delivery,
    Destination,
    enqueue,
    record_alert_with_events,
)

logger = logging.getLogger(__name__)

BREAKER = ACTIONS_BREAKER
"""Name of the breaker in front of every scheduler action."""

APPLY_EVENTS = frozenset({AlertEvent.OPENED.value})
UNDO_EVENTS = frozenset(
    {
        AlertEvent.RESOLVED.value,
        AlertEvent.FALSE_POSITIVE.value,
        AlertEvent.CLEARED_BY_SELFCHECK.value,
    }
)

CHECK = "check"
"""The audit operation of a scheduler check that failed (its ``failed`` rows are no apply: no undo
is due after them, and the breaker does not count them)."""

_SHOWN_CHARS = 64
"""Characters of a job id quoted in a detail or a log line (it comes from a node's report)."""
_EVIDENCE_NODES = 16
"""The job's nodes listed in a ``suspicious_source`` alert's evidence (the count is given too)."""


def apply_operation(target: str) -> str:
    """The audit operation of taking a node out on ``target``: ``cordon`` or ``drain``."""
    return "cordon" if target == "kubernetes" else "drain"


def undo_operation(target: str) -> str:
    """The audit operation of giving a node back on ``target``: ``uncordon`` or ``resume``."""
    return "uncordon" if target == "kubernetes" else "resume"


def breaker_refusal(
    session: Session,
    policy: ActionPolicy,
    *,
    target: str,
    job: str,
    machine: str,
    alert_id: str,
    resume: bool,
    now: float,
) -> tuple[str | None, bool]:
    """Whether the actions circuit breaker refuses one more change, tripping it if this one
    would pass a bound; call it in the transaction that then audits the change as ``started``.

    The breaker's row is locked, so replicas decide one after another. Within ``window_s`` (or
    since an operator's reset) it counts the machines taken out (once per ``(job, machine)``)
    and the nodes returned after a passed self-check (once per ``(job, alert)``) whose drain for
    that alert is not counted in the window already (the same machine out and back is one
    machine). ``resume`` says which this change is: a drain of a machine already counted, or a
    return already counted for its alert or whose drain is counted, adds nothing.

    Returns
    -------
    tuple
        Why the breaker refuses (None: it allows), and whether it tripped just now (the caller
        then notifies: :func:`enqueue_breaker_trip`).
    """
    state = get_breaker(session, BREAKER, for_update=True)
    if state.tripped:
        return f"circuit breaker tripped ({state.reason}); reset it to act again", False
    # An operator's reset starts a new window: what was counted before it is forgiven.
    since = max(now - policy.window_s, state.reset_at or 0.0)
    drained = machines_acted_on(session, since=since, operation=apply_operation(target))
    drained_alerts = alerts_acted_on(session, since=since, operation=apply_operation(target))
    # A node out and back for the same alert is one machine: its drain counts, its return not.
    returned = {(j, a) for j, a in alerts_resumed(session, since=since) if a not in drained_alerts}
    if (
        (not resume and (job, machine) in drained)
        or (resume and (job, alert_id) in returned)
        or (resume and alert_id in drained_alerts)
    ):
        return None, False  # already counted: nothing new changes
    in_job = sum(1 for j, _ in drained if j == job) + sum(1 for j, _ in returned if j == job)
    total = len(drained) + len(returned)
    fleet = watched_machines(session)
    fleet_bound = policy.fleet_bound(fleet)
    what = "returns and drains" if returned or resume else "machines"
    reason = None
    if in_job + 1 > policy.max_per_job:
        reason = (
            f"{in_job + 1} {what} of job {_shown(job)} within {policy.window_s:.0f} s would "
            f"pass the bound of {policy.max_per_job}"
        )
    elif total + 1 > fleet_bound:
        reason = (
            f"{total + 1} {what} within {policy.window_s:.0f} s would pass "
            f"{policy.max_fraction:.1%} of the {fleet} watched machines ({fleet_bound})"
        )
    if reason is None:
        return None, False
    tripped = trip_breaker(session, BREAKER, reason, now=now)
    if tripped:
        logger.error("actions circuit breaker tripped: %s; no action until it is reset", reason)
    return f"circuit breaker tripped: {reason}", tripped


def enqueue_breaker_trip(
    session: Session,
    notify: Sequence[Destination],
    *,
    reason: str,
    target: str,
    mode: str,
    alert: Alert,
    now: float,
) -> None:
    """The ``breaker.tripped`` event of a trip, to the notification destinations."""
    enqueue(
        session,
        notify,
        event=AlertEvent.BREAKER_TRIPPED,
        data={
            "breaker": BREAKER,
            "reason": reason,
            "target": target,
            "mode": mode,
            "refused": {"alert_id": alert.id, "job": alert.job, "machine": alert.machine},
        },
        now=now,
    )


class ActionMetrics:
    """Scheduler actions by target, operation and outcome; the breaker's state."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.actions = Counter(
            "minder_actions",
            "Scheduler action decisions by target, operation and outcome (applied, unchanged, "
            "dry_run, failed, skipped_policy, skipped_opt_out, skipped_breaker, "
            "skipped_not_in_job)",
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
        Destinations that hear of the breaker and of ``suspicious_source`` alerts (webhooks,
        Kafka, Alertmanager); never an action destination.
    on_enqueued
        Called after breaker events or a ``suspicious_source`` alert were written (wakes their
        workers).
    on_applied
        Called after a node was taken out in enforce mode (wakes the self-check service).
    scheduler
        Where the check asks which nodes a job runs on; None: the actuator itself (the Slurm and
        Kubernetes actuators are their own :class:`~minder.actions.base.SchedulerView`).

    Raises
    ------
    TypeError
        Neither ``scheduler`` nor the actuator can say where a job runs: Minder does not act
        without the check.
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
        scheduler: SchedulerView | None = None,
        on_applied: Callable[[], None] | None = None,
    ) -> None:
        view: object = scheduler if scheduler is not None else actuator
        if not callable(getattr(view, "job_nodes", None)):
            raise TypeError(
                f"actions target {actuator.name!r} cannot say which nodes a job runs on (no "
                "job_nodes): Minder does not act on a node without the scheduler's check"
            )
        self.scheduler = cast(SchedulerView, view)
        self.actuator = actuator
        # The check (one or two reads) and the action (a read and a write), each within
        # scontrol's timeout (30 s by default); the Kubernetes client's requests take less.
        self.timeout_s = 2 * float(getattr(actuator, "timeout_s", 30.0))
        self.target = actuator.name
        self.destination = f"action:{actuator.name}"
        self.policy = policy
        self.sessions = sessions
        self.notify = list(notify)
        self.metrics = metrics
        self.on_enqueued = on_enqueued
        self.on_applied = on_applied
        self.clock = clock
        if metrics is not None:
            for operation in (self._operation(undo=False), self._operation(undo=True)):
                for outcome in ActionOutcomeKind:
                    metrics.actions.labels(self.target, operation, outcome.value)
            metrics.actions.labels(self.target, CHECK, ActionOutcomeKind.FAILED.value)
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
            refused = self._refusal(session, alert)
            if refused is not None:
                self._audit(session, alert, node, operation, *refused, delivery)
                return
        # Outside any transaction (the scheduler may take seconds): does the node run the job?
        nodes = self._job_nodes(alert, node, operation, delivery)
        if nodes is None or node not in nodes:
            self._not_in_job(alert, node, operation, nodes, delivery)
            return
        confirmed = f"{node} runs job {_shown(alert.job)} per {self.target}"
        with self.sessions.begin() as session:
            # Again: the alert may have ended, or the job opted out, while the scheduler answered.
            refused = self._refusal(session, alert)
            if refused is None and (why := self._breaker_refuses(session, alert)) is not None:
                refused = (ActionOutcomeKind.SKIPPED_BREAKER, why)
            if refused is not None:
                self._audit(session, alert, node, operation, *refused, delivery)
                return
            if not self.policy.enforce:
                detail = f"dry run: would {operation} {node} ({self._reason(alert)}); {confirmed}"
                self._audit(session, alert, node, operation, ActionOutcomeKind.DRY_RUN, detail,
                            delivery)  # fmt: skip
                logger.info("%s", detail)
                return
            # Counted by every replica's breaker from now on, before the target answers.
            self._audit(session, alert, node, operation, ActionOutcomeKind.STARTED,
                        f"{operation} {node} ({self._reason(alert)}); {confirmed}",
                        delivery)  # fmt: skip
        self._act(alert, node, operation, delivery, undo=False)

    def _refusal(self, session: Session, alert: Alert) -> tuple[ActionOutcomeKind, str] | None:
        """Why the policy, the alert's status or an opt-out refuse this apply, if they do."""
        why = self.policy.why_not(alert)
        if why is not None:
            return ActionOutcomeKind.SKIPPED_POLICY, why
        current = get_alert(session, alert.id).status
        if current not in ACTIVE_STATUSES:
            return (
                ActionOutcomeKind.SKIPPED_POLICY,
                f"the alert is {current.value} already: nothing to take out",
            )
        if alert.job in self.policy.opt_out_jobs:
            return (
                ActionOutcomeKind.SKIPPED_OPT_OUT,
                f"job {_shown(alert.job)} opted out of actions (MINDER_ACTIONS__OPT_OUT_JOBS)",
            )
        if not actions_enabled(session, alert.job):
            return (
                ActionOutcomeKind.SKIPPED_OPT_OUT,
                f"job {_shown(alert.job)} opted out of actions (job settings)",
            )
        return None

    # -- the scheduler's check -----------------------------------------------------------------
    def _job_nodes(
        self, alert: Alert, node: str, operation: str, delivery: Delivery
    ) -> frozenset[str] | None:
        """The nodes the scheduler runs the alert's job on; a failed check is audited as
        ``check``/``failed`` and raised as a :class:`DeliveryError` (retried while transient)."""
        try:
            return self.scheduler.job_nodes(alert.job)
        except ActionError as exc:
            detail = (
                f"cannot check with {self.target} that {node} runs job {_shown(alert.job)}, so "
                f"nothing is done: {exc}{' (retried)' if exc.transient else ''}"
            )
            with self.sessions.begin() as session:
                self._audit(session, alert, node, CHECK, ActionOutcomeKind.FAILED, detail,
                            delivery)  # fmt: skip
            raise DeliveryError(str(exc), transient=exc.transient) from None

    def _not_in_job(
        self,
        alert: Alert,
        node: str,
        operation: str,
        nodes: frozenset[str] | None,
        delivery: Delivery,
    ) -> None:
        """Audit ``skipped_not_in_job`` and raise a ``suspicious_source`` alert, in one
        transaction; nothing reaches the scheduler and the breaker counts nothing."""
        job = _shown(alert.job)
        reason = f"node {_shown(node)} is not running job {job} per {self.target}"
        if nodes is None:
            reason += f" ({self.target} knows no running job of that id)"
        else:
            reason += f" (the job runs on {len(nodes)} other node(s))"
        now = self.clock()
        suspicious = Alert(
            job=alert.job,
            machine=alert.machine,
            kind=AlertKind.SUSPICIOUS_SOURCE,
            metric=alert.metric,
            score=1.0,
            first_ts=now,
            detected_ts=now,
            devices=alert.devices,
            evidence={
                "original_alert_id": alert.id,
                "original_kind": alert.kind.value,
                "original_metric": alert.metric,
                "reason": reason,
                "target": self.target,
                "node": node,
                "job_running": nodes is not None,
                "job_node_count": len(nodes or ()),
                "job_nodes": sorted(nodes or ())[:_EVIDENCE_NODES],
            },
        )
        with self.sessions.begin() as session:
            self._audit(session, alert, node, operation, ActionOutcomeKind.SKIPPED_NOT_IN_JOB,
                        f"{reason}: not acted on; suspicious_source alert raised",
                        delivery)  # fmt: skip
            stored, created = record_alert_with_events(session, suspicious, self.notify, now=now)
        logger.warning(
            "alert %s (%s on %s): %s; not acted on, suspicious_source alert %s%s",
            alert.id,
            alert.kind.value,
            alert.machine[:_SHOWN_CHARS],
            reason,
            stored.id,
            "" if created else " (already open)",
        )
        if created and self.on_enqueued is not None:
            self.on_enqueued()

    def _breaker_refuses(self, session: Session, alert: Alert) -> str | None:
        """Why the breaker refuses this apply (tripping it now if this one would pass a bound)."""
        now = self.clock()
        why, tripped = breaker_refusal(
            session,
            self.policy,
            target=self.target,
            job=alert.job,
            machine=alert.machine,
            alert_id=alert.id,
            resume=False,
            now=now,
        )
        if tripped:
            if self.metrics is not None:
                self.metrics.breaker.set(1)
            state = get_breaker(session, BREAKER)
            enqueue_breaker_trip(session, self.notify, reason=state.reason or "",
                                 target=self.target, mode=self.policy.mode, alert=alert,
                                 now=now)  # fmt: skip
            if self.on_enqueued is not None:
                self.on_enqueued()
        return why

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
        if not undo and done.changed and self.on_applied is not None:
            self.on_applied()

    def _operation(self, *, undo: bool) -> str:
        return undo_operation(self.target) if undo else apply_operation(self.target)

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


def _shown(text: str) -> str:
    """A job id from a node's report, cut for a detail or a log line."""
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
