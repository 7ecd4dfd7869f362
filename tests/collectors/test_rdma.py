"""RDMA sysfs source against the real procfs/node_exporter trees and a generated 8-NIC mlx5 tree."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from manual_clock import ManualClock
from ttar import unpack_ttar

import collectors.rdma as rdma_module
from collectors.base import Collected, Source
from collectors.rdma import RdmaSource, is_sysfs, port_device_name
from minder.core.metrics import validate_sample
from minder.core.records import EventKind


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(autouse=True, params=["per_read", "kept_open"])
def file_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: files opened per read (a captured tree, the default off sysfs) and kept
    open and re-read with pread (the default on a sysfs mount). The trees are rewritten in place
    (``_write``), as sysfs values change in place, so both modes must see the same values."""
    mode: str = request.param
    monkeypatch.setattr(rdma_module, "is_sysfs", lambda _root: mode == "kept_open")
    return mode


_IS_SYSFS = is_sysfs  # the real one (file_mode replaces the module's)
HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / ".." / "shared" / "data" / "sysfs-infiniband-fixtures"
EIGHT_NIC = HERE / "fixtures" / "rdma" / "mlx5_8nic.ttar"


# -- the 8-NIC mlx5 RoCE tree ------------------------------------------------------------------

_PORT_COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
_HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
)


