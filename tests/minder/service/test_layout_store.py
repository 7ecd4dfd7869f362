"""The service shares wire layouts through its database: a restarted worker decodes the nodes'
packed batches before they re-announce their layouts (docs/architecture.md §3.2)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from service_settings import fleet_signer, isolated_settings

from collectors.sim import Scenario, iter_batches
from minder.core.codec import BatchEncoder, Decoder, LayoutCache, layout_cache, layout_id
from minder.core.records import NodeBatch
from minder.service.stack import Stack, build_stack
from minder.service.telemetry import LayoutStoreCollector, ServiceMetrics
from minder.storage import create_engine_for, load_layout, session_factory
from minder.stream import BatchProducer, EmbeddedBroker

SCENARIO = Scenario.model_validate(
    {
        "seed": 4,
        "duration_s": 9,
        "jobs": [{"name": "lay", "machines": 4, "machines_per_domain": 4, "step_time_s": 3.0}],
    }
)


class DictStore:
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def load(self, layout_id: int) -> dict[str, Any] | None:
        return self.rows.get(layout_id)

    def save(self, layout_id: int, definition: dict[str, Any]) -> None:
        self.rows.setdefault(layout_id, definition)


def test_the_layout_store_outcomes_are_exported() -> None:
    registry = CollectorRegistry()
    store = DictStore()
    cache = LayoutCache(store=store)
    registry.register(LayoutStoreCollector(cache))
    batch = NodeBatch("j", "n", 1763700000.0, samples=[("cpu_util_ratio", "", 0.5)])
    encoder = BatchEncoder()
    Decoder(LayoutCache(store=store)).decode(encoder.encode(batch))  # another worker saves
    Decoder(cache).decode(encoder.encode(batch))  # this one loads
    values = {
        outcome: registry.get_sample_value("minder_layout_store_total", {"outcome": outcome})
        for outcome in ("loaded", "saved", "not_found", "invalid", "error")
    }
    assert values == {"loaded": 1, "saved": 0, "not_found": 0, "invalid": 0, "error": 0}
    # The service's metrics carry the module-wide decoder's, from the start.
    service = ServiceMetrics(CollectorRegistry())
    assert service.registry.get_sample_value(
        "minder_layout_store_total", {"outcome": "error"}
    ) == float(layout_cache().store_failures)


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_restarted_service_decodes_before_the_nodes_re_announce(
    broker: EmbeddedBroker, database_url: str
) -> None:
    settings = isolated_settings(broker.bootstrap, database_url)
    seconds = [batches for _, batches in iter_batches(SCENARIO)]
    machines = len(seconds[0])

    def run(stack: Stack, producer: BatchProducer, upto: int, part: list[list[NodeBatch]]) -> None:
        assert stack.worker is not None
        stats = stack.worker.consumer.stats
        for batches in part:
            for batch in batches:
                producer.send(batch)
        producer.flush()
        # handled and committed up to there (the offsets are published after the commit)
        _wait_for(
            lambda: sum(stats.offset_by_partition.values()) >= machines * upto,
            60,
            f"{machines * upto} messages committed",
        )

    with BatchProducer(
        broker.bootstrap, topic=settings.kafka.metrics_topic, signer=fleet_signer(settings)
    ) as producer:
        first = build_stack(settings, registry=CollectorRegistry())
        assert layout_cache().store is first.layout_store is not None
        first.start(api=False)
        try:
            run(first, producer, 2, seconds[:2])  # the nodes announce their layouts here
        finally:
            first.stop()
        assert layout_cache().store is None  # the stopped stack's store is not left behind
        layout_cache().clear()  # what a restart forgets

        engine = create_engine_for(database_url)
        try:
            with session_factory(engine)() as session:
                announced = {lid: load_layout(session, lid) for lid in _layout_ids(seconds[0])}
        finally:
            engine.dispose()
        assert all(announced.values()), "a layout the first worker learnt is not stored"

        loaded_before = layout_cache().store_loaded
        second = build_stack(settings, registry=CollectorRegistry())
        second.start(api=False)
        try:
            run(second, producer, len(seconds), seconds[2:])  # no announcement before second 10
            assert second.worker is not None
            stats = second.worker.consumer.stats
            assert stats.dead_lettered_by_reason.get("unknown_layout", 0) == 0
            assert stats.decoded == stats.consumed >= machines * len(seconds[2:])
            # decoded thanks to the store (not to a redelivered announcement)
            assert layout_cache().store_loaded - loaded_before == len(announced)
            exported = second.metrics.registry.get_sample_value(
                "minder_layout_store_total", {"outcome": "loaded"}
            )
            assert exported == layout_cache().store_loaded
        finally:
            second.stop()


def _layout_ids(batches: list[NodeBatch]) -> set[int]:
    ids = set()
    for batch in batches:
        metrics, devices = zip(*[(m, d) for m, d, _ in batch.samples], strict=True)
        ids.add(layout_id(metrics, devices))
    return ids
