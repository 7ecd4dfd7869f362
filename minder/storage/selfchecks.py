"""Self-check repository: the checks the service schedules on drained nodes (docs/selfcheck.md).

Every function takes a :class:`~sqlalchemy.orm.Session` opened by the caller and leaves the
commit to it, like :mod:`minder.storage.alerts`; records come back as
:class:`~minder.core.selfcheck.SelfCheckRecord`.

A check moves ``pending → running → passed | failed | inconclusive | timed_out`` (or
``cancelled`` from either of the first two). Its one-time token is stored only as a SHA-256:
:func:`accept_report` compares the digest of the token a report brings with
:func:`hmac.compare_digest`. The service (:mod:`minder.service.selfcheck`) applies a final
state's consequences (node, alert) and then sets ``applied_ts``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from minder.core.alert import Alert, AlertStatus
from minder.core.errors import NotFoundError, ValidationError
from minder.core.selfcheck import (
    FINAL_STATES,
    STATE_OF_VERDICT,
    SelfCheckConflictError,
    SelfCheckRecord,
    SelfCheckReport,
    SelfCheckState,
    SelfCheckTokenError,
)
from minder.storage.actions import RESUME_OPERATION as _RESUME_OPERATION
from minder.storage.actions import ActionOutcomeKind
from minder.storage.alerts import ACTIVE_STATUSES, get_alert
from minder.storage.models import ActionAuditRow, AlertRow, SelfCheckRow

logger = logging.getLogger(__name__)

MAX_PAGE = 500
"""Largest ``limit`` :func:`list_selfchecks` accepts."""
MAX_DETAIL_CHARS = 1000
"""Longest ``detail`` kept (it may quote a scheduler's or a node's text)."""
ACTIVE_STATES: tuple[SelfCheckState, ...] = (SelfCheckState.PENDING, SelfCheckState.RUNNING)
"""States of a check not finished yet."""
DRAIN_OPERATIONS: tuple[str, ...] = ("drain", "cordon")
"""Audit operations of the executor's apply (Slurm, Kubernetes): a node Minder took out."""
LAUNCH_OPERATION = "selfcheck_launch"
"""Audit operation of a check launched on the scheduler (or, in dry run, one that would be)."""
CANCEL_OPERATION = "selfcheck_cancel"
"""Audit operation of a launched check stopped (timeout, cancel, the alert closed)."""
RESUME_OPERATION = _RESUME_OPERATION
"""Audit operation of a node returned after its check passed (the breaker counts these)."""
KEEP_OPERATION = "selfcheck_keep"
"""Audit operation of a node kept out after its check (failed, inconclusive, timed out,
cancelled, or passed with the breaker refusing its return)."""
RELEASE_OPERATION = "selfcheck_release"
"""Audit operation of a check's hold removed after a person closed its alert (the person's close
returns the node)."""
SKIP_OPERATION = "selfcheck_skip"
"""Audit operation of a drained node the service decided not to check (audited once)."""
_SHOWN = 64


@dataclass(frozen=True, slots=True)
class Drain:
    """Where and when Minder took an alert's node out (its applied, enforced apply)."""

    node: str
    target: str
    drained_ts: float | None


@dataclass(frozen=True, slots=True)
class DrainedAlert:
    """An active alert whose node Minder drained, and the drain."""

    alert: Alert
    drain: Drain


