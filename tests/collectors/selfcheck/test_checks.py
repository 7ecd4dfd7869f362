"""The checks of ``minder selfcheck run`` (collectors/selfcheck: gpu, network, host).

What can run here runs for real: the CPU matmul with torch, pynvml without a driver (skipped),
the kernel's ``ntp_adjtime``, ``shutil.disk_usage``. sysfs readers read trees laid out as the
kernel lays them out: built in tmp_path, and the real captured trees (the repo's mlx5 fixture,
node_exporter's when the shared data is present). NVML's health logic is driven by a fake with
pynvml's real functions' names, constants and error classes, seeded from real ``nvidia-smi -q
-x`` dumps. Tools that cannot run here (dcgmi, ib_write_bw, chronyc) are small scripts on a
test PATH that answer as the real tools do; each says so.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
from ttar import unpack_ttar

from collectors.selfcheck.base import GIB, CheckContext, CheckOptions, key, node_name
from collectors.selfcheck.gpu import (
    BUILTIN_BASELINES,
    EXPECTED_GPUS_ENV,
    TORCH_MISSING,
    DcgmCheck,
    MatmulCheck,
    NvmlCheck,
    baselines_from_environ,
    kernel_xids,
    load_baseline_file,
    match_baseline,
    parse_dcgm_diag,
    pci_key,
)
from collectors.selfcheck.host import (
    KERNEL_MAX_ERROR_S,
    ClockCheck,
    ClockReading,
    DiskCheck,
    MemoryEccCheck,
    clock_from_timex,
    parse_chronyc_tracking,
    parse_timedatectl,
    read_adjtimex,
)
from collectors.selfcheck.network import (
    IbWriteBwCheck,
    RdmaCheck,
    parse_ib_write_bw,
    read_ports,
)
from minder.core.errors import ValidationError
from minder.core.selfcheck import CheckResult, CheckStatus

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
SHARED = TESTS.parent / ".." / "shared" / "data"
SMI_XML = SHARED / "nvidia-smi-xml"
EIGHT_NIC = TESTS / "collectors" / "fixtures" / "rdma" / "mlx5_8nic.ttar"
SMALL = CheckOptions(matmul_size_cpu=128, matmul_warmup=1, matmul_repeats=3)
"""Options that keep the CPU matmul to a few milliseconds where its figure does not matter."""


def _shared(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data {path} is absent (read-only data beside the repo)")
    return path


def _context(tmp_path: Path, **changes: Any) -> CheckContext:
    """A context on empty trees: no GPU device files, no sysfs, no kernel log."""
    (tmp_path / "dev").mkdir(exist_ok=True)
    (tmp_path / "sys").mkdir(exist_ok=True)
    base = CheckContext(
        environ={"PATH": str(tmp_path / "bin")},
        options=SMALL,
        sysfs_root=tmp_path / "sys",
        dev_root=tmp_path / "dev",
        kmsg_path=tmp_path / "kmsg",
        timeout_s=60.0,
    )
    return replace(base, **changes)


def _tool(tmp_path: Path, name: str, script: str) -> Path:
    """An executable ``name`` in ``tmp_path/bin`` running ``script`` with this Python."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- options ---------------------------------------------------------------------------------


def test_options_come_from_their_variables_and_refuse_bad_values_in_one_line() -> None:
    options = CheckOptions.from_environ(
        {
            "MINDER_SELFCHECK_MATMUL_MIN_FRACTION": "0.6",
            "MINDER_SELFCHECK_DISK_PATHS": "/scratch, /data,",
            "MINDER_SELFCHECK_MATMUL_REPEATS": "4",
            "MINDER_SELFCHECK_NODES": "n1,n2",  # the launch's, not an option
        }
    )
    assert options.matmul_min_fraction == 0.6
    assert options.disk_paths == ("/scratch", "/data")
    assert options.matmul_repeats == 4
    assert options.clock_max_offset_s == CheckOptions().clock_max_offset_s
    for variable, value, expected in [
        ("MINDER_SELFCHECK_MATMUL_MIN_FRACTION", "abc", "expected a number"),
        ("MINDER_SELFCHECK_MATMUL_MIN_FRACTION", "1.5", "expected <= 1.0"),
        ("MINDER_SELFCHECK_MATMUL_REPEATS", "2.5", "expected a whole number"),
        ("MINDER_SELFCHECK_MATMUL_REPEATS", "0", "expected >= 1"),
        ("MINDER_SELFCHECK_CLOCK_MAX_OFFSET_S", "nan", "expected >= 0.0"),
    ]:
        with pytest.raises(ValidationError) as caught:
            CheckOptions.from_environ({variable: value})
        message = str(caught.value)
        assert variable in message and expected in message and "\n" not in message
    documented = {name for name, _, _ in CheckOptions.documented()}
    assert "MINDER_SELFCHECK_DISK_MIN_FREE_BYTES" in documented


def test_node_name_follows_the_launch_then_slurm_then_the_host() -> None:
    assert node_name({"MINDER_SELFCHECK_NODE": "n7", "SLURMD_NODENAME": "s7"}) == "n7"
    assert node_name({"SLURMD_NODENAME": "s7"}) == "s7"
    assert node_name({}) == os.uname().nodename


def test_measurement_keys_fit_the_reports_rule() -> None:
    assert key("disk[/scratch space]", "free_bytes") == "disk[/scratch_space].free_bytes"
    assert len(key("x" * 200)) == 64


# -- baselines -------------------------------------------------------------------------------


