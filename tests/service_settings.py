"""Settings of a service under test: its own topics, consumer group and API port on a shared
broker, so tests of one session do not read each other's data."""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

from collectors.sim.output import iter_batches
from collectors.sim.scenario import Scenario
from minder.config import Settings
from minder.core.signing import FleetSigner, init_cluster_keys, load_cluster_keys
from minder.stream import BatchProducer, free_port


def isolated_settings(bootstrap: str, database_url: str, *, partitions: int = 2) -> Settings:
    settings = Settings()
    suffix = uuid.uuid4().hex[:8]
    settings.kafka.bootstrap = bootstrap
    settings.kafka.metrics_topic = f"metrics-{suffix}"
    settings.kafka.alerts_topic = f"alerts-{suffix}"
    settings.kafka.deadletter_topic = f"dead-{suffix}"
    settings.kafka.group_id = f"detect-{suffix}"
    settings.kafka.partitions = partitions
    settings.database.url = database_url
    settings.api.port = free_port()
    settings.detection.new_job_max_age_s = 0  # simulated streams are dated by their scenario
    settings.auth.keys_file = cluster_keys()
    return settings


def cluster_keys() -> Path:
    """A new cluster key file (batches must be signed: the default mode requires it)."""
    path = Path(tempfile.mkdtemp(prefix="minder-keys-")) / "cluster.keys"
    init_cluster_keys(path, "test")
    return path


def fleet_signer(settings: Settings) -> FleetSigner:
    """Signs each node's batches as its agent would, for a service of ``settings``."""
    assert settings.auth.keys_file is not None, "settings without a cluster key file"
    return FleetSigner(load_cluster_keys(settings.auth.keys_file)[-1])


def send_scenario(settings: Settings, scenario: Scenario) -> None:
    """Every batch of ``scenario``, dated so that it ends now and signed as the agents sign
    them, into the metrics topic of a service of ``settings``."""
    start = time.time() - scenario.duration_s
    bootstrap, topic = settings.kafka.bootstrap, settings.kafka.metrics_topic
    with BatchProducer(bootstrap, topic=topic, signer=fleet_signer(settings)) as producer:
        for _, batches in iter_batches(scenario, start_ts=start):
            for batch in batches:
                producer.send(batch)
        producer.flush()
