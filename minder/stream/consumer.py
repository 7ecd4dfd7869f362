"""The detection service's consumer of the metrics topic.

Delivery is **at least once**. Each poll is one unit of work:

1. every message is decoded; one that cannot be (a :class:`DecodeError`, or any exception the
   decoder raises) is copied to the dead-letter topic with its reason and counted, and never
   stops the consumer;
2. the good batches of the poll go to the handler in one list, partition by partition, each
   partition's in offset order (so one job's batches arrive in the order they were produced);
3. only when the handler has returned and the dead letters are acknowledged are the offsets
   committed.

If the handler raises (or a dead letter cannot be written) nothing is committed and the consumer
seeks back to the first message of the poll, so the next poll delivers the same messages again.
A crash between handling and committing, or a rebalance that moves a partition to another
worker, also redelivers them: after every rebalance each partition resumes from the group's
committed offset (kafka-python alone would keep the old position of a partition it keeps, which
skips messages when a memory-only broker restarted empty), and when the brokers answer with a
new cluster id (a cluster formatted anew, as the embedded broker is at each start) every
assigned partition starts again from the beginning of its new log; so does every partition a
later rebalance assigns while its committed offset is still the one it had at the first rebalance
after the change (a commit made in the new cluster before its id was known may be a position of
the old logs). Handlers must therefore
tolerate seeing a batch twice (docs/architecture.md §3.3: samples may be late or duplicated). A
message dead-lettered in a poll that is then redelivered is not dead-lettered twice by the same
consumer (unless a rebalance came in between).

The handler must return within ``max_poll_interval_ms`` or the group evicts this consumer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConfigurationError,
    KafkaError,
    KafkaTimeoutError,
)
from kafka.structs import OffsetAndMetadata, TopicPartition

from minder.core.codec import decode_batch
from minder.core.errors import BrokerError, ValidationError
from minder.core.records import DEADLETTER_TOPIC, METRICS_TOPIC, NodeBatch
from minder.core.signing import AuthError
from minder.stream.auth import BatchAuthenticator
from minder.stream.closing import close_client
from minder.stream.deadletter import (
    REASON_CLASSES,
    HandlerError,
    dead_letter_headers,
    describe_failure,
    reason_class,
)
from minder.stream.metadata import with_topic_creation
from minder.stream.security import connection_config

if TYPE_CHECKING:
    from kafka.producer.future import FutureRecordMetadata

    from minder.config import KafkaSettings

logger = logging.getLogger(__name__)

MAX_ID_CHARS = 64
"""A cluster id the brokers send is cut to this length in the log."""
JOIN_SLICE_MS = 500
"""A poll waiting for a group join looks this often whether the consumer is being stopped."""

BatchHandler = Callable[[list[NodeBatch]], object]
"""Receives the good batches of one poll; its return value is ignored, raising means retry."""

_LOG_EVERY = 100  # after the first dead letter of a reason class, log one in this many
# A dead letter on its way: source partition, offset, reason class, the send (or its error).
_Send = tuple[TopicPartition, ConsumerRecord, str, "FutureRecordMetadata | KafkaError"]
DEAD_LETTER_ATTEMPTS = 3
"""Polls a message that cannot be dead-lettered is retried before it is skipped (the second try
writes its payload truncated to :data:`TRUNCATED_BYTES`)."""
TRUNCATED_BYTES = 64 * 1024
"""How much of a payload a truncated dead letter keeps (its headers ``minder-payload-sha256`` and
``minder-payload-bytes`` describe the whole payload)."""


@dataclass(slots=True)
class ConsumerStats:
    """Counters of one :class:`BatchConsumer`, for the service to export.

    Counts include redeliveries: a message seen twice is counted twice in ``consumed``.

    Attributes
    ----------
    polls
        Polls that returned at least one message.
    consumed
        Messages received.
    decoded
        Messages decoded into a batch.
    handled
        Batches the handler returned from.
    dead_lettered
        Messages written to the dead-letter topic (acknowledged).
    dead_lettered_by_reason
        ``dead_lettered`` split by :func:`~minder.stream.deadletter.reason_class`; holds every
        class of :data:`~minder.stream.deadletter.REASON_CLASSES` from the start (at 0), so its
        keys never change while another thread reads it.
    deadletter_failures
        Polls retried because a dead letter could not be written.
    skipped
        Messages skipped after :data:`DEAD_LETTER_ATTEMPTS` polls could not dead-letter them
        (not even truncated): counted and logged with their partition and offset, so one
        message never stalls the stream.
    handler_failures
        Polls retried because the handler raised.
    rewound
        Messages sought back for redelivery.
    commits, commit_failures
        Offset commits that succeeded / failed (a failed commit is covered by the next one, or
        the messages are redelivered after a restart or rebalance).
    last_lag_s
        ``now - newest batch ts`` of the latest handled poll: how far detection trails the
        machines.
    last_batch_ts
        Newest batch timestamp handled so far.
    backlog_messages
        Messages in the assigned partitions not yet consumed, as of the latest fetch.
    backlog_by_partition
        ``backlog_messages`` per assigned ``(topic, partition)``: the partition's high watermark
        minus its entry in ``offset_by_partition`` (0 until a fetch says more), brought up to
        date after every poll, failed ones included, so a partition stuck on a message shows
        a lag that grows; replaced, never mutated, so another thread may read it.
    offset_by_partition
        Per assigned ``(topic, partition)``, the next offset this consumer will hand over: the
        offset after the last message of the latest handled poll (what it commits), the first
        message of a poll that will be redelivered, or the committed offset it resumed from
        after a rebalance. Absent until known. An offset that stands still while the lag grows
        is a stuck partition. Replaced, never mutated.
    decode_failures_by_reason
        Messages that failed to decode, per reason class (counted when decoding fails, whether
        or not the dead letter could be written yet). Unlike the other counts, a message is
        counted once however many polls it takes to dead-letter it; only a consumer that gets it
        again after a rebalance or a restart counts it again.
    assigned_partitions
        Partitions this consumer owns now.
    cluster_changes
        Times the brokers answered with a new cluster id (a cluster formatted anew under a new
        id): every assigned partition was read again from the start of its new log (from its
        end with ``auto_offset_reset="latest"``), and so was every partition a later rebalance
        assigned while nobody had committed it since (:meth:`BatchConsumer._resume_from_committed`).
    dropped_joins
        Group joins the Kafka client dropped and was asked to make again
        (:meth:`BatchConsumer._complete_rejoin`).
    """

    polls: int = 0
    consumed: int = 0
    decoded: int = 0
    handled: int = 0
    dead_lettered: int = 0
    dead_lettered_by_reason: Counter[str] = field(
        default_factory=lambda: Counter(dict.fromkeys(REASON_CLASSES, 0))
    )
    deadletter_failures: int = 0
    skipped: int = 0
    handler_failures: int = 0
    rewound: int = 0
    commits: int = 0
    commit_failures: int = 0
    last_lag_s: float | None = None
    last_batch_ts: float | None = None
    backlog_messages: int = 0
    assigned_partitions: int = 0
    cluster_changes: int = 0
    dropped_joins: int = 0
    backlog_by_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    offset_by_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    decode_failures_by_reason: Counter[str] = field(
        default_factory=lambda: Counter(dict.fromkeys(REASON_CLASSES, 0))
    )

    def snapshot(self) -> ConsumerStats:
        """A copy, for a reader in another thread than the consumer's."""
        return replace(
            self,
            dead_lettered_by_reason=Counter(self.dead_lettered_by_reason),
            decode_failures_by_reason=Counter(self.decode_failures_by_reason),
            backlog_by_partition=dict(self.backlog_by_partition),
            offset_by_partition=dict(self.offset_by_partition),
        )


