from __future__ import annotations

import numpy as np
import pytest

from detectors.window import NEVER, JobWindow, WindowLimits
from minder.core.codec import Decoder, WireFormat, encode_batch
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


# -- packed batches (schema 2) and whole polls ---------------------------------------------------


def _named(node: str, sec: int, gpus: int = 2, scale: float = 1.0) -> NodeBatch:
    samples = [("gpu_util_ratio", f"gpu{g}", 0.01 * scale * (g + 1)) for g in range(gpus)]
    samples += [("gpu_power_watts", f"gpu{g}", 100.0 * scale + g) for g in range(gpus)]
    samples.append(("cpu_util_ratio", "", 0.025 * scale))
    return NodeBatch("j", node, sec + 0.5, labels={"group": "pp0"}, samples=samples)


def _packed(batch: NodeBatch, decoder: Decoder) -> NodeBatch:
    return decoder.decode(encode_batch(batch, WireFormat.PACKED))


def _state(w: JobWindow, sec: int) -> tuple[object, ...]:
    view = w.window(sec, 8)
    return (
        [m.name for m in w.machines],
        list(w.series),
        np.nan_to_num(view, nan=-1.0).tolist(),
        w.last_seen().tolist(),
        w.machine_last_seen().tolist(),
        w.joined_sec[: w.n_machines].tolist(),
        w.departed[: w.n_machines].tolist(),
        [(c.change, c.machines) for c in w.membership],
        w.stats.samples,
        dict(w.stats.rejected),
    )


def test_a_poll_of_packed_batches_fills_the_window_like_named_batches_one_by_one() -> None:
    decoder = Decoder()
    polls = [
        [_named(f"m{m}", sec, gpus=2 if m != 3 or sec < 13 else 1, scale=1 + m) for m in range(6)]
        for sec in range(10, 16)
    ]
    polls[3].append(  # a goodbye in the middle of a poll, then the machine comes back
        NodeBatch("j", "m5", 13.6, events=[Event(EventKind.LEAVE, "", 13.6, message="bye")])
    )
    polls[4].insert(0, _named("m2", 12, scale=9))  # late, and of an older second
    one_by_one, whole = JobWindow("j", horizon_s=8), JobWindow("j", horizon_s=8)
    for poll in polls:
        for batch in poll:
            one_by_one.add_batch(batch)
        whole.add_batches([_packed(b, decoder) if b.samples else b for b in poll])
    assert _state(whole, 15) == _state(one_by_one, 15)
    assert whole.n_machines == 6 and whole.n_series == 5
    # m3 lost gpu1 at second 13 (its layout changed mid-stream): that series stops there.
    gpu1 = whole.series_index[("gpu_util_ratio", "gpu1")]
    assert np.isnan(whole.window(15, 3)[:, 3, gpu1]).all()
    assert not np.isnan(whole.window(12, 1)[0, 3, gpu1])
    assert [c.change for c in whole.take_membership()] == ["left", "joined"]


def test_packed_layouts_map_to_series_once_and_respect_the_series_bound() -> None:
    decoder = Decoder()
    w = JobWindow("j", horizon_s=8, limits=WindowLimits(max_series_per_machine=3))
    w.add_batches([_packed(_named("a", 10), decoder)])  # 5 pairs, 3 allowed
    assert w.n_series == 3 and w.stats.rejected == {"too_many_series": 2}
    assert w.stats.samples == 3
    w = JobWindow("j", horizon_s=8)
    calls: list[int] = []
    add_arrays = w.add_arrays

    def counted(sec: int, *args: np.ndarray, **kwargs: np.ndarray) -> int:
        calls.append(sec)
        return add_arrays(sec, *args, **kwargs)

    w.add_arrays = counted  # type: ignore[method-assign]
    batches = [_packed(_named(f"m{m}", 10 + m % 2, gpus=1 + m % 3), decoder) for m in range(50)]
    w.add_batches(batches)
    assert sorted(calls) == [10, 11]  # one call per second of the poll, whatever the layouts
    assert len(w._packed_cache) == 3  # three layouts, each mapped once for all its machines
    cpu = w.at(10)[:, w.series_index[("cpu_util_ratio", "")]]
    np.testing.assert_allclose(cpu[::2], 0.025)  # machines of second 10
    assert np.isnan(cpu[1::2]).all()


