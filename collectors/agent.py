"""The node agent's collection step and its local Prometheus exposition.

:class:`Agent` runs every source once per interval and merges what they read into one
:class:`~minder.core.records.NodeBatch` (docs/architecture.md §3.2). It never lets one source spoil
the others: a source that raises is skipped for that interval (counted, logged once per source and
exception type), samples that fail :func:`~minder.core.metrics.validate_sample` are dropped
(counted per source, logged once per source and metric), and a second sample for the same
``(metric, device)`` is dropped in favour of the first (counted as ``duplicate``).

:class:`AgentExporter` is a prometheus_client custom collector on its own registry: it serves the
last batch as gauges ``minder_node_<metric>{device}`` plus the agent's own counters, and costs
nothing between scrapes. Sending (Kafka, spool) lives in ``minder.agent.runner``, which plugs its
counters in through :meth:`AgentExporter.set_sender`. :meth:`Agent.goodbye` builds the batch the
runner sends last on a clean stop (a ``leave`` event: the node leaves its job on purpose).

With a flight-recorder watcher (:class:`collectors.fr_watch.FrWatcher`) each collection also
polls the node's dump directory (the watcher lists it only every few seconds) and attaches the
summaries of new dumps to the batch (:attr:`~minder.core.records.NodeBatch.flight_recorder`), at
most :data:`~minder.core.hang.MAX_SUMMARIES_PER_BATCH` and
:data:`~collectors.fr_watch.MAX_BATCH_BYTES` per batch; the rest wait for the next batches.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from collectors.base import Collected, Source
from collectors.labels import Identity, check_label, discover_identity, parse_label
from minder.core.errors import ValidationError
from minder.core.metrics import MetricKind, MetricSpec, validate_sample, validate_value
from minder.core.records import Event, EventKind, NodeBatch, Sample

if TYPE_CHECKING:  # the watcher is imported by whoever builds it (the flight recorder's reader)
    from collectors.fr_watch import FrWatcher
    from minder.core.hang import RankSummary

__all__ = [
    "AGENT_REASONS",
    "Agent",
    "AgentExporter",
    "Identity",
    "SenderCounters",
    "discover_identity",
    "parse_label",
]

logger = logging.getLogger(__name__)

JOB_LABEL = "job_id"
"""Minder's job on every series (Prometheus owns ``job`` and ``instance``)."""

RESERVED_LABELS = frozenset({"job", "instance", JOB_LABEL, "machine", "device", "__name__"})
"""Agent labels left out of ``minder_agent_info``: Prometheus' own, and the ones set here."""

COUNT_SUFFIX = "_count"


def exported_count_name(metric: str) -> str:
    """``gpu_xid_count`` → ``minder_node_gpu_xid_total``: an event count per interval, exported
    as a counter since start (Prometheus reserves ``_count`` for histograms and summaries)."""
    return f"minder_node_{metric.removesuffix(COUNT_SUFFIX)}_total"


AGENT_REASONS = ("exception", "invalid_sample", "duplicate")
"""Reasons the agent itself counts per source, besides those of each source's ProblemLog."""


@dataclass(frozen=True, slots=True)
class SenderCounters:
    """What the sender reports to the agent's ``/metrics`` (see ``minder.agent.runner``).

    Attributes
    ----------
    batches_sent
        Batches the broker acknowledged.
    spooled
        Batches written to the on-disk spool.
    dropped_oldest
        Batches dropped from the spool, oldest first, because it was full.
    spool_bytes
        Bytes of batches in the spool now, not yet acknowledged.
    spool_batches
        Batches in the spool now.
    send_errors
        Failed delivery attempts (each retried later).
    corrupt_dropped
        Spooled records dropped because they could not be unframed (damaged or foreign).
    spool_max_bytes
        The spool's bound; beyond it the oldest batches are dropped.
    """

    batches_sent: int = 0
    spooled: int = 0
    dropped_oldest: int = 0
    spool_bytes: int = 0
    spool_batches: int = 0
    send_errors: int = 0
    corrupt_dropped: int = 0
    spool_max_bytes: int = 0