def mlx5_8nic_ttar(nics: int = 8) -> str:
    """ttar text of a ``/sys`` tree with ``nics`` single-port mlx5 RoCE devices."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for i in range(nics):
        dev = f"sys/class/infiniband/mlx5_{i}"
        bus = 0x0C + 0x10 * i
        pci = f"0000:{bus:02x}:00.0"
        netdev = f"enp{bus}s0np0"
        files[f"{dev}/board_id"] = "MT_0000000838"
        files[f"{dev}/fw_ver"] = "28.39.1002"
        files[f"{dev}/hca_type"] = "MT4129"
        files[f"{dev}/node_guid"] = f"b83f:d203:00{i:02x}:5a3c"
        links[f"{dev}/device"] = f"../../../devices/pci0000:00/{pci}"
        files[f"sys/devices/pci0000:00/{pci}/net/{netdev}/type"] = "1"
        files[f"sys/devices/pci0000:00/{pci}/net/{netdev}/dev_port"] = "0"
        port = f"{dev}/ports/1"
        for k, name in enumerate(_PORT_COUNTERS):
            value = {
                "port_xmit_data": 250_000_000_000 + i * 1_000_003,
                "port_rcv_data": 240_000_000_000 + i * 999_983,
                "port_xmit_packets": 3_900_000_000 + i,
                "port_rcv_packets": 3_800_000_000 + i,
                "port_xmit_wait": 1_000_000 + 17 * i,
            }.get(name, 0 if "err" in name or name in ("link_downed", "symbol_error") else k)
            files[f"{port}/counters/{name}"] = str(value)
        for k, name in enumerate(_HW_COUNTERS):
            value = {"lifespan": 10, "np_cnp_sent": 5_000 + i, "rp_cnp_handled": 7_000 + i}.get(
                name, k
            )
            files[f"{port}/hw_counters/{name}"] = str(value)
        files[f"{port}/link_layer"] = "Ethernet"
        files[f"{port}/phys_state"] = "5: LinkUp"
        files[f"{port}/rate"] = "400 Gb/sec (4X NDR)"
        files[f"{port}/state"] = "4: ACTIVE"
    out = ["# Archive created by mlx5_8nic_ttar() in tests/collectors/test_rdma.py"]
    made: set[str] = set()
    for path in sorted({*files, *links}):
        parts = path.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in made:
                made.add(folder)
                out += [f"Directory: {folder}", "Mode: 755", "# ttar - - -"]
        if path in links:
            out += [f"Path: {path}", f"SymlinkTo: {links[path]}", "# ttar - - -"]
        else:
            out += [f"Path: {path}", "Lines: 1", files[path], "Mode: 444", "# ttar - - -"]
    return "\n".join(out) + "\n"


# -- helpers -----------------------------------------------------------------------------------


def _shared(name: str) -> Path:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"shared fixture {path} is absent (read-only data beside the repo)")
    return path


@pytest.fixture
def node_exporter_sys(tmp_path: Path) -> Path:
    unpack_ttar(_shared("node_exporter_sys_class_infiniband.ttar"), tmp_path)
    return tmp_path / "sys"


@pytest.fixture
def procfs_sys(tmp_path: Path) -> Path:
    unpack_ttar(_shared("procfs_sys_class_infiniband.ttar"), tmp_path)
    return tmp_path / "fixtures" / "sys"


@pytest.fixture
def eight_nic_sys(tmp_path: Path) -> Path:
    unpack_ttar(EIGHT_NIC, tmp_path)
    return tmp_path / "sys"


def _port(root: Path, dev: str, port: int = 1) -> Path:
    return root / "class" / "infiniband" / dev / "ports" / str(port)


def _write(path: Path, value: object) -> None:
    if path.exists():
        path.chmod(0o644)
    path.write_text(f"{value}\n")


def _values(out: Collected) -> dict[tuple[str, str], float]:
    values: dict[tuple[str, str], float] = {}
    for metric, device, value in out.samples:
        validate_sample(metric, device, value)
        assert (metric, device) not in values, f"{metric}/{device} emitted twice"
        values[(metric, device)] = value
    return values


def _prom(metric: str) -> dict[str, float]:
    """``device name -> value`` of one node_exporter metric in the expected exposition."""
    text = _shared("node_exporter_e2e_infiniband.prom").read_text()
    found: dict[str, float] = {}
    pattern = re.compile(rf'^{metric}{{device="([^"]+)",port="(\d+)"}} (\S+)$', re.M)
    for device, port, value in pattern.findall(text):
        found[port_device_name(device, int(port))] = float(value)
    assert found, f"{metric} not in the node_exporter exposition"
    return found


def _zero_counters(root: Path) -> dict[Path, str]:
    """Set every integer counter of the tree to 0; return the original texts."""
    saved: dict[Path, str] = {}
    for path in root.glob("class/infiniband/*/ports/*/*counters*/*"):
        text = path.read_text()
        if text.strip().isdigit():
            saved[path] = text
            _write(path, 0)
    return saved


# -- real trees --------------------------------------------------------------------------------


def test_is_a_source_and_first_collect_only_primes(node_exporter_sys: Path) -> None:
    source = RdmaSource(node_exporter_sys)
    assert isinstance(source, Source)
    assert source.name == "rdma"
    values = _values(source.collect(1000.0))
    # No rate or count before a second reading: only the port state gauge.
    assert {metric for metric, _ in values} == {"rdma_port_up"}
    expected = {
        device: float(state == 4) for device, state in _prom("node_infiniband_state_id").items()
    }
    assert {device: v for (_, device), v in values.items()} == expected
    assert set(expected) == {"i40iw0", "mlx4_0", "mlx4_0:2"}


def test_counters_times_four_equal_node_exporter_bytes(
    node_exporter_sys: Path, clock: ManualClock
) -> None:
    """A counter going from 0 to its fixture value in 1 s has a rate of exactly that value, so the
    rates can be checked against node_exporter's totals for the same tree (×4 included)."""
    saved = _zero_counters(node_exporter_sys)
    source = RdmaSource(node_exporter_sys, clock=clock)
    source.collect(clock.at(100.0))
    for path, text in saved.items():
        path.write_text(text)
    values = _values(source.collect(clock.at(101.0)))
    tx = _prom("node_infiniband_port_data_transmitted_bytes_total")
    rx = _prom("node_infiniband_port_data_received_bytes_total")
    downed = _prom("node_infiniband_link_downed_total")
    for device in ("mlx4_0", "mlx4_0:2"):
        assert values[("rdma_tx_bytes_per_second", device)] == tx[device]
        assert values[("rdma_rx_bytes_per_second", device)] == rx[device]
        assert values[("rdma_link_downed_count", device)] == downed[device]
    assert values[("rdma_tx_bytes_per_second", "mlx4_0")] == 3733440 * 4
    # node_exporter exports the saturated 32-bit port_xmit_wait (2^32-1) as is; a counter stuck
    # at its maximum has no rate, so we emit none and say why.
    assert _prom("node_infiniband_port_transmit_wait_total")["mlx4_0"] == 2**32 - 1
    assert ("rdma_xmit_wait_per_second", "mlx4_0") not in values
    assert source.problems.counts["counter_saturated"] == 1
    # i40iw has no PMA ("N/A (no PMA)"): nothing but its state, and the reason is counted.
    assert [m for m, d in values if d == "i40iw0"] == ["rdma_port_up"]
    assert source.problems.counts["not_available"] == 2 * 5
    # mlx4_0 has no symbol_error file in this tree; port 2 also lacks port_xmit_wait.
    assert source.problems.counts["missing"] == 2 * 3


