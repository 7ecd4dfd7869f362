"""The kinds of injections a scenario can name."""

from __future__ import annotations

from enum import StrEnum


class FaultType(StrEnum):
    """Injectable faults: the paper's Table 1 types plus a generic XID and two network faults.

    Each one's signature (see ``collectors/sim/faults.py`` and docs/detection-method.md §3):

    ``gpu_xid``
        XID (default 119, GSP timeout; ``xid_code`` to change) on one GPU, the training process
        dies a second later (that machine's GPUs idle, CPU drops), the job stalls at its next
        collective (peers spin in NCCL: utilisation high, tensor activity and power low).
    ``ecc_error``
        Double-bit ECC error (DBE count, XID 48) on one GPU, then as ``gpu_xid``.
    ``gpu_lost``
        XID 79 on one GPU whose samples then stop while the machine keeps reporting; job stalls.
    ``nic_down``
        One RDMA port down: ``rdma_port_up`` 0, one link-down count at onset, no traffic on it;
        the job's communication slows by ``0.8 * severity``.
    ``pcie_downgrade``
        One GPU's PCIe link drops to ``link_width`` (default 8) / ``link_gen``: PFC pause frames
        surge on the machine's NICs, its RDMA throughput falls, the whole job slows somewhat.
    ``nvlink_error``
        NVLink error counts and halved NVLink throughput on one GPU; the job slows slightly.
    ``thermal_throttle``
        One GPU (``device: all`` for the whole machine) runs hot (90+ C) at lowered SM clocks
        with the thermal throttle bits set and lower power; its peers wait for it each step.
    ``machine_unreachable``
        The machine sends nothing at all; the job stalls.
    ``switch_reboot``
        Every machine of one ``domain`` (leaf switch) loses all RDMA ports for the duration
        (``silent: true``: the machines go silent instead); the job stalls, then recovers.
    ``aoc_error``
        A bad optical cable on one NIC: symbol errors, short link flaps, PFC pauses.
    ``cuda_execution_error``
        The training process dies without any XID or ECC count; the job stalls.
    ``gpu_execution_error``
        One or more GPUs hang (utilisation and SM activity high, tensor activity 0, power low);
        the job stalls.
    ``hdfs_error``
        The data loader starves: each step waits ``2 * severity`` step times for data, during
        which this machine's GPUs idle, its CPU and network receive drop; peers spin.

    Stragglers (``factor``: how many times longer the slow ranks' compute, their *busy time*,
    takes; see ``collectors/sim/faults.py``). In a synchronous job (the default) every rank's
    step then takes as long as the slowest rank's busy time plus the communication: the slow
    ranks compute through the time their peers wait in the collective, so the slow ranks show
    the largest ``train_busy_seconds`` and the shortest ``nccl_collective_seconds``, every rank
    the same longer ``train_step_seconds``, and the healthy ranks' GPUs spin a little longer
    each step (utilisation and power dip mildly). In an asynchronous job (``sync: false``) only
    the slow ranks' own steps take longer and their ``train_step_number`` falls behind (their
    GPU and host signals keep the job's rhythm: the simulator has one phase timeline per job).
    The other faults keep their job-wide effects in an asynchronous job.

    ``slow_worker``
        One machine's ranks (``device``: ``rankN``, a list of them or ``all``, the default)
        are ``factor`` (default 1.2) slower from ``start_s``, for ``duration_s`` or to the end.
    ``transient_straggler``
        As ``slow_worker`` for a short while: default ``factor`` 2.0, ``duration_s`` 20 steps.
    ``slow_stage``
        Every rank of one pipeline stage (``stage``: ``ppN`` or ``N``; a ``machine`` stands for
        its stage; default drawn from the seed) is ``factor`` (default 1.2) slower: one stage
        out of balance, not so many separate stragglers. The job needs ``pp_stages`` >= 2.
    ``flapping_worker``
        As ``slow_worker`` (default ``factor`` 1.5) but slow and normal by turns, ``period_s``
        (default 60 s) each, slow first.
    ``slow_group``
        Several machines (``machines``: a count drawn from the seed, default 3, or a list) are
        ``factor`` (default 1.2) slower at once.
    ``intermittent_straggler``
        One machine's ranks (``device`` as ``slow_worker``) straggle in bursts, step by step:
        peaks of ``0.85 * factor`` to ``1.2 * factor`` (default ``factor`` 2.0: 1.7-2.4x) with
        single steps back at 1.0-1.3x between them (never two in a row), drawn from the seed;
        on average about 1.6x its peers' busy time, about 1.5x their step time. Default
        ``duration_s``: :data:`DEFAULT_INTERMITTENT_STEPS` of its slowed steps. Its label's
        ``slowdown`` is that of the mean factor of those steps.

    Fail-stop faults that end in a job halt (``halt_after_s``, for :data:`HALTING_FAULTS`):
    the fault shows for ``halt_after_s`` seconds, then the job halts (the NCCL watchdog or the
    scheduler tears it down): every machine's training process exits, every GPU idles alike
    and the agents keep reporting. A ``nic_down`` that halts stalls the job from its onset (the
    collective hangs on the lost rail until the timeout) instead of slowing it.
    """

    GPU_XID = "gpu_xid"
    ECC_ERROR = "ecc_error"
    GPU_LOST = "gpu_lost"
    NIC_DOWN = "nic_down"
    PCIE_DOWNGRADE = "pcie_downgrade"
    NVLINK_ERROR = "nvlink_error"
    THERMAL_THROTTLE = "thermal_throttle"
    MACHINE_UNREACHABLE = "machine_unreachable"
    SWITCH_REBOOT = "switch_reboot"
    AOC_ERROR = "aoc_error"
    CUDA_EXECUTION_ERROR = "cuda_execution_error"
    GPU_EXECUTION_ERROR = "gpu_execution_error"
    HDFS_ERROR = "hdfs_error"
    SLOW_WORKER = "slow_worker"
    TRANSIENT_STRAGGLER = "transient_straggler"
    SLOW_STAGE = "slow_stage"
    FLAPPING_WORKER = "flapping_worker"
    SLOW_GROUP = "slow_group"
    INTERMITTENT_STRAGGLER = "intermittent_straggler"


