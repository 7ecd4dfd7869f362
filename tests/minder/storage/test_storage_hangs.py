"""The latest hang analysis per job, and the job's open hang alerts (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, select

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import NotFoundError, ValidationError
from minder.core.hang import Culprit, CulpritReason, GroupVerdict, HangAnalysis, Mismatch
from minder.storage import (
    MachineInfo,
    SessionFactory,
    get_hang_analysis,
    open_hang_alerts,
    record_alert,
    save_hang_analysis,
    set_alert_status,
    upsert_job_machines,
)
from minder.storage.models import Base

T0 = 1_700_000_000.0


def hung(ts: float = T0, *ranks: int) -> HangAnalysis:
    culprits = tuple(
        Culprit(
            rank=r,
            reason=CulpritReason.NOT_JOINED,
            machine=f"n{r // 2:02d}",
            group="0",
            group_desc="default_pg",
            op="nccl:all_reduce",
            seq=41,
            detail=f"rank {r} never enqueued all_reduce #41",
        )
        for r in ranks or (2,)
    )
    return HangAnalysis(
        hung=True,
        culprits=culprits,
        mismatches=(Mismatch("0", 40, "input_sizes", {"[[8]]": (0, 1, 3), "[[4]]": (2,)}),),
        groups=(GroupVerdict("0", "default_pg", 4, True, 41, "nccl:all_reduce", 3, (2,)),),
        ranks_seen=4,
        ranks_expected=4,
        versions=("2.10",),
        analysed_ts=ts,
        notes=("one note",),
    )


def test_the_latest_analysis_round_trips_and_replaces_the_one_before(
    sessions: SessionFactory,
) -> None:
    first = hung(T0, 2)
    with sessions.begin() as session:
        save_hang_analysis(session, "j1", first, T0 + 1, now=5.0)
    with sessions() as session:
        record = get_hang_analysis(session, "j1")
    assert record.analysis == first
    assert (record.job, record.analysed_ts, record.updated_ts, record.updated_at) == (
        "j1",
        T0,
        T0 + 1,
        5.0,
    )
    assert record.hung and record.analysis.culprit_ranks == [2]

    over = HangAnalysis(hung=False, ranks_seen=4, ranks_expected=4, analysed_ts=T0 + 60)
    with sessions.begin() as session:
        save_hang_analysis(session, "j1", over.to_dict(), T0 + 61)  # the wire form is taken too
    with sessions() as session:
        record = get_hang_analysis(session, "j1")
        rows = session.scalar(select(func.count()).select_from(Base.metadata.tables["job_hangs"]))
    assert rows == 1
    assert record.analysis == over and not record.hung
    assert (record.analysed_ts, record.updated_ts) == (T0 + 60, T0 + 61)


def test_an_unknown_job_or_one_without_analysis_is_not_found(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(session, "quiet", [MachineInfo("n1")], T0)
    with sessions() as session:
        with pytest.raises(NotFoundError, match="no job 'ghost'"):
            get_hang_analysis(session, "ghost")
        with pytest.raises(NotFoundError, match="no hang analysis of job 'quiet'"):
            get_hang_analysis(session, "quiet")


def test_saving_registers_the_job_and_the_row_goes_with_it(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        save_hang_analysis(session, "new-job", hung(), T0 + 5)
    with sessions.begin() as session:
        jobs = Base.metadata.tables["jobs"]
        (first, last) = session.execute(select(jobs.c.first_seen_ts, jobs.c.last_seen_ts)).one()
        assert (first, last) == (T0 + 5, T0 + 5)
        session.execute(delete(jobs))
    with sessions() as session:
        hangs = Base.metadata.tables["job_hangs"]
        assert session.scalar(select(func.count()).select_from(hangs)) == 0


@pytest.mark.parametrize(
    ("job", "analysis", "ts", "message"),
    [
        ("", hung(), T0, "job name '' is empty"),
        ("j", {"hung": "yes"}, T0, "analysis.hung is 'yes': expected true or false"),
        ("j", hung(), float("nan"), "expected a finite time"),
        ("j", hung(float("inf")), T0, "analysed_ts inf: expected a finite time"),
    ],
)
def test_bad_input_is_refused_with_one_line_and_nothing_stored(
    sessions: SessionFactory, job: str, analysis: object, ts: float, message: str
) -> None:
    with sessions.begin() as session, pytest.raises(ValidationError, match=message):
        save_hang_analysis(session, job, analysis, ts)  # type: ignore[arg-type]
    with sessions() as session:
        hangs = Base.metadata.tables["job_hangs"]
        assert session.scalar(select(func.count()).select_from(hangs)) == 0


def _alert(job: str, machine: str, kind: AlertKind = AlertKind.HANG, ts: float = T0) -> Alert:
    return Alert(
        job=job,
        machine=machine,
        kind=kind,
        metric="hang",
        score=1.0,
        first_ts=ts,
        detected_ts=ts,
        evidence={"culprit_ranks": [2]},
    )


def test_open_hang_alerts_name_the_job_level_one_and_each_machine(
    sessions: SessionFactory,
) -> None:
    with sessions.begin() as session:
        job_level, _ = record_alert(session, _alert("j1", ""))
        n01, _ = record_alert(session, _alert("j1", "n01"))
        n03, _ = record_alert(session, _alert("j1", "n03"))
        record_alert(session, _alert("j1", "n02", AlertKind.RULE))  # not a hang alert
        record_alert(session, _alert("other", "n01"))  # another job's
        set_alert_status(session, n03.id, AlertStatus.RESOLVED)
    with sessions() as session:
        found = open_hang_alerts(session, "j1")
        assert found.job_alert == job_level.id
        assert dict(found.machine_alerts) == {"n01": n01.id}
        assert open_hang_alerts(session, "ghost").job_alert is None
        assert dict(open_hang_alerts(session, "ghost").machine_alerts) == {}
