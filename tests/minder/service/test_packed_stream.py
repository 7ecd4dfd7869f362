"""Schema 2 (packed) against schema 1 through a real broker: the same alerts."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry

from collectors.sim import Scenario, iter_batches
from detectors.methods import default_factory
from minder.core.codec import WireFormat
from minder.service.engine import DetectionService
from minder.service.telemetry import ServiceMetrics
from minder.stream import BatchConsumer, BatchProducer, EmbeddedBroker, ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SCENARIO = Scenario.model_validate(
    {
        "seed": 11,
        "duration_s": 90,
        "jobs": [{"name": "wire", "machines": 12, "machines_per_domain": 6, "step_time_s": 3.0}],
        "faults": [
            # The GPU falls off the bus: the node's layout changes mid-stream (fewer pairs).
            {"type": "gpu_lost", "job": "wire", "machine": 2, "device": "gpu1", "start_s": 25},
            {"type": "thermal_throttle", "job": "wire", "machine": 7, "start_s": 20},
            {"type": "machine_unreachable", "job": "wire", "machine": 9, "start_s": 50},
        ],
        "confounders": [{"type": "agent_restart", "job": "wire", "machine": 4, "start_s": 30}],
    }
)
END_TS = SCENARIO.start_ts + SCENARIO.duration_s


class Clock:
    now = END_TS

    def __call__(self) -> float:
        return self.now


def _alerts(broker: EmbeddedBroker, fmt: WireFormat) -> tuple[list[tuple[object, ...]], int]:
    suffix = uuid.uuid4().hex[:8]
    metrics, dead = f"wire.{fmt.value}.{suffix}", f"wire.dead.{suffix}"
    ensure_topics(broker.bootstrap, {metrics: 2, dead: 1})
    sent = 0
    with BatchProducer(broker.bootstrap, topic=metrics, fmt=fmt) as producer:
        for _, batches in iter_batches(SCENARIO):
            for batch in batches:
                producer.send(batch)
                sent += 1
        producer.flush(30)
        inlined = producer.encoder.stats.layouts_inlined
    clock = Clock()
    service = DetectionService(
        default_factory(), grace_s=2, metrics=ServiceMetrics(CollectorRegistry()), clock=clock
    )
    with BatchConsumer(
        broker.bootstrap,
        group_id=f"wire-{suffix}",
        topic=metrics,
        deadletter_topic=dead,
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
        max_poll_records=12,  # about one second of the job per poll, whatever the encoding
    ) as consumer:
        for _ in range(1000):
            consumer.poll_once(lambda batches: (service.ingest(batches), service.tick()), 200)
            if consumer.stats.consumed >= sent:
                break
        assert consumer.stats.consumed == sent and consumer.stats.dead_lettered == 0
    clock.now += 60  # the stream is over: its last seconds are evaluated
    service.tick()
    if fmt is WireFormat.PACKED:
        assert 0 < inlined < sent / 5  # the layouts travelled now and then, not every time
    keys = sorted(
        (a.machine, a.kind.value, a.metric, tuple(a.devices), a.first_ts, a.detected_ts)
        for a in service.alerts
    )
    return keys, sent


def test_a_packed_stream_gives_the_same_alerts_as_named_samples(broker: EmbeddedBroker) -> None:
    named, sent_named = _alerts(broker, WireFormat.MSGPACK)
    packed, sent_packed = _alerts(broker, WireFormat.PACKED)
    assert sent_named == sent_packed
    assert packed == named
    machines = {key[0] for key in packed}
    assert {"wire-n0002", "wire-n0007", "wire-n0009"} <= machines, packed
