"""The host checks of ``minder selfcheck run`` (docs/selfcheck.md, "Checks").

* :class:`ClockCheck` (``host.clock``) — clock synchronisation, from ``chronyc tracking``,
  ``timedatectl show`` or the kernel's own view (``ntp_adjtime``).
* :class:`DiskCheck` (``host.disk``) — free space of ``/``, ``/tmp`` and the paths given.
* :class:`MemoryEccCheck` (``host.memory_ecc``) — EDAC's corrected and uncorrected error counts
  per memory controller.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from collectors.selfcheck.base import (
    Check,
    CheckContext,
    key,
    one_line,
    result,
    run_tool,
    skipped,
)
from minder.core.selfcheck import CheckResult, CheckStatus, Measurement

logger = logging.getLogger(__name__)

# -- host.clock ------------------------------------------------------------------------------

KERNEL_MAX_ERROR_S = 16.0
"""The kernel's ceiling of its clock error estimate (NTP_PHASE_LIMIT): an undisciplined clock's
``maxerror`` grows to it and stays, so at the ceiling the kernel does not know the error."""
_TOOL_TIMEOUT_S = 5.0
_STA_UNSYNC = 0x0040
_STA_NANO = 0x2000
_TIME_ERROR = 5


@dataclass(frozen=True, slots=True)
class ClockReading:
    """What one source says of the clock."""

    source: str
    synchronised: bool
    offset_s: float | None = None
    """The clock's offset from true time, when the source knows it."""
    max_error_s: float | None = None
    """A bound on the offset (the kernel's ``maxerror``), when the source knows one."""
    detail: str = ""

    def bound(self) -> float | None:
        """How far off the clock may be: its offset if known, else the bound below the kernel's
        ceiling; None when nothing bounds it."""
        if self.offset_s is not None and self.synchronised:
            return abs(self.offset_s)
        if self.max_error_s is not None and self.max_error_s < KERNEL_MAX_ERROR_S:
            return self.max_error_s
        return None


def parse_chronyc_tracking(text: str) -> ClockReading | None:
    """``chronyc tracking``'s report: ``System time : 0.000012 seconds fast of NTP time`` and
    ``Leap status : Normal`` (``Not synchronised`` when chronyd has no source)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    leap = fields.get("leap status")
    system = re.match(r"([-+]?[\d.]+)\s+seconds\s+(fast|slow)", fields.get("system time", ""))
    if leap is None:
        return None
    offset = None
    if system is not None:
        offset = float(system.group(1)) * (1 if system.group(2) == "fast" else -1)
    synchronised = leap.lower() != "not synchronised"
    return ClockReading(
        "chronyc", synchronised, offset if synchronised else None, None, f"leap status {leap}"
    )


def parse_timedatectl(text: str) -> ClockReading | None:
    """``timedatectl show``'s ``NTPSynchronized=yes|no``."""
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "NTPSynchronized":
            synced = value.strip().lower() == "yes"
            return ClockReading("timedatectl", synced, detail=f"NTPSynchronized={value.strip()}")
    return None


class _Timeval(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long))


class _Timex(ctypes.Structure):
    """``struct timex`` of <sys/timex.h> (Linux, LP64 and ILP32 alike: longs and ints)."""

    _fields_ = (
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    )


