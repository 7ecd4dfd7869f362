"""The simulated machines' ``/metrics``, as their node agents would serve them.

``minder simulate --kafka … --metrics-port P`` publishes a scenario's batches and serves, for
every simulated machine, what its agent's ``/metrics`` would hold (:class:`AgentExporter`): the
gauges and rates of its newest batch as ``minder_node_<metric>{job_id, machine, device}`` (per
GPU, NIC, rank, or ``device=""`` for host metrics; the per-rank step signals too:
``train_step_seconds``, ``train_busy_seconds``, ``nccl_collective_seconds``,
``train_step_number`` when the job emits them), and each ``<name>_count`` metric as a counter
``minder_node_<name>_total`` of the events since the start. So Prometheus can scrape a simulated
job, and the job dashboard's "metric against its peers" panels have data, as for a real job.

A machine that fell silent (no batch for :data:`STALE_S` seconds of data time while others
report) or said goodbye leaves the exposition, as a dead agent leaves Prometheus' targets.
The agents' own series (``minder_agent_*``) are not served: no agent runs here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from collectors.agent import COUNT_SUFFIX, JOB_LABEL, exported_count_name
from minder.core.records import EventKind, NodeBatch

logger = logging.getLogger(__name__)

STALE_S = 10.0
"""A machine without a batch for this long (data time, behind the newest batch of any machine)
is left out: late batches come at most 3 s behind (collectors.sim.delivery)."""

LABELS = [JOB_LABEL, "machine", "device"]


@dataclass(slots=True)
class _Machine:
    ts: float
    samples: list[tuple[str, str, float]]
    counts: dict[tuple[str, str], float] = field(default_factory=dict)


class SimulationExporter(Collector):
    """Serves the newest batch of every simulated machine (see the module); thread-safe:
    :meth:`update` runs in the publishing loop, :meth:`collect` in the HTTP server's thread."""

    def __init__(self, stale_s: float = STALE_S) -> None:
        self.stale_s = stale_s
        self._machines: dict[tuple[str, str], _Machine] = {}
        self._newest = float("-inf")
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def update(self, batches: Iterable[NodeBatch]) -> None:
        """Take the batches just published (a late one older than its machine's newest only
        adds its events to the counters)."""
        with self._lock:
            for batch in batches:
                key = (batch.job, batch.node)
                if any(e.kind is EventKind.LEAVE for e in batch.events):
                    self._machines.pop(key, None)  # goodbye: the agent stopped
                    continue
                samples = batch.all_samples()
                machine = self._machines.get(key)
                if machine is None:
                    machine = self._machines[key] = _Machine(batch.ts, [])
                gauges = []
                for metric, device, value in samples:
                    if metric.endswith(COUNT_SUFFIX):
                        counted = (metric, device)
                        machine.counts[counted] = machine.counts.get(counted, 0.0) + value
                    else:
                        gauges.append((metric, device, value))
                if batch.ts >= machine.ts:
                    machine.ts, machine.samples = batch.ts, gauges
                self._newest = max(self._newest, batch.ts)

    def machines(self) -> list[tuple[str, str]]:
        """``(job, machine)`` of the machines served now."""
        with self._lock:
            return sorted(k for k, m in self._machines.items() if self._live(m))

    def _live(self, machine: _Machine) -> bool:
        return machine.ts >= self._newest - self.stale_s

    def collect(self) -> Iterator[Metric]:
        """Build the exposition at scrape time (prometheus_client's custom collector protocol)."""
        with self._lock:
            live = [(k, m) for k, m in sorted(self._machines.items()) if self._live(m)]
            gauges: dict[str, GaugeMetricFamily] = {}
            counters: dict[str, CounterMetricFamily] = {}
            for (job, node), machine in live:
                for metric, device, value in machine.samples:
                    family = gauges.get(metric)
                    if family is None:
                        family = gauges[metric] = GaugeMetricFamily(
                            f"minder_node_{metric}",
                            f"{metric} of the simulated machine's newest batch",
                            labels=LABELS,
                        )
                    family.add_metric([job, node, device], value)
                for (metric, device), total in sorted(machine.counts.items()):
                    name = exported_count_name(metric)
                    counter = counters.get(name)
                    if counter is None:
                        counter = counters[name] = CounterMetricFamily(
                            name,
                            f"Events counted by {metric} since the simulation started",
                            labels=LABELS,
                        )
                    counter.add_metric([job, node, device], total)
        yield from gauges.values()
        yield from counters.values()

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve :attr:`registry` on ``http://addr:port/metrics`` from a daemon thread; the
        port bound (``port`` 0: a free one)."""
        from prometheus_client import start_http_server  # noqa: PLC0415

        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        bound = int(self._server.server_port)
        logger.info("simulated machines' metrics on http://%s:%d/metrics", addr, bound)
        return bound

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