def test_procfs_tree_rates_and_ib_mlx5_without_cnp_counters(
    procfs_sys: Path, clock: ManualClock
) -> None:
    source = RdmaSource(procfs_sys, clock=clock)
    source.collect(clock.at(10.0))
    port = _port(procfs_sys, "mlx5_0")
    _write(port / "counters/port_xmit_data", 2880761508848 + 2500)
    _write(port / "counters/port_rcv_data", 18126345378 + 1000)
    _write(port / "counters/port_xmit_wait", 40)
    _write(port / "counters/symbol_error", 3)
    _write(_port(procfs_sys, "hfi1_0") / "counters/port_rcv_data", 345091702026 + 50)
    values = _values(source.collect(clock.at(12.0)))
    assert values[("rdma_tx_bytes_per_second", "mlx5_0")] == 2500 * 4 / 2
    assert values[("rdma_rx_bytes_per_second", "mlx5_0")] == 1000 * 4 / 2
    assert values[("rdma_xmit_wait_per_second", "mlx5_0")] == 20.0
    assert values[("rdma_symbol_error_count", "mlx5_0")] == 3.0
    assert values[("rdma_rx_bytes_per_second", "hfi1_0")] == 100.0
    assert values[("rdma_xmit_wait_per_second", "mlx4_0:2")] == 0.0
    # An InfiniBand-link mlx5 port has hw_counters but no CNP counters (CNPs are RoCE's): not a
    # problem, and nothing invented.
    assert not any(metric.startswith("rdma_cnp") for metric, _ in values)
    assert dict(source.problems.counts) == {}
    assert len({d for _, d in values}) == 4


def test_reset_gives_no_negative_rate_and_rates_resume(
    procfs_sys: Path, clock: ManualClock
) -> None:
    source = RdmaSource(procfs_sys, clock=clock)
    data = _port(procfs_sys, "mlx4_0", 2) / "counters/port_xmit_data"
    _write(data, 1000)
    source.collect(clock.at(0.0))
    _write(data, 1500)
    assert (
        _values(source.collect(clock.at(1.0)))[("rdma_tx_bytes_per_second", "mlx4_0:2")] == 2000.0
    )
    _write(data, 10)  # driver reload
    values = _values(source.collect(clock.at(2.0)))
    assert ("rdma_tx_bytes_per_second", "mlx4_0:2") not in values
    assert values[("rdma_rx_bytes_per_second", "mlx4_0:2")] == 0.0
    assert source.problems.counts["counter_reset"] == 1
    _write(data, 20)
    assert _values(source.collect(clock.at(3.0)))[("rdma_tx_bytes_per_second", "mlx4_0:2")] == 40.0


def test_port_leaving_active_emits_one_link_down_event(procfs_sys: Path) -> None:
    source = RdmaSource(procfs_sys)
    state = _port(procfs_sys, "mlx4_0", 2) / "state"
    assert source.collect(0.0).events == []
    _write(state, "1: DOWN")
    out = source.collect(1.0)
    assert _values(out)[("rdma_port_up", "mlx4_0:2")] == 0.0
    assert _values(out)[("rdma_port_up", "mlx4_0")] == 1.0
    assert [(e.kind, e.device, e.ts) for e in out.events] == [
        (EventKind.LINK_DOWN, "mlx4_0:2", 1.0)
    ]
    assert "DOWN" in out.events[0].message
    assert source.collect(2.0).events == []  # still down: not a new event
    _write(state, "4: ACTIVE")
    out = source.collect(3.0)
    assert out.events == [] and _values(out)[("rdma_port_up", "mlx4_0:2")] == 1.0
    _write(state, "2: INIT")  # any state but ACTIVE is down
    assert [e.device for e in source.collect(4.0).events] == ["mlx4_0:2"]


def test_a_port_down_from_the_start_emits_no_event(procfs_sys: Path) -> None:
    _write(_port(procfs_sys, "hfi1_0") / "state", "1: DOWN")
    source = RdmaSource(procfs_sys)
    for now in (0.0, 1.0):
        out = source.collect(now)
        assert out.events == []
        assert _values(out)[("rdma_port_up", "hfi1_0")] == 0.0


