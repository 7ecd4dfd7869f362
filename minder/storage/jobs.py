"""Job, machine and current-score repository.

Every function takes a :class:`~sqlalchemy.orm.Session` opened by the caller and leaves the
commit to it. Writes are set-based (one statement per table, native upserts), so a job of 10,000
machines costs a handful of statements, not 10,000.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, case, delete, func, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from minder.core.errors import NotFoundError, ValidationError
from minder.storage.alerts import count_active_alerts
from minder.storage.models import JobFindingRow, JobRow, MachineRow, MachineScoreRow
from minder.storage.records import (
    JobFinding,
    JobInfo,
    JobReport,
    JobStatus,
    MachineInfo,
    MachineScore,
    MachineState,
    ScoreRow,
)

# Core tables for the bulk statements: the ORM's bulk mode adds ~30% per row (measured)
_JOBS = cast(Table, JobRow.__table__)
_MACHINES = cast(Table, MachineRow.__table__)
_SCORES = cast(Table, MachineScoreRow.__table__)
_FINDINGS = cast(Table, JobFindingRow.__table__)

NAME_MAX_LEN = 255
"""Longest job or machine name the tables hold."""

_Score = tuple[str, str, float, str]
"""A checked score row: ``(machine, metric, score, device)``."""


def check_name(value: str, what: str) -> str:
    """``value`` if it is a usable job or machine name, else :class:`ValidationError`."""
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{what} name {value!r} is empty or not a string")
    if len(value) > NAME_MAX_LEN:
        raise ValidationError(
            f"{what} name {value[:40]!r}… is {len(value)} characters long: at most {NAME_MAX_LEN}"
        )
    return value


def _upsert_construct(session: Session) -> Any:
    """The dialect's ``INSERT … ON CONFLICT`` construct (SQLite and PostgreSQL share its API)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise ValidationError(f"database {dialect!r} is not supported: use SQLite or PostgreSQL")


def _bulk_insert(
    session: Session,
    table: Table,
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    on_conflict: Callable[[Any], Any] | None = None,
) -> None:
    """Insert ``rows`` (tuples of the ``columns``' values: floats, strings, None) in one
    statement, upserting via ``on_conflict``.

    PostgreSQL gets one ``INSERT … SELECT FROM unnest(arrays)``: with psycopg's row-by-row
    ``executemany`` saving 40,000 scores took twice as long. SQLite gets the statement compiled
    once and the driver's ``executemany`` of the plain tuples: SQLAlchemy's own executemany
    builds a parameter dictionary per row, more than half the time of a job's first write.
    """
    if not rows:
        return
    upsert = _upsert_construct(session)
    if upsert is not postgresql.insert:
        stmt = upsert(table)
        stmt = stmt if on_conflict is None else on_conflict(stmt)
        connection = session.connection()
        dialect = connection.dialect
        compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
        keys = set(columns)
        plain = (
            compiled.positional
            and list(compiled.positiontup or ()) == list(columns)
            and all(c.default is None or c.key in keys for c in table.c)  # no default to add
        )
        if not plain:  # a statement with other parameters, or defaults: SQLAlchemy's way
            session.execute(stmt, [dict(zip(columns, row, strict=True)) for row in rows])
            return
        # The values go to the driver as they are (the callers give floats, strings and None:
        # no column type has anything to convert).
        # In key order: the table's index is then written page by page, not all over.
        connection.exec_driver_sql(str(compiled), sorted(rows, key=_key(table, columns)))
        return
    arrays = [
        bindparam(f"values_{i}", [row[i] for row in rows], type_=ARRAY(table.c[name].type))
        for i, name in enumerate(columns)
    ]
    source = func.unnest(*arrays).table_valued(*columns).render_derived(name="source")
    stmt = upsert(table).from_select(columns, select(*(source.c[name] for name in columns)))
    session.execute(stmt if on_conflict is None else on_conflict(stmt))