def test_a_device_model_matches_its_longest_baseline_name() -> None:
    table = {name: b.tflops for name, b in BUILTIN_BASELINES.items()}
    assert match_baseline("NVIDIA H100 PCIe", table) == ("h100 pcie", pytest.approx(529.2))
    assert match_baseline("NVIDIA H100 NVL", table)[0] == "h100 nvl"  # type: ignore[index]
    assert match_baseline("NVIDIA H200", table)[0] == "h200"  # type: ignore[index]
    assert match_baseline("NVIDIA H200 NVL", table)[0] == "h200 nvl"  # type: ignore[index]
    assert match_baseline("NVIDIA A100-SXM4-80GB", table)[0] == "a100 sxm4"  # type: ignore[index]
    assert match_baseline("NVIDIA A100-PCIE-40GB", table)[0] == "a100 pcie"  # type: ignore[index]
    assert match_baseline("NVIDIA A10G", table) is None  # not "a100": whole words only
    assert match_baseline("CPU Intel(R) Xeon(R) Platinum 8480+", {"cpu": 2.0}) == ("cpu", 2.0)


def test_baselines_come_from_a_file_and_from_variables(tmp_path: Path) -> None:
    good = tmp_path / "baselines.json"
    good.write_text(json.dumps({"NVIDIA H100 PCIe": 600, "cpu": "0.5"}))
    assert load_baseline_file(good) == {"nvidia h100 pcie": 600.0, "cpu": 0.5}
    assert baselines_from_environ(
        {"MINDER_SELFCHECK_BASELINE_H100_PCIE": "550", "PATH": "/bin"}
    ) == {"h100 pcie": 550.0}
    for content, expected in [
        ("not json", "is not JSON"),
        ("[1, 2]", "holds list"),
        (json.dumps({"H100": -3}), "expected a positive number"),
        (json.dumps({"H100": True}), "expected a positive number"),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(ValidationError, match=expected):
            load_baseline_file(bad)
    with pytest.raises(ValidationError, match="cannot be read"):
        load_baseline_file(tmp_path / "missing.json")
    with pytest.raises(ValidationError, match="MINDER_SELFCHECK_BASELINE_CPU"):
        baselines_from_environ({"MINDER_SELFCHECK_BASELINE_CPU": "fast"})


# -- gpu.matmul ------------------------------------------------------------------------------


def test_the_cpu_matmul_really_runs_and_passes_without_a_baseline(tmp_path: Path) -> None:
    check = MatmulCheck()
    context = _context(tmp_path, options=CheckOptions())  # the real size: 0.2-1 s here
    assert check.unavailable(context) is None
    began = time.monotonic()
    got = check.run(context)
    took = time.monotonic() - began
    assert got.status is CheckStatus.PASS, got.summary
    tflops = got.measurements["cpu.tflops"]
    assert isinstance(tflops, float) and tflops > 0
    assert got.measurements["dtype"] == "fp32"
    assert got.measurements["size"] == CheckOptions().matmul_size_cpu
    assert str(got.measurements["cpu.model"]).startswith("CPU ")
    assert got.measurements["cpu.baseline_tflops"] is None
    assert "no baseline" in got.summary
    assert took < 30  # the size was chosen for about a second here


def test_a_baseline_above_what_the_machine_can_do_fails_it(tmp_path: Path) -> None:
    impossible = _context(tmp_path, baselines={"cpu": 1e6})
    got = MatmulCheck().run(impossible)
    assert got.status is CheckStatus.FAIL
    assert "baseline" in got.summary and "cpu" in got.summary
    assert got.measurements["cpu.baseline_tflops"] == 1e6
    assert got.measurements["cpu.baseline_source"] == "given"
    easy = MatmulCheck().run(_context(tmp_path, baselines={"cpu": 1e-9}))
    assert easy.status is CheckStatus.PASS
    assert "≥ 0.7 × baseline" in easy.summary


def test_gpu_device_files_without_cuda_are_the_finding_not_a_cpu_run(tmp_path: Path) -> None:
    context = _context(tmp_path)
    for index in range(2):
        (context.dev_root / f"nvidia{index}").write_text("")
    (context.dev_root / "nvidiactl").write_text("")  # not a GPU
    got = MatmulCheck().run(context)
    # torch here is a CPU build: the node is misconfigured (error), not faulty
    assert got.status is CheckStatus.ERROR
    assert "CPU build" in got.summary and "2 NVIDIA GPU(s)" in got.summary
    assert got.measurements == {"gpu_device_files": 2}


def test_expected_gpus_with_none_visible_fail_the_cpu_fallback(tmp_path: Path) -> None:
    """A GPU node (the scheduler counts 8) where torch sees no CUDA and /dev has no GPU: the
    check must not pass on the CPU."""
    got = MatmulCheck().run(_context(tmp_path, environ={EXPECTED_GPUS_ENV: "8"}))
    assert got.status is CheckStatus.FAIL
    assert got.summary.startswith("only 0 of 8 GPUs visible")
    assert got.measurements == {"cuda_devices": 0, "expected_gpus": 8}
    zero = MatmulCheck().run(_context(tmp_path, environ={EXPECTED_GPUS_ENV: "0"}))
    assert zero.status is CheckStatus.PASS, zero.summary  # a CPU node: the CPU fallback runs
    bad = MatmulCheck().run(_context(tmp_path, environ={EXPECTED_GPUS_ENV: "eight"}))
    assert bad.status is CheckStatus.ERROR and "'eight'" in bad.summary


def test_fewer_cuda_devices_than_expected_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch sees 7 CUDA devices (CUDA_VISIBLE_DEVICES or the job's cgroup hides one) where the
    scheduler counts 8."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 7)
    context = _context(
        tmp_path, environ={EXPECTED_GPUS_ENV: "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6"}
    )
    got = MatmulCheck().run(context)
    assert got.status is CheckStatus.FAIL
    assert got.summary.startswith("only 7 of 8 GPUs visible")
    assert got.measurements == {"cuda_devices": 7, "expected_gpus": 8}


def test_without_torch_the_matmul_is_skipped_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert MatmulCheck().unavailable(_context(tmp_path)) == TORCH_MISSING


# -- gpu.nvml --------------------------------------------------------------------------------


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class FakeGpu:
    """NVML's answers for one GPU; ``None`` answers ``NotSupported``."""

    name: str
    bus_id: str
    pcie_gen: int
    pcie_gen_max: int
    pcie_width: int
    pcie_width_max: int
    pstate: int
    ecc_uncorrected: int | None = 0
    ecc_corrected: int | None = 0
    remap: tuple[int, int, int, int] | None = None
    retired: tuple[int, int, int] | None = None
    """Retired pages: multiple single-bit, double-bit, pending (before Ampere)."""
    nvlinks: list[int] = field(default_factory=list)
    """State of each link the GPU has (1 active)."""
    lost: bool = False
    broken: set[str] = field(default_factory=set)
    """Functions that answer NVML_ERROR_UNKNOWN."""


def _smi_text(gpu: ET.Element, path: str) -> str:
    node = gpu.find(path)
    assert node is not None and node.text is not None, path
    return node.text.strip()


def _smi_int(gpu: ET.Element, path: str) -> int | None:
    text = _smi_text(gpu, path).rstrip("x")
    return int(text) if text.isdigit() else None


def gpu_from_smi_xml(path: Path, bus_id: str | None = None) -> FakeGpu:
    """A GPU answering as the one of a real ``nvidia-smi -q -x`` dump."""
    gpu = ET.parse(path).getroot().find("gpu")
    assert gpu is not None
    link = "pci/pci_gpu_link_info/"
    ecc = "ecc_errors/volatile/"
    unc = [_smi_int(gpu, ecc + k) for k in ("sram_uncorrectable", "dram_uncorrectable")]
    cor = [_smi_int(gpu, ecc + k) for k in ("sram_correctable", "dram_correctable")]
    sbe = _smi_int(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")
    dbe = _smi_int(gpu, "retired_pages/double_bit_retirement/retired_count")
    pending = _smi_text(gpu, "retired_pages/pending_retirement")
    remapped = gpu.find("remapped_rows")
    remap = None
    if remapped is not None and len(remapped):
        remap = (
            _smi_int(remapped, "remapped_row_corr") or 0,
            _smi_int(remapped, "remapped_row_unc") or 0,
            int(_smi_text(remapped, "remapped_row_pending") == "Yes"),
            int(_smi_text(remapped, "remapped_row_failure") == "Yes"),
        )
    return FakeGpu(
        name=_smi_text(gpu, "product_name"),
        bus_id=bus_id or _smi_text(gpu, "pci/pci_bus_id"),
        pcie_gen=_smi_int(gpu, link + "pcie_gen/current_link_gen") or 0,
        pcie_gen_max=_smi_int(gpu, link + "pcie_gen/max_link_gen") or 0,
        pcie_width=_smi_int(gpu, link + "link_widths/current_link_width") or 0,
        pcie_width_max=_smi_int(gpu, link + "link_widths/max_link_width") or 0,
        pstate=int(_smi_text(gpu, "performance_state").lstrip("P")),
        ecc_uncorrected=None if None in unc else sum(u or 0 for u in unc),
        ecc_corrected=None if None in cor else sum(c or 0 for c in cor),
        remap=remap,
        retired=None if sbe is None or dbe is None else (sbe, dbe, int(pending == "Yes")),
    )


class FakeNvml:
    """A stand-in for ``pynvml`` (no GPU here): the functions :class:`NvmlCheck` calls, with
    pynvml's names, constants and ``NVMLError`` classes, answering as NVML does (NotSupported
    for what a GPU lacks, InvalidArgument for a link it does not have, GpuIsLost for a lost GPU).
    """

    def __init__(self, gpus: list[FakeGpu], *, library_present: bool = True) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.library_present = library_present
        self.initialized = False

    def _gpu(self, handle: _Handle, name: str) -> FakeGpu:
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if name in gpu.broken:
            raise pynvml.NVMLError_Unknown()
        return gpu

    def nvmlInit(self) -> None:
        if not self.library_present:
            raise pynvml.NVMLError_LibraryNotFound()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id.encode()
        return info

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if counter != pynvml.NVML_VOLATILE_ECC:
            raise pynvml.NVMLError_InvalidArgument()
        uncorrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        value = gpu.ecc_uncorrected if uncorrected else gpu.ecc_corrected
        if value is None:
            raise pynvml.NVMLError_NotSupported()
        return value

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        if gpu.remap is None:
            raise pynvml.NVMLError_NotSupported()
        return gpu.remap

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        if gpu.retired is None:
            raise pynvml.NVMLError_NotSupported()
        return pynvml.NVML_FEATURE_ENABLED if gpu.retired[2] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        if gpu.retired is None:
            raise pynvml.NVMLError_NotSupported()
        multiple = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        count = gpu.retired[0] if cause == multiple else gpu.retired[1]
        return [0x1000 * (i + 1) for i in range(count)]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    def nvmlDeviceGetPerformanceState(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPerformanceState").pstate

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
        if not gpu.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= link < len(gpu.nvlinks):
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.nvlinks[link]


def _a100_node(count: int = 8, **changes: Any) -> list[FakeGpu]:
    """``count`` A100-SXM4 answering as the real dump's, each on its own bus, 12 NVLinks up."""
    base = gpu_from_smi_xml(_shared("nvidia-smi-xml", "a100-sxm4-v12.xml"))
    return [
        replace(base, bus_id=f"00000000:{0x10 * (i + 1):02X}:00.0", nvlinks=[1] * 12, **changes)
        for i in range(count)
    ]


def _nvml(gpus: list[FakeGpu], tmp_path: Path, **options: Any) -> CheckResult:
    check = NvmlCheck(FakeNvml(gpus))
    context = _context(tmp_path, options=replace(SMALL, **options))
    assert check.unavailable(context) is None
    return check.run(context)


def test_real_pynvml_without_a_driver_is_skipped_saying_nvml_is_absent(tmp_path: Path) -> None:
    check = NvmlCheck()
    context = _context(tmp_path)
    assert check.unavailable(context) is None  # pynvml is installed
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver: NVML is present")
    got = check.run(context)
    assert got.status is CheckStatus.SKIPPED
    assert got.summary.startswith("NVML is absent")


def test_healthy_a100s_of_a_real_dump_pass(tmp_path: Path) -> None:
    got = _nvml(_a100_node(), tmp_path)
    assert got.status is CheckStatus.PASS, got.summary
    assert "8 GPU(s) healthy" in got.summary and "96 NVLink(s) active" in got.summary
    assert got.measurements["gpu0.name"] == "NVIDIA A100-SXM4-80GB"
    assert got.measurements["gpu0.pcie_width"] == 16
    assert got.measurements["gpu0.pstate"] == 0
    assert got.measurements["gpu7.nvlink_active"] == 12
    assert got.measurements["xid_source"].startswith("unreadable")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ({"ecc_uncorrected": 2}, "gpu3: 2 uncorrectable ECC error(s)"),
        ({"remap": (0, 1, 1, 0)}, "gpu3: a row remap is pending"),
        ({"remap": (0, 64, 0, 1)}, "gpu3: row remapping failed"),
        ({"pcie_width": 8}, "gpu3: PCIe link x8 of x16 (its widest peer has x16)"),
        ({"pcie_gen": 3}, "gpu3: PCIe gen 3 of 4 in P0 (its best peer runs gen 4)"),
        ({"nvlinks": [1] * 10 + [0, 0]}, "gpu3: 10 NVLink(s) active, its peers have 12"),
        ({"lost": True}, "gpu3: NVML reports the GPU lost"),
    ],
)
def test_one_faulty_a100_among_eight_fails_naming_it(
    tmp_path: Path, fault: dict[str, Any], expected: str
) -> None:
    gpus = _a100_node()
    gpus[3] = replace(gpus[3], **fault)
    got = _nvml(gpus, tmp_path)
    assert got.status is CheckStatus.FAIL
    assert expected in got.summary
    assert "gpu2" not in got.summary


def test_a_slower_link_while_idle_is_power_saving_not_a_fault(tmp_path: Path) -> None:
    gpus = _a100_node()
    gpus[3] = replace(gpus[3], pcie_gen=1, pstate=8)  # idle: the link slows on purpose
    got = _nvml(gpus, tmp_path)
    assert got.status is CheckStatus.PASS
    assert got.measurements["gpu3.pcie_gen"] == 1


def test_cloud_gpus_at_x8_of_x16_are_the_platform_unless_x16_is_expected(tmp_path: Path) -> None:
    t4 = gpu_from_smi_xml(_shared("nvidia-smi-xml", "tesla-t4.xml"))  # x8 of x16 in P0 on EC2
    a10g = gpu_from_smi_xml(_shared("nvidia-smi-xml", "a10g.xml"))  # x8 of x16, gen 1 in P8
    assert (t4.pcie_width, t4.pcie_width_max, t4.pstate) == (8, 16, 0)
    for gpu in (t4, a10g):
        got = _nvml([gpu], tmp_path)
        assert got.status is CheckStatus.PASS, got.summary
        assert "PCIe x8 of x16 like its peers" in got.summary
    strict = _nvml([t4], tmp_path, pcie_width_expected=16)
    assert strict.status is CheckStatus.FAIL
    assert "gpu0: PCIe link x8 of x16 (expected x16)" in strict.summary


def test_retired_pages_pending_fail_a_gpu_before_ampere(tmp_path: Path) -> None:
    t4 = gpu_from_smi_xml(_shared("nvidia-smi-xml", "tesla-t4.xml"))
    assert t4.retired == (0, 0, 0)
    healthy = _nvml([t4], tmp_path)
    assert healthy.measurements["gpu0.retired_pages_pending"] is False
    pending = _nvml([replace(t4, retired=(2, 1, 1))], tmp_path)
    assert pending.status is CheckStatus.FAIL
    assert "retired pages pending" in pending.summary
    assert pending.measurements["gpu0.retired_pages_dbe"] == 1


def test_an_nvml_query_that_fails_otherwise_makes_the_check_give_no_answer(
    tmp_path: Path,
) -> None:
    gpus = _a100_node(2)
    gpus[1] = replace(gpus[1], broken={"nvmlDeviceGetTotalEccErrors"})
    got = _nvml(gpus, tmp_path)
    assert got.status is CheckStatus.ERROR
    assert "gpu1 nvmlDeviceGetTotalEccErrors" in got.summary


def test_xids_of_the_kernel_log_are_recorded_per_gpu_not_judged(tmp_path: Path) -> None:
    gpus = _a100_node(2)
    now_us = int(time.monotonic() * 1e6)
    # The kernel log is dated by the monotonic clock (time since boot): the lookback is kept
    # short so that an XID older than it exists on a machine booted minutes ago (a CI runner).
    lookback_s = 30.0
    if now_us < 70 * 1e6:
        time.sleep(70 - now_us / 1e6)
        now_us = int(time.monotonic() * 1e6)
    old_us = now_us - int(2 * lookback_s * 1e6)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        f"4,100,{old_us},-;NVRM: Xid (PCI:0000:10:00): 79, pid=1, GPU has fallen off the bus.\n"
        f"4,101,{now_us - 5_000_000},-;NVRM: Xid (PCI:0000:20:00): 48, pid=7, DBE.\n"
        " SUBSYSTEM=pci\n"
        f"6,102,{now_us - 4_000_000},-;eth0: link up\n"
        f"4,103,{now_us - 3_000_000},-;NVRM: Xid (PCI:0000:20:00): 63, pid=7, row remap\n"
    )
    check = NvmlCheck(FakeNvml(gpus))
    options = replace(SMALL, xid_lookback_s=lookback_s)
    context = _context(tmp_path, kmsg_path=kmsg, options=options)
    check.unavailable(context)
    got = check.run(context)
    assert got.status is CheckStatus.PASS  # recorded, not judged
    assert got.measurements["gpu0.xid_count"] == 0  # its XID 79 is older than the lookback
    assert got.measurements["gpu1.xid_count"] == 2
    assert got.measurements["gpu1.xids"] == "48,63"
    assert got.measurements["xid_lookback_s"] == lookback_s


def test_kernel_xids_and_pci_addresses(tmp_path: Path) -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == (0, 0x3B, 0)
    assert pci_key("garbage") is None
    missing = kernel_xids(tmp_path / "nope", 0.0)
    assert isinstance(missing, str) and "No such file" in missing
    log = tmp_path / "kmsg"
    log.write_text("4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n")
    assert kernel_xids(log, 0.0) == {(0, 0x3B, 0): [13]}
    assert kernel_xids(log, 6.0) == {}


# -- gpu.dcgm --------------------------------------------------------------------------------

# dcgmi diag -r 1 -j documents shaped as DCGM 4 writes them ("DCGM Diagnostic", per-entity
# results, a test_summary) and as DCGM 3 did ("DCGM GPU Diagnostic", gpu_ids).
DCGM4_PASS = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {
                        "name": "software",
                        "results": [
                            {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                            {"entity_group": "GPU", "entity_id": 1, "status": "Pass"},
                        ],
                        "test_summary": {"status": "Pass"},
                    },
                    {"name": "denylist", "test_summary": {"status": "Skip"}},
                ],
            }
        ]
    },
    "metadata": {"version": "4.2.3"},
}
DCGM4_FAIL = json.loads(json.dumps(DCGM4_PASS))
DCGM4_FAIL["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][1] = {
    "entity_group": "GPU",
    "entity_id": 1,
    "status": "Fail",
    "warnings": [{"error_id": 95, "warning": "GPU 1 has uncorrectable memory errors"}],
}
DCGM3_FAIL = {
    "DCGM GPU Diagnostic": {
        "version": "3.3.5",
        "test_categories": [
            {
                "category": "Integration",
                "tests": [
                    {
                        "name": "PCIe",
                        "results": [{"gpu_ids": "0", "status": "Fail", "warnings": ["bw low"]}],
                    }
                ],
            }
        ],
    }
}


