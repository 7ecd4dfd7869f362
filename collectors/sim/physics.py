"""The numbers of the simulated machines: phases, device states, levels, noise, resolution.

Figures are those of an 8x H100 SXM node with four 400 Gb/s RDMA NICs (one per two GPUs):
board power 700 W cap, ~660 W in dense compute, ~70 W idle without a process; SM clock
1.98 GHz boost; NVLink 4 up to 450 GB/s a direction; PCIe gen5 x16 64 GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Phase(IntEnum):
    """What the job as a whole is doing (all machines in step)."""

    COMPUTE = 0
    """Forward/backward kernels (tensor-parallel traffic on NVLink overlaps)."""
    WAIT = 1
    """Healthy ranks wait in a collective for a slow or dead one (a stall is a long WAIT)."""
    COMM = 2
    """Gradient all-reduce / pipeline transfers over RDMA and NVLink."""
    CHECKPOINT = 3
    """Checkpoint save: GPUs idle, state copied to host, written to disk and storage."""
    HOST = 4
    """Host-bound part of a step (``JobSpec.host_fraction``): the next batch is prepared and
    copied in, an offloaded optimiser runs on the CPU; the GPUs wait with little to do."""


N_PHASES = len(Phase)


class State(IntEnum):
    """What one GPU (and through the mean of its GPUs, its host) is doing."""

    COMPUTE = 0
    COMM = 1
    SPIN = 2
    """NCCL kernel polling for peers: duty cycle high, few SMs, no tensor work."""
    CHECKPOINT = 3
    DATA_WAIT = 4
    """Process alive but starved of input: GPU idle, CPU and network receive low."""
    OFF = 5
    """No training process (it died): idle GPU, memory freed."""
    HUNG = 6
    """A kernel that never finishes: duty cycle and SM activity high, no tensor work."""
    HOST = 7
    """The host-bound phase of a step: a few small kernels and copies, the CPU busy."""


N_STATES = len(State)

DEFAULT_STATE_OF_PHASE = np.array(
    [State.COMPUTE, State.SPIN, State.COMM, State.CHECKPOINT, State.HOST], dtype=np.int8
)
"""The state a healthy GPU is in during each :class:`Phase`."""


def _levels(**by_state: float) -> np.ndarray:
    return np.array([by_state[s.name.lower()] for s in State], dtype=np.float64)


# Per-state means, indexed by State. COMPUTE entries of the "load-scaled" ones are scaled by the
# machine's load (last PP stage) and the job's intensity (eval phase) in signals.py.
GPU_UTIL = _levels(compute=0.99, comm=0.97, spin=0.99, checkpoint=0.03, data_wait=0.02, off=0.0,
                   hung=1.0, host=0.2)  # fmt: skip
GPU_SM_ACTIVE = _levels(compute=0.84, comm=0.30, spin=0.04, checkpoint=0.01, data_wait=0.0,
                        off=0.0, hung=0.92, host=0.05)  # fmt: skip
GPU_TENSOR_ACTIVE = _levels(compute=0.56, comm=0.03, spin=0.0, checkpoint=0.0, data_wait=0.0,
                            off=0.0, hung=0.0, host=0.0)  # fmt: skip
GPU_GR_ENGINE = _levels(compute=0.99, comm=0.97, spin=0.99, checkpoint=0.03, data_wait=0.02,
                        off=0.0, hung=1.0, host=0.2)  # fmt: skip
GPU_DRAM_ACTIVE = _levels(compute=0.46, comm=0.22, spin=0.01, checkpoint=0.05, data_wait=0.0,
                          off=0.0, hung=0.03, host=0.03)  # fmt: skip
GPU_POWER_W = _levels(compute=655.0, comm=330.0, spin=185.0, checkpoint=125.0, data_wait=115.0,
                      off=72.0, hung=255.0, host=160.0)  # fmt: skip
GPU_SM_CLOCK_HZ = _levels(compute=1.92e9, comm=1.98e9, spin=1.98e9, checkpoint=1.755e9,
                          data_wait=1.755e9, off=0.345e9, hung=1.98e9, host=1.98e9)  # fmt: skip
GPU_PCIE_TX = _levels(compute=0.3e9, comm=20e9, spin=0.05e9, checkpoint=9e9, data_wait=0.01e9,
                      off=0.0, hung=0.0, host=2e9)  # fmt: skip
GPU_PCIE_RX = _levels(compute=1.5e9, comm=20e9, spin=0.05e9, checkpoint=0.2e9, data_wait=0.01e9,
                      off=0.0, hung=0.0, host=8e9)  # fmt: skip
GPU_NVLINK = _levels(compute=90e9, comm=160e9, spin=0.5e9, checkpoint=0.0, data_wait=0.0,
                     off=0.0, hung=0.0, host=25e9)  # fmt: skip
GPU_MEMORY_ALIVE_B = 71.5 * 2**30
GPU_MEMORY_OFF_B = 0.5 * 2**30
GPU_MEMORY_LAST_STAGE_B = 4.0 * 2**30
POWER_CAP_W = 700.0
TEMP_AMBIENT_C = 36.0
TEMP_PER_WATT = 0.06
THROTTLE_TEMP_C = 90.0
THROTTLE_REASON_IDLE = 0x1
THROTTLE_REASON_THERMAL = 0x20 | 0x40  # SW + HW thermal slowdown

# NIC, per port, indexed by State (the mean over the machine's GPUs).
RDMA_BYTES = _levels(compute=3.0e9, comm=38e9, spin=0.0, checkpoint=0.0, data_wait=0.0, off=0.0,
                     hung=0.0, host=0.5e9)  # fmt: skip
PFC_TX = _levels(compute=3.0, comm=25.0, spin=0.5, checkpoint=0.5, data_wait=0.5, off=0.0,
                 hung=0.5, host=0.5)  # fmt: skip
PFC_RX = _levels(compute=2.0, comm=15.0, spin=0.5, checkpoint=0.5, data_wait=0.5, off=0.0,
                 hung=0.5, host=0.5)  # fmt: skip
XMIT_WAIT = _levels(compute=2e4, comm=4e5, spin=0.0, checkpoint=0.0, data_wait=0.0, off=0.0,
                    hung=0.0, host=0.0)  # fmt: skip
CNP = _levels(compute=4.0, comm=40.0, spin=0.0, checkpoint=0.0, data_wait=0.0, off=0.0,
              hung=0.0, host=0.0)  # fmt: skip

# Host, indexed by State.
CPU_UTIL = _levels(compute=0.32, comm=0.27, spin=0.24, checkpoint=0.46, data_wait=0.05,
                   off=0.015, hung=0.22, host=0.7)  # fmt: skip
HOST_MEMORY_B = _levels(compute=420 * 2**30, comm=420 * 2**30, spin=420 * 2**30,
                        checkpoint=480 * 2**30, data_wait=420 * 2**30, off=36 * 2**30,
                        hung=420 * 2**30, host=440 * 2**30)  # fmt: skip
DISK_READ = _levels(compute=40e6, comm=20e6, spin=2e6, checkpoint=5e6, data_wait=1e6, off=0.2e6,
                    hung=1e6, host=400e6)  # fmt: skip
DISK_WRITE = _levels(compute=3e6, comm=3e6, spin=2e6, checkpoint=1.6e9, data_wait=1e6, off=0.1e6,
                     hung=2e6, host=3e6)  # fmt: skip
NET_TX = _levels(compute=12e6, comm=10e6, spin=4e6, checkpoint=1.1e9, data_wait=3e6, off=0.05e6,
                 hung=4e6, host=15e6)  # fmt: skip
NET_RX = _levels(compute=240e6, comm=120e6, spin=15e6, checkpoint=10e6, data_wait=4e6, off=0.05e6,
                 hung=10e6, host=600e6)  # fmt: skip

NCCL_BUSBW_NOMINAL = 160e9
"""Bus bandwidth of a collective that takes the nominal communication time."""

STEP_JITTER = 0.01
"""Relative sd of a step's phase lengths at noise 1 (the whole job's, not one machine's)."""
MACHINE_SKEW_S = 0.08
"""Machines see the job's phases shifted by up to this many seconds (clock/launch skew)."""
THERMAL_WINDOW_S = 48
THERMAL_TAU_S = 12.0


