"""GPU source that scrapes NVIDIA dcgm-exporter's Prometheus text exposition.

An alternative to :mod:`collectors.nvml` on nodes where dcgm-exporter already runs (GPU
Operator): one HTTP GET per interval against the node-local exporter, ``DCGM_FI_*`` fields
mapped to the canonical names and units (docs/architecture.md §3.1; docs/sources.md §2a–2c).

Field notes:

* ``DCGM_FI_PROF_*`` activity fields are ratios already; ``DCGM_FI_DEV_GPU_UTIL`` is percent.
* ``DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES`` are rates (bytes/s averaged over DCGM's sample
  period) whatever Prometheus type the exporter's CSV declares for them (``counter`` in
  ``default-counters.csv``, ``gauge`` in ``dcp-metrics-included.csv``).
* ``DCGM_FI_DEV_FB_USED`` is MiB.
* ``DCGM_FI_DEV_XID_ERRORS`` holds only the *last* XID code: a change to a new nonzero code is
  one XID event; a repeat of the same code is invisible (NVIDIA/dcgm-exporter#190), and a code
  already there at the first scrape is taken as history, not as a new event.
* Host labels are ``Hostname`` (released exporters) or ``hostname`` (since d5e5f51).
* Series of a MIG instance (non-empty ``GPU_I_ID``) are skipped: the canonical metrics are per
  physical GPU.
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import socket
import time
import urllib.parse
from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from collectors.base import Collected, CounterRates, ProblemLog
from minder.core.errors import ValidationError
from minder.core.metrics import validate_sample
from minder.core.records import Event, EventKind

logger = logging.getLogger(__name__)

_Key = TypeVar("_Key", bound=Hashable)

DEFAULT_URL = "http://127.0.0.1:9400/metrics"
MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest exposition read; an 8-GPU node with every field enabled is well under 1 MiB."""
_READ_BYTES = 65536

_MIB = 1024.0 * 1024.0
_MHZ = 1e6
_GPU_LABEL = re.compile(r"\d+")
_SERIES_START = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)")
_PLAIN_SERIES = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^{}]*)\})? (\S+)(?: -?\d+)?")
_PLAIN_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)",?')
# DCGM's "no data" sentinels (DCGM_INT32_BLANK .. 0x7fffffff, DCGM_FP64_BLANK and above).
_INT32_BLANK = (0x7FFFFFF0, 0x7FFFFFFF)
_FP64_BLANK = 140737488355328.0
_RATIO_SLACK = 0.005


_Series = tuple[str, dict[str, str], float]
"""``(field, labels, value)`` of one series."""


class _Kind(Enum):
    GAUGE = "gauge"
    """A level (or a rate DCGM already computed): emitted as read, times ``scale``."""
    COUNT = "count"
    """A cumulative counter: emitted as its increase in the interval."""
    SUM_COUNT = "sum_count"
    """One of several cumulative counters whose increases are summed into one metric."""
    XID = "xid"
    """The last-XID gauge."""


@dataclass(frozen=True, slots=True)
class _Field:
    metric: str
    kind: _Kind
    scale: float = 1.0