class Agent:
    """Collects one batch per interval from a node's sources.

    Parameters
    ----------
    sources
        The sources, run in this order; on a duplicate ``(metric, device)`` the first wins.
    job, node
        Identity of the batches (see :func:`~collectors.labels.discover_identity`).
    labels
        Placement and role labels (``group``, ``domain``, ``switch`` …).
    interval_s
        Collection interval, written into each batch.
    flight_recorder
        Watches the node's flight-recorder dumps; their summaries ride in the batches.

    Attributes
    ----------
    last_batch
        The latest batch (``None`` before the first collection).
    collections_total
        Calls of :meth:`collect_once` so far.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        job: str,
        node: str,
        labels: Mapping[str, str],
        interval_s: float = 1.0,
        flight_recorder: FrWatcher | None = None,
    ) -> None:
        if not job or not node:
            raise ValidationError(f"job {job!r} and node {node!r}: expected non-empty names")
        if not interval_s > 0:
            raise ValidationError(f"interval_s is {interval_s!r}: expected a positive number")
        names = [s.name for s in sources]
        if flight_recorder is not None:
            names.append(flight_recorder.name)
        if len(set(names)) != len(names):
            raise ValidationError(f"source names {names}: expected each source once")
        for key, value in labels.items():
            check_label(key, value)
        self.sources = tuple(sources)
        self.job = job
        self.node = node
        self.labels = dict(labels)
        self.interval_s = float(interval_s)
        self.flight_recorder = flight_recorder
        self.last_batch: NodeBatch | None = None
        self.collections_total = 0
        self._errors: Counter[tuple[str, str]] = Counter()
        self._seconds: dict[str, float] = {}
        self._seconds_total: Counter[str] = Counter()
        # Event counts per interval (metrics of kind "count"), summed since start for /metrics.
        self._count_totals: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()  # counters are read by the /metrics thread
        self._logged: set[tuple[str, str]] = set()
        # (metric, device) pairs already checked: the names and devices repeat every interval,
        # so only the value is checked after the first time.
        self._specs: dict[tuple[str, str], MetricSpec] = {}

    def collect_once(self, now: float) -> NodeBatch:
        """Run every source at ``now`` (unix seconds) and return the merged, checked batch."""
        samples: list[Sample] = []
        events: list[Event] = []
        seen: set[tuple[str, str]] = set()
        errors: Counter[tuple[str, str]] = Counter()
        counts: dict[tuple[str, str], float] = {}
        seconds: dict[str, float] = {}
        specs = self._specs
        for source in self.sources:
            started = time.perf_counter()
            try:
                collected = source.collect(now)
                if not isinstance(collected, Collected):
                    raise TypeError(f"collect() returned {type(collected).__name__}")
            except Exception as exc:
                # A source bug must not stop the node's other metrics: skip it this interval.
                errors[(source.name, "exception")] += 1
                self._log_once(
                    source.name,
                    f"exception:{type(exc).__name__}",
                    "source %s raised %r; it is skipped each time it raises (counted, logged "
                    "once per exception type)",
                    source.name,
                    exc,
                )
                continue
            finally:
                seconds[source.name] = time.perf_counter() - started
            for metric, device, value in collected.samples:
                key = (metric, device)
                if key in seen:
                    errors[(source.name, "duplicate")] += 1
                    self._log_once(
                        source.name,
                        f"duplicate:{metric}",
                        "source %s: second sample for %s{device=%r} dropped, the first kept",
                        source.name,
                        metric,
                        device,
                    )
                    continue
                spec = specs.get(key)
                # A known pair with a float in range (bounds are finite: NaN and inf fail)
                # needs no further check; anything else takes the check that names the fault.
                if (
                    spec is None
                    or value.__class__ is not float
                    or not (spec.lower <= value <= spec.upper)
                ):
                    spec = self._valid(source.name, metric, device, value)
                    if spec is None:
                        errors[(source.name, "invalid_sample")] += 1
                        continue
                seen.add(key)
                samples.append((metric, device, float(value)))
                if spec.kind is MetricKind.COUNT:
                    counts[key] = counts.get(key, 0.0) + float(value)
            events.extend(collected.events)
        summaries = [] if self.flight_recorder is None else self._summaries(now, errors, seconds)
        batch = NodeBatch(
            job=self.job,
            node=self.node,
            ts=now,
            interval_s=self.interval_s,
            labels=dict(self.labels),
            samples=samples,
            events=events,
            flight_recorder=summaries,
        )
        with self._lock:
            self._errors.update(errors)
            self._seconds = seconds
            self._seconds_total.update(seconds)
            for key, value in counts.items():
                self._count_totals[key] = self._count_totals.get(key, 0.0) + value
            self.collections_total += 1
            self.last_batch = batch
        return batch

    def _summaries(
        self, now: float, errors: Counter[tuple[str, str]], seconds: dict[str, float]
    ) -> list[RankSummary]:
        """Poll the flight-recorder watcher and take what the batch may carry."""
        watcher = self.flight_recorder
        assert watcher is not None
        started = time.perf_counter()
        try:
            watcher.poll(now)
        except Exception as exc:  # a bug; what it summarised before still goes out
            errors[(watcher.name, "exception")] += 1
            self._log_once(
                watcher.name,
                f"exception:{type(exc).__name__}",
                "the flight-recorder watcher raised %r; it is skipped each time it raises "
                "(counted, logged once per exception type)",
                exc,
            )
        finally:
            seconds[watcher.name] = time.perf_counter() - started
        return watcher.take() if watcher.pending else []

    def give_back(self, batch: NodeBatch) -> None:
        """Keep ``batch``'s flight-recorder summaries for the next batch (it was not spooled)."""
        if batch.flight_recorder and self.flight_recorder is not None:
            self.flight_recorder.give_back(batch.flight_recorder)

    def goodbye(self, now: float, reason: str) -> NodeBatch:
        """The last batch of a clean stop: no samples, one ``leave`` event (``device=""``).

        It tells the detection service that the node leaves its job on purpose (not a fault):
        the service drops the node until it reports again. ``reason`` ends up in the event's
        message (``"agent stopped: SIGTERM"``). Nothing of the agent changes (``last_batch``
        and the counters stay those of the last collection), except that flight-recorder
        summaries still waiting for a batch ride in this one.
        """
        if not reason:
            raise ValidationError("goodbye reason is empty: expected why the agent stopped")
        watcher = self.flight_recorder
        return NodeBatch(
            job=self.job,
            node=self.node,
            ts=now,
            interval_s=self.interval_s,
            labels=dict(self.labels),
            samples=[],
            events=[Event(EventKind.LEAVE, device="", ts=now, message=f"agent stopped: {reason}")],
            flight_recorder=watcher.take() if watcher is not None and watcher.pending else [],
        )

    def _valid(self, source: str, metric: str, device: str, value: float) -> MetricSpec | None:
        try:
            spec = self._specs.get((metric, device))
            if spec is None:
                spec = validate_sample(metric, device, value)
                finite = math.isfinite(spec.lower) and math.isfinite(spec.upper)
                if len(self._specs) < 100_000 and finite:  # (the fast path relies on it)
                    self._specs[(metric, device)] = spec
            else:
                validate_value(spec, value)
        except (ValidationError, TypeError) as exc:  # TypeError: a name that is not a string
            self._log_once(
                source,
                f"invalid:{metric}",
                "source %s: sample dropped (%s); further invalid %s samples are counted, "
                "not logged",
                source,
                exc,
                metric,
            )
            return None
        return spec

    def _log_once(self, source: str, what: str, message: str, *args: object) -> None:
        if (source, what) in self._logged:
            return
        if len(self._logged) < 10_000:  # bounded: a source inventing metric names cannot grow it
            self._logged.add((source, what))
        logger.warning(message, *args)

    def error_counts(self) -> dict[tuple[str, str], int]:
        """Problems since start by ``(source, reason)``: the sources' own and the agent's."""
        with self._lock:
            counts = dict(self._errors)
        problem_logs = [(s.name, s.problems) for s in self.sources]
        if self.flight_recorder is not None:
            problem_logs.append((self.flight_recorder.name, self.flight_recorder.problems))
        for name, problems in problem_logs:
            for reason, count in dict(problems.counts).items():
                counts[(name, reason)] = counts.get((name, reason), 0) + count
        return counts

    def count_totals(self) -> dict[tuple[str, str], float]:
        """Events since start per ``(metric, device)`` of the metrics of kind ``count``."""
        with self._lock:
            return dict(self._count_totals)

    def collect_seconds(self) -> dict[str, float]:
        """Duration of each source's last ``collect`` (seconds)."""
        with self._lock:
            return dict(self._seconds)

    def collect_seconds_total(self) -> dict[str, float]:
        """Total time spent in each source's ``collect`` since start (seconds)."""
        with self._lock:
            return dict(self._seconds_total)

    def close(self) -> None:
        """Close every source (and the watcher); one that fails to close is logged, the others
        still close."""
        closing: list[Source | FrWatcher] = list(self.sources)
        if self.flight_recorder is not None:
            closing.append(self.flight_recorder)
        for source in closing:
            try:
                source.close()
            except Exception as exc:
                logger.warning("source %s failed to close: %r", source.name, exc)


