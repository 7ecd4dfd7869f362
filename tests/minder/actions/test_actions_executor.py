"""Policy, dry run, holds, opt-out, the scheduler's check, undo, audit and the circuit breaker in
front of the scheduler.

The scheduler here is a recording actuator that knows which nodes each job runs on (the real
Slurm and Kubernetes ones have their own tests against a real slurmctld and a fake API server):
what matters is which calls reach it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from minder.actions.base import ActionError, ActionOutcome, SchedulerView
from minder.actions.executor import BREAKER, ActionExecutor, ActionMetrics
from minder.actions.policy import ActionPolicy
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.delivery.worker import Backoff, DeliveryWorker
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database
from minder.storage.actions import (
    RESUME_OPERATION,
    audit,
    get_breaker,
    list_audit,
    machines_acted_on,
    reset_breaker,
    set_actions_enabled,
)
from minder.storage.alerts import get_alert_record, list_alerts
from minder.storage.jobs import upsert_job_machines
from minder.storage.outbox import (
    AlertEvent,
    Destination,
    change_alert_status,
    list_deliveries,
    record_alert_with_events,
    record_selfcheck_verdict,
)
from minder.storage.records import MachineInfo

FAST = Backoff(base_s=0.01, cap_s=0.05, floor_s=0.01)
NOTIFY = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))


def _fleet() -> dict[str, frozenset[str]]:
    """The running jobs of the ``sessions`` fixture's fleet: j and k, 100 nodes each."""
    return {job: frozenset(f"{job}-n{i:04d}" for i in range(100)) for job in ("j", "k")}


@dataclass
class Recording:
    """Records applies and undos; ``fail`` raises that error on the next call. As the scheduler's
    view, ``jobs`` are the running jobs and their nodes; ``unreachable`` raises that error on the
    next check."""

    name: str = "slurm"
    applied: list[tuple[str, str]] = field(default_factory=list)
    undone: list[tuple[str, str]] = field(default_factory=list)
    fail: ActionError | None = None
    jobs: dict[str, frozenset[str]] = field(default_factory=_fleet)
    checked: list[str] = field(default_factory=list)
    unreachable: ActionError | None = None

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        self.checked.append(job_id)
        if self.unreachable is not None:
            error, self.unreachable = self.unreachable, None
            raise error
        return self.jobs.get(job_id)

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        self.applied.append((node, alert_id))
        return ActionOutcome(self.name, node, "drain", True, f"drained {node}: {reason}")

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        self.undone.append((node, alert_id))
        return ActionOutcome(self.name, node, "resume", True, f"resumed {node}")


@pytest.fixture
def sessions(tmp_path: Path) -> SessionFactory:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'actions.db'}")
    upgrade_database(engine)
    factory = session_factory(engine)
    with factory.begin() as session:  # a watched fleet of 200 machines in two jobs
        for job in ("j", "k"):
            upsert_job_machines(
                session, job, [MachineInfo(f"{job}-n{i:04d}", "", "") for i in range(100)], 1.0
            )
    return factory