def test_dcgm_documents_are_read_in_both_shapes() -> None:
    passing = parse_dcgm_diag(json.dumps(DCGM4_PASS))
    assert passing.tests == {"Deployment/software": "pass", "Deployment/denylist": "skip"}
    assert passing.failures == [] and passing.version == "4.2.3"
    failing = parse_dcgm_diag(json.dumps(DCGM4_FAIL))
    assert failing.failures == [
        "Deployment/software on GPU 1: GPU 1 has uncorrectable memory errors"
    ]
    old = parse_dcgm_diag(json.dumps(DCGM3_FAIL))
    assert old.failures == ["Integration/PCIe on GPU 0: bw low"] and old.version == "3.3.5"
    for text in ("not json", "[1]", json.dumps({"other": {}})):
        with pytest.raises(ValueError):
            parse_dcgm_diag(text)


def _dcgmi(tmp_path: Path, stdout: str, *, code: int = 0, sleep_s: float = 0.0) -> None:
    """A ``dcgmi`` that answers ``diag -r 1 -j`` with ``stdout`` (DCGM is not installed here)."""
    _tool(
        tmp_path,
        "dcgmi",
        "import sys, time\n"
        "assert sys.argv[1:] == ['diag', '-r', '1', '-j'], sys.argv\n"
        f"time.sleep({sleep_s})\n"
        f"sys.stdout.write({stdout!r})\n"
        f"sys.exit({code})\n",
    )


