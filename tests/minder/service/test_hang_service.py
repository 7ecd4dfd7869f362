"""Hangs in the service: the latest analysis per job kept, handed to the writer when it is new,
stored durably, and exported as ``minder_job_hang`` and ``minder_hang_culprit``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detectors.base import CompositeDetector
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.hang import (
    Culprit,
    CulpritReason,
    EntryState,
    FrEntry,
    GroupState,
    HangAnalysis,
    RankSummary,
)
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.service.persistence import JobSnapshot, StateWriter
from minder.service.telemetry import HANG_CULPRIT_SERIES, ServiceMetrics
from minder.storage import (
    SessionFactory,
    create_engine_for,
    get_hang_analysis,
    save_hang_analysis,
    session_factory,
    upgrade_database,
)

NOW = 1_800_000_000.0


def analysis(ts: float, *ranks: int, hung: bool = True) -> HangAnalysis:
    return HangAnalysis(
        hung=hung,
        culprits=tuple(
            Culprit(
                r, CulpritReason.NOT_JOINED, f"n{r % 5}", "0", "default_pg", "gloo:all_reduce", 7
            )
            for r in ranks
        ),
        ranks_seen=8,
        ranks_expected=8,
        analysed_ts=ts,
    )


class HangingDetector:
    """A detector that raises nothing and holds the analysis the test sets."""

    def __init__(self) -> None:
        self.analysis: Any = None

    @property
    def horizon_s(self) -> int:
        return 60

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        return []

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        return {}

    def hang_analysis(self) -> Any:
        return self.analysis


class HangStore:
    """Records every hang write; fails while ``fail`` is set. With ``sessions``, writes to a
    real database too."""

    def __init__(self, sessions: SessionFactory | None = None) -> None:
        self.writes: list[tuple[str, float, HangAnalysis]] = []
        self.fail = False
        self.sessions = sessions
        self.open: dict[tuple[str, str, str], int] = {}

    def record_alert(self, alert: Alert) -> tuple[Alert, bool]:
        return alert, True

    def save_job(self, job: JobSnapshot) -> None:
        pass

    def open_alert_counts(self, job: str | None = None) -> dict[tuple[str, str, str], int]:
        return {k: n for k, n in self.open.items() if job is None or k[0] == job}

    def save_hang_analysis(self, job: str, analysis: HangAnalysis, ts: float) -> None:
        if self.fail:
            raise ConnectionError("database restarting")
        if self.sessions is not None:
            with self.sessions.begin() as session:
                save_hang_analysis(session, job, analysis, ts)
        self.writes.append((job, ts, analysis))


class Run:
    """A service over one job of five machines fed one second at a time."""

    def __init__(self, store: HangStore | None = None, *, composite: bool = False,
                 **kwargs: Any) -> None:  # fmt: skip
        self.detector = HangingDetector()
        self.t = 0
        part: Any = self.detector
        self.service = DetectionService(
            (lambda: CompositeDetector([part])) if composite else (lambda: part),
            grace_s=0,
            metrics=ServiceMetrics(CollectorRegistry()),
            store=store,
            clock=lambda: NOW + self.t,
            **kwargs,
        )

    def seconds(self, n: int) -> None:
        for _ in range(n):
            self.service.ingest(
                [
                    NodeBatch("j", f"n{i}", NOW + self.t, samples=[("cpu_util_ratio", "", 0.5)])
                    for i in range(5)
                ]
            )
            self.service.tick()
            self.t += 1

    def samples(self, name: str) -> dict[tuple[str, ...], float]:
        return {
            tuple(sample.labels.values()): sample.value
            for metric in self.service.metrics.registry.collect()
            for sample in metric.samples
            if sample.name == name
        }


def test_the_gauges_follow_the_latest_analysis_and_leave_with_the_job() -> None:
    run = Run()
    run.seconds(2)
    assert run.samples("minder_job_hang") == {("j",): 0.0}
    assert run.samples("minder_hang_culprit") == {}
    run.detector.analysis = analysis(NOW + 1, 3, 7)
    run.seconds(1)
    assert run.samples("minder_job_hang") == {("j",): 1.0}
    assert run.samples("minder_hang_culprit") == {
        ("j", "3", "n3", "default_pg", "not_joined"): 1.0,
        ("j", "7", "n2", "default_pg", "not_joined"): 1.0,
    }
    run.detector.analysis = analysis(NOW + 5, 7)  # rank 3 joined: its series goes
    run.seconds(1)
    assert set(run.samples("minder_hang_culprit")) == {("j", "7", "n2", "default_pg", "not_joined")}
    run.detector.analysis = analysis(NOW + 9, hung=False)  # the hang is over
    run.seconds(1)
    assert run.samples("minder_job_hang") == {("j",): 0.0}
    assert run.samples("minder_hang_culprit") == {}
    run.detector.analysis = analysis(NOW + 12, 1)
    run.seconds(1)
    assert len(run.samples("minder_hang_culprit")) == 1
    run.service._retire("j")
    assert run.samples("minder_job_hang") == {} and run.samples("minder_hang_culprit") == {}


def test_the_culprit_series_are_bounded_per_job() -> None:
    run = Run()
    run.detector.analysis = analysis(NOW, *range(200, 0, -1))
    run.seconds(2)
    series = run.samples("minder_hang_culprit")
    assert len(series) == HANG_CULPRIT_SERIES
    assert sorted(int(labels[1]) for labels in series) == list(range(1, HANG_CULPRIT_SERIES + 1))


def test_a_composite_detector_is_looked_through_for_the_analysis() -> None:
    run = Run(composite=True)
    run.detector.analysis = analysis(NOW, 4)
    run.seconds(2)
    assert run.samples("minder_job_hang") == {("j",): 1.0}


def test_without_an_analysis_an_open_job_level_hang_alert_means_hung() -> None:
    store = HangStore()
    store.open = {("j", "", AlertKind.HANG.value): 1}  # raised before a restart, still open
    run = Run(store)
    run.seconds(2)
    assert run.samples("minder_job_hang") == {("j",): 1.0}
    run.detector.analysis = analysis(NOW, hung=False)  # an analysis decides from then on
    run.seconds(1)
    assert run.samples("minder_job_hang") == {("j",): 0.0}


def test_each_new_analysis_is_written_once_and_a_refused_one_with_the_next_capture() -> None:
    store = HangStore()
    run = Run(store, persist_every_s=5)
    run.seconds(3)
    assert store.writes == []  # no analysis: nothing written
    first = analysis(NOW + 1, 2)
    run.detector.analysis = first
    run.seconds(4)
    assert [(job, a) for job, _, a in store.writes] == [("j", first)]
    assert store.writes[0][1] == NOW + 3  # the data second it was taken at
    run.detector.analysis = analysis(NOW + 1, 2)  # equal, another object: not written again
    run.seconds(2)
    assert len(store.writes) == 1
    store.fail = True
    second = analysis(NOW + 8, 2, 3)
    run.detector.analysis = second
    run.seconds(1)
    assert len(store.writes) == 1
    store.fail = False
    run.seconds(6)  # the job's next capture carries it
    assert [a for _, _, a in store.writes] == [first, second]
    registry = run.service.metrics.registry
    assert registry.get_sample_value("minder_state_writes_total", {"outcome": "error"}) == 1


def test_the_background_writer_writes_the_latest_analysis_before_flush_returns() -> None:
    store = HangStore()
    writer = StateWriter(store)
    writer.start()
    try:
        writer.submit_hang("j", 10.0, analysis(9.0, 1))
        writer.submit_hang("j", 11.0, analysis(10.0, 1, 2))  # replaces the one not written
        assert writer.flush(10)
    finally:
        writer.close()
    assert store.writes[-1] == ("j", 11.0, analysis(10.0, 1, 2))
    assert len(store.writes) in (1, 2)


def test_a_store_without_hang_analyses_is_given_none() -> None:
    class Plain:
        def save_job(self, job: JobSnapshot) -> None:
            pass

    writer = StateWriter(Plain(), background=False)
    writer.submit_hang("j", 1.0, analysis(1.0, 1))  # nothing to call: no error
    assert writer.writes == 0


def test_a_malformed_analysis_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    store = HangStore()
    run = Run(store)
    run.detector.analysis = {"hung": "maybe"}
    with caplog.at_level(logging.WARNING, logger="minder.service.engine"):
        run.seconds(3)
    said = [r for r in caplog.records if "malformed hang analysis" in r.getMessage()]
    assert len(said) == 1 and "'maybe'" in said[0].getMessage()
    assert store.writes == [] and run.samples("minder_job_hang") == {("j",): 0.0}
    run.detector.analysis = analysis(NOW, 1).to_dict()  # a well-formed dict is taken
    run.seconds(1)
    assert store.writes[-1][2] == analysis(NOW, 1)


def test_a_hang_is_logged_when_it_begins_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = Run()
    with caplog.at_level(logging.DEBUG, logger="minder.service.engine"):
        run.detector.analysis = analysis(NOW, 3)
        run.seconds(2)
        run.detector.analysis = analysis(NOW + 1, 3)  # the same culprits again: debug
        run.seconds(1)
        run.detector.analysis = analysis(NOW + 2, hung=False)
        run.seconds(1)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "job j: " in r.getMessage()]
    hung = [(level, text) for level, text in lines if "hung: it waits on" in text]
    assert [level for level, _ in hung] == [logging.WARNING, logging.DEBUG]
    assert "rank(s) 3 on n3 (8 of 8 ranks' dumps analysed" in hung[0][1]
    assert [text for level, text in lines if level == logging.INFO and "over" in text] == [
        f"job j: the hang is over (latest analysis at {NOW + 2:.0f})"
    ]


def test_the_latest_analysis_reaches_the_database(tmp_path: Path) -> None:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'minder.db'}")
    upgrade_database(engine)
    sessions = session_factory(engine)
    run = Run(HangStore(sessions))
    run.seconds(1)
    run.detector.analysis = analysis(NOW, 6)
    run.seconds(2)
    with sessions() as session:
        stored = get_hang_analysis(session, "j")
    assert stored.analysis == analysis(NOW, 6) and stored.updated_ts == NOW + 1
    engine.dispose()


# -- the real detector ----------------------------------------------------------------------


def _summary(rank: int, node: str, joined: bool) -> RankSummary:
    """Rank ``rank``'s dump of a job of 8 ranks in one group: all_reduce #4 completed, #5
    entered by every rank but the one that did not join."""
    done = FrEntry(40, 4, "gloo:all_reduce", EntryState.COMPLETED, input_sizes=((8,),),
                   input_dtypes=("Float",))  # fmt: skip
    waiting = FrEntry(50, 5, "gloo:all_reduce", EntryState.STARTED, input_sizes=((8,),),
                      input_dtypes=("Float",))  # fmt: skip
    group = GroupState(
        group="0",
        desc="default_pg",
        ranks=((0, 8, 1),),
        last_enqueued=5 if joined else 4,
        last_started=5 if joined else 4,
        last_completed=4,
        entries=(done, waiting) if joined else (done,),
    )
    return RankSummary(rank=rank, version="2.10", groups=(group,), node=node,
                       dumped_ts=NOW + 3, source=f"nccl_trace_rank_{rank}",
                       entries_total=12)  # fmt: skip


def test_a_real_detection_service_finds_the_rank_that_never_joined(tmp_path: Path) -> None:
    pytest.importorskip("detectors.hang_watch", reason="detectors/hang_watch.py not written yet")
    from detectors.methods import default_factory

    engine = create_engine_for(f"sqlite:///{tmp_path / 'minder.db'}")
    upgrade_database(engine)
    sessions = session_factory(engine)
    store = HangStore(sessions)
    t = [0]
    service = DetectionService(
        default_factory(),
        grace_s=0,
        metrics=ServiceMetrics(CollectorRegistry()),
        store=store,
        clock=lambda: NOW + t[0],
    )
    nodes = [f"n{i}" for i in range(4)]  # ranks 2i and 2i + 1 on node i; rank 5 never joins
    for second in range(40):
        batches = []
        for i, node in enumerate(nodes):
            batch = NodeBatch("j", node, NOW + second, samples=[("cpu_util_ratio", "", 0.5)])
            if second == 3:
                batch.flight_recorder = [_summary(r, node, r != 5) for r in (2 * i, 2 * i + 1)]
            batches.append(batch)
        service.ingest(batches)
        service.tick()
        t[0] += 1
        if store.writes and any(a.kind is AlertKind.HANG and a.machine for a in service.alerts):
            break
    state = service.jobs["j"]
    assert state.hang is not None and state.hang.hung
    assert state.hang.culprit_ranks == [5] and state.hang.culprit_machines == ["n2"]
    registry = service.metrics.registry
    assert registry.get_sample_value("minder_job_hang", {"job_id": "j"}) == 1
    culprit = {"job_id": "j", "rank": "5", "machine": "n2", "group": "default_pg",
               "reason": "not_joined"}  # fmt: skip
    assert registry.get_sample_value("minder_hang_culprit", culprit) == 1
    hangs = [a for a in service.alerts if a.kind is AlertKind.HANG]
    assert sorted(a.machine for a in hangs) == ["", "n2"]
    with sessions() as session:
        assert get_hang_analysis(session, "j").analysis == state.hang
    engine.dispose()


def test_a_detector_that_raises_on_one_job_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Raising(HangingDetector):
        def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
            if window.job == "bad":
                raise ValueError("invalid literal for int() with base 10: '²'")
            return []

    evaluated: list[str] = []

    class Counting(HangingDetector):
        def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
            evaluated.append(window.job)
            return []

    made = iter([Raising(), Counting()])
    service = DetectionService(lambda: next(made), grace_s=0.0, clock=lambda: NOW + 10)
    service.ingest([NodeBatch("bad", "n1", NOW, samples=[("cpu_util_ratio", "", 0.5)]),
                    NodeBatch("good", "n1", NOW, samples=[("cpu_util_ratio", "", 0.5)])])  # fmt: skip
    with caplog.at_level(logging.ERROR):
        service.tick()
        service.tick()
    assert "good" in evaluated
    failed = [r for r in caplog.records if "detection failed" in r.getMessage()]
    assert len(failed) == 1 and "bad" in failed[0].getMessage()
