"""Produce → consume → detect → store → API, with a real broker and a real database."""

from __future__ import annotations

import json
import re
import time
import uuid

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer
from prometheus_client import CollectorRegistry
from service_settings import fleet_signer, isolated_settings

from collectors.sim.output import iter_batches
from collectors.sim.scenario import Scenario
from minder.config import Settings
from minder.core.alert import Alert
from minder.service.stack import build_stack
from minder.stream import BatchProducer, ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SCENARIO = {
    "seed": 5,
    "duration_s": 100,
    "jobs": [{"name": "e2e", "machines": 16, "machines_per_domain": 8, "step_time_s": 3.0}],
    "faults": [
        {"type": "gpu_xid", "job": "e2e", "machine": 3, "device": "gpu2", "start_s": 30},
        {"type": "nic_down", "job": "e2e", "machine": 11, "start_s": 50},
    ],
}


def _settings(bootstrap: str, database_url: str) -> Settings:
    return isolated_settings(bootstrap, database_url)


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def test_fault_batches_become_stored_alerts_served_by_the_api(broker, database_url) -> None:
    settings = _settings(broker.bootstrap, database_url)
    stack = build_stack(settings, registry=CollectorRegistry())
    stack.start()
    try:
        scenario = Scenario.model_validate(SCENARIO)
        with BatchProducer(
            broker.bootstrap, topic=settings.kafka.metrics_topic, signer=fleet_signer(settings)
        ) as producer:
            # Tansu refuses idempotent produce requests (kafka-python 3 turns them on by default).
            raw = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False)
            for second, (_, batches) in enumerate(iter_batches(scenario)):
                for batch in batches:
                    producer.send(batch)
                if second == 10:  # garbage in the middle of the stream, from a real node
                    garbage = b"\x00not a batch"
                    signature = fleet_signer(settings).header("e2e-n0001", garbage)
                    raw.send(
                        settings.kafka.metrics_topic,
                        key=b"e2e",
                        value=garbage,
                        headers=[signature],
                    ).get(timeout=10)
            producer.flush()
            raw.flush()
            raw.close()

        service = stack.service
        _wait_for(lambda: len(service.alerts) >= 2, 90, "two alerts")
        by_machine = {a.machine: a for a in service.alerts}
        assert set(by_machine) == {"e2e-n0003", "e2e-n0011"}
        assert by_machine["e2e-n0003"].metric == "gpu_xid_count"
        assert by_machine["e2e-n0003"].devices == ("gpu2",)
        assert by_machine["e2e-n0011"].kind.value == "rule"

        api = f"{stack.api_url}/api/v1"
        listed = httpx.get(f"{api}/alerts", params={"job": "e2e"}).json()
        assert listed["total"] == 2
        assert {item["machine"] for item in listed["items"]} == set(by_machine)
        one = httpx.get(f"{api}/alerts/{by_machine['e2e-n0003'].id}").json()
        assert one["status"] == "open" and one["evidence"]["rule"] in {"xid", "event:xid"}

        _wait_for(lambda: httpx.get(f"{api}/jobs/e2e/machines").status_code == 200, 30, "machines")
        machines = httpx.get(f"{api}/jobs/e2e/machines").json()
        assert len(machines) == 16
        scores = httpx.get(f"{api}/jobs/e2e/scores")
        assert scores.status_code == 200
        ready = httpx.get(f"{api}/ready")
        assert ready.status_code == 200, ready.text

        # Counters are exported once the poll that raised the alerts returns (one poll may hold
        # the whole stream, the garbage message too).
        _wait_for(
            lambda: (
                'minder_decode_failures_total{reason="undecodable"} 1.0'
                in httpx.get(f"{stack.api_url}/metrics").text
            ),
            30,
            "the poll's counters",
        )
        metrics = httpx.get(f"{stack.api_url}/metrics").text
        assert 'minder_alerts_total{kind="rule"} 2.0' in metrics
        assert 'minder_decode_failures_total{reason="undecodable"} 1.0' in metrics
        assert "minder_machine_score{" in metrics
        # every batch was signed by its node: verified, none refused
        verified = re.search(
            r'^minder_batches_verified_total\{kid="test"\} (\S+)$', metrics, re.MULTILINE
        )
        assert verified is not None and float(verified.group(1)) > 0
        assert (
            'minder_batches_unauthenticated_total{action="dead_lettered",reason="unsigned"} 0.0'
            in metrics
        )

        # The alerts topic carries the same two alerts, as alert.opened events from the outbox.
        _wait_for(
            lambda: (
                httpx.get(f"{api}/deliveries", params={"status": "delivered"}).json()["total"] >= 2
            ),
            30,
            "the outbox to deliver",
        )
        consumer = KafkaConsumer(
            settings.kafka.alerts_topic,
            bootstrap_servers=broker.bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5000,
        )
        events = [json.loads(m.value) for m in consumer]
        consumer.close()
        assert {e["type"] for e in events} == {"alert.opened"}
        assert {e["version"] for e in events} == {1}
        published = [Alert.from_dict(e["data"]["alert"]) for e in events]
        assert sorted(a.machine for a in published) == sorted(by_machine)
    finally:
        stack.stop()


def test_replayed_stream_does_not_duplicate_stored_alerts(broker, tmp_path) -> None:
    """A second service in a new group replays the topic: same alerts, same ids, no new rows."""
    database_url = f"sqlite:///{tmp_path / 'replay.db'}"
    settings = _settings(broker.bootstrap, database_url)
    scenario = Scenario.model_validate({**SCENARIO, "faults": SCENARIO["faults"][:1]})
    # Written before any service made it: Minder's clients never create a topic by asking.
    ensure_topics(broker.bootstrap, {settings.kafka.metrics_topic: settings.kafka.partitions})
    with BatchProducer(
        broker.bootstrap, topic=settings.kafka.metrics_topic, signer=fleet_signer(settings)
    ) as producer:
        for _, batches in iter_batches(scenario):
            for batch in batches:
                producer.send(batch)
        producer.flush()
    ids = []
    for attempt in range(2):
        settings.kafka.group_id = f"replay-{attempt}-{uuid.uuid4().hex[:6]}"
        stack = build_stack(settings, registry=CollectorRegistry())
        stack.start(api=False)
        service = stack.service
        end = scenario.start_ts + scenario.duration_s - 5

        def replayed(service=service, end=end) -> bool:
            return any(job.evaluated_sec >= end for job in service.jobs.values())

        try:
            _wait_for(replayed, 60, "the whole replay")
            ids.append(sorted(a.id for a in stack.service.alerts))
        finally:
            stack.stop()
    assert len(ids[0]) == 1
    assert ids[1] == []  # the second run found the fault already stored: no new alert
