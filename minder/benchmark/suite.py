"""The labelled scenario suites of ``minder bench detect``, built from the simulator.

Every faulty case is one job with one fault, injected at a random time after a warm-up, on a
random machine and device, at a varied severity (fail-slow faults mostly mild, as they are in
production), in a job of a random size, rhythm, noise level and pipeline layout. The fault types
follow the shares of the paper's Table 1 (docs/detection-method.md §3), with at least
:data:`MIN_PER_TYPE` instances of each in the ``standard`` and ``full`` suites; switch reboots
(the link-loss and the silent form) come on top. Fault-free cases carry only confounders:
checkpoints, evaluation phases, a heavier last pipeline stage, 10-second blips, agent restarts,
missing, late and duplicated samples; and most of them a change of the job's membership, which is
no fault either (:class:`~collectors.sim.kinds.ConfounderType`): machines that join late, a
scale-down of a batch of machines within seconds (silent, as a scheduler killing them, or with
each agent's goodbye, a ``leave`` event), a rolling restart (each machine leaves with a goodbye,
stays away 20-90 s, comes back), and the job's end (every machine stops within seconds, with or
without goodbyes). Every suite has each of them at least once (``quick`` in its two fault-free
cases; ``standard`` and ``full`` a silent and a goodbye scale-down, and a job end of each kind).
Everything random is drawn from the suite seed, so a suite name and a seed fix every case; the
membership draws come from a stream of their own, so the other draws (and every faulty case)
are those of the suites before membership confounders were added.

Suites
------
``quick``
    One instance of every Table 1 type, a switch reboot and two fault-free runs (with every
    membership confounder between them), 8-32 machines, a few minutes each: for tests and CI.
``standard``
    Table 1 shares (~70 faults), switch reboots, fault-free runs (six of eight with membership
    confounders); 8-512 machines. The default.
``full``
    ``standard`` plus faulty jobs of 1024 and 2048 machines and fault-free runs (with membership
    confounders) that total over 1000 machine-hours, so that false alarms per 1000
    machine-hours is measured, not guessed.
``stragglers``
    36 jobs of 16-256 machines for straggler detection (:func:`_stragglers`), with the per-rank
    signals (:data:`STRAGGLER_SUITE_METRICS`) and step times from 0.3 s to 60 s (a few steps a
    second to one a minute): persistent slow workers (5-50 % slower, for 50 steps or more),
    transient 2x workers (10-40 steps), slow pipeline stages, flapping workers and groups of
    slow workers, in synchronous and some asynchronous jobs; and fault-free jobs with a
    job-wide slowdown (everyone slower is no straggler) or the usual confounders (checkpoints,
    evaluation phases, blips, agent restarts, membership changes). Each straggler's label
    carries the slowdown S it causes (``slowdown``, :func:`collectors.sim.scenario_labels`).
``realism``
    The patterns of real clusters that the other suites lack (:func:`_realism`), 27 jobs of
    16-64 machines: fail-stop faults that end in a job halt 8-16 samples after their onset (a
    NIC down, a GPU hung or lost to an XID; after the halt every machine idles alike), a leaf
    switch that drops its 8 machines (links down or silent) and recovers, intermittent
    stragglers (bursts of 1.7-2.4x steps with single steps back at 1.0-1.3x), two faults in one
    job, some of them in jobs whose steps swing in lockstep; and fault-free backgrounds: idle-
    heavy fleets of mixed load (most machines idle, a rotating few busy, no label saying which)
    and jobs whose steps have a host-bound phase, so that gauges swing up to ~4x between
    samples in lockstep across machines (``JobSpec.host_fraction``, with step periods that
    divide the coarse scrape intervals, read at a fixed phase, and periods that do not). Fault
    durations are at least :data:`MIN_FAULT_SAMPLES` samples at the suite's interval, onsets
    come after as many samples of warm-up, so the suite depends on ``interval_s``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectors.sim import FaultType, Scenario
from collectors.sim.scenario import DEFAULT_METRICS, STRAGGLER_METRICS

SUITES: tuple[str, ...] = ("quick", "standard", "full", "stragglers", "realism")
INDEPENDENT_SUITES: tuple[str, ...] = ("independent", "independent-large")
"""Suites of independently generated jobs, run by
:func:`minder.benchmark.independent.run.run_independent` rather than by the simulator's runner:
``minder.benchmark.independent.cases.SUITES`` written out, so that the runner need not import
the independent generator, which imports the runner (tests/minder/benchmark/test_independent.py
checks that they agree)."""

TABLE1_SHARES: dict[FaultType, float] = {
    FaultType.ECC_ERROR: 38.9,
    FaultType.CUDA_EXECUTION_ERROR: 14.6,
    FaultType.GPU_EXECUTION_ERROR: 7.7,
    FaultType.PCIE_DOWNGRADE: 6.6,
    FaultType.MACHINE_UNREACHABLE: 6.0,
    FaultType.NIC_DOWN: 5.7,
    FaultType.HDFS_ERROR: 5.7,
    FaultType.GPU_LOST: 2.0,
    FaultType.NVLINK_ERROR: 1.7,
    FaultType.AOC_ERROR: 0.9,
}
"""Share (%) of each fault type among production faults (Table 1; the rows sum to 89.8 %)."""

FAIL_STOP: frozenset[str] = frozenset(
    {
        "ecc_error",
        "gpu_lost",
        "nic_down",
        "machine_unreachable",
        "cuda_execution_error",
        "gpu_execution_error",
        "switch_reboot",
        "gpu_xid",
    }
)
"""Faults that stop the job (or a link) at once."""
STRAGGLERS: frozenset[str] = frozenset(
    {"slow_worker", "transient_straggler", "slow_stage", "flapping_worker", "slow_group"}
)
"""Straggler faults: some ranks compute slower than their peers (the ``stragglers`` suite)."""
FAIL_SLOW: frozenset[str] = (
    frozenset({"pcie_downgrade", "nvlink_error", "aoc_error", "hdfs_error", "thermal_throttle"})
    | STRAGGLERS
    | {"intermittent_straggler"}  # of the realism suite
)
"""Faults that only slow the job down."""

POST_SAMPLES = 12
"""Fewest samples a faulty case runs past its onset, at the suite's sampling interval."""
MIN_PER_TYPE = 3
"""Fewest instances of each Table 1 type in the ``standard`` and ``full`` suites."""
WARM_UP_S = 120
"""No fault starts earlier: the detector's windows and the job's rhythm must settle first."""

_STANDARD_FAULTS = 60
_STANDARD_SIZES = (8, 16, 16, 32, 32, 64, 64, 128, 128, 256, 512)
"""Sizes of the faulty jobs of ``standard``, cycled then shuffled (more small jobs than big)."""
_STREAMS = {"quick": 1, "standard": 2, "full": 2, "train": 3, "stragglers": 6, "realism": 7}
"""``full`` shares ``standard``'s stream, so its first cases are exactly ``standard``'s."""
_FULL_STREAM = 4
_MEMBERSHIP_STREAM = 5
"""Sub-stream of each suite's stream for the membership confounders of its fault-free cases."""

