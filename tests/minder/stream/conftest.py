"""Shared fixtures of the Kafka layer tests: one real Tansu broker for the whole session."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from minder.core.records import NodeBatch, Sample

# kafka-python 3 loads its protocol schemas with importlib.resources.read_text, deprecated since
# Python 3.11; the warning is attributed to importlib, so pyproject's "kafka.*" filter misses it.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from minder.stream import BatchConsumer, EmbeddedBroker, ensure_topics

GPU_METRICS = (
    "gpu_util_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_gr_engine_active_ratio",
    "gpu_dram_active_ratio",
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_sm_clock_hertz",
    "gpu_memory_used_bytes",
    "gpu_pcie_tx_bytes_per_second",
    "gpu_pcie_rx_bytes_per_second",
    "gpu_nvlink_tx_bytes_per_second",
    "gpu_nvlink_rx_bytes_per_second",
    "gpu_ecc_sbe_count",
    "gpu_xid_count",
    "gpu_throttle_reasons",
)
NIC_METRICS = (
    "rdma_tx_bytes_per_second",
    "rdma_rx_bytes_per_second",
    "rdma_xmit_wait_per_second",
    "rdma_cnp_sent_per_second",
    "rdma_cnp_handled_per_second",
    "rdma_port_up",
    "pfc_tx_pause_per_second",
    "pfc_rx_pause_per_second",
)
HOST_METRICS = (
    "cpu_util_ratio",
    "memory_used_bytes",
    "disk_read_bytes_per_second",
    "disk_write_bytes_per_second",
    "net_tx_bytes_per_second",
    "net_rx_bytes_per_second",
)


def make_samples(seed: int, gpus: int = 8, nics: int = 2) -> list[Sample]:
    """150 canonical samples with the default sizes (8 GPUs x 16, 2 NICs x 8, 6 host)."""
    samples: list[Sample] = []
    for g in range(gpus):
        for i, name in enumerate(GPU_METRICS):
            value = 0.5 if name.endswith("_ratio") else float(seed % 97 + g + i)
            samples.append((name, f"gpu{g}", value))
    for n in range(nics):
        for name in NIC_METRICS:
            samples.append((name, f"mlx5_{n}", 1.0 if name == "rdma_port_up" else 1e9 + seed))
    for name in HOST_METRICS:
        samples.append((name, "", 0.25 if name.endswith("_ratio") else float(seed)))
    return samples


def _make_batch(job: str, node: str, ts: float, seed: int = 0, **kwargs: object) -> NodeBatch:
    return NodeBatch(
        job=job,
        node=node,
        ts=ts,
        labels={"group": "pp0", "domain": "leaf-1"},
        samples=make_samples(seed),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def topics(broker: EmbeddedBroker) -> tuple[str, str]:
    """A fresh metrics topic (3 partitions) and dead-letter topic for one test."""
    suffix = uuid.uuid4().hex[:8]
    metrics, deadletter = f"test.metrics.{suffix}", f"test.deadletter.{suffix}"
    ensure_topics(broker.bootstrap, {metrics: 3, deadletter: 1})
    return metrics, deadletter


# Tansu holds a JoinGroup for about half the session timeout: 3 s gives a 1.5 s join instead of
# the 5 s of the service default (10 s).
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


@pytest.fixture
def group_id() -> str:
    return f"test-group-{uuid.uuid4().hex[:8]}"


def _consume_until(
    consumer: BatchConsumer,
    handler: Callable[[list[NodeBatch]], object],
    done: Callable[[], bool],
    timeout_s: float = 20.0,
) -> None:
    """Poll (through the ~3 s group join) until ``done()`` or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"condition not met in {timeout_s} s: {consumer.stats}"
        consumer.poll_once(handler, timeout_ms=200)


BatchFactory = Callable[..., NodeBatch]
ConsumeUntil = Callable[..., None]
ConsumerFactory = Callable[..., BatchConsumer]


@pytest.fixture
def make_consumer(broker: EmbeddedBroker, topics: tuple[str, str]) -> Iterator[ConsumerFactory]:
    """``make_consumer(group_id, **options)``: a consumer of the test's topics, closed after."""
    made: list[BatchConsumer] = []

    def make(group_id: str, **options: object) -> BatchConsumer:
        metrics, deadletter = topics
        consumer = BatchConsumer(
            broker.bootstrap,
            group_id=group_id,
            topic=metrics,
            deadletter_topic=deadletter,
            **{**FAST_GROUP, **options},  # type: ignore[arg-type]
        )
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


@pytest.fixture
def make_batch() -> BatchFactory:
    """``make_batch(job, node, ts, seed=0, **fields)``: a batch of 150 samples."""
    return _make_batch


@pytest.fixture
def consume_until() -> ConsumeUntil:
    """``consume_until(consumer, handler, done, timeout_s=20)``."""
    return _consume_until


def _wire_view(batch: NodeBatch) -> tuple[object, ...]:
    """What a batch carries, comparable across encodings: packed batches (schema 2, the
    producers' default) hold float32 values, so every value is compared as a float32."""
    samples = [(m, d, float(np.float32(v))) for m, d, v in batch.all_samples()]
    return (batch.job, batch.node, batch.ts, batch.interval_s, batch.labels, samples, batch.events)


@pytest.fixture
def wire_view() -> Callable[[NodeBatch], tuple[object, ...]]:
    """``wire_view(batch)``: the batch's content, comparable whatever its encoding."""
    return _wire_view
