"""How each fault and confounder shows up: on the job's rhythm, device states, signals, events.

Signatures follow docs/detection-method.md §3 (what production faults looked like in the paper's
Table 1 data) and how NVIDIA drivers, NCCL and RDMA NICs behave:

* a dead training process (XID, ECC, CUDA error) leaves its GPUs idle and its CPU quiet, while
  the rest of the job spins in NCCL (duty cycle high, tensor activity and power low);
* a fail-slow device (PCIe downgrade, NVLink errors, bad cable, hot GPU) slows every step of
  the whole job, and shows on its own machine in the device's counters;
* silence (an unreachable machine, a rebooting switch, a restarting agent) means no batch at
  all;
* a straggler (a slow worker, stage or group of machines) computes longer each step: in a
  synchronous job the whole job's steps last as long as its compute plus the communication,
  while its peers wait for it in the collective (their GPUs spin); in an asynchronous job only
  its own steps are longer (``collectors/sim/timeline.py``, :class:`RankPace`);
* a fail-stop fault with ``halt_after_s`` ends in a job halt: from then on every machine's
  training process is gone (every GPU idles alike) and the job makes no progress;
* a machine out of the job (a late joiner before it joins, a machine scaled down, restarting
  in a rolling restart, or at the job's end) sends no samples either; one that leaves cleanly
  sends a last batch with only a ``leave`` event (its agent's goodbye).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from collectors.sim.contexts import Injection, PlannedEvent, SignalContext, StateContext
from collectors.sim.kinds import MEMBERSHIP_CONFOUNDERS, STRAGGLER_FAULTS
from collectors.sim.physics import (
    THROTTLE_REASON_THERMAL,
    Phase,
    State,
    pcie_bandwidth_ratio,
)
from collectors.sim.scenario import ConfounderType, FaultSpec, FaultType, JobSpec
from collectors.sim.timeline import JobEffects, RankSlowdown
from minder.core.records import EventKind

DEFAULT_XID = 119
"""XID of a generic ``gpu_xid``: GSP RPC timeout, a common fatal XID on H100 nodes."""
XID_DBE = 48
XID_FELL_OFF_BUS = 79
GOODBYE_MESSAGE = "agent stopped: SIGTERM"
"""Message of the ``leave`` event a cleanly stopped agent sends (minder.agent.runner)."""
PCIE_GEN5_X16_BYTES = 64e9
FLAP_S = 2

_DIES_AFTER_XID = frozenset({FaultType.GPU_XID, FaultType.ECC_ERROR, FaultType.GPU_LOST})
_STALLS_JOB = frozenset(
    {
        FaultType.GPU_XID,
        FaultType.ECC_ERROR,
        FaultType.GPU_LOST,
        FaultType.CUDA_EXECUTION_ERROR,
        FaultType.GPU_EXECUTION_ERROR,
        FaultType.MACHINE_UNREACHABLE,
        FaultType.SWITCH_REBOOT,
    }
)


def _cells(
    mask: np.ndarray, machines: Sequence[int], devices: Sequence[int]
) -> tuple[np.ndarray, ...]:
    """Open-mesh index of (seconds where ``mask``) x machines x devices."""
    return np.ix_(np.flatnonzero(mask), _ints(machines), _ints(devices))


def _rows(mask: np.ndarray, machines: Sequence[int]) -> tuple[np.ndarray, ...]:
    """Open-mesh index of (seconds where ``mask``) x machines."""
    return np.ix_(np.flatnonzero(mask), _ints(machines))


def _ints(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.intp)


def _fault(injection: Injection) -> FaultSpec:
    assert isinstance(injection.spec, FaultSpec)
    return injection.spec


def throttle_clock(severity: float) -> float:
    """SM clock factor of a thermally throttled GPU."""
    return max(0.3, 1.0 - 0.35 * severity)


def pcie_link(injection: Injection) -> tuple[int, int]:
    """``(width, gen)`` of a downgraded link (default x8 at gen5; a gen alone keeps x16)."""
    spec = _fault(injection)
    default_width = 16 if spec.link_gen is not None else 8
    width = spec.link_width if spec.link_width is not None else default_width
    return width, spec.link_gen if spec.link_gen is not None else 5


def pcie_ratio(injection: Injection) -> float:
    """Bandwidth of the downgraded link relative to gen5 x16."""
    return pcie_bandwidth_ratio(*pcie_link(injection))


def slow_seconds(injection: Injection, seconds: np.ndarray) -> np.ndarray:
    """True for the intervals ``[s, s+1)`` overlapping one of the injection's slow spans."""
    out = np.zeros(seconds.shape, dtype=bool)
    for start, end in injection.target.slow_spans:
        out |= (seconds + 1 > start) & (seconds < end)
    return out


