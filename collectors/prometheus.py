"""Reads dcgm-exporter, node_exporter and Minder agent series back from a Prometheus server.

Many clusters already scrape dcgm-exporter and node_exporter into Prometheus every 15–60 s. This
reader asks Prometheus's HTTP API for those series (``/api/v1/label/__name__/values`` and
``/api/v1/series`` to discover them, ``/api/v1/query_range`` to read them) and turns them into
canonical samples (docs/architecture.md §3.1; docs/sources.md §8):

* ``DCGM_FI_*`` through the table of :mod:`collectors.dcgm` (:data:`collectors.dcgm.FIELDS`):
  the same names, units and scales as the node agent's dcgm source;
* node_exporter: InfiniBand port counters (already in bytes: node_exporter applies the ×4 of
  sysfs' ``port_*_data``), ``node_infiniband_state_id`` → ``rdma_port_up``, CPU busy share,
  ``MemTotal − MemAvailable`` and physical-NIC throughput;
* the Minder agent's own ``minder_node_<metric>`` gauges and ``minder_node_<x>_total`` counters.

Every output sample sits on the step grid (multiples of ``step_s`` in unix seconds). Gauges are
``last_over_time(x[step])``: a step without a scrape in it has no sample rather than a stale
copy. Counters go through ``rate(x[window])`` on the server (a counter reset gives no negative
rate); a ``_count`` metric is that rate times the step, so totals over a range are kept.

Long ranges are read in chunks of at most :data:`MAX_POINTS_PER_SERIES` steps; a chunk that
Prometheus refuses as too big (``--query.max-samples``, the 11,000-point limit, a query timeout)
is halved down to one step, then the read fails with a :class:`PrometheusError` that says what
to narrow. Any other refusal, an unreachable server (after a few bounded retries), or an answer
with ``warnings`` (partial data) fails the whole read: nothing is ever silently shortened.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from typing import Any

import httpx
import numpy as np
import orjson
import pandas as pd

from collectors.agent import exported_count_name
from collectors.dcgm import FIELDS, RATIO_SLACK, FieldKind, is_blank, xid_change
from collectors.rdma import port_device_name
from minder.core.errors import MinderError, ValidationError
from minder.core.metrics import METRICS, MetricKind, validate_device
from minder.core.records import Event, EventKind, NodeBatch

__all__ = [
    "DEFAULT_JOB_LABELS",
    "DEFAULT_MACHINE_LABELS",
    "MAX_POINTS_PER_SERIES",
    "PrometheusError",
    "PrometheusReader",
    "ReadResult",
    "ReadStats",
    "parse_duration",
    "parse_matchers",
    "parse_time",
]

logger = logging.getLogger(__name__)

DEFAULT_JOB_LABELS: tuple[str, ...] = ("slurm_job_id", "job_id", "SLURM_JOB_ID", "hpc_job")
"""Labels that name the training job, first present wins: a Slurm job id relabelled onto the
series, the Minder agent's ``job_id``, the environment variable's spelling, dcgm-exporter's HPC
mode ``hpc_job``. Prometheus's own ``job`` label names the *scrape* job and is never used."""
DEFAULT_MACHINE_LABELS: tuple[str, ...] = ("machine", "Hostname", "hostname", "node", "instance")
"""Labels that name the machine, first present wins: the Minder agent's ``machine``,
dcgm-exporter's ``Hostname`` (``hostname`` upstream since d5e5f51), Kubernetes' ``node``, and
the scrape target ``instance`` with its port stripped."""
MAX_POINTS_PER_SERIES = 11_000
"""Prometheus refuses a range query of more points than this per series."""
DEFAULT_CHUNK_STEPS = 240
"""Steps per range query at first (one hour at 15 s); halved when Prometheus finds it too big."""
MAX_ANSWER_BYTES = 256 * 2**20
"""Largest answer read; a bigger one fails (narrow the range or the matchers)."""
RETRIES = 3
"""Attempts after the first for a connection error or a 502/503/504."""
_SHOWN = 160
_NIC_NAMES = r"lo|ifb.*|veth.*|docker.*|br-.*|virbr.*|cali.*|flannel.*|cni.*|tunl.*|vxlan.*"
_NIC_NAMES += r"|kube-.*|bond.*|team.*|tap.*|tun.*|genev.*|dummy.*|lxc.*|weave.*|cilium.*"
_NIC_NAMES += r"|nodelocaldns|nerdctl.*|podman.*|wg.*"
VIRTUAL_NICS = _NIC_NAMES
"""node_exporter network devices left out of ``net_*`` (loopback, mirrors, bridges, veths,
overlays and bonds, whose traffic their physical NICs already count), a PromQL regex."""
_FAMILIES = r"DCGM_FI_.+|node_infiniband_.+|minder_node_.+"
_ACTIVE = 4
_GPU_INDEX = re.compile(r"\d+")
_NVIDIA_DEVICE = re.compile(r"nvidia(\d+)")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_UNITS["y"] = 365 * 86400.0


