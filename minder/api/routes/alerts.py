"""Alerts: list with filters and pagination, get one, change its status."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from minder.api.deps import MUTATION_RESPONSES, Context, DbSession, Offset, require_token
from minder.api.schemas import AlertOut, AlertPage, AlertStatusChange, Problem, TransitionProblem
from minder.core.alert import AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.storage import MAX_PAGE, get_alert_record, list_alert_records
from minder.storage.outbox import change_alert_status

router = APIRouter(prefix="/alerts", tags=["alerts"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such alert"}
}


@router.get("", response_model=AlertPage, summary="List alerts")
def alerts(
    session: DbSession,
    job: str | None = None,
    machine: str | None = None,
    kind: Annotated[list[AlertKind] | None, Query(description="repeat for several")] = None,
    status: Annotated[list[AlertStatus] | None, Query(description="repeat for several")] = None,
    since: Annotated[float | None, Query(description="detected at or after, unix s")] = None,
    until: Annotated[float | None, Query(description="detected before, unix s")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Offset = 0,
) -> AlertPage:
    """Alerts matching every given filter, newest detected first, with the total for paging."""
    if since is not None and until is not None and since > until:
        raise ValidationError(f"since ({since}) is after until ({until}): expected since <= until")
    records, total = list_alert_records(
        session,
        job=job,
        machine=machine,
        kind=kind,
        status=status,
        since=since,
        until=until,
        limit=limit,
        offset=offset,
    )
    return AlertPage(
        items=[AlertOut.of(record) for record in records], total=total, limit=limit, offset=offset
    )


@router.get("/{alert_id}", response_model=AlertOut, responses=_NOT_FOUND, summary="Get an alert")
def alert(alert_id: str, session: DbSession) -> AlertOut:
    """One alert with its evidence."""
    return AlertOut.of(get_alert_record(session, alert_id))


@router.patch(
    "/{alert_id}",
    response_model=AlertOut,
    dependencies=[Depends(require_token)],
    responses={
        **_NOT_FOUND,
        **MUTATION_RESPONSES,
        409: {"model": TransitionProblem, "description": "the life cycle forbids this change"},
    },
    summary="Change an alert's status",
)
def change_status(
    alert_id: str, change: AlertStatusChange, session: DbSession, context: Context
) -> AlertOut:
    """Move an alert along ``open → acknowledged → resolved | false_positive``.

    The change and its events (webhooks, Kafka, Alertmanager, and giving back a node Minder took
    out) commit together; a resolved or false-positive alert's node is returned to the scheduler.
    """
    change_alert_status(session, alert_id, change.status, context.destinations, by=change.by)
    session.commit()
    context.enqueued()
    return AlertOut.of(get_alert_record(session, alert_id))