def test_machines_arriving_over_several_polls_read_back_as_one_dense_record() -> None:
    """The value buffer grows for a poll's new machines at once and fills rows as they come;
    series added later and a re-bucketed window keep every value, NaN where nothing was sent."""
    rng = np.random.default_rng(7)
    names = [("gpu_util_ratio", f"gpu{d}") for d in range(3)] + [("cpu_util_ratio", "")]
    w = JobWindow("j", horizon_s=6)
    expected: dict[tuple[int, str, tuple[str, str]], float] = {}
    n = 0
    for poll, sec in enumerate(range(100, 112)):
        n = min(3 + 7 * poll * poll, 400)  # a few machines, then hundreds more each poll
        layout = names + ([("rdma_port_up", "mlx5_0")] if poll >= 5 else [])  # a series later
        batches = []
        for m in range(n):
            if rng.random() < 0.1:
                continue  # a machine that missed this second
            values = rng.random(len(layout)).tolist()
            batches.append(
                NodeBatch(
                    "j",
                    f"n{m}",
                    float(sec),
                    samples=[(a, b, v) for (a, b), v in zip(layout, values, strict=True)],
                )
            )
            for key, v in zip(layout, values, strict=True):
                expected[(sec, f"n{m}", key)] = float(np.float32(v))
        w.add_batches(batches)
        if poll == 8:
            w.ensure_slots(9)  # re-bucketed into more slots: nothing is lost
    assert w.n_machines == n
    end, length = 111, w.slots
    view = w.window(end, length)
    for t, sec in enumerate(range(end - length + 1, end + 1)):
        for m, info in enumerate(w.machines):
            for k, key in enumerate(w.series):
                want = expected.get((sec, info.name, key), np.nan)
                got = view[t, m, k]
                assert (np.isnan(want) and np.isnan(got)) or got == want, (sec, info.name, key)
    # A subset of series, in runs and scattered, reads the same values as the full view.
    for cols in (np.array([1, 2]), np.array([4, 0, 2]), np.arange(w.n_series)[::-1].copy()):
        np.testing.assert_array_equal(w.window(end, length, cols), view[:, :, cols])


def test_refused_machines_and_series_do_not_grow_the_window() -> None:
    """A broken agent's names (too long, or beyond the bounds) are refused and counted, and take
    no room: the buffer is sized by what was taken."""
    lim = WindowLimits(max_series_per_machine=8)
    w = JobWindow("j", horizon_s=64, limits=lim)
    healthy = [("gpu_util_ratio", f"gpu{d}", 0.5) for d in range(4)]
    for sec in range(100, 164):  # a healthy job: 20 machines x 4 series, every slot live
        w.add_batches([NodeBatch("j", f"n{m}", float(sec), samples=healthy) for m in range(20)])
    before = w._values.shape
    long = "x" * (lim.max_name_length + 1)
    bad_devices = [("gpu_util_ratio", f"{long}{d}", 1.0) for d in range(2000)]
    many = [("gpu_util_ratio", f"gpu-extra{d}", 1.0) for d in range(2000)]
    w.add_batches([NodeBatch("j", "n0", 164.0, samples=bad_devices + many)])
    w.add_batches([NodeBatch("j", f"{long}{m}", 164.0, samples=[]) for m in range(3000)])
    assert w.stats.rejected["name_too_long"] == 2000 + 3000
    assert w.stats.rejected["too_many_series"] == 2000 - 4
    assert w.n_machines == 20 and w.n_series == 8
    assert w._values.shape[1] <= max(before[1], 32) and w._values.shape[2] <= max(before[2], 16)
