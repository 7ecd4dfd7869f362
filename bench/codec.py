"""Codec benchmark: encode + decode one second of a 10,000-machine job, JSON vs msgpack.

Run: ``python bench/codec.py [--machines 10000] [--repeat 3]``. Each node batch carries what a
real 8-GPU, 8-NIC node sends (21 GPU metrics x 8, 10 NIC metrics x 8, 6 host, 3 x 8 ranks).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from minder.core.codec import WireFormat, decode_batch, encode_batch
from minder.core.metrics import METRICS, DeviceFamily
from minder.core.records import NodeBatch


def node_batch(rng: np.random.Generator, node: int, ts: float) -> NodeBatch:
    samples = []
    for name, spec in METRICS.items():
        if spec.family is DeviceFamily.GPU:
            devices = [f"gpu{i}" for i in range(8)]
        elif spec.family is DeviceFamily.NIC:
            devices = [f"mlx5_{i}" for i in range(8)]
        elif spec.family is DeviceFamily.RANK:
            devices = [f"rank{node * 8 + i}" for i in range(8)]
        else:
            devices = [""]
        upper = 1.0 if spec.upper <= 1.0 else 1000.0
        for dev in devices:
            samples.append((name, dev, float(rng.uniform(0, upper))))
    return NodeBatch(
        job="job-42",
        node=f"node{node:05d}",
        ts=ts,
        labels={"group": f"pp{node % 16}", "domain": f"leaf-{node // 32:03d}"},
        samples=samples,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batches = [node_batch(rng, n, 1763700000.0) for n in range(args.machines)]
    per_node = len(batches[0].samples)
    print(f"{args.machines} nodes x {per_node} samples = {args.machines * per_node:,} samples")
    print(f"{'format':8} {'encode s':>9} {'decode s':>9} {'total s':>8} {'bytes/node':>11}")
    for fmt in WireFormat:
        enc_times, dec_times = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            payloads = [encode_batch(b, fmt) for b in batches]
            t1 = time.perf_counter()
            for p in payloads:
                decode_batch(p)
            t2 = time.perf_counter()
            enc_times.append(t1 - t0)
            dec_times.append(t2 - t1)
        enc, dec = statistics.median(enc_times), statistics.median(dec_times)
        size = sum(len(p) for p in payloads) / len(payloads)
        print(f"{fmt.value:8} {enc:9.3f} {dec:9.3f} {enc + dec:8.3f} {size:11.0f}")


if __name__ == "__main__":
    main()
