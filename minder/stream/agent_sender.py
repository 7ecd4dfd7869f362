"""Delivery of the node agent's pre-encoded batches, in order, with the broker's acknowledgement.

:class:`KafkaRecordSender` is what ``minder.agent.runner`` drains its on-disk spool through: it
sends a run of records and reports how many of them, from the first, the broker acknowledged, so
the caller removes exactly those from the spool and sends the rest again later.

Ordering: the client keeps one request in flight per connection and retries inside the
``delivery_timeout_ms`` window, so one key's records reach their partition in the order given.
Records are never lost by this class (a record is only reported delivered once acknowledged), but
one may arrive twice: when the broker stored it and the acknowledgement was lost, or when a run
is given up after ``timeout_s``. Duplicates are harmless downstream (the detectors tolerate
repeated samples; a batch is identified by node and ``ts``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka.errors import (
    InvalidRecordError,
    KafkaConfigurationError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)

from minder.core.errors import BrokerError, ValidationError
from minder.core.records import METRICS_TOPIC
from minder.core.signing import Signer
from minder.stream.closing import close_producer
from minder.stream.metadata import with_topic_creation
from minder.stream.security import connection_config

logger = logging.getLogger(__name__)

# Refused for what the record is, not for the state of the broker: sending it again cannot help.
_REJECTED = (MessageSizeTooLargeError, RecordListTooLargeError, InvalidRecordError)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of :meth:`KafkaRecordSender.send`.

    Attributes
    ----------
    delivered
        How many records, from the first, the broker acknowledged.
    rejected
        1 when the record right after those was refused for good (too large, invalid): the
        caller should drop it instead of retrying; else 0.
    error
        Why the rest was not delivered (None when everything was).
    """

    delivered: int
    rejected: int = 0
    error: str | None = None


