"""The network checks of ``minder selfcheck run`` (docs/selfcheck.md, "Checks").

* :class:`RdmaCheck` (``network.rdma``) — every RDMA port of ``/sys/class/infiniband``: it must
  be ``4: ACTIVE`` and ``5: LinkUp``, and no error counter may grow while the check watches.
* :class:`IbWriteBwCheck` (``network.ib_write_bw``) — perftest's ``ib_write_bw`` in loopback
  (server and client on this host) on each active port, against a minimum bandwidth.

The sysfs layout is the kernel's (Documentation/ABI/stable/sysfs-class-infiniband):
``<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/*}``.
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collectors.selfcheck.base import (
    Check,
    CheckContext,
    CheckOptions,
    key,
    one_line,
    result,
    run_tool,
    skipped,
)
from minder.core.selfcheck import CheckResult, CheckStatus, Measurement

logger = logging.getLogger(__name__)

ERROR_COUNTERS: tuple[str, ...] = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
"""The IB PMA error counters of ``counters/`` (PortCounters): on a drained, idle node none
should move."""
_ACTIVE = 4
_LINK_UP = 5
_GBPS = re.compile(r"([\d.]+)\s*Gb/sec")


@dataclass(frozen=True, slots=True)
class PortReading:
    """One RDMA port as sysfs shows it at one moment."""

    device: str
    port: int
    state: str
    """``4: ACTIVE``, ``1: DOWN`` …"""
    phys_state: str
    """``5: LinkUp``, ``3: Disabled`` …"""
    rate: str
    """``400 Gb/sec (4X NDR)``."""
    link_layer: str
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return _number(self.state) == _ACTIVE

    @property
    def link_up(self) -> bool:
        return _number(self.phys_state) == _LINK_UP

    @property
    def rate_gbps(self) -> float | None:
        match = _GBPS.search(self.rate)
        return float(match.group(1)) if match else None


def _number(text: str) -> int | None:
    head = text.split(":", 1)[0].strip()
    return int(head) if head.isdigit() else None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def rdma_root(sysfs_root: Path) -> Path:
    return sysfs_root / "class" / "infiniband"


def read_ports(sysfs_root: Path) -> list[PortReading]:
    """Every port of every RDMA device under ``<sysfs_root>/class/infiniband``, sorted."""
    root = rdma_root(sysfs_root)
    readings: list[PortReading] = []
    try:
        devices = sorted(p for p in root.iterdir())
    except OSError:
        return readings
    for device in devices:
        try:
            ports = sorted((p for p in (device / "ports").iterdir() if p.name.isdigit()), key=_port)
        except OSError:
            continue
        for port in ports:
            counters: dict[str, int] = {}
            for counter in ERROR_COUNTERS:
                text = _read(port / "counters" / counter)
                if text.isdigit():
                    counters[counter] = int(text)
            readings.append(
                PortReading(
                    device.name,
                    int(port.name),
                    _read(port / "state"),
                    _read(port / "phys_state"),
                    _read(port / "rate"),
                    _read(port / "link_layer"),
                    counters,
                )
            )
    return readings


def _port(path: Path) -> int:
    return int(path.name)


def _ignored(port: PortReading, ignore: Sequence[str]) -> bool:
    return port.device in ignore or port.name in ignore


class RdmaCheck(Check):
    """``network.rdma``: every RDMA port up, and no error counter growing.

    The counters are read twice, :attr:`CheckOptions.rdma_interval_s` apart; a port down or gone
    between the readings, or a counter that grew, fails. Ports in ``rdma_ignore_ports`` (an
    unused second port) are recorded but not judged.
    """

    name = "network.rdma"
    description = "RDMA ports ACTIVE/LinkUp, error counters not growing (sysfs)"

    def unavailable(self, context: CheckContext) -> str | None:
        root = rdma_root(context.sysfs_root)
        if not root.is_dir():
            return f"no RDMA device: {root} is absent"
        if not read_ports(context.sysfs_root):
            return f"no RDMA port under {root}"
        return None

    def run(self, context: CheckContext) -> CheckResult:
        options = context.options
        first = {p.name: p for p in read_ports(context.sysfs_root)}
        time.sleep(max(0.0, min(options.rdma_interval_s, context.timeout_s * 0.5)))
        second = {p.name: p for p in read_ports(context.sysfs_root)}
        values: dict[str, Measurement] = {
            "ports": len(first),
            "interval_s": options.rdma_interval_s,
        }
        faults: list[str] = []
        for name, before in first.items():
            after = second.get(name)
            if after is None:
                values[key(name, "state")] = "gone"
                if not _ignored(before, options.rdma_ignore_ports):
                    faults.append(f"{name} disappeared during the check")
                continue
            faults += self._port(before, after, values, options)
        for name in second.keys() - first.keys():
            values[key(name, "state")] = second[name].state  # appeared: recorded only
        if faults:
            return result(self.name, CheckStatus.FAIL, "; ".join(faults), values)
        judged = [p for p in first.values() if not _ignored(p, options.rdma_ignore_ports)]
        rates = sorted({f"{p.rate_gbps:g}" for p in judged if p.rate_gbps is not None})
        return result(
            self.name,
            CheckStatus.PASS,
            f"{len(judged)} port(s) ACTIVE and LinkUp"
            + (f" at {'/'.join(rates)} Gb/s" if rates else "")
            + f", no error counter grew in {options.rdma_interval_s:g} s",
            values,
        )

    @staticmethod
    def _port(
        before: PortReading,
        after: PortReading,
        values: dict[str, Measurement],
        options: CheckOptions,
    ) -> list[str]:
        name = after.name
        values[key(name, "state")] = after.state or None
        values[key(name, "phys_state")] = after.phys_state or None
        values[key(name, "rate_gbps")] = after.rate_gbps
        values[key(name, "link_layer")] = after.link_layer or None
        if _ignored(after, options.rdma_ignore_ports):
            values[key(name, "ignored")] = True
            return []
        faults: list[str] = []
        if not after.active:
            faults.append(f"{name} state {after.state or 'unreadable'!r}, expected '4: ACTIVE'")
        if not after.link_up:
            faults.append(
                f"{name} phys_state {after.phys_state or 'unreadable'!r}, expected '5: LinkUp'"
            )
        grew: list[str] = []
        for counter, value in after.counters.items():
            if value:
                values[key(name, counter)] = value
            previous = before.counters.get(counter)
            if previous is not None and value > previous:
                values[key(name, counter, "delta")] = value - previous
                grew.append(f"{counter} +{value - previous}")
        if grew:
            faults.append(f"{name} error counters grew: {', '.join(grew)}")
        return faults


# -- network.ib_write_bw ---------------------------------------------------------------------

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
_UNIT = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")
_MB_PER_S_IN_GBPS = 1048576 * 8 / 1e9
"""perftest's ``MB/sec`` is 2^20 bytes a second; its ``Gb/sec`` 10^9 bits."""
_READY = "Waiting for client"


