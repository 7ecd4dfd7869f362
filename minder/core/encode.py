"""Encoder side of the wire codec of the per-node batch (docs/architecture.md §3.2).

What a node agent needs to write batches, in the standard library and msgpack only, so that the
agent's process does not load numpy (issue 14: ~20 MiB of its resident memory). The schema-2
values are packed with :mod:`struct` as little-endian float32, the bytes numpy's ``"<f4"`` cast
gives (values beyond float32 or not floats at all, which the agent never sends, still take
numpy's conversion, as before).
The decoder and the envelope's description live in :mod:`minder.core.codec`, which re-exports
every name here, so ``from minder.core.codec import BatchEncoder`` keeps working.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from minder.core.errors import ValidationError
from minder.core.hang import BATCH_FIELD
from minder.core.records import PACKED_SCHEMA_VERSION, SCHEMA_VERSION, Event, NodeBatch
from minder.core.wire import AGENT_FORMAT, DEFAULT_FORMAT, WireFormat

__all__ = [
    "ANNOUNCE_EVERY",
    "ANNOUNCE_EVERY_S",
    "BatchEncoder",
    "EncoderStats",
    "batch_to_dict",
    "encode_batch",
    "layout_definition",
    "layout_id",
]

ANNOUNCE_EVERY = 10
"""A node inlines its layout in one batch of this many (and at every change)."""
ANNOUNCE_EVERY_S = 10.0
"""... and at least this often in data seconds (so a slow interval re-announces too)."""
_F32 = "<f4"
"""Little-endian float32, as the values travel (a dtype name: numpy is not imported here)."""


def batch_to_dict(batch: NodeBatch, *, columns: bool = True) -> dict[str, Any]:
    """Return the schema-1 envelope as plain data (the form both schema-1 encodings carry).

    Samples travel as three parallel lists (``"columns": {"metric", "device", "value"}``): two to
    three times cheaper to encode and decode than one ``[metric, device, value]`` list per
    sample (``bench/codec.py``). ``columns=False`` gives that readable triple form, which the
    decoder accepts too. A packed batch (decoded from schema 2) is written with its samples
    named. Flight-recorder summaries (:attr:`NodeBatch.flight_recorder`) travel under
    :data:`minder.core.hang.BATCH_FIELD`, in every format, and only when there are some.
    """
    samples = batch.samples if batch.values is None else batch.all_samples()
    data: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "job": batch.job,
        "node": batch.node,
        "ts": batch.ts,
        "interval_s": batch.interval_s,
        "labels": batch.labels,
    }
    if columns:
        data["columns"] = {
            "metric": [s[0] for s in samples],
            "device": [s[1] for s in samples],
            "value": [s[2] for s in samples],
        }
    else:
        data["samples"] = [list(s) for s in samples]
    data["events"] = [_event_to_dict(e) for e in batch.events]
    if batch.flight_recorder:
        data[BATCH_FIELD] = [s.to_dict() for s in batch.flight_recorder]
    return data


def _event_to_dict(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": event.kind.value, "device": event.device, "ts": event.ts}
    if event.code is not None:
        out["code"] = event.code
    if event.message:
        out["message"] = event.message
    return out


def layout_id(metrics: Sequence[str], devices: Sequence[str]) -> int:
    """The 64-bit content hash naming a layout: BLAKE2b of the msgpack of both name lists."""
    digest = hashlib.blake2b(
        msgpack.packb([list(metrics), list(devices)], use_bin_type=True), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little")


def layout_definition(metrics: Sequence[str], devices: Sequence[str]) -> dict[str, Any]:
    """A layout as it is inlined (``"layout_def"``): each distinct name once, then per position
    the index of its metric and of its device."""
    metric_index: dict[str, int] = {}
    device_index: dict[str, int] = {}
    by_metric = [metric_index.setdefault(m, len(metric_index)) for m in metrics]
    by_device = [device_index.setdefault(d, len(device_index)) for d in devices]
    return {
        "metrics": list(metric_index),
        "devices": list(device_index),
        "metric": by_metric,
        "device": by_device,
    }


def _packed_dict(
    batch: NodeBatch,
    lid: int | None,
    values: bytes,
    definition: dict[str, Any] | None,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": PACKED_SCHEMA_VERSION,
        "job": batch.job,
        "node": batch.node,
        "ts": batch.ts,
        "interval_s": batch.interval_s,
        "labels": batch.labels,
    }
    if lid is not None:
        data["layout"] = lid
        data["values"] = values
        if definition is not None:
            data["layout_def"] = definition
    if batch.events:
        data["events"] = [_event_to_dict(e) for e in batch.events]
    if batch.flight_recorder:
        data[BATCH_FIELD] = [s.to_dict() for s in batch.flight_recorder]
    return data


def _unzip(batch: NodeBatch) -> tuple[tuple[str, ...], tuple[str, ...], bytes]:
    """Names, devices and packed float32 values of a batch's samples (either form)."""
    if batch.layout is not None and batch.values is not None and not batch.samples:
        return batch.layout.metrics, batch.layout.devices, batch.values.astype(_F32).tobytes()
    samples = batch.samples if batch.values is None else batch.all_samples()
    if not samples:
        return (), (), b""
    metrics, devices, values = zip(*samples, strict=True)
    try:
        packed = struct.pack(f"<{len(values)}f", *values)
    except (OverflowError, struct.error):
        # Beyond float32 (numpy says inf) or not a float at all: numpy's conversion, as always.
        # Never from the agent, whose samples are floats within their metric's float32 bounds.
        import numpy as np  # noqa: PLC0415

        packed = np.asarray(values, dtype=_F32).tobytes()
    return metrics, devices, packed


