"""ensure_topics creates what is missing and nothing else."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient

from minder.core.errors import BrokerError, ValidationError
from minder.core.records import ALERTS_TOPIC, DEADLETTER_TOPIC, METRICS_TOPIC, TRACES_TOPIC
from minder.stream import EmbeddedBroker, ensure_topics, free_port, minder_topics

pytestmark = pytest.mark.kafka


def _partitions(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        return {d["name"]: len(d["partitions"]) for d in admin.describe_topics(names)}
    finally:
        admin.close()


def test_ensure_topics_is_idempotent(broker: EmbeddedBroker) -> None:
    suffix = uuid.uuid4().hex[:8]
    wanted = {f"a.{suffix}": 3, f"b.{suffix}": 1}

    assert ensure_topics(broker.bootstrap, wanted) == sorted(wanted)
    assert ensure_topics(broker.bootstrap, wanted) == []
    # A superset creates only the new one.
    more = {**wanted, f"c.{suffix}": 2}
    assert ensure_topics(broker.bootstrap, more) == [f"c.{suffix}"]

    assert _partitions(broker.bootstrap, sorted(more)) == more


def test_fewer_partitions_than_asked_are_left_alone(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"small.{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, {name: 1})
    assert ensure_topics(broker.bootstrap, {name: 4}) == []
    assert _partitions(broker.bootstrap, [name]) == {name: 1}
    assert "has 1 partitions, fewer than the 4" in caplog.text


def test_minder_topics() -> None:
    assert minder_topics(8) == {
        METRICS_TOPIC: 8,
        ALERTS_TOPIC: 1,
        DEADLETTER_TOPIC: 1,
        TRACES_TOPIC: 1,
    }
    with pytest.raises(ValidationError, match="metrics=0"):
        minder_topics(0)


def test_bad_partition_counts_are_refused(broker: EmbeddedBroker) -> None:
    with pytest.raises(ValidationError, match="'x' has partitions 0"):
        ensure_topics(broker.bootstrap, {"x": 0})
    with pytest.raises(ValidationError, match="'x' has partitions '2'"):
        ensure_topics(broker.bootstrap, {"x": "2"})  # type: ignore[dict-item]


def test_unreachable_broker_raises_broker_error() -> None:
    port = free_port()
    with pytest.raises(BrokerError, match=f"127.0.0.1:{port}"):
        ensure_topics(f"127.0.0.1:{port}", {"x": 1}, timeout_s=1.0)
