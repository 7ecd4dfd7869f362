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
are produced on read; mlx5 ``hw_counters`` are cached by the driver for ``lifespan`` ms); on a
sysfs mount the files stay open and are re-read from offset 0 (``pread``), and where a port's
counters live (``counters/`` or ``hw_counters/``) is found once per port, not per read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from collectors.base import Collected, CounterRates, ProblemLog
from minder.core.records import Event, EventKind

__all__ = ["MAX_OPEN_FILES", "RdmaSource", "is_sysfs", "port_device_name"]

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
_READ_SIZE = 4096
"""Bytes read from a file: a sysfs attribute holds at most one page (a counter ~20 bytes)."""
MAX_OPEN_FILES = 512
"""Files an :class:`RdmaSource` keeps open (8 per port); beyond it they are opened per read."""


def port_device_name(device: str, port: int) -> str:
    """Canonical NIC device of an RDMA port: ``mlx5_0`` for port 1, ``mlx4_0:2`` otherwise."""
    return device if port == 1 else f"{device}:{port}"


def is_sysfs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies on a sysfs mount (``/proc/self/mountinfo``; False if unreadable)."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not rest:
                    continue
                point = parts[4].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):  # the last mount over a point wins
                    best, fstype = point, rest.split()[0]
    except OSError:
        return False
    return fstype == "sysfs"


@dataclass(slots=True)
class _PortPlan:
    """Where one port's files are, found once while the port exists."""

    port: str
    hw_counters: bool
    """Whether the port has ``hw_counters/`` (only then are CNP counters looked for)."""
    found: dict[str, str] = field(default_factory=dict)
    """Counter name -> the file it was found in (``counters/`` or ``hw_counters/``)."""


