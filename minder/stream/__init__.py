"""Kafka layer: the only package that imports kafka-python (docs/architecture.md §2).

- :class:`EmbeddedBroker`: a local Tansu broker for demos and tests (extra ``demo``).
- :func:`ensure_topics`, :func:`minder_topics`: create Minder's topics.
- :class:`BatchProducer`, :class:`AlertPublisher`, :class:`JsonPublisher`: producers.
- :class:`BatchConsumer`: the detection service's consumer (manual commits, dead letters).
- :func:`read_dead_letters`: read the dead-letter topic back.
- :func:`connection_config`: the security options (TLS, SASL) every client above takes as
  ``client_options`` (from :meth:`minder.config.KafkaSettings.client_options`).
"""

from minder.stream.broker import EmbeddedBroker, free_port, resolve_tansu_binary
from minder.stream.consumer import BatchConsumer, BatchHandler, ConsumerStats, PollOutcome
from minder.stream.deadletter import REASON_CLASSES, DeadLetter, read_dead_letters, reason_class
from minder.stream.producer import (
    AlertPublisher,
    BatchProducer,
    JsonPublisher,
    ProducerStats,
)
from minder.stream.security import CONNECTION_OPTIONS, connection_config
from minder.stream.topics import check_reachable, ensure_topics, minder_topics

__all__ = [
    "CONNECTION_OPTIONS",
    "REASON_CLASSES",
    "AlertPublisher",
    "BatchConsumer",
    "BatchHandler",
    "BatchProducer",
    "ConsumerStats",
    "DeadLetter",
    "EmbeddedBroker",
    "JsonPublisher",
    "PollOutcome",
    "ProducerStats",
    "check_reachable",
    "connection_config",
    "ensure_topics",
    "free_port",
    "minder_topics",
    "read_dead_letters",
    "reason_class",
    "resolve_tansu_binary",
]
