"""A job whose data ends: a fail-stop fault kills the job a few samples after its onset, before
the continuity a similarity alert needs, and the machine that stood apart up to the end is named
(docs/detection-method.md, "A job whose data ends")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from gpu_cubes import cube_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from metamorphic_tables import rename, scale_metric
from metamorphic_tables import shift as shift_table

from detectors.continuity import ContinuityTracker, Severity
from detectors.offline import detect_table
from minder.core.table import normalize_table

GPUS = 4
START = 1_700_000_000
ONSET = 150
"""Sample at which the fault begins: the windows have filled by then at every cadence, and the
job has worked for two minutes (a job that never worked as one has no end to read)."""


def _job(
    interval_s: int,
    samples: int,
    dead: dict[int, int],
    machines: int = 16,
    seed: int = 0,
    throttled: dict[int, int] | None = None,
    slow_link: dict[int, int] | None = None,
    idle_at: int | None = None,
) -> pd.DataFrame:
    """A synchronous job whose table ends after ``samples`` samples. Each machine in ``dead``
    has its process die at its sample: GPUs at 0, low power. From the first death on, the
    others spin in the collective that waits for it (utilisation 1.0 at a lower power), as NCCL
    ranks do. Each machine in ``throttled`` runs its GPUs' SM clock at 0.67 from its sample, and
    each in ``slow_link`` moves 0.11 of its peers' NVLink traffic from its sample. From
    ``idle_at`` on every machine idles (the job halted) and keeps reporting."""
    rng = np.random.default_rng(seed)
    shape = (samples, machines, GPUS)
    t = np.arange(samples)[:, None, None]
    alive = np.ones(shape, dtype=bool)
    for m, at in dead.items():
        alive[at:, m] = False
    first = min(dead.values(), default=samples)
    waiting = alive & (t >= first)
    util = np.where(waiting, 1.0, 0.95 + rng.normal(0, 0.01, shape))
    util = np.where(alive, util, 0.0)
    power = np.where(waiting, 160 + rng.normal(0, 4, shape), 600 + rng.normal(0, 8, shape))
    power = np.where(alive, power, 76 + rng.normal(0, 1, shape))
    clock = np.full(shape, 1.74e9)
    for m, at in (throttled or {}).items():
        clock[at:, m] = 1.14e9
    clock = np.round((clock + rng.normal(0, 1.5e7, shape)) / 1.5e7) * 1.5e7  # 15 MHz steps
    nvlink = 1e11 * (1 + rng.normal(0, 0.05, shape))
    for m, at in (slow_link or {}).items():
        nvlink[at:, m] *= 0.11
    if idle_at is not None:
        util[idle_at:] = 0.0
        power[idle_at:] = 80 + rng.normal(0, 2, power[idle_at:].shape)
        nvlink[idle_at:] = 5e8 * (1 + rng.normal(0, 0.05, nvlink[idle_at:].shape))
    cubes = (
        ("gpu_util_ratio", np.clip(util, 0, 1)),
        ("gpu_power_watts", power),
        ("gpu_sm_clock_hertz", clock),
        ("gpu_nvlink_tx_bytes_per_second", nvlink),
    )
    return cube_table(cubes, interval_s, START)


def _end_alerts(table: pd.DataFrame) -> list[tuple[str, bool]]:
    return [(a.machine, bool(a.evidence.get("apart_at_end"))) for a in detect_table(table).alerts]


@pytest.mark.parametrize("interval_s", [1, 5, 15, 60])
def test_a_process_that_dies_8_samples_before_the_data_ends_is_named(interval_s: int) -> None:
    """8 samples of fault, then the table ends (the job was killed): at 1 s that is far shorter
    than the 30 evaluations of continuity; the end names the machine."""
    table = _job(interval_s, ONSET + 8, {5: ONSET})
    run = detect_table(table)
    assert [a.machine for a in run.alerts] == ["m05"]
    alert = run.alerts[0]
    last = START + (ONSET + 7) * interval_s
    assert alert.detected_ts <= last
    assert alert.first_ts >= START + (ONSET - 1) * interval_s - 0.5 * 25
    if interval_s == 1:
        # Only the end names it this soon: the evidence says so.
        assert alert.evidence["apart_at_end"] is True
        assert alert.evidence["lead_s"] >= 5
        assert alert.detected_ts == last


def test_most_machines_falling_silent_ends_the_job_too() -> None:
    """Most of the job stops reporting 8 s after m05's process died (a few agents still send
    their node's data under the job's id): the job ended, and m05 is named then."""
    table = _job(1, ONSET + 30, {5: ONSET})
    late = table["ts"] >= START + ONSET + 8
    keep = table["machine"].isin(["m00", "m01", "m02"])
    run = detect_table(table[~late | keep].reset_index(drop=True))
    assert [(a.machine, a.evidence.get("apart_at_end")) for a in run.alerts] == [("m05", True)]
    assert run.alerts[0].detected_ts <= START + ONSET + 8 + 3


def test_the_data_ending_names_nobody_in_a_healthy_job() -> None:
    assert detect_table(_job(1, ONSET + 30, {})).alerts == []


def test_an_idle_fleet_whose_data_ends_with_a_busy_machine_names_nobody() -> None:
    """A serving fleet: most machines idle, one serving requests (its NIC pausing its link)
    for the last 12 s of the data. It never worked as one job, so its end is no fault's end."""
    rng = np.random.default_rng(4)
    shape = (ONSET + 12, 16, GPUS)
    busy = np.zeros(shape, dtype=bool)
    busy[ONSET:, 3] = True
    util = np.where(busy, 0.9 + rng.normal(0, 0.02, shape), 0.0)
    power = np.where(busy, 550 + rng.normal(0, 10, shape), 75 + rng.normal(0, 1, shape))
    pauses = np.where(busy, 2000 + rng.normal(0, 50, shape), 5 + rng.normal(0, 1, shape))
    cubes = (
        ("gpu_util_ratio", np.clip(util, 0, 1)),
        ("gpu_power_watts", power),
        ("pfc_tx_pause_per_second", np.clip(pauses, 0, None)),
    )
    assert _end_alerts(cube_table(cubes, 1, START)) == []