class Harness:
    def __init__(self, sessions: SessionFactory, policy: ActionPolicy) -> None:
        self.sessions = sessions
        self.actuator = Recording()
        self.registry = CollectorRegistry()
        self.executor = ActionExecutor(
            self.actuator,
            policy,
            sessions,
            notify=[NOTIFY],
            metrics=ActionMetrics(self.registry),
        )
        self.destinations = [self.executor.destination_spec(), NOTIFY]
        self.worker = DeliveryWorker(self.executor, sessions, backoff=FAST)

    def raise_alert(self, machine: str, kind: AlertKind = AlertKind.RULE, job: str = "j",
                    domain: str = "", metric: str = "gpu_xid_count") -> Alert:  # fmt: skip
        alert = Alert(job=job, machine=machine, kind=kind, metric=metric, score=9.0,
                      first_ts=1000.0, detected_ts=1001.0, domain=domain)  # fmt: skip
        with self.sessions.begin() as session:
            stored, _ = record_alert_with_events(session, alert, self.destinations)
        return stored

    def set_status(self, alert: Alert, status: AlertStatus) -> None:
        with self.sessions.begin() as session:
            change_alert_status(session, alert.id, status, self.destinations)

    def run(self, seconds: float = 0.0) -> None:
        deadline = time.monotonic() + seconds
        while True:
            self.worker.run_once()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def run_until(self, done: Callable[[], bool], timeout_s: float = 15.0) -> None:
        """Runs the worker until ``done()`` holds; a loaded machine may need many passes for a
        retry's backoff or a hold to pass, so the test waits on the outcome, not on a fixed time."""
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"not done within {timeout_s} s"
            self.worker.run_once()
            time.sleep(0.02)

    def outcomes(self) -> list[tuple[str, str, str]]:
        """The audit trail, oldest first, without the ``started`` rows; checks that every enforced
        request to the target was announced by one first."""
        with self.sessions() as session:
            entries, _ = list_audit(session, limit=500)
        trail = [(e.machine or "", e.operation, e.outcome) for e in reversed(entries)]
        for index, (machine, operation, outcome) in enumerate(trail):
            if outcome in ("applied", "unchanged", "failed") and operation == "drain":
                assert (machine, operation, "started") in trail[:index]
        return [t for t in trail if t[2] != "started"]


def test_log_only_is_the_default_and_changes_nothing(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy())
    alert = h.raise_alert("j-n0001")
    h.run()
    assert h.actuator.applied == []
    assert h.outcomes() == [("j-n0001", "drain", "dry_run")]
    h.set_status(alert, AlertStatus.FALSE_POSITIVE)
    h.run()
    assert h.actuator.undone == []
    assert h.outcomes()[-1] == ("j-n0001", "resume", "dry_run")
    assert (
        h.registry.get_sample_value(
            "minder_actions_total", {"target": "slurm", "operation": "drain", "outcome": "dry_run"}
        )
        == 1
    )


def test_enforced_rules_act_at_once_and_undo_on_false_positive(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    alert = h.raise_alert("j-n0001")
    h.run()
    assert h.actuator.applied == [("j-n0001", alert.id)]
    h.set_status(alert, AlertStatus.ACKNOWLEDGED)
    h.run()
    assert h.actuator.undone == []  # acknowledging is not the end of the fault
    h.set_status(alert, AlertStatus.FALSE_POSITIVE)
    h.run()
    assert h.actuator.undone == [("j-n0001", alert.id)]
    assert [o[2] for o in h.outcomes()] == ["applied", "applied"]


def test_similarity_acts_only_once_it_has_held(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True, act_on={"rule": 0, "similarity": 0.4}))
    held = h.raise_alert("j-n0002", AlertKind.SIMILARITY)
    dismissed = h.raise_alert("j-n0003", AlertKind.SIMILARITY)
    h.run()
    assert h.actuator.applied == []  # within the hold
    h.set_status(dismissed, AlertStatus.FALSE_POSITIVE)
    h.run_until(lambda: bool(h.actuator.applied) and len(h.outcomes()) >= 3)
    assert h.actuator.applied == [("j-n0002", held.id)]
    assert ("j-n0003", "drain", "skipped_policy") in h.outcomes()
    # the dismissed one was never taken out, so there is nothing to give back
    assert h.actuator.undone == []
    assert ("j-n0003", "resume", "skipped_policy") in h.outcomes()


