"""The job lifecycle through the service's own path: batches into the detection service, its
state writer into a real database (SQLite and PostgreSQL), the HTTP API reading it, and the
Prometheus series of the same process; the API and the series say the same at every step.

A job is ``active`` while its machines report, ``idle`` when its window is dropped, ``ended``
when its last machine said goodbye or it stayed idle past the retention (docs/operations.md,
"Job lifecycle").
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from service_settings import fleet_signer, isolated_settings

from detectors.methods import default_factory
from minder.api import create_app
from minder.core.records import Event, EventKind, NodeBatch
from minder.service.engine import DetectionService
from minder.service.persistence import StateWriter
from minder.service.sinks import SqlStateStore
from minder.service.stack import build_stack
from minder.service.telemetry import ServiceMetrics
from minder.storage import create_engine_for, list_jobs, session_factory, upgrade_database
from minder.stream import BatchProducer, EmbeddedBroker

TOKEN = "lifecycle-token"
IDLE_S = 60.0
RETENTION_S = 300.0


class Clock:
    """The service's wall clock, moved by the test (it starts at the real time: the store's
    own wall-time columns are written with it too)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass
class Service:
    """One service process: detection, its writer and store, its API and its series."""

    clock: Clock
    detection: DetectionService
    api: TestClient
    registry: CollectorRegistry
    origin: float
    """Data time of the job's first second."""

    def feed(self, machines: list[str], seconds: range, goodbye: str | None = None) -> None:
        """One batch per machine per second (the clock follows the data), then a tick; with
        ``goodbye``, that machine says goodbye after the last second."""
        for sec in seconds:
            self.clock.now = self.origin + sec + 1.0
            self.detection.ingest([_batch(m, self.origin + sec) for m in machines])
            self.detection.tick()
        if goodbye is not None:
            ts = self.origin + seconds.stop
            self.clock.now = ts + 1.0
            self.detection.ingest(
                [NodeBatch("train", goodbye, ts, events=[Event(EventKind.LEAVE, "", ts, None,
                                                               "agent stopped")])]
            )  # fmt: skip
            self.detection.tick()

    def wait(self, seconds: float) -> None:
        """Nothing arrives for ``seconds``; the service ticks as its poll loop does."""
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + 5.0)
            self.detection.tick()

    def job(self) -> dict[str, Any]:
        response = self.api.get("/api/v1/jobs/train")
        assert response.status_code == 200, response.text
        listed = [j for j in self.api.get("/api/v1/jobs").json() if j["id"] == "train"]
        detail = response.json()
        assert listed == [{k: v for k, v in detail.items() if k != "findings"}]
        return detail

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def assert_agree(self, status: str, machines: int) -> dict[str, Any]:
        """The API and the series say the job is in ``status`` with ``machines`` in it."""
        job = self.job()
        assert (job["status"], job["active_machines"]) == (status, machines)
        by_status = self.api.get("/api/v1/jobs", params={"status": status}).json()
        assert [j["id"] for j in by_status] == ["train"]
        exported = self.gauge("minder_job_machines", job_id="train")
        if status == "active":
            assert exported == machines
            assert self.gauge("minder_jobs") == 1
            assert self.gauge("minder_machines") == machines
            assert self.gauge("minder_job_last_sample_timestamp_seconds", job_id="train")
            assert job["status_reason"] == ""
        else:  # an idle or ended job has no series, and is not counted
            assert exported is None
            assert self.gauge("minder_jobs") == 0
            assert self.gauge("minder_machines") == 0
            assert self.gauge("minder_job_last_sample_timestamp_seconds", job_id="train") is None
            assert self.gauge("minder_open_alerts", job_id="train", kind="rule") is None
        text = self.api.get("/metrics").text  # what Prometheus scrapes says the same
        assert ('minder_job_machines{job_id="train"}' in text) is (status == "active")
        return job


def _batch(machine: str, ts: float) -> NodeBatch:
    return NodeBatch(
        "train",
        machine,
        ts,
        samples=[("gpu_util_ratio", "gpu0", 0.9), ("cpu_util_ratio", "", 0.4)],
    )


@pytest.fixture
def database(database_url: str) -> Iterator[str]:
    engine = create_engine_for(database_url)
    upgrade_database(engine)
    engine.dispose()
    yield database_url


def _service(database_url: str, clock: Clock, origin: float) -> Generator[Service, None, None]:
    engine = create_engine_for(database_url)
    sessions = session_factory(engine)
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    store = SqlStateStore(sessions)
    detection = DetectionService(
        default_factory(),
        grace_s=2,
        metrics=metrics,
        store=store,
        writer=StateWriter(store, metrics, background=False),
        clock=clock,
        idle_job_s=IDLE_S,
        idle_retention_s=RETENTION_S,
    )
    app = create_app(sessions, registry=registry, api_token=TOKEN)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        yield Service(clock, detection, api, registry, origin)
    engine.dispose()


@pytest.fixture
def service(database: str) -> Iterator[Service]:
    clock = Clock()
    yield from _service(database, clock, clock.now - 100.0)


MACHINES = [f"n{i}" for i in range(4)]