class ConfounderType(StrEnum):
    """Benign events that must not be alerted.

    ``blip``
        One machine deviates for a short while (default 10 s): a CPU spike, a PFC burst and a
        25 % GPU power dip.
    ``eval_phase``
        Every machine of the job changes rhythm together (default 120 s): shorter steps
        (0.4x), little communication, 20 % lower compute intensity.
    ``agent_restart``
        The node agent of one machine restarts (an upgrade, a crash, a driver reload): the
        machine sends nothing for the duration (default 4 s), then for its first second back
        its rate metrics (``MetricKind.RATE``, ``*_per_second``) are absent while the agent
        re-primes its counters; levels and counts are back at once. Training goes on
        undisturbed. This is how the simulator models counter resets: a real agent that
        restarts (or sees a counter go backwards) drops the first difference instead of
        emitting a negative or huge rate, so the detector sees a short gap, never a bogus
        value (docs/architecture.md §3.1).

    Membership confounders: machines join and leave the job on purpose. A machine out of the
    job sends no batch at all (no samples, not NaN values); an agent that stops cleanly sends
    one last batch with no samples and a ``leave`` event (``EventKind.LEAVE``, device ``""``,
    ``"agent stopped: SIGTERM"``) in the first second it is gone, never ahead of its late
    batches (the agent delivers in order); an agent that starts (a late joiner, a machine back
    from a restart) sends no rate metric in its first second, as after ``agent_restart``.
    Training goes on undisturbed on the machines that stay.

    ``late_join``
        ``machine`` or ``machines`` (a count drawn from the seed, or a list; default one
        machine) report nothing before ``start_s``, then like their peers.
    ``scale_down``
        ``machine`` or ``machines`` (default one) stop reporting for good, each at a time drawn
        in ``[start_s, start_s + spread_s)`` (``spread_s`` default 3 s). ``goodbye`` (default
        true): each sends a ``leave`` event as it stops; false: they fall silent (a scheduler
        killing them).
    ``rolling_restart``
        ``machine`` or ``machines`` (a count, a list, default every machine of the job)
        restart one after another, ``every_s`` apart (default 60 s) from ``start_s`` in index
        (or listed) order: each leaves with a ``leave`` event, stays away ``duration_s``
        (default 30 s), then reports again.
    ``job_end``
        Every machine of the job stops for good at a time drawn in ``[start_s, start_s +
        spread_s)``, with or without ``goodbye`` (default true) as ``scale_down``; the scenario
        may end a little after.

    ``job_wide_slowdown``
        Every rank of the job computes ``factor`` (default 1.2) times longer from ``start_s``
        (for ``duration_s`` or to the end): slower data, a lower clock cap, a bigger batch. The
        whole job slows, but no rank lags its peers, so it is no straggler and no fault.
    """

    BLIP = "blip"
    EVAL_PHASE = "eval_phase"
    AGENT_RESTART = "agent_restart"
    LATE_JOIN = "late_join"
    SCALE_DOWN = "scale_down"
    ROLLING_RESTART = "rolling_restart"
    JOB_END = "job_end"
    JOB_WIDE_SLOWDOWN = "job_wide_slowdown"