class AgentExporter(Collector):
    """The agent's ``/metrics``: the last batch as gauges, plus the agent's own counters.

    Registered on its own :class:`~prometheus_client.CollectorRegistry` (:attr:`registry`), not
    the process-global one, so tests and several agents in one process do not collide. Series:

    Every series carries ``job_id`` and ``machine`` (never ``job``/``instance``, which
    Prometheus owns), so peers can be compared in PromQL without a join:

    - ``minder_node_<metric>{device}``: the last batch's gauges and rates (host metrics have
      ``device=""``);
    - ``minder_node_<name>_total{device}`` for each ``<name>_count`` metric: events since the
      agent started (use ``increase()``);
    - ``minder_agent_info{<labels>}`` = 1 with the agent's placement labels;
    - ``minder_agent_collections_total``, ``minder_agent_last_collection_timestamp_seconds``;
    - ``minder_agent_source_errors_total{source,reason}``;
    - ``minder_agent_collect_seconds{source}`` (last duration) and
      ``minder_agent_collect_duration_seconds_total{source}``;
    - with a flight-recorder watcher: ``minder_agent_flight_recorder_summaries_total`` (dumps
      summarised) and ``minder_agent_flight_recorder_pending`` (summaries waiting for a batch);
      the files it skipped are in ``minder_agent_source_errors_total{source="flight_recorder"}``;
    - with a sender: ``minder_agent_batches_sent_total``, ``minder_agent_spooled_total``,
      ``minder_agent_dropped_oldest_total``, ``minder_agent_send_errors_total``,
      ``minder_agent_corrupt_dropped_total``, ``minder_agent_spool_bytes``,
      ``minder_agent_spool_batches`` and ``minder_agent_spool_max_bytes``.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._sender: Callable[[], SenderCounters] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: WSGIServer | None = None

    def set_sender(self, counters: Callable[[], SenderCounters] | None) -> None:
        """Export the sender's counters, read from ``counters()`` at each scrape."""
        self._sender = counters

    def collect(self) -> Iterator[Metric]:
        """Build the metrics at scrape time (prometheus_client's custom collector protocol)."""
        agent = self.agent
        batch = agent.last_batch
        ids = [JOB_LABEL, "machine"]
        values = [agent.job, agent.node]
        extra = {k: v for k, v in agent.labels.items() if k not in RESERVED_LABELS}
        info = GaugeMetricFamily(
            "minder_agent_info", "Identity of this node agent", labels=[*ids, *extra]
        )
        info.add_metric([*values, *extra.values()], 1.0)
        yield info
        if batch is not None:
            families: dict[str, GaugeMetricFamily] = {}
            for metric, device, value in batch.samples:
                if metric.endswith(COUNT_SUFFIX):
                    continue  # exported below as a counter of events since start
                family = families.get(metric)
                if family is None:
                    family = families[metric] = GaugeMetricFamily(
                        f"minder_node_{metric}",
                        f"{metric} of the last batch (docs/architecture.md §3.1)",
                        labels=[*ids, "device"],
                    )
                family.add_metric([*values, device], value)
            yield from families.values()
            last = GaugeMetricFamily(
                "minder_agent_last_collection_timestamp_seconds",
                "Unix time of the last batch",
                labels=ids,
            )
            last.add_metric(values, batch.ts)
            yield last
        counters: dict[str, CounterMetricFamily] = {}
        for (metric, device), total in sorted(agent.count_totals().items()):
            name = exported_count_name(metric)
            family_c = counters.get(name)
            if family_c is None:
                family_c = counters[name] = CounterMetricFamily(
                    name,
                    f"Events counted by {metric} since the agent started (use increase())",
                    labels=[*ids, "device"],
                )
            family_c.add_metric([*values, device], total)
        yield from counters.values()
        collections = CounterMetricFamily(
            "minder_agent_collections", "Collections the agent ran since start", labels=ids
        )
        collections.add_metric(values, agent.collections_total)
        yield collections
        errors = CounterMetricFamily(
            "minder_agent_source_errors",
            "Problems by source and reason (sources' own reasons, exception, invalid_sample, "
            "duplicate)",
            labels=[*ids, "source", "reason"],
        )
        # Every source's "exception" exists from the start (at 0), so rates exist before errors.
        counts = {(source.name, "exception"): 0 for source in agent.sources}
        watcher = agent.flight_recorder
        if watcher is not None:
            counts.update({(watcher.name, r): 0 for r in ("exception", "not_a_dump")})
        counts.update(agent.error_counts())
        for (source, reason), count in sorted(counts.items()):
            errors.add_metric([*values, source, reason], count)
        yield errors
        last_seconds = GaugeMetricFamily(
            "minder_agent_collect_seconds",
            "Duration of each source's last collection",
            labels=[*ids, "source"],
        )
        for source, seconds in sorted(agent.collect_seconds().items()):
            last_seconds.add_metric([*values, source], seconds)
        yield last_seconds
        total_seconds = CounterMetricFamily(
            "minder_agent_collect_duration_seconds",
            "Time spent in each source's collection since start",
            labels=[*ids, "source"],
        )
        for source, seconds in sorted(agent.collect_seconds_total().items()):
            total_seconds.add_metric([*values, source], seconds)
        yield total_seconds
        if watcher is not None:
            summaries = CounterMetricFamily(
                "minder_agent_flight_recorder_summaries",
                "Flight-recorder dumps summarised for the batches since start",
                labels=ids,
            )
            summaries.add_metric(values, watcher.summaries_total)
            yield summaries
            pending = GaugeMetricFamily(
                "minder_agent_flight_recorder_pending",
                "Flight-recorder summaries waiting for a batch",
                labels=ids,
            )
            pending.add_metric(values, watcher.pending)
            yield pending
        if self._sender is not None:
            yield from _sender_metrics(self._sender(), ids, values)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve :attr:`registry` on ``http://addr:port/metrics`` from a daemon thread."""
        from prometheus_client import start_http_server  # noqa: PLC0415

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        logger.info("agent metrics on http://%s:%d/metrics", addr, server.server_port)

    @property
    def port(self) -> int | None:
        """The port :meth:`serve` listens on (useful with port 0), or None."""
        return None if self._server is None else int(self._server.server_port)

    def shutdown(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _sender_metrics(
    counters: SenderCounters, labels: list[str], values: list[str]
) -> Iterator[Metric]:
    for name, help_text in (
        ("batches_sent", "Batches the broker acknowledged"),
        ("spooled", "Batches written to the on-disk spool"),
        ("dropped_oldest", "Batches dropped from the full spool, oldest first"),
        ("send_errors", "Failed delivery attempts (retried)"),
        ("corrupt_dropped", "Spooled records dropped because they could not be unframed"),
    ):
        family = CounterMetricFamily(f"minder_agent_{name}", help_text, labels=labels)
        family.add_metric(values, getattr(counters, name))
        yield family
    for name, help_text in (
        ("spool_bytes", "Bytes of unsent batches in the spool"),
        ("spool_batches", "Unsent batches in the spool"),
        ("spool_max_bytes", "Bound of the spool; beyond it the oldest batches are dropped"),
    ):
        gauge = GaugeMetricFamily(f"minder_agent_{name}", help_text, labels=labels)
        gauge.add_metric(values, getattr(counters, name))
        yield gauge
