"""Host source against the real psutil of this machine, and a faked psutil for the edge cases."""

from __future__ import annotations

import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import psutil
import pytest
from manual_clock import ManualClock

import collectors.host as host
from collectors.base import Collected, Source
from collectors.host import HostSource
from minder.core.metrics import validate_sample

RATES = {
    "disk_read_bytes_per_second",
    "disk_write_bytes_per_second",
    "net_tx_bytes_per_second",
    "net_rx_bytes_per_second",
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _values(out: Collected) -> dict[str, float]:
    values = {}
    for metric, device, value in out.samples:
        validate_sample(metric, device, value)
        assert device == ""
        values[metric] = value
    assert len(values) == len(out.samples)
    return values


def test_real_psutil_first_collect_primes_then_all_six_metrics(tmp_path: Any) -> None:
    source = HostSource()
    assert isinstance(source, Source) and source.name == "host"
    first = _values(source.collect(time.time()))
    # Only the level is known at once; the CPU ratio and the rates need a second reading.
    assert set(first) == {"memory_used_bytes"}
    total = psutil.virtual_memory().total
    assert 0 < first["memory_used_bytes"] < total
    time.sleep(0.2)
    (tmp_path / "blob").write_bytes(b"x" * 1_000_000)  # some disk activity, harmless
    second = _values(source.collect(time.time()))
    assert set(second) >= {"cpu_util_ratio", "memory_used_bytes"}
    assert 0.0 <= second["cpu_util_ratio"] <= 1.0
    # Disk rates need a whole physical disk, network rates a non-loopback interface.
    expected = set()
    if any(Path("/sys/block").glob("*/device")):
        expected |= {"disk_read_bytes_per_second", "disk_write_bytes_per_second"}
    if any(nic != "lo" for nic in psutil.net_io_counters(pernic=True)):
        expected |= {"net_tx_bytes_per_second", "net_rx_bytes_per_second"}
    assert expected, "this machine has neither a physical disk nor a network interface"
    assert set(second) - {"cpu_util_ratio", "memory_used_bytes"} == expected
    for metric in RATES:
        assert 0.0 <= second[metric] < 100e9, metric
    assert dict(source.problems.counts) == {}
    source.close()


def test_collect_does_not_block() -> None:
    source = HostSource()
    source.collect(0.0)
    start = time.perf_counter()
    for now in range(1, 21):
        source.collect(float(now))
    assert (time.perf_counter() - start) / 20 < 0.05  # cpu_percent(interval=1) would take 1 s


# -- a fake psutil -----------------------------------------------------------------------------

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
Memory = namedtuple("Memory", "total available")
Disk = namedtuple("Disk", "read_bytes write_bytes")
Nic = namedtuple("Nic", "bytes_sent bytes_recv")


class FakePsutil:
    def __init__(self) -> None:
        self.cpu = CpuTimes(100.0, 0.0, 50.0, 800.0, 50.0, 0.0, 0.0, 0.0, 10.0, 0.0)
        self.disks: dict[str, Disk] = {"vda": Disk(1000, 2000), "vda1": Disk(900, 1900)}
        self.nics: dict[str, Nic] = {"eth0": Nic(5000, 7000), "lo": Nic(10**9, 10**9)}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(psutil, "cpu_times", lambda: self.cpu)
        monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory(16 * 2**30, 4 * 2**30))
        monkeypatch.setattr(psutil, "disk_io_counters", lambda **_: dict(self.disks))
        monkeypatch.setattr(psutil, "net_io_counters", lambda **_: dict(self.nics))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> FakePsutil:
    """A fake psutil and a fake /sys: vda is a whole physical disk, eth0 a physical NIC."""
    (tmp_path / "block/vda/device").mkdir(parents=True)
    (tmp_path / "block/loop0").mkdir(parents=True)
    (tmp_path / "class/net/eth0/device").mkdir(parents=True)
    (tmp_path / "class/net/docker0").mkdir(parents=True)
    (tmp_path / "class/net/lo").mkdir(parents=True)
    monkeypatch.setattr(host, "_SYS", tmp_path)
    fake = FakePsutil()
    fake.install(monkeypatch)
    return fake


def test_values_from_fake_counters(fake: FakePsutil, clock: ManualClock) -> None:
    source = HostSource(clock=clock)
    assert _values(source.collect(clock.at(10.0))) == {"memory_used_bytes": 12 * 2**30}
    # 35 s of CPU time passed (guest time is inside user), 10 of them idle or iowait.
    fake.cpu = fake.cpu._replace(user=120.0, system=55.0, idle=808.0, iowait=52.0, guest=15.0)
    fake.disks = {"vda": Disk(3000, 2500), "vda1": Disk(2900, 2400), "loop0": Disk(10**6, 10**6)}
    fake.nics = {"eth0": Nic(6000, 9000), "lo": Nic(2 * 10**9, 2 * 10**9), "docker0": Nic(10**6, 0)}
    values = _values(source.collect(clock.at(12.0)))
    assert values["cpu_util_ratio"] == pytest.approx(25 / 35)
    # Only the whole physical disk counts: not its partition, not loop devices.
    assert values["disk_read_bytes_per_second"] == 1000.0
    assert values["disk_write_bytes_per_second"] == 250.0
    # Only the physical NIC: loopback and bridges would count traffic twice.
    assert values["net_tx_bytes_per_second"] == 500.0
    assert values["net_rx_bytes_per_second"] == 1000.0


