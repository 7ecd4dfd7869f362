"""Hostile or broken producers: huge names, floods of jobs and series, events dated anywhere,
batches from long ago. The state stays bounded, each refusal is counted, and the healthy job's
fault is alerted on time."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from fault_harness import (
    FAULTY,
    HEALTHY,
    HEALTHY_PARTITION,
    HOSTILE_PARTITION,
    WARMUP_S,
    FaultService,
    Figures,
    rss_mb,
    wait_until,
)

from minder.core.records import Event, EventKind, NodeBatch
from minder.logging_setup import configure_logging

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

GPU_METRICS = (
    "gpu_util_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_sm_clock_hertz",
    "gpu_memory_used_bytes",
    "gpu_pcie_tx_bytes_per_second",
)
FLOOD_ON_TIME_S = 45.0
"""The healthy alert's bound behind a flood of job ids: the thousand jobs the default bound
admits each get a window, a detector and a first evaluation, seconds of CPU on a shared 2-core
machine (before the bounds, the flood delayed the alert by minutes)."""


def rejected(service: FaultService, name: str, reason: str) -> float:
    return service.metric(name, reason=reason) or 0.0


class LineLengths(logging.Handler):
    """The longest formatted log line."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.longest = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.longest = max(self.longest, len(self.format(record)))