def straggler_slowdown(injection: Injection, job: JobSpec) -> float:
    """The slowdown S a straggler causes while it is slow, from the job's nominal rhythm.

    S is the step time observed over the step time had the slow ranks' compute been the mean
    of every rank's (the balanced reference): with compute ``c`` and communication ``m`` of
    the nominal step, ``factor`` f and a fraction ``k`` of the job's ranks slowed,
    ``S = (c f + m) / (c (1 + k (f - 1)) + m)`` in a synchronous job, the whole job's
    slowdown. In an asynchronous one each rank keeps its own pace: the job's throughput falls by
    the slow ranks' share of it, ``S = 1 / (1 - k (1 - 1 / s))`` with ``s = (c f + m) / (c + m)``
    their own slowdown. 1.0 for other injections.
    """
    if injection.kind not in STRAGGLER_FAULTS:
        return 1.0
    target = injection.target
    factor = injection.spec.factor_in_effect
    if target.step_factors:  # an intermittent straggler: the mean of its steps' factors
        factor = _mean_step_factor(injection, job)
    share = len(target.machines) * len(target.ranks) / (job.machines * job.gpus_per_machine)
    compute = job.step_time_s * (1.0 - job.comm_fraction)
    comm = job.step_time_s * job.comm_fraction
    if not job.sync:
        own = (compute * factor + comm) / (compute + comm)
        return 1.0 / (1.0 - share * (1.0 - 1.0 / own))
    return (compute * factor + comm) / (compute * (1.0 + share * (factor - 1.0)) + comm)


def _mean_step_factor(injection: Injection, job: JobSpec) -> float:
    """Mean compute factor of the steps an intermittent straggler's slow span holds, from the
    job's nominal rhythm (each step takes its compute times its factor, plus the rest)."""
    target = injection.target
    factors = target.step_factors
    compute = job.step_time_s * (1.0 - job.comm_fraction - job.host_fraction)
    rest = job.step_time_s - compute
    span = target.end_s - target.start_s
    elapsed, taken = 0.0, 0
    while elapsed < span and taken < 100_000:
        elapsed += compute * factors[taken % len(factors)] + rest
        taken += 1
    return float(np.mean([factors[k % len(factors)] for k in range(max(taken, 1))]))


def add_job_effects(injection: Injection, job: JobSpec, effects: JobEffects) -> None:
    """Record the injection's effect on the whole job's rhythm."""
    start = injection.target.start_s
    # An effect that does not clear lasts past the scenario's end, so that the last seconds
    # do not show the job resuming.
    end = injection.target.end_s if injection.target.clears else math.inf
    severity = injection.severity
    if injection.target.halts:  # the job never makes progress again
        effects.stalls.append((injection.target.end_s, math.inf))
    match injection.kind:
        case kind if kind in _STALLS_JOB:
            effects.stalls.append((start, end))
        case FaultType.NIC_DOWN if injection.target.halts:
            # The collective hangs on the lost rail until the watchdog tears the job down.
            effects.stalls.append((start, end))
        case FaultType.NIC_DOWN if len(injection.target.nics) == job.nics_per_machine:
            effects.stalls.append((start, end))
        case FaultType.NIC_DOWN:
            effects.comm_factors.append((start, end, 1.0 + 0.8 * severity))
        case FaultType.PCIE_DOWNGRADE:
            slow = 1.0 + 1.2 * (1.0 - pcie_ratio(injection)) * severity
            effects.comm_factors.append((start, end, slow))
        case FaultType.AOC_ERROR:
            effects.comm_factors.append((start, end, 1.0 + 0.1 * severity))
        case FaultType.NVLINK_ERROR:
            effects.comm_factors.append((start, end, 1.0 + 0.15 * severity))
        case FaultType.THERMAL_THROTTLE:
            effects.stretches.append((start, end, 1.0 / throttle_clock(severity)))
        case FaultType.HDFS_ERROR:
            effects.data_waits.append((start, end, 2.0 * severity * job.step_time_s))
        case ConfounderType.EVAL_PHASE:
            effects.evals.append((start, end))
        case kind if kind in STRAGGLER_FAULTS:
            target = injection.target
            factor = injection.spec.factor_in_effect
            steps = target.step_factors
            if job.sync and steps:  # everyone waits for the slow ranks, step by step
                effects.step_stretches.extend((s, e, steps) for s, e in target.slow_spans)
            elif job.sync:  # everyone waits for the slow ranks each step
                effects.stretches.extend((s, e, factor) for s, e in target.slow_spans)
            effects.rank_slowdowns.append(
                RankSlowdown(target.machines, target.ranks, target.slow_spans, factor, steps)
            )
        case ConfounderType.JOB_WIDE_SLOWDOWN:
            factor = injection.spec.factor_in_effect
            effects.compute_factors.extend((s, e, factor) for s, e in injection.target.slow_spans)
        case _:
            pass