FIELDS: dict[str, _Field] = {
    "DCGM_FI_DEV_GPU_UTIL": _Field("gpu_util_ratio", _Kind.GAUGE, 0.01),
    "DCGM_FI_PROF_SM_ACTIVE": _Field("gpu_sm_active_ratio", _Kind.GAUGE),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _Field("gpu_tensor_active_ratio", _Kind.GAUGE),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _Field("gpu_gr_engine_active_ratio", _Kind.GAUGE),
    "DCGM_FI_PROF_DRAM_ACTIVE": _Field("gpu_dram_active_ratio", _Kind.GAUGE),
    "DCGM_FI_DEV_POWER_USAGE": _Field("gpu_power_watts", _Kind.GAUGE),
    "DCGM_FI_DEV_GPU_TEMP": _Field("gpu_temperature_celsius", _Kind.GAUGE),
    "DCGM_FI_DEV_SM_CLOCK": _Field("gpu_sm_clock_hertz", _Kind.GAUGE, _MHZ),
    "DCGM_FI_DEV_FB_USED": _Field("gpu_memory_used_bytes", _Kind.GAUGE, _MIB),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _Field("gpu_pcie_tx_bytes_per_second", _Kind.GAUGE),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _Field("gpu_pcie_rx_bytes_per_second", _Kind.GAUGE),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": _Field("gpu_nvlink_tx_bytes_per_second", _Kind.GAUGE),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": _Field("gpu_nvlink_rx_bytes_per_second", _Kind.GAUGE),
    "DCGM_FI_DEV_PCIE_LINK_GEN": _Field("gpu_pcie_link_gen", _Kind.GAUGE),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": _Field("gpu_pcie_link_width", _Kind.GAUGE),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": _Field("gpu_throttle_reasons", _Kind.GAUGE),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _Field("gpu_throttle_reasons", _Kind.GAUGE),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _Field("gpu_pcie_replay_count", _Kind.COUNT),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _Field("gpu_ecc_sbe_count", _Kind.COUNT),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _Field("gpu_ecc_dbe_count", _Kind.COUNT),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": _Field(
        "gpu_nvlink_error_count", _Kind.SUM_COUNT
    ),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": _Field(
        "gpu_nvlink_error_count", _Kind.SUM_COUNT
    ),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": _Field(
        "gpu_nvlink_error_count", _Kind.SUM_COUNT
    ),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": _Field(
        "gpu_nvlink_error_count", _Kind.SUM_COUNT
    ),
    "DCGM_FI_DEV_XID_ERRORS": _Field("gpu_xid_count", _Kind.XID),
}
"""The dcgm-exporter fields this source reads; every other series is ignored."""

# Public names of the table above, for the other readers of dcgm-exporter series
# (collectors.prometheus maps the same fields from a Prometheus server).
FieldKind = _Kind
DcgmField = _Field
RATIO_SLACK = _RATIO_SLACK
"""Activity ratios up to 1 + this are DCGM's rounding and read as 1."""