def test_non_numeric_value_is_reported_once_and_the_rest_still_comes_out(
    procfs_sys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = RdmaSource(procfs_sys)
    port = _port(procfs_sys, "mlx5_0")
    _write(port / "counters/port_rcv_data", "garbage")
    _write(port / "state", "weird")
    with caplog.at_level(logging.WARNING):
        for now in (0.0, 1.0, 2.0):
            values = _values(source.collect(now))
    assert ("rdma_rx_bytes_per_second", "mlx5_0") not in values
    assert ("rdma_port_up", "mlx5_0") not in values
    assert values[("rdma_tx_bytes_per_second", "mlx5_0")] == 0.0
    assert values[("rdma_tx_bytes_per_second", "mlx4_0")] == 0.0
    assert source.problems.counts["not_numeric"] == 2 * 3
    logged = [r for r in caplog.records if "not_numeric" in r.getMessage()]
    assert len(logged) == 1 and "garbage" in logged[0].getMessage()


def test_unreadable_and_missing_files_are_problems_not_errors(procfs_sys: Path) -> None:
    port = _port(procfs_sys, "mlx4_0")
    (port / "counters/port_xmit_data").unlink()
    (port / "counters/port_xmit_data").mkdir()  # a folder where a file belongs: EISDIR
    (port / "counters/port_rcv_data").unlink()
    source = RdmaSource(procfs_sys)
    source.collect(0.0)
    values = _values(source.collect(1.0))
    assert ("rdma_tx_bytes_per_second", "mlx4_0") not in values
    assert ("rdma_rx_bytes_per_second", "mlx4_0") not in values
    assert values[("rdma_xmit_wait_per_second", "mlx4_0")] == 0.0
    assert values[("rdma_tx_bytes_per_second", "mlx5_0")] == 0.0
    assert source.problems.counts["unreadable"] == 2
    assert source.problems.counts["missing"] == 2


def test_hw_counters_is_the_fallback_for_port_counters(
    procfs_sys: Path, clock: ManualClock
) -> None:
    port = _port(procfs_sys, "mlx5_0")
    (port / "counters/port_xmit_data").unlink()
    _write(port / "hw_counters/port_xmit_data", 100)
    _write(port / "hw_counters/port_rcv_data", 999)  # ignored: counters/ has it
    source = RdmaSource(procfs_sys, clock=clock)
    source.collect(clock.at(0.0))
    _write(port / "hw_counters/port_xmit_data", 150)
    _write(port / "hw_counters/port_rcv_data", 5000)
    values = _values(source.collect(clock.at(1.0)))
    assert values[("rdma_tx_bytes_per_second", "mlx5_0")] == 200.0
    assert values[("rdma_rx_bytes_per_second", "mlx5_0")] == 0.0
    assert dict(source.problems.counts) == {}


def test_saturated_small_counters_yield_no_count(procfs_sys: Path) -> None:
    _write(_port(procfs_sys, "hfi1_0") / "counters/symbol_error", 2**16 - 1)
    _write(_port(procfs_sys, "hfi1_0") / "counters/link_downed", 2**8 - 1)
    source = RdmaSource(procfs_sys)
    source.collect(0.0)
    values = _values(source.collect(1.0))
    assert ("rdma_symbol_error_count", "hfi1_0") not in values
    assert ("rdma_link_downed_count", "hfi1_0") not in values
    assert values[("rdma_symbol_error_count", "mlx5_0")] == 0.0
    assert source.problems.counts["counter_saturated"] == 4


def test_no_infiniband_class_is_absent_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = RdmaSource(tmp_path)
    with caplog.at_level(logging.WARNING):
        for now in range(3):
            out = source.collect(float(now))
            assert out.samples == [] and out.events == []
    assert dict(source.problems.counts) == {"absent": 1}
    assert sum("absent" in r.getMessage() for r in caplog.records) == 1
    (tmp_path / "class" / "infiniband").mkdir(parents=True)  # ib_core loaded, no device
    assert source.collect(3.0).samples == []
    assert dict(source.problems.counts) == {"absent": 1}
    source.close()


def test_device_that_vanishes_and_returns_primes_again(procfs_sys: Path, tmp_path: Path) -> None:
    source = RdmaSource(procfs_sys)
    mlx5 = procfs_sys / "class/infiniband/mlx5_0"
    source.collect(0.0)
    shutil.move(mlx5, tmp_path / "parked")
    values = _values(source.collect(1.0))
    assert not any(device == "mlx5_0" for _, device in values)
    data = tmp_path / "parked/ports/1/counters/port_xmit_data"
    _write(data, int(data.read_text()) + 10**9)
    shutil.move(tmp_path / "parked", mlx5)
    values = _values(source.collect(2.0))
    # Back after a gap: its counters prime again instead of yielding a rate over the gap.
    assert ("rdma_tx_bytes_per_second", "mlx5_0") not in values
    assert values[("rdma_port_up", "mlx5_0")] == 1.0
    assert source.problems.counts["counter_reset"] == 0


def test_kept_files_are_read_in_place_and_closed_when_their_port_leaves(
    procfs_sys: Path, tmp_path: Path, clock: ManualClock, file_mode: str
) -> None:
    source = RdmaSource(procfs_sys, clock=clock)
    assert source.keep_open is (file_mode == "kept_open")
    source.collect(clock.at(0.0))
    kept = dict(source._fds)
    mlx5 = [p for p in kept if "/mlx5_0/" in p]
    assert len(mlx5) == (6 if source.keep_open else 0)  # 5 counters and state (IB: no CNP)
    _write(_port(procfs_sys, "mlx5_0") / "counters/port_xmit_data", 2880761508848 + 250)
    assert _values(source.collect(clock.at(1.0)))[("rdma_tx_bytes_per_second", "mlx5_0")] == 1000.0
    assert source._fds == kept  # re-read through the same descriptors
    shutil.move(procfs_sys / "class/infiniband/mlx5_0", tmp_path / "parked")
    source.collect(clock.at(2.0))
    assert not any("/mlx5_0/" in p for p in source._fds)
    assert len(source._fds) == len(kept) - len(mlx5)
    source.close()
    assert source._fds == {}
    for fd in kept.values():  # every one closed
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)


