"""Fair admission at the jobs bound: the scheduler's cached answers, the order in which jobs
give their place, the rate-limited log lines and the counters of refused and evicted jobs."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from detectors.methods import default_factory
from minder.actions.base import ActionError
from minder.core.records import NodeBatch
from minder.service.admission import (
    MAX_PRIORITY,
    ONE_SHOT_IDLE_S,
    Confirmation,
    JobConfirmations,
    LogDigest,
    RefusedJobs,
    job_key,
)
from minder.service.engine import DetectionService, ServiceLimits
from minder.service.telemetry import ServiceMetrics

NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeScheduler:
    """A scheduler that knows ``running`` jobs (job -> nodes), counts the questions, and fails
    while ``down`` is set (as an unreachable controller does)."""

    def __init__(self, running: dict[str, frozenset[str]] | None = None) -> None:
        self.running = dict(running or {})
        self.asked: list[str] = []
        self.down = False
        self.lock = threading.Lock()

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        with self.lock:
            self.asked.append(job_id)
        if self.down:
            raise ActionError("slurm: controller unreachable", transient=True)
        return self.running.get(job_id)


def drain(confirmations: JobConfirmations) -> int:
    looked = 0
    while confirmations.lookup_once():
        looked += 1
    return looked


# -- the scheduler's cached answers ------------------------------------------------------------


def test_answers_are_looked_up_off_the_caller_and_cached_for_their_ttl() -> None:
    clock = Clock(0.0)
    outcomes: list[str] = []
    scheduler = FakeScheduler({"4242": frozenset({"n1", "n2"})})
    confirmations = JobConfirmations(
        scheduler,
        confirmed_ttl_s=600,
        not_found_ttl_s=120,
        clock=clock,
        on_outcome=outcomes.append,
    )
    assert confirmations.state("4242", priority=2) is Confirmation.UNKNOWN
    assert confirmations.state("fake-1", priority=1) is Confirmation.UNKNOWN
    assert scheduler.asked == []  # the caller never waits for the scheduler
    assert drain(confirmations) == 2
    assert confirmations.state("4242", priority=2) is Confirmation.CONFIRMED
    assert confirmations.state("fake-1", priority=1) is Confirmation.NOT_FOUND
    assert sorted(outcomes) == ["confirmed", "not_found"]
    # Within their TTLs the answers are not asked again.
    clock.now = 100.0
    confirmations.state("4242", priority=2)
    confirmations.state("fake-1", priority=1)
    assert confirmations.pending == 0
    # "Not found" is asked again after 120 s, a confirmation after 600 s; the old answer holds
    # until the new one comes.
    clock.now = 130.0
    assert confirmations.state("fake-1", priority=1) is Confirmation.NOT_FOUND
    assert confirmations.state("4242", priority=2) is Confirmation.CONFIRMED
    assert confirmations.pending == 1
    scheduler.running["fake-1"] = frozenset({"n9"})
    drain(confirmations)
    assert confirmations.state("fake-1") is Confirmation.CONFIRMED
    clock.now = 601.0
    del scheduler.running["4242"]  # the job ended
    assert confirmations.state("4242", priority=2) is Confirmation.CONFIRMED
    drain(confirmations)
    assert confirmations.state("4242") is Confirmation.NOT_FOUND
    assert scheduler.asked == ["4242", "fake-1", "fake-1", "4242"]


def test_an_unreachable_scheduler_keeps_the_last_answer_and_is_asked_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(0.0)
    outcomes: list[str] = []
    scheduler = FakeScheduler({"7": frozenset({"n1"})})
    confirmations = JobConfirmations(
        scheduler, confirmed_ttl_s=60, error_retry_s=30, clock=clock, on_outcome=outcomes.append
    )
    confirmations.state("7", priority=1)
    drain(confirmations)
    scheduler.down = True
    clock.now = 61.0
    confirmations.state("7", priority=1)
    confirmations.state("8", priority=1)
    with caplog.at_level(logging.WARNING, logger="minder.service.admission"):
        drain(confirmations)
    assert confirmations.state("7") is Confirmation.CONFIRMED  # kept
    assert confirmations.state("8") is Confirmation.UNKNOWN
    assert outcomes == ["confirmed", "error", "error"]
    [line] = [r.getMessage() for r in caplog.records]  # one line a minute at most
    assert "controller unreachable" in line
    # Not asked again before error_retry_s, asked again after it.
    clock.now = 80.0
    confirmations.state("7", priority=1)
    confirmations.state("8", priority=1)
    assert confirmations.pending == 0
    scheduler.down = False
    clock.now = 92.0
    confirmations.state("8", priority=1)
    drain(confirmations)
    assert confirmations.state("8") is Confirmation.NOT_FOUND


def test_jobs_of_more_machines_are_looked_up_first_and_the_queue_is_bounded() -> None:
    outcomes: list[str] = []
    scheduler = FakeScheduler()
    confirmations = JobConfirmations(scheduler, max_pending=3, on_outcome=outcomes.append)
    for job in ("fake-1", "fake-2", "fake-3"):
        confirmations.state(job, priority=1)
    confirmations.state("fake-4", priority=1)  # full, no higher: the new one is dropped
    confirmations.state("real", priority=8)  # takes the place of the oldest of the lowest
    confirmations.state("fake-2", priority=5)  # asked for again by more machines: moves up
    confirmations.state("huge", priority=10_000)
    assert outcomes == ["dropped", "dropped", "dropped"]
    drain(confirmations)
    assert scheduler.asked == ["huge", "real", "fake-2"]
    assert MAX_PRIORITY < 10_000  # capped, not unbounded


def test_the_lookup_thread_answers_without_exceeding_its_rate() -> None:
    scheduler = FakeScheduler({"1": frozenset({"a", "b"})})
    confirmations = JobConfirmations(scheduler, lookups_per_s=10)
    confirmations.start()
    try:
        started = time.monotonic()
        for i in range(1, 40):
            confirmations.state(str(i), priority=1)
        deadline = time.monotonic() + 10
        while confirmations.state("1") is Confirmation.UNKNOWN and time.monotonic() < deadline:
            time.sleep(0.01)
        assert confirmations.state("1") is Confirmation.CONFIRMED
        time.sleep(0.5)
        elapsed = time.monotonic() - started
    finally:
        confirmations.close()
    assert len(scheduler.asked) <= 10 * elapsed + 1


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_intervals_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="lookups_per_s"):
        JobConfirmations(FakeScheduler(), lookups_per_s=bad)


# -- the service at its jobs bound -----------------------------------------------------------


def service(
    max_jobs: int, clock: Clock, scheduler: FakeScheduler | None = None
) -> DetectionService:
    confirmations = None if scheduler is None else JobConfirmations(scheduler, clock=clock)
    return DetectionService(
        default_factory(),
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=clock,
        limits=ServiceLimits(max_jobs=max_jobs),
        confirmations=confirmations,
    )


def batch(job: str, node: str, ts: float) -> NodeBatch:
    return NodeBatch(job, node, ts, samples=[("gpu_util_ratio", "gpu0", 0.9)])


def value(s: DetectionService, name: str, **labels: str) -> float:
    found = s.metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_one_shot_jobs_go_first_then_single_machine_jobs_longest_idle_first() -> None:
    clock = Clock()
    s = service(4, clock)
    s.ingest([batch("one-shot", "n0", clock.now)])
    for t in range(5):  # a single-machine job that keeps sending
        clock.now = NOW + t
        s.ingest([batch("steady", "n0", clock.now)])
    s.ingest([batch("pair", f"p{i}", clock.now) for i in range(2)])
    clock.now = NOW + 10
    s.ingest([batch("recent", "n0", clock.now)])
    assert len(s.jobs) == 4
    # Nobody is one-shot yet: a single-machine newcomer is refused.
    clock.now = NOW + 20
    s.ingest([batch("late", "n0", clock.now)])
    assert "late" not in s.jobs
    # A minute later the one-shot job gives its place to any newcomer, and only it does.
    clock.now = NOW + ONE_SHOT_IDLE_S + 1
    s.ingest([batch("late", "n0", clock.now)])
    assert set(s.jobs) == {"steady", "pair", "recent", "late"}
    assert value(s, "minder_evicted_jobs_total", reason="one_shot") == 1
    s.ingest([batch("late-2", "n0", clock.now)])
    assert "late-2" not in s.jobs
    # A job of several machines takes the place of the single-machine job idle longest
    # ("steady": last batch at +4), never that of a job of several machines.
    clock.now += 2
    s.ingest([batch("real", "r0", clock.now)])
    assert "real" not in s.jobs  # one machine so far: worth no more than the others
    s.ingest([batch("real", "r1", clock.now)])
    assert set(s.jobs) == {"pair", "recent", "late", "real"}
    clock.now += 2
    s.ingest([batch("real-2", f"q{i}", clock.now) for i in range(2)])
    assert set(s.jobs) == {"pair", "late", "real", "real-2"}  # "recent" (+10) before "late"
    # Their first batches were refused: the next second all their machines are in.
    s.ingest([batch(job, f"{node}{i}", clock.now) for job, node in (("real", "r"), ("real-2", "q"))
              for i in range(2)])  # fmt: skip
    clock.now += 2
    s.ingest([batch("real-3", f"x{i}", clock.now) for i in range(3)])
    assert set(s.jobs) == {"pair", "real", "real-2", "real-3"}
    clock.now += 2
    s.ingest([batch("real-4", f"y{i}", clock.now) for i in range(3)])
    assert "real-4" not in s.jobs  # every job left has several machines
    assert value(s, "minder_evicted_jobs_total", reason="for_several_machines") == 3


def test_a_confirmed_job_takes_the_place_of_an_unconfirmed_one_never_the_reverse() -> None:
    clock = Clock()
    scheduler = FakeScheduler({"4242": frozenset({"c0"}), "5000": frozenset({"d0", "d1"})})
    s = service(2, clock, scheduler)
    assert s.confirmations is not None
    s.ingest([batch("pair", f"p{i}", clock.now) for i in range(4)])
    s.ingest([batch("5000", f"d{i}", clock.now) for i in range(2)])
    clock.now += 10
    s.tick()  # queues the live jobs for a lookup
    drain(s.confirmations)
    # 4242 is refused until the scheduler has answered, then it takes the place of "pair".
    s.ingest([batch("4242", "c0", clock.now)])
    assert "4242" not in s.jobs
    drain(s.confirmations)
    clock.now += 2
    s.ingest([batch("4242", "c0", clock.now)])
    assert set(s.jobs) == {"5000", "4242"}
    assert value(s, "minder_evicted_jobs_total", reason="for_confirmed_job") == 1
    # An unconfirmed job, however many machines, takes no confirmed job's place.
    clock.now += 2
    s.ingest([batch("pair", f"p{i}", clock.now) for i in range(8)])
    assert set(s.jobs) == {"5000", "4242"}
    assert set(scheduler.asked) >= {"pair", "5000", "4242"}


def test_a_job_with_batches_in_the_same_poll_keeps_its_place() -> None:
    clock = Clock()
    s = service(2, clock)
    s.ingest([batch("a", "n0", clock.now), batch("b", "n0", clock.now)])
    clock.now += 5
    # "a" sends in the same poll as the newcomer of two machines: "b" gives its place.
    s.ingest([batch("a", "n0", clock.now), batch("new", "m0", clock.now),
              batch("new", "m1", clock.now), batch("a", "n0", clock.now)])  # fmt: skip
    assert set(s.jobs) == {"a", "new"}
    assert s.jobs["a"].batches == 3


def test_a_real_job_wins_a_place_against_a_flood_of_resent_fake_ids() -> None:
    clock = Clock()
    s = service(50, clock)
    fakes = [f"flood-{i:04d}" for i in range(1_000)]
    for round_ in range(5):  # the attacker keeps re-sending every fake id
        clock.now = NOW + round_
        s.ingest([batch(job, "n0", clock.now) for job in fakes])
        s.tick()
    assert len(s.jobs) == 50 and "real" not in s.jobs
    nodes = [f"real-n{i}" for i in range(8)]
    clock.now += 1
    s.ingest([batch("real", nodes[0], clock.now)] + [batch(j, "n0", clock.now) for j in fakes])
    s.ingest([batch("real", node, clock.now) for node in nodes[1:]])
    assert "real" in s.jobs and len(s.jobs) == 50
    assert s.jobs["real"].window.n_machines == 7  # its first batch was refused
    assert value(s, "minder_evicted_jobs_total", reason="for_several_machines") == 1
    assert value(s, "minder_refused_jobs_total", reason="too_many_jobs") == 950 + 1
    assert value(s, "minder_batches_rejected_total", reason="too_many_jobs") == 6 * 950 + 1


# -- what is said and counted about refused jobs -----------------------------------------------


def test_refused_jobs_are_named_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    s = service(2, clock)
    s.ingest([batch(job, f"n{i}", clock.now) for job in ("a", "b") for i in range(3)])
    with caplog.at_level(logging.WARNING, logger="minder.service.engine"):
        s.ingest([batch(f"fake-{i}", "n0", clock.now) for i in range(500)])
        clock.now += 1
        s.ingest([batch("blocked", f"b{i}", clock.now) for i in range(3)])  # several machines
        s.tick()
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(lines) == 1  # the first refusal, at once
        assert "'fake-0'" in lines[0]
        clock.now += 10
        s.tick()
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2
    assert "too_many_jobs" in lines[1]
    assert "'blocked' (3 machine(s), 3 batch(es))" in lines[1]  # the weightiest named first
    assert "502 batch(es) of 500 job(s)" in lines[1]
    assert "and 495 more" in lines[1]
    assert all(len(line) < 1000 for line in lines)


def test_refused_jobs_are_counted_once_while_refused_and_again_after_a_while() -> None:
    clock = Clock()
    s = DetectionService(
        default_factory(),
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=clock,
        limits=ServiceLimits(max_jobs=1),
        idle_job_s=100,
    )
    s.ingest([batch("a", "n0", clock.now)])
    for t in range(5):
        clock.now = NOW + t
        s.ingest([batch("x", "n0", clock.now), batch("y" * 300, "n0", clock.now)])
    assert value(s, "minder_refused_jobs_total", reason="too_many_jobs") == 1
    assert value(s, "minder_refused_jobs_total", reason="name_too_long") == 1
    assert value(s, "minder_batches_rejected_total", reason="too_many_jobs") == 5
    clock.now += 101  # forgotten after idle_job_s without a refusal: counted again
    s.ingest([batch("a", "n0", clock.now), batch("x", "n0", clock.now)])
    assert value(s, "minder_refused_jobs_total", reason="too_many_jobs") == 2


def test_log_digest_names_the_weightiest_and_counts_the_rest() -> None:
    digest = LogDigest(every_s=10, names=2)
    first = digest.add("a", 1, "one", 0.0)
    assert first is not None and first.names() == "'a' (one)"
    for i, now in enumerate((1.0, 2.0, 3.0, 4.0)):
        assert digest.add(f"s{i}", i, f"w{i}", now) is None
    assert digest.add("s0", 9, "again", 5.0) is None
    assert digest.due(9.9) is None
    said = digest.due(10.0)
    assert said is not None
    assert (said.events, said.subjects) == (5, 4)
    assert said.names() == "'s0' (again), 's3' (w3) and 2 more"
    assert digest.due(30.0) is None  # nothing new


def test_refused_jobs_memory_is_bounded_and_keeps_long_ids_short() -> None:
    refused = RefusedJobs(max_kept=3, memory_s=60)
    for i in range(5):
        refused.note("too_many_jobs", f"j{i}", "n0", float(i))
    assert len(refused) == 3
    entry = refused.note("name_too_long", "z" * 65_536, "n" * 1_000, 10.0)
    assert len(entry.job) < 120 and entry.job == job_key("z" * 65_536)
    assert job_key("z" * 65_536) != job_key("z" * 65_535 + "y")
    assert all(len(node) <= 256 for node in entry.nodes)