def test_a_burst_of_pause_frames_at_the_end_names_nobody() -> None:
    """A host's NIC pauses its link 15x as often as its peers' for the last 16 s of the data (an
    incast burst): a surge, not a machine that stopped working, and continuity would have seen
    it pass. The end confirms only work metrics below the peers."""
    rng = np.random.default_rng(6)
    pauses = 100 * (1 + rng.normal(0, 0.05, (ONSET + 16, 16, GPUS)))
    pauses[ONSET:, 4] *= 15
    tables = [_job(1, ONSET + 16, {}), cube_table([("pfc_tx_pause_per_second", pauses)], 1, START)]
    assert _end_alerts(normalize_table(pd.concat(tables, ignore_index=True))) == []


def test_ranks_that_leave_seconds_apart_at_the_end_name_nobody() -> None:
    """A job that ends as it should: its ranks exit within a couple of seconds of each other,
    and the first to leave reads 0 for two samples before the data ends."""
    assert _end_alerts(_job(1, ONSET + 2, {5: ONSET})) == []


def test_many_machines_apart_at_the_end_name_nobody() -> None:
    """A third of the job died together (a rack's power): no one culprit among peers."""
    run = detect_table(_job(1, ONSET + 10, {m: ONSET for m in range(6)}))
    assert [a for a in run.alerts if a.evidence.get("apart_at_end")] == []


def test_a_throttled_gpu_whose_job_ends_before_continuity_is_named() -> None:
    """A clock at 0.67 of its peers for 26 samples at 1 s, then the job is killed by another
    machine's fault: each evaluation is a mild deviation, but the run holds more evidence than
    a confirmation needs (its sum of |z|), and the dead machine is named as well."""
    table = _job(1, ONSET + 26, {9: ONSET + 14}, throttled={3: ONSET})
    named = sorted(_end_alerts(table))
    assert named == [("m03", True), ("m09", True)]


def test_a_link_fault_that_halts_the_job_before_continuity_is_named_at_the_halt() -> None:
    """NVLink at a tenth of its peers' traffic for 16 s, then the job goes idle and keeps
    reporting: the run ends as the peers' means follow it down, before 30 evaluations; chosen
    as the job goes idle, the machine is named once the job stayed idle (30 s)."""
    table = _job(1, ONSET + 100, {}, slow_link={7: ONSET}, idle_at=ONSET + 16)
    run = detect_table(table)
    assert [(a.machine, a.metric) for a in run.alerts] == [
        ("m07", "gpu_nvlink_tx_bytes_per_second")
    ]
    alert = run.alerts[0]
    assert alert.evidence["stopped_before_halt"] is True
    assert START + ONSET + 16 + 30 <= alert.detected_ts <= START + ONSET + 16 + 45


def test_a_job_that_goes_idle_and_ends_before_the_halt_is_confirmed_names_the_machine() -> None:
    """The same link fault, but the job's data ends 12 s after it went idle, before it stayed
    idle 30 s: the machine chosen as it went idle is named at the end."""
    table = _job(1, ONSET + 16 + 12, {}, slow_link={7: ONSET}, idle_at=ONSET + 16)
    alerts = detect_table(table).alerts
    assert [(a.machine, a.evidence.get("stopped_before_halt")) for a in alerts] == [("m07", True)]
    assert alerts[0].detected_ts == START + ONSET + 16 + 11


def test_a_job_that_idles_with_its_machines_alike_names_nobody() -> None:
    assert detect_table(_job(1, ONSET + 100, {}, idle_at=ONSET + 23)).alerts == []


