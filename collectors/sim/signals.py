"""Clean (noise-free) metric values from device-state fractions, and the step to reported ones.

Every GPU metric is the state-fraction-weighted mean of per-state levels (physics.py), so a
1 Hz sample averages the phases that overlap its second. Compute-state contributions scale
with the machine's load (last PP stage) and the job's intensity (evaluation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from collectors.sim import physics as ph
from collectors.sim.physics import SAMPLE_MODELS, State
from collectors.sim.timeline import Completed, RankPace, Timeline, step_seconds_of
from minder.core.metrics import METRICS

C = State.COMPUTE


@dataclass(frozen=True, slots=True)
class SignalInputs:
    """Everything the clean signals of a chunk's output range depend on.

    Shapes: ``T`` seconds, ``N`` machines, ``G`` GPUs, ``K`` NICs.
    """

    gpu_states: np.ndarray  # (T, N, G, N_STATES)
    host_states: np.ndarray  # (T, N, N_STATES): mean over the machine's GPUs
    boost: np.ndarray  # (T, N, 1): load x intensity - 1, applied to compute contributions
    clock: np.ndarray  # (T, N, G)
    power: np.ndarray  # (T, N, G) clean board power
    temperature: np.ndarray  # (T, N, G) clean temperature
    comm_factor: np.ndarray  # (T,)
    memory_extra: np.ndarray  # (N,) extra GPU memory of the machine (last stage)
    sample_end: np.ndarray  # (T, N) each machine's own time at the end of each interval
    rank_waits: np.ndarray  # (T, N, G) False for a rank the others wait for
    timeline: Timeline
    n_nics: int
    paces: tuple[RankPace, ...] = ()  # ranks slowed by stragglers


def gpu_power(
    gpu_states: np.ndarray,
    boost: np.ndarray,
    clock: np.ndarray,
    power_mult: np.ndarray,
    power_scale: np.ndarray,
) -> np.ndarray:
    """Clean board power, (T, N, G); a throttled GPU's compute draws about clock^1.2."""
    levels = ph.GPU_POWER_W
    compute = gpu_states[..., C] * levels[C]
    other = gpu_states @ levels - compute
    watts = (compute * (1.0 + boost) * clock**1.2 + other) * power_mult * power_scale
    return np.minimum(watts, ph.POWER_CAP_W)


def gpu_temperature(
    power_ext: np.ndarray, hot_ext: np.ndarray, temp_offset: np.ndarray, window: int
) -> np.ndarray:
    """Clean temperature of the last ``len - window`` seconds: the die follows an exponential
    average of the power (time constant THERMAL_TAU_S); a throttled GPU sits at its limit."""
    steps = power_ext.shape[0] - window
    weights = np.exp(-np.arange(window) / ph.THERMAL_TAU_S)
    weights /= weights.sum()
    drive = np.zeros((steps, *power_ext.shape[1:]))
    heat = np.zeros_like(drive)
    for lag, weight in enumerate(weights):
        drive += weight * power_ext[window - lag : window - lag + steps]
        heat += weight * hot_ext[window - lag : window - lag + steps]
    normal = ph.TEMP_AMBIENT_C + ph.TEMP_PER_WATT * drive + temp_offset
    return (1.0 - heat) * normal + heat * (ph.THROTTLE_TEMP_C + 3.0)


def _scaled(inputs: SignalInputs, levels: np.ndarray) -> np.ndarray:
    states = inputs.gpu_states
    return states @ levels + states[..., C] * levels[C] * inputs.boost


def _gpu(levels: np.ndarray, scaled: bool = False) -> Callable[[SignalInputs], np.ndarray]:
    if scaled:
        return lambda inputs: _scaled(inputs, levels)
    return lambda inputs: inputs.gpu_states @ levels


def _gpu_const(value: float) -> Callable[[SignalInputs], np.ndarray]:
    return lambda inputs: np.full(inputs.clock.shape, value)


def _host(levels: np.ndarray) -> Callable[[SignalInputs], np.ndarray]:
    return lambda inputs: (inputs.host_states @ levels)[:, :, None]


def _nic(values: Callable[[SignalInputs], np.ndarray]) -> Callable[[SignalInputs], np.ndarray]:
    def per_port(inputs: SignalInputs) -> np.ndarray:
        per_machine = values(inputs)
        shape = (*per_machine.shape, inputs.n_nics)
        return np.ascontiguousarray(np.broadcast_to(per_machine[:, :, None], shape))

    return per_port


def _nic_const(value: float) -> Callable[[SignalInputs], np.ndarray]:
    def per_port(inputs: SignalInputs) -> np.ndarray:
        return np.full((*inputs.sample_end.shape, inputs.n_nics), value)

    return per_port