def test_dcgm_is_skipped_where_it_is_not_installed(tmp_path: Path) -> None:
    assert DcgmCheck().unavailable(_context(tmp_path)) == (
        "dcgmi is not on PATH (DCGM is not installed)"
    )


@pytest.mark.parametrize(
    ("stdout", "code", "status", "expected"),
    [
        (json.dumps(DCGM4_PASS), 0, CheckStatus.PASS, "2 test(s), none failed"),
        (json.dumps(DCGM4_FAIL), 226, CheckStatus.FAIL, "Deployment/software on GPU 1"),
        (
            "Error: unable to establish a connection to the specified host: localhost\n",
            255,
            CheckStatus.SKIPPED,
            "cannot reach nv-hostengine",
        ),
        ("Segmentation fault\n", 139, CheckStatus.ERROR, "gave no diagnostic"),
    ],
)
def test_dcgm_diag_outcomes(
    tmp_path: Path, stdout: str, code: int, status: CheckStatus, expected: str
) -> None:
    _dcgmi(tmp_path, stdout, code=code)
    context = _context(tmp_path)
    check = DcgmCheck()
    assert check.unavailable(context) is None
    got = check.run(context)
    assert got.status is status, got.summary
    assert expected in got.summary


def test_a_dcgm_diag_that_hangs_is_stopped(tmp_path: Path) -> None:
    _dcgmi(tmp_path, json.dumps(DCGM4_PASS), sleep_s=30)
    context = _context(tmp_path, options=replace(SMALL, dcgm_timeout_s=1.0))
    began = time.monotonic()
    got = DcgmCheck().run(context)
    assert time.monotonic() - began < 10
    assert got.status is CheckStatus.ERROR
    assert "did not finish within 1 s" in got.summary