def apply_states(injection: Injection, ctx: StateContext) -> None:
    """Change device states and power/clock modifiers (extended range of a chunk)."""
    target = injection.target
    machines = list(target.machines)
    if target.halts:  # every machine's training process exits with the job
        ctx.dead[ctx.seconds + 1 > target.end_s] = True
    match injection.kind:
        case kind if kind in _DIES_AFTER_XID:
            ctx.dead[_rows(injection.active(ctx.seconds, 1), machines)] = True
        case FaultType.CUDA_EXECUTION_ERROR:
            ctx.dead[_rows(injection.active(ctx.seconds), machines)] = True
        case FaultType.GPU_EXECUTION_ERROR:
            ctx.state_map[_cells(injection.active(ctx.seconds), machines, target.gpus)] = State.HUNG
        case FaultType.THERMAL_THROTTLE:
            cells = _cells(injection.active(ctx.seconds), machines, target.gpus)
            # The hot GPU computes through the time its peers spend waiting for it.
            ctx.state_map[..., Phase.WAIT][cells] = State.COMPUTE
            ctx.clock[cells] = throttle_clock(injection.severity)
            ctx.hot[cells] = 1.0
        case FaultType.HDFS_ERROR:
            gpus = list(range(ctx.state_map.shape[2]))
            cells = _cells(injection.active(ctx.seconds), machines, gpus)
            ctx.state_map[..., Phase.WAIT][cells] = State.DATA_WAIT
        case ConfounderType.BLIP:
            gpus = list(range(ctx.power_scale.shape[2]))
            cells = _cells(injection.active(ctx.seconds), machines, gpus)
            ctx.power_scale[cells] *= 1.0 - 0.25 * min(injection.severity, 2.0)
        case kind if kind in STRAGGLER_FAULTS and ctx.sync:
            # The slow ranks compute through the time their peers wait for them (who spin).
            cells = _cells(slow_seconds(injection, ctx.seconds), machines, target.ranks)
            ctx.state_map[..., Phase.WAIT][cells] = State.COMPUTE
        case _:
            pass