def test_stragglers_and_domain_alerts_only_notify(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.raise_alert("j-n0004", AlertKind.STRAGGLER)
    h.raise_alert("leaf-3", AlertKind.SILENCE, domain="leaf-3")
    h.run(0.1)
    assert h.actuator.applied == []
    assert {o[2] for o in h.outcomes()} == {"skipped_policy"}


def test_jobs_opt_out_by_setting_or_through_the_store(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True, opt_out_jobs=frozenset({"k"})))
    h.raise_alert("k-n0001", job="k")
    with sessions.begin() as session:
        set_actions_enabled(session, "j", False, by="ops")
    h.raise_alert("j-n0001")
    h.run()
    assert h.actuator.applied == []
    assert [o[2] for o in h.outcomes()] == ["skipped_opt_out", "skipped_opt_out"]


def test_transient_failures_retry_and_permanent_ones_give_up(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.actuator.fail = ActionError("controller unreachable", transient=True)
    first = h.raise_alert("j-n0001")
    h.run_until(lambda: bool(h.actuator.applied))
    assert h.actuator.applied == [("j-n0001", first.id)]
    h.actuator.fail = ActionError("node j-n0002 not found", transient=False)
    h.raise_alert("j-n0002")
    h.run_until(lambda: len(h.outcomes()) >= 3)
    assert [o[2] for o in h.outcomes()] == ["failed", "applied", "failed"]
    with sessions() as session:
        expired, _ = list_deliveries(session, status="expired")
    assert [d.destination for d in expired] == ["action:slurm"]


def test_the_breaker_trips_at_its_bound_in_a_fault_storm(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True, max_per_job=3, max_fraction=0.5))
    storm = [h.raise_alert(f"j-n{i:04d}") for i in range(10)]
    h.run()
    # exactly the bound, and not one action past it
    assert [node for node, _ in h.actuator.applied] == ["j-n0000", "j-n0001", "j-n0002"]
    outcomes = [o[2] for o in h.outcomes()]
    assert outcomes == ["applied"] * 3 + ["skipped_breaker"] * 7
    with sessions() as session:
        state = get_breaker(session, BREAKER)
        events, _ = list_deliveries(session, destination="webhook:ops", limit=100)
    assert state.tripped and "4 machines of job j" in (state.reason or "")
    tripped = [e for e in events if e.event == "breaker.tripped"]
    assert len(tripped) == 1 and tripped[0].payload["data"]["refused"]["machine"] == "j-n0003"
    assert h.registry.get_sample_value("minder_actions_breaker_tripped") == 1
    assert (
        h.registry.get_sample_value(
            "minder_actions_total",
            {"target": "slurm", "operation": "drain", "outcome": "skipped_opt_out"},
        )
        == 0
    )  # every outcome exists from the start
    # tripped: no other job is acted on either, until an operator resets it
    h.raise_alert("k-n0001", job="k")
    h.run()
    assert len(h.actuator.applied) == 3
    # undos still happen: giving a node back is safe
    h.set_status(storm[0], AlertStatus.RESOLVED)
    h.run()
    assert h.actuator.undone == [("j-n0000", storm[0].id)]
    with sessions.begin() as session:
        assert reset_breaker(session, BREAKER, by="ops")
    h.executor.refresh_gauges()  # what the delivery hub does every few seconds
    assert h.registry.get_sample_value("minder_actions_breaker_tripped") == 0
    h.raise_alert("k-n0002", job="k")
    h.run()
    assert h.actuator.applied[-1][0] == "k-n0002"


def test_the_fleet_wide_bound_counts_every_job(sessions: SessionFactory) -> None:
    # 200 watched machines, 1.5 % -> 3 machines across all jobs
    h = Harness(sessions, ActionPolicy(enforce=True, max_per_job=10, max_fraction=0.015))
    for job, i in (("j", 1), ("k", 1), ("j", 2), ("k", 2)):
        h.raise_alert(f"{job}-n{i:04d}", job=job)
    h.run()
    assert len(h.actuator.applied) == 3
    with sessions() as session:
        assert "of the 200 watched machines" in (get_breaker(session, BREAKER).reason or "")


