"""Job-level findings in the service: ``minder_job_peer_coherence``, one log line per beginning
and end, and the set written to the store only when it changes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detectors.methods import default_factory
from detectors.window import JobWindow
from minder.core.alert import Alert
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.service.persistence import JobSnapshot, StateWriter
from minder.service.sinks import SqlStateStore
from minder.service.telemetry import ServiceMetrics
from minder.storage import (
    JobFinding,
    create_engine_for,
    get_job,
    list_job_findings,
    session_factory,
    upgrade_database,
)

NOW = 1_800_000_000.0
NOT_PEERS: dict[str, Any] = {
    "finding": "not_peer_comparable",
    "metric": "gpu_util_ratio",
    "coherence": 0.62,
    "outliers": 55,
    "allowance": 8,
    "machines": 144,
    "since_ts": NOW + 3,
    "detail": "55 distinct machines were outliers on gpu_util_ratio",
}


class FakeDetector:
    """A detector that raises nothing and reports what the test sets as its findings."""

    def __init__(self) -> None:
        self.findings: list[dict[str, Any]] = []

    @property
    def horizon_s(self) -> int:
        return 60

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        return []

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        return {}

    def job_findings(self) -> list[dict[str, Any]]:
        return [dict(f) for f in self.findings]


class FindingsStore:
    """Records every findings write; fails while ``fail`` is set."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, float, tuple[JobFinding, ...]]] = []
        self.fail = False

    def record_alert(self, alert: Alert) -> tuple[Alert, bool]:
        return alert, True

    def save_job(self, job: JobSnapshot) -> None:
        pass

    def open_alert_counts(self, job: str | None = None) -> dict[tuple[str, str, str], int]:
        return {}

    def save_job_findings(self, job: str, findings: Sequence[JobFinding], ts: float) -> None:
        if self.fail:
            raise ConnectionError("database restarting")
        self.writes.append((job, ts, tuple(findings)))


class Run:
    """A service over one job of five machines fed one second at a time."""

    def __init__(self, store: FindingsStore | None = None, **kwargs: Any) -> None:
        self.detector = FakeDetector()
        self.t = 0
        self.service = DetectionService(
            lambda: self.detector,
            grace_s=0,
            metrics=ServiceMetrics(CollectorRegistry()),
            store=store,  # type: ignore[arg-type]
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

    def coherence(self) -> dict[tuple[str, str], float]:
        return {
            (sample.labels["job_id"], sample.labels["metric"]): sample.value
            for metric in self.service.metrics.registry.collect()
            if metric.name == "minder_job_peer_coherence"
            for sample in metric.samples
        }


def test_the_coherence_gauge_follows_the_not_peer_comparable_findings() -> None:
    run = Run()
    run.seconds(3)
    assert run.coherence() == {}
    run.detector.findings = [
        NOT_PEERS,
        {**NOT_PEERS, "metric": "cpu_util_ratio", "coherence": 0.9},
        # no coherence gauge for a finding about no metric
        {"finding": "too_few_machines", "metric": None, "machines": 3, "since_ts": NOW},
    ]
    run.seconds(2)
    assert run.coherence() == {("j", "gpu_util_ratio"): 0.62, ("j", "cpu_util_ratio"): 0.9}
    run.detector.findings = [{**NOT_PEERS, "coherence": 0.55}]
    run.seconds(1)
    assert run.coherence() == {("j", "gpu_util_ratio"): 0.55}  # cpu_util_ratio: peers again
    run.detector.findings = []
    run.seconds(1)
    assert run.coherence() == {}
    run.detector.findings = [NOT_PEERS]
    run.seconds(1)
    assert run.coherence() == {("j", "gpu_util_ratio"): 0.62}
    run.service._retire("j")  # the job's series leave with it
    assert run.coherence() == {}


def test_the_set_is_written_when_it_changes_and_its_numbers_at_most_every_refresh() -> None:
    store = FindingsStore()
    run = Run(store, findings_refresh_s=10)
    run.seconds(3)
    # the first evaluation on this worker writes the (empty) set: rows another worker left go
    assert [(job, findings) for job, _, findings in store.writes] == [("j", ())]
    run.seconds(5)
    assert len(store.writes) == 1  # nothing changed: nothing written
    run.detector.findings = [NOT_PEERS]
    run.seconds(1)
    assert len(store.writes) == 2
    job, ts, (finding,) = store.writes[-1]
    assert (job, ts) == ("j", run.service.jobs["j"].evaluated_sec)
    assert (finding.key, finding.coherence, finding.since_ts) == (
        ("not_peer_comparable", "gpu_util_ratio"),
        0.62,
        NOW + 3,
    )
    # only the numbers move, every second: written again once the refresh interval has passed
    for second in range(12):
        run.detector.findings = [{**NOT_PEERS, "outliers": 55 + second, "coherence": 0.6}]
        run.seconds(1)
    assert len(store.writes) == 3
    assert store.writes[-1][1] - store.writes[-2][1] >= 10
    # a new finding (or one that ends) is written at once
    run.detector.findings = [NOT_PEERS, {**NOT_PEERS, "metric": "cpu_util_ratio"}]
    run.seconds(1)
    assert [f.metric for f in store.writes[-1][2]] == ["cpu_util_ratio", "gpu_util_ratio"]
    run.detector.findings = [NOT_PEERS]
    run.seconds(1)
    assert [f.metric for f in store.writes[-1][2]] == ["gpu_util_ratio"]
    # a finding that ended and began again between two evaluations (a new since_ts) too
    run.detector.findings = [{**NOT_PEERS, "since_ts": NOW + 40}]
    run.seconds(1)
    assert store.writes[-1][2][0].since_ts == NOW + 40
    run.detector.findings = []
    run.seconds(1)
    assert store.writes[-1][2] == ()
    assert len(store.writes) == 7


def test_a_set_the_store_refused_is_written_with_the_jobs_next_capture() -> None:
    store = FindingsStore()
    run = Run(store, persist_every_s=5)
    run.seconds(2)
    store.fail = True
    run.detector.findings = [NOT_PEERS]
    run.seconds(1)
    assert store.writes == [store.writes[0]] and store.writes[0][2] == ()
    store.fail = False
    run.seconds(6)  # the job's next capture carries it
    assert [f.key for f in store.writes[-1][2]] == [("not_peer_comparable", "gpu_util_ratio")]
    assert len(store.writes) == 2
    registry = run.service.metrics.registry
    assert registry.get_sample_value("minder_state_writes_total", {"outcome": "error"}) == 1


def test_the_background_writer_writes_the_latest_set_before_flush_returns() -> None:
    store = FindingsStore()
    writer = StateWriter(store)  # type: ignore[arg-type]
    writer.start()
    try:
        finding = JobFinding.coerce(NOT_PEERS)
        writer.submit_findings("j", 10.0, [finding])
        assert writer.flush(10)
        writer.submit_findings("j", 11.0, [])
        writer.close()
    finally:
        writer.close()
    assert store.writes[0] == ("j", 10.0, (finding,))
    assert store.writes[-1] == ("j", 11.0, ())


def test_a_malformed_finding_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    store = FindingsStore()
    run = Run(store)
    run.detector.findings = [NOT_PEERS, {**NOT_PEERS, "metric": "x", "coherence": 7.0}]
    with caplog.at_level(logging.WARNING, logger="minder.service.engine"):
        run.seconds(3)
    assert [f.metric for f in store.writes[-1][2]] == ["gpu_util_ratio"]
    said = [r for r in caplog.records if "malformed job finding" in r.getMessage()]
    assert len(said) == 1 and "coherence 7.0" in said[0].getMessage()


def test_each_finding_is_logged_once_when_it_begins_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = Run()
    other = {"finding": "mixed_roles", "metric": None, "machines": 5, "since_ts": NOW + 1,
             "detail": "two roles"}  # fmt: skip
    with caplog.at_level(logging.DEBUG, logger="minder.service.engine"):
        run.seconds(1)
        run.detector.findings = [NOT_PEERS, other]
        run.seconds(4)
        run.detector.findings = []
        run.seconds(3)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "job j: " in r.getMessage()]
    began = [line for line in lines if "since" in line[1] and "ended" not in line[1]]
    ended = [line for line in lines if "ended" in line[1]]
    # the default engine logs not_peer_comparable itself (with its numbers): debug here only
    assert [level for level, text in began if "not_peer_comparable" in text] == [logging.DEBUG]
    assert [level for level, text in ended if "not_peer_comparable" in text] == [logging.DEBUG]
    # a finding nobody else logs: info, once each way
    assert [text for level, text in began if level == logging.INFO] == [
        f"job j: mixed_roles since {NOW + 1:.0f}: two roles"
    ]
    assert [text for level, text in ended if level == logging.INFO] == [
        f"job j: mixed_roles ended (it held since {NOW + 1:.0f})"
    ]


