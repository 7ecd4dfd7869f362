"""The canonical metric names (docs/architecture.md §3.1), with units, kinds and devices.

Collectors, the simulator and the detectors all speak these names; anything else is refused at
the edge (codec, table reader) with an error that names the value and the close matches.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from enum import StrEnum

from minder.core.errors import UnknownMetricError, ValidationError

FLOAT32_MAX = 3.0e38
"""Largest value accepted: windows hold float32, and anything larger would become infinite."""


class MetricKind(StrEnum):
    """How a sample's value is to be read."""

    GAUGE = "gauge"
    """A level sampled at the end of the interval (utilisation, temperature, link width)."""
    RATE = "rate"
    """A counter the agent has turned into a per-second rate over the interval."""
    COUNT = "count"
    """Raw events counted in the interval (XIDs, ECC errors, link-down events)."""


class DeviceFamily(StrEnum):
    """Which device a metric is reported for; ``HOST`` metrics carry an empty device."""

    GPU = "gpu"
    NIC = "nic"
    HOST = "host"
    RANK = "rank"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One canonical metric.

    Attributes
    ----------
    name
        ``snake_case`` name with the base unit in it.
    unit
        Base unit (``ratio``, ``bytes``, ``seconds``, ``watts`` …, or ``1`` for counts and levels).
    kind
        Gauge, rate or count.
    family
        The device family whose devices report it.
    lower, upper
        Physically possible range; values outside it are refused.
    derived
        Computed by the detection service where all ranks meet, never collected by a node: a
        source (the Prometheus reader) does not look for it.
    """

    name: str
    unit: str
    kind: MetricKind
    family: DeviceFamily
    description: str
    lower: float = 0.0
    upper: float = FLOAT32_MAX
    derived: bool = False


def _m(
    name: str,
    unit: str,
    kind: MetricKind,
    family: DeviceFamily,
    description: str,
    upper: float = FLOAT32_MAX,
) -> MetricSpec:
    return MetricSpec(name, unit, kind, family, description, 0.0, upper)


G, R, C = MetricKind.GAUGE, MetricKind.RATE, MetricKind.COUNT
GPU, NIC, HOST, RANK = DeviceFamily.GPU, DeviceFamily.NIC, DeviceFamily.HOST, DeviceFamily.RANK

_SPECS: tuple[MetricSpec, ...] = (
    # GPU
    _m("gpu_util_ratio", "ratio", G, GPU, "GPU duty cycle (kernel running)", 1.0),
    _m("gpu_sm_active_ratio", "ratio", G, GPU, "fraction of time an SM had a warp resident", 1.0),
    _m("gpu_tensor_active_ratio", "ratio", G, GPU, "tensor pipe activity", 1.0),
    _m("gpu_gr_engine_active_ratio", "ratio", G, GPU, "graphics engine activity", 1.0),
    _m("gpu_dram_active_ratio", "ratio", G, GPU, "device memory interface activity", 1.0),
    _m("gpu_power_watts", "watts", G, GPU, "board power draw"),
    _m("gpu_temperature_celsius", "celsius", G, GPU, "GPU core temperature"),
    _m("gpu_sm_clock_hertz", "hertz", G, GPU, "SM clock"),
    _m("gpu_memory_used_bytes", "bytes", G, GPU, "frame buffer in use"),
    _m("gpu_pcie_tx_bytes_per_second", "bytes_per_second", R, GPU, "PCIe transmit throughput"),
    _m("gpu_pcie_rx_bytes_per_second", "bytes_per_second", R, GPU, "PCIe receive throughput"),
    _m("gpu_pcie_link_gen", "1", G, GPU, "current PCIe link generation"),
    _m("gpu_pcie_link_width", "1", G, GPU, "current PCIe link width (lanes)"),
    _m("gpu_pcie_replay_count", "1", C, GPU, "PCIe replays in the interval"),
    _m("gpu_nvlink_tx_bytes_per_second", "bytes_per_second", R, GPU, "NVLink transmit throughput"),
    _m("gpu_nvlink_rx_bytes_per_second", "bytes_per_second", R, GPU, "NVLink receive throughput"),
    _m("gpu_nvlink_error_count", "1", C, GPU, "NVLink CRC/replay/recovery errors in the interval"),
    _m("gpu_ecc_sbe_count", "1", C, GPU, "single-bit (corrected) ECC errors in the interval"),
    _m("gpu_ecc_dbe_count", "1", C, GPU, "double-bit (uncorrected) ECC errors in the interval"),
    _m("gpu_xid_count", "1", C, GPU, "XID events in the interval (codes travel as events)"),
    _m("gpu_throttle_reasons", "1", G, GPU, "NVML clocks-event reason bitmask"),
    # NIC
    _m("rdma_tx_bytes_per_second", "bytes_per_second", R, NIC, "RDMA port transmit throughput"),
    _m("rdma_rx_bytes_per_second", "bytes_per_second", R, NIC, "RDMA port receive throughput"),
    _m("rdma_xmit_wait_per_second", "1/s", R, NIC, "ticks the port had data but no credit"),
    _m("rdma_cnp_sent_per_second", "1/s", R, NIC, "congestion notification packets sent"),
    _m("rdma_cnp_handled_per_second", "1/s", R, NIC, "congestion notification packets handled"),
    _m("rdma_link_downed_count", "1", C, NIC, "link-down events in the interval"),
    _m("rdma_symbol_error_count", "1", C, NIC, "symbol errors in the interval"),
    _m("rdma_port_up", "1", G, NIC, "1 when the port state is ACTIVE, else 0", 1.0),
    _m("pfc_tx_pause_per_second", "1/s", R, NIC, "PFC pause frames sent (configured priority)"),
    _m("pfc_rx_pause_per_second", "1/s", R, NIC, "PFC pause frames received"),
    # host
    _m("cpu_util_ratio", "ratio", G, HOST, "host CPU busy fraction", 1.0),
    _m("memory_used_bytes", "bytes", G, HOST, "host memory in use"),
    _m("disk_read_bytes_per_second", "bytes_per_second", R, HOST, "disk read throughput"),
    _m("disk_write_bytes_per_second", "bytes_per_second", R, HOST, "disk write throughput"),
    _m("net_tx_bytes_per_second", "bytes_per_second", R, HOST, "host (TCP/IP) transmit throughput"),
    _m("net_rx_bytes_per_second", "bytes_per_second", R, HOST, "host (TCP/IP) receive throughput"),
    # training
    _m("train_step_seconds", "seconds", G, RANK, "duration of the last training step"),
    _m("nccl_collective_seconds", "seconds", G, RANK, "mean collective execution time"),
    _m("nccl_busbw_bytes_per_second", "bytes_per_second", G, RANK, "mean collective bus bandwidth"),
    _m(
        "train_busy_seconds",
        "seconds",
        G,
        RANK,
        "mean busy time per step (outside blocking collectives) over the interval's steps",
    ),
    _m("train_step_number", "1", G, RANK, "index of the last training step the rank completed"),
    _m(
        "train_paused_seconds",
        "seconds",
        G,
        RANK,
        "how long the rank's training loop has been paused on purpose (a checkpoint, an "
        "evaluation), as it reports through the step probe (probe.pause); 0 in the interval the "
        "pause ended, absent when not paused: a paused job is not hung (docs/hangs.md)",
    ),
    MetricSpec(
        "train_lateness_seconds",
        "seconds",
        G,
        RANK,
        "how long the rank's peers waited for it per step: its peer group's median collective "
        "time less its own (nccl_collective_seconds; without it, its busy time over the group's "
        "median), 0 when not late; derived by the detection service's straggler detector where "
        "all ranks meet, in synchronous jobs only (a node sees only its own ranks)",
        derived=True,
    ),
)

METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}
"""Every canonical metric by name."""

_DEVICE_PATTERNS: dict[DeviceFamily, re.Pattern[str]] = {
    DeviceFamily.GPU: re.compile(r"gpu\d+"),
    # RDMA device names vary by vendor and driver (mlx5_0, ibp12s0, hfi1_0, rocep1s0f0).
    DeviceFamily.NIC: re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}"),
    DeviceFamily.HOST: re.compile(r""),
    DeviceFamily.RANK: re.compile(r"rank\d+"),
}
_DEVICE_EXAMPLES = {
    DeviceFamily.GPU: "'gpu0'…",
    DeviceFamily.NIC: "a NIC name such as 'mlx5_0'",
    DeviceFamily.HOST: "'' (host metrics carry no device)",
    DeviceFamily.RANK: "'rank0'…",
}


def metric_spec(name: str) -> MetricSpec:
    """Return the spec of ``name`` or raise :class:`UnknownMetricError` naming close matches."""
    try:
        return METRICS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), METRICS, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownMetricError(
            f"unknown metric {name!r}: expected one of the {len(METRICS)} canonical names "
            f"of docs/architecture.md §3.1{hint}"
        ) from None


def validate_device(spec: MetricSpec, device: str) -> None:
    """Refuse a device name that does not fit the metric's family."""
    if not _DEVICE_PATTERNS[spec.family].fullmatch(device):
        raise ValidationError(
            f"metric {spec.name!r} got device {device!r}: expected {_DEVICE_EXAMPLES[spec.family]}"
        )


def validate_value(spec: MetricSpec, value: float) -> None:
    """Refuse a value that is not finite or lies outside the metric's physical range."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValidationError(f"metric {spec.name!r} got value {value!r}: expected a number")
    if not math.isfinite(value) or value < spec.lower or value > spec.upper:
        raise ValidationError(
            f"metric {spec.name!r} got value {value!r}: expected a finite number in "
            f"[{spec.lower:g}, {spec.upper:g}] ({spec.unit})"
        )


def validate_sample(name: str, device: str, value: float) -> MetricSpec:
    """Check one ``(metric, device, value)`` sample and return its spec."""
    spec = metric_spec(name)
    validate_device(spec, device)
    validate_value(spec, value)
    return spec