def apply_signals(injection: Injection, ctx: SignalContext) -> None:
    """Change the clean signals of a chunk's output range."""
    target = injection.target
    machines = list(target.machines)
    seconds = ctx.seconds
    act = injection.active(seconds)
    on = injection.onset(seconds)
    severity = injection.severity
    rng = ctx.rng
    all_nics = list(range(ctx.n_nics))
    match injection.kind:
        case FaultType.GPU_XID:
            ctx.set("gpu_xid_count", _cells(on, machines, target.gpus), 1.0)
        case FaultType.ECC_ERROR:
            ctx.set("gpu_xid_count", _cells(on, machines, target.gpus), 1.0)
            ctx.set("gpu_ecc_dbe_count", _cells(on, machines, target.gpus), 1.0)
            ctx.set("gpu_ecc_sbe_count", _cells(on, machines, target.gpus), 2.0)
        case FaultType.GPU_LOST:
            ctx.set("gpu_xid_count", _cells(on, machines, target.gpus), 1.0)
            ctx.gpu_absent[_cells(injection.active(seconds, 1), machines, target.gpus)] = True
        case FaultType.NIC_DOWN:
            _port_down(ctx, act, on, machines, list(target.nics))
        case FaultType.SWITCH_REBOOT:
            _port_down(ctx, act, on, machines, all_nics)
            if _fault(injection).silent:
                ctx.silent[_rows(act, machines)] = True
        case FaultType.MACHINE_UNREACHABLE:
            ctx.silent[_rows(act, machines)] = True
        case FaultType.PCIE_DOWNGRADE:
            _pcie_downgrade(injection, ctx, act, machines)
        case FaultType.NVLINK_ERROR:
            cells = _cells(act, machines, target.gpus)
            shape = (int(act.sum()), len(machines), len(target.gpus))
            ctx.set("gpu_nvlink_error_count", cells, rng.poisson(4.0 * severity, shape))
            for metric in ("gpu_nvlink_tx_bytes_per_second", "gpu_nvlink_rx_bytes_per_second"):
                ctx.scale(metric, cells, 1.0 - 0.5 * min(severity, 1.0))
        case FaultType.THERMAL_THROTTLE:
            ctx.set("gpu_throttle_reasons", _cells(act, machines, target.gpus),
                    float(THROTTLE_REASON_THERMAL))  # fmt: skip
        case FaultType.AOC_ERROR:
            nics = list(target.nics)
            cells = _cells(act, machines, nics)
            shape = (int(act.sum()), len(machines), len(nics))
            ctx.set("rdma_symbol_error_count", cells, rng.poisson(40.0 * severity, shape))
            ctx.add("pfc_tx_pause_per_second", cells, 800.0 * severity)
            for flap in injection.flaps:
                down = (seconds >= np.floor(flap)) & (seconds < np.floor(flap) + FLAP_S)
                _port_down(ctx, down, seconds == np.floor(flap), machines, nics)
        case FaultType.HDFS_ERROR:
            ctx.scale("net_rx_bytes_per_second", _cells(act, machines, [0]), 0.15)
        case ConfounderType.BLIP:
            ctx.add("cpu_util_ratio", _cells(act, machines, [0]), 0.35 * severity)
            ctx.add("pfc_tx_pause_per_second", _cells(act, machines, all_nics), 1500.0 * severity)
        case ConfounderType.AGENT_RESTART:
            ctx.silent[_rows(act, machines)] = True
            # The first interval after the restart has no previous counter reading to take a
            # difference from: the agent sends its levels and counts but no rates.
            back = seconds == math.ceil(target.end_s)
            ctx.rates_absent[_rows(back, machines)] = True
        case kind if kind in MEMBERSHIP_CONFOUNDERS:
            _membership(injection, ctx)
        case _:
            pass


def _membership(injection: Injection, ctx: SignalContext) -> None:
    """Machines out of the job send nothing; one (re)joining sends no rate in its first second
    (its agent has no previous counter reading yet)."""
    seconds = ctx.seconds
    for machine, (leave, back) in zip(
        injection.target.machines, injection.target.away, strict=True
    ):
        ctx.away[(seconds + 1 > leave) & (seconds < back), machine] = True
        if math.isfinite(back):
            ctx.rates_absent[seconds == math.ceil(back), machine] = True


def _port_down(
    ctx: SignalContext, down: np.ndarray, onset: np.ndarray, machines: list[int], nics: list[int]
) -> None:
    cells = _cells(down, machines, nics)
    ctx.set("rdma_port_up", cells, 0.0)
    for metric in (
        "rdma_tx_bytes_per_second",
        "rdma_rx_bytes_per_second",
        "rdma_xmit_wait_per_second",
        "rdma_cnp_sent_per_second",
        "rdma_cnp_handled_per_second",
        "pfc_tx_pause_per_second",
        "pfc_rx_pause_per_second",
    ):
        ctx.set(metric, cells, 0.0)
    ctx.set("rdma_link_downed_count", _cells(onset & down, machines, nics), 1.0)


