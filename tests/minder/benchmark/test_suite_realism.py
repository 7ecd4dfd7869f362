"""The ``realism`` suite: every new fault class several times, the fault-free backgrounds, fault
durations and onsets in samples at every cadence, the same jobs at every cadence, determinism,
and that what each case claims really shows in its simulated table."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from collectors.sim import scenario_labels, simulate_table
from collectors.sim.kinds import HALTING_FAULTS
from collectors.sim.plan import compile_scenario
from minder.benchmark.suite import (
    DOMAIN_DROP_S,
    FAIL_SLOW,
    FAIL_STOP,
    HALT_SAMPLES,
    MIN_FAULT_SAMPLES,
    SUITES,
    WARM_UP_S,
    BenchCase,
    build_suite,
)

INTERVALS = (1, 5, 10, 15, 30, 60)


@pytest.fixture(scope="module")
def by_interval() -> dict[int, list[BenchCase]]:
    return {i: build_suite("realism", 0, i) for i in INTERVALS}


def kinds(cases: list[BenchCase]) -> Counter[str]:
    """Cases per class: ``<fault>_halt``, ``switch_reboot``, ``intermittent_straggler``,
    ``two_faults``, ``idle_fleet``, ``lockstep``."""
    out: Counter[str] = Counter()
    for case in cases:
        faults = case.scenario.faults
        job = case.scenario.jobs[0]
        if len(faults) == 2:
            out["two_faults"] += 1
        elif faults and faults[0].halt_after_s is not None:
            out[f"{case.fault}_halt"] += 1
        elif faults:
            out[str(case.fault)] += 1
        elif job.fleet is not None:
            out["idle_fleet"] += 1
        else:
            assert job.host_fraction > 0, case.name
            out["lockstep"] += 1
    return out


def test_realism_is_a_suite_with_every_new_class_several_times(
    by_interval: dict[int, list[BenchCase]],
) -> None:
    assert "realism" in SUITES
    cases = by_interval[1]
    counts = kinds(cases)
    halting = sum(n for k, n in counts.items() if k.endswith("_halt"))
    assert counts["nic_down_halt"] >= 3 and halting - counts["nic_down_halt"] >= 3
    assert {k.removesuffix("_halt") for k in counts if k.endswith("_halt")} <= {
        t.value for t in HALTING_FAULTS
    }
    for kind in ("switch_reboot", "intermittent_straggler", "two_faults", "idle_fleet"):
        assert counts[kind] >= 3, kind
    assert counts["lockstep"] >= 4
    # Faults in lockstep jobs too, and both kinds of domain loss.
    assert any(c.scenario.jobs[0].host_fraction > 0 for c in cases if c.fault)
    reboots = [c.scenario.faults[0] for c in cases if c.fault == "switch_reboot"]
    assert {f.silent for f in reboots} == {True, False}
    assert {c.fail_mode for c in cases} == {"fail-stop", "fail-slow", None}
    assert {c.fault for c in cases if c.fault} <= FAIL_STOP | FAIL_SLOW
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)


def test_fault_free_backgrounds_are_idle_fleets_and_lockstep_jobs(
    by_interval: dict[int, list[BenchCase]],
) -> None:
    free = [c for c in by_interval[1] if c.is_fault_free]
    for case in free:
        assert not case.scenario.faults and scenario_labels(case.scenario).empty
        job = case.scenario.jobs[0]
        if job.fleet is not None:
            assert job.pp_stages == 1 and job.fleet.busy_share <= 0.2  # idle-heavy, one group
            assert not any(m.startswith("train_") for m in job.metric_names)
        else:
            assert 0.2 <= job.host_fraction <= 0.35 and job.step_time_s >= 20
    steps = {c.scenario.jobs[0].step_time_s for c in free if c.scenario.jobs[0].fleet is None}
    assert any(60 % s == 0 for s in steps) and any(60 % s for s in steps)  # fixed phase or not
    assert any(s > 60 for s in steps)  # a step that outlasts the slowest scrape


@pytest.mark.parametrize("interval_s", INTERVALS)
def test_faults_last_and_start_after_enough_samples(
    by_interval: dict[int, list[BenchCase]], interval_s: int
) -> None:
    for case in by_interval[interval_s]:
        labels = scenario_labels(case.scenario)
        origin = case.scenario.start_ts
        for index, rows in labels.groupby("fault_index"):
            start = float(rows["start_ts"].iloc[0] - origin)
            length = float(rows["end_ts"].iloc[0] - origin) - start
            fault = case.scenario.faults[int(index)]
            assert start >= max(WARM_UP_S, MIN_FAULT_SAMPLES * interval_s), case.name
            assert length >= MIN_FAULT_SAMPLES * interval_s, case.name
            if fault.halt_after_s is not None:
                samples = fault.halt_after_s / interval_s
                assert samples == int(samples) and HALT_SAMPLES[0] <= samples <= HALT_SAMPLES[1]
            if fault.type.value == "switch_reboot":
                assert length == max(DOMAIN_DROP_S, MIN_FAULT_SAMPLES * interval_s)
                assert len(rows) == 8 and rows["domain"].nunique() == 1  # one leaf of 8
                assert case.duration_s - (start + length) >= 240  # time to see it recover
            assert case.duration_s - start >= 12 * interval_s  # samples past the onset
        if len(case.scenario.faults) == 2:
            assert labels["fault_index"].nunique() == 2 and labels["machine"].nunique() == 2
            assert labels.groupby("fault_index")["start_ts"].first().diff().iloc[1] >= max(
                60, MIN_FAULT_SAMPLES * interval_s
            )


def test_the_same_jobs_at_every_cadence_and_deterministic_by_seed(
    by_interval: dict[int, list[BenchCase]],
) -> None:
    base = by_interval[1]
    for interval_s, cases in by_interval.items():
        assert [c.name for c in cases] == [c.name for c in base]
        assert [c.scenario.jobs for c in cases] == [c.scenario.jobs for c in base], interval_s
        assert [c.scenario.seed for c in cases] == [c.scenario.seed for c in base]
    again = build_suite("realism", 0, 15)
    assert [c.scenario for c in again] == [c.scenario for c in by_interval[15]]
    other = build_suite("realism", 1, 15)
    assert [c.scenario.seed for c in other] != [c.scenario.seed for c in again]


def test_one_cadence_is_sized_for_about_a_minute(by_interval: dict[int, list[BenchCase]]) -> None:
    # ~170 machine-hours at 1-15 s took ~60-80 s of CPU with the minder detector (2 cores).
    for interval_s, cases in by_interval.items():
        hours = sum(c.machine_hours for c in cases)
        assert hours < (200 if interval_s <= 15 else 350), interval_s
        assert max(c.machines for c in cases) <= 64


def table_of(case: BenchCase) -> tuple[pd.DataFrame, float]:
    return simulate_table(case.scenario), case.scenario.start_ts


def per_second(table: pd.DataFrame, origin: float, metric: str, agg: str = "mean") -> pd.DataFrame:
    rows = table[table["metric"] == metric]
    sec = (rows["ts"] - origin - 1).round().astype(int)
    return rows.assign(sec=sec).pivot_table(
        index="sec", columns="machine", values="value", aggfunc=agg, observed=True
    )


def test_a_halting_case_halts_its_samples_after_onset_at_its_cadence(
    by_interval: dict[int, list[BenchCase]],
) -> None:
    interval_s = 15
    case = next(
        c
        for c in by_interval[interval_s]
        if c.fault == "nic_down" and c.machines == 16 and len(c.scenario.faults) == 1
    )
    fault = case.scenario.faults[0]
    assert fault.halt_after_s is not None
    table, origin = table_of(case)
    util = per_second(table, origin, "gpu_util_ratio")
    scraped = util[util.index % interval_s == interval_s - 1]
    halted = scraped[scraped.max(axis=1) <= 0.02].index
    first = (halted.min() + 1) // interval_s  # the first scrape after the halt, in samples
    onset = fault.start_s / interval_s
    assert 8 <= first - onset <= 17
    assert len(halted) == len(scraped.loc[halted.min() :])  # and it stays halted


@pytest.mark.parametrize("step_s", [30.0, 45.0])
def test_a_lockstep_background_swings_in_lockstep_or_sits_at_a_fixed_phase(
    by_interval: dict[int, list[BenchCase]], step_s: float
) -> None:
    case = next(
        c
        for c in by_interval[1]
        if c.is_fault_free and c.scenario.jobs[0].fleet is None
        if c.scenario.jobs[0].step_time_s == step_s
    )
    table, origin = table_of(case)
    power = per_second(table, origin, "gpu_power_watts")
    for interval_s in (5, 15, 60):
        scraped = power[power.index % interval_s == interval_s - 1]
        median = scraped.median(axis=1)
        ratio = (median / median.shift(1)).dropna()
        swing = np.maximum(ratio, 1 / ratio)
        if interval_s % step_s == 0:  # every scrape meets the same phase of the step
            assert swing.quantile(0.9) < 1.3, interval_s
        else:
            assert swing.max() >= 2.0, interval_s
        far = (scraped.div(median, axis=0) - 1).abs().stack()
        assert far.quantile(0.99) <= 0.2, interval_s  # blips and restarts aside


def test_an_idle_fleet_background_is_mostly_idle(by_interval: dict[int, list[BenchCase]]) -> None:
    case = min(
        (c for c in by_interval[1] if c.scenario.jobs[0].fleet is not None),
        key=lambda c: c.machines,
    )
    table, origin = table_of(case)
    util = per_second(table, origin, "gpu_util_ratio")
    assert util.median(axis=1).quantile(0.99) <= 0.03
    busy = (util > 0.2).sum(axis=1)
    assert busy.max() >= 1 and busy.mean() <= 0.3 * case.machines


def test_every_case_compiles(by_interval: dict[int, list[BenchCase]]) -> None:
    for case in by_interval[60]:
        plans = compile_scenario(case.scenario)
        assert len(plans) == 1 and plans[0].spec.machines == case.machines
