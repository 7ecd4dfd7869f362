"""Codec benchmark: one second of a large job, every wire format, and the service's ingest cost.

Run: ``python bench/codec.py [--machines 10000] [--repeat 3] [--baseline-tree DIR]``. Each node
batch carries what a real 8-GPU, 8-NIC node sends (every canonical metric: the GPU ones x 8, the
NIC ones x 8, the host ones, the training ones x 8 ranks named by the node's place in the job, so
every node has a layout of its own).

Part 1, the wire formats, per batch: bytes, encode µs, decode µs (``decode_batch``, validation
included), for schema 1 in msgpack (named samples, the format before schema 2) and JSON, schema 2
in its msgpack envelope (the default), and schema 2 with Apache Arrow IPC as the envelope instead
(two forms: a self-describing IPC stream per message, and the record batch alone with a schema
both ends know). Schema 2 figures are the steady state (layout known to the decoder); the bytes
of a batch that inlines its layout, and the average over the re-announcement period
(:data:`minder.core.codec.ANNOUNCE_EVERY`), are printed beside them.

Part 2, the detection service's ingest cost per batch: decoding a poll of 1,000 messages and
placing it in the job window (``DetectionService.ingest``), for schema 1 and schema 2 on this
tree, and for schema 1 on ``--baseline-tree`` (another checkout, e.g. ``git worktree add
/tmp/base <commit>``, measured in a subprocess in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Only names every tree has at module level: --baseline-tree imports this module with old code.
from minder.core.codec import WireFormat, decode_batch, encode_batch
from minder.core.metrics import METRICS, DeviceFamily
from minder.core.records import NodeBatch

POLL = 1_000


def node_batch(
    rng: np.random.Generator, node: int, ts: float, *, global_ranks: bool = True
) -> NodeBatch:
    """A node's batch; ``global_ranks``: its 8 ranks are named by their place in the job (every
    node a layout of its own), else ``rank0``-``rank7`` like the simulator's (one layout)."""
    first_rank = node * 8 if global_ranks else 0
    samples = []
    for name, spec in METRICS.items():
        if spec.family is DeviceFamily.GPU:
            devices = [f"gpu{i}" for i in range(8)]
        elif spec.family is DeviceFamily.NIC:
            devices = [f"mlx5_{i}" for i in range(8)]
        elif spec.family is DeviceFamily.RANK:
            devices = [f"rank{first_rank + i}" for i in range(8)]
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


# -- Arrow IPC as the schema-2 envelope (measured, not used: see bench/RESULTS.md) -------------


class ArrowEnvelope:
    """Schema 2 with an Arrow record batch of one row instead of the msgpack map."""

    def __init__(self, *, with_schema: bool) -> None:
        import pyarrow as pa  # noqa: PLC0415

        self.pa = pa
        self.with_schema = with_schema
        self.schema = pa.schema(
            [
                ("schema", pa.uint8()),
                ("job", pa.string()),
                ("node", pa.string()),
                ("ts", pa.float64()),
                ("interval_s", pa.float64()),
                ("labels", pa.map_(pa.string(), pa.string())),
                ("layout", pa.uint64()),
                ("values", pa.list_(pa.float32())),
                ("events", pa.string()),  # JSON; events are rare and stay structured
            ]
        )
        self.ids: dict[str, int] = {}

    def encode(self, batch: NodeBatch) -> bytes:
        from minder.core.codec import layout_id  # noqa: PLC0415

        pa = self.pa
        names, devices, values = zip(*batch.samples, strict=True)
        lid = self.ids.get(batch.node)
        if lid is None:
            lid = self.ids[batch.node] = layout_id(names, devices)
        record = pa.record_batch(
            [
                pa.array([2], pa.uint8()),
                pa.array([batch.job]),
                pa.array([batch.node]),
                pa.array([batch.ts]),
                pa.array([batch.interval_s]),
                pa.array([list(batch.labels.items())], self.schema.field("labels").type),
                pa.array([lid], pa.uint64()),
                pa.ListArray.from_arrays(
                    pa.array([0, len(values)], pa.int32()),
                    pa.array(np.asarray(values, dtype=np.float32)),
                ),
                pa.array(["[]"]),
            ],
            schema=self.schema,
        )
        if not self.with_schema:
            return bytes(record.serialize())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema) as writer:
            writer.write_batch(record)
        return bytes(sink.getvalue())

    def decode(self, payload: bytes) -> tuple[Any, ...]:
        pa = self.pa
        if self.with_schema:
            record = pa.ipc.open_stream(payload).read_next_batch()
        else:
            record = pa.ipc.read_record_batch(pa.py_buffer(payload), self.schema)
        header = tuple(record.column(i)[0].as_py() for i in (0, 1, 2, 3, 4, 5, 6, 8))
        values = record.column(7).values.to_numpy(zero_copy_only=True)
        return header, values


