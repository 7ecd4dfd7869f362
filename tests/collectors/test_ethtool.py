"""PFC source: netdev discovery from sysfs, a fake ``ethtool -S`` and its failure modes."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest
from manual_clock import ManualClock
from ttar import unpack_ttar

from collectors.base import Collected, Source
from collectors.ethtool import EthtoolSource, parse_ethtool_stats, rdma_netdevs
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
INTEL_STATS = (
    HERE.parents[1]
    / ".."
    / "shared"
    / "data"
    / "sysfs-infiniband-fixtures"
    / "node_exporter_ethtool_eth0_statistics.txt"
)
NETDEVS = [f"enp{0x0C + 0x10 * i}s0np0" for i in range(8)]

# Prints <dir>/<netdev>.txt; <netdev>.sleep makes it hang, <netdev>.exit makes it fail.
FAKE_ETHTOOL = """\
import pathlib, sys, time
folder, netdev = pathlib.Path(sys.argv[1]), sys.argv[-1]
if (folder / f"{netdev}.sleep").exists():
    time.sleep(float((folder / f"{netdev}.sleep").read_text()))
if (folder / f"{netdev}.exit").exists():
    sys.stderr.write(f"Cannot get stats strings information: No such device\\n")
    sys.exit(int((folder / f"{netdev}.exit").read_text()))
sys.stdout.write((folder / f"{netdev}.txt").read_text())
"""


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    unpack_ttar(EIGHT_NIC, tmp_path / "tree")
    return tmp_path / "tree" / "sys"


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """Folder of per-netdev ``ethtool -S`` outputs, all the mlx5 capture to begin with."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    for netdev in [*NETDEVS, "eth0"]:
        (folder / f"{netdev}.txt").write_text(MLX5_STATS.read_text())
    return folder


@pytest.fixture
def fake(tmp_path: Path, outputs: Path) -> tuple[str, ...]:
    script = tmp_path / "fake_ethtool.py"
    script.write_text(FAKE_ETHTOOL)
    return (sys.executable, str(script), str(outputs), "-S")


def _set(outputs: Path, netdev: str, **counters: object) -> None:
    """Rewrite some counters of one netdev's output."""
    lines = []
    for line in (outputs / f"{netdev}.txt").read_text().splitlines():
        name = line.split(":")[0].strip()
        lines.append(f"     {name}: {counters[name]}" if name in counters else line)
    (outputs / f"{netdev}.txt").write_text("\n".join(lines) + "\n")


def _values(out: Collected) -> dict[tuple[str, str], float]:
    values = {}
    for metric, device, value in out.samples:
        validate_sample(metric, device, value)
        values[(metric, device)] = value
    assert len(values) == len(out.samples)
    assert out.events == []
    return values


# -- parsing and discovery ---------------------------------------------------------------------


def test_parse_keeps_names_with_dots_and_spaces_and_skips_the_header() -> None:
    if not INTEL_STATS.is_file():
        pytest.skip(f"shared fixture {INTEL_STATS} is absent (read-only data beside the repo)")
    stats = parse_ethtool_stats(INTEL_STATS.read_text())
    assert stats["port.rx_dropped"] == "12028"
    assert stats["duplicate metric"] == "1" and stats["duplicate_metric"] == "2"
    assert stats["rx_packets"] == "1260062"
    assert "NIC statistics" not in stats and "# ethtool -S eth0" not in stats
    mlx5 = parse_ethtool_stats(MLX5_STATS.read_text())
    assert mlx5["rx_prio3_pause"] == "182731" and mlx5["tx_prio3_pause"] == "40218"
    assert len(mlx5) == 79


def test_rdma_netdevs_maps_netdevs_to_rdma_device_names(sysfs: Path) -> None:
    assert rdma_netdevs(sysfs) == {netdev: f"mlx5_{i}" for i, netdev in enumerate(NETDEVS)}
    pci = sysfs / "devices/pci0000:00"
    (pci / "0000:1c:00.0/net/enp28s0np0/type").write_text("32\n")  # IPoIB: no PFC
    (pci / "0000:2c:00.0/net/enp44s0np0/dev_port").write_text("1\n")  # second port
    mapping = rdma_netdevs(sysfs)
    assert "enp28s0np0" not in mapping
    assert mapping["enp44s0np0"] == "mlx5_2:2"
    assert rdma_netdevs(sysfs.parent / "nowhere") == {}


# -- collecting --------------------------------------------------------------------------------


