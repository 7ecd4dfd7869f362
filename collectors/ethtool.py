"""PFC pause-frame rates from ``ethtool -S <netdev>`` (mlx5 names, kernel ``mlx5/counters.rst``).

mlx5 reports, per priority ``p`` with PFC enabled, ``rx_prio<p>_pause`` (pause frames received:
the network is congested) and ``tx_prio<p>_pause`` (pause frames sent: this adapter cannot absorb
the traffic). RoCE usually runs on priority 3, the default here. The rates come out as
``pfc_rx_pause_per_second`` / ``pfc_tx_pause_per_second`` under the RDMA device name of the
NIC (``mlx5_0``), so PFC lines up with the ``rdma_*`` metrics of the same port; the netdev of an
RDMA port is found in ``<sysfs>/class/infiniband/<dev>/device/net/<netdev>``. IPoIB netdevs
(ARPHRD 32) are skipped: PFC is an Ethernet mechanism.

The counters are read in-process by default, through the same SIOCETHTOOL ioctls that
``ethtool -S`` makes (:mod:`collectors.ethtool_ioctl`): a few µs of CPU per NIC instead of a few ms
for a process. An external command (``--ethtool-command``: a captured output, ``ssh host ethtool
-S``, a wrapper) runs one process per netdev per collect, all in parallel under one deadline,
without a shell.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from collectors.base import Collected, CounterRates, ProblemLog
from collectors.ethtool_ioctl import (
    EthtoolNoDevice,
    EthtoolReader,
    EthtoolUnsupported,
)
from collectors.rdma import port_device_name
from minder.core.errors import ValidationError

__all__ = ["DEFAULT_COMMAND", "METHODS", "EthtoolSource", "parse_ethtool_stats", "rdma_netdevs"]

DEFAULT_COMMAND = ("ethtool", "-S")
"""The command that the ioctl reader stands in for in ``method="auto"``."""
METHODS = ("auto", "ioctl", "command")

_ARPHRD_INFINIBAND = "32"
_ABSENT_RETRY_S = 60.0
"""A missing ``ethtool`` is looked for again after this long (it may get installed)."""
_GRACE_S = 0.1
"""Time to read the output of a process that ended by the deadline but was not read yet."""
DEFAULT_TIMEOUT_S = 0.25
"""Deadline of the external commands of one collect: ``ethtool -S`` answers in a few ms, and
the agent's whole interval is 1 s."""
BACKOFF_INITIAL_S = 2.0
BACKOFF_MAX_S = 60.0
"""After a timeout the command is not run for that netdev for ``BACKOFF_INITIAL_S``, doubled
at each further timeout up to ``BACKOFF_MAX_S``: a hung driver or command costs the agent one
deadline now and then, not one every interval."""
_NETDEV = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}")
"""Linux interface names: at most 15 characters, no '/' or whitespace."""


def parse_ethtool_stats(text: str) -> dict[str, str]:
    """``name -> value`` of ``ethtool -S`` output (``     rx_prio3_pause: 12`` lines).

    The ``NIC statistics:`` header and lines without a value are skipped; names may hold dots or
    spaces (``port.rx_dropped``), so a line is split at its last colon.
    """
    stats: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.rpartition(":")
        name, value = name.strip(), value.strip()
        if sep and name and value:
            stats[name] = value
    return stats


