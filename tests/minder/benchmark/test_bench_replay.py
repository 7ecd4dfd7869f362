"""Replaying a scenario without a table gives the alerts of the table and of the live service."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectors.sim import Scenario, iter_batches, simulate_table
from detectors.methods import default_factory
from detectors.offline import detect_table
from minder.benchmark.replay import chunk_bytes_estimate, job_chunks, replay, simulate
from minder.core.alert import Alert
from minder.service.engine import DetectionService

FAULTS = [
    {"type": "ecc_error", "machine": 3, "device": "gpu1", "start_s": 130},
    {"type": "pcie_downgrade", "machine": 9, "device": "gpu2", "start_s": 170.5},
    {"type": "machine_unreachable", "machine": 11, "start_s": 200},
    {"type": "gpu_lost", "machine": 1, "device": "gpu4", "start_s": 230.3},
]


def scenario(**job: Any) -> Scenario:
    spec = {"name": "j", "machines": 12, "machines_per_domain": 4, "step_time_s": 4.0, **job}
    return Scenario.model_validate(
        {
            "seed": 3,
            "duration_s": 300,
            "jobs": [spec],
            "faults": FAULTS,
            "confounders": [{"type": "agent_restart", "machine": 5, "start_s": 150}],
        }
    )


def key(alerts: list[Alert]) -> list[tuple[Any, ...]]:
    return sorted(
        (a.detected_ts, a.machine, a.kind.value, a.metric, a.first_ts, a.devices, round(a.score, 6))
        for a in alerts
    )


def test_replay_gives_the_alerts_of_the_offline_table() -> None:
    scen = scenario(pp_stages=2, missing_rate=0.01, duplicate_rate=0.02)
    offline = detect_table(simulate_table(scen), default_factory())
    replayed = replay(scen, default_factory(), grace_s=0, events=False)
    assert key(replayed.alerts) == key(offline.alerts)
    assert {a.machine for a in offline.alerts} >= {"j-n0003", "j-n0009", "j-n0011"}
    assert replayed.seconds == scen.duration_s == replayed.job_seconds
    assert replayed.machine_seconds == 12 * scen.duration_s
    assert replayed.events == 0 and replayed.samples > 0
    assert replayed.detect_cpu_s > 0


def test_replay_gives_the_alerts_of_the_live_service() -> None:
    """Late and duplicated batches, events, the service's grace: the same alerts as
    DetectionService fed by iter_batches, second by second."""
    scen = scenario(missing_rate=0.01, late_rate=0.05, duplicate_rate=0.02)
    clock = [0.0]
    service = DetectionService(default_factory(), grace_s=2.0, clock=lambda: clock[0])
    live: list[Alert] = []
    for ts, batches in iter_batches(scen):
        clock[0] = ts
        service.ingest(batches)
        live += service.tick()
    clock[0] += 60.0  # nothing more comes: the last seconds are evaluated
    live += service.tick()
    replayed = replay(simulate(scen, cache_bytes=2**30), default_factory(), grace_s=2)
    assert key(replayed.alerts) == key(live)
    assert replayed.events > 0
    # The ECC event fires in the second holding the onset.
    ecc = [a for a in replayed.alerts if a.machine == "j-n0003"]
    assert ecc and min(a.detected_ts for a in ecc) == scen.start_ts + 130


def test_cached_and_regenerated_deliveries_replay_the_same() -> None:
    scen = Scenario.model_validate(
        {
            "seed": 8,
            "duration_s": 150,
            "jobs": [{"name": "k", "machines": 6, "late_rate": 0.05, "duplicate_rate": 0.02}],
            "faults": [{"type": "nic_down", "machine": 2, "device": "mlx5_1", "start_s": 60}],
        }
    )
    cached = simulate(scen, cache_bytes=chunk_bytes_estimate(scen))
    fresh = simulate(scen, cache_bytes=chunk_bytes_estimate(scen) - 1)
    assert cached.cached and not fresh.cached
    a = replay(cached, default_factory())
    b = replay(fresh, default_factory())
    assert key(a.alerts) == key(b.alerts) and a.samples == b.samples and a.events == b.events
    assert a.simulate_cpu_s == 0.0 < b.simulate_cpu_s
    assert any(alert.machine == "k-n0002" for alert in a.alerts)
    chunks = list(job_chunks(cached.jobs[0].plan, scen.start_ts))
    assert sum(c.nbytes for c in chunks) <= chunk_bytes_estimate(scen)
    assert [c.first for c in chunks] == [0, 120]
    with pytest.raises(ValueError, match="grace_s"):
        replay(cached, default_factory(), grace_s=-1)


def test_agent_restarts_alone_raise_no_alert() -> None:
    scen = Scenario.model_validate(
        {
            "seed": 2,
            "duration_s": 240,
            "jobs": [{"name": "r", "machines": 12, "step_time_s": 4.0}],
            "confounders": [
                {"type": "agent_restart", "machine": m, "start_s": s, "duration_s": d}
                for m, s, d in ((1, 60, 4), (7, 100, 8), (1, 170, 2))
            ],
        }
    )
    result = replay(scen, default_factory())
    assert result.alerts == []


def test_resampler_reads_a_scrape_of_the_interval() -> None:
    from minder.benchmark.replay import Resampler

    # series: a gauge, a rate, a count; two machines; 5 s intervals
    r = Resampler(2, ("gpu_util_ratio", "rdma_tx_bytes_per_second", "gpu_xid_count"), 5, 1)
    for sec in range(5):
        machines = np.array([0, 0, 0, 1, 1, 1])
        series = np.array([0, 1, 2, 0, 1, 2])
        values = np.array([sec / 10, 10.0 * sec, 1.0, 0.5, 1.0, 0.0], dtype=np.float32)
        if sec == 4:  # machine 1 is down at the scrape instant: no sample for it
            machines, series, values = machines[:3], series[:3], values[:3]
        r.add(sec, machines, series, values)
    assert list(r.due(4)) == []  # its grace is not over
    [(second, machines, series, values)] = list(r.due(5))
    assert second == 4
    assert machines.tolist() == [0, 0, 0]
    assert values.tolist() == pytest.approx([0.4, 20.0, 5.0])  # last, mean, sum
    r.add(3, np.array([0]), np.array([0]), np.array([1.0], dtype=np.float32))
    assert r.too_late == 1


@pytest.mark.parametrize("interval", [5, 15])
def test_replay_at_a_coarse_interval_detects_at_that_interval(interval: int) -> None:
    from detectors.window import JobWindow

    windows: list[JobWindow] = []
    base = default_factory()

    class Spy:
        def __init__(self) -> None:
            self.inner = base()
            self.horizon_s = self.inner.horizon_s

        def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
            if not windows:
                windows.append(window)
            return self.inner.evaluate(window, now)

        def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
            return self.inner.machine_scores()

    sc = Scenario.model_validate(
        {
            "seed": 3,
            "duration_s": 900,
            "jobs": [{"name": "j", "machines": 12, "machines_per_domain": 4, "step_time_s": 4.3}],
            "faults": [{"type": "machine_unreachable", "machine": 7, "start_s": 400}],
        }
    )
    result = replay(sc, Spy, interval_s=interval)
    assert windows[0].tick_s == interval
    assert [(a.machine, a.kind.value) for a in result.alerts] == [("j-n0007", "silence")]