def _rdma_bytes(inputs: SignalInputs) -> np.ndarray:
    # The same bytes a step: slower communication is lower throughput.
    states = inputs.host_states
    slow = 1.0 / inputs.comm_factor[:, None] - 1.0
    return states @ ph.RDMA_BYTES + states[..., State.COMM] * ph.RDMA_BYTES[State.COMM] * slow


def _xmit_wait(inputs: SignalInputs) -> np.ndarray:
    states = inputs.host_states
    congestion = inputs.comm_factor[:, None] - 1.0
    return states @ ph.XMIT_WAIT + states[..., State.COMM] * ph.XMIT_WAIT[State.COMM] * congestion


def _gpu_memory(inputs: SignalInputs) -> np.ndarray:
    off = inputs.gpu_states[..., State.OFF]
    alive = ph.GPU_MEMORY_ALIVE_B + inputs.memory_extra[None, :, None]
    return (1.0 - off) * alive + off * ph.GPU_MEMORY_OFF_B


def _throttle_reasons(inputs: SignalInputs) -> np.ndarray:
    states = inputs.gpu_states
    idle = (
        states[..., State.CHECKPOINT]
        + states[..., State.DATA_WAIT]
        + states[..., State.OFF]
        + states[..., State.HOST]
    )
    return np.where(idle > 0.5, float(ph.THROTTLE_REASON_IDLE), 0.0)


def _per_rank(per_machine: np.ndarray, inputs: SignalInputs) -> np.ndarray:
    """``(T, N)`` values as ``(T, N, G)``, one per rank."""
    return np.ascontiguousarray(np.broadcast_to(per_machine[:, :, None], inputs.clock.shape))


def _fill(out: np.ndarray, cells: np.ndarray, per_machine: np.ndarray) -> None:
    """Set the ranks ``cells`` (``(N, G)``) of ``out`` to their machine's ``(T, N)`` value."""
    machines, ranks = np.nonzero(cells)
    out[:, machines, ranks] = per_machine[:, machines]


def _step_seconds(inputs: SignalInputs) -> np.ndarray:
    step = inputs.timeline.step_seconds(inputs.sample_end)
    out = _per_rank(step, inputs)
    for pace in inputs.paces:
        if not pace.shared:  # asynchronous: the slow ranks' own, longer steps
            nominal = inputs.timeline.nominal_step_s
            own = step_seconds_of(pace.start, pace.end, nominal, inputs.sample_end)
            _fill(out, pace.cells, own)
    return out


def _busy_seconds(inputs: SignalInputs) -> np.ndarray:
    """Mean busy time of the steps completed in each interval (held when none was): compute,
    and for a rank the others wait for (a hot GPU) its time in the wait phase too."""
    timeline, t = inputs.timeline, inputs.sample_end
    completed = Completed(timeline.it_end)
    # The host-bound phase is busy time too (no collective); zeros without host_fraction.
    compute = completed.interval_mean(timeline.it_host + timeline.it_compute, t)
    through_wait = completed.interval_mean(
        timeline.it_host + timeline.it_compute + timeline.it_wait, t
    )
    out = np.where(inputs.rank_waits, compute[:, :, None], through_wait[:, :, None])
    for pace in inputs.paces:
        _fill(out, pace.cells, pace.completed.interval_mean(timeline.it_host + pace.busy, t))
    return out


def _step_number(inputs: SignalInputs) -> np.ndarray:
    """Index of the last step completed, counted from the job's first (before the scenario)."""
    t = inputs.sample_end
    number = np.maximum(Completed(inputs.timeline.it_end).count(t) - 1, 0).astype(np.float64)
    out = _per_rank(number, inputs)
    for pace in inputs.paces:
        if not pace.shared:  # asynchronous: the slow ranks fall behind
            own = np.maximum(pace.completed.count(t) - 1, 0).astype(np.float64)
            _fill(out, pace.cells, own)
    return out


def _collective_seconds(inputs: SignalInputs) -> np.ndarray:
    timeline, t = inputs.timeline, inputs.sample_end
    out = timeline.collective_seconds(t[:, :, None], inputs.rank_waits)
    for pace in inputs.paces:
        if pace.shared:
            # The job's collective with its wait, less the part of the wait this rank spent
            # computing (all of it for the slowest rank).
            completed = pace.completed
            with_wait = timeline.collective_seconds(t, np.ones(t.shape, dtype=bool))
            extra = completed.last(pace.busy - timeline.it_compute, t)
            _fill(out, pace.cells, np.maximum(with_wait - extra, 0.0))
        else:
            _fill(out, pace.cells, pace.completed.last(pace.collective, t))
    return out


