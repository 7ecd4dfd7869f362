"""NVML source: replayed A100 recording (no GPU needed) and one real-GPU test (``-m gpu``)."""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import pynvml
import pytest
from manual_clock import ManualClock
from nvml_recording import A100_XML, MIB, FakeNvml, GpuRecording, a100_node, parse_smi_xml

from collectors.base import Collected, Source
from collectors.nvml import INIT_RETRY_S, NvmlSource
from minder.core.metrics import validate_sample
from minder.core.records import EventKind

needs_xml = pytest.mark.skipif(
    not A100_XML.is_file(),
    reason=f"shared nvidia-smi dump {A100_XML} is absent (../shared/data/nvidia-smi-xml)",
)

T0 = 1_763_700_000.0
GPM = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 81.5,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 42.0,
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 97.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 100.2,  # GPM overshoots 100 by rounding
}


def by_device(out: Collected) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for metric, device, value in out.samples:
        assert metric not in table[device], f"{metric}/{device} emitted twice"
        table[device][metric] = value
    return dict(table)


def assert_valid(out: Collected) -> None:
    for metric, device, value in out.samples:
        validate_sample(metric, device, value)


def make(
    gpus: list[GpuRecording], clock: Callable[[], float] = time.monotonic
) -> tuple[FakeNvml, NvmlSource]:
    fake = FakeNvml(gpus)
    return fake, NvmlSource(fake, clock=clock)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@needs_xml
def test_recording_holds_the_dump_values() -> None:
    rec = parse_smi_xml(A100_XML)
    assert rec.product == "NVIDIA A100-SXM4-80GB"
    assert rec.util_gpu is None  # MIG mode: nvidia-smi shows N/A
    assert rec.power_mw == 67030
    assert rec.temperature_c == 27
    assert rec.sm_clock_mhz == 1275
    assert rec.memory_used_bytes == 50 * MIB
    assert (rec.pcie_gen, rec.pcie_gen_max, rec.pcie_width, rec.pcie_width_max) == (4, 4, 16, 16)
    assert (rec.pcie_tx_kib_s, rec.pcie_rx_kib_s, rec.pcie_replay) == (4000, 0, 0)
    assert (rec.ecc_corrected, rec.ecc_uncorrected, rec.throttle_reasons) == (0, 0, 0)


@needs_xml
def test_source_protocol_and_dump_as_recorded() -> None:
    fake, source = make(a100_node(8))
    assert isinstance(source, Source)
    assert source.name == "nvml"
    first = source.collect(T0)
    table = by_device(first)
    assert sorted(table) == [f"gpu{i}" for i in range(8)]
    for device, row in table.items():
        assert row["gpu_power_watts"] == pytest.approx(67.03), device
        assert row["gpu_temperature_celsius"] == 27.0
        assert row["gpu_sm_clock_hertz"] == 1275e6
        assert row["gpu_memory_used_bytes"] == 50 * MIB
        assert row["gpu_pcie_link_gen"] == 4.0
        assert row["gpu_pcie_link_width"] == 16.0
        assert row["gpu_throttle_reasons"] == 0.0
        assert row["gpu_pcie_tx_bytes_per_second"] == 4000 * 1024.0  # NVML KB/s are KiB/s
        assert row["gpu_pcie_rx_bytes_per_second"] == 0.0
        assert row["gpu_xid_count"] == 0.0
        # MIG mode: no utilisation; Ampere: no GPM; counters only primed on the first read
        for absent in ("gpu_util_ratio", "gpu_sm_active_ratio", "gpu_pcie_replay_count"):
            assert absent not in row
    assert source.pcie_link_max == {f"gpu{i}": (4, 16) for i in range(8)}
    assert_valid(first)
    fake.tick()
    second = by_device(source.collect(T0 + 1))
    for row in second.values():
        for count in ("gpu_pcie_replay_count", "gpu_ecc_sbe_count", "gpu_ecc_dbe_count"):
            assert row[count] == 0.0
        assert row["gpu_nvlink_error_count"] == 0.0
        assert row["gpu_nvlink_tx_bytes_per_second"] == 0.0
    assert source.problems.total == 0


