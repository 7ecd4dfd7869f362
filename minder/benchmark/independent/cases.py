"""The ``independent`` suites: labelled jobs of :mod:`~minder.benchmark.independent.generator`
drawn from a seed stream of their own, never used for tuning.

Every case is drawn from ``numpy.random.default_rng([seed, INDEPENDENT_STREAM, index])``. The
tuned suites (:mod:`minder.benchmark.suite`) and the training suite draw from streams 1-6 of the
same seed; :data:`INDEPENDENT_STREAM` is none of them, and nothing in the project may tune a
threshold, a model or a default on these cases: they are the held-out measurement.

A case has the same shape in samples at every interval: its warm-up, its faults' onsets and
durations and what follows are drawn in samples (floored in seconds where the physics needs
seconds: the detector's warm-up, a leaf switch's 120 s outage, a straggler's steps), so every
fault lasts at least :data:`MIN_FAULT_SAMPLES` samples at 1, 5, 10, 15, 30 and 60 s and every
class is present at every interval.

Suites
------
``independent``
    22 jobs of 8-256 machines: four fault-free (two training jobs in lockstep, two idle-heavy
    serving fleets), 16 with one fault (every class twice; the fail-stop ones halt the job
    8-16 samples after their onset) and two with two faults (on two machines, at two onsets).
``independent-large``
    ``independent`` (the same first 22 cases) and 28 more jobs of 8-256 machines: every class
    three more times, four more fault-free jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from minder.benchmark.independent.generator import (
    HALTING,
    MACHINES_PER_DOMAIN,
    FaultSpec,
    Halt,
    JobSpec,
    Pattern,
    generate_table,
    job_labels,
)

SUITES: tuple[str, ...] = ("independent", "independent-large")
INTERVALS: tuple[int, ...] = (1, 5, 10, 15, 30, 60)
"""Sampling intervals the suite is reported at by default (``--intervals``)."""
INDEPENDENT_STREAM = 7657
"""The cases' seed stream: ``default_rng([seed, INDEPENDENT_STREAM, case_index])``. The tuned
suites use streams 1-6; this one is never used for tuning."""
MIN_FAULT_SAMPLES = 8
"""Every fault lasts at least this many samples at every interval."""
WARM_UP_S = 150
"""No fault starts before this many seconds (nor before 40-70 samples): the detector's windows
must fill first, as in the tuned suites."""
POST_S = 120
"""A faulty job runs this long (15 samples at least) past its last fault's end: an alert within
the matching's slack still counts, a later one is a false positive."""
SWITCH_OUTAGE_S = 120
"""A leaf switch is down this long, or :data:`MIN_FAULT_SAMPLES` samples if longer."""

_DEFAULT: tuple[tuple[str, int], ...] = (
    ("lockstep", 32),
    ("lockstep", 256),
    ("serving", 24),
    ("serving", 64),
    ("nic_down", 16),
    ("nic_down", 64),
    ("cuda_execution_error", 8),
    ("cuda_execution_error", 32),
    ("gpu_execution_error", 16),
    ("gpu_execution_error", 64),
    ("gpu_lost", 32),
    ("gpu_lost", 16),
    ("nvlink_error", 16),
    ("nvlink_error", 128),
    ("thermal_throttle", 32),
    ("thermal_throttle", 64),
    ("switch_reboot", 32),
    ("switch_reboot", 64),
    ("flapping_worker", 16),
    ("flapping_worker", 32),
    ("two_faults", 32),
    ("two_faults", 64),
)
"""``(kind, machines)`` of the ``independent`` suite's cases, in order."""
_LARGE_EXTRA: tuple[tuple[str, int], ...] = (
    ("lockstep", 64),
    ("lockstep", 128),
    ("serving", 128),
    ("serving", 256),
    *(
        (kind, size)
        for kind in (
            "nic_down",
            "cuda_execution_error",
            "gpu_execution_error",
            "gpu_lost",
            "nvlink_error",
            "thermal_throttle",
            "switch_reboot",
            "flapping_worker",
        )
        for size in (
            8 if kind != "switch_reboot" else 16,
            48,
            256 if kind != "flapping_worker" else 64,
        )
    ),
)
"""Cases ``independent-large`` adds."""

