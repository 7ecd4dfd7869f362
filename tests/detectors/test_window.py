from __future__ import annotations

import numpy as np
import pytest

from detectors.window import NEVER, JobWindow
from minder.core.records import Event, EventKind, NodeBatch


def test_window_returns_recent_seconds_and_nan_for_absent() -> None:
    w = JobWindow("j", horizon_s=8)
    for sec in range(100, 110):
        w.add_samples(sec, "a", [("cpu_util_ratio", "", sec / 1000)])
        if sec % 2 == 0:
            w.add_samples(sec, "b", [("cpu_util_ratio", "", 0.5)])
    view = w.window(109, 4)
    assert view.shape == (4, 2, 1)
    np.testing.assert_allclose(view[:, 0, 0], [0.106, 0.107, 0.108, 0.109], rtol=1e-6)
    assert np.isnan(view[1, 1, 0]) and view[2, 1, 0] == 0.5
    # Seconds beyond the horizon are gone (NaN), not wrapped around.
    assert np.isnan(w.window(109, 8)[:, 0, 0]).sum() == 0
    assert np.isnan(w.window(120, 8)).all()


def test_samples_older_than_horizon_are_counted_not_placed() -> None:
    w = JobWindow("j", horizon_s=4)
    w.add_samples(100, "a", [("cpu_util_ratio", "", 0.1)])
    w.add_samples(90, "a", [("cpu_util_ratio", "", 0.9)])
    assert w.stats.too_old == 1
    assert w.at(100)[0, 0] == pytest.approx(0.1)


def test_registries_grow_and_keep_labels() -> None:
    w = JobWindow("j", horizon_s=4)
    for m in range(40):
        w.add_samples(1, f"m{m}", [("gpu_util_ratio", f"gpu{m % 8}", 0.5)], group="pp1", domain="d")
    assert w.n_machines == 40 and w.n_series == 8
    assert w.machines[39].group == "pp1" and w.machines[39].domain == "d"
    assert w.machine_last_seen().tolist() == [1] * 40
    assert w.last_seen()[0, 1] == NEVER


def test_events_are_held_until_their_second_is_evaluated() -> None:
    w = JobWindow("j", horizon_s=8)
    w.add_batch(NodeBatch("j", "a", 10.5, events=[Event(EventKind.XID, "gpu1", 12.2, code=79)]))
    assert w.take_events(11) == []
    taken = w.take_events(12)
    assert len(taken) == 1 and taken[0].event.code == 79 and w.events == []


def test_horizon_must_be_at_least_two() -> None:
    with pytest.raises(ValueError, match="horizon_s"):
        JobWindow("j", horizon_s=1)