def test_a_kept_file_that_fails_a_read_is_opened_again(
    procfs_sys: Path, monkeypatch: pytest.MonkeyPatch, clock: ManualClock, file_mode: str
) -> None:
    """A device that goes away and comes back (driver reload) between two collects: its old
    descriptors answer ENODEV; each is reopened and read, nothing is reported."""
    if file_mode != "kept_open":
        pytest.skip("only kept files are re-read")
    source = RdmaSource(procfs_sys, clock=clock)
    source.collect(clock.at(0.0))
    data = f"{_port(procfs_sys, 'mlx5_0')}/counters/port_xmit_data"
    old = source._fds[data]
    real_pread = os.pread
    failed: list[int] = []

    def pread(fd: int, n: int, offset: int) -> bytes:
        if fd == old and not failed:
            failed.append(fd)
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_pread(fd, n, offset)

    monkeypatch.setattr(rdma_module.os, "pread", pread)
    open_before = len(os.listdir("/proc/self/fd"))
    _write(_port(procfs_sys, "mlx5_0") / "counters/port_xmit_data", 2880761508848 + 250)
    values = _values(source.collect(clock.at(1.0)))
    assert failed == [old]
    assert values[("rdma_tx_bytes_per_second", "mlx5_0")] == 1000.0
    assert dict(source.problems.counts) == {}
    assert len(os.listdir("/proc/self/fd")) == open_before  # the old one closed, a new one kept
    assert os.pread(source._fds[data], 100, 0) == b"2880761509098\n"
    source.close()


def test_kept_files_are_bounded(
    eight_nic_sys: Path, monkeypatch: pytest.MonkeyPatch, file_mode: str
) -> None:
    monkeypatch.setattr(rdma_module, "MAX_OPEN_FILES", 10)
    source = RdmaSource(eight_nic_sys)
    source.collect(0.0)
    values = _values(source.collect(1.0))
    assert len(values) == 8 * 8 and dict(source.problems.counts) == {}
    assert len(source._fds) == (10 if file_mode == "kept_open" else 0)
    source.close()


def test_sysfs_mounts_are_recognised(tmp_path: Path) -> None:
    assert not _IS_SYSFS(tmp_path)
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = [line.split(" - ")[1].split()[0] for line in fh if " /sys " in line]
    if mounts[-1:] != ["sysfs"]:
        pytest.skip("no sysfs mounted on /sys here")
    assert _IS_SYSFS("/sys") and _IS_SYSFS("/sys/class")
    assert _IS_SYSFS("/sys/class/net/lo/statistics/rx_bytes")  # through symlinks too


# -- 8-NIC mlx5 RoCE tree ----------------------------------------------------------------------


def test_8nic_fixture_is_what_the_generator_writes() -> None:
    assert EIGHT_NIC.read_text() == mlx5_8nic_ttar(), (
        "fixture drifted; regenerate with `.venv/bin/python tests/collectors/test_rdma.py`"
    )


