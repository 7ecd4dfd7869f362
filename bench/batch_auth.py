"""What checking batch signatures costs: per batch, and on the consumer's drain rate.

Usage::

    python bench/batch_auth.py --batches 20000 --rounds 2

Prints one JSON object:

- ``verify_us``: median microseconds to verify one batch (HMAC-SHA256 of the payload under the
  node's derived key, the time window, the replay guard), per wire format, against
  ``decode_us``, the decoder's own cost for the same payloads (measured in the same run);
- ``drain_per_s``: batches per second a :class:`BatchConsumer` drains from a backlog of signed
  batches through an embedded Tansu broker, with verification on and off, each measured
  ``--rounds`` times in alternation on the same topic (a new consumer group each time), and
  their ratio.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_throughput import make_batches

from minder.core.codec import WireFormat, decode_batch
from minder.core.encode import BatchEncoder
from minder.core.records import NodeBatch
from minder.core.signing import ClusterKey, FleetSigner, Verifier
from minder.stream import BatchConsumer, BatchProducer, EmbeddedBroker, ensure_topics
from minder.stream.auth import BatchAuthenticator


def per_batch_us(fmt: WireFormat, batches: list[NodeBatch], repeat: int) -> dict[str, float]:
    key = ClusterKey.generate("bench")
    signer = FleetSigner(key)
    encoder = BatchEncoder(fmt)
    payloads = [encoder.encode(batch) for batch in batches]
    headers = [
        signer.header(batch.node, payload) for batch, payload in zip(batches, payloads, strict=True)
    ]
    verify_runs, decode_runs = [], []
    for _ in range(repeat):
        auth = BatchAuthenticator(Verifier([key]))
        started = time.perf_counter()
        for batch, payload, header in zip(batches, payloads, headers, strict=True):
            verified = auth.check([header], payload)
            auth.check_batch(verified, batch.node, batch.job)
        verify_runs.append((time.perf_counter() - started) / len(payloads) * 1e6)
        auth.commit()
        started = time.perf_counter()
        for payload in payloads:
            decode_batch(payload)
        decode_runs.append((time.perf_counter() - started) / len(payloads) * 1e6)
    return {
        "bytes_per_batch": round(sum(map(len, payloads)) / len(payloads)),
        "verify_us": round(statistics.median(verify_runs), 2),
        "decode_us": round(statistics.median(decode_runs), 2),
    }


def drain(
    bootstrap: str, topic: str, deadletter: str, count: int, auth: bool, key: ClusterKey
) -> float:
    handled = 0

    def handler(received: list[NodeBatch]) -> None:
        nonlocal handled
        handled += len(received)

    authenticator = BatchAuthenticator(Verifier([key])) if auth else None
    with BatchConsumer(
        bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        topic=topic,
        deadletter_topic=deadletter,
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
        authenticator=authenticator,
    ) as consumer:
        first: float | None = None
        deadline = time.perf_counter() + 300
        while handled < count and time.perf_counter() < deadline:
            outcome = consumer.poll_once(handler, timeout_ms=500)
            if outcome.messages and first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        assert first is not None and handled == count, consumer.stats
        if authenticator is not None:
            assert authenticator.verified == count and not sum(authenticator.failures.values())
    return count / (end - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)

    batches = make_batches(args.batches, 4, 500)
    costs = {
        fmt.value: per_batch_us(fmt, batches[:5000], repeat=5)
        for fmt in (WireFormat.PACKED, WireFormat.MSGPACK)
    }
    key = ClusterKey.generate("bench")
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with EmbeddedBroker() as broker:
        topic = f"bench.metrics.{uuid.uuid4().hex[:6]}"
        deadletter = f"bench.deadletter.{uuid.uuid4().hex[:6]}"
        ensure_topics(broker.bootstrap, {topic: args.partitions, deadletter: 1})
        with BatchProducer(broker.bootstrap, topic=topic, signer=FleetSigner(key)) as producer:
            for batch in batches:
                producer.send(batch)
            producer.flush(120)
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                rates[mode].append(
                    drain(broker.bootstrap, topic, deadletter, len(batches), mode == "on", key)
                )
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(
        json.dumps(
            {
                "batches": len(batches),
                "samples_per_batch": len(batches[0].samples),
                "per_batch": costs,
                "drain_per_s": {
                    "verification_on": round(on),
                    "verification_off": round(off),
                    "on_over_off": round(on / off, 3),
                    "rounds": {mode: [round(r) for r in runs] for mode, runs in rates.items()},
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
