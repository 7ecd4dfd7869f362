"""Metamorphic properties of detection: transformations that must not change the answer.

The benchmark was tuned on our own simulator; these properties hold whatever the data set.
The answer of :func:`detectors.offline.detect_table` with the service's default detector (the
alerted ``(machine, kind)`` pairs, the metric of similarity alerts, their onsets within a
tolerance) must not change when a table is

* thinned to a coarser cadence (a scrape), while the fault still lasts 8 samples or more;
* multiplied, metric by metric, by one positive factor common to all machines at each instant
  (a lockstep swing of the whole job, a slow ramp);
* given other machine names, rows in another order;
* shifted in time by whole seconds;
* expressed in another unit (a constant factor);
* joined by idle machines of another role, declared as their own group.

Each property also checks the answer before the transformation: the faulty machine is named
(on its metric, near its onset) and a fault-free job names nobody, so "no alert before and
after" can never pass on its own.

Bad input: a job of 2 or 3 machines has no peers to be scored against, and a metric that is
constant over the fleet, all NaN or all zero raises no alert, warning or exception.

Jobs are drawn by :mod:`metamorphic_tables`; hypothesis runs derandomised and without its
example database, so every run (and CI) checks the same examples.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from metamorphic_tables import (
    BYTE_RATES,
    CADENCES,
    LEVELS,
    SERIES,
    Fault,
    Job,
    answer,
    build,
    compare,
    devices_of,
    expected_keys,
    fault_onset,
    fault_samples_needed,
    frame,
    rename,
    scale_metric,
    shift,
    thin,
    values,
    with_idle,
)

from detectors.config import DetectorConfig
from detectors.offline import DetectionRun, detect_table
from minder.core.alert import AlertKind
from minder.core.table import normalize_table

CONFIG = DetectorConfig()
"""The configuration of the service's default detector (``detect_table``'s default)."""

F = TypeVar("F", bound=Callable[..., Any])


def examples(count: int) -> Callable[[F], F]:
    """Hypothesis settings of this file: ``count`` examples, derandomised, no database, no
    deadline (one detection run takes from 0.05 s to 1 s on a loaded machine).

    No shrinking: each step runs detection twice, and shrinking one failure took three minutes
    on a loaded 2-core machine, near pytest's 300 s timeout. A failure reports the example as
    generated (its job in the notes); add ``Phase.shrink`` to ``phases`` to shrink it locally.
    """
    return settings(
        max_examples=count,
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- strategies ---------------------------------------------------------------------------


@st.composite
def faults(
    draw: st.DrawFn,
    machines: int,
    *,
    onset: int,
    length: int,
    metric: str | None = None,
) -> Fault:
    """A fault on a drawn machine from sample ``onset`` for ``length`` samples."""
    metric = metric or draw(st.sampled_from(sorted(LEVELS)))
    return Fault(
        machine=draw(st.integers(0, machines - 1)),
        metric=metric,
        start=onset,
        samples=length,
        ratio=draw(st.floats(0.1, 0.3)),
        device=draw(st.none() | st.sampled_from(devices_of(metric))),
    )


@st.composite
def jobs(
    draw: st.DrawFn,
    *,
    machines: st.SearchStrategy[int] | None = None,
    faulty: bool | None = None,
    stagger: bool | None = None,
    fault_metrics: tuple[str, ...] = tuple(sorted(LEVELS)),
) -> Job:
    """A job at an interval of :data:`CADENCES`, healthy or with one fault (``faulty`` None:
    either) that starts 10 or more samples in and lasts long enough to be confirmed at that
    cadence (:func:`fault_samples_needed`). ``stagger`` None: drawn."""
    interval = draw(st.sampled_from(CADENCES))
    n = draw(st.integers(8, 64) if machines is None else machines)
    onset = draw(st.integers(10, 16))
    length = fault_samples_needed(interval, CONFIG) + draw(st.integers(0, 8))
    samples = onset + length + draw(st.integers(0, 6))
    has_fault = draw(st.booleans()) if faulty is None else faulty
    fault = None
    if has_fault:
        metric = draw(st.sampled_from(fault_metrics))
        fault = draw(faults(n, onset=onset, length=length, metric=metric))
    return Job(
        machines=n,
        samples=samples,
        interval_s=interval,
        seed=draw(st.integers(0, 2**32 - 1)),
        noise=draw(st.floats(0.002, 0.03)),
        start_ts=draw(st.integers(1_500_000_000, 1_900_000_000)),
        fault=fault,
        stagger=draw(st.booleans()) if stagger is None else stagger,
    )


# -- helpers ------------------------------------------------------------------------------


def detect(table: pd.DataFrame) -> DetectionRun:
    """Detection with the service's default detector; a RuntimeWarning (a mean of nothing,
    a division by zero) is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return detect_table(table)