class _ScrapeError(Exception):
    """A failed scrape: ``reason`` is the bounded problem class."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class DcgmSource:
    """Scrapes the node-local dcgm-exporter once per interval.

    Parameters
    ----------
    url
        The exporter's ``/metrics`` URL (node-local: proxies from the environment are ignored,
        redirects are not followed).
    timeout_s
        Deadline for the whole scrape (connect, request and body): the body is read as it
        arrives, each read waiting at most for the time left, so an exporter that trickles its
        answer is cut off at the deadline (problem ``timeout``).
    hostname
        When given, only series whose ``Hostname``/``hostname`` label equals it (or that carry
        no host label) are read; for an exporter that serves several hosts.
    """

    name = "dcgm"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout_s: float = 0.5,
        hostname: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"dcgm-exporter url {url!r}: expected an http:// or https:// URL")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s {timeout_s!r}: expected a positive number of seconds")
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"dcgm-exporter url {url!r}: {exc}") from None
        if not parts.hostname:
            raise ValueError(
                f"dcgm-exporter url {url!r}: expected a host, e.g. http://127.0.0.1:9400/metrics"
            )
        self.url = url
        self.timeout_s = float(timeout_s)
        self.hostname = hostname
        self.problems = ProblemLog(self.name)
        self._rates = CounterRates(self.problems)
        self._last_xid: dict[str, int] = {}
        # http.client rather than urllib: it gives the socket, whose timeout is set to the time
        # left before each read, and it never uses an http_proxy from the environment (the
        # exporter is node-local).
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def collect(self, now: float) -> Collected:
        """Scrape the exporter; on any failure report it and return nothing."""
        out = Collected()
        try:
            text = self._fetch()
            series = self._parse(text)
        except _ScrapeError as exc:
            self.problems.report(exc.reason, f"{self.url}: {exc}")
            return out
        self._map(series, now, out)
        return out

    def close(self) -> None:
        """Nothing to release: every scrape opens and closes its own connection."""

    # -- scrape ----------------------------------------------------------------------------

    def _fetch(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        connection_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = connection_type(self._host, self._port, timeout=self.timeout_s)
        try:
            connection.connect()
            sock = connection.sock
            if not isinstance(sock, socket.socket):  # http.client sets it on connect
                raise _ScrapeError("unreachable", "no socket after connect")
            connection.request(
                "GET", self._target, headers={"Accept": "text/plain", "Accept-Encoding": "identity"}
            )
            _set_timeout(sock, deadline, self.timeout_s)
            response = connection.getresponse()
            if not 200 <= response.status < 300:
                raise _ScrapeError(
                    f"http_{response.status}", f"HTTP {response.status} {response.reason}"
                )
            chunks: list[bytes] = []
            size = 0
            while True:
                # Each read returns what has arrived (read1: at most one recv) and waits at
                # most for the time left, so a trickling answer cannot outlive the deadline.
                _set_timeout(sock, deadline, self.timeout_s)
                chunk = response.read1(_READ_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise _ScrapeError("too_large", f"answer over {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
        except TimeoutError as exc:
            raise _ScrapeError("timeout", f"no full answer in {self.timeout_s:g} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _ScrapeError("unreachable", f"connection failed: {exc!r}") from exc
        finally:
            connection.close()
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _ScrapeError("unparsable", f"answer is not UTF-8 text: {exc}") from exc

    @staticmethod
    def _parse(text: str) -> list[_Series]:
        """``(field, labels, value)`` of every series of a known field."""
        try:
            lines = _known_lines(text)
            fast = _parse_plain(lines)
            if fast is not None:
                return fast
            # Escapes or unusual spacing: prometheus_client's parser handles the full format.
            # It is lazy (errors surface while iterating), so everything is read here.
            series: list[_Series] = []
            for family in text_string_to_metric_families("\n".join(lines) + "\n"):
                if family.name in FIELDS:
                    for sample in family.samples:
                        series.append((family.name, sample.labels, float(sample.value)))
        except (ValueError, IndexError, KeyError, TypeError) as exc:
            raise _ScrapeError("unparsable", f"not Prometheus text exposition: {exc}") from exc
        return series

    # -- mapping ---------------------------------------------------------------------------

    def _wanted(self, labels: dict[str, str]) -> str | None:
        """The series' canonical device, or None when it is not read."""
        gpu = labels.get("gpu", "")
        if not _GPU_LABEL.fullmatch(gpu):
            return None  # NVSwitch / link entities, or a series without a GPU
        if labels.get("GPU_I_ID", ""):
            return None  # one MIG instance, not the whole GPU
        if self.hostname is not None:
            host = labels.get("hostname", labels.get("Hostname"))
            if host is not None and host != self.hostname:
                return None
        return f"gpu{int(gpu)}"

    def _map(
        self, series: list[tuple[str, dict[str, str], float]], now: float, out: Collected
    ) -> None:
        seen: set[tuple[str, str]] = set()
        gauges: set[tuple[str, str]] = set()
        sums: dict[str, float] = {}
        keys: set[tuple[str, ...]] = set()
        for field_name, labels, value in series:
            device = self._wanted(labels)
            if device is None or (field_name, device) in seen:
                continue  # the first series of a field per GPU wins (e.g. k8s pod duplicates)
            seen.add((field_name, device))
            if math.isnan(value) or _is_blank(value):
                continue  # DCGM has no value for this field now
            spec = FIELDS[field_name]
            if spec.kind is _Kind.GAUGE:
                # both spellings of the clock-event reasons field may be exported: once only
                if (spec.metric, device) not in gauges:
                    gauges.add((spec.metric, device))
                    self._emit(out, spec.metric, device, value * spec.scale)
            elif spec.kind is _Kind.XID:
                self._xid(device, value, now, out)
            else:
                key = (device, field_name)
                keys.add(key)
                step = self._rates.count(key, value)
                if step is None:
                    continue
                if spec.kind is _Kind.SUM_COUNT:
                    sums[device] = sums.get(device, 0.0) + step
                    continue
                self._emit(out, spec.metric, device, step)
                if field_name == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" and step > 0:
                    message = f"{int(step)} uncorrectable (volatile) ECC error(s)"
                    out.events.append(Event(EventKind.ECC, device, now, message=message))
        for device, total in sums.items():
            self._emit(out, "gpu_nvlink_error_count", device, total)
        self._rates.forget(keys)
        devices = {device for _field, device in seen}
        for device in [d for d in self._last_xid if d not in devices]:
            del self._last_xid[device]

    def _emit(self, out: Collected, metric: str, device: str, value: float) -> None:
        if metric.endswith("_ratio") and 1.0 < value <= 1.0 + _RATIO_SLACK:
            value = 1.0  # DCGM's averaged activity ratios overshoot 1 by rounding
        try:
            validate_sample(metric, device, value)
        except ValidationError as exc:
            self.problems.report("out_of_range", str(exc))
            return
        out.add(metric, device, value)

    def _xid(self, device: str, value: float, now: float, out: Collected) -> None:
        new = xid_change(self._last_xid, device, int(value))
        if new is None:
            return
        if new:
            out.events.append(Event(EventKind.XID, device, now, code=int(value)))
        out.add("gpu_xid_count", device, 1.0 if new else 0.0)