class RdmaSource:
    """Node-agent source for RDMA/IB port counters read from sysfs.

    Parameters
    ----------
    sysfs_root
        Mount point of sysfs; ``<sysfs_root>/class/infiniband`` is listed on every collect, so
        NICs that appear or vanish (driver reload) are followed.
    clock
        Monotonic seconds at which each counter is read (rates divide by its differences);
        tests inject a manual clock.
    keep_open
        Keep each file open and re-read it from offset 0 (``pread``) instead of opening it on
        every collect: a sysfs attribute produces its value on every read, so this saves the
        path walk, the open and the close (0.6 µs a read instead of 2.9 µs). ``None`` (default):
        only when ``sysfs_root`` is a sysfs mount, because a regular file replaced by a rename (a
        captured tree that a test rewrites) would be read stale through an old descriptor.
        Descriptors are closed when their port leaves the listing and reopened after a read
        error (``ENODEV`` once a device is gone); at most :data:`MAX_OPEN_FILES` stay open.
    """

    name = "rdma"

    def __init__(
        self,
        sysfs_root: str | os.PathLike[str] = "/sys",
        *,
        clock: Callable[[], float] = time.monotonic,
        keep_open: bool | None = None,
    ) -> None:
        self.problems = ProblemLog(self.name)
        self._root = os.path.join(os.fspath(sysfs_root), "class", "infiniband")
        self._rates = CounterRates(self.problems, clock=clock)
        self._was_active: dict[str, bool] = {}
        self._link_layer: dict[str, str | None] = {}
        self._absent = False
        self.keep_open = is_sysfs(sysfs_root) if keep_open is None else keep_open
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        """Open descriptors by path (``keep_open``)."""
        self._plans: dict[str, _PortPlan] = {}
        """Per port folder: where its files are (they do not move while the port exists)."""
        self._listed: tuple[tuple[str, str], ...] = ()
        self._keep: set[tuple[str, ...]] = set()
        """The rate keys of the ports last listed."""

    # -- reading -------------------------------------------------------------------------------

    def _ports(self) -> list[tuple[str, str]] | None:
        """``(device name, port folder)`` of every port, or None when there is no RDMA device."""
        try:
            devices = sorted(os.listdir(self._root))
        except OSError:
            return None
        ports: list[tuple[int, str, str]] = []
        for dev in devices:
            folder = f"{self._root}/{dev}/ports"
            try:
                entries = os.listdir(folder)
            except OSError:
                self.problems.report("unreadable", f"cannot list {folder}")
                continue
            ports.extend((int(p), dev, f"{folder}/{p}") for p in entries if p.isdigit())
        ports.sort(key=lambda item: (item[1], item[0]))
        return [(port_device_name(dev, number), path) for number, dev, path in ports] or None

    def _read(self, path: str, *, quiet_missing: bool = False, keep: bool = True) -> str | None:
        """Text of a sysfs file, or None with the problem recorded; ``keep``: a file read on
        every collect, kept open when the source keeps files open."""
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return os.pread(fd, _READ_SIZE, 0).decode("utf-8", "replace").strip()
            except OSError:  # ENODEV: the device went away (or came back): open it again
                del self._fds[path]
                os.close(fd)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not quiet_missing:
                self.problems.report("missing", f"{path} does not exist")
            return None
        except OSError as exc:  # EACCES, EIO from the driver
            self.problems.report("unreadable", f"cannot read {path}: {exc.strerror or exc}")
            return None
        try:
            data = os.read(fd, _READ_SIZE)
        except OSError as exc:  # a folder where a file belongs (EISDIR), EIO from the driver
            os.close(fd)
            self.problems.report("unreadable", f"cannot read {path}: {exc.strerror or exc}")
            return None
        if keep and self.keep_open and len(self._fds) < MAX_OPEN_FILES:
            self._fds[path] = fd
        else:
            os.close(fd)
        return data.decode("utf-8", "replace").strip()

    def _number(self, path: str, *, quiet_missing: bool = False) -> int | None:
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

    def _counter(self, plan: _PortPlan, name: str) -> int | None:
        """``counters/<name>``, else ``hw_counters/<name>`` (some drivers only have the latter)."""
        path = plan.found.get(name)
        if path is None:
            path = primary = f"{plan.port}/counters/{name}"
            if not os.path.lexists(primary):
                fallback = f"{plan.port}/hw_counters/{name}"
                if os.path.lexists(fallback):
                    path = fallback
            if os.path.lexists(path):  # else looked for again next time (and reported missing)
                plan.found[name] = path
        return self._number(path)

    def _roce(self, port: str) -> bool:
        """Whether the port runs RoCE (Ethernet link layer): only then do CNP counters exist."""
        if port not in self._link_layer:
            self._link_layer[port] = self._read(
                f"{port}/link_layer", quiet_missing=True, keep=False
            )
        return (self._link_layer[port] or "").lower() == "ethernet"

    def _plan(self, port: str) -> _PortPlan:
        plan = self._plans.get(port)
        if plan is None:
            plan = self._plans[port] = _PortPlan(port, os.path.isdir(f"{port}/hw_counters"))
        return plan

    # -- one port ------------------------------------------------------------------------------

    def _live_counter(self, device: str, plan: _PortPlan, file: str, saturated: int) -> int | None:
        """A counter's value, or None when unreadable or stuck at its maximum (IB counters
        saturate instead of wrapping, so a stuck one says nothing about the interval)."""
        value = self._counter(plan, file)
        if value == saturated:
            self.problems.report(
                "counter_saturated", f"{device} {file} stuck at its maximum {value}"
            )
            return None
        return value

    def _collect_port(self, device: str, port: str, now: float, out: Collected) -> None:
        plan = self._plan(port)
        for file, metric, factor, saturated in _RATES:
            value = self._live_counter(device, plan, file, saturated)
            rate = None if value is None else self._rates.rate((device, file), value * factor)
            if rate is not None:
                out.add(metric, device, rate)
        for file, metric, saturated in _COUNTS:
            value = self._live_counter(device, plan, file, saturated)
            count = None if value is None else self._rates.count((device, file), value)
            if count is not None:
                out.add(metric, device, count)
        if plan.hw_counters:
            # IB-link mlx5 ports have hw_counters but no CNP counters (CNPs are RoCE's):
            # their absence is only a problem on a RoCE port.
            quiet = not self._roce(port)
            for file, metric in _CNP:
                value = self._number(f"{port}/hw_counters/{file}", quiet_missing=quiet)
                if value is None:
                    continue
                rate = self._rates.rate((device, file), value)
                if rate is not None:
                    out.add(metric, device, rate)
        self._collect_state(device, port, now, out)

    def _collect_state(self, device: str, port: str, now: float, out: Collected) -> None:
        text = self._read(f"{port}/state")
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
                "not_numeric", f"{port}/state holds {text[:40]!r}: expected e.g. '4: ACTIVE'"
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
        with self._lock:  # not closed under a read (a collector thread that outlived its join)
            return self._collect(now)

    def _collect(self, now: float) -> Collected:
        out = Collected()
        ports = self._ports()
        if ports is None:
            if not self._absent:
                self._absent = True
                self.problems.report("absent", f"no RDMA device under {self._root}")
            self._rates.forget(set())
            self._was_active.clear()
            self._follow(())
            return out
        self._absent = False
        listed = tuple(ports)
        if listed != self._listed:
            self._follow(listed)
        for device, port in ports:
            self._collect_port(device, port, now, out)
        self._rates.forget(self._keep)
        return out

    def _follow(self, listed: tuple[tuple[str, str], ...]) -> None:
        """The listing changed: forget what belonged to ports no longer in it (a port back
        later is planned, opened and primed afresh)."""
        self._listed = listed
        names = {device for device, _ in listed}
        folders = {port for _, port in listed}
        self._keep = {(d, f) for d in names for f in _FILES}
        for gone in set(self._was_active) - names:
            del self._was_active[gone]
        for path in set(self._link_layer) - folders:
            del self._link_layer[path]
        for path in set(self._plans) - folders:
            del self._plans[path]
        inside = tuple(f"{port}/" for port in folders)
        for path in [p for p in self._fds if not p.startswith(inside)]:
            os.close(self._fds.pop(path))

    def close(self) -> None:
        """Close the files kept open (after the collect in progress, if any)."""
        with self._lock:
            fds, self._fds = self._fds, {}
            for fd in fds.values():
                os.close(fd)
            self._plans.clear()
            self._listed = ()
