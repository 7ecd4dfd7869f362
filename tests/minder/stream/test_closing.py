"""Closing kafka-python's threaded clients: their I/O thread stops before their connections close."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer

from minder.stream import EmbeddedBroker
from minder.stream.closing import close_client

pytestmark = pytest.mark.kafka


def _spy_on_connection_close(client: Any) -> list[bool]:
    """Record, at each close of the client's connections, whether its I/O thread still ran."""
    manager = client._manager
    net = client._net
    seen: list[bool] = []
    closing = manager.close

    def close(*args: Any, **kwargs: Any) -> Any:
        thread = net._io_thread
        seen.append(thread is not None and thread.is_alive())
        return closing(*args, **kwargs)

    manager.close = close
    return seen


def _io_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("kafka-io-")}


def test_a_consumer_in_a_group_leaves_it_with_its_io_thread_stopped_first(
    broker: EmbeddedBroker, topics: tuple[str, str], group_id: str, caplog
) -> None:
    metrics, _ = topics

    def joined(session_ms: int) -> KafkaConsumer:
        consumer = KafkaConsumer(
            metrics,
            bootstrap_servers=broker.bootstrap,
            group_id=group_id,
            client_id=f"closing-{time.monotonic_ns()}",
            session_timeout_ms=session_ms,
            enable_auto_commit=False,
        )
        deadline = time.monotonic() + 20
        while not consumer.assignment():
            assert time.monotonic() < deadline, "never joined the group"
            consumer.poll(timeout_ms=100)
        return consumer

    first = joined(30_000)  # Tansu holds a join about half the session: about 15 s
    seen = _spy_on_connection_close(first)
    with caplog.at_level(logging.INFO, logger="kafka"):
        close_client(first, autocommit=False)
    assert seen == [False], "the connections were closed while the I/O thread still ran"
    assert f"kafka-io-{first.config['client_id']}" not in _io_threads()
    # No error from the library (a warning may say a task ran slowly on a busy machine).
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "Leaving consumer group" in caplog.text
    # It really left: a newcomer (a 6 s session: a join held about 3 s) gets every partition long
    # before the first member's 30 s session would have expired.
    started = time.monotonic()
    second = joined(6_000)
    try:
        assert {tp.partition for tp in second.assignment()} == set(
            second.partitions_for_topic(metrics) or ()
        )
        assert time.monotonic() - started < 20
    finally:
        close_client(second, autocommit=False)


def test_an_admin_client_closes_with_its_io_thread_stopped_first(
    broker: EmbeddedBroker, caplog
) -> None:
    admin = KafkaAdminClient(
        bootstrap_servers=broker.bootstrap, client_id=f"closing-admin-{time.monotonic_ns()}"
    )
    admin.list_topics()
    seen = _spy_on_connection_close(admin._client)
    with caplog.at_level(logging.WARNING, logger="kafka"):
        close_client(admin)
    assert seen == [False]
    assert f"kafka-io-{admin.config['client_id']}" not in _io_threads()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_client_without_an_io_thread_is_just_closed() -> None:
    closed: list[dict[str, Any]] = []

    class Plain:
        def close(self, **options: Any) -> None:
            closed.append(options)

    close_client(Plain(), autocommit=False)
    assert closed == [{"autocommit": False}]
