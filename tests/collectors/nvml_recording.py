"""A recording of NVML's answers, replayed through a module-like fake of ``pynvml``.

The recording is built from a real ``nvidia-smi -q -x`` dump (the A100-SXM4-80GB file in
``../shared/data/nvidia-smi-xml/``): utilisation, power, temperature, SM clock, memory, PCIe link
generation and width (current and max), PCIe throughput, replay counter, volatile ECC counts and
clock-event reasons are the dump's values. What a dump does not hold (NVLink counters, PCIe byte
counters, GPM activity, recovery action) is scripted by the test and says so.

:class:`FakeNvml` answers with the *real* pynvml constants, ctypes structures and ``NVMLError``
classes (re-exported from the installed ``pynvml``), so the source under test cannot tell it from
the library. Handles are real ``c_nvmlDevice_t`` pointers to private buffers. A test scripts
changes between collects: :meth:`FakeNvml.tick` advances counters, :meth:`FakeNvml.queue_xid`
queues an XID, :meth:`FakeNvml.lose_gpu` makes a GPU answer ``GPU_IS_LOST`` after N more calls,
:meth:`FakeNvml.remove_gpu` drops a GPU from the enumeration, ``unsupported`` makes a query
answer ``NotSupported``.
"""

from __future__ import annotations

import copy
import ctypes
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml

SHARED_XML_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "nvidia-smi-xml"
A100_XML = SHARED_XML_DIR / "a100-sxm4-v12.xml"

MIB = 1024 * 1024

# nvidia-smi's <clocks_event_reasons> children and the NVML bit each one shows.
_REASON_BITS = {
    "clocks_event_reason_gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "clocks_event_reason_applications_clocks_setting": (
        pynvml.nvmlClocksEventReasonApplicationsClocksSetting
    ),
    "clocks_event_reason_sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "clocks_event_reason_hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "clocks_event_reason_hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "clocks_event_reason_hw_power_brake_slowdown": (
        pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    ),
    "clocks_event_reason_sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "clocks_event_reason_sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "clocks_event_reason_display_clocks_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

NVLINK_ERROR_FIELDS = (
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
)


@dataclass
class GpuRecording:
    """NVML's answers for one GPU; ``None`` means the query answers ``NotSupported``."""

    product: str
    uuid: str
    util_gpu: int | None
    util_memory: int | None
    power_mw: int
    temperature_c: int
    sm_clock_mhz: int
    memory_total_bytes: int
    memory_used_bytes: int
    pcie_gen: int
    pcie_gen_max: int
    pcie_width: int
    pcie_width_max: int
    pcie_tx_kib_s: int
    pcie_rx_kib_s: int
    pcie_replay: int
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    throttle_reasons: int
    # Scripted, not in an nvidia-smi dump:
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    nvlink_tx_kib: int | None = 0
    nvlink_rx_kib: int | None = 0
    nvlink_errors: dict[int, int] = field(
        default_factory=lambda: dict.fromkeys(NVLINK_ERROR_FIELDS, 0)
    )
    recovery_action: int | None = 0
    gpm: dict[int, float] | None = None
    """GPM metric id -> percent; None: the GPU has no GPM (Ampere and older)."""
    unsupported: set[str] = field(default_factory=set)
    """NVML function names that answer NotSupported for this GPU."""
    per_tick: dict[str, int] = field(default_factory=dict)
    """Attribute -> increase applied by :meth:`FakeNvml.tick` (counters moving on)."""


def _text(gpu: ET.Element, path: str) -> str:
    node = gpu.find(path)
    if node is None or node.text is None:
        raise ValueError(f"nvidia-smi XML has no <{path}>")
    return node.text.strip()


def _number(gpu: ET.Element, path: str) -> float | None:
    """The leading number of ``path``'s text (``'67.03 W'`` -> 67.03), None for ``N/A``."""
    text = _text(gpu, path)
    match = re.match(r"[-+]?\d+(\.\d+)?", text)
    return float(match.group(0)) if match else None