def token_digest(token: str) -> str:
    """The SHA-256 (hex) under which a check's token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_check_id() -> str:
    """A new random check id: 16 hex digits (a valid Slurm job name and Kubernetes name part)."""
    return secrets.token_hex(8)


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _parse_state(value: SelfCheckState | str) -> SelfCheckState:
    try:
        return SelfCheckState(value)
    except ValueError:
        allowed = ", ".join(s.value for s in SelfCheckState)
        raise ValidationError(
            f"self-check state {str(value)[:40]!r}: expected one of {allowed}"
        ) from None


def _states(
    value: SelfCheckState | str | Iterable[SelfCheckState | str] | None,
) -> list[str] | None:
    if value is None:
        return None
    values: Iterable[SelfCheckState | str] = [value] if isinstance(value, str) else value
    return sorted({_parse_state(v).value for v in values})


def _record(row: SelfCheckRow) -> SelfCheckRecord:
    return SelfCheckRecord(
        id=row.id,
        alert_id=row.alert_id,
        job=row.job,
        machine=row.machine,
        node=row.node,
        target=row.target,
        state=SelfCheckState(row.state),
        attempt=row.attempt,
        created_ts=row.created_ts,
        partners=tuple(row.partners or ()),
        started_ts=row.started_ts,
        finished_ts=row.finished_ts,
        drained_ts=row.drained_ts,
        returned_ts=row.returned_ts,
        scheduler_ref=row.scheduler_ref,
        detail=row.detail,
        report=SelfCheckReport.from_dict(row.report) if row.report is not None else None,
    )


def _row(session: Session, check_id: str, *, for_update: bool = False) -> SelfCheckRow:
    row = session.get(SelfCheckRow, check_id, with_for_update=for_update)
    if row is None:
        raise NotFoundError(f"no self-check with id {_shown(check_id)!r}")
    return row


# -- the API's functions ----------------------------------------------------------------------


def create_selfcheck(
    session: Session,
    *,
    alert_id: str,
    job: str,
    machine: str,
    node: str,
    target: str,
    attempt: int,
    drained_ts: float | None,
    now: float,
    requested_by: str | None = None,
    detail: str = "",
) -> SelfCheckRecord:
    """A new ``pending`` check of ``node`` for ``alert_id`` (a new random id).

    Raises
    ------
    ValidationError
        ``attempt`` below 1.
    IntegrityError
        A check of that alert with that attempt exists already (another replica decided it).
    """
    if attempt < 1:
        raise ValidationError(f"self-check attempt {attempt}: expected >= 1")
    row = SelfCheckRow(
        id=new_check_id(),
        alert_id=alert_id,
        job=job,
        machine=machine,
        node=node,
        target=target,
        state=SelfCheckState.PENDING.value,
        attempt=attempt,
        partners=[],
        created_ts=now,
        drained_ts=drained_ts,
        detail=(detail or "decided: waiting for a slot and for the node")[:MAX_DETAIL_CHARS],
        requested_by=None if requested_by is None else requested_by[:255],
        claimed_until=0.0,
        updated_at=now,
    )
    session.add(row)
    session.flush()
    logger.info("self-check %s of node %s (alert %s, attempt %d) decided", row.id,
                _shown(node), alert_id, attempt)  # fmt: skip
    return _record(row)


def get_selfcheck(session: Session, check_id: str) -> SelfCheckRecord:
    """The check ``check_id``; :class:`NotFoundError` naming the id if absent."""
    return _record(_row(session, check_id))


def list_selfchecks(
    session: Session,
    *,
    state: SelfCheckState | str | Iterable[SelfCheckState | str] | None = None,
    node: str | None = None,
    alert_id: str | None = None,
    job: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[SelfCheckRecord], int]:
    """One page of checks matching every filter, newest first, and how many match in all.

    Raises
    ------
    ValidationError
        An unknown state, ``limit`` outside 1..500 or a negative ``offset``.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit {limit} is out of range: expected 1..{MAX_PAGE}")
    if offset < 0:
        raise ValidationError(f"offset {offset} is negative: expected >= 0")
    conditions: list[ColumnElement[bool]] = []
    states = _states(state)
    if states is not None:
        conditions.append(SelfCheckRow.state.in_(states))
    if node is not None:
        conditions.append(SelfCheckRow.node == node)
    if alert_id is not None:
        conditions.append(SelfCheckRow.alert_id == alert_id)
    if job is not None:
        conditions.append(SelfCheckRow.job == job)
    total = session.scalar(select(func.count()).select_from(SelfCheckRow).where(*conditions))
    rows = session.scalars(
        select(SelfCheckRow)
        .where(*conditions)
        .order_by(SelfCheckRow.created_ts.desc(), SelfCheckRow.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return [_record(row) for row in rows], int(total or 0)


def _check_token(check_id: str, stored: str | None, token: str) -> None:
    if not token:
        raise SelfCheckTokenError(f"self-check {_shown(check_id)!r}: no token given")
    if stored is None:
        raise SelfCheckTokenError(
            f"self-check {_shown(check_id)!r} has no token: it was never launched"
        )
    if not hmac.compare_digest(token_digest(token), stored):
        raise SelfCheckTokenError(f"self-check {_shown(check_id)!r}: wrong token")


def verify_token(session: Session, check_id: str, token: str) -> None:
    """Refuse a wrong token before anything else is read: the API calls this before it reads
    and parses a report's body, so a caller without the check's token costs one lookup.
    :func:`accept_report` checks again under the row's lock.

    Raises
    ------
    NotFoundError, SelfCheckTokenError
        As :func:`accept_report`.
    """
    _check_token(check_id, _row(session, check_id).token_sha256, token)


def accept_report(
    session: Session, check_id: str, token: str, report: SelfCheckReport, now: float
) -> SelfCheckRecord:
    """Take a node's report for check ``check_id``, authenticated by the check's token.

    Under the row's lock: the token is checked first (so a forger learns nothing of the check),
    then the state and the report's identity. The report is stored, the state follows its
    verdict (:data:`~minder.core.selfcheck.STATE_OF_VERDICT`) and ``finished_ts`` is ``now``; the
    service applies the consequences on its next pass (the caller commits and wakes it).

    Raises
    ------
    NotFoundError
        No check has that id.
    SelfCheckTokenError
        The token is missing or wrong, or the check has none (it was never launched).
    SelfCheckConflictError
        The check is not running (it has a verdict already: a replay; it timed out or was
        cancelled), or the report names another check or node.
    """
    row = _row(session, check_id, for_update=True)
    _check_token(check_id, row.token_sha256, token)
    if row.state != SelfCheckState.RUNNING.value:
        raise SelfCheckConflictError(
            f"self-check {_shown(check_id)!r} is {row.state}: it takes no report (a replay, or "
            "a report after its end)"
        )
    if report.check_id != row.id:
        raise SelfCheckConflictError(
            f"the report names check {_shown(str(report.check_id))!r}: expected {row.id!r}"
        )
    if report.node != row.node:
        raise SelfCheckConflictError(
            f"the report comes from node {_shown(report.node)!r}: expected {_shown(row.node)!r}"
        )
    row.report = report.to_dict()
    row.state = STATE_OF_VERDICT[report.verdict].value
    row.finished_ts = now
    row.detail = f"{report.verdict.value}: {report.reason}"[:MAX_DETAIL_CHARS]
    row.updated_at = now
    session.flush()
    logger.info("self-check %s of node %s: %s", row.id, _shown(row.node), row.detail[:200])
    return _record(row)


def drain_of(session: Session, alert_id: str, *, dry_run: bool = False) -> Drain | None:
    """The node Minder took out for ``alert_id`` (its latest applied, enforced drain or cordon),
    or None when it took none out; ``dry_run``: the node it would have taken out."""
    found = session.execute(
        select(ActionAuditRow.node, ActionAuditRow.target, ActionAuditRow.created_at)
        .where(_applied_drain(alert_id, dry_run=dry_run))
        .order_by(ActionAuditRow.id.desc())
        .limit(1)
    ).first()
    if found is None or not found[0]:
        return None
    return Drain(node=found[0], target=found[1], drained_ts=found[2])


def _applied_drain(
    alert_id: InstrumentedAttribute[str] | str, *, dry_run: bool = False
) -> ColumnElement[bool]:
    outcome = ActionOutcomeKind.DRY_RUN if dry_run else ActionOutcomeKind.APPLIED
    return and_(
        ActionAuditRow.alert_id == alert_id,
        ActionAuditRow.operation.in_(DRAIN_OPERATIONS),
        ActionAuditRow.outcome == outcome.value,
        ActionAuditRow.mode == ("dry_run" if dry_run else "enforce"),
    )


def request_selfcheck(session: Session, alert_id: str, *, by: str, now: float) -> SelfCheckRecord:
    """An operator's request: a new pending check of the node Minder drained for ``alert_id``.

    A person asking is a person acting: the request is honoured whatever the service's policy
    (alert kinds, failures of the node so far).

    Raises
    ------
    NotFoundError
        No alert has that id.
    ValidationError
        The alert names no machine, is closed, or its node was not drained by Minder.
    SelfCheckConflictError
        A check of the alert is pending or running already, or one was created concurrently
        (the unique ``(alert_id, attempt)``).
    """
    alert = get_alert(session, alert_id)
    if not alert.machine:
        raise ValidationError(
            f"alert {alert_id!r} names no machine: expected an alert of one machine whose node "
            "Minder drained"
        )
    if alert.status not in ACTIVE_STATUSES:
        raise ValidationError(
            f"alert {alert_id!r} is {alert.status.value}: Minder holds its node out no more "
            "(expected an open, acknowledged or confirmed alert)"
        )
    drain = drain_of(session, alert_id)
    if drain is None:
        raise ValidationError(
            f"alert {alert_id!r}: Minder did not take its node out (no applied drain or cordon "
            "in the audit trail): expected an alert whose node Minder drained"
        )
    active = active_selfcheck_for_alert(session, alert_id)
    if active is not None:
        raise SelfCheckConflictError(
            f"alert {alert_id!r} has self-check {active.id!r} {active.state.value} already"
        )
    attempt = next_attempt(session, alert_id)
    try:
        with session.begin_nested():  # a savepoint: the caller's transaction survives a race
            return create_selfcheck(
                session,
                alert_id=alert.id,
                job=alert.job,
                machine=alert.machine,
                node=drain.node,
                target=drain.target,
                attempt=attempt,
                drained_ts=drain.drained_ts,
                now=now,
                requested_by=by,
                detail=f"requested by {by[:_SHOWN]}: waiting for a slot and for the node",
            )
    except IntegrityError as exc:
        raise SelfCheckConflictError(
            f"alert {alert_id!r}: self-check attempt {attempt} was created concurrently (by the "
            "service or another request); ask again"
        ) from exc


def cancel_selfcheck(session: Session, check_id: str, *, by: str, now: float) -> SelfCheckRecord:
    """Cancel a pending or running check: state ``cancelled`` (the service then stops the
    scheduler's job and keeps the node out).

    Raises
    ------
    NotFoundError
        No check has that id.
    SelfCheckConflictError
        The check is final already.
    """
    row = _row(session, check_id, for_update=True)
    if SelfCheckState(row.state) in FINAL_STATES:
        raise SelfCheckConflictError(
            f"self-check {_shown(check_id)!r} is {row.state} already: nothing to cancel"
        )
    row.state = SelfCheckState.CANCELLED.value
    row.finished_ts = now
    row.detail = f"cancelled by {by}"[:MAX_DETAIL_CHARS]
    row.updated_at = now
    session.flush()
    logger.info("self-check %s of node %s cancelled by %s", row.id, _shown(row.node),
                _shown(by))  # fmt: skip
    return _record(row)


def latest_selfcheck_for_alert(session: Session, alert_id: str) -> SelfCheckRecord | None:
    """The newest check of ``alert_id``, or None."""
    row = session.scalars(
        select(SelfCheckRow)
        .where(SelfCheckRow.alert_id == alert_id)
        .order_by(SelfCheckRow.attempt.desc(), SelfCheckRow.created_ts.desc())
        .limit(1)
    ).first()
    return None if row is None else _record(row)


# -- the service's functions ------------------------------------------------------------------


def active_selfcheck_for_alert(session: Session, alert_id: str) -> SelfCheckRecord | None:
    """The pending or running check of ``alert_id``, or None."""
    row = session.scalars(
        select(SelfCheckRow)
        .where(
            SelfCheckRow.alert_id == alert_id,
            SelfCheckRow.state.in_([s.value for s in ACTIVE_STATES]),
        )
        .limit(1)
    ).first()
    return None if row is None else _record(row)


def next_attempt(session: Session, alert_id: str) -> int:
    """1 + the highest attempt of ``alert_id``'s checks (1 for its first)."""
    highest = session.scalar(
        select(func.max(SelfCheckRow.attempt)).where(SelfCheckRow.alert_id == alert_id)
    )
    return int(highest or 0) + 1


def drained_alerts_without_check(
    session: Session, *, kinds: Iterable[str], limit: int = 100, dry_run: bool = False
) -> list[DrainedAlert]:
    """Active alerts of ``kinds`` whose node Minder drained (an applied, enforced drain or
    cordon), that have no check yet and were not skipped (an audit row ``selfcheck_skip``),
    oldest first.

    ``dry_run``: the alerts whose node Minder would have drained (a ``dry_run`` drain) and that
    have no ``selfcheck_launch`` audit row yet (what a dry run audits once per alert).
    """
    kind_values = sorted(set(kinds))
    if not kind_values:
        return []
    drained = select(ActionAuditRow.id).where(_applied_drain(AlertRow.id, dry_run=dry_run))
    checked = select(SelfCheckRow.id).where(SelfCheckRow.alert_id == AlertRow.id).exists()
    audited_ops = [SKIP_OPERATION, LAUNCH_OPERATION] if dry_run else [SKIP_OPERATION]
    skipped = (
        select(ActionAuditRow.id)
        .where(ActionAuditRow.alert_id == AlertRow.id, ActionAuditRow.operation.in_(audited_ops))
        .exists()
    )
    rows = session.scalars(
        select(AlertRow)
        .where(
            AlertRow.status.in_([s.value for s in ACTIVE_STATUSES]),
            AlertRow.kind.in_(kind_values),
            AlertRow.machine != "",
            drained.exists(),
            ~checked,
            ~skipped,
        )
        .order_by(AlertRow.updated_at, AlertRow.id)
        .limit(limit)
    )
    out = []
    for row in list(rows):
        drain = drain_of(session, row.id, dry_run=dry_run)
        if drain is not None:
            out.append(DrainedAlert(get_alert(session, row.id), drain))
    return out


def decide_selfcheck(
    session: Session,
    *,
    alert: Alert,
    drain: Drain,
    now: float,
    requested_by: str | None = None,
    detail: str = "",
) -> SelfCheckRecord | None:
    """The service's decision: a new pending check of ``alert``'s drained node (its next
    attempt); None when another replica decided the same attempt first."""
    try:
        with session.begin_nested():
            return create_selfcheck(
                session,
                alert_id=alert.id,
                job=alert.job,
                machine=alert.machine,
                node=drain.node,
                target=drain.target,
                attempt=next_attempt(session, alert.id),
                drained_ts=drain.drained_ts,
                now=now,
                requested_by=requested_by,
                detail=detail,
            )
    except IntegrityError:
        logger.debug("self-check of alert %s decided concurrently", alert.id)
        return None


def selfchecks_in(
    session: Session, states: Sequence[SelfCheckState], *, limit: int = 500
) -> list[SelfCheckRecord]:
    """Checks in ``states``, oldest first (the service's passes)."""
    rows = session.scalars(
        select(SelfCheckRow)
        .where(SelfCheckRow.state.in_([s.value for s in states]))
        .order_by(SelfCheckRow.created_ts, SelfCheckRow.id)
        .limit(limit)
    )
    return [_record(row) for row in rows]


def unapplied_selfchecks(session: Session, *, limit: int = 500) -> list[SelfCheckRecord]:
    """Final checks whose consequences the service has not applied yet, oldest first."""
    rows = session.scalars(
        select(SelfCheckRow)
        .where(
            SelfCheckRow.state.in_([s.value for s in FINAL_STATES]),
            SelfCheckRow.applied_ts.is_(None),
        )
        .order_by(SelfCheckRow.finished_ts, SelfCheckRow.id)
        .limit(limit)
    )
    return [_record(row) for row in rows]


def count_by_target(
    session: Session, states: Sequence[SelfCheckState] = ACTIVE_STATES
) -> dict[str, int]:
    """Checks in ``states`` per target (the in-progress gauge)."""
    query = (
        select(SelfCheckRow.target, func.count())
        .where(SelfCheckRow.state.in_([s.value for s in states]))
        .group_by(SelfCheckRow.target)
    )
    return {str(target): int(count) for target, count in session.execute(query)}


def count_running(session: Session) -> int:
    """Checks launched and not finished (the concurrency bound counts these)."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(SelfCheckRow)
            .where(SelfCheckRow.state == SelfCheckState.RUNNING.value)
        )
        or 0
    )


def failed_checks(session: Session, node: str) -> int:
    """Checks of ``node`` that failed since a person last closed (resolved, false positive) an
    alert with a check of that node (see ``max_failures_per_node``): a repaired node, whose
    alert a person closed, gets automatic checks again."""
    closed_ts = session.scalar(
        select(func.max(AlertRow.updated_at)).where(
            AlertRow.id.in_(select(SelfCheckRow.alert_id).where(SelfCheckRow.node == node)),
            AlertRow.status.in_([AlertStatus.RESOLVED.value, AlertStatus.FALSE_POSITIVE.value]),
        )
    )
    query = (
        select(func.count())
        .select_from(SelfCheckRow)
        .where(SelfCheckRow.node == node, SelfCheckRow.state == SelfCheckState.FAILED.value)
    )
    if closed_ts is not None:
        query = query.where(SelfCheckRow.finished_ts > closed_ts)
    return int(session.scalar(query) or 0)


def inconclusive_checks(session: Session, alert_id: str) -> int:
    """Checks of ``alert_id`` without a verdict (inconclusive or timed out): retries spent."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(SelfCheckRow)
            .where(
                SelfCheckRow.alert_id == alert_id,
                SelfCheckRow.state.in_(
                    [SelfCheckState.INCONCLUSIVE.value, SelfCheckState.TIMED_OUT.value]
                ),
            )
        )
        or 0
    )


