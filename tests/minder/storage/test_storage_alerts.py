"""Alert repository: dedup, queries, status life cycle, JSON evidence (SQLite and PostgreSQL)."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import NotFoundError, ValidationError
from minder.storage import (
    SessionFactory,
    StatusTransitionError,
    allowed_transitions,
    get_alert,
    get_alert_record,
    list_alert_records,
    list_alerts,
    open_alerts,
    record_alert,
    set_alert_status,
)


def make_alert(
    machine: str = "m1",
    *,
    job: str = "j1",
    kind: AlertKind = AlertKind.SIMILARITY,
    metric: str = "gpu_util_ratio",
    score: float = 7.0,
    first_ts: float = 1000.0,
    detected_ts: float | None = None,
    devices: tuple[str, ...] = ("gpu3",),
    evidence: dict[str, Any] | None = None,
    domain: str = "",
) -> Alert:
    return Alert(
        job=job,
        machine=machine,
        kind=kind,
        metric=metric,
        score=score,
        first_ts=first_ts,
        detected_ts=first_ts + 20 if detected_ts is None else detected_ts,
        devices=devices,
        evidence=evidence if evidence is not None else {"rule": "peer", "window": [1.0, 2.0]},
        domain=domain,
    )


def record(
    sessions: SessionFactory, alert: Alert, seen_ts: float | None = None
) -> tuple[Alert, bool]:
    with sessions.begin() as session:
        return record_alert(session, alert, seen_ts)


def test_new_alert_is_inserted_and_round_trips(sessions: SessionFactory) -> None:
    alert = make_alert(domain="leaf-3")
    stored, inserted = record(sessions, alert, seen_ts=1025.0)
    assert inserted
    assert stored == alert
    with sessions() as session:
        assert get_alert(session, alert.id) == alert
        rec = get_alert_record(session, alert.id)
    assert rec.occurrences == 1
    assert rec.last_seen_ts == 1025.0
    assert rec.created_at == rec.updated_at > 0


def test_evidence_json_round_trip_with_numpy_and_nan(sessions: SessionFactory) -> None:
    evidence = {
        "rule": "peer_zscore",
        "machine_window": np.array([0.97, np.nan, 0.2]),
        "peer_median": [0.98, 0.97, math.inf],
        "threshold": np.float32(6.0),
        "peers": np.int64(127),
        "nested": {"devices": ("gpu1", "gpu3"), "ok": np.bool_(True), "none": None},
    }
    alert = make_alert(evidence=evidence)
    stored, _ = record(sessions, alert)
    expected = {
        "rule": "peer_zscore",
        "machine_window": [0.97, None, 0.2],
        "peer_median": [0.98, 0.97, None],
        "threshold": 6.0,
        "peers": 127,
        "nested": {"devices": ["gpu1", "gpu3"], "ok": True, "none": None},
    }
    assert stored.evidence == expected
    with sessions() as session:
        assert get_alert(session, alert.id).evidence == expected


def test_unstorable_alerts_are_refused_and_nothing_is_stored(sessions: SessionFactory) -> None:
    with pytest.raises(ValidationError, match="score nan"):
        record(sessions, make_alert(score=math.nan))
    with pytest.raises(ValidationError, match=r"evidence\.when.*datetime"):
        import datetime

        record(sessions, make_alert(evidence={"when": datetime.datetime.now()}))
    with pytest.raises(ValidationError, match="key"):
        record(sessions, make_alert(evidence={1: "x"}))  # type: ignore[dict-item]
    with sessions() as session:
        assert list_alerts(session) == ([], 0)


def test_same_id_is_one_alert(sessions: SessionFactory) -> None:
    first = make_alert(score=7.0, devices=("gpu3",), evidence={"v": 1})
    record(sessions, first, seen_ts=1020.0)
    again = make_alert(score=9.0, devices=("gpu3", "gpu5"), evidence={"v": 2}, detected_ts=1030.0)
    assert again.id == first.id
    stored, inserted = record(sessions, again, seen_ts=1030.0)
    assert not inserted
    assert stored.id == first.id
    assert stored.score == 9.0
    assert stored.evidence == {"v": 2}  # evidence follows the higher score
    assert stored.devices == ("gpu3", "gpu5")
    assert stored.detected_ts == first.detected_ts
    lower = make_alert(score=3.0, evidence={"v": 3})
    stored, _ = record(sessions, lower, seen_ts=1025.0)
    assert stored.score == 9.0 and stored.evidence == {"v": 2}
    with sessions() as session:
        rec = get_alert_record(session, first.id)
        assert list_alerts(session)[1] == 1
    assert rec.occurrences == 3
    assert rec.last_seen_ts == 1030.0  # a late report does not move it back


@pytest.mark.parametrize("status", [AlertStatus.OPEN, AlertStatus.ACKNOWLEDGED])
def test_open_key_absorbs_a_new_onset(sessions: SessionFactory, status: AlertStatus) -> None:
    original = make_alert(first_ts=1000.0, score=6.5)
    record(sessions, original)
    with sessions.begin() as session:
        set_alert_status(session, original.id, status)
    later = make_alert(first_ts=1100.0, score=8.0, domain="leaf-1")
    assert later.id != original.id and later.key == original.key
    stored, inserted = record(sessions, later, seen_ts=1130.0)
    assert not inserted
    assert stored.id == original.id
    assert stored.first_ts == 1000.0
    assert stored.status is status
    assert stored.score == 8.0
    assert stored.domain == "leaf-1"
    with sessions() as session:
        assert list_alerts(session)[1] == 1
        assert get_alert_record(session, original.id).last_seen_ts == 1130.0


@pytest.mark.parametrize("final", [AlertStatus.RESOLVED, AlertStatus.FALSE_POSITIVE])
def test_closed_alert_does_not_absorb_a_new_fault(
    sessions: SessionFactory, final: AlertStatus
) -> None:
    original = make_alert(first_ts=1000.0)
    record(sessions, original)
    with sessions.begin() as session:
        set_alert_status(session, original.id, final)
    new_fault = make_alert(first_ts=2000.0)
    stored, inserted = record(sessions, new_fault)
    assert inserted
    assert stored.id == new_fault.id != original.id
    assert stored.status is AlertStatus.OPEN
    # a replay of the closed fault (same id) stays in the closed alert
    replay, inserted = record(sessions, original, seen_ts=1500.0)
    assert not inserted and replay.id == original.id and replay.status is final
    with sessions() as session:
        assert list_alerts(session)[1] == 2
        assert [a.id for a in open_alerts(session)] == [new_fault.id]
        assert get_alert_record(session, original.id).occurrences == 2


def test_other_kind_metric_or_machine_is_another_fault(sessions: SessionFactory) -> None:
    record(sessions, make_alert())
    assert record(sessions, make_alert(kind=AlertKind.STRAGGLER))[1]
    assert record(sessions, make_alert(metric="gpu_power_watts"))[1]
    assert record(sessions, make_alert("m2"))[1]
    assert record(sessions, make_alert(job="j2"))[1]
    with sessions() as session:
        assert list_alerts(session)[1] == 5


def test_concurrent_insert_of_the_same_alert_stays_one(sessions: SessionFactory) -> None:
    """Two writers report the same new fault at once: one inserts, the other updates."""
    alert = make_alert()
    first = sessions()
    record_alert(first, alert)
    first.flush()  # inserted, not committed: the second writer cannot see it yet
    result: list[tuple[Alert, bool]] = []
    failures: list[BaseException] = []

    def second_writer() -> None:
        try:
            with sessions.begin() as session:
                result.append(record_alert(session, alert, seen_ts=2000.0))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=second_writer)
    thread.start()
    time.sleep(0.3)  # let it block on the first writer's lock
    first.commit()
    first.close()
    thread.join(timeout=30)
    assert not failures, failures
    assert result and result[0][1] is False
    with sessions() as session:
        assert list_alerts(session)[1] == 1
        assert get_alert_record(session, alert.id).occurrences == 2


def test_get_missing_alert_names_the_id(sessions: SessionFactory) -> None:
    with sessions() as session, pytest.raises(NotFoundError, match="'nope'"):
        get_alert(session, "nope")
    with sessions() as session, pytest.raises(NotFoundError, match="'nope'"):
        set_alert_status(session, "nope", "resolved")


@pytest.fixture
def populated(sessions: SessionFactory) -> dict[str, Alert]:
    alerts = {
        "a": make_alert("m1", first_ts=100.0, detected_ts=110.0),
        "b": make_alert(
            "m2", first_ts=200.0, detected_ts=210.0, kind=AlertKind.RULE, metric="gpu_xid_count"
        ),
        "c": make_alert("m1", first_ts=300.0, detected_ts=310.0, metric="gpu_power_watts"),
        "d": make_alert(
            "m3",
            job="j2",
            first_ts=400.0,
            detected_ts=410.0,
            kind=AlertKind.SILENCE,
            metric="silence",
        ),
        "e": make_alert(
            "m4",
            first_ts=500.0,
            detected_ts=510.0,
            kind=AlertKind.STRAGGLER,
            metric="train_step_seconds",
        ),
    }
    for alert in alerts.values():
        record(sessions, alert)
    with sessions.begin() as session:
        set_alert_status(session, alerts["b"].id, AlertStatus.RESOLVED)
        set_alert_status(session, alerts["e"].id, AlertStatus.ACKNOWLEDGED)
    return alerts


def ids(session: Session, **filters: Any) -> tuple[list[str], int]:
    alerts, total = list_alerts(session, **filters)
    return [a.id for a in alerts], total


def test_list_filters(sessions: SessionFactory, populated: dict[str, Alert]) -> None:
    p = {k: a.id for k, a in populated.items()}
    with sessions() as session:
        assert ids(session) == ([p["e"], p["d"], p["c"], p["b"], p["a"]], 5)
        assert ids(session, job="j1") == ([p["e"], p["c"], p["b"], p["a"]], 4)
        assert ids(session, machine="m1") == ([p["c"], p["a"]], 2)
        assert ids(session, kind="rule") == ([p["b"]], 1)
        assert ids(session, kind=[AlertKind.RULE, AlertKind.SILENCE]) == ([p["d"], p["b"]], 2)
        assert ids(session, status=AlertStatus.RESOLVED) == ([p["b"]], 1)
        assert ids(session, status=["open", "acknowledged"]) == (
            [p["e"], p["d"], p["c"], p["a"]],
            4,
        )
        assert ids(session, since=210.0) == ([p["e"], p["d"], p["c"], p["b"]], 4)
        assert ids(session, since=210.0, until=410.0) == ([p["c"], p["b"]], 2)
        assert ids(
            session, job="j1", machine="m1", kind="similarity", status="open", since=0.0, until=1e12
        ) == ([p["c"], p["a"]], 2)
        assert ids(session, job="nope") == ([], 0)
        assert [a.id for a in open_alerts(session)] == [p["e"], p["d"], p["c"], p["a"]]
        assert [a.id for a in open_alerts(session, job="j2")] == [p["d"]]


def test_list_pagination_and_total(sessions: SessionFactory) -> None:
    for i in range(7):
        record(sessions, make_alert(f"m{i}", first_ts=100.0 + i))
    # two with the same detected_ts: the order must still be total and stable
    record(sessions, make_alert("tie-a", first_ts=50.0, detected_ts=106.0 + 20))
    with sessions() as session:
        everything, total = ids(session, limit=500)
        assert total == 8 and len(everything) == 8
        pages = [ids(session, limit=3, offset=offset) for offset in (0, 3, 6, 9)]
    assert [len(page) for page, _ in pages] == [3, 3, 2, 0]
    assert all(t == 8 for _, t in pages)
    assert [i for page, _ in pages for i in page] == everything


def test_list_records_carry_bookkeeping(sessions: SessionFactory) -> None:
    alert = make_alert()
    record(sessions, alert, seen_ts=1020.0)
    record(sessions, alert, seen_ts=1040.0)
    with sessions() as session:
        records, total = list_alert_records(session)
    assert total == 1
    assert records[0].alert == alert
    assert (records[0].occurrences, records[0].last_seen_ts) == (2, 1040.0)


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"kind": "bogus"}, r"unknown alert kind 'bogus': allowed \['rule'"),
        ({"status": ["open", "closed"]}, r"unknown alert status 'closed': allowed \['open'"),
        ({"limit": 0}, r"limit 0 .* 1\.\.500"),
        ({"limit": 501}, r"limit 501"),
        ({"offset": -1}, r"offset -1"),
    ],
)
def test_list_refuses_bad_filters(
    sessions: SessionFactory, filters: dict[str, Any], message: str
) -> None:
    with sessions() as session, pytest.raises(ValidationError, match=message):
        list_alerts(session, **filters)


def test_status_transitions(sessions: SessionFactory) -> None:
    alert = make_alert()
    record(sessions, alert)
    with sessions.begin() as session:
        assert set_alert_status(session, alert.id, "open").status is AlertStatus.OPEN  # no-op
        assert (
            set_alert_status(session, alert.id, "acknowledged").status is AlertStatus.ACKNOWLEDGED
        )
    with sessions.begin() as session, pytest.raises(StatusTransitionError) as info:
        set_alert_status(session, alert.id, AlertStatus.OPEN)
    assert info.value.current is AlertStatus.ACKNOWLEDGED
    assert info.value.requested is AlertStatus.OPEN
    assert info.value.allowed == [AlertStatus.RESOLVED, AlertStatus.FALSE_POSITIVE]
    assert alert.id in str(info.value)
    with sessions.begin() as session:
        before = get_alert_record(session, alert.id).updated_at
        assert (
            set_alert_status(session, alert.id, AlertStatus.RESOLVED).status is AlertStatus.RESOLVED
        )
    with sessions() as session:
        rec = get_alert_record(session, alert.id)
        assert rec.alert.status is AlertStatus.RESOLVED and rec.updated_at >= before
        with pytest.raises(StatusTransitionError, match="none \\(final status\\)") as final:
            set_alert_status(session, alert.id, AlertStatus.ACKNOWLEDGED)
        assert final.value.allowed == []
        with pytest.raises(ValidationError, match="unknown alert status 'done'"):
            set_alert_status(session, alert.id, "done")


def test_allowed_transitions_follow_the_life_cycle() -> None:
    assert allowed_transitions(AlertStatus.OPEN) == [
        AlertStatus.ACKNOWLEDGED,
        AlertStatus.RESOLVED,
        AlertStatus.FALSE_POSITIVE,
    ]
    assert allowed_transitions(AlertStatus.FALSE_POSITIVE) == []
