"""The GPU checks of ``minder selfcheck run`` (docs/selfcheck.md, "Checks").

* :class:`MatmulCheck` (``gpu.matmul``) — each device's throughput on a timed square matmul with
  torch, judged against a baseline for its model; on a machine without CUDA it runs on the CPU.
* :class:`NvmlCheck` (``gpu.nvml``) — NVML health: uncorrectable ECC errors, row remapping
  (retired pages before Ampere), PCIe link width and generation against their maximum, NVLink
  state; XIDs of the kernel log are recorded.
* :class:`DcgmCheck` (``gpu.dcgm``) — ``dcgmi diag -r 1 -j`` where DCGM is installed.

torch and pynvml are imported when their check runs, never with this module.
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import os
import re
import statistics
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collectors.selfcheck.base import (
    BASELINE_ENV_PREFIX,
    Check,
    CheckContext,
    CheckOptions,
    key,
    one_line,
    result,
    run_tool,
    skipped,
)
from minder.core.errors import ValidationError
from minder.core.selfcheck import CheckResult, CheckStatus, Measurement

logger = logging.getLogger(__name__)

TORCH_MISSING = "torch not installed: pip install 'minder[deep]'"
EXPECTED_GPUS_ENV = "MINDER_SELFCHECK_EXPECTED_GPUS"
"""How many GPUs the node has, by its scheduler (Slurm's ``Gres=gpu:N``, Kubernetes'
``capacity["nvidia.com/gpu"]``): ``gpu.matmul`` fails when fewer CUDA devices are visible."""

# -- baselines -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Baseline:
    """What a healthy device of a model does on :class:`MatmulCheck`'s bf16 matmul.

    Attributes
    ----------
    peak_tflops
        The datasheet's dense bf16 tensor-core peak (half its "with sparsity" figure).
    fraction
        The share of that peak a healthy device reaches on an 8192² bf16 matmul with cuBLAS:
        power and clock limits keep every real device below its peak, the PCIe and NVL boards
        (lower power) further below than the SXM ones.
    """

    peak_tflops: float
    fraction: float

    @property
    def tflops(self) -> float:
        return self.peak_tflops * self.fraction


BUILTIN_BASELINES: Mapping[str, Baseline] = {
    # Hopper SXM (700 W): 989.4 dense bf16
    "H200": Baseline(989.4, 0.75),
    "H100 80GB HBM3": Baseline(989.4, 0.75),
    "H100 SXM5": Baseline(989.4, 0.75),
    # Hopper NVL and PCIe boards (350-600 W)
    "H200 NVL": Baseline(835.0, 0.70),
    "H100 NVL": Baseline(835.0, 0.70),
    "H100 PCIe": Baseline(756.0, 0.70),
    # Ampere: 312 dense bf16
    "A100 SXM4": Baseline(312.0, 0.85),
    "A100 PCIe": Baseline(312.0, 0.80),
    "A100 80GB PCIe": Baseline(312.0, 0.80),
    # Ada: 362 dense bf16
    "L40S": Baseline(362.0, 0.65),
}
"""Built-in baselines by device model name (a run's baselines come first)."""


def normalise_model(text: str) -> str:
    """A model name as lower-case words: ``NVIDIA A100-SXM4-80GB`` -> ``nvidia a100 sxm4 80gb``."""
    return " ".join(re.split(r"[^a-z0-9]+", text.lower())).strip()


def match_baseline(model: str, table: Mapping[str, float]) -> tuple[str, float] | None:
    """The entry of ``table`` whose name's words appear, in order and together, in ``model``'s
    (the longest such name): ``H100 PCIe`` matches ``NVIDIA H100 PCIe``, not ``NVIDIA H100 NVL``."""
    words = f" {normalise_model(model)} "
    best: tuple[str, float] | None = None
    for name, tflops in table.items():
        wanted = normalise_model(name)
        if wanted and f" {wanted} " in words and (best is None or len(wanted) > len(best[0])):
            best = (wanted, tflops)
    return best


def baselines_from_environ(environ: Mapping[str, str]) -> dict[str, float]:
    """``MINDER_SELFCHECK_BASELINE_<MODEL>=<TFLOP/s>`` variables: ``{model words: TFLOP/s}``.

    ``MINDER_SELFCHECK_BASELINE_H100_PCIE=600`` gives ``{"h100 pcie": 600.0}``;
    ``MINDER_SELFCHECK_BASELINE_CPU`` applies to the CPU fallback.
    """
    found: dict[str, float] = {}
    for variable, raw in environ.items():
        if not variable.startswith(BASELINE_ENV_PREFIX) or variable == BASELINE_ENV_PREFIX:
            continue
        model = normalise_model(variable[len(BASELINE_ENV_PREFIX) :])
        found[model] = _tflops(raw, variable)
    return found


def load_baseline_file(path: Path) -> dict[str, float]:
    """A baseline file: a JSON object of device model -> TFLOP/s (``{"NVIDIA H100 PCIe": 600}``).

    Raises
    ------
    ValidationError
        It cannot be read, is not such an object, or holds a value that is not a positive number.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValidationError(
            f"baseline file {path}: cannot be read ({exc.strerror or exc}): expected a JSON file"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(
            f"baseline file {path} is not JSON ({one_line(exc, 80)}): expected an object of "
            'device model -> TFLOP/s, e.g. {"NVIDIA H100 PCIe": 600}'
        ) from None
    if not isinstance(data, dict) or not data:
        raise ValidationError(
            f"baseline file {path} holds {type(data).__name__}: expected a non-empty object of "
            'device model -> TFLOP/s, e.g. {"NVIDIA H100 PCIe": 600}'
        )
    found: dict[str, float] = {}
    for model, value in data.items():
        words = normalise_model(str(model))
        if not words:
            raise ValidationError(f"baseline file {path}: model {model!r}: expected a device name")
        found[words] = _tflops(value, f"baseline file {path} [{one_line(model, 60)!r}]")
    return found


def _tflops(value: object, what: str) -> float:
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not number > 0 or number == float("inf"):
        raise ValidationError(
            f"{what}={one_line(value, 40)!r}: expected a positive number of TFLOP/s"
        )
    return number


# -- gpu.matmul ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Throughput:
    device: str
    model: str
    tflops: float | None
    error: str | None = None
    baseline: float | None = None
    baseline_source: str | None = None


class MatmulCheck(Check):
    """``gpu.matmul``: each device's matmul throughput against its model's baseline.

    On CUDA devices a bf16 matmul of :attr:`CheckOptions.matmul_size_gpu`; without CUDA a fp32
    one of :attr:`CheckOptions.matmul_size_cpu` on the CPU, which really runs (where a node has
    NVIDIA device files but torch sees no CUDA, that is the finding instead). Warm-up, then the
    median of the timed repetitions. Fails below ``matmul_min_fraction`` of the baseline; a
    device with no baseline passes with its figure when it computed at all.

    With :data:`EXPECTED_GPUS_ENV` set (the launcher sets it from the scheduler's count of the
    node's GPUs), fewer visible CUDA devices fail the check ("only N of M GPUs visible"), and so
    does the CPU fallback when M > 0: a GPU node whose GPUs are all invisible.
    """

    name = "gpu.matmul"
    description = "each device's matmul TFLOP/s against its model's baseline (CPU without CUDA)"

    def unavailable(self, context: CheckContext) -> str | None:
        try:
            importlib.import_module("torch")
        except ImportError:
            return TORCH_MISSING
        return None

    def run(self, context: CheckContext) -> CheckResult:
        torch: Any = importlib.import_module("torch")
        options = context.options
        raw_expected = context.environ.get(EXPECTED_GPUS_ENV)
        expected = _expected_gpus(raw_expected)
        if expected is None and raw_expected is not None:
            return result(
                self.name,
                CheckStatus.ERROR,
                f"{EXPECTED_GPUS_ENV}={one_line(raw_expected, 40)!r} is not a number of GPUs",
                {},
            )
        gpu_files = _nvidia_device_files(context.dev_root)
        cuda = bool(torch.cuda.is_available())
        visible_count = int(torch.cuda.device_count()) if cuda else 0
        cpu_build = getattr(torch.version, "cuda", None) is None
        if expected is not None and visible_count < expected and not (cpu_build and gpu_files):
            where = "" if cuda else " (no CUDA: the node's GPUs are all invisible)"
            return result(
                self.name,
                CheckStatus.FAIL,
                f"only {visible_count} of {expected} GPUs visible to the check{where}: a GPU "
                "is missing or was not given to the check's job",
                {"cuda_devices": visible_count, "expected_gpus": expected},
            )
        if cuda:
            count = visible_count
            visible = context.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is None and count < len(gpu_files):
                return result(
                    self.name,
                    CheckStatus.FAIL,
                    f"torch sees {count} CUDA device(s) but {context.dev_root} has "
                    f"{len(gpu_files)} NVIDIA GPU(s): a GPU is missing",
                    {"cuda_devices": count, "gpu_device_files": len(gpu_files)},
                )
            devices = [
                (f"gpu{i}", torch.device("cuda", i), str(torch.cuda.get_device_name(i)))
                for i in range(count)
            ]
            dtype, dtype_name, size = torch.bfloat16, "bf16", options.matmul_size_gpu
        elif gpu_files:
            listed = ", ".join(p.name for p in gpu_files[:4]) + (
                ", …" if len(gpu_files) > 4 else ""
            )
            if cpu_build:
                return result(
                    self.name,
                    CheckStatus.ERROR,
                    f"torch {torch.__version__} is a CPU build but {context.dev_root} has "
                    f"{len(gpu_files)} NVIDIA GPU(s) ({listed}): install a CUDA build of torch",
                    {"gpu_device_files": len(gpu_files)},
                )
            return result(
                self.name,
                CheckStatus.FAIL,
                f"CUDA is unavailable to torch {torch.__version__} although {context.dev_root} "
                f"has {len(gpu_files)} NVIDIA GPU(s) ({listed}): the driver or a GPU is broken",
                {"gpu_device_files": len(gpu_files)},
            )
        else:
            devices = [("cpu", torch.device("cpu"), f"CPU {_cpu_model()}")]
            dtype, dtype_name, size = torch.float32, "fp32", options.matmul_size_cpu
        measured = [
            self._judge(self._measure(torch, d, dtype, size, options), context) for d in devices
        ]
        return self._result(measured, dtype_name, size, options)

    @staticmethod
    def _measure(
        torch: Any, device: tuple[str, Any, str], dtype: Any, size: int, options: CheckOptions
    ) -> _Throughput:
        label, where, model = device
        try:
            seconds = _time_matmul(torch, where, dtype, size, options)
        except RuntimeError as exc:  # a CUDA error: the device could not compute
            return _Throughput(label, model, None, error=one_line(exc, 160))
        if seconds is None:
            return _Throughput(label, model, None, error="the product holds non-finite values")
        return _Throughput(label, model, 2.0 * size**3 / seconds / 1e12)

    @staticmethod
    def _judge(measured: _Throughput, context: CheckContext) -> _Throughput:
        given = match_baseline(measured.model, context.baselines)
        if given is not None:
            return replace(measured, baseline=given[1], baseline_source="given")
        builtin = match_baseline(
            measured.model, {name: b.tflops for name, b in BUILTIN_BASELINES.items()}
        )
        if builtin is not None:
            return replace(measured, baseline=builtin[1], baseline_source="builtin")
        return measured

    def _result(
        self, measured: list[_Throughput], dtype: str, size: int, options: CheckOptions
    ) -> CheckResult:
        values: dict[str, Measurement] = {
            "dtype": dtype,
            "size": size,
            "repeats": options.matmul_repeats,
            "min_fraction": options.matmul_min_fraction,
        }
        bad: list[str] = []
        for m in measured:
            values[key(m.device, "model")] = m.model
            values[key(m.device, "tflops")] = None if m.tflops is None else round(m.tflops, 4)
            values[key(m.device, "baseline_tflops")] = m.baseline
            values[key(m.device, "baseline_source")] = m.baseline_source
            if m.error is not None:
                values[key(m.device, "error")] = m.error
                bad.append(f"{m.device} ({m.model}): {m.error}")
            elif m.tflops is None or m.tflops <= 0:
                bad.append(f"{m.device} ({m.model}): no throughput")
            elif m.baseline is not None and m.tflops < options.matmul_min_fraction * m.baseline:
                bad.append(
                    f"{m.device} {m.tflops:.3g} TFLOP/s < {options.matmul_min_fraction:g} × "
                    f"{m.baseline:.4g} baseline ({m.model})"
                )
        if bad:
            return result(self.name, CheckStatus.FAIL, "; ".join(bad), values)
        judged = [m for m in measured if m.baseline is not None]
        unjudged = [m for m in measured if m.baseline is None]
        parts = []
        if judged:
            low = min(m.tflops or 0.0 for m in judged)
            parts.append(
                f"{len(judged)} device(s) ≥ {options.matmul_min_fraction:g} × baseline "
                f"(lowest {low:.3g} TFLOP/s {dtype}, {judged[0].model})"
            )
        for m in unjudged:
            parts.append(
                f"{m.device}: {m.tflops or 0.0:.3g} TFLOP/s {dtype} measured; no baseline for "
                f"{m.model!r} (give one: --baseline-file or "
                f"{BASELINE_ENV_PREFIX}<MODEL>)"
            )
        return result(self.name, CheckStatus.PASS, "; ".join(parts), values)


def _time_matmul(
    torch: Any, device: Any, dtype: Any, size: int, options: CheckOptions
) -> float | None:
    """Median seconds of one ``size``² matmul on ``device``; None when the product is not finite."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    out = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(options.matmul_warmup):
        torch.matmul(a, b, out=out)
    times: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        pairs = []
        for _ in range(options.matmul_repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=out)
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1000.0 for s, e in pairs]
    else:
        for _ in range(options.matmul_repeats):
            began = time.perf_counter()
            torch.matmul(a, b, out=out)
            times.append(time.perf_counter() - began)
    if not bool(torch.isfinite(out).all()):
        return None
    return float(statistics.median(times))


def _expected_gpus(raw: str | None) -> int | None:
    """The GPU count of ``MINDER_SELFCHECK_EXPECTED_GPUS`` (None: unset or not a count >= 0)."""
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw.strip())


