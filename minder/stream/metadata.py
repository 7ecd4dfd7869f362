"""Metadata requests that never create a topic, whatever the kafka-python version.

kafka-python 3.0 (3.0.12 here) accepts ``allow_auto_create_topics`` in the configuration of a
``KafkaConsumer`` or ``KafkaProducer`` but builds the client's cluster metadata without it, so
every metadata request it sends asks the broker to create the topics it names (the option's
default, True). Kafka brokers with ``auto.create.topics.enable`` and Tansu (which has no switch)
then create a missing topic with the broker's default partition count: four on Tansu. After an
embedded broker restarts empty, a client that asks for the metrics topic before
:class:`~minder.stream.broker.EmbeddedBroker` has created it again with its own count gets four
partitions where one was configured, and a consumer group's assignment made from the two views
left a member with none: nothing was read for 30 s in CI.

:func:`with_topic_creation` sets the option on the client's cluster metadata itself, where the
requests read it; with a kafka-python that passes the option through, it changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

Client = TypeVar("Client")

_CLUSTER_ATTRIBUTES = ("_cluster", "_metadata")  # KafkaConsumer, KafkaProducer (private)


def with_topic_creation(client: Client, config: Mapping[str, Any]) -> Client:
    """``client`` (a ``KafkaConsumer`` or ``KafkaProducer`` built from ``config``), its metadata
    requests now asking the broker to create missing topics only if ``config`` allows it
    (``allow_auto_create_topics``, True when absent, as in kafka-python)."""
    allowed = bool(config.get("allow_auto_create_topics", True))
    for name in _CLUSTER_ATTRIBUTES:
        cluster_config: Any = getattr(getattr(client, name, None), "config", None)
        if isinstance(cluster_config, dict) and "allow_auto_create_topics" in cluster_config:
            cluster_config["allow_auto_create_topics"] = allowed
    return client
