"""Job state written off the poll loop: only the machines that changed, latest capture wins,
failures counted, pending state written at shutdown."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from detectors.methods import default_factory
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.service.persistence import JobCapture, JobSnapshot, MachineSnapshot, StateWriter
from minder.service.sinks import SqlStateStore
from minder.service.telemetry import ServiceMetrics
from minder.storage import create_engine_for, session_factory, upgrade_database
from minder.storage.jobs import current_scores, list_machines

NAMES = [f"n{i}" for i in range(6)]


def capture(
    ts: float,
    util: Sequence[float],
    last_seen: float = 100.0,
    names: Sequence[str] = NAMES,
) -> JobCapture:
    n = len(names)
    return JobCapture.build(
        "j",
        ts,
        [(name, "pp0", "leaf-0") for name in names],
        np.full(n, last_seen),
        {
            "gpu_util_ratio": (list(util), [1] * n),
            "cpu_util_ratio": ([0.5] * (n - 1), [0] * (n - 1)),  # the last machine: none
        },
        {"gpu_util_ratio": ["gpu0", "gpu1"], "cpu_util_ratio": [""]},
    )


def sql_store(tmp_path: Path) -> SqlStateStore:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade_database(engine)
    return SqlStateStore(session_factory(engine))


def stored(store: SqlStateStore) -> tuple[dict[str, tuple[float | None, float | None]], int]:
    with store.sessions() as session:
        machines = {m.name: (m.top_score, m.score_ts) for m in list_machines(session, "j")}
        return machines, len(current_scores(session, "j"))


def value(metrics: ServiceMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_only_the_machines_that_changed_are_written(tmp_path: Path) -> None:
    store = sql_store(tmp_path)
    metrics = ServiceMetrics(CollectorRegistry())
    writer = StateWriter(store, metrics, background=False, score_tolerance=0.5)
    writer.submit(capture(10.0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    machines, rows = stored(store)
    assert machines["n5"] == (6.0, 10.0) and rows == 11  # the whole job the first time
    # n1 moves by 0.6 (written), n2 by 0.3 (within the tolerance: not written)
    writer.submit(capture(15.0, [1.0, 2.6, 3.3, 4.0, 5.0, 6.0]))
    machines, rows = stored(store)
    assert machines["n1"] == (2.6, 15.0)
    assert machines["n2"] == (3.0, 10.0) and machines["n0"] == (1.0, 10.0)
    with store.sessions() as session:
        scores = {(s.machine, s.metric): (s.score, s.ts) for s in current_scores(session, "j")}
    assert len(scores) == 11
    assert scores[("n1", "gpu_util_ratio")] == (2.6, 15.0)  # the score that moved
    assert scores[("n1", "cpu_util_ratio")] == (0.5, 10.0)  # its other scores are kept
    assert value(metrics, "minder_state_machines_written_total") == 6 + 1
    # drift adds up against what was written: n2 is 0.6 away from its stored 3.0 now
    writer.submit(capture(20.0, [1.0, 2.6, 3.6, 4.0, 5.0, 6.0]))
    assert stored(store)[0]["n2"] == (3.6, 20.0)
    # last seen moving by a minute rewrites every machine
    writer.submit(capture(25.0, [1.0, 2.6, 3.6, 4.0, 5.0, 6.0], last_seen=160.0))
    assert {ts for _, ts in stored(store)[0].values()} == {25.0}
    assert value(metrics, "minder_state_writes_total", {"outcome": "ok"}) == 4


def test_a_score_that_disappears_is_deleted_and_the_top_follows(tmp_path: Path) -> None:
    store = sql_store(tmp_path)
    writer = StateWriter(store, None, background=False)
    writer.submit(capture(10.0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    gone = capture(15.0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    gone.scores[gone.metrics.index("gpu_util_ratio"), 0] = np.nan  # n0 lost its GPU score
    writer.submit(gone)
    with store.sessions() as session:
        scores = {(s.machine, s.metric) for s in current_scores(session, "j")}
        n0 = next(m for m in list_machines(session, "j") if m.name == "n0")
    assert ("n0", "gpu_util_ratio") not in scores and ("n0", "cpu_util_ratio") in scores
    assert (n0.top_score, n0.top_metric, n0.score_ts) == (0.5, "cpu_util_ratio", 15.0)


def test_a_changed_membership_rewrites_the_whole_job(tmp_path: Path) -> None:
    store = sql_store(tmp_path)
    writer = StateWriter(store, None, background=False)
    writer.submit(capture(10.0, [1.0] * 6))
    writer.submit(capture(15.0, [1.0] * 7, names=[*NAMES, "n6"]))
    machines, _ = stored(store)
    assert len(machines) == 7 and {ts for _, ts in machines.values()} == {15.0}


class BlockingStore:
    """Records what it is given; ``save_*`` wait on ``gate`` (a slow database)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.jobs: list[JobSnapshot] = []
        self.machines: list[tuple[str, float, list[str]]] = []
        self.fail = False

    def save_job(self, job: JobSnapshot) -> None:
        self.entered.set()
        self.gate.wait(10)
        if self.fail:
            raise ConnectionError("database restarting")
        self.jobs.append(job)

    def save_changes(
        self,
        job: str,
        ts: float,
        machines: Sequence[MachineSnapshot],
        scores: Sequence[tuple[str, str, float, str]],
        removed: Sequence[tuple[str, str]],
    ) -> None:
        self.entered.set()
        self.gate.wait(10)
        if self.fail:
            raise ConnectionError("database restarting")
        self.machines.append((job, ts, [m.machine for m in machines]))