def _nvidia_device_files(dev_root: Path) -> list[Path]:
    """``/dev/nvidia0``, ``/dev/nvidia1``, … (one per GPU the driver knows)."""
    try:
        found = [p for p in dev_root.iterdir() if re.fullmatch(r"nvidia\d+", p.name)]
    except OSError:
        return []
    return sorted(found, key=lambda p: int(p.name[len("nvidia") :]))


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return one_line(value, 120)
    except OSError:
        pass
    return os.uname().machine


# -- XIDs in the kernel log ------------------------------------------------------------------

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)[^)]*\): (\d+)"
)


def pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """``(domain, bus, device)`` of a PCI address: ``00000000:3B:00.0`` (NVML) or ``0000:3b:00``
    (the kernel log)."""
    match = re.fullmatch(
        r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?\s*", bus_id
    )
    if match is None:
        return None
    return (int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16))


def kernel_xids(
    kmsg: Path, since_monotonic_s: float
) -> dict[tuple[int, int, int], list[int]] | str:
    """XID codes the NVIDIA driver logged at or after ``since_monotonic_s`` (CLOCK_MONOTONIC, the
    kernel log's clock), by GPU ``(domain, bus, device)``; a string saying why when the log
    cannot be read (``/dev/kmsg`` needs root, or ``CAP_SYSLOG``).

    Records are ``priority,sequence,microseconds,flags;message`` (Documentation/ABI/testing/
    dev-kmsg); ``/dev/kmsg`` gives one per read, a saved copy many.
    """
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return f"{kmsg}: {exc.strerror or exc}"
    found: dict[tuple[int, int, int], list[int]] = {}
    try:
        for line in _kmsg_lines(fd):
            header, sep, message = line.partition(";")
            parts = header.split(",")
            if not sep or len(parts) < 3:
                continue
            try:
                stamp = int(parts[2]) / 1e6
            except ValueError:
                continue
            match = _XID.search(message)
            if match is None or stamp < since_monotonic_s:
                continue
            where = (int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16))
            found.setdefault(where, []).append(int(match.group(4)))
    except OSError as exc:
        return f"{kmsg}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return found