class PrometheusError(MinderError):
    """Prometheus could not be read: unreachable, a refused query, or partial data.

    ``reason`` is a short, bounded class for counters: ``unreachable``, ``refused``,
    ``too_big``, ``partial_data`` or ``bad_answer``.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _TooBigError(Exception):
    """Prometheus refused a chunk as too big (samples, resolution or time): split it."""


def _short(text: object, limit: int = _SHOWN) -> str:
    """An untrusted string as a message may show it: repr, one line, at most ``limit`` chars."""
    shown = repr(str(text))
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


# -- parsing of the command line's values ----------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration (``15s``, ``1m30s``, ``500ms``) or a plain number.

    Raises
    ------
    ValidationError
        Not a positive duration.
    """
    value = text.strip()
    seconds: float | None = None
    try:
        seconds = float(value)
    except ValueError:
        position, total = 0, 0.0
        for match in _DURATION_PART.finditer(value):
            if match.start() != position:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            position = match.end()
        if position == len(value) and value:
            seconds = total
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValidationError(
            f"duration {_short(text, 60)}: expected a positive duration such as 15s, 1m, 1h30m "
            "or a number of seconds"
        )
    return seconds


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds of an RFC 3339 time, unix seconds, ``now`` or ``now-1h`` / ``-1h``.

    Raises
    ------
    ValidationError
        None of these forms, or an RFC 3339 time without a zone.
    """
    value = text.strip()
    current = time.time() if now is None else now
    if value == "now":
        return current
    relative = re.fullmatch(r"(?:now)?\s*([-+])\s*(\S+)", value)
    if relative and not re.fullmatch(r"[-+]?\d+(\.\d+)?", value):
        sign = -1.0 if relative.group(1) == "-" else 1.0
        try:
            return current + sign * parse_duration(relative.group(2))
        except ValidationError:
            pass
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        moment = None
    if moment is not None:
        if moment.tzinfo is None:
            raise ValidationError(
                f"time {_short(text, 60)} has no zone: expected RFC 3339 such as "
                "2025-01-31T12:00:00Z or 2025-01-31T13:00:00+01:00"
            )
        return moment.timestamp()
    raise ValidationError(
        f"time {_short(text, 60)}: expected RFC 3339 (2025-01-31T12:00:00Z), unix seconds, "
        "'now' or a relative time such as -1h or now-30m"
    )


def parse_matchers(texts: Sequence[str]) -> tuple[str, ...]:
    """Label matchers of ``--match`` values (``{cluster="a"}`` or ``cluster="a",rack=~"r1.*"``),
    normalised to ``name<op>"value"``; every one is added to every selector.

    Raises
    ------
    ValidationError
        A value that is not a list of PromQL label matchers, or one on ``__name__``.
    """
    matchers: list[str] = []
    for text in texts:
        body = text.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1]
        position = 0
        found = 0
        while position < len(body):
            match = _MATCHER.match(body, position)
            if match is None or match.end() == position:
                raise ValidationError(
                    f"--match {_short(text, 80)}: expected PromQL label matchers such as "
                    '\'{cluster="a"}\' or \'rack=~"r1.*",env!="test"\''
                )
            name, op, value, _ = match.groups()
            if name == "__name__":
                raise ValidationError(
                    f"--match {_short(text, 80)}: a matcher on __name__ is not allowed "
                    "(the reader chooses the metric names)"
                )
            matchers.append(f'{name}{op}"{value}"')
            position = match.end()
            found += 1
        if not found:
            raise ValidationError(
                f"--match {_short(text, 80)}: expected at least one label matcher, "
                "e.g. '{cluster=\"a\"}'"
            )
    return tuple(matchers)


def _check_label_specs(specs: Sequence[str], what: str) -> tuple[tuple[str, ...], ...]:
    """``a`` or ``a+b`` (values joined with ``/``) per spec, every part a label name."""
    parsed: list[tuple[str, ...]] = []
    for spec in specs:
        parts = tuple(part.strip() for part in spec.split("+"))
        if not parts or not all(_LABEL_NAME.fullmatch(part) for part in parts):
            raise ValidationError(
                f"{what} {_short(spec, 80)}: expected a label name such as slurm_job_id, or "
                "names joined with '+' (e.g. namespace+job_name)"
            )
        parsed.append(parts)
    if not parsed:
        raise ValidationError(f"{what}: expected at least one label name")
    return tuple(parsed)


def _promql_duration(seconds: float) -> str:
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


# -- what is read ----------------------------------------------------------------------------------


class _Out(Enum):
    GAUGE = "gauge"
    """A level (or a rate computed before the scrape): the value times ``scale``."""
    RATE = "rate"
    """A per-second rate computed by Prometheus."""
    COUNT = "count"
    """Events in the step: the rate computed by Prometheus times the step."""
    XID = "xid"
    """dcgm's last-XID gauge: a change to a new non-zero code is one event."""
    PORT_STATE = "port_state"
    """node_exporter's IB port state number: 1 when ACTIVE (4), else 0."""


class _Device(Enum):
    GPU = "gpu"
    NIC = "nic"
    HOST = "host"
    LABEL = "label"
    """The series' own ``device`` label (the Minder agent's)."""


@dataclass(frozen=True, slots=True)
class _Query:
    """One PromQL expression and how its series become canonical samples."""

    metric: str
    names: tuple[str, ...]
    """The series names the expression reads (it runs when one of them is present)."""
    expr: Callable[[_Ctx], str]
    out: _Out
    device: _Device
    source: str
    scale: float = 1.0
    family: int = 0
    """Samples of one family and key are summed; of several families, the lowest wins."""
    summed: bool = False


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What an expression is built from: the user's matchers, the step and the rate window."""

    matchers: tuple[str, ...]
    step: str
    window: str
    last: str
    """The range of ``last_over_time``: the step less 1 ms, so that a sample on the grid is read
    at its own step only (Prometheus 2 ranges include both ends, Prometheus 3 only the end)."""

    def sel(self, name: str, *extra: str) -> str:
        labels = ",".join((*extra, *self.matchers))
        return f"{name}{{{labels}}}" if labels else name


def _last(name: str) -> Callable[[_Ctx], str]:
    return lambda c: f"last_over_time({c.sel(name)}[{c.last}])"


def _rate(name: str) -> Callable[[_Ctx], str]:
    return lambda c: f"rate({c.sel(name)}[{c.window}])"


def _cpu(c: _Ctx) -> str:
    idle = c.sel("node_cpu_seconds_total", 'mode=~"idle|iowait"')
    every = c.sel("node_cpu_seconds_total")
    return (
        f"1 - sum without (cpu, mode) (rate({idle}[{c.window}])) "
        f"/ sum without (cpu, mode) (rate({every}[{c.window}]))"
    )


def _memory(c: _Ctx) -> str:
    total = c.sel("node_memory_MemTotal_bytes")
    available = c.sel("node_memory_MemAvailable_bytes")
    return f"last_over_time({total}[{c.last}]) - last_over_time({available}[{c.last}])"


def _network(name: str) -> Callable[[_Ctx], str]:
    def expr(c: _Ctx) -> str:
        return (
            f"sum without (device) (rate({c.sel(name, f'device!~{VIRTUAL_NICS!r}')}[{c.window}]))"
        )

    return expr