def test_the_latest_capture_of_a_job_wins_and_close_writes_it() -> None:
    store = BlockingStore()
    metrics = ServiceMetrics(CollectorRegistry())
    writer = StateWriter(store, metrics)
    writer.start()
    try:
        writer.submit(capture(10.0, [1.0] * 6))
        assert store.entered.wait(5)  # the writer is stuck in the first write
        writer.submit(capture(15.0, [2.0] * 6))
        writer.submit(capture(20.0, [3.0] * 6))  # replaces the one of 15.0
        assert value(metrics, "minder_state_captures_superseded_total") == 1
        store.gate.set()
    finally:
        writer.close(10)
    assert [j.ts for j in store.jobs] == [10.0]
    assert store.machines == [("j", 20.0, NAMES)]


def test_a_failed_write_is_counted_and_the_next_capture_carries_its_changes() -> None:
    store = BlockingStore()
    store.gate.set()
    metrics = ServiceMetrics(CollectorRegistry())
    writer = StateWriter(store, metrics, background=False)
    writer.submit(capture(10.0, [1.0] * 6))
    store.fail = True
    writer.submit(capture(15.0, [1.0, 9.0, 1.0, 1.0, 1.0, 1.0]))
    assert value(metrics, "minder_state_writes_total", {"outcome": "error"}) == 1
    store.fail = False
    writer.submit(capture(20.0, [1.0, 9.0, 1.0, 1.0, 1.0, 1.0]))
    assert store.machines == [("j", 20.0, ["n1"])]
    assert value(metrics, "minder_state_write_seconds_count") == 3


def test_the_poll_loop_does_not_wait_for_the_database() -> None:
    store = BlockingStore()  # every write blocks until the gate opens
    metrics = ServiceMetrics(CollectorRegistry())
    writer = StateWriter(store, metrics)
    writer.start()
    now = [1_800_000_000.0]
    service = DetectionService(
        default_factory(),
        metrics=metrics,
        store=store,  # type: ignore[arg-type]
        writer=writer,
        persist_every_s=1,
        clock=lambda: now[0],
    )
    store.record_alert = lambda alert: (alert, True)  # type: ignore[attr-defined]
    store.open_alert_counts = lambda job=None: {}  # type: ignore[attr-defined]
    try:
        for _ in range(15):
            now[0] += 1
            batches = [
                NodeBatch("j", name, now[0], samples=[("gpu_util_ratio", "gpu0", 0.9)])
                for name in NAMES
            ]
            service.ingest(batches)
            service.tick()  # returns although the writer is blocked in the database
        # The writer thread may not have been scheduled yet: it is blocked in the database
        # once it has (the loop above returned either way).
        assert store.entered.wait(10) and not store.jobs
        assert value(metrics, "minder_state_captures_superseded_total") >= 1
        top = metrics.registry.get_sample_value(
            "minder_machine_score", {"job_id": "j", "machine": "n0"}
        )
        assert top is not None  # the top-k gauges do not wait for the writer either
        store.gate.set()
        assert writer.flush(10)
    finally:
        writer.close(10)
    assert store.jobs and store.jobs[0].job == "j"
    assert {m.machine for m in store.jobs[0].machines} == set(NAMES)


def test_bad_tolerances_are_refused() -> None:
    with pytest.raises(ValueError, match="score_tolerance=-1"):
        StateWriter(BlockingStore(), score_tolerance=-1)


def test_a_job_back_after_a_gap_and_every_ten_minutes_is_written_whole(tmp_path: Path) -> None:
    """Rows another worker wrote while the job's partition was away are not left behind."""
    store = sql_store(tmp_path)
    writer = StateWriter(store, None, background=False, full_after_gap_s=30.0, full_every_s=600.0)
    writer.submit(capture(10.0, [1.0] * 6))
    # another worker took the partition and wrote its own (warm-up) scores
    store.save_job(capture(20.0, [9.0] * 6).snapshot())
    # back here 40 s later: the same scores as written before, yet the whole job is written
    writer.submit(capture(50.0, [1.0] * 6))
    machines, _ = stored(store)
    assert {top for top, _ in machines.values()} == {1.0}
    # within the gap and the period only what moved is written ...
    store.save_job(capture(52.0, [9.0] * 6).snapshot())
    writer.submit(capture(55.0, [1.0] * 6))
    assert {top for top, _ in stored(store)[0].values()} == {9.0}
    # ... and every ten minutes of data the whole job again
    writer.submit(capture(650.0, [1.0] * 6))
    assert {top for top, _ in stored(store)[0].values()} == {1.0}


def test_the_writer_thread_outlives_a_job_it_cannot_diff(tmp_path: Path) -> None:
    store = sql_store(tmp_path)
    writer = StateWriter(store, None)
    writer.start()
    try:
        writer.submit(capture(10.0, [1.0] * 6))
        assert writer.flush(10.0)

        def broken(_capture: JobCapture) -> None:
            raise MemoryError("no room for the diff")

        writer.changes = broken  # type: ignore[assignment,method-assign]
        writer.submit(capture(15.0, [2.0] * 6))
        assert writer.flush(10.0)
        assert writer.failures == 1
        del writer.changes  # the class's own again
        writer.submit(capture(20.0, [3.0] * 6))
        assert writer.flush(10.0)
        assert {top for top, _ in stored(store)[0].values()} == {3.0}
    finally:
        writer.close()