def claim(session: Session, check_id: str, *, now: float, lease_s: float) -> bool:
    """Lease ``check_id`` to the calling replica for ``lease_s`` while it acts on the scheduler
    (launch, cancel, release); False when another replica holds it."""
    result = session.execute(
        update(SelfCheckRow)
        .where(SelfCheckRow.id == check_id, SelfCheckRow.claimed_until <= now)
        .values(claimed_until=now + lease_s)
    )
    return bool(getattr(result, "rowcount", 0))


def unclaim(session: Session, check_id: str) -> None:
    """End the lease of :func:`claim`."""
    session.execute(
        update(SelfCheckRow).where(SelfCheckRow.id == check_id).values(claimed_until=0.0)
    )


def set_pending_detail(session: Session, check_id: str, detail: str, *, now: float) -> None:
    """Why a pending check waits (changes only a pending check)."""
    session.execute(
        update(SelfCheckRow)
        .where(
            SelfCheckRow.id == check_id,
            SelfCheckRow.state == SelfCheckState.PENDING.value,
            SelfCheckRow.detail != detail[:MAX_DETAIL_CHARS],
        )
        .values(detail=detail[:MAX_DETAIL_CHARS], updated_at=now)
    )


def mark_launching(
    session: Session,
    check_id: str,
    *,
    token_sha256: str,
    partners: Sequence[str],
    planned_ref: str | None = None,
    now: float,
) -> bool:
    """``pending → running`` before the launch (so a fast report finds it running), with the
    token's digest, the partners and the launcher's ``planned_ref`` (``ref_for``: a launch that
    stops midway leaves a ref its release can clean up with); False when the check is no longer
    pending."""
    row = _row(session, check_id, for_update=True)
    if row.state != SelfCheckState.PENDING.value:
        return False
    row.state = SelfCheckState.RUNNING.value
    if planned_ref is not None:
        row.scheduler_ref = planned_ref[:255]
    row.token_sha256 = token_sha256
    row.partners = list(partners)
    row.started_ts = now
    row.detail = f"launching on {row.node} with {len(partners)} partner(s)"[:MAX_DETAIL_CHARS]
    row.updated_at = now
    session.flush()
    return True