@needs_xml
def test_every_metric_for_eight_gpus_with_units(clock: ManualClock) -> None:
    gpus = a100_node(8, pcie_tx_bytes=10_000, pcie_rx_bytes=20_000, gpm=dict(GPM))
    for i, gpu in enumerate(gpus):
        gpu.util_gpu, gpu.util_memory = 50 + i, 10
        gpu.temperature_c = 30 + i
        gpu.power_mw = 300_000 + 1000 * i
        gpu.sm_clock_mhz = 1400 + i
        gpu.memory_used_bytes = (1000 + i) * MIB
        gpu.throttle_reasons = pynvml.nvmlClocksEventReasonSwPowerCap if i == 6 else 0
        gpu.per_tick = {
            "pcie_tx_bytes": 2_000_000_000 * (i + 1),
            "pcie_rx_bytes": 1_000_000,
            "nvlink_tx_kib": 100_000 * (i + 1),
            "nvlink_rx_kib": 50_000,
            "pcie_replay": i,
            "ecc_corrected": 2 if i == 4 else 0,
            f"nvlink_errors.{pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL}": i,
            f"nvlink_errors.{pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL}": 1,
        }
    fake, source = make(gpus, clock)
    first = by_device(source.collect(clock.at(T0)))
    assert "gpu_sm_active_ratio" not in first["gpu0"]  # GPM needs two samples
    fake.tick()
    out = source.collect(clock.at(T0 + 2.0))  # two seconds: rates divide by it, counts do not
    assert_valid(out)
    table = by_device(out)
    assert sorted(table) == [f"gpu{i}" for i in range(8)]
    for i in range(8):
        row = table[f"gpu{i}"]
        assert row["gpu_util_ratio"] == pytest.approx((50 + i) / 100)
        assert row["gpu_temperature_celsius"] == 30 + i
        assert row["gpu_power_watts"] == pytest.approx(300 + i)
        assert row["gpu_sm_clock_hertz"] == (1400 + i) * 1e6
        assert row["gpu_memory_used_bytes"] == (1000 + i) * MIB
        assert row["gpu_pcie_tx_bytes_per_second"] == pytest.approx(1e9 * (i + 1))
        assert row["gpu_pcie_rx_bytes_per_second"] == pytest.approx(500_000)
        assert row["gpu_nvlink_tx_bytes_per_second"] == pytest.approx(50_000 * 1024 * (i + 1))
        assert row["gpu_nvlink_rx_bytes_per_second"] == pytest.approx(25_000 * 1024)
        assert row["gpu_pcie_replay_count"] == i
        assert row["gpu_ecc_sbe_count"] == (2 if i == 4 else 0)
        assert row["gpu_ecc_dbe_count"] == 0
        assert row["gpu_nvlink_error_count"] == i + 1
        assert row["gpu_throttle_reasons"] == (4.0 if i == 6 else 0.0)
        assert row["gpu_sm_active_ratio"] == pytest.approx(0.815)
        assert row["gpu_tensor_active_ratio"] == pytest.approx(0.42)
        assert row["gpu_gr_engine_active_ratio"] == pytest.approx(0.97)
        assert row["gpu_dram_active_ratio"] == 1.0
        assert row["gpu_pcie_link_gen"] == 4 and row["gpu_pcie_link_width"] == 16
        assert row["gpu_xid_count"] == 0
    # byte counters were there: the 20 ms nvmlDeviceGetPcieThroughput was never needed
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert out.events == []
    assert source.problems.total == 0


@needs_xml
def test_counter_reset_yields_no_value_then_resumes(clock: ManualClock) -> None:
    gpus = a100_node(2, nvlink_tx_kib=5_000_000)
    gpus[1].per_tick = {"pcie_replay": 4, "nvlink_tx_kib": 1000}
    fake, source = make(gpus, clock)
    source.collect(clock.at(T0))
    fake.tick()
    assert by_device(source.collect(clock.at(T0 + 1)))["gpu1"]["gpu_pcie_replay_count"] == 4
    gpus[1].pcie_replay = 0  # driver reload
    gpus[1].nvlink_tx_kib = 0
    row = by_device(source.collect(clock.at(T0 + 2)))["gpu1"]
    assert "gpu_pcie_replay_count" not in row
    assert "gpu_nvlink_tx_bytes_per_second" not in row
    assert source.problems.counts["counter_reset"] == 2
    fake.tick()
    row = by_device(source.collect(clock.at(T0 + 3)))["gpu1"]
    assert row["gpu_pcie_replay_count"] == 4
    assert row["gpu_nvlink_tx_bytes_per_second"] == 1000 * 1024


