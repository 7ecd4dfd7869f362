"""The consumer's fetch and poll sizes come from the settings (``MINDER_KAFKA__…``)."""

from __future__ import annotations

import pytest

from minder.config import Settings, SettingsError
from minder.stream import BatchConsumer, EmbeddedBroker


@pytest.mark.kafka
def test_fetch_and_poll_sizes_reach_the_kafka_client(
    broker: EmbeddedBroker, topics: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINDER_KAFKA__BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("MINDER_KAFKA__MAX_POLL_RECORDS", "1234")
    monkeypatch.setenv("MINDER_KAFKA__MAX_PARTITION_FETCH_BYTES", "2097152")
    monkeypatch.setenv("MINDER_KAFKA__FETCH_MAX_BYTES", "4194304")
    settings = Settings.load().kafka
    metrics, deadletter = topics
    settings.metrics_topic, settings.deadletter_topic = metrics, deadletter
    consumer = BatchConsumer.from_settings(settings)
    try:
        config = consumer._consumer.config
        assert config["max_poll_records"] == 1234
        assert config["max_partition_fetch_bytes"] == 2 << 20
        assert config["fetch_max_bytes"] == 4 << 20
    finally:
        consumer.close()


def test_defaults_are_the_measured_ones_and_bad_sizes_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = Settings.load().kafka
    assert (kafka.max_poll_records, kafka.max_partition_fetch_bytes) == (5000, 8 << 20)
    monkeypatch.setenv("MINDER_KAFKA__MAX_POLL_RECORDS", "0")
    with pytest.raises(SettingsError, match="MINDER_KAFKA__MAX_POLL_RECORDS='0'"):
        Settings.load()
