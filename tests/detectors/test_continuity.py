"""Incremental continuity with per-severity durations."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.continuity import ContinuityTracker, Severity


def _tracker() -> ContinuityTracker:
    return ContinuityTracker([Severity(6.0, 30), Severity(24.0, 10)])


def test_a_mild_deviation_needs_the_long_run() -> None:
    tracker = _tracker()
    z = np.asarray([0.5, 8.0, 1.0])
    for second in range(1, 31):
        confirmed = tracker.update("m", z)
        assert (1 in confirmed.machines) == (second >= 30), second
    assert confirmed.run_s.tolist() == [30]
    assert confirmed.peak.tolist() == [8.0]


def test_a_severe_deviation_is_confirmed_sooner() -> None:
    tracker = _tracker()
    z = np.asarray([0.5, 40.0, 1.0])
    seconds = [s for s in range(1, 20) if tracker.update("m", z).machines.size]
    assert seconds[0] == 10


def test_a_gap_or_a_dip_restarts_the_run() -> None:
    tracker = _tracker()
    for second in range(40):
        value = np.nan if second == 20 else 8.0
        confirmed = tracker.update("m", np.asarray([value]))
        if second < 50:
            assert not (second == 29 and confirmed.machines.size)
    assert tracker.run_length("m", 0) == 19


def test_threshold_scale_and_growing_jobs() -> None:
    tracker = _tracker()
    tracker.update("m", np.asarray([8.0]), scale=1.5)  # 8 < 9: not above
    assert tracker.run_length("m", 0) == 0
    tracker.update("m", np.asarray([8.0, 8.0]))  # a second machine joined
    assert tracker.run_length("m", 1) == 1
    assert tracker.run_length("other", 0) == 0


def test_bad_levels_are_refused() -> None:
    with pytest.raises(ValueError, match="min_z"):
        Severity(0.0, 10)
    with pytest.raises(ValueError, match="at least one"):
        ContinuityTracker([])


def test_reset_forgets_every_run() -> None:
    tracker = _tracker()
    for _ in range(5):
        tracker.update("m", np.asarray([8.0]))
    tracker.reset()
    assert tracker.run_length("m", 0) == 0
