"""What-if report repository: life cycle, stored bodies, listing, refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minder.core.errors import NotFoundError, ValidationError
from minder.storage import (
    SessionFactory,
    WhatIfRecord,
    WhatIfStatus,
    WhatIfSummary,
    create_report,
    fail_report,
    finish_report,
    get_report,
    list_reports,
    mark_running,
)
from minder.storage.whatif import ERROR_MAX_LEN

REPORT = {
    "slowdown": 1.25,
    "waste": 0.2,
    "model_error": 0.01,
    "by_optype": {"forward-compute": 1.1, "backward-compute": 1.2},
    "by_stage": {"0": 1.0, "3": 1.2},
    "verdict": {"cause": "stage", "target": {"stage": 3}},
    "per_step": [{"step": 1, "slowdown": 1.25}],
}


def test_life_cycle_pending_running_done(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        created = create_report(session, "upload: trace-ST.parquet", now=100.0)
    assert isinstance(created, WhatIfSummary)
    assert created.status is WhatIfStatus.PENDING
    assert (created.job, created.created_at, created.started_at) == (None, 100.0, None)
    assert len(created.id) == 32

    with sessions.begin() as session:
        running = mark_running(session, created.id, now=101.0)
    assert (running.status, running.started_at) == (WhatIfStatus.RUNNING, 101.0)

    with sessions.begin() as session:
        done = finish_report(session, created.id, REPORT, 1.25, "stage", "ST", now=103.5)
    assert (done.status, done.slowdown, done.verdict, done.job) == (
        WhatIfStatus.DONE,
        1.25,
        "stage",
        "ST",
    )
    assert done.finished_at == 103.5

    with sessions() as session:
        record = get_report(session, created.id)
    assert isinstance(record, WhatIfRecord)
    assert record.report == REPORT
    # the report keeps its key order on every backend (docs/architecture.md §3.5 keys first)
    assert record.report is not None
    assert list(record.report) == list(REPORT)
    assert (record.status, record.source, record.error) == (
        WhatIfStatus.DONE,
        "upload: trace-ST.parquet",
        None,
    )


def test_failure_stores_the_error_from_pending_or_running(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        never_ran = create_report(session, "path: /data/a.parquet", job="j1").id
        ran = create_report(session, "path: /data/b.parquet", job="j1").id
        mark_running(session, ran)
    with sessions.begin() as session:
        fail_report(session, never_ran, "the service stopped before the analysis ran")
        failed = fail_report(session, ran, "trace.parquet: missing column 'optype'")
    assert failed.status is WhatIfStatus.FAILED
    assert failed.finished_at is not None
    with sessions() as session:
        record = get_report(session, ran)
        assert record.error == "trace.parquet: missing column 'optype'"
        assert record.report is None and record.slowdown is None
        assert get_report(session, never_ran).status is WhatIfStatus.FAILED


def test_long_errors_are_cut_saying_how_much(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        report_id = create_report(session, "x").id
        failed = fail_report(session, report_id, "e" * (ERROR_MAX_LEN + 123))
    assert failed.error is not None
    assert failed.error.endswith("(123 more characters)")
    assert failed.error.startswith("e" * ERROR_MAX_LEN)


def test_transitions_out_of_order_are_refused(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        report_id = create_report(session, "x").id
    pending_only = r"is 'pending'.*'done' only from \['running'\]"
    with sessions() as session, pytest.raises(ValidationError, match=pending_only):
        finish_report(session, report_id, REPORT, 1.2, "stage", "j")
    with sessions.begin() as session:
        mark_running(session, report_id)
    with sessions() as session, pytest.raises(ValidationError, match="'running'"):
        mark_running(session, report_id)
    with sessions.begin() as session:
        finish_report(session, report_id, REPORT, 1.2, "stage", "j")
    with sessions() as session, pytest.raises(ValidationError, match="is 'done'"):
        fail_report(session, report_id, "late failure")


def test_unknown_id_is_not_found_naming_it(sessions: SessionFactory) -> None:
    with sessions() as session:
        for call in (
            lambda: get_report(session, "nope"),
            lambda: mark_running(session, "nope"),
            lambda: fail_report(session, "nope", "x"),
            lambda: finish_report(session, "nope", REPORT, 1.0, "none", "j"),
        ):
            with pytest.raises(NotFoundError, match="no what-if report with id 'nope'"):
                call()


def test_report_bodies_are_made_json_safe(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        report_id = create_report(session, "x").id
        mark_running(session, report_id)
        finish_report(
            session,
            report_id,
            {"slowdown": np.float64(1.5), "forward_cv": math.nan, "steps": np.arange(3)},
            1.5,
            "none",
            "j",
        )
    with sessions() as session:
        assert get_report(session, report_id).report == {
            "slowdown": 1.5,
            "forward_cv": None,
            "steps": [0, 1, 2],
        }


def test_bad_values_are_refused_naming_them(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        report_id = create_report(session, "x").id
        mark_running(session, report_id)
    with sessions() as session:
        with pytest.raises(ValidationError, match="slowdown nan"):
            finish_report(session, report_id, REPORT, math.nan, "stage", "j")
        with pytest.raises(ValidationError, match="job name"):
            finish_report(session, report_id, REPORT, 1.2, "stage", "")
        with pytest.raises(ValidationError, match=r"report\.bad has type object"):
            finish_report(session, report_id, {"bad": object()}, 1.2, "stage", "j")
        with pytest.raises(ValidationError, match="non-empty source"):
            create_report(session, "")
        with pytest.raises(ValidationError, match="job name"):
            create_report(session, "x", job="j" * 300)


def test_listing_pages_newest_first_without_bodies(sessions: SessionFactory) -> None:
    ids = []
    with sessions.begin() as session:
        for i in range(5):
            summary = create_report(session, f"trace {i}", job="a" if i % 2 else "b", now=10.0 + i)
            ids.append(summary.id)
        mark_running(session, ids[4])
        finish_report(session, ids[4], REPORT, 1.25, "stage", "b")
    newest_first = ids[::-1]
    with sessions() as session:
        items, total = list_reports(session)
        assert total == 5
        assert [item.id for item in items] == newest_first
        assert all(type(item) is WhatIfSummary for item in items)  # no report body
        assert items[0].slowdown == 1.25 and items[0].verdict == "stage"

        first, total = list_reports(session, limit=2)
        second, _ = list_reports(session, limit=2, offset=2)
        third, _ = list_reports(session, limit=2, offset=4)
        assert total == 5
        assert [i.id for i in first + second + third] == newest_first
        assert list_reports(session, offset=10) == ([], 5)

        by_job, total = list_reports(session, job="a")
        assert total == 2 and [i.id for i in by_job] == [ids[3], ids[1]]
        done, total = list_reports(session, status="done")
        assert total == 1 and done[0].id == ids[4]
        assert list_reports(session, job="nobody") == ([], 0)


def test_listing_refuses_bad_paging_and_status(sessions: SessionFactory) -> None:
    with sessions() as session:
        with pytest.raises(ValidationError, match="limit 0 is out of range"):
            list_reports(session, limit=0)
        with pytest.raises(ValidationError, match="offset -1 is negative"):
            list_reports(session, offset=-1)
        with pytest.raises(ValidationError, match="unknown what-if status 'finished'"):
            list_reports(session, status="finished")
