"""In-process ``ethtool -S``: the real kernel where it can be, a fake SIOCETHTOOL elsewhere, and the
PFC source reading through it (auto mode, fallback to the command, missing devices)."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from manual_clock import ManualClock
from ttar import unpack_ttar

import collectors.ethtool as ethtool_module
from collectors import ethtool_ioctl
from collectors.base import Collected
from collectors.ethtool import EthtoolSource, parse_ethtool_stats
from collectors.ethtool_ioctl import (
    ETH_GSTRING_LEN,
    ETHTOOL_GDRVINFO,
    ETHTOOL_GSSET_INFO,
    ETHTOOL_GSTATS,
    ETHTOOL_GSTRINGS,
    SIOCETHTOOL,
    EthtoolError,
    EthtoolNoDevice,
    EthtoolReader,
    EthtoolUnsupported,
    StatNames,
    read_stats,
)
from minder.core.errors import ValidationError
from minder.core.metrics import validate_sample


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


HERE = Path(__file__).resolve().parent
FAKE_TIMEOUT_S = 10.0
"""Deadline for the fake ethtool: a Python script, whose start-up on a loaded machine must not
look like a hung command (the default deadline is 0.25 s)."""
MLX5_STATS = HERE / "fixtures" / "ethtool" / "mlx5_ethtool_S.txt"
EIGHT_NIC = HERE / "fixtures" / "rdma" / "mlx5_8nic.ttar"
NETDEVS = [f"enp{0x0C + 0x10 * i}s0np0" for i in range(8)]
SYS_NET = Path("/sys/class/net")

# Prints <dir>/<netdev>.txt, like the fake of test_ethtool.py.
FAKE_ETHTOOL = """\
import pathlib, sys
folder, netdev = pathlib.Path(sys.argv[1]), sys.argv[-1]
sys.stdout.write((folder / f"{netdev}.txt").read_text())
"""


# -- a fake kernel -----------------------------------------------------------------------------


class FakeKernel:
    """Answers SIOCETHTOOL like the kernel does, writing through the pointer in ``struct ifreq``.

    ``devices`` maps a netdev to its ``[(name, value), ...]`` or to an errno every request fails
    with. ``strict`` is the behaviour of kernels from 6.19 (a count that differs from the one sent
    gets 0 back); otherwise the kernel writes all it has, like older kernels.
    """

    def __init__(self) -> None:
        self.devices: dict[str, list[tuple[str, int]] | int] = {}
        self.calls: list[tuple[str, int]] = []
        self.has_sset_info = True
        self.strict = True
        self.grow_before: int | None = None
        """Add this many statistics just before the next GSTRINGS/GSTATS answer (a resize race)."""

    def set_stats(self, netdev: str, stats: dict[str, int]) -> None:
        self.devices[netdev] = list(stats.items())

    def _grow(self, netdev: str, stats: list[tuple[str, int]]) -> list[tuple[str, int]]:
        if self.grow_before:
            stats = stats + [(f"rx{i}_new", i) for i in range(self.grow_before)]
            self.devices[netdev] = stats
            self.grow_before = None
        return stats

    def ioctl(self, fd: int, request: int, arg: bytes, *rest: object) -> bytes:
        assert request == SIOCETHTOOL and isinstance(fd, int)
        raw_name, pointer = struct.unpack_from("16sP", arg)
        netdev = raw_name.rstrip(b"\0").decode()
        cmd = struct.unpack("=I", ctypes.string_at(pointer, 4))[0]
        self.calls.append((netdev, cmd))
        stats = self.devices.get(netdev, errno.ENODEV)
        if isinstance(stats, int):
            raise OSError(stats, os.strerror(stats))
        if cmd == ETHTOOL_GSSET_INFO:
            if not self.has_sset_info:
                raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
            header = ctypes.string_at(pointer, 16)
            mask = struct.unpack_from("=Q", header, 8)[0] & (0b10 if stats else 0)
            ctypes.memmove(pointer + 8, struct.pack("=QI", mask, len(stats)), 12 if mask else 8)
        elif cmd == ETHTOOL_GDRVINFO:
            ctypes.memmove(pointer + 180, struct.pack("=I", len(stats)), 4)
        elif cmd == ETHTOOL_GSTRINGS:
            stats = self._grow(netdev, stats)
            sent = struct.unpack("=III", ctypes.string_at(pointer, 12))[2]
            count = 0 if self.strict and sent != len(stats) else len(stats)
            data = b"".join(n.encode().ljust(ETH_GSTRING_LEN, b"\0") for n, _ in stats[:count])
            ctypes.memmove(pointer + 8, struct.pack("=I", count) + data, 4 + len(data))
        elif cmd == ETHTOOL_GSTATS:
            stats = self._grow(netdev, stats)
            sent = struct.unpack("=II", ctypes.string_at(pointer, 8))[1]
            count = 0 if self.strict and sent != len(stats) else len(stats)
            data = struct.pack(f"={count}Q", *(v for _, v in stats[:count]))
            ctypes.memmove(pointer + 4, struct.pack("=I", count) + data, 4 + len(data))
        else:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return arg


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    fake = FakeKernel()
    monkeypatch.setattr(ethtool_ioctl, "fcntl", SimpleNamespace(ioctl=fake.ioctl))
    return fake


def _mlx5_stats() -> dict[str, int]:
    return {k: int(v) for k, v in parse_ethtool_stats(MLX5_STATS.read_text()).items()}


# -- the real kernel ---------------------------------------------------------------------------


def _interface_with_stats() -> str:
    """A netdev of this machine whose driver has ``ethtool -S`` statistics, or skip."""
    names = sorted(os.listdir(SYS_NET)) if SYS_NET.is_dir() else []
    with EthtoolReader() as reader:
        for name in names:
            try:
                if reader.read_stats(name):
                    return name
            except OSError:
                continue
    pytest.skip(f"no interface of {names} gives ethtool statistics (virtio_net, veth, mlx5 do)")


def test_real_interface_has_the_names_and_values_ethtool_prints() -> None:
    netdev = _interface_with_stats()
    binary = shutil.which("ethtool") or next(
        (p for p in ("/usr/sbin/ethtool", "/sbin/ethtool") if os.access(p, os.X_OK)), None
    )
    if binary is None:
        pytest.skip("the ethtool program is not installed: nothing to compare the ioctl with")
    cache: dict[str, StatNames] = {}
    before = read_stats(netdev, cache)
    text = subprocess.run(
        [binary, "-S", netdev], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    after = read_stats(netdev, cache)
    printed = {name: int(value) for name, value in parse_ethtool_stats(text).items()}
    # ethtool prints names with "%s:"; parse_ethtool_stats strips them, so compare stripped.
    assert [n.strip() for n in before] == list(printed)
    assert list(after) == list(before)
    for (name, value), first, last in zip(
        printed.items(), before.values(), after.values(), strict=True
    ):
        low, high = min(first, last), max(first, last)
        slack = 64 + high // 100  # busy counters (packets, kicks) move between the three reads
        assert low - slack <= value <= high + slack, (name, low, value, high)
    assert list(cache) == [netdev] and len(cache[netdev].names) == len(before)


def test_real_interface_subset_and_steady_reads() -> None:
    netdev = _interface_with_stats()
    with EthtoolReader() as reader:
        full = reader.read_stats(netdev)
        first, last = next(iter(full)), list(full)[-1]
        part = reader.read_stats(netdev, [last, "no_such_statistic", first])
        assert set(part) == {first, last}
        assert all(isinstance(v, int) and v >= 0 for v in part.values())
        fetched = reader.names_cache[netdev]
        reader.read_stats(netdev)
        assert reader.names_cache[netdev] is fetched  # the names were not fetched again


def test_missing_interface_raises_no_device() -> None:
    with EthtoolReader() as reader, pytest.raises(EthtoolNoDevice) as info:
        reader.read_stats("minder-nosuch0")
    assert info.value.errno == errno.ENODEV
    assert isinstance(info.value, EthtoolError) and isinstance(info.value, OSError)
    assert info.value.ifname == "minder-nosuch0"
    assert "'minder-nosuch0'" in str(info.value) and "Errno 19" in str(info.value)


def test_loopback_has_no_statistics() -> None:
    if not (SYS_NET / "lo").exists():
        pytest.skip("no loopback interface in this network namespace")
    with pytest.raises(EthtoolUnsupported) as info:
        read_stats("lo")
    assert info.value.errno == errno.EOPNOTSUPP and info.value.ifname == "lo"


@pytest.mark.parametrize("name", ["", "a" * 16, "../eth0", "eth\0"])
def test_impossible_interface_names_are_refused(name: str) -> None:
    with EthtoolReader() as reader, pytest.raises(ValueError, match="interface name"):
        reader.read_stats(name)


def test_closed_reader_is_refused() -> None:
    reader = EthtoolReader()
    reader.close()
    reader.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        reader.read_stats("lo")


# -- the fake kernel: caching and races ---------------------------------------------------------


def test_names_are_fetched_once_and_again_when_the_count_changes(kernel: FakeKernel) -> None:
    kernel.set_stats("eth0", {"rx_packets": 5, "tx_packets": 7})
    reader = EthtoolReader()
    assert reader.read_stats("eth0") == {"rx_packets": 5, "tx_packets": 7}
    assert reader.read_stats("eth0") == {"rx_packets": 5, "tx_packets": 7}
    cmds = [cmd for _, cmd in kernel.calls]
    assert cmds.count(ETHTOOL_GSTRINGS) == 1
    assert cmds.count(ETHTOOL_GSSET_INFO) == 2 and cmds.count(ETHTOOL_GSTATS) == 2
    kernel.set_stats("eth0", {"rx_packets": 6, "rx_prio3_pause": 1, "tx_packets": 8})
    assert reader.read_stats("eth0") == {"rx_packets": 6, "rx_prio3_pause": 1, "tx_packets": 8}
    assert [cmd for _, cmd in kernel.calls].count(ETHTOOL_GSTRINGS) == 2
    assert reader.names_cache["eth0"].names == ("rx_packets", "rx_prio3_pause", "tx_packets")
    reader.close()


def test_same_count_new_names_are_picked_up_after_the_max_age(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(ethtool_ioctl.time, "monotonic", lambda: clock[0])
    kernel.set_stats("eth0", {"rx_prio3_pause": 10, "tx_prio3_pause": 20})
    reader = EthtoolReader(names_max_age_s=60.0)
    assert reader.read_stats("eth0") == {"rx_prio3_pause": 10, "tx_prio3_pause": 20}
    kernel.set_stats("eth0", {"rx_prio4_pause": 1, "tx_prio4_pause": 2})  # PFC moved to prio 4
    clock[0] += 59.0
    assert reader.read_stats("eth0") == {"rx_prio3_pause": 1, "tx_prio3_pause": 2}  # stale names
    clock[0] += 2.0
    assert reader.read_stats("eth0") == {"rx_prio4_pause": 1, "tx_prio4_pause": 2}
    with pytest.raises(ValueError, match="names_max_age_s"):
        EthtoolReader(names_max_age_s=0)


def test_shared_names_cache_and_subset(kernel: FakeKernel) -> None:
    kernel.set_stats("eth0", {"a": 1, "dup": 2, "b": 3, "dup ": 9})
    kernel.devices["eth0"].append(("dup", 4))  # type: ignore[union-attr]
    cache: dict[str, StatNames] = {}
    assert read_stats("eth0", cache) == {"a": 1, "dup": 4, "b": 3, "dup ": 9}  # last one wins
    assert read_stats("eth0", cache)["dup"] == 4
    assert [cmd for _, cmd in kernel.calls].count(ETHTOOL_GSTRINGS) == 1
    with EthtoolReader(cache) as reader:
        assert reader.read_stats("eth0", ["dup", "b", "zz"]) == {"dup": 4, "b": 3}
    assert [cmd for _, cmd in kernel.calls].count(ETHTOOL_GSTRINGS) == 1


@pytest.mark.parametrize("strict", [True, False])
def test_a_set_resized_between_two_ioctls_is_read_again(kernel: FakeKernel, strict: bool) -> None:
    kernel.strict = strict
    kernel.set_stats("eth0", {"rx_packets": 5, "tx_packets": 7})
    reader = EthtoolReader()
    reader.read_stats("eth0")
    kernel.grow_before = 3  # e.g. mlx5 opened more channels right after the size query
    stats = reader.read_stats("eth0")
    assert stats == {"rx_packets": 5, "tx_packets": 7, "rx0_new": 0, "rx1_new": 1, "rx2_new": 2}
    assert reader.names_cache["eth0"].names[-1] == "rx2_new"
    reader.close()


def test_a_set_that_never_settles_is_an_error(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel.set_stats("eth0", {"rx_packets": 5})
    grow = kernel._grow

    def always_grow(netdev: str, stats: list[tuple[str, int]]) -> list[tuple[str, int]]:
        kernel.grow_before = 1
        return grow(netdev, stats)

    monkeypatch.setattr(kernel, "_grow", always_grow)
    with pytest.raises(EthtoolError, match="keeps changing") as info:
        read_stats("eth0")
    assert info.value.errno == errno.EAGAIN


def test_kernel_without_sset_info_uses_drvinfo(kernel: FakeKernel) -> None:
    kernel.has_sset_info = False
    kernel.set_stats("eth0", {"rx_prio3_pause": 3})
    kernel.set_stats("eth1", {"tx_prio3_pause": 4})
    with EthtoolReader() as reader:
        assert reader.read_stats("eth0") == {"rx_prio3_pause": 3}
        assert reader.read_stats("eth1") == {"tx_prio3_pause": 4}
    cmds = [cmd for _, cmd in kernel.calls]
    assert cmds.count(ETHTOOL_GSSET_INFO) == 1  # tried once, then GDRVINFO for every read
    assert cmds.count(ETHTOOL_GDRVINFO) == 2


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (errno.EOPNOTSUPP, EthtoolUnsupported),
        (errno.EPERM, EthtoolUnsupported),
        (errno.ENOTTY, EthtoolUnsupported),
        (errno.ENODEV, EthtoolNoDevice),
        (errno.EIO, EthtoolError),
        (errno.EBUSY, EthtoolError),
    ],
)
def test_errnos_map_to_exceptions(kernel: FakeKernel, err: int, kind: type[Exception]) -> None:
    kernel.devices["eth0"] = err
    with pytest.raises(kind) as info:
        read_stats("eth0")
    assert type(info.value) is kind
    assert info.value.errno == err  # type: ignore[attr-defined]
    assert "ETHTOOL_GSSET_INFO on interface 'eth0'" in str(info.value)


def test_empty_statistics_set_is_unsupported(kernel: FakeKernel) -> None:
    kernel.devices["eth0"] = []
    with pytest.raises(EthtoolUnsupported, match="no statistics"):
        read_stats("eth0")


# -- the PFC source through the ioctl -----------------------------------------------------------


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    unpack_ttar(EIGHT_NIC, tmp_path / "tree")
    return tmp_path / "tree" / "sys"


@pytest.fixture
def fake_command(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """A fake ``ethtool -S`` printing ``<outputs>/<netdev>.txt``, and that folder."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    script = tmp_path / "fake_ethtool.py"
    script.write_text(FAKE_ETHTOOL)
    return folder, (sys.executable, str(script), str(folder), "-S")


