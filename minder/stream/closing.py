"""Closing kafka-python 3 clients without racing their own I/O threads.

kafka-python 3.0 runs a consumer's and an admin client's network loop on a daemon I/O thread,
and their ``close()`` closes the connections from the caller's thread *before* it stops that
thread. A metadata refresh or a read in flight on the I/O thread then fails underneath it and
the library logs tracebacks at ERROR (``generator already executing``, ``Transport closed for
writes``) on every few shutdowns. Stopping the I/O thread first makes the library drive its loop
on the caller's thread (its documented fallback when no I/O thread runs), so the leave-group
request and the close happen there, in order, with nothing running beside them.

A producer has no such thread; its sender thread closes its own connections, but ``close`` may
leave it running (:func:`close_producer`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

logger = logging.getLogger(__name__)


def close_client(client: Any, **close_options: Any) -> None:
    """Close a ``KafkaConsumer`` or ``KafkaAdminClient`` after stopping its I/O thread.

    ``close_options`` go to the client's ``close`` (``autocommit=False`` for a consumer).
    """
    net = getattr(client, "_net", None)  # private, but the only handle on the I/O thread
    stop = getattr(net, "stop", None)
    try:
        if callable(stop):
            stop()  # the thread ends after its current step of the loop
    finally:
        client.close(**close_options)


def close_producer(producer: KafkaProducer, timeout_s: float) -> None:
    """Close ``producer`` for sure, dropping what it still holds after ``timeout_s``.

    kafka-python 3.0's ``close(timeout)`` first flushes and raises ``KafkaTimeoutError`` when
    records are still pending, before it would force-close its I/O thread; that thread would then
    go on and deliver those records behind our resend. So force the close ourselves.
    """
    try:
        producer.close(timeout=timeout_s)
        return
    except KafkaError as exc:
        logger.debug("closing the Kafka client with records pending: %r", exc)
    sender = getattr(producer, "_sender", None)  # private, but the only way to stop it
    if sender is not None:
        sender.force_close()
    with contextlib.suppress(KafkaError, ValueError):
        producer.close(timeout=0)