def read_adjtimex() -> ClockReading | None:
    """The kernel's clock discipline state, read with ``ntp_adjtime`` (modes 0: reads only, no
    privilege needed); None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        call = libc.ntp_adjtime
    except (OSError, AttributeError):
        return None
    timex = _Timex()
    state = int(call(ctypes.byref(timex)))
    if state < 0:
        return None
    unit = 1e-9 if timex.status & _STA_NANO else 1e-6
    synced = state != _TIME_ERROR and not timex.status & _STA_UNSYNC
    return clock_from_timex(synced, timex.offset * unit, timex.maxerror * 1e-6, state, timex.status)


def clock_from_timex(
    synchronised: bool, offset_s: float, max_error_s: float, state: int, status: int
) -> ClockReading:
    """A :class:`ClockReading` of the kernel's answer: its offset is meaningful only while an NTP
    daemon disciplines the clock."""
    return ClockReading(
        "adjtimex",
        synchronised,
        offset_s if synchronised else None,
        max_error_s,
        f"state {state}, status 0x{status:x}, maxerror {max_error_s:g} s",
    )


class ClockCheck(Check):
    """``host.clock``: is the clock synchronised, and within ``clock_max_offset_s``?

    Asks ``chronyc tracking``, then ``timedatectl show``, then the kernel (``ntp_adjtime``),
    using the first that can tell. Fails when the clock is off by more than the maximum: a
    synchronised clock by its offset, an unsynchronised one by the kernel's bound on its error.
    Skipped when no source can bound it (no NTP daemon ever disciplined the kernel clock: its
    ``maxerror`` sits at the 16 s ceiling).
    """

    name = "host.clock"
    description = "clock synchronised within clock_max_offset_s (chronyc, timedatectl, adjtimex)"

    def run(self, context: CheckContext) -> CheckResult:
        limit = context.options.clock_max_offset_s
        readings = list(self._readings(context))
        values: dict[str, Measurement] = {"max_offset_s": limit}
        for reading in readings:
            values[key(reading.source, "synchronised")] = reading.synchronised
            values[key(reading.source, "offset_s")] = reading.offset_s
            values[key(reading.source, "max_error_s")] = reading.max_error_s
            values[key(reading.source, "detail")] = reading.detail
        for reading in readings:
            bound = reading.bound()
            if bound is None:
                if reading.synchronised:
                    return result(
                        self.name,
                        CheckStatus.PASS,
                        f"synchronised ({reading.source}: {reading.detail})",
                        values,
                    )
                continue  # unsynchronised and unbounded: ask the next source
            sync = "synchronised" if reading.synchronised else "unsynchronised"
            what = "offset" if reading.offset_s is not None else "error bound"
            values["source"] = reading.source
            if bound > limit:
                return result(
                    self.name,
                    CheckStatus.FAIL,
                    f"{sync} with {what} {bound:.3g} s > {limit:g} s ({reading.source}: "
                    f"{reading.detail})",
                    values,
                )
            return result(
                self.name,
                CheckStatus.PASS,
                f"{sync}, {what} {bound:.3g} s ≤ {limit:g} s ({reading.source})",
                values,
            )
        if not readings:
            return skipped(self.name, "nothing can tell the clock's state here", values)
        last = readings[-1]
        return skipped(
            self.name,
            f"the clock is not synchronised and nothing bounds its offset ({last.source}: "
            f"{last.detail})",
            values,
        )

    def _readings(self, context: CheckContext) -> list[ClockReading]:
        readings: list[ClockReading] = []
        timeout = context.tool_timeout(_TOOL_TIMEOUT_S)
        chronyc = context.which("chronyc")
        if chronyc is not None:
            ran = run_tool([chronyc, "tracking"], timeout, context.environ)
            reading = parse_chronyc_tracking(ran.stdout) if ran.returncode == 0 else None
            if reading is not None:
                readings.append(reading)
            else:
                logger.debug("selfcheck: chronyc tracking gave nothing: %s", ran.why())
        timedatectl = context.which("timedatectl")
        if timedatectl is not None:
            ran = run_tool([timedatectl, "show"], timeout, context.environ)
            reading = parse_timedatectl(ran.stdout) if ran.returncode == 0 else None
            if reading is not None:
                readings.append(reading)
            else:
                logger.debug("selfcheck: timedatectl show gave nothing: %s", ran.why())
        kernel = read_adjtimex()
        if kernel is not None:
            readings.append(kernel)
        return readings


# -- host.disk -------------------------------------------------------------------------------

DEFAULT_DISK_PATHS = ("/", "/tmp")


class DiskCheck(Check):
    """``host.disk``: free space of ``/``, ``/tmp`` and ``disk_paths``; fails below
    ``disk_min_free_fraction`` of a file system or ``disk_min_free_bytes``, or when a path given
    is missing (a scratch file system not mounted)."""

    name = "host.disk"
    description = "free space of /, /tmp and MINDER_SELFCHECK_DISK_PATHS"

    def run(self, context: CheckContext) -> CheckResult:
        options = context.options
        paths = list(dict.fromkeys((*DEFAULT_DISK_PATHS, *options.disk_paths)))
        values: dict[str, Measurement] = {
            "min_free_fraction": options.disk_min_free_fraction,
            "min_free_bytes": options.disk_min_free_bytes,
        }
        faults: list[str] = []
        lowest: tuple[float, str] | None = None
        for path in paths:
            where = f"disk[{path}]"
            try:
                usage = shutil.disk_usage(path)
            except OSError as exc:
                values[key(where, "error")] = one_line(exc.strerror or exc, 80)
                faults.append(f"{path}: {one_line(exc.strerror or exc, 60)}")
                continue
            fraction = usage.free / usage.total if usage.total else 0.0
            values[key(where, "free_bytes")] = usage.free
            values[key(where, "total_bytes")] = usage.total
            values[key(where, "free_fraction")] = round(fraction, 4)
            if (
                fraction < options.disk_min_free_fraction
                or usage.free < options.disk_min_free_bytes
            ):
                faults.append(
                    f"{path}: {usage.free / (1 << 30):.2f} GiB free ({fraction:.1%}), below "
                    f"{options.disk_min_free_fraction:.0%} or "
                    f"{options.disk_min_free_bytes / (1 << 30):g} GiB"
                )
            if lowest is None or fraction < lowest[0]:
                lowest = (fraction, path)
        if faults:
            return result(self.name, CheckStatus.FAIL, "; ".join(faults), values)
        assert lowest is not None
        return result(
            self.name,
            CheckStatus.PASS,
            f"{len(paths)} path(s) with enough free space (least: {lowest[1]} "
            f"{lowest[0]:.1%} free)",
            values,
        )


# -- host.memory_ecc -------------------------------------------------------------------------


def edac_root(sysfs_root: Path) -> Path:
    return sysfs_root / "devices" / "system" / "edac" / "mc"


def _count(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class MemoryEccCheck(Check):
    """``host.memory_ecc``: EDAC's error counts per memory controller
    (``/sys/devices/system/edac/mc/mc*/{ce_count,ue_count}``, since boot or the driver's load).
    Fails on any uncorrected error (the host needs a repair, then a reboot); corrected ones are
    recorded."""

    name = "host.memory_ecc"
    description = "EDAC memory errors: fail on any uncorrected, record corrected"

    def _controllers(self, context: CheckContext) -> list[Path]:
        root = edac_root(context.sysfs_root)
        try:
            found = [p for p in root.iterdir() if re.fullmatch(r"mc\d+", p.name)]
        except OSError:
            return []
        return sorted(found, key=lambda p: int(p.name[2:]))

    def unavailable(self, context: CheckContext) -> str | None:
        if not self._controllers(context):
            return f"EDAC is absent: no memory controller under {edac_root(context.sysfs_root)}"
        return None

    def run(self, context: CheckContext) -> CheckResult:
        controllers = self._controllers(context)
        values: dict[str, Measurement] = {"controllers": len(controllers)}
        faults: list[str] = []
        unreadable: list[str] = []
        corrected = 0
        for mc in controllers:
            ce = _count(mc / "ce_count")
            ue = _count(mc / "ue_count")
            values[key(mc.name, "ce_count")] = ce
            values[key(mc.name, "ue_count")] = ue
            if ce is None or ue is None:
                unreadable.append(mc.name)
            corrected += ce or 0
            if ue:
                faults.append(f"{mc.name}: {ue} uncorrected memory error(s)")
        if faults:
            return result(self.name, CheckStatus.FAIL, "; ".join(faults), values)
        if unreadable and len(unreadable) == len(controllers):
            return result(
                self.name,
                CheckStatus.ERROR,
                f"EDAC counts unreadable for {', '.join(unreadable)}",
                values,
            )
        return result(
            self.name,
            CheckStatus.PASS,
            f"{len(controllers)} memory controller(s): no uncorrected error, {corrected} corrected",
            values,
        )