def test_dry_run_trips_the_breaker_too_so_operators_learn_their_bound(
    sessions: SessionFactory,
) -> None:
    h = Harness(sessions, ActionPolicy(max_per_job=2))
    for i in range(4):
        h.raise_alert(f"j-n{i:04d}")
    h.run()
    assert [o[2] for o in h.outcomes()] == ["dry_run", "dry_run", "skipped_breaker",
                                            "skipped_breaker"]  # fmt: skip
    assert h.actuator.applied == []


def test_an_apply_recorded_as_failed_is_still_undone(sessions: SessionFactory) -> None:
    # the target timed out but the drain took effect: the undo must still ask the target
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.actuator.fail = ActionError("node j-n0001 not found", transient=False)
    alert = h.raise_alert("j-n0001")
    h.run()
    h.set_status(alert, AlertStatus.RESOLVED)
    h.run()
    assert h.actuator.undone == [("j-n0001", alert.id)]


def test_undo_finds_the_apply_however_long_the_audit_grew(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    alert = h.raise_alert("j-n0001")
    h.run()
    h.set_status(alert, AlertStatus.RESOLVED)
    for _ in range(60):  # the controller is down for an hour: 60 failed resumes
        h.actuator.undone.clear()
        with sessions.begin() as session:
            from minder.storage.actions import audit

            audit(session, target="slurm", operation="resume", mode="enforce", outcome="failed",
                  detail="controller down", alert_id=alert.id, job="j", machine="j-n0001")  # fmt: skip
    h.run()
    assert h.actuator.undone == [("j-n0001", alert.id)]


def test_a_reset_starts_a_new_window(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True, max_per_job=2, max_fraction=1.0))
    for i in range(3):
        h.raise_alert(f"j-n{i:04d}")
    h.run()
    assert len(h.actuator.applied) == 2
    with sessions.begin() as session:
        assert reset_breaker(session, BREAKER, by="ops")
    h.raise_alert("j-n0010")
    h.raise_alert("j-n0011")
    h.run()
    assert [n for n, _ in h.actuator.applied] == ["j-n0000", "j-n0001", "j-n0010", "j-n0011"]


# -- the scheduler's check ------------------------------------------------------------------------


def _suspicious(sessions: SessionFactory) -> list[Alert]:
    with sessions() as session:
        alerts, _ = list_alerts(session, kind="suspicious_source")
    return alerts


def _deliveries(sessions: SessionFactory, alert_id: str) -> set[tuple[str, str]]:
    with sessions() as session:
        rows, _ = list_deliveries(session, alert_id=alert_id, limit=100)
    return {(d.destination, d.event) for d in rows}


def test_a_node_outside_the_job_is_not_acted_on_and_raises_suspicious_source(
    sessions: SessionFactory,
) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    forged = h.raise_alert("k-n0007", job="j")  # a node of job k, claimed for job j
    h.run()
    assert h.actuator.checked == ["j"]
    assert h.actuator.applied == []
    assert h.outcomes() == [("k-n0007", "drain", "skipped_not_in_job")]
    with sessions() as session:
        [entry], _ = list_audit(session, outcome="skipped_not_in_job")
    assert entry.alert_id == forged.id and entry.mode == "enforce"
    assert "node k-n0007 is not running job j per slurm" in entry.detail
    assert "the job runs on 100 other node(s)" in entry.detail

    [suspicious] = _suspicious(sessions)
    assert (suspicious.job, suspicious.machine, suspicious.status) == ("j", "k-n0007",
                                                                      AlertStatus.OPEN)  # fmt: skip
    assert suspicious.evidence["original_alert_id"] == forged.id
    assert suspicious.evidence["reason"].startswith("node k-n0007 is not running job j per slurm")
    assert suspicious.evidence["job_node_count"] == 100
    assert len(suspicious.evidence["job_nodes"]) == 16
    # delivered to the notification destinations, never to an action destination
    assert _deliveries(sessions, suspicious.id) == {("webhook:ops", "alert.opened")}
    assert (
        h.registry.get_sample_value(
            "minder_actions_total",
            {"target": "slurm", "operation": "drain", "outcome": "skipped_not_in_job"},
        )
        == 1
    )
    # the forged alert's end asks for no undo: nothing was taken out
    h.set_status(forged, AlertStatus.RESOLVED)
    h.run()
    assert h.actuator.undone == []
    assert h.outcomes()[-1] == ("k-n0007", "resume", "skipped_policy")


