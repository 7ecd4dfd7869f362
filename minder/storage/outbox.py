"""The outbox: alert events and actions to deliver, written in the alert's own transaction.

An alert transition (opened, acknowledged, resolved, false positive, and a self-check's
confirmed or cleared_by_selfcheck) and the actions it calls for
are rows of ``outbox``, one per destination, added by :func:`enqueue` in the same database
transaction that records the transition. Delivery workers (``minder.delivery``) then
:func:`claim_due` rows, deliver them and :func:`mark_delivered` or :func:`mark_failed` them. A
crash between the transition and its delivery loses nothing: the row waits in the database, and
a restarted service resumes from it. A claimed row is leased to its worker for
:data:`DEFAULT_LEASE_S`, renewed (:func:`renew_leases`) while the worker is still delivering it,
so a slow delivery is never sent twice at once and a crashed worker's rows are redelivered
shortly after its last renewal. Delivery is at-least-once: a row's ``delivery_id`` stays the
same across attempts and restarts, so receivers de-duplicate on it.

Order: the rows of one alert reach one destination in the order they were written (an undo never
overtakes its apply), because a row is claimed only when no earlier row of the same alert is
still pending for that destination.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, aliased

from minder.core.alert import Alert, AlertStatus
from minder.core.errors import ValidationError
from minder.storage.alerts import (
    ACTIVE_STATUSES,
    SELFCHECK_EVIDENCE,
    record_alert,
    transition_alert_status,
)
from minder.storage.jsonsafe import json_safe
from minder.storage.models import OutboxRow

MAX_ERROR_CHARS = 500
"""Longest ``last_error`` kept (receivers' answers are untrusted text)."""

MAX_PAGE = 500
"""Largest ``limit`` :func:`list_deliveries` accepts."""

DEFAULT_LEASE_S = 15.0
"""How long a claimed row stays a worker's without a heartbeat (:func:`renew_leases`): after a
crash mid-delivery, another worker redelivers it this long after the last renewal."""


class DeliveryStatus(StrEnum):
    """Where an outbox row stands: ``pending → delivered | expired``."""

    PENDING = "pending"
    DELIVERED = "delivered"
    EXPIRED = "expired"


class AlertEvent(StrEnum):
    """Event types of the outbox (the ``type`` of a webhook payload)."""

    OPENED = "alert.opened"
    ACKNOWLEDGED = "alert.acknowledged"
    RESOLVED = "alert.resolved"
    FALSE_POSITIVE = "alert.false_positive"
    CONFIRMED = "alert.confirmed"
    """A self-check of the alert's drained node failed: the node stays out."""
    CLEARED_BY_SELFCHECK = "alert.cleared_by_selfcheck"
    """A self-check of the alert's drained node passed: the node was returned."""
    SELFCHECK_INCONCLUSIVE = "selfcheck.inconclusive"
    """A self-check gave no verdict (crashed, timed out, no slot or node in time) and no retry is
    left, or a passed check could not return the node: it stays out, a person decides."""
    BREAKER_TRIPPED = "breaker.tripped"
    BREAKER_RESET = "breaker.reset"


EVENT_OF_STATUS: dict[AlertStatus, AlertEvent] = {
    AlertStatus.OPEN: AlertEvent.OPENED,
    AlertStatus.ACKNOWLEDGED: AlertEvent.ACKNOWLEDGED,
    AlertStatus.RESOLVED: AlertEvent.RESOLVED,
    AlertStatus.FALSE_POSITIVE: AlertEvent.FALSE_POSITIVE,
    AlertStatus.CONFIRMED: AlertEvent.CONFIRMED,
    AlertStatus.CLEARED_BY_SELFCHECK: AlertEvent.CLEARED_BY_SELFCHECK,
}
"""The event each alert status is reached by."""

PAYLOAD_VERSION = 1
"""Version of the event payload (docs/webhooks.md); bumped on an incompatible change."""


@dataclass(frozen=True, slots=True)
class Destination:
    """Somewhere events go, and which of them.

    Attributes
    ----------
    name
        ``kafka``, ``webhook:<name>``, ``alertmanager``, ``action:<target>``.
    events
        The event types it receives.
    ttl_s
        How long a row is retried before it expires.
    hold_s
        Per alert kind, how long after the transition the row becomes due (e.g. act on a
        similarity alert only once it has held for a while); missing kinds are due at once.
    """

    name: str
    events: frozenset[str]
    ttl_s: float = 24 * 3600.0
    hold_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One outbox row, as the workers and the API see it."""

    id: int
    delivery_id: str
    destination: str
    event: str
    alert_id: str | None
    job: str | None
    payload: dict[str, Any]
    status: DeliveryStatus
    attempts: int
    created_at: float
    next_attempt_at: float
    expires_at: float
    delivered_at: float | None
    last_error: str | None

    def to_dict(self, *, with_payload: bool = False) -> dict[str, Any]:
        """As JSON data (the payload only when asked)."""
        data: dict[str, Any] = {
            "id": self.id,
            "delivery_id": self.delivery_id,
            "destination": self.destination,
            "event": self.event,
            "alert_id": self.alert_id,
            "job": self.job,
            "status": self.status.value,
            "attempts": self.attempts,
            "created_at": self.created_at,
            "next_attempt_at": self.next_attempt_at,
            "expires_at": self.expires_at,
            "delivered_at": self.delivered_at,
            "last_error": self.last_error,
        }
        if with_payload:
            data["payload"] = self.payload
        return data


def event_payload(event: str, data: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The body every destination gets: ``{"type", "timestamp", "version", "data"}``.

    The shape follows the Standard Webhooks payload structure (``type``, ``timestamp``, ``data``).
    """
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    return {
        "type": event,
        "timestamp": stamp,
        "version": PAYLOAD_VERSION,
        "data": json_safe(dict(data), "event data"),
    }


def alert_event_data(alert: Alert, **extra: Any) -> dict[str, Any]:
    """``data`` of an alert event: the alert as the API shows it, plus ``extra``."""
    return {"alert": alert.to_dict(), **extra}


def enqueue(
    session: Session,
    destinations: Sequence[Destination],
    *,
    event: str,
    data: Mapping[str, Any],
    alert: Alert | None = None,
    now: float | None = None,
) -> list[str]:
    """Add one row per destination that takes ``event``; returns their delivery ids.

    Call it in the transaction that records what happened, so both commit or neither does.
    """
    wall = time.time() if now is None else now
    payload = event_payload(event, data, wall)
    ids = []
    for destination in destinations:
        if event not in destination.events:
            continue
        # A hold delays acting on a new alert; its end (resolve, dismiss) is never held.
        hold = (
            destination.hold_s.get(alert.kind.value, 0.0)
            if alert is not None and event == AlertEvent.OPENED
            else 0.0
        )
        delivery_id = f"msg_{uuid.uuid4().hex}"
        session.add(
            OutboxRow(
                delivery_id=delivery_id,
                destination=destination.name,
                event=event,
                alert_id=alert.id if alert is not None else None,
                job=alert.job if alert is not None else None,
                payload=payload,
                status=DeliveryStatus.PENDING.value,
                attempts=0,
                created_at=wall,
                next_attempt_at=wall + hold,
                expires_at=wall + hold + destination.ttl_s,
                lease_until=0.0,
            )
        )
        ids.append(delivery_id)
    if ids:
        session.flush()
    return ids


def record_alert_with_events(
    session: Session,
    alert: Alert,
    destinations: Sequence[Destination],
    *,
    seen_ts: float | None = None,
    now: float | None = None,
) -> tuple[Alert, bool]:
    """:func:`~minder.storage.alerts.record_alert`, plus the ``alert.opened`` rows of a new
    fault, in the caller's transaction."""
    stored, created = record_alert(session, alert, seen_ts=seen_ts)
    if created:
        enqueue(
            session,
            destinations,
            event=AlertEvent.OPENED,
            data=alert_event_data(stored),
            alert=stored,
            now=now,
        )
    return stored, created


def change_alert_status(
    session: Session,
    alert_id: str,
    status: AlertStatus | str,
    destinations: Sequence[Destination],
    *,
    by: str | None = None,
    now: float | None = None,
) -> Alert:
    """:func:`~minder.storage.alerts.set_alert_status`, plus the event rows of the transition
    (none when the status does not change), in the caller's transaction."""
    after, before = transition_alert_status(session, alert_id, status)
    if after.status is not before:
        if after.status not in ACTIVE_STATUSES:
            _release_held(session, alert_id, time.time() if now is None else now)
        enqueue(
            session,
            destinations,
            event=EVENT_OF_STATUS[after.status],
            data=alert_event_data(after, previous_status=before.value, changed_by=by),
            alert=after,
            now=now,
        )
    return after


def _release_held(session: Session, alert_id: str, now: float) -> None:
    """The alert ended: an action still held back for it (a similarity alert's hold) is due now,
    so the executor records at once that there is nothing to do, and the end's own rows do not
    wait behind it."""
    session.execute(
        update(OutboxRow)
        .where(
            OutboxRow.alert_id == alert_id,
            OutboxRow.status == DeliveryStatus.PENDING.value,
            OutboxRow.attempts == 0,
            OutboxRow.next_attempt_at > now,
        )
        .values(next_attempt_at=now)
    )


def record_selfcheck_verdict(
    session: Session,
    alert_id: str,
    status: AlertStatus | None,
    evidence: Mapping[str, Any],
    destinations: Sequence[Destination],
    *,
    event: AlertEvent,
    now: float | None = None,
) -> Alert:
    """Apply a self-check's verdict to its alert, with its event rows, in the caller's
    transaction: the service's own change (a person cannot set these statuses).

    The alert's ``evidence["selfcheck"]`` becomes ``evidence``, and ``status`` (``confirmed``,
    ``cleared_by_selfcheck``; None: unchanged, for an inconclusive check) is set. The event
    (``alert.confirmed``, ``alert.cleared_by_selfcheck``, ``selfcheck.inconclusive``) is written
    even when the status stays (a check an operator asked for that fails again is news too), with
    ``data`` = the alert, ``previous_status``, ``changed_by`` (``selfcheck``) and ``selfcheck``.

    Raises
    ------
    NotFoundError
        No alert has that id.
    StatusTransitionError
        The alert's status does not allow ``status`` (it was closed meanwhile).
    """
    data = json_safe(dict(evidence), "self-check evidence")
    after, before = transition_alert_status(
        session, alert_id, status, by_service=True, evidence={SELFCHECK_EVIDENCE: data}
    )
    if after.status is not before and after.status not in ACTIVE_STATUSES:
        _release_held(session, alert_id, time.time() if now is None else now)
    enqueue(
        session,
        destinations,
        event=event,
        data=alert_event_data(
            after, previous_status=before.value, changed_by="selfcheck", selfcheck=data
        ),
        alert=after,
        now=now,
    )
    return after


def claim_due(
    session: Session,
    destination: str,
    *,
    now: float,
    owner: str,
    limit: int = 50,
    lease_s: float = DEFAULT_LEASE_S,
) -> list[Delivery]:
    """Lease up to ``limit`` due rows of ``destination`` to ``owner``, oldest first.

    A row is due when pending, past ``next_attempt_at`` and not leased; of one alert's rows only
    the oldest pending one can be due, so an alert's events reach a destination in order. Rows
    past their time to live are expired here, never sent late. The lease ends at
    :func:`mark_delivered` / :func:`mark_failed` / :func:`release`, or ``lease_s`` after its last
    :func:`renew_leases` if the worker died; a worker whose lease ran out and whose row another
    worker claimed no longer owns the row (the marks check it).
    """
    session.execute(
        update(OutboxRow)
        .where(
            OutboxRow.destination == destination,
            OutboxRow.status == DeliveryStatus.PENDING.value,
            OutboxRow.expires_at <= now,
            OutboxRow.lease_until <= now,
        )
        .values(status=DeliveryStatus.EXPIRED.value, last_error="time to live ran out")
    )
    earlier = aliased(OutboxRow)
    blocked = (
        select(earlier.id)
        .where(
            earlier.destination == OutboxRow.destination,
            earlier.alert_id == OutboxRow.alert_id,
            earlier.status == DeliveryStatus.PENDING.value,
            earlier.id < OutboxRow.id,
        )
        .exists()
    )
    query = (
        select(OutboxRow)
        .where(
            OutboxRow.destination == destination,
            OutboxRow.status == DeliveryStatus.PENDING.value,
            OutboxRow.next_attempt_at <= now,
            OutboxRow.lease_until <= now,
            ~blocked,
        )
        .order_by(OutboxRow.id)
        .limit(limit)
        .with_for_update()
    )
    claimed = list(session.scalars(query))
    for row in claimed:
        row.lease_until = now + lease_s
        row.lease_owner = owner
    session.flush()
    return [_record(row) for row in claimed]


def renew_leases(session: Session, row_ids: Sequence[int], *, owner: str, until: float) -> int:
    """Extend ``owner``'s leases of ``row_ids`` to ``until`` (a worker's heartbeat while it
    sends them); returns how many it still held.

    A row already marked, or claimed by another worker after this one's lease ran out, is left
    alone, so a count below ``len(row_ids)`` means the worker lost rows it had not finished.
    """
    if not row_ids:
        return 0
    result = session.execute(
        update(OutboxRow)
        .where(
            OutboxRow.id.in_(list(row_ids)),
            OutboxRow.lease_owner == owner,
            OutboxRow.status == DeliveryStatus.PENDING.value,
        )
        .values(lease_until=until)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def _owned(session: Session, row_id: int, owner: str | None) -> OutboxRow | None:
    row = session.get(OutboxRow, row_id, with_for_update=True)
    if row is None or row.status != DeliveryStatus.PENDING.value:
        return None
    if owner is not None and row.lease_owner != owner:
        return None  # the lease ran out and another worker took the row over
    return row


def mark_delivered(
    session: Session, row_id: int, *, now: float | None = None, owner: str | None = None
) -> bool:
    """The row reached its destination; False when ``owner`` no longer holds it."""
    row = _owned(session, row_id, owner)
    if row is None:
        return False
    row.status = DeliveryStatus.DELIVERED.value
    row.delivered_at = time.time() if now is None else now
    row.attempts += 1
    row.lease_until = 0.0
    row.lease_owner = None
    row.last_error = None
    session.flush()
    return True


def mark_failed(
    session: Session,
    row_id: int,
    *,
    error: str,
    retry_at: float | None,
    now: float | None = None,
    count_attempt: bool = True,
    owner: str | None = None,
) -> DeliveryStatus:
    """A delivery attempt failed: retry at ``retry_at``, or expire (``None``, or past expiry).

    ``count_attempt=False`` reschedules without counting an attempt (the destination asked to
    wait, e.g. a hold that is not over).
    """
    row = _owned(session, row_id, owner)
    if row is None:
        return DeliveryStatus.PENDING
    wall = time.time() if now is None else now
    if count_attempt:
        row.attempts += 1
    row.last_error = error[:MAX_ERROR_CHARS]
    row.lease_until = 0.0
    row.lease_owner = None
    if retry_at is None or retry_at >= row.expires_at or wall >= row.expires_at:
        row.status = DeliveryStatus.EXPIRED.value
    else:
        row.next_attempt_at = retry_at
    session.flush()
    return DeliveryStatus(row.status)


def release(session: Session, row_ids: Sequence[int], *, owner: str) -> None:
    """Give back leased rows that were not sent (a stopping worker): due again at once."""
    if not row_ids:
        return
    session.execute(
        update(OutboxRow)
        .where(OutboxRow.id.in_(list(row_ids)), OutboxRow.lease_owner == owner)
        .values(lease_until=0.0, lease_owner=None)
    )


def purge_finished(session: Session, *, before: float) -> int:
    """Delete delivered and expired rows created before ``before``; returns how many."""
    result = session.execute(
        delete(OutboxRow).where(
            OutboxRow.status != DeliveryStatus.PENDING.value, OutboxRow.created_at < before
        )
    )
    return int(getattr(result, "rowcount", 0) or 0)


def list_deliveries(
    session: Session,
    *,
    status: DeliveryStatus | str | None = None,
    destination: str | None = None,
    alert_id: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Delivery], int]:
    """Rows matching the filters, newest first, and how many match in all."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit is {limit}: expected 1 to {MAX_PAGE}")
    if offset < 0:
        raise ValidationError(f"offset is {offset}: expected >= 0")
    conditions = []
    if status is not None:
        try:
            conditions.append(OutboxRow.status == DeliveryStatus(status).value)
        except ValueError:
            allowed = [s.value for s in DeliveryStatus]
            raise ValidationError(
                f"unknown delivery status {str(status)[:40]!r}: allowed {allowed}"
            ) from None
    if destination is not None:
        conditions.append(OutboxRow.destination == destination)
    if alert_id is not None:
        conditions.append(OutboxRow.alert_id == alert_id)
    total = session.scalar(select(func.count()).select_from(OutboxRow).where(*conditions)) or 0
    rows = session.scalars(
        select(OutboxRow)
        .where(*conditions)
        .order_by(OutboxRow.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return [_record(row) for row in rows], int(total)


@dataclass(frozen=True, slots=True)
class DestinationBacklog:
    """Pending and expired rows of one destination (delivered rows are not counted: the table
    keeps them only until :func:`purge_finished`)."""

    pending: int
    oldest_pending_created_at: float | None
    expired: int


def backlog(
    session: Session, destinations: Iterable[str] | None = None
) -> dict[str, DestinationBacklog]:
    """Per destination: pending rows, the oldest pending row's creation time, expired rows."""
    query = (
        select(
            OutboxRow.destination,
            OutboxRow.status,
            func.count(),
            func.min(OutboxRow.created_at),
        )
        .where(OutboxRow.status != DeliveryStatus.DELIVERED.value)
        .group_by(OutboxRow.destination, OutboxRow.status)
    )
    if destinations is not None:
        query = query.where(OutboxRow.destination.in_(list(destinations)))
    found: dict[str, dict[str, tuple[int, float | None]]] = {}
    for name, status, count, first in session.execute(query):
        found.setdefault(name, {})[status] = (int(count), first)
    out = {}
    for name in set(found) | set(destinations or ()):
        by_status = found.get(name, {})
        pending, oldest_pending = by_status.get("pending", (0, None))
        out[name] = DestinationBacklog(
            pending=pending,
            oldest_pending_created_at=oldest_pending,
            expired=by_status.get("expired", (0, None))[0],
        )
    return out


def _record(row: OutboxRow) -> Delivery:
    return Delivery(
        id=row.id,
        delivery_id=row.delivery_id,
        destination=row.destination,
        event=row.event,
        alert_id=row.alert_id,
        job=row.job,
        payload=row.payload,
        status=DeliveryStatus(row.status),
        attempts=row.attempts,
        created_at=row.created_at,
        next_attempt_at=row.next_attempt_at,
        expires_at=row.expires_at,
        delivered_at=row.delivered_at,
        last_error=row.last_error,
    )
