"""Peer scores: the O(N) median score, the pairwise reference, devices and missing data."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.scoring import lag_tolerant_means, median_scores, pairwise_scores, row_nanmedian

FLOORS = np.asarray([0.02])


def _block(n: int = 32, width: int = 4, w: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 0.9 + rng.normal(0, 0.005, size=(n, 1, width, w))


def _everyone(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.arange(n), np.arange(n))]


@pytest.mark.parametrize("score", [median_scores, pairwise_scores])
def test_the_deviating_device_of_the_deviating_machine_scores_highest(score) -> None:
    block = _block()
    block[7, 0, 2, :] -= 0.4  # machine 7, GPU 2 idles
    result = score(block, _everyone(32), 0.02, FLOORS)
    absz = np.abs(result.z)
    machine, _, device = np.unravel_index(np.nanargmax(absz), absz.shape)
    assert (machine, device) == (7, 2)
    assert result.z[7, 0, 2] < -6  # below its peers, and far
    others = np.delete(absz.reshape(32, -1), 7, axis=0)
    assert np.nanmax(others) < 3


def test_median_score_of_one_value_windows_is_the_mad_z() -> None:
    values = np.asarray([1.0, 1.1, 0.9, 1.05, 0.95, 3.0])
    block = values.reshape(-1, 1, 1, 1)
    result = median_scores(block, _everyone(6), 0.0, np.asarray([1e-9]))
    median = np.median(values)
    mad = np.median(np.abs(values - median))
    expected = (values - median) / (1.4826 * mad)
    np.testing.assert_allclose(result.z[:, 0, 0], expected)


def test_missing_samples_are_scored_on_what_is_present() -> None:
    block = _block()
    block[3, 0, 0, :5] = np.nan  # 5 of 8 seconds missing, the rest normal
    block[4, 0, :, :] = np.nan  # never reported: not an outlier, just unscored
    for score in (median_scores, pairwise_scores):
        result = score(block, _everyone(32), 0.02, FLOORS)
        assert np.isfinite(result.z[3, 0, 0]) and abs(result.z[3, 0, 0]) < 3
        assert np.isnan(result.z[4]).all()


def test_one_threshold_carries_across_job_sizes() -> None:
    for n in (8, 64, 1024):
        block = _block(n=n, width=1, seed=n)
        block[0] -= 0.2
        result = median_scores(block, _everyone(n), 0.02, FLOORS)
        healthy = np.abs(result.z[1:, 0, 0])
        assert result.z[0, 0, 0] < -6, n
        assert np.nanmax(healthy) < 6, n


def test_groups_are_compared_within_themselves() -> None:
    block = _block(n=16, width=1)
    block[12:] += 0.05  # the last stage works harder: normal for its group
    groups = [(np.arange(12), np.arange(12)), (np.arange(12, 16), np.arange(12, 16))]
    within = median_scores(block, groups, 0.0, np.asarray([0.005]))
    pooled = median_scores(block, _everyone(16), 0.0, np.asarray([0.005]))
    assert np.nanmax(np.abs(within.z)) < 6
    assert np.nanmax(np.abs(pooled.z)) > 6


def test_too_few_peers_give_no_score() -> None:
    block = _block(n=2, width=1)
    result = median_scores(block, _everyone(2), 0.02, FLOORS)
    assert np.isnan(result.z).all()


def test_row_nanmedian_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=(20, 9))
    values[rng.random(values.shape) < 0.3] = np.nan
    values[0] = np.nan
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        expected = np.nanmedian(values, axis=1)
    np.testing.assert_allclose(row_nanmedian(values), expected)


def _lagged(peers: list[float], machine: list[float], n: int = 9) -> tuple[float, float]:
    """``lag_tolerant_means`` of one series: the peers' level (lag 0) and the machine's mean at
    its best lag, for ``n - 1`` identical peers and the machine last."""
    values = np.tile(np.asarray(peers, dtype=float)[:, None, None], (1, n, 1))
    values[:, -1, 0] = machine
    plain, best = lag_tolerant_means(values, _everyone(n))
    return float(plain[0, 0]), float(best[-1, 0])


def test_a_machine_a_sample_out_of_phase_is_judged_at_its_lag() -> None:
    level, judged = _lagged([1, 4, 1, 4, 1], [4, 1, 4, 1, 4])  # reads its peers' previous sample
    assert judged == pytest.approx(level)


def test_a_machine_that_stops_as_its_job_halts_is_not_excused_by_a_lag() -> None:
    """Its NIC dies as the job halts: read against the peers' first halted sample, its last
    (partly) working one would cancel its zeros in a mean (+0.62 at the lag ahead); by fit, lag
    0 is the closest."""
    peers = [17.5, 3.75, 2.3, 2.3]
    level, judged = _lagged(peers, [10.2, 0.0, 0.0, 0.0])
    assert judged == pytest.approx(level - (3.75 + 2.3 + 2.3) / 3)