MEMBERSHIP: tuple[str, ...] = (
    "late_join",
    "scale_down_silent",
    "scale_down_goodbye",
    "rolling_restart",
    "job_end_silent",
    "job_end_goodbye",
)
"""Membership confounders a fault-free case can be given (:meth:`_Builder.fault_free`)."""
MIN_GROUP = 4
"""A scale-down leaves at least this many machines in each peer group (the detector's
smallest), unless every group is that small already (then one machine leaves)."""


@dataclass(frozen=True, slots=True)
class BenchCase:
    """One labelled scenario of a suite.

    Attributes
    ----------
    name
        Unique within the suite; also the job's name.
    scenario
        The simulator scenario (one job).
    fault
        The injected fault type, or None for a fault-free case.
    machines
        Machines of the job.
    duration_s
        Seconds simulated.
    is_fault_free
        No fault injected: every alert is a false alarm.
    detail
        What was drawn (severity, device, start, confounders), for the report.
    """

    name: str
    scenario: Scenario
    fault: str | None
    machines: int
    duration_s: int
    is_fault_free: bool
    detail: str = ""

    @property
    def machine_hours(self) -> float:
        """Machines times hours simulated."""
        return self.machines * self.duration_s / 3600.0

    @property
    def fail_mode(self) -> str | None:
        """``"fail-stop"``, ``"fail-slow"`` or None (fault-free)."""
        if self.fault is None:
            return None
        return "fail-stop" if self.fault in FAIL_STOP else "fail-slow"


def instance_counts(total: int, minimum: int = MIN_PER_TYPE) -> dict[FaultType, int]:
    """Instances per Table 1 type: ``total`` split by the shares (largest remainder), each
    raised to ``minimum``."""
    if total < 1:
        raise ValueError(f"total is {total!r}: expected a positive number of faults")
    weight = sum(TABLE1_SHARES.values())
    exact = {t: total * share / weight for t, share in TABLE1_SHARES.items()}
    counts = {t: math.floor(x) for t, x in exact.items()}
    by_remainder = sorted(exact, key=lambda t: exact[t] - counts[t], reverse=True)
    for t in by_remainder[: total - sum(counts.values())]:
        counts[t] += 1
    return {t: max(minimum, n) for t, n in counts.items()}


def build_suite(name: str = "standard", seed: int = 0, interval_s: int = 1) -> list[BenchCase]:
    """The cases of suite ``name`` (one of :data:`SUITES`) for ``seed``.

    ``interval_s`` is the sampling interval the cases will be seen at: each faulty case runs at
    least :data:`POST_SAMPLES` samples past its onset (detection at coarse sampling takes longer,
    in proportion), so suites at 1, 5 and 15 s are the same cases and at 60 s longer ones.
    """
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}: expected one of {', '.join(SUITES)}")
    if seed < 0 or interval_s < 1:
        raise ValueError(
            f"seed={seed!r}, interval_s={interval_s!r}: expected seed >= 0 and interval_s >= 1"
        )
    prefix = {"quick": "q", "stragglers": "st", "realism": "r"}.get(name, "s")
    builder = _Builder(seed, _STREAMS[name], prefix=prefix)
    builder.min_post_s = POST_SAMPLES * interval_s
    if name == "quick":
        return _quick(builder)
    if name == "realism":
        return _realism(builder, interval_s)
    if name == "stragglers":
        return _stragglers(builder)
    cases = _standard(builder)
    if name == "full":
        extra = _Builder(seed, _FULL_STREAM, prefix="f")
        extra.min_post_s = builder.min_post_s
        cases += _full_extra(extra)
    return cases


def build_training_suite(seed: int = 0) -> list[BenchCase]:
    """A small labelled suite to train on: every Table 1 type once (twice for ECC and CUDA),
    a switch reboot and a fault-free run, 8-32 machines, 6-8 minutes each, drawn from another
    random stream than any test suite."""
    b = _Builder(seed, _STREAMS["train"], prefix="t")
    sizes = [16, 16, 32, 8, 16, 16, 32, 8, 16, 16, 16, 16]
    kinds = [*TABLE1_SHARES, FaultType.ECC_ERROR, FaultType.CUDA_EXECUTION_ERROR]
    cases = [
        b.faulty(kind, size, post_s=240, max_start_s=240)
        for kind, size in zip(kinds, sizes, strict=True)
    ]
    cases.append(b.switch_reboot(32, silent=False, post_s=240, max_start_s=240))
    cases.append(b.fault_free(16, 600))
    return cases


# -- suites ----------------------------------------------------------------------------------


def _quick(b: _Builder) -> list[BenchCase]:
    sizes = {
        FaultType.ECC_ERROR: 16,
        FaultType.CUDA_EXECUTION_ERROR: 8,
        FaultType.GPU_EXECUTION_ERROR: 16,
        FaultType.PCIE_DOWNGRADE: 16,
        FaultType.MACHINE_UNREACHABLE: 8,
        FaultType.NIC_DOWN: 16,
        FaultType.HDFS_ERROR: 16,
        FaultType.GPU_LOST: 8,
        FaultType.NVLINK_ERROR: 16,
        FaultType.AOC_ERROR: 8,
    }
    cases = [b.faulty(kind, size, post_s=180, max_start_s=180) for kind, size in sizes.items()]
    cases.append(b.switch_reboot(32, silent=False, post_s=180, max_start_s=180))
    cases.append(
        b.fault_free(16, 600, membership=("late_join", "scale_down_silent", "rolling_restart"))
    )
    cases.append(
        b.fault_free(24, 480, pp_stages=2, membership=("scale_down_goodbye", "job_end_goodbye"))
    )
    return cases


def _standard(b: _Builder) -> list[BenchCase]:
    counts = instance_counts(_STANDARD_FAULTS)
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    sizes = [int(s) for s in np.resize(np.array(_STANDARD_SIZES), len(kinds))]
    order = b.rng.permutation(len(kinds))
    cases = [b.faulty(kinds[i], sizes[j]) for j, i in enumerate(order)]
    for size, silent in ((32, False), (128, True), (256, False), (64, True)):
        cases.append(b.switch_reboot(size, silent=silent))
    membership: tuple[tuple[int, int, tuple[str, ...]], ...] = (
        (8, 1, ()),
        (16, 2, ("late_join", "scale_down_silent")),
        (32, 1, ("rolling_restart",)),
        (64, 4, ("job_end_goodbye",)),
        (64, 2, ()),
        (128, 4, ("scale_down_goodbye", "job_end_silent")),
        (256, 2, ("late_join", "rolling_restart")),
        (512, 4, ("scale_down_silent",)),
    )
    for size, pp, moves in membership:
        cases.append(b.fault_free(size, 1200, pp_stages=pp, membership=moves))
    return cases