# -- network.rdma ----------------------------------------------------------------------------


def _port(
    sys_root: Path,
    device: str,
    port: int = 1,
    *,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    counters: dict[str, int] | None = None,
) -> Path:
    """One port as the kernel lays it out under ``/sys/class/infiniband``."""
    folder = sys_root / "class" / "infiniband" / device / "ports" / str(port)
    (folder / "counters").mkdir(parents=True, exist_ok=True)
    (folder / "state").write_text(state + "\n")
    (folder / "phys_state").write_text(phys_state + "\n")
    (folder / "rate").write_text(rate + "\n")
    (folder / "link_layer").write_text("InfiniBand\n")
    values = {"symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0, "port_xmit_discards": 0}
    values.update(counters or {})
    for name, value in values.items():
        (folder / "counters" / name).write_text(f"{value}\n")
    return folder


def _rdma(tmp_path: Path, **options: Any) -> CheckResult:
    check = RdmaCheck()
    context = _context(tmp_path, options=replace(SMALL, rdma_interval_s=0.05, **options))
    assert check.unavailable(context) is None
    return check.run(context)


def test_rdma_is_skipped_without_infiniband_in_sysfs(tmp_path: Path) -> None:
    reason = RdmaCheck().unavailable(_context(tmp_path))
    assert reason is not None and reason.startswith("no RDMA device")


def test_active_ports_with_still_counters_pass(tmp_path: Path) -> None:
    for device in ("mlx5_0", "mlx5_1"):
        _port(tmp_path / "sys", device, counters={"symbol_error": 3})
    got = _rdma(tmp_path)
    assert got.status is CheckStatus.PASS, got.summary
    assert got.summary.startswith("2 port(s) ACTIVE and LinkUp at 400 Gb/s")
    assert got.measurements["mlx5_0:1.symbol_error"] == 3  # old errors: recorded
    assert got.measurements["mlx5_1:1.rate_gbps"] == 400.0


def test_a_port_down_fails_unless_it_is_ignored(tmp_path: Path) -> None:
    _port(tmp_path / "sys", "mlx5_0")
    _port(tmp_path / "sys", "mlx5_1", state="1: DOWN", phys_state="3: Disabled")
    got = _rdma(tmp_path)
    assert got.status is CheckStatus.FAIL
    assert "mlx5_1:1 state '1: DOWN', expected '4: ACTIVE'" in got.summary
    assert "mlx5_1:1 phys_state '3: Disabled', expected '5: LinkUp'" in got.summary
    assert _rdma(tmp_path, rdma_ignore_ports=("mlx5_1:1",)).status is CheckStatus.PASS


def test_an_error_counter_growing_during_the_check_fails(tmp_path: Path) -> None:
    folder = _port(tmp_path / "sys", "mlx5_0", counters={"symbol_error": 7})
    check = RdmaCheck()
    context = _context(tmp_path, options=replace(SMALL, rdma_interval_s=1.0))

    def bump() -> None:  # the link takes errors between the two readings
        (folder / "counters" / "symbol_error").write_text("19\n")
        (folder / "counters" / "link_downed").write_text("1\n")

    timer = threading.Timer(0.3, bump)
    timer.start()
    try:
        got = check.run(context)
    finally:
        timer.cancel()
    assert got.status is CheckStatus.FAIL
    assert "mlx5_0:1 error counters grew: symbol_error +12, link_downed +1" in got.summary
    assert got.measurements["mlx5_0:1.symbol_error.delta"] == 12


def test_real_captured_sysfs_trees_pass(tmp_path: Path) -> None:
    unpack_ttar(EIGHT_NIC, tmp_path / "eight")
    ports = read_ports(tmp_path / "eight" / "sys")
    assert len(ports) == 8 and all(p.active and p.link_up for p in ports)
    check = RdmaCheck()
    context = _context(tmp_path, sysfs_root=tmp_path / "eight" / "sys")
    context = replace(context, options=replace(SMALL, rdma_interval_s=0.05))
    got = check.run(context)
    assert got.status is CheckStatus.PASS, got.summary
    assert got.measurements["ports"] == 8
    unpack_ttar(_shared("sysfs-infiniband-fixtures", "node_exporter_sys_class_infiniband.ttar"),
                tmp_path / "ne")  # fmt: skip
    context = replace(context, sysfs_root=tmp_path / "ne" / "sys")
    mixed = check.run(context)
    assert mixed.status is CheckStatus.PASS, mixed.summary  # i40iw 10 Gb/s, mlx4 40 Gb/s
    assert mixed.measurements["mlx4_0:2.rate_gbps"] == 40.0


# -- network.ib_write_bw ---------------------------------------------------------------------


def test_ib_write_bw_output_is_read_in_either_unit() -> None:
    real = _shared("superbench-fixtures", "data_ib_loopback_all_sizes.log").read_text()
    # the largest size's (8 MiB) average: 23240.68 MB/sec (of 2^20 bytes) = 195.0 Gb/s
    assert parse_ib_write_bw(real) == pytest.approx(23240.68 * 1048576 * 8 / 1e9)
    gbits = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      183092           0.00               196.31               0.374432\n"
    )
    assert parse_ib_write_bw(gbits) == pytest.approx(196.31)
    assert parse_ib_write_bw("Couldn't connect to 127.0.0.1:18515") is None


