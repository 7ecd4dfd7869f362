"""Self-checks of drained nodes: list and inspect them, ask for one, cancel one, and take a node's
report (docs/selfcheck-service.md).

Two routers: :data:`router` (reads, and the operator's request and cancel) is guarded like the
other resources (the API token); :data:`report_router` takes a node's report, authenticated by
the check's own one-time token, which storage compares with the check's
(:func:`~minder.storage.selfchecks.accept_report`): the API token is neither needed nor enough
there. The token is never logged.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi import status as http_status
from starlette.concurrency import run_in_threadpool

from minder.api.deps import (
    MUTATION_RESPONSES,
    ApiContext,
    CheckToken,
    Context,
    DbSession,
    Offset,
    require_token,
)
from minder.api.schemas import (
    InvalidInput,
    Problem,
    SelfCheckCancel,
    SelfCheckOut,
    SelfCheckPage,
    SelfCheckRequest,
)
from minder.core.errors import ValidationError
from minder.core.selfcheck import (
    SelfCheckConflictError,
    SelfCheckRecord,
    SelfCheckReport,
    SelfCheckState,
    SelfCheckTokenError,
)
from minder.storage import MAX_PAGE
from minder.storage.selfchecks import (
    accept_report,
    cancel_selfcheck,
    get_selfcheck,
    list_selfchecks,
    request_selfcheck,
    verify_token,
)

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/selfchecks", tags=["selfchecks"])
"""Reads, the operator's request and cancel: behind the API token like every resource."""
report_router = APIRouter(prefix="/selfchecks", tags=["selfchecks"])
"""A node's report: behind its check's token only."""

MAX_REPORT_BYTES = 256 * 1024
"""Largest report body accepted (413 beyond): 64 checks of 256 measurements fit with room."""
CANCELLED_BY = "api"
"""Who cancelled, when the request does not say."""
_SHOWN = 64
"""Characters of an untrusted value (a check id, a node name) that go into a log line."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such self-check"}
}
_REPORT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": f"SelfCheckReport.to_dict() as JSON, at most {MAX_REPORT_BYTES} bytes",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SelfCheckReportBody"}}
        },
    }
}


def _shown(value: str) -> str:
    return value if len(value) <= _SHOWN else value[: _SHOWN - 1] + "…"


@router.get("", response_model=SelfCheckPage, summary="List self-checks")
def selfchecks(
    session: DbSession,
    state: Annotated[list[SelfCheckState] | None, Query(description="repeat for several")] = None,
    node: Annotated[str | None, Query(description="the scheduler's node name")] = None,
    alert_id: str | None = None,
    job: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Offset = 0,
) -> SelfCheckPage:
    """Self-checks matching every given filter, newest first, with the total for paging."""
    records, total = list_selfchecks(
        session,
        state=state,
        node=node,
        alert_id=alert_id,
        job=job,
        limit=limit,
        offset=offset,
    )
    return SelfCheckPage(
        items=[SelfCheckOut.of(record) for record in records],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/{check_id}", response_model=SelfCheckOut, responses=_NOT_FOUND, summary="Get a self-check"
)
def selfcheck(check_id: str, session: DbSession) -> SelfCheckOut:
    """One self-check with the node's report once it came."""
    return SelfCheckOut.of(get_selfcheck(session, check_id))


@router.post(
    "",
    status_code=http_status.HTTP_202_ACCEPTED,
    response_model=SelfCheckOut,
    dependencies=[Depends(require_token)],
    responses={
        **MUTATION_RESPONSES,
        404: {"model": Problem, "description": "no such alert"},
        409: {
            "model": Problem,
            "description": "a check of the alert is pending or running, or no enforcing "
            "self-check service runs (MINDER_SELFCHECK__ENABLED, MINDER_ACTIONS__ENFORCE)",
        },
        422: {
            "model": InvalidInput,
            "description": "the alert names no machine, or its node was not drained by Minder",
        },
    },
    summary="Ask for a self-check of an alert's drained node",
)
def ask(
    body: SelfCheckRequest, session: DbSession, context: Context, response: Response
) -> SelfCheckOut:
    """Check the node that an alert's action drained; answer 202 with the pending check.

    The service launches it when a slot is free (``MINDER_SELFCHECK__*`` limits) and acts on its
    verdict as on a check it decided itself: pass returns the node, fail confirms the alert.
    """
    if context.selfcheck_wake is None:
        # no enforcing self-check service behind this API: a request would wait forever
        raise SelfCheckConflictError(
            f"self-check of alert {_shown(body.alert_id)!r} refused: no self-check service "
            "runs here (MINDER_SELFCHECK__ENABLED is false, or MINDER_ACTIONS__ENFORCE is false: "
            "dry run)"
        )
    record = request_selfcheck(session, body.alert_id, by=body.by, now=time.time())
    session.commit()
    logger.info(
        "self-check %s of alert %s (node %s) requested by %s",
        record.id,
        record.alert_id,
        _shown(record.node),
        _shown(body.by),
    )
    context.wake_selfchecks()
    response.headers["Location"] = f"/api/v1/selfchecks/{record.id}"
    return SelfCheckOut.of(record)


