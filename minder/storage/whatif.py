"""What-if report repository: the life cycle of one trace analysis and its stored report.

``create_report`` (``pending``) → ``mark_running`` → ``finish_report`` (``done``) or
``fail_report`` (``failed``, also straight from ``pending`` when the analysis never ran). Every
function takes a :class:`~sqlalchemy.orm.Session` opened by the caller and leaves the commit to it.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session, defer

from minder.core.errors import NotFoundError, ValidationError
from minder.storage.alerts import MAX_PAGE
from minder.storage.jobs import check_name
from minder.storage.jsonsafe import json_safe
from minder.storage.models import WhatIfReportRow
from minder.storage.records import WhatIfRecord, WhatIfStatus, WhatIfSummary

ERROR_MAX_LEN = 8_000
"""Longest error message stored; longer ones keep their start and say how much was cut."""

_ALLOWED_FROM: dict[WhatIfStatus, tuple[WhatIfStatus, ...]] = {
    WhatIfStatus.RUNNING: (WhatIfStatus.PENDING,),
    WhatIfStatus.DONE: (WhatIfStatus.RUNNING,),
    WhatIfStatus.FAILED: (WhatIfStatus.PENDING, WhatIfStatus.RUNNING),
}


def parse_whatif_status(value: WhatIfStatus | str) -> WhatIfStatus:
    """``value`` as a :class:`WhatIfStatus`, refusing unknown names with the allowed ones."""
    try:
        return WhatIfStatus(value)
    except ValueError:
        allowed = [s.value for s in WhatIfStatus]
        raise ValidationError(f"unknown what-if status {value!r}: allowed {allowed}") from None


def create_report(
    session: Session,
    source: str,
    *,
    job: str | None = None,
    report_id: str | None = None,
    now: float | None = None,
) -> WhatIfSummary:
    """Register a submitted analysis as ``pending``.

    Parameters
    ----------
    source
        What is analysed, for humans (uploaded file names, a server path).
    job
        The job the trace belongs to, when the client names it.
    report_id
        The id to use; a new random one (32 hex digits) when not given.
    now
        Wall time of the submission; the current time when not given.

    Raises
    ------
    ValidationError
        For an empty or over-long job name or id, or an empty source.
    """
    if job is not None:
        check_name(job, "job")
    report_id = report_id if report_id is not None else uuid.uuid4().hex
    if not report_id or len(report_id) > 64:
        raise ValidationError(f"report id {report_id!r} must have 1..64 characters")
    if not source:
        raise ValidationError("a what-if report needs a non-empty source description")
    row = WhatIfReportRow(
        id=report_id,
        job=job,
        status=WhatIfStatus.PENDING.value,
        source=source,
        created_at=time.time() if now is None else float(now),
    )
    session.add(row)
    session.flush()
    return _to_summary(row)


def _row_for_change(session: Session, report_id: str, target: WhatIfStatus) -> WhatIfReportRow:
    row = session.get(WhatIfReportRow, report_id, with_for_update=True)
    if row is None:
        raise NotFoundError(f"no what-if report with id {report_id!r}")
    allowed = _ALLOWED_FROM[target]
    if row.status not in allowed:
        raise ValidationError(
            f"what-if report {report_id!r} is {row.status!r}: it can become {target.value!r} "
            f"only from {[s.value for s in allowed]}"
        )
    return row


def mark_running(session: Session, report_id: str, now: float | None = None) -> WhatIfSummary:
    """``pending`` → ``running``, stamping ``started_at``.

    Raises
    ------
    NotFoundError
        For an unknown id.
    ValidationError
        When the report is not ``pending``.
    """
    row = _row_for_change(session, report_id, WhatIfStatus.RUNNING)
    row.status = WhatIfStatus.RUNNING.value
    row.started_at = time.time() if now is None else float(now)
    session.flush()
    return _to_summary(row)


def finish_report(
    session: Session,
    report_id: str,
    report: Mapping[str, Any],
    slowdown: float,
    verdict: str,
    job: str,
    now: float | None = None,
) -> WhatIfSummary:
    """``running`` → ``done``, storing the report, its S, its verdict and its job.

    ``report`` is made JSON-safe first (NaN and infinities become ``null``, numpy values plain
    numbers).

    Raises
    ------
    NotFoundError
        For an unknown id.
    ValidationError
        When the report is not ``running``, ``slowdown`` is not finite, the job name is empty or
        too long, or ``report`` is not JSON data.
    """
    if not math.isfinite(slowdown):
        raise ValidationError(
            f"what-if report {report_id!r} has slowdown {slowdown}: expected a finite number"
        )
    check_name(job, "job")
    body = json_safe(dict(report), "report")
    row = _row_for_change(session, report_id, WhatIfStatus.DONE)
    row.status = WhatIfStatus.DONE.value
    row.report = body
    row.slowdown = float(slowdown)
    row.verdict = verdict
    row.job = job
    row.finished_at = time.time() if now is None else float(now)
    session.flush()
    return _to_summary(row)


def fail_report(
    session: Session, report_id: str, error: str, now: float | None = None
) -> WhatIfSummary:
    """``pending`` or ``running`` → ``failed``, storing why.

    Raises
    ------
    NotFoundError
        For an unknown id.
    ValidationError
        When the report is already ``done`` or ``failed``.
    """
    row = _row_for_change(session, report_id, WhatIfStatus.FAILED)
    message = error or "the analysis failed without a message"
    if len(message) > ERROR_MAX_LEN:
        cut = len(message) - ERROR_MAX_LEN
        message = f"{message[:ERROR_MAX_LEN]}… ({cut} more characters)"
    row.status = WhatIfStatus.FAILED.value
    row.error = message
    row.finished_at = time.time() if now is None else float(now)
    session.flush()
    return _to_summary(row)


def get_report(session: Session, report_id: str) -> WhatIfRecord:
    """The report ``report_id`` with its body; :class:`NotFoundError` naming the id if absent."""
    row = session.get(WhatIfReportRow, report_id, populate_existing=True)
    if row is None:
        raise NotFoundError(f"no what-if report with id {report_id!r}")
    summary = _to_summary(row)
    values = {field.name: getattr(summary, field.name) for field in fields(summary)}
    return WhatIfRecord(**values, report=row.report)


def list_reports(
    session: Session,
    job: str | None = None,
    status: WhatIfStatus | str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[WhatIfSummary], int]:
    """One page of reports (without their bodies), newest submitted first, and the total.

    Raises
    ------
    ValidationError
        For an unknown status, ``limit`` outside 1..500 or a negative ``offset``.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit {limit} is out of range: expected 1..{MAX_PAGE}")
    if offset < 0:
        raise ValidationError(f"offset {offset} is negative: expected >= 0")
    conditions: list[ColumnElement[bool]] = []
    if job is not None:
        conditions.append(WhatIfReportRow.job == job)
    if status is not None:
        conditions.append(WhatIfReportRow.status == parse_whatif_status(status).value)
    total = (
        session.scalar(select(func.count()).select_from(WhatIfReportRow).where(*conditions)) or 0
    )
    query = (
        select(WhatIfReportRow)
        .where(*conditions)
        # reports can weigh megabytes: a listing never loads them
        .options(defer(WhatIfReportRow.report, raiseload=True))
        .order_by(WhatIfReportRow.created_at.desc(), WhatIfReportRow.id.desc())
        .limit(limit)
        .offset(offset)
        .execution_options(populate_existing=True)
    )
    return [_to_summary(row) for row in session.scalars(query)], total


def _to_summary(row: WhatIfReportRow) -> WhatIfSummary:
    return WhatIfSummary(
        id=row.id,
        job=row.job,
        status=WhatIfStatus(row.status),
        source=row.source,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        slowdown=row.slowdown,
        verdict=row.verdict,
        error=row.error,
    )