@needs_xml
def test_xid_events_and_counts() -> None:
    fake, source = make(a100_node(8))
    source.collect(T0)
    fake.queue_xid(3, 79)
    fake.queue_xid(5, 13)
    fake.queue_xid(5, 31)
    out = source.collect(T0 + 1)
    xids = [(e.device, e.code, e.ts) for e in out.events if e.kind is EventKind.XID]
    assert xids == [("gpu3", 79, T0 + 1), ("gpu5", 13, T0 + 1), ("gpu5", 31, T0 + 1)]
    counts = {d: row["gpu_xid_count"] for d, row in by_device(out).items()}
    assert counts == {f"gpu{i}": {3: 1.0, 5: 2.0}.get(i, 0.0) for i in range(8)}
    later = source.collect(T0 + 2)
    assert later.events == []
    assert all(row["gpu_xid_count"] == 0 for row in by_device(later).values())


@needs_xml
def test_failed_event_wait_gives_no_xid_count_instead_of_zeros() -> None:
    fake, source = make(a100_node(4))
    source.collect(T0)
    fake.queue_xid(2, 79)
    fake.queue_xid(1, 48)
    # The first wait returns gpu2's XID, the second fails: gpu1's XID is still queued, so a
    # count of 0 for gpu1 (or 1 for gpu2 as if complete) would be invented.
    real_wait = fake.nvmlEventSetWait_v2
    waits: list[int] = []

    def wait_then_fail(event_set: object, timeout_ms: int) -> object:
        waits.append(timeout_ms)
        if len(waits) == 2:
            raise pynvml.NVMLError_Unknown()
        return real_wait(event_set, timeout_ms)

    fake.nvmlEventSetWait_v2 = wait_then_fail  # type: ignore[method-assign]
    out = source.collect(T0 + 1)
    table = by_device(out)
    assert sorted(table) == [f"gpu{i}" for i in range(4)]
    assert all("gpu_xid_count" not in row for row in table.values())
    assert all(row["gpu_temperature_celsius"] == 27.0 for row in table.values())  # the rest
    assert [(e.device, e.code) for e in out.events if e.kind is EventKind.XID] == [("gpu2", 79)]
    assert source.problems.counts["event_wait_failed"] == 1
    later = source.collect(T0 + 2)  # the wait works again: gpu1's XID is read and counted
    assert [(e.device, e.code) for e in later.events] == [("gpu1", 48)]
    counts = {d: row["gpu_xid_count"] for d, row in by_device(later).items()}
    assert counts == {"gpu0": 0.0, "gpu1": 1.0, "gpu2": 0.0, "gpu3": 0.0}


@needs_xml
def test_recorded_driver_error_on_event_wait_is_reported_not_counted() -> None:
    fake, source = make(a100_node(2))
    source.collect(T0)
    fake.fail_next("nvmlEventSetWait_v2", pynvml.NVMLError_Unknown(), times=2)
    for step in (1, 2):
        out = source.collect(T0 + step)
        assert all("gpu_xid_count" not in row for row in by_device(out).values())
    assert source.problems.counts["event_wait_failed"] == 2
    counts = [row["gpu_xid_count"] for row in by_device(source.collect(T0 + 3)).values()]
    assert counts == [0.0, 0.0]


@needs_xml
def test_uncorrectable_ecc_emits_event_and_count() -> None:
    gpus = a100_node(4)
    _fake, source = make(gpus)
    source.collect(T0)
    gpus[2].ecc_uncorrected = 1
    gpus[2].ecc_corrected = 7
    out = source.collect(T0 + 1)
    table = by_device(out)
    assert table["gpu2"]["gpu_ecc_dbe_count"] == 1
    assert table["gpu2"]["gpu_ecc_sbe_count"] == 7
    assert table["gpu1"]["gpu_ecc_dbe_count"] == 0
    assert [(e.kind, e.device) for e in out.events] == [(EventKind.ECC, "gpu2")]
    assert source.collect(T0 + 2).events == []


