"""Congestion counters are judged by ratio to the peers (docs/detection-method.md §10).

Healthy ports of one job pause at rates that differ by a factor; a fault is a surge. The tables
are built here with their own noise and a job-wide swing every sample (the step's phases read
at a fixed phase), not by the simulators.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_standing import _named, _table

from detectors.config import CONGESTION_COUNTERS, METRIC_REL_FLOORS, NETWORK_THROUGHPUTS

T, N, ONSET, LASTS = 240, 32, 60, 60


def _pauses(
    seed: int,
    ratio: float,
    level: float = 1.0,
    *,
    alternate: bool = False,
    base: float = 100.0,
    noise: float = 0.05,
) -> np.ndarray:
    """Ports near ``level`` x ``base`` (100/s) with ``noise`` (5 %) each, moving together by one
    common factor: a slow random walk, or (``alternate``) 1x and 4x on alternate samples (the
    step's phases read at a fixed phase); port 7 at ``ratio`` times its peers for ``LASTS``
    samples from ``ONSET``."""
    rng = np.random.default_rng(seed)
    if alternate:
        common = np.where(np.arange(T) % 2 == 0, 1.0, 4.0)
    else:
        common = np.exp(np.cumsum(rng.normal(0.0, 0.05, T)))
    cube = base * common[:, None] * np.exp(rng.normal(0.0, noise, size=(T, N)))
    cube[ONSET : ONSET + LASTS, 7] *= ratio
    return cube * level


def test_every_congestion_counter_takes_the_ratio_floor() -> None:
    assert set(METRIC_REL_FLOORS) >= CONGESTION_COUNTERS
    assert all(METRIC_REL_FLOORS[m] == 1.5 for m in CONGESTION_COUNTERS)
    assert METRIC_REL_FLOORS["rdma_tx_bytes_per_second"] < 1.5


@pytest.mark.parametrize("metric", sorted(CONGESTION_COUNTERS))
@pytest.mark.parametrize("interval_s", [1, 60])
def test_a_port_pausing_several_times_as_often_as_its_peers_is_no_fault(
    metric: str, interval_s: int
) -> None:
    """Healthy ports differ by a factor, and burst to several times their peers' rate."""
    assert _named(_table(_pauses(1, 6.0), metric, interval_s, "mlx5_0")) == set()


@pytest.mark.parametrize("metric", sorted(CONGESTION_COUNTERS))
@pytest.mark.parametrize("interval_s", [1, 60])
def test_a_surge_is_named(metric: str, interval_s: int) -> None:
    assert _named(_table(_pauses(2, 12.0), metric, interval_s, "mlx5_0")) == {"m007"}
    # Phases that swing 4x every sample cost a surge up to one phase's worth at coarse sampling:
    # each machine is judged at the lag that fits it best (docs/detection-method.md §10).
    surge = _pauses(2, 16.0, alternate=True)
    assert _named(_table(surge, metric, interval_s, "mlx5_0")) == {"m007"}


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    ratio=st.one_of(st.floats(1.2, 8.0), st.floats(12.0, 40.0)),
    level=st.sampled_from([1.0, 8.0, 1e3]),
    interval_s=st.sampled_from([5, 15, 60]),
)
def test_named_by_ratio_whatever_the_level(
    seed: int, ratio: float, level: float, interval_s: int
) -> None:
    """A surge (12x or more) is named and a port within 8x of its peers is not, at any
    level and through a common drift: the floor is a ratio, so it scales with the counts
    (levels stay above the absolute floor of 10/s, which does not)."""
    table = _table(_pauses(seed, ratio, level), "pfc_tx_pause_per_second", interval_s, "mlx5_0")
    expected = {"m007"} if ratio >= 12.0 else set()
    assert _named(table) == expected


def _tight(seed: int, ratio: float, alternate: bool) -> np.ndarray:
    """Ports near 10 GB/s with 1 % noise each (far tighter than a routed network keeps them),
    as :func:`_pauses` builds them."""
    return _pauses(seed, ratio, alternate=alternate, base=1e10, noise=0.01)


@pytest.mark.parametrize("metric", sorted(NETWORK_THROUGHPUTS))
@pytest.mark.parametrize("interval_s", [1, 60])
def test_a_port_moving_a_fifth_less_than_its_peers_for_a_while_is_no_fault(
    metric: str, interval_s: int
) -> None:
    """Routing and congestion move healthy ports' rates by 10-20 % (scale >= 5 % of the level);
    with peers 1 % apart, a 2 % scale would have named it at z 10."""
    assert _named(_table(_tight(3, 0.8, False), metric, interval_s, "mlx5_0")) == set()


@pytest.mark.parametrize("metric", sorted(NETWORK_THROUGHPUTS))
@pytest.mark.parametrize("interval_s", [1, 60])
def test_a_port_at_half_its_peers_rate_is_named(metric: str, interval_s: int) -> None:
    """A link trained at half speed (z 10 against the 5 % floor), also under 4x phase swings."""
    assert _named(_table(_tight(4, 0.5, False), metric, interval_s, "mlx5_0")) == {"m007"}
    assert _named(_table(_tight(4, 0.5, True), metric, interval_s, "mlx5_0")) == {"m007"}