def test_a_detector_without_findings_exports_and_writes_none() -> None:
    store = FindingsStore()

    class Baseline(FakeDetector):
        job_findings = None  # type: ignore[assignment]

    service = DetectionService(Baseline, grace_s=0, store=store,  # type: ignore[arg-type]
                               metrics=ServiceMetrics(CollectorRegistry()),
                               clock=lambda: NOW + 5)  # fmt: skip
    service.ingest([NodeBatch("j", f"n{i}", NOW, samples=[("cpu_util_ratio", "", 0.5)])
                    for i in range(5)])  # fmt: skip
    service.tick()
    assert service.jobs["j"].evaluated_sec == int(NOW)
    assert store.writes == []


def test_a_job_of_three_machines_is_stored_as_too_few_machines(database_url: str) -> None:
    """Through the default detector and the SQL store (SQLite and PostgreSQL)."""
    engine = create_engine_for(database_url)
    try:
        upgrade_database(engine)
        sessions = session_factory(engine)
        now = [NOW]
        service = DetectionService(default_factory(), grace_s=0, clock=lambda: now[0],
                                   metrics=ServiceMetrics(CollectorRegistry()),
                                   store=SqlStateStore(sessions))  # fmt: skip
        for t in range(15):
            now[0] = NOW + t
            service.ingest(
                [
                    NodeBatch("small", f"n{i}", NOW + t, samples=[("gpu_util_ratio", "gpu0", 0.9)])
                    for i in range(3)
                ]
            )
            service.tick()
        with sessions() as session:
            (finding,) = list_job_findings(session, "small")
            assert get_job(session, "small").finding_count == 1
        assert (finding.finding, finding.metric, finding.machines) == ("too_few_machines", None, 3)
        assert NOW <= finding.since_ts <= NOW + 15 and "fewer than 4" in finding.detail
        assert finding.updated_ts is not None and finding.updated_ts >= finding.since_ts
    finally:
        engine.dispose()
