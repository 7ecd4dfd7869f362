"""Detection at the sampling intervals real clusters have: 1 s from the agent, 5-60 s from a
scrape, and both within one job."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from detectors.config import DetectorConfig
from detectors.engine import MinderDetector
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind

START = 1_000_020  # a multiple of 60: scrape ticks align with whole minutes

Sample = dict[tuple[str, str], float]
Mutate = Callable[[int, int, Sample], Sample | None]


def machine_second(rng: np.random.Generator, sec: int, offset: float, interval: int = 1) -> Sample:
    """One machine's readings at second ``sec`` of a job whose 6.3 s steps compute for 4.2 s:
    gauges as read at that instant, rates (``rate()`` of a counter) averaged over the
    ``interval`` before it. (A step that divided the interval exactly would show each machine
    the same phase of it at every scrape: instantaneous gauges would then differ by phase.)"""
    computing = sec % 6.3 < 4.2
    busy = float(np.mean([(s % 6.3) < 4.2 for s in range(sec - interval + 1, sec + 1)]))
    out: Sample = {}
    for g in range(4):
        dev = f"gpu{g}"
        out[("gpu_util_ratio", dev)] = float(np.clip(0.97 + rng.normal(0, 0.01), 0, 1))
        out[("gpu_power_watts", dev)] = (600 if computing else 350) * (1 + offset) + float(
            rng.normal(0, 8)
        )
        out[("gpu_xid_count", dev)] = 0.0
    for n in range(2):
        out[("rdma_tx_bytes_per_second", f"mlx5_{n}")] = (busy * 2e8 + (1 - busy) * 2e9) * (
            1 + float(rng.normal(0, 0.02))
        )
    out[("cpu_util_ratio", "")] = float(np.clip(0.3 + rng.normal(0, 0.01), 0, 1))
    return out


def stream(
    *,
    machines: int = 16,
    seconds: int,
    interval: int,
    mutate: Mutate | None = None,
    slow: dict[str, int] | None = None,
    domains: int = 4,
    config: DetectorConfig | None = None,
    seed: int = 0,
    stagger: bool = True,
) -> tuple[list[Alert], JobWindow]:
    """Feed the job to a detector second by second, each machine sampled every ``interval``
    seconds (at its own offset within the interval when ``stagger``, as Prometheus spreads its
    scrapes); metrics in ``slow`` are sampled only every ``slow[metric]`` seconds.
    Returns the alerts and the window."""
    rng = np.random.default_rng(seed)
    offsets = rng.normal(0, 0.02, machines)
    phase = rng.integers(0, interval, machines) if stagger else np.zeros(machines, dtype=int)
    detector = MinderDetector(config or DetectorConfig())
    window = JobWindow("job", horizon_s=detector.horizon_s)
    alerts: list[Alert] = []
    slow = slow or {}
    for sec in range(START, START + seconds):
        for m in range(machines):
            if (sec - int(phase[m])) % interval:
                continue
            sample: Sample | None = machine_second(rng, sec, float(offsets[m]), interval)
            if mutate is not None:
                sample = mutate(m, sec - START, sample)
            if sample is None:
                continue
            window.add_samples(
                sec,
                f"m{m:03d}",
                [
                    (name, dev, v)
                    for (name, dev), v in sample.items()
                    if name not in slow or sec % slow[name] == 0
                ],
                domain=f"leaf-{m * domains // machines}",
            )
        alerts.extend(detector.evaluate(window, sec))
    return alerts, window


def named(alerts: list[Alert]) -> list[tuple[str, AlertKind]]:
    return [(a.machine, a.kind) for a in alerts]


@pytest.mark.parametrize("interval", [1, 5, 15, 60])
def test_window_learns_the_sampling_interval(interval: int) -> None:
    _, window = stream(seconds=6 * interval + 2, interval=interval, machines=8)
    assert window.cadence_known
    assert window.tick_s == interval
    assert set(window.series_every.tolist()[: window.n_series]) == {1}


def test_a_coarse_metric_beside_agent_data_keeps_the_one_second_tick() -> None:
    _, window = stream(seconds=80, interval=1, machines=8, slow={"gpu_power_watts": 15})
    assert window.tick_s == 1
    power = window.columns_of("gpu_power_watts")[0]
    util = window.columns_of("gpu_util_ratio")[0]
    assert set(window.series_every[power].tolist()) == {15}
    assert set(window.series_every[util].tolist()) == {1}


@pytest.mark.parametrize("interval", [1, 5, 15, 60])
def test_a_healthy_job_raises_nothing(interval: int) -> None:
    alerts, _ = stream(seconds=max(600, 40 * interval), interval=interval, seed=interval)
    assert alerts == []


def test_ten_minutes_of_deviation_in_minute_data_is_alerted() -> None:
    def slow_gpu(m: int, t: int, s: Sample) -> Sample:
        if m == 5 and 20 * 60 <= t < 30 * 60:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 0.6
                s[("gpu_util_ratio", f"gpu{g}")] = 0.55
        return s

    alerts, window = stream(seconds=40 * 60, interval=60, mutate=slow_gpu)
    assert window.tick_s == 60
    assert named(alerts) == [("m005", AlertKind.SIMILARITY)]
    onset = START + 20 * 60
    assert alerts[0].detected_ts - onset <= 10 * 60
    assert abs(alerts[0].first_ts - onset) <= 3 * 60
    assert alerts[0].evidence["interval_s"] == 60


@pytest.mark.parametrize("interval", [5, 15, 60])
def test_one_deviating_sample_is_not_a_culprit(interval: int) -> None:
    def spike(m: int, t: int, s: Sample) -> Sample:
        if m == 3 and 30 * interval <= t < 31 * interval:
            for g in range(4):
                s[("gpu_util_ratio", f"gpu{g}")] = 0.0
                s[("gpu_power_watts", f"gpu{g}")] = 60.0
        return s

    alerts, _ = stream(seconds=50 * interval, interval=interval, mutate=spike)
    assert alerts == []


@pytest.mark.parametrize("interval", [15, 60])
def test_one_missed_sample_is_not_silence_but_three_are(interval: int) -> None:
    def missing(m: int, t: int, s: Sample) -> Sample | None:
        if m == 2 and 20 * interval <= t < 21 * interval:
            return None  # one scrape missed
        if m == 9 and t >= 30 * interval:
            return None  # gone for good
        return s

    alerts, _ = stream(seconds=45 * interval, interval=interval, mutate=missing)
    assert named(alerts) == [("m009", AlertKind.SILENCE)]
    gone = START + 30 * interval
    assert gone + 2 * interval <= alerts[0].detected_ts <= gone + 5 * interval


def test_a_deviation_only_in_a_coarse_metric_is_alerted() -> None:
    def hot(m: int, t: int, s: Sample) -> Sample:
        if m == 7 and t >= 300:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 0.6
        return s

    alerts, window = stream(
        seconds=900, interval=1, mutate=hot, slow={"gpu_power_watts": 15}, stagger=False
    )
    assert window.tick_s == 1
    assert [(a.machine, a.kind, a.metric) for a in alerts] == [
        ("m007", AlertKind.SIMILARITY, "gpu_power_watts")
    ]
    # Its own interval's durations: a window of 3 samples, runs of 5 (15 s each).
    assert 60 <= alerts[0].detected_ts - (START + 300) <= 10 * 15


def test_durations_follow_the_interval_with_floors_in_seconds() -> None:
    cfg = DetectorConfig()
    one = cfg.at_interval(1)
    assert (one.window, one.continuity, one.severe_continuity, one.silence_s) == (8, 30, 25, 10)
    for interval in (5, 15, 60):
        c = cfg.at_interval(interval)
        assert c.window >= cfg.window_samples
        # One deviating sample stays in the window mean for `window` evaluations: never enough.
        assert min(c.continuity, c.severe_continuity) > c.window
        assert c.silence_s >= cfg.silence_intervals * interval
    with pytest.raises(ValueError, match="interval_s is 0"):
        cfg.at_interval(0)


def test_a_whole_domain_missing_two_scrapes_is_its_switch_a_lone_machine_is_not() -> None:
    def reboot(m: int, t: int, s: Sample) -> Sample | None:
        if m // 4 == 1 and 20 * 60 <= t < 20 * 60 + 135:  # leaf-1 silent for 2 min 15 s
            return None
        if m == 13 and 30 * 60 <= t < 30 * 60 + 120:  # one machine misses two scrapes
            return None
        return s

    alerts, _ = stream(seconds=40 * 60, interval=60, mutate=reboot, stagger=False)
    assert named(alerts) == [("leaf-1", AlertKind.SILENCE)]
