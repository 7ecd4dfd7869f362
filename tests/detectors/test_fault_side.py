"""Which side of the peers is a fault, and what the peer comparison does not score
(docs/detection-method.md §12).

The tables are built here with their own noise, not by the simulators: a machine that does more
work than its peers (a burst of traffic, a busier phase of the step) is no fault, the same
machine doing less is; host memory in use and the step probe's per-step times are not judged
against peers at all; a machine that stands above its peers on work from its first evaluation is
not named, at any level, even when the job's phases swing every sample.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_standing import _table

from detectors.config import (
    ABOVE_WITH_WORK_BELOW,
    FAULT_BELOW_ONLY,
    IDLE_AT_ZERO,
    RISES_WITH_LOAD,
)
from detectors.offline import detect_table
from detectors.scoring import NOT_SCORED
from minder.core.alert import AlertKind
from minder.core.table import normalize_table

T, N = 240, 32


def _level(rng: np.random.Generator, level: float, noise: float = 0.03) -> np.ndarray:
    return level * np.exp(rng.normal(0.0, noise, size=(T, N)))


def _similarity(table: pd.DataFrame) -> set[tuple[str, str]]:
    run = detect_table(table)
    return {(a.machine, a.metric) for a in run.alerts if a.kind is AlertKind.SIMILARITY}


WORK = [
    ("rdma_tx_bytes_per_second", 12e9, "mlx5_0"),
    ("gpu_util_ratio", 0.6, "gpu0"),
    ("gpu_sm_clock_hertz", 1.4e9, "gpu0"),
]


@pytest.mark.parametrize("interval_s", [1, 5, 60])
@pytest.mark.parametrize(("metric", "level", "device"), WORK)
def test_doing_more_work_than_the_peers_is_no_fault(
    metric: str, level: float, device: str, interval_s: int
) -> None:
    rng = np.random.default_rng(21)
    cube = _level(rng, level)
    cube[120:, 7] *= 1.5  # a burst of work that lasts the rest of the job
    assert _similarity(_table(cube, metric, interval_s, device)) == set()


@pytest.mark.parametrize("interval_s", [1, 5, 60])
@pytest.mark.parametrize(("metric", "level", "device"), WORK)
def test_doing_less_work_than_the_peers_is_named(
    metric: str, level: float, device: str, interval_s: int
) -> None:
    rng = np.random.default_rng(21)
    cube = _level(rng, level)
    cube[120:, 7] /= 1.5  # the same change, the other way: a degraded link, a throttled GPU
    assert _similarity(_table(cube, metric, interval_s, device)) == {("m007", metric)}


@pytest.mark.parametrize("interval_s", [1, 5, 60])
def test_host_cpu_above_its_peers_is_a_fault_only_while_its_work_falls_behind(
    interval_s: int,
) -> None:
    """A cron job or a heavier data loader raises a host's CPU use while its GPUs keep pace: no
    fault. An interrupt storm or a soft lockup of a failing device raises it and takes the host
    from the job: its GPUs fall behind their peers, and the machine is named."""
    rng = np.random.default_rng(22)
    cpu = _level(rng, 0.2, 0.05)
    cpu[120:, 7] *= 2.5
    util = _level(rng, 0.6)
    tables = [_table(cpu, "cpu_util_ratio", interval_s), _table(util, "gpu_util_ratio", interval_s)]
    assert _similarity(normalize_table(pd.concat(tables, ignore_index=True))) == set()
    util[120:, 7] /= 1.5
    tables[1] = _table(util, "gpu_util_ratio", interval_s)
    named = _similarity(normalize_table(pd.concat(tables, ignore_index=True)))
    assert {machine for machine, _ in named} == {"m007"}
    assert ("m007", "cpu_util_ratio") in named


@pytest.mark.parametrize("interval_s", [1, 5, 60])
def test_host_cpu_below_its_peers_is_judged(interval_s: int) -> None:
    """A host whose CPU falls to a third of its peers' (its training process died)."""
    rng = np.random.default_rng(22)
    cube = _level(rng, 0.2, 0.05)
    cube[120:, 7] /= 3.0
    assert _similarity(_table(cube, "cpu_util_ratio", interval_s)) == {("m007", "cpu_util_ratio")}