@dataclass(frozen=True, slots=True)
class PollOutcome:
    """What one :meth:`BatchConsumer.poll_once` did.

    Attributes
    ----------
    messages
        Messages received.
    batches
        Batches handed to the handler.
    dead_lettered
        Messages dead-lettered by this poll.
    committed
        Whether the poll's offsets were committed.
    error
        Why the poll will be redelivered (handler or dead-letter failure), else ``None``.
    """

    messages: int = 0
    batches: int = 0
    dead_lettered: int = 0
    committed: bool = False
    error: str | None = None


class _Assignments(ConsumerRebalanceListener):
    def __init__(self, owner: BatchConsumer) -> None:
        self._owner = owner

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if revoked:
            logger.info("partitions revoked: %s", _names(revoked))
        self._owner._forget(revoked)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        logger.info("partitions assigned: %s", _names(assigned))
        self._owner.stats.assigned_partitions = len(self._owner._consumer.assignment())
        for tp in assigned:
            self._owner._backlog.setdefault(tp, 0)
        self._owner._publish_backlog()
        # Runs inside the client's event loop, where a blocking request would stall it: the
        # consumer repositions these partitions itself, right after the poll.
        self._owner._reposition |= assigned


def _names(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)) or "none"


class BatchConsumer:
    """Consumer-group consumer of the metrics topic, with manual commits and a dead-letter topic.

    See the module documentation for the delivery semantics.

    Parameters
    ----------
    bootstrap
        ``host:port[,host:port…]`` of the brokers.
    group_id
        Consumer group of the detection workers.
    topic, deadletter_topic
        Where batches come from and undecodable messages go.
    auto_offset_reset
        Where a group without committed offsets starts: ``"earliest"`` replays what the topic
        holds, ``"latest"`` only sees new batches.
    max_poll_records
        Most messages one poll hands over.
    max_partition_fetch_bytes, fetch_max_bytes
        Most bytes one fetch brings back per partition, and in all. One poll is one detection
        pass and one commit, so larger polls amortise both (defaults: ``KafkaSettings``).
    max_poll_interval_ms, session_timeout_ms, heartbeat_interval_ms
        Group timings. kafka-python's default poll interval (5 min) is also the rebalance
        timeout, which makes every join wait; keep it short.
    bootstrap_timeout_ms
        How long the constructor tries to reach a broker before it raises
        :class:`BrokerError`.
    clock
        Source of "now" for the lag (unix seconds).
    extra_config
        Further ``KafkaConsumer`` settings, overriding the above.
    client_options
        Connection settings (security protocol, TLS, SASL) of the consumer and of its dead-letter
        producer: :meth:`minder.config.KafkaSettings.client_options`.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        group_id: str = "minder-detect",
        topic: str = METRICS_TOPIC,
        deadletter_topic: str = DEADLETTER_TOPIC,
        client_id: str = "minder",
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
        max_poll_records: int = 5000,
        max_partition_fetch_bytes: int = 8 << 20,
        fetch_max_bytes: int = 50 << 20,
        max_poll_interval_ms: int = 10_000,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        bootstrap_timeout_ms: int = 10_000,
        clock: Callable[[], float] = time.time,
        extra_config: dict[str, Any] | None = None,
        client_options: Mapping[str, Any] | None = None,
        authenticator: BatchAuthenticator | None = None,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValidationError(
                f"auto_offset_reset is {auto_offset_reset!r}: expected 'earliest' or 'latest'"
            )
        if not topic or not deadletter_topic or topic == deadletter_topic:
            raise ValidationError(
                f"topic {topic!r} and dead-letter topic {deadletter_topic!r}: expected two "
                "different non-empty names"
            )
        self.topic = topic
        self.deadletter_topic = deadletter_topic
        self.group_id = group_id
        self.stats = ConsumerStats()
        self._clock = clock
        # (partition, offset) of messages dead-lettered by a poll not committed yet, so a
        # redelivery does not write them again.
        self._pending_dead: set[tuple[TopicPartition, int]] = set()
        self._dead_attempts: dict[tuple[TopicPartition, int], int] = {}
        self._handler_tries: dict[tuple[tuple[TopicPartition, int], ...], int] = {}
        self._backlog: dict[TopicPartition, int] = {}
        self._offsets: dict[TopicPartition, int] = {}  # next offset to hand over, when known
        self._refused: Counter[str] = Counter()  # decode failures per reason class, for logging
        self._reposition: set[TopicPartition] = set()  # assigned, not yet sought to the commit
        self._cluster_id: str | None = None  # of the brokers this member last read from
        self._clusters_seen: set[str] = set()
        # From a new cluster to the first rebalance after it: the partitions whose committed
        # offset this member made knowing it (None: no new cluster is waiting for a rebalance).
        self._trusted: set[TopicPartition] | None = None
        # From that rebalance on: the committed offset of every partition this member had not
        # committed then, until someone commits it again (see _resume_from_committed).
        self._suspect: dict[TopicPartition, int | None] = {}
        self._flip_logged = False
        self._auto_offset_reset = auto_offset_reset
        self._closed = False
        self.authenticator = authenticator
        connection = connection_config(client_options)
        config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "group_id": group_id,
            "client_id": client_id,
            "enable_auto_commit": False,
            "auto_offset_reset": auto_offset_reset,
            "max_poll_records": max_poll_records,
            "max_partition_fetch_bytes": max_partition_fetch_bytes,
            "fetch_max_bytes": fetch_max_bytes,
            "max_poll_interval_ms": max_poll_interval_ms,
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": heartbeat_interval_ms,
            "bootstrap_timeout_ms": bootstrap_timeout_ms,
            "reconnect_backoff_max_ms": 1000,
            # Topics come from ensure_topics (see the producer); a missing one is waited for.
            "allow_auto_create_topics": False,
            **connection,
        }
        config.update(extra_config or {})
        self._join_timeout_ms = int(config["max_poll_interval_ms"])
        self._stop_waiting = threading.Event()
        try:
            self._consumer = with_topic_creation(KafkaConsumer(**config), config)
        except KafkaConfigurationError as exc:
            raise ValidationError(f"invalid Kafka consumer settings: {exc}") from exc
        except KafkaError as exc:
            raise BrokerError(f"cannot connect a consumer to {bootstrap!r}: {exc!r}") from exc
        try:
            deadletter_config: dict[str, Any] = {
                "bootstrap_servers": bootstrap,
                "client_id": f"{client_id}-deadletter",
                "acks": "all",
                "enable_idempotence": False,  # Tansu refuses idempotent produce requests
                "linger_ms": 0,
                "max_block_ms": 5_000,
                "bootstrap_timeout_ms": bootstrap_timeout_ms,
                "reconnect_backoff_max_ms": 1000,
                "allow_auto_create_topics": False,
                **connection,
            }
            self._deadletters = with_topic_creation(
                KafkaProducer(**deadletter_config), deadletter_config
            )
        except KafkaError as exc:
            close_client(self._consumer, autocommit=False)
            raise BrokerError(
                f"cannot connect the dead-letter producer to {bootstrap!r}: {exc!r}"
            ) from exc
        self._consumer.subscribe([topic], listener=_Assignments(self))

    @classmethod
    def from_settings(cls, settings: KafkaSettings, **overrides: Any) -> BatchConsumer:
        """Build from the ``kafka`` section of the settings."""
        options: dict[str, Any] = {
            "group_id": settings.group_id,
            "topic": settings.metrics_topic,
            "deadletter_topic": settings.deadletter_topic,
            "client_id": settings.client_id,
            "max_poll_records": settings.max_poll_records,
            "max_partition_fetch_bytes": settings.max_partition_fetch_bytes,
            "fetch_max_bytes": settings.fetch_max_bytes,
            "max_poll_interval_ms": settings.max_poll_interval_ms,
            "session_timeout_ms": settings.session_timeout_ms,
            "heartbeat_interval_ms": settings.heartbeat_interval_ms,
            "client_options": settings.client_options(),
        }
        options.update(overrides)
        return cls(settings.bootstrap, **options)

    # -- consuming -------------------------------------------------------------------------

    def poll_once(self, handler: BatchHandler, timeout_ms: int = 1000) -> PollOutcome:
        """Fetch, decode, dead-letter, hand over and commit one poll's messages.

        While the group is being (re)joined, the poll first waits for the join to end
        (:meth:`_complete_rejoin`); Tansu holds a join for about half ``session_timeout_ms``
        (5 s with the default 10 s).

        Raises
        ------
        BrokerError
            The broker cannot be reached or the consumer is closed. Handler exceptions are
            not raised: they are logged, counted, and the messages redelivered.
        """
        if self._closed:
            raise BrokerError("the consumer is closed")
        self._complete_rejoin()
        try:
            fetched: dict[TopicPartition, list[ConsumerRecord]] = self._consumer.poll(
                timeout_ms=timeout_ms
            )
        except KafkaError as exc:
            raise BrokerError(f"polling {self.topic!r} failed: {exc!r}") from exc
        cluster_id = self._new_cluster()
        if cluster_id is not None:
            # Read at positions in logs that are gone: read again from the start of the new ones.
            self._start_again(cluster_id)
            fetched = {}
        if self._reposition:
            repositioned = self._resume_from_committed()
            # Fetched from the positions held before the rebalance: fetched again after the seek.
            fetched = {tp: records for tp, records in fetched.items() if tp not in repositioned}
        if not fetched:
            return PollOutcome()
        partitions = sorted(fetched)
        n_messages = sum(len(fetched[tp]) for tp in partitions)
        self.stats.polls += 1
        self.stats.consumed += n_messages

        auth = self.authenticator
        batches: list[NodeBatch] = []
        sources: list[tuple[TopicPartition, ConsumerRecord]] = []
        sends: list[_Send] = []
        for tp in partitions:
            for record in fetched[tp]:
                if (tp, record.offset) in self._pending_dead:
                    continue  # dead-lettered already (a batch the handler could not take)
                try:
                    payload = record.value or b""
                    if auth is None:
                        batch = decode_batch(payload)
                    else:  # verified before it touches any state (the decoder learns layouts)
                        where = (tp, record.offset)
                        verified = auth.check(record.headers, payload, where)
                        batch = decode_batch(payload)
                        auth.check_batch(verified, batch.node, batch.job, where)
                    batches.append(batch)
                    sources.append((tp, record))
                except Exception as exc:  # any decoder or signature failure is a dead letter
                    if (tp, record.offset) in self._pending_dead:
                        continue
                    sends.append((tp, record, reason_class(exc), self._dead_letter(record, exc)))
        self.stats.decoded += len(batches)

        error = self._await_dead_letters(sends)
        if error is None and batches:
            error = self._handle(handler, batches)
            if error is not None:
                error = self._isolate(handler, batches, sources, error)
        if error is not None:
            if auth is not None:
                auth.rollback()  # redelivered: its sequence numbers are not replays
            self._rewind(fetched)
            self._update_backlog()
            return PollOutcome(n_messages, 0, len(sends), committed=False, error=error)

        committed = self._commit(fetched)
        if auth is not None and committed:
            # Kept pending while the offsets are not committed: after a rebalance the group
            # resumes from the last commit, and those messages come again (no replays).
            auth.commit()
        for tp, records in fetched.items():
            self._offsets[tp] = records[-1].offset + 1
        self._update_backlog()
        return PollOutcome(n_messages, len(batches), len(sends), committed=committed)

    def run(
        self,
        handler: BatchHandler,
        stop_event: threading.Event,
        *,
        poll_timeout_ms: int = 500,
        retry_backoff_s: float = 1.0,
    ) -> None:
        """Poll until ``stop_event`` is set; survives bad messages, handler and broker errors.

        After a failed poll (handler raised, dead letter not written, broker unreachable) it
        waits ``retry_backoff_s`` before the next one, so a persistent failure does not spin.
        """
        logger.info("consuming %s as group %s", self.topic, self.group_id)
        while not stop_event.is_set():
            try:
                outcome = self.poll_once(handler, poll_timeout_ms)
            except (BrokerError, KafkaError) as exc:
                if self._closed:
                    break
                logger.warning("%s; retrying in %.1f s", exc, retry_backoff_s)
                stop_event.wait(retry_backoff_s)
                continue
            if outcome.error is not None:
                stop_event.wait(retry_backoff_s)
        logger.info("stopped consuming %s", self.topic)

    # -- steps of a poll -------------------------------------------------------------------

    def _dead_letter(
        self, record: ConsumerRecord, exc: BaseException
    ) -> FutureRecordMetadata | KafkaError:
        reason = describe_failure(exc)
        cls = reason_class(exc)
        # A message whose dead letter could not be written is dead-lettered again by the retried
        # poll: it was counted at its first failure, and counts once.
        where = (TopicPartition(record.topic, record.partition), record.offset)
        if where not in self._dead_attempts:
            self._refused[cls] += 1
            if not isinstance(exc, AuthError):  # the authenticator counts and logs its own
                self.stats.decode_failures_by_reason[cls] += 1
        if isinstance(exc, AuthError):
            pass
        elif isinstance(exc, HandlerError):
            logger.error(
                "dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc
            )
        elif not isinstance(exc, ValidationError):
            logger.error(
                "decoder raised on %s[%d]@%d",
                record.topic,
                record.partition,
                record.offset,
                exc_info=exc,
            )
        elif self._refused[cls] % _LOG_EVERY == 1:
            logger.warning(
                "dead-lettering %s[%d]@%d (%s, %d so far): %s",
                record.topic,
                record.partition,
                record.offset,
                cls,
                self._refused[cls],
                reason,
            )
        headers = dead_letter_headers(
            record.headers,
            reason=reason,
            reason_cls=cls,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp,
            payload=record.value,
        )
        try:
            future: FutureRecordMetadata = self._deadletters.send(
                self.deadletter_topic, value=record.value, key=record.key, headers=headers
            )
        except KafkaError as send_error:
            return send_error
        return future

    def _await_dead_letters(self, sends: list[_Send]) -> str | None:
        """Wait for the dead letters of a poll; a message whose dead letter keeps failing is
        written truncated, then skipped, so the poll is retried at most a few times."""
        if not sends:
            return None
        try:
            self._deadletters.flush(timeout=10.0)
        except KafkaError as exc:
            logger.warning("dead letters not acknowledged: %r", exc)
        failed = 0
        for tp, record, cls, future in sends:
            if not isinstance(future, KafkaError) and future.succeeded():
                self._delivered_dead_letter(tp, record.offset, cls)
                continue
            why = future if isinstance(future, KafkaError) else future.exception
            key = (tp, record.offset)
            attempts = self._dead_attempts.get(key, 0) + 1
            self._dead_attempts[key] = attempts
            if attempts >= 2 and self._dead_letter_truncated(record, cls, why):
                self._delivered_dead_letter(tp, record.offset, cls)
                continue
            if attempts >= DEAD_LETTER_ATTEMPTS:
                self.stats.skipped += 1
                self._pending_dead.add(key)
                self._dead_attempts.pop(key, None)
                logger.error(
                    "skipping %s[%d]@%d (%d bytes): it could not be decoded (%s) nor written to "
                    "%s after %d tries (%r); counted in the skipped messages",
                    tp.topic,
                    tp.partition,
                    record.offset,
                    len(record.value or b""),
                    cls,
                    self.deadletter_topic,
                    attempts,
                    why,
                )
                continue
            failed += 1
            logger.error(
                "cannot write %s[%d]@%d to %s (try %d of %d): %r",
                tp.topic,
                tp.partition,
                record.offset,
                self.deadletter_topic,
                attempts,
                DEAD_LETTER_ATTEMPTS,
                why,
            )
        if failed:
            self.stats.deadletter_failures += 1
            return f"{failed} of {len(sends)} dead letters not written to {self.deadletter_topic!r}"
        return None

    def _delivered_dead_letter(self, tp: TopicPartition, offset: int, cls: str) -> None:
        self.stats.dead_lettered += 1
        self.stats.dead_lettered_by_reason[cls] += 1
        self._pending_dead.add((tp, offset))
        self._dead_attempts.pop((tp, offset), None)

    def _dead_letter_truncated(self, record: ConsumerRecord, cls: str, why: object) -> bool:
        """Write the dead letter with its payload cut to :data:`TRUNCATED_BYTES` (a message
        too big for the dead-letter producer), its headers giving the SHA-256 and size of the
        whole payload; True when acknowledged."""
        value = record.value or b""
        headers = dead_letter_headers(
            record.headers,
            reason=f"{cls}; payload truncated from {len(value)} bytes (first write: {why!r})"[:512],
            reason_cls=cls,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp,
            payload=value,
        )
        try:
            future = self._deadletters.send(
                self.deadletter_topic,
                value=value[:TRUNCATED_BYTES],
                key=(record.key or b"")[:1024] or None,
                headers=headers,
            )
            future.get(timeout=10.0)
        except KafkaError as exc:
            logger.warning("truncated dead letter not written either: %r", exc)
            return False
        return True

    def _isolate(
        self,
        handler: BatchHandler,
        batches: list[NodeBatch],
        sources: list[tuple[TopicPartition, ConsumerRecord]],
        error: str,
    ) -> str | None:
        """After :data:`DEAD_LETTER_ATTEMPTS` failed tries of the same poll, hand its batches
        over one at a time and dead-letter those the handler raises on while the others pass (a
        batch that crashes detection must not stall every partition). When every batch fails
        alone too, the trouble is the handler's (an outage): the poll is retried as before.
        Returns the error that remains, if any."""
        # The poll starts again at the same message after each rewind, whatever arrives after.
        key = tuple((tp, record.offset) for tp, record in sources[:1])
        tries = self._handler_tries.get(key, 0) + 1
        self._handler_tries = {key: tries}
        if tries < DEAD_LETTER_ATTEMPTS:
            return error
        failed: list[tuple[TopicPartition, ConsumerRecord, Exception]] = []
        for batch, (tp, record) in zip(batches, sources, strict=True):
            try:
                handler([batch])
            except Exception as exc:
                failed.append((tp, record, exc))
            else:
                self.stats.handled += 1
        if len(failed) == len(batches):
            # Every batch fails alone too: the handler's own trouble (its database is down),
            # not a poisoned batch. Nothing is dead-lettered; the poll is retried.
            self.stats.handler_failures += 1
            return error
        sends: list[_Send] = []
        for tp, record, raised in failed:
            self.stats.handler_failures += 1
            # Skipped by later polls only once its dead letter is acknowledged (_pending_dead).
            failure = HandlerError(
                f"the handler raised {type(raised).__name__} on this batch alone, after "
                f"{DEAD_LETTER_ATTEMPTS} failed polls: {str(raised)[:200]}"
            )
            sends.append((tp, record, "handler_error", self._dead_letter(record, failure)))
        self._handler_tries = {}
        return self._await_dead_letters(sends)

    def _handle(self, handler: BatchHandler, batches: list[NodeBatch]) -> str | None:
        try:
            handler(batches)
        except Exception as exc:
            self.stats.handler_failures += 1
            logger.exception("handler failed on %d batches; they will be redelivered", len(batches))
            return f"handler raised {type(exc).__name__}: {exc}"
        self.stats.handled += len(batches)
        newest = max(batch.ts for batch in batches)
        self.stats.last_batch_ts = max(newest, self.stats.last_batch_ts or newest)
        self.stats.last_lag_s = self._clock() - newest
        return None

    def _rewind(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        for tp, records in fetched.items():
            try:
                self._consumer.seek(tp, records[0].offset)
                self.stats.rewound += len(records)
                self._offsets[tp] = records[0].offset
            except IllegalStateError:
                # Revoked meanwhile: the new owner starts from the last commit, which is earlier.
                logger.info("%s[%d] no longer assigned; not rewinding it", tp.topic, tp.partition)

    def _commit(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> bool:
        offsets = {
            tp: OffsetAndMetadata(records[-1].offset + 1, "", -1) for tp, records in fetched.items()
        }
        try:
            self._consumer.commit(offsets=offsets)
        except (CommitFailedError, KafkaError) as exc:
            # Commits are cumulative: the next one covers these offsets; if none comes (crash,
            # rebalance) the messages are redelivered.
            self.stats.commit_failures += 1
            logger.warning("offset commit failed (messages may be redelivered): %r", exc)
            return False
        self.stats.commits += 1
        if self._trusted is not None:
            self._trusted.update(offsets)
        for tp in offsets:
            self._suspect.pop(tp, None)
        # Forget the dead letters the commit covers; later ones may still be redelivered.
        self._pending_dead = {
            (tp, offset)
            for tp, offset in self._pending_dead
            if tp not in offsets or offset >= offsets[tp].offset
        }
        return True

    def _update_backlog(self) -> None:
        """Lag of every partition whose next offset is known: its high watermark (as of the
        latest fetch of it) minus that offset, also after a poll that will be redelivered."""
        for tp, offset in self._offsets.items():
            try:
                highwater = self._consumer.highwater(tp)
            except IllegalStateError:
                continue
            if highwater is not None:
                self._backlog[tp] = max(0, highwater - offset)
        self._publish_backlog()

    def _publish_backlog(self) -> None:
        self.stats.backlog_by_partition = {
            (tp.topic, tp.partition): count for tp, count in self._backlog.items()
        }
        self.stats.offset_by_partition = {
            (tp.topic, tp.partition): offset for tp, offset in self._offsets.items()
        }
        self.stats.backlog_messages = sum(self._backlog.values())

    def _complete_rejoin(self) -> None:
        """Drive a group (re)join the client has started, or needs, to its end.

        kafka-python 3.0 (3.0.12) loses joins that outlive a poll. A broker holds a JoinGroup
        until the group's members have joined (Tansu: half the session timeout), longer than a
        short poll, so the join goes on in the background. (1) A join that completes between
        two polls is thrown away and sent again by the next one; a worker busy between polls
        with what the last one gave can loop on this for good. (2) A join asked for because
        the topic's partitions in the metadata differ from those of the group's last
        assignment (as after a broker restart) is not applied at all if it completes between
        polls: the leader's assignment records the partitions that asked for it, the next poll
        finds nothing to rejoin for, and the member keeps the partitions it revoked, never
        fetched again (CI read nothing for 30 s). So while a join is needed or under way, wait
        for it here, in slices of at most :data:`JOIN_SLICE_MS` until :meth:`stop_waiting` or
        :meth:`close`, up to ``max_poll_interval_ms`` (the rebalance timeout the broker holds a
        join for) plus 5 s, as the Java client does; a join dropped as in (2) is asked for again
        first. Nothing is done while the coordinator is unknown (the poll looks for it), or
        with a client without these (private) attributes.
        """
        coordinator: Any = getattr(self._consumer, "_coordinator", None)
        if not all(
            callable(getattr(coordinator, name, None))
            for name in (
                "need_rejoin",
                "request_rejoin",
                "ensure_active_group",
                "coordinator_unknown",
            )
        ):
            return
        started = getattr(coordinator, "rejoining", False) is True
        need = coordinator.need_rejoin()
        if not (started or need) or coordinator.coordinator_unknown():
            return
        if started and not need:
            task = getattr(coordinator, "_join_task", None)
            if task is None or getattr(task, "is_done", True):  # else the leader's join runs on
                logger.warning(
                    "the Kafka client dropped the group join it had started for %s (the "
                    "partitions changed while the broker held it): joining again",
                    self.topic,
                )
                self.stats.dropped_joins += 1
            coordinator.request_rejoin()
        deadline = time.monotonic() + (self._join_timeout_ms + 5000) / 1000
        while not (self._closed or self._stop_waiting.is_set()):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return
            try:
                if coordinator.ensure_active_group(timeout_ms=min(left_ms, JOIN_SLICE_MS)):
                    return
            except KafkaTimeoutError:  # kafka-python 2.x raises where 3.0 returns False
                pass
            except KafkaError as exc:
                raise BrokerError(f"joining group {self.group_id!r} failed: {exc!r}") from exc
            except RuntimeError as exc:  # the client's network loop closed under the call
                if self._closed:
                    raise BrokerError("the consumer is closed") from exc
                raise
            if coordinator.coordinator_unknown():
                return  # the coordinator went away: the poll looks for it

    def stop_waiting(self) -> None:
        """Polls from now on wait for a group join no longer than their own timeout: the
        consumer is being stopped (:meth:`close` follows)."""
        self._stop_waiting.set()

    def _new_cluster(self) -> str | None:
        """The cluster id the brokers now answer with, when it is new: a cluster whose storage
        was formatted anew under a new id (the embedded Tansu broker restarted, which keeps
        everything in memory), whose logs begin again at offset 0. A position or a committed
        offset of the old logs means nothing there, and one below the new log's end would
        silently skip what was written to it, so neither the fetch position nor a rebalance can
        tell it. (A cluster re-formatted under the id it had, as ``CLUSTER_ID`` pinned in a
        deployment does, cannot be told this way.) An id seen before that comes back is not
        new: bootstrap servers of two clusters, or a cut-over, is logged once and not followed
        by a re-read on every flip."""
        cluster = getattr(self._consumer, "_cluster", None)  # private: the client's metadata
        current = getattr(cluster, "cluster_id", None)
        if not isinstance(current, str) or not current or current == self._cluster_id:
            return None
        before = self._cluster_id
        if before is None:
            self._cluster_id = current
            self._clusters_seen.add(current)
            return None
        if current in self._clusters_seen:
            self._cluster_id = current
            if not self._flip_logged:
                self._flip_logged = True
                logger.error(
                    "the Kafka brokers answer as cluster %s again, after %s: are the bootstrap "
                    "servers of two clusters? Positions are kept; check MINDER_KAFKA__BOOTSTRAP",
                    current[:MAX_ID_CHARS],
                    before[:MAX_ID_CHARS],
                )
            return None
        owned = self._consumer.assignment()
        logger.warning(
            "the Kafka brokers now answer as cluster %s, not %s: their logs are new; %s start "
            "again from the %s",
            current[:MAX_ID_CHARS],
            before[:MAX_ID_CHARS],
            f"partitions {_names(owned)}" if owned else "the partitions assigned next",
            self._reset_to,
        )
        return current

    def _start_again(self, cluster_id: str) -> None:
        """Every assigned partition from the start (or, with ``auto_offset_reset="latest"``,
        the end) of its log in the new cluster ``cluster_id``, which becomes the known one."""
        if self.authenticator is not None:
            self.authenticator.rollback()  # what follows the last commit is delivered again
        owned = self._consumer.assignment()
        if owned:
            self._seek_to_reset(*owned)
        for tp in owned:
            self._offsets.pop(tp, None)  # known again after the first fetch
            self._backlog[tp] = 0  # of the old log; the first fetch says the new one's
        # Keyed by offsets of the old logs: another message may sit at the same offset now.
        self._pending_dead.clear()
        self._dead_attempts.clear()
        self._handler_tries.clear()
        self._reposition -= owned
        # A commit in the new cluster made before this member saw its id (the fetch at a stale
        # position can land before the metadata that names the new cluster) is a position of
        # the old logs: see _resume_from_committed.
        self._trusted = set()
        self._suspect = {}
        self._cluster_id = cluster_id
        self._clusters_seen.add(cluster_id)
        self.stats.cluster_changes += 1
        self._publish_backlog()

    def _resume_from_committed(self) -> set[TopicPartition]:
        """Seek every partition assigned by the last rebalance to its committed offset.

        kafka-python keeps the in-memory position of a partition that stays with this member
        across a rebalance. The group's committed offset is the truth after a rebalance: the
        position may be ahead of it (a poll that failed, then a rebalance) or stale (the broker
        lost its data and was restarted: Tansu keeps everything in memory).

        After a new cluster (:meth:`_new_cluster`) a committed offset may be a position of the
        old logs: the member that owned the partition read it at its stale position before the
        metadata naming the new cluster reached it, and committed that. So the first rebalance
        after the change notes the committed offset of every partition of the topic that this
        member has not committed since (:meth:`_suspect_commits`), and while a partition's
        committed offset is still the one noted, no rebalance follows it: the partition starts
        from the beginning (or the end). Once anyone commits it again (this member, or another
        that has seen the new id by the group's first rebalance in it) it is followed, so a
        partition moving between members later is not read twice. Not covered: a member that
        starts only after the change has nothing to compare with and follows such a commit,
        and a partition read again from the beginning by another member, which then commits
        exactly the noted offset (nothing new was written), is read again by the next owner.
        """
        read: dict[TopicPartition, int | None] = {}  # committed offsets read just now
        if self._trusted is not None:
            # Before the targets are taken: a failure here leaves them to the next poll.
            self._suspect = self._suspect_commits(self._trusted)
            self._trusted = None  # the first rebalance after a new cluster is applied
            read = dict(self._suspect)
        targets, self._reposition = self._reposition, set()
        if self.authenticator is not None:
            self.authenticator.rollback()  # what follows the last commit is delivered again
        owned = self._consumer.assignment()
        done: set[TopicPartition] = set()
        for tp in sorted(targets & owned):
            try:
                offset = (
                    read[tp]
                    if tp in read
                    else self._consumer.committed(tp, timeout_ms=self._join_timeout_ms)
                )
            except KafkaError as exc:
                logger.warning("cannot read the committed offset of %s: %r", tp, exc)
                self._reposition.add(tp)  # try again at the next poll
                continue
            if tp in self._suspect and self._suspect[tp] == offset:
                logger.info(
                    "%s[%d]: its committed offset %s was there when the cluster changed and "
                    "nobody has committed it since: starting it again from the %s",
                    tp.topic,
                    tp.partition,
                    offset,
                    self._reset_to,
                )
                offset = None
            else:
                self._suspect.pop(tp, None)  # committed again since: followed from now on
            if offset is not None:
                self._consumer.seek(tp, offset)
                self._offsets[tp] = offset
            else:
                self._offsets.pop(tp, None)  # known again after the first fetch
                self._seek_to_reset(tp)
            done.add(tp)
        self._publish_backlog()
        return done | (targets - owned)

    def _suspect_commits(self, trusted: set[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The committed offset of every partition of the topic this member has not committed
        since the cluster changed. One that cannot be read is left out (logged): it is followed
        as any commit would be."""
        try:
            partitions = self._consumer.partitions_for_topic(self.topic) or set()
        except KafkaError as exc:
            logger.warning("cannot list the partitions of %s: %r", self.topic, exc)
            partitions = {tp.partition for tp in self._reposition if tp.topic == self.topic}
        suspect: dict[TopicPartition, int | None] = {}
        for number in sorted(partitions):
            tp = TopicPartition(self.topic, number)
            if tp in trusted:
                continue
            try:
                suspect[tp] = self._consumer.committed(tp, timeout_ms=self._join_timeout_ms)
            except KafkaError as exc:
                logger.warning("cannot read the committed offset of %s: %r", tp, exc)
        return suspect

    @property
    def _reset_to(self) -> str:
        """Where ``auto_offset_reset`` starts a partition without a position, in words."""
        return "beginning" if self._auto_offset_reset == "earliest" else "end"

    def _seek_to_reset(self, *tps: TopicPartition) -> None:
        """Seek ``tps`` where ``auto_offset_reset`` says a partition without a position starts:
        the beginning of its log (``earliest``) or its end (``latest``)."""
        if self._auto_offset_reset == "earliest":
            self._consumer.seek_to_beginning(*tps)
        else:
            self._consumer.seek_to_end(*tps)

    def _forget(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self._backlog.pop(tp, None)
            self._offsets.pop(tp, None)
        self._pending_dead = {key for key in self._pending_dead if key[0] not in revoked}
        self._publish_backlog()
        self.stats.assigned_partitions = max(0, self.stats.assigned_partitions - len(revoked))

    # -- life cycle ------------------------------------------------------------------------

    def assignment(self) -> set[tuple[str, int]]:
        """``(topic, partition)`` pairs this consumer owns now."""
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def close(self) -> None:
        """Leave the group (without committing anything more) and release the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            close_client(self._consumer, autocommit=False)
        finally:
            self._deadletters.close(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
