"""GPU source over NVML (``nvidia-ml-py``, import name ``pynvml``).

One :class:`NvmlSource` reads every GPU of the node once per interval: utilisation, power,
temperature, SM clock, memory, PCIe and NVLink throughput and errors, ECC counts, clock-event
reasons, GPM activity ratios where the GPU has GPM (Hopper and later), the GPU recovery action,
and XID events from an NVML event set.

What the source does when NVML misbehaves:

* no ``pynvml``, no ``libnvidia-ml`` or no driver: reports ``absent`` once, yields nothing and
  retries ``nvmlInit`` at most every :data:`INIT_RETRY_S` seconds;
* a query a GPU does not support (``NotSupported``, or ``FunctionNotFound`` on an older driver)
  is dropped for that GPU for good, without a log line per second;
* a GPU that is lost (``GPU_IS_LOST``, its UUID no longer found after the device count dropped)
  yields one :attr:`~minder.core.records.EventKind.GPU_LOST` event and is no longer queried; the
  other GPUs go on;
* any other failed query goes to :attr:`NvmlSource.problems` (counted, logged once per reason).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.base import Collected, CounterRates, ProblemLog
from minder.core.records import Event, EventKind

logger = logging.getLogger(__name__)

INIT_RETRY_S = 60.0
"""Seconds between two ``nvmlInit`` attempts while the library or driver is absent."""

MAX_EVENTS_PER_COLLECT = 256
"""Events drained per interval at most, so an XID storm cannot stall the agent's loop."""

_KIB = 1024.0
_MHZ = 1e6
_MW_PER_W = 1000.0
_ALL_LINKS = 0xFFFFFFFF
"""``scopeId`` that makes NVML sum an NVLink throughput field over every link (UINT_MAX)."""

_GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_SM_UTIL", "gpu_sm_active_ratio"),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "gpu_tensor_active_ratio"),
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "gpu_gr_engine_active_ratio"),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "gpu_dram_active_ratio"),
)
"""GPM metrics (percent, 0–100) and the canonical ratio each becomes."""

