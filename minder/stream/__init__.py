"""Kafka layer: the only package that imports kafka-python (docs/architecture.md §2).

- :class:`EmbeddedBroker`: a local Tansu broker for demos and tests (extra ``demo``).
- :func:`ensure_topics`, :func:`minder_topics`: create Minder's topics.
- :class:`BatchProducer`, :class:`AlertPublisher`, :class:`JsonPublisher`: producers.
- :class:`BatchConsumer`: the detection service's consumer (manual commits, dead letters).
- :func:`read_dead_letters`: read the dead-letter topic back.
- :func:`connection_config`: the security options (TLS, SASL) every client above takes as
  ``client_options`` (from :meth:`minder.config.KafkaSettings.client_options`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Each name is imported from its module on first use (PEP 562), so that a process that needs one
# module (the node agent: the spool and the record sender) does not load the others (the
# consumer's decoder and numpy, the admin client, the broker).
_MODULES = {
    "EmbeddedBroker": "broker",
    "free_port": "broker",
    "resolve_tansu_binary": "broker",
    "BatchConsumer": "consumer",
    "BatchHandler": "consumer",
    "ConsumerStats": "consumer",
    "PollOutcome": "consumer",
    "REASON_CLASSES": "deadletter",
    "DeadLetter": "deadletter",
    "read_dead_letters": "deadletter",
    "reason_class": "deadletter",
    "AlertPublisher": "producer",
    "BatchProducer": "producer",
    "JsonPublisher": "producer",
    "ProducerStats": "producer",
    "CONNECTION_OPTIONS": "security",
    "connection_config": "security",
    "check_reachable": "topics",
    "ensure_topics": "topics",
    "minder_topics": "topics",
}

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


if not TYPE_CHECKING:  # mypy sees the imports above; a module __getattr__ would hide typos

    def __getattr__(name: str) -> Any:
        module = _MODULES.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