def test_a_job_goes_active_idle_ended_and_the_api_and_series_agree(service: Service) -> None:
    service.feed(MACHINES, range(20))
    job = service.assert_agree("active", 4)
    assert job["machine_count"] == 4
    since = job["status_since"]
    service.feed(MACHINES, range(20, 30), goodbye="n3")  # one agent stops: 3 machines left
    job = service.assert_agree("active", 3)
    service.feed(MACHINES[:3], range(31, 40))
    job = service.assert_agree("active", 3)
    assert (job["machine_count"], job["status_since"]) == (4, since)

    service.wait(IDLE_S + 5)  # the rest fall silent: the window is dropped
    job = service.assert_agree("idle", 0)
    assert job["status_reason"] == f"no data for {IDLE_S:.0f} s"
    assert job["status_since"] == pytest.approx(service.clock.now, abs=5.0)
    assert service.detection.jobs == {}

    service.wait(RETENTION_S / 2)  # within the retention: still idle
    service.assert_agree("idle", 0)
    service.wait(RETENTION_S / 2 + 15)
    job = service.assert_agree("ended", 0)
    assert job["status_reason"] == f"idle for the retention of {RETENTION_S:.0f} s"
    assert job["machine_count"] == 4  # the machines it had are still listed
    assert len(service.api.get("/api/v1/jobs/train/machines").json()) == 4

    # The same job id reporting again (a requeued job) is active again.
    service.feed(MACHINES[:2], range(700, 710))
    job = service.assert_agree("active", 2)
    assert job["status_since"] > since


def test_a_job_ends_when_its_last_machine_says_goodbye(service: Service) -> None:
    """The operator's case: the only agent said goodbye; 16 minutes later the job is still
    ended, not active with one machine."""
    service.feed(["solo"], range(15))
    service.assert_agree("active", 1)
    service.feed([], range(15, 15), goodbye="solo")
    job = service.assert_agree("ended", 0)
    assert (job["status_reason"], job["machine_count"]) == ("its last machine said goodbye", 1)
    # the agent restarts in place (a goodbye, then data again): active again, then ended again
    service.feed(["solo"], range(30, 35))
    service.assert_agree("active", 1)
    service.feed([], range(35, 35), goodbye="solo")
    job = service.assert_agree("ended", 0)
    ended_at = job["status_since"]
    service.wait(16 * 60)  # the window is dropped meanwhile: an ended job stays ended
    assert service.detection.jobs == {}
    job = service.assert_agree("ended", 0)
    assert job["status_since"] == ended_at


def test_a_restart_leaves_no_job_of_the_earlier_run_active(database: str) -> None:
    clock = Clock()
    origin = clock.now - 100.0
    first = _service(database, clock, origin)
    before = next(first)
    before.feed(MACHINES, range(10))
    before.assert_agree("active", 4)
    first.close()  # the process dies: nothing said

    # The next process: the stored job has no worker; it becomes idle within a minute of the
    # start, and ended after the retention, unless its data comes back.
    second = _service(database, clock, origin)
    after = next(second)
    try:
        after.detection.tick()
        after.wait(after.detection.stale_after_s + 10)
        job = after.assert_agree("idle", 0)
        assert job["status_reason"].startswith("no word for 60 s from the worker that held it")
        after.wait(RETENTION_S + 15)
        after.assert_agree("ended", 0)
        after.feed(MACHINES, range(800, 810))  # its agents report again
        after.assert_agree("active", 4)
        # A clean stop says so at once.
        after.detection.release()
        job = after.assert_agree("idle", 0)
        assert job["status_reason"] == "the service stopped"
    finally:
        second.close()


@pytest.mark.kafka
def test_through_the_broker_a_goodbye_ends_the_job_and_a_stop_idles_the_rest(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """``minder serve`` as an operator runs it: agents' batches through a real broker; the one
    agent of job ``solo`` says goodbye, the job ``other`` keeps reporting; then the service
    stops. The HTTP API and ``/metrics`` agree at each step."""
    settings = isolated_settings(broker.bootstrap, f"sqlite:///{tmp_path / 'minder.db'}")
    stack = build_stack(settings, registry=CollectorRegistry())
    api = f"{stack.api_url}/api/v1"

    def status(job: str) -> tuple[str, int] | None:
        response = httpx.get(f"{api}/jobs/{job}", timeout=10)
        if response.status_code == 404:
            return None
        body = response.json()
        return body["status"], body["active_machines"]

    def exported(job: str) -> str | None:
        text = httpx.get(f"{stack.api_url}/metrics", timeout=10).text
        found = re.search(rf'^minder_job_machines\{{job_id="{job}"\}} (\S+)$', text, re.M)
        return None if found is None else found.group(1)

    stack.start()
    try:
        now = time.time()
        with BatchProducer(
            broker.bootstrap, topic=settings.kafka.metrics_topic, signer=fleet_signer(settings)
        ) as producer:
            for sec in range(-20, 0):
                for job, machine in (("solo", "s1"), ("other", "o1"), ("other", "o2")):
                    producer.send(
                        NodeBatch(job, machine, now + sec, samples=[("cpu_util_ratio", "", 0.4)])
                    )
            producer.flush()
            _wait_for(lambda: status("solo") == ("active", 1), 60, "solo to be active")
            assert exported("solo") == "1.0"
            bye = time.time()
            producer.send(
                NodeBatch("solo", "s1", bye, events=[Event(EventKind.LEAVE, "", bye, None, "bye")])
            )
            producer.flush()
            _wait_for(lambda: status("solo") == ("ended", 0), 60, "solo to end")
            _wait_for(lambda: status("other") == ("active", 2), 60, "other to be active")
            assert exported("solo") is None and exported("other") == "2.0"
            metrics = httpx.get(f"{stack.api_url}/metrics", timeout=10).text
            assert re.search(r"^minder_jobs 1\.0$", metrics, re.M)
    finally:
        stack.stop()
    with session_factory(create_engine_for(settings.database.url))() as session:
        jobs = {job.id: job for job in list_jobs(session)}
    assert (jobs["solo"].status, jobs["solo"].status_reason) == (
        "ended",
        "its last machine said goodbye",
    )
    assert jobs["solo"].machine_count == 1  # the machine it had
    assert (jobs["other"].status, jobs["other"].status_reason) == ("idle", "the service stopped")


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)