def _required(gpu: ET.Element, path: str) -> float:
    value = _number(gpu, path)
    if value is None:
        raise ValueError(f"nvidia-smi XML <{path}> is {_text(gpu, path)!r}: expected a number")
    return value


def _optional_int(gpu: ET.Element, path: str) -> int | None:
    value = _number(gpu, path)
    return None if value is None else int(value)


def parse_smi_xml(path: Path) -> GpuRecording:
    """Read the first GPU of an ``nvidia-smi -q -x`` dump into a recording."""
    root = ET.parse(path).getroot()
    gpu = root.find("gpu")
    if gpu is None:
        raise ValueError(f"{path}: no <gpu> element")
    reasons = 0
    event_reasons = gpu.find("clocks_event_reasons")
    for child in event_reasons if event_reasons is not None else ():
        if (child.text or "").strip() == "Active":
            reasons |= _REASON_BITS[child.tag]
    ecc = "ecc_errors/volatile/"
    corrected = [_optional_int(gpu, ecc + k) for k in ("sram_correctable", "dram_correctable")]
    uncorrected = [
        _optional_int(gpu, ecc + k) for k in ("sram_uncorrectable", "dram_uncorrectable")
    ]
    return GpuRecording(
        product=_text(gpu, "product_name"),
        uuid=_text(gpu, "uuid"),
        util_gpu=_optional_int(gpu, "utilization/gpu_util"),
        util_memory=_optional_int(gpu, "utilization/memory_util"),
        power_mw=round(_required(gpu, "gpu_power_readings/power_draw") * 1000),
        temperature_c=int(_required(gpu, "temperature/gpu_temp")),
        sm_clock_mhz=int(_required(gpu, "clocks/sm_clock")),
        memory_total_bytes=int(_required(gpu, "fb_memory_usage/total")) * MIB,
        memory_used_bytes=int(_required(gpu, "fb_memory_usage/used")) * MIB,
        pcie_gen=int(_required(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
        pcie_gen_max=int(_required(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
        pcie_width=int(_required(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
        pcie_width_max=int(_required(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
        pcie_tx_kib_s=int(_required(gpu, "pci/tx_util")),
        pcie_rx_kib_s=int(_required(gpu, "pci/rx_util")),
        pcie_replay=int(_required(gpu, "pci/replay_counter")),
        ecc_corrected=None if None in corrected else sum(c for c in corrected if c is not None),
        ecc_uncorrected=(
            None if None in uncorrected else sum(c for c in uncorrected if c is not None)
        ),
        throttle_reasons=reasons,
    )


def a100_node(count: int = 8, **overrides: Any) -> list[GpuRecording]:
    """``count`` GPUs answering like the recorded A100 (each with its own UUID)."""
    base = parse_smi_xml(A100_XML)
    gpus = []
    for index in range(count):
        uuid = f"{base.uuid[:-2]}{index:02x}"
        # every GPU gets its own copies of the mutable answers (dicts, sets)
        changes = copy.deepcopy({"nvlink_errors": base.nvlink_errors, **overrides})
        gpus.append(replace(base, uuid=uuid, **changes))
    return gpus


class FakeNvml:
    """Module-like stand-in for ``pynvml`` that replays :class:`GpuRecording` answers."""

    def __init__(self, gpus: list[GpuRecording], *, library_present: bool = True) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks", "c_nvml")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.library_present = library_present
        self.missing_functions: set[str] = set()
        """Names that answer FunctionNotFound, like an older libnvidia-ml without the symbol."""
        self.failures: dict[str, list[BaseException]] = {}
        """Errors the next calls of a function raise, one per call (see :meth:`fail_next`)."""
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self.device_calls: Counter[int] = Counter()
        self.ticks = 0
        self._buffers: list[Any] = []
        self._handles = [self._new_pointer(pynvml.c_nvmlDevice_t) for _ in gpus]
        self._index_by_address = {_address(h): i for i, h in enumerate(self._handles)}
        self._removed: set[int] = set()
        self._lost: set[int] = set()
        self._lose_after: dict[int, int] = {}
        self._events: list[tuple[int, int]] = []
        self._registered: set[int] = set()
        self._event_sets: set[int] = set()
        self._gpm_samples: dict[int, tuple[int, dict[int, float]] | None] = {}
        self._scheduled: dict[int, list[Callable[[FakeNvml], None]]] = {}

    # -- scripting -------------------------------------------------------------------------

    def tick(self) -> None:
        """Advance every GPU's counters by its ``per_tick`` and run what is scheduled."""
        self.ticks += 1
        for gpu in self.gpus:
            for attr, step in gpu.per_tick.items():
                if attr.startswith("nvlink_errors."):
                    fid = int(attr.split(".", 1)[1])
                    gpu.nvlink_errors[fid] += step
                else:
                    setattr(gpu, attr, getattr(gpu, attr) + step)
        for action in self._scheduled.pop(self.ticks, []):
            action(self)

    def at_tick(self, tick: int, action: Callable[[FakeNvml], None]) -> None:
        """Run ``action`` when :meth:`tick` reaches ``tick``."""
        self._scheduled.setdefault(tick, []).append(action)

    def queue_xid(self, index: int, code: int) -> None:
        self._events.append((index, code))

    def fail_next(self, name: str, error: BaseException, times: int = 1) -> None:
        """The next ``times`` calls of ``name`` raise ``error`` (a driver hiccup)."""
        self.failures.setdefault(name, []).extend([error] * times)

    def lose_gpu(self, index: int, after_calls: int = 0) -> None:
        """GPU ``index`` answers GPU_IS_LOST once it has served ``after_calls`` more calls."""
        self._lose_after[index] = self.device_calls[index] + after_calls

    def remove_gpu(self, index: int) -> None:
        """GPU ``index`` leaves the enumeration (the device count drops) and is lost."""
        self._removed.add(index)
        self._lost.add(index)

    # -- helpers ---------------------------------------------------------------------------

    def _new_pointer(self, kind: Any) -> Any:
        buffer = ctypes.create_string_buffer(16)
        self._buffers.append(buffer)
        return ctypes.cast(buffer, kind)

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()
        if name in self.missing_functions:
            raise pynvml.NVMLError_FunctionNotFound()
        pending = self.failures.get(name)
        if pending:
            raise pending.pop(0)

    def _gpu(self, handle: Any, name: str) -> tuple[int, GpuRecording]:
        self._call(name)
        index = self._index_by_address.get(_address(handle))
        if index is None:
            raise pynvml.NVMLError_InvalidArgument()
        self.device_calls[index] += 1
        limit = self._lose_after.get(index)
        if limit is not None and self.device_calls[index] > limit:
            self._lost.add(index)
        if index in self._lost:
            raise pynvml.NVMLError_GpuIsLost()
        gpu = self.gpus[index]
        if name in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return index, gpu

    def _enumerated(self) -> list[int]:
        return [i for i in range(len(self.gpus)) if i not in self._removed]

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if not self.library_present:
            raise pynvml.NVMLError_LibraryNotFound()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self._enumerated())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        enumerated = self._enumerated()
        if not 0 <= index < len(enumerated):
            raise pynvml.NVMLError_InvalidArgument()
        return self._handles[enumerated[index]]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._call("nvmlDeviceGetHandleByUUID")
        for index in self._enumerated():
            if self.gpus[index].uuid == uuid:
                return self._handles[index]
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        index, _ = self._gpu(handle, "nvmlDeviceGetIndex")
        return index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID")[1].uuid

    # -- device queries --------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")[1]
        if gpu.util_gpu is None or gpu.util_memory is None:
            raise pynvml.NVMLError_NotSupported()  # what NVML answers in MIG mode ("N/A")
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util_gpu, gpu.util_memory
        return util

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage")[1].power_mw

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")[1]
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")[1]
        if kind != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.sm_clock_mhz

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")[1]
        memory = pynvml.c_nvmlMemory_t()
        memory.total = gpu.memory_total_bytes
        memory.used = gpu.memory_used_bytes
        memory.free = gpu.memory_total_bytes - gpu.memory_used_bytes
        return memory

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration")[1].pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration")[1].pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth")[1].pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth")[1].pcie_width_max

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetPcieThroughput")[1]
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kib_s
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kib_s
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter")[1].pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")[1]
        if counter != pynvml.NVML_VOLATILE_ECC:
            raise pynvml.NVMLError_InvalidArgument()
        value = (
            gpu.ecc_corrected
            if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            else gpu.ecc_uncorrected
        )
        if value is None:
            raise pynvml.NVMLError_NotSupported()
        return value

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")[1].throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")[1].throttle_reasons

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")[1]
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, requested in zip(values, field_ids, strict=True):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            slot.fieldId, slot.scopeId = fid, scope
            number = self._field(gpu, fid, scope)
            if number is None:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            if fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                slot.value.uiVal = number
            else:
                slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                slot.value.ullVal = number
        return values

    @staticmethod
    def _field(gpu: GpuRecording, fid: int, scope: int) -> int | None:
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return gpu.pcie_tx_bytes
        if fid == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return gpu.pcie_rx_bytes
        if fid in (
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ):
            if scope != 0xFFFFFFFF:
                return None  # this recording holds the all-links sum only
            tx = fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            return gpu.nvlink_tx_kib if tx else gpu.nvlink_rx_kib
        if fid in gpu.nvlink_errors:
            return gpu.nvlink_errors[fid]
        if fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return gpu.recovery_action
        return None

    # -- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._call("nvmlEventSetCreate")
        event_set = self._new_pointer(pynvml.c_nvmlEventSet_t)
        self._event_sets.add(_address(event_set))
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        index, _ = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if _address(event_set) not in self._event_sets:
            raise pynvml.NVMLError_InvalidArgument()
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            self._registered.add(index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._call("nvmlEventSetWait_v2")
        if _address(event_set) not in self._event_sets:
            raise pynvml.NVMLError_InvalidArgument()
        for position, (index, code) in enumerate(self._events):
            if index in self._registered:
                del self._events[position]
                data = pynvml.c_nvmlEventData_t()
                data.device = self._handles[index]
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = code
                return data
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree")
        self._event_sets.discard(_address(event_set))

    # -- GPM -------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")[1]
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm is not None)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._call("nvmlGpmSampleAlloc")
        sample = self._new_pointer(pynvml.c_nvmlGpmSample_t)
        self._gpm_samples[_address(sample)] = None
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._call("nvmlGpmSampleFree")
        self._gpm_samples.pop(_address(sample), None)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        index, gpu = self._gpu(handle, "nvmlGpmSampleGet")
        if gpu.gpm is None:
            raise pynvml.NVMLError_NotSupported()
        address = _address(sample)
        if address not in self._gpm_samples:
            raise pynvml.NVMLError_InvalidArgument()
        self._gpm_samples[address] = (index, dict(gpu.gpm))
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._call("nvmlGpmMetricsGet")
        first = self._gpm_samples.get(_address(request.sample1))
        second = self._gpm_samples.get(_address(request.sample2))
        if first is None or second is None or first[0] != second[0]:
            raise pynvml.NVMLError_InvalidArgument()
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            value = second[1].get(int(metric.metricId))
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = value
        return request


def _address(pointer: Any) -> int:
    value = ctypes.cast(pointer, ctypes.c_void_p).value
    if value is None:
        raise pynvml.NVMLError_InvalidArgument()
    return value
