"""The self-check loop end to end on a real one-host Slurm cluster (munged, slurmctld, one slurmd
per node: tests/minder/actions/slurm_cluster.py), with nothing faked:

an injected fault (an alert on a node that runs a Slurm job) → the actions executor drains the
node → the job dies → the self-check service decides a check, the Slurm launcher holds the node in
a ``MAINT`` reservation and submits ``minder selfcheck run`` on it and two idle partners (the
collective over gloo, the CPU matmul) → the suspect posts its report to Minder's real API with the
check's token → the service returns the node to ``IDLE`` and clears the alert (pass), or keeps it
``DRAIN`` and confirms the alert (a matmul baseline no CPU reaches).

``SELFCHECK_E2E_RUNS`` (default 1) repeats the passing cycle to measure the drain-to-return time;
the figures are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from slurm_cluster import ONE_HOST_COLLECTIVE, SlurmCluster, skip_reason

from minder.actions.executor import ActionExecutor
from minder.actions.policy import ActionPolicy, SelfCheckPolicy
from minder.actions.selfcheck import LauncherOptions
from minder.actions.slurm import SlurmActuator
from minder.actions.slurm_selfcheck import SlurmSelfCheckLauncher, parse_ref
from minder.api.app import create_app
from minder.api.server import ApiServer, ServerLimits, api_server
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.selfcheck import FINAL_STATES, SelfCheckRecord, SelfCheckState
from minder.delivery.worker import Backoff, DeliveryWorker
from minder.service.selfcheck import SelfCheckMetrics, SelfCheckService
from minder.storage import (
    SessionFactory,
    create_engine_for,
    session_factory,
    upgrade_database,
)
from minder.storage.alerts import get_alert
from minder.storage.jobs import upsert_job_machines
from minder.storage.outbox import (
    AlertEvent,
    Destination,
    list_deliveries,
    record_alert_with_events,
)
from minder.storage.records import MachineInfo
from minder.storage.selfchecks import applied_ts_of, list_selfchecks
from minder.stream import free_port

pytestmark = [pytest.mark.slow]

NODES = ("sce-n01", "sce-n02", "sce-n03", "sce-n04")
SUSPECT = NODES[0]
NOTIFY = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))
CHECKS = ("collective.allreduce", "gpu.matmul", "host.disk")
HEALTHY_BASELINES = {"no such device model": 1.0}
"""No baseline for the CPU: its matmul passes with its figure."""
FAILING_BASELINES = {"cpu": 1_000_000.0}
"""A CPU matmul baseline no machine reaches: the check fails."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(nodes=NODES, cluster_name="minder-sce") as started:
        yield started


