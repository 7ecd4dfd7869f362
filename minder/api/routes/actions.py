"""Scheduler actions: the audit trail, the circuit breaker, per-job opt-out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from minder.api.deps import MUTATION_RESPONSES, Context, DbSession, Offset, require_token
from minder.api.schemas import (
    AuditOut,
    AuditPage,
    BreakerOut,
    BreakerReset,
    JobSettingsChange,
    JobSettingsOut,
)
from minder.storage.actions import (
    ACTIONS_BREAKER,
    MAX_PAGE,
    ActionOutcomeKind,
    actions_enabled,
    get_breaker,
    list_audit,
    reset_breaker,
    set_actions_enabled,
)
from minder.storage.outbox import AlertEvent, enqueue

router = APIRouter(tags=["actions"])

BREAKER = ACTIONS_BREAKER


@router.get("/actions", response_model=AuditPage, summary="List the action audit trail")
def actions(
    session: DbSession,
    alert_id: str | None = None,
    machine: str | None = None,
    job: str | None = None,
    outcome: ActionOutcomeKind | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Offset = 0,
) -> AuditPage:
    """Every attempt, result and undo of a scheduler action, and every decision not to act."""
    entries, total = list_audit(
        session,
        alert_id=alert_id,
        machine=machine,
        job=job,
        outcome=outcome,
        limit=limit,
        offset=offset,
    )
    return AuditPage(
        items=[AuditOut(**entry.to_dict()) for entry in entries],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get("/breaker", response_model=BreakerOut, summary="The actions circuit breaker")
def breaker(session: DbSession) -> BreakerOut:
    """Whether Minder still acts on the scheduler, and if not, why."""
    return BreakerOut(**get_breaker(session, BREAKER).to_dict())


@router.post(
    "/breaker/reset",
    response_model=BreakerOut,
    dependencies=[Depends(require_token)],
    responses=MUTATION_RESPONSES,
    summary="Reset the actions circuit breaker",
)
def reset(change: BreakerReset, session: DbSession, context: Context) -> BreakerOut:
    """Let Minder act again once an operator has checked why it tripped (idempotent)."""
    if reset_breaker(session, BREAKER, by=change.by):
        enqueue(
            session,
            context.destinations,
            event=AlertEvent.BREAKER_RESET,
            data={"breaker": BREAKER, "reset_by": change.by},
        )
    session.commit()
    context.enqueued()
    return BreakerOut(**get_breaker(session, BREAKER).to_dict())


@router.get(
    "/jobs/{job}/settings", response_model=JobSettingsOut, summary="A job's operator settings"
)
def job_settings(job: str, session: DbSession) -> JobSettingsOut:
    """Whether Minder may act on the job's machines."""
    return JobSettingsOut(job=job, actions_enabled=actions_enabled(session, job))


@router.put(
    "/jobs/{job}/settings",
    response_model=JobSettingsOut,
    dependencies=[Depends(require_token)],
    responses=MUTATION_RESPONSES,
    summary="Opt a job in or out of scheduler actions",
)
def change_job_settings(job: str, change: JobSettingsChange, session: DbSession) -> JobSettingsOut:
    """Opt out: alerts of the job still notify, but no node of it is drained or cordoned."""
    set_actions_enabled(session, job, change.actions_enabled, by=change.by)
    session.commit()
    return JobSettingsOut(job=job, actions_enabled=actions_enabled(session, job))