def test_the_same_job_running_on_names_the_machine_by_continuity() -> None:
    """Had the data not ended, continuity would have named the same machine: the end only
    shortens the wait."""
    table = _job(1, ONSET + 60, {5: ONSET})
    run = detect_table(table)
    assert [a.machine for a in run.alerts] == ["m05"]
    assert "apart_at_end" not in run.alerts[0].evidence


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    order=st.permutations(range(16)),
    scale=st.floats(0.5, 2.0),
    shift=st.integers(min_value=-(10**6), max_value=10**6),
)
def test_the_end_names_the_same_machine_whatever_the_names_units_and_time(
    order: list[int], scale: float, shift: int
) -> None:
    """Metamorphic: renaming and reordering machines, another unit of power (a constant
    factor: ratios are bounded and keep their unit) and shifting time change nothing of who is
    named when the data ends."""
    table = _job(1, ONSET + 8, {5: ONSET})
    names = {f"m{i:02d}": f"host-{order[i]:02d}" for i in range(16)}
    changed = scale_metric(table, "gpu_power_watts", lambda ts: np.full(ts.shape, scale))
    changed = rename(shift_table(changed, shift), names, seed=order[0])
    assert _end_alerts(changed) == [(names["m05"], True)]


def test_continuity_keeps_each_runs_sum_of_z() -> None:
    tracker = ContinuityTracker([Severity(6.0, 30), Severity(24.0, 25)])
    for z in ([7.0, 1.0], [9.0, 8.0], [np.nan, 10.0], [12.0, 11.0]):
        tracker.update("m", np.asarray(z))
    run, peak, total, ago = tracker.runs("m", 3)
    assert run.tolist() == [1, 3, 0]  # a missing score breaks the run
    assert peak.tolist() == [12.0, 11.0, 0.0]
    assert total.tolist() == [12.0, 29.0, 0.0]
    assert ago.tolist() == [0, 0, 0]


def test_a_finished_run_is_kept_for_the_memory_and_a_flicker_does_not_hide_it() -> None:
    """Ten evaluations at 40, then a flicker above the threshold between quiet ones: the long
    run is what the halt reads, until it is older than the memory."""
    tracker = ContinuityTracker([Severity(6.0, 30)], memory=5)
    for z in [40.0] * 10 + [1.0, 7.0, 1.0]:
        tracker.update("m", np.asarray([z]))
    run, peak, total, ago = tracker.runs("m", 1, within=5)
    assert (run[0], peak[0], total[0], ago[0]) == (10, 40.0, 400.0, 3)
    assert tracker.runs("m", 1, within=2)[0][0] == 0  # ended 3 evaluations ago: too old
    assert tracker.runs("m", 1)[0][0] == 0  # without within: only a current run
    for _ in range(3):
        tracker.update("m", np.asarray([1.0]))
    # Past the memory now; the flicker, smaller while the long run was kept, was not kept.
    assert tracker.runs("m", 1, within=5)[0].tolist() == [0]


def _hung_gpu(samples_after: int, low: float, seed: int = 8) -> pd.DataFrame:
    """One GPU of m05 draws ``low`` W from ONSET (a kernel hung: no progress, no tensor work)
    while every peer keeps working at 600 W; the table ends ``samples_after`` samples later."""
    rng = np.random.default_rng(seed)
    shape = (ONSET + samples_after, 16, GPUS)
    util = np.clip(0.97 + rng.normal(0, 0.01, shape), 0, 1)
    power = 600 + rng.normal(0, 8, shape)
    power[ONSET:, 5, 1] = low + rng.normal(0, 1, power[ONSET:, 5, 1].shape)
    return cube_table((("gpu_util_ratio", util), ("gpu_power_watts", power)), 1, START)


def test_a_hung_gpu_whose_job_ends_9_samples_later_is_named_at_1_s() -> None:
    """A GPU at 240 W against its peers' 600 W (z 30 against the 2 % scale) for 9 samples, then
    the data ends. At 1 s each evaluation judges an 8-sample window mean, so the z grows over
    the first 8 samples (3.75, 7.5, ... 30): the run above the threshold holds a sum of 154,
    short of the 180 a confirmation holds, because the samples of the last window have counted
    in fewer evaluations than earlier ones. The end adds what they lack (the last |z| times
    7 / 2) before it compares."""
    assert _end_alerts(_hung_gpu(9, 240.0)) == [("m05", True)]


def test_a_mild_dip_at_the_end_is_not_made_a_fault_by_the_last_window() -> None:
    """A GPU at 504 W against 600 (z 8, above the threshold of 6) for the last 16 samples:
    what the last window lacks (28) still leaves its run (79) far short of a confirmation."""
    assert _end_alerts(_hung_gpu(16, 504.0)) == []