def _plan() -> tuple[_Query, ...]:
    """Every query the reader may run, in priority order (the agent's own series first)."""
    queries: list[_Query] = []
    family = 0
    # The Minder agent: its values are canonical already.
    for spec in METRICS.values():
        if spec.derived:
            continue  # computed by the service from the ranks' own series; no node exports it
        family += 1
        if spec.kind is MetricKind.COUNT:
            name = exported_count_name(spec.name)
            expr, out_kind = _rate(name), _Out.COUNT
        else:
            name = f"minder_node_{spec.name}"
            expr, out_kind = _last(name), _Out.GAUGE
        queries.append(
            _Query(spec.name, (name,), expr, out_kind, _Device.LABEL, "agent", family=family)
        )
    # dcgm-exporter, through the dcgm source's table.
    sums: dict[str, int] = {}
    out = {FieldKind.GAUGE: _Out.GAUGE, FieldKind.COUNT: _Out.COUNT, FieldKind.XID: _Out.XID}
    for name, dcgm in FIELDS.items():
        if dcgm.kind is FieldKind.SUM_COUNT:
            if dcgm.metric not in sums:
                family += 1
                sums[dcgm.metric] = family
            summed = _Query(
                dcgm.metric, (name,), _rate(name), _Out.COUNT, _Device.GPU, "dcgm", summed=True
            )
            queries.append(replace(summed, family=sums[dcgm.metric]))
            continue
        family += 1
        expr = _rate(name) if dcgm.kind is FieldKind.COUNT else _last(name)
        query = _Query(dcgm.metric, (name,), expr, out[dcgm.kind], _Device.GPU, "dcgm")
        queries.append(replace(query, scale=dcgm.scale, family=family))
    # node_exporter.
    node: list[tuple[str, str, _Out]] = [
        (
            "node_infiniband_port_data_transmitted_bytes_total",
            "rdma_tx_bytes_per_second",
            _Out.RATE,
        ),
        ("node_infiniband_port_data_received_bytes_total", "rdma_rx_bytes_per_second", _Out.RATE),
        ("node_infiniband_port_transmit_wait_total", "rdma_xmit_wait_per_second", _Out.RATE),
        ("node_infiniband_link_downed_total", "rdma_link_downed_count", _Out.COUNT),
        ("node_infiniband_symbol_error_total", "rdma_symbol_error_count", _Out.COUNT),
        ("node_infiniband_state_id", "rdma_port_up", _Out.PORT_STATE),
    ]
    for name, metric, out_kind in node:
        family += 1
        expr = _last(name) if out_kind is _Out.PORT_STATE else _rate(name)
        queries.append(
            _Query(metric, (name,), expr, out_kind, _Device.NIC, "node_exporter", family=family)
        )
    host: list[tuple[str, tuple[str, ...], Callable[[_Ctx], str], _Out]] = [
        ("cpu_util_ratio", ("node_cpu_seconds_total",), _cpu, _Out.GAUGE),
        (
            "memory_used_bytes",
            ("node_memory_MemTotal_bytes", "node_memory_MemAvailable_bytes"),
            _memory,
            _Out.GAUGE,
        ),
        (
            "net_tx_bytes_per_second",
            ("node_network_transmit_bytes_total",),
            _network("node_network_transmit_bytes_total"),
            _Out.RATE,
        ),
        (
            "net_rx_bytes_per_second",
            ("node_network_receive_bytes_total",),
            _network("node_network_receive_bytes_total"),
            _Out.RATE,
        ),
    ]
    for metric, names, expr, out_kind in host:
        family += 1
        queries.append(
            _Query(metric, names, expr, out_kind, _Device.HOST, "node_exporter", family=family)
        )
    for query in queries:
        assert query.metric in METRICS, query.metric
    return tuple(queries)


PLAN: tuple[_Query, ...] = _plan()
KNOWN_NAMES: frozenset[str] = frozenset(name for query in PLAN for name in query.names)
"""Every series name the reader maps to a canonical metric."""
_ALL_NAMES: tuple[str, ...] = tuple(sorted(KNOWN_NAMES))


# -- results ---------------------------------------------------------------------------------------


