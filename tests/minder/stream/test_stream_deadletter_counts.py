"""Dead letters on the real broker: a message whose dead letter needs several polls is counted
once in ``minder_decode_failures_total``, and every dead letter carries the SHA-256 and size of
the whole original payload, a truncated one (its first 64 KiB) included."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError
from prometheus_client import CollectorRegistry

import minder.stream.consumer as consumer_module
from detectors.methods import default_factory
from minder.core.codec import encode_batch
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.service.runner import DetectionWorker
from minder.service.telemetry import ServiceMetrics
from minder.stream import BatchConsumer, EmbeddedBroker, read_dead_letters

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0
BatchFactory = Callable[..., NodeBatch]
ConsumerFactory = Callable[..., BatchConsumer]


def _send(broker: EmbeddedBroker, topic: str, payloads: list[bytes], key: bytes) -> None:
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, enable_idempotence=False, max_request_size=4 << 20
    )
    try:
        for payload in payloads:
            producer.send(topic, value=payload, key=key)
        producer.flush(10)
    finally:
        producer.close()


def test_a_message_dead_lettered_after_a_failed_write_is_counted_once(
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    group_id: str,
    make_batch: BatchFactory,
    make_consumer: ConsumerFactory,
) -> None:
    metrics, deadletter = topics
    good: NodeBatch = make_batch("jc", "n0", T0)
    _send(broker, metrics, [b"junk", encode_batch(good)], key=b"jc")
    consumer = make_consumer(group_id)
    real_send = consumer._deadletters.send
    calls = 0

    def fails_first(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KafkaTimeoutError("broker busy")
        return real_send(*args, **kwargs)

    consumer._deadletters.send = fails_first
    registry = CollectorRegistry()
    service = DetectionService(default_factory(), metrics=ServiceMetrics(registry))
    worker = DetectionWorker(consumer, service)
    deadline = time.monotonic() + 30
    while consumer.stats.handled == 0:
        assert time.monotonic() < deadline, consumer.stats
        worker.poll(timeout_ms=200)
    stats = consumer.stats
    # the junk was decoded (and refused) by two polls: the failed one and its retry
    assert calls == 2 and stats.deadletter_failures == 1 and stats.dead_lettered == 1
    assert +stats.decode_failures_by_reason == {"undecodable": 1}
    exported = registry.get_sample_value("minder_decode_failures_total", {"reason": "undecodable"})
    assert exported == 1
    assert [d.payload for d in read_dead_letters(broker.bootstrap, deadletter)] == [b"junk"]


def test_dead_letters_carry_the_sha256_and_size_of_the_whole_payload(
    broker: EmbeddedBroker,
    topics: tuple[str, str],
    group_id: str,
    make_batch: BatchFactory,
    make_consumer: ConsumerFactory,
) -> None:
    metrics, deadletter = topics
    good: NodeBatch = make_batch("jh", "n0", T0)
    # 1.5 MiB of garbage (over the dead-letter producer's 1 MiB limit), not one repeated byte,
    # so a hash of the kept prefix cannot pass for the hash of the whole
    big = b"\xc1" + hashlib.shake_256(b"minder").digest(1536 * 1024 - 1)
    small = b"\xc1 small junk"
    _send(broker, metrics, [big, small, encode_batch(good)], key=b"jh")
    consumer = make_consumer(group_id)
    handled: list[NodeBatch] = []
    deadline = time.monotonic() + 30
    while not handled:
        assert time.monotonic() < deadline, consumer.stats
        consumer.poll_once(handled.extend, timeout_ms=200)
    # the small one is written by the first poll, the big one truncated by its retry
    letters = read_dead_letters(broker.bootstrap, deadletter)
    truncated, whole = sorted(letters, key=lambda d: d.source_offset)
    kept = consumer_module.TRUNCATED_BYTES
    assert kept == 64 * 1024
    assert truncated.source_offset == 0 and truncated.truncated
    assert truncated.payload == big[:kept]
    assert truncated.payload_bytes == len(big)
    assert truncated.payload_sha256 == hashlib.sha256(big).hexdigest()
    assert truncated.payload_sha256 != hashlib.sha256(truncated.payload).hexdigest()
    assert whole.source_offset == 1 and not whole.truncated and whole.payload == small
    assert whole.payload_bytes == len(small)
    assert whole.payload_sha256 == hashlib.sha256(small).hexdigest()
    assert +consumer.stats.decode_failures_by_reason == {"undecodable": 2}  # each one once