_ROUND_STEPS = (2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.5, 10.0, 12.0, 15.0, 20.0, 30.0)
"""Step periods that divide 60 s."""

TWO_FAULTS = "two_faults"
"""The case kind (and :attr:`IndependentCase.fault`) of a job with two faults."""


@dataclass(frozen=True, slots=True)
class IndependentCase:
    """One labelled job of an independent suite at one sampling interval.

    Attributes
    ----------
    name
        Unique within the suite; also the job's name.
    spec
        What :func:`~minder.benchmark.independent.generator.generate_table` generates.
    fault
        The fault class, :data:`TWO_FAULTS`, or None for a fault-free job.
    detail
        What was drawn, for the report.
    """

    name: str
    spec: JobSpec
    fault: str | None
    detail: str

    @property
    def machines(self) -> int:
        """Machines of the job."""
        return self.spec.machines

    @property
    def interval_s(self) -> int:
        """Seconds between samples."""
        return self.spec.interval_s

    @property
    def duration_s(self) -> int:
        """Seconds the job covers."""
        return self.spec.duration_s

    @property
    def is_fault_free(self) -> bool:
        """No fault injected: every alert is a false alarm."""
        return self.fault is None

    @property
    def machine_hours(self) -> float:
        """Machines times hours covered."""
        return self.machines * self.duration_s / 3600.0

    def table(self) -> pd.DataFrame:
        """The job's canonical metric table (generated afresh: deterministic)."""
        return generate_table(self.spec)

    def labels(self) -> pd.DataFrame:
        """The job's ground truth (:func:`~minder.benchmark.independent.generator.job_labels`)."""
        return job_labels(self.spec)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {
            "name": self.name,
            "fault": self.fault,
            "machines": self.machines,
            "interval_s": self.interval_s,
            "samples": self.spec.samples,
            "duration_s": self.duration_s,
            "fault_free": self.is_fault_free,
            "detail": self.detail,
        }