@dataclass
class ReadStats:
    """What a read found besides its samples (the import's summary, the poller's log)."""

    queries: int = 0
    """Range queries answered."""
    splits: int = 0
    """Chunks Prometheus refused as too big and that were halved."""
    series: Counter[str] = field(default_factory=Counter)
    """Series read per source name."""
    unknown: dict[str, int] = field(default_factory=dict)
    """Series of the dcgm/node_exporter/agent families whose name maps to nothing, per name."""
    skipped_series: Counter[tuple[str, str]] = field(default_factory=Counter)
    """``(reason, name)`` → series left out (no machine label, no GPU index, MIG instance…)."""
    dropped_samples: Counter[tuple[str, str]] = field(default_factory=Counter)
    """``(reason, metric)`` → samples left out (``no_job``, ``out_of_range``, ``duplicate``)."""
    seen: set[int] = field(default_factory=set, repr=False)
    """Fingerprints of the series counted (a series answered in several chunks counts once)."""

    def first_sight(self, name: str, labels: dict[str, str]) -> bool:
        """Whether this series is new to the counts (and remember it)."""
        fingerprint = hash((name, tuple(sorted(labels.items()))))
        if fingerprint in self.seen:
            return False
        self.seen.add(fingerprint)
        return True

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: counts nested by reason."""
        skipped: dict[str, dict[str, int]] = {}
        for (reason, name), count in sorted(self.skipped_series.items()):
            skipped.setdefault(reason, {})[name] = count
        dropped: dict[str, dict[str, int]] = {}
        for (reason, metric), count in sorted(self.dropped_samples.items()):
            dropped.setdefault(reason, {})[metric] = count
        return {
            "queries": self.queries,
            "splits": self.splits,
            "series": dict(sorted(self.series.items())),
            "unknown_series": dict(sorted(self.unknown.items())),
            "skipped_series": skipped,
            "dropped_samples": dropped,
        }


@dataclass
class ReadResult:
    """Canonical rows of one read (columns of the metric table) and the events seen."""

    frame: pd.DataFrame
    """``ts, job, machine, metric, value, device, group, domain``."""
    events: list[tuple[str, str, Event]]
    """``(job, machine, event)``: XID changes, uncorrectable ECC errors, IB ports leaving ACTIVE."""
    stats: ReadStats

    def batches(self, interval_s: float) -> list[NodeBatch]:
        """One :class:`NodeBatch` per job, machine and step, oldest first."""
        out: dict[tuple[float, str, str], NodeBatch] = {}
        frame = self.frame
        if len(frame):
            for (ts, job, machine), rows in frame.groupby(
                ["ts", "job", "machine"], observed=True, sort=True
            ):
                samples = list(
                    zip(
                        rows["metric"].astype(str).tolist(),
                        rows["device"].astype(str).tolist(),
                        rows["value"].astype(float).tolist(),
                        strict=True,
                    )
                )
                key = (float(ts), str(job), str(machine))  # type: ignore[arg-type]
                out[key] = NodeBatch(
                    job=key[1], node=key[2], ts=key[0], interval_s=interval_s, samples=samples
                )
        for job, machine, event in self.events:
            key = (float(event.ts), job, machine)
            batch = out.get(key)
            if batch is None:
                batch = out[key] = NodeBatch(
                    job=job, node=machine, ts=key[0], interval_s=interval_s
                )
            batch.events.append(event)
        return [out[key] for key in sorted(out)]


@dataclass
class _Piece:
    """The samples of one series after mapping (one device of one machine)."""

    query: _Query
    name: str
    job: str | None
    machine: str
    device: str
    ts: np.ndarray
    values: np.ndarray


# -- the reader ------------------------------------------------------------------------------------


class PrometheusReader:
    """Reads canonical samples from a Prometheus server's HTTP API.

    Parameters
    ----------
    url
        The server's base URL (``http://prometheus:9090``, or with its route prefix).
    step_s
        The sampling interval of the output: one sample per series per step. Set it to the
        scrape interval.
    matchers
        ``--match`` values (see :func:`parse_matchers`), added to every selector.
    job_labels, machine_labels
        Label specs in priority order (None: :data:`DEFAULT_JOB_LABELS`,
        :data:`DEFAULT_MACHINE_LABELS`); ``a+b`` joins the values of both with ``/``. A series
        without a job label takes the job its machine's other series carry at that step, else
        ``default_job``, else it is left out and counted (``no_job``).
    rate_window_s
        The range of ``rate()``; default twice the step, so that every window holds at least two
        scrapes when the step is the scrape interval.
    timeout_s
        Per HTTP request (also sent to Prometheus as the query's own timeout).
    chunk_steps
        Steps per range query at first (at most :data:`MAX_POINTS_PER_SERIES`).
    discovery_ttl_s
        How long a discovery of the series names present is reused (the live poller's reads).
    transport
        An httpx transport (tests put a failing one in front of the real network).
    """

    def __init__(
        self,
        url: str,
        *,
        step_s: float = 15.0,
        matchers: Sequence[str] = (),
        job_labels: Sequence[str] | None = None,
        machine_labels: Sequence[str] | None = None,
        default_job: str | None = None,
        rate_window_s: float | None = None,
        timeout_s: float = 30.0,
        chunk_steps: int = DEFAULT_CHUNK_STEPS,
        discovery_ttl_s: float = 300.0,
        bearer_token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        retry_wait_s: float = 0.5,
    ) -> None:
        parts = httpx.URL(url) if url.startswith(("http://", "https://")) else None
        if parts is None or not parts.host:
            raise ValidationError(
                f"Prometheus url {_short(url, 80)}: expected http(s)://host:port of the server, "
                "e.g. http://prometheus:9090"
            )
        if not (math.isfinite(step_s) and step_s >= 0.01):
            raise ValidationError(f"step {step_s!r}: expected a positive number of seconds")
        if rate_window_s is not None and not (math.isfinite(rate_window_s) and rate_window_s > 0):
            raise ValidationError(f"rate window {rate_window_s!r}: expected positive seconds")
        if not timeout_s > 0:
            raise ValidationError(f"timeout {timeout_s!r}: expected positive seconds")
        if not 1 <= chunk_steps <= MAX_POINTS_PER_SERIES:
            raise ValidationError(
                f"chunk of {chunk_steps!r} steps: expected 1 to {MAX_POINTS_PER_SERIES}"
            )
        if default_job is not None and not default_job.strip():
            raise ValidationError("default job '': expected a non-empty job name")
        self.url = url.rstrip("/")
        self.step_s = float(step_s)
        self.matchers = parse_matchers(matchers)
        self.job_specs = _check_label_specs(job_labels or DEFAULT_JOB_LABELS, "job label")
        self.machine_specs = _check_label_specs(
            machine_labels or DEFAULT_MACHINE_LABELS, "machine label"
        )
        self.default_job = default_job
        self.rate_window_s = float(rate_window_s) if rate_window_s else 2.0 * self.step_s
        self.timeout_s = float(timeout_s)
        self.chunk_steps = int(chunk_steps)
        self.discovery_ttl_s = discovery_ttl_s
        self.retry_wait_s = retry_wait_s
        self._ctx = _Ctx(
            self.matchers,
            _promql_duration(self.step_s),
            _promql_duration(self.rate_window_s),
            _promql_duration(self.step_s - 0.001),
        )
        headers = {"Accept": "application/json", "User-Agent": "minder-prometheus-reader"}
        if bearer_token:
            headers["Authorization"] = f"Bearer {bearer_token}"
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout_s),
            headers=headers,
            transport=transport,
            follow_redirects=False,
        )
        self._discovered: tuple[float, set[str], dict[str, int]] | None = None
        self._reported_unknown: set[str] = set()
        self._reported_skips: set[tuple[str, str]] = set()
        # State of the stateful mappings across reads (the live poller reads step after step).
        self._last_xid: dict[tuple[str, str], int] = {}
        self._was_active: dict[tuple[str, str], bool] = {}

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def __enter__(self) -> PrometheusReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ---------------------------------------------------------------------------------

    def _call(self, path: str, params: dict[str, Any], what: str, *, method: str = "POST") -> Any:
        """Send ``params`` to ``path`` (a form for POST, the query string for GET) and return
        ``data`` of a successful answer.

        Raises
        ------
        _TooBigError
            Prometheus refused the query as too big (samples, resolution or its timeout).
        PrometheusError
            Anything else that is not a complete, successful answer.
        """
        target = f"{self.url}{path}"
        for attempt in range(RETRIES + 1):
            transient = ""
            try:
                status, body = self._send(method, target, params)
            except httpx.TimeoutException:
                raise _TooBigError() from None  # the server is slow on this much data: split it
            except httpx.TransportError as exc:
                transient = f"cannot connect: {exc.__class__.__name__}: {_short(exc, 120)}"
            else:
                if status in (502, 503, 504) and not _is_timeout_answer(body):
                    transient = f"HTTP {status}"
                else:
                    return self._decode(target, status, body, what)
            if attempt < RETRIES:
                logger.info("Prometheus at %s: %s; retrying", self.url, transient)
                time.sleep(self.retry_wait_s * 2**attempt)
        raise PrometheusError(
            f"Prometheus at {self.url} is unreachable ({transient}, {RETRIES + 1} attempts) "
            f"for {what}: expected a Prometheus server answering on {target}",
            "unreachable",
        )

    def _send(self, method: str, target: str, params: dict[str, Any]) -> tuple[int, bytes]:
        arguments: dict[str, Any] = {"data": params} if method == "POST" else {"params": params}
        with self._client.stream(method, target, **arguments) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise PrometheusError(
                        f"Prometheus at {self.url}: answer over {MAX_ANSWER_BYTES} bytes to "
                        f"{target}: narrow the time range or add --match matchers",
                        "too_big",
                    )
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    def _decode(self, target: str, status: int, body: bytes, what: str) -> Any:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict) or answer.get("status") not in ("success", "error"):
            raise PrometheusError(
                f"{target} answered HTTP {status} with {_short(body[:80].decode(errors='replace'))}"
                f" to {what}: expected Prometheus API JSON (is {self.url} the Prometheus server?)",
                "bad_answer",
            )
        if answer["status"] == "error":
            kind = str(answer.get("errorType", ""))
            message = str(answer.get("error", ""))
            if (
                (status == 422 and "too many samples" in message)
                or "exceeded maximum resolution" in message
                or kind == "timeout"
            ):
                raise _TooBigError()
            raise PrometheusError(
                f"Prometheus at {self.url} refused {what}: HTTP {status} {_short(kind, 40)}: "
                f"{_short(message)}",
                "refused",
            )
        warnings = answer.get("warnings") or []
        if warnings:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {what} with {len(warnings)} warning(s), e.g. "
                f"{_short(warnings[0])}: the data may be partial; expected a complete answer "
                "(nothing was written from it)",
                "partial_data",
            )
        return answer.get("data")

    def check(self) -> None:
        """Raise :class:`PrometheusError` unless the server answers a trivial query."""
        self._call("/api/v1/query", {"query": "1"}, "the query '1'")

    # -- discovery ----------------------------------------------------------------------------

    def _selector(self, names_regex: str) -> str:
        return "{" + ",".join((f"__name__=~{names_regex!r}", *self.matchers)) + "}"

    def discover(self, start: float, end: float) -> tuple[set[str], dict[str, int]]:
        """Names present in ``[start, end]``: the known ones, and the unknown ones of the
        dcgm-exporter, node_exporter IB and agent families with their series counts."""
        span = {"start": _fmt(start), "end": _fmt(end)}
        known = "|".join(re.escape(name) for name in _ALL_NAMES)
        selectors = [self._selector(f"{known}"), self._selector(_FAMILIES)]
        data = self._call(
            "/api/v1/label/__name__/values",
            {"match[]": selectors, **span},
            f"the series names matching {_short(','.join(self.matchers) or 'anything', 80)}",
            method="GET",  # this endpoint takes no POST
        )
        if not isinstance(data, list):
            raise PrometheusError(
                f"Prometheus at {self.url}: the label values answer is {type(data).__name__}: "
                "expected a list of names",
                "bad_answer",
            )
        names = {str(name) for name in data}
        present = names & KNOWN_NAMES
        unknown_names = sorted(names - KNOWN_NAMES)
        unknown: dict[str, int] = {}
        if unknown_names:
            regex = "|".join(re.escape(name) for name in unknown_names)
            series = self._call(
                "/api/v1/series",
                {"match[]": [self._selector(regex)], **span},
                "the series of names that map to no canonical metric",
            )
            counts: Counter[str] = Counter(
                str(labels.get("__name__", ""))
                for labels in series or []
                if isinstance(labels, dict)
            )
            unknown = {name: counts.get(name, 0) for name in unknown_names}
        for name in unknown_names:
            if name not in self._reported_unknown:
                self._reported_unknown.add(name)
                logger.info(
                    "Prometheus at %s: %d series named %s map to no canonical metric: ignored",
                    self.url,
                    unknown.get(name, 0),
                    _short(name, 80),
                )
        return present, unknown

    def _discovery(
        self, start: float, end: float, *, cached: bool
    ) -> tuple[set[str], dict[str, int]]:
        now = time.monotonic()
        if cached and self._discovered is not None:
            at, present, unknown = self._discovered
            if now - at < self.discovery_ttl_s:
                return present, {}
        present, unknown = self.discover(start, end)
        self._discovered = (now, present, unknown)
        return present, unknown

    # -- reading ------------------------------------------------------------------------------

    def grid(self, start: float, end: float) -> tuple[float, float]:
        """``start`` rounded up and ``end`` rounded down to the step grid.

        Raises
        ------
        ValidationError
            No step of the grid lies in ``[start, end]``.
        """
        step = self.step_s
        first = math.ceil(start / step - 1e-9) * step
        last = math.floor(end / step + 1e-9) * step
        if last < first:
            raise ValidationError(
                f"time range {_fmt(start)} .. {_fmt(end)}: expected the start before the end "
                f"and at least one {self._ctx.step} step between them"
            )
        return first, last

    def read(
        self,
        start: float,
        end: float,
        *,
        progress: Callable[[int, int], None] | None = None,
        cached_discovery: bool = False,
    ) -> ReadResult:
        """Read every known series in ``[start, end]`` (rounded to the step grid).

        ``progress(done, total)`` is called after each range query of each chunk.

        Raises
        ------
        PrometheusError
            Unreachable, refused, partial data, or a chunk too big even at one step.
        ValidationError
            An empty time range.
        """
        first, last = self.grid(start, end)
        # A failed read is retried whole (the live poller reads the missed range again): the
        # XID and port-state memory must then be what it was before this read.
        saved = (dict(self._last_xid), dict(self._was_active))
        try:
            return self._read(first, last, progress, cached_discovery)
        except BaseException:
            self._last_xid, self._was_active = saved
            raise

    def _read(
        self,
        first: float,
        last: float,
        progress: Callable[[int, int], None] | None,
        cached_discovery: bool,
    ) -> ReadResult:
        stats = ReadStats()
        lookback = max(self.rate_window_s, 600.0) if cached_discovery else 0.0
        present, stats.unknown = self._discovery(first - lookback, last, cached=cached_discovery)
        queries = [q for q in PLAN if any(name in present for name in q.names)]
        n_steps = round((last - first) / self.step_s) + 1
        chunk = min(self.chunk_steps, MAX_POINTS_PER_SERIES)
        n_chunks = math.ceil(n_steps / chunk)
        total = max(1, n_chunks * len(queries))
        done = 0
        frames: list[pd.DataFrame] = []
        events: list[tuple[str, str, Event]] = []
        for index in range(n_chunks):
            chunk_first = first + index * chunk * self.step_s
            chunk_last = min(last, chunk_first + (chunk - 1) * self.step_s)
            pieces: list[_Piece] = []
            raw_events: list[tuple[str | None, str, Event]] = []
            for query in queries:
                self._run(query, chunk_first, chunk_last, pieces, raw_events, stats)
                done += 1
                if progress is not None:
                    progress(done, total)
            frame, resolved = self._resolve(pieces, raw_events, stats)
            frames.append(frame)
            events.extend(resolved)
        if progress is not None:
            progress(total, total)
        frame = pd.concat(frames, ignore_index=True) if frames else _empty_frame()
        return ReadResult(frame, events, stats)

    def _run(
        self,
        query: _Query,
        first: float,
        last: float,
        pieces: list[_Piece],
        events: list[tuple[str | None, str, Event]],
        stats: ReadStats,
    ) -> None:
        """Run ``query`` over ``[first, last]``, halving the chunk while Prometheus refuses it as
        too big; map every answered series."""
        expr = query.expr(self._ctx)
        steps = round((last - first) / self.step_s) + 1
        at = first
        while at <= last + 1e-9:
            upto = min(last, at + (steps - 1) * self.step_s)
            params = {
                "query": expr,
                "start": _fmt(at),
                "end": _fmt(upto),
                "step": self._ctx.step,
                "timeout": _promql_duration(self.timeout_s),
            }
            what = f"query {_short(expr)} over {_fmt(at)} .. {_fmt(upto)}"
            try:
                data = self._call("/api/v1/query_range", params, what)
            except _TooBigError:
                if steps <= 1:
                    raise PrometheusError(
                        f"Prometheus at {self.url} refuses {what} as too big even for one step: "
                        "expected it to fit --query.max-samples and the query timeout; add "
                        "--match matchers or raise those limits",
                        "too_big",
                    ) from None
                steps = max(1, steps // 2)
                stats.splits += 1
                logger.info("Prometheus refused %s as too big; %d steps per query now", what, steps)
                continue
            stats.queries += 1
            if not isinstance(data, dict) or data.get("resultType") != "matrix":
                kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
                raise PrometheusError(
                    f"Prometheus at {self.url} answered {what} with {_short(kind, 40)}: "
                    "expected a matrix",
                    "bad_answer",
                )
            for series in data.get("result") or []:
                self._map(query, series, pieces, events, stats)
            at = upto + self.step_s

    # -- mapping ------------------------------------------------------------------------------

    def _label(self, labels: dict[str, str], specs: tuple[tuple[str, ...], ...]) -> str | None:
        for parts in specs:
            values = [labels.get(part, "").strip() for part in parts]
            if all(values):
                if parts == ("instance",):
                    return _strip_port(values[0])
                return "/".join(values)
        return None

    def _device(self, query: _Query, labels: dict[str, str]) -> tuple[str | None, str]:
        """``(device, "")`` or ``(None, reason)``."""
        if query.device is _Device.HOST:
            return "", ""
        if query.device is _Device.LABEL:
            return labels.get("device", ""), ""
        if query.device is _Device.GPU:
            if labels.get("GPU_I_ID", ""):
                return None, "mig_instance"
            gpu = labels.get("gpu", "")
            if _GPU_INDEX.fullmatch(gpu):
                return f"gpu{int(gpu)}", ""
            nvidia = _NVIDIA_DEVICE.fullmatch(labels.get("device", ""))
            if not gpu and nvidia:
                return f"gpu{int(nvidia.group(1))}", ""
            return None, "no_gpu_index"
        device, port = labels.get("device", ""), labels.get("port", "")
        if not device or not port.isdigit():
            return None, "no_device_port"
        return port_device_name(device, int(port)), ""

    def _map(
        self,
        query: _Query,
        series: Any,
        pieces: list[_Piece],
        events: list[tuple[str | None, str, Event]],
        stats: ReadStats,
    ) -> None:
        if not isinstance(series, dict):
            raise PrometheusError(
                f"Prometheus at {self.url}: a series of the answer is {type(series).__name__}: "
                "expected an object with 'metric' and 'values'",
                "bad_answer",
            )
        labels = {str(k): str(v) for k, v in (series.get("metric") or {}).items()}
        name = labels.get("__name__") or query.names[0]
        first = stats.first_sight(name, labels)
        if first:
            stats.series[name] += 1
        machine = self._label(labels, self.machine_specs)
        device, reason = self._device(query, labels)
        if machine is None or device is None:
            if first:
                self._skip(stats, "no_machine_label" if machine is None else reason, name, labels)
            return
        try:
            validate_device(METRICS[query.metric], device)
        except ValidationError:
            if first:
                self._skip(stats, "bad_device", name, labels)
            return
        job = self._label(labels, self.job_specs)
        try:
            points = np.asarray(series.get("values") or [], dtype=object).reshape(-1, 2)
            ts = points[:, 0].astype(np.float64)
            values = points[:, 1].astype(str).astype(np.float64)
        except (TypeError, ValueError):
            raise PrometheusError(
                f"Prometheus at {self.url}: series {_short(name, 80)} holds values that are not "
                "[time, 'number'] pairs",
                "bad_answer",
            ) from None
        if not len(ts):
            return
        spec = METRICS[query.metric]
        if query.out is _Out.XID:
            ts, values = self._xid(job, machine, device, ts, values, events)
        elif query.out is _Out.PORT_STATE:
            ts, values = self._port_state(job, machine, device, ts, values, events)
        else:
            if query.source == "dcgm":
                keep = ~np.fromiter((is_blank(v) for v in values), dtype=bool, count=len(values))
                ts, values = ts[keep], values[keep]
            values = values * query.scale
            if query.out is _Out.COUNT:
                values = values * self.step_s
            if spec.upper == 1.0:
                values = np.where((values > 1.0) & (values <= 1.0 + RATIO_SLACK), 1.0, values)
        finite = np.isfinite(values)
        ts, values = ts[finite], values[finite]
        inside = (values >= spec.lower) & (values <= spec.upper)
        if not inside.all():
            stats.dropped_samples[("out_of_range", query.metric)] += int((~inside).sum())
            if ("out_of_range", query.metric) not in self._reported_skips:
                self._reported_skips.add(("out_of_range", query.metric))
                logger.info(
                    "Prometheus at %s: %s of %s holds %r, outside [%g, %g] (%s): left out; "
                    "further ones are counted, not logged",
                    self.url,
                    query.metric,
                    _short(name, 80),
                    float(values[~inside][0]),
                    spec.lower,
                    spec.upper,
                    spec.unit,
                )
            ts, values = ts[inside], values[inside]
        if query.metric == "gpu_ecc_dbe_count":
            for at, count in zip(ts[values > 0], values[values > 0], strict=True):
                message = f"{count:g} uncorrectable (volatile) ECC error(s)"
                events.append(
                    (job, machine, Event(EventKind.ECC, device, float(at), message=message))
                )
        if len(ts):
            pieces.append(_Piece(query, name, job, machine, device, ts, values))

    def _skip(self, stats: ReadStats, reason: str, name: str, labels: dict[str, str]) -> None:
        """Count a series left out; the first of each reason and name is logged."""
        stats.skipped_series[(reason, name)] += 1
        if (reason, name) not in self._reported_skips:
            self._reported_skips.add((reason, name))
            logger.info(
                "Prometheus at %s: series of %s left out (%s), e.g. labels %s; further ones "
                "are counted, not logged",
                self.url,
                _short(name, 80),
                reason,
                _short(",".join(f"{k}={v}" for k, v in sorted(labels.items())), 200),
            )

    def _xid(
        self,
        job: str | None,
        machine: str,
        device: str,
        ts: np.ndarray,
        values: np.ndarray,
        events: list[tuple[str | None, str, Event]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """dcgm's last-XID gauge → ``gpu_xid_count`` 1 at a change to a new non-zero code, else
        0; the first value seen is history (as the dcgm source does)."""
        key = (machine, device)
        out_ts: list[float] = []
        out_values: list[float] = []
        for at, value in zip(ts.tolist(), values.tolist(), strict=True):
            if not math.isfinite(value) or is_blank(value):
                continue
            new = xid_change(self._last_xid, key, int(value))
            if new is None:
                continue
            if new:
                events.append((job, machine, Event(EventKind.XID, device, at, code=int(value))))
            out_ts.append(at)
            out_values.append(1.0 if new else 0.0)
        return np.asarray(out_ts, dtype=np.float64), np.asarray(out_values, dtype=np.float64)

    def _port_state(
        self,
        job: str | None,
        machine: str,
        device: str,
        ts: np.ndarray,
        values: np.ndarray,
        events: list[tuple[str | None, str, Event]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """IB port state number → ``rdma_port_up``; a ``link_down`` event when a port that was
        ACTIVE at the previous step is not ACTIVE now."""
        key = (machine, device)
        up = (values == _ACTIVE).astype(np.float64)
        for at, active in zip(ts.tolist(), up.tolist(), strict=True):
            if self._was_active.get(key) and not active:
                message = "node_infiniband_state_id left 4 (ACTIVE)"
                events.append(
                    (job, machine, Event(EventKind.LINK_DOWN, device, at, message=message))
                )
            self._was_active[key] = bool(active)
        return ts, up

    def _resolve(
        self,
        pieces: list[_Piece],
        raw_events: list[tuple[str | None, str, Event]],
        stats: ReadStats,
    ) -> tuple[pd.DataFrame, list[tuple[str, str, Event]]]:
        """One chunk's pieces as canonical rows: jobs filled in, summed families summed,
        duplicates (a metric from two sources, two spellings of a field) dropped.

        Rows are handled as integer codes of sorted names (a chunk of a large cluster holds
        tens of millions of samples), and come out as the table's categorical columns.
        """
        if not pieces:
            return _empty_frame(), []
        names: dict[str, list[str]] = {}
        piece_codes: dict[str, np.ndarray] = {}
        default = [self.default_job] if self.default_job else []
        for column, texts in (
            ("job", [p.job or "" for p in pieces]),
            ("machine", [p.machine for p in pieces]),
            ("metric", [p.query.metric for p in pieces]),
            ("device", [p.device for p in pieces]),
        ):
            names[column] = sorted({*texts, *(default if column == "job" else [])})
            code_of = {name: code for code, name in enumerate(names[column])}
            piece_codes[column] = np.array([code_of[t] for t in texts], dtype=np.int32)
        job_code = {name: code for code, name in enumerate(names["job"])}
        sizes = np.fromiter((len(p.ts) for p in pieces), dtype=np.int64, count=len(pieces))
        row_piece = np.repeat(np.arange(len(pieces), dtype=np.int32), sizes)
        frame = pd.DataFrame(
            {
                "ts": np.concatenate([p.ts for p in pieces]),
                **{column: codes[row_piece] for column, codes in piece_codes.items()},
                "value": np.concatenate([p.values for p in pieces]),
                "family": np.array([p.query.family for p in pieces], dtype=np.int32)[row_piece],
                "summed": np.array([p.query.summed for p in pieces], dtype=bool)[row_piece],
            }
        )
        no_job = job_code.get("", -1)
        at_step: dict[tuple[int, float], int] = {}
        by_machine: dict[int, int] = {}
        if no_job >= 0:
            # The job of a series without a job label: the one its machine's other series carry
            # at that step, else the one they carry most in this chunk, else the default.
            missing = (frame["job"] == no_job).to_numpy()
            labelled = frame.loc[~missing, ["machine", "ts", "job"]]
            lookup = labelled.drop_duplicates(["machine", "ts"])
            counts = labelled.groupby(["machine", "job"]).size().reset_index(name="n")
            best = counts.sort_values("n", ascending=False, kind="stable")
            by_machine = {
                int(m): int(j)
                for m, j in best.drop_duplicates("machine")[["machine", "job"]].itertuples(
                    index=False, name=None
                )
            }
            keys = frame.loc[missing, ["machine", "ts"]].reset_index(drop=True)
            found = keys.merge(lookup, on=["machine", "ts"], how="left")["job"].to_numpy()
            fallback = keys["machine"].map(by_machine).to_numpy(dtype=np.float64)
            chosen = np.where(np.isnan(found), fallback, found)
            default_code = job_code[self.default_job] if self.default_job else no_job
            chosen = np.where(np.isnan(chosen), default_code, chosen).astype(np.int32)
            job = frame["job"].to_numpy().copy()
            job[missing] = chosen
            frame["job"] = job
            unresolved = (frame["job"] == no_job).to_numpy()
            if unresolved.any():
                dropped = np.bincount(
                    frame.loc[unresolved, "metric"], minlength=len(names["metric"])
                )
                for code in np.flatnonzero(dropped):
                    metric = names["metric"][code]
                    stats.dropped_samples[("no_job", metric)] += int(dropped[code])
                frame = frame.loc[~unresolved]
            if raw_events:
                at_step = {
                    (int(m), float(t)): int(j)
                    for m, t, j in lookup.itertuples(index=False, name=None)
                }
        key = ["job", "machine", "metric", "device", "ts"]
        summed = frame["summed"].to_numpy(dtype=bool)
        if summed.any():
            sums = frame.loc[summed].groupby([*key, "family"], sort=False)["value"].sum()
            totals: pd.DataFrame = sums.reset_index()
            totals["summed"] = True
            frame = pd.concat([frame.loc[~summed], totals], ignore_index=True)
        frame = frame.sort_values("family", kind="stable")
        duplicate = frame.duplicated(key, keep="first").to_numpy()
        if duplicate.any():
            per_metric = np.bincount(frame.loc[duplicate, "metric"], minlength=len(names["metric"]))
            for code in np.flatnonzero(per_metric):
                stats.dropped_samples[("duplicate", names["metric"][code])] += int(per_metric[code])
            frame = frame.loc[~duplicate]
        frame = frame.sort_values(["ts", "job", "machine", "metric", "device"], kind="stable")
        n = len(frame)
        out = pd.DataFrame(
            {
                "ts": frame["ts"].to_numpy(dtype=np.float64),
                **{
                    column: _category(frame[column].to_numpy(), names[column])
                    for column in ("job", "machine", "metric")
                },
                "value": frame["value"].to_numpy(dtype=np.float64),
                "device": _category(frame["device"].to_numpy(), names["device"]),
                "group": _category(np.zeros(n, dtype=np.int32), [""]),
                "domain": _category(np.zeros(n, dtype=np.int32), [""]),
            }
        )
        events: list[tuple[str, str, Event]] = []
        machine_code = {name: code for code, name in enumerate(names["machine"])}
        for labelled_job, machine, event in raw_events:
            chosen_job = labelled_job
            if chosen_job is None:
                m = machine_code[machine]
                index = at_step.get((m, float(event.ts)), by_machine.get(m, -1))
                chosen_job = names["job"][index] if index >= 0 else self.default_job
            if chosen_job:
                events.append((chosen_job, machine, event))
        return out, events


def _category(codes: np.ndarray, names: list[str]) -> pd.Categorical[str]:
    """A table column from codes into sorted ``names``."""
    return pd.Categorical.from_codes(codes, categories=pd.Index(names, dtype=str))


def _empty_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ts": np.zeros(0, dtype=np.float64),
            "job": pd.Categorical([]),
            "machine": pd.Categorical([]),
            "metric": pd.Categorical([]),
            "value": np.zeros(0, dtype=np.float64),
            "device": pd.Categorical([]),
            "group": pd.Categorical([]),
            "domain": pd.Categorical([]),
        }
    )


def _is_timeout_answer(body: bytes) -> bool:
    """Prometheus answers a query that ran past its timeout with 503 ``errorType: timeout``."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and answer.get("errorType") == "timeout"


def _strip_port(instance: str) -> str:
    """``host:9100`` → ``host``, ``[::1]:9100`` → ``::1``; anything else unchanged."""
    if instance.startswith("["):
        end = instance.find("]")
        return instance[1:end] if end > 0 else instance
    host, sep, port = instance.rpartition(":")
    if sep and port.isdigit() and host and ":" not in host:
        return host
    return instance


def _fmt(ts: float) -> str:
    """A unix time as the API takes it (milliseconds at most)."""
    return f"{ts:.3f}".rstrip("0").rstrip(".")
