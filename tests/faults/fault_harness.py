"""The fault suite's harness (its fixtures are in ``conftest.py``): a real Tansu broker, the
real service (``build_stack``: worker, store, API on a loopback port) and a healthy job with one
injected fault.

Every case feeds the healthy job before and after its hostile input and asserts that the
worker kept consuming the healthy job's partition and raised the injected fault's alert on time.
The figures each case measures (stall seconds, RSS growth, alert delay, series counts) go to
``$MINDER_FAULT_FIGURES`` (JSON lines) when it is set, for ``bench/faults_figures.py``; the
tests print nothing.

Settings are given as a nested mapping (``Settings.model_validate``), which ignores keys an
older version of the service does not know, so the suite also runs against an older tree (put
on ``PYTHONPATH``) to measure the figures before a change.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from collectors.sim.output import iter_batches
from collectors.sim.scenario import Scenario
from minder.config import Settings
from minder.core.alert import Alert
from minder.core.codec import encode_batch
from minder.core.errors import BrokerError
from minder.core.records import NodeBatch
from minder.core.signing import ClusterKey, FleetSigner, format_cluster_keys, write_secret_file
from minder.service.stack import Stack, build_stack

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.errors import KafkaError
    from kafka.partitioner.default import murmur2
    from kafka.structs import TopicPartition

    from minder.stream import EmbeddedBroker
    from minder.stream.broker import free_port, resolve_tansu_binary

FIGURES_ENV = "MINDER_FAULT_FIGURES"
PARTITIONS = 2
HEALTHY = "healthy"
"""The healthy job: 8 machines, an XID on machine 3 (``FAULTY``) at second ``FAULT_S``."""
FAULTY = "healthy-n0003"
WARMUP_S = 10
"""Seconds of the healthy job sent before the hostile input."""
FAULT_S = 16
DURATION_S = 24
ON_TIME_S = 15.0
"""Most wall seconds from sending the fault's data to its alert (a loaded 2-core machine
included; about 1 s on an idle one)."""


def broker_unavailable() -> str | None:
    """Why the embedded broker cannot run here (a reason to skip on), or ``None``."""
    try:
        resolve_tansu_binary()
    except BrokerError as exc:
        return str(exc)
    return None


def partition_of(key: str, partitions: int = PARTITIONS) -> int:
    """The partition kafka-python's default partitioner gives ``key``."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


HEALTHY_PARTITION = partition_of(HEALTHY)
HOSTILE_PARTITION = 1 - HEALTHY_PARTITION
"""Where the hostile input goes: the other partition, which one worker also owns."""


def healthy_scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "seed": 13,
            "duration_s": DURATION_S,
            "jobs": [{"name": HEALTHY, "machines": 8, "machines_per_domain": 8}],
            "faults": [
                {"type": "gpu_xid", "job": HEALTHY, "machine": 3, "device": "gpu1"}
                | {"start_s": FAULT_S, "duration_s": DURATION_S}
            ],
        }
    )


class Figures:
    """What a case measured, appended to ``$MINDER_FAULT_FIGURES`` when it is set."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.path = os.environ.get(FIGURES_ENV)

    def record(self, figure: str, value: float | None, unit: str) -> None:
        if not self.path:
            return
        line = {"test": self.test, "figure": figure, "value": value, "unit": unit}
        with Path(self.path).open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def wait_until(predicate: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> float | None:
    """Seconds until ``predicate()`` held, or ``None`` if it did not within ``timeout_s``."""
    started = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(poll_s)


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


@dataclass(frozen=True, slots=True)
class Healthy:
    """How the healthy job fared: seconds from sending its last data until its partition was
    consumed and until its fault's alert (``None``: not within the wait)."""

    consumed_s: float | None
    alert_s: float | None

    def on_time(self, bound_s: float = ON_TIME_S) -> bool:
        return self.consumed_s is not None and self.alert_s is not None and self.alert_s < bound_s