@contextmanager
def serving(server: ApiServer) -> Iterator[None]:
    thread = threading.Thread(target=server.run, name="e2e-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)


class Loop:
    """Minder's service parts on the cluster: the executor and its outbox worker, the API, the
    self-check service (each in its thread, as ``minder serve`` runs them)."""

    def __init__(self, cluster: SlurmCluster, tmp_path: Path) -> None:
        self.cluster = cluster
        engine = create_engine_for(f"sqlite:///{tmp_path / 'minder.db'}")
        upgrade_database(engine)
        self.sessions: SessionFactory = session_factory(engine)
        with self.sessions.begin() as session:  # the watched fleet: the breaker's fleet bound
            fleet = [MachineInfo(f"gpu-{i:03d}", "", "") for i in range(100)]
            upsert_job_machines(session, "fleet", fleet, time.time())
        actuator = SlurmActuator(scontrol=cluster.scontrol_path, slurm_conf=cluster.conf_path)
        action_policy = ActionPolicy(
            enforce=True, act_on={"rule": 0.0}, max_per_job=1000, max_fraction=1.0
        )
        self.executor = ActionExecutor(actuator, action_policy, self.sessions, notify=[NOTIFY])
        self.destinations = [self.executor.destination_spec(), NOTIFY]
        self.worker = DeliveryWorker(
            self.executor, self.sessions, backoff=Backoff(0.2, 2.0, 0.1), idle_s=0.2
        )
        work_dir = tmp_path / "jobs"
        work_dir.mkdir()
        work_dir.chmod(0o777)
        launcher = SlurmSelfCheckLauncher(
            actuator, LauncherOptions(master_port=free_port()), work_dir=str(work_dir)
        )
        self.baselines = tmp_path / "baselines.json"
        self.baselines.write_text(json.dumps(HEALTHY_BASELINES))
        self.port = free_port()
        minder = Path(sys.executable).with_name("minder")
        checks = [part for name in CHECKS for part in ("--check", name)]
        self.policy = SelfCheckPolicy(
            report_url=f"http://127.0.0.1:{self.port}",
            enforce=True,
            kinds=frozenset({"rule"}),
            partners=2,
            command=(
                *ONE_HOST_COLLECTIVE,
                str(minder),
                "selfcheck",
                "run",
                *checks,
                "--baseline-file",
                str(self.baselines),
                "--format",
                "json",
            ),
            timeout_s=300.0,
            report_grace_s=10.0,
            interval_s=0.5,
        )
        self.registry = CollectorRegistry()
        self.service = SelfCheckService(
            launcher,
            self.policy,
            action_policy,
            self.sessions,
            destinations=self.destinations,
            metrics=SelfCheckMetrics(self.registry),
            on_enqueued=self.worker.wake,
        )
        self.executor.on_applied = self.service.wake
        self.executor.on_enqueued = self.worker.wake
        app = create_app(
            self.sessions,
            registry=CollectorRegistry(),
            allowed_hosts=["127.0.0.1"],
            destinations=self.destinations,
            on_enqueued=self.worker.wake,
            selfcheck_wake=self.service.wake,
        )
        self.server = api_server(app, host="127.0.0.1", port=self.port, limits=ServerLimits(64))
        self.runs = 0

    @contextmanager
    def running(self) -> Iterator[Loop]:
        with serving(self.server):
            self.worker.start()
            self.service.start()
            try:
                yield self
            finally:
                self.service.stop()
                self.worker.stop()

    def fault(self, *, failing: bool) -> tuple[Alert, SelfCheckRecord]:
        """One cycle: a job on the suspect, a fault reported on it, the job dies; until the
        check's verdict is applied. Returns the alert and its check."""
        self.baselines.write_text(json.dumps(FAILING_BASELINES if failing else HEALTHY_BASELINES))
        job_id = self.cluster.submit_sleep(SUSPECT, 600)
        self.runs += 1
        now = time.time()
        alert = Alert(job=job_id, machine=SUSPECT, kind=AlertKind.RULE, metric="gpu_xid_count",
                      score=1.0, first_ts=now, detected_ts=now,
                      evidence={"rule": "event:xid", "code": 79})  # fmt: skip
        with self.sessions.begin() as session:
            stored, _ = record_alert_with_events(session, alert, self.destinations)
        self.worker.wake()
        self.cluster.wait_for_state(SUSPECT, lambda flags: "DRAIN" in flags, timeout_s=60)
        self.cluster.cancel_job(job_id)  # the fault killed the job
        record = wait_for(lambda: self._applied(stored.id), 300, f"the check of {stored.id}")
        return stored, record

    def _applied(self, alert_id: str) -> SelfCheckRecord | None:
        with self.sessions() as session:
            records, _ = list_selfchecks(session, alert_id=alert_id)
            for record in records:
                if record.state in FINAL_STATES and applied_ts_of(session, record.id) is not None:
                    return record
        return None

    def alert(self, alert_id: str) -> Alert:
        with self.sessions() as session:
            return get_alert(session, alert_id)


def wait_for(
    found: Callable[[], SelfCheckRecord | None], timeout_s: float, what: str
) -> SelfCheckRecord:
    deadline = time.monotonic() + timeout_s
    while True:
        result = found()
        if result is not None:
            return result
        assert time.monotonic() < deadline, f"{what}: not done within {timeout_s:.0f} s"
        time.sleep(0.3)


def test_a_healthy_node_returns_and_a_failing_one_stays_out(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    runs = int(os.environ.get("SELFCHECK_E2E_RUNS", "1"))
    loop = Loop(cluster, tmp_path)
    drain_to_return: list[float] = []
    with loop.running():
        for _ in range(runs):
            alert, check = loop.fault(failing=False)
            assert check.state is SelfCheckState.PASSED, check.detail
            assert check.report is not None and check.report.verdict.value == "pass"
            assert check.partners == NODES[1:3]
            job_id, reservation = parse_ref(check.scheduler_ref or "")
            assert cluster.job_state(job_id) == "COMPLETED"  # the check really ran there
            flags, reason = cluster.wait_idle(SUSPECT, timeout_s=60)
            assert flags == {"IDLE"} and reason == ""
            assert reservation not in cluster.reservations()
            cleared = loop.alert(alert.id)
            assert cleared.status is AlertStatus.CLEARED_BY_SELFCHECK
            assert cleared.evidence["selfcheck"]["verdict"] == "pass"
            assert check.returned_ts is not None and check.drained_ts is not None
            drain_to_return.append(check.returned_ts - check.drained_ts)

        alert, check = loop.fault(failing=True)
        assert check.state is SelfCheckState.FAILED, check.detail
        assert check.report is not None and check.report.failing() == ["gpu.matmul"]
        job_id, reservation = parse_ref(check.scheduler_ref or "")
        assert cluster.job_state(job_id) == "FAILED"  # minder selfcheck run exits 1 on a fail
        flags, reason = cluster.node_state(SUSPECT)
        assert "DRAIN" in flags and reason.startswith(f"minder:{alert.id}")
        assert reservation not in cluster.reservations()
        confirmed = loop.alert(alert.id)
        assert confirmed.status is AlertStatus.CONFIRMED
        evidence = confirmed.evidence["selfcheck"]
        assert evidence["failing"] == ["gpu.matmul"] and "measurements" in evidence
        with loop.sessions() as session:
            events = [d.event for d in list_deliveries(session, destination=NOTIFY.name,
                                                       alert_id=alert.id, limit=50)[0]]  # fmt: skip
        assert "alert.confirmed" in events
    cluster.scontrol("update", f"NodeName={SUSPECT}", "State=RESUME", check=False)
    print(
        f"\ndrain-to-return over {len(drain_to_return)} run(s): median "
        f"{statistics.median(drain_to_return):.1f} s, min {min(drain_to_return):.1f} s, "
        f"max {max(drain_to_return):.1f} s; all: " + ", ".join(f"{v:.1f}" for v in drain_to_return)
    )
