"""BatchConsumer: dead letters, commit semantics, redelivery, and never stopping on bad input."""

from __future__ import annotations

import random
import threading
import time

import msgpack
import orjson
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError

import minder.stream.consumer as consumer_module
from minder.core.codec import (
    WireFormat,
    batch_to_dict,
    decode_batch,
    encode_batch,
    layout_definition,
    layout_id,
)
from minder.core.errors import DecodeError
from minder.core.records import NodeBatch
from minder.stream import REASON_CLASSES, EmbeddedBroker, read_dead_letters, reason_class

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0


def _raw_producer(broker: EmbeddedBroker) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False)


def _send_all(
    broker: EmbeddedBroker,
    topic: str,
    payloads: list[bytes | None],
    key: bytes = b"jbad",
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    producer = _raw_producer(broker)
    try:
        for payload in payloads:
            producer.send(topic, value=payload, key=key, headers=headers)
        producer.flush(10)
    finally:
        producer.close()


def _json(batch: NodeBatch, **changes: object) -> bytes:
    return orjson.dumps({**batch_to_dict(batch, columns=False), **changes})


def test_undecodable_messages_go_to_the_dead_letter_topic_with_their_reason(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until, monkeypatch
) -> None:
    metrics, deadletter = topics
    good = [make_batch("jbad", f"n{i}", T0 + i) for i in range(5)]
    unknown_metric = _json(good[0], samples=[["gpu_utilisation", "gpu0", 0.5]])
    wrong_schema = msgpack.packb({**batch_to_dict(good[0]), "schema": 3})
    crashing = b"CRASH the decoder"
    bad = [b"\x00\xffgarbage", unknown_metric, wrong_schema, b"", crashing]
    payloads: list[bytes | None] = []
    for batch, junk in zip(good, bad, strict=True):
        payloads += [encode_batch(batch), junk]
    _send_all(broker, metrics, payloads, headers=[("trace", b"abc")])

    def decode_or_crash(payload: bytes) -> NodeBatch:
        if payload == crashing:
            raise RuntimeError("a decoder bug")
        return decode_batch(payload)

    monkeypatch.setattr(consumer_module, "decode_batch", decode_or_crash)
    handled: list[NodeBatch] = []
    consumer = make_consumer(group_id)
    consume_until(consumer, handled.extend, lambda: len(handled) >= 5)

    assert handled == good
    stats = consumer.stats
    assert (stats.consumed, stats.decoded, stats.dead_lettered) == (10, 5, 5)
    expected_classes = [
        "undecodable",
        "unknown_metric",
        "schema_version",
        "empty",
        "decoder_failure",
    ]
    assert +stats.dead_lettered_by_reason == dict.fromkeys(expected_classes, 1)
    assert set(stats.dead_lettered_by_reason) == set(REASON_CLASSES)  # all exported from 0
    assert set(expected_classes) <= set(REASON_CLASSES)

    letters = read_dead_letters(broker.bootstrap, deadletter)
    assert [d.reason_class for d in letters] == expected_classes
    assert [d.payload for d in letters] == bad  # the original bytes, untouched
    assert all(d.key == b"jbad" and d.job == "jbad" for d in letters)
    assert [d.source_offset for d in letters] == [1, 3, 5, 7, 9]
    assert {d.source_topic for d in letters} == {metrics}
    assert len({d.source_partition for d in letters}) == 1  # one key, one partition
    assert all(("trace", b"abc") in d.headers for d in letters)  # original headers kept
    assert "unknown metric 'gpu_utilisation'" in letters[1].reason
    assert "field 'schema' is 3: expected 1 or 2" in letters[2].reason
    assert letters[4].reason == "decoder raised RuntimeError: a decoder bug"


def _packed(batch: NodeBatch, *, drop_layout: bool = False, **changes: object) -> bytes:
    data = msgpack.unpackb(encode_batch(batch, WireFormat.PACKED))
    if drop_layout:
        data.pop("layout_def")
        data["layout"] = 12345  # never announced
    return msgpack.packb({**data, **changes})


def test_reason_classes_of_codec_errors() -> None:
    batch = NodeBatch(job="j", node="n", ts=T0, samples=[("gpu_util_ratio", "gpu0", 0.5)])
    cases = {
        b'{"schema": 1,': "undecodable",
        b"\x92\x01": "undecodable",  # a msgpack list cut short
        b"[1, 2]": "not_an_object",
        msgpack.packb([1, 2]): "not_an_object",
        _json(batch, ts="yesterday"): "bad_field",
        _json(batch, samples=[["gpu_util_ratio", "gpu0", 1.5]]): "bad_sample",
        _json(batch, samples=[["gpu_util_ratio", "mlx5_0", 0.5]]): "bad_sample",
        _json(batch, events=[{"kind": "meteor", "ts": T0}]): "bad_event",
        msgpack.packb(
            {**batch_to_dict(batch), "columns": {"metric": [], "device": [], "value": [1.0]}}
        ): "bad_sample",
        _json(batch, columns={"metric": [], "device": [], "value": []}): "bad_field",
        # Schema 2 (packed): a layout never announced, a bad layout, a bad value block.
        _packed(batch, drop_layout=True): "unknown_layout",
        _packed(batch, layout=99, layout_def={"metrics": ["gpu_util"]}): "bad_layout",
        _packed(batch, values=b"\0\0\0"): "bad_values",
        _packed(batch, values=b"\0\0\xc0\x7f"): "bad_sample",  # NaN, as in schema 1
        _packed(batch, layout="7"): "bad_field",
        # A metric this service does not know yet (a newer agent): the same class as schema 1's
        _packed(
            batch,
            layout=layout_id(["gpu_util_future"], ["gpu0"]),
            layout_def=layout_definition(["gpu_util_future"], ["gpu0"]),
        ): "unknown_metric",
    }
    for payload, expected in cases.items():
        with pytest.raises(DecodeError) as caught:
            decode_batch(payload)
        assert reason_class(caught.value) == expected, caught.value.reason
    assert reason_class(DecodeError("something new")) == "invalid"
    assert reason_class(KeyError("x")) == "decoder_failure"


def test_committed_messages_are_not_delivered_again_to_the_group(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until
) -> None:
    metrics, _ = topics
    first = [make_batch(f"job{i % 3}", "n0", T0 + i) for i in range(6)]
    _send_all_batches(broker, metrics, first)
    handled: list[NodeBatch] = []
    with make_consumer(group_id) as consumer:
        consume_until(consumer, handled.extend, lambda: len(handled) >= 6)
        assert consumer.stats.commits >= 1
    assert sorted(b.ts for b in handled) == [b.ts for b in first]

    second = [make_batch(f"job{i % 3}", "n0", T0 + 100 + i) for i in range(3)]
    _send_all_batches(broker, metrics, second)
    later: list[NodeBatch] = []
    with make_consumer(group_id) as consumer:
        consume_until(consumer, later.extend, lambda: len(later) >= 3)
        for _ in range(3):  # nothing else is waiting
            assert consumer.poll_once(later.extend, timeout_ms=200).messages == 0
    assert sorted(b.ts for b in later) == [b.ts for b in second]


def _send_all_batches(broker: EmbeddedBroker, topic: str, batches: list[NodeBatch]) -> None:
    producer = _raw_producer(broker)
    try:
        for batch in batches:
            producer.send(topic, value=encode_batch(batch), key=batch.job.encode())
        producer.flush(10)
    finally:
        producer.close()


def test_a_failing_handler_gets_the_messages_again_and_nothing_is_committed(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until
) -> None:
    metrics, deadletter = topics
    good = [make_batch("jr", f"n{i}", T0 + i) for i in range(4)]
    payloads = [encode_batch(b) for b in good[:2]] + [b"junk"] + [encode_batch(b) for b in good[2:]]
    _send_all(broker, metrics, payloads, key=b"jr")

    seen: list[list[NodeBatch]] = []

    def failing(batches: list[NodeBatch]) -> None:
        seen.append(list(batches))
        raise RuntimeError("database down")

    consumer = make_consumer(group_id)
    consume_until(consumer, failing, lambda: len(seen) >= 2)
    assert seen[0] == seen[1] == good  # redelivered, same batches, same order
    stats = consumer.stats
    assert stats.handler_failures == 2
    assert stats.commits == 0
    assert stats.handled == 0
    assert stats.rewound == 10
    # Dead-lettered once although the poll was delivered twice.
    assert stats.dead_lettered == 1
    outcome = consumer.poll_once(failing, timeout_ms=2000)
    assert not outcome.committed
    assert outcome.error == "handler raised RuntimeError: database down"
    consumer.close()

    # Nothing was committed: the next member of the group starts from the beginning.
    handled: list[NodeBatch] = []
    successor = make_consumer(group_id)
    consume_until(successor, handled.extend, lambda: len(handled) >= 4)
    assert handled == good
    assert successor.stats.commits >= 1
    # At least once: the successor dead-letters the junk again (it did not know the first had).
    assert [d.payload for d in read_dead_letters(broker.bootstrap, deadletter)] == [b"junk"] * 2


def test_a_dead_letter_that_cannot_be_written_holds_the_commit_back(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer
) -> None:
    metrics, deadletter = topics
    good = make_batch("jd", "n0", T0)
    _send_all(broker, metrics, [b"junk", encode_batch(good)], key=b"jd")
    consumer = make_consumer(group_id)
    real_send = consumer._deadletters.send
    failures = iter([KafkaTimeoutError("broker busy")])

    def flaky_send(*args: object, **kwargs: object) -> object:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_send(*args, **kwargs)

    consumer._deadletters.send = flaky_send  # type: ignore[method-assign]
    outcomes = []
    handled: list[NodeBatch] = []
    deadline = time.monotonic() + 20
    while not handled:
        assert time.monotonic() < deadline, consumer.stats
        outcome = consumer.poll_once(handled.extend, timeout_ms=200)
        if outcome.messages:
            outcomes.append(outcome)
    failed, succeeded = outcomes
    assert failed.error is not None and "dead letters not written" in failed.error
    assert not failed.committed and failed.batches == 0
    assert succeeded.committed and succeeded.batches == 1 and succeeded.dead_lettered == 1
    assert handled == [good]  # the handler saw the good batch once, after the retry
    assert consumer.stats.deadletter_failures == 1
    assert [d.payload for d in read_dead_letters(broker.bootstrap, deadletter)] == [b"junk"]


def test_run_never_stops_on_bad_input(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer
) -> None:
    metrics, deadletter = topics
    rng = random.Random(7)
    good = [make_batch(f"job{i % 4}", f"n{i}", T0 + i) for i in range(30)]
    template = batch_to_dict(good[0], columns=False)
    bad: list[bytes | None] = [
        None,
        b"",
        b"{",
        b"null",
        b"\xc1" * 50_000,  # a byte msgpack never uses
        orjson.dumps([template]),
        msgpack.packb(12),
        msgpack.packb({**template, "job": ""}),
        msgpack.packb({**template, "samples": [["gpu_util_ratio", "gpu0", float("nan")]]}),
        msgpack.packb({**template, "samples": "all of them"}),
        orjson.dumps({**template, "interval_s": -1}),
        orjson.dumps({**template, "labels": {"rack": 3}}),
        orjson.dumps({**template, "events": [{"kind": "xid", "ts": T0, "code": "79"}]}),
        encode_batch(good[0])[:-7],  # truncated
    ]
    bad += [rng.randbytes(rng.randint(1, 300)) for _ in range(30 - len(bad))]
    producer = _raw_producer(broker)
    for batch, junk in zip(good, bad, strict=True):
        producer.send(metrics, value=junk, key=batch.job.encode())
        producer.send(metrics, value=encode_batch(batch), key=batch.job.encode())
    producer.flush(10)
    producer.close()

    handled: dict[tuple[str, float], NodeBatch] = {}
    calls = 0

    def handler(batches: list[NodeBatch]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first call fails")
        handled.update(((b.node, b.ts), b) for b in batches)

    consumer = make_consumer(group_id, max_poll_records=7)
    stop = threading.Event()
    worker = threading.Thread(
        target=consumer.run, args=(handler, stop), kwargs={"retry_backoff_s": 0.1}
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while len(handled) < 30 and time.monotonic() < deadline:
            assert worker.is_alive()
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join(timeout=5)
    assert not worker.is_alive()
    assert sorted(handled.values(), key=lambda b: b.ts) == good
    stats = consumer.stats
    assert stats.handler_failures == 1
    assert stats.dead_lettered == 30  # each bad message once, the failed poll's included
    assert sum(stats.dead_lettered_by_reason.values()) == 30
    assert set(stats.dead_lettered_by_reason) == set(REASON_CLASSES)
    snapshot = stats.snapshot()
    assert (
        snapshot == stats and snapshot.dead_lettered_by_reason is not stats.dead_lettered_by_reason
    )
    assert stats.dead_lettered_by_reason["decoder_failure"] == 0
    letters = read_dead_letters(broker.bootstrap, deadletter)
    assert sorted((d.payload for d in letters), key=bytes.hex) == sorted(
        (b or b"" for b in bad), key=bytes.hex
    )


def test_a_message_too_big_to_dead_letter_is_written_truncated_and_the_stream_goes_on(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer
) -> None:
    metrics, deadletter = topics
    good = make_batch("jp", "n0", T0)
    big = b"\xc1" * (1536 * 1024)  # 1.5 MiB of garbage: over the dead-letter producer's limit
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, enable_idempotence=False, max_request_size=4 << 20
    )
    try:
        producer.send(metrics, value=big, key=b"jp")
        producer.send(metrics, value=encode_batch(good), key=b"jp")
        producer.flush(10)
    finally:
        producer.close()
    consumer = make_consumer(group_id)
    handled: list[NodeBatch] = []
    polls = 0
    deadline = time.monotonic() + 30
    while not handled:
        assert time.monotonic() < deadline, consumer.stats
        if consumer.poll_once(handled.extend, timeout_ms=200).messages:
            polls += 1
    assert handled == [good]
    assert polls <= consumer_module.DEAD_LETTER_ATTEMPTS
    [letter] = read_dead_letters(broker.bootstrap, deadletter)
    assert len(letter.payload) == consumer_module.TRUNCATED_BYTES
    assert "truncated from 1572864 bytes" in letter.reason
    assert consumer.stats.skipped == 0


def test_a_message_that_cannot_be_dead_lettered_at_all_is_skipped_after_bounded_tries(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, caplog
) -> None:
    metrics, deadletter = topics
    good = make_batch("js", "n0", T0)
    _send_all(broker, metrics, [b"junk", encode_batch(good)], key=b"js")
    consumer = make_consumer(group_id)

    def refuse(*args: object, **kwargs: object) -> object:
        raise KafkaTimeoutError("dead-letter topic unwritable")

    consumer._deadletters.send = refuse  # type: ignore[method-assign]
    handled: list[NodeBatch] = []
    polls = 0
    deadline = time.monotonic() + 30
    while not handled:
        assert time.monotonic() < deadline, consumer.stats
        if consumer.poll_once(handled.extend, timeout_ms=200).messages:
            polls += 1
    assert handled == [good]
    assert polls == consumer_module.DEAD_LETTER_ATTEMPTS
    assert consumer.stats.skipped == 1
    assert any("skipping" in r.getMessage() and "@0" in r.getMessage() for r in caplog.records)
    assert read_dead_letters(broker.bootstrap, deadletter) == []


def test_a_batch_the_handler_always_raises_on_is_dead_lettered_and_the_others_go_on(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer
) -> None:
    metrics, deadletter = topics
    poison = make_batch("jh", "bad-node", T0)
    good = [make_batch("jh", f"n{i}", T0) for i in range(3)]
    _send_all(broker, metrics, [encode_batch(b) for b in [good[0], poison, *good[1:]]], key=b"jh")
    consumer = make_consumer(group_id)
    handled: list[NodeBatch] = []

    def handler(batches: list[NodeBatch]) -> None:
        if any(b.node == "bad-node" for b in batches):
            raise RuntimeError("detection crashed on this batch")
        handled.extend(batches)

    polls = 0
    deadline = time.monotonic() + 30
    while len(handled) < 3:
        assert time.monotonic() < deadline, consumer.stats
        if consumer.poll_once(handler, timeout_ms=200).messages:
            polls += 1
    assert [b.node for b in handled] == ["n0", "n1", "n2"]
    assert polls == consumer_module.DEAD_LETTER_ATTEMPTS
    [letter] = read_dead_letters(broker.bootstrap, deadletter)
    assert letter.reason_class == "handler_error" and "RuntimeError" in letter.reason
    assert decode_batch(letter.payload) == poison
    # Redelivered later (a restart), the poisoned batch is not handed over again.
    assert consumer.poll_once(handler, timeout_ms=200).error is None
