"""The dead-letter topic: messages the consumer could not decode, kept with the reason.

A dead letter is the original message (same key, same payload, original headers kept) plus
``minder-*`` headers naming the reason and where it came from, so an operator can inspect it,
fix the producer, and feed the payload back if it is worth it. A payload too big for the
dead-letter producer is kept truncated (its first 64 KiB); the ``minder-payload-sha256`` and
``minder-payload-bytes`` headers always describe the whole original payload, so a truncated
dead letter still identifies the message it came from.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from minder.core.errors import BrokerError, DecodeError
from minder.core.records import DEADLETTER_TOPIC
from minder.core.signing import AUTH_REASONS, AuthError
from minder.stream.closing import close_client
from minder.stream.metadata import with_topic_creation
from minder.stream.security import connection_config

logger = logging.getLogger(__name__)

REASON_HEADER = "minder-reason"
REASON_CLASS_HEADER = "minder-reason-class"
SOURCE_TOPIC_HEADER = "minder-source-topic"
SOURCE_PARTITION_HEADER = "minder-source-partition"
SOURCE_OFFSET_HEADER = "minder-source-offset"
SOURCE_TIMESTAMP_HEADER = "minder-source-timestamp"
PAYLOAD_SHA256_HEADER = "minder-payload-sha256"
"""SHA-256 (hex) of the whole original payload, whether or not the dead letter keeps all of it."""
PAYLOAD_BYTES_HEADER = "minder-payload-bytes"
"""Size of the whole original payload in bytes (more than the dead letter's when truncated)."""
_MAX_REASON_BYTES = 4096

DECODER_FAILURE = "decoder_failure"
"""Reason class of an exception other than :class:`DecodeError` raised by the decoder (a bug)."""

# Ordered (pattern, class) pairs matched at the start of the codec's DecodeError reasons; the
# classes are few and fixed, so they can label a Prometheus counter.
_REASON_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"empty message", "empty"),
        (r"undecodable payload", "undecodable"),
        (r"envelope is", "not_an_object"),
        (r"field 'schema'", "schema_version"),
        (r"samples\[\d+\] has unknown metric", "unknown_metric"),
        (r"samples\[", "bad_sample"),
        (r"columns have", "bad_sample"),
        (r"events\[", "bad_event"),
        (r"unknown layout", "unknown_layout"),
        (r"layout_def pairs\[\d+\] has unknown metric", "unknown_metric"),
        (r"layout_def", "bad_layout"),
        (r"field 'values'", "bad_values"),
        (r"values\[", "bad_sample"),
        (r"field ", "bad_field"),
        (r"envelope has both", "bad_field"),
    )
)
HANDLER_ERROR = "handler_error"
REASON_CLASSES: tuple[str, ...] = (
    *dict.fromkeys(name for _, name in _REASON_PATTERNS),
    "invalid",
    DECODER_FAILURE,
    HANDLER_ERROR,
    *AUTH_REASONS,
)
"""Every value :func:`reason_class` returns (signature failures included: their classes are
:data:`~minder.core.signing.AUTH_REASONS`)."""


class HandlerError(Exception):
    """A batch that decoded but that the service's handler raised on, poll after poll: it is
    dead-lettered (class ``handler_error``) so that it cannot stall the stream."""


def reason_class(exc: BaseException) -> str:
    """A short, bounded name for why decoding failed (one of :data:`REASON_CLASSES`)."""
    if isinstance(exc, HandlerError):
        return HANDLER_ERROR
    if isinstance(exc, AuthError):
        return exc.reason.value
    if not isinstance(exc, DecodeError):
        return DECODER_FAILURE
    for pattern, name in _REASON_PATTERNS:
        if pattern.match(exc.reason):
            return name
    return "invalid"


def describe_failure(exc: BaseException) -> str:
    """The reason text stored in the ``minder-reason`` header."""
    if isinstance(exc, DecodeError):
        return exc.reason
    if isinstance(exc, HandlerError | AuthError):
        return str(exc)
    return f"decoder raised {type(exc).__name__}: {exc}"