def xid_change(last_xid: dict[_Key, int], key: _Key, code: int) -> bool | None:
    """DCGM's last-XID gauge read again: record ``code`` for ``key`` and say whether it is a
    new XID (a non-zero code other than the last one). None at first sight: a non-zero code
    then is history from before this reader."""
    last = last_xid.get(key)
    last_xid[key] = code
    if last is None:
        return None
    return code not in (0, last)


def _known_lines(text: str) -> list[str]:
    """The lines of ``text`` that belong to a field in :data:`FIELDS`.

    An exporter with every field enabled serves ~500 series on an 8-GPU node, most of which
    this source ignores; they are dropped before parsing. Every line is still checked for the
    exposition's shape, so text that is not an exposition fails (``ValueError``).
    """
    kept: list[str] = []
    for line in text.splitlines():
        if not line or line.isspace():
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] not in FIELDS:
                continue
            kept.append(line)
            continue
        match = _SERIES_START.match(line)
        if match is None:
            raise ValueError(f"line {line[:80]!r} is not a series")
        float(line.rsplit(None, 1)[-1])  # its value (or timestamp) must be a number
        if match.group(1) in FIELDS:
            kept.append(line)
    return kept


def _parse_plain(lines: list[str]) -> list[_Series] | None:
    """Parse series written the way dcgm-exporter writes them, or None for anything else.

    prometheus_client's parser costs ~35 µs per series (7 ms per scrape of an 8-GPU node,
    measured): too much for a 1 Hz agent meant to stay under 1 % of a core. Label values
    without escapes, one space before the value: ~10x cheaper; anything else returns None and
    goes to the full parser.
    """
    series: list[_Series] = []
    for line in lines:
        if line[0] == "#":
            continue
        match = _PLAIN_SERIES.fullmatch(line)
        if match is None:
            return None
        name, body, value = match.groups()
        labels: dict[str, str] = {}
        if body:
            position = 0
            while position < len(body):
                label = _PLAIN_LABEL.match(body, position)
                if label is None:
                    return None
                labels[label.group(1)] = label.group(2)
                position = label.end()
        try:
            number = float(value)
        except ValueError:
            return None
        series.append((name, labels, number))
    return series


def _set_timeout(sock: socket.socket, deadline: float, timeout_s: float) -> None:
    """Let the next socket operation wait at most until ``deadline`` (monotonic)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _ScrapeError("timeout", f"no full answer in {timeout_s:g} s")
    sock.settimeout(left)


def _is_blank(value: float) -> bool:
    return _INT32_BLANK[0] <= value <= _INT32_BLANK[1] or value >= _FP64_BLANK


def is_blank(value: float) -> bool:
    """Whether ``value`` is one of DCGM's "no data" sentinels (int32 or fp64 blank)."""
    return _is_blank(value)