FAKE_IB_WRITE_BW = """
import os, sys, time
# A stand-in for perftest's ib_write_bw (no RDMA device here): the server waits for its client,
# the client writes what the real one writes with --report_gbits.
args = sys.argv[1:]
assert args[:2] == ["-d", "mlx5_0"] and "--report_gbits" in args and "-F" in args, args
done = os.path.join(os.environ["FAKE_DIR"], "client-done")
rows = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\\n"
        " 65536      183092           0.00               {gbps}               0.374432\\n")
if args[-1] == "127.0.0.1":
    print("                    RDMA_Write BW Test")
    print(rows.format(gbps=os.environ["FAKE_GBPS"]))
    open(done, "w").close()
else:
    print("************************************")
    print("* Waiting for client to connect... *", flush=True)
    deadline = time.monotonic() + 20
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.02)
    print(rows.format(gbps=os.environ["FAKE_GBPS"]))
"""


@pytest.mark.parametrize(
    ("gbps", "status"), [("191.40", CheckStatus.PASS), ("96.5", CheckStatus.FAIL)]
)
def test_ib_write_bw_loopback_against_the_ports_rate(
    tmp_path: Path, gbps: str, status: CheckStatus
) -> None:
    _port(tmp_path / "sys", "mlx5_0", rate="200 Gb/sec (4X HDR)")
    _port(tmp_path / "sys", "mlx5_1", state="1: DOWN")  # not tested: down
    _tool(tmp_path, "ib_write_bw", FAKE_IB_WRITE_BW)
    check = IbWriteBwCheck()
    context = _context(tmp_path)
    context = replace(
        context,
        environ={**context.environ, "FAKE_DIR": str(tmp_path), "FAKE_GBPS": gbps},
    )
    assert check.unavailable(context) is None
    got = check.run(context)
    assert got.status is status, got.summary
    assert got.measurements["ports"] == 1
    assert got.measurements["mlx5_0:1.min_gbps"] == 150.0  # 0.75 of 200
    assert got.measurements["mlx5_0:1.gbps"] == float(gbps)
    if status is CheckStatus.FAIL:
        assert "mlx5_0:1 96.5 Gb/s < 150.0 Gb/s" in got.summary


