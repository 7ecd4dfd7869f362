"""Scheduler actions' records: the audit trail, circuit breakers and per-job settings."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from minder.core.errors import ValidationError
from minder.storage.models import ActionAuditRow, BreakerRow, JobRow, JobSettingRow

MAX_PAGE = 500
MAX_DETAIL_CHARS = 2000


class ActionOutcomeKind(StrEnum):
    """How an action request ended (one audit row each)."""

    APPLIED = "applied"
    """The target took the node out of scheduling (or returned it, for an undo)."""
    UNCHANGED = "unchanged"
    """Nothing to do: already in the wanted state, or not Minder's to undo."""
    DRY_RUN = "dry_run"
    """Log-only mode: what would have been done."""
    STARTED = "started"
    """The request is being sent to the target (written with the breaker's check, so replicas
    count it before its result is known)."""
    FAILED = "failed"
    """The target refused or could not be reached (retried while transient)."""
    SKIPPED_POLICY = "skipped_policy"
    """The policy does not act on this alert (kind, domain alert, alert no longer open)."""
    SKIPPED_OPT_OUT = "skipped_opt_out"
    """The job opted out of actions."""
    SKIPPED_BREAKER = "skipped_breaker"
    """The circuit breaker is open."""
    SKIPPED_NOT_IN_JOB = "skipped_not_in_job"
    """The scheduler says the node does not run the alert's job (or knows no such running job):
    a forged or misrouted report. Nothing is done, a ``suspicious_source`` alert is raised, and
    the breaker's budget is not spent."""


ACTED = (
    ActionOutcomeKind.APPLIED,
    ActionOutcomeKind.UNCHANGED,
    ActionOutcomeKind.DRY_RUN,
    ActionOutcomeKind.STARTED,
)
"""Outcomes of an apply that count against the circuit breaker's bounds: only applies whose node
the scheduler confirmed runs the alert's job get this far (``skipped_*`` never count)."""

ATTEMPTED = (*ACTED, ActionOutcomeKind.FAILED)
"""Outcomes of an apply after which the node may be out of scheduling: an undo is due."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One row of the action audit trail."""

    id: int
    created_at: float
    alert_id: str | None
    job: str | None
    machine: str | None
    node: str | None
    target: str
    operation: str
    mode: str
    outcome: str
    detail: str
    delivery_id: str | None

    def to_dict(self) -> dict[str, Any]:
        """As JSON data."""
        return {
            "id": self.id,
            "created_at": self.created_at,
            "alert_id": self.alert_id,
            "job": self.job,
            "machine": self.machine,
            "node": self.node,
            "target": self.target,
            "operation": self.operation,
            "mode": self.mode,
            "outcome": self.outcome,
            "detail": self.detail,
            "delivery_id": self.delivery_id,
        }


def audit(
    session: Session,
    *,
    target: str,
    operation: str,
    mode: str,
    outcome: ActionOutcomeKind | str,
    detail: str,
    alert_id: str | None = None,
    job: str | None = None,
    machine: str | None = None,
    node: str | None = None,
    delivery_id: str | None = None,
    now: float | None = None,
) -> AuditEntry:
    """Append one audit row."""
    row = ActionAuditRow(
        created_at=time.time() if now is None else now,
        alert_id=alert_id,
        job=job,
        machine=machine,
        node=node,
        target=target,
        operation=operation,
        mode=mode,
        outcome=ActionOutcomeKind(outcome).value,
        detail=detail[:MAX_DETAIL_CHARS],
        delivery_id=delivery_id,
    )
    session.add(row)
    session.flush()
    return _entry(row)