def _write_output(folder: Path, netdev: str, stats: dict[str, int]) -> None:
    lines = ["NIC statistics:", *(f"     {name}: {value}" for name, value in stats.items())]
    (folder / f"{netdev}.txt").write_text("\n".join(lines) + "\n")


def _values(out: Collected) -> dict[tuple[str, str], float]:
    for sample in out.samples:
        validate_sample(*sample)
    values = {(metric, device): value for metric, device, value in out.samples}
    assert len(values) == len(out.samples) and out.events == []
    return values


def test_auto_mode_gives_the_samples_of_the_command_on_the_same_numbers(
    sysfs: Path, kernel: FakeKernel, fake_command: tuple[Path, tuple[str, ...]], clock: ManualClock
) -> None:
    folder, command = fake_command
    by_ioctl = EthtoolSource(sysfs_root=sysfs, clock=clock)
    by_command = EthtoolSource(command, sysfs_root=sysfs, clock=clock, timeout_s=FAKE_TIMEOUT_S)
    assert by_ioctl.method == "ioctl" and by_command.method == "command"
    results = []
    for step, now in enumerate([100.0, 100.5, 101.5]):
        for i, netdev in enumerate(NETDEVS):
            stats = _mlx5_stats()
            stats["rx_prio3_pause"] += step * 100 * (i + 1)
            stats["tx_prio3_pause"] += step * step * 7
            kernel.set_stats(netdev, stats)
            _write_output(folder, netdev, stats)
        mine, theirs = by_ioctl.collect(clock.at(now)), by_command.collect(clock.at(now))
        assert sorted(mine.samples) == sorted(theirs.samples)
        results.append(_values(mine))
    assert results[0] == {}  # primes
    assert results[1][("pfc_rx_pause_per_second", "mlx5_0")] == 200.0
    assert results[1][("pfc_rx_pause_per_second", "mlx5_7")] == 1600.0
    assert results[2][("pfc_tx_pause_per_second", "mlx5_3")] == 21.0
    assert len(results[2]) == 16
    assert dict(by_ioctl.problems.counts) == {} == dict(by_command.problems.counts)
    # The in-process path read two counters per NIC and never fetched the names again.
    gstrings = [n for n, cmd in kernel.calls if cmd == ETHTOOL_GSTRINGS]
    assert sorted(gstrings) == sorted(NETDEVS)
    by_ioctl.close()
    by_ioctl.close()


