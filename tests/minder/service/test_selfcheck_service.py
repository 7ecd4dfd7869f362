"""The self-check service end to end on a real database (SQLite; the main paths on PostgreSQL
too), with the fake scheduler of ``fake_launcher`` (Slurm's semantics) and time driven by the
test: fault → drain (the actions executor) → check decided, launched, reported through the
storage function the API calls → node returned or kept out, alert cleared or confirmed, events
with the evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_launcher import FakeScheduler, Run
from prometheus_client import CollectorRegistry

import minder.storage.alerts
from minder.actions.base import ActionError
from minder.actions.executor import BREAKER, ActionExecutor
from minder.actions.policy import ActionPolicy, SelfCheckPolicy
from minder.actions.selfcheck import CheckLaunch, LaunchState
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.selfcheck import (
    CheckResult,
    CheckStatus,
    SelfCheckConflictError,
    SelfCheckRecord,
    SelfCheckReport,
    SelfCheckState,
    SelfCheckTokenError,
)
from minder.delivery.worker import Backoff, DeliveryWorker
from minder.service.selfcheck import SelfCheckMetrics, SelfCheckService, node_budget_s
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database
from minder.storage.actions import AuditEntry, get_breaker, list_audit
from minder.storage.alerts import get_alert
from minder.storage.jobs import upsert_job_machines
from minder.storage.outbox import (
    AlertEvent,
    Delivery,
    Destination,
    change_alert_status,
    list_deliveries,
    record_alert_with_events,
)
from minder.storage.records import MachineInfo
from minder.storage.selfchecks import (
    accept_report,
    cancel_selfcheck,
    list_selfchecks,
    request_selfcheck,
)

NOTIFY = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))
FAST = Backoff(base_s=0.01, cap_s=0.05, floor_s=0.01)
JOB_NODES = [f"n{i:02d}" for i in range(1, 9)]
IDLE_NODES = [f"n{i:02d}" for i in range(9, 13)]
URL = "http://minder.example:8080"


class Clock:
    """Wall time the test moves (it starts now, so rows written with the real clock agree)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def report(launch: CheckLaunch, status: CheckStatus = CheckStatus.PASS) -> SelfCheckReport:
    """What ``minder selfcheck run`` would post for ``launch``'s node."""
    checks = [
        CheckResult("gpu.matmul", status, f"matmul {status.value}: 31 TFLOP/s against 40",
                    {"tflops": 31.0, "baseline_tflops": 40.0}),
        CheckResult("collective.allreduce", CheckStatus.PASS, "0.12 s, median of partners 0.11 s",
                    {"round1_s": 0.12, "round2_s": 0.11, "partners_median_s": 0.11}),
        CheckResult("network.rdma", CheckStatus.SKIPPED, "no RDMA device in /sys/class/infiniband"),
    ]  # fmt: skip
    return SelfCheckReport.of(launch.node, 1.0, 2.0, checks, launch.check_id)


def passing(launch: CheckLaunch) -> Run:
    return Run(report=report(launch))


def failing(launch: CheckLaunch) -> Run:
    return Run(report=report(launch, CheckStatus.FAIL))


def erring(launch: CheckLaunch) -> Run:
    return Run(report=report(launch, CheckStatus.ERROR))