class KafkaRecordSender:
    """Sends ``(key, value)`` records to one topic and waits for the broker's acknowledgement.

    The Kafka client is created at the first :meth:`send` (so a broker that is down at start-up
    only makes that send fail) and recreated after a send that was given up while records were
    still in the client's hands, so none of them can arrive out of order later.

    Parameters
    ----------
    bootstrap
        ``host:port[,host:port…]`` of the brokers.
    topic
        Destination topic.
    acks
        ``"all"`` (default: a record counts as delivered once every in-sync replica has it, so
        removing it from the spool is safe), ``1`` or ``0`` (never use 0 here).
    request_timeout_ms, delivery_timeout_ms
        How long one request, and one record through all its retries, may take.
    max_block_ms
        How long ``send`` may wait for the topic's metadata (broker unreachable).
    bootstrap_timeout_ms
        How long creating the client may try to reach a broker.
    extra_config
        Further ``KafkaProducer`` settings, overriding the above.
    client_options
        Connection settings (security protocol, TLS, SASL):
        :meth:`minder.config.KafkaSettings.client_options`.
    signer
        This node's signer (its node key file, docs/security.md); None sends unsigned records,
        which a service in the default ``required`` mode dead-letters.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str = METRICS_TOPIC,
        client_id: str = "minder-agent",
        acks: int | str = "all",
        request_timeout_ms: int = 5_000,
        delivery_timeout_ms: int = 10_000,
        max_block_ms: int = 2_000,
        bootstrap_timeout_ms: int = 2_000,
        extra_config: Mapping[str, Any] | None = None,
        client_options: Mapping[str, Any] | None = None,
        signer: Signer | None = None,
    ) -> None:
        if not bootstrap:
            raise ValidationError("Kafka bootstrap is empty: expected host:port[,host:port…]")
        if not topic:
            raise ValidationError("topic is empty: expected a topic name")
        if acks not in (0, 1, -1, "all"):
            raise ValidationError(f"acks is {acks!r}: expected 0, 1 or 'all'")
        self.bootstrap = bootstrap
        self.topic = topic
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self._config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "client_id": client_id,
            "acks": acks,
            # One request in flight: retries cannot overtake each other, so order holds.
            "max_in_flight_requests_per_connection": 1,
            # Gather a run of records into one request, so it succeeds or fails as a whole.
            "linger_ms": 5,
            "batch_size": 1024 * 1024,
            "max_request_size": 4 * 1024 * 1024,
            "request_timeout_ms": request_timeout_ms,
            "delivery_timeout_ms": delivery_timeout_ms,
            "max_block_ms": max_block_ms,
            "bootstrap_timeout_ms": bootstrap_timeout_ms,
            # Same reasons as minder.stream.producer: Tansu refuses idempotent produce requests,
            # a restarted broker should be found within ~1 s, topics are created by Minder.
            "enable_idempotence": False,
            "reconnect_backoff_max_ms": 1000,
            "allow_auto_create_topics": False,
        }
        self._config.update(connection_config(client_options))
        self._config.update(extra_config or {})
        self._producer: KafkaProducer | None = None
        self.signer = signer

    def send(
        self, records: Sequence[tuple[str, bytes]], *, timeout_s: float | None = None
    ) -> SendResult:
        """Send ``records`` (key, value) in order and wait for the broker.

        Parameters
        ----------
        records
            The run to send, oldest first.
        timeout_s
            How long to wait for all acknowledgements; default a little more than
            ``delivery_timeout_ms``, after which the client has settled every record itself.

        Returns
        -------
        SendResult
            How many were delivered (a prefix of ``records``), whether the next one was refused
            for good, and why the rest was not delivered. Never raises for broker trouble.
        """
        if not records:
            return SendResult(0)
        if timeout_s is None:
            timeout_s = self.delivery_timeout_s + 2.0
        try:
            producer = self._client()
        except BrokerError as exc:
            return SendResult(0, error=str(exc))
        deadline = time.monotonic() + timeout_s
        futures = []
        queue_error: str | None = None
        queue_rejected = False
        for key, value in records:
            try:
                # Signed when sent, not when spooled: a record resent after an outage carries a
                # fresh sequence number and is no replay.
                headers = None if self.signer is None else [self.signer.header(value)]
                futures.append(
                    producer.send(self.topic, value=value, key=key.encode(), headers=headers)
                )
            except KafkaError as exc:  # no metadata within max_block_ms: broker unreachable
                queue_rejected = isinstance(exc, _REJECTED)  # larger than max_request_size
                queue_error = f"cannot queue a record for {self.topic!r}: {exc!r}"
                break
        with contextlib.suppress(KafkaError):  # the futures below say which records are settled
            producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        delivered = 0
        rejected = 0
        error: str | None = None
        limbo = False
        for future in futures:
            if future.succeeded():
                delivered += 1
                continue
            if not future.is_done:
                limbo = True
                error = f"no acknowledgement from {self.bootstrap} within {timeout_s:g} s"
            elif isinstance(future.exception, _REJECTED):
                rejected = 1
                error = f"record refused by the broker for good: {future.exception!r}"
            else:
                error = (
                    f"delivery to {self.topic!r} at {self.bootstrap} failed: {future.exception!r}"
                )
            break
        if error is None:
            error = queue_error
            rejected = int(queue_rejected)
        elif not rejected and any(f.succeeded() for f in futures[delivered + 1 :]):
            # Delivered after an earlier record failed: the caller sends it again, so it arrives
            # twice, the first time before that record. Rare (a run usually travels in one
            # request, which succeeds or fails as a whole), so only logged.
            logger.warning(
                "records to %s were delivered after record %d of %d failed: they will arrive "
                "twice, the first time out of order",
                self.topic,
                delivered + 1,
                len(futures),
            )
        if limbo or any(not f.is_done for f in futures):
            # Records still in the client could be delivered later, behind the caller's resend:
            # drop the client (and them) so the order holds.
            self._reset()
        return SendResult(delivered, rejected, error)

    def _client(self) -> KafkaProducer:
        if self._producer is None:
            try:
                self._producer = with_topic_creation(KafkaProducer(**self._config), self._config)
            except KafkaConfigurationError as exc:
                raise ValidationError(f"invalid Kafka producer settings: {exc}") from exc
            except KafkaError as exc:
                raise BrokerError(f"cannot reach Kafka at {self.bootstrap!r}: {exc!r}") from exc
        return self._producer

    def _reset(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            close_producer(producer, 0.0)

    def close(self, timeout_s: float = 5.0) -> None:
        """Release the client; everything sent was already waited for by :meth:`send`."""
        producer, self._producer = self._producer, None
        if producer is not None:
            close_producer(producer, timeout_s)
