"""The self-check repository on SQLite and PostgreSQL: checks decided, listed, reported (by the
check's token only, once), requested by an operator, cancelled; and the alert's side of a
verdict (service-only statuses, the evidence kept)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy.exc import IntegrityError

import minder.storage.alerts as alerts_storage
import minder.storage.selfchecks as selfchecks_storage
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import NotFoundError, ValidationError
from minder.core.selfcheck import (
    CheckResult,
    CheckStatus,
    SelfCheckConflictError,
    SelfCheckReport,
    SelfCheckState,
    SelfCheckTokenError,
)
from minder.storage import SessionFactory
from minder.storage.actions import audit
from minder.storage.alerts import (
    StatusTransitionError,
    closed_alerts_since,
    get_alert,
    open_alerts,
    record_alert,
)
from minder.storage.outbox import (
    AlertEvent,
    Destination,
    change_alert_status,
    list_deliveries,
    record_selfcheck_verdict,
)
from minder.storage.selfchecks import (
    accept_report,
    cancel_selfcheck,
    create_selfcheck,
    decide_selfcheck,
    drain_of,
    drained_alerts_without_check,
    failed_checks,
    finish,
    get_selfcheck,
    latest_selfcheck_for_alert,
    list_selfchecks,
    mark_launching,
    request_selfcheck,
    token_digest,
)

TOKEN = "s3cret-token-of-the-check"
ALL = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))


def _alert(machine: str = "n1", *, first_ts: float = 100.0, kind: AlertKind = AlertKind.RULE,
           metric: str = "gpu_xid_count", score: float = 1.0) -> Alert:  # fmt: skip
    return Alert(job="j", machine=machine, kind=kind, metric=metric, score=score,
                 first_ts=first_ts, detected_ts=first_ts + 1)  # fmt: skip


def _drained(sessions: SessionFactory, machine: str = "n1", *, now: float = 200.0,
             **kwargs: object) -> Alert:  # fmt: skip
    """An alert whose node Minder drained (the executor's applied, enforced drain)."""
    alert = _alert(machine, **kwargs)  # type: ignore[arg-type]
    with sessions.begin() as session:
        stored, _ = record_alert(session, alert)
        audit(session, target="slurm", operation="drain", mode="enforce", outcome="applied",
              detail="drained", alert_id=stored.id, job=stored.job, machine=stored.machine,
              node=stored.machine, now=now)  # fmt: skip
    return stored


def _report(check_id: str | None, node: str = "n1", *, fail: bool = False) -> SelfCheckReport:
    checks = [
        CheckResult("gpu.matmul", CheckStatus.FAIL if fail else CheckStatus.PASS,
                    "12 TFLOP/s against a baseline of 40", {"tflops": 12.0, "baseline": 40.0}),
        CheckResult("host.disk", CheckStatus.PASS, "31% used"),
    ]  # fmt: skip
    return SelfCheckReport.of(node, 1000.0, 1010.0, checks, check_id)


def _running(sessions: SessionFactory, alert: Alert, *, attempt: int = 1) -> str:
    with sessions.begin() as session:
        record = create_selfcheck(session, alert_id=alert.id, job=alert.job,
                                  machine=alert.machine, node=alert.machine, target="slurm",
                                  attempt=attempt, drained_ts=200.0, now=300.0)  # fmt: skip
        assert mark_launching(session, record.id, token_sha256=token_digest(TOKEN),
                              partners=["n2", "n3"], now=301.0)  # fmt: skip
    return record.id


def test_right_token_once_then_replay_is_a_conflict(sessions: SessionFactory) -> None:
    alert = _drained(sessions)
    check_id = _running(sessions, alert)
    with sessions.begin() as session:
        record = accept_report(session, check_id, TOKEN, _report(check_id), now=400.0)
    assert record.state is SelfCheckState.PASSED and record.finished_ts == 400.0
    assert record.partners == ("n2", "n3") and record.report == _report(check_id)
    assert record.detail.startswith("pass: passed: gpu.matmul")
    with sessions() as session, pytest.raises(SelfCheckConflictError, match="is passed"):
        accept_report(session, check_id, TOKEN, _report(check_id, fail=True), now=401.0)
    with sessions() as session:  # the replay changed nothing
        assert get_selfcheck(session, check_id).verdict.value == "pass"  # type: ignore[union-attr]


@pytest.mark.parametrize("token", ["", "s3cret-token-of-the-checK", TOKEN + "x"])
def test_missing_or_wrong_token_is_refused_before_anything_else(
    sessions: SessionFactory, token: str
) -> None:
    alert = _drained(sessions)
    check_id = _running(sessions, alert)
    with sessions() as session, pytest.raises(SelfCheckTokenError):
        accept_report(session, check_id, token, _report(check_id), now=400.0)
    with sessions.begin() as session:  # also on a finished check: a forger learns nothing
        accept_report(session, check_id, TOKEN, _report(check_id), now=400.0)
    with sessions() as session, pytest.raises(SelfCheckTokenError, match="wrong token"):
        accept_report(session, check_id, "forged", _report(check_id), now=401.0)


def test_a_check_never_launched_has_no_token(sessions: SessionFactory) -> None:
    alert = _drained(sessions)
    with sessions.begin() as session:
        record = request_selfcheck(session, alert.id, by="ana", now=300.0)
    with sessions() as session, pytest.raises(SelfCheckTokenError, match="never launched"):
        accept_report(session, record.id, TOKEN, _report(record.id), now=400.0)
    with sessions() as session, pytest.raises(NotFoundError, match="no self-check with id"):
        accept_report(session, "nope", TOKEN, _report("nope"), now=400.0)


def test_a_report_of_another_node_or_check_is_a_conflict(sessions: SessionFactory) -> None:
    alert = _drained(sessions)
    check_id = _running(sessions, alert)
    with sessions() as session:
        with pytest.raises(SelfCheckConflictError, match="from node 'n9'"):
            accept_report(session, check_id, TOKEN, _report(check_id, node="n9"), now=400.0)
        with pytest.raises(SelfCheckConflictError, match="names check 'other'"):
            accept_report(session, check_id, TOKEN, _report("other"), now=400.0)
        with pytest.raises(SelfCheckConflictError, match="names check 'None'"):
            accept_report(session, check_id, TOKEN, _report(None), now=400.0)
    with sessions.begin() as session:  # a failing report: state failed, counted for the node
        assert accept_report(session, check_id, TOKEN, _report(check_id, fail=True),
                             now=400.0).state is SelfCheckState.FAILED  # fmt: skip
        assert failed_checks(session, "n1") == 1 and failed_checks(session, "n2") == 0


def test_a_report_after_a_timeout_is_refused(sessions: SessionFactory) -> None:
    alert = _drained(sessions)
    check_id = _running(sessions, alert)
    with sessions.begin() as session:
        assert finish(session, check_id, SelfCheckState.TIMED_OUT, "no verdict", now=900.0)
    with sessions() as session, pytest.raises(SelfCheckConflictError, match="is timed_out"):
        accept_report(session, check_id, TOKEN, _report(check_id), now=901.0)


def test_operator_request_needs_a_drained_node_and_no_check_under_way(
    sessions: SessionFactory,
) -> None:
    drained = _drained(sessions)
    not_drained = _alert("n5")
    job_level = Alert(job="j", machine="", kind=AlertKind.HANG, metric="hang", score=1.0,
                      first_ts=5.0, detected_ts=6.0)  # fmt: skip
    with sessions.begin() as session:
        record_alert(session, not_drained)
        record_alert(session, job_level)
        with pytest.raises(NotFoundError, match="no alert with id 'missing'"):
            request_selfcheck(session, "missing", by="ana", now=300.0)
        with pytest.raises(ValidationError, match="names no machine"):
            request_selfcheck(session, job_level.id, by="ana", now=300.0)
        with pytest.raises(ValidationError, match="Minder did not take its node out"):
            request_selfcheck(session, not_drained.id, by="ana", now=300.0)
        record = request_selfcheck(session, drained.id, by="ana", now=300.0)
        assert (record.state, record.attempt, record.node, record.target) == (
            SelfCheckState.PENDING, 1, "n1", "slurm")  # fmt: skip
        assert record.drained_ts == 200.0 and "requested by ana" in record.detail
        with pytest.raises(SelfCheckConflictError, match="pending already"):
            request_selfcheck(session, drained.id, by="bo", now=301.0)
        cancel_selfcheck(session, record.id, by="ana", now=302.0)
        again = request_selfcheck(session, drained.id, by="bo", now=303.0)
        assert again.attempt == 2
        assert latest_selfcheck_for_alert(session, drained.id) == again
        change_alert_status(session, drained.id, AlertStatus.RESOLVED, [])
        with pytest.raises(ValidationError, match="is resolved: Minder holds its node out no"):
            request_selfcheck(session, drained.id, by="bo", now=304.0)


def test_cancel_only_what_is_not_final(sessions: SessionFactory) -> None:
    alert = _drained(sessions)
    check_id = _running(sessions, alert)
    with sessions.begin() as session:
        cancelled = cancel_selfcheck(session, check_id, by="ana", now=500.0)
    assert cancelled.state is SelfCheckState.CANCELLED and cancelled.detail == "cancelled by ana"
    with sessions() as session, pytest.raises(SelfCheckConflictError, match="nothing to cancel"):
        cancel_selfcheck(session, check_id, by="ana", now=501.0)
    with sessions() as session, pytest.raises(SelfCheckConflictError, match="is cancelled"):
        accept_report(session, check_id, TOKEN, _report(check_id), now=502.0)


def test_list_filters_pages_newest_first(sessions: SessionFactory) -> None:
    first, second = _drained(sessions, "n1"), _drained(sessions, "n2", first_ts=50.0)
    with sessions.begin() as session:
        a = request_selfcheck(session, first.id, by="x", now=300.0)
        b = request_selfcheck(session, second.id, by="x", now=310.0)
        cancel_selfcheck(session, a.id, by="x", now=320.0)
    with sessions() as session:
        items, total = list_selfchecks(session)
        assert [r.id for r in items] == [b.id, a.id] and total == 2
        assert list_selfchecks(session, state="cancelled")[0] == [get_selfcheck(session, a.id)]
        assert list_selfchecks(session, state=["pending", "running"])[1] == 1
        assert list_selfchecks(session, node="n2")[0][0].id == b.id
        assert list_selfchecks(session, alert_id=first.id, job="j")[0][0].id == a.id
        assert list_selfchecks(session, job="other") == ([], 0)
        page, total = list_selfchecks(session, limit=1, offset=1)
        assert [r.id for r in page] == [a.id] and total == 2
        with pytest.raises(ValidationError, match="self-check state 'done': expected one of"):
            list_selfchecks(session, state="done")
        with pytest.raises(ValidationError, match="limit 0 is out of range"):
            list_selfchecks(session, limit=0)
        with pytest.raises(ValidationError, match="limit 501"):
            list_selfchecks(session, limit=501)


def test_service_finds_drained_alerts_once_and_one_attempt_per_alert(
    sessions: SessionFactory,
) -> None:
    drained = _drained(sessions, "n1")
    _drained(sessions, "n2", kind=AlertKind.STRAGGLER, metric="step_time")
    with sessions.begin() as session:
        record_alert(session, _alert("n3", first_ts=7.0))  # not drained
        found = drained_alerts_without_check(session, kinds={"rule", "hang"})
        assert [f.alert.id for f in found] == [drained.id]
        assert found[0].drain == drain_of(session, drained.id)
        assert drained_alerts_without_check(session, kinds={"rule"}, dry_run=True) == []
        first = decide_selfcheck(session, alert=found[0].alert, drain=found[0].drain, now=300.0)
        assert first is not None and first.attempt == 1
        assert drained_alerts_without_check(session, kinds={"rule"}) == []
        # the same attempt twice (two replicas deciding at once) is refused by the database
        with pytest.raises(IntegrityError), session.begin_nested():
            create_selfcheck(session, alert_id=drained.id, job="j", machine="n1", node="n1",
                             target="slurm", attempt=1, drained_ts=None, now=301.0)  # fmt: skip


def test_a_verdict_moves_the_alert_and_writes_its_event_with_the_evidence(
    sessions: SessionFactory,
) -> None:
    alert = _drained(sessions)
    evidence = {"check_id": "c1", "verdict": "fail", "failing": ["gpu.matmul"]}
    with sessions.begin() as session:
        # a person cannot set it (the API's PATCH goes through change_alert_status)
        with pytest.raises(StatusTransitionError, match="only Minder's self-check") as refused:
            change_alert_status(session, alert.id, AlertStatus.CONFIRMED, [ALL])
        assert AlertStatus.CONFIRMED not in refused.value.allowed
        after = record_selfcheck_verdict(session, alert.id, AlertStatus.CONFIRMED, evidence,
                                         [ALL], event=AlertEvent.CONFIRMED, now=500.0)  # fmt: skip
        assert after.status is AlertStatus.CONFIRMED and after.evidence["selfcheck"] == evidence
        # a confirmed alert is active: a new report of the fault folds into it, keeping the
        # verdict even when its higher score replaces the detector's evidence
        stored, created = record_alert(session, _alert(first_ts=150.0, score=5.0))
        assert not created and stored.id == alert.id and stored.score == 5.0
        assert stored.evidence["selfcheck"] == evidence
        assert [a.id for a in open_alerts(session)] == [alert.id]
        rows, _ = list_deliveries(session, alert_id=alert.id)
        payload = rows[0].payload
        assert rows[0].event == "alert.confirmed" and payload["type"] == "alert.confirmed"
        assert payload["data"]["selfcheck"] == evidence
        assert payload["data"]["previous_status"] == "open"
        assert payload["data"]["changed_by"] == "selfcheck"
        assert payload["data"]["alert"]["status"] == "confirmed"
        # evidence only (inconclusive): the status stays, the event is written anyway
        again = record_selfcheck_verdict(session, alert.id, None, {"check_id": "c2"}, [ALL],
                                         event=AlertEvent.SELFCHECK_INCONCLUSIVE)  # fmt: skip
        assert again.status is AlertStatus.CONFIRMED
        assert again.evidence["selfcheck"] == {"check_id": "c2"}
        # a person resolves a confirmed alert after the repair
        assert change_alert_status(session, alert.id, AlertStatus.RESOLVED,
                                   [ALL]).status is AlertStatus.RESOLVED  # fmt: skip


def test_cleared_by_selfcheck_is_closed(sessions: SessionFactory) -> None:
    alert = _drained(sessions)
    with sessions.begin() as session:
        record_selfcheck_verdict(session, alert.id, AlertStatus.CLEARED_BY_SELFCHECK,
                                 {"check_id": "c1", "verdict": "pass"}, [ALL],
                                 event=AlertEvent.CLEARED_BY_SELFCHECK)  # fmt: skip
        assert open_alerts(session) == []
        assert [a.id for a in closed_alerts_since(session, 0.0)] == [alert.id]
        with pytest.raises(StatusTransitionError, match="final status"):
            change_alert_status(session, alert.id, AlertStatus.RESOLVED, [ALL])
        assert get_alert(session, alert.id).status is AlertStatus.CLEARED_BY_SELFCHECK
        # a new report of the same fault after the return is a new alert
        stored, created = record_alert(session, _alert(first_ts=900.0))
        assert created and stored.id != alert.id


def test_a_request_racing_the_service_is_a_conflict_and_keeps_the_transaction(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    alert = _drained(sessions)
    other = _drained(sessions, "n2")
    with sessions.begin() as session:
        first = request_selfcheck(session, alert.id, by="ana", now=300.0)
        cancel_selfcheck(session, first.id, by="ana", now=301.0)
    # the service decided attempt 1 between this request's read and its insert
    monkeypatch.setattr(selfchecks_storage, "next_attempt", lambda session, alert_id: 1)
    with sessions.begin() as session:
        with pytest.raises(SelfCheckConflictError, match=r"attempt 1 was created concurrently"):
            request_selfcheck(session, alert.id, by="bo", now=302.0)
        # the savepoint kept the caller's transaction usable
        kept = request_selfcheck(session, other.id, by="bo", now=303.0)
    with sessions() as session:
        assert get_selfcheck(session, kept.id).attempt == 1


def test_failures_count_since_a_person_closed_an_alert_of_the_node(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    alert = _drained(sessions)
    for attempt in (1, 2):
        check_id = _running(sessions, alert, attempt=attempt)
        with sessions.begin() as session:
            accept_report(session, check_id, TOKEN, _report(check_id, fail=True), now=400.0)
    with sessions() as session:
        assert failed_checks(session, "n1") == 2 and failed_checks(session, "n2") == 0
    monkeypatch.setattr(alerts_storage, "time", SimpleNamespace(time=lambda: 500.0))
    with sessions.begin() as session:
        change_alert_status(session, alert.id, AlertStatus.RESOLVED, [])
    with sessions() as session:
        assert failed_checks(session, "n1") == 0  # repaired: checked again
    later = _drained(sessions, metric="gpu_ecc_errors")
    check_id = _running(sessions, later)
    with sessions.begin() as session:
        accept_report(session, check_id, TOKEN, _report(check_id, fail=True), now=600.0)
    with sessions() as session:
        assert failed_checks(session, "n1") == 1