@needs_xml
def test_gpu_lost_mid_collect_emits_one_event_others_go_on() -> None:
    fake, source = make(a100_node(8))
    source.collect(T0)
    fake.queue_xid(2, 79)  # "GPU has fallen off the bus" arrives before the queries fail
    fake.lose_gpu(2, after_calls=3)
    out = source.collect(T0 + 1)
    kinds = [(e.kind, e.device, e.code) for e in out.events]
    assert kinds == [(EventKind.XID, "gpu2", 79), (EventKind.GPU_LOST, "gpu2", None)]
    table = by_device(out)
    assert "gpu2" not in table  # its partial readings are dropped with it
    assert sorted(table) == [f"gpu{i}" for i in range(8) if i != 2]
    assert all(len(row) >= 10 for row in table.values())
    calls = fake.device_calls[2]
    again = source.collect(T0 + 2)
    assert again.events == []  # once per loss
    assert "gpu2" not in by_device(again)
    assert fake.device_calls[2] == calls  # a lost GPU is not queried again
    assert source.problems.total == 0
    assert_valid(again)


@needs_xml
def test_gpu_lost_before_start_is_reported_on_the_first_collect() -> None:
    fake = FakeNvml(a100_node(4))
    fake.lose_gpu(1, after_calls=0)  # its handle is there, every query answers GPU_IS_LOST
    source = NvmlSource(fake)
    out = source.collect(T0)
    assert [(e.kind, e.device) for e in out.events] == [(EventKind.GPU_LOST, "gpu1")]
    assert sorted(by_device(out)) == ["gpu0", "gpu2", "gpu3"]
    assert source.collect(T0 + 1).events == []
    assert source.problems.total == 0


@needs_xml
def test_device_count_drop_finds_the_lost_gpu_by_uuid() -> None:
    fake, source = make(a100_node(8))
    source.collect(T0)
    fake.remove_gpu(4)
    out = source.collect(T0 + 1)
    assert [(e.kind, e.device) for e in out.events] == [(EventKind.GPU_LOST, "gpu4")]
    assert sorted(by_device(out)) == [f"gpu{i}" for i in range(8) if i != 4]
    assert source.collect(T0 + 2).events == []


@needs_xml
def test_not_supported_is_skipped_for_good_without_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpus = a100_node(3, nvlink_tx_kib=None, nvlink_rx_kib=None, nvlink_errors={})
    gpus[1].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieReplayCounter"}
    fake, source = make(gpus)
    with caplog.at_level(logging.INFO, logger="collectors.nvml"):
        for step in range(5):
            out = source.collect(T0 + step)
            fake.tick()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
    table = by_device(out)
    assert "gpu_power_watts" not in table["gpu1"]
    assert "gpu_pcie_replay_count" not in table["gpu1"]
    assert table["gpu0"]["gpu_power_watts"] == pytest.approx(67.03)
    assert table["gpu0"]["gpu_pcie_replay_count"] == 0
    assert "gpu_nvlink_tx_bytes_per_second" not in table["gpu0"]
    assert "gpu_nvlink_error_count" not in table["gpu0"]
    # asked once, then remembered: 3 GPUs x 1 call for the utilisation (MIG: NotSupported)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 3
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1 + 2 * 5
    # GPM: support asked once per GPU at start; an Ampere GPU is never sampled
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 3
    assert fake.calls["nvmlGpmSampleGet"] == 0
    assert source.problems.total == 0


@needs_xml
def test_gpm_not_supported_at_sample_time_stops_gpm_quietly() -> None:
    gpus = a100_node(2, gpm=dict(GPM))
    fake, source = make(gpus)
    source.collect(T0)
    gpus[0].gpm = None  # e.g. MIG enabled underneath: sampling answers NotSupported
    out = by_device(source.collect(T0 + 1))
    assert "gpu_sm_active_ratio" not in out["gpu0"]
    assert out["gpu1"]["gpu_sm_active_ratio"] == pytest.approx(0.815)
    before = fake.calls["nvmlGpmSampleGet"]
    source.collect(T0 + 2)
    assert fake.calls["nvmlGpmSampleGet"] == before + 1  # gpu1 only
    assert source.problems.total == 0