def _key(table: Table, columns: Sequence[str]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The sort key of ``columns``' rows: their primary key (in the index's column order)."""
    where = {name: i for i, name in enumerate(columns)}
    picks = [where[c.key] for c in table.primary_key.columns if c.key in where]
    return operator.itemgetter(*picks) if len(picks) > 1 else lambda row: (row[picks[0]],)


def _later(column: Any, new: Any) -> Any:
    # portable max(a, b): SQLite has max(), PostgreSQL greatest()
    return case((column > new, column), else_=new)


def _new_job(job: str, ts: float, now: float) -> dict[str, Any]:
    """The row of a job first seen at data time ``ts`` (wall time ``now``): active."""
    return {
        "id": job,
        "first_seen_ts": ts,
        "last_seen_ts": ts,
        "machine_count": 0,
        "status": JobStatus.ACTIVE.value,
        "updated_at": now,
        "active_machines": 0,
        "status_since": now,
        "status_reason": "",
        "reported_at": now,
    }


def _touch_job(session: Session, job: str, ts: float, now: float) -> None:
    """Register ``job`` (active) or widen its seen times to include ``ts``. Its status is left
    as it is: the detection worker that holds the job says it (:func:`report_job_states`)."""
    upsert = _upsert_construct(session)
    stmt = upsert(_JOBS).values(**_new_job(job, ts, now))
    stmt = stmt.on_conflict_do_update(
        index_elements=[_JOBS.c.id],
        set_={
            "first_seen_ts": case(
                (_JOBS.c.first_seen_ts < stmt.excluded.first_seen_ts, _JOBS.c.first_seen_ts),
                else_=stmt.excluded.first_seen_ts,
            ),
            "last_seen_ts": _later(_JOBS.c.last_seen_ts, stmt.excluded.last_seen_ts),
            "updated_at": now,
        },
    )
    session.execute(stmt)


def _recount_machines(session: Session, job: str) -> None:
    count = select(func.count()).where(_MACHINES.c.job == job).scalar_subquery()
    session.execute(update(_JOBS).where(_JOBS.c.id == job).values(machine_count=count))


def upsert_job_machines(
    session: Session,
    job: str,
    machines: Iterable[MachineInfo | Mapping[str, Any]],
    ts: float,
) -> int:
    """Register ``job`` (seen at ``ts``) and its ``machines``, creating or updating them.

    A new job is ``active`` (a known one keeps its status: :func:`report_job_states`); its
    ``first_seen_ts``/``last_seen_ts`` widen to include ``ts``.
    Each machine gets its ``group`` and ``domain`` as given and ``last_seen_ts`` = the later of the
    stored one and its own (``ts`` when it has none). Machines not listed are kept. A name listed
    twice counts once (the last entry wins).

    Returns
    -------
    int
        The job's machine count after the upsert.

    Raises
    ------
    ValidationError
        For an empty or over-long job or machine name, or a malformed machine entry.
    """
    check_name(job, "job")
    by_name: dict[str, MachineInfo] = {}
    for entry in machines:
        info = MachineInfo.coerce(entry)
        by_name[check_name(info.name, "machine")] = info
    now = time.time()
    _touch_job(session, job, ts, now)
    _bulk_insert(
        session,
        _MACHINES,
        ("job", "name", "group", "domain", "last_seen_ts"),
        [
            (
                job,
                info.name,
                info.group,
                info.domain,
                float(ts if info.last_seen_ts is None else info.last_seen_ts),
            )
            for info in by_name.values()
        ],
        lambda stmt: stmt.on_conflict_do_update(
            index_elements=[_MACHINES.c.job, _MACHINES.c.name],
            set_={
                "group": stmt.excluded["group"],
                "domain": stmt.excluded["domain"],
                "last_seen_ts": _later(
                    func.coalesce(_MACHINES.c.last_seen_ts, stmt.excluded.last_seen_ts),
                    stmt.excluded.last_seen_ts,
                ),
            },
        ),
    )
    _recount_machines(session, job)
    session.flush()
    return int(session.scalar(select(JobRow.machine_count).where(JobRow.id == job)) or 0)


def save_scores(
    session: Session,
    job: str,
    rows: Iterable[ScoreRow | Mapping[str, Any] | tuple[Any, ...]],
    ts: float,
) -> int:
    """Replace the current scores of ``job`` with ``rows``, computed at data time ``ts``.

    The table keeps one row per (job, machine, metric): a (machine, metric) given twice keeps its
    highest score (and that row's device). Each machine's ``top_score``/``top_metric``/
    ``top_device``/``score_ts`` become its highest row; machines without a row lose theirs.
    Unknown machines are registered (empty group and domain), and so is the job.

    Returns
    -------
    int
        The number of score rows stored.

    Raises
    ------
    ValidationError
        For a malformed row or a non-finite score (nothing is changed then).
    """
    check_name(job, "job")
    best, top = _best_rows(rows)
    _touch_job(session, job, ts, time.time())
    session.execute(delete(_SCORES).where(_SCORES.c.job == job))
    _insert_scores(session, job, best, ts)
    session.execute(
        update(_MACHINES)
        .where(_MACHINES.c.job == job, _MACHINES.c.top_score.is_not(None))
        .values(top_score=None, top_metric=None, top_device=None, score_ts=None)
    )
    _upsert_tops(session, job, top, ts)
    session.flush()
    return len(best)


_IN_CHUNK = 5_000  # items per IN (...) list: SQLite allows 32,766 parameters per statement


def upsert_scores(
    session: Session,
    job: str,
    rows: Iterable[ScoreRow | Mapping[str, Any] | tuple[Any, ...]],
    ts: float,
    *,
    removed: Iterable[tuple[str, str]] = (),
) -> int:
    """Set the current score of each (machine, metric) of ``rows``, computed at data time
    ``ts``, and delete the ``(machine, metric)`` scores in ``removed``; every other score is
    kept. The service writes only the scores that changed. Machines' ``top_*`` are not
    touched (:func:`set_top_scores`); unknown machines are not registered.

    Returns
    -------
    int
        The number of score rows written.

    Raises
    ------
    ValidationError
        For a malformed row, a non-finite score or a bad name (nothing is changed then).
    """
    check_name(job, "job")
    best, _ = _best_rows(rows)
    gone = sorted({(check_name(m, "machine"), metric) for m, metric in removed})
    _touch_job(session, job, ts, time.time())
    for lo in range(0, len(gone), _IN_CHUNK):
        chunk = gone[lo : lo + _IN_CHUNK]
        session.execute(
            delete(_SCORES).where(
                _SCORES.c.job == job, tuple_(_SCORES.c.machine, _SCORES.c.metric).in_(chunk)
            )
        )
    _insert_scores(
        session,
        job,
        best,
        ts,
        lambda stmt: stmt.on_conflict_do_update(
            index_elements=[_SCORES.c.job, _SCORES.c.machine, _SCORES.c.metric],
            set_={
                "score": stmt.excluded.score,
                "device": stmt.excluded.device,
                "ts": stmt.excluded.ts,
            },
        ),
    )
    session.flush()
    return len(best)


def set_top_scores(
    session: Session, job: str, tops: Mapping[str, ScoreRow | None], ts: float
) -> None:
    """Set each named machine's ``top_score``/``top_metric``/``top_device``/``score_ts`` from
    its row, or clear them (``None``); other machines are kept. Unknown machines are
    registered (empty group and domain).

    Raises
    ------
    ValidationError
        For a bad name or a malformed row (nothing is changed then).
    """
    check_name(job, "job")
    rows = {
        check_name(m, "machine"): None if r is None else ScoreRow.coerce(r) for m, r in tops.items()
    }
    _touch_job(session, job, ts, time.time())
    cleared = sorted(m for m, r in rows.items() if r is None)
    for lo in range(0, len(cleared), _IN_CHUNK):
        session.execute(
            update(_MACHINES)
            .where(_MACHINES.c.job == job, _MACHINES.c.name.in_(cleared[lo : lo + _IN_CHUNK]))
            .values(top_score=None, top_metric=None, top_device=None, score_ts=None)
        )
    _upsert_tops(
        session,
        job,
        {
            m: (r.machine, r.metric, float(r.score), r.device)
            for m, r in rows.items()
            if r is not None
        },
        ts,
    )
    session.flush()


def _score(entry: ScoreRow | Mapping[str, Any] | tuple[Any, ...]) -> _Score:
    """``entry`` as a ``(machine, metric, score, device)`` tuple, checked as
    :meth:`ScoreRow.coerce` and :func:`check_name` check it. The service's own rows (4-tuples of
    str, str, float, str, or ScoreRows) are taken as they are once found valid; anything else,
    or anything invalid (for its error), goes through them."""
    if isinstance(entry, tuple) and len(entry) == 4:
        machine, metric, score, device = entry
    elif isinstance(entry, ScoreRow):
        machine, metric, score, device = entry.machine, entry.metric, entry.score, entry.device
    else:
        machine = metric = device = ""
        score = 0.0
    if (
        type(machine) is str
        and type(metric) is str
        and type(score) is float
        and type(device) is str
        and machine
        and metric
        and len(machine) <= NAME_MAX_LEN
        and math.isfinite(score)
    ):
        return (machine, metric, score, device)
    coerced = ScoreRow.coerce(entry)
    check_name(coerced.machine, "machine")
    # float(): a ScoreRow may hold a numpy float
    return (coerced.machine, coerced.metric, float(coerced.score), coerced.device)


def _best_rows(
    rows: Iterable[ScoreRow | Mapping[str, Any] | tuple[Any, ...]],
) -> tuple[dict[tuple[str, str], _Score], dict[str, _Score]]:
    """The highest row per (machine, metric), and per machine, as ``(machine, metric, score,
    device)`` tuples (:func:`_score`)."""
    best: dict[tuple[str, str], _Score] = {}
    for entry in rows:
        row = _score(entry)
        key = (row[0], row[1])
        old = best.get(key)
        if old is None or row[2] > old[2]:
            best[key] = row
    top: dict[str, _Score] = {}
    for kept in best.values():
        old = top.get(kept[0])
        if old is None or kept[2] > old[2]:
            top[kept[0]] = kept
    return best, top


def _insert_scores(
    session: Session,
    job: str,
    best: dict[tuple[str, str], _Score],
    ts: float,
    on_conflict: Callable[[Any], Any] | None = None,
) -> None:
    ts = float(ts)
    _bulk_insert(
        session,
        _SCORES,
        ("job", "machine", "metric", "score", "device", "ts"),
        [
            (job, machine, metric, score, device, ts)
            for machine, metric, score, device in best.values()
        ],
        on_conflict,
    )


def _upsert_tops(session: Session, job: str, top: dict[str, _Score], ts: float) -> None:
    """Each machine's ``top_*`` from its highest row (registering unknown machines)."""
    ts = float(ts)
    if top:
        _bulk_insert(
            session,
            _MACHINES,
            (
                "job",
                "name",
                "group",
                "domain",
                "last_seen_ts",
                "top_score",
                "top_metric",
                "top_device",
                "score_ts",
            ),
            [
                (job, machine, "", "", None, score, metric, device, ts)
                for machine, metric, score, device in top.values()
            ],
            lambda stmt: stmt.on_conflict_do_update(
                index_elements=[_MACHINES.c.job, _MACHINES.c.name],
                set_={
                    "top_score": stmt.excluded.top_score,
                    "top_metric": stmt.excluded.top_metric,
                    "top_device": stmt.excluded.top_device,
                    "score_ts": stmt.excluded.score_ts,
                },
            ),
        )
        _recount_machines(session, job)