class Harness:
    """A database, the fake scheduler (job ``j`` on n01-n08, n09-n12 idle), the actions
    executor with its outbox worker, and the self-check service, all on one test clock."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        database_url: str | None = None,
        runner: Callable[[CheckLaunch], Run] = passing,
        enforce: bool = True,
        max_per_job: int = 4,
        window_s: float = 3600.0,
        action_policy: ActionPolicy | None = None,
        **policy: Any,
    ) -> None:
        engine = create_engine_for(database_url or f"sqlite:///{tmp_path / 'selfcheck.db'}")
        upgrade_database(engine)
        self.sessions: SessionFactory = session_factory(engine)
        self.clock = Clock()
        with self.sessions.begin() as session:
            upsert_job_machines(session, "j", [MachineInfo(n, "", "") for n in JOB_NODES], 1.0)
        self.runner = runner
        self.refused: list[Exception] = []
        self.scheduler = FakeScheduler(
            [*JOB_NODES, *IDLE_NODES], runner=self.run_check, post=self.post
        )
        self.scheduler.run_job("j", JOB_NODES)
        self.action_policy = action_policy or ActionPolicy(
            enforce=enforce,
            act_on={"rule": 0.0},
            max_per_job=max_per_job,
            max_fraction=1.0,
            window_s=window_s,
        )
        self.executor = ActionExecutor(
            self.scheduler, self.action_policy, self.sessions, notify=[NOTIFY], clock=self.clock
        )
        self.destinations = [self.executor.destination_spec(), NOTIFY]
        self.worker = DeliveryWorker(self.executor, self.sessions, clock=self.clock, backoff=FAST)
        self.policy = SelfCheckPolicy(
            report_url=URL, enforce=enforce, kinds=frozenset({"rule"}), **policy
        )
        self.registry = CollectorRegistry()
        self.service = self.new_service(SelfCheckMetrics(self.registry))
        self.woken = 0
        self.executor.on_applied = self._woken

    def run_check(self, launch: CheckLaunch) -> Run:
        """The current ``runner`` (a test changes it midway: a repair, a restart)."""
        return self.runner(launch)

    def _woken(self) -> None:
        self.woken += 1
        self.service.wake()

    def new_service(self, metrics: SelfCheckMetrics | None = None) -> SelfCheckService:
        """A service as a (re)started process builds it: nothing but the database carries over."""
        return SelfCheckService(self.scheduler, self.policy, self.action_policy, self.sessions,
                                destinations=self.destinations, metrics=metrics,
                                clock=self.clock)  # fmt: skip

    def post(self, check_id: str, token: str, body: SelfCheckReport) -> None:
        """The node's report, through the storage function the API's report route calls."""
        try:
            with self.sessions.begin() as session:
                accept_report(session, check_id, token, body, now=self.clock())
        except (SelfCheckTokenError, SelfCheckConflictError) as exc:
            self.refused.append(exc)

    def raise_alert(self, machine: str, *, job: str = "j", metric: str = "gpu_xid_count") -> Alert:
        alert = Alert(job=job, machine=machine, kind=AlertKind.RULE, metric=metric, score=1.0,
                      first_ts=self.clock(), detected_ts=self.clock())  # fmt: skip
        with self.sessions.begin() as session:
            stored, _ = record_alert_with_events(session, alert, self.destinations,
                                                 now=self.clock())  # fmt: skip
        self.deliver()
        return stored

    def deliver(self) -> None:
        for _ in range(20):
            if self.worker.run_once() == 0:
                return

    def settle(self, passes: int = 6, step_s: float = 1.0) -> None:
        for _ in range(passes):
            self.service.run_once()
            self.deliver()
            self.clock.advance(step_s)

    def checks(self, **filters: Any) -> list[SelfCheckRecord]:
        with self.sessions() as session:
            return list(reversed(list_selfchecks(session, **filters)[0]))

    def alert(self, alert_id: str) -> Alert:
        with self.sessions() as session:
            return get_alert(session, alert_id)

    def events(self, alert_id: str | None = None) -> list[Delivery]:
        with self.sessions() as session:
            rows, _ = list_deliveries(session, destination=NOTIFY.name, alert_id=alert_id)
        return list(reversed(rows))

    def audit(self, alert_id: str, operation: str | None = None) -> list[AuditEntry]:
        with self.sessions() as session:
            rows, _ = list_audit(session, alert_id=alert_id, limit=500)
        return [r for r in reversed(rows) if operation is None or r.operation == operation]

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def close(self, alert: Alert, status: AlertStatus) -> None:
        with self.sessions.begin() as session:
            change_alert_status(session, alert.id, status, self.destinations, by="ana",
                                now=self.clock())  # fmt: skip
        self.deliver()


def test_a_passed_check_returns_the_node_and_clears_the_alert(
    tmp_path: Path, database_url: str
) -> None:
    h = Harness(tmp_path, database_url=database_url, partners=2)
    alert = h.raise_alert("n03")
    assert h.scheduler.nodes["n03"].drained and h.woken == 1  # the drain woke the service
    h.scheduler.end_job("j")  # the fault killed the job: the node is DRAINED now
    h.clock.advance(30)
    h.settle()
    (check,) = h.checks()
    assert check.state is SelfCheckState.PASSED and check.partners == ("n01", "n02")
    assert check.returned_ts is not None and check.drained_ts is not None
    assert not h.scheduler.nodes["n03"].drained
    assert all(n.reservation is None for n in h.scheduler.nodes.values())
    # what the nodes ran: the command with the report URL and id, the token only in the env
    (launch,) = h.scheduler.launched
    assert launch.command == ("minder", "selfcheck", "run", "--report-url", URL, "--check-id",
                              check.id)  # fmt: skip
    token = launch.env["MINDER_SELFCHECK_TOKEN"]
    assert len(token) >= 40 and all(token not in part for part in launch.command)
    assert launch.env["MINDER_SELFCHECK_NODES"] == "n03,n01,n02"
    assert launch.env["MINDER_SELFCHECK_SUSPECT"] == "n03"
    assert launch.env["MINDER_SELFCHECK_CHECK_ID"] == check.id
    assert launch.env["MINDER_SELFCHECK_REPORT_URL"] == URL
    # the alert and its event carry the evidence
    cleared = h.alert(alert.id)
    assert cleared.status is AlertStatus.CLEARED_BY_SELFCHECK
    evidence = cleared.evidence["selfcheck"]
    assert evidence["verdict"] == "pass" and evidence["check_id"] == check.id
    assert evidence["partners"] == ["n01", "n02"] and evidence["returned_ts"] is not None
    assert evidence["measurements"]["collective.allreduce"]["partners_median_s"] == 0.11
    assert evidence["outcome"].startswith("returned to scheduling")
    event = h.events(alert.id)[-1]
    assert event.event == "alert.cleared_by_selfcheck"
    assert event.payload["data"]["selfcheck"] == evidence
    # the audit: launched, started returning, returned; the executor's undo finds nothing left
    operations = [(a.operation, a.outcome) for a in h.audit(alert.id)]
    assert operations == [
        ("drain", "started"), ("drain", "applied"), ("selfcheck_launch", "applied"),
        ("selfcheck_resume", "started"), ("selfcheck_resume", "applied"),
        ("resume", "unchanged"),
    ]  # fmt: skip
    assert h.metric("minder_selfchecks_total", state="passed") == 1.0
    assert h.metric("minder_selfcheck_drain_to_return_seconds_count") == 1.0
    drain_to_return = h.metric("minder_selfcheck_drain_to_return_seconds_sum")
    assert drain_to_return is not None and 30 <= drain_to_return < 40
    assert h.metric("minder_selfchecks_in_progress", target="slurm") == 0.0


def test_a_failed_check_keeps_the_node_out_and_confirms_the_alert(
    tmp_path: Path, database_url: str
) -> None:
    h = Harness(tmp_path, database_url=database_url, runner=failing)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle()
    (check,) = h.checks()
    assert check.state is SelfCheckState.FAILED and check.returned_ts is None
    node = h.scheduler.nodes["n03"]
    assert node.drained and node.reason.startswith(f"minder:{alert.id}")
    assert node.reservation is None
    confirmed = h.alert(alert.id)
    assert confirmed.status is AlertStatus.CONFIRMED
    evidence = confirmed.evidence["selfcheck"]
    assert evidence["verdict"] == "fail" and evidence["failing"] == ["gpu.matmul"]
    assert evidence["reason"] == "failed: gpu.matmul"
    assert evidence["measurements"]["gpu.matmul"] == {"tflops": 31.0, "baseline_tflops": 40.0}
    event = h.events(alert.id)[-1]
    assert event.event == "alert.confirmed" and event.payload["data"]["selfcheck"] == evidence
    assert event.payload["data"]["alert"]["status"] == "confirmed"
    keep = h.audit(alert.id, "selfcheck_keep")
    assert [k.outcome for k in keep] == ["unchanged"] and "kept drained" in keep[0].detail
    assert h.audit(alert.id, "resume") == []  # no undo: the node stays out
    assert h.metric("minder_selfchecks_total", state="failed") == 1.0
    # a person resolves it after the repair: the node goes back as today
    h.close(alert, AlertStatus.RESOLVED)
    assert not h.scheduler.nodes["n03"].drained
    assert [a.outcome for a in h.audit(alert.id, "resume")] == ["applied"]


def test_an_inconclusive_check_is_retried_then_notified(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=erring, retries=1)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(10)
    first, second = h.checks()
    assert (first.attempt, first.state) == (1, SelfCheckState.INCONCLUSIVE)
    assert (second.attempt, second.state) == (2, SelfCheckState.INCONCLUSIVE)
    assert "gpu.matmul gave no answer" in first.detail
    assert len(h.scheduler.launched) == 2 and len(h.checks()) == 2  # no third
    still = h.alert(alert.id)
    assert still.status is AlertStatus.OPEN and h.scheduler.nodes["n03"].drained
    assert still.evidence["selfcheck"]["check_id"] == second.id
    assert still.evidence["selfcheck"]["outcome"].startswith("kept out, no verdict")
    events = [e.event for e in h.events(alert.id)]
    assert events.count("selfcheck.inconclusive") == 1  # once retries are spent, not before
    assert h.metric("minder_selfchecks_total", state="inconclusive") == 2.0


def test_a_hanging_check_times_out_and_is_cancelled(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=lambda launch: Run(hang=True), retries=0, timeout_s=120)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(3)
    (check,) = h.checks()
    assert check.state is SelfCheckState.RUNNING
    h.clock.advance(121)
    h.settle(2)
    (check,) = h.checks()
    assert check.state is SelfCheckState.TIMED_OUT and "no verdict within 120 s" in check.detail
    assert h.scheduler.cancelled == [check.scheduler_ref.split(":")[0]]  # type: ignore[union-attr]
    assert [a.outcome for a in h.audit(alert.id, "selfcheck_cancel")] == ["applied"]
    assert h.scheduler.nodes["n03"].drained and h.alert(alert.id).status is AlertStatus.OPEN
    assert [e.event for e in h.events(alert.id)][-1] == "selfcheck.inconclusive"
    assert h.metric("minder_selfchecks_total", state="timed_out") == 1.0


def test_a_check_that_crashes_without_a_report_is_inconclusive(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=lambda launch: Run(exit=LaunchState.FAILED), retries=0,
                report_grace_s=10)  # fmt: skip
    h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(4, step_s=1.0)
    (check,) = h.checks()
    assert check.state is SelfCheckState.RUNNING  # within the grace: a report may still come
    h.settle(12, step_s=1.0)
    (check,) = h.checks()
    assert check.state is SelfCheckState.INCONCLUSIVE
    assert "the check exited without a report: failed (exit code 1)" in check.detail


@pytest.mark.parametrize(("linger", "cancelled"), [(3, False), (1000, True)])
def test_a_reported_check_is_left_to_exit_within_the_grace(
    tmp_path: Path, linger: int, cancelled: bool
) -> None:
    """After its report, a check's job (its partners still finishing) ends by itself if it does
    within ``report_grace_s``; past it, the release cancels it."""
    h = Harness(tmp_path, runner=lambda launch: Run(report=report(launch), linger=linger),
                report_grace_s=10)  # fmt: skip
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(4)
    (check,) = h.checks()
    assert check.state is SelfCheckState.PASSED
    assert h.alert(alert.id).status is AlertStatus.OPEN  # not applied while the job ends
    h.settle(12)
    assert h.alert(alert.id).status is AlertStatus.CLEARED_BY_SELFCHECK
    (job,) = h.scheduler.checks.values()
    assert bool(h.scheduler.cancelled) is cancelled
    assert job.state is (LaunchState.FAILED if cancelled else LaunchState.SUCCEEDED)


def test_a_forged_report_is_refused_and_the_check_stays_without_verdict(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=lambda launch: Run(report=report(launch), token="forged"),
                retries=0, report_grace_s=5)  # fmt: skip
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(12)
    assert len(h.refused) == 1 and isinstance(h.refused[0], SelfCheckTokenError)
    (check,) = h.checks()
    assert check.state is SelfCheckState.INCONCLUSIVE and check.report is None
    assert h.scheduler.nodes["n03"].drained and h.alert(alert.id).status is AlertStatus.OPEN


def test_a_node_that_failed_twice_gets_no_third_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, runner=failing, max_failures_per_node=2)
    # a person's close is stamped with the wall time: the test's clock here
    monkeypatch.setattr(minder.storage.alerts, "time", SimpleNamespace(time=h.clock))
    first = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle()
    assert h.alert(first.id).status is AlertStatus.CONFIRMED
    with h.sessions.begin() as session:
        request_selfcheck(session, first.id, by="ana", now=h.clock())
    h.settle()  # fails again: two failures, and no person closed an alert of n03
    # someone returns the node by hand, leaving the alert confirmed; it fails a new job
    assert h.scheduler.undo("n03", alert_id=first.id).changed
    h.scheduler.run_job("j2", ["n03"])
    alert = h.raise_alert("n03", job="j2")
    h.scheduler.end_job("j2")
    h.settle()
    assert len(h.checks()) == 2 and len(h.scheduler.launched) == 2
    assert h.scheduler.nodes["n03"].drained  # out until a person acts
    assert h.alert(alert.id).status is AlertStatus.OPEN
    (skip,) = h.audit(alert.id, "selfcheck_skip")
    assert skip.outcome == "skipped_policy"
    assert "n03 failed 2 self-check(s)" in skip.detail and "until a person acts" in skip.detail
    # the notification destinations hear of it, with the reason
    (event,) = [e for e in h.events(alert.id) if e.event == "selfcheck.inconclusive"]
    selfcheck = event.payload["data"]["selfcheck"]
    assert selfcheck["state"] == "skipped" and selfcheck["reason"] == skip.detail
    assert h.alert(alert.id).evidence["selfcheck"]["failures"] == 2
    h.settle()  # audited and notified once, not every pass
    assert len(h.audit(alert.id, "selfcheck_skip")) == 1
    assert [e.event for e in h.events(alert.id)].count("selfcheck.inconclusive") == 1
    # a person repairs the node and closes its alerts: its next fault is checked again
    h.close(first, AlertStatus.RESOLVED)
    h.close(alert, AlertStatus.RESOLVED)  # returns the node
    assert not h.scheduler.nodes["n03"].drained
    h.clock.advance(1)
    h.scheduler.run_job("j3", ["n03"])
    third = h.raise_alert("n03", job="j3")
    h.scheduler.end_job("j3")
    h.settle()
    assert len(h.checks()) == 3 and h.audit(third.id, "selfcheck_skip") == []
    assert h.checks(alert_id=third.id)[0].state is SelfCheckState.FAILED
    assert h.alert(third.id).status is AlertStatus.CONFIRMED


def test_a_launch_that_stops_midway_releases_what_it_created(tmp_path: Path) -> None:
    h = Harness(tmp_path, retries=0, partners=1)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.scheduler.fail_after_hold = ActionError("sbatch: error: Batch job submission failed",
                                              transient=False)  # fmt: skip
    h.settle(3)
    (check,) = h.checks()
    assert check.state is SelfCheckState.INCONCLUSIVE and "sbatch: error" in check.detail
    # the reservation the launch made before it failed is gone; the node stays out, Minder's
    assert check.scheduler_ref == h.scheduler.ref_for(check.id)
    assert [(ref, node, passed) for ref, node, passed in h.scheduler.releases] == [
        (h.scheduler.ref_for(check.id), "n03", False)
    ]
    assert all(n.reservation is None for n in h.scheduler.nodes.values())
    assert h.scheduler.nodes["n03"].drained
    assert h.scheduler.nodes["n03"].reason.startswith(f"minder:{alert.id}")
    assert h.alert(alert.id).status is AlertStatus.OPEN


def test_a_transient_launch_failure_releases_its_hold_before_the_retry(tmp_path: Path) -> None:
    h = Harness(tmp_path, partners=1)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.scheduler.fail_after_hold = ActionError("slurmctld not responding", transient=True)
    h.service.run_once()
    (check,) = h.checks()
    assert check.state is SelfCheckState.PENDING and check.scheduler_ref is None
    assert all(n.reservation is None for n in h.scheduler.nodes.values())
    h.settle()
    (check,) = h.checks()
    assert check.state is SelfCheckState.PASSED
    assert h.alert(alert.id).status is AlertStatus.CLEARED_BY_SELFCHECK


def test_the_node_gets_a_shorter_budget_than_the_service_waits(tmp_path: Path) -> None:
    assert node_budget_s(600) == 480.0 and node_budget_s(40) == 30.0
    h = Harness(tmp_path, timeout_s=900, partners=0)
    h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle()
    (launch,) = h.scheduler.launched
    assert launch.env["MINDER_SELFCHECK_TIMEOUT_S"] == "735"
    assert launch.timeout_s == 900


def test_no_more_than_max_concurrent_checks_run(tmp_path: Path, database_url: str) -> None:
    hang = {"on": True}
    h = Harness(tmp_path, database_url=database_url, runner=lambda launch: Run(hang=True) if hang["on"] else passing(launch),
                max_concurrent=2, partners=0, max_per_job=8)  # fmt: skip
    alerts = [h.raise_alert(node) for node in ("n02", "n03", "n04")]
    h.scheduler.end_job("j")
    h.settle(4)
    states = [c.state for c in h.checks()]
    assert states.count(SelfCheckState.RUNNING) == 2 and states.count(SelfCheckState.PENDING) == 1
    (waiting,) = h.checks(state="pending")
    assert waiting.detail == "waiting for a slot: 2 of 2 checks running"
    assert h.metric("minder_selfchecks_in_progress", target="slurm") == 3.0
    hang["on"] = False
    h.settle(8)
    assert [c.state for c in h.checks()] == [SelfCheckState.PASSED] * 3
    assert all(h.alert(a.id).status is AlertStatus.CLEARED_BY_SELFCHECK for a in alerts)


def test_the_breaker_counts_returns(tmp_path: Path, database_url: str) -> None:
    # n03 and n04 drained an hour ago (outside the window), n05 now: their returns count
    h = Harness(tmp_path, database_url=database_url, max_per_job=2, partners=0, window_s=60)
    first, second = h.raise_alert("n03"), h.raise_alert("n04")
    h.settle(2)  # the checks wait for the job to leave the nodes
    h.clock.advance(120)
    third = h.raise_alert("n05")
    h.scheduler.end_job("j")
    h.settle(8)
    assert [c.state for c in h.checks()] == [SelfCheckState.PASSED] * 3
    with h.sessions() as session:
        breaker = get_breaker(session, BREAKER)
    # n05's drain + one older node's return = 2; the other's would be the third change of j
    assert breaker.tripped and "3 returns and drains of job j" in (breaker.reason or "")
    statuses = {a.id: h.alert(a.id).status for a in (first, second, third)}
    # which of the older two came back first depends on the apply order; not both
    assert [statuses[a.id] for a in (first, second)].count(AlertStatus.OPEN) >= 1
    kept_out = [a for a in (first, second, third) if statuses[a.id] is AlertStatus.OPEN]
    for alert in kept_out:
        kept = h.alert(alert.id)
        assert h.scheduler.nodes[alert.machine].drained
        outcome = kept.evidence["selfcheck"]["outcome"]
        assert "passed, but kept out: circuit breaker tripped" in outcome
        assert [e.event for e in h.events(alert.id)][-1] == "selfcheck.inconclusive"
        resumes = h.audit(alert.id, "selfcheck_resume")
        assert [r.outcome for r in resumes] == ["skipped_breaker"]
    assert [e.event for e in h.events()].count("breaker.tripped") == 1


def test_the_default_breaker_lets_a_drained_node_come_back(tmp_path: Path) -> None:
    # the default bounds on 8 watched machines: one change per hour (2 % of 8, at least 1);
    # the node out and back for the same alert is that one change
    policy = ActionPolicy(enforce=True, act_on={"rule": 0.0})
    assert policy.fleet_bound(len(JOB_NODES)) == 1
    h = Harness(tmp_path, action_policy=policy, partners=0)
    alert = h.raise_alert("n03")
    assert h.scheduler.nodes["n03"].drained
    h.scheduler.end_job("j")
    h.settle()
    (check,) = h.checks()
    assert check.state is SelfCheckState.PASSED and check.returned_ts is not None
    assert h.alert(alert.id).status is AlertStatus.CLEARED_BY_SELFCHECK
    assert not h.scheduler.nodes["n03"].drained
    with h.sessions() as session:
        assert not get_breaker(session, BREAKER).tripped
    assert [r.outcome for r in h.audit(alert.id, "selfcheck_resume")] == ["started", "applied"]


def test_the_default_breaker_still_bounds_returns_of_older_drains(tmp_path: Path) -> None:
    policy = ActionPolicy(enforce=True, act_on={"rule": 0.0}, window_s=60)
    h = Harness(tmp_path, action_policy=policy, partners=0)
    old = h.raise_alert("n03")
    h.settle(2)  # waits for job j to leave the node
    h.clock.advance(120)  # n03's drain leaves the window
    h.scheduler.run_job("j2", ["n09"])
    new = h.raise_alert("n09", job="j2")  # the one change of this window
    assert h.scheduler.nodes["n09"].drained
    h.scheduler.end_job("j")
    h.settle()
    with h.sessions() as session:
        breaker = get_breaker(session, BREAKER)
    assert breaker.tripped and "2 returns and drains within 60 s" in (breaker.reason or "")
    assert h.scheduler.nodes["n03"].drained
    assert [r.outcome for r in h.audit(old.id, "selfcheck_resume")] == ["skipped_breaker"]
    assert h.alert(new.id).status is AlertStatus.OPEN


def test_a_return_counts_against_later_drains(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_per_job=2, partners=0, window_s=60)
    first = h.raise_alert("n03")
    h.settle(2)
    h.clock.advance(120)  # the drain leaves the window, the return comes in it
    h.scheduler.end_job("j")
    h.settle()
    assert h.alert(first.id).status is AlertStatus.CLEARED_BY_SELFCHECK  # 1 return
    h.scheduler.run_job("j", ["n05", "n06"])
    h.raise_alert("n05")  # 1 return + 1 drain of job j
    second = h.raise_alert("n06")  # a third change of job j within the window
    assert h.scheduler.nodes["n05"].drained and not h.scheduler.nodes["n06"].drained
    assert [a.outcome for a in h.audit(second.id, "drain")] == ["skipped_breaker"]


def test_a_person_closing_the_alert_cancels_its_check(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=lambda launch: Run(hang=True))
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(3)
    (running,) = h.checks()
    assert running.state is SelfCheckState.RUNNING
    h.close(alert, AlertStatus.FALSE_POSITIVE)  # the executor's undo returns the node
    h.settle(2)
    (check,) = h.checks()
    assert check.state is SelfCheckState.CANCELLED
    assert check.detail == "cancelled: the alert was false_positive by a person"
    assert len(h.scheduler.cancelled) == 1
    assert all(n.reservation is None for n in h.scheduler.nodes.values())
    assert not h.scheduler.nodes["n03"].drained
    assert h.alert(alert.id).status is AlertStatus.FALSE_POSITIVE
    assert [a.operation for a in h.audit(alert.id)][-2:] == ["selfcheck_cancel",
                                                            "selfcheck_release"]  # fmt: skip
    assert h.metric("minder_selfchecks_total", state="cancelled") == 1.0


def test_an_operators_cancel_keeps_the_node_out(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=lambda launch: Run(hang=True))
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(3)
    (running,) = h.checks()
    with h.sessions.begin() as session:
        cancel_selfcheck(session, running.id, by="ana", now=h.clock())
    h.settle(2)
    assert len(h.scheduler.cancelled) == 1 and h.scheduler.nodes["n03"].drained
    assert h.alert(alert.id).status is AlertStatus.OPEN
    assert [a.outcome for a in h.audit(alert.id, "selfcheck_keep")] == ["unchanged"]


def test_a_node_still_running_its_job_waits_then_gives_up(tmp_path: Path) -> None:
    h = Harness(tmp_path, retries=0, ready_timeout_s=600)
    alert = h.raise_alert("n03")  # job j goes on running there: DRAINING
    h.settle(2)
    (check,) = h.checks()
    assert check.state is SelfCheckState.PENDING
    assert check.detail == "waiting for the node: n03 still runs job(s) j (DRAINING)"
    h.clock.advance(601)
    h.settle(2)
    (check,) = h.checks()
    assert check.state is SelfCheckState.INCONCLUSIVE
    assert "the node was not ready for a check within 600 s: n03 still runs" in check.detail
    assert h.scheduler.launched == [] and h.scheduler.nodes["n03"].drained
    assert [e.event for e in h.events(alert.id)][-1] == "selfcheck.inconclusive"


def test_dry_run_only_audits_what_it_would_check(tmp_path: Path) -> None:
    h = Harness(tmp_path, enforce=False)
    alert = h.raise_alert("n03")
    assert not h.scheduler.nodes["n03"].drained  # the executor's own dry run
    h.settle(3)
    assert h.checks() == [] and h.scheduler.launched == []
    (audited,) = h.audit(alert.id, "selfcheck_launch")
    assert (audited.mode, audited.outcome) == ("dry_run", "dry_run")
    assert audited.detail.startswith("dry run: would check node n03")
    assert h.alert(alert.id).status is AlertStatus.OPEN


def test_a_restarted_service_finishes_the_check_it_launched(
    tmp_path: Path, database_url: str
) -> None:
    h = Harness(tmp_path, database_url=database_url, runner=lambda launch: Run(hang=True))
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle(2)
    (running,) = h.checks()
    assert running.state is SelfCheckState.RUNNING and running.scheduler_ref is not None
    # the process stops; its successor knows only the database (and the token's digest in it)
    h.service = h.new_service()
    h.runner = passing
    h.settle(3)
    (check,) = h.checks()
    assert check.id == running.id and check.state is SelfCheckState.PASSED
    assert h.refused == [] and len(h.scheduler.launched) == 1
    assert h.alert(alert.id).status is AlertStatus.CLEARED_BY_SELFCHECK
    assert not h.scheduler.nodes["n03"].drained


def test_an_operator_may_ask_again_for_a_confirmed_node(tmp_path: Path) -> None:
    h = Harness(tmp_path, runner=failing)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")
    h.settle()
    assert h.alert(alert.id).status is AlertStatus.CONFIRMED
    h.runner = passing  # repaired
    with h.sessions.begin() as session:
        asked = request_selfcheck(session, alert.id, by="ana", now=h.clock())
    assert asked.attempt == 2
    h.settle()
    assert h.alert(alert.id).status is AlertStatus.CLEARED_BY_SELFCHECK
    assert not h.scheduler.nodes["n03"].drained


def test_a_launcher_that_breaks_makes_its_check_inconclusive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(tmp_path, retries=0)
    alert = h.raise_alert("n03")
    h.scheduler.end_job("j")

    def broken(launch: CheckLaunch) -> str:
        raise RuntimeError("sbatch printed something unexpected")

    monkeypatch.setattr(h.scheduler, "launch", broken)
    h.settle(2)
    (check,) = h.checks()
    assert check.state is SelfCheckState.INCONCLUSIVE
    assert "the launch failed: RuntimeError: sbatch printed something unexpected" in check.detail
    assert h.scheduler.nodes["n03"].drained and h.alert(alert.id).status is AlertStatus.OPEN