@needs_xml
def test_throttle_reasons_fall_back_to_the_older_function() -> None:
    gpus = a100_node(2)
    gpus[0].throttle_reasons = pynvml.nvmlClocksThrottleReasonHwSlowdown
    fake, source = make(gpus)
    fake.missing_functions.add("nvmlDeviceGetCurrentClocksEventReasons")  # pre-r535 driver
    out = by_device(source.collect(T0))
    assert out["gpu0"]["gpu_throttle_reasons"] == float(pynvml.nvmlClocksThrottleReasonHwSlowdown)
    source.collect(T0 + 1)
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 2  # once per GPU
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 4


@needs_xml
def test_recovery_action_event_on_change() -> None:
    gpus = a100_node(2)
    _fake, source = make(gpus)
    assert source.collect(T0).events == []
    gpus[1].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    out = source.collect(T0 + 1)
    assert [(e.kind, e.device, e.code) for e in out.events] == [
        (EventKind.RECOVERY_ACTION, "gpu1", pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    ]
    assert source.collect(T0 + 2).events == []  # still pending: not repeated every second
    gpus[1].recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    assert [e.code for e in source.collect(T0 + 3).events] == [2]


@needs_xml
def test_other_errors_are_problems_and_the_rest_still_comes_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class FlakyNvml(FakeNvml):
        def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
            self._gpu(handle, "nvmlDeviceGetTemperature")
            raise pynvml.NVMLError_Unknown()

    fake = FlakyNvml(a100_node(2))
    source = NvmlSource(fake)
    with caplog.at_level(logging.WARNING, logger="collectors.base"):
        for step in range(3):
            out = source.collect(T0 + step)
    assert source.problems.counts["query_failed"] == 6  # asked again: not a NotSupported
    assert len([r for r in caplog.records if "query_failed" in r.getMessage()]) == 1
    row = by_device(out)["gpu0"]
    assert "gpu_temperature_celsius" not in row
    assert row["gpu_power_watts"] == pytest.approx(67.03)


def test_library_absent_reports_once_and_retries_every_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml([], library_present=False)
    source = NvmlSource(fake)
    with caplog.at_level(logging.WARNING, logger="collectors.base"):
        for step in range(5):
            out = source.collect(T0 + step)
            assert out.samples == [] and out.events == []
    assert fake.calls["nvmlInit"] == 1  # not retried every second
    assert source.problems.counts == {"absent": 1}
    assert len([r for r in caplog.records if "absent" in r.getMessage()]) == 1
    source.collect(T0 + INIT_RETRY_S + 0.5)
    assert fake.calls["nvmlInit"] == 2
    assert source.problems.counts == {"absent": 1}


@needs_xml
def test_library_appearing_later_is_picked_up() -> None:
    fake = FakeNvml(a100_node(2), library_present=False)
    source = NvmlSource(fake)
    assert source.collect(T0).samples == []
    fake.library_present = True
    assert source.collect(T0 + 10).samples == []  # too soon to retry
    assert sorted(by_device(source.collect(T0 + INIT_RETRY_S))) == ["gpu0", "gpu1"]


def test_pynvml_not_installed_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    source = NvmlSource()
    out = source.collect(T0)
    assert out.samples == [] and out.events == []
    assert source.problems.counts == {"absent": 1}
    source.close()  # nothing to release


@needs_xml
def test_close_frees_the_event_set_and_shuts_down() -> None:
    fake, source = make(a100_node(2, gpm=dict(GPM)))
    source.collect(T0)
    source.close()
    assert fake.calls["nvmlEventSetFree"] == 1
    assert fake.calls["nvmlGpmSampleFree"] == 4
    assert fake.calls["nvmlShutdown"] == 1
    assert not fake.initialized
    source.close()
    assert fake.calls["nvmlShutdown"] == 1


@pytest.mark.gpu
def test_real_nvml_two_collects() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVIDIA driver/GPU here: nvmlInit failed ({exc})")
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML found no GPU")
    source = NvmlSource()
    try:
        first = source.collect(T0)
        second = source.collect(T0 + 1.0)
    finally:
        source.close()
    for out in (first, second):
        assert_valid(out)
        table = by_device(out)
        assert sorted(table) == sorted(f"gpu{i}" for i in range(count))
        for row in table.values():
            for metric in ("gpu_power_watts", "gpu_temperature_celsius", "gpu_memory_used_bytes"):
                assert metric in row
    assert all("gpu_xid_count" in row for row in by_device(second).values())
    assert source.problems.counts.get("absent", 0) == 0
