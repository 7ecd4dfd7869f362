"""The detection loop without Kafka: data time, grace, idle jobs, metrics."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry

from collectors.sim import Scenario, iter_batches
from detectors.methods import default_factory
from minder.core.alert import Alert
from minder.core.records import Event, EventKind, NodeBatch
from minder.service.engine import DetectionService
from minder.service.telemetry import ServiceMetrics

SCENARIO = Scenario.model_validate(
    {
        "seed": 2,
        "duration_s": 60,
        "jobs": [
            {"name": "a", "machines": 8, "step_time_s": 3.0},
            {"name": "b", "machines": 8, "step_time_s": 4.0},
        ],
        "faults": [{"type": "gpu_xid", "job": "b", "machine": 5, "device": "gpu0", "start_s": 20}],
    }
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _service(clock: Clock) -> DetectionService:
    metrics = ServiceMetrics(CollectorRegistry())
    return DetectionService(default_factory(), grace_s=2, metrics=metrics, clock=clock,
                            idle_job_s=60)  # fmt: skip


def test_each_second_is_evaluated_once_after_the_grace_period() -> None:
    clock = Clock()
    service = _service(clock)
    alerts = []
    for _, batches in iter_batches(SCENARIO):
        service.ingest(batches)
        alerts += service.tick()
        for state in service.jobs.values():
            assert state.evaluated_sec == state.window.newest_sec - 2
    assert [(a.job, a.machine) for a in alerts] == [("b", "b-n0005")]
    assert set(service.jobs) == {"a", "b"}
    # Replaying the same tick changes nothing: every second was evaluated exactly once.
    assert service.tick() == []
    registry = service.metrics.registry
    assert registry.get_sample_value("minder_alerts_total", {"kind": "rule"}) == 1
    assert registry.get_sample_value("minder_jobs") == 2
    assert registry.get_sample_value("minder_machines") == 16
    assert (
        registry.get_sample_value("minder_machine_score", {"job_id": "a", "machine": "a-n0001"})
        >= 0
    )


def test_samples_older_than_the_window_are_counted() -> None:
    service = _service(Clock())
    service.ingest([NodeBatch("j", "n1", 1000.5, samples=[("cpu_util_ratio", "", 0.5)])])
    service.ingest([NodeBatch("j", "n1", 900.5, samples=[("cpu_util_ratio", "", 0.5)])])
    assert service.metrics.registry.get_sample_value("minder_samples_too_old_total") == 1


def test_idle_jobs_are_dropped_with_their_series() -> None:
    clock = Clock()
    service = _service(clock)
    service.ingest([NodeBatch("j", f"n{i}", 1000.5, samples=[("cpu_util_ratio", "", 0.5)])
                    for i in range(5)])  # fmt: skip
    service.tick()
    assert "j" in service.jobs
    clock.now += 61
    service.tick()
    assert service.jobs == {}
    assert service.metrics.registry.get_sample_value("minder_jobs") == 0


def test_processing_lag_is_wall_clock_minus_newest_sample() -> None:
    clock = Clock()
    service = _service(clock)
    service.ingest([NodeBatch("j", "n1", clock.now - 3.5, samples=[("cpu_util_ratio", "", 0.5)])])
    assert service.metrics.registry.get_sample_value("minder_processing_lag_seconds") == 3.5


def test_batches_from_a_clock_far_ahead_are_refused_and_counted() -> None:
    clock = Clock()
    service = _service(clock)
    good = [NodeBatch("j", f"n{i}", clock.now - 5, samples=[("cpu_util_ratio", "", 0.5)])
            for i in range(5)]  # fmt: skip
    ahead = NodeBatch("j", "n9", clock.now + 1e7, samples=[("cpu_util_ratio", "", 0.5)])
    assert service.ingest([*good, ahead]) == 5
    assert service.jobs["j"].window.newest_sec == int(clock.now - 5)
    assert (
        service.metrics.registry.get_sample_value(
            "minder_batches_rejected_total", {"reason": "future_timestamp"}
        )
        == 1
    )


def test_last_seconds_are_evaluated_once_the_data_stops() -> None:
    clock = Clock()
    service = _service(clock)
    for sec in range(10):
        service.ingest([NodeBatch("j", f"n{i}", 1000.5 + sec, samples=[("cpu_util_ratio", "", 0.5)])
                        for i in range(5)])  # fmt: skip
        service.tick()
    assert service.jobs["j"].evaluated_sec == 1007  # 1009 minus the 2 s grace
    clock.now += 5  # nothing arrives for longer than the grace
    service.tick()
    assert service.jobs["j"].evaluated_sec == 1009


def test_an_alert_the_store_refused_is_stored_on_a_later_tick() -> None:
    from minder.core.alert import Alert, AlertKind

    class FlakyStore:
        def __init__(self) -> None:
            self.fail = True
            self.stored: list[Alert] = []

        def record_alert(self, alert: Alert) -> tuple[Alert, bool]:
            if self.fail:
                raise ConnectionError("database restarting")
            self.stored.append(alert)
            return alert, True

        def save_job(self, job) -> None:
            pass

    store = FlakyStore()
    service = DetectionService(default_factory(), store=store,  # type: ignore[arg-type]
                               metrics=ServiceMetrics(CollectorRegistry()))  # fmt: skip
    alert = Alert("j", "n1", AlertKind.RULE, "gpu_xid_count", 1.0, 100.0, 100.0)
    assert service._deliver(alert) is alert  # delivered downstream although not stored
    assert store.stored == []
    service.tick()
    assert store.stored == []  # still failing: kept
    store.fail = False
    service.tick()
    assert [a.id for a in store.stored] == [alert.id]


def test_a_node_with_a_fast_clock_does_not_drag_the_job_ahead() -> None:
    clock = Clock()
    service = _service(clock)
    for sec in range(20):
        ts = clock.now - 30 + sec
        batches = [NodeBatch("j", f"n{i}", ts, samples=[("cpu_util_ratio", "", 0.5)])
                   for i in range(9)]  # fmt: skip
        batches.append(NodeBatch("j", "fast", ts + 8, samples=[("cpu_util_ratio", "", 0.5)]))
        service.ingest(batches)
        service.tick()
    state = service.jobs["j"]
    assert state.evaluated_sec == int(clock.now - 30 + 19) - 2
    assert state.window.stats.too_old == 0


def test_an_ingest_spanning_more_than_the_window_is_evaluated_part_way() -> None:
    """A backlog drained in large polls (small packed batches: minutes of a small job in one
    poll) raises the same alerts, at the same data seconds, as the stream second by second."""
    scenario = Scenario.model_validate(
        {
            "seed": 3,
            "duration_s": 160,
            "jobs": [{"name": "b", "machines": 8, "step_time_s": 4.0}],
            "faults": [
                {"type": "gpu_xid", "job": "b", "machine": 5, "device": "gpu0", "start_s": 70},
                {"type": "thermal_throttle", "job": "b", "machine": 2, "start_s": 40},
            ],
        }
    )
    seconds = [batches for _, batches in iter_batches(scenario)]
    live = _service(Clock())
    expected = []
    for batches in seconds:
        live.ingest(batches)
        expected += live.tick()
    drained = _service(Clock())
    got = []
    for batches in seconds[:10]:
        drained.ingest(batches)
        got += drained.tick()
    drained.ingest([batch for batches in seconds[10:] for batch in batches])  # 150 s at once
    got += drained.tick()
    assert drained.jobs["b"].window.horizon_s < 150
    key = [(a.machine, a.kind, a.metric, a.first_ts, a.detected_ts) for a in expected]
    assert [(a.machine, a.kind, a.metric, a.first_ts, a.detected_ts) for a in got] == key
    assert {a.machine for a in expected} == {"b-n0005", "b-n0002"}


def _samples(rng: np.random.Generator, dead: bool, waiting: bool) -> list[tuple[str, str, float]]:
    util = 0.0 if dead else (1.0 if waiting else 0.95 + rng.normal(0, 0.01))
    power = 76.0 if dead else (160.0 if waiting else 600.0) + rng.normal(0, 6)
    out = [("gpu_util_ratio", f"gpu{g}", util) for g in range(4)]
    return out + [("gpu_power_watts", f"gpu{g}", power) for g in range(4)]


ORIGIN = 1_800_000_000


def _run(
    service: DetectionService,
    clock: Clock,
    seconds: range,
    jobs: dict[str, tuple[str, int]],
    rng: np.random.Generator,
) -> list[Alert]:
    """One batch per machine per second of ``seconds`` for each job in ``jobs`` (16 machines
    of 4 GPUs; ``(machine, at)``: that machine's process dies at second ``at`` and the others
    spin in the collective that waits for it); the clock follows the data. Returns the alerts."""
    alerts = []
    for sec in seconds:
        batches = []
        for job, (dies, at) in jobs.items():
            for i in range(16):
                machine = f"{job}-n{i:02d}"
                samples = _samples(rng, machine == dies and sec >= at, sec >= at)
                batches.append(NodeBatch(job, machine, ORIGIN + sec, samples=samples))
        clock.now = ORIGIN + sec + 1.0
        service.ingest(batches)
        alerts += service.tick()
    return alerts


def _named(alerts: list[Alert]) -> list[tuple[str, object]]:
    return [(a.machine, a.evidence.get("apart_at_end")) for a in alerts]


def test_a_job_killed_by_its_fault_names_the_machine_when_its_data_ends() -> None:
    """The process on t-n05 dies 8 s before the job is torn down: too short for continuity at
    1 s. The job's data ends (nothing of it for JOB_STOPPED_S while another job still reports)
    and the service tells the detector once: the machine is named."""
    clock, rng = Clock(), np.random.default_rng(3)
    service = _service(clock)
    healthy = ("none", 10**6)
    both = {"t": ("t-n05", 150), "other": healthy}
    assert _run(service, clock, range(158), both, rng) == []
    assert _run(service, clock, range(158, 163), {"other": healthy}, rng) == []  # a pause
    alerts = _run(service, clock, range(163, 170), {"other": healthy}, rng)
    assert _named(alerts) == [("t-n05", True)]
    assert alerts[0].detected_ts == ORIGIN + 157  # the job's last second, evaluated
    assert _run(service, clock, range(170, 200), {"other": healthy}, rng) == []  # told once


def test_the_last_goodbyes_evaluate_the_jobs_last_seconds_then_end_it() -> None:
    """Every machine's goodbye comes right after its last data: the seconds the grace still
    held are evaluated first, then the job's data ended, and the machine is named."""
    clock, rng = Clock(), np.random.default_rng(3)
    service = _service(clock)
    assert _run(service, clock, range(158), {"t": ("t-n05", 150)}, rng) == []
    ts = ORIGIN + 158
    service.ingest([NodeBatch("t", f"t-n{i:02d}", ts, events=[
        Event(EventKind.LEAVE, "", ts, None, "agent stopped")]) for i in range(16)])  # fmt: skip
    alerts = service.tick()
    assert _named(alerts) == [("t-n05", True)]
    assert alerts[0].detected_ts == ORIGIN + 157  # not 155: the grace's seconds came first


def test_a_stream_that_stalls_as_a_whole_ends_no_job() -> None:
    """A broker outage: no job's data arrives for a minute. That is no job's end: nothing is
    named for it, and the job goes on when the data comes back."""
    clock, rng = Clock(), np.random.default_rng(3)
    service = _service(clock)
    assert _run(service, clock, range(158), {"t": ("t-n05", 150)}, rng) == []
    for _ in range(6):
        clock.now += 10.0
        assert service.tick() == []
    assert not service.jobs["t"].finished


def test_a_healthy_job_whose_data_ends_names_nobody() -> None:
    clock, rng = Clock(), np.random.default_rng(3)
    service = _service(clock)
    healthy = ("none", 10**6)
    assert _run(service, clock, range(158), {"t": healthy, "other": healthy}, rng) == []
    assert _run(service, clock, range(158, 200), {"other": healthy}, rng) == []
    assert service.jobs["t"].finished