@pytest.mark.parametrize("interval_s", [1, 5, 60])
def test_host_memory_in_use_is_not_compared_with_peers(interval_s: int) -> None:
    rng = np.random.default_rng(23)
    cube = _level(rng, 900e9, 0.01)
    cube[100:, 7] *= 1.7  # a bigger cache, a leak in one rank's process: software, not machine
    cube[100:, 9] *= 0.5
    assert _similarity(_table(cube, "memory_used_bytes", interval_s)) == set()


def test_one_slow_step_held_for_its_length_is_no_similarity_alert() -> None:
    """The step probe holds a step's time until the next step ends: at 1 s, one step 15 % slower
    reads apart for a whole 30-second step. The straggler detector judges steps; the peer
    comparison does not score them."""
    rng = np.random.default_rng(24)
    step = np.repeat(30.0 * np.exp(rng.normal(0.0, 0.003, size=(T // 30, N))), 30, axis=0)
    step[3, 7] *= 1.15
    for metric in ("train_busy_seconds", "train_step_seconds"):
        assert _similarity(_table(step, metric, 1, "rank0")) == set()


@pytest.mark.parametrize("interval_s", [5, 15, 30])
def test_a_machine_above_its_peers_from_the_start_is_no_fault_through_phase_swings(
    interval_s: int,
) -> None:
    """Every sample falls in another phase of the step (the peers' level swings 4x in lockstep);
    one machine reads 1.7x its peers at every one of them, from its first evaluation on: far
    beyond the severe level, and above its peers on a work metric, so a standing offset."""
    rng = np.random.default_rng(25)
    phases = np.array([0.16, 0.51, 0.63, 0.35])
    swing = phases[np.arange(T) % phases.size][:, None]
    cube = swing * np.exp(rng.normal(0.0, 0.03, size=(T, N)))
    cube[:, 7] *= 1.7
    table = _table(np.clip(cube, 0.0, 1.0), "gpu_tensor_active_ratio", interval_s, "gpu0")
    assert _similarity(table) == set()
    broken = np.clip(cube.copy(), 0.0, 1.0)
    broken[:, 7] = 0.0  # the other side, from the start: a GPU that never works is named
    named = _similarity(_table(broken, "gpu_tensor_active_ratio", interval_s, "gpu0"))
    assert named == {("m007", "gpu_tensor_active_ratio")}


def test_the_sides_and_the_unscored_are_consistent() -> None:
    assert FAULT_BELOW_ONLY <= RISES_WITH_LOAD
    assert "cpu_util_ratio" in IDLE_AT_ZERO - FAULT_BELOW_ONLY
    assert not ABOVE_WITH_WORK_BELOW & FAULT_BELOW_ONLY
    assert "gpu_temperature_celsius" not in FAULT_BELOW_ONLY
    assert "pfc_tx_pause_per_second" not in FAULT_BELOW_ONLY
    assert not NOT_SCORED & FAULT_BELOW_ONLY
    assert {"memory_used_bytes", "train_step_seconds", "train_busy_seconds"} <= NOT_SCORED


@settings(max_examples=12, deadline=None)
@given(
    factor=st.floats(min_value=1.3, max_value=4.0),
    onset=st.integers(min_value=60, max_value=160),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_more_work_is_never_named_whatever_its_size_and_onset(
    factor: float, onset: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    cube = _level(rng, 12e9)
    cube[onset:, 3] *= factor
    assert _similarity(_table(cube, "rdma_rx_bytes_per_second", 5, "mlx5_0")) == set()