def window_s(interval_s: int) -> int:
    """Seconds one denoising window spans at ``interval_s``: how far an onset estimate moves
    with where, within the window, the run of outlying scores starts."""
    return CONFIG.at_interval(interval_s).window * interval_s


def assert_base(job: Job, found: dict[tuple[str, AlertKind, str], float]) -> None:
    """The answer on the untransformed job is right: the faulty machine is named on its metric
    near its onset, and nobody else is named (a fault-free job names nobody)."""
    if currently_in_test_context():  # a hypothesis example: say which job failed
        note(f"job: {job!r}")
        event(f"{'faulty' if job.fault else 'healthy'} job at {job.interval_s} s")
    assert set(found) == expected_keys(job), f"{job}: answer {found}"
    if job.fault is not None:
        (onset,) = found.values()
        tolerance = window_s(job.interval_s) + job.interval_s
        assert abs(onset - fault_onset(job)) <= tolerance, (
            f"{job}: onset {onset}, fault from {fault_onset(job)}: expected within {tolerance} s"
        )


# -- the helpers' own behaviour -------------------------------------------------------------


def test_the_builder_injects_one_drop_and_nothing_else() -> None:
    fault = Fault(machine=2, metric="rdma_tx_bytes_per_second", start=12, samples=20, ratio=0.2)
    job = Job(machines=8, samples=40, interval_s=5, seed=3, noise=0.01, fault=fault)
    faulty, healthy = values(job), values(replace(job, fault=None))
    changed = np.argwhere(faulty != healthy)
    cols = [s for s, (m, _) in enumerate(SERIES) if m == fault.metric]
    assert set(changed[:, 0].tolist()) == set(range(12, 32))
    assert set(changed[:, 1].tolist()) == {2}
    assert set(changed[:, 2].tolist()) == set(cols)
    np.testing.assert_allclose(faulty[12:32, 2, cols], 0.2 * healthy[12:32, 2, cols])
    table = build(job)
    assert len(table) == 40 * 8 * len(SERIES)
    assert set(np.diff(np.unique(table["ts"].to_numpy()))) == {5.0}
    with pytest.raises(ValueError, match="fault ends at sample 32"):
        replace(job, samples=30)


def test_thinning_keeps_each_machines_phase() -> None:
    job = Job(machines=4, samples=30, interval_s=1, seed=0, noise=0.01)
    table = build(job)
    thinned = thin(table, 1, 5, {"n0000": 0, "n0001": 1, "n0002": 4, "n0003": 0})
    for name, phase in (("n0000", 0), ("n0001", 1), ("n0002", 4)):
        ts = np.unique(thinned.loc[thinned["machine"] == name, "ts"].to_numpy())
        assert (ts - job.start_ts).tolist() == list(range(phase, 30, 5))


# -- metamorphic properties -----------------------------------------------------------------

PAIRS = [(b, c) for b in CADENCES for c in CADENCES if c > b and c % b == 0]
"""``(base, coarse)`` intervals: a table at ``base`` thinned to ``coarse``."""


@st.composite
def thinning_cases(draw: st.DrawFn) -> tuple[Job, int, dict[str, int]]:
    """A job at a fine interval, how many samples a scrape keeps one of, and each machine's
    phase. Its fault starts 10 or more coarse samples in and lasts 8 or more coarse samples
    (and long enough to be confirmed at the fine interval)."""
    base, coarse = draw(st.sampled_from(PAIRS))
    every = coarse // base
    n = draw(st.integers(8, 64))
    onset = every * draw(st.integers(10, 14)) + draw(st.integers(0, every - 1))
    length = max(every * draw(st.integers(8, 12)), fault_samples_needed(base, CONFIG))
    samples = onset + length + draw(st.integers(0, 3 * every))
    fault = draw(st.none() | faults(n, onset=onset, length=length))
    job = Job(
        machines=n,
        samples=samples,
        interval_s=base,
        seed=draw(st.integers(0, 2**32 - 1)),
        noise=draw(st.floats(0.002, 0.03)),
        start_ts=draw(st.integers(1_500_000_000, 1_900_000_000)),
        fault=fault,
    )
    staggered = draw(st.booleans())
    phases = {job.name(m): draw(st.integers(0, every - 1)) if staggered else 0 for m in range(n)}
    return job, every, phases