_NVLINK_ERROR_FIELDS = (
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
"""Cumulative NVLink error counters (all links) summed into ``gpu_nvlink_error_count``."""

# How a field value's union is read, by its ``valueType`` (NVML_VALUE_TYPE_*).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class _GpuLostError(Exception):
    """Raised inside one GPU's collection when NVML says the GPU is gone."""


@dataclass(slots=True)
class _Field:
    """One field of ``nvmlDeviceGetFieldValues`` that this source asks for."""

    role: str
    """``pcie_tx``, ``pcie_rx``, ``nvlink_tx``, ``nvlink_rx``, ``nvlink_err`` or ``recovery``."""
    field_id: int
    scope_id: int = 0


@dataclass(slots=True)
class _Gpu:
    """What the source keeps per GPU between intervals (beyond counter state)."""

    index: int
    handle: Any
    uuid: str | None
    unsupported: set[str] = field(default_factory=set)
    fields: list[_Field] = field(default_factory=list)
    xid_registered: bool = False
    gpm_samples: list[Any] | None = None
    gpm_primed: bool = False
    recovery_action: int = 0
    pcie_max: tuple[int, int] | None = None
    lost: bool = False

    @property
    def device(self) -> str:
        return f"gpu{self.index}"


class NvmlSource:
    """Reads every GPU of the node through NVML.

    Parameters
    ----------
    nvml
        A module-like object with pynvml's functions, constants and ``NVMLError`` classes;
        ``None`` imports ``pynvml`` lazily on the first :meth:`collect`.
    clock
        Monotonic seconds at which each counter is read (rates divide by its differences);
        tests inject a manual clock.

    Attributes
    ----------
    pcie_link_max
        ``{device: (max_gen, max_width)}`` read once per GPU at start, kept as evidence for a
        degraded link (current below max); not emitted as a metric.
    """

    name = "nvml"

    def __init__(
        self, nvml: Any | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.problems = ProblemLog(self.name)
        self.pcie_link_max: dict[str, tuple[int, int]] = {}
        self._nvml: Any | None = nvml
        self._rates = CounterRates(self.problems, clock=clock)
        self._initialized = False
        self._absent_reported = False
        self._next_init = float("-inf")
        self._gpus: list[_Gpu] = []
        self._count = 0
        self._event_set: Any | None = None
        self._by_address: dict[int, _Gpu] = {}
        self._errors: dict[str, type[BaseException]] = {}
        # GPU_LOST events found while starting up, handed out by the next collect().
        self._pending: list[Event] = []

    # -- lifecycle -------------------------------------------------------------------------

    def collect(self, now: float) -> Collected:
        """Read every GPU at ``now``; never raises for NVML errors."""
        out = Collected()
        if not self._ensure_init(now):
            return out
        self._check_device_count(now, out)
        xids = self._drain_events(now, out)
        for gpu in self._gpus:
            if gpu.lost:
                continue
            one = Collected()
            try:
                self._collect_gpu(gpu, now, one)
            except _GpuLostError:
                self._lose(gpu, now, out, "NVML reports the GPU is lost")
                continue
            # No count when the event set could not be read: a zero would claim "no XID".
            if gpu.xid_registered and xids is not None:
                one.add("gpu_xid_count", gpu.device, float(xids.get(gpu.index, 0)))
            out.extend(one)
        return out

    def close(self) -> None:
        """Free the event set and GPM samples and shut NVML down (idempotent)."""
        if not self._initialized or self._nvml is None:
            return
        nvml = self._lib
        for gpu in self._gpus:
            for sample in gpu.gpm_samples or ():
                self._quietly(nvml.nvmlGpmSampleFree, sample)
            gpu.gpm_samples = None
        if self._event_set is not None:
            self._quietly(nvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._quietly(nvml.nvmlShutdown)
        self._initialized = False
        self._gpus = []
        self._by_address = {}

    @property
    def _lib(self) -> Any:
        """The NVML module; only used once ``_ensure_init`` has set it."""
        if self._nvml is None:
            raise RuntimeError("NVML module used before it was loaded")  # a bug of this class
        return self._nvml

    def _quietly(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except self._error("NVMLError") as exc:
            logger.debug("nvml: %s failed at close: %s", getattr(fn, "__name__", fn), exc)

    # -- init ------------------------------------------------------------------------------

    def _error(self, name: str) -> type[BaseException]:
        """The module's ``NVMLError*`` class ``name``, or one that is never raised."""
        cls = self._errors.get(name)
        if cls is None:
            found = getattr(self._nvml, name, None)
            cls = found if isinstance(found, type) else _NeverRaisedError
            self._errors[name] = cls
        return cls

    def _absent(self, detail: str) -> None:
        if not self._absent_reported:
            self._absent_reported = True
            self.problems.report("absent", detail)

    def _ensure_init(self, now: float) -> bool:
        if self._initialized:
            return True
        if now < self._next_init:
            return False
        self._next_init = now + INIT_RETRY_S
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                self._absent(f"cannot import pynvml (pip install nvidia-ml-py): {exc}")
                return False
        nvml: Any = self._nvml
        absent = (
            self._error("NVMLError_LibraryNotFound"),
            self._error("NVMLError_DriverNotLoaded"),
        )
        try:
            nvml.nvmlInit()
        except absent as exc:
            self._absent(f"NVML unavailable: {exc}")
            return False
        except self._error("NVMLError") as exc:
            self.problems.report("init_failed", f"nvmlInit failed: {exc}")
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._error("NVMLError") as exc:
            self.problems.report("init_failed", f"nvmlDeviceGetCount failed: {exc}")
            self._quietly(nvml.nvmlShutdown)
            return False
        self._initialized = True
        self._count = count
        self._create_event_set()
        for index in range(count):
            self._add_gpu(index, now)
        logger.info("nvml: %d GPU(s) found", count)
        return True

    def _create_event_set(self) -> None:
        nvml = self._lib
        if not hasattr(nvml, "nvmlEventSetCreate"):
            return
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except self._error("NVMLError") as exc:
            self.problems.report("events_unavailable", f"nvmlEventSetCreate failed: {exc}")

    def _add_gpu(self, index: int, now: float) -> None:
        nvml = self._lib
        device = f"gpu{index}"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except self._lost_errors() as exc:
            gpu = _Gpu(index, None, None, lost=True)
            self._gpus.append(gpu)
            self._pending.append(Event(EventKind.GPU_LOST, device, now, message=str(exc)))
            return
        except self._error("NVMLError") as exc:
            self.problems.report("handle_failed", f"{device}: nvmlDeviceGetHandleByIndex: {exc}")
            return
        uuid: str | None
        try:
            raw = nvml.nvmlDeviceGetUUID(handle)
            uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
        except self._error("NVMLError"):
            uuid = None
        gpu = _Gpu(index, handle, uuid)
        self._gpus.append(gpu)
        address = _address(handle)
        if address is not None:
            self._by_address[address] = gpu
        self._register_xid(gpu)
        self._setup_fields(gpu)
        self._setup_gpm(gpu)
        try:
            gen = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
            width = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
            gpu.pcie_max = (gen, width)
            self.pcie_link_max[device] = gpu.pcie_max
        except self._error("NVMLError") as exc:
            logger.debug("nvml: %s max PCIe link unknown: %s", device, exc)

    def _register_xid(self, gpu: _Gpu) -> None:
        nvml = self._lib
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if self._event_set is None or xid_type is None:
            return
        try:
            nvml.nvmlDeviceRegisterEvents(gpu.handle, xid_type, self._event_set)
            gpu.xid_registered = True
        except (*self._unsupported_errors(), *self._lost_errors()) as exc:
            # a lost GPU is reported by its first query in collect()
            logger.debug("nvml: %s has no XID events: %s", gpu.device, exc)
        except self._error("NVMLError") as exc:
            self.problems.report("events_unavailable", f"{gpu.device}: register XID: {exc}")

    def _setup_fields(self, gpu: _Gpu) -> None:
        nvml = self._lib
        wanted: list[tuple[str, str, int]] = [
            ("pcie_tx", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0),
            ("pcie_rx", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0),
            ("nvlink_tx", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", _ALL_LINKS),
            ("nvlink_rx", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", _ALL_LINKS),
            *(("nvlink_err", name, 0) for name in _NVLINK_ERROR_FIELDS),
            ("recovery", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 0),
        ]
        for role, constant, scope in wanted:
            field_id = getattr(nvml, constant, None)
            if isinstance(field_id, int):
                gpu.fields.append(_Field(role, field_id, scope))

    def _setup_gpm(self, gpu: _Gpu) -> None:
        nvml = self._lib
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(gpu.handle)
        except self._error("NVMLError") as exc:
            logger.debug("nvml: %s has no GPM: %s", gpu.device, exc)
            return
        if not int(getattr(support, "isSupportedDevice", 0)):
            logger.debug("nvml: %s does not support GPM", gpu.device)
            return
        try:
            gpu.gpm_samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        except self._error("NVMLError") as exc:
            self.problems.report("gpm_failed", f"{gpu.device}: nvmlGpmSampleAlloc: {exc}")

    # -- errors ----------------------------------------------------------------------------

    def _unsupported_errors(self) -> tuple[type[BaseException], ...]:
        return (self._error("NVMLError_NotSupported"), self._error("NVMLError_FunctionNotFound"))

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        return (self._error("NVMLError_GpuIsLost"), self._error("NVMLError_GpuNotFound"))

    def _query(self, gpu: _Gpu, fn_name: str, *args: Any, key: str | None = None) -> Any | None:
        """Call ``fn_name(handle, *args)``; None when unsupported (for good) or failed.

        ``key`` names the query in the GPU's unsupported set (default: name and arguments).
        """
        if key is None:
            key = fn_name if not args else f"{fn_name}{args}"
        if key in gpu.unsupported:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            gpu.unsupported.add(key)
            return None
        try:
            return fn(gpu.handle, *args)
        except self._lost_errors() as exc:
            raise _GpuLostError(str(exc)) from exc
        except self._unsupported_errors() as exc:
            gpu.unsupported.add(key)
            logger.debug(
                "nvml: %s %s not supported (%s); skipped from now on", gpu.device, key, exc
            )
            return None
        except self._error("NVMLError") as exc:
            self.problems.report("query_failed", f"{gpu.device}: {fn_name}: {exc}")
            return None

    # -- per interval ----------------------------------------------------------------------

    def _lose(self, gpu: _Gpu, now: float, out: Collected, why: str) -> None:
        gpu.lost = True
        out.events.append(Event(EventKind.GPU_LOST, gpu.device, now, message=why))
        logger.warning("nvml: %s lost: %s", gpu.device, why)
        keep: set[tuple[str, ...]] = set()
        for other in self._gpus:
            if not other.lost:
                keep.update(self._counter_keys(other))
        self._rates.forget(keep)

    @staticmethod
    def _counter_keys(gpu: _Gpu) -> list[tuple[str, ...]]:
        device = gpu.device
        keys: list[tuple[str, ...]] = [(device, "pcie_replay"), (device, "ecc_sbe")]
        keys.append((device, "ecc_dbe"))
        keys += [(device, f.role, str(f.field_id)) for f in gpu.fields]
        return keys

    def _check_device_count(self, now: float, out: Collected) -> None:
        nvml = self._lib
        out.events.extend(self._pending)
        self._pending.clear()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._error("NVMLError") as exc:
            self.problems.report("query_failed", f"nvmlDeviceGetCount: {exc}")
            return
        if count >= self._count:
            return
        # A GPU fell off the bus: find which by its UUID, since indices may have shifted.
        for gpu in self._gpus:
            if gpu.lost:
                continue
            if gpu.uuid is None:
                gone = gpu.index >= count
            else:
                try:
                    nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                    gone = False
                except self._error("NVMLError"):
                    gone = True
            if gone:
                self._lose(gpu, now, out, f"device count dropped from {self._count} to {count}")
        self._count = count

    def _drain_events(self, now: float, out: Collected) -> dict[int, int] | None:
        """Read every pending XID event without waiting; returns XIDs per GPU index.

        None when the event set could not be read (``event_wait_failed``): the interval's XID
        count is unknown, though events read before the failure are still in ``out``.
        """
        nvml = self._lib
        counts: dict[int, int] = {}
        if self._event_set is None:
            return counts
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", 0)
        for _ in range(MAX_EVENTS_PER_COLLECT):
            try:
                data = wait(self._event_set, 0)
            except self._error("NVMLError_Timeout"):
                break
            except self._error("NVMLError") as exc:
                self.problems.report("event_wait_failed", f"nvmlEventSetWait: {exc}")
                return None
            if not int(data.eventType) & xid_type:
                continue
            gpu = self._event_gpu(data.device)
            if gpu is None:
                self.problems.report("unknown_event_device", "XID event for an unknown GPU handle")
                continue
            code = int(data.eventData)
            counts[gpu.index] = counts.get(gpu.index, 0) + 1
            out.events.append(Event(EventKind.XID, gpu.device, now, code=code))
        else:
            self.problems.report(
                "event_backlog", f"more than {MAX_EVENTS_PER_COLLECT} NVML events in one interval"
            )
        return counts

    def _event_gpu(self, handle: Any) -> _Gpu | None:
        address = _address(handle)
        if address is not None and address in self._by_address:
            return self._by_address[address]
        # Not a ctypes handle: ask NVML (fails for a lost GPU, hence the address map first).
        try:
            index = int(self._lib.nvmlDeviceGetIndex(handle))
        except self._error("NVMLError"):
            return None
        return next((g for g in self._gpus if g.index == index), None)

    def _collect_gpu(self, gpu: _Gpu, now: float, out: Collected) -> None:
        nvml = self._lib
        device = gpu.device
        util = self._query(gpu, "nvmlDeviceGetUtilizationRates")
        if util is not None:
            self._add_percent(out, "gpu_util_ratio", gpu, float(util.gpu))
        power = self._query(gpu, "nvmlDeviceGetPowerUsage")
        if power is not None:
            out.add("gpu_power_watts", device, float(power) / _MW_PER_W)
        temp = self._query(gpu, "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            out.add("gpu_temperature_celsius", device, float(temp))
        clock = self._query(gpu, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
        if clock is not None:
            out.add("gpu_sm_clock_hertz", device, float(clock) * _MHZ)
        memory = self._query(gpu, "nvmlDeviceGetMemoryInfo")
        if memory is not None:
            out.add("gpu_memory_used_bytes", device, float(memory.used))
        gen = self._query(gpu, "nvmlDeviceGetCurrPcieLinkGeneration")
        if gen is not None:
            out.add("gpu_pcie_link_gen", device, float(gen))
        width = self._query(gpu, "nvmlDeviceGetCurrPcieLinkWidth")
        if width is not None:
            out.add("gpu_pcie_link_width", device, float(width))
        replay = self._query(gpu, "nvmlDeviceGetPcieReplayCounter")
        if replay is not None:
            self._add_count(out, "gpu_pcie_replay_count", (device, "pcie_replay"), replay)
        self._collect_ecc(gpu, now, out)
        self._collect_throttle(gpu, out)
        pcie_from_fields = self._collect_fields(gpu, now, out)
        if not pcie_from_fields:
            self._collect_pcie_throughput(gpu, out)
        self._collect_gpm(gpu, out)

    def _add_percent(self, out: Collected, metric: str, gpu: _Gpu, percent: float) -> None:
        # GPM doubles can overshoot 100 by rounding; anything further off is a bad reading.
        if not 0.0 <= percent <= 100.5:
            self.problems.report("out_of_range", f"{gpu.device}: {metric} read {percent!r} %")
            return
        out.add(metric, gpu.device, min(percent / 100.0, 1.0))

    def _add_count(
        self, out: Collected, metric: str, key: tuple[str, ...], value: Any
    ) -> float | None:
        step = self._rates.count(key, float(value))
        if step is not None:
            out.add(metric, key[0], step)
        return step

    def _collect_ecc(self, gpu: _Gpu, now: float, out: Collected) -> None:
        nvml = self._lib
        device = gpu.device
        volatile = nvml.NVML_VOLATILE_ECC
        sbe = self._query(
            gpu, "nvmlDeviceGetTotalEccErrors", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile
        )
        if sbe is not None:
            self._add_count(out, "gpu_ecc_sbe_count", (device, "ecc_sbe"), sbe)
        dbe = self._query(
            gpu, "nvmlDeviceGetTotalEccErrors", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile
        )
        if dbe is not None:
            step = self._add_count(out, "gpu_ecc_dbe_count", (device, "ecc_dbe"), dbe)
            if step:
                out.events.append(
                    Event(
                        EventKind.ECC,
                        device,
                        now,
                        message=f"{int(step)} uncorrectable (volatile) ECC error(s)",
                    )
                )

    def _collect_throttle(self, gpu: _Gpu, out: Collected) -> None:
        # The newer name first; drivers before r535 only have the "throttle" spelling.
        for fn_name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if fn_name in gpu.unsupported:
                continue
            reasons = self._query(gpu, fn_name)
            if reasons is not None:
                out.add("gpu_throttle_reasons", gpu.device, float(reasons))
                return
            if fn_name not in gpu.unsupported:
                return  # it failed for another reason: reported, don't ask twice

    def _collect_fields(self, gpu: _Gpu, now: float, out: Collected) -> bool:
        """Read the field values; True when PCIe throughput came from the byte counters."""
        if not gpu.fields or "nvmlDeviceGetFieldValues" in gpu.unsupported:
            return False
        ids = [(f.field_id, f.scope_id) for f in gpu.fields]
        values = self._query(gpu, "nvmlDeviceGetFieldValues", ids, key="nvmlDeviceGetFieldValues")
        if values is None:
            return False
        nvml = self._lib
        device = gpu.device
        not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        lost = {getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)}
        read: dict[str, list[tuple[_Field, float]]] = {}
        dropped: list[_Field] = []
        for spec, value in zip(gpu.fields, values, strict=False):
            ret = int(value.nvmlReturn)
            if ret in lost:
                raise _GpuLostError(f"field {spec.field_id}: GPU is lost")
            if ret == not_supported:
                dropped.append(spec)
                continue
            if ret != 0:
                self.problems.report("query_failed", f"{device}: field {spec.field_id} -> {ret}")
                continue
            number = _field_number(value)
            if number is None:
                self.problems.report("query_failed", f"{device}: field {spec.field_id} bad type")
                continue
            read.setdefault(spec.role, []).append((spec, number))
        for spec in dropped:
            gpu.fields.remove(spec)
            logger.debug("nvml: %s field %d not supported; skipped", device, spec.field_id)

        def rate(role: str, metric: str, scale: float) -> bool:
            got = read.get(role)
            if not got:
                return False
            spec, number = got[0]
            per_s = self._rates.rate((device, role, str(spec.field_id)), number)
            if per_s is not None:
                out.add(metric, device, per_s * scale)
            return True

        pcie = rate("pcie_tx", "gpu_pcie_tx_bytes_per_second", 1.0)
        pcie = rate("pcie_rx", "gpu_pcie_rx_bytes_per_second", 1.0) and pcie
        rate("nvlink_tx", "gpu_nvlink_tx_bytes_per_second", _KIB)
        rate("nvlink_rx", "gpu_nvlink_rx_bytes_per_second", _KIB)
        errors = [
            self._rates.count((device, "nvlink_err", str(spec.field_id)), number)
            for spec, number in read.get("nvlink_err", [])
        ]
        known = [e for e in errors if e is not None]
        if known:
            out.add("gpu_nvlink_error_count", device, sum(known))
        for _spec, number in read.get("recovery", []):
            action = int(number)
            if action and action != gpu.recovery_action:
                out.events.append(
                    Event(
                        EventKind.RECOVERY_ACTION,
                        device,
                        now,
                        code=action,
                        message=f"NVML GPU recovery action {action}",
                    )
                )
            gpu.recovery_action = action
        return pcie

    def _collect_pcie_throughput(self, gpu: _Gpu, out: Collected) -> None:
        # Fallback when the PCIe byte counters are unsupported: NVML samples 20 ms per call.
        nvml = self._lib
        for counter, metric in (
            (nvml.NVML_PCIE_UTIL_TX_BYTES, "gpu_pcie_tx_bytes_per_second"),
            (nvml.NVML_PCIE_UTIL_RX_BYTES, "gpu_pcie_rx_bytes_per_second"),
        ):
            kib_s = self._query(gpu, "nvmlDeviceGetPcieThroughput", counter)
            if kib_s is not None:
                out.add(metric, gpu.device, float(kib_s) * _KIB)

    def _collect_gpm(self, gpu: _Gpu, out: Collected) -> None:
        if gpu.gpm_samples is None:
            return
        nvml = self._lib
        previous, current = gpu.gpm_samples
        try:
            nvml.nvmlGpmSampleGet(gpu.handle, current)
            if gpu.gpm_primed:
                wanted = [
                    (getattr(nvml, const), metric)
                    for const, metric in _GPM_METRICS
                    if hasattr(nvml, const)
                ]
                request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = nvml.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = len(wanted)
                request.sample1 = previous
                request.sample2 = current
                for i, (metric_id, _metric) in enumerate(wanted):
                    request.metrics[i].metricId = metric_id
                nvml.nvmlGpmMetricsGet(request)
                for i, (_metric_id, metric) in enumerate(wanted):
                    answer = request.metrics[i]
                    if int(answer.nvmlReturn) == 0:
                        self._add_percent(out, metric, gpu, float(answer.value))
        except self._lost_errors() as exc:
            raise _GpuLostError(str(exc)) from exc
        except self._unsupported_errors() as exc:
            logger.debug("nvml: %s GPM not supported (%s); skipped", gpu.device, exc)
            for sample in gpu.gpm_samples:
                self._quietly(nvml.nvmlGpmSampleFree, sample)
            gpu.gpm_samples = None
            return
        except self._error("NVMLError") as exc:
            self.problems.report("gpm_failed", f"{gpu.device}: GPM: {exc}")
            gpu.gpm_primed = False
            return
        gpu.gpm_samples = [current, previous]
        gpu.gpm_primed = True


class _NeverRaisedError(Exception):
    """Stands in for an ``NVMLError*`` class that the module does not define."""


def _address(handle: Any) -> int | None:
    """Pointer value of a ctypes NVML handle (stable per device), or None."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _field_number(value: Any) -> float | None:
    """Number held in a ``c_nvmlFieldValue_t`` according to its ``valueType``."""
    kind = int(value.valueType)
    if not 0 <= kind < len(_VALUE_MEMBERS):
        return None
    return float(getattr(value.value, _VALUE_MEMBERS[kind]))