def _read_quiet(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def rdma_netdevs(sysfs_root: str | os.PathLike[str] = "/sys") -> dict[str, str]:
    """Map each Ethernet netdev of an RDMA NIC to the NIC's device name (``ens1f0 -> mlx5_0``).

    The RDMA port of a netdev is its ``dev_port`` + 1 (mlx4 puts two ports on one PCI function);
    mlx5 has one netdev per function, so it maps to ``<dev>``. IPoIB netdevs are left out.
    """
    root = Path(sysfs_root) / "class" / "infiniband"
    mapping: dict[str, str] = {}
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return mapping
    for dev in devices:
        net = root / dev / "device" / "net"
        try:
            netdevs = sorted(os.listdir(net))
        except OSError:
            continue
        for netdev in netdevs:
            if _read_quiet(net / netdev / "type") == _ARPHRD_INFINIBAND:
                continue
            dev_port = _read_quiet(net / netdev / "dev_port")
            port = int(dev_port) + 1 if dev_port and dev_port.isdigit() else 1
            name = port_device_name(dev, port)
            # Two netdevs claiming one port (no dev_port file): keep the second distinct.
            mapping[netdev] = netdev if name in mapping.values() else name
    return mapping


class EthtoolSource:
    """Node-agent source for PFC pause rates of the RDMA NICs, from their ethtool statistics.

    Parameters
    ----------
    command
        Program and leading arguments of an external reader; the netdev name is appended
        (``ethtool -S ens1f0``). With ``method="auto"`` the default, ``("ethtool", "-S")``, only
        runs for an interface the ioctl cannot read. None: no external command.
    method
        ``"auto"``: read in-process through the SIOCETHTOOL ioctl when ``command`` is the default
        or None, and fall back to ``command`` for an interface whose driver or kernel refuses the
        ioctl (EOPNOTSUPP, ENOTTY, EPERM ...: reported once per interface as
        ``ioctl_unsupported``); any other ``command`` (a fake, ``ssh host ethtool -S``) runs as
        given. ``"ioctl"``: in-process only, ``command`` unused. ``"command"``: always run
        ``command``.
    sysfs_root
        Where to discover the netdevs of RDMA NICs and their RDMA device names.
    interfaces
        Netdevs to read; None discovers the RDMA NICs' netdevs. An interface that maps to an
        RDMA device is reported under that device's name, any other under its own name.
    priority
        PFC priority (0–7) whose ``rx_prio<N>_pause`` / ``tx_prio<N>_pause`` counters are read.
    timeout_s
        Deadline for all external processes of one collect together. The ioctl has none: it
        takes the kernel's RTNL lock, so it waits while another task holds that lock. A netdev
        whose command timed out is skipped with exponential backoff (:data:`BACKOFF_INITIAL_S`
        .. :data:`BACKOFF_MAX_S`); a reading in time ends its backoff.
    clock
        Monotonic seconds: when each counter is read (rates divide by its differences) and when
        a backed-off command is due again; tests inject a manual clock.

    Notes
    -----
    A missing interface (ENODEV) is reported as ``no_device`` and read again next time, never
    handed to the command: ``ethtool -S`` makes the same ioctls in the same network namespace,
    and a netdev that comes back after a driver reload should not stay on the costly path.
    Other ioctl failures (EIO, EBUSY ...) are ``ioctl_failed`` for that interval.
    """

    name = "ethtool"

    def __init__(
        self,
        command: Sequence[str] | None = DEFAULT_COMMAND,
        *,
        method: str = "auto",
        sysfs_root: str | os.PathLike[str] = "/sys",
        interfaces: Sequence[str] | None = None,
        priority: int = 3,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if method not in METHODS:
            raise ValidationError(
                f"ethtool method {method!r}: expected one of {', '.join(map(repr, METHODS))}"
            )
        if command is None:
            if method == "command":
                raise ValidationError(
                    "ethtool command None with method 'command': expected a command such as "
                    "('ethtool', '-S')"
                )
        elif (
            isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)
        ):
            raise ValidationError(
                f"ethtool command {command!r}: expected a non-empty sequence of strings such as "
                "('ethtool', '-S'), or None"
            )
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 7:
            raise ValidationError(f"PFC priority {priority!r}: expected an integer 0..7")
        if not timeout_s > 0:
            raise ValidationError(f"ethtool timeout_s {timeout_s!r}: expected seconds > 0")
        if interfaces is not None:
            bad = [i for i in interfaces if not isinstance(i, str) or not _NETDEV.fullmatch(i)]
            if isinstance(interfaces, str) or bad:
                raise ValidationError(
                    f"ethtool interfaces {interfaces!r}: expected a list of Linux interface "
                    "names (up to 15 characters, no '/' or spaces)"
                )
        self.problems = ProblemLog(self.name)
        self._command = None if command is None else tuple(command)
        self._use_ioctl = method == "ioctl" or (
            method == "auto" and self._command in (None, DEFAULT_COMMAND)
        )
        self._fallback = self._command if method == "auto" else None
        self._reader: EthtoolReader | None = None
        self._reader_error: OSError | None = None
        self._on_command: set[str] = set()
        """Netdevs the ioctl refused, read by the command from then on (``method="auto"``)."""
        self._sysfs_root = Path(sysfs_root)
        self._interfaces = None if interfaces is None else tuple(dict.fromkeys(interfaces))
        self._counters = (
            (f"rx_prio{priority}_pause", "pfc_rx_pause_per_second"),
            (f"tx_prio{priority}_pause", "pfc_tx_pause_per_second"),
        )
        self._counter_names = tuple(counter for counter, _ in self._counters)
        self._timeout_s = float(timeout_s)
        self._clock = clock
        self._rates = CounterRates(self.problems, clock=clock)
        self._backoff: dict[str, tuple[float, float]] = {}
        """Netdev -> (monotonic time its command is due again, current backoff seconds)."""
        self._absent_since: float | None = None
        self._no_interfaces = False

    @property
    def method(self) -> str:
        """How the counters are read now: ``"ioctl"``, ``"command"`` or ``"mixed"``."""
        if not self._use_ioctl:
            return "command"
        return "mixed" if self._on_command else "ioctl"

    def _targets(self) -> list[tuple[str, str]]:
        """``(netdev, device)`` pairs to read this interval."""
        mapping = rdma_netdevs(self._sysfs_root)
        if self._interfaces is None:
            return sorted(mapping.items())
        return [(netdev, mapping.get(netdev, netdev)) for netdev in self._interfaces]

    def collect(self, now: float) -> Collected:
        """Read every netdev's pause counters; the first reading of each counter only primes it."""
        out = Collected()
        targets = self._targets()
        if not targets:
            if not self._no_interfaces:
                self._no_interfaces = True
                self.problems.report(
                    "absent", f"no RDMA netdev under {self._sysfs_root / 'class' / 'infiniband'}"
                )
            self._rates.forget(set())
            return out
        self._no_interfaces = False
        by_command = self._collect_ioctl(targets, out) if self._use_ioctl else targets
        if by_command:
            self._collect_command(by_command, now, out)
        netdevs = {netdev for netdev, _ in targets}
        for gone in [n for n in self._backoff if n not in netdevs]:
            del self._backoff[gone]
        devices = {device for _, device in targets}
        self._rates.forget({(d, c) for d in devices for c in self._counter_names})
        return out

    # -- in-process ------------------------------------------------------------------------------

    def _read_ioctl(self, netdev: str) -> dict[str, int]:
        """The pause counters of ``netdev`` by ioctl; raises as ``EthtoolReader.read_stats``."""
        if self._reader is None and self._reader_error is None:
            try:
                self._reader = EthtoolReader()
            except OSError as exc:  # no AF_INET socket in this sandbox: nothing to retry
                self._reader_error = exc
        if self._reader is None:
            err = self._reader_error.errno if self._reader_error else None
            raise EthtoolUnsupported(netdev, "socket(AF_INET, SOCK_DGRAM)", err or errno.EPERM)
        return self._reader.read_stats(netdev, self._counter_names)

    def _collect_ioctl(
        self, targets: list[tuple[str, str]], out: Collected
    ) -> list[tuple[str, str]]:
        """Read ``targets`` in-process; returns those left to the command."""
        by_command: list[tuple[str, str]] = []
        for netdev, device in targets:
            if netdev in self._on_command:
                by_command.append((netdev, device))
                continue
            try:
                stats = self._read_ioctl(netdev)
            except EthtoolNoDevice as exc:
                self.problems.report("no_device", str(exc))
                continue
            except EthtoolUnsupported as exc:
                if self._fallback is None:
                    self.problems.report("ioctl_unsupported", str(exc))
                    continue
                self._on_command.add(netdev)
                self.problems.report(
                    "ioctl_unsupported", f"{exc}; running {' '.join(self._fallback)} {netdev}"
                )
                by_command.append((netdev, device))
                continue
            except (OSError, ValueError) as exc:
                self.problems.report("ioctl_failed", str(exc))
                continue
            self._emit(device, stats, out)
        return by_command

    # -- external command ------------------------------------------------------------------------

    def _collect_command(self, targets: list[tuple[str, str]], now: float, out: Collected) -> None:
        """Run the command once per netdev of ``targets`` (all in parallel)."""
        if self._command is None:
            return
        if self._absent_since is not None and now - self._absent_since < _ABSENT_RETRY_S:
            return
        due = self._clock()
        targets = [t for t in targets if t[0] not in self._backoff or self._backoff[t[0]][0] <= due]
        if not targets:
            return
        results = self._run_all(self._command, targets)
        if results is None:
            if self._absent_since is None:
                self.problems.report("absent", f"command {self._command[0]!r} not found")
            self._absent_since = now
            return
        self._absent_since = None
        for device, stdout, at in results:
            self._emit(device, parse_ethtool_stats(stdout), out, at=at)

    def _run_all(
        self, command: tuple[str, ...], targets: list[tuple[str, str]]
    ) -> list[tuple[str, str, float]] | None:
        """``(device, stdout, clock time)`` of every netdev whose command succeeded; None: no such
        program.

        The time is taken when the process was started: it reads its counters a few ms later,
        a delay that is about the same every interval, whereas the moment its output is
        collected depends on the other processes awaited before it (a hung one: the deadline).
        """
        started: list[tuple[str, str, subprocess.Popen[str], float]] = []
        for netdev, device in targets:
            try:
                proc = subprocess.Popen(
                    [*command, netdev],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    errors="replace",
                    start_new_session=True,  # so a timeout kills the whole group, helpers too
                )
            except FileNotFoundError:
                for _, _, other, _ in started:
                    _kill(other)
                return None
            except OSError as exc:
                self.problems.report(
                    "command_failed", f"cannot start {command[0]!r}: {exc.strerror or exc}"
                )
                continue
            started.append((netdev, device, proc, self._clock()))
        deadline = time.monotonic() + self._timeout_s
        results: list[tuple[str, str, float]] = []
        for netdev, device, proc, at in started:
            output = _wait(proc, deadline)
            if output is None:
                _kill(proc)
                skip = self._back_off(netdev)
                self.problems.report(
                    "timeout",
                    f"{' '.join(command)} {netdev} took over {self._timeout_s:g} s; not run "
                    f"for that netdev for {skip:g} s, then with backoff up to {BACKOFF_MAX_S:g} s",
                )
                continue
            self._backoff.pop(netdev, None)  # answered in time: no more backoff
            stdout, stderr = output
            if proc.returncode != 0:
                self.problems.report(
                    "command_failed",
                    f"{' '.join(command)} {netdev} exited {proc.returncode}: "
                    f"{stderr.strip()[:200]!r}",
                )
                continue
            results.append((device, stdout, at))
        return results

    def _back_off(self, netdev: str) -> float:
        """Skip ``netdev``'s command for a while after a timeout; returns the delay (s)."""
        previous = self._backoff.get(netdev)
        delay = BACKOFF_INITIAL_S if previous is None else min(previous[1] * 2, BACKOFF_MAX_S)
        self._backoff[netdev] = (self._clock() + delay, delay)
        return delay

    # -- both ------------------------------------------------------------------------------------

    def _emit(
        self,
        device: str,
        stats: Mapping[str, str | int],
        out: Collected,
        *,
        at: float | None = None,
    ) -> None:
        """Rates of the pause counters in ``stats``, read at ``at`` (clock time; None: now)."""
        missing = [counter for counter in self._counter_names if counter not in stats]
        if missing:
            self.problems.report(
                "no_pfc_counters",
                f"{device} has no {' / '.join(missing)} (PFC not enabled on that priority, "
                "or not an mlx5 NIC)",
            )
        for counter, metric in self._counters:
            raw = stats.get(counter)
            if raw is None:
                continue
            if isinstance(raw, int):
                value = raw
            else:
                try:
                    value = int(raw)
                except ValueError:
                    value = -1
            if value < 0:
                self.problems.report(
                    "not_numeric", f"{device} {counter} is {str(raw)[:40]!r}: expected an integer"
                )
                continue
            rate = self._rates.rate((device, counter), value, at=at)
            if rate is not None:
                out.add(metric, device, rate)

    def close(self) -> None:
        """Close the ioctl socket (each command run is reaped within its collect)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _wait(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str] | None:
    """``(stdout, stderr)`` of ``proc`` if it ends by ``deadline`` (monotonic), else None."""
    try:
        return proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        if proc.poll() is None:
            return None
    # It ended while other processes were awaited, but its pipes were not read yet.
    try:
        return proc.communicate(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        return None


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill a process group started by :meth:`EthtoolSource._run_all` and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=1.0)