def test_8nic_roce_node_gives_every_metric_for_every_nic(
    eight_nic_sys: Path, clock: ManualClock
) -> None:
    source = RdmaSource(eight_nic_sys, clock=clock)
    source.collect(clock.at(50.0))
    for i in range(8):
        hw = _port(eight_nic_sys, f"mlx5_{i}") / "hw_counters"
        _write(hw / "np_cnp_sent", 5_000 + i + 10 * i)
        _write(hw / "rp_cnp_handled", 7_000 + i + 20)
    counters = _port(eight_nic_sys, "mlx5_3") / "counters"
    _write(counters / "port_xmit_data", int((counters / "port_xmit_data").read_text()) + 25_000)
    _write(counters / "link_downed", 1)
    values = _values(source.collect(clock.at(50.5)))
    devices = {device for _, device in values}
    assert devices == {f"mlx5_{i}" for i in range(8)}
    assert len(values) == 8 * 8  # tx, rx, xmit_wait, cnp sent/handled, link_downed, symbols, up
    for i in range(8):
        assert values[("rdma_cnp_sent_per_second", f"mlx5_{i}")] == 10 * i / 0.5
        assert values[("rdma_cnp_handled_per_second", f"mlx5_{i}")] == 20 / 0.5
        assert values[("rdma_port_up", f"mlx5_{i}")] == 1.0
    assert values[("rdma_tx_bytes_per_second", "mlx5_3")] == 25_000 * 4 / 0.5
    assert values[("rdma_link_downed_count", "mlx5_3")] == 1.0
    assert values[("rdma_link_downed_count", "mlx5_2")] == 0.0
    assert dict(source.problems.counts) == {}


def test_roce_port_without_cnp_counters_is_a_problem(eight_nic_sys: Path) -> None:
    (_port(eight_nic_sys, "mlx5_5") / "hw_counters/np_cnp_sent").unlink()
    source = RdmaSource(eight_nic_sys)
    source.collect(0.0)
    values = _values(source.collect(1.0))
    assert ("rdma_cnp_sent_per_second", "mlx5_5") not in values
    assert values[("rdma_cnp_handled_per_second", "mlx5_5")] == 0.0
    assert source.problems.counts["missing"] == 2


def test_rate_uses_the_time_of_the_reading_not_the_batch_time(eight_nic_sys: Path) -> None:
    """A source before rdma that is slow once (0.4 s) must not skew rdma's rate.

    The counter grows at a known rate in real time; the source just before rdma writes it as it
    is at that moment, so rdma reads it right after. The batch times (as the agent's run loop
    passes them) are 0.6 s apart, the readings 1.0 s: the rate is the real one only if rdma
    timestamps its own readings.
    """
    from collectors.agent import Agent
    from collectors.base import ProblemLog

    bytes_per_s = 4_000_000.0
    data = _port(eight_nic_sys, "mlx5_0") / "counters/port_xmit_data"
    start = time.monotonic()

    class SlowOnce:
        name = "host"

        def __init__(self) -> None:
            self.problems = ProblemLog(self.name)
            self.delay_s = 0.0

        def collect(self, now: float) -> Collected:
            time.sleep(self.delay_s)
            # The NIC's counter as it is now (port_xmit_data counts 4-byte words).
            _write(data, int(bytes_per_s / 4 * (time.monotonic() - start)))
            return Collected()

        def close(self) -> None:
            pass

    slow = SlowOnce()
    agent = Agent([slow, RdmaSource(eight_nic_sys)], job="j", node="n", labels={})
    agent.collect_once(time.time())
    time.sleep(0.6)
    slow.delay_s = 0.4
    batch = agent.collect_once(time.time())
    rates = {(m, d): v for m, d, v in batch.samples}
    assert rates[("rdma_tx_bytes_per_second", "mlx5_0")] == pytest.approx(bytes_per_s, rel=0.05)


def test_8nic_collect_is_cheap(eight_nic_sys: Path) -> None:
    source = RdmaSource(eight_nic_sys)
    source.collect(0.0)
    start = time.process_time()
    for now in range(1, 101):
        source.collect(float(now))
    per_collect = (time.process_time() - start) / 100
    # ~70 small sysfs reads per collect; at 1 Hz this must stay far below 1% of a core.
    assert per_collect < 0.01, f"{per_collect * 1e3:.2f} ms CPU per collect"


if __name__ == "__main__":
    EIGHT_NIC.write_text(mlx5_8nic_ttar())
    sys.stdout.write(f"wrote {EIGHT_NIC}\n")
