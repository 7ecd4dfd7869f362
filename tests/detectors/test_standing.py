"""Machines apart from their peers from their first evaluation: judged by how far they move.

The tables are built here with their own noise: a host whose NIC sends more pause frames than
its peers from the start (its place in the fabric) is no fault; the same host moving much
further later is; a fault that strikes during a machine's first evaluations, or one at the severe level
from the start, is still named.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.offline import detect_table
from detectors.standing import StandingOffsets
from minder.core.alert import AlertKind
from minder.core.table import normalize_table


def _table(cube: np.ndarray, metric: str, interval_s: int, device: str = "") -> pd.DataFrame:
    """Canonical rows of one metric shaped (time, machine), of one device (none: a host
    metric)."""
    t, n = cube.shape
    ts = np.repeat(1_700_000_000 + np.arange(t) * interval_s, n).astype(float)
    machine = np.tile([f"m{i:03d}" for i in range(n)], t)
    frame = pd.DataFrame(
        {
            "ts": ts,
            "job": "job",
            "machine": machine,
            "metric": metric,
            "value": cube.reshape(-1),
            "device": device,
        }
    )
    return normalize_table(frame)


def _pauses(rng: np.random.Generator, t: int, n: int) -> np.ndarray:
    """PFC pause frames sent near 100/s with 5 % noise per machine and sample: a metric judged
    on both sides of the peers, by ratio (its scale is at least one and a half times the
    peers' level, 150/s here: docs/detection-method.md §10 and §12)."""
    return 100.0 * (1 + rng.normal(0, 0.05, size=(t, n)))


PAUSES = "pfc_tx_pause_per_second"


def _named(table: pd.DataFrame) -> set[str]:
    run = detect_table(table)
    return {a.machine for a in run.alerts if a.kind is AlertKind.SIMILARITY}


@pytest.mark.parametrize("interval_s", [1, 5, 60])
def test_a_machine_apart_from_its_start_is_no_fault(interval_s: int) -> None:
    rng = np.random.default_rng(11)
    cube = _pauses(rng, 240, 32)
    cube[:, 7] *= 16.0  # apart at every evaluation, from the first one (z 10)
    assert _named(_table(cube, PAUSES, interval_s, "mlx5_0")) == set()


@pytest.mark.parametrize("interval_s", [1, 5, 60])
def test_a_machine_apart_from_its_start_that_moves_further_is_named(interval_s: int) -> None:
    rng = np.random.default_rng(12)
    cube = _pauses(rng, 240, 32)
    cube[:, 7] *= 16.0
    cube[120:, 7] *= 2.5  # then it moves far beyond where it stood (z 10 -> 26)
    assert _named(_table(cube, PAUSES, interval_s, "mlx5_0")) == {"m007"}


@pytest.mark.parametrize("interval_s", [1, 5, 60])
def test_a_fault_that_strikes_during_the_first_evaluations_is_named(interval_s: int) -> None:
    rng = np.random.default_rng(13)
    cube = _pauses(rng, 240, 32)
    cube[12:, 7] *= 16.0  # within the first run: a change, not a standing offset
    assert _named(_table(cube, PAUSES, interval_s, "mlx5_0")) == {"m007"}


def test_a_machine_broken_from_the_start_is_named() -> None:
    rng = np.random.default_rng(14)
    cube = 0.9 * (1 + rng.normal(0, 0.02, size=(240, 32)))
    cube[:, 7] = 0.0  # its GPUs never work: the severe level is never an offset
    assert _named(_table(cube, "gpu_util_ratio", 5)) == {"m007"}


def test_moving_back_towards_the_peers_is_no_deviation() -> None:
    standing = StandingOffsets(3.0, 24.0, 2)
    scored = np.ones(2, dtype=bool)
    for tick in (1, 2):
        standing.born(scored, tick)
        standing.apply("m", np.array([[8.0], [0.5]]), scored, tick)
    offsets = standing.offsets("m")
    assert offsets is not None and offsets[:, 0].tolist() == [8.0, 0.0]
    later = np.array([[5.0], [0.5]])
    standing.born(scored, 3)
    standing.apply("m", later, scored, 3)
    assert later[:, 0].tolist() == [0.0, 0.5]
    other_side = np.array([[-7.0], [-7.0]])
    standing.apply("m", other_side, scored, 4)
    assert other_side[:, 0].tolist() == [-7.0, -7.0]


def test_a_missing_score_in_the_first_run_keeps_no_offset() -> None:
    standing = StandingOffsets(3.0, 24.0, 3)
    scored = np.ones(1, dtype=bool)
    for tick, z in ((1, 9.0), (2, np.nan), (3, 9.0)):
        standing.born(scored, tick)
        standing.apply("m", np.array([[z]]), scored, tick)
    offsets = standing.offsets("m")
    assert offsets is not None and offsets[0, 0] == 0.0


def test_bad_parameters_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="expected 0 < threshold <= severe") as caught:
        StandingOffsets(30.0, 24.0, 5)
    assert "\n" not in str(caught.value)


@settings(max_examples=40, deadline=None)
@given(
    offset=st.floats(min_value=-20.0, max_value=20.0),
    later=st.lists(st.floats(min_value=-40.0, max_value=40.0), min_size=1, max_size=10),
    birth=st.integers(min_value=1, max_value=6),
)
def test_an_offset_never_raises_a_score(offset: float, later: list[float], birth: int) -> None:
    """Whatever the offset, a score is only ever brought towards zero, never away from it, and
    never pushed to the other side."""
    standing = StandingOffsets(3.0, 24.0, birth)
    scored = np.ones(1, dtype=bool)
    for tick in range(1, birth + 1):
        standing.born(scored, tick)
        standing.apply("m", np.array([[offset]]), scored, tick)
    for tick, value in enumerate(later, start=birth + 1):
        z = np.array([[value]])
        standing.born(scored, tick)
        standing.apply("m", z, scored, tick)
        assert abs(z[0, 0]) <= abs(value)
        assert z[0, 0] == 0.0 or np.sign(z[0, 0]) == np.sign(value)


def test_a_new_sampling_interval_keeps_offsets_and_starts_no_new_first_run() -> None:
    standing = StandingOffsets(3.0, 24.0, 2)
    scored = np.ones(2, dtype=bool)
    standing.born(scored, 1)
    standing.apply("m", np.array([[8.0], [8.0]]), scored, 1)
    standing.born(scored, 2)
    standing.apply("m", np.array([[8.0], [0.0]]), scored, 2)
    standing.rebase(5)  # ticks counted anew from here
    for tick in range(1, 8):
        z = np.array([[8.0], [7.0]])
        standing.born(scored, tick)
        standing.apply("m", z, scored, tick)
        # the first machine keeps its offset; the second, with its peers at first, is judged as
        # every other, and a fault now is not taken for a standing offset
        assert z[:, 0].tolist() == [0.0, 7.0]