@dataclass(frozen=True, slots=True)
class SampleModel:
    """How a clean value becomes a reported one.

    Attributes
    ----------
    rel, add
        Gaussian noise sd at ``noise`` 1: relative to the value, and absolute.
    poisson
        The clean value is an event rate; the sample is a Poisson draw of it.
    resolution
        The reported value is rounded to a multiple of this (0: not rounded).
    """

    rel: float = 0.0
    add: float = 0.0
    poisson: bool = False
    resolution: float = 0.0


MIB = float(2**20)

SAMPLE_MODELS: dict[str, SampleModel] = {
    "gpu_util_ratio": SampleModel(add=0.004, resolution=0.01),
    "gpu_sm_active_ratio": SampleModel(rel=0.01, add=0.005, resolution=1e-4),
    "gpu_tensor_active_ratio": SampleModel(rel=0.02, add=0.002, resolution=1e-4),
    "gpu_gr_engine_active_ratio": SampleModel(add=0.004, resolution=1e-4),
    "gpu_dram_active_ratio": SampleModel(rel=0.02, add=0.002, resolution=1e-4),
    "gpu_power_watts": SampleModel(rel=0.012, add=2.0, resolution=0.1),
    "gpu_temperature_celsius": SampleModel(add=0.4, resolution=1.0),
    "gpu_sm_clock_hertz": SampleModel(add=6e6, resolution=1e6),
    "gpu_memory_used_bytes": SampleModel(add=16 * MIB, resolution=MIB),
    "gpu_pcie_tx_bytes_per_second": SampleModel(rel=0.05, resolution=1e3),
    "gpu_pcie_rx_bytes_per_second": SampleModel(rel=0.05, resolution=1e3),
    "gpu_pcie_link_gen": SampleModel(),
    "gpu_pcie_link_width": SampleModel(),
    "gpu_pcie_replay_count": SampleModel(),
    "gpu_nvlink_tx_bytes_per_second": SampleModel(rel=0.04, resolution=1e3),
    "gpu_nvlink_rx_bytes_per_second": SampleModel(rel=0.04, resolution=1e3),
    "gpu_nvlink_error_count": SampleModel(),
    "gpu_ecc_sbe_count": SampleModel(),
    "gpu_ecc_dbe_count": SampleModel(),
    "gpu_xid_count": SampleModel(),
    "gpu_throttle_reasons": SampleModel(),
    "rdma_tx_bytes_per_second": SampleModel(rel=0.03, resolution=4.0),
    "rdma_rx_bytes_per_second": SampleModel(rel=0.03, resolution=4.0),
    "rdma_xmit_wait_per_second": SampleModel(poisson=True),
    "rdma_cnp_sent_per_second": SampleModel(poisson=True),
    "rdma_cnp_handled_per_second": SampleModel(poisson=True),
    "rdma_link_downed_count": SampleModel(),
    "rdma_symbol_error_count": SampleModel(),
    "rdma_port_up": SampleModel(),
    "pfc_tx_pause_per_second": SampleModel(poisson=True),
    "pfc_rx_pause_per_second": SampleModel(poisson=True),
    "cpu_util_ratio": SampleModel(rel=0.05, add=0.004, resolution=1e-4),
    "memory_used_bytes": SampleModel(rel=0.002, resolution=4096.0),
    "disk_read_bytes_per_second": SampleModel(rel=0.15, resolution=1.0),
    "disk_write_bytes_per_second": SampleModel(rel=0.15, resolution=1.0),
    "net_tx_bytes_per_second": SampleModel(rel=0.1, resolution=1.0),
    "net_rx_bytes_per_second": SampleModel(rel=0.1, resolution=1.0),
    "train_step_seconds": SampleModel(rel=0.002, resolution=1e-4),
    "nccl_collective_seconds": SampleModel(rel=0.01, resolution=1e-5),
    "nccl_busbw_bytes_per_second": SampleModel(rel=0.02, resolution=1e3),
    "train_busy_seconds": SampleModel(rel=0.004, resolution=1e-4),
    "train_step_number": SampleModel(),
}
"""Every canonical metric the simulator can emit (all of docs/architecture.md §3.1)."""


def pcie_bandwidth_ratio(width: int, gen: int) -> float:
    """Link bandwidth relative to gen5 x16 (per-lane rate doubles each generation from gen3)."""
    per_lane = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}[gen]
    return (width / 16.0) * (per_lane / 32.0)