def encode_batch(batch: NodeBatch, fmt: WireFormat = DEFAULT_FORMAT) -> bytes:
    """Encode one batch for the wire, on its own.

    ``WireFormat.PACKED`` inlines the layout in every message (any decoder reads it); a node
    sending a stream uses :class:`BatchEncoder`, which inlines it only now and then.
    """
    if fmt is WireFormat.PACKED:
        metrics, devices, values = _unzip(batch)
        if not metrics:
            packed: bytes = msgpack.packb(_packed_dict(batch, None, b"", None), use_bin_type=True)
            return packed
        data = _packed_dict(
            batch, layout_id(metrics, devices), values, layout_definition(metrics, devices)
        )
        packed = msgpack.packb(data, use_bin_type=True)
        return packed
    data = batch_to_dict(batch)
    if fmt is WireFormat.JSON:
        import orjson  # noqa: PLC0415  # schema 1 in JSON only

        return orjson.dumps(data)
    packed = msgpack.packb(data, use_bin_type=True)
    return packed


@dataclass(slots=True)
class _Announced:
    """What one node's stream last said of its layout."""

    metrics: tuple[str, ...]
    devices: tuple[str, ...]
    id: int
    definition: dict[str, Any]
    since: int = 0
    """Batches sent since the layout was last inlined."""
    inlined_ts: float = -math.inf


@dataclass(slots=True)
class EncoderStats:
    """Counters of one :class:`BatchEncoder`."""

    batches: int = 0
    layouts_inlined: int = 0
    """Batches that carried their layout (first batch, change, periodic re-announcement)."""
    layout_changes: int = 0
    """Times a node's layout differed from its previous one (a GPU fell off the bus...)."""
    nodes_forgotten: int = 0
    """Nodes dropped from the encoder's memory beyond ``max_nodes`` (they re-announce)."""


class BatchEncoder:
    """Encodes a stream of batches, remembering per node what the stream announced.

    With ``WireFormat.PACKED`` (the default) a node's layout is inlined in its first batch, in
    the batch where it changes (a GPU fell off the bus: fewer pairs, another id), and then once
    every ``announce_every`` batches or ``announce_every_s`` seconds of data time, whichever comes
    first, so a worker that starts or takes a partition over mid-stream learns every layout within
    that bound (docs/architecture.md §3.2). Other formats are encoded by :func:`encode_batch`.

    Parameters
    ----------
    fmt
        Wire format.
    announce_every, announce_every_s
        Re-announcement period in batches and in data seconds.
    max_nodes
        Nodes remembered (one encoder may serve a simulator's whole cluster); beyond it the
        least recently seen is forgotten (and counted), so it simply announces again.
    """

    def __init__(
        self,
        fmt: WireFormat = AGENT_FORMAT,
        *,
        announce_every: int = ANNOUNCE_EVERY,
        announce_every_s: float = ANNOUNCE_EVERY_S,
        max_nodes: int = 100_000,
    ) -> None:
        if announce_every < 1:
            raise ValidationError(f"announce_every is {announce_every!r}: expected at least 1")
        if not announce_every_s > 0:
            raise ValidationError(
                f"announce_every_s is {announce_every_s!r}: expected a positive number of seconds"
            )
        if max_nodes < 1:
            raise ValidationError(f"max_nodes is {max_nodes!r}: expected at least 1")
        self.fmt = WireFormat(fmt)
        self.announce_every = announce_every
        self.announce_every_s = float(announce_every_s)
        self.max_nodes = max_nodes
        self.stats = EncoderStats()
        self._nodes: OrderedDict[tuple[str, str], _Announced] = OrderedDict()

    def encode(self, batch: NodeBatch) -> bytes:
        """Encode ``batch`` (inlining its layout when due)."""
        self.stats.batches += 1
        if self.fmt is not WireFormat.PACKED:
            return encode_batch(batch, self.fmt)
        metrics, devices, values = _unzip(batch)
        if not metrics:
            packed: bytes = msgpack.packb(_packed_dict(batch, None, b"", None), use_bin_type=True)
            return packed
        key = (batch.job, batch.node)
        state = self._nodes.get(key)
        if state is None or state.metrics != metrics or state.devices != devices:
            if state is not None:
                self.stats.layout_changes += 1
            state = _Announced(
                metrics, devices, layout_id(metrics, devices), layout_definition(metrics, devices)
            )
            self._nodes[key] = state
            if len(self._nodes) > self.max_nodes:
                self._nodes.popitem(last=False)
                self.stats.nodes_forgotten += 1
        self._nodes.move_to_end(key)
        inline = (
            state.inlined_ts == -math.inf
            or state.since >= self.announce_every - 1
            or not 0 <= batch.ts - state.inlined_ts < self.announce_every_s
        )
        if inline:
            state.since = 0
            state.inlined_ts = batch.ts
            self.stats.layouts_inlined += 1
        else:
            state.since += 1
        data = _packed_dict(batch, state.id, values, state.definition if inline else None)
        packed = msgpack.packb(data, use_bin_type=True)
        return packed

    def forget(self) -> None:
        """Forget every node: each announces its layout again with its next batch."""
        self._nodes.clear()
