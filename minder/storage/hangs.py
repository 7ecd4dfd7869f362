"""The latest hang analysis of each job, and the hang alerts open for it (docs/hangs.md).

The detection service hands a job's latest :class:`~minder.core.hang.HangAnalysis` to its state
writer whenever the detector makes a new one; :func:`save_hang_analysis` keeps one row per job
(the newest analysis replaces the one before, including the one that says the hang is over),
and ``GET /api/v1/jobs/{job}/hang`` reads it back with :func:`get_hang_analysis` and
:func:`open_hang_alerts`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from minder.core.alert import AlertKind
from minder.core.errors import NotFoundError, ValidationError
from minder.core.hang import HangAnalysis
from minder.storage.alerts import ACTIVE_STATUSES
from minder.storage.jobs import _job_row, _touch_job, _upsert_construct, check_name
from minder.storage.models import AlertRow, JobHangRow

_HANGS = cast(Table, JobHangRow.__table__)


@dataclass(frozen=True, slots=True)
class HangRecord:
    """A job's latest stored hang analysis.

    Attributes
    ----------
    analysed_ts
        When the analysis was made (its own ``analysed_ts``), unix seconds.
    updated_ts
        Data time at which the service stored it.
    updated_at
        Wall time of the write, unix seconds.
    """

    job: str
    analysis: HangAnalysis
    analysed_ts: float
    updated_ts: float
    updated_at: float

    @property
    def hung(self) -> bool:
        return self.analysis.hung


@dataclass(frozen=True, slots=True)
class OpenHangAlerts:
    """The ``hang`` alerts of a job that are open or acknowledged.

    Attributes
    ----------
    job_alert
        The id of the job-level alert (the one with no machine, holding the analysis), if open.
    machine_alerts
        Machine → id of its own ``hang`` alert (the culprits' machines), by machine.
    """

    job_alert: str | None = None
    machine_alerts: Mapping[str, str] = field(default_factory=dict)


def _analysis(value: HangAnalysis | Mapping[str, Any]) -> HangAnalysis:
    if isinstance(value, HangAnalysis):
        return value
    return HangAnalysis.from_dict(value)


def save_hang_analysis(
    session: Session,
    job: str,
    analysis: HangAnalysis | Mapping[str, Any],
    ts: float,
    *,
    now: float | None = None,
) -> None:
    """Keep ``analysis`` (a :class:`HangAnalysis` or its ``to_dict``) as ``job``'s latest, as of
    data time ``ts``, replacing the one stored before. The job is registered if unknown (its
    seen times widen to include ``ts``, like any write of the service).

    Raises
    ------
    ValidationError
        For a bad job name, a time that is not finite or a malformed analysis (nothing is
        changed then).
    """
    check_name(job, "job")
    if not (isinstance(ts, int | float) and math.isfinite(ts)):
        raise ValidationError(f"hang analysis of job {job[:64]!r} at ts {ts!r}: expected a "
                              "finite time")  # fmt: skip
    checked = _analysis(analysis)
    if not math.isfinite(checked.analysed_ts):
        raise ValidationError(
            f"hang analysis of job {job[:64]!r} has analysed_ts {checked.analysed_ts!r}: "
            "expected a finite time"
        )
    wall = time.time() if now is None else now
    _touch_job(session, job, float(ts), wall)
    values = {
        "hung": checked.hung,
        "culprits": len(checked.culprit_ranks),
        "analysed_ts": checked.analysed_ts,
        "updated_ts": float(ts),
        "analysis": checked.to_dict(),
        "updated_at": wall,
    }
    upsert = _upsert_construct(session)
    stmt = upsert(_HANGS).values(job=job, **values)
    stmt = stmt.on_conflict_do_update(index_elements=[_HANGS.c.job], set_=values)
    session.execute(stmt)
    session.flush()


def get_hang_analysis(session: Session, job: str) -> HangRecord:
    """``job``'s latest hang analysis; :class:`NotFoundError` naming the job when it is unknown
    or has none."""
    _job_row(session, job)
    row = session.get(JobHangRow, job, populate_existing=True)
    if row is None:
        raise NotFoundError(f"no hang analysis of job {job[:64]!r}: none was made for it")
    return HangRecord(
        job=row.job,
        analysis=HangAnalysis.from_dict(row.analysis, f"stored hang analysis of {job[:64]!r}"),
        analysed_ts=row.analysed_ts,
        updated_ts=row.updated_ts,
        updated_at=row.updated_at,
    )


def open_hang_alerts(session: Session, job: str) -> OpenHangAlerts:
    """The ids of ``job``'s ``hang`` alerts that are open or acknowledged (the newest of each
    machine, should there be several)."""
    query = (
        select(AlertRow.id, AlertRow.machine)
        .where(
            AlertRow.job == job,
            AlertRow.kind == AlertKind.HANG.value,
            AlertRow.status.in_(ACTIVE_STATUSES),
        )
        .order_by(AlertRow.detected_ts, AlertRow.id)
    )
    job_alert: str | None = None
    machines: dict[str, str] = {}
    for alert_id, machine in session.execute(query):
        if machine:
            machines[machine] = alert_id
        else:
            job_alert = alert_id
    return OpenHangAlerts(job_alert, dict(sorted(machines.items())))
