"""Fair admission of jobs: a producer floods 10,000 made-up job ids, filling the worker's jobs
bound (1,000) before a real job starts, and keeps re-sending them so that none of them goes idle.
The real job, several machines, wins a place (as a job of several machines against the flood of
one node, or as the job the scheduler confirms against fakes of two nodes), says so in the log,
and its fault is alerted on time."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any

import pytest
from fault_harness import (
    FAULTY,
    HEALTHY,
    HOSTILE_PARTITION,
    FaultService,
    Figures,
    wait_until,
)
from test_fault_hostile_producers import FLOOD_ON_TIME_S

from minder.actions.base import ActionOutcome
from minder.core.codec import encode_batch
from minder.core.records import NodeBatch
from minder.service.admission import Confirmation

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FAKES = 10_000
MAX_JOBS = 1_000  # MINDER_DETECTION__MAX_JOBS by default
RESEND_EVERY_S = 3.0
"""The attacker re-sends every fake id this often: far within idle_job_s (900 s) and within
the minute after which a one-shot job gives its place."""


class Attacker:
    """A producer holding the keys of ``nodes`` (signing as they would) that sends a batch of
    every fake job id from each of them, once by :meth:`flood`, then every
    :data:`RESEND_EVERY_S` in a thread of its own until :meth:`stop`."""

    def __init__(self, service: FaultService, nodes: tuple[str, ...]) -> None:
        self.service = service
        self.nodes = nodes
        self.producer = KafkaProducer(
            bootstrap_servers=service.broker.bootstrap,
            enable_idempotence=False,  # Tansu refuses idempotent produce requests
            linger_ms=20,
            batch_size=1 << 20,
        )
        self.end = 0
        """The hostile partition's offset after the last message sent."""
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attacker", daemon=True)

    def flood(self) -> None:
        now = time.time() - 1
        futures = []
        for i in range(FAKES):
            for node in self.nodes:
                batch = NodeBatch(
                    f"flood-{i:05d}", node, now, samples=[("cpu_util_ratio", "", 0.5)]
                )
                payload = encode_batch(batch)
                header = self.service.signer.header(node, payload)
                futures.append(
                    self.producer.send(
                        self.service.topic,
                        value=payload,
                        key=batch.job.encode(),
                        partition=HOSTILE_PARTITION,
                        headers=[header],
                    )
                )
        self.producer.flush(60)
        self.end = max(self.end, *(f.get(timeout=60).offset + 1 for f in futures))
        self.rounds += 1

    def consumed(self) -> bool:
        return self.service.committed(HOSTILE_PARTITION) >= self.end

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.flood()
            if self._stop.wait(RESEND_EVERY_S):
                return

    def stop(self, rounds: int) -> None:
        """Stop after ``rounds`` rounds in all, and wait until they are consumed."""
        assert wait_until(lambda: self.rounds >= rounds, 120) is not None, self.rounds
        self._stop.set()
        self._thread.join(120)
        self.producer.close()
        assert wait_until(self.consumed, 120) is not None, "the re-sent flood was not consumed"


class Scheduler:
    """A scheduler target (test fake of the Slurm or Kubernetes one, log-only here) whose only
    running job is the harness's healthy job, on its eight nodes."""

    name = "fake-scheduler"

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.lock = threading.Lock()

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        with self.lock:
            self.asked.append(job_id)
        time.sleep(0.01)  # a scheduler call is not free
        if job_id != HEALTHY:
            return None
        return frozenset(f"{HEALTHY}-n{i:04d}" for i in range(8))

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        return ActionOutcome(self.name, node, "drain", False, "log-only test target")

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        return ActionOutcome(self.name, node, "resume", False, "log-only test target")


def counted(service: FaultService, name: str, reason: str) -> float:
    return service.metric(name, reason=reason) or 0.0


def flooded(service: FaultService, attacker: Attacker, figures: Figures) -> None:
    """The flood, consumed: the worker holds its bound of jobs, all fake."""
    started = time.monotonic()
    attacker.flood()
    assert wait_until(attacker.consumed, 120) is not None, "the flood was never consumed"
    figures.record("flood consumed after", time.monotonic() - started, "s")
    jobs = service.stack.service.jobs
    assert len(jobs) == MAX_JOBS and HEALTHY not in jobs


def evictions_naming(caplog: pytest.LogCaptureFixture, job: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "minder.service.engine" and "evicted" in r.getMessage()
        if f"for {job!r}" in r.getMessage()
    ]


def test_a_job_of_several_machines_wins_a_place_from_a_flood_of_one_node(
    make_service: Any, figures: Figures, caplog: pytest.LogCaptureFixture
) -> None:
    service: FaultService = make_service()
    attacker = Attacker(service, ("n0",))
    caplog.set_level(logging.WARNING, logger="minder.service.engine")
    flooded(service, attacker, figures)
    attacker.start()
    try:
        service.warm_up()
        healthy = service.fault_then_alert(figures, timeout_s=60)
    finally:
        attacker.stop(rounds=4)  # the flood goes on after the real job took its place
    jobs = service.stack.service.jobs
    assert healthy.on_time(FLOOD_ON_TIME_S), healthy
    assert service.alert_on(FAULTY) is not None
    assert HEALTHY in jobs and len(jobs) == MAX_JOBS
    assert jobs[HEALTHY].window.n_machines == 8
    # One fake gave its place (the healthy job's first batch, from one machine, was refused);
    # the fakes, re-sent, never took it back.
    assert counted(service, "minder_evicted_jobs_total", "for_several_machines") == 1
    assert counted(service, "minder_evicted_jobs_total", "one_shot") == 0
    refused = counted(service, "minder_refused_jobs_total", "too_many_jobs")
    assert FAKES - MAX_JOBS + 1 <= refused <= FAKES - MAX_JOBS + 2  # + the evicted fake
    assert evictions_naming(caplog, HEALTHY), "no log line names the admitted real job"


def test_the_job_the_scheduler_confirms_wins_a_place_from_fakes_of_two_nodes(
    make_service: Any, figures: Figures, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = Scheduler()
    service: FaultService = make_service(scheduler)
    confirmations = service.stack.confirmations
    assert confirmations is not None, "a scheduler target gives the admission its answers"
    # The attacker holds two nodes' keys: each fake job has two machines, as the real one may.
    attacker = Attacker(service, ("n0", "n1"))
    caplog.set_level(logging.WARNING, logger="minder.service.engine")
    flooded(service, attacker, figures)
    attacker.start()
    try:
        service.warm_up()
        confirmed = wait_until(lambda: confirmations.state(HEALTHY) is Confirmation.CONFIRMED, 30)
        figures.record("healthy job confirmed after its warm-up", confirmed, "s")
        assert confirmed is not None, "the scheduler was never asked about the real job"
        healthy = service.fault_then_alert(figures, timeout_s=60)
    finally:
        attacker.stop(rounds=4)
    jobs = service.stack.service.jobs
    assert healthy.on_time(FLOOD_ON_TIME_S), healthy
    assert HEALTHY in jobs and len(jobs) == MAX_JOBS
    assert counted(service, "minder_evicted_jobs_total", "for_confirmed_job") == 1
    assert counted(service, "minder_evicted_jobs_total", "for_several_machines") == 0
    assert (service.metric("minder_scheduler_lookups_total", outcome="confirmed") or 0) >= 1
    assert (service.metric("minder_scheduler_lookups_total", outcome="not_found") or 0) >= 1
    assert HEALTHY in scheduler.asked
    assert evictions_naming(caplog, HEALTHY), "no log line names the admitted real job"