def _kmsg_lines(fd: int) -> Iterator[str]:
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break  # /dev/kmsg: no more records
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # records overwritten while reading: go on
                continue
            raise
        if not chunk:
            break  # a regular file's end
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            if raw and not raw.startswith(b" "):  # " KEY=value" continuation lines
                yield raw.decode("utf-8", errors="replace")
    if pending.strip():
        yield pending.decode("utf-8", errors="replace")


# -- gpu.nvml --------------------------------------------------------------------------------


class _LostError(Exception):
    """NVML says the GPU is lost."""


@dataclass(slots=True)
class _Health:
    """What NVML says of one GPU (None: not supported by this GPU or driver)."""

    index: int
    name: str = "?"
    bus_id: str | None = None
    lost: str | None = None
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    remap: tuple[int, int, bool, bool] | None = None
    """Remapped rows: correctable, uncorrectable, pending, failure (Ampere and later)."""
    retired_pending: bool | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pstate: int | None = None
    nvlink_links: int = 0
    """Links NVML answers for (the device's own)."""
    nvlink_active: int = 0
    unreadable: list[str] = field(default_factory=list)

    @property
    def device(self) -> str:
        return f"gpu{self.index}"


class NvmlCheck(Check):
    """``gpu.nvml``: NVML's view of each GPU's health.

    Fails on an uncorrectable (volatile) ECC error, a row remap pending (the GPU needs a reset)
    or failed (it needs service), retired pages pending before Ampere, a PCIe link narrower than
    its maximum and than expected, a PCIe generation below its maximum and below expected while
    the GPU is in P0 (an idle GPU lowers its link speed on purpose), and fewer active NVLinks
    than expected. "Expected" is the ``pcie_width_expected``, ``pcie_gen_expected`` or
    ``nvlink_expected`` option, else the best GPU of the same model on the node: cloud VMs
    report every GPU at x8 of x16, which is their platform, not a fault.
    XIDs the driver logged within ``xid_lookback_s`` are recorded, not judged: most are caused
    by applications, and the fault that drained the node is usually among them.

    Parameters
    ----------
    nvml
        A module-like object with pynvml's functions and ``NVMLError`` classes; None imports
        ``pynvml``.
    """

    name = "gpu.nvml"
    description = "NVML: uncorrectable ECC, row remapping, PCIe link, NVLink state; XIDs noted"

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml

    def unavailable(self, context: CheckContext) -> str | None:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                return "pynvml not installed: pip install nvidia-ml-py"
        return None

    def run(self, context: CheckContext) -> CheckResult:
        nvml = self._nvml
        assert nvml is not None  # set by unavailable(), which the runner calls first
        error = self._error("NVMLError")
        try:
            nvml.nvmlInit()
        except error as exc:
            return skipped(self.name, f"NVML is absent: {one_line(exc, 120)}")
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                return skipped(self.name, "NVML found no GPU")
            gpus = [self._read(index) for index in range(count)]
        finally:
            try:
                nvml.nvmlShutdown()
            except error as exc:
                logger.debug("selfcheck: nvmlShutdown failed: %s", exc)
        since = time.monotonic() - context.options.xid_lookback_s
        xids = kernel_xids(context.kmsg_path, since)
        return self._judge(gpus, xids, context.options)

    def _error(self, name: str) -> type[BaseException]:
        found = getattr(self._nvml, name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            return found
        return _NeverRaisedError

    def _ask(self, gpu: _Health, fn_name: str, *args: Any) -> Any:
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            return None
        absent = (
            self._error("NVMLError_NotSupported"),
            self._error("NVMLError_FunctionNotFound"),
            self._error("NVMLError_InvalidArgument"),
        )
        try:
            return fn(*args)
        except absent:
            return None
        except (self._error("NVMLError_GpuIsLost"), self._error("NVMLError_GpuNotFound")) as exc:
            raise _LostError(str(exc)) from exc
        except self._error("NVMLError") as exc:
            gpu.unreadable.append(f"{fn_name}: {one_line(exc, 60)}")
            return None

    def _read(self, index: int) -> _Health:
        nvml: Any = self._nvml
        gpu = _Health(index)
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except (self._error("NVMLError_GpuIsLost"), self._error("NVMLError_GpuNotFound")) as exc:
            gpu.lost = one_line(exc, 80)
            return gpu
        try:
            self._read_device(gpu, handle)
        except _LostError as exc:
            gpu.lost = one_line(exc, 80)
        return gpu

    def _read_device(self, gpu: _Health, handle: Any) -> None:
        nvml: Any = self._nvml
        name = self._ask(gpu, "nvmlDeviceGetName", handle)
        gpu.name = _str(name) if name is not None else "?"
        pci = self._ask(gpu, "nvmlDeviceGetPciInfo", handle)
        if pci is not None:
            bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
            gpu.bus_id = _str(bus) if bus is not None else None
        volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
        for kind, attribute in (
            ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "ecc_uncorrected"),
            ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "ecc_corrected"),
        ):
            count = self._ask(
                gpu, "nvmlDeviceGetTotalEccErrors", handle, getattr(nvml, kind, 0), volatile
            )
            setattr(gpu, attribute, None if count is None else int(count))
        remap = self._ask(gpu, "nvmlDeviceGetRemappedRows", handle)
        if remap is not None:
            corr, unc, pending, failure = remap
            gpu.remap = (int(corr), int(unc), bool(pending), bool(failure))
        else:  # before Ampere: page retirement
            pending = self._ask(gpu, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
            gpu.retired_pending = None if pending is None else bool(int(pending))
            for cause, attribute in (
                ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", "retired_sbe"),
                ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", "retired_dbe"),
            ):
                if hasattr(nvml, cause):
                    pages = self._ask(
                        gpu, "nvmlDeviceGetRetiredPages", handle, getattr(nvml, cause)
                    )
                    setattr(gpu, attribute, None if pages is None else len(pages))
        for fn_name, attribute in (
            ("nvmlDeviceGetCurrPcieLinkGeneration", "pcie_gen"),
            ("nvmlDeviceGetMaxPcieLinkGeneration", "pcie_gen_max"),
            ("nvmlDeviceGetCurrPcieLinkWidth", "pcie_width"),
            ("nvmlDeviceGetMaxPcieLinkWidth", "pcie_width_max"),
            ("nvmlDeviceGetPerformanceState", "pstate"),
        ):
            value = self._ask(gpu, fn_name, handle)
            setattr(gpu, attribute, None if value is None else int(value))
        if getattr(nvml, "nvmlDeviceGetNvLinkState", None) is not None:
            for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                state = self._ask(gpu, "nvmlDeviceGetNvLinkState", handle, link)
                if state is None:
                    continue  # not a link of this device
                gpu.nvlink_links += 1
                gpu.nvlink_active += int(int(state) == 1)

    def _judge(
        self,
        gpus: list[_Health],
        xids: dict[tuple[int, int, int], list[int]] | str,
        options: CheckOptions,
    ) -> CheckResult:
        values: dict[str, Measurement] = {"gpus": len(gpus)}
        if isinstance(xids, str):
            values["xid_source"] = f"unreadable: {xids}"
        else:
            values["xid_lookback_s"] = options.xid_lookback_s
        peers: dict[str, _Peers] = {}
        for gpu in gpus:
            if gpu.lost is None:
                peers.setdefault(gpu.name, _Peers()).add(gpu)
        notes: list[str] = []
        faults: list[str] = []
        unreadable: list[str] = []
        for gpu in gpus:
            d = gpu.device
            values[key(d, "name")] = gpu.name
            values[key(d, "bus_id")] = gpu.bus_id
            if gpu.lost is not None:
                values[key(d, "lost")] = gpu.lost
                faults.append(f"{d}: NVML reports the GPU lost ({gpu.lost})")
                continue
            faults += self._faults(gpu, values, peers[gpu.name], options, notes)
            if not isinstance(xids, str):
                where = pci_key(gpu.bus_id) if gpu.bus_id else None
                codes = xids.get(where, []) if where is not None else []
                values[key(d, "xid_count")] = len(codes)
                values[key(d, "xids")] = ",".join(str(c) for c in codes[-20:]) or None
            unreadable += [f"{d} {what}" for what in gpu.unreadable]
        if unreadable:
            values["unreadable"] = one_line("; ".join(unreadable), 400)
        if faults:
            return result(self.name, CheckStatus.FAIL, "; ".join(faults), values)
        if unreadable:
            return result(
                self.name, CheckStatus.ERROR, f"NVML could not answer: {unreadable[0]}", values
            )
        links = sum(g.nvlink_active for g in gpus)
        noted = f"; {'; '.join(notes)}" if notes else ""
        return result(
            self.name,
            CheckStatus.PASS,
            f"{len(gpus)} GPU(s) healthy: no uncorrectable ECC error, no row remap pending or "
            f"failed, PCIe links as expected, {links} NVLink(s) active{noted}",
            values,
        )

    @staticmethod
    def _faults(
        gpu: _Health,
        values: dict[str, Measurement],
        peers: _Peers,
        options: CheckOptions,
        notes: list[str],
    ) -> list[str]:
        d = gpu.device
        faults: list[str] = []
        values[key(d, "ecc_uncorrected")] = gpu.ecc_uncorrected
        values[key(d, "ecc_corrected")] = gpu.ecc_corrected
        if gpu.ecc_uncorrected:
            faults.append(f"{d}: {gpu.ecc_uncorrected} uncorrectable ECC error(s) (volatile)")
        if gpu.remap is not None:
            corr, unc, pending, failure = gpu.remap
            values[key(d, "remapped_rows_correctable")] = corr
            values[key(d, "remapped_rows_uncorrectable")] = unc
            values[key(d, "remap_pending")] = pending
            values[key(d, "remap_failed")] = failure
            if failure:
                faults.append(f"{d}: row remapping failed (the GPU needs service)")
            if pending:
                faults.append(f"{d}: a row remap is pending (the GPU needs a reset)")
        if gpu.retired_pending is not None or gpu.retired_sbe is not None:
            values[key(d, "retired_pages_pending")] = gpu.retired_pending
            values[key(d, "retired_pages_sbe")] = gpu.retired_sbe
            values[key(d, "retired_pages_dbe")] = gpu.retired_dbe
            if gpu.retired_pending:
                faults.append(f"{d}: retired pages pending (the GPU needs a reset)")
        for attribute in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "pstate"):
            values[key(d, attribute)] = getattr(gpu, attribute)
        faults += _pcie_faults(gpu, peers, options, notes)
        values[key(d, "nvlink_links")] = gpu.nvlink_links
        values[key(d, "nvlink_active")] = gpu.nvlink_active
        expected = options.nvlink_expected or peers.nvlink_active
        if gpu.nvlink_links and gpu.nvlink_active < expected:
            whence = "expected" if options.nvlink_expected else "its peers have"
            faults.append(f"{d}: {gpu.nvlink_active} NVLink(s) active, {whence} {expected}")
        return faults


