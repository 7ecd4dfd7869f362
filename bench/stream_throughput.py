"""Produce + consume throughput of NodeBatches (150 samples each) through an embedded Tansu.

Usage::

    python bench/stream_throughput.py --batches 20000 --format msgpack --compression none

Prints one JSON object: produce rate (encode + send + broker acknowledgement), consume rate
(fetch + decode + validate + commit, measured from the first delivered message so the ~1.5 s
group join is excluded), and the in-process encode/decode rates that bound them.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid

from minder.core.codec import WireFormat, decode_batch, encode_batch
from minder.core.records import NodeBatch, Sample
from minder.stream import BatchConsumer, BatchProducer, EmbeddedBroker, ensure_topics

GPU_METRICS = (
    "gpu_util_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_gr_engine_active_ratio",
    "gpu_dram_active_ratio",
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_sm_clock_hertz",
    "gpu_memory_used_bytes",
    "gpu_pcie_tx_bytes_per_second",
    "gpu_pcie_rx_bytes_per_second",
    "gpu_nvlink_tx_bytes_per_second",
    "gpu_nvlink_rx_bytes_per_second",
    "gpu_ecc_sbe_count",
    "gpu_xid_count",
    "gpu_throttle_reasons",
)
NIC_METRICS = (
    "rdma_tx_bytes_per_second",
    "rdma_rx_bytes_per_second",
    "rdma_xmit_wait_per_second",
    "rdma_cnp_sent_per_second",
    "rdma_cnp_handled_per_second",
    "rdma_port_up",
    "pfc_tx_pause_per_second",
    "pfc_rx_pause_per_second",
)
HOST_METRICS = (
    "cpu_util_ratio",
    "memory_used_bytes",
    "disk_read_bytes_per_second",
    "disk_write_bytes_per_second",
    "net_tx_bytes_per_second",
    "net_rx_bytes_per_second",
)


def node_samples(node: int, second: int) -> list[Sample]:
    """150 samples: 8 GPUs x 16 metrics, 2 NICs x 8, 6 host metrics, with varying values."""
    wobble = ((node * 31 + second * 17) % 100) / 1000.0
    samples: list[Sample] = []
    for g in range(8):
        for name in GPU_METRICS:
            if name.endswith("_ratio"):
                value = 0.85 + wobble
            elif "bytes" in name:
                value = 1.2e10 * (1 + wobble)
            else:
                value = 300.0 + 100 * wobble + g
            samples.append((name, f"gpu{g}", value))
    for n in range(2):
        for name in NIC_METRICS:
            value = 1.0 if name == "rdma_port_up" else 2.4e10 * (1 + wobble)
            samples.append((name, f"mlx5_{n}", value))
    for name in HOST_METRICS:
        samples.append((name, "", 0.3 + wobble if name.endswith("_ratio") else 1e9 * (1 + wobble)))
    return samples


def make_batches(count: int, jobs: int, nodes_per_job: int) -> list[NodeBatch]:
    t0 = time.time()
    batches = []
    for i in range(count):
        job, rest = i % jobs, i // jobs
        node, second = rest % nodes_per_job, rest // nodes_per_job
        batches.append(
            NodeBatch(
                job=f"job{job}",
                node=f"n{node:05d}",
                ts=t0 + second,
                labels={"group": f"pp{node % 8}", "domain": f"leaf-{node // 32}"},
                samples=node_samples(node, second),
            )
        )
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--nodes-per-job", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--format", choices=[f.value for f in WireFormat], default="msgpack")
    parser.add_argument("--compression", choices=["none", "gzip"], default="none")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # reconnect noise at shutdown
    fmt = WireFormat(args.format)
    compression = None if args.compression == "none" else args.compression

    batches = make_batches(args.batches, args.jobs, args.nodes_per_job)
    payloads = [encode_batch(b, fmt) for b in batches[:2000]]
    t = time.perf_counter()
    for b in batches[:2000]:
        encode_batch(b, fmt)
    encode_rate = 2000 / (time.perf_counter() - t)
    t = time.perf_counter()
    for p in payloads:
        decode_batch(p)
    decode_rate = len(payloads) / (time.perf_counter() - t)

    with EmbeddedBroker() as broker:
        topic = f"bench.metrics.{uuid.uuid4().hex[:6]}"
        deadletter = f"bench.deadletter.{uuid.uuid4().hex[:6]}"
        ensure_topics(broker.bootstrap, {topic: args.partitions, deadletter: 1})

        with BatchProducer(
            broker.bootstrap, topic=topic, fmt=fmt, compression=compression
        ) as producer:
            t = time.perf_counter()
            for batch in batches:
                producer.send(batch)
            producer.flush(120)
            produce_s = time.perf_counter() - t
            assert producer.stats.delivered == len(batches), producer.stats

        handled = 0
        first_message_at: float | None = None

        def handler(received: list[NodeBatch]) -> None:
            nonlocal handled
            handled += len(received)

        with BatchConsumer(
            broker.bootstrap,
            group_id="bench",
            topic=topic,
            deadletter_topic=deadletter,
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
        ) as consumer:
            t_all = time.perf_counter()
            deadline = t_all + 300
            while handled < len(batches) and time.perf_counter() < deadline:
                outcome = consumer.poll_once(handler, timeout_ms=500)
                if outcome.messages and first_message_at is None:
                    first_message_at = time.perf_counter()
            end = time.perf_counter()
            stats = consumer.stats
        assert first_message_at is not None and handled == len(batches), stats

    consume_s = end - first_message_at
    print(
        json.dumps(
            {
                "batches": len(batches),
                "samples_per_batch": len(batches[0].samples),
                "format": fmt.value,
                "compression": args.compression,
                "partitions": args.partitions,
                "bytes_per_batch": round(producer.stats.bytes_sent / len(batches)),
                "encode_per_s": round(encode_rate),
                "decode_per_s": round(decode_rate),
                "produce_per_s": round(len(batches) / produce_s),
                "consume_per_s": round(len(batches) / consume_s),
                "consume_incl_group_join_s": round(end - t_all, 2),
                "polls": stats.polls,
                "commits": stats.commits,
                "dead_lettered": stats.dead_lettered,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