def _pcie_downgrade(
    injection: Injection, ctx: SignalContext, act: np.ndarray, machines: list[int]
) -> None:
    gpus = list(injection.target.gpus)
    width, gen = pcie_link(injection)
    ratio = pcie_bandwidth_ratio(width, gen)
    severity = injection.severity
    gpu_cells = _cells(act, machines, gpus)
    ctx.set("gpu_pcie_link_width", gpu_cells, float(width))
    ctx.set("gpu_pcie_link_gen", gpu_cells, float(gen))
    shape = (int(act.sum()), len(machines), len(gpus))
    ctx.set("gpu_pcie_replay_count", gpu_cells, ctx.rng.poisson(2.0 * severity, shape))
    cap = 0.8 * ratio * PCIE_GEN5_X16_BYTES
    for metric in ("gpu_pcie_tx_bytes_per_second", "gpu_pcie_rx_bytes_per_second"):
        array = ctx.values.get(metric)
        if array is not None:
            array[gpu_cells] = np.minimum(array[gpu_cells], cap)
    # The NIC cannot DMA into the slow GPU fast enough: its buffers fill and it pauses the
    # switch (PFC), hardest on the port that serves that GPU.
    attached = sorted({int(ctx.nic_of_gpu[g]) for g in gpus})
    comm = ctx.phases[..., Phase.COMM][_rows(act, machines)]  # (a, m)
    surge = 3e4 * (1.0 - ratio) * severity * (0.3 + 0.7 * comm)[:, :, None]
    for nic in range(ctx.n_nics):
        share = 1.0 if nic in attached else 0.25
        cells = _cells(act, machines, [nic])
        ctx.add("pfc_tx_pause_per_second", cells, share * surge)
        ctx.add("rdma_xmit_wait_per_second", cells, share * surge * 20.0)
        if nic in attached:
            ctx.add("rdma_cnp_sent_per_second", cells, 0.1 * surge)
            for metric in ("rdma_tx_bytes_per_second", "rdma_rx_bytes_per_second"):
                ctx.scale(metric, cells, 0.6 + 0.4 * ratio)


def planned_events(
    injection: Injection, gpu_names: tuple[str, ...], nic_names: tuple[str, ...]
) -> list[PlannedEvent]:
    """The hard-fault events the node agent would report for ``injection``."""
    target = injection.target
    start = target.start_s
    out: list[PlannedEvent] = []

    def emit(
        kind: EventKind, device: str, at: float, code: int | None = None, text: str = ""
    ) -> None:
        for machine in target.machines:
            out.append(PlannedEvent(at, machine, kind, device, code, text))

    match injection.kind:
        case FaultType.GPU_XID:
            code = _fault(injection).xid_code or DEFAULT_XID
            for g in target.gpus:
                emit(EventKind.XID, gpu_names[g], start, code)
        case FaultType.ECC_ERROR:
            for g in target.gpus:
                emit(EventKind.ECC, gpu_names[g], start, None, "uncorrectable ECC error")
                emit(EventKind.XID, gpu_names[g], start, XID_DBE)
        case FaultType.GPU_LOST:
            for g in target.gpus:
                emit(EventKind.XID, gpu_names[g], start, XID_FELL_OFF_BUS)
                emit(EventKind.GPU_LOST, gpu_names[g], start, None, "GPU has fallen off the bus")
        case FaultType.NVLINK_ERROR:
            for g in target.gpus:
                emit(EventKind.NVLINK_ERROR, gpu_names[g], start, None, "NVLink degraded")
        case FaultType.NIC_DOWN:
            for k in target.nics:
                emit(EventKind.LINK_DOWN, nic_names[k], start)
        case FaultType.SWITCH_REBOOT:
            for name in nic_names:
                emit(EventKind.LINK_DOWN, name, start)
        case FaultType.AOC_ERROR:
            for flap in injection.flaps:
                for k in target.nics:
                    emit(EventKind.LINK_DOWN, nic_names[k], flap)
        case kind if kind in MEMBERSHIP_CONFOUNDERS and target.goodbye:
            # The goodbye: each machine's own, at the time it leaves.
            for machine, (leave, _back) in zip(target.machines, target.away, strict=True):
                if math.isfinite(leave):
                    out.append(
                        PlannedEvent(leave, machine, EventKind.LEAVE, "", None, GOODBYE_MESSAGE)
                    )
        case _:
            pass
    return out
