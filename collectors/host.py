"""Host CPU, memory, disk and TCP/IP network figures via psutil.

* ``cpu_util_ratio`` — busy share of all CPU time between two collects, from ``psutil.cpu_times``
  (busy = total − idle − iowait, guest time not counted twice), the way ``cpu_percent`` computes it
  but with this source's own previous reading: ``cpu_percent(interval=None)`` keeps one
  module-global previous reading that any other caller in the process would disturb.
* ``memory_used_bytes`` — ``total − available`` (what applications cannot get back).
* ``disk_{read,write}_bytes_per_second`` — summed over whole physical disks: on Linux a disk of
  ``/sys/block`` with a ``device`` link (partitions, loop, ram, zram, dm and md are left out, so
  no byte is counted twice).
* ``net_{tx,rx}_bytes_per_second`` — summed over physical NICs (``/sys/class/net/<nic>/device``),
  so bridge, veth, VLAN and bond traffic is not counted twice. When the agent sees no physical
  NIC (it runs in a container's network namespace) every interface but loopback and ``ifb*``
  (mirrors of other interfaces) is summed. RDMA traffic bypasses the kernel stack, so it does not
  inflate these; IPoIB traffic is TCP/IP and is counted.

All counters are cumulative: the first collect primes the rates and the CPU ratio.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from collectors.base import Collected, CounterRates, ProblemLog

__all__ = ["HostSource"]

_SYS = Path("/sys")
_VIRTUAL_DISKS = ("loop", "ram", "zram", "dm-", "md", "nbd")
_MIRROR_NICS = ("lo", "ifb")
_DISK_METRICS = ("disk_read_bytes_per_second", "disk_write_bytes_per_second")
_NET_METRICS = ("net_tx_bytes_per_second", "net_rx_bytes_per_second")


class HostSource:
    """Node-agent source for host-level CPU, memory, disk and network figures.

    Parameters
    ----------
    clock
        Monotonic seconds at which each counter is read (rates divide by its differences);
        tests inject a manual clock.
    """

    name = "host"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.problems = ProblemLog(self.name)
        self._rates = CounterRates(self.problems, clock=clock)
        self._cpu_last: tuple[float, float] | None = None
        # Whether a disk / NIC name is physical, looked up once per name; pruned every collect
        # to the names seen then, so short-lived interfaces (veths of containers) do not pile up.
        self._disk_physical: dict[str, bool] = {}
        self._nic_physical: dict[str, bool] = {}

    # -- pieces --------------------------------------------------------------------------------

    def _cpu_ratio(self) -> float | None:
        times = psutil.cpu_times()
        total = sum(times)
        # On Linux guest time is already inside user/nice; psutil subtracts it the same way.
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        last, self._cpu_last = self._cpu_last, (total, idle)
        if last is None:
            return None
        d_total, d_idle = total - last[0], idle - last[1]
        if d_total < 0 or d_idle < 0:  # CPU hotplug or a kernel quirk
            self.problems.report("counter_reset", "cpu times went backwards")
            return None
        if d_total == 0:  # no tick elapsed
            return None
        return min(1.0, max(0.0, 1.0 - d_idle / d_total))

    def _is_physical_disk(self, name: str) -> bool:
        known = self._disk_physical.get(name)
        if known is None:
            block = _SYS / "block"
            if block.is_dir():
                # Partitions are not in /sys/block; virtual disks have no backing ``device``.
                known = os.path.exists(block / name / "device")
            else:  # not Linux: psutil lists whole disks there
                known = not name.startswith(_VIRTUAL_DISKS)
            self._disk_physical[name] = known
        return known

    def _physical_nics(self, names: list[str]) -> list[str]:
        for name in names:
            if name not in self._nic_physical:
                self._nic_physical[name] = os.path.exists(_SYS / "class" / "net" / name / "device")
        physical = [n for n in names if self._nic_physical[n]]
        return physical or [n for n in names if not n.startswith(_MIRROR_NICS)]

    # -- Source protocol -----------------------------------------------------------------------

    def collect(self, now: float) -> Collected:
        """Read CPU, memory, disk and network counters once."""
        out = Collected()
        try:
            ratio = self._cpu_ratio()
        except (OSError, psutil.Error) as exc:
            self.problems.report("unreadable", f"cpu times: {exc}")
        else:
            if ratio is not None:
                out.add("cpu_util_ratio", "", ratio)
        try:
            memory = psutil.virtual_memory()
        except (OSError, psutil.Error) as exc:
            self.problems.report("unreadable", f"virtual memory: {exc}")
        else:
            out.add("memory_used_bytes", "", max(0, memory.total - memory.available))
        try:
            disks = psutil.disk_io_counters(perdisk=True, nowrap=True) or {}
        except (OSError, psutil.Error) as exc:
            self.problems.report("unreadable", f"disk counters: {exc}")
            disks = {}
        physical = {name: io for name, io in disks.items() if self._is_physical_disk(name)}
        _prune(self._disk_physical, disks)
        self._sum_rates(
            out, "disk_read_bytes_per_second", {n: d.read_bytes for n, d in physical.items()}
        )
        self._sum_rates(
            out, "disk_write_bytes_per_second", {n: d.write_bytes for n, d in physical.items()}
        )
        try:
            nics = psutil.net_io_counters(pernic=True, nowrap=True) or {}
        except (OSError, psutil.Error) as exc:
            self.problems.report("unreadable", f"network counters: {exc}")
            nics = {}
        chosen = {name: nics[name] for name in self._physical_nics(sorted(nics))}
        _prune(self._nic_physical, nics)
        self._sum_rates(
            out, "net_tx_bytes_per_second", {n: c.bytes_sent for n, c in chosen.items()}
        )
        self._sum_rates(
            out, "net_rx_bytes_per_second", {n: c.bytes_recv for n, c in chosen.items()}
        )
        self._rates.forget(
            {(metric, name) for metric in _DISK_METRICS for name in physical}
            | {(metric, name) for metric in _NET_METRICS for name in chosen}
        )
        return out

    def _sum_rates(self, out: Collected, metric: str, counters: dict[str, int]) -> None:
        """Emit the sum of per-device rates.

        Each disk or NIC keeps its own counter, so one that appears (hotplug, a new veth) only
        primes itself instead of adding its whole history to one interval, and one that vanishes
        does not look like a reset of the total. Nothing is emitted until some device has a rate.
        """
        rates = [self._rates.rate((metric, name), value) for name, value in counters.items()]
        known = [rate for rate in rates if rate is not None]
        if known:
            out.add(metric, "", sum(known))

    def close(self) -> None:
        """Nothing to release."""


def _prune(cache: dict[str, bool], seen: Mapping[str, object]) -> None:
    """Forget the cached names that were not seen in this collection."""
    # The cache holds every name seen (looked up just before), so only a larger one is stale.
    if len(cache) > len(seen):
        for name in [n for n in cache if n not in seen]:
            del cache[name]
