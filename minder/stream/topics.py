"""Creating Minder's topics (docs/architecture.md §3.2) on a broker."""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from minder.core.errors import BrokerError, ValidationError
from minder.core.records import ALERTS_TOPIC, DEADLETTER_TOPIC, METRICS_TOPIC, TRACES_TOPIC
from minder.stream.closing import close_client
from minder.stream.security import connection_config

logger = logging.getLogger(__name__)


def minder_topics(metrics_partitions: int, *, other_partitions: int = 1) -> dict[str, int]:
    """Minder's topics with their partition counts.

    Only the metrics topic is consumed by a group of detection workers, so only it needs
    ``metrics_partitions`` (the most workers that can share the load); the others are small.
    """
    if metrics_partitions < 1 or other_partitions < 1:
        raise ValidationError(
            f"partitions are metrics={metrics_partitions!r}, other={other_partitions!r}: "
            "expected integers >= 1"
        )
    return {
        METRICS_TOPIC: metrics_partitions,
        ALERTS_TOPIC: other_partitions,
        DEADLETTER_TOPIC: other_partitions,
        TRACES_TOPIC: other_partitions,
    }


def ensure_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    *,
    replication_factor: int = 1,
    client_id: str = "minder-admin",
    timeout_s: float = 30.0,
    client_options: Mapping[str, Any] | None = None,
) -> list[str]:
    """Create the topics of ``topics`` (name → partitions) that do not exist yet.

    Idempotent: existing topics are left alone (a warning is logged when one has fewer
    partitions than asked, since partitions are never changed behind the operator's back), and
    a topic created concurrently by someone else counts as existing. ``client_options``: the
    connection settings (security protocol, TLS, SASL) of
    :meth:`minder.config.KafkaSettings.client_options`.

    ACLs: DESCRIBE on the topics (listing them), and CREATE on the cluster or on the topic names
    only when one is missing.

    Returns
    -------
    list[str]
        The names this call created, sorted.

    Raises
    ------
    ValidationError
        A partition count below 1.
    BrokerError
        The broker cannot be reached or refuses to create a topic.
    """
    validate_topics(topics)
    connection = connection_config(client_options)
    if not topics:
        return []
    timeout_ms = int(timeout_s * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
            **connection,
        )
    except KafkaError as exc:
        raise BrokerError(f"cannot reach the Kafka brokers at {bootstrap!r}: {exc!r}") from exc
    try:
        return create_missing_topics(admin, topics, replication_factor, timeout_ms)
    except KafkaError as exc:
        raise BrokerError(f"cannot create topics {sorted(topics)} at {bootstrap!r}: {exc}") from exc
    finally:
        close_client(admin)


BROKER_HINT = (
    "start a broker and point MINDER_KAFKA__BOOTSTRAP at it (host:port[,host:port]), or try Minder "
    "on one machine with `minder serve --embedded-broker`"
)


def check_reachable(bootstrap: str, timeout_s: float = 5.0) -> None:
    """Fail fast, in one line, when no address of ``bootstrap`` accepts a TCP connection.

    kafka-python retries an unreachable bootstrap for its whole request timeout and logs each
    attempt; a plain connect per address answers in well under ``timeout_s`` in total.

    Only TCP: nothing is sent, so a TLS or SASL listener counts as reachable like a plaintext
    one (no security settings needed here); a failed handshake or authentication shows up when
    the clients connect, in their own errors.

    Raises
    ------
    ValidationError
        ``bootstrap`` is not ``host:port[,host:port…]``.
    BrokerError
        No address accepts a connection; the message names them, the reason and :data:`BROKER_HINT`.
    """
    addresses = parse_bootstrap(bootstrap)
    per_address = max(0.2, timeout_s / len(addresses))
    reasons = []
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=per_address):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port} ({exc.strerror or type(exc).__name__})")
    raise BrokerError(f"no Kafka broker reachable at {', '.join(reasons)}: {BROKER_HINT}")


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port[,host:port…]`` as pairs; IPv6 hosts in brackets (``[::1]:9092``).

    Raises
    ------
    ValidationError
        An empty list, a missing or out-of-range port.
    """
    pairs = []
    for item in (part.strip() for part in bootstrap.split(",")):
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not item or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValidationError(
                f"Kafka bootstrap {bootstrap[:200]!r}: expected host:port[,host:port…] "
                "with ports 1-65535"
            )
        pairs.append((host, int(port)))
    return pairs


def validate_topics(topics: Mapping[str, int]) -> None:
    """Refuse empty names and partition counts that are not integers >= 1."""
    for name, partitions in topics.items():
        if not name or isinstance(partitions, bool) or not isinstance(partitions, int):
            raise ValidationError(
                f"topic {name!r} has partitions {partitions!r}: "
                "expected a non-empty name and an integer"
            )
        if partitions < 1:
            raise ValidationError(f"topic {name!r} has partitions {partitions}: expected >= 1")


def create_missing_topics(
    admin: KafkaAdminClient,
    topics: Mapping[str, int],
    replication_factor: int = 1,
    timeout_ms: int = 30_000,
) -> list[str]:
    """:func:`ensure_topics` on an open admin client; kafka-python errors pass through."""
    existing = set(admin.list_topics())
    _warn_fewer_partitions(admin, {n: p for n, p in topics.items() if n in existing})
    missing = sorted(name for name in topics if name not in existing)
    if not missing:
        return []
    try:
        # One request for all: the embedded broker creates its topics this way at start, before
        # a client's request can make Tansu auto-create one with its default partitions.
        admin.create_topics(
            [NewTopic(name, topics[name], replication_factor) for name in missing],
            timeout_ms=timeout_ms,
        )
        created = missing
    except TopicAlreadyExistsError:
        # Someone created one meanwhile: go one by one, so that one does not hide the others.
        created = []
        for name in missing:
            try:
                admin.create_topics(
                    [NewTopic(name, topics[name], replication_factor)], timeout_ms=timeout_ms
                )
                created.append(name)
            except TopicAlreadyExistsError:
                logger.debug("topic %s was created concurrently", name)
    for name in created:
        logger.info("created topic %s with %d partitions", name, topics[name])
    return created


def _warn_fewer_partitions(admin: KafkaAdminClient, wanted: Mapping[str, int]) -> None:
    if not wanted:
        return
    for description in admin.describe_topics(list(wanted)):
        name = description.get("name")
        have = len(description.get("partitions") or [])
        if name in wanted and have < wanted[name]:
            logger.warning(
                "topic %s has %d partitions, fewer than the %d asked for: left unchanged",
                name,
                have,
                wanted[name],
            )