def _full_extra(b: _Builder) -> list[BenchCase]:
    cases = [
        b.faulty(FaultType.ECC_ERROR, 1024),
        b.faulty(FaultType.CUDA_EXECUTION_ERROR, 2048),
        b.faulty(FaultType.GPU_EXECUTION_ERROR, 1024),
        b.faulty(FaultType.PCIE_DOWNGRADE, 2048),
        b.faulty(FaultType.NIC_DOWN, 1024),
        b.faulty(FaultType.MACHINE_UNREACHABLE, 2048),
        b.faulty(FaultType.HDFS_ERROR, 1024),
        b.faulty(FaultType.NVLINK_ERROR, 2048),
        b.switch_reboot(2048, silent=True),
        b.switch_reboot(1024, silent=False),
    ]
    # 2048 x 30 min + 1024 x 30 min = 1536 machine-hours of fault-free data on their own.
    cases.append(
        b.fault_free(1024, 1800, pp_stages=4, membership=("rolling_restart", "scale_down_goodbye"))
    )
    cases.append(b.fault_free(2048, 1800, pp_stages=8, membership=("late_join", "job_end_goodbye")))
    return cases


STRAGGLER_SUITE_METRICS: tuple[str, ...] = (
    *STRAGGLER_METRICS,
    "gpu_util_ratio",
    "gpu_tensor_active_ratio",
    "gpu_power_watts",
    "gpu_sm_clock_hertz",
    "gpu_throttle_reasons",
    "gpu_xid_count",
    "rdma_tx_bytes_per_second",
    "rdma_port_up",
    "cpu_util_ratio",
    "net_rx_bytes_per_second",
)
"""What the jobs of the ``stragglers`` suite emit: the per-rank signals and the node signals a
straggler shows in (or hides behind); fewer than the other suites, so that an hour of a
256-machine job stays cheap to simulate and replay."""

RHYTHMS: dict[str, tuple[float, float]] = {
    "fast": (0.3, 1.0),
    "medium": (1.0, 6.0),
    "slow": (6.0, 20.0),
    "very_slow": (20.0, 60.0),
}
"""Step-time ranges (seconds) of the ``stragglers`` suite's jobs, drawn log-uniformly."""
MIN_SLOW_STEPS = 50
"""A persistent straggler of the ``stragglers`` suite runs at least this many (slow) steps."""

_StragglerCase = tuple[str, int, str, bool, dict[str, Any]]
"""``(kind, machines, rhythm, sync, options)`` of one case of :func:`_stragglers`."""
_STRAGGLER_CASES: tuple[_StragglerCase, ...] = (
    # persistent slow workers: every rank of a machine, or one or a few of its ranks
    ("slow_worker", 16, "very_slow", True, {}),
    ("slow_worker", 32, "slow", True, {}),
    ("slow_worker", 64, "medium", True, {}),
    ("slow_worker", 128, "fast", True, {}),
    ("slow_worker", 256, "fast", True, {}),
    ("slow_worker", 64, "medium", False, {}),
    ("slow_worker", 32, "slow", False, {}),
    ("slow_worker", 16, "medium", True, {"ranks": 1}),
    ("slow_worker", 128, "medium", True, {"ranks": 2}),
    ("slow_worker", 256, "medium", False, {}),
    # transient 2x workers, 10-40 steps
    ("transient_straggler", 16, "fast", True, {}),
    ("transient_straggler", 32, "medium", True, {}),
    ("transient_straggler", 64, "slow", True, {}),
    ("transient_straggler", 128, "fast", False, {}),
    ("transient_straggler", 256, "medium", True, {}),
    ("transient_straggler", 32, "very_slow", True, {}),
    # a slow pipeline stage (synchronous: a pipeline waits for its stages)
    ("slow_stage", 32, "medium", True, {"pp_stages": 2}),
    ("slow_stage", 64, "fast", True, {"pp_stages": 4}),
    ("slow_stage", 128, "slow", True, {"pp_stages": 4}),
    ("slow_stage", 256, "fast", True, {"pp_stages": 8}),
    # flapping workers
    ("flapping_worker", 16, "medium", True, {}),
    ("flapping_worker", 64, "fast", True, {}),
    ("flapping_worker", 128, "medium", False, {}),
    ("flapping_worker", 32, "slow", True, {}),
    # several slow workers at once
    ("slow_group", 32, "fast", True, {}),
    ("slow_group", 64, "medium", True, {}),
    ("slow_group", 128, "slow", True, {}),
    ("slow_group", 256, "medium", False, {}),
    # no fault: everyone slower, or only the usual confounders (membership changes included)
    ("job_wide_slowdown", 16, "very_slow", True, {}),
    ("job_wide_slowdown", 64, "medium", False, {"membership": ("late_join", "rolling_restart")}),
    ("job_wide_slowdown", 128, "fast", True, {"membership": ("scale_down_silent",)}),
    ("job_wide_slowdown", 256, "medium", True, {}),
    ("fault_free", 32, "slow", True, {"membership": ("job_end_goodbye",)}),
    ("fault_free", 64, "fast", False, {}),
    ("fault_free", 128, "medium", True, {"membership": ("scale_down_goodbye",)}),
    ("fault_free", 256, "fast", True, {"membership": ("job_end_silent",)}),
)


def _stragglers(b: _Builder) -> list[BenchCase]:
    cases = []
    for kind, machines, rhythm, sync, options in _STRAGGLER_CASES:
        if kind in STRAGGLERS:
            cases.append(b.straggler(kind, machines, rhythm, sync, **options))
        else:
            slowdown = kind == "job_wide_slowdown"
            cases.append(b.straggler_free(machines, rhythm, sync, slowdown=slowdown, **options))
    return cases


MIN_FAULT_SAMPLES = 8
"""``realism``: a fault lasts at least this many samples at the suite's interval (when its class
allows it), and starts after at least as many samples of the fault-free job."""
HALT_SAMPLES = (8, 16)
"""``realism``: a halting fault halts the job this many samples after its onset (drawn)."""
DOMAIN_DROP_S = 120.0
"""``realism``: a leaf switch drops its machines this long (or :data:`MIN_FAULT_SAMPLES`
samples, whichever is longer)."""
LOCKSTEP_STEPS_S: tuple[float, ...] = (20.0, 30.0, 45.0, 90.0, 150.0)
"""Step periods of the ``realism`` suite's lockstep jobs: 20 and 30 s divide the 60 s scrape
(read at a fixed phase), 45 s turns through its phases, 90 and 150 s outlast the scrape so
that even averaged rates swing."""
REALISM_METRICS: tuple[str, ...] = tuple(dict.fromkeys((*DEFAULT_METRICS, *STRAGGLER_METRICS)))
"""What the ``realism`` jobs that may hold a straggler emit: the default metrics and the
per-rank straggler signals."""
BACKGROUND_S = 900
"""Length of the ``realism`` suite's fault-free backgrounds."""
INTERMITTENT_MEAN = 1.65
"""About the mean compute factor of an intermittent straggler's steps (peaks and dips), to
size its cases."""