# -- measurement -------------------------------------------------------------------------


def _median_us(run: Callable[[], object], count: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / count * 1e6


def _encode_all(encode: Callable[[NodeBatch], bytes], batches: list[NodeBatch]) -> None:
    for b in batches:
        encode(b)


def _decode_all(decode: Callable[[bytes], object], payloads: list[bytes]) -> None:
    for p in payloads:
        decode(p)


def _row(
    name: str,
    encode: Callable[[NodeBatch], bytes],
    decode: Callable[[bytes], object],
    batches: list[NodeBatch],
    repeat: int,
) -> dict[str, Any]:
    n = len(batches)
    payloads = [encode(b) for b in batches]
    _decode_all(decode, payloads)  # warm: the decoders learn the layouts
    return {
        "format": name,
        "bytes": sum(map(len, payloads)) / n,
        "encode_us": _median_us(lambda: _encode_all(encode, batches), n, repeat),
        "decode_us": _median_us(lambda: _decode_all(decode, payloads), n, repeat),
    }


def formats(batches: list[NodeBatch], repeat: int) -> list[dict[str, Any]]:
    from minder.core.codec import ANNOUNCE_EVERY, BatchEncoder  # noqa: PLC0415

    rows = [
        _row(
            f"schema 1, {fmt.value}",
            lambda b, f=fmt: encode_batch(b, f),
            decode_batch,
            batches,
            repeat,
        )
        for fmt in (WireFormat.MSGPACK, WireFormat.JSON)
    ]
    encoder = BatchEncoder(WireFormat.PACKED, announce_every=10**9, announce_every_s=1e12)
    announced = [encoder.encode(b) for b in batches]  # the first batch of each node inlines
    _decode_all(decode_batch, announced)
    row = _row("schema 2, msgpack envelope", encoder.encode, decode_batch, batches, repeat)
    inline_bytes = sum(map(len, announced)) / len(batches)
    row["bytes_inlined"] = inline_bytes
    row["bytes_average"] = ((ANNOUNCE_EVERY - 1) * row["bytes"] + inline_bytes) / ANNOUNCE_EVERY
    rows.append(row)
    for with_schema in (True, False):
        arrow = ArrowEnvelope(with_schema=with_schema)
        # The layout itself would travel as in the msgpack envelope: its bytes are not counted.
        what = "stream (schema in each message)" if with_schema else "record batch only"
        rows.append(
            _row(f"schema 2, Arrow IPC {what}", arrow.encode, arrow.decode, batches, repeat)
        )
    return rows


def ingest_cost(machines: int, seconds: int, repeat: int, schemas: list[int]) -> dict[str, float]:
    """µs per batch of decode + ``DetectionService.ingest`` in polls of :data:`POLL` messages:
    ``seconds`` seconds of a ``machines``-machine job, after one second that fills the window's
    registries (and teaches the decoder the layouts)."""
    from detectors.methods import method_factory  # noqa: PLC0415
    from minder.service.engine import DetectionService  # noqa: PLC0415

    rng = np.random.default_rng(1)
    # Ranks named rank0-rank7 on every node, as the simulator names them: with one series per
    # global rank the job window (machines x series) of thousands of machines would not fit.
    template = [node_batch(rng, m, 0.0, global_ranks=False) for m in range(machines)]
    t0 = 1_763_700_000.0
    out: dict[str, float] = {}
    for schema in schemas:
        if schema == 2:
            from minder.core.codec import BatchEncoder  # noqa: PLC0415

            encoder = BatchEncoder(WireFormat.PACKED)
            encode: Callable[[NodeBatch], bytes] = encoder.encode
        else:
            encode = encode_batch  # schema 1, msgpack: what every tree writes by default
        stream = []
        for s in range(seconds + 1):
            for b in template:
                b.ts = t0 + s + 0.5
                stream.append(encode(b))
        first, rest = stream[:machines], stream[machines:]
        polls = [rest[i : i + POLL] for i in range(0, len(rest), POLL)]
        times = []
        for _ in range(repeat):
            service = DetectionService(method_factory("minder"), clock=lambda: t0 + seconds + 2)
            service.ingest([decode_batch(p) for p in first])
            started = time.perf_counter()
            for poll in polls:
                service.ingest([decode_batch(p) for p in poll])
            times.append(time.perf_counter() - started)
        out[f"schema {schema}"] = statistics.median(times) / len(rest) * 1e6
    return out


def _baseline(tree: Path, machines: int, seconds: int, repeat: int) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        f"sys.path.insert(1, {str(Path(__file__).parent)!r}); import codec as bench; "
        "print(json.dumps(bench.ingest_cost(int(sys.argv[2]), int(sys.argv[3]), "
        "int(sys.argv[4]), [1])))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tree), str(machines), str(seconds), str(repeat)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ingest-machines", type=int, default=2_000)
    parser.add_argument("--ingest-seconds", type=int, default=5)
    parser.add_argument("--baseline-tree", type=Path, help="another checkout to measure against")
    parser.add_argument("--skip-formats", action="store_true")
    args = parser.parse_args()
    from minder.core.codec import ANNOUNCE_EVERY, layout_definition  # noqa: PLC0415

    rng = np.random.default_rng(0)
    if not args.skip_formats:
        batches = [node_batch(rng, n, 1763700000.0) for n in range(args.machines)]
        per_node = len(batches[0].samples)
        metrics, devices = zip(*[(s[0], s[1]) for s in batches[0].samples], strict=True)
        definition = len(json.dumps(layout_definition(metrics, devices)))
        print(f"{args.machines} nodes x {per_node} samples; layout definition ~{definition} B")
        print(f"{'format':52} {'bytes':>7} {'encode µs':>10} {'decode µs':>10}")
        for row in formats(batches, args.repeat):
            extra = ""
            if "bytes_inlined" in row:
                extra = (
                    f"  (inlining the layout: {row['bytes_inlined']:.0f} B; average with one "
                    f"in {ANNOUNCE_EVERY} inlined: {row['bytes_average']:.0f} B)"
                )
            print(
                f"{row['format']:52} {row['bytes']:7.0f} {row['encode_us']:10.1f} "
                f"{row['decode_us']:10.1f}{extra}"
            )
    print(
        f"\ningest (decode + DetectionService.ingest, polls of {POLL}), "
        f"{args.ingest_machines} machines x {args.ingest_seconds} s, µs per batch:"
    )
    if args.baseline_tree is not None:
        base = _baseline(args.baseline_tree, args.ingest_machines, args.ingest_seconds, args.repeat)
        print(f"  baseline tree {args.baseline_tree}: schema 1 {base['schema 1']:.1f}")
    ours = ingest_cost(args.ingest_machines, args.ingest_seconds, args.repeat, [1, 2])
    print(f"  this tree: schema 1 {ours['schema 1']:.1f}, schema 2 {ours['schema 2']:.1f}")


if __name__ == "__main__":
    main()