def _busbw(inputs: SignalInputs) -> np.ndarray:
    seconds = np.maximum(_collective_seconds(inputs), 1e-3)
    return ph.NCCL_BUSBW_NOMINAL * inputs.timeline.nominal_comm_s / seconds


CLEAN: dict[str, Callable[[SignalInputs], np.ndarray]] = {
    "gpu_util_ratio": _gpu(ph.GPU_UTIL),
    "gpu_sm_active_ratio": _gpu(ph.GPU_SM_ACTIVE, scaled=True),
    "gpu_tensor_active_ratio": _gpu(ph.GPU_TENSOR_ACTIVE, scaled=True),
    "gpu_gr_engine_active_ratio": _gpu(ph.GPU_GR_ENGINE),
    "gpu_dram_active_ratio": _gpu(ph.GPU_DRAM_ACTIVE, scaled=True),
    "gpu_power_watts": lambda inputs: inputs.power.copy(),
    "gpu_temperature_celsius": lambda inputs: inputs.temperature.copy(),
    "gpu_sm_clock_hertz": lambda inputs: (inputs.gpu_states @ ph.GPU_SM_CLOCK_HZ) * inputs.clock,
    "gpu_memory_used_bytes": _gpu_memory,
    "gpu_pcie_tx_bytes_per_second": _gpu(ph.GPU_PCIE_TX),
    "gpu_pcie_rx_bytes_per_second": _gpu(ph.GPU_PCIE_RX),
    "gpu_pcie_link_gen": _gpu_const(5.0),
    "gpu_pcie_link_width": _gpu_const(16.0),
    "gpu_pcie_replay_count": _gpu_const(0.0),
    "gpu_nvlink_tx_bytes_per_second": _gpu(ph.GPU_NVLINK),
    "gpu_nvlink_rx_bytes_per_second": _gpu(ph.GPU_NVLINK),
    "gpu_nvlink_error_count": _gpu_const(0.0),
    "gpu_ecc_sbe_count": _gpu_const(0.0),
    "gpu_ecc_dbe_count": _gpu_const(0.0),
    "gpu_xid_count": _gpu_const(0.0),
    "gpu_throttle_reasons": _throttle_reasons,
    "rdma_tx_bytes_per_second": _nic(_rdma_bytes),
    "rdma_rx_bytes_per_second": _nic(_rdma_bytes),
    "rdma_xmit_wait_per_second": _nic(_xmit_wait),
    "rdma_cnp_sent_per_second": _nic(lambda inputs: inputs.host_states @ ph.CNP),
    "rdma_cnp_handled_per_second": _nic(lambda inputs: inputs.host_states @ ph.CNP),
    "rdma_link_downed_count": _nic_const(0.0),
    "rdma_symbol_error_count": _nic_const(0.0),
    "rdma_port_up": _nic_const(1.0),
    "pfc_tx_pause_per_second": _nic(lambda inputs: inputs.host_states @ ph.PFC_TX),
    "pfc_rx_pause_per_second": _nic(lambda inputs: inputs.host_states @ ph.PFC_RX),
    "cpu_util_ratio": _host(ph.CPU_UTIL),
    "memory_used_bytes": _host(ph.HOST_MEMORY_B),
    "disk_read_bytes_per_second": _host(ph.DISK_READ),
    "disk_write_bytes_per_second": _host(ph.DISK_WRITE),
    "net_tx_bytes_per_second": _host(ph.NET_TX),
    "net_rx_bytes_per_second": _host(ph.NET_RX),
    "train_step_seconds": _step_seconds,
    "nccl_collective_seconds": _collective_seconds,
    "nccl_busbw_bytes_per_second": _busbw,
    "train_busy_seconds": _busy_seconds,
    "train_step_number": _step_number,
}
"""Metric → its clean values, (T, N, devices); host metrics (T, N, 1)."""


def clean_signals(metrics: tuple[str, ...], inputs: SignalInputs) -> dict[str, np.ndarray]:
    """Clean values of ``metrics`` (only those are computed)."""
    return {name: CLEAN[name](inputs) for name in metrics}


def reported(name: str, clean: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    """Add the metric's noise, clip to its physical range, round to its resolution."""
    model = SAMPLE_MODELS[name]
    spec = METRICS[name]
    if model.poisson:
        rate = np.maximum(clean, 0.0)
        values = rng.poisson(rate).astype(np.float64) if noise > 0 else np.round(rate)
    elif noise > 0 and (model.rel or model.add):
        spread = noise * (model.rel * np.abs(clean) + model.add)
        values = clean + spread * rng.standard_normal(clean.shape, dtype=np.float32)
    else:
        values = clean
    values = np.clip(values, spec.lower, spec.upper)
    if model.resolution:
        values = np.round(values / model.resolution) * model.resolution
        values = np.clip(values, spec.lower, spec.upper)
    return values