_RealismFault = tuple[str, int, str]
"""``(kind, machines, background)`` of one halting or intermittent case of :func:`_realism`."""
_HALTING: tuple[_RealismFault, ...] = (
    ("nic_down", 16, "lockstep"),
    ("nic_down", 32, "plain"),
    ("nic_down", 16, "plain"),
    ("gpu_execution_error", 16, "plain"),
    ("gpu_execution_error", 32, "lockstep"),
    ("gpu_xid", 16, "lockstep"),
    ("ecc_error", 32, "plain"),
)
_INTERMITTENT: tuple[tuple[int, bool, str], ...] = (
    (16, True, "plain"),
    (16, True, "lockstep"),
    (32, True, "plain"),
    (32, False, "plain"),
)
_PAIRS: tuple[tuple[int, str, str], ...] = (
    (16, "pcie_downgrade", "ecc_error"),
    (32, "thermal_throttle", "nic_down"),
    (32, "aoc_error", "intermittent_straggler"),
    (16, "nvlink_error", "gpu_execution_error"),
)
"""Two faults in one job: a fail-slow one first, another on another machine later."""
_BACKGROUNDS: tuple[tuple[str, int, float, tuple[str, ...]], ...] = (
    ("fleet", 32, 0.1, ("late_join",)),
    ("fleet", 48, 0.15, ("scale_down_silent", "job_end_goodbye")),
    ("fleet", 64, 0.2, ()),
    ("lockstep", 16, 30.0, ("rolling_restart",)),
    ("lockstep", 32, 45.0, ("scale_down_goodbye",)),
    ("lockstep", 32, 150.0, ("job_end_silent",)),
    ("lockstep", 16, 20.0, ()),
    ("lockstep", 48, 90.0, ("late_join",)),
)
"""Fault-free backgrounds: ``(kind, machines, busy share or step period, membership)``."""


def _realism(b: _Builder, interval_s: int) -> list[BenchCase]:
    cases = [b.halting(kind, size, background, interval_s) for kind, size, background in _HALTING]
    for size, silent in ((32, False), (32, True), (24, False), (48, True)):
        cases.append(b.domain_recovery(size, silent=silent, interval_s=interval_s))
    for size, sync, background in _INTERMITTENT:
        cases.append(b.intermittent(size, sync, background, interval_s))
    for size, first, second in _PAIRS:
        cases.append(b.two_faults(size, first, second, interval_s))
    for kind, size, value, moves in _BACKGROUNDS:
        if kind == "fleet":
            cases.append(b.fleet(size, value, membership=moves))
        else:
            cases.append(b.lockstep(size, value, membership=moves))
    return cases


# -- case builder ----------------------------------------------------------------------------


