"""A message that can be neither decoded nor dead-lettered, and a partition that cannot advance:
the worker goes on with the others, and ``/metrics`` says which partition is stuck."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fault_harness import (
    HEALTHY_PARTITION,
    HOSTILE_PARTITION,
    WARMUP_S,
    FaultService,
    Figures,
    wait_until,
)

from minder.core.records import NodeBatch
from minder.stream import read_dead_letters

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

POISON_BYTES = 1100 * 1024
"""Garbage just over the 1 MiB a kafka-python producer (the dead-letter one) sends at most."""
TRUNCATED_BYTES = 64 * 1024


def neighbour_batches(service: FaultService, seconds: range) -> list[NodeBatch]:
    """A second job's batches for the poisoned partition (dated like the healthy job's)."""
    return [
        NodeBatch(
            "neighbour", f"nb{i}", service.start_ts + s, samples=[("cpu_util_ratio", "", 0.5)]
        )
        for s in seconds
        for i in range(2)
    ]


def test_a_1_mib_garbage_message_is_dead_lettered_truncated_and_the_stream_goes_on(
    make_service: Any, figures: Figures
) -> None:
    service: FaultService = make_service()
    service.warm_up()
    poison_at = service.end_offsets()[HOSTILE_PARTITION]
    # signed by a real node (its agent has a bug): the garbage reaches the decoder
    poison = b"\xc1" * POISON_BYTES
    signature = service.signer.header("nb0", poison)
    service.send_raw(poison, b"poison", HOSTILE_PARTITION, [signature])
    service.send(neighbour_batches(service, range(5)), HOSTILE_PARTITION)
    healthy = service.fault_then_alert(figures, timeout_s=30)
    assert healthy.on_time(), healthy
    assert service.consumed(HEALTHY_PARTITION)
    # the poisoned partition goes on too: past the poison to its end
    end = service.end_offsets()[HOSTILE_PARTITION]
    assert wait_until(lambda: service.consumed(HOSTILE_PARTITION), 30) is not None
    [letter] = read_dead_letters(service.broker.bootstrap, service.deadletter_topic)
    assert letter.source_offset == poison_at and len(letter.payload) == TRUNCATED_BYTES
    assert f"truncated from {POISON_BYTES} bytes" in letter.reason
    hostile = {"topic": service.topic, "partition": str(HOSTILE_PARTITION)}

    def exported() -> bool:
        return service.metric("minder_consumer_offset", **hostile) == end

    assert wait_until(exported, 10) is not None
    assert service.metric("minder_consumer_lag_messages", **hostile) == 0
    assert (service.metric("minder_deadletter_failures_total") or 0) >= 1
    assert service.metric("minder_dead_letters_total", reason="undecodable") == 1


def test_a_stuck_partition_shows_a_frozen_offset_and_a_growing_lag(
    make_service: Any, figures: Figures
) -> None:
    """Detection raises on every batch, even alone (nothing to dead-letter: an outage of the
    handler): offsets stand still while the lag grows, and both move again once it recovers."""
    service: FaultService = make_service()
    service.warm_up()
    healthy = {"topic": service.topic, "partition": str(HEALTHY_PARTITION)}
    frozen = service.end_offsets()[HEALTHY_PARTITION]
    assert wait_until(lambda: service.metric("minder_consumer_offset", **healthy) == frozen, 10)
    detection = service.stack.service
    ingest = detection.ingest

    def broken(batches: Any) -> int:
        raise RuntimeError("detection is broken")

    detection.ingest = broken  # type: ignore[method-assign]
    lags = []
    for first in (WARMUP_S, WARMUP_S + 4):
        service.feed_healthy(first, first + 4)
        time.sleep(1.5)  # a few retried polls
        lags.append(service.metric("minder_consumer_lag_messages", **healthy))
        assert service.metric("minder_consumer_offset", **healthy) == frozen
    assert lags[0] is not None and lags[1] is not None
    assert 0 < lags[0] < lags[1] == service.end_offsets()[HEALTHY_PARTITION] - frozen
    figures.record("stuck partition lag while frozen", lags[1], "messages")
    detection.ingest = ingest  # type: ignore[method-assign]
    end = service.end_offsets()[HEALTHY_PARTITION]

    def recovered() -> bool:
        return (
            service.metric("minder_consumer_offset", **healthy) == end
            and service.metric("minder_consumer_lag_messages", **healthy) == 0
        )

    assert wait_until(recovered, 20) is not None