def dead_letter_headers(
    original: Sequence[tuple[str, bytes]] | None,
    *,
    reason: str,
    reason_cls: str,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    payload: bytes | None = None,
) -> list[tuple[str, bytes]]:
    """The headers of a dead letter: the original ones, then Minder's.

    ``payload``, the whole original payload (``None`` for an absent one: empty), gives the
    ``minder-payload-sha256`` and ``minder-payload-bytes`` headers.
    """
    whole = payload or b""
    headers = list(original or [])
    headers += [
        (REASON_HEADER, reason.encode("utf-8", errors="replace")[:_MAX_REASON_BYTES]),
        (REASON_CLASS_HEADER, reason_cls.encode()),
        (SOURCE_TOPIC_HEADER, topic.encode()),
        (SOURCE_PARTITION_HEADER, str(partition).encode()),
        (SOURCE_OFFSET_HEADER, str(offset).encode()),
        (PAYLOAD_SHA256_HEADER, hashlib.sha256(whole).hexdigest().encode()),
        (PAYLOAD_BYTES_HEADER, str(len(whole)).encode()),
    ]
    if timestamp_ms is not None:
        headers.append((SOURCE_TIMESTAMP_HEADER, str(timestamp_ms).encode()))
    return headers


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message read back from the dead-letter topic.

    Attributes
    ----------
    key, payload
        The original message's key and value, unchanged.
    reason, reason_class
        Why it was refused (see :func:`reason_class`).
    source_topic, source_partition, source_offset
        Where it was first read.
    offset
        Its own offset in the dead-letter topic (per partition).
    headers
        Every header, the original ones included.
    payload_sha256, payload_bytes
        SHA-256 (hex) and size of the whole original payload; ``None`` for a dead letter
        written before these headers existed.
    """

    key: bytes | None
    payload: bytes
    reason: str
    reason_class: str
    source_topic: str
    source_partition: int
    source_offset: int
    partition: int
    offset: int
    headers: tuple[tuple[str, bytes], ...]
    payload_sha256: str | None = None
    payload_bytes: int | None = None

    @property
    def truncated(self) -> bool:
        """True when ``payload`` is only the start of the original one (too big to keep)."""
        return self.payload_bytes is not None and self.payload_bytes > len(self.payload)

    @property
    def job(self) -> str:
        """The key as text (the job id for metric batches)."""
        return (self.key or b"").decode("utf-8", errors="replace")


def _header(headers: Sequence[tuple[str, bytes]], name: str) -> str:
    # The last one wins: a message dead-lettered twice (fed back, refused again) keeps both sets.
    value = ""
    for key, raw in headers:
        if key == name:
            value = raw.decode("utf-8", errors="replace")
    return value


def _int_header(headers: Sequence[tuple[str, bytes]], name: str) -> int:
    text = _header(headers, name)
    return int(text) if text.lstrip("-").isdigit() else -1


def read_dead_letters(
    bootstrap: str,
    topic: str = DEADLETTER_TOPIC,
    *,
    timeout_s: float = 10.0,
    client_id: str = "minder-deadletter-reader",
    client_options: Mapping[str, Any] | None = None,
) -> list[DeadLetter]:
    """Read every message in the dead-letter topic as of now, without a consumer group.

    Returns the dead letters ordered by partition and offset; an absent topic gives ``[]``.
    ``client_options``: connection settings (security protocol, TLS, SASL), as
    :meth:`minder.config.KafkaSettings.client_options` gives them.

    Raises
    ------
    BrokerError
        The broker cannot be reached, or the topic could not be read to its end in
        ``timeout_s``.
    """
    connection = connection_config(client_options)
    try:
        config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "client_id": client_id,
            "group_id": None,
            "fetch_max_wait_ms": 100,
            "enable_auto_commit": False,
            "request_timeout_ms": max(1000, int(timeout_s * 1000)),
            "allow_auto_create_topics": False,  # reading a topic never creates it
            **connection,
        }
        consumer = with_topic_creation(KafkaConsumer(**config), config)
    except KafkaError as exc:
        raise BrokerError(f"cannot reach the Kafka brokers at {bootstrap!r}: {exc!r}") from exc
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        # Tansu's ListOffsets answers the base offset of the last record batch + 1, short of
        # the real end when that batch holds several records; the high watermark of a fetch
        # response is right, so read until both are reached and a poll comes back empty.
        listed_end = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        letters: list[DeadLetter] = []
        deadline = time.monotonic() + timeout_s
        while True:
            fetched = consumer.poll(timeout_ms=200)
            for records in fetched.values():
                letters.extend(_to_dead_letter(r) for r in records)
            behind = [tp.partition for tp in tps if not _read_to_end(consumer, tp, listed_end[tp])]
            if not fetched and not behind:
                break
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"read {len(letters)} dead letters from {topic!r} but partitions {behind} "
                    f"were not read to the end within {timeout_s:g} s"
                )
        letters.sort(key=lambda d: (d.partition, d.offset))
        return letters
    except KafkaError as exc:
        raise BrokerError(f"cannot read dead letters from {topic!r}: {exc!r}") from exc
    finally:
        close_client(consumer)


def _read_to_end(consumer: KafkaConsumer, tp: TopicPartition, listed_end: int) -> bool:
    highwater = consumer.highwater(tp)
    if highwater is None:  # no fetch response for the partition yet
        return False
    position: int = consumer.position(tp)
    return position >= max(highwater, listed_end)


def _to_dead_letter(record: ConsumerRecord) -> DeadLetter:
    headers = tuple(record.headers or ())
    return DeadLetter(
        key=record.key,
        payload=record.value or b"",
        reason=_header(headers, REASON_HEADER),
        reason_class=_header(headers, REASON_CLASS_HEADER),
        source_topic=_header(headers, SOURCE_TOPIC_HEADER),
        source_partition=_int_header(headers, SOURCE_PARTITION_HEADER),
        source_offset=_int_header(headers, SOURCE_OFFSET_HEADER),
        partition=record.partition,
        offset=record.offset,
        headers=headers,
        payload_sha256=_header(headers, PAYLOAD_SHA256_HEADER) or None,
        payload_bytes=size if (size := _int_header(headers, PAYLOAD_BYTES_HEADER)) >= 0 else None,
    )