def _job_info(row: JobRow, open_alerts: int, finding_count: int = 0) -> JobInfo:
    return JobInfo(
        id=row.id,
        first_seen_ts=row.first_seen_ts,
        last_seen_ts=row.last_seen_ts,
        machine_count=row.machine_count,
        status=JobStatus(row.status),
        updated_at=row.updated_at,
        open_alerts=open_alerts,
        finding_count=finding_count,
        active_machines=row.active_machines,
        status_since=row.status_since,
        status_reason=row.status_reason,
    )


def _parse_job_status(value: JobStatus | str) -> JobStatus:
    try:
        return JobStatus(value)
    except ValueError:
        allowed = [s.value for s in JobStatus]
        raise ValidationError(f"unknown job status {value!r}: allowed {allowed}") from None


def list_jobs(session: Session, status: JobStatus | str | None = None) -> list[JobInfo]:
    """Every job (in ``status``), most recently seen first, with its open-alert and current
    finding counts."""
    query = select(JobRow).execution_options(populate_existing=True)
    if status is not None:
        query = query.where(JobRow.status == _parse_job_status(status).value)
    jobs = list(session.scalars(query.order_by(JobRow.last_seen_ts.desc(), JobRow.id)))
    counts = count_active_alerts(session, [job.id for job in jobs]) if jobs else {}
    findings = count_job_findings(session) if jobs else {}
    return [_job_info(job, counts.get(job.id, 0), findings.get(job.id, 0)) for job in jobs]


