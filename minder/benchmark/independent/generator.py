"""An independent generator of labelled jobs: canonical metric tables written directly at a
sampling interval, with their ground truth.

Why a second generator: the detector was tuned on :mod:`collectors.sim`, so its scores there say
how well it learnt that simulator, not how well it detects faults. This module shares no signal
code with the simulator (it imports only :mod:`minder.core` names, numpy and pandas) and models
the data differently:

* **Steps of five phases** (forward, backward, exposed communication, optimizer, an optional
  input stall) whose shares and levels are drawn per job, with a period set by the suite (2.5-45 s
  log-uniform, or one that divides a minute, so that a coarse scrape keeps reading the same
  phase); every step's length jitters (Student-t), so the phase a sample lands on wanders. Every
  machine of a job is sampled at the same instant (within 0.15 s), so at every instant the peers
  read the same phase and agree within about +-20 %, while the job swings by up to 4x from one
  sample to the next.
* **What a sample averages.** DCGM fields (GPU utilisation, power, tensor activity, SM clock,
  NVLink bandwidth) average the last second before the scrape, whatever the scrape interval;
  counter rates (RDMA bytes, PFC pauses, CPU utilisation) average the whole interval, as
  ``rate()`` does. At coarse intervals the former swing with the phase, the latter are smooth.
* **Noise.** Per machine and metric an AR(1) offset with Student-t innovations (a minutes-long
  time constant), per device a static offset, per sample lognormal noise (shrinking with the
  averaging window), Poisson PFC pause counts, missed scrapes, and quantisation: integer-percent
  GPU utilisation, 15 MHz clock steps, 4 KiB memory pages.
* **States**, mixed by the share of each sample's window they cover: training, blocked in a
  collective (GPUs spin at 100 %, no tensor work, no traffic), process dead, idle after the job
  halted, checkpointing; and ``gone``: the machine reports nothing.
* **Serving fleets**: most machines near 0 % most of the time, a few busy at a time, rotating,
  every machine in one group (roles undeclared).

A job is described by a :class:`JobSpec` whose onsets and durations are in samples (one case of
the suite has the same shape in samples at every interval); :func:`generate_table` turns it into
a canonical table, :func:`job_labels` into labels of the columns the benchmark's matching reads
(:data:`LABEL_COLUMNS`, those of ``collectors.sim.labels.scenario_labels``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

import numpy as np
import pandas as pd

from minder.core.metrics import METRICS
from minder.core.table import normalize_table

GPUS: tuple[str, ...] = tuple(f"gpu{i}" for i in range(8))
NICS: tuple[str, ...] = tuple(f"mlx5_{i}" for i in range(8))
"""One 400 Gb/s RDMA NIC per GPU (rail-optimised H100 nodes)."""
RANKS: tuple[str, ...] = tuple(f"rank{i}" for i in range(8))
MACHINES_PER_DOMAIN = 8
"""Machines under one leaf switch (``domain`` label ``torNN``)."""
ORIGIN_TS = 1_767_225_600
"""Unix time of a job's sample 0 (2026-01-01), plus a per-job offset of whole hours."""

LABEL_COLUMNS: tuple[str, ...] = (
    "job",
    "machine",
    "start_ts",
    "end_ts",
    "fault",
    "device",
    "domain",
    "fault_index",
    "group",
    "slowdown",
)
"""Columns of :func:`job_labels`: those the benchmark's matching reads
(:func:`minder.benchmark.evaluate.match_case`)."""

FAULT_KINDS: tuple[str, ...] = (
    "nic_down",
    "cuda_execution_error",
    "gpu_execution_error",
    "gpu_lost",
    "nvlink_error",
    "thermal_throttle",
    "switch_reboot",
    "flapping_worker",
)
"""Fault classes this generator injects (the names of the benchmark's fault types, so that the
fail-stop / fail-slow split and the domain matching of ``switch_reboot`` apply)."""
HALTING: frozenset[str] = frozenset(
    {"nic_down", "cuda_execution_error", "gpu_execution_error", "gpu_lost"}
)
"""Fail-stop classes: the job halts 8-16 samples after their onset."""

NODE_METRICS: tuple[str, ...] = (
    "gpu_util_ratio",
    "gpu_tensor_active_ratio",
    "gpu_power_watts",
    "gpu_sm_clock_hertz",
    "gpu_nvlink_tx_bytes_per_second",
    "rdma_tx_bytes_per_second",
    "rdma_rx_bytes_per_second",
    "pfc_tx_pause_per_second",
    "cpu_util_ratio",
    "memory_used_bytes",
)
"""Emitted by every job."""
LINK_METRICS: tuple[str, ...] = ("rdma_port_up", "rdma_link_downed_count")
"""Emitted by jobs whose exporters read the port state (:attr:`JobSpec.link_counters`)."""
PROBE_METRICS: tuple[str, ...] = ("train_step_seconds", "train_busy_seconds", "train_step_number")
"""Emitted by training jobs with the step probe (:attr:`JobSpec.probe`)."""

DCGM_WINDOW_S = 1.0
"""DCGM fields average the last second before the scrape, at any scrape interval."""
SCRAPE_SKEW_S = 0.15
"""Each machine is read up to this long before the sample's timestamp (its own offset): with
the one-second DCGM window, peers at a phase boundary differ by 15 % of the swing at most."""


class Pattern(StrEnum):
    """The background a job runs."""

    LOCKSTEP = "lockstep"
    """Synchronous training: every machine swings with the step's phases."""
    SERVING = "serving"
    """Mixed-load serving fleet: mostly idle, a few busy machines at a time, rotating."""