def test_backwards_counters_give_no_negative_values(fake: FakePsutil, clock: ManualClock) -> None:
    source = HostSource(clock=clock)
    source.collect(clock.at(0.0))
    fake.cpu = fake.cpu._replace(idle=700.0)  # CPU hotplug: idle went back
    fake.disks = {"vda": Disk(10, 20)}
    fake.nics = {"eth0": Nic(1, 1)}
    values = _values(source.collect(clock.at(1.0)))
    assert set(values) == {"memory_used_bytes"}
    assert source.problems.counts["counter_reset"] == 5  # cpu, 2 disk, 2 net
    fake.cpu = fake.cpu._replace(user=101.0, idle=701.0)
    fake.disks = {"vda": Disk(110, 20)}
    fake.nics = {"eth0": Nic(3, 1)}
    values = _values(source.collect(clock.at(2.0)))
    assert values["cpu_util_ratio"] == pytest.approx(0.5)
    assert values["disk_read_bytes_per_second"] == 100.0
    assert values["net_tx_bytes_per_second"] == 2.0
    assert all(v >= 0 for v in values.values())


def test_a_new_device_primes_instead_of_adding_its_history(
    fake: FakePsutil, clock: ManualClock
) -> None:
    (host._SYS / "block/nvme0n1/device").mkdir(parents=True)
    source = HostSource(clock=clock)
    source.collect(clock.at(0.0))
    fake.disks = {"vda": Disk(1100, 2000), "nvme0n1": Disk(10**12, 10**12)}  # hot-plugged
    values = _values(source.collect(clock.at(1.0)))
    assert values["disk_read_bytes_per_second"] == 100.0
    fake.disks = {"vda": Disk(1100, 2000), "nvme0n1": Disk(10**12 + 50, 10**12)}
    assert _values(source.collect(clock.at(2.0)))["disk_read_bytes_per_second"] == 50.0
    fake.disks = {"nvme0n1": Disk(10**12 + 80, 10**12)}  # vda removed: no reset, no drop
    assert _values(source.collect(clock.at(3.0)))["disk_read_bytes_per_second"] == 30.0
    assert source.problems.counts["counter_reset"] == 0


def test_without_physical_nics_all_but_loopback_and_mirrors_count(
    fake: FakePsutil, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, clock: ManualClock
) -> None:
    # A container's network namespace: eth0 is one end of a veth, no backing device.
    (tmp_path / "class/net/eth0/device").rmdir()
    fake.nics = {"eth0": Nic(0, 0), "lo": Nic(0, 0), "ifb0": Nic(0, 0)}
    source = HostSource(clock=clock)
    source.collect(clock.at(0.0))
    fake.nics = {"eth0": Nic(10, 20), "lo": Nic(10**6, 10**6), "ifb0": Nic(10**6, 10**6)}
    values = _values(source.collect(clock.at(1.0)))
    assert values["net_tx_bytes_per_second"] == 10.0
    assert values["net_rx_bytes_per_second"] == 20.0


def test_psutil_failure_is_a_problem_not_an_error(
    fake: FakePsutil, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    def broken(**_: Any) -> Any:
        raise OSError("no /proc/diskstats")

    monkeypatch.setattr(psutil, "disk_io_counters", broken)
    source = HostSource(clock=clock)
    source.collect(clock.at(0.0))
    fake.nics = {"eth0": Nic(5100, 7000)}
    values = _values(source.collect(clock.at(1.0)))
    assert "disk_read_bytes_per_second" not in values
    assert values["net_tx_bytes_per_second"] == 100.0
    assert source.problems.counts["unreadable"] == 2


def test_physical_device_caches_keep_only_the_names_seen_last(
    fake: FakePsutil, clock: ManualClock
) -> None:
    source = HostSource(clock=clock)
    # Containers come and go: each leaves a veth name behind that is never seen again.
    for i in range(200):
        fake.nics = {"eth0": Nic(5000 + i, 7000), "lo": Nic(0, 0), f"veth{i}": Nic(i, i)}
        fake.disks = {"vda": Disk(1000 + i, 2000), f"loop{i}": Disk(0, 0)}
        source.collect(clock.at(float(i)))
    assert set(source._nic_physical) == {"eth0", "lo", "veth199"}
    assert set(source._disk_physical) == {"vda", "loop199"}
    # The cache still answers for the names that stay (eth0 physical, veth not).
    fake.nics = {"eth0": Nic(6000, 7000), "lo": Nic(0, 0), "veth199": Nic(10**9, 0)}
    values = _values(source.collect(clock.at(200.0)))
    assert values["net_tx_bytes_per_second"] == 6000 - 5199