def test_pause_rates_per_rdma_device(
    sysfs: Path, outputs: Path, fake: tuple[str, ...], clock: ManualClock
) -> None:
    source = EthtoolSource(fake, sysfs_root=sysfs, clock=clock, timeout_s=FAKE_TIMEOUT_S)
    assert isinstance(source, Source) and source.name == "ethtool"
    assert source.collect(clock.at(100.0)).samples == []  # primes
    _set(outputs, NETDEVS[0], rx_prio3_pause=182731 + 100, tx_prio3_pause=40218 + 10)
    _set(outputs, NETDEVS[7], rx_prio3_pause_duration=1)  # a neighbour name: ignored
    values = _values(source.collect(clock.at(100.5)))
    assert values[("pfc_rx_pause_per_second", "mlx5_0")] == 200.0
    assert values[("pfc_tx_pause_per_second", "mlx5_0")] == 20.0
    assert values[("pfc_rx_pause_per_second", "mlx5_7")] == 0.0
    assert {device for _, device in values} == {f"mlx5_{i}" for i in range(8)}
    assert len(values) == 16
    assert dict(source.problems.counts) == {}
    source.close()


def test_explicit_interfaces_use_the_rdma_name_when_known(
    sysfs: Path, outputs: Path, fake: tuple[str, ...], clock: ManualClock
) -> None:
    source = EthtoolSource(
        fake,
        sysfs_root=sysfs,
        interfaces=["eth0", NETDEVS[4]],
        clock=clock,
        timeout_s=FAKE_TIMEOUT_S,
    )
    source.collect(clock.at(0.0))
    _set(outputs, "eth0", tx_prio3_pause=40218 + 3)
    values = _values(source.collect(clock.at(1.0)))
    assert values == {
        ("pfc_rx_pause_per_second", "eth0"): 0.0,
        ("pfc_tx_pause_per_second", "eth0"): 3.0,
        ("pfc_rx_pause_per_second", "mlx5_4"): 0.0,
        ("pfc_tx_pause_per_second", "mlx5_4"): 0.0,
    }