def test_unsupported_ioctl_falls_back_to_the_command_once(
    sysfs: Path,
    kernel: FakeKernel,
    fake_command: tuple[Path, tuple[str, ...]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    clock: ManualClock,
) -> None:
    folder, command = fake_command
    # Make the fake the command that auto mode stands in for.
    monkeypatch.setattr(ethtool_module, "DEFAULT_COMMAND", command)
    for netdev in NETDEVS:
        kernel.set_stats(netdev, _mlx5_stats())
        _write_output(folder, netdev, _mlx5_stats())
    kernel.devices[NETDEVS[2]] = errno.EOPNOTSUPP
    kernel.devices[NETDEVS[5]] = errno.EPERM  # e.g. a seccomp filter on ioctl
    source = EthtoolSource(command, sysfs_root=sysfs, clock=clock, timeout_s=FAKE_TIMEOUT_S)
    assert source.method == "ioctl"
    with caplog.at_level(logging.WARNING):
        source.collect(clock.at(0.0))
        assert source.method == "mixed"
        stats = _mlx5_stats()
        stats["rx_prio3_pause"] += 30
        _write_output(folder, NETDEVS[2], stats)
        kernel.set_stats(NETDEVS[4], stats)
        values = _values(source.collect(clock.at(1.0)))
        source.collect(clock.at(2.0))
    assert values[("pfc_rx_pause_per_second", "mlx5_2")] == 30.0  # by the command
    assert values[("pfc_rx_pause_per_second", "mlx5_4")] == 30.0  # by the ioctl
    assert values[("pfc_rx_pause_per_second", "mlx5_5")] == 0.0  # by the command
    assert len(values) == 16
    assert dict(source.problems.counts) == {"ioctl_unsupported": 2}  # once per interface
    logged = [r.getMessage() for r in caplog.records if "ioctl_unsupported" in r.getMessage()]
    assert len(logged) == 1 and NETDEVS[2] in logged[0] and "Errno 95" in logged[0]
    asked = {n for n, _ in kernel.calls[-3 * len(NETDEVS) :]}
    assert NETDEVS[2] not in asked and NETDEVS[5] not in asked  # not retried by ioctl
    source.close()


def test_ioctl_only_reports_unsupported_without_running_anything(
    sysfs: Path, kernel: FakeKernel, tmp_path: Path
) -> None:
    for netdev in NETDEVS:
        kernel.set_stats(netdev, _mlx5_stats())
    kernel.devices[NETDEVS[1]] = errno.EOPNOTSUPP
    marker = tmp_path / "ran"
    command = ("/bin/sh", "-c", f"touch {marker}", "sh")
    source = EthtoolSource(command, method="ioctl", sysfs_root=sysfs)
    source.collect(0.0)
    values = _values(source.collect(1.0))
    assert len(values) == 14 and not any(device == "mlx5_1" for _, device in values)
    assert dict(source.problems.counts) == {"ioctl_unsupported": 2}
    assert not marker.exists()
    none = EthtoolSource(None, sysfs_root=sysfs)  # auto without a command: no fallback either
    none.collect(0.0)
    assert dict(none.problems.counts) == {"ioctl_unsupported": 1}


def test_missing_device_is_retried_not_handed_to_the_command(
    sysfs: Path,
    kernel: FakeKernel,
    fake_command: tuple[Path, tuple[str, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, command = fake_command  # it has no output for the netdev: running it would fail
    monkeypatch.setattr(ethtool_module, "DEFAULT_COMMAND", command)
    source = EthtoolSource(
        command, sysfs_root=sysfs, interfaces=[NETDEVS[0]], timeout_s=FAKE_TIMEOUT_S
    )
    assert source.collect(0.0).samples == []  # no such device in the fake kernel
    assert dict(source.problems.counts) == {"no_device": 1}
    assert source.method == "ioctl"
    kernel.set_stats(NETDEVS[0], _mlx5_stats())  # the driver came back
    source.collect(1.0)
    assert len(_values(source.collect(2.0))) == 2
    assert dict(source.problems.counts) == {"no_device": 1}


def test_transient_driver_error_skips_the_interval(sysfs: Path, kernel: FakeKernel) -> None:
    kernel.set_stats(NETDEVS[0], _mlx5_stats())
    source = EthtoolSource(sysfs_root=sysfs, interfaces=[NETDEVS[0]])
    source.collect(0.0)
    kernel.devices[NETDEVS[0]] = errno.EIO
    assert source.collect(1.0).samples == []
    kernel.set_stats(NETDEVS[0], _mlx5_stats())
    assert len(_values(source.collect(2.0))) == 2
    assert dict(source.problems.counts) == {"ioctl_failed": 1}
    assert source.method == "ioctl"


def test_explicit_command_never_touches_the_ioctl(
    sysfs: Path, kernel: FakeKernel, fake_command: tuple[Path, tuple[str, ...]]
) -> None:
    folder, command = fake_command
    for netdev in NETDEVS:
        _write_output(folder, netdev, _mlx5_stats())
    for source in (
        EthtoolSource(command, sysfs_root=sysfs, timeout_s=FAKE_TIMEOUT_S),
        EthtoolSource(command, method="command", sysfs_root=sysfs, timeout_s=FAKE_TIMEOUT_S),
    ):
        source.collect(0.0)
        assert len(_values(source.collect(1.0))) == 16
    assert kernel.calls == []


def test_no_socket_falls_back_in_auto_mode(
    sysfs: Path,
    fake_command: tuple[Path, tuple[str, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, command = fake_command
    for netdev in NETDEVS:
        _write_output(folder, netdev, _mlx5_stats())

    def no_socket(*args: object) -> None:
        raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))

    monkeypatch.setattr(ethtool_ioctl.socket, "socket", no_socket)
    monkeypatch.setattr(ethtool_module, "DEFAULT_COMMAND", command)
    source = EthtoolSource(command, sysfs_root=sysfs, timeout_s=FAKE_TIMEOUT_S)
    source.collect(0.0)
    assert len(_values(source.collect(1.0))) == 16
    assert dict(source.problems.counts) == {"ioctl_unsupported": 8}
    assert source.method == "mixed"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "netlink"}, "expected one of 'auto', 'ioctl', 'command'"),
        ({"command": None, "method": "command"}, "with method 'command'"),
    ],
)
def test_bad_method_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EthtoolSource(**kwargs)  # type: ignore[arg-type]