def test_a_job_the_scheduler_does_not_run_is_not_acted_on(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.raise_alert("j-n0001", job="4242")
    h.raise_alert("j-n0002", job="x" * 300)  # a long forged job id is cut in messages
    h.run()
    assert h.actuator.applied == []
    assert [o[2] for o in h.outcomes()] == ["skipped_not_in_job"] * 2
    by_job = {a.job: a for a in _suspicious(sessions)}
    assert by_job["4242"].evidence["reason"] == (
        "node j-n0001 is not running job 4242 per slurm (slurm knows no running job of that id)"
    )
    assert by_job["4242"].evidence["job_running"] is False
    assert len(by_job["x" * 300].evidence["reason"]) < 150


def test_a_suspicious_source_alert_is_never_acted_on(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.raise_alert("k-n0007", job="j")
    h.run()
    [suspicious] = _suspicious(sessions)
    # even if one reached an action destination, the policy refuses it
    h.raise_alert("j-n0001", kind=AlertKind.SUSPICIOUS_SOURCE)
    h.run()
    assert h.actuator.applied == [] and h.actuator.checked == ["j"]
    assert h.outcomes()[-1] == ("j-n0001", "drain", "skipped_policy")
    h.set_status(suspicious, AlertStatus.RESOLVED)
    h.run()
    assert h.actuator.undone == []
    with pytest.raises(ValidationError, match="never acted on"):
        ActionPolicy(act_on={"suspicious_source": 0})


def test_the_same_forged_fault_again_folds_into_one_suspicious_alert(
    sessions: SessionFactory,
) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    first = h.raise_alert("k-n0007", job="j")
    h.run()
    h.set_status(first, AlertStatus.RESOLVED)
    h.run()
    again = Alert(job="j", machine="k-n0007", kind=AlertKind.RULE, metric="gpu_xid_count",
                  score=9.0, first_ts=2000.0, detected_ts=2001.0)  # fmt: skip
    with sessions.begin() as session:
        record_alert_with_events(session, again, h.destinations)
    h.run()
    [suspicious] = _suspicious(sessions)
    with sessions() as session:
        assert get_alert_record(session, suspicious.id).occurrences == 2
    assert [o[2] for o in h.outcomes() if o[1] == "drain"] == ["skipped_not_in_job"] * 2


def test_forged_alerts_neither_spend_nor_trip_the_breaker(sessions: SessionFactory) -> None:
    # 200 watched machines, 0.5 %: one machine per window, as 2 % of 8 machines would be
    h = Harness(sessions, ActionPolicy(enforce=True, max_per_job=1, max_fraction=0.005))
    for i in range(3):
        h.raise_alert(f"k-n{i:04d}", job="j")  # forged: k's nodes claimed for j
    h.raise_alert("j-n0000", job="k")  # forged: j's node claimed for k
    h.run()
    assert [o[2] for o in h.outcomes()] == ["skipped_not_in_job"] * 4
    with sessions() as session:
        assert not get_breaker(session, BREAKER).tripped
        assert machines_acted_on(session, since=0.0, operation="drain") == set()
    real = h.raise_alert("j-n0005")  # a real fault is still drained
    h.run()
    assert h.actuator.applied == [("j-n0005", real.id)]
    with sessions() as session:
        assert machines_acted_on(session, since=0.0, operation="drain") == {("j", "j-n0005")}
    h.raise_alert("j-n0006")  # and the bound still holds for real faults
    h.run()
    assert len(h.actuator.applied) == 1
    with sessions() as session:
        assert get_breaker(session, BREAKER).tripped


def test_dry_run_checks_too_and_forged_alerts_do_not_count(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(max_per_job=1))
    h.raise_alert("k-n0001", job="j")
    h.raise_alert("j-n0001")
    h.run()
    assert [o[2] for o in h.outcomes()] == ["skipped_not_in_job", "dry_run"]
    with sessions() as session:
        [dry], _ = list_audit(session, outcome="dry_run")
    assert "j-n0001 runs job j per slurm" in dry.detail
    assert h.actuator.applied == []


def test_an_unreachable_scheduler_is_retried_never_acted_on_blind(
    sessions: SessionFactory,
) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.actuator.unreachable = ActionError("slurm: controller unreachable", transient=True)
    alert = h.raise_alert("j-n0001")
    h.run()
    assert h.actuator.applied == []  # not before the scheduler answered
    h.run_until(lambda: bool(h.actuator.applied))
    assert h.actuator.applied == [("j-n0001", alert.id)]
    assert [o[1:] for o in h.outcomes()] == [("check", "failed"), ("drain", "applied")]
    with sessions() as session:
        [failed], _ = list_audit(session, outcome="failed")
    assert "cannot check with slurm that j-n0001 runs job j" in failed.detail
    assert failed.detail.endswith("(retried)")
    assert (
        h.registry.get_sample_value(
            "minder_actions_total", {"target": "slurm", "operation": "check", "outcome": "failed"}
        )
        == 1
    )


def test_a_check_that_cannot_succeed_gives_up_without_acting(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.actuator.unreachable = ActionError("slurm: scontrol not found", transient=False)
    alert = h.raise_alert("j-n0001")
    h.run()
    assert h.actuator.applied == []
    assert [o[1:] for o in h.outcomes()] == [("check", "failed")]
    with sessions() as session:
        expired, _ = list_deliveries(session, status="expired")
    assert [d.destination for d in expired] == ["action:slurm"]
    h.set_status(alert, AlertStatus.RESOLVED)  # nothing was applied: nothing to undo
    h.run()
    assert h.actuator.undone == []
    assert h.outcomes()[-1] == ("j-n0001", "resume", "skipped_policy")


def test_undos_need_no_check(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    alert = h.raise_alert("j-n0001")
    h.run()
    h.actuator.jobs.clear()  # the job ended: the node is given back all the same
    h.set_status(alert, AlertStatus.RESOLVED)
    h.run()
    assert h.actuator.undone == [("j-n0001", alert.id)]
    assert h.actuator.checked == ["j"]


def test_an_actuator_that_cannot_check_is_refused(sessions: SessionFactory) -> None:
    class Blind:
        name = "blind"

        def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
            raise AssertionError("never called")

        def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="scheduler's check"):
        ActionExecutor(Blind(), ActionPolicy(enforce=True), sessions)
    view: SchedulerView = Recording()
    executor = ActionExecutor(Blind(), ActionPolicy(enforce=True), sessions, scheduler=view)
    assert executor.scheduler is view


@pytest.mark.parametrize(
    "kwargs",
    [
        {"act_on": {"bogus": 0}},
        {"act_on": {"rule": -1}},
        {"max_per_job": 0},
        {"max_fraction": 0},
        {"node_template": "node"},
        {"node_template": "{machine}.{domain}"},
    ],
)
def test_a_bad_policy_is_refused_naming_the_value(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        ActionPolicy(**kwargs)


# -- self-checks (issue 24) ------------------------------------------------------------------------


@dataclass
class Marked(Recording):
    """A target that undoes only Minder's own mark, as Slurm and Kubernetes do: ``marks`` holds
    the (node, alert) it drained; a self-check launcher's release removes the mark first."""

    marks: set[tuple[str, str]] = field(default_factory=set)

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        done = super().apply(node, alert_id=alert_id, reason=reason)
        self.marks.add((node, alert_id))
        return done

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        self.undone.append((node, alert_id))
        if (node, alert_id) not in self.marks:
            return ActionOutcome(self.name, node, "resume", False, "no mark of Minder's: left")
        self.marks.discard((node, alert_id))
        return ActionOutcome(self.name, node, "resume", True, f"resumed {node}")


@pytest.mark.parametrize("released_first", [True, False])
def test_a_cleared_alert_is_undone_harmlessly_after_the_launchers_release(
    sessions: SessionFactory, released_first: bool
) -> None:
    """``alert.cleared_by_selfcheck`` is an undo: after the launcher returned the node it finds
    no mark and is audited unchanged; where a launcher left the mark, it returns the node."""
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.actuator = Marked()
    h.executor.actuator = h.actuator
    alert = h.raise_alert("j-n0001")
    h.run()
    assert h.actuator.marks == {("j-n0001", alert.id)}
    if released_first:
        h.actuator.marks.clear()  # the launcher's release(passed=True) returned the node
    with sessions.begin() as session:
        record_selfcheck_verdict(session, alert.id, AlertStatus.CLEARED_BY_SELFCHECK,
                                 {"check_id": "c1", "verdict": "pass"}, h.destinations,
                                 event=AlertEvent.CLEARED_BY_SELFCHECK)  # fmt: skip
    h.run()
    assert h.actuator.undone == [("j-n0001", alert.id)] and h.actuator.marks == set()
    assert h.outcomes()[-1] == (
        "j-n0001", "resume", "unchanged" if released_first else "applied")  # fmt: skip


def test_an_applied_drain_wakes_the_selfcheck_service(sessions: SessionFactory) -> None:
    woken: list[str] = []
    dry = Harness(sessions, ActionPolicy())
    dry.executor.on_applied = lambda: woken.append("dry")
    dry.raise_alert("j-n0001")
    dry.run()
    assert woken == []  # a dry run takes nothing out
    h = Harness(sessions, ActionPolicy(enforce=True))
    h.executor.on_applied = lambda: woken.append("enforce")
    alert = h.raise_alert("j-n0002")
    h.run()
    assert woken == ["enforce"]
    h.set_status(alert, AlertStatus.RESOLVED)
    h.run()
    assert woken == ["enforce"] and h.actuator.undone == [("j-n0002", alert.id)]


def test_the_breaker_counts_the_returns_of_passed_selfchecks(sessions: SessionFactory) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True, max_per_job=2, max_fraction=0.5))
    h.raise_alert("j-n0001")
    h.run()
    with sessions.begin() as session:  # a passed self-check returned another node of job j
        audit(session, target="slurm", operation=RESUME_OPERATION, mode="enforce",
              outcome="started", detail="returning j-n0009", alert_id="a9", job="j",
              machine="j-n0009", node="j-n0009")  # fmt: skip
    h.raise_alert("j-n0002")
    h.run()
    assert [node for node, _ in h.actuator.applied] == ["j-n0001"]
    with sessions() as session:
        state = get_breaker(session, BREAKER)
    assert state.tripped and "3 returns and drains of job j" in (state.reason or "")


def test_a_confirmed_alert_still_holds_its_node_until_a_person_ends_it(
    sessions: SessionFactory,
) -> None:
    h = Harness(sessions, ActionPolicy(enforce=True))
    alert = h.raise_alert("j-n0001")
    h.run()
    with sessions.begin() as session:
        record_selfcheck_verdict(session, alert.id, AlertStatus.CONFIRMED,
                                 {"check_id": "c1", "verdict": "fail"}, h.destinations,
                                 event=AlertEvent.CONFIRMED)  # fmt: skip
    h.run()
    assert h.actuator.undone == []  # confirmed is no end: the node stays out
    h.set_status(alert, AlertStatus.RESOLVED)
    h.run()
    assert h.actuator.undone == [("j-n0001", alert.id)]