@dataclass(slots=True)
class _Peers:
    """The best of the GPUs of one model on this node: what each of them is judged against
    where no expected figure is set."""

    nvlink_active: int = 0
    pcie_width: int = 0
    pcie_gen_in_p0: int = 0

    def add(self, gpu: _Health) -> None:
        self.nvlink_active = max(self.nvlink_active, gpu.nvlink_active)
        self.pcie_width = max(self.pcie_width, gpu.pcie_width or 0)
        if gpu.pstate == 0:
            self.pcie_gen_in_p0 = max(self.pcie_gen_in_p0, gpu.pcie_gen or 0)


def _pcie_faults(gpu: _Health, peers: _Peers, options: CheckOptions, notes: list[str]) -> list[str]:
    """A link below its maximum fails when it is also below what is expected of it: the
    ``pcie_*_expected`` option, else the best peer of the same model. Where every GPU of the
    model is below its maximum alike (cloud VMs report x8 of x16), that is the platform's: noted.
    The generation is judged in P0 only: an idle GPU lowers its link speed on purpose."""
    d = gpu.device
    faults: list[str] = []
    width, widest = gpu.pcie_width, gpu.pcie_width_max
    if width is not None and widest and width < widest:
        expected = options.pcie_width_expected or peers.pcie_width
        if width < expected:
            whence = "expected" if options.pcie_width_expected else "its widest peer has"
            faults.append(f"{d}: PCIe link x{width} of x{widest} ({whence} x{expected})")
        else:
            notes.append(f"{d} PCIe x{width} of x{widest} like its peers")
    gen, fastest = gpu.pcie_gen, gpu.pcie_gen_max
    if gen is not None and fastest and gen < fastest and gpu.pstate == 0:
        expected = options.pcie_gen_expected or peers.pcie_gen_in_p0
        if gen < expected:
            whence = "expected" if options.pcie_gen_expected else "its best peer runs"
            faults.append(f"{d}: PCIe gen {gen} of {fastest} in P0 ({whence} gen {expected})")
        else:
            notes.append(f"{d} PCIe gen {gen} of {fastest} in P0 like its peers")
    return faults