def test_intel_style_output_has_no_pfc_counters(
    tmp_path: Path, outputs: Path, fake: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    if not INTEL_STATS.is_file():
        pytest.skip(f"shared fixture {INTEL_STATS} is absent (read-only data beside the repo)")
    (outputs / "eth0.txt").write_text(INTEL_STATS.read_text())
    source = EthtoolSource(fake, sysfs_root=tmp_path, interfaces=["eth0"], timeout_s=FAKE_TIMEOUT_S)
    with caplog.at_level(logging.WARNING):
        for now in range(3):
            assert source.collect(float(now)).samples == []
    assert dict(source.problems.counts) == {"no_pfc_counters": 3}
    assert sum("no_pfc_counters" in r.getMessage() for r in caplog.records) == 1


def test_other_priority(sysfs: Path, outputs: Path, fake: tuple[str, ...]) -> None:
    text = (outputs / f"{NETDEVS[1]}.txt").read_text()
    (outputs / f"{NETDEVS[1]}.txt").write_text(
        text + "     rx_prio0_pause: 5\n     tx_prio0_pause: 7\n"
    )
    source = EthtoolSource(
        fake, sysfs_root=sysfs, interfaces=[NETDEVS[1]], priority=0, timeout_s=FAKE_TIMEOUT_S
    )
    source.collect(0.0)
    assert _values(source.collect(1.0)) == {
        ("pfc_rx_pause_per_second", "mlx5_1"): 0.0,
        ("pfc_tx_pause_per_second", "mlx5_1"): 0.0,
    }


def test_garbage_value_and_backwards_counter(
    sysfs: Path, outputs: Path, fake: tuple[str, ...], clock: ManualClock
) -> None:
    source = EthtoolSource(
        fake, sysfs_root=sysfs, interfaces=NETDEVS[:2], clock=clock, timeout_s=FAKE_TIMEOUT_S
    )
    source.collect(clock.at(0.0))
    _set(outputs, NETDEVS[0], rx_prio3_pause="lots")
    _set(outputs, NETDEVS[1], rx_prio3_pause=5, tx_prio3_pause=40218 + 50)  # rx reset
    values = _values(source.collect(clock.at(1.0)))
    assert ("pfc_rx_pause_per_second", "mlx5_0") not in values
    assert values[("pfc_tx_pause_per_second", "mlx5_0")] == 0.0
    assert ("pfc_rx_pause_per_second", "mlx5_1") not in values
    assert values[("pfc_tx_pause_per_second", "mlx5_1")] == 50.0
    assert dict(source.problems.counts) == {"not_numeric": 1, "counter_reset": 1}
    _set(outputs, NETDEVS[1], rx_prio3_pause=25)
    assert _values(source.collect(clock.at(2.0)))[("pfc_rx_pause_per_second", "mlx5_1")] == 20.0


def test_failing_command_is_a_problem_and_other_nics_still_report(
    sysfs: Path, outputs: Path, fake: tuple[str, ...]
) -> None:
    (outputs / f"{NETDEVS[3]}.exit").write_text("1")
    source = EthtoolSource(fake, sysfs_root=sysfs, timeout_s=FAKE_TIMEOUT_S)
    source.collect(0.0)
    values = _values(source.collect(1.0))
    assert not any(device == "mlx5_3" for _, device in values)
    assert len(values) == 14
    assert source.problems.counts["command_failed"] == 2


def test_timeout_kills_the_process_group(
    tmp_path: Path, outputs: Path, fake: tuple[str, ...]
) -> None:
    (outputs / "eth0.sleep").write_text("30")
    source = EthtoolSource(
        fake, sysfs_root=tmp_path, interfaces=["eth0", NETDEVS[0]], timeout_s=1.5
    )
    start = time.monotonic()
    assert source.collect(0.0).samples == []
    assert time.monotonic() - start < 10.0
    assert dict(source.problems.counts) == {"timeout": 1}
    # A shell whose child keeps the pipe open: only killing the whole group ends the wait.
    script = tmp_path / "hang.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    source = EthtoolSource((str(script),), sysfs_root=tmp_path, interfaces=["eth0"], timeout_s=0.2)
    start = time.monotonic()
    source.collect(0.0)
    assert time.monotonic() - start < 5.0
    assert dict(source.problems.counts) == {"timeout": 1}


def test_missing_command_is_absent_once(
    sysfs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = EthtoolSource((str(tmp_path / "no-ethtool"), "-S"), sysfs_root=sysfs)
    with caplog.at_level(logging.WARNING):
        for now in range(5):
            assert source.collect(float(now)).samples == []
    assert dict(source.problems.counts) == {"absent": 1}
    assert sum("absent" in r.getMessage() for r in caplog.records) == 1


def test_no_rdma_netdev_is_absent_once(tmp_path: Path, fake: tuple[str, ...]) -> None:
    source = EthtoolSource(fake, sysfs_root=tmp_path, timeout_s=FAKE_TIMEOUT_S)
    for now in range(3):
        assert source.collect(float(now)).samples == []
    assert dict(source.problems.counts) == {"absent": 1}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"command": "ethtool -S"}, "non-empty sequence of strings"),
        ({"command": ()}, "non-empty sequence of strings"),
        ({"priority": 8}, "integer 0..7"),
        ({"priority": True}, "integer 0..7"),
        ({"timeout_s": 0}, "seconds > 0"),
        ({"interfaces": "eth0"}, "list of Linux interface names"),
        ({"interfaces": ["../etc"]}, "list of Linux interface names"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EthtoolSource(**kwargs)  # type: ignore[arg-type]


def _timed_collect(source: EthtoolSource, now: float) -> float:
    start = time.monotonic()
    source.collect(now)
    return time.monotonic() - start


def test_hung_command_costs_a_short_deadline_then_backs_off(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    hung = ("sh", "-c", "sleep 30", "sh")  # the netdev lands in $1, unused
    source = EthtoolSource(hung, sysfs_root=tmp_path, interfaces=["eth0"], clock=clock)
    ran: list[float] = []
    with caplog.at_level(logging.WARNING):
        for t in range(0, 70):
            before = source.problems.counts["timeout"]
            took = _timed_collect(source, clock.at(float(t)))
            if source.problems.counts["timeout"] > before:
                ran.append(t)
                assert took < 0.8, f"a run at {t} s took {took:.2f} s: default deadline is 0.25 s"
            else:
                assert took < 0.15, f"skipped at {t} s but took {took:.2f} s"
    # Runs at 0, then after 2, 4, 8, 16, 32 s of backoff (the next would be 60 s later).
    assert ran == [0, 2, 6, 14, 30, 62]
    assert dict(source.problems.counts) == {"timeout": 6}
    assert sum("(timeout)" in r.getMessage() for r in caplog.records) == 1
    for t in (63, 121):  # capped at 60 s
        assert _timed_collect(source, clock.at(float(t))) < 0.15
    source.collect(clock.at(122.0))
    assert source.problems.counts["timeout"] == 7


def test_command_answering_again_ends_its_backoff(
    tmp_path: Path, outputs: Path, fake: tuple[str, ...], clock: ManualClock
) -> None:
    (outputs / "eth0.sleep").write_text("30")
    source = EthtoolSource(
        fake, sysfs_root=tmp_path, interfaces=["eth0", NETDEVS[0]], timeout_s=1.0, clock=clock
    )
    source.collect(clock.at(0.0))
    assert dict(source.problems.counts) == {"timeout": 1}
    source.collect(clock.at(1.0))  # eth0 skipped, the other netdev read
    _set(outputs, NETDEVS[0], rx_prio3_pause=182731 + 5)
    (outputs / "eth0.sleep").unlink()
    source.collect(clock.at(2.0))  # eth0 due again, answers: primes
    _set(outputs, "eth0", rx_prio3_pause=182731 + 10)
    values = _values(source.collect(clock.at(3.0)))  # no backoff left: read every interval
    assert values[("pfc_rx_pause_per_second", "eth0")] == 10.0
    assert values[("pfc_rx_pause_per_second", NETDEVS[0])] == 0.0
    assert dict(source.problems.counts) == {"timeout": 1}