def _job_row(session: Session, job: str) -> JobRow:
    # populate_existing: the set-based writes above bypass the identity map
    row = session.get(JobRow, job, populate_existing=True)
    if row is None:
        raise NotFoundError(f"no job {job!r}")
    return row


def get_job(session: Session, job: str) -> JobInfo:
    """The job ``job``; :class:`NotFoundError` naming it if unknown."""
    row = _job_row(session, job)
    return _job_info(
        row,
        count_active_alerts(session, [job]).get(job, 0),
        count_job_findings(session, job).get(job, 0),
    )


def set_job_status(
    session: Session, job: str, status: JobStatus | str, reason: str = "set by hand"
) -> JobInfo:
    """Put ``job`` in ``status`` (tools, tests; the service reports through
    :func:`report_job_states`, which the next report of a worker that holds the job
    overrides)."""
    parsed = _parse_job_status(status)
    row = _job_row(session, job)
    if row.status != parsed.value:
        now = time.time()
        row.status = parsed.value
        row.status_since = now
        row.status_reason = "" if parsed is JobStatus.ACTIVE else reason[:NAME_MAX_LEN]
        if parsed is not JobStatus.ACTIVE:
            row.active_machines = 0
        row.reported_at = now
        row.updated_at = now
        session.flush()
    return get_job(session, job)


