"""Hang alerts and the action policy: a culprit machine's ``hang`` alert acts at once (log-only
by default), the job-level one (no machine) never acts, asks the scheduler nothing and raises no
``suspicious_source`` alert."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from minder.actions.base import ActionOutcome
from minder.actions.executor import ActionExecutor, ActionMetrics
from minder.actions.policy import DEFAULT_ACT_ON, ActionPolicy
from minder.config import ActionSettings
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.delivery.worker import Backoff, DeliveryWorker
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database
from minder.storage.actions import list_audit
from minder.storage.alerts import list_alerts
from minder.storage.jobs import upsert_job_machines
from minder.storage.outbox import (
    AlertEvent,
    Destination,
    change_alert_status,
    record_alert_with_events,
)
from minder.storage.records import MachineInfo

FAST = Backoff(base_s=0.01, cap_s=0.05, floor_s=0.01)
NOTIFY = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))
NODES = frozenset(f"j-n{i:04d}" for i in range(8))


@dataclass
class Scheduler:
    """Runs job ``j`` on :data:`NODES`; records checks, applies and undos."""

    name: str = "slurm"
    checked: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        self.checked.append(job_id)
        return NODES if job_id == "j" else None

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        self.applied.append(node)
        return ActionOutcome(self.name, node, "drain", True, f"drained {node}: {reason}")

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        self.undone.append(node)
        return ActionOutcome(self.name, node, "resume", True, f"resumed {node}")


class Harness:
    def __init__(self, tmp_path: Path, policy: ActionPolicy) -> None:
        engine = create_engine_for(f"sqlite:///{tmp_path / 'actions.db'}")
        upgrade_database(engine)
        self.sessions: SessionFactory = session_factory(engine)
        with self.sessions.begin() as session:
            upsert_job_machines(session, "j", [MachineInfo(n) for n in sorted(NODES)], 1.0)
        self.scheduler = Scheduler()
        executor = ActionExecutor(
            self.scheduler,
            policy,
            self.sessions,
            notify=[NOTIFY],
            metrics=ActionMetrics(CollectorRegistry()),
        )
        self.destinations = [executor.destination_spec(), NOTIFY]
        self.worker = DeliveryWorker(executor, self.sessions, backoff=FAST)

    def hang(self, machine: str) -> Alert:
        evidence = {"culprit_ranks": [5], "culprit_machines": ["j-n0002"]}
        alert = Alert(job="j", machine=machine, kind=AlertKind.HANG, metric="hang", score=1.0,
                      first_ts=1000.0, detected_ts=1001.0, evidence=evidence)  # fmt: skip
        with self.sessions.begin() as session:
            stored, _ = record_alert_with_events(session, alert, self.destinations)
        return stored

    def resolve(self, alert: Alert) -> None:
        with self.sessions.begin() as session:
            change_alert_status(session, alert.id, AlertStatus.RESOLVED, self.destinations)

    def run(self) -> None:
        for _ in range(3):
            self.worker.run_once()

    def audit(self) -> list[tuple[str, str, str, str]]:
        with self.sessions() as session:
            entries, _ = list_audit(session, limit=100)
        return [(e.machine or "", e.operation, e.outcome, e.detail) for e in reversed(entries)]


def test_hang_acts_at_once_by_default_and_the_settings_agree() -> None:
    assert DEFAULT_ACT_ON["hang"] == 0.0
    assert ActionPolicy().act_on["hang"] == 0.0
    assert ActionSettings().act_on.get("hang") == DEFAULT_ACT_ON["hang"], (
        "minder/config.py ActionSettings.act_on must default to DEFAULT_ACT_ON"
    )


def test_a_culprits_hang_alert_drains_its_node_and_the_job_level_one_never_acts(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, ActionPolicy(enforce=True))
    job_level = h.hang("")
    culprit = h.hang("j-n0002")
    h.run()
    assert h.scheduler.applied == ["j-n0002"]
    assert h.scheduler.checked == ["j"]  # the job-level alert asked the scheduler nothing
    trail = [t for t in h.audit() if t[2] != "started"]
    assert [(m, op, outcome) for m, op, outcome, _ in trail] == [
        ("", "drain", "skipped_policy"),
        ("j-n0002", "drain", "applied"),
    ]
    assert "job-level hang alert: it names no one machine" in trail[0][3]
    with h.sessions() as session:
        assert list_alerts(session, kind="suspicious_source")[1] == 0
    h.resolve(job_level)
    h.resolve(culprit)
    h.run()
    assert h.scheduler.undone == ["j-n0002"]
    assert h.audit()[-2][:3] == ("", "resume", "skipped_policy")  # nothing to undo for it


def test_log_only_by_default(tmp_path: Path) -> None:
    h = Harness(tmp_path, ActionPolicy())
    h.hang("j-n0003")
    h.run()
    assert h.scheduler.applied == []
    [(machine, operation, outcome, detail)] = h.audit()
    assert (machine, operation, outcome) == ("j-n0003", "drain", "dry_run")
    assert detail.startswith("dry run: would drain j-n0003 (hang hang)")


def test_why_not_names_the_reason() -> None:
    policy = ActionPolicy()
    alert = Alert(job="j", machine="", kind=AlertKind.HANG, metric="hang", score=1.0,
                  first_ts=1.0, detected_ts=1.0)  # fmt: skip
    assert policy.why_not(alert) == (
        "job-level hang alert: it names no one machine; the machines the hang waits on have "
        "hang alerts of their own, and those act"
    )
    rule = Alert(job="j", machine="", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                 first_ts=1.0, detected_ts=1.0)  # fmt: skip
    assert policy.why_not(rule) == "rule alert names no machine: nothing to take out"
    culprit = Alert(job="j", machine="n1", kind=AlertKind.HANG, metric="hang", score=1.0,
                    first_ts=1.0, detected_ts=1.0)  # fmt: skip
    assert policy.why_not(culprit) is None
    assert ActionPolicy(act_on={"rule": 0}).why_not(culprit) == (
        "hang alerts only notify (acting kinds: rule)"
    )


def test_act_on_takes_hang_and_names_every_kind_when_refusing() -> None:
    assert ActionPolicy(act_on={"hang": 30}).act_on == {"hang": 30}
    with pytest.raises(ValidationError, match="expected rule, similarity, straggler, silence or "
                       "hang"):  # fmt: skip
        ActionPolicy(act_on={"hung": 0})