@pytest.mark.slow
@examples(35)
@given(case=thinning_cases())
def test_thinning_to_a_coarser_cadence_keeps_the_answer(
    case: tuple[Job, int, dict[str, int]],
) -> None:
    job, every, phases = case
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    coarse = job.interval_s * every
    event(f"thinned {job.interval_s} s -> {coarse} s")
    note(f"every {every}, phases {phases}")
    thinned = thin(table, job.interval_s, every, phases)
    run = detect(thinned)
    assert run.jobs["job"]["interval_s"] == coarse
    # The coarse estimate of an onset is as good as its window, plus the scrape's phase.
    compare(before, answer(run), window_s(coarse) + coarse)


SWINGS = ("swing", "alternate", "ramp")


@st.composite
def common_factors(draw: st.DrawFn, shape: str, samples: int) -> np.ndarray:
    """One positive factor per sample: a lockstep swing between ``low`` and 1 (random or
    alternating from sample to sample) or a slow ramp between two levels in [0.25, 1]."""
    low = draw(st.floats(0.25, 0.5))
    if shape == "swing":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return rng.uniform(low, 1.0, samples)
    if shape == "alternate":
        return np.where(np.arange(samples) % 2 == 0, low, 1.0)
    high = draw(st.floats(0.25, 1.0))
    ends = (low, high) if draw(st.booleans()) else (high, low)
    return np.linspace(*ends, samples)


@pytest.mark.slow
@examples(50)
@given(data=st.data(), shape=st.sampled_from(SWINGS))
def test_a_factor_common_to_all_machines_keeps_the_answer(data: st.DataObject, shape: str) -> None:
    # A swing from sample to sample is common to the machines only where they are sampled at
    # the same instants: scrapes staggered within the interval would each read another phase
    # of it (docs/detection-method.md §8, "a known limit"). A slow ramp is common either way.
    job = data.draw(jobs(stagger=None if shape == "ramp" else False), label="job")
    # The factor multiplies the faulty metric (else a drawn one): a whole job swinging in
    # lockstep must neither hide the fault nor make its healthy machines outliers.
    metric = job.fault.metric if job.fault else data.draw(st.sampled_from(sorted(LEVELS)))
    factor = data.draw(common_factors(shape, job.samples), label="factor")
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)

    def at(ts: np.ndarray) -> np.ndarray:
        sample = (ts - job.start_ts) // job.interval_s  # staggered instants stay in their sample
        return factor[sample.astype(np.int64)]

    after = answer(detect(scale_metric(table, metric, at)))
    compare(before, after, window_s(job.interval_s))


