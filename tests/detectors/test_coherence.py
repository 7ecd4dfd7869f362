"""Peer scores that hold on how real metrics move, and jobs whose machines are not peers.

The tables are built here, with their own noise, so they are no copy of the simulator the
detector was tuned on: a job whose traffic swings in lockstep with the step's phases (read at a
fixed phase at coarse cadence), a serving fleet whose pods idle most of the time, undeclared
mixed roles, a domain fault, and jobs too small to have peers.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pandas as pd
import pytest

from detectors.coherence import PeerCoherence
from detectors.offline import DetectionRun, detect_table
from minder.core.alert import AlertKind
from minder.core.table import normalize_table

GPUS = 4


def _table(
    values: dict[str, np.ndarray], interval_s: int, domains: list[str] | None = None
) -> pd.DataFrame:
    """Canonical rows from ``values[metric]`` shaped (time, machine, gpu)."""
    parts = []
    start = 1_700_000_000
    for metric, cube in values.items():
        t, n, g = cube.shape
        ts = np.repeat(start + np.arange(t) * interval_s, n * g).astype(float)
        machine = np.tile(np.repeat([f"m{i:03d}" for i in range(n)], g), t)
        device = np.tile([f"gpu{j}" for j in range(g)], t * n)
        frame = {
            "ts": ts,
            "job": "job",
            "machine": machine,
            "metric": metric,
            "value": cube.reshape(-1).astype(float),
            "device": device,
        }
        if domains is not None:
            frame["domain"] = np.tile(np.repeat(domains, g), t)
        parts.append(pd.DataFrame(frame))
    return normalize_table(pd.concat(parts, ignore_index=True))


def _lockstep(rng: np.random.Generator, t: int, n: int, swing: float = 4.0) -> np.ndarray:
    """NVLink traffic that swings up to ``swing`` x between samples in lockstep (the step's
    phases read at a fixed phase), peers within about +-20 % of each other at every instant."""
    phase = rng.uniform(1.0, swing, size=t)  # the same phase for every machine at an instant
    base = 40e9 * phase[:, None, None]
    return base * (1 + rng.uniform(-0.2, 0.2, size=(t, n, GPUS)))


def _similarity(run: DetectionRun) -> set[str]:
    return {a.machine for a in run.alerts if a.kind is AlertKind.SIMILARITY}


@pytest.mark.parametrize("interval_s", [5, 15, 60])
def test_lockstep_swing_does_not_hide_a_machine_far_below_its_peers(interval_s: int) -> None:
    """The issue's missed case: a machine's NVLink traffic falls to 1/8 of its peers' for 100
    samples while every machine swings up to 4x from one sample to the next in lockstep."""
    rng = np.random.default_rng(7)
    t, n = 160, 32
    nvlink = _lockstep(rng, t, n)
    nvlink[40:140, 9] /= 8
    run = detect_table(_table({"gpu_nvlink_tx_bytes_per_second": nvlink}, interval_s))
    assert _similarity(run) == {"m009"}
    alert = next(a for a in run.alerts if a.machine == "m009")
    assert alert.metric == "gpu_nvlink_tx_bytes_per_second"
    # Named within a few evaluations of the fault, not at the end of it.
    assert alert.detected_ts - (1_700_000_000 + 40 * interval_s) <= 12 * interval_s


def test_lockstep_swing_alone_raises_nothing() -> None:
    rng = np.random.default_rng(8)
    nvlink = _lockstep(rng, 200, 32)
    run = detect_table(_table({"gpu_nvlink_tx_bytes_per_second": nvlink}, 5))
    assert run.alerts == []
    assert run.findings == []


@pytest.mark.parametrize("phase", [0, 1, 2, 3])
def test_fault_named_whatever_the_phase_the_cadence_samples(phase: int) -> None:
    """A 4-phase step read at a fixed phase: a different phase per case, same verdict."""
    rng = np.random.default_rng(phase)
    levels = np.array([1.0, 4.0, 2.5, 1.5])
    t, n = 150, 24
    level = levels[(np.arange(t) + phase) % 4]
    nvlink = 30e9 * level[:, None, None] * (1 + rng.normal(0, 0.05, size=(t, n, GPUS)))
    nvlink[50:130, 3] *= 0.125
    run = detect_table(_table({"gpu_nvlink_tx_bytes_per_second": nvlink}, 15))
    assert _similarity(run) == {"m003"}


def _serving_fleet(rng: np.random.Generator, t: int, n: int) -> np.ndarray:
    """GPU use of a serving fleet sampled each minute: most pods idle at exactly 0 % most of the
    time; a few serve requests at a time, in sessions of 5-60 minutes, different pods later."""
    util = np.zeros((t, n, GPUS))
    for pod in range(n):
        minute = int(rng.integers(0, 60))
        while minute < t:
            length = int(rng.integers(5, 60))
            if rng.random() < 0.35:
                load = rng.uniform(0.2, 1.0)
                noise = rng.normal(0, 0.05, size=(min(length, t - minute), GPUS))
                util[minute : minute + length, pod] = np.clip(load + noise, 0, 1)
            minute += length + int(rng.integers(30, 240))
    return np.round(util, 2)  # integer percent, as DCGM reports it


def test_serving_fleet_is_not_peer_comparable_and_raises_almost_nothing() -> None:
    rng = np.random.default_rng(11)
    t, n = 12 * 60, 96  # 12 hours at one sample a minute
    util = _serving_fleet(rng, t, n)
    power = 70 + 330 * util + rng.normal(0, 3, size=util.shape)
    run = detect_table(_table({"gpu_util_ratio": util, "gpu_power_watts": power}, 60))
    machine_hours = n * t / 60
    assert len(run.alerts) <= machine_hours / 1000, [a.summary() for a in run.alerts]
    found = {f["metric"] for f in run.findings if f["finding"] == "not_peer_comparable"}
    assert found == {"gpu_util_ratio", "gpu_power_watts"}
    for f in run.findings:
        assert 0 <= f["coherence"] < 1 and f["outliers"] > f["allowance"]


def test_undeclared_mixed_roles_stop_similarity_alerts() -> None:
    """A fifth of the machines do a different job (no group label): their power differs from
    the others'; that is no fault. (An even split has a wide robust scale: nobody is an
    outlier then, and nothing needs saying.)"""
    rng = np.random.default_rng(3)
    t, n = 120, 40
    power = np.where(np.arange(n)[None, :, None] % 5 == 0, 250.0, 650.0) + rng.normal(
        0, 10, size=(t, n, GPUS)
    )
    run = detect_table(_table({"gpu_power_watts": power}, 15))
    assert _similarity(run) == set()
    assert [f["metric"] for f in run.findings] == ["gpu_power_watts"]


def test_declared_roles_keep_their_own_peers() -> None:
    """The same fleet with its roles declared (``group``) is two peer groups: comparable, and a
    fault inside one group is named."""
    rng = np.random.default_rng(3)
    t, n = 120, 40
    power = np.where(np.arange(n)[None, :, None] % 5 == 0, 250.0, 650.0) + rng.normal(
        0, 10, size=(t, n, GPUS)
    )
    power[40:110, 6] = 120.0
    table = _table({"gpu_power_watts": power}, 15)
    table["group"] = np.where(table["machine"].str[1:].astype(int) % 5 == 0, "a", "b")
    run = detect_table(normalize_table(table))
    assert _similarity(run) == {"m006"}
    assert run.findings == []


def test_a_domain_fault_counts_once_towards_coherence() -> None:
    """A leaf switch drops the traffic of its 8 machines for a while: one fault, not 8."""
    rng = np.random.default_rng(5)
    t, n = 200, 64
    traffic = 20e9 * (1 + rng.normal(0, 0.05, size=(t, n, GPUS)))
    traffic[60:90, 8:16] = 0.0
    domains = [f"leaf{i // 8}" for i in range(n)]
    run = detect_table(_table({"gpu_nvlink_tx_bytes_per_second": traffic}, 5, domains))
    assert run.findings == []


@pytest.mark.parametrize("machines", [2, 3])
def test_a_job_of_two_or_three_machines_is_not_scored_and_says_so_once(
    machines: int, caplog: pytest.LogCaptureFixture
) -> None:
    rng = np.random.default_rng(1)
    power = 600 + rng.normal(0, 5, size=(100, machines, GPUS))
    power[30:, 0] = 100.0
    with caplog.at_level(logging.INFO, logger="detectors.engine"):
        run = detect_table(_table({"gpu_power_watts": power}, 1))
    assert _similarity(run) == set()
    assert [f["finding"] for f in run.findings] == ["too_few_machines"]
    assert run.findings[0]["machines"] == machines
    assert sum("no peers to compare" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("fill", [0.0, 42.0, np.nan])
def test_constant_zero_or_missing_metric_gives_no_alert_and_no_warning(fill: float) -> None:
    values = np.full((80, 16, GPUS), fill)
    table = _table({"gpu_util_ratio": np.full((80, 16, GPUS), 0.9)}, 5)
    if np.isfinite(fill):
        table = _table(
            {"gpu_util_ratio": np.full((80, 16, GPUS), 0.9), "gpu_power_watts": values}, 5
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run = detect_table(table)
    assert run.alerts == []


def _feed(tracker: PeerCoherence, ticks: range, n: int, apart: dict[int, list[int]]) -> list:
    """Feed ``ticks``: at each, the machines ``apart[tick]`` are at z = 10, the rest at 0."""
    changes = []
    for tick in ticks:
        z = np.zeros(n)
        z[apart.get(tick, [])] = 10.0
        changed = tracker.update("m", z, 6.0, np.ones(n, dtype=bool), tick, 1000 + tick)
        if changed is not None:
            changes.append((tick, changed.comparable))
    return changes


def test_peer_coherence_counts_rotating_outlier_events_with_hysteresis() -> None:
    tracker = PeerCoherence(share=0.05, min_outliers=3, horizon_ticks=40, spread_ticks=3)
    n = 40
    assert tracker.allowance(n) == 3
    # Quiet for 10 ticks, then a new machine apart every 5 ticks, for 3 ticks each: they rotate.
    apart = {t: [10 + (t - 10) // 5] for t in range(10, 40) if (t - 10) % 5 < 3}
    changes = _feed(tracker, range(40), n, apart)
    assert changes and changes[0][1] is False
    state = tracker.states()[0]
    assert not state.comparable and state.outliers > state.allowance
    # The rotation stops: once the old outliers are older than the horizon, comparable again.
    changes += _feed(tracker, range(40, 85), n, {})
    assert changes[-1][1] is True and tracker.comparable("m")


def test_machines_that_fail_together_are_one_event() -> None:
    """Six machines of 64 fall apart within two ticks of each other (a bad batch, a switch
    without labels): one fault, still comparable, so their alerts are not dropped."""
    tracker = PeerCoherence(share=0.05, min_outliers=3, horizon_ticks=100, spread_ticks=3)
    apart = {t: [1, 2, 3] + ([4, 5, 6] if t >= 21 else []) for t in range(20, 60)}
    assert _feed(tracker, range(60), 64, apart) == []
    assert tracker.comparable("m") and tracker.states()[0].outliers == 1


def test_too_many_machines_apart_at_once_are_not_peers() -> None:
    tracker = PeerCoherence(share=0.05, min_outliers=3, horizon_ticks=100, spread_ticks=3)
    apart = {t: list(range(12)) for t in range(20, 30)}  # 12 of 40 at once: over a quarter
    changes = _feed(tracker, range(30), 40, apart)
    assert changes == [(21, False)]


def test_machines_apart_from_their_first_evaluations_count_one_by_one() -> None:
    """Undeclared roles: 8 machines differ from the start. Together, but no fault struck
    them: each is an event of its own, and the metric is not comparable."""
    tracker = PeerCoherence(share=0.05, min_outliers=3, horizon_ticks=100, spread_ticks=3)
    changes = _feed(tracker, range(30), 40, {t: list(range(8)) for t in range(30)})
    assert changes == [(1, False)]
    assert tracker.states()[0].outliers == 8


def test_peer_coherence_ignores_single_evaluation_blips() -> None:
    tracker = PeerCoherence(share=0.05, min_outliers=3, horizon_ticks=100)
    n = 20
    _feed(tracker, range(60), n, {t: [t % n] for t in range(60)})  # never twice in a row
    assert tracker.comparable("m") and tracker.states()[0].outliers == 0


def test_peer_coherence_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match=r"share=1\.5"):
        PeerCoherence(share=1.5, min_outliers=3, horizon_ticks=10)


@pytest.mark.parametrize("broken", [1, 4, 6])
def test_several_machines_failing_together_are_all_named(broken: int) -> None:
    """A bad batch (no domain labels): ``broken`` machines of 64 lose 70 % of their NVLink
    traffic at the same moment. They are one fault, not a fleet of mixed load."""
    rng = np.random.default_rng(12)
    t, n = 160, 64
    nvlink = 30e9 * (1 + rng.normal(0, 0.04, size=(t, n, GPUS)))
    nvlink[60:, 10 : 10 + broken] *= 0.3
    run = detect_table(_table({"gpu_nvlink_tx_bytes_per_second": nvlink}, 5))
    assert _similarity(run) == {f"m{i:03d}" for i in range(10, 10 + broken)}
    assert run.findings == []