@pytest.fixture
def serve_logging() -> Iterator[LineLengths]:
    """The root logger as ``minder serve`` sets it up (rich console, INFO), plus a handler that
    measures the lines; pytest's own handlers are put back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    configure_logging("INFO")
    lengths = LineLengths()
    root.addHandler(lengths)
    try:
        yield lengths
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, logger in logging.root.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))


def test_a_64_kib_job_id_neither_freezes_the_worker_nor_the_api(
    make_service: Any, figures: Figures, serve_logging: LineLengths
) -> None:
    service: FaultService = make_service()
    service.warm_up()
    health_s: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{service.api}/health", timeout=60)
            health_s.append(time.monotonic() - started)
            stop.wait(0.2)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        huge = NodeBatch("x" * 65536, "n0", time.time() - 1, samples=[("cpu_util_ratio", "", 0.5)])
        service.send([huge], HOSTILE_PARTITION)
        healthy = service.fault_then_alert(figures, timeout_s=40)
    finally:
        stop.set()
        prober.join(70)
    figures.record("slowest /health", max(health_s), "s")
    figures.record("longest log line", serve_logging.longest, "characters")
    assert healthy.on_time(), healthy
    assert max(health_s) < 2.0, f"/health took {max(health_s):.1f} s"
    assert serve_logging.longest < 1000
    assert "x" * 65536 not in service.stack.service.jobs
    assert rejected(service, "minder_batches_rejected_total", "name_too_long") == 1


def test_10000_job_ids_are_bounded_and_do_not_delay_a_real_alert(
    make_service: Any, figures: Figures
) -> None:
    service: FaultService = make_service()
    service.warm_up()
    gc.collect()
    before = rss_mb()
    now = time.time() - 1
    for start in range(0, 10_000, 1_000):
        service.send(
            [
                NodeBatch(f"flood-{i:05d}", "n0", now, samples=[("cpu_util_ratio", "", 0.5)])
                for i in range(start, start + 1_000)
            ],
            HOSTILE_PARTITION,
        )
    healthy = service.fault_then_alert(figures, timeout_s=60)
    consumed = wait_until(lambda: service.consumed(HOSTILE_PARTITION), 60)
    gc.collect()
    growth = rss_mb() - before
    series = service.metrics()
    jobs = len(service.stack.service.jobs)
    scores = len(series.get("minder_machine_score", []))
    job_series = sum(1 for values in series.values() for labels, _ in values if "job_id" in labels)
    figures.record("jobs in memory", jobs, "jobs")
    figures.record("RSS growth", growth, "MB")
    figures.record("minder_machine_score series", scores, "series")
    figures.record("series with a job_id label", job_series, "series")
    assert healthy.on_time(FLOOD_ON_TIME_S), healthy
    assert consumed is not None, "the flood's partition was not consumed"
    limit = 1_000  # MINDER_DETECTION__MAX_JOBS by default
    assert jobs <= limit and HEALTHY in service.stack.service.jobs
    assert rejected(service, "minder_batches_rejected_total", "too_many_jobs") == 10_001 - jobs
    assert scores <= (jobs - 1) + 8  # one machine per flood job, the healthy job's eight
    assert growth < 200, f"RSS grew by {growth:.0f} MB"


def test_4_nodes_of_100000_series_each_are_bounded(make_service: Any, figures: Figures) -> None:
    service: FaultService = make_service()
    service.warm_up()
    gc.collect()
    before = rss_mb()
    now = time.time() - 1
    devices = 100_000 // len(GPU_METRICS)
    for node in range(4):
        for first in range(0, devices, 1_250):
            samples = [
                (metric, f"gpu{d}", 0.5)
                for d in range(first, first + 1_250)
                for metric in GPU_METRICS
            ]
            service.send([NodeBatch("wide", f"w{node}", now, samples=samples)], HOSTILE_PARTITION)
    healthy = service.fault_then_alert(figures, timeout_s=60)
    consumed = wait_until(lambda: service.consumed(HOSTILE_PARTITION), 60)
    gc.collect()
    growth = rss_mb() - before
    wide = service.stack.service.jobs.get("wide")
    n_series = 0 if wide is None else wide.window.n_series
    figures.record("series in the window", n_series, "series")
    figures.record("RSS growth", growth, "MB")
    assert healthy.on_time(), healthy
    assert consumed is not None, "the wide job's partition was not consumed"
    # The job's series are shared by its machines: each node adds 4,096 new ones to those the
    # nodes before it added, and keeps sending those.
    assert n_series == 4 * 4_096
    accepted = sum(4_096 * (node + 1) for node in range(4))
    assert rejected(service, "minder_rejected_total", "too_many_series") == 4 * 100_000 - accepted
    assert growth < 150, f"RSS grew by {growth:.0f} MB"


def test_events_dated_far_from_their_batch_are_refused_and_raise_nothing(
    make_service: Any, figures: Figures
) -> None:
    """A crafted XID on a healthy machine dated an hour before its batch, one dated ts = 1, and
    20,000 dated in 2096: refused and counted, no alert but the real one, pending bounded."""
    service: FaultService = make_service()
    service.warm_up()
    last = {b.node: b for b in service.seconds[WARMUP_S - 1]}

    def with_events(node: str, *events: Event) -> NodeBatch:
        return replace(last[f"{HEALTHY}-{node}"], events=list(events))

    in_2096 = 3_980_000_000.0
    hostile = [
        with_events("n0006", Event(EventKind.XID, "gpu0", last[FAULTY].ts - 3600, code=79)),
        with_events("n0005", Event(EventKind.XID, "gpu0", 1.0, code=79)),
    ]
    flood = [Event(EventKind.XID, "gpu0", in_2096 + i, code=79) for i in range(5_000)]
    hostile += [with_events("n0007", *flood) for _ in range(4)]
    service.send(hostile, HEALTHY_PARTITION)
    healthy = service.fault_then_alert(figures, timeout_s=30)
    wrong = [a for a in service.stack.service.alerts if a.machine != FAULTY]
    job = service.stack.service.jobs.get(HEALTHY)
    pending = 0 if job is None else len(job.window.events)
    earliest = min((a.first_ts for a in service.stack.service.alerts), default=None)
    figures.record("alerts on healthy machines", len(wrong), "alerts")
    figures.record("pending events", pending, "events")
    figures.record("earliest alert onset", earliest, "unix s")
    assert healthy.on_time(), healthy
    assert wrong == [], [(a.machine, a.first_ts) for a in wrong]
    assert earliest is not None and earliest >= service.start_ts
    assert rejected(service, "minder_rejected_total", "event_time") == 2 + 20_000
    assert pending <= 10_000


def test_batches_from_long_ago_do_not_start_jobs(make_service: Any, figures: Figures) -> None:
    service: FaultService = make_service()
    service.warm_up()
    year_ago = time.time() - 365 * 86_400
    ancient = [
        NodeBatch("epoch", "n0", 1.0, samples=[("cpu_util_ratio", "", 0.5)]),
        NodeBatch("last-year", "n0", year_ago, samples=[("cpu_util_ratio", "", 0.5)]),
    ]
    service.send(ancient, HOSTILE_PARTITION)
    healthy = service.fault_then_alert(figures, timeout_s=30)
    assert wait_until(lambda: service.consumed(HOSTILE_PARTITION), 30) is not None
    started = sorted({"epoch", "last-year"} & set(service.stack.service.jobs))
    figures.record("jobs started by old batches", len(started), "jobs")
    assert healthy.on_time(), healthy
    assert started == []
    assert rejected(service, "minder_batches_rejected_total", "too_old_for_new_job") == 2
