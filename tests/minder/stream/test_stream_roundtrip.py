"""Producing NodeBatches and alerts, consuming them back through a real broker."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import orjson
import pytest
from kafka import KafkaConsumer, TopicPartition

from minder.core.alert import Alert, AlertKind
from minder.core.codec import WireFormat
from minder.core.errors import BrokerError, ValidationError
from minder.core.records import Event, EventKind, NodeBatch
from minder.stream import (
    AlertPublisher,
    BatchConsumer,
    BatchProducer,
    EmbeddedBroker,
    JsonPublisher,
    ensure_topics,
    free_port,
)

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0


def test_round_trip_keeps_every_batch_and_the_order_within_a_job(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until, wire_view
) -> None:
    metrics, _ = topics
    sent: dict[str, list[NodeBatch]] = defaultdict(list)
    # Two encodings on the wire at once: the decoder recognises each message's own.
    with (
        BatchProducer(broker.bootstrap, topic=metrics) as packed,
        BatchProducer(broker.bootstrap, topic=metrics, fmt=WireFormat.JSON) as json_producer,
    ):
        for second in range(5):
            for j in range(4):
                job = f"job{j}"
                for n in range(3):
                    events = (
                        [Event(EventKind.XID, "gpu3", T0 + second, code=79, message="fell off")]
                        if (j, n, second) == (1, 2, 3)
                        else []
                    )
                    batch = make_batch(job, f"n{n:04d}", T0 + second, seed=n, events=events)
                    (json_producer if j == 3 else packed).send(batch)
                    sent[job].append(batch)
        packed.flush(10)
        json_producer.flush(10)
        assert packed.stats.delivered == 45
        assert json_producer.stats.delivered == 15
        assert packed.stats.failed == json_producer.stats.failed == 0

    received: dict[str, list[NodeBatch]] = defaultdict(list)
    calls: list[int] = []

    def handler(batches: list[NodeBatch]) -> None:
        calls.append(len(batches))
        for batch in batches:
            received[batch.job].append(batch)

    now = T0 + 100.0
    with make_consumer(group_id, clock=lambda: now) as consumer:
        consume_until(consumer, handler, lambda: sum(map(len, received.values())) >= 60)
        assert consumer.assignment() == {(metrics, p) for p in range(3)}
        stats = consumer.stats

    # Same batches, and each job's in the order sent.
    assert {job: [wire_view(b) for b in batches] for job, batches in received.items()} == {
        job: [wire_view(b) for b in batches] for job, batches in sent.items()
    }
    assert {b.schema for b in received["job0"]} == {2} and {b.schema for b in received["job3"]} == {
        1
    }
    (with_event,) = [b for b in received["job1"] if b.events]
    assert with_event.events == [Event(EventKind.XID, "gpu3", T0 + 3, code=79, message="fell off")]
    assert sum(calls) == 60
    assert (stats.consumed, stats.decoded, stats.handled, stats.dead_lettered) == (60, 60, 60, 0)
    assert stats.commits == len(calls)
    assert stats.commit_failures == stats.handler_failures == 0
    assert stats.last_batch_ts == T0 + 4
    assert stats.last_lag_s == pytest.approx(now - (T0 + 4))
    assert stats.backlog_messages == 0


def test_one_job_stays_in_one_partition(broker: EmbeddedBroker, topics, make_batch) -> None:
    metrics, _ = topics
    with BatchProducer(broker.bootstrap, topic=metrics) as producer:
        for second in range(3):
            for job in ("a", "b", "c", "d", "e"):
                producer.send(make_batch(job, "n0", T0 + second))
        producer.flush(10)
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=100)
    try:
        tps = [TopicPartition(metrics, p) for p in range(3)]
        reader.assign(tps)
        reader.seek_to_beginning(*tps)
        partitions_of: dict[bytes, set[int]] = defaultdict(set)
        seen = 0
        deadline = time.monotonic() + 10
        while seen < 15:
            assert time.monotonic() < deadline, f"read {seen} of 15"
            for tp, records in reader.poll(timeout_ms=200).items():
                seen += len(records)
                for record in records:
                    partitions_of[record.key].add(tp.partition)
    finally:
        reader.close()
    assert set(partitions_of) == {b"a", b"b", b"c", b"d", b"e"}
    assert all(len(p) == 1 for p in partitions_of.values())
    assert len(set().union(*partitions_of.values())) > 1  # keys spread over partitions


def _read_all(bootstrap: str, topic: str, expected: int) -> list:
    reader = KafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=100)
    try:
        tp = TopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek_to_beginning(tp)
        records: list = []
        deadline = time.monotonic() + 10
        while len(records) < expected:
            assert time.monotonic() < deadline, f"read {len(records)} of {expected}"
            for batch in reader.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        reader.close()


def test_alert_publisher_round_trip(broker: EmbeddedBroker) -> None:
    topic = f"test.alerts.{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, {topic: 1})
    alert = Alert(
        job="j42",
        machine="n0017",
        kind=AlertKind.SIMILARITY,
        metric="gpu_power_watts",
        score=9.5,
        first_ts=T0,
        detected_ts=T0 + 20,
        devices=("gpu3",),
        evidence={"window": [1.0, 2.0], "peers_median": [3.0, 3.0]},
    )
    with AlertPublisher(broker.bootstrap, topic) as publisher:
        publisher.publish_alert(alert)
        publisher.flush(10)
        assert publisher.stats.delivered == 1
    (record,) = _read_all(broker.bootstrap, topic, 1)
    assert record.key == b"j42"
    assert dict(record.headers)["minder-alert-id"] == alert.id.encode()
    assert Alert.from_dict(orjson.loads(record.value)) == alert


def test_json_publisher_refuses_what_json_cannot_carry(broker: EmbeddedBroker) -> None:
    with JsonPublisher(broker.bootstrap, "test.json.unused") as publisher:
        with pytest.raises(ValidationError, match="key 'k' is not JSON-serialisable"):
            publisher.publish("k", {"when": object()})
        assert publisher.stats.sent == 0


def test_unreachable_broker_raises_broker_error() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError, match=bootstrap):
        BatchProducer(bootstrap, bootstrap_timeout_ms=300)
    with pytest.raises(BrokerError, match=bootstrap):
        BatchConsumer(bootstrap, bootstrap_timeout_ms=300)


def test_invalid_settings_are_refused(broker: EmbeddedBroker) -> None:
    with pytest.raises(ValidationError, match="compression is 'brotli'"):
        BatchProducer(broker.bootstrap, compression="brotli")
    with pytest.raises(ValidationError, match="auto_offset_reset is 'middle'"):
        BatchConsumer(broker.bootstrap, auto_offset_reset="middle")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="two different"):
        BatchConsumer(broker.bootstrap, topic="same", deadletter_topic="same")
