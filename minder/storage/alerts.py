"""Alert repository: dedup on record, queries, status changes.

Every function takes a :class:`~sqlalchemy.orm.Session` opened by the caller and leaves the
commit to it (changes are flushed, so constraint errors surface here).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from minder.core.alert import Alert, AlertKind, AlertStatus, allowed_statuses, check_transition
from minder.core.errors import NotFoundError, ValidationError
from minder.storage.jsonsafe import json_safe
from minder.storage.models import AlertRow
from minder.storage.records import AlertRecord, parse_status

logger = logging.getLogger(__name__)

ACTIVE_STATUSES: tuple[AlertStatus, ...] = (
    AlertStatus.OPEN,
    AlertStatus.ACKNOWLEDGED,
    AlertStatus.CONFIRMED,
)
"""Statuses under which an alert still absorbs new reports of its key (a confirmed fault is real
and its node stays out: it is active until a person closes it)."""

CLOSED_STATUSES: tuple[AlertStatus, ...] = (
    AlertStatus.RESOLVED,
    AlertStatus.FALSE_POSITIVE,
    AlertStatus.CLEARED_BY_SELFCHECK,
)
"""Final statuses: the alert ended (by a person, or by a self-check that returned the node)."""

SELFCHECK_EVIDENCE = "selfcheck"
"""The key of an alert's evidence that holds its latest self-check's verdict (kept when a
higher-scored report replaces the rest of the evidence)."""

MAX_PAGE = 500
"""Largest ``limit`` :func:`list_alerts` accepts."""


class StatusTransitionError(ValidationError):
    """The alert life cycle forbids the requested status change.

    Attributes
    ----------
    alert_id, current, requested
        Which alert, its stored status and the status asked for.
    allowed
        The statuses ``current`` may go to (empty for a final status).
    """

    def __init__(
        self,
        alert_id: str,
        current: AlertStatus,
        requested: AlertStatus,
        message: str,
        *,
        by_service: bool = False,
    ) -> None:
        super().__init__(f"alert {alert_id!r}: {message}")
        self.alert_id = alert_id
        self.current = current
        self.requested = requested
        self.allowed = allowed_transitions(current, by_service=by_service)


def allowed_transitions(current: AlertStatus, *, by_service: bool = False) -> list[AlertStatus]:
    """The statuses an alert in ``current`` may move to, per :func:`check_transition`: a
    person's choices, or (``by_service``) the self-check service's too."""
    return allowed_statuses(current, by_service=by_service)


def record_alert(
    session: Session, alert: Alert, seen_ts: float | None = None
) -> tuple[Alert, bool]:
    """Store ``alert``, or fold it into the alert that already describes the same fault.

    The fault is already known when an alert with the same ``id`` exists (whatever its status: a
    replayed report of a closed fault stays closed), or when an active alert (open, acknowledged
    or confirmed) has the same :func:`~minder.core.alert.alert_key`. Then that alert keeps its
    id, ``first_ts``, ``detected_ts`` and status, and gets: ``score`` = the max of both
    (``evidence`` follows the higher score, but a self-check's verdict in it stays),
    ``last_seen_ts`` = the latest, ``occurrences`` + 1, the union of ``devices``, and ``domain``
    if it had none. A resolved alert never absorbs a report under a new id: that is
    a new fault and a new alert.

    Parameters
    ----------
    seen_ts
        Data time of this report; ``alert.detected_ts`` when not given.

    Returns
    -------
    tuple
        The stored alert and ``True`` when it was inserted, ``False`` when an existing one was
        updated.

    Raises
    ------
    ValidationError
        When the score is not finite or the evidence is not JSON data.
    """
    if not math.isfinite(alert.score):
        raise ValidationError(
            f"alert {alert.id!r} has score {alert.score}: expected a finite number"
        )
    seen = alert.detected_ts if seen_ts is None else float(seen_ts)
    evidence = json_safe(alert.evidence, "evidence")
    now = time.time()

    existing = _find_same_fault(session, alert)
    if existing is None:
        row = _new_row(alert, evidence, seen, now)
        try:
            # a savepoint, so a concurrent insert of the same id costs a retry, not the caller's
            # whole transaction
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            existing = _find_same_fault(session, alert)
            if existing is None:
                raise
            logger.debug("alert %s was inserted concurrently; updating it instead", alert.id)
        else:
            return _to_alert(row), True
    _absorb(existing, alert, evidence, seen, now)
    session.flush()
    return _to_alert(existing), False


def _find_same_fault(session: Session, alert: Alert) -> AlertRow | None:
    by_id = session.get(AlertRow, alert.id, with_for_update=True)
    if by_id is not None:
        return by_id
    query = (
        select(AlertRow)
        .where(AlertRow.key == alert.key, AlertRow.status.in_(ACTIVE_STATUSES))
        .order_by(AlertRow.detected_ts.desc(), AlertRow.id)
        .limit(1)
        .with_for_update()
    )
    return session.scalars(query).first()


def _new_row(alert: Alert, evidence: dict[str, Any], seen_ts: float, now: float) -> AlertRow:
    return AlertRow(
        id=alert.id,
        key=alert.key,
        job=alert.job,
        machine=alert.machine,
        devices=list(alert.devices),
        kind=alert.kind.value,
        metric=alert.metric,
        score=float(alert.score),
        first_ts=float(alert.first_ts),
        detected_ts=float(alert.detected_ts),
        last_seen_ts=max(seen_ts, float(alert.detected_ts)),
        occurrences=1,
        domain=alert.domain,
        status=alert.status.value,
        evidence=evidence,
        created_at=now,
        updated_at=now,
    )


def _absorb(
    row: AlertRow, alert: Alert, evidence: dict[str, Any], seen_ts: float, now: float
) -> None:
    if alert.score > row.score:
        row.score = float(alert.score)
        kept = row.evidence.get(SELFCHECK_EVIDENCE) if isinstance(row.evidence, dict) else None
        # the detector's evidence follows the higher score; a self-check's verdict stays
        row.evidence = evidence if kept is None else {**evidence, SELFCHECK_EVIDENCE: kept}
    row.last_seen_ts = max(row.last_seen_ts, seen_ts)
    row.occurrences = row.occurrences + 1
    new_devices = [d for d in alert.devices if d not in row.devices]
    if new_devices:
        # a new list object: the JSON column only notices reassignment
        row.devices = [*row.devices, *new_devices]
    if not row.domain and alert.domain:
        row.domain = alert.domain
    row.updated_at = now


def _to_alert(row: AlertRow) -> Alert:
    return Alert(
        id=row.id,
        job=row.job,
        machine=row.machine,
        devices=tuple(row.devices),
        kind=AlertKind(row.kind),
        metric=row.metric,
        score=row.score,
        first_ts=row.first_ts,
        detected_ts=row.detected_ts,
        domain=row.domain,
        status=AlertStatus(row.status),
        evidence=dict(row.evidence),
    )


def _to_record(row: AlertRow) -> AlertRecord:
    return AlertRecord(
        alert=_to_alert(row),
        last_seen_ts=row.last_seen_ts,
        occurrences=row.occurrences,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _get_row(session: Session, alert_id: str, *, for_update: bool = False) -> AlertRow:
    row = session.get(AlertRow, alert_id, with_for_update=for_update)
    if row is None:
        raise NotFoundError(f"no alert with id {alert_id!r}")
    return row


def get_alert_record(session: Session, alert_id: str) -> AlertRecord:
    """The alert ``alert_id`` with its bookkeeping; :class:`NotFoundError` if absent."""
    return _to_record(_get_row(session, alert_id))


def get_alert(session: Session, alert_id: str) -> Alert:
    """The alert ``alert_id``; :class:`NotFoundError` naming the id if absent."""
    return _to_alert(_get_row(session, alert_id))


def _parse_kind(value: AlertKind | str) -> AlertKind:
    try:
        return AlertKind(value)
    except ValueError:
        allowed = [k.value for k in AlertKind]
        raise ValidationError(f"unknown alert kind {value!r}: allowed {allowed}") from None


def _as_set(value: str | Iterable[str] | None, parse: Callable[[str], StrEnum]) -> list[str] | None:
    # enum members are str too: one value or an iterable of values
    if value is None:
        return None
    values: Iterable[str] = [value] if isinstance(value, str) else value
    return sorted({parse(v).value for v in values})


def _filters(
    job: str | None,
    machine: str | None,
    kind: AlertKind | str | Iterable[AlertKind | str] | None,
    status: AlertStatus | str | Iterable[AlertStatus | str] | None,
    since: float | None,
    until: float | None,
) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if job is not None:
        conditions.append(AlertRow.job == job)
    if machine is not None:
        conditions.append(AlertRow.machine == machine)
    kinds = _as_set(kind, _parse_kind)
    if kinds is not None:
        conditions.append(AlertRow.kind.in_(kinds))
    statuses = _as_set(status, parse_status)
    if statuses is not None:
        conditions.append(AlertRow.status.in_(statuses))
    if since is not None:
        conditions.append(AlertRow.detected_ts >= since)
    if until is not None:
        conditions.append(AlertRow.detected_ts < until)
    return conditions


def list_alert_records(
    session: Session,
    job: str | None = None,
    machine: str | None = None,
    kind: AlertKind | str | Iterable[AlertKind | str] | None = None,
    status: AlertStatus | str | Iterable[AlertStatus | str] | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[AlertRecord], int]:
    """One page of alerts, newest detected first, and how many match in total.

    ``kind`` and ``status`` take one value or several (any of them matches). ``since`` (included)
    and ``until`` (excluded) bound ``detected_ts``, unix seconds.

    Raises
    ------
    ValidationError
        For an unknown kind or status, ``limit`` outside 1..500 or a negative ``offset``.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit {limit} is out of range: expected 1..{MAX_PAGE}")
    if offset < 0:
        raise ValidationError(f"offset {offset} is negative: expected >= 0")
    conditions = _filters(job, machine, kind, status, since, until)
    total = session.scalar(select(func.count()).select_from(AlertRow).where(*conditions)) or 0
    query = (
        select(AlertRow)
        .where(*conditions)
        .order_by(AlertRow.detected_ts.desc(), AlertRow.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return [_to_record(row) for row in session.scalars(query)], total


def list_alerts(
    session: Session,
    job: str | None = None,
    machine: str | None = None,
    kind: AlertKind | str | Iterable[AlertKind | str] | None = None,
    status: AlertStatus | str | Iterable[AlertStatus | str] | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Alert], int]:
    """Like :func:`list_alert_records`, returning the alerts only."""
    records, total = list_alert_records(
        session, job, machine, kind, status, since, until, limit, offset
    )
    return [record.alert for record in records], total


def open_alerts(session: Session, job: str | None = None) -> list[Alert]:
    """Every active alert (open, acknowledged or confirmed: :data:`ACTIVE_STATUSES`) of ``job``,
    newest detected first."""
    query = select(AlertRow).where(AlertRow.status.in_(ACTIVE_STATUSES))
    if job is not None:
        query = query.where(AlertRow.job == job)
    query = query.order_by(AlertRow.detected_ts.desc(), AlertRow.id.desc())
    return [_to_alert(row) for row in session.scalars(query)]


def set_alert_status(session: Session, alert_id: str, status: AlertStatus | str) -> Alert:
    """Move alert ``alert_id`` to ``status`` (setting its current status again changes nothing).

    Raises
    ------
    NotFoundError
        When no alert has that id.
    ValidationError
        For an unknown status name.
    StatusTransitionError
        When the life cycle forbids the change; it lists the allowed statuses.
    """
    return transition_alert_status(session, alert_id, status)[0]


def transition_alert_status(
    session: Session,
    alert_id: str,
    status: AlertStatus | str | None,
    *,
    by_service: bool = False,
    evidence: dict[str, Any] | None = None,
) -> tuple[Alert, AlertStatus]:
    """:func:`set_alert_status`, also returning the status before, read under the row's lock (two
    concurrent identical changes: one sees the change, the other sees nothing to do).

    Parameters
    ----------
    status
        The new status; None keeps the current one (to change the evidence only).
    by_service
        True only for the self-check service applying a verdict: it may set ``confirmed`` and
        ``cleared_by_selfcheck``, which a person may not (:func:`check_transition`).
    evidence
        Keys to set in the alert's evidence with the change (the self-check's verdict under
        :data:`SELFCHECK_EVIDENCE`); JSON data only.
    """
    row = _get_row(session, alert_id, for_update=True)
    current = AlertStatus(row.status)
    requested = current if status is None else parse_status(status)
    try:
        check_transition(current, requested, by_service=by_service)
    except ValidationError as exc:
        raise StatusTransitionError(
            alert_id, current, requested, str(exc), by_service=by_service
        ) from None
    changed = False
    if evidence:
        # a new dict object: the JSON column only notices reassignment
        row.evidence = {**dict(row.evidence), **json_safe(evidence, "evidence")}
        changed = True
    if requested is not current:
        row.status = requested.value
        changed = True
        logger.info("alert %s: %s -> %s", alert_id, current.value, requested.value)
    if changed:
        row.updated_at = time.time()
        session.flush()
    return _to_alert(row), current


def closed_alerts_since(session: Session, since: float, limit: int = 10_000) -> list[Alert]:
    """Alerts resolved, dismissed or cleared by a self-check (wall time) at or after ``since``,
    newest first."""
    query = (
        select(AlertRow)
        .where(
            AlertRow.status.in_([s.value for s in CLOSED_STATUSES]),
            AlertRow.updated_at >= since,
        )
        .order_by(AlertRow.updated_at.desc())
        .limit(limit)
    )
    return [_to_alert(row) for row in session.scalars(query)]


def count_active_alerts_by_machine(
    session: Session, job: str | None = None
) -> dict[tuple[str, str, str], int]:
    """Active alerts per ``(job, machine, kind)`` (of ``job``, or of every job)."""
    query = (
        select(AlertRow.job, AlertRow.machine, AlertRow.kind, func.count())
        .where(AlertRow.status.in_(ACTIVE_STATUSES))
        .group_by(AlertRow.job, AlertRow.machine, AlertRow.kind)
    )
    if job is not None:
        query = query.where(AlertRow.job == job)
    return {(j, m, str(k)): int(n) for j, m, k, n in session.execute(query)}


def count_active_alerts(session: Session, jobs: Sequence[str] | None = None) -> dict[str, int]:
    """Active alerts (:data:`ACTIVE_STATUSES`) per job (of ``jobs``, or of every job)."""
    query = (
        select(AlertRow.job, func.count())
        .where(AlertRow.status.in_(ACTIVE_STATUSES))
        .group_by(AlertRow.job)
    )
    if jobs is not None:
        query = query.where(AlertRow.job.in_(list(jobs)))
    return {job: int(count) for job, count in session.execute(query)}
