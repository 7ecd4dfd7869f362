"""Producers: node batches to the metrics topic, alerts (JSON) to the alerts topic.

Delivery is asynchronous: :meth:`BatchProducer.send` queues the message and returns; the broker's
acknowledgement or the final failure (after retries, ``delivery_timeout_ms``) is counted in
:class:`ProducerStats` and failures are logged. :meth:`flush` waits for everything queued.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson
from kafka import KafkaProducer
from kafka.errors import (
    KafkaConfigurationError,
    KafkaError,
    UnknownError,
    UnknownTopicOrPartitionError,
)

from minder.core.alert import Alert
from minder.core.encode import BatchEncoder
from minder.core.errors import BrokerError, ValidationError
from minder.core.records import ALERTS_TOPIC, METRICS_TOPIC, NodeBatch
from minder.core.signing import FleetSigner
from minder.core.wire import AGENT_FORMAT, WireFormat
from minder.stream.closing import close_producer
from minder.stream.metadata import with_topic_creation
from minder.stream.security import connection_config

if TYPE_CHECKING:
    from minder.config import KafkaSettings

logger = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]

COMPRESSION_TYPES = (None, "gzip", "snappy", "lz4", "zstd")
"""Values of ``compression``; all but ``None`` and ``gzip`` need an extra Python package."""

DEFAULT_COMPRESSION: str | None = None
"""No compression: gzip (the one codec kafka-python has without extra packages) cost ~40 % of
the produce rate in ``bench/stream_throughput.py``; choose it where network bandwidth is short."""


@dataclass(slots=True)
class ProducerStats:
    """Counters of one producer, for the service to export.

    Attributes
    ----------
    sent
        Messages handed to the client.
    delivered
        Messages the broker acknowledged.
    failed
        Messages the client gave up on (after its retries); each is logged.
    bytes_sent
        Payload bytes handed to the client (before compression).
    resent
        Resends of messages the broker refused with an error worth retrying.
    last_error
        Text of the latest delivery failure.
    """

    sent: int = 0
    delivered: int = 0
    failed: int = 0
    bytes_sent: int = 0
    resent: int = 0
    last_error: str = ""

    @property
    def pending(self) -> int:
        """Messages neither acknowledged nor failed yet."""
        return self.sent - self.delivered - self.failed


# Errors the client gives up on at once but that pass: Tansu answers UnknownError for a topic it
# does not have (yet), e.g. to the messages a client queued while the broker restarted.
_RESENDABLE = (UnknownError, UnknownTopicOrPartitionError)


@dataclass(frozen=True, slots=True)
class _Message:
    key: str
    value: bytes
    headers: list[tuple[str, bytes]] | None
    attempt: int = 0
    due: float = 0.0


class _Publisher:
    """A kafka-python producer with Minder's settings, counters and error translation.

    The client retries what it considers transient by itself (up to ``delivery_timeout_ms``); a
    message refused with ``UnknownError`` or ``UnknownTopicOrPartition`` is sent again by this
    class, up to ``max_resends`` times, ``resend_backoff_s`` apart, from the caller's thread (at
    the next send or flush). A resent message may arrive after newer ones of the same key.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str,
        client_id: str,
        compression: str | None,
        linger_ms: int,
        acks: int | str,
        batch_size: int,
        max_block_ms: int,
        delivery_timeout_ms: int,
        bootstrap_timeout_ms: int,
        extra_config: Mapping[str, Any] | None,
        client_options: Mapping[str, Any] | None = None,
        max_resends: int = 3,
        resend_backoff_s: float = 0.5,
    ) -> None:
        if compression not in COMPRESSION_TYPES:
            raise ValidationError(
                f"compression is {compression!r}: expected one of {list(COMPRESSION_TYPES)}"
            )
        if not topic:
            raise ValidationError("topic is empty: expected a topic name")
        self.topic = topic
        self.stats = ProducerStats()
        self._lock = threading.Lock()  # the counters change in the client's I/O thread too
        self._resends: deque[_Message] = deque()  # appended by the I/O thread, sent by ours
        self._max_resends = max_resends
        self._resend_backoff_s = resend_backoff_s
        config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "client_id": client_id,
            "compression_type": compression,
            "linger_ms": linger_ms,
            "acks": acks,
            "batch_size": batch_size,
            "max_block_ms": max_block_ms,
            "delivery_timeout_ms": delivery_timeout_ms,
            "bootstrap_timeout_ms": bootstrap_timeout_ms,
            # kafka-python 3 turns idempotence on by default; Tansu answers such produce requests
            # with UnknownError, and a broker restart would lose the producer ids anyway.
            # Duplicates are harmless here (the detectors tolerate repeated samples, alerts have
            # stable ids).
            "enable_idempotence": False,
            # The default backoff grows to 30 s; a restarted broker should be found in ~1 s.
            "reconnect_backoff_max_ms": 1000,
            # Topics come from ensure_topics with their partition counts, never from the
            # broker's defaults because a client happened to ask first.
            "allow_auto_create_topics": False,
        }
        config.update(connection_config(client_options))
        config.update(extra_config or {})
        try:
            self._producer = with_topic_creation(KafkaProducer(**config), config)
        except KafkaConfigurationError as exc:
            raise ValidationError(f"invalid Kafka producer settings: {exc}") from exc
        except KafkaError as exc:
            raise BrokerError(f"cannot create a Kafka producer for {bootstrap!r}: {exc!r}") from exc

    def _produce(self, key: str, value: bytes, headers: Headers | None = None) -> None:
        self._resend_due()
        message = _Message(key, value, list(headers) if headers else None)
        # Count first: the acknowledgement may arrive (in the I/O thread) before send() returns.
        with self._lock:
            self.stats.sent += 1
            self.stats.bytes_sent += len(value)
        try:
            self._send(message)
        except BrokerError:
            with self._lock:
                self.stats.sent -= 1
                self.stats.bytes_sent -= len(value)
            raise

    def _send(self, message: _Message) -> None:
        try:
            future = self._producer.send(
                self.topic, value=message.value, key=message.key.encode(), headers=message.headers
            )
        except KafkaError as exc:
            raise BrokerError(f"cannot queue a message for topic {self.topic!r}: {exc!r}") from exc
        future.add_callback(self._on_delivered)
        future.add_errback(self._on_failed, message)

    def _on_delivered(self, _metadata: Any) -> None:
        with self._lock:
            self.stats.delivered += 1

    def _on_failed(self, message: _Message, exc: BaseException) -> None:
        # Runs in the client's I/O thread: only queue the resend, the caller's thread sends it.
        if isinstance(exc, _RESENDABLE) and message.attempt < self._max_resends:
            due = time.monotonic() + self._resend_backoff_s
            self._resends.append(replace(message, attempt=message.attempt + 1, due=due))
            return
        self._give_up(message, exc)

    def _give_up(self, message: _Message, exc: BaseException) -> None:
        with self._lock:
            self.stats.failed += 1
            self.stats.last_error = repr(exc)
        logger.error(
            "message for topic %s (key %s) was not delivered after %d attempts: %r",
            self.topic,
            message.key,
            message.attempt + 1,
            exc,
        )

    def _resend_due(self) -> None:
        now = time.monotonic()
        while self._resends and self._resends[0].due <= now:
            message = self._resends.popleft()
            with self._lock:
                self.stats.resent += 1
            try:
                self._send(message)
            except BrokerError as exc:
                self._give_up(message, exc)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is acknowledged or has failed for good.

        Resends (see the class documentation) happen here too.

        Raises
        ------
        BrokerError
            Messages are still pending after ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self._producer.flush(timeout=remaining)
            except KafkaError as exc:
                raise self._still_pending(timeout_s, exc) from exc
            if self.stats.pending == 0:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise self._still_pending(timeout_s, None)
            # Either resends wait for their backoff, or an errback is still on its way.
            time.sleep(
                0.01 if not self._resends else max(0.0, self._resends[0].due - time.monotonic())
            )
            self._resend_due()

    def _still_pending(self, timeout_s: float | None, exc: BaseException | None) -> BrokerError:
        why = f": {exc!r}" if exc is not None else ""
        return BrokerError(
            f"{self.stats.pending} messages for topic {self.topic!r} still pending after "
            f"{timeout_s} s{why}"
        )

    def close(self, timeout_s: float | None = 10.0) -> None:
        """Deliver what is queued (up to ``timeout_s``) and release the connection."""
        try:
            self.flush(timeout_s)
        except BrokerError as exc:
            logger.error(
                "closing the producer of %s with messages undelivered: %s", self.topic, exc
            )
        close_producer(self._producer, 0.0 if timeout_s is not None else 30.0)
        for message in self._resends:
            self._give_up(message, BrokerError("producer closed before the resend"))
        self._resends.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class BatchProducer(_Publisher):
    """Sends :class:`NodeBatch` messages to the metrics topic, keyed by job id.

    The key keeps one job's batches in one partition, so the consumer sees them in the order a
    node sent them and each job's state lives in one detection worker.

    Parameters
    ----------
    bootstrap
        ``host:port[,host:port…]`` of the brokers.
    topic
        The metrics topic.
    fmt
        Wire encoding (:mod:`minder.core.codec`): packed (schema 2, the default; each node's
        layout inlined now and then by a :class:`~minder.core.codec.BatchEncoder`), or
        ``msgpack`` / ``json`` (schema 1) for consumers older than schema 2.
    compression
        Kafka batch compression, one of :data:`COMPRESSION_TYPES`.
    linger_ms, batch_size
        How long and how much the client gathers into one request per partition.
    acks
        ``0``, ``1`` or ``"all"``.
    max_block_ms
        How long :meth:`send` may block when the broker's metadata is unknown (broker down at
        start-up) before it raises :class:`BrokerError`.
    delivery_timeout_ms
        How long a queued message is retried (through a broker restart, say) before it is
        counted as failed.
    bootstrap_timeout_ms
        How long the constructor tries to reach a broker before it raises
        :class:`BrokerError`.
    extra_config
        Further ``KafkaProducer`` settings, overriding the above.
    client_options
        Connection settings every client shares (security protocol, TLS, SASL):
        :meth:`minder.config.KafkaSettings.client_options`.
    signer
        Signs each batch with its node's key (``minder-sig`` header), as each node's agent
        would: the simulator's and the demo's producers hold the cluster key
        (docs/security.md). None sends unsigned batches, which a service in the default
        ``required`` mode dead-letters.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str = METRICS_TOPIC,
        fmt: WireFormat = AGENT_FORMAT,
        client_id: str = "minder-agent",
        compression: str | None = DEFAULT_COMPRESSION,
        linger_ms: int = 20,
        batch_size: int = 256 * 1024,
        acks: int | str = 1,
        max_block_ms: int = 5_000,
        delivery_timeout_ms: int = 120_000,
        bootstrap_timeout_ms: int = 10_000,
        extra_config: Mapping[str, Any] | None = None,
        client_options: Mapping[str, Any] | None = None,
        signer: FleetSigner | None = None,
    ) -> None:
        super().__init__(
            bootstrap,
            topic=topic,
            client_id=client_id,
            compression=compression,
            linger_ms=linger_ms,
            acks=acks,
            batch_size=batch_size,
            max_block_ms=max_block_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            bootstrap_timeout_ms=bootstrap_timeout_ms,
            extra_config=extra_config,
            client_options=client_options,
        )
        self.fmt = WireFormat(fmt)
        self.encoder = BatchEncoder(self.fmt)
        self.signer = signer
        self._encode_lock = threading.Lock()  # the encoder remembers what each node announced

    @classmethod
    def from_settings(cls, settings: KafkaSettings, **overrides: Any) -> BatchProducer:
        """Build from the ``kafka`` section of the settings."""
        options: dict[str, Any] = {
            "topic": settings.metrics_topic,
            "client_id": f"{settings.client_id}-agent",
            "client_options": settings.client_options(),
        }
        options.update(overrides)
        return cls(settings.bootstrap, **options)

    def send(self, batch: NodeBatch) -> None:
        """Encode ``batch`` and queue it, keyed by its job.

        Raises
        ------
        BrokerError
            The client could not queue it within ``max_block_ms``.
        """
        with self._encode_lock:
            value = self.encoder.encode(batch)
        # Signed as each node's agent would (a resend keeps its signature: the service takes a
        # duplicate for a replay and dead-letters it, counted).
        headers = None if self.signer is None else [self.signer.header(batch.node, value)]
        try:
            self._produce(batch.job, value, headers)
        except BrokerError:
            with self._encode_lock:  # the lost batch may have carried a layout: announce again
                self.encoder.forget()
            raise


class JsonPublisher(_Publisher):
    """Publishes JSON objects (orjson) to one topic, with a string key.

    The parameters are those of :class:`BatchProducer`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        client_id: str = "minder",
        compression: str | None = DEFAULT_COMPRESSION,
        linger_ms: int = 5,
        batch_size: int = 64 * 1024,
        acks: int | str = "all",
        max_block_ms: int = 5_000,
        delivery_timeout_ms: int = 120_000,
        bootstrap_timeout_ms: int = 10_000,
        extra_config: Mapping[str, Any] | None = None,
        client_options: Mapping[str, Any] | None = None,
        signer: FleetSigner | None = None,
    ) -> None:
        super().__init__(
            bootstrap,
            topic=topic,
            client_id=client_id,
            compression=compression,
            linger_ms=linger_ms,
            acks=acks,
            batch_size=batch_size,
            max_block_ms=max_block_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            bootstrap_timeout_ms=bootstrap_timeout_ms,
            extra_config=extra_config,
            client_options=client_options,
        )

    def publish(self, key: str, data: Mapping[str, Any], headers: Headers | None = None) -> None:
        """Queue ``data`` as JSON under ``key``.

        Raises
        ------
        ValidationError
            ``data`` holds something JSON cannot carry.
        BrokerError
            The client could not queue it within ``max_block_ms``.
        """
        try:
            value = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError as exc:
            raise ValidationError(
                f"message for key {key!r} is not JSON-serialisable: {exc}"
            ) from None
        self._produce(key, value, headers)


class AlertPublisher(JsonPublisher):
    """Publishes :class:`Alert` records (``Alert.to_dict()``) to the alerts topic, keyed by job."""

    def __init__(self, bootstrap: str, topic: str = ALERTS_TOPIC, **options: Any) -> None:
        super().__init__(bootstrap, topic, **options)

    @classmethod
    def from_settings(cls, settings: KafkaSettings, **overrides: Any) -> AlertPublisher:
        """Build from the ``kafka`` section of the settings."""
        options: dict[str, Any] = {
            "client_id": f"{settings.client_id}-alerts",
            "client_options": settings.client_options(),
        }
        options.update(overrides)
        return cls(settings.bootstrap, settings.alerts_topic, **options)

    def publish_alert(self, alert: Alert) -> None:
        """Queue one alert; a status change is published again under the same ``id``."""
        self.publish(alert.job, alert.to_dict(), headers=[("minder-alert-id", alert.id.encode())])