class Halt(StrEnum):
    """How a job ends after a fail-stop fault."""

    IDLE = "idle"
    """Every machine idles alike and keeps reporting."""
    STOP = "stop"
    """The job stops reporting."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One injected fault.

    Attributes
    ----------
    kind
        One of :data:`FAULT_KINDS` (the label's ``fault``).
    machines
        Indices of the faulty machines (the 8 of a leaf switch for ``switch_reboot``).
    onset
        The first sample that shows the fault (its true onset is within the interval before).
    samples
        Samples from onset to its end: recovery, or the job's halt for :data:`HALTING` kinds.
    devices
        GPU or NIC indices hit (empty: the machine, or every device the kind touches); for
        ``flapping_worker`` the slow ranks.
    severity
        NVLink traffic left (``nvlink_error``), clock left (``thermal_throttle``), the slow
        ranks' compute factor (``flapping_worker``), traffic left to the blocked peers (the
        others).
    halt
        For :data:`HALTING` kinds: what the job does at the fault's end.
    """

    kind: str
    machines: tuple[int, ...]
    onset: int
    samples: int
    devices: tuple[int, ...] = ()
    severity: float = 1.0
    halt: Halt | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r}: expected one of {', '.join(FAULT_KINDS)}")
        if not self.machines or self.onset < 1 or self.samples < 1:
            raise ValueError(
                f"fault {self.kind!r} on machines {self.machines!r}, onset {self.onset!r}, "
                f"samples {self.samples!r}: expected machines, onset >= 1 and samples >= 1"
            )
        if (self.kind in HALTING) != (self.halt is not None):
            raise ValueError(
                f"fault {self.kind!r} has halt {self.halt!r}: expected a halt exactly for "
                f"{', '.join(sorted(HALTING))}"
            )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job at one sampling interval; every random draw of its data comes from ``seed``.

    Attributes
    ----------
    name
        The job's name (machines are ``{name}-h000`` …).
    pattern
        Training in lockstep or a serving fleet.
    machines
        8 to 256 (a multiple of :data:`MACHINES_PER_DOMAIN`).
    interval_s
        Seconds between samples.
    samples
        Samples of the job.
    seed
        Seeds every draw of the data (not of the spec).
    groups
        Peer groups (pipeline stages ``stage0`` …, contiguous blocks of machines); a serving
        fleet has one, ``serve``.
    step_s
        Nominal step period (lockstep jobs).
    link_counters
        The NICs' port state and link-down counts are exported.
    probe
        The per-rank step probe is exported (step time, busy time, step number).
    faults
        Injected faults, in order (their position is the label's ``fault_index``).
    checkpoint
        ``(sample, seconds)``: a job-wide checkpoint that begins before that sample.
    missing_rate
        Share of machine scrapes that are lost.
    """

    name: str
    pattern: Pattern
    machines: int
    interval_s: int
    samples: int
    seed: int
    groups: int = 1
    step_s: float = 6.0
    link_counters: bool = True
    probe: bool = False
    faults: tuple[FaultSpec, ...] = ()
    checkpoint: tuple[int, float] | None = None
    missing_rate: float = 0.0

    def __post_init__(self) -> None:
        if not 8 <= self.machines <= 4096 or self.machines % MACHINES_PER_DOMAIN:
            raise ValueError(
                f"job {self.name!r} has {self.machines!r} machines: expected 8 to 4096, a "
                f"multiple of {MACHINES_PER_DOMAIN}"
            )
        if self.interval_s < 1 or self.samples < 8:
            raise ValueError(
                f"job {self.name!r}: interval_s={self.interval_s!r}, samples={self.samples!r}: "
                "expected an interval of 1 s or more and at least 8 samples"
            )
        if not 1 <= self.groups <= self.machines // 4:
            raise ValueError(
                f"job {self.name!r} has {self.groups!r} groups: expected 1 to machines/4"
            )
        for fault in self.faults:
            if max(fault.machines) >= self.machines or fault.onset >= self.samples:
                raise ValueError(
                    f"job {self.name!r}: fault {fault.kind!r} on machines {fault.machines} at "
                    f"sample {fault.onset}: expected machines below {self.machines} and an onset "
                    f"before sample {self.samples}"
                )

    @property
    def origin(self) -> int:
        """Unix second of sample 0."""
        return ORIGIN_TS + 3600 * (self.seed % 9973)

    @property
    def duration_s(self) -> int:
        """Seconds the job covers."""
        return self.samples * self.interval_s

    def machine_names(self) -> list[str]:
        """Machine names, index order."""
        return [f"{self.name}-h{i:03d}" for i in range(self.machines)]

    def group_of(self, index: int) -> str:
        """Peer-group label of machine ``index``."""
        if self.pattern is Pattern.SERVING:
            return "serve"
        return f"stage{index * self.groups // self.machines}"

    def domain_of(self, index: int) -> str:
        """Leaf-switch label of machine ``index``."""
        return f"tor{index // MACHINES_PER_DOMAIN:02d}"

    def onset_ts(self, fault: FaultSpec) -> float:
        """True onset of ``fault``: within the interval before its first sample, drawn from the
        job's seed and the fault's position (deterministic)."""
        index = self.faults.index(fault)
        u = np.random.default_rng([self.seed, 7, index]).uniform(0.15, 0.85)
        return self.origin + (fault.onset - u) * self.interval_s

    def end_ts(self, fault: FaultSpec) -> float:
        """End of ``fault``: its recovery, or the job's halt."""
        return self.onset_ts(fault) + fault.samples * self.interval_s

    @property
    def halt_ts(self) -> float | None:
        """When the job halts (the earliest end of a halting fault), or None."""
        ends = [self.end_ts(f) for f in self.faults if f.halt is not None]
        return min(ends) if ends else None

    def metrics(self) -> tuple[str, ...]:
        """The canonical metrics this job emits."""
        out = list(NODE_METRICS)
        if self.link_counters:
            out += LINK_METRICS
        if self.probe and self.pattern is Pattern.LOCKSTEP:
            out += PROBE_METRICS
        return tuple(out)


def job_labels(spec: JobSpec) -> pd.DataFrame:
    """Ground truth of ``spec``: one row per faulty machine of every fault (columns
    :data:`LABEL_COLUMNS`). A fault cut short by the job's halt ends at the halt; a
    ``switch_reboot``'s rows carry its leaf switch as ``domain``; ``slowdown`` is the job's
    step-time slowdown while a ``flapping_worker`` is slow (NaN for the others)."""
    names = spec.machine_names()
    halt = spec.halt_ts
    rows = []
    for index, fault in enumerate(spec.faults):
        start = spec.onset_ts(fault)
        end = spec.end_ts(fault)
        if halt is not None and fault.halt is None:
            end = min(end, halt)
        if start >= end:
            continue
        if fault.kind in ("nic_down",):
            device = ",".join(NICS[d] for d in fault.devices)
        elif fault.kind == "flapping_worker":
            device = ",".join(RANKS[d] for d in fault.devices) if len(fault.devices) < 8 else ""
        elif fault.kind in ("switch_reboot", "cuda_execution_error"):
            device = ""
        else:
            device = ",".join(GPUS[d] for d in fault.devices)
        slowdown = _flapping_slowdown(spec, fault) if fault.kind == "flapping_worker" else math.nan
        for m in fault.machines:
            rows.append(
                {
                    "job": spec.name,
                    "machine": names[m],
                    "start_ts": start,
                    "end_ts": end,
                    "fault": fault.kind,
                    "device": device,
                    "domain": spec.domain_of(m),
                    "fault_index": index,
                    "group": spec.group_of(m),
                    "slowdown": slowdown,
                }
            )
    frame = pd.DataFrame(rows, columns=list(LABEL_COLUMNS))
    return frame.astype(
        {"start_ts": "float64", "end_ts": "float64", "fault_index": "int64", "slowdown": "float64"}
    )


# -- the job's draws ---------------------------------------------------------------------------


class State(IntEnum):
    """What a machine is doing; values index :attr:`_Levels.state`."""

    TRAIN = 0
    BLOCKED = 1
    DEAD = 2
    IDLE = 3
    CHECKPOINT = 4
    GONE = 5


_N_STATES = len(State)
_PHASE_SHARES = ((0.20, 0.32), (0.30, 0.45), (0.12, 0.30), (0.04, 0.10), (0.0, 0.08))
"""Forward, backward, exposed communication, optimizer, input stall: ranges of their shares."""
_COMM_PHASE = 2
_PHASE_LEVELS: dict[str, tuple[float, ...]] = {
    "gpu_util_ratio": (0.97, 0.99, 0.93, 0.80, 0.35),
    "gpu_tensor_active_ratio": (0.60, 0.68, 0.17, 0.20, 0.17),
    "gpu_power_watts": (610.0, 670.0, 270.0, 240.0, 170.0),
    "gpu_sm_clock_hertz": (1.74e9, 1.695e9, 1.98e9, 1.98e9, 1.98e9),
    "gpu_nvlink_tx_bytes_per_second": (40e9, 85e9, 160e9, 40e9, 40e9),
    "rdma_tx_bytes_per_second": (9e9, 12e9, 36e9, 9e9, 9e9),
    "rdma_rx_bytes_per_second": (9e9, 12e9, 36e9, 9e9, 9e9),
    "pfc_tx_pause_per_second": (5.0, 5.0, 120.0, 5.0, 5.0),
    "cpu_util_ratio": (0.18, 0.18, 0.20, 0.25, 0.55),
}
"""Level of each metric in each phase of a training step, before the job's own scaling."""
_JOB_SCALE: dict[str, tuple[float, float]] = {
    "gpu_util_ratio": (1.0, 1.0),
    "gpu_tensor_active_ratio": (0.75, 1.2),
    "gpu_power_watts": (0.9, 1.05),
    "gpu_sm_clock_hertz": (1.0, 1.0),
    "gpu_nvlink_tx_bytes_per_second": (0.6, 1.4),
    "rdma_tx_bytes_per_second": (0.6, 1.2),
    "rdma_rx_bytes_per_second": (0.6, 1.2),
    "pfc_tx_pause_per_second": (0.3, 3.0),
    "cpu_util_ratio": (0.7, 1.3),
}
_NOISE: dict[str, tuple[float, float]] = {
    "gpu_util_ratio": (0.004, 0.01),
    "gpu_tensor_active_ratio": (0.03, 0.04),
    "gpu_power_watts": (0.025, 0.03),
    "gpu_sm_clock_hertz": (0.004, 0.003),
    "gpu_nvlink_tx_bytes_per_second": (0.04, 0.06),
    "rdma_tx_bytes_per_second": (0.03, 0.04),
    "rdma_rx_bytes_per_second": (0.03, 0.04),
    "pfc_tx_pause_per_second": (0.15, 0.0),
    "cpu_util_ratio": (0.10, 0.06),
    "memory_used_bytes": (0.03, 0.001),
}
"""Per metric: the stationary spread of a machine's AR(1) offset, and the lognormal sample noise
at a one-second window (it shrinks with the square root of a longer window)."""
_AR_TAU_S = (300.0, 900.0)
_T_DF = 4.0
_IDLE_CLOCKS = (0.21e9, 0.345e9, 1.41e9)
_HOST_MEMORY = 2 * 2**40


def _window(metric: str, interval_s: int) -> float:
    """Seconds a sample of ``metric`` averages."""
    if metric.startswith("gpu_"):
        return DCGM_WINDOW_S
    if metric in ("memory_used_bytes", "rdma_port_up"):
        return 0.0  # read at the instant
    return float(interval_s)


def _t(rng: np.random.Generator, size: tuple[int, ...] | int) -> np.ndarray:
    """Student-t draws scaled to unit variance."""
    return rng.standard_t(_T_DF, size) / math.sqrt(_T_DF / (_T_DF - 2.0))


@dataclass(slots=True)
class _Levels:
    """Per-job levels: per training phase (``phase``) and per state (``state``, TRAIN unused)."""

    shares: np.ndarray
    phase: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    idle_clock: float
    memory: np.ndarray  # (N,) bytes in use while training


def _draw_levels(spec: JobSpec, rng: np.random.Generator) -> _Levels:
    shares = _phase_shares(spec)
    phase: dict[str, np.ndarray] = {}
    for metric, levels in _PHASE_LEVELS.items():
        lo, hi = _JOB_SCALE[metric]
        values = np.array(levels) * rng.uniform(lo, hi) * rng.uniform(0.93, 1.07, len(levels))
        if metric == "gpu_sm_clock_hertz":
            values = np.minimum(values - np.array([1, 1, 0, 0, 0]) * rng.uniform(0, 1.5e8), 1.98e9)
        values = np.maximum(values, values.max() / 4.0)  # a swing of 4x at most
        if metric.endswith("_ratio"):
            values = np.minimum(values, 1.0)
        phase[metric] = values
    idle_clock = float(rng.choice(_IDLE_CLOCKS))
    mean = {m: float(v @ shares) for m, v in phase.items()}
    blocking = [f.severity for f in spec.faults if f.kind in HALTING | {"switch_reboot"}]
    residual = max(blocking, default=0.0)
    blocked_power = rng.uniform(150.0, 210.0)  # NCCL kernels spin
    idle_power = rng.uniform(62.0, 80.0)
    state: dict[str, np.ndarray] = {
        # TRAIN, BLOCKED, DEAD, IDLE, CHECKPOINT (GONE reports nothing)
        "gpu_util_ratio": np.array([0, 1.0, 0.0, 0.0, 0.08, 0]),
        "gpu_tensor_active_ratio": np.array([0, 0.004, 0.0, 0.0, 0.01, 0]),
        "gpu_power_watts": np.array(
            [0, blocked_power, idle_power, idle_power, rng.uniform(110, 140), 0]
        ),
        "gpu_sm_clock_hertz": np.array([0, 1.98e9, idle_clock, idle_clock, 1.98e9, 0]),
        "gpu_nvlink_tx_bytes_per_second": np.array(
            [0, 0.005 * mean["gpu_nvlink_tx_bytes_per_second"], 0, 0, 2e8, 0]
        ),
        "rdma_tx_bytes_per_second": np.array(
            [0, residual * mean["rdma_tx_bytes_per_second"], 0, 0, 0.05 * 14e9, 0]
        ),
        "rdma_rx_bytes_per_second": np.array(
            [0, residual * mean["rdma_rx_bytes_per_second"], 0, 0, 0.05 * 14e9, 0]
        ),
        "pfc_tx_pause_per_second": np.array([0, 0.0, 0.0, 0.0, 1.0, 0]),
        "cpu_util_ratio": np.array([0, 0.12, rng.uniform(0.01, 0.03), 0.02, 0.45, 0]),
    }
    memory = _HOST_MEMORY * rng.uniform(0.35, 0.6) * np.exp(rng.normal(0, 0.02, spec.machines))
    return _Levels(shares, phase, state, idle_clock, memory)


class _Timeline:
    """Per-machine states over time: segments between sorted boundaries."""

    def __init__(self, machines: int) -> None:
        self.bounds = [-math.inf, math.inf]
        self.states = np.full((1, machines), int(State.TRAIN), dtype=np.int8)

    def _split(self, t: float) -> int:
        """Index of the segment that starts at ``t`` (splitting one if needed)."""
        i = int(np.searchsorted(self.bounds, t, side="right")) - 1
        if self.bounds[i] == t:
            return i
        self.bounds.insert(i + 1, t)
        self.states = np.insert(self.states, i + 1, self.states[i], axis=0)
        return i + 1

    def set(self, machines: Sequence[int] | slice, t0: float, t1: float, state: State) -> None:
        """Machines ``machines`` are in ``state`` over ``[t0, t1)``."""
        if t1 <= t0:
            return
        a = self._split(t0)
        b = self._split(t1)
        rows = self.states[a:b]
        if isinstance(machines, slice):
            rows[:, machines] = int(state)
        else:
            rows[:, list(machines)] = int(state)

    def coverage(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``(S, T, N)``: the share of each window ``[a, b]`` (arrays ``(T, N)``) each state
        covers; a window of no length takes the state at ``b``."""
        bounds = np.asarray(self.bounds)
        out = np.zeros((_N_STATES, *a.shape))
        width = b - a
        instant = width <= 0
        for s in range(len(bounds) - 1):
            lo, hi = bounds[s], bounds[s + 1]
            share = np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0.0, None)
            share = np.where(instant, (b >= lo) & (b < hi), share / np.where(instant, 1.0, width))
            for state in np.unique(self.states[s]):
                mask = self.states[s] == state
                out[state] += share * mask[None, :]
        return out


def _phase_shares(spec: JobSpec) -> np.ndarray:
    """Shares of a step's five phases, drawn from the job's seed alone (the labels' slowdown
    needs them without the data)."""
    rng = np.random.default_rng([spec.seed, 11])
    low, high = np.array(_PHASE_SHARES).T
    shares = rng.uniform(low, high)
    if rng.random() < 0.5:
        shares[4] = 0.0
    return np.asarray(shares / shares.sum())


def _phase_cumulative(shares: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(breaks, cumulative)``: the integral of ``levels`` over one step's phases, at each
    phase boundary (as a share of the step)."""
    breaks = np.concatenate(([0.0], np.cumsum(shares)))
    breaks[-1] = 1.0
    cumulative = np.concatenate(([0.0], np.cumsum(shares * levels)))
    return breaks, cumulative


@dataclass(slots=True)
class _Steps:
    """The job's synchronous steps: starts, lengths (of their phases), ends (when they complete;
    infinite for a step the job halted in) and, with the probe, every rank's busy time of every
    step (``(steps, N, 8)``)."""

    starts: np.ndarray
    lengths: np.ndarray
    ends: np.ndarray
    busy: np.ndarray | None


def _step_timeline(plan: _Plan, shares: np.ndarray, rng: np.random.Generator) -> _Steps:
    """Steps from before the first sample to after the last: each as long as its slowest rank's
    busy time (compute with a 1.2 % Student-t jitter; the flapping worker's ranks ``severity``
    times longer while slow) plus the exposed communication; no step progresses through a stall
    (a step that spans one is that much longer) and none starts after the job halted."""
    spec = plan.spec
    dt = spec.interval_s
    n = spec.machines
    comm_share = float(shares[_COMM_PHASE])
    compute = spec.step_s * (1.0 - comm_share)
    comm = spec.step_s * comm_share
    t_first = spec.origin - dt - 2.0 * spec.step_s - rng.uniform(0.0, spec.step_s)
    t_last = float(plan.ts[-1]) + dt
    count = int((t_last - t_first) / (0.7 * spec.step_s)) + 16
    slow_cells = np.zeros((n, len(RANKS)), dtype=bool)
    factor = 1.0
    for fault in spec.faults:
        if fault.kind == "flapping_worker":
            ranks = list(fault.devices) if fault.devices else list(range(len(RANKS)))
            for m in fault.machines:
                slow_cells[m, ranks] = True
            factor = fault.severity
    busy: np.ndarray | None = None
    if spec.probe:
        busy = compute * np.exp(0.012 * _t(rng, (count, n, len(RANKS))))
        healthy_max = np.where(slow_cells[None], 0.0, busy).max(axis=(1, 2))
        slow_max = np.where(slow_cells[None], busy, 0.0).max(axis=(1, 2))
    else:
        healthy_max = compute * np.exp(0.012 * _t(rng, count))
        slow_max = healthy_max if slow_cells.any() else np.zeros(count)
    comm_j = comm * np.exp(0.02 * _t(rng, count))
    stalls = sorted(plan.stalls)
    starts: list[float] = []
    lengths: list[float] = []
    ends: list[float] = []
    slow_step: list[bool] = []
    t = t_first
    for j in range(count):
        for a, b in stalls:
            if a <= t < b:
                t = b
        if t > t_last or not math.isfinite(t):
            break
        slow = any(a <= t < b for a, b in plan.slow)
        length = max(healthy_max[j], slow_max[j] * (factor if slow else 1.0)) + comm_j[j]
        end = t + length
        for a, b in stalls:
            if t < a < end:
                end += b - a
        starts.append(t)
        slow_step.append(slow)
        if not math.isfinite(end):
            # Halted within this step: its phases run on (no machine trains any more, so they
            # weigh nothing), but it never completes.
            lengths.append(length)
            ends.append(math.inf)
            break
        lengths.append(end - t)
        ends.append(end)
        t = end
    if not starts:
        starts, lengths, ends, slow_step = [t_first], [spec.step_s], [math.inf], [False]
    m = len(starts)
    if busy is not None:
        slow_mask = np.asarray(slow_step)[:, None, None] & slow_cells[None]
        busy = np.where(slow_mask, busy[:m] * factor, busy[:m])
    return _Steps(np.asarray(starts), np.asarray(lengths), np.asarray(ends), busy)


def _integral(
    t: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    breaks: np.ndarray,
    cumulative: np.ndarray,
) -> np.ndarray:
    """The phase level integrated from the first step's start to ``t``."""
    j = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(starts) - 1)
    f = np.clip((t - starts[j]) / lengths[j], 0.0, 1.0)
    return cumulative[-1] * (starts[j] - starts[0]) + lengths[j] * np.interp(f, breaks, cumulative)


# -- values ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Effect:
    """A device-level change over ``[t0, t1)``: ``scale`` multiplies, ``value`` replaces,
    ``add`` adds (each in proportion to the window's share it covers)."""

    metric: str
    machines: tuple[int, ...]
    devices: tuple[int, ...] | None
    t0: float
    t1: float
    scale: float | None = None
    value: float | None = None
    add: float | None = None


@dataclass(slots=True)
class _Plan:
    """Everything drawn for one job before its values."""

    spec: JobSpec
    ts: np.ndarray  # (T,) sample timestamps
    instant: np.ndarray  # (T, N) when each machine's sample was read
    timeline: _Timeline
    effects: list[_Effect] = field(default_factory=list)
    gone: list[tuple[int, tuple[int, ...] | None, float, float]] = field(default_factory=list)
    """``(machine, GPU indices or None for the machine, t0, t1)`` that report nothing."""
    slow: list[tuple[float, float]] = field(default_factory=list)
    """Spans in which the flapping worker's ranks are slow."""
    stalls: list[tuple[float, float]] = field(default_factory=list)
    """Spans in which the job makes no progress (blocked, checkpointing, halted)."""


def _plan(spec: JobSpec, rng: np.random.Generator) -> _Plan:
    n = spec.machines
    dt = spec.interval_s
    ts = spec.origin + dt * np.arange(spec.samples, dtype=np.float64)
    instant = ts[:, None] - rng.uniform(0.0, SCRAPE_SKEW_S, n)[None, :]
    plan = _Plan(spec, ts, instant, _Timeline(n))
    end = float(ts[-1]) + dt
    if spec.checkpoint is not None:
        sample, seconds = spec.checkpoint
        begin = spec.origin + (sample - rng.uniform(0.1, 0.9)) * dt
        plan.timeline.set(slice(None), begin, begin + seconds, State.CHECKPOINT)
        plan.stalls.append((begin, begin + seconds))
    halt = spec.halt_ts
    for fault in spec.faults:
        t0, t1 = spec.onset_ts(fault), spec.end_ts(fault)
        if halt is not None and fault.halt is None:
            t1 = min(t1, halt)
        _inject(plan, fault, t0, t1, rng)
    if halt is not None:
        first = next(f for f in spec.faults if f.halt is not None and spec.end_ts(f) == halt)
        if first.halt is Halt.STOP:
            plan.timeline.set(slice(None), halt, math.inf, State.GONE)
        else:
            plan.timeline.set(slice(None), halt, end + dt, State.IDLE)
        plan.stalls.append((halt, math.inf))
    return plan


def _inject(plan: _Plan, fault: FaultSpec, t0: float, t1: float, rng: np.random.Generator) -> None:
    """Put ``fault`` into the plan's states and effects."""
    spec = plan.spec
    others = [m for m in range(spec.machines) if m not in fault.machines]
    delay = min(rng.uniform(0.2, 1.0) * spec.step_s, 30.0)  # the next collective blocks
    kind = fault.kind
    ms = fault.machines
    if kind in HALTING or kind == "switch_reboot":
        plan.stalls.append((t0 + delay, t1))  # the job stops once every machine is blocked
    if kind == "cuda_execution_error":
        plan.timeline.set(ms, t0, t1, State.DEAD)
        plan.timeline.set(others, t0 + delay, t1, State.BLOCKED)
    elif kind == "nic_down":
        plan.timeline.set(slice(None), t0 + delay, t1, State.BLOCKED)
        for metric in ("rdma_tx_bytes_per_second", "rdma_rx_bytes_per_second"):
            plan.effects.append(_Effect(metric, ms, fault.devices, t0, t1, value=0.0))
        plan.effects.append(_Effect("pfc_tx_pause_per_second", ms, fault.devices, t0, t1, value=0))
        plan.effects.append(_Effect("rdma_port_up", ms, fault.devices, t0, t1, value=0.0))
        plan.effects.append(_Effect("rdma_link_downed_count", ms, fault.devices, t0, t0, add=1.0))
    elif kind == "gpu_execution_error":
        plan.timeline.set(slice(None), t0 + delay, t1, State.BLOCKED)
        hung_util = float(rng.choice([0.0, 1.0]))
        for metric, value in (
            ("gpu_util_ratio", hung_util),
            ("gpu_tensor_active_ratio", 0.0),
            ("gpu_power_watts", rng.uniform(80.0, 105.0)),  # no kernel makes progress
            ("gpu_nvlink_tx_bytes_per_second", 0.0),
        ):
            plan.effects.append(_Effect(metric, ms, fault.devices, t0, t1, value=value))
    elif kind == "gpu_lost":
        plan.timeline.set(slice(None), t0 + delay, t1, State.BLOCKED)
        for m in ms:
            plan.gone.append((m, fault.devices, t0, math.inf))
    elif kind == "nvlink_error":
        plan.effects.append(
            _Effect("gpu_nvlink_tx_bytes_per_second", ms, None, t0, t1, scale=fault.severity)
        )
    elif kind == "thermal_throttle":
        for metric, factor in (
            ("gpu_sm_clock_hertz", fault.severity),
            ("gpu_power_watts", 0.5 + 0.4 * fault.severity),
            ("gpu_tensor_active_ratio", 0.4 + 0.6 * fault.severity),
        ):
            plan.effects.append(_Effect(metric, ms, fault.devices, t0, t1, scale=factor))
    elif kind == "switch_reboot":
        plan.timeline.set(others, t0 + delay, t1, State.BLOCKED)
        plan.timeline.set(ms, t0, t1, State.BLOCKED)
        for metric in ("rdma_tx_bytes_per_second", "rdma_rx_bytes_per_second", "rdma_port_up"):
            plan.effects.append(_Effect(metric, ms, None, t0, t1, value=0.0))
        plan.effects.append(_Effect("pfc_tx_pause_per_second", ms, None, t0, t1, value=0.0))
        plan.effects.append(_Effect("rdma_link_downed_count", ms, None, t0, t0, add=1.0))
    elif kind == "flapping_worker":
        plan.slow.extend(_slow_runs(spec, fault, t0, t1, rng))
        extra = rng.uniform(0.15, 0.3)  # host contention behind the slowness
        for a, b in plan.slow:
            plan.effects.append(_Effect("cpu_util_ratio", ms, None, a, b, add=extra))


def _slow_runs(
    spec: JobSpec, fault: FaultSpec, t0: float, t1: float, rng: np.random.Generator
) -> list[tuple[float, float]]:
    """Alternating slow runs (10-25 steps, two samples at least) and normal gaps (5-12 steps,
    a sample at least) from ``t0``; the last slow run ends at ``t1``."""
    dt = spec.interval_s
    slow_step = spec.step_s * fault.severity
    out: list[tuple[float, float]] = []
    t = t0
    while t < t1:
        run = max(rng.uniform(10, 25) * slow_step, 2.0 * dt)
        out.append((t, min(t + run, t1)))
        t += run + max(rng.uniform(5, 12) * spec.step_s, float(dt))
    if out and out[-1][1] < t1:
        out.append((max(out[-1][1] + dt, t1 - 2.0 * dt), t1))
    return out


def _flapping_slowdown(spec: JobSpec, fault: FaultSpec) -> float:
    """The job's step time over its nominal one while the flapping worker is slow."""
    comm = _comm_share(spec)
    return round((1.0 - comm) * fault.severity + comm, 3)


def _comm_share(spec: JobSpec) -> float:
    """Share of a step spent in exposed communication."""
    return float(_phase_shares(spec)[_COMM_PHASE])


def _ar1(rng: np.random.Generator, shape: tuple[int, int], spread: float, dt: int) -> np.ndarray:
    """``(T, N)`` AR(1) offsets with Student-t innovations, stationary spread ``spread``."""
    if spread <= 0:
        return np.zeros(shape)
    tau = rng.uniform(*_AR_TAU_S)
    phi = math.exp(-dt / tau)
    shocks = _t(rng, shape) * spread * math.sqrt(1.0 - phi * phi)
    out = np.empty(shape)
    out[0] = _t(rng, shape[1]) * spread
    for k in range(1, shape[0]):
        out[k] = phi * out[k - 1] + shocks[k]
    return out


def _serving_load(spec: JobSpec, rng: np.random.Generator) -> np.ndarray:
    """``(T, N)`` load (0-1) of a serving fleet: a few busy machines at a time, each busy for
    5-30 samples then handing over to another, over a light background on some machines."""
    t_count, n = spec.samples, spec.machines
    load = np.zeros((t_count, n))
    background = np.where(rng.random(n) < 0.25, rng.uniform(0.03, 0.12, n), 0.0)
    load += background[None, :]
    slots = max(1, round(n * rng.uniform(0.06, 0.15)))
    for _ in range(slots):
        k = -int(rng.integers(0, 20))
        while k < t_count:
            length = int(rng.integers(5, 31))
            m = int(rng.integers(n))
            level = rng.uniform(0.3, 0.95)
            load[max(k, 0) : k + length, m] = np.maximum(load[max(k, 0) : k + length, m], level)
            k += length + int(rng.integers(0, 4))
    return np.clip(load * np.exp(0.08 * _t(rng, load.shape)), 0.0, 1.0)


_SERVING: dict[str, tuple[float, float]] = {
    "gpu_util_ratio": (0.0, 1.0),
    "gpu_tensor_active_ratio": (0.0, 0.45),
    "gpu_power_watts": (70.0, 520.0),
    "gpu_nvlink_tx_bytes_per_second": (0.0, 30e9),
    "rdma_tx_bytes_per_second": (1e6, 0.3e9),
    "rdma_rx_bytes_per_second": (1e6, 0.2e9),
    "pfc_tx_pause_per_second": (0.0, 0.5),
    "cpu_util_ratio": (0.03, 0.25),
}
"""``(idle, added at full load)`` of each metric of a serving machine."""


def _family_size(metric: str) -> int:
    family = METRICS[metric].family.value
    return {"gpu": len(GPUS), "nic": len(NICS), "rank": len(RANKS)}.get(family, 1)


def _devices(metric: str) -> tuple[str, ...]:
    family = METRICS[metric].family.value
    return {"gpu": GPUS, "nic": NICS, "rank": RANKS}.get(family, ("",))


def _base(
    metric: str,
    plan: _Plan,
    levels: _Levels,
    load: np.ndarray | None,
    steps: _Steps | None,
    cover: dict[float, np.ndarray],
) -> np.ndarray:
    """``(T, N)`` value of ``metric`` before device offsets, effects and noise."""
    spec = plan.spec
    w = _window(metric, spec.interval_s)
    share = cover[w]
    if metric == "memory_used_bytes":
        base = levels.memory[None, :] * np.ones(share.shape[1:])
        state = np.array([1.0, 1.0, 0.55, 0.5, 1.1, 0.0])
        return base * np.tensordot(state, share, axes=1)
    if metric == "rdma_port_up":
        return np.ones(share.shape[1:])
    if metric == "rdma_link_downed_count":
        return np.zeros(share.shape[1:])
    b = plan.instant
    if spec.pattern is Pattern.SERVING:
        assert load is not None
        if metric == "gpu_sm_clock_hertz":
            train = np.where(load > 0.02, 1.98e9, levels.idle_clock)
        else:
            idle, full = _SERVING.get(metric, (0.0, 0.0))
            train = idle + full * load
    else:
        assert steps is not None
        starts, lengths = steps.starts, steps.lengths
        breaks, cumulative = _phase_cumulative(levels.shares, levels.phase[metric])
        if w > 0:
            train = (
                _integral(b, starts, lengths, breaks, cumulative)
                - _integral(b - w, starts, lengths, breaks, cumulative)
            ) / w
        else:
            train = cumulative[-1] * np.ones(b.shape)
    others = levels.state[metric][:, None, None]
    return share[State.TRAIN] * train + (share[1:] * others[1:]).sum(axis=0)


def _apply(values: np.ndarray, effect: _Effect, plan: _Plan, metric: str) -> None:
    """Apply ``effect`` to ``values`` (``(T, N, D)``) in place."""
    w = _window(metric, plan.spec.interval_s)
    rows = list(effect.machines)
    b = plan.instant[:, rows]
    if effect.add is not None and effect.t0 == effect.t1:
        # An event: counted in the sample whose interval holds it.
        dt = plan.spec.interval_s
        share = ((b - dt < effect.t0) & (effect.t0 <= b)).astype(float)
    elif w > 0:
        share = np.clip(np.minimum(b, effect.t1) - np.maximum(b - w, effect.t0), 0.0, None) / w
    else:
        share = ((b >= effect.t0) & (b < effect.t1)).astype(float)
    share = share[:, :, None]
    cols = slice(None) if effect.devices is None else list(effect.devices)
    block = values[:, rows][:, :, cols]
    if effect.scale is not None:
        block = block * (1.0 - share + share * effect.scale)
    if effect.value is not None:
        block = block * (1.0 - share) + share * effect.value
    if effect.add is not None:
        block = block + share * effect.add
    sub = values[:, rows]
    sub[:, :, cols] = block
    values[:, rows] = sub


def _finish(metric: str, values: np.ndarray, rng: np.random.Generator, w: float) -> np.ndarray:
    """Sample noise, quantisation and the metric's physical range."""
    spec = METRICS[metric]
    sigma = _NOISE.get(metric, (0.0, 0.0))[1] / math.sqrt(max(w, 1.0))
    if metric == "pfc_tx_pause_per_second":
        span = max(w, 1.0)
        values = rng.poisson(np.maximum(values, 0.0) * span) / span
    elif sigma > 0:
        values = values * np.exp(sigma * rng.standard_normal(values.shape))
    if metric == "gpu_util_ratio":
        values = np.round(values * 100.0) / 100.0
    elif metric == "gpu_sm_clock_hertz":
        values = np.round(values / 15e6) * 15e6
    elif metric == "memory_used_bytes":
        values = np.round(values / 4096.0) * 4096.0
    elif metric in ("rdma_port_up", "rdma_link_downed_count"):
        values = np.round(values)
    return np.clip(values, spec.lower, spec.upper)


def _node_values(
    metric: str,
    plan: _Plan,
    levels: _Levels,
    load: np.ndarray | None,
    steps: _Steps | None,
    cover: dict[float, np.ndarray],
    rng: np.random.Generator,
) -> np.ndarray:
    """``(T, N, D)`` reported values of a node metric."""
    spec = plan.spec
    base = _base(metric, plan, levels, load, steps, cover)
    d = _family_size(metric)
    spread, _ = _NOISE.get(metric, (0.0, 0.0))
    offsets = _ar1(rng, base.shape, spread, spec.interval_s)
    values = np.repeat((base * np.exp(offsets))[:, :, None], d, axis=2)
    if spread > 0 and d > 1:
        values = values * np.exp(rng.normal(0.0, spread / 2, (1, spec.machines, d)))
    if spec.groups > 1 and metric not in ("gpu_util_ratio", "gpu_sm_clock_hertz"):
        group = np.array([spec.group_of(m) for m in range(spec.machines)])
        scale = {g: rng.uniform(0.94, 1.06) for g in sorted(set(group.tolist()))}
        values = values * np.array([scale[g] for g in group])[None, :, None]
    for effect in plan.effects:
        if effect.metric == metric:
            _apply(values, effect, plan, metric)
    return _finish(metric, values, rng, _window(metric, spec.interval_s))


def _probe_values(plan: _Plan, steps: _Steps, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``(T, N, 8)`` what every rank's step probe reports at each sample: the length of its
    last completed step, the mean busy time of the steps completed in the interval (held when
    none was) and the last step's number."""
    spec = plan.spec
    assert steps.busy is not None
    n, dt = spec.machines, spec.interval_s
    ends = steps.ends
    now = plan.instant
    last = np.searchsorted(ends, now, side="right") - 1  # last step completed
    before = np.searchsorted(ends, now - dt, side="right") - 1
    cum = np.concatenate((np.zeros((1, n, len(RANKS))), np.cumsum(steps.busy, axis=0)))
    machines = np.arange(n)[None, :]
    completed = np.maximum(last - before, 0)[:, :, None]
    total = cum[last + 1, machines] - cum[before + 1, machines]
    held = steps.busy[np.maximum(last, 0), machines]
    mean_busy = np.where(completed > 0, total / np.maximum(completed, 1), held)
    timer = np.exp(0.002 * rng.standard_normal((*now.shape, len(RANKS))))
    step_seconds = steps.lengths[np.maximum(last, 0)][:, :, None] * timer
    first_number = int(rng.integers(1_000, 50_000))
    number = np.repeat((first_number + np.maximum(last, 0))[:, :, None], len(RANKS), axis=2)
    return {
        "train_step_seconds": np.round(step_seconds, 4),
        "train_busy_seconds": np.round(mean_busy, 4),
        "train_step_number": number.astype(np.float64),
    }


def generate_table(spec: JobSpec) -> pd.DataFrame:
    """The canonical metric table of ``spec`` (``minder.core.table`` columns and dtypes): one
    row per machine, series and sample it reported."""
    rng = np.random.default_rng([spec.seed, 1])
    levels = _draw_levels(spec, rng)
    plan = _plan(spec, rng)
    n, t_count = spec.machines, spec.samples
    dt = spec.interval_s
    windows = sorted({_window(m, dt) for m in spec.metrics() if METRICS[m].family.value != "rank"})
    cover = {w: plan.timeline.coverage(plan.instant - w, plan.instant) for w in windows}
    steps = None
    load = None
    if spec.pattern is Pattern.LOCKSTEP:
        steps = _step_timeline(plan, levels.shares, rng)
    else:
        load = _serving_load(spec, rng)
    state_now = plan.timeline.coverage(plan.instant, plan.instant)[State.GONE] > 0.5
    missed = rng.random((t_count, n)) < spec.missing_rate
    silent = state_now | missed  # (T, N): nothing from the machine

    blocks: list[tuple[str, tuple[str, ...], np.ndarray, np.ndarray]] = []
    for metric in spec.metrics():
        if METRICS[metric].family.value == "rank":
            continue
        values = _node_values(metric, plan, levels, load, steps, cover, rng)
        present = np.broadcast_to(~silent[:, :, None], values.shape).copy()
        if metric.startswith("gpu_"):
            for m, gpus, a, b in plan.gone:
                sel = (plan.instant[:, m] >= a) & (plan.instant[:, m] < b)
                cols = slice(None) if gpus is None else list(gpus)
                sub = present[:, m]
                sub[np.ix_(sel, np.arange(len(GPUS))[cols])] = False
                present[:, m] = sub
        blocks.append((metric, _devices(metric), values, present))
    if spec.probe and spec.pattern is Pattern.LOCKSTEP:
        assert steps is not None
        for metric, values in _probe_values(plan, steps, rng).items():
            present = np.broadcast_to(~silent[:, :, None], values.shape).copy()
            blocks.append((metric, RANKS, values, present))
    return _to_table(spec, plan.ts, blocks)


def _to_table(
    spec: JobSpec,
    ts: np.ndarray,
    blocks: list[tuple[str, tuple[str, ...], np.ndarray, np.ndarray]],
) -> pd.DataFrame:
    """Rows in time order, then machine, then series."""
    series_metric: list[str] = []
    series_device: list[str] = []
    for metric, names, _, _ in blocks:
        series_metric += [metric] * len(names)
        series_device += list(names)
    values = np.concatenate([v for _, _, v, _ in blocks], axis=2)  # (T, N, S)
    present = np.concatenate([p for _, _, _, p in blocks], axis=2)
    k, m, s = np.nonzero(present)
    metrics = sorted(set(series_metric))
    devices = sorted(set(series_device))
    metric_code = np.array([metrics.index(x) for x in series_metric], dtype=np.int16)
    device_code = np.array([devices.index(x) for x in series_device], dtype=np.int16)
    groups = [spec.group_of(i) for i in range(spec.machines)]
    domains = [spec.domain_of(i) for i in range(spec.machines)]
    group_names = sorted(set(groups))
    domain_names = sorted(set(domains))
    group_code = np.array([group_names.index(g) for g in groups], dtype=np.int16)
    domain_code = np.array([domain_names.index(d) for d in domains], dtype=np.int16)
    frame = pd.DataFrame(
        {
            "ts": ts[k],
            "job": _categorical(np.zeros(len(k), dtype=np.int8), [spec.name]),
            "machine": _categorical(m, spec.machine_names()),
            "metric": _categorical(metric_code[s], metrics),
            "value": values[k, m, s],
            "device": _categorical(device_code[s], devices),
            "group": _categorical(group_code[m], group_names),
            "domain": _categorical(domain_code[m], domain_names),
        }
    )
    return normalize_table(frame)


def _categorical(codes: np.ndarray, names: Sequence[str]) -> pd.Categorical:
    """A categorical column from integer codes into ``names``."""
    return pd.Categorical.from_codes(
        codes.astype(np.int32), categories=pd.Index(list(names), dtype="string")
    )
