"""The SQL state store: alerts with their outbox rows in one transaction, dedup, open alerts
that survive a restart, jobs and scores."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.service.engine import DetectionService, JobSnapshot, MachineSnapshot
from minder.service.sinks import SqlStateStore
from minder.storage import create_engine_for, session_factory, upgrade_database
from minder.storage.alerts import list_alerts
from minder.storage.jobs import current_scores, list_machines
from minder.storage.outbox import AlertEvent, Destination, change_alert_status, list_deliveries

DESTINATIONS = [
    Destination("kafka", frozenset(e.value for e in AlertEvent)),
    Destination("webhook:ops", frozenset({"alert.opened", "alert.resolved"})),
]


def _alert(kind: AlertKind = AlertKind.RULE, metric: str = "gpu_xid_count",
           machine: str = "n1", first_ts: float = 100.0) -> Alert:  # fmt: skip
    return Alert(job="j", machine=machine, kind=kind, metric=metric, score=1.0,
                 first_ts=first_ts, detected_ts=first_ts + 2, devices=("gpu3",))  # fmt: skip


def _store(tmp_path: Path) -> SqlStateStore:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade_database(engine)
    return SqlStateStore(session_factory(engine), DESTINATIONS)


def test_store_dedups_so_the_service_raises_a_fault_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    sessions = store.sessions
    seen: list[Alert] = []

    class Collect:
        name = "collect"

        def deliver(self, alert: Alert) -> None:
            seen.append(alert)

    service = DetectionService(lambda: None, store=store, sinks=[Collect()])  # type: ignore[arg-type,return-value]
    first = service._deliver(_alert())
    again = service._deliver(_alert())  # the same fault reported again (e.g. after a replay)
    assert first is not None and again is None and len(seen) == 1
    store.save_job(
        JobSnapshot(
            job="j",
            ts=100.0,
            machines=[
                MachineSnapshot(
                    "n1",
                    "pp0",
                    "leaf-1",
                    99.0,
                    7.5,
                    "gpu_power_watts",
                    "gpu3",
                    {"gpu_power_watts": (7.5, "gpu3"), "cpu_util_ratio": (0.4, "")},
                ),
                MachineSnapshot("n2", "pp0", "leaf-1", 99.0, 0.0, "", "", {}),
            ],
        )
    )
    with sessions() as session:
        alerts, total = list_alerts(session, job="j")
        machines = {m.name: m for m in list_machines(session, "j")}
        scores = current_scores(session, "j")
    assert total == 1 and alerts[0].id == first.id
    assert machines["n1"].top_metric == "gpu_power_watts" and machines["n1"].top_device == "gpu3"
    assert {(s.machine, s.metric) for s in scores} == {
        ("n1", "gpu_power_watts"),
        ("n1", "cpu_util_ratio"),
    }


def test_a_new_alert_and_its_outbox_rows_commit_together(tmp_path: Path) -> None:
    store = _store(tmp_path)
    woken: list[int] = []
    store.on_enqueued = lambda: woken.append(1)
    stored, created = store.record_alert(_alert())
    again, created_again = store.record_alert(_alert())
    assert created and not created_again and again.id == stored.id
    with store.sessions() as session:
        rows, total = list_deliveries(session)
    assert total == 2 and woken == [1]
    assert {(r.destination, r.event, r.alert_id) for r in rows} == {
        ("kafka", "alert.opened", stored.id),
        ("webhook:ops", "alert.opened", stored.id),
    }
    assert rows[0].payload["type"] == "alert.opened"
    assert rows[0].payload["data"]["alert"]["machine"] == "n1"
    assert len({r.delivery_id for r in rows}) == 2


def test_status_changes_enqueue_only_the_destinations_that_take_them(tmp_path: Path) -> None:
    store = _store(tmp_path)
    stored, _ = store.record_alert(_alert())
    with store.sessions.begin() as session:
        change_alert_status(session, stored.id, AlertStatus.ACKNOWLEDGED, DESTINATIONS, by="ana")
        change_alert_status(session, stored.id, AlertStatus.RESOLVED, DESTINATIONS, by="ana")
        # the same status again is no transition: no event
        change_alert_status(session, stored.id, AlertStatus.RESOLVED, DESTINATIONS, by="ana")
    with store.sessions() as session:
        rows, _ = list_deliveries(session, limit=50)
    events = sorted((r.destination, r.event) for r in rows)
    assert events == [
        ("kafka", "alert.acknowledged"),
        ("kafka", "alert.opened"),
        ("kafka", "alert.resolved"),
        ("webhook:ops", "alert.opened"),
        ("webhook:ops", "alert.resolved"),
    ]
    resolved = next(r for r in rows if r.event == "alert.resolved")
    assert resolved.payload["data"]["changed_by"] == "ana"
    assert resolved.payload["data"]["previous_status"] == "acknowledged"


def test_a_restarted_service_does_not_alert_an_alerted_machine_again(tmp_path: Path) -> None:
    store = _store(tmp_path)
    first = DetectionService(lambda: None, store=store)  # type: ignore[arg-type,return-value]
    assert first._deliver(_alert()) is not None
    # The "restart": a new service (a new worker taking the job over) on the same store.
    second = DetectionService(lambda: None, store=store)  # type: ignore[arg-type,return-value]
    second._load_open_alerts(["j"])
    later = _alert(AlertKind.SIMILARITY, "gpu_power_watts", first_ts=400.0)
    assert second._deliver(later) is None
    assert second.metrics.registry.get_sample_value("minder_alerts_suppressed_total") == 1
    # another machine is news; so is a hard fault on a machine with only a soft alert open
    assert second._deliver(_alert(machine="n2")) is not None
    assert (
        second._deliver(_alert(AlertKind.SIMILARITY, "gpu_power_watts", machine="n3")) is not None
    )
    assert second._deliver(_alert(machine="n3", first_ts=500.0)) is not None
    # a notify-only alert left open never mutes a machine: a later silence is a new fault
    assert (
        second._deliver(_alert(AlertKind.STRAGGLER, "train_step_seconds", machine="n4")) is not None
    )
    assert second._deliver(_alert(AlertKind.SILENCE, "silence", machine="n4")) is not None
    # nor does one rule alert mute another hard fault of the machine
    assert second._deliver(_alert(AlertKind.RULE, "gpu_ecc_dbe_count", first_ts=600.0)) is not None
    with store.sessions() as session:
        _, total = list_alerts(session, job="j")
    assert total == 7


def test_many_jobs_starting_at_once_load_their_open_alerts_in_one_query(tmp_path: Path) -> None:
    store = _store(tmp_path)
    first = DetectionService(lambda: None, store=store)  # type: ignore[arg-type,return-value]
    assert first._deliver(_alert()) is not None
    queries: list[str | None] = []
    counts = store.open_alert_counts

    def counted(job: str | None = None) -> dict[tuple[str, str, str], int]:
        queries.append(job)
        return counts(job)

    store.open_alert_counts = counted  # type: ignore[method-assign]
    second = DetectionService(lambda: None, store=store)  # type: ignore[arg-type,return-value]
    second._load_open_alerts(["j", *(f"other-{i}" for i in range(20))])
    assert queries == [None]
    assert second._deliver(_alert(AlertKind.SIMILARITY, "gpu_power_watts", first_ts=400.0)) is None
    assert second._open_by_machine["other-3"] == {}


def test_a_resolved_machine_may_be_alerted_again(tmp_path: Path) -> None:
    store = _store(tmp_path)
    service = DetectionService(lambda: None, store=store)  # type: ignore[arg-type,return-value]
    service.open_alerts_every_s = 0.0
    stored = service._deliver(_alert())
    assert stored is not None
    assert service._deliver(_alert(AlertKind.SIMILARITY, "gpu_power_watts", first_ts=300)) is None
    with store.sessions.begin() as session:
        change_alert_status(session, stored.id, AlertStatus.RESOLVED, DESTINATIONS)
    service.jobs["j"] = SimpleNamespace(ended=False)  # type: ignore[assignment]  # a live job
    service._open_alerts_at = -1e18
    service._export_open_alerts()
    del service.jobs["j"]
    assert service._deliver(_alert(AlertKind.SIMILARITY, "gpu_power_watts", first_ts=time.time()))


def test_the_latest_hang_analysis_of_a_job_replaces_the_one_before(tmp_path: Path) -> None:
    from minder.core.hang import Culprit, CulpritReason, HangAnalysis
    from minder.storage.hangs import get_hang_analysis

    store = _store(tmp_path)
    first = HangAnalysis(
        hung=True,
        culprits=(Culprit(2, CulpritReason.NOT_JOINED, "n2", "0", "default_pg"),),
        ranks_seen=4,
        ranks_expected=4,
        analysed_ts=100.0,
    )
    store.save_hang_analysis("j", first, 100.0)
    later = HangAnalysis(hung=False, ranks_seen=4, ranks_expected=4, analysed_ts=160.0)
    store.save_hang_analysis("j", later, 160.0)
    with store.sessions() as session:
        record = get_hang_analysis(session, "j")
    assert record.analysis == later and record.updated_ts == 160.0