def report_job_states(session: Session, reports: Iterable[JobReport], now: float) -> None:
    """Store what a detection worker says about the jobs it holds (or held), at wall time
    ``now`` (the worker's clock).

    ``active``: the job is registered if unknown, becomes active (``status_since`` = ``now``
    when it was not), takes the report's ``active_machines`` and ``reported_at`` = ``now``.
    ``idle`` (its window was dropped) applies to an active job only, ``ended`` to a job not
    ended yet; both set ``active_machines`` to 0 and keep the report's reason (an unknown job
    is registered in that status). A report whose
    ``seen_ts`` is older than the job's stored ``last_seen_ts`` is ignored: another worker
    has newer data of the job (it took the job's partition over). Each report raises
    ``last_seen_ts`` to its ``seen_ts``.

    Raises
    ------
    ValidationError
        For a bad job name, a negative machine count or a non-finite time (nothing is
        changed then).
    """
    by_job: dict[str, JobReport] = {}
    for report in reports:
        check_name(report.job, "job")
        status = _parse_job_status(report.status)
        if not (math.isfinite(report.seen_ts) and math.isfinite(now)):
            raise ValidationError(
                f"report of job {report.job!r} at seen_ts {report.seen_ts!r}, now {now!r}: "
                "expected finite times"
            )
        if report.active_machines < 0:
            raise ValidationError(
                f"report of job {report.job!r}: active_machines {report.active_machines!r}: "
                "expected a count >= 0"
            )
        by_job[report.job] = JobReport(
            report.job,
            status,
            int(report.active_machines) if status is JobStatus.ACTIVE else 0,
            float(report.seen_ts),
            "" if status is JobStatus.ACTIVE else report.reason[:NAME_MAX_LEN],
        )
    active = [r for r in by_job.values() if r.status is JobStatus.ACTIVE]
    upsert = _upsert_construct(session)
    if active:
        stmt = upsert(_JOBS)
        was_active = _JOBS.c.status == JobStatus.ACTIVE.value
        stmt = stmt.on_conflict_do_update(
            index_elements=[_JOBS.c.id],
            set_={
                "status": JobStatus.ACTIVE.value,
                "status_since": case(
                    (was_active, _JOBS.c.status_since), else_=stmt.excluded.status_since
                ),
                "status_reason": "",
                "active_machines": stmt.excluded.active_machines,
                "reported_at": stmt.excluded.reported_at,
                "last_seen_ts": _later(_JOBS.c.last_seen_ts, stmt.excluded.last_seen_ts),
                # a report that changes nothing (the worker's periodic word) is no update
                "updated_at": case(
                    (
                        and_(was_active, _JOBS.c.active_machines == stmt.excluded.active_machines),
                        _JOBS.c.updated_at,
                    ),
                    else_=stmt.excluded.updated_at,
                ),
            },
            where=_JOBS.c.last_seen_ts <= stmt.excluded.last_seen_ts,
        )
        rows = []
        for r in sorted(active, key=lambda r: r.job):
            row = _new_job(r.job, r.seen_ts, now)
            row["active_machines"] = r.active_machines
            rows.append(row)
        for lo in range(0, len(rows), _IN_CHUNK // 10):
            session.execute(stmt, rows[lo : lo + _IN_CHUNK // 10])
    for r in sorted(by_job.values(), key=lambda r: r.job):
        if r.status is JobStatus.ACTIVE:
            continue
        # a job never written (it ended before its first evaluation) is registered as it is
        row = _new_job(r.job, r.seen_ts, now)
        row.update(status=r.status.value, status_reason=r.reason)
        session.execute(upsert(_JOBS).values(**row).on_conflict_do_nothing())
        if r.status is JobStatus.IDLE:
            allowed = _JOBS.c.status == JobStatus.ACTIVE.value
        else:
            allowed = _JOBS.c.status != JobStatus.ENDED.value
        session.execute(
            update(_JOBS)
            .where(_JOBS.c.id == r.job, allowed, _JOBS.c.last_seen_ts <= r.seen_ts)
            .values(
                status=r.status.value,
                status_since=now,
                status_reason=r.reason,
                active_machines=0,
                last_seen_ts=_later(_JOBS.c.last_seen_ts, r.seen_ts),
                updated_at=now,
            )
        )
    session.flush()


def sweep_jobs(
    session: Session, now: float, *, stale_after_s: float, retention_s: float
) -> tuple[list[str], list[str]]:
    """Age the stored jobs at wall time ``now``: an active job no worker said is active for
    ``stale_after_s`` becomes idle (the worker that held it stopped: a restart, a crash), an
    idle job idle for ``retention_s`` becomes ended.

    Returns
    -------
    tuple[list[str], list[str]]
        The jobs that became idle, and those that ended, by name.
    """
    if not (stale_after_s >= 0 and retention_s >= 0 and math.isfinite(now)):
        raise ValidationError(
            f"sweep at {now!r} with stale_after_s={stale_after_s!r}, "
            f"retention_s={retention_s!r}: expected a finite time and seconds >= 0"
        )
    steps = (
        (
            JobStatus.ACTIVE,
            _JOBS.c.reported_at,
            stale_after_s,
            JobStatus.IDLE,
            f"no word for {stale_after_s:.0f} s from the worker that held it (it stopped or "
            "restarted)",
        ),
        (
            JobStatus.IDLE,
            _JOBS.c.status_since,
            retention_s,
            JobStatus.ENDED,
            f"idle for the retention of {retention_s:.0f} s",
        ),
    )
    out: list[list[str]] = []
    for before, since, after_s, status, reason in steps:
        due = (_JOBS.c.status == before.value, since < now - after_s)
        names = sorted(session.scalars(select(_JOBS.c.id).where(*due)))
        for lo in range(0, len(names), _IN_CHUNK):
            session.execute(
                update(_JOBS)
                .where(_JOBS.c.id.in_(names[lo : lo + _IN_CHUNK]), *due)
                .values(
                    status=status.value,
                    status_since=now,
                    status_reason=reason,
                    active_machines=0,
                    updated_at=now,
                )
            )
        out.append(names)
    session.flush()
    return out[0], out[1]


def list_machines(session: Session, job: str) -> list[MachineState]:
    """The machines of ``job`` by name; :class:`NotFoundError` if the job is unknown."""
    _job_row(session, job)
    query = (
        select(MachineRow)
        .where(MachineRow.job == job)
        .order_by(MachineRow.name)
        .execution_options(populate_existing=True)
    )
    return [
        MachineState(
            job=row.job,
            name=row.name,
            group=row.group,
            domain=row.domain,
            last_seen_ts=row.last_seen_ts,
            top_score=row.top_score,
            top_metric=row.top_metric,
            top_device=row.top_device,
            score_ts=row.score_ts,
        )
        for row in session.scalars(query)
    ]


def current_scores(session: Session, job: str) -> list[MachineScore]:
    """The current scores of ``job`` by machine and metric; :class:`NotFoundError` if unknown."""
    _job_row(session, job)
    query = (
        select(MachineScoreRow)
        .where(MachineScoreRow.job == job)
        .order_by(MachineScoreRow.machine, MachineScoreRow.metric)
        .execution_options(populate_existing=True)
    )
    return [
        MachineScore(
            job=row.job,
            machine=row.machine,
            metric=row.metric,
            score=row.score,
            device=row.device,
            ts=row.ts,
        )
        for row in session.scalars(query)
    ]


def save_job_findings(
    session: Session,
    job: str,
    findings: Iterable[JobFinding | Mapping[str, Any]],
    ts: float,
) -> int:
    """Replace the current job-level findings of ``job`` with ``findings``, as of data time
    ``ts`` (their ``updated_ts``); an empty ``findings`` clears them. A finding given twice
    (same name and metric) counts once: the last one wins. The job is registered if unknown
    (its seen times widen to include ``ts``, like any write of the service).

    Returns
    -------
    int
        The number of findings stored.

    Raises
    ------
    ValidationError
        For a bad job name or a malformed finding (nothing is changed then).
    """
    check_name(job, "job")
    if not math.isfinite(ts):
        raise ValidationError(f"findings of job {job!r} at ts {ts!r}: expected a finite time")
    by_key = {f.key: f for f in (JobFinding.coerce(entry) for entry in findings)}
    ts = float(ts)
    _touch_job(session, job, ts, time.time())
    session.execute(delete(_FINDINGS).where(_FINDINGS.c.job == job))
    if by_key:
        session.execute(
            _FINDINGS.insert(),
            [
                {
                    "job": job,
                    "finding": f.finding,
                    "metric": f.metric or "",
                    "coherence": f.coherence,
                    "outliers": f.outliers,
                    "allowance": f.allowance,
                    "machines": f.machines,
                    "since_ts": f.since_ts,
                    "updated_ts": ts,
                    "detail": f.detail,
                }
                for f in by_key.values()
            ],
        )
    session.flush()
    return len(by_key)


def list_job_findings(session: Session, job: str) -> list[JobFinding]:
    """The current job-level findings of ``job`` by finding and metric (a finding about no
    one metric has ``metric`` ``None``); :class:`NotFoundError` if the job is unknown."""
    _job_row(session, job)
    query = (
        select(JobFindingRow)
        .where(JobFindingRow.job == job)
        .order_by(JobFindingRow.finding, JobFindingRow.metric)
        .execution_options(populate_existing=True)
    )
    return [
        JobFinding(
            finding=row.finding,
            metric=row.metric or None,
            machines=row.machines,
            since_ts=row.since_ts,
            detail=row.detail,
            coherence=row.coherence,
            outliers=row.outliers,
            allowance=row.allowance,
            updated_ts=row.updated_ts,
        )
        for row in session.scalars(query)
    ]


def count_job_findings(session: Session, job: str | None = None) -> dict[str, int]:
    """Current job-level findings per job (of ``job``, or of every job that has any)."""
    query = select(_FINDINGS.c.job, func.count()).group_by(_FINDINGS.c.job)
    if job is not None:
        query = query.where(_FINDINGS.c.job == job)
    return {name: int(count) for name, count in session.execute(query)}
