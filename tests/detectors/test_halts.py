"""Who stopped first: a machine below its peers shortly before its whole job halted."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from gpu_cubes import cube_table

from detectors.halts import HaltWatch
from detectors.offline import detect_table
from minder.core.alert import AlertKind
from minder.core.table import normalize_table

GPUS = 4
START = 1_700_000_000


def _job(
    interval_s: int,
    samples: int,
    halt_at: int | None,
    stopped: dict[int, int],
    machines: int = 16,
    seed: int = 0,
) -> pd.DataFrame:
    """Working GPUs (use ~0.95, power ~600 W); each machine in ``stopped`` idles from its
    sample on; at ``halt_at`` every machine idles (the job halted)."""
    rng = np.random.default_rng(seed)
    shape = (samples, machines, GPUS)
    working = np.ones(shape, dtype=bool)
    if halt_at is not None:
        working[halt_at:] = False
    for m, at in stopped.items():
        working[at:, m] = False
    util = np.where(working, 0.95 + rng.normal(0, 0.01, shape), 0.0)
    power = np.where(working, 600 + rng.normal(0, 8, shape), 80 + rng.normal(0, 2, shape))
    cubes = (("gpu_util_ratio", np.clip(util, 0, 1)), ("gpu_power_watts", power))
    return cube_table(cubes, interval_s, START)


@pytest.mark.parametrize(("interval_s", "lead"), [(1, 8), (1, 16), (5, 8), (15, 8), (60, 8)])
def test_the_machine_that_stopped_before_the_job_halted_is_named(
    interval_s: int, lead: int
) -> None:
    """The fault shows for ``lead`` samples, then the job halts: too short for continuity at
    1 s (30 evaluations), named at the halt."""
    run = detect_table(_job(interval_s, 120, halt_at=30 + lead, stopped={5: 30}))
    named = {(a.machine, a.kind) for a in run.alerts}
    assert named == {("m05", AlertKind.SIMILARITY)}
    alert = run.alerts[0]
    assert abs(alert.first_ts - (START + 30 * interval_s)) <= 8 * interval_s
    if interval_s > 1 and "stopped_before_halt" not in alert.evidence:
        # At coarse sampling continuity may need no more evaluations than the lead: named
        # by the time the halt shows (its window mean still holds the deviation a sample on).
        assert alert.detected_ts <= START + (30 + lead + 1) * interval_s
        return
    if interval_s > 1:
        assert alert.detected_ts >= START + (30 + lead) * interval_s
        return
    # At 1 s continuity (30 evaluations) is longer than the lead: named once the job stayed
    # idle for 30 s, not before.
    assert alert.evidence["stopped_before_halt"] is True
    assert START + 30 + lead + 30 - 1 <= alert.detected_ts <= START + 30 + lead + 10 + 30


@pytest.mark.parametrize("interval_s", [1, 15])
def test_a_job_that_halts_with_nobody_ahead_names_nobody(interval_s: int) -> None:
    run = detect_table(_job(interval_s, 120, halt_at=40, stopped={}))
    assert run.alerts == []


def test_a_machine_only_a_moment_ahead_of_the_halt_is_not_named() -> None:
    """Ranks leave a halting job within a second or two of each other: no culprit."""
    run = detect_table(_job(1, 120, halt_at=40, stopped={5: 38}))
    assert run.alerts == []


def test_many_machines_ahead_of_the_halt_name_nobody() -> None:
    run = detect_table(_job(1, 120, halt_at=40, stopped={m: 30 for m in range(6)}))
    assert [a for a in run.alerts if a.evidence.get("stopped_before_halt")] == []


def test_a_lull_shorter_than_a_halt_names_nobody() -> None:
    """The job idles 20 s (a data-loading phase, a short checkpoint) right after a machine was
    below its peers for 10 s: the job did not halt, nobody is named for it."""
    table = _job(1, 120, halt_at=None, stopped={})
    lull = _job(1, 120, halt_at=40, stopped={5: 30})
    ts = table["ts"] - START
    keep = (ts < 30) | (ts >= 60)
    table.loc[~keep, "value"] = lull.loc[~keep, "value"].to_numpy()
    run = detect_table(table)
    assert [a for a in run.alerts if a.evidence.get("stopped_before_halt")] == []


def test_halt_watch_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="lead=0"):
        HaltWatch(0, 3)


def test_a_machine_still_busy_after_its_job_halted_is_named() -> None:
    """A hung kernel: the job halts after working for minutes, one machine's GPUs stay busy.
    Its peers' idle GPUs excuse nothing in a job that was working a moment ago."""
    table = _job(1, 300, halt_at=160, stopped={})
    busy = _job(1, 300, halt_at=None, stopped={})
    hung = (table["machine"] == "m07") & (table["ts"] >= START + 160)
    table.loc[hung, "value"] = busy.loc[hung, "value"].to_numpy()
    run = detect_table(table)
    assert {a.machine for a in run.alerts} == {"m07"}


def test_a_pause_storm_in_a_halted_job_is_named() -> None:
    """Congestion counters are no activity: a surge above quiet, idle peers is the fault."""
    table = _job(1, 160, halt_at=40, stopped={})
    rng = np.random.default_rng(3)
    rows = pd.DataFrame(
        {
            "ts": np.repeat(START + np.arange(160), 16),
            "job": "j",
            "machine": np.tile([f"m{i:02d}" for i in range(16)], 160),
            "metric": "pfc_tx_pause_per_second",
            "device": "mlx5_0",
            "value": rng.poisson(3, 160 * 16).astype(float),
        }
    )
    storm = (rows["machine"] == "m03") & (rows["ts"] >= START + 60)
    rows.loc[storm, "value"] = 5000.0
    run = detect_table(normalize_table(pd.concat([table, rows], ignore_index=True)))
    assert {(a.machine, a.metric) for a in run.alerts} == {("m03", "pfc_tx_pause_per_second")}
