"""Bounded state under hostile or broken producers: every limit refuses, counts, and keeps the
healthy job going."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from detectors.methods import default_factory
from detectors.window import WindowLimits
from minder.core.alert import AlertKind
from minder.core.records import Event, EventKind, NodeBatch
from minder.service.engine import DetectionService, ServiceLimits
from minder.service.telemetry import ServiceMetrics

NOW = 1_800_000_000.0


def service(**limits: object) -> DetectionService:
    window = {k: v for k, v in limits.items() if k in WindowLimits.__dataclass_fields__}
    own = {k: v for k, v in limits.items() if k not in window}
    return DetectionService(
        default_factory(),
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=lambda: NOW,
        limits=ServiceLimits(window=WindowLimits(**window), **own),  # type: ignore[arg-type]
    )


def batch(job: str = "j", node: str = "n0", ts: float = NOW, **kw: object) -> NodeBatch:
    samples = kw.pop("samples", [("gpu_util_ratio", "gpu0", 0.9)])
    return NodeBatch(job, node, ts, samples=samples, **kw)  # type: ignore[arg-type]


def counted(s: DetectionService, name: str, reason: str) -> float:
    value = s.metrics.registry.get_sample_value(name, {"reason": reason})
    return 0.0 if value is None else value


def test_a_huge_job_id_is_refused_counted_and_logged_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = service()
    with caplog.at_level(logging.WARNING):
        s.ingest([batch(job="x" * 65536), batch(job="y" * 65536), batch()])
    assert set(s.jobs) == {"j"}
    assert counted(s, "minder_batches_rejected_total", "name_too_long") == 2
    [record] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(record.getMessage()) < 400


def test_jobs_beyond_the_bound_are_refused() -> None:
    s = service(max_jobs=3)
    s.ingest([batch(job=f"job{i}") for i in range(10)])
    assert len(s.jobs) == 3
    assert counted(s, "minder_batches_rejected_total", "too_many_jobs") == 7


def test_old_batches_do_not_start_jobs_but_reach_known_ones() -> None:
    s = service(new_job_max_age_s=3600)
    s.ingest([batch(job="ancient", ts=1_700_000_000.0), batch(job="live")])
    assert set(s.jobs) == {"live"}
    assert counted(s, "minder_batches_rejected_total", "too_old_for_new_job") == 1
    s.ingest([batch(job="live", node="n1", ts=NOW - 7200)])  # late data of a live job is data
    assert s.jobs["live"].window.n_machines == 2


def test_machines_series_and_names_beyond_the_bounds_are_refused() -> None:
    s = service(max_machines=4, max_series_per_machine=3, max_name_length=32)
    s.ingest([batch(node=f"n{i}") for i in range(6)])
    window = s.jobs["j"].window
    assert window.n_machines == 4
    assert counted(s, "minder_rejected_total", "too_many_machines") == 2
    many = [("gpu_util_ratio", f"gpu{g}", 0.9) for g in range(10)]
    s.ingest([batch(node="n0", samples=many)])
    assert window.n_series == 3  # gpu0 was there; two more fit; seven refused
    assert counted(s, "minder_rejected_total", "too_many_series") == 7
    s.ingest([batch(node="n1", samples=[("gpu_util_ratio", "g" * 100, 0.5)])])
    s.ingest([batch(node="m" * 100)])
    assert counted(s, "minder_rejected_total", "name_too_long") == 2


def test_events_far_from_their_batch_or_beyond_the_bound_are_refused() -> None:
    s = service(max_pending_events=5, event_skew_s=300)
    far = [Event(EventKind.XID, "gpu0", ts, code=79) for ts in (1.0, 4_000_000_000.0)]
    s.ingest([batch(events=far)])
    assert counted(s, "minder_rejected_total", "event_time") == 2
    many = [Event(EventKind.XID, "gpu0", NOW + 1, code=79) for _ in range(8)]
    s.ingest([batch(events=many)])
    assert counted(s, "minder_rejected_total", "too_many_events") == 3
    assert len(s.jobs["j"].window.events) == 5


def test_an_alert_onset_is_never_before_the_jobs_first_data() -> None:
    s = service()
    nodes = [f"n{i}" for i in range(6)]
    # The XID is dated 4 minutes before the job's first sample (within the skew bound).
    xid = Event(EventKind.XID, "gpu0", NOW - 240, code=79)
    s.ingest([batch(node=n, events=[xid] if n == "n2" else []) for n in nodes])
    alerts = []
    for t in range(1, 8):
        s.clock = lambda t=t: NOW + t
        s.ingest([batch(node=n, ts=NOW + t) for n in nodes])
        alerts += s.tick()
    [alert] = [a for a in alerts if a.kind is AlertKind.RULE]
    assert alert.first_ts >= NOW


def test_machine_scores_are_exported_for_the_top_k_only() -> None:
    s = service(top_k_scores=5)
    s.persist_every_s = 1
    nodes = [f"n{i:02d}" for i in range(40)]
    for t in range(12):
        s.clock = lambda t=t: NOW + t
        s.ingest(
            [
                batch(node=n, ts=NOW + t, samples=[("gpu_util_ratio", "gpu0", 0.9 + i / 1000)])
                for i, n in enumerate(nodes)
            ]
        )
        s.tick()
    text = [
        sample
        for metric in s.metrics.registry.collect()
        if metric.name == "minder_machine_score"
        for sample in metric.samples
    ]
    assert 0 < len(text) <= 5


def test_a_job_whose_data_arrives_but_whose_evaluation_stops_is_stalled() -> None:
    s = service()
    wall = [NOW]
    s.clock = lambda: wall[0]
    nodes = [f"n{i}" for i in range(6)]
    for t in range(5):
        wall[0] = NOW + t
        s.ingest([batch(node=n, ts=NOW + t) for n in nodes])
        s.tick()
    assert s.stalled_jobs() == []
    # Batches keep coming, all stamped with one frozen second: the watermark cannot move.
    for t in range(5, 80):
        wall[0] = NOW + t
        s.ingest([batch(node=n, ts=NOW + 4) for n in nodes])
        s.tick()
    assert s.stalled_jobs() == ["j"]
    assert s.metrics.registry.get_sample_value("minder_stalled_jobs") == 1
    # A job whose data stopped is not stalled, only idle.
    wall[0] += 120
    assert s.stalled_jobs() == []