def recipe(name: str) -> tuple[tuple[str, int], ...]:
    """``(kind, machines)`` of every case of suite ``name``."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}: expected one of {', '.join(SUITES)}")
    return _DEFAULT if name == "independent" else _DEFAULT + _LARGE_EXTRA


def build_independent_suite(
    name: str = "independent", seed: int = 0, interval_s: int = 1
) -> list[IndependentCase]:
    """The cases of suite ``name`` (one of :data:`SUITES`) for ``seed``, sampled every
    ``interval_s`` seconds."""
    if seed < 0 or not 1 <= interval_s <= 300:
        raise ValueError(
            f"seed={seed!r}, interval_s={interval_s!r}: expected seed >= 0 and an interval of "
            "1 to 300 seconds"
        )
    return [
        draw_case(kind, machines, seed, index, interval_s)
        for index, (kind, machines) in enumerate(recipe(name))
    ]


def draw_case(kind: str, machines: int, seed: int, index: int, interval_s: int) -> IndependentCase:
    """Case ``index`` of a suite: a job of ``machines`` with ``kind`` (a fault class,
    :data:`TWO_FAULTS`, ``lockstep`` or ``serving``: fault-free), every draw from
    ``default_rng([seed, INDEPENDENT_STREAM, index])``; only the floors in seconds depend on
    ``interval_s``."""
    if machines % MACHINES_PER_DOMAIN or not 8 <= machines <= 4096:
        raise ValueError(
            f"machines is {machines!r}: expected 8 to 4096, a multiple of {MACHINES_PER_DOMAIN}"
        )
    return _Draw(kind, machines, seed, index, interval_s).case()


class _Draw:
    """The draws of one case, in a fixed order (so that every interval gets the same ones)."""

    def __init__(self, kind: str, machines: int, seed: int, index: int, interval_s: int) -> None:
        self.rng = np.random.default_rng([seed, INDEPENDENT_STREAM, index])
        self.kind = kind
        self.machines = machines
        self.index = index
        self.dt = interval_s
        self.step_s = 6.0

    def samples(self, seconds: float) -> int:
        """Samples that cover ``seconds`` at this interval."""
        return math.ceil(seconds / self.dt)

    def case(self) -> IndependentCase:
        rng = self.rng
        kind, n = self.kind, self.machines
        serving = kind == "serving"
        stragglers = kind == "flapping_worker"
        groups = 1 if serving else int(rng.choice([g for g in (1, 2, 4) if n // g >= 8]))
        low, high = (2.0, 10.0) if stragglers else (2.5, 45.0)
        step_s = round(math.exp(rng.uniform(math.log(low), math.log(high))), 2)
        if rng.random() < 0.3:
            # A period that divides a minute: a coarse scrape reads (nearly) the same phase
            # every time, until the steps' jitter moves it.
            step_s = float(rng.choice([d for d in _ROUND_STEPS if low <= d <= high]))
        self.step_s = step_s
        link_counters = bool(rng.random() < 0.6)
        probe = stragglers or bool(rng.random() < 0.4 and n <= 128 and step_s >= 3.0)
        missing_rate = float(rng.choice([0.0, 0.001, 0.003]))
        warm_up = max(int(rng.integers(40, 71)), self.samples(WARM_UP_S))
        checkpoint_s = float(rng.uniform(15.0, 45.0)) if rng.random() < 0.4 else None
        job_seed = int(rng.integers(2**31 - 1))
        name = f"i{self.index:02d}-{kind.replace('_', '-')}-{n}"

        faults: list[FaultSpec] = []
        what: list[str] = []
        if kind in ("lockstep", "serving"):
            samples = max(int(rng.integers(240, 321)), self.samples(360))
        else:
            first = self.fault(kind if kind != TWO_FAULTS else self.pick_first(), warm_up, ())
            faults.append(first[0])
            what.append(first[1])
            if kind == TWO_FAULTS:
                onset = warm_up + int(rng.integers(8, 21))
                second = self.fault(self.pick_second(), onset, faults[0].machines)
                faults.append(second[0])
                what.append(second[1])
            end = max(f.onset + f.samples for f in faults)
            halts = [f.onset + f.samples for f in faults if f.halt is not None]
            if halts:
                end = min(halts)
            samples = end + max(15, self.samples(POST_S))
        checkpoint = None
        if checkpoint_s is not None:
            latest = (warm_up - 10) if faults else (samples - 10)
            if latest > 10:
                checkpoint = (int(rng.integers(10, latest)), checkpoint_s)
        spec = JobSpec(
            name=name,
            pattern=Pattern.SERVING if serving else Pattern.LOCKSTEP,
            machines=n,
            interval_s=self.dt,
            samples=samples,
            seed=job_seed,
            groups=groups,
            step_s=step_s,
            link_counters=link_counters,
            probe=probe and not serving,
            faults=tuple(faults),
            checkpoint=checkpoint,
            missing_rate=missing_rate,
        )
        layout = "serving fleet" if serving else f"{groups} stage(s), step {step_s:g} s"
        extras = [
            layout,
            "link counters" if link_counters else "no link counters",
            *(["step probe"] if spec.probe else []),
            *([f"checkpoint {checkpoint_s:.0f} s"] if checkpoint else []),
            f"{samples} samples",
        ]
        detail = "; ".join([*what, ", ".join(extras)])
        fault = None if kind in ("lockstep", "serving") else kind
        return IndependentCase(name, spec, fault, detail)

    def pick_first(self) -> str:
        return str(self.rng.choice(["nvlink_error", "thermal_throttle"]))

    def pick_second(self) -> str:
        return str(
            self.rng.choice(
                ["nvlink_error", "thermal_throttle", "cuda_execution_error", "nic_down"]
            )
        )

    def fault(self, kind: str, onset: int, avoid: tuple[int, ...]) -> tuple[FaultSpec, str]:
        """One fault of ``kind`` starting at sample ``onset``, on a machine not in ``avoid``."""
        rng = self.rng
        n = self.machines
        free = [m for m in range(n) if m not in avoid]
        machine = int(rng.choice(free))
        halt_in = int(rng.integers(8, 17))
        stop = bool(rng.random() < 0.5)
        if kind in HALTING:
            halt = Halt.STOP if stop or kind == "gpu_lost" else Halt.IDLE
            devices: tuple[int, ...] = ()
            if kind == "nic_down":
                devices = (int(rng.integers(8)),)
                severity = float(rng.uniform(0.1, 0.35))
                what = f"mlx5_{devices[0]} down"
            elif kind == "cuda_execution_error":
                severity = float(rng.uniform(0.0, 0.03))
                what = "process dies"
            else:
                devices = (int(rng.integers(8)),)
                severity = float(rng.uniform(0.0, 0.03))
                what = f"gpu{devices[0]} {'hangs' if kind == 'gpu_execution_error' else 'lost'}"
            spec = FaultSpec(kind, (machine,), onset, halt_in, devices, severity, halt)
            return spec, (
                f"{kind} on h{machine:03d} at sample {onset}: {what}, job halts "
                f"{halt_in} samples later ({halt.value})"
            )
        if kind == "switch_reboot":
            domain = int(rng.integers(n // MACHINES_PER_DOMAIN))
            machines = tuple(
                range(domain * MACHINES_PER_DOMAIN, (domain + 1) * MACHINES_PER_DOMAIN)
            )
            severity = float(rng.uniform(0.1, 0.3))
            length = max(MIN_FAULT_SAMPLES, self.samples(SWITCH_OUTAGE_S))
            spec = FaultSpec(kind, machines, onset, length, (), severity)
            return spec, f"leaf switch tor{domain:02d} down for {length} samples at {onset}"
        if kind == "flapping_worker":
            ranks: tuple[int, ...] = ()
            if rng.random() < 0.5:
                count = int(rng.integers(1, 4))
                ranks = tuple(sorted(int(r) for r in rng.choice(8, size=count, replace=False)))
            severity = round(float(rng.uniform(1.3, 2.0)), 3)
            steps = int(rng.integers(80, 161))
            length = max(int(rng.integers(24, 49)), self.samples(steps * self.step_s))
            spec = FaultSpec(kind, (machine,), onset, length, ranks, severity)
            which = "+".join(f"rank{r}" for r in ranks) if ranks else "every rank"
            return spec, (
                f"flapping_worker h{machine:03d} ({which}) x{severity} on and off for "
                f"{length} samples from {onset}"
            )
        length = int(rng.integers(30, 61))
        if kind == "nvlink_error":
            severity = float(rng.uniform(0.1, 0.16))
            spec = FaultSpec(kind, (machine,), onset, length, (), severity)
            return spec, (
                f"nvlink_error h{machine:03d}: NVLink at {severity:.2f} of peers for {length} "
                f"samples from {onset}"
            )
        if kind == "thermal_throttle":
            count = int(rng.integers(1, 3))
            gpus = tuple(sorted(int(g) for g in rng.choice(8, size=count, replace=False)))
            severity = float(rng.uniform(0.6, 0.75))
            spec = FaultSpec(kind, (machine,), onset, length, gpus, severity)
            return spec, (
                f"thermal_throttle h{machine:03d} {'+'.join(f'gpu{g}' for g in gpus)}: clock "
                f"x{severity:.2f} for {length} samples from {onset}"
            )
        raise ValueError(
            f"case kind {kind!r}: expected a fault class, {TWO_FAULTS!r}, 'lockstep' or 'serving'"
        )
