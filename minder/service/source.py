"""Where the service's batches come from (``minder serve --source``): the agents over Kafka,
Prometheus, or both. Light to import: ``minder serve`` resolves its source before it imports the
service stack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from minder.config import Settings

Source = Literal["kafka", "prometheus", "both"]
"""Where the service's batches come from (``minder serve --source``)."""
SOURCES: tuple[Source, ...] = ("kafka", "prometheus", "both")


def resolve_source(settings: Settings, chosen: Source | None) -> Source:
    """``chosen``, else ``prometheus`` when MINDER_PROMETHEUS__URL is set and
    MINDER_KAFKA__BOOTSTRAP is not, else ``kafka``."""
    if chosen is not None:
        return chosen
    kafka_set = "kafka" in settings.model_fields_set and (
        "bootstrap" in settings.kafka.model_fields_set
    )
    if settings.prometheus.url is not None and not kafka_set:
        return "prometheus"
    return "kafka"