def set_launched(session: Session, check_id: str, ref: str, *, now: float) -> None:
    """The scheduler's handle of a launched check (its state stays whatever it is now: a report
    may have come already)."""
    row = _row(session, check_id, for_update=True)
    row.scheduler_ref = ref[:255]
    if row.state == SelfCheckState.RUNNING.value:
        row.detail = f"running on the scheduler as {ref}"[:MAX_DETAIL_CHARS]
    row.updated_at = now
    session.flush()


def back_to_pending(session: Session, check_id: str, detail: str, *, now: float) -> None:
    """A launch that failed transiently (and whose partial launch was released): pending again,
    without a token (a report of the failed launch would be refused) nor a ref."""
    row = _row(session, check_id, for_update=True)
    if row.state != SelfCheckState.RUNNING.value:
        return
    row.state = SelfCheckState.PENDING.value
    row.token_sha256 = None
    row.scheduler_ref = None
    row.started_ts = None
    row.partners = []
    row.detail = detail[:MAX_DETAIL_CHARS]
    row.updated_at = now
    session.flush()


def finish(
    session: Session,
    check_id: str,
    state: SelfCheckState,
    detail: str,
    *,
    now: float,
    only_from: Sequence[SelfCheckState] = ACTIVE_STATES,
    unclaimed: bool = False,
) -> bool:
    """Give a check its final ``state`` without a report (inconclusive, timed out); False when
    it is no longer in one of ``only_from`` (a report or a cancel came first) or, with
    ``unclaimed``, while a replica holds its claim (it is launching it)."""
    if state not in FINAL_STATES:
        raise ValidationError(f"self-check state {state.value!r}: expected a final state")
    row = _row(session, check_id, for_update=True)
    if SelfCheckState(row.state) not in only_from:
        return False
    if unclaimed and row.claimed_until > now:
        return False
    row.state = state.value
    row.finished_ts = now
    row.detail = detail[:MAX_DETAIL_CHARS]
    row.updated_at = now
    session.flush()
    logger.info("self-check %s of node %s: %s (%s)", row.id, _shown(row.node), state.value,
                detail[:200])  # fmt: skip
    return True


def mark_applied(
    session: Session,
    check_id: str,
    *,
    now: float,
    detail: str | None = None,
    returned_ts: float | None = None,
) -> SelfCheckRecord:
    """The verdict's consequences were applied (node, alert): ``applied_ts``, and when the node
    went back to scheduling, ``returned_ts``."""
    row = _row(session, check_id, for_update=True)
    row.applied_ts = now
    if returned_ts is not None:
        row.returned_ts = returned_ts
    if detail is not None:
        row.detail = detail[:MAX_DETAIL_CHARS]
    row.claimed_until = 0.0
    row.updated_at = now
    session.flush()
    return _record(row)


def applied_ts_of(session: Session, check_id: str) -> float | None:
    """When the service applied ``check_id``'s verdict (None: not yet)."""
    return session.scalar(select(SelfCheckRow.applied_ts).where(SelfCheckRow.id == check_id))