class FaultService:
    """The service under test, its topics and the healthy job's feed."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        tmp_path: Path,
        actuator: object | None = None,
        **sections: dict[str, Any],
    ) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.broker = broker
        self.topic = f"faults-metrics-{suffix}"
        self.deadletter_topic = f"faults-dead-{suffix}"
        self.group = f"faults-{suffix}"
        tree: dict[str, dict[str, Any]] = {
            "kafka": {
                "bootstrap": broker.bootstrap,
                "metrics_topic": self.topic,
                "alerts_topic": f"faults-alerts-{suffix}",
                "deadletter_topic": self.deadletter_topic,
                "group_id": self.group,
                "partitions": PARTITIONS,
                # Tansu holds a join for half the session timeout: 3 s gives a 1.5 s join
                "session_timeout_ms": 3000,
                "heartbeat_interval_ms": 500,
            },
            "database": {"url": f"sqlite:///{tmp_path / 'minder.db'}"},
            "api": {"port": free_port()},
            # Batches are signed as the agents sign them (the default mode requires it).
            "auth": {"keys_file": str(tmp_path / "cluster.keys")},
        }
        for name, values in sections.items():
            tree[name] = {**tree.get(name, {}), **values}
        self.cluster_key = ClusterKey.generate("faults")
        write_secret_file(tmp_path / "cluster.keys", format_cluster_keys([self.cluster_key]))
        self.signer = FleetSigner(self.cluster_key)
        self.settings = Settings.model_validate(tree)
        self.stack: Stack = build_stack(
            self.settings, registry=CollectorRegistry(), actuator=actuator
        )
        self.producer = KafkaProducer(
            bootstrap_servers=broker.bootstrap,
            enable_idempotence=False,  # Tansu refuses idempotent produce requests
            max_request_size=4 << 20,  # a producer that sends what Minder's own would refuse
            linger_ms=5,
        )
        self.admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        self._sent: list[Any] = []
        self._ends = dict.fromkeys(range(PARTITIONS), 0)
        self.scenario = healthy_scenario()
        # dated so that its last second is a second ago: live data, never in the future
        self.seconds = [
            batches
            for _, batches in iter_batches(self.scenario, start_ts=time.time() - DURATION_S - 1)
        ]
        self.start_ts = self.seconds[0][0].ts

    @property
    def api(self) -> str:
        return self.stack.api_url

    def start(self) -> FaultService:
        self.stack.start()
        return self

    def close(self) -> None:
        self.producer.close()
        self.admin.close()
        self.stack.stop()

    # -- input --------------------------------------------------------------------------------

    def send(self, batches: list[NodeBatch], partition: int | None = None) -> None:
        """Send ``batches`` signed, each with its node's key (as its agent would)."""
        for batch in batches:
            payload = encode_batch(batch)
            signature = self.signer.header(batch.node, payload) if len(batch.node) <= 256 else None
            headers = None if signature is None else [signature]
            self.send_raw(payload, batch.job[:1024].encode(), partition, headers)

    def send_raw(
        self,
        payload: bytes,
        key: bytes,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        future = self.producer.send(
            self.topic, value=payload, key=key, partition=partition, headers=headers
        )
        self._sent.append(future)

    def flush(self) -> None:
        """Wait for the broker to take what was sent, and note each partition's end offset."""
        self.producer.flush(30)
        for future in self._sent:
            written = future.get(timeout=30)
            self._ends[written.partition] = max(self._ends[written.partition], written.offset + 1)
        self._sent.clear()

    def feed_healthy(self, first: int, last: int) -> float:
        """Send the healthy job's seconds ``[first, last)``; the monotonic time they were sent."""
        for batches in self.seconds[first:last]:
            self.send(batches)
        self.flush()
        return time.monotonic()

    def warm_up(self) -> None:
        """The healthy job's first seconds, consumed: the job exists, the worker has joined."""
        self.feed_healthy(0, WARMUP_S)
        waited = wait_until(lambda: self.consumed(HEALTHY_PARTITION), 60)
        assert waited is not None, "the warm-up was never consumed"

    # -- observation --------------------------------------------------------------------------

    def end_offsets(self) -> dict[int, int]:
        """Each partition's offset after the last message this harness wrote (Tansu's own
        end offsets count produce requests, not messages)."""
        self.flush()
        return dict(self._ends)

    def broker_restarted(self) -> None:
        """Tansu keeps everything in memory: after a restart, offsets start from 0 again."""
        self._sent.clear()
        self._ends = dict.fromkeys(range(PARTITIONS), 0)

    def committed(self, partition: int) -> int:
        """The group's committed offset of ``partition`` (0 when none, or while the broker
        cannot be asked: it is restarting)."""
        tp = TopicPartition(self.topic, partition)
        try:
            offsets = self.admin.list_group_offsets({self.group: [tp]})
        except KafkaError:
            return 0
        found = offsets.get(self.group, {}).get(tp)
        return 0 if found is None or found.offset < 0 else int(found.offset)

    def consumed(self, partition: int) -> bool:
        """Whether the worker committed everything ``partition`` holds."""
        return self.committed(partition) >= self.end_offsets()[partition]

    def alert_on(self, machine: str) -> Alert | None:
        return next((a for a in list(self.stack.service.alerts) if a.machine == machine), None)

    def fault_then_alert(self, figures: Figures, timeout_s: float = 60.0) -> Healthy:
        """Send the healthy job's remaining seconds (its fault among them) and measure the
        seconds until its partition is consumed (the stall figure) and until the fault's alert
        (the delay figure)."""
        sent = self.feed_healthy(WARMUP_S, DURATION_S)
        consumed = wait_until(lambda: self.consumed(HEALTHY_PARTITION), timeout_s)
        figures.record("healthy partition consumed after", consumed, "s")
        alerted = wait_until(lambda: self.alert_on(FAULTY) is not None, timeout_s)
        delay = None if alerted is None else time.monotonic() - sent
        figures.record("healthy alert delay", delay, "s")
        return Healthy(consumed, delay)

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The service's ``/metrics``, scraped over HTTP: series name -> (labels, value)."""
        text = httpx.get(f"{self.api}/metrics", timeout=10).text
        series: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series.setdefault(sample.name, []).append((sample.labels, sample.value))
        return series

    def metric(self, name: str, **labels: str) -> float | None:
        for found, value in self.metrics().get(name, []):
            if all(found.get(k) == v for k, v in labels.items()):
                return value
        return None