@pytest.mark.parametrize("low", [0.25, 0.5])
def test_a_job_swinging_every_sample_keeps_its_fault_at_coarse_cadence(low: float) -> None:
    # The smallest case hypothesis found while a job-wide swing raised the robust scale at
    # coarse cadence (the engine's former "unsteady" floor): 8 machines scraped every 5 s, the
    # NVLink traffic of all of them cut on every other sample, one machine's at a quarter for
    # 12 samples. The fault was lost.
    fault = Fault(
        machine=0, metric="gpu_nvlink_tx_bytes_per_second", start=10, samples=12, ratio=0.25
    )
    job = Job(
        machines=8,
        samples=22,
        interval_s=5,
        seed=0,
        noise=0.015625,
        start_ts=1_500_000_000,
        fault=fault,
    )
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    swing = np.where(np.arange(job.samples) % 2 == 0, low, 1.0)
    after = answer(
        detect(
            scale_metric(
                table, fault.metric, lambda ts: swing[((ts - job.start_ts) // 5).astype(int)]
            )
        )
    )
    compare(before, after, window_s(job.interval_s))


@examples(30)
@given(data=st.data(), job=jobs())
def test_renaming_and_reordering_machines_keeps_the_answer(data: st.DataObject, job: Job) -> None:
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    old = [job.name(m) for m in range(job.machines)]
    # A permutation of the names (so the machines' sorted order changes too), or new names.
    if data.draw(st.booleans(), label="permute"):
        new = data.draw(st.permutations(old), label="names")
    else:
        new = [f"host-{i:03d}.rack{i % 7}" for i in data.draw(st.permutations(range(len(old))))]
    names = dict(zip(old, new, strict=True))
    after = answer(detect(rename(table, names, seed=data.draw(st.integers(0, 2**31 - 1)))))
    compare(before, after, 0.0, names=names)


@examples(40)
@given(
    job=jobs(),
    seconds=st.integers(-60, 60) | st.integers(-1_400_000_000, 1_000_000_000),
)
def test_shifting_timestamps_keeps_the_answer(job: Job, seconds: int) -> None:
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    after = answer(detect(shift(table, seconds)))
    # A shift by a non-multiple of the interval moves where ticks cut the stream: onsets are
    # reported at tick boundaries, so they may move by up to one interval.
    compare(before, after, job.interval_s, offset_s=seconds)


@examples(30)
@given(
    data=st.data(),
    job=jobs(fault_metrics=BYTE_RATES),
    c=st.floats(0.5, 2.0),
)
def test_a_change_of_unit_keeps_the_answer(data: st.DataObject, job: Job, c: float) -> None:
    # Byte rates only: a ratio has a bounded range. Levels (GB/s) stay far above the 10 MB/s
    # floor at any c here.
    metric = job.fault.metric if job.fault else data.draw(st.sampled_from(BYTE_RATES))
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    after = answer(detect(scale_metric(table, metric, lambda ts: np.full(ts.shape, c))))
    compare(before, after, job.interval_s)


@examples(30)
@given(
    job=jobs(),
    group=st.sampled_from(["", "train"]),
    idle=st.integers(4, 16),
    seed=st.integers(0, 2**32 - 1),
)
def test_idle_machines_of_another_role_keep_the_answer(
    job: Job, group: str, idle: int, seed: int
) -> None:
    job = replace(job, group=group)
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    after = answer(detect(with_idle(table, job, idle, seed)))
    compare(before, after, job.interval_s)


# -- bad input ------------------------------------------------------------------------------


@examples(20)
@given(job=jobs(machines=st.integers(2, 3), faulty=True))
def test_two_or_three_machines_are_not_scored_against_each_other(job: Job) -> None:
    # A clear fault: with 8 or more machines it would be named (the properties above).
    note(f"job: {job!r}")
    run = detect(build(job))
    assert [a for a in run.alerts if a.kind is AlertKind.SIMILARITY] == []
    assert run.jobs["job"]["machines"] == job.machines


DEGENERATE = ("constant", "fleet_constant", "nan", "zero")


@examples(50)
@given(
    data=st.data(),
    job=jobs(),
    metric=st.sampled_from(sorted(LEVELS)),
    kind=st.sampled_from(DEGENERATE),
)
def test_a_degenerate_metric_raises_nothing(
    data: st.DataObject, job: Job, metric: str, kind: str
) -> None:
    # The degenerate metric replaces one metric of the job; a fault, if any, is on another.
    if job.fault is not None and job.fault.metric == metric:
        other = sorted(set(LEVELS) - {metric})
        moved = replace(job.fault, metric=data.draw(st.sampled_from(other)), device=None)
        job = replace(job, fault=moved)
    data_values = values(job)
    cols = [s for s, (m, _) in enumerate(SERIES) if m == metric]
    top = 1.0 if metric == "gpu_util_ratio" else 1e10
    if kind == "constant":
        data_values[:, :, cols] = data.draw(st.floats(0.0, top), label="value")
    elif kind == "fleet_constant":
        # The same on every machine at each instant, changing from sample to sample.
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        data_values[:, :, cols] = rng.uniform(0.0, top, (job.samples, 1, 1))
    elif kind == "nan":
        data_values[:, :, cols] = np.nan
    else:
        data_values[:, :, cols] = 0.0
    note(f"job: {job!r}")
    table = normalize_table(frame(job, data_values))
    found = answer(detect(table))
    assert not any(key[2] == metric for key in found), f"{kind} {metric} alerted: {found}"
    assert set(found) == expected_keys(job), f"{job}: answer {found}"


def test_a_port_at_a_ninth_of_its_peers_thinned_to_8_samples_at_5_s_keeps_the_answer() -> None:
    """The case hypothesis found when network throughputs first took a 5 % scale floor: a port
    at 0.115 of its peers' rate for 40 samples at 1 s, thinned to 8 samples at 5 s, was named
    at 1 s only (z 18, under the severe 24 the floor left out of reach). A port that lost half
    of its peers' rate is now a severe deviation whatever the floor."""
    fault = Fault(machine=18, metric="rdma_tx_bytes_per_second", start=72, samples=40,
                  ratio=0.11476603093796177)  # fmt: skip
    job = Job(machines=29, samples=123, interval_s=1, seed=367, noise=0.002,
              start_ts=1867980012, fault=fault)  # fmt: skip
    table = build(job)
    before = answer(detect(table))
    assert_base(job, before)
    thinned = thin(table, 1, 5, {job.name(m): 0 for m in range(job.machines)})
    compare(before, answer(detect(thinned)), window_s(5) + 5)