def test_ib_write_bw_is_skipped_without_perftest_or_an_active_port(tmp_path: Path) -> None:
    context = _context(tmp_path)
    assert IbWriteBwCheck().unavailable(context) == "perftest's ib_write_bw is not on PATH"
    _tool(tmp_path, "ib_write_bw", "print('unused')\n")
    reason = IbWriteBwCheck().unavailable(context)
    assert reason is not None and reason.startswith("no active RDMA port")


# -- host.clock ------------------------------------------------------------------------------

CHRONY_SYNCED = """Reference ID    : C0A80001 (ntp.example)
Stratum         : 3
Ref time (UTC)  : Thu Jan 01 00:00:00 2026
System time     : 0.000012345 seconds slow of NTP time
Last offset     : +0.000001234 seconds
RMS offset      : 0.000012345 seconds
Frequency       : 1.234 ppm slow
Residual freq   : +0.000 ppm
Skew            : 0.012 ppm
Root delay      : 0.001234567 seconds
Root dispersion : 0.000123456 seconds
Update interval : 64.0 seconds
Leap status     : Normal
"""


def test_clock_reports_are_read() -> None:
    synced = parse_chronyc_tracking(CHRONY_SYNCED)
    assert synced == ClockReading("chronyc", True, -0.000012345, None, "leap status Normal")
    off = parse_chronyc_tracking(
        CHRONY_SYNCED.replace("0.000012345 seconds slow", "0.25 seconds fast")
    )
    assert off is not None and off.offset_s == 0.25
    lost = parse_chronyc_tracking(CHRONY_SYNCED.replace("Normal", "Not synchronised"))
    assert lost is not None and not lost.synchronised and lost.bound() is None
    assert parse_chronyc_tracking("506 Cannot talk to daemon") is None
    assert parse_timedatectl("Timezone=UTC\nNTPSynchronized=yes\n") == ClockReading(
        "timedatectl", True, detail="NTPSynchronized=yes"
    )
    assert parse_timedatectl("Timezone=UTC\n") is None
    # the kernel: undisciplined, its error estimate at the ceiling: nothing bounds it
    assert clock_from_timex(False, 0.0, KERNEL_MAX_ERROR_S, 5, 0x40).bound() is None
    assert clock_from_timex(False, 0.0, 0.03, 5, 0x40).bound() == 0.03
    assert clock_from_timex(True, 0.002, 0.01, 0, 0x2001).bound() == 0.002


def test_the_kernel_clock_state_is_read_here() -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("ntp_adjtime is Linux's")
    reading = read_adjtimex()
    assert reading is not None and reading.source == "adjtimex"
    assert reading.max_error_s is not None and reading.max_error_s >= 0