class _Builder:
    """Draws cases from one random stream; names them ``{prefix}{number:03d}-{kind}-n{size}``."""

    def __init__(self, seed: int, stream: int, prefix: str) -> None:
        self.rng = np.random.default_rng([seed, stream])
        # Membership confounders draw from their own stream, so adding them changed no other draw.
        self.membership_rng = np.random.default_rng([seed, stream, _MEMBERSHIP_STREAM])
        self.prefix = prefix
        self.count = 0
        self.min_post_s = 0

    def _name(self, kind: str, machines: int) -> str:
        self.count += 1
        return f"{self.prefix}{self.count:03d}-{kind.replace('_', '-')}-n{machines}"

    def _u(self, low: float, high: float) -> float:
        return float(self.rng.uniform(low, high))

    def _job(self, name: str, machines: int, pp_stages: int | None = None) -> dict[str, Any]:
        """A job of ``machines`` with a random rhythm, noise and layout."""
        rng = self.rng
        if pp_stages is None:
            # Stages of at least 4 machines: the detector's smallest peer group.
            choices = [p for p in (1, 1, 2, 4) if machines // p >= 4]
            pp_stages = int(rng.choice(choices))
        job: dict[str, Any] = {
            "name": name,
            "machines": machines,
            "pp_stages": pp_stages,
            "last_stage_extra_load": round(self._u(0.05, 0.15), 3),
            "machines_per_domain": max(4, min(16, machines // 4)),
            "step_time_s": round(self._u(2.0, 10.0), 2),
            "comm_fraction": round(self._u(0.2, 0.4), 3),
            "noise": round(self._u(0.8, 1.3), 2),
            "missing_rate": float(rng.choice([0.0, 0.001, 0.005])),
            "late_rate": float(rng.choice([0.0, 0.001, 0.005])),
            "duplicate_rate": float(rng.choice([0.0, 0.0, 0.0005])),
        }
        if rng.random() < 0.5:
            every = float(rng.choice([300.0, 600.0, 900.0]))
            job["checkpoint_every_s"] = every
            job["checkpoint_duration_s"] = round(self._u(15.0, 40.0), 1)
        return job

    def _scenario(self, job: dict[str, Any], duration_s: int, **extra: Any) -> Scenario:
        seed = int(self.rng.integers(2**31 - 1))
        return Scenario.model_validate(
            {"seed": seed, "duration_s": duration_s, "jobs": [job], **extra}
        )

    def _confounders(
        self, machines: int, duration_s: int, blips: int, restarts: int
    ) -> list[dict[str, Any]]:
        rng = self.rng
        out: list[dict[str, Any]] = []
        for _ in range(blips):
            out.append(
                {
                    "type": "blip",
                    "machine": int(rng.integers(machines)),
                    "start_s": float(rng.integers(60, duration_s - 30)),
                    "severity": round(self._u(0.5, 1.5), 2),
                }
            )
        for _ in range(restarts):
            out.append(
                {
                    "type": "agent_restart",
                    "machine": int(rng.integers(machines)),
                    "start_s": float(rng.integers(60, duration_s - 30)),
                    "duration_s": float(rng.integers(2, 9)),
                }
            )
        return out

    def faulty(
        self, kind: FaultType, machines: int, post_s: int = 360, max_start_s: int = 420
    ) -> BenchCase:
        """One job of ``machines`` with one ``kind`` fault from a random time after warm-up."""
        rng = self.rng
        name = self._name(kind.value, machines)
        job = self._job(name, machines)
        start = round(self._u(WARM_UP_S, max_start_s), 1)
        duration = 60 * math.ceil((start + max(post_s, self.min_post_s)) / 60)
        fault, detail = _FAULTS[kind](self, machines)
        fault.update({"type": kind.value, "machine": int(rng.integers(machines)), "start_s": start})
        confounders = self._confounders(
            machines, duration, blips=int(rng.integers(0, 3)), restarts=int(rng.integers(0, 2))
        )
        scenario = self._scenario(job, duration, faults=[fault], confounders=confounders)
        text = f"{detail}, machine {fault['machine']}, start {start:.0f} s"
        return BenchCase(name, scenario, kind.value, machines, duration, False, text)

    def switch_reboot(
        self, machines: int, *, silent: bool, post_s: int = 360, max_start_s: int = 420
    ) -> BenchCase:
        """A leaf switch of the job reboots for 1-4 minutes (``silent``: its machines go quiet)."""
        name = self._name("switch_reboot", machines)
        job = self._job(name, machines)
        domains = -(-machines // job["machines_per_domain"])
        if domains < 2:
            raise ValueError(f"switch_reboot needs two domains or more: {machines} machines")
        start = round(self._u(WARM_UP_S, max_start_s), 1)
        duration = 60 * math.ceil((start + max(post_s, self.min_post_s)) / 60)
        fault = {
            "type": "switch_reboot",
            "domain": f"leaf-{int(self.rng.integers(domains)):02d}",
            "start_s": start,
            "duration_s": float(self.rng.integers(60, 241)),
            "silent": silent,
        }
        scenario = self._scenario(job, duration, faults=[fault])
        text = f"{fault['domain']} {'silent' if silent else 'links down'} for " + (
            f"{fault['duration_s']:.0f} s, start {start:.0f} s"
        )
        return BenchCase(name, scenario, "switch_reboot", machines, duration, False, text)

    def fault_free(
        self,
        machines: int,
        duration_s: int,
        pp_stages: int | None = None,
        membership: tuple[str, ...] = (),
    ) -> BenchCase:
        """A job with no fault and every kind of confounder, plus the ``membership``
        confounders named (of :data:`MEMBERSHIP`)."""
        unknown = sorted(set(membership) - set(MEMBERSHIP))
        if unknown:
            raise ValueError(
                f"membership confounders {unknown}: expected some of {', '.join(MEMBERSHIP)}"
            )
        rng = self.rng
        name = self._name("fault_free", machines)
        job = self._job(name, machines, pp_stages)
        # Every fault-free job checkpoints and loses, delays and repeats a few samples.
        job["checkpoint_every_s"] = float(rng.choice([300.0, 600.0]))
        job["checkpoint_duration_s"] = round(self._u(15.0, 40.0), 1)
        job["missing_rate"] = float(rng.choice([0.001, 0.005, 0.01]))
        job["late_rate"] = float(rng.choice([0.001, 0.005]))
        job["duplicate_rate"] = 0.0005
        minutes = duration_s / 60
        confounders = self._confounders(
            machines,
            duration_s,
            blips=max(2, round(minutes / 4)),
            restarts=max(1, round(minutes / 8)),
        )
        for _ in range(1 + int(rng.integers(0, 2))):
            length = float(rng.integers(60, 181))
            confounders.append(
                {
                    "type": "eval_phase",
                    "start_s": float(rng.integers(WARM_UP_S, duration_s - int(length))),
                    "duration_s": length,
                }
            )
        moves = self._membership(
            membership, machines, job["pp_stages"], duration_s, _crashing(confounders)
        )
        confounders += [entry for entry, _text in moves]
        scenario = self._scenario(job, duration_s, confounders=confounders)
        kinds = sorted({c["type"] for c in confounders} - {entry["type"] for entry, _ in moves})
        text = f"pp{job['pp_stages']}, checkpoints, {', '.join([*kinds, *(t for _, t in moves)])}"
        return BenchCase(name, scenario, None, machines, duration_s, True, text)

    def _straggler_job(
        self, name: str, machines: int, rhythm: str, sync: bool, pp_stages: int | None = None
    ) -> dict[str, Any]:
        """A job of the ``stragglers`` suite: a step time drawn log-uniformly in the range of
        ``rhythm`` (:data:`RHYTHMS`), its noise, layout and checkpoints drawn as by
        :meth:`_job`, the straggler metrics."""
        rng = self.rng
        low, high = RHYTHMS[rhythm]
        step = round(math.exp(self._u(math.log(low), math.log(high))), 2)
        if pp_stages is None:
            choices = [p for p in (1, 1, 2, 4) if machines // p >= 4]
            pp_stages = int(rng.choice(choices))
        job: dict[str, Any] = {
            "name": name,
            "machines": machines,
            "pp_stages": pp_stages,
            "last_stage_extra_load": round(self._u(0.05, 0.15), 3),
            "machines_per_domain": max(4, min(16, machines // 4)),
            "step_time_s": step,
            "comm_fraction": round(self._u(0.15, 0.4), 3),
            "noise": round(self._u(0.8, 1.3), 2),
            "missing_rate": float(rng.choice([0.0, 0.001, 0.005])),
            "late_rate": float(rng.choice([0.0, 0.001, 0.005])),
            "duplicate_rate": float(rng.choice([0.0, 0.0, 0.0005])),
            "metrics": list(STRAGGLER_SUITE_METRICS),
            "sync": sync,
        }
        if rng.random() < 0.5:
            self._checkpoints(job)
        return job

    def _checkpoints(self, job: dict[str, Any]) -> None:
        """Checkpoints every 5-15 minutes (and at least every 10 steps), 15-40 s long."""
        every = float(self.rng.choice([300.0, 600.0, 900.0]))
        job["checkpoint_every_s"] = max(every, round(10 * job["step_time_s"], 1))
        job["checkpoint_duration_s"] = round(self._u(15.0, 40.0), 1)

    def _onset(self, step_s: float) -> float:
        """A straggler's start: after the warm-up and at least 10 steps, within 5 more."""
        settled = max(float(WARM_UP_S), 10 * step_s)
        return round(settled + self._u(0.0, max(60.0, 5 * step_s)), 1)

    def straggler(
        self,
        kind: str,
        machines: int,
        rhythm: str,
        sync: bool,
        *,
        ranks: int | None = None,
        pp_stages: int | None = None,
    ) -> BenchCase:
        """One job of ``machines`` with one straggler fault ``kind`` (of :data:`STRAGGLERS`);
        ``ranks``: a ``slow_worker`` of that many of its machine's ranks, not all of them."""
        if kind not in STRAGGLERS:
            raise ValueError(f"straggler kind {kind!r}: expected one of {sorted(STRAGGLERS)}")
        rng = self.rng
        name = self._name(kind, machines)
        job = self._straggler_job(name, machines, rhythm, sync, pp_stages)
        step, comm = job["step_time_s"], job["comm_fraction"]
        start = self._onset(step)
        fault: dict[str, Any] = {"type": kind, "start_s": start}
        if kind == "transient_straggler":
            factor = 2.0
            steps = int(rng.integers(10, 41))
            fault["duration_s"] = round(steps * step, 1)
            post = fault["duration_s"] + max(240.0, 10 * step)
            what = f"2x for {steps} steps"
        else:
            low, high = {"slow_stage": (1.1, 1.4), "flapping_worker": (1.2, 1.6)}.get(
                kind, (1.05, 1.5)
            )
            if kind == "slow_worker":  # log-uniform: the mild ones, the hard ones, are many
                factor = round(math.exp(self._u(math.log(low), math.log(high))), 3)
            else:
                factor = round(self._u(low, high), 3)
            slow_step = step * ((1.0 - comm) * factor + comm)
            post = max(360.0, (MIN_SLOW_STEPS + 2) * slow_step)
            what = f"x{factor}"
        fault["factor"] = factor
        if kind == "slow_stage":
            fault["stage"] = int(rng.integers(job["pp_stages"]))
            what += f" on stage pp{fault['stage']} of {job['pp_stages']}"
        elif kind == "slow_group":
            count = int(rng.integers(2, min(6, machines // 4) + 1))
            fault["machines"] = count
            what += f" on {count} machines"
        else:
            fault["machine"] = int(rng.integers(machines))
            what += f" on machine {fault['machine']}"
        if kind == "flapping_worker":
            period = round(max(float(rng.integers(5, 16)) * step, 20.0), 1)
            fault["period_s"] = period
            post = max(post, 6 * period)  # three slow turns at least
            what += f", {period:.0f} s slow / {period:.0f} s normal"
        if ranks is not None:
            picked = sorted(int(r) for r in rng.choice(8, size=ranks, replace=False))
            fault["device"] = [f"rank{r}" for r in picked]
            what += f" ({'+'.join(fault['device'])})"
        duration = 60 * math.ceil((start + max(post, self.min_post_s)) / 60)
        confounders = self._confounders(
            machines, duration, blips=int(rng.integers(0, 3)), restarts=int(rng.integers(0, 2))
        )
        scenario = self._scenario(job, duration, faults=[fault], confounders=confounders)
        mode = "sync" if sync else "async"
        text = f"{what}, {mode}, step {step:g} s, pp{job['pp_stages']}, start {start:.0f} s"
        return BenchCase(name, scenario, kind, machines, duration, False, text)

    def straggler_free(
        self,
        machines: int,
        rhythm: str,
        sync: bool,
        *,
        slowdown: bool,
        membership: tuple[str, ...] = (),
    ) -> BenchCase:
        """A ``stragglers`` job with no fault: checkpoints, blips, agent restarts, an evaluation
        phase, the ``membership`` confounders named, and with ``slowdown`` a job-wide slowdown
        (every rank slower alike, no straggler) for a while or to the end."""
        rng = self.rng
        name = self._name("job_wide_slowdown" if slowdown else "fault_free", machines)
        job = self._straggler_job(name, machines, rhythm, sync)
        self._checkpoints(job)
        job["missing_rate"] = float(rng.choice([0.001, 0.005, 0.01]))
        job["late_rate"] = float(rng.choice([0.001, 0.005]))
        step = job["step_time_s"]
        duration = 60 * math.ceil(max(1200.0, 100 * step) / 60)
        minutes = duration / 60
        confounders = self._confounders(
            machines,
            duration,
            blips=max(2, round(minutes / 4)),
            restarts=max(1, round(minutes / 8)),
        )
        length = float(rng.integers(60, 181))
        start = float(rng.integers(WARM_UP_S, duration - int(length)))
        confounders.append({"type": "eval_phase", "start_s": start, "duration_s": length})
        kinds = ["blip", "agent_restart", "eval_phase"]
        if slowdown:
            factor = round(self._u(1.1, 1.5), 3)
            entry: dict[str, Any] = {
                "type": "job_wide_slowdown",
                "factor": factor,
                "start_s": self._onset(step),
            }
            if rng.random() < 0.5:
                entry["duration_s"] = float(rng.integers(300, 901))
            confounders.append(entry)
            kinds.append(f"job_wide_slowdown x{factor}")
        moves = self._membership(
            membership, machines, job["pp_stages"], duration, _crashing(confounders)
        )
        confounders += [entry for entry, _text in moves]
        scenario = self._scenario(job, duration, confounders=confounders)
        mode = "sync" if sync else "async"
        text = f"{mode}, step {step:g} s, pp{job['pp_stages']}, checkpoints, " + ", ".join(
            [*kinds, *(t for _, t in moves)]
        )
        return BenchCase(name, scenario, None, machines, duration, True, text)

    # -- the realism suite -------------------------------------------------------------------

    def _realism_onset(self, interval_s: int) -> float:
        """A fault's start, in whole seconds: after the warm-up and at least
        :data:`MIN_FAULT_SAMPLES` samples of the healthy job, within 5 minutes more."""
        settled = max(WARM_UP_S, MIN_FAULT_SAMPLES * interval_s)
        return float(settled + int(self.rng.integers(0, 301)))

    def _realism_job(
        self, name: str, machines: int, background: str, *, stragglers: bool = False
    ) -> dict[str, Any]:
        """A job as :meth:`_job` draws it; ``lockstep``: steps with a host-bound phase
        (:meth:`_make_lockstep`); ``stragglers``: with the per-rank signals."""
        job = self._job(name, machines)
        if background == "lockstep":
            self._make_lockstep(job, float(self.rng.choice(LOCKSTEP_STEPS_S[:2])))
        if stragglers:
            job["metrics"] = list(REALISM_METRICS)
        return job

    def _make_lockstep(self, job: dict[str, Any], step_s: float) -> None:
        """Steps of ``step_s`` whose first 20-35 % is host-bound (every GPU waits together:
        power and utilisation fall ~4x, NVLink and RDMA more) and 20-35 % communication;
        checkpoints, if any, at most every 10 steps."""
        job["step_time_s"] = step_s
        job["host_fraction"] = round(self._u(0.2, 0.35), 3)
        job["comm_fraction"] = round(self._u(0.2, 0.35), 3)
        if "checkpoint_every_s" in job:
            job["checkpoint_every_s"] = max(job["checkpoint_every_s"], 10 * step_s)

    def _realism_duration(self, end_s: float, interval_s: int) -> int:
        """Whole minutes past ``end_s`` (a fault's last effect) by the slack of a coarse
        cadence and the suite's post-onset minimum."""
        return 60 * math.ceil((end_s + max(180.0, 6.0 * interval_s)) / 60)

    def halting(self, kind: str, machines: int, background: str, interval_s: int) -> BenchCase:
        """A fail-stop ``kind`` that halts the job 8-16 samples (:data:`HALT_SAMPLES`) after
        its onset; ``background`` ``plain`` or ``lockstep``."""
        rng = self.rng
        name = self._name(f"{kind}_halt", machines)
        job = self._realism_job(name, machines, background)
        start = self._realism_onset(interval_s)
        samples = int(rng.integers(HALT_SAMPLES[0], HALT_SAMPLES[1] + 1))
        halt = float(samples * interval_s)
        fault: dict[str, Any] = {
            "type": kind,
            "machine": int(rng.integers(machines)),
            "start_s": start,
            "halt_after_s": halt,
        }
        if kind == "nic_down":
            fault["device"] = _nic(self)
        elif kind != "cuda_execution_error":
            fault["device"] = _gpu(self)
        duration = self._realism_duration(start + halt, interval_s)
        duration = 60 * math.ceil(max(duration, start + self.min_post_s) / 60)
        confounders = self._confounders(machines, duration, blips=int(rng.integers(0, 3)),
                                        restarts=0)  # fmt: skip
        scenario = self._scenario(job, duration, faults=[fault], confounders=confounders)
        text = (
            f"{fault.get('device', '')} on machine {fault['machine']}, start {start:.0f} s, job "
            f"halts {samples} samples later ({halt:.0f} s), {background}"
        )
        return BenchCase(name, scenario, kind, machines, duration, False, text)

    def domain_recovery(self, machines: int, *, silent: bool, interval_s: int) -> BenchCase:
        """A leaf switch of 8 machines drops them (links down, or ``silent``) for
        :data:`DOMAIN_DROP_S` (at least :data:`MIN_FAULT_SAMPLES` samples) and recovers; the
        job stalls meanwhile and then computes again."""
        name = self._name("switch_reboot", machines)
        job = self._job(name, machines)
        job["machines_per_domain"] = 8
        start = self._realism_onset(interval_s)
        length = max(DOMAIN_DROP_S, float(MIN_FAULT_SAMPLES * interval_s))
        domain = f"leaf-{int(self.rng.integers(machines // 8)):02d}"
        fault = {
            "type": "switch_reboot",
            "domain": domain,
            "start_s": start,
            "duration_s": length,
            "silent": silent,
        }
        duration = self._realism_duration(start + length + 240.0, interval_s)
        duration = 60 * math.ceil(max(duration, start + self.min_post_s) / 60)
        scenario = self._scenario(job, duration, faults=[fault])
        how = "silent" if silent else "links down"
        text = f"{domain} (8 machines) {how} for {length:.0f} s then back, start {start:.0f} s"
        return BenchCase(name, scenario, "switch_reboot", machines, duration, False, text)

    def _intermittent_fault(
        self, job: dict[str, Any], machine: int, start: float, interval_s: int
    ) -> tuple[dict[str, Any], str]:
        """An ``intermittent_straggler`` entry on ``machine``, for 20 of its slowed steps or
        :data:`MIN_FAULT_SAMPLES` samples, whichever is longer."""
        step, comm = job["step_time_s"], job["comm_fraction"]
        rest = comm + job.get("host_fraction", 0.0)
        slow_step = step * ((1.0 - rest) * INTERMITTENT_MEAN + rest)
        length = round(max(20 * slow_step, float(MIN_FAULT_SAMPLES * interval_s)), 1)
        fault: dict[str, Any] = {
            "type": "intermittent_straggler",
            "machine": machine,
            "start_s": start,
            "duration_s": length,
        }
        steps = length / slow_step
        text = f"intermittent on machine {fault['machine']} for {length:.0f} s (~{steps:.0f} steps)"
        return fault, text

    def intermittent(
        self, machines: int, sync: bool, background: str, interval_s: int
    ) -> BenchCase:
        """An intermittent straggler (peaks of 1.7-2.4x with single steps back at 1.0-1.3x)
        in a job of ``machines``, synchronous or not."""
        name = self._name("intermittent_straggler", machines)
        job = self._realism_job(name, machines, background, stragglers=True)
        job["sync"] = sync
        start = self._realism_onset(interval_s)
        machine = int(self.rng.integers(machines))
        fault, what = self._intermittent_fault(job, machine, start, interval_s)
        end = start + fault["duration_s"]
        duration = 60 * math.ceil(max(self._realism_duration(end, interval_s),
                                      start + self.min_post_s) / 60)  # fmt: skip
        confounders = self._confounders(machines, duration, blips=int(self.rng.integers(0, 3)),
                                        restarts=0)  # fmt: skip
        scenario = self._scenario(job, duration, faults=[fault], confounders=confounders)
        mode = "sync" if sync else "async"
        text = f"{what}, {mode}, step {job['step_time_s']:g} s, start {start:.0f} s, {background}"
        return BenchCase(name, scenario, "intermittent_straggler", machines, duration, False, text)

    def two_faults(self, machines: int, first: str, second: str, interval_s: int) -> BenchCase:
        """Two faults in one job on two machines: fail-slow ``first`` for 5 minutes (at least
        10 samples), ``second`` from 8-16 samples (at least a minute) after its onset, for its
        class's length (a fail-stop to the end, an intermittent straggler its 20 steps). The
        case's ``fault`` is ``first``; the labels hold both."""
        rng = self.rng
        name = self._name(f"{first}_and_{second}", machines)
        job = self._realism_job(
            name, machines, "plain", stragglers=second == "intermittent_straggler"
        )
        mild = _mild(first.replace("_", " "), _gpu, 0.5, 1.0)
        one, one_text = _FAULTS.get(FaultType(first), mild)(self, machines)
        start = self._realism_onset(interval_s)
        length = float(max(300, 10 * interval_s))
        m1, m2 = (int(m) for m in rng.choice(machines, size=2, replace=False))
        one.update({"type": first, "machine": m1, "start_s": start, "duration_s": length})
        gap = max(60.0, float(int(rng.integers(8, 17)) * interval_s))
        later = start + gap
        if second == "intermittent_straggler":
            two, two_text = self._intermittent_fault(job, m2, later, interval_s)
            end = later + two["duration_s"]
        else:
            two, two_text = _FAULTS[FaultType(second)](self, machines)
            two.update({"type": second, "machine": m2, "start_s": later})
            end = later + MIN_FAULT_SAMPLES * interval_s
        end = max(end, start + length)
        duration = 60 * math.ceil(max(self._realism_duration(end, interval_s),
                                      later + self.min_post_s) / 60)  # fmt: skip
        scenario = self._scenario(job, duration, faults=[one, two])
        text = (
            f"{first}: {one_text}, machine {m1}, start {start:.0f} s for {length:.0f} s; "
            f"{second}: {two_text}, machine {m2}, start {later:.0f} s"
        )
        return BenchCase(name, scenario, first, machines, duration, False, text)

    def _background(
        self,
        name: str,
        job: dict[str, Any],
        machines: int,
        membership: tuple[str, ...],
        what: str,
    ) -> BenchCase:
        """A fault-free case of ``job``: 15 minutes at every interval (15 samples at 60 s, so
        that its draws, and every later case's, do not depend on the interval), blips, agent
        restarts, lost and late samples, and the ``membership`` confounders named."""
        rng = self.rng
        duration = BACKGROUND_S
        job["missing_rate"] = float(rng.choice([0.001, 0.005]))
        job["late_rate"] = float(rng.choice([0.001, 0.005]))
        minutes = duration / 60
        confounders = self._confounders(
            machines,
            duration,
            blips=max(2, round(minutes / 5)),
            restarts=max(1, round(minutes / 10)),
        )
        moves = self._membership(
            membership, machines, job["pp_stages"], duration, _crashing(confounders)
        )
        confounders += [entry for entry, _text in moves]
        scenario = self._scenario(job, duration, confounders=confounders)
        text = ", ".join([what, "blip", "agent_restart", *(t for _, t in moves)])
        return BenchCase(name, scenario, None, machines, duration, True, text)

    def fleet(
        self, machines: int, busy_share: float, membership: tuple[str, ...] = ()
    ) -> BenchCase:
        """A fault-free idle-heavy fleet of mixed load: ``busy_share`` of the machines busy at a
        time on average (a rotating few, 2-10 minutes each), the rest idle; one peer group, no
        label saying who is busy; short, communication-light steps; no checkpoints."""
        name = self._name("idle_fleet", machines)
        job = self._job(name, machines, pp_stages=1)
        job.pop("checkpoint_every_s", None)
        job.pop("checkpoint_duration_s", None)
        job["step_time_s"] = round(self._u(1.0, 3.0), 2)
        job["comm_fraction"] = round(self._u(0.05, 0.15), 3)
        dwell = float(self.rng.integers(120, 601))
        job["fleet"] = {"busy_share": busy_share, "dwell_s": dwell}
        what = f"idle fleet, {busy_share:.0%} busy at a time for {dwell:.0f} s on average"
        return self._background(name, job, machines, membership, what)

    def lockstep(self, machines: int, step_s: float, membership: tuple[str, ...] = ()) -> BenchCase:
        """A fault-free job whose ``step_s`` steps open with a host-bound phase: gauges swing
        up to ~4x between samples, in lockstep across machines."""
        name = self._name("lockstep", machines)
        job = self._job(name, machines)
        self._make_lockstep(job, step_s)
        what = (
            f"lockstep phases, step {step_s:g} s, host {job['host_fraction']:.0%}, "
            f"comm {job['comm_fraction']:.0%}, pp{job['pp_stages']}"
        )
        return self._background(name, job, machines, membership, what)

    def _membership(
        self,
        kinds: tuple[str, ...],
        machines: int,
        pp_stages: int,
        duration_s: int,
        avoid: frozenset[int] = frozenset(),
    ) -> list[tuple[dict[str, Any], str]]:
        """The confounder entries (and their description) of the membership ``kinds``, each on
        other machines, none on ``avoid`` (machines whose agent crashes: a planned leave while
        the agent is down is no goodbye, and a fault-free case must hold no real silence)."""
        rng = self.membership_rng
        used: set[int] = set(avoid)

        def pick(count: int, keep_groups: bool = False) -> list[int]:
            """``count`` unused machines; with ``keep_groups`` fewer when more would leave a
            peer group smaller than :data:`MIN_GROUP` (but one at least)."""
            left = Counter(i * pp_stages // machines for i in range(machines))
            order = [i for i in rng.permutation(machines).tolist() if i not in used]
            out: list[int] = []
            for i in order:
                group = i * pp_stages // machines
                if len(out) == count:
                    break
                if keep_groups and left[group] <= MIN_GROUP:
                    continue
                left[group] -= 1
                out.append(i)
            if not out:  # every group is at its minimum already: one machine leaves anyway
                out = order[:1]
            used.update(out)
            return sorted(out)

        out: list[tuple[dict[str, Any], str]] = []
        for kind in kinds:
            if kind == "late_join":
                joiners = pick(int(rng.integers(1, max(1, machines // 16) + 1)))
                start = float(rng.integers(30, duration_s // 4))
                entry: dict[str, Any] = {"type": kind, "machines": joiners, "start_s": start}
                text = f"late_join {len(joiners)} at {start:.0f} s"
            elif kind.startswith("scale_down"):
                goodbye = kind.endswith("goodbye")
                leaving = pick(max(1, round(machines * float(rng.uniform(0.05, 0.2)))), True)
                start = float(rng.integers(WARM_UP_S + 60, duration_s - 240))
                spread = round(float(rng.uniform(1.0, 5.0)), 1)
                entry = {
                    "type": "scale_down",
                    "machines": leaving,
                    "start_s": start,
                    "spread_s": spread,
                    "goodbye": goodbye,
                }
                how = "goodbye" if goodbye else "silent"
                text = f"scale_down {len(leaving)} {how} at {start:.0f} s"
            elif kind == "rolling_restart":
                restarted = pick(int(rng.integers(2, min(6, machines // 2) + 1)))
                every = round(float(rng.uniform(20.0, 60.0)), 1)
                away = float(rng.integers(20, 91))
                latest = duration_s - (len(restarted) - 1) * every - away - 60
                start = float(rng.integers(WARM_UP_S, max(WARM_UP_S, int(latest)) + 1))
                entry = {
                    "type": kind,
                    "machines": restarted,
                    "start_s": start,
                    "every_s": every,
                    "duration_s": away,
                }
                text = f"rolling_restart {len(restarted)} every {every:.0f} s, {away:.0f} s away"
            else:  # job_end_silent, job_end_goodbye
                goodbye = kind.endswith("goodbye")
                start = float(duration_s - int(rng.integers(20, 61)))
                spread = round(float(rng.uniform(1.0, 5.0)), 1)
                entry = {
                    "type": "job_end",
                    "start_s": start,
                    "spread_s": spread,
                    "goodbye": goodbye,
                }
                text = f"job_end {'goodbye' if goodbye else 'silent'} at {start:.0f} s"
            out.append((entry, text))
        return out


# -- fault parameters ------------------------------------------------------------------------


def _gpu(b: _Builder) -> str:
    return f"gpu{int(b.rng.integers(8))}"


def _nic(b: _Builder) -> str:
    return f"mlx5_{int(b.rng.integers(4))}"


def _ecc(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    device = _gpu(b)
    return {"device": device}, f"DBE on {device}"


def _gpu_lost(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    device = _gpu(b)
    return {"device": device}, f"{device} off the bus"


def _gpu_exec(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    many = int(b.rng.choice([1, 1, 1, 2, 8]))
    if many == 8:
        return {"device": "all"}, "every GPU hangs"
    picks = sorted({_gpu(b) for _ in range(many)})
    return {"device": tuple(picks)}, f"{'+'.join(picks)} hang"


def _cuda(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    return {}, "process dies"


def _unreachable(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    return {}, "machine silent"


def _nic_down(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    device = _nic(b)
    severity = round(b._u(0.5, 1.25), 2)
    return {"device": device, "severity": severity}, f"{device} down, severity {severity}"


def _pcie(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
    device = _gpu(b)
    severity = round(b._u(0.3, 1.0), 2)
    draw = b.rng.random()
    if draw < 0.6:
        link: dict[str, Any] = {"link_width": 8}
    elif draw < 0.8:
        link = {"link_width": 4}
    else:
        link = {"link_gen": int(b.rng.choice([3, 4]))}
    text = ", ".join(f"{k} {v}" for k, v in link.items())
    return {"device": device, "severity": severity, **link}, f"{device} {text}, sev {severity}"


_FaultDraw = Callable[["_Builder", int], tuple[dict[str, Any], str]]


def _mild(
    label: str, device: Callable[[_Builder], str] | None, low: float, high: float
) -> _FaultDraw:
    """A fail-slow fault of a severity drawn from ``[low, high]``."""

    def draw(b: _Builder, machines: int) -> tuple[dict[str, Any], str]:
        severity = round(b._u(low, high), 2)
        fault: dict[str, Any] = {"severity": severity}
        where = ""
        if device is not None:
            fault["device"] = device(b)
            where = f" on {fault['device']}"
        return fault, f"{label}{where}, severity {severity}"

    return draw


_FAULTS: dict[FaultType, _FaultDraw] = {
    FaultType.ECC_ERROR: _ecc,
    FaultType.CUDA_EXECUTION_ERROR: _cuda,
    FaultType.GPU_EXECUTION_ERROR: _gpu_exec,
    FaultType.PCIE_DOWNGRADE: _pcie,
    FaultType.MACHINE_UNREACHABLE: _unreachable,
    FaultType.NIC_DOWN: _nic_down,
    FaultType.HDFS_ERROR: _mild("data loader starved", None, 0.15, 0.8),
    FaultType.GPU_LOST: _gpu_lost,
    FaultType.NVLINK_ERROR: _mild("NVLink errors", _gpu, 0.3, 1.0),
    FaultType.AOC_ERROR: _mild("bad optical cable", _nic, 0.3, 1.0),
}


def _crashing(confounders: list[dict[str, Any]]) -> frozenset[int]:
    """Machines of ``agent_restart`` confounders."""
    return frozenset(int(c["machine"]) for c in confounders if c["type"] == "agent_restart")