@router.post(
    "/{check_id}/cancel",
    response_model=SelfCheckOut,
    dependencies=[Depends(require_token)],
    responses={
        **_NOT_FOUND,
        **MUTATION_RESPONSES,
        409: {"model": Problem, "description": "the check is already over"},
    },
    summary="Cancel a self-check",
)
def cancel(
    check_id: str, session: DbSession, context: Context, body: SelfCheckCancel | None = None
) -> SelfCheckOut:
    """Stop a pending or running check: the service stops its scheduler job and keeps the node
    out (a person decides then)."""
    by = body.by if body is not None and body.by else CANCELLED_BY
    record = cancel_selfcheck(session, check_id, by=by, now=time.time())
    session.commit()
    logger.info("self-check %s cancelled by %s", record.id, _shown(by))
    context.wake_selfchecks()
    return SelfCheckOut.of(record)


@report_router.post(
    "/{check_id}/report",
    response_model=SelfCheckOut,
    openapi_extra=_REPORT_BODY,
    responses={
        **_NOT_FOUND,
        401: {
            "model": Problem,
            "description": "no bearer token, or not this check's token (the API token is not it)",
        },
        403: {"model": Problem, "description": "a cross-origin request from an origin not allowed"},
        408: {"model": Problem, "description": "the request body stalled"},
        409: {
            "model": Problem,
            "description": "the check already has a verdict or is not running (a replay, a report "
            "after its timeout), or the report names another check or node",
        },
        413: {"model": Problem, "description": f"a body over {MAX_REPORT_BYTES} bytes"},
        422: {"model": InvalidInput, "description": "a body that is not a valid report"},
    },
    summary="Report a self-check's verdict (the node's check token)",
)
async def report(
    check_id: str, request: Request, context: Context, token: CheckToken
) -> SelfCheckOut:
    """The node's ``minder selfcheck run`` posts its report here once, with
    ``Authorization: Bearer <the check's token>`` (``MINDER_SELFCHECK_TOKEN``).

    The check must be running; its state then follows the verdict (passed, failed,
    inconclusive) and the service acts on it at once: returns the node on a pass, keeps it out
    and confirms the alert on a fail.
    """
    await run_in_threadpool(_verify, context, check_id, token)
    raw = await _bounded_body(request, MAX_REPORT_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, depth
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ValidationError(
            f"the self-check report is not UTF-8 JSON ({reason}): expected "
            "SelfCheckReport.to_dict() as JSON"
        ) from None
    parsed = SelfCheckReport.from_dict(data)
    record = await run_in_threadpool(_accept, context, check_id, token, parsed)
    return SelfCheckOut.of(record)


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) beyond ``limit`` bytes before it is all read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(
            http_status.HTTP_413_CONTENT_TOO_LARGE,
            f"the report is {int(declared)} bytes: expected at most {limit}",
        )
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise HTTPException(
                http_status.HTTP_413_CONTENT_TOO_LARGE,
                f"the report is larger than {limit} bytes: expected at most {limit}",
            )
    return bytes(raw)


def _verify(context: ApiContext, check_id: str, token: str) -> None:
    with context.session_factory() as session:
        try:
            verify_token(session, check_id, token)
        except SelfCheckTokenError as exc:
            logger.warning("self-check %s: report refused: %s", _shown(check_id), exc)
            raise


def _accept(
    context: ApiContext, check_id: str, token: str, parsed: SelfCheckReport
) -> SelfCheckRecord:
    with context.session_factory() as session:
        try:
            record = accept_report(session, check_id, token, parsed, time.time())
        except (SelfCheckTokenError, SelfCheckConflictError) as exc:
            logger.warning("self-check %s: report refused: %s", _shown(check_id), exc)
            raise
        session.commit()
    logger.info(
        "self-check %s: report of node %s accepted: %s (%s)",
        record.id,
        _shown(parsed.node),
        parsed.verdict.value,
        _shown(parsed.reason),
    )
    context.wake_selfchecks()
    return record
