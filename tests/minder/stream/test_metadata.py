"""Metadata requests of Minder's Kafka clients never create a topic (a real Tansu broker).

kafka-python 3.0 dropped ``allow_auto_create_topics`` on the way to its cluster metadata, and
Tansu creates a topic named in a metadata request with four partitions: after a restart, the
metrics topic configured with one came back with four, and a consumer group was left without a
partition (CI)."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer

from minder.core.errors import BrokerError
from minder.stream import BatchConsumer, BatchProducer, EmbeddedBroker
from minder.stream.closing import close_client
from minder.stream.deadletter import read_dead_letters
from minder.stream.metadata import with_topic_creation

pytestmark = pytest.mark.kafka

ABSENT = "minder.absent.v1"


def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-topics")
    try:
        return set(admin.list_topics())
    finally:
        close_client(admin)


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker() as running:
        yield running


def test_a_consumer_subscribed_to_a_missing_topic_does_not_create_it(broker) -> None:
    with BatchConsumer(
        broker.bootstrap, group_id="absent", topic=ABSENT, deadletter_topic="minder.absent.dl"
    ) as consumer:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            consumer.poll_once(lambda batches: None, timeout_ms=200)
        assert consumer.assignment() == set()
    assert ABSENT not in _topics(broker.bootstrap)


def test_a_producer_sending_to_a_missing_topic_does_not_create_it(broker, make_batch) -> None:
    topic = ABSENT + ".produced"
    with (
        BatchProducer(broker.bootstrap, topic=topic, max_block_ms=1500) as producer,
        pytest.raises(BrokerError, match="cannot queue"),
    ):
        producer.send(make_batch("a", "n0", 1.0))
    assert topic not in _topics(broker.bootstrap)


def test_reading_dead_letters_of_a_missing_topic_does_not_create_it(broker) -> None:
    topic = ABSENT + ".dead"
    assert read_dead_letters(broker.bootstrap, topic, timeout_s=3) == []
    assert topic not in _topics(broker.bootstrap)


def test_the_setting_given_is_the_one_the_requests_carry(broker) -> None:
    """Where the client is asked to create topics, it still does (the option is applied, not
    forced off), and kafka-python's default is True."""
    for config, expected in (
        ({"allow_auto_create_topics": False}, False),
        ({"allow_auto_create_topics": True}, True),
        ({}, True),
    ):
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, **config)
        try:
            with_topic_creation(consumer, config)
            request = consumer._cluster.metadata_request()  # what the next refresh sends
            assert request.allow_auto_topic_creation is expected
        finally:
            close_client(consumer)