class _NeverRaisedError(Exception):
    """Stands in for an ``NVMLError*`` class the module does not define: never raised."""


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# -- gpu.dcgm --------------------------------------------------------------------------------

_DCGM_ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")
"""The JSON document's top key: DCGM 3 (``DCGM GPU Diagnostic``) and 4 (``DCGM Diagnostic``)."""
_NO_HOST_ENGINE = re.compile(r"(host ?engine|connection|connect to)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class DcgmOutcome:
    """What a ``dcgmi diag -j`` document says."""

    tests: dict[str, str]
    """``category/test`` -> ``pass``, ``fail``, ``skip``, ``warn`` or what DCGM said."""
    failures: list[str]
    """One line per failing test (its GPUs and first warning)."""
    version: str | None = None
    runtime_error: str | None = None


def parse_dcgm_diag(text: str) -> DcgmOutcome:
    """Read ``dcgmi diag -r N -j``'s document (DCGM 3 and 4: ``test_categories`` -> ``tests`` ->
    per-GPU ``results`` and a ``test_summary``).

    Raises
    ------
    ValueError
        Not JSON, or none of DCGM's diagnostic documents.
    """
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    root = next((data[k] for k in _DCGM_ROOTS if isinstance(data.get(k), dict)), None)
    if root is None:
        raise ValueError(f"no {' or '.join(map(repr, _DCGM_ROOTS))} object")
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    version = root.get("version") or (metadata or {}).get("version")
    runtime = root.get("runtime_error") or data.get("runtime_error")
    tests: dict[str, str] = {}
    failures: list[str] = []
    for category in root.get("test_categories") or []:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            name = f"{category.get('category', '?')}/{test.get('name', '?')}"
            statuses: list[str] = []
            failed_gpus: list[str] = []
            first_warning = ""
            for entry in test.get("results") or []:
                if not isinstance(entry, dict):
                    continue
                status = str(entry.get("status", "")).strip().lower()
                statuses.append(status)
                if status == "fail":
                    failed_gpus.append(_dcgm_entity(entry))
                    first_warning = first_warning or _dcgm_warning(entry)
            summary = test.get("test_summary")
            if isinstance(summary, dict) and summary.get("status"):
                statuses.append(str(summary["status"]).strip().lower())
            overall = (
                "fail"
                if "fail" in statuses
                else "warn"
                if "warn" in statuses
                else "pass"
                if "pass" in statuses
                else (statuses[0] if statuses else "unknown")
            )
            tests[name] = overall
            if overall == "fail":
                where = f" on {', '.join(g for g in failed_gpus if g)}" if any(failed_gpus) else ""
                why = f": {first_warning}" if first_warning else ""
                failures.append(one_line(f"{name}{where}{why}", 200))
    return DcgmOutcome(
        tests,
        failures,
        None if version is None else str(version),
        None if not runtime else one_line(runtime, 200),
    )


def _dcgm_entity(entry: Mapping[str, Any]) -> str:
    for name in ("entity_id", "gpu_id"):
        if entry.get(name) is not None:
            return f"GPU {entry[name]}"
    ids = entry.get("gpu_ids")
    if isinstance(ids, list) and ids:
        return f"GPU {','.join(map(str, ids))}"
    return f"GPU {ids}" if isinstance(ids, str | int) and str(ids) else ""


def _dcgm_warning(entry: Mapping[str, Any]) -> str:
    for item in entry.get("warnings") or []:
        if isinstance(item, dict) and item.get("warning"):
            return one_line(item["warning"], 120)
        if isinstance(item, str) and item:
            return one_line(item, 120)
    return ""


class DcgmCheck(Check):
    """``gpu.dcgm``: DCGM's quick diagnostic, ``dcgmi diag -r 1 -j`` (deployment and software
    checks, a few seconds). Any test ``Fail`` fails the check; a DCGM without a running
    ``nv-hostengine`` is skipped, saying so."""

    name = "gpu.dcgm"
    description = "dcgmi diag -r 1 (DCGM's quick diagnostic) where DCGM is installed"

    def unavailable(self, context: CheckContext) -> str | None:
        if context.which("dcgmi") is None:
            return "dcgmi is not on PATH (DCGM is not installed)"
        return None

    def timeout_s(self, options: CheckOptions) -> float:
        return options.dcgm_timeout_s + 10.0

    def run(self, context: CheckContext) -> CheckResult:
        tool = context.which("dcgmi")
        if tool is None:
            return skipped(self.name, "dcgmi is not on PATH (DCGM is not installed)")
        timeout = context.tool_timeout(context.options.dcgm_timeout_s)
        ran = run_tool([tool, "diag", "-r", "1", "-j"], timeout, context.environ)
        if ran.timed_out:
            return result(
                self.name, CheckStatus.ERROR, f"dcgmi diag -r 1 did not finish within {timeout:g} s"
            )
        try:
            outcome = parse_dcgm_diag(ran.stdout)
        except ValueError as exc:
            output = f"{ran.stdout}\n{ran.stderr}"
            if _NO_HOST_ENGINE.search(output) and "{" not in ran.stdout:
                return skipped(
                    self.name,
                    f"dcgmi is installed but cannot reach nv-hostengine ({ran.why(120)})",
                )
            return result(
                self.name,
                CheckStatus.ERROR,
                f"dcgmi diag -r 1 gave no diagnostic ({ran.why(100)}; {one_line(exc, 80)})",
            )
        values: dict[str, Measurement] = {
            "version": outcome.version,
            "exit_status": ran.returncode,
            "tests": len(outcome.tests),
            "tests_failed": len(outcome.failures),
        }
        for name, status in list(outcome.tests.items())[:200]:
            values[key("test", name)] = status
        if outcome.runtime_error:
            values["runtime_error"] = outcome.runtime_error
        if outcome.failures:
            return result(
                self.name,
                CheckStatus.FAIL,
                f"dcgmi diag -r 1 failed: {'; '.join(outcome.failures)}",
                values,
            )
        if outcome.runtime_error or not outcome.tests:
            why = outcome.runtime_error or "no test ran"
            return result(self.name, CheckStatus.ERROR, f"dcgmi diag -r 1: {why}", values)
        return result(
            self.name,
            CheckStatus.PASS,
            f"dcgmi diag -r 1: {len(outcome.tests)} test(s), none failed",
            values,
        )
