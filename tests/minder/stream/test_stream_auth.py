"""Signed batches through a real broker: verified before decoding, forgeries dead-lettered with
their reason and counted, a redelivery never taken for a replay, permissive mode counting only."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer

from minder.core.codec import encode_batch
from minder.core.records import NodeBatch
from minder.core.signing import (
    AuthError,
    AuthReason,
    ClusterKey,
    FleetSigner,
    Signer,
    Verifier,
)
from minder.stream import BatchProducer, EmbeddedBroker, read_dead_letters
from minder.stream.auth import AuthMode, BatchAuthenticator

pytestmark = pytest.mark.kafka

KEY = ClusterKey("k1", bytes(range(32)))
OTHER = ClusterKey("k1", bytes(32))  # the same key id, another secret: a forger's guess


def authenticator(mode: AuthMode = AuthMode.REQUIRED) -> BatchAuthenticator:
    return BatchAuthenticator(Verifier([KEY]), mode)


def send_signed(broker: EmbeddedBroker, topic: str, batches: list[NodeBatch]) -> None:
    """Send ``batches`` signed with their nodes' keys under :data:`KEY`, and wait for them."""
    with BatchProducer(broker.bootstrap, topic=topic, signer=FleetSigner(KEY)) as producer:
        for batch in batches:
            producer.send(batch)
        producer.flush(10)


def test_only_batches_signed_by_their_own_node_reach_the_handler(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until
) -> None:
    metrics, deadletter = topics
    now = time.time()
    genuine = [make_batch("job", f"n{i}", now - 5 + i, seed=i) for i in range(3)]
    forged_xid = make_batch("job", "n1", now, seed=9)
    raw = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False)
    send_signed(broker, metrics, genuine)
    payload = encode_batch(forged_xid)
    stolen = Signer(KEY.node_key("n2"))  # node n2's real key, for a batch claiming n1
    sends = [
        (payload, None),  # unsigned
        (payload, [Signer(OTHER.node_key("n1")).header(payload)]),  # wrong secret
        (payload, [stolen.header(payload)]),  # another node's key
        (payload, [("minder-sig", b"v1;k1;n1;xx;abc")]),  # malformed
    ]
    for value, headers in sends:
        raw.send(metrics, value=value, key=b"job", headers=headers)
    raw.flush(10)

    received: list[NodeBatch] = []
    with make_consumer(group_id, authenticator=authenticator()) as consumer:
        consume_until(consumer, received.extend, lambda: consumer.stats.consumed >= 7)
        auth = consumer.authenticator
        assert auth is not None
        # the genuine first batch again, with its original signature: a replay
        captured, signature = read_back(broker, metrics, genuine[0].node)
        raw.send(metrics, value=captured, key=b"job", headers=[signature])
        raw.flush(10)
        consume_until(consumer, received.extend, lambda: consumer.stats.consumed >= 8)
    raw.close()

    assert sorted(b.node for b in received) == ["n0", "n1", "n2"]
    assert auth.verified == 3
    failures = {reason: n for reason, n in auth.failures.items() if n}
    assert failures == {
        "unsigned": 1,
        "bad_signature": 1,
        "misattributed": 1,
        "malformed_signature": 1,
        "replayed": 1,
    }
    letters = read_dead_letters(broker.bootstrap, deadletter)
    assert sorted(letter.reason_class for letter in letters) == sorted(failures)
    for letter in letters:
        assert len(letter.reason) < 400 and "\n" not in letter.reason
    # signature failures are not decode failures
    assert sum(consumer.stats.decode_failures_by_reason.values()) == 0


def read_back(broker: EmbeddedBroker, topic: str, node: str) -> tuple[bytes, tuple[str, bytes]]:
    """``node``'s first signed batch on ``topic`` and its ``minder-sig`` header (what an
    eavesdropper on the network captures)."""
    from kafka import KafkaConsumer

    reader = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    try:
        for record in reader:
            for name, value in record.headers:
                if name == "minder-sig" and f";{node};".encode() in value:
                    return record.value, (name, value)
    finally:
        reader.close()
    raise AssertionError(f"no signed batch of {node}")


def test_a_redelivered_poll_is_not_a_replay(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until
) -> None:
    metrics, deadletter = topics
    send_signed(broker, metrics, [make_batch("job", "n0", time.time() + i) for i in range(4)])
    calls = {"n": 0}
    received: list[NodeBatch] = []

    def flaky(batches: list[NodeBatch]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database down for one poll")
        received.extend(batches)

    with make_consumer(group_id, authenticator=authenticator()) as consumer:
        consume_until(consumer, flaky, lambda: len(received) >= 4)
        auth = consumer.authenticator
        assert auth is not None and sum(auth.failures.values()) == 0
        assert consumer.stats.rewound >= 1
    assert read_dead_letters(broker.bootstrap, deadletter) == []


def test_permissive_mode_counts_but_takes_every_batch(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until
) -> None:
    metrics, deadletter = topics
    with BatchProducer(broker.bootstrap, topic=metrics) as unsigned:
        for i in range(3):
            unsigned.send(make_batch("job", f"n{i}", time.time()))
        unsigned.flush(10)
    received: list[NodeBatch] = []
    with make_consumer(group_id, authenticator=authenticator(AuthMode.PERMISSIVE)) as consumer:
        consume_until(consumer, received.extend, lambda: len(received) >= 3)
        auth = consumer.authenticator
        assert auth is not None
    assert auth.failures["unsigned"] == 3
    assert read_dead_letters(broker.bootstrap, deadletter) == []


def test_required_mode_raises_permissive_returns_none() -> None:
    header = Signer(OTHER.node_key("n")).header(b"p")
    with pytest.raises(AuthError) as raised:
        authenticator().check([header], b"p")
    assert raised.value.reason is AuthReason.BAD_SIGNATURE
    lenient = authenticator(AuthMode.PERMISSIVE)
    assert lenient.check([header], b"p") is None
    assert lenient.failures["bad_signature"] == 1
    # the same message seen again before its poll committed counts once
    assert lenient.check([header], b"p", key=("t", 1)) is None
    assert lenient.check([header], b"p", key=("t", 1)) is None
    assert lenient.failures["bad_signature"] == 2


def test_after_a_failed_commit_and_a_rebalance_the_batches_again_are_no_replays(
    broker: EmbeddedBroker, topics, group_id, make_batch, make_consumer, consume_until
) -> None:
    """A commit fails (a rebalance under way), the group resumes from the last commit, and the
    same batches come again to this consumer: taken, not dead-lettered as replays."""
    metrics, deadletter = topics
    send_signed(broker, metrics, [make_batch("job", "n0", time.time() + i) for i in range(4)])
    received: list[NodeBatch] = []
    with make_consumer(group_id, authenticator=authenticator()) as consumer:
        real_commit = consumer._commit
        consumer._commit = lambda fetched: False  # type: ignore[method-assign]
        consume_until(consumer, received.extend, lambda: len(received) >= 4)
        consumer._commit = real_commit  # type: ignore[method-assign]
        # the rebalance: every partition repositioned to the group's (absent) commit
        consumer._reposition = {tp for tp in consumer._consumer.assignment()}
        consume_until(consumer, received.extend, lambda: len(received) >= 8)
        auth = consumer.authenticator
        assert auth is not None and sum(auth.failures.values()) == 0, auth.failures
    assert len(received) == 8  # each batch twice: at least once, never refused
    assert read_dead_letters(broker.bootstrap, deadletter) == []