def parse_ib_write_bw(text: str) -> float | None:
    """The average bandwidth, Gb/s, of the largest message size in an ``ib_write_bw`` output
    (``--report_gbits`` or the default ``MB/sec``); None when it holds no result row."""
    unit = _UNIT.search(text)
    rows = [m for m in (_ROW.match(line) for line in text.splitlines()) if m is not None]
    if unit is None or not rows:
        return None
    last = max(rows, key=lambda m: int(m.group(1)))
    average = float(last.group(4))
    return average if unit.group(1) == "Gb/sec" else average * _MB_PER_S_IN_GBPS


@dataclass(frozen=True, slots=True)
class LoopbackRun:
    """One ``ib_write_bw`` loopback on one port."""

    gbps: float | None
    error: str | None = None


def loopback(
    tool: str, port: PortReading, timeout_s: float, environ: Mapping[str, str]
) -> LoopbackRun:
    """Run ``ib_write_bw`` as server and client on this host over ``port`` (RDMA writes of 64 KiB
    for 2 s), the client connecting once the server says it waits."""
    tcp_port = _free_tcp_port()
    common = [tool, "-d", port.device, "-i", str(port.port), "-p", str(tcp_port)]
    common += ["-F", "--report_gbits", "-D", "2"]
    deadline = time.monotonic() + timeout_s
    try:
        server = subprocess.Popen(
            common,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=dict(environ),
        )
    except OSError as exc:
        return LoopbackRun(None, f"cannot run {tool}: {exc.strerror or exc}")
    lines: list[str] = []
    ready = threading.Event()

    def read_server() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line)
            if _READY in line:
                ready.set()
        ready.set()  # it ended

    reader = threading.Thread(target=read_server, name="ib_write_bw-server", daemon=True)
    reader.start()
    try:
        if not ready.wait(min(10.0, timeout_s)) or server.poll() is not None:
            why = one_line("".join(lines[-3:]) or "no output", 120)
            return LoopbackRun(None, f"the ib_write_bw server did not start: {why}")
        left = max(1.0, deadline - time.monotonic())
        client = run_tool([*common, "127.0.0.1"], left, environ)
        if client.timed_out:
            return LoopbackRun(None, f"the ib_write_bw client did not finish within {left:.0f} s")
        gbps = parse_ib_write_bw(client.stdout)
        if gbps is None:
            return LoopbackRun(None, f"ib_write_bw gave no result ({client.why(120)})")
        return LoopbackRun(gbps)
    finally:
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        reader.join(timeout=1)


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class IbWriteBwCheck(Check):
    """``network.ib_write_bw``: perftest's RDMA-write bandwidth in loopback on each active port.

    Fails below :attr:`CheckOptions.ib_write_bw_min_gbps` when set, else below
    ``ib_write_bw_min_fraction`` of the port's rate. Loopback runs through the HCA and its PCIe
    link both ways, so a healthy port reaches close to its rate (about 0.95 on HDR).
    """

    name = "network.ib_write_bw"
    description = "perftest ib_write_bw loopback on each active RDMA port, against its rate"

    def unavailable(self, context: CheckContext) -> str | None:
        if context.which("ib_write_bw") is None:
            return "perftest's ib_write_bw is not on PATH"
        if not any(p.active for p in read_ports(context.sysfs_root)):
            return f"no active RDMA port under {rdma_root(context.sysfs_root)}"
        return None

    def timeout_s(self, options: CheckOptions) -> float:
        return options.ib_write_bw_timeout_s * 4 + 10.0

    def run(self, context: CheckContext) -> CheckResult:
        tool = context.which("ib_write_bw")
        if tool is None:
            return skipped(self.name, "perftest's ib_write_bw is not on PATH")
        options = context.options
        ports = [
            p
            for p in read_ports(context.sysfs_root)
            if p.active and not _ignored(p, options.rdma_ignore_ports)
        ]
        if not ports:
            return skipped(self.name, "no active RDMA port to test")
        started = time.monotonic()
        values: dict[str, Measurement] = {"ports": len(ports)}
        faults: list[str] = []
        errors: list[str] = []
        low: float | None = None
        for port in ports:
            left = context.timeout_s * 0.95 - (time.monotonic() - started)
            if left < 3.0:
                errors.append(f"{port.name}: not run, the check's time was spent")
                continue
            ran = loopback(tool, port, min(options.ib_write_bw_timeout_s, left), context.environ)
            minimum = options.ib_write_bw_min_gbps or (
                options.ib_write_bw_min_fraction * port.rate_gbps if port.rate_gbps else None
            )
            values[key(port.name, "gbps")] = None if ran.gbps is None else round(ran.gbps, 2)
            values[key(port.name, "min_gbps")] = None if minimum is None else round(minimum, 2)
            if ran.error is not None:
                values[key(port.name, "error")] = ran.error
                errors.append(f"{port.name}: {ran.error}")
                continue
            assert ran.gbps is not None
            low = ran.gbps if low is None else min(low, ran.gbps)
            if minimum is not None and ran.gbps < minimum:
                faults.append(f"{port.name} {ran.gbps:.1f} Gb/s < {minimum:.1f} Gb/s")
        if faults:
            return result(
                self.name, CheckStatus.FAIL, "loopback below minimum: " + "; ".join(faults), values
            )
        if errors:
            return result(self.name, CheckStatus.ERROR, "; ".join(errors), values)
        return result(
            self.name,
            CheckStatus.PASS,
            f"{len(ports)} port(s) at or above their minimum in loopback "
            f"(lowest {low or 0:.1f} Gb/s)",
            values,
        )
