"""Settings of a service under test: its own topics, consumer group and API port on a shared
broker, so tests of one session do not read each other's data."""

from __future__ import annotations

import uuid

from minder.config import Settings
from minder.stream import free_port


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
    return settings