@pytest.mark.parametrize(
    ("tracking", "status", "expected"),
    [
        (CHRONY_SYNCED, CheckStatus.PASS, "synchronised, offset 1.23e-05 s ≤ 0.1 s (chronyc)"),
        (
            CHRONY_SYNCED.replace("0.000012345 seconds slow", "0.4 seconds fast"),
            CheckStatus.FAIL,
            "synchronised with offset 0.4 s > 0.1 s (chronyc",
        ),
    ],
)
def test_chronyc_decides_the_clock_when_it_answers(
    tmp_path: Path, tracking: str, status: CheckStatus, expected: str
) -> None:
    # chronyd does not run here: a chronyc that answers as the real one does
    _tool(
        tmp_path,
        "chronyc",
        f"import sys\nassert sys.argv[1:] == ['tracking']\nprint({tracking!r})\n",
    )
    got = ClockCheck().run(_context(tmp_path))
    assert got.status is status, got.summary
    assert expected in got.summary
    assert got.measurements["chronyc.synchronised"] is True


def test_an_unsynchronised_clock_is_judged_by_the_kernels_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(
        tmp_path,
        "chronyc",
        f"print({CHRONY_SYNCED.replace('Normal', 'Not synchronised')!r})\n",
    )
    import collectors.selfcheck.host as host

    for kernel, status in [
        (clock_from_timex(False, 0.0, 2.5, 5, 0x40), CheckStatus.FAIL),
        (clock_from_timex(False, 0.0, 0.02, 5, 0x40), CheckStatus.PASS),
        (clock_from_timex(False, 0.0, KERNEL_MAX_ERROR_S, 5, 0x40), CheckStatus.SKIPPED),
    ]:
        monkeypatch.setattr(host, "read_adjtimex", lambda kernel=kernel: kernel)
        got = ClockCheck().run(_context(tmp_path))
        assert got.status is status, got.summary
        assert got.measurements["chronyc.synchronised"] is False
    assert "nothing bounds its offset" in got.summary


# -- host.disk and host.memory_ecc -----------------------------------------------------------


def test_disk_space_of_the_real_file_systems(tmp_path: Path) -> None:
    context = _context(tmp_path, options=replace(SMALL, disk_paths=(str(tmp_path),)))
    got = DiskCheck().run(context)
    assert got.status is CheckStatus.PASS, got.summary
    assert f"disk[{tmp_path}].free_bytes"[:64] in got.measurements
    assert isinstance(got.measurements["disk[/].free_fraction"], float)
    greedy = replace(context, options=replace(SMALL, disk_min_free_bytes=1 << 62))
    short = DiskCheck().run(greedy)
    assert short.status is CheckStatus.FAIL
    assert "/: " in short.summary and f"{(1 << 62) / GIB:g} GiB" in short.summary
    missing = replace(context, options=replace(SMALL, disk_paths=(str(tmp_path / "scratch"),)))
    gone = DiskCheck().run(missing)
    assert gone.status is CheckStatus.FAIL
    assert "scratch: No such file or directory" in gone.summary


def _edac(sys_root: Path, counts: list[tuple[int, int]]) -> None:
    for index, (ce, ue) in enumerate(counts):
        mc = sys_root / "devices" / "system" / "edac" / "mc" / f"mc{index}"
        mc.mkdir(parents=True)
        (mc / "ce_count").write_text(f"{ce}\n")
        (mc / "ue_count").write_text(f"{ue}\n")
        (mc / "mc_name").write_text("Skylake Socket#0 IMC#0\n")


def test_memory_ecc_from_edac(tmp_path: Path) -> None:
    check = MemoryEccCheck()
    reason = check.unavailable(_context(tmp_path))
    assert reason is not None and reason.startswith("EDAC is absent")
    _edac(tmp_path / "sys", [(4, 0), (0, 0)])
    context = _context(tmp_path)
    assert check.unavailable(context) is None
    healthy = check.run(context)
    assert healthy.status is CheckStatus.PASS
    assert "4 corrected" in healthy.summary and healthy.measurements["mc0.ce_count"] == 4
    (tmp_path / "sys" / "devices" / "system" / "edac" / "mc" / "mc1" / "ue_count").write_text("1\n")
    broken = check.run(context)
    assert broken.status is CheckStatus.FAIL
    assert broken.summary == "mc1: 1 uncorrected memory error(s)"


def test_the_collective_threshold_reaches_the_collective_check(monkeypatch) -> None:
    """``MINDER_SELFCHECK_COLLECTIVE_THRESHOLD`` is the collective's slow factor (2 by default),
    at least 1.2."""
    import collectors.selfcheck.collective as collective
    from collectors.selfcheck.base import skipped
    from collectors.selfcheck.runner import CollectiveCheck

    assert CheckOptions().collective_threshold == collective.CollectiveOptions().threshold == 2.0
    seen: list[float] = []

    def fake_run(environ, *, timeout_s, options):
        seen.append(options.threshold)
        return skipped(collective.CHECK_NAME, "a world of one")

    monkeypatch.setattr(collective, "run_collective_check", fake_run)
    options = CheckOptions.from_environ({"MINDER_SELFCHECK_COLLECTIVE_THRESHOLD": "3.5"})
    CollectiveCheck().run(CheckContext(options=options, timeout_s=10.0))
    assert seen == [3.5]
    with pytest.raises(ValidationError, match=r"COLLECTIVE_THRESHOLD=1\.0.*expected >= 1\.2"):
        CheckOptions.from_environ({"MINDER_SELFCHECK_COLLECTIVE_THRESHOLD": "1.0"})