MEMBERSHIP_CONFOUNDERS = frozenset(
    {
        ConfounderType.LATE_JOIN,
        ConfounderType.SCALE_DOWN,
        ConfounderType.ROLLING_RESTART,
        ConfounderType.JOB_END,
    }
)
"""Confounders where machines join or leave the job (their absence sends nothing at all)."""


GPU_FAULTS = frozenset(
    {
        FaultType.GPU_XID,
        FaultType.ECC_ERROR,
        FaultType.GPU_LOST,
        FaultType.PCIE_DOWNGRADE,
        FaultType.NVLINK_ERROR,
        FaultType.THERMAL_THROTTLE,
        FaultType.GPU_EXECUTION_ERROR,
    }
)
"""Faults that hit one or more GPUs (``device``: ``gpuN``, a list of them, or ``all``)."""
NIC_FAULTS = frozenset({FaultType.NIC_DOWN, FaultType.AOC_ERROR})
"""Faults that hit one or more RDMA NICs (``device``: ``mlx5_N``, a list of them, or ``all``)."""
STRAGGLER_FAULTS = frozenset(
    {
        FaultType.SLOW_WORKER,
        FaultType.TRANSIENT_STRAGGLER,
        FaultType.SLOW_STAGE,
        FaultType.FLAPPING_WORKER,
        FaultType.SLOW_GROUP,
        FaultType.INTERMITTENT_STRAGGLER,
    }
)
"""Faults that slow some ranks' compute by a ``factor`` (see :class:`FaultType`)."""
RANK_FAULTS = frozenset(
    {
        FaultType.SLOW_WORKER,
        FaultType.TRANSIENT_STRAGGLER,
        FaultType.FLAPPING_WORKER,
        FaultType.INTERMITTENT_STRAGGLER,
    }
)
"""Stragglers of one machine that may hit only some of its ranks (``device``: ``rankN``, a list
of them, or ``all``, the default)."""
DEFAULT_FACTOR: dict[FaultType | ConfounderType, float] = {
    FaultType.SLOW_WORKER: 1.2,
    FaultType.TRANSIENT_STRAGGLER: 2.0,
    FaultType.SLOW_STAGE: 1.2,
    FaultType.FLAPPING_WORKER: 1.5,
    FaultType.SLOW_GROUP: 1.2,
    FaultType.INTERMITTENT_STRAGGLER: 2.0,
    ConfounderType.JOB_WIDE_SLOWDOWN: 1.2,
}
"""``factor`` of each slowdown when the scenario names none."""
DEFAULT_PERIOD_S = 60.0
"""``flapping_worker``: seconds slow, then as many normal, by turns."""
DEFAULT_TRANSIENT_STEPS = 20
"""``transient_straggler``: default ``duration_s`` in the job's steps."""
DEFAULT_GROUP_SIZE = 3
"""``slow_group``: machines drawn when ``machines`` is left out."""
DEFAULT_INTERMITTENT_STEPS = 20
"""``intermittent_straggler``: default ``duration_s`` in the straggler's own (slowed) steps."""
INTERMITTENT_MIN_FACTOR = 1.5
"""``intermittent_straggler``: the smallest ``factor`` (its peaks must stand above its dips)."""
INTERMITTENT_DIPS = (1.0, 1.3)
"""``intermittent_straggler``: the range of the compute factor of a step back between peaks."""
INTERMITTENT_PEAKS = (0.85, 1.2)
"""``intermittent_straggler``: its peaks' range, as multiples of ``factor``."""
INTERMITTENT_DIP_CHANCE = 0.8
"""``intermittent_straggler``: the chance that a peak is followed by a dip (else another peak);
a dip is always followed by a peak."""

HALTING_FAULTS = frozenset(
    {
        FaultType.NIC_DOWN,
        FaultType.GPU_XID,
        FaultType.ECC_ERROR,
        FaultType.CUDA_EXECUTION_ERROR,
        FaultType.GPU_EXECUTION_ERROR,
    }
)
"""Fail-stop faults that may end in a job halt (``halt_after_s``, see :class:`FaultType`)."""