def list_audit(
    session: Session,
    *,
    alert_id: str | None = None,
    machine: str | None = None,
    job: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[AuditEntry], int]:
    """Audit rows matching every filter, newest first, and how many match in all."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit is {limit}: expected 1 to {MAX_PAGE}")
    if offset < 0:
        raise ValidationError(f"offset is {offset}: expected >= 0")
    conditions = []
    if alert_id is not None:
        conditions.append(ActionAuditRow.alert_id == alert_id)
    if machine is not None:
        conditions.append(ActionAuditRow.machine == machine)
    if job is not None:
        conditions.append(ActionAuditRow.job == job)
    if outcome is not None:
        try:
            conditions.append(ActionAuditRow.outcome == ActionOutcomeKind(outcome).value)
        except ValueError:
            allowed = [o.value for o in ActionOutcomeKind]
            raise ValidationError(
                f"unknown action outcome {outcome[:40]!r}: allowed {allowed}"
            ) from None
    total = session.scalar(select(func.count()).select_from(ActionAuditRow).where(*conditions))
    rows = session.scalars(
        select(ActionAuditRow)
        .where(*conditions)
        .order_by(ActionAuditRow.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return [_entry(row) for row in rows], int(total or 0)


def machines_acted_on(
    session: Session, *, since: float, operation: str, job: str | None = None
) -> set[tuple[str | None, str | None]]:
    """Distinct ``(job, machine)`` an apply acted on (or would have, in dry run) since ``since``."""
    query = select(ActionAuditRow.job, ActionAuditRow.machine).where(
        ActionAuditRow.created_at >= since,
        ActionAuditRow.operation == operation,
        ActionAuditRow.outcome.in_([o.value for o in ACTED]),
    )
    if job is not None:
        query = query.where(ActionAuditRow.job == job)
    return {(j, m) for j, m in session.execute(query.distinct())}


def alerts_acted_on(session: Session, *, since: float, operation: str) -> set[str]:
    """Distinct alert ids an apply of ``operation`` acted on (or would have, in dry run) since
    ``since``: the circuit breaker does not count again the return of a node whose drain for
    the same alert it counts already."""
    query = select(ActionAuditRow.alert_id).where(
        ActionAuditRow.created_at >= since,
        ActionAuditRow.operation == operation,
        ActionAuditRow.outcome.in_([o.value for o in ACTED]),
    )
    return {a for a in session.scalars(query.distinct()) if a is not None}


RESUME_OPERATION = "selfcheck_resume"
"""The audit operation of a node returned to scheduling after its self-check passed."""


def alerts_resumed(
    session: Session, *, since: float, job: str | None = None
) -> set[tuple[str | None, str | None]]:
    """Distinct ``(job, alert_id)`` whose node a passed self-check returned (or started to
    return) since ``since``: the circuit breaker counts each such return, as it counts drains
    (a node that flaps between a fault and a passed check is one return per alert)."""
    query = select(ActionAuditRow.job, ActionAuditRow.alert_id).where(
        ActionAuditRow.created_at >= since,
        ActionAuditRow.operation == RESUME_OPERATION,
        ActionAuditRow.outcome.in_(
            [ActionOutcomeKind.STARTED.value, ActionOutcomeKind.APPLIED.value]
        ),
    )
    if job is not None:
        query = query.where(ActionAuditRow.job == job)
    return {(j, a) for j, a in session.execute(query.distinct())}


def audited(session: Session, alert_id: str, operation: str) -> bool:
    """Whether the audit trail has a row of ``operation`` for ``alert_id``."""
    found = session.scalar(
        select(ActionAuditRow.id)
        .where(ActionAuditRow.alert_id == alert_id, ActionAuditRow.operation == operation)
        .limit(1)
    )
    return found is not None


def apply_modes(session: Session, alert_id: str, operation: str) -> set[str]:
    """Modes (``enforce``, ``dry_run``) in which an apply was attempted for ``alert_id``."""
    query = select(ActionAuditRow.mode).where(
        ActionAuditRow.alert_id == alert_id,
        ActionAuditRow.operation == operation,
        ActionAuditRow.outcome.in_([o.value for o in ATTEMPTED]),
    )
    return set(session.scalars(query.distinct()))


def _entry(row: ActionAuditRow) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        created_at=row.created_at,
        alert_id=row.alert_id,
        job=row.job,
        machine=row.machine,
        node=row.node,
        target=row.target,
        operation=row.operation,
        mode=row.mode,
        outcome=row.outcome,
        detail=row.detail,
        delivery_id=row.delivery_id,
    )


# -- circuit breakers --------------------------------------------------------------------------

ACTIONS_BREAKER = "actions"
"""The breaker in front of every scheduler action (its row is created by migration 0003)."""


@dataclass(frozen=True, slots=True)
class BreakerState:
    """A circuit breaker: closed (acting) or tripped (not acting until reset)."""

    name: str
    tripped: bool
    tripped_at: float | None
    reason: str | None
    reset_at: float | None
    reset_by: str | None

    def to_dict(self) -> dict[str, Any]:
        """As JSON data."""
        return {
            "name": self.name,
            "tripped": self.tripped,
            "tripped_at": self.tripped_at,
            "reason": self.reason,
            "reset_at": self.reset_at,
            "reset_by": self.reset_by,
        }


def get_breaker(session: Session, name: str, *, for_update: bool = False) -> BreakerState:
    """The breaker ``name`` (closed when never tripped).

    ``for_update`` locks its row until the transaction ends (creating the row first when a
    database has none), so concurrent checks by several replicas happen one after another.
    """
    row = session.get(BreakerRow, name, with_for_update=for_update)
    if row is None and for_update:
        try:
            with session.begin_nested():
                session.add(BreakerRow(name=name, tripped=0, updated_at=time.time()))
        except IntegrityError:
            pass  # created concurrently
        row = session.get(BreakerRow, name, with_for_update=True, populate_existing=True)
    if row is None:
        return BreakerState(name, False, None, None, None, None)
    return _breaker(row)


def trip_breaker(session: Session, name: str, reason: str, *, now: float | None = None) -> bool:
    """Trip ``name``; returns False when it already was tripped (nothing changed)."""
    wall = time.time() if now is None else now
    row = session.get(BreakerRow, name, with_for_update=True)
    if row is None:
        row = BreakerRow(name=name, tripped=0, updated_at=wall)
        session.add(row)
    if row.tripped:
        return False
    row.tripped = 1
    row.tripped_at = wall
    row.reason = reason[:MAX_DETAIL_CHARS]
    row.updated_at = wall
    session.flush()
    return True


def reset_breaker(session: Session, name: str, *, by: str, now: float | None = None) -> bool:
    """Close ``name`` again (an operator's decision); returns False when it was not tripped."""
    wall = time.time() if now is None else now
    row = session.get(BreakerRow, name, with_for_update=True)
    if row is None or not row.tripped:
        return False
    row.tripped = 0
    row.reset_at = wall
    row.reset_by = by[:255]
    row.updated_at = wall
    session.flush()
    return True


def _breaker(row: BreakerRow) -> BreakerState:
    return BreakerState(
        name=row.name,
        tripped=bool(row.tripped),
        tripped_at=row.tripped_at,
        reason=row.reason,
        reset_at=row.reset_at,
        reset_by=row.reset_by,
    )


# -- per-job settings ---------------------------------------------------------------------------


def actions_enabled(session: Session, job: str) -> bool:
    """Whether Minder may act on ``job``'s machines (True unless the job opted out)."""
    row = session.get(JobSettingRow, job)
    return True if row is None else bool(row.actions_enabled)


def set_actions_enabled(
    session: Session, job: str, enabled: bool, *, by: str | None = None, now: float | None = None
) -> None:
    """Opt ``job`` in or out of actions."""
    if not job or len(job) > 255:
        raise ValidationError(f"job {job[:40]!r}: expected 1 to 255 characters")
    wall = time.time() if now is None else now
    row = session.get(JobSettingRow, job, with_for_update=True)
    if row is None:
        row = JobSettingRow(job=job, actions_enabled=int(enabled), updated_at=wall, updated_by=by)
        session.add(row)
    else:
        row.actions_enabled = int(enabled)
        row.updated_at = wall
        row.updated_by = by
    session.flush()


def opted_out_jobs(session: Session) -> list[str]:
    """Jobs that opted out of actions."""
    return list(
        session.scalars(
            select(JobSettingRow.job).where(JobSettingRow.actions_enabled == 0).order_by("job")
        )
    )


def watched_machines(session: Session) -> int:
    """Machines of the active jobs (the base of the breaker's fleet-wide fraction)."""
    total = session.scalar(
        select(func.coalesce(func.sum(JobRow.machine_count), 0)).where(JobRow.status == "active")
    )
    return int(total or 0)
