"""RDMA port counters from ``/sys/class/infiniband`` (kernel ABI ``sysfs-class-infiniband``).

Per port ``<root>/class/infiniband/<dev>/ports/<p>/`` this source reads:

* ``counters/port_xmit_data``, ``port_rcv_data`` — octets divided by 4 (the kernel ABI's "divided
  by 4 (lanes)"), so ×4 → bytes, then a per-second rate (the ×4 trap of node_exporter#573);
* ``counters/port_xmit_wait`` — ticks with data to send but no credit, as a rate;
* ``counters/link_downed``, ``symbol_error`` — events in the interval (``_count``);
* ``hw_counters/np_cnp_sent``, ``rp_cnp_handled`` — mlx5 RoCE congestion notifications, as rates;
* ``state`` (``"4: ACTIVE"``) — ``rdma_port_up`` 1/0, and a ``link_down`` event when a port that
  was ACTIVE at the previous reading is not ACTIVE now.

The device is ``<dev>`` for port 1 and ``<dev>:<port>`` for other ports, so a single-port NIC
(every mlx5 function) is just ``mlx5_0``. Every file is read on every ``collect`` (sysfs values
are produced on read; mlx5 ``hw_counters`` are cached by the driver for ``lifespan`` ms).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from collectors.base import Collected, CounterRates, ProblemLog
from minder.core.records import Event, EventKind

__all__ = ["RdmaSource", "port_device_name"]

_ACTIVE = 4
"""``state`` number of an ACTIVE port (IBA: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)."""
_STATES = frozenset({"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"})

# (file, metric, factor, saturation value). IB PMA counters of the classic PortCounters attribute
# saturate instead of wrapping (8-bit link_downed, 16-bit symbol_error, 32-bit xmit_wait and, on
# devices without extended counters, 32-bit data): a counter stuck at its maximum yields no
# value rather than a false zero rate.
_U8, _U16, _U32 = 2**8 - 1, 2**16 - 1, 2**32 - 1
_RATES: tuple[tuple[str, str, float, int], ...] = (
    ("port_xmit_data", "rdma_tx_bytes_per_second", 4.0, _U32),
    ("port_rcv_data", "rdma_rx_bytes_per_second", 4.0, _U32),
    ("port_xmit_wait", "rdma_xmit_wait_per_second", 1.0, _U32),
)
_COUNTS: tuple[tuple[str, str, int], ...] = (
    ("link_downed", "rdma_link_downed_count", _U8),
    ("symbol_error", "rdma_symbol_error_count", _U16),
)
_CNP: tuple[tuple[str, str], ...] = (
    ("np_cnp_sent", "rdma_cnp_sent_per_second"),
    ("rp_cnp_handled", "rdma_cnp_handled_per_second"),
)
_FILES: tuple[str, ...] = (*(r[0] for r in _RATES), *(c[0] for c in _COUNTS), *(c[0] for c in _CNP))


def port_device_name(device: str, port: int) -> str:
    """Canonical NIC device of an RDMA port: ``mlx5_0`` for port 1, ``mlx4_0:2`` otherwise."""
    return device if port == 1 else f"{device}:{port}"


class RdmaSource:
    """Node-agent source for RDMA/IB port counters read from sysfs.

    Parameters
    ----------
    sysfs_root
        Mount point of sysfs; ``<sysfs_root>/class/infiniband`` is scanned on every collect, so
        NICs that appear or vanish (driver reload) are followed.
    clock
        Monotonic seconds at which each counter is read (rates divide by its differences);
        tests inject a manual clock.
    """

    name = "rdma"

    def __init__(
        self,
        sysfs_root: str | os.PathLike[str] = "/sys",
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.problems = ProblemLog(self.name)
        self._root = Path(sysfs_root) / "class" / "infiniband"
        self._rates = CounterRates(self.problems, clock=clock)
        self._was_active: dict[str, bool] = {}
        self._link_layer: dict[Path, str | None] = {}
        self._absent = False

    # -- reading -------------------------------------------------------------------------------

    def _ports(self) -> list[tuple[str, Path]] | None:
        """``(device name, port folder)`` of every port, or None when there is no RDMA device."""
        try:
            devices = sorted(os.listdir(self._root))
        except OSError:
            return None
        ports: list[tuple[int, str, str, Path]] = []
        for dev in devices:
            try:
                entries = os.listdir(self._root / dev / "ports")
            except OSError:
                self.problems.report("unreadable", f"cannot list {self._root / dev / 'ports'}")
                continue
            ports.extend(
                (int(p), dev, p, self._root / dev / "ports" / p) for p in entries if p.isdigit()
            )
        ports.sort(key=lambda item: (item[1], item[0]))
        return [(port_device_name(dev, number), path) for number, dev, _, path in ports] or None

    def _read(self, path: Path, *, quiet_missing: bool = False) -> str | None:
        """Text of a sysfs file, or None with the problem recorded."""
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read().strip()
        except FileNotFoundError:
            if not quiet_missing:
                self.problems.report("missing", f"{path} does not exist")
        except OSError as exc:  # a folder where a file belongs, EACCES, EIO from the driver
            self.problems.report("unreadable", f"cannot read {path}: {exc.strerror or exc}")
        return None

    def _number(self, path: Path, *, quiet_missing: bool = False) -> int | None:
        """Integer value of a counter file, or None with the problem recorded."""
        text = self._read(path, quiet_missing=quiet_missing)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            # i40iw and other iWARP devices print "N/A (no PMA)": the counter does not exist.
            reason = "not_available" if text.startswith("N/A") else "not_numeric"
            self.problems.report(reason, f"{path} holds {text[:40]!r}: expected an integer")
            return None
        if value < 0:
            self.problems.report("not_numeric", f"{path} holds {value}: expected a counter >= 0")
            return None
        return value

    def _counter(self, port: Path, name: str) -> int | None:
        """``counters/<name>``, else ``hw_counters/<name>`` (some drivers only have the latter)."""
        primary = port / "counters" / name
        if not os.path.lexists(primary):
            fallback = port / "hw_counters" / name
            if os.path.lexists(fallback):
                return self._number(fallback)
        return self._number(primary)

    def _roce(self, port: Path) -> bool:
        """Whether the port runs RoCE (Ethernet link layer): only then do CNP counters exist."""
        if port not in self._link_layer:
            self._link_layer[port] = self._read(port / "link_layer", quiet_missing=True)
        return (self._link_layer[port] or "").lower() == "ethernet"

    # -- one port ------------------------------------------------------------------------------

    def _live_counter(self, device: str, port: Path, file: str, saturated: int) -> int | None:
        """A counter's value, or None when unreadable or stuck at its maximum (IB counters
        saturate instead of wrapping, so a stuck one says nothing about the interval)."""
        value = self._counter(port, file)
        if value == saturated:
            self.problems.report(
                "counter_saturated", f"{device} {file} stuck at its maximum {value}"
            )
            return None
        return value

    def _collect_port(self, device: str, port: Path, now: float, out: Collected) -> None:
        for file, metric, factor, saturated in _RATES:
            value = self._live_counter(device, port, file, saturated)
            rate = None if value is None else self._rates.rate((device, file), value * factor)
            if rate is not None:
                out.add(metric, device, rate)
        for file, metric, saturated in _COUNTS:
            value = self._live_counter(device, port, file, saturated)
            count = None if value is None else self._rates.count((device, file), value)
            if count is not None:
                out.add(metric, device, count)
        if os.path.isdir(port / "hw_counters"):
            # IB-link mlx5 ports have hw_counters but no CNP counters (CNPs are RoCE's):
            # their absence is only a problem on a RoCE port.
            quiet = not self._roce(port)
            for file, metric in _CNP:
                value = self._number(port / "hw_counters" / file, quiet_missing=quiet)
                if value is None:
                    continue
                rate = self._rates.rate((device, file), value)
                if rate is not None:
                    out.add(metric, device, rate)
        self._collect_state(device, port, now, out)

    def _collect_state(self, device: str, port: Path, now: float, out: Collected) -> None:
        text = self._read(port / "state")
        if text is None:
            self._was_active.pop(device, None)
            return
        number, _, label = text.partition(":")
        if number.strip().isdigit():
            active = int(number) == _ACTIVE
        elif not label and number.strip().upper() in _STATES:  # a bare "ACTIVE"
            active = number.strip().upper() == "ACTIVE"
        else:
            self.problems.report(
                "not_numeric", f"{port / 'state'} holds {text[:40]!r}: expected e.g. '4: ACTIVE'"
            )
            self._was_active.pop(device, None)
            return
        out.add("rdma_port_up", device, 1.0 if active else 0.0)
        if self._was_active.get(device) and not active:
            out.events.append(
                Event(EventKind.LINK_DOWN, device, now, message=f"port state is now {text!r}")
            )
        self._was_active[device] = active

    # -- Source protocol -----------------------------------------------------------------------

    def collect(self, now: float) -> Collected:
        """Read every RDMA port once; rates need a previous reading, so the first call primes."""
        out = Collected()
        ports = self._ports()
        if ports is None:
            if not self._absent:
                self._absent = True
                self.problems.report("absent", f"no RDMA device under {self._root}")
            self._rates.forget(set())
            self._was_active.clear()
            return out
        self._absent = False
        for device, port in ports:
            self._collect_port(device, port, now, out)
        names = {device for device, _ in ports}
        self._rates.forget({(d, f) for d in names for f in _FILES})
        for gone in set(self._was_active) - names:
            del self._was_active[gone]
        for path in set(self._link_layer) - {port for _, port in ports}:
            del self._link_layer[path]
        return out

    def close(self) -> None:
        """Nothing to release: files are opened and closed per read."""
