"""Jobs, machines and current scores (SQLite and PostgreSQL)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import NotFoundError, ValidationError
from minder.storage import (
    JobReport,
    JobStatus,
    MachineInfo,
    ScoreRow,
    SessionFactory,
    current_scores,
    get_job,
    list_jobs,
    list_machines,
    record_alert,
    report_job_states,
    save_scores,
    set_alert_status,
    set_job_status,
    sweep_jobs,
    upsert_job_machines,
)
from minder.storage.jobs import set_top_scores, upsert_scores


def test_upsert_registers_job_and_machines(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        count = upsert_job_machines(
            session,
            "j1",
            [
                MachineInfo("n1", group="pp0", domain="leaf-1", last_seen_ts=99.0),
                {"name": "n2", "group": "pp1", "domain": "leaf-1"},
                {"name": "n3"},
                {"name": "n2", "group": "pp2", "domain": "leaf-2"},  # listed twice: last wins
            ],
            100.0,
        )
    assert count == 3
    with sessions() as session:
        job = get_job(session, "j1")
        machines = {m.name: m for m in list_machines(session, "j1")}
    assert (job.id, job.first_seen_ts, job.last_seen_ts, job.machine_count) == (
        "j1",
        100.0,
        100.0,
        3,
    )
    assert job.status is JobStatus.ACTIVE and job.open_alerts == 0
    assert list(machines) == ["n1", "n2", "n3"]
    assert (machines["n1"].group, machines["n1"].domain, machines["n1"].last_seen_ts) == (
        "pp0",
        "leaf-1",
        99.0,
    )
    assert (machines["n2"].group, machines["n2"].domain) == ("pp2", "leaf-2")
    assert (machines["n3"].group, machines["n3"].last_seen_ts) == ("", 100.0)
    assert machines["n3"].top_score is None


def test_upsert_updates_and_keeps_time_bounds(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(session, "j1", [MachineInfo("n1", group="pp0")], 100.0)
    with sessions.begin() as session:
        # a late batch (ts 90) widens first_seen, does not move last_seen or the machine back
        assert (
            upsert_job_machines(
                session,
                "j1",
                [MachineInfo("n1", group="pp1", last_seen_ts=90.0), MachineInfo("n2")],
                90.0,
            )
            == 2
        )
        assert get_job(session, "j1").machine_count == 2  # fresh value within the same session
    with sessions.begin() as session:
        upsert_job_machines(session, "j1", [], 150.0)  # machines not listed are kept
    with sessions() as session:
        job = get_job(session, "j1")
        n1 = list_machines(session, "j1")[0]
    assert (job.first_seen_ts, job.last_seen_ts, job.machine_count) == (90.0, 150.0, 2)
    assert (n1.group, n1.last_seen_ts) == ("pp1", 100.0)


@pytest.mark.parametrize(
    ("machines", "message"),
    [
        ([{"group": "pp0"}], "non-empty 'name'"),
        ([{"name": "n1", "rack": "r1"}], r"unknown fields \['rack'\]"),
        ([{"name": "n1", "last_seen_ts": "yesterday"}], "last_seen_ts 'yesterday'"),
        ([42], "MachineInfo or a mapping, got int"),
        ([MachineInfo("x" * 300)], "300 characters long"),
    ],
)
def test_upsert_refuses_bad_machines(
    sessions: SessionFactory, machines: list[Any], message: str
) -> None:
    with sessions.begin() as session, pytest.raises(ValidationError, match=message):
        upsert_job_machines(session, "j1", machines, 1.0)
    with sessions() as session:
        assert list_jobs(session) == []


def test_upsert_refuses_bad_job_name(sessions: SessionFactory) -> None:
    with sessions.begin() as session, pytest.raises(ValidationError, match="job name ''"):
        upsert_job_machines(session, "", [], 1.0)


def test_save_scores_replaces_the_current_scores(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(
            session, "j1", [MachineInfo("n1", "pp0"), MachineInfo("n2", "pp0")], 10.0
        )
        stored = save_scores(
            session,
            "j1",
            [
                ScoreRow("n1", "gpu_util_ratio", 2.0, "gpu0"),
                ScoreRow("n1", "gpu_util_ratio", 7.5, "gpu3"),  # same metric: highest kept
                {"machine": "n1", "metric": "gpu_power_watts", "score": 4.0, "device": "gpu3"},
                ("n2", "cpu_util_ratio", 1.5),
                ("n9", "gpu_util_ratio", 0.5, "gpu1"),  # unknown machine: registered
            ],
            12.0,
        )
    assert stored == 4
    with sessions() as session:
        scores = [
            (s.machine, s.metric, s.score, s.device, s.ts) for s in current_scores(session, "j1")
        ]
        machines = {m.name: m for m in list_machines(session, "j1")}
        job = get_job(session, "j1")
    assert scores == [
        ("n1", "gpu_power_watts", 4.0, "gpu3", 12.0),
        ("n1", "gpu_util_ratio", 7.5, "gpu3", 12.0),
        ("n2", "cpu_util_ratio", 1.5, "", 12.0),
        ("n9", "gpu_util_ratio", 0.5, "gpu1", 12.0),
    ]
    assert (machines["n1"].top_score, machines["n1"].top_metric, machines["n1"].top_device) == (
        7.5,
        "gpu_util_ratio",
        "gpu3",
    )
    assert machines["n1"].group == "pp0"  # scores do not touch the registration
    assert (machines["n9"].group, machines["n9"].top_score, machines["n9"].score_ts) == (
        "",
        0.5,
        12.0,
    )
    assert (job.machine_count, job.last_seen_ts) == (3, 12.0)

    with sessions.begin() as session:
        assert (
            save_scores(session, "j1", [ScoreRow("n2", "gpu_util_ratio", 3.0, "gpu2")], 13.0) == 1
        )
    with sessions() as session:
        scores = [(s.machine, s.metric, s.score) for s in current_scores(session, "j1")]
        machines = {m.name: m for m in list_machines(session, "j1")}
    assert scores == [("n2", "gpu_util_ratio", 3.0)]
    assert machines["n1"].top_score is None and machines["n1"].top_metric is None
    assert (machines["n2"].top_score, machines["n2"].score_ts) == (3.0, 13.0)

    with sessions.begin() as session:
        save_scores(session, "j1", [], 14.0)
    with sessions() as session:
        assert current_scores(session, "j1") == []
        assert all(m.top_score is None for m in list_machines(session, "j1"))


def test_upsert_scores_and_tops_change_only_what_they_name(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        save_scores(
            session,
            "j1",
            [
                ScoreRow("n1", "gpu_util_ratio", 2.0, "gpu0"),
                ScoreRow("n1", "gpu_power_watts", 1.0, "gpu0"),
                ScoreRow("n2", "gpu_util_ratio", 3.0, "gpu1"),
            ],
            10.0,
        )
        written = upsert_scores(
            session,
            "j1",
            [ScoreRow("n1", "gpu_util_ratio", 9.0, "gpu5"), ScoreRow("n3", "cpu_util_ratio", 1.0)],
            15.0,
            removed=[("n1", "gpu_power_watts")],
        )
        set_top_scores(
            session, "j1", {"n1": ScoreRow("n1", "gpu_util_ratio", 9.0, "gpu5"), "n2": None}, 15.0
        )
    assert written == 2
    with sessions() as session:
        scores = [(s.machine, s.metric, s.score, s.ts) for s in current_scores(session, "j1")]
        machines = {m.name: m for m in list_machines(session, "j1")}
    assert scores == [
        ("n1", "gpu_util_ratio", 9.0, 15.0),
        ("n2", "gpu_util_ratio", 3.0, 10.0),  # untouched
        ("n3", "cpu_util_ratio", 1.0, 15.0),
    ]
    assert (machines["n1"].top_score, machines["n1"].top_device, machines["n1"].score_ts) == (
        9.0,
        "gpu5",
        15.0,
    )
    assert machines["n2"].top_score is None and machines["n2"].score_ts is None
    with sessions.begin() as session, pytest.raises(ValidationError, match="non-empty machine"):
        upsert_scores(session, "j1", [ScoreRow("", "gpu_util_ratio", 1.0)], 16.0)


def test_save_scores_of_one_job_leaves_others(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        save_scores(session, "j1", [("n1", "gpu_util_ratio", 1.0)], 1.0)
        save_scores(session, "j2", [("n1", "gpu_util_ratio", 2.0)], 1.0)
        save_scores(session, "j1", [("n2", "gpu_util_ratio", 3.0)], 2.0)
    with sessions() as session:
        assert [s.score for s in current_scores(session, "j2")] == [2.0]
        assert [s.machine for s in current_scores(session, "j1")] == ["n2"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (("n1", "gpu_util_ratio", math.nan), "finite"),
        (("n1", "gpu_util_ratio", math.inf), "finite"),
        ({"machine": "n1", "score": 1.0}, "missing 'metric'"),
        (("n1", "gpu_util_ratio", "high"), "not a number"),
        (("n1",), "neither a ScoreRow"),
        (("", "gpu_util_ratio", 1.0), "non-empty machine"),
    ],
)
def test_bad_score_rows_change_nothing(sessions: SessionFactory, row: Any, message: str) -> None:
    with sessions.begin() as session:
        save_scores(session, "j1", [("n1", "gpu_util_ratio", 1.0)], 1.0)
    with sessions.begin() as session, pytest.raises(ValidationError, match=message):
        save_scores(session, "j1", [("n2", "cpu_util_ratio", 2.0), row], 2.0)
    with sessions() as session:
        assert [(s.machine, s.score) for s in current_scores(session, "j1")] == [("n1", 1.0)]


def test_list_jobs_newest_first_with_open_alert_counts(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(session, "old", [MachineInfo("n1")], 10.0)
        upsert_job_machines(session, "new", [MachineInfo("n1"), MachineInfo("n2")], 20.0)
        for machine in ("n1", "n2"):
            record_alert(
                session,
                Alert(
                    job="new",
                    machine=machine,
                    kind=AlertKind.RULE,
                    metric="gpu_xid_count",
                    score=1.0,
                    first_ts=20.0,
                    detected_ts=20.0,
                ),
            )
        closed, _ = record_alert(
            session,
            Alert(
                job="old",
                machine="n1",
                kind=AlertKind.RULE,
                metric="gpu_xid_count",
                score=1.0,
                first_ts=5.0,
                detected_ts=5.0,
            ),
        )
        set_alert_status(session, closed.id, AlertStatus.RESOLVED)
    with sessions() as session:
        jobs = list_jobs(session)
        assert [(j.id, j.machine_count, j.open_alerts) for j in jobs] == [
            ("new", 2, 2),
            ("old", 1, 0),
        ]
        assert get_job(session, "new").open_alerts == 2


def test_job_status_and_filter(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(session, "a", [], 1.0)
        upsert_job_machines(session, "b", [], 2.0)
        ended = set_job_status(session, "a", "ended", "done by hand")
        assert (ended.status, ended.status_reason) == (JobStatus.ENDED, "done by hand")
    with sessions() as session:
        assert [j.id for j in list_jobs(session, status=JobStatus.ENDED)] == ["a"]
        assert [j.id for j in list_jobs(session, status="active")] == ["b"]
        with pytest.raises(ValidationError, match="unknown job status 'gone'"):
            list_jobs(session, status="gone")
    with sessions.begin() as session:
        upsert_job_machines(session, "a", [], 3.0)  # a write of data says nothing of the status
    with sessions() as session:
        assert get_job(session, "a").status is JobStatus.ENDED


def test_reports_of_the_worker_set_the_status_and_the_machines_in_the_job(
    sessions: SessionFactory,
) -> None:
    with sessions.begin() as session:
        report_job_states(session, [JobReport("j", JobStatus.ACTIVE, 3, 100.0)], now=1_000.0)
    with sessions() as session:
        job = get_job(session, "j")  # registered by its first report
    assert (job.status, job.active_machines, job.status_since, job.last_seen_ts) == (
        JobStatus.ACTIVE, 3, 1_000.0, 100.0,
    )  # fmt: skip
    with sessions.begin() as session:
        # the periodic word changes nothing: not even updated_at
        report_job_states(session, [JobReport("j", JobStatus.ACTIVE, 3, 105.0)], now=1_010.0)
        assert get_job(session, "j").updated_at == 1_000.0
        report_job_states(session, [JobReport("j", JobStatus.ACTIVE, 2, 106.0)], now=1_020.0)
        job = get_job(session, "j")
        assert (job.active_machines, job.status_since, job.updated_at) == (2, 1_000.0, 1_020.0)
        # a worker with older data of the job (it lost the job's partition) is not heard
        report_job_states(session, [JobReport("j", JobStatus.IDLE, 0, 50.0, "stale")], 1_030.0)
        assert get_job(session, "j").status is JobStatus.ACTIVE
        report_job_states(session, [JobReport("j", JobStatus.IDLE, 0, 106.0, "no data")], 1_040.0)
        job = get_job(session, "j")
        assert (job.status, job.active_machines, job.status_since, job.status_reason) == (
            JobStatus.IDLE, 0, 1_040.0, "no data",
        )  # fmt: skip
        report_job_states(session, [JobReport("j", JobStatus.ENDED, 0, 106.0, "bye")], 1_050.0)
        # idle applies to an active job only: an ended job stays ended
        report_job_states(session, [JobReport("j", JobStatus.IDLE, 0, 106.0, "late")], 1_060.0)
        job = get_job(session, "j")
        assert (job.status, job.status_since, job.status_reason) == (
            JobStatus.ENDED,
            1_050.0,
            "bye",
        )
        # data again: active again, since then
        report_job_states(session, [JobReport("j", JobStatus.ACTIVE, 1, 200.0)], now=1_070.0)
        job = get_job(session, "j")
        assert (job.status, job.status_since, job.status_reason, job.active_machines) == (
            JobStatus.ACTIVE, 1_070.0, "", 1,
        )  # fmt: skip
        # a job that ended before it was first written is registered as ended
        report_job_states(session, [JobReport("brief", JobStatus.ENDED, 0, 7.0, "bye")], 1_075.0)
        brief = get_job(session, "brief")
        assert (brief.status, brief.status_reason, brief.last_seen_ts) == (
            JobStatus.ENDED,
            "bye",
            7.0,
        )
        with pytest.raises(ValidationError, match="active_machines -1: expected a count >= 0"):
            report_job_states(session, [JobReport("j", JobStatus.ACTIVE, -1, 200.0)], 1_080.0)
        with pytest.raises(ValidationError, match="unknown job status 'gone'"):
            report_job_states(session, [JobReport("j", "gone", 0, 200.0)], 1_080.0)  # type: ignore[arg-type]


def test_the_sweep_idles_jobs_no_worker_reports_and_ends_those_idle_past_the_retention(
    sessions: SessionFactory,
) -> None:
    with sessions.begin() as session:
        report_job_states(
            session,
            [
                JobReport("old", JobStatus.ACTIVE, 4, 10.0),
                JobReport("held", JobStatus.ACTIVE, 2, 10.0),
            ],
            now=1_000.0,
        )
        report_job_states(session, [JobReport("held", JobStatus.ACTIVE, 2, 11.0)], now=1_050.0)
        assert sweep_jobs(session, 1_070.0, stale_after_s=60, retention_s=600) == (["old"], [])
        old = get_job(session, "old")
        assert (old.status, old.active_machines, old.status_since) == (JobStatus.IDLE, 0, 1_070.0)
        assert "no word for 60 s" in old.status_reason
        assert get_job(session, "held").status is JobStatus.ACTIVE
        assert sweep_jobs(session, 1_600.0, stale_after_s=60, retention_s=600) == (["held"], [])
        assert sweep_jobs(session, 1_671.0, stale_after_s=60, retention_s=600) == ([], ["old"])
        old = get_job(session, "old")
        assert (old.status, old.status_since) == (JobStatus.ENDED, 1_671.0)
        assert old.status_reason == "idle for the retention of 600 s"
        with pytest.raises(ValidationError, match="retention_s=-1: expected"):
            sweep_jobs(session, 1_700.0, stale_after_s=60, retention_s=-1)


def test_unknown_job_is_not_found_by_name(sessions: SessionFactory) -> None:
    with sessions() as session:
        for call in (get_job, list_machines, current_scores):
            with pytest.raises(NotFoundError, match="no job 'ghost'"):
                call(session, "ghost")
        with pytest.raises(NotFoundError, match="no job 'ghost'"):
            set_job_status(session, "ghost", "ended")


@pytest.mark.slow
def test_a_large_job_is_written_in_bulk(sessions: SessionFactory) -> None:
    """10,000 machines and 40,000 scores: set-based writes keep this to seconds."""
    machines = [
        MachineInfo(f"n{i:05d}", group=f"pp{i % 8}", domain=f"leaf-{i // 32}")
        for i in range(10_000)
    ]
    rows = [
        ScoreRow(m.name, metric, float(i % 97) / 10, "gpu0")
        for i, m in enumerate(machines)
        for metric in ("gpu_util_ratio", "gpu_power_watts", "cpu_util_ratio", "train_step_seconds")
    ]
    start = time.perf_counter()
    with sessions.begin() as session:
        assert upsert_job_machines(session, "big", machines, 1.0) == 10_000
    upsert_s = time.perf_counter() - start
    start = time.perf_counter()
    for ts in (2.0, 3.0):
        with sessions.begin() as session:
            assert save_scores(session, "big", rows, ts) == 40_000
    scores_s = (time.perf_counter() - start) / 2
    with sessions() as session:
        assert len(current_scores(session, "big")) == 40_000
        assert get_job(session, "big").machine_count == 10_000
    print(f"upsert 10k machines {upsert_s:.2f}s, save 40k scores {scores_s:.2f}s")
    assert upsert_s < 20 and scores_s < 30


def test_score_rows_of_any_accepted_form_and_order_are_stored_alike(
    sessions: SessionFactory,
) -> None:
    """The service's own rows (plain tuples) go to the database as they are; numbers of other
    types (numpy, int), rows in any order and a (machine, metric) given twice are stored as
    ScoreRows would be."""
    rows: list[Any] = [
        ("n2", "gpu_util_ratio", np.float32(2.5), "gpu1"),
        ("n1", "gpu_util_ratio", 3, "gpu0"),
        ("n1", "gpu_util_ratio", 1.0, "gpu7"),  # same cell, lower: ignored
        ScoreRow("n3", "cpu_util_ratio", np.float32(0.25)),  # type: ignore[arg-type]
        ("n1", "cpu_util_ratio", np.float64(-1.5), ""),
    ]
    with sessions.begin() as session:
        save_scores(session, "j1", rows, np.float64(20))
        upsert_scores(session, "j1", [("n0", "gpu_util_ratio", 4, "gpu2")], 21)
        upsert_job_machines(session, "j1", [MachineInfo("n0", "pp0", last_seen_ts=19)], 21)
        top = ScoreRow("n4", "gpu_util_ratio", np.float32(0.5))  # type: ignore[arg-type]
        set_top_scores(session, "j1", {"n4": top}, 21)
    with sessions() as session:
        scores = [
            (s.machine, s.metric, s.score, s.device, s.ts) for s in current_scores(session, "j1")
        ]
        machines = {m.name: m for m in list_machines(session, "j1")}
    assert scores == [
        ("n0", "gpu_util_ratio", 4.0, "gpu2", 21.0),
        ("n1", "cpu_util_ratio", -1.5, "", 20.0),
        ("n1", "gpu_util_ratio", 3.0, "gpu0", 20.0),
        ("n2", "gpu_util_ratio", 2.5, "gpu1", 20.0),
        ("n3", "cpu_util_ratio", 0.25, "", 20.0),
    ]
    assert all(type(s[2]) is float and type(s[4]) is float for s in scores)
    assert (machines["n1"].top_score, machines["n1"].top_metric) == (3.0, "gpu_util_ratio")
    assert machines["n0"].last_seen_ts == 19.0 and type(machines["n0"].last_seen_ts) is float
    assert (machines["n4"].top_score, machines["n4"].score_ts) == (0.5, 21.0)
