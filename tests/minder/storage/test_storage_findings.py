"""Job-level findings: stored per job, replaced as a set (SQLite and PostgreSQL)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minder.core.errors import NotFoundError, ValidationError
from minder.storage import (
    JobFinding,
    MachineInfo,
    SessionFactory,
    count_job_findings,
    get_job,
    list_job_findings,
    list_jobs,
    save_job_findings,
    upsert_job_machines,
)

NOT_PEERS = {
    "finding": "not_peer_comparable",
    "metric": "gpu_util_ratio",
    "coherence": 0.62,
    "outliers": 55,
    "allowance": 8,
    "machines": 144,
    "since_ts": 1_700_000_000.0,
    "detail": "55 distinct machines were outliers on gpu_util_ratio",
}
TOO_FEW = {
    "finding": "too_few_machines",
    "metric": None,
    "machines": 3,
    "since_ts": 1_700_000_100.0,
    "detail": "fewer than 4 machines",
}


def test_findings_round_trip_with_their_write_time_and_counts(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(session, "j1", [MachineInfo("n1")], 1_700_000_000.0)
        assert save_job_findings(session, "j1", [TOO_FEW, NOT_PEERS], 1_700_000_200.0) == 2
    with sessions() as session:
        stored = list_job_findings(session, "j1")
        job = get_job(session, "j1")
        listed = {j.id: j.finding_count for j in list_jobs(session)}
    assert [f.key for f in stored] == [
        ("not_peer_comparable", "gpu_util_ratio"),
        ("too_few_machines", ""),
    ]
    peers, few = stored
    assert (peers.coherence, peers.outliers, peers.allowance, peers.machines) == (0.62, 55, 8, 144)
    assert (peers.since_ts, peers.updated_ts, peers.detail) == (
        1_700_000_000.0,
        1_700_000_200.0,
        NOT_PEERS["detail"],
    )
    assert few.metric is None and few.coherence is None and few.outliers is None
    assert few.allowance is None and few.machines == 3
    assert job.finding_count == 2 and listed == {"j1": 2}
    assert job.last_seen_ts == 1_700_000_200.0  # a write of the service: the job was seen then


def test_a_new_set_replaces_the_old_one_and_an_empty_set_clears_it(
    sessions: SessionFactory,
) -> None:
    with sessions.begin() as session:
        save_job_findings(session, "j1", [TOO_FEW, NOT_PEERS], 10.0)
        save_job_findings(session, "j2", [TOO_FEW], 10.0)
    with sessions.begin() as session:
        save_job_findings(session, "j1", [{**NOT_PEERS, "coherence": 0.7, "outliers": 43}], 20.0)
    with sessions() as session:
        (only,) = list_job_findings(session, "j1")
        assert (only.finding, only.coherence, only.outliers, only.updated_ts) == (
            "not_peer_comparable",
            0.7,
            43,
            20.0,
        )
        assert count_job_findings(session) == {"j1": 1, "j2": 1}
    with sessions.begin() as session:
        assert save_job_findings(session, "j1", [], 30.0) == 0
    with sessions() as session:
        assert list_job_findings(session, "j1") == []
        assert count_job_findings(session) == {"j2": 1}
        assert {j.id: j.finding_count for j in list_jobs(session)} == {"j1": 0, "j2": 1}
        assert [f.finding for f in list_job_findings(session, "j2")] == ["too_few_machines"]


def test_a_finding_given_twice_counts_once_the_last_wins(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        stored = save_job_findings(
            session, "j1", [NOT_PEERS, {**NOT_PEERS, "coherence": 0.5, "metric": "gpu_util_ratio"}],
            10.0,
        )  # fmt: skip
    assert stored == 1
    with sessions() as session:
        assert [f.coherence for f in list_job_findings(session, "j1")] == [0.5]


def test_numpy_numbers_of_a_detector_are_taken(sessions: SessionFactory) -> None:
    finding = {**NOT_PEERS, "coherence": np.float64(0.25), "outliers": np.int64(9)}
    with sessions.begin() as session:
        save_job_findings(session, "j1", [finding], 10.0)
    with sessions() as session:
        (stored,) = list_job_findings(session, "j1")
    assert (stored.coherence, stored.outliers) == (0.25, 9)
    assert type(stored.outliers) is int


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"finding": ""}, "''"),
        ({"finding": "x" * 65}, "at most 64"),
        ({"metric": 7}, "metric 7"),
        ({"coherence": 1.5}, "coherence 1.5"),
        ({"coherence": float("nan")}, "coherence nan"),
        ({"outliers": -1}, "outliers -1"),
        ({"outliers": 2.5}, "outliers 2.5"),
        ({"machines": None}, "machines None"),
        ({"since_ts": "later"}, "since_ts 'later'"),
        ({"coherence": "0.5"}, "coherence '0.5'"),
        ({"since_ts": float("inf")}, "since_ts inf"),
        ({"detail": 3}, "detail 3"),
        ({"severity": "high"}, "unknown fields ['severity']"),
    ],
)
def test_a_malformed_finding_is_refused_naming_it_and_nothing_changes(
    sessions: SessionFactory, change: dict[str, Any], named: str
) -> None:
    with sessions.begin() as session:
        save_job_findings(session, "j1", [TOO_FEW], 10.0)
    with pytest.raises(ValidationError, match=re.escape(named)), sessions.begin() as session:
        save_job_findings(session, "j1", [{**NOT_PEERS, **change}], 20.0)
    with sessions() as session:
        assert [f.finding for f in list_job_findings(session, "j1")] == ["too_few_machines"]


def test_a_long_detail_is_cut() -> None:
    finding = JobFinding.coerce({**NOT_PEERS, "detail": "d" * 5_000})
    assert len(finding.detail) == 2_000 and finding.detail.endswith("…")


def test_bad_job_names_and_unknown_jobs(sessions: SessionFactory) -> None:
    with pytest.raises(ValidationError, match="empty"), sessions.begin() as session:
        save_job_findings(session, "", [TOO_FEW], 10.0)
    with pytest.raises(ValidationError, match="ts nan"), sessions.begin() as session:
        save_job_findings(session, "j1", [TOO_FEW], float("nan"))
    with pytest.raises(NotFoundError, match="'nope'"), sessions() as session:
        list_job_findings(session, "nope")


_findings = st.lists(
    st.builds(
        JobFinding,
        finding=st.sampled_from(["not_peer_comparable", "too_few_machines", "other"]),
        metric=st.one_of(st.none(), st.sampled_from(["gpu_util_ratio", "cpu_util_ratio", "é"])),
        machines=st.integers(0, 2**31 - 1),
        since_ts=st.floats(-1e12, 1e12, allow_nan=False),
        detail=st.text(max_size=50).filter(lambda t: "\x00" not in t),
        coherence=st.one_of(st.none(), st.floats(0, 1)),
        outliers=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
        allowance=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
    ),
    max_size=6,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=_findings, second=_findings)
def test_what_is_read_back_is_the_last_set_written(
    sessions: SessionFactory, first: list[JobFinding], second: list[JobFinding]
) -> None:
    with sessions.begin() as session:
        save_job_findings(session, "j", first, 1.0)
    with sessions.begin() as session:
        save_job_findings(session, "j", second, 2.0)
    expected = sorted({f.key: f for f in second}.values(), key=lambda f: f.key)
    with sessions() as session:
        stored = list_job_findings(session, "j")
        assert get_job(session, "j").finding_count == len(expected)
    assert [(f.key, f.updated_ts) for f in stored] == [(f.key, 2.0) for f in expected]
    for got, want in zip(stored, expected, strict=True):
        assert (got.machines, got.since_ts, got.detail) == (
            want.machines,
            want.since_ts,
            want.detail,
        )
        assert (got.coherence, got.outliers, got.allowance) == (
            want.coherence,
            want.outliers,
            want.allowance,
        )
