"""Wire codec of the per-node batch (docs/architecture.md §3.2).

Two envelope versions, both read:

- **schema 1** names every sample (``"columns": {"metric", "device", "value"}``, or triples),
  in msgpack or JSON (orjson; readable with any Kafka tool);
- **schema 2** (*packed*, msgpack only, the agent's default) carries a layout id and the values
  as little-endian float32 bytes; the layout itself (the ordered ``(metric, device)`` pairs)
  travels inlined (``"layout_def"``) in a node's first batch, whenever it changes, and every
  few batches after (:class:`BatchEncoder`). The id is a hash of the pairs, so any worker
  recognises a layout it learnt from any node. The decoder validates a layout once, when it
  first sees it, and then each batch's values with one vectorised check against the bounds
  of each position (:class:`Decoder`). The service backs the decoder's layouts with its
  database (:class:`LayoutStore`), so a worker that restarts or takes a partition over knows
  them before the nodes announce them again.

The decoder recognises JSON and msgpack from the first byte, validates the whole message, and
raises :class:`DecodeError` with the reason, so the consumer can route it to the dead-letter
topic. Choice and measurements: ``bench/codec.py`` and ``bench/RESULTS.md``.

The encoder side (:class:`BatchEncoder`, :func:`encode_batch`, :func:`layout_id` ...) lives in
:mod:`minder.core.encode`, standard library and msgpack only, so the node agent's process loads
no numpy; it is re-exported here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, cast

import msgpack
import numpy as np
import orjson

from minder.core.encode import (
    ANNOUNCE_EVERY,
    ANNOUNCE_EVERY_S,
    BatchEncoder,
    EncoderStats,
    batch_to_dict,
    encode_batch,
    layout_definition,
    layout_id,
)
from minder.core.errors import DecodeError, ValidationError
from minder.core.hang import BATCH_FIELD, MAX_SUMMARIES_PER_BATCH, RankSummary
from minder.core.metrics import METRICS, MetricSpec, validate_device
from minder.core.records import (
    PACKED_SCHEMA_VERSION,
    SCHEMA_VERSION,
    Event,
    EventKind,
    Layout,
    NodeBatch,
    Sample,
)
from minder.core.wire import AGENT_FORMAT, DEFAULT_FORMAT, WireFormat

__all__ = [  # with the encoder's names (minder.core.encode) and the wire formats, re-exported
    "AGENT_FORMAT",
    "ANNOUNCE_EVERY",
    "ANNOUNCE_EVERY_S",
    "DEFAULT_FORMAT",
    "MAX_LAYOUTS",
    "MAX_LAYOUT_CACHE_PAIRS",
    "MAX_LAYOUT_PAIRS",
    "MAX_STORE_MISSES",
    "MAX_TS",
    "MIN_TS",
    "STORE_LOG_EVERY_S",
    "STORE_MISS_TTL_S",
    "STORE_RETRY_S",
    "BatchEncoder",
    "Decoder",
    "EncoderStats",
    "LayoutCache",
    "LayoutStore",
    "WireFormat",
    "batch_from_dict",
    "batch_to_dict",
    "decode_batch",
    "encode_batch",
    "layout_cache",
    "layout_definition",
    "layout_id",
]

logger = logging.getLogger(__name__)


MAX_LAYOUT_PAIRS = 65_536
"""Most ``(metric, device)`` pairs in one layout."""
MAX_LAYOUTS = 65_536
"""Layouts one decoder keeps (least recently used evicted first, counted)."""
MAX_LAYOUT_CACHE_PAIRS = 16_000_000
"""Pairs all kept layouts may hold together (beyond it the least recently used go)."""
STORE_MISS_TTL_S = 5.0
"""How long a decoder trusts its backing store's "not there" for one layout id before asking
again (so a flood of batches with a truly unknown id costs one query per id per period)."""
STORE_RETRY_S = 5.0
"""After a backing store call raised, the store is left alone this long (lookups answer "not
there", saves wait for a later announcement), so a database that is down does not hold the poll
loop for its timeout at every batch."""
MAX_STORE_MISSES = 4_096
"""Layout ids whose "not there" a decoder remembers (oldest forgotten first)."""
STORE_LOG_EVERY_S = 60.0
"""A failing backing store is logged at most once per this many seconds (every failure counted)."""

_EVENT_KINDS = {kind.value: kind for kind in EventKind}
# (metric, device) pairs already checked: a node reports the same few hundred pairs every second,
# so the device-name check runs once per pair instead of once per sample.
_checked_pairs: dict[tuple[str, str], MetricSpec] = {}
_MAX_CHECKED_PAIRS = 1_000_000
# Value bounds of each distinct (names, devices) layout already validated (schema 1).
_layout_bounds: dict[tuple[tuple[Any, ...], tuple[Any, ...]], tuple[np.ndarray, np.ndarray]] = {}
_MAX_LAYOUTS = 65_536
# Schema 2: one metric tuple and one pair of float32 bound arrays per distinct metric sequence,
# shared by every layout with that sequence (nodes differ by device names, e.g. their ranks).
_metric_bounds: dict[
    tuple[str, ...], tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray | None]
] = {}
_MAX_METRIC_SEQUENCES = 4_096
_NUMBER_TYPES = frozenset({float, int})
_F32 = np.dtype("<f4")
_U32 = np.dtype("<u4")
MIN_TS = 0.0
MAX_TS = 4_102_444_800.0  # 2100-01-01: beyond it a timestamp is a broken clock, not data


class LayoutStore(Protocol):
    """Where a :class:`LayoutCache` keeps the layouts it learns, shared by every worker (the
    service's database: :class:`minder.storage.layouts.SqlLayoutStore`), so a worker that
    restarts or takes a partition over decodes the nodes' batches before they re-announce.

    Definitions are what the wire carries (``"layout_def"``, :func:`layout_definition`). Either
    method may raise: the cache counts and logs it and decodes on without the store.
    """

    def load(self, layout_id: int) -> dict[str, Any] | None:
        """The definition stored for ``layout_id``, or ``None`` when there is none."""
        ...

    def save(self, layout_id: int, definition: dict[str, Any]) -> None:
        """Keep ``definition`` under ``layout_id`` unless one is there already."""
        ...


class LayoutCache:
    """The layouts a decoder knows, by id: bounded in count and in pairs, least recently used
    evicted first, every eviction counted (an evicted layout is learnt again at its node's next
    announcement, or from the backing store; otherwise its batches in between are refused as
    ``unknown_layout``).

    With a backing ``store`` (:class:`LayoutStore`), every layout learnt from an inlined
    definition is saved there (once per id per process), and an id the cache does not hold is
    looked up there before its batch is refused; a "not there" is remembered for
    :data:`STORE_MISS_TTL_S` per id. A store that raises never breaks decoding: it is counted
    (``store_failures``), logged at most once a minute, and left alone for
    :data:`STORE_RETRY_S` (the cache works as without it meanwhile).
    """

    def __init__(
        self,
        max_layouts: int = MAX_LAYOUTS,
        max_pairs: int = MAX_LAYOUT_CACHE_PAIRS,
        *,
        store: LayoutStore | None = None,
        miss_ttl_s: float = STORE_MISS_TTL_S,
        retry_s: float = STORE_RETRY_S,
    ) -> None:
        if max_layouts < 1 or max_pairs < 1:
            raise ValidationError(
                f"max_layouts={max_layouts!r}, max_pairs={max_pairs!r}: expected at least 1"
            )
        for name, value in (("miss_ttl_s", miss_ttl_s), ("retry_s", retry_s)):
            if not 0 <= value < math.inf:
                raise ValidationError(
                    f"{name} is {value!r}: expected a finite number of seconds, 0 or more"
                )
        self.max_layouts = max_layouts
        self.max_pairs = max_pairs
        self.miss_ttl_s = float(miss_ttl_s)
        self.retry_s = float(retry_s)
        self.pairs = 0
        self.learned = 0
        self.evictions = 0
        self._store: LayoutStore | None = store
        self.store_loaded = 0
        """Layouts learnt from the store (a batch decoded that would have been refused)."""
        self.store_saved = 0
        """Layouts handed to the store."""
        self.store_misses = 0
        """Lookups the store answered with nothing."""
        self.store_refused = 0
        """Stored definitions that failed validation (not the id they are stored under...)."""
        self.store_failures = 0
        """Store calls that raised."""
        self._layouts: OrderedDict[int, Layout] = OrderedDict()
        self._saved: set[int] = set()
        self._misses: OrderedDict[int, float] = OrderedDict()
        self._logged_at = -math.inf
        self._down_until = -math.inf

    def __len__(self) -> int:
        return len(self._layouts)

    @property
    def store(self) -> LayoutStore | None:
        """The backing store, or ``None``."""
        return self._store

    @store.setter
    def store(self, store: LayoutStore | None) -> None:
        # Another store knows nothing of what this one was told or answered.
        self._store = store
        self._saved.clear()
        self._misses.clear()
        self._down_until = -math.inf

    def get(self, lid: int) -> Layout | None:
        layout = self._layouts.get(lid)
        if layout is not None:
            self._layouts.move_to_end(lid)
        return layout

    def learn(self, layout: Layout) -> Layout:
        """Keep ``layout`` (evicting the least recently used beyond the bounds); returns it."""
        old = self._layouts.pop(layout.id, None)
        if old is not None:
            self.pairs -= len(old)
        self._layouts[layout.id] = layout
        self.pairs += len(layout)
        self.learned += 1
        self._misses.pop(layout.id, None)
        while len(self._layouts) > 1 and (
            len(self._layouts) > self.max_layouts or self.pairs > self.max_pairs
        ):
            _, gone = self._layouts.popitem(last=False)
            self.pairs -= len(gone)
            self.evictions += 1
            if self.evictions == 1 or math.log2(self.evictions).is_integer():
                logger.warning(
                    "layout cache full (%d layouts, %d pairs): least recently used evicted "
                    "(%d so far); their nodes' batches are refused until re-announced",
                    len(self._layouts),
                    self.pairs,
                    self.evictions,
                )
        return layout

    def learn_announced(self, definition: Any, lid: int) -> Layout:
        """Validate an inlined definition, keep its layout, and save it to the store. Raises
        :class:`DecodeError` if it is invalid."""
        layout = self.learn(_layout_from_definition(definition, lid))
        self.announced(layout)
        return layout

    def announced(self, layout: Layout) -> None:
        """Save ``layout`` to the store unless this process did already (or the store is
        failing: it is tried again at a later announcement)."""
        lid = layout.id
        store = self.store
        if store is None or lid in self._saved or time.monotonic() < self._down_until:
            return
        # What is saved is rebuilt from the validated pairs: whatever else an agent's
        # definition carried (extra keys) stays out of the shared database.
        definition = layout_definition(layout.metrics, layout.devices)
        try:
            store.save(lid, definition)
        except Exception as exc:  # a store must never break decoding
            self._failed("save", lid, exc)
            return
        self.store_saved += 1
        self._mark_saved(lid)

    def from_store(self, lid: int) -> Layout | None:
        """The layout the store holds for ``lid`` (validated, then kept), or ``None``: no
        store, nothing stored (remembered for ``miss_ttl_s``), or the store failed.

        Raises :class:`DecodeError` when the stored definition is invalid (it does not hash to
        ``lid``...); that id is then not asked for again for ``miss_ttl_s`` either.
        """
        store = self.store
        if store is None:
            return None
        now = time.monotonic()
        if now < self._down_until:
            return None
        until = self._misses.get(lid)
        if until is not None:
            if now < until:
                return None
            del self._misses[lid]
        try:
            definition = store.load(lid)
        except Exception as exc:  # a store must never break decoding
            self._failed("load", lid, exc)
            self._miss(lid, now)
            return None
        if definition is None:
            self.store_misses += 1
            self._miss(lid, now)
            return None
        try:
            layout = _layout_from_definition(definition, lid)
        except DecodeError as exc:
            self.store_refused += 1
            self._miss(lid, now)
            logger.error(
                "layout 0x%016x in the layout store is invalid, not used: %s",
                lid,
                str(exc)[:300],
            )
            raise
        self.store_loaded += 1
        self._mark_saved(lid)
        return self.learn(layout)

    def _mark_saved(self, lid: int) -> None:
        if len(self._saved) >= 4 * self.max_layouts:
            self._saved.clear()  # saving again is harmless (the store keeps the first)
        self._saved.add(lid)

    def _miss(self, lid: int, now: float) -> None:
        self._misses[lid] = now + self.miss_ttl_s
        self._misses.move_to_end(lid)
        while len(self._misses) > MAX_STORE_MISSES:
            self._misses.popitem(last=False)

    def _failed(self, what: str, lid: int, exc: Exception) -> None:
        self.store_failures += 1
        now = time.monotonic()
        # A store that is down (a database timing out) is not asked again for a while: every
        # call would hold the poll loop for its timeout.
        self._down_until = now + self.retry_s
        if now - self._logged_at >= STORE_LOG_EVERY_S:
            self._logged_at = now
            logger.warning(
                "layout store %s of 0x%016x failed (%d failures so far; decoding goes on "
                "without the store): %s",
                what,
                lid,
                self.store_failures,
                repr(exc)[:300],
            )

    def clear(self) -> None:
        self._layouts.clear()
        self._misses.clear()
        self._saved.clear()
        self.pairs = 0


class Decoder:
    """Decodes and validates wire messages of either schema, with its own layout cache.

    :func:`decode_batch` uses one module-wide decoder; a process may hold others (tests, tools).
    """

    def __init__(self, layouts: LayoutCache | None = None) -> None:
        self.layouts = layouts if layouts is not None else LayoutCache()

    def decode(self, payload: bytes) -> NodeBatch:
        """Decode and validate one wire message.

        Raises
        ------
        DecodeError
            The payload is not a well-formed batch; ``reason`` names the field, the value
            received and what was expected.
        """
        if not payload:
            raise DecodeError("empty message: expected a JSON or msgpack batch envelope")
        first = payload[0]
        try:
            if first in (0x7B, 0x5B, 0x20, 0x0A, 0x0D, 0x09):  # '{', '[' or whitespace: JSON
                data = orjson.loads(payload)
            else:
                data = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        except (orjson.JSONDecodeError, ValueError, msgpack.ExtraData, msgpack.FormatError) as exc:
            raise DecodeError(
                f"undecodable payload ({len(payload)} bytes, first byte 0x{first:02x}): {exc}"
            ) from None
        except Exception as exc:  # msgpack raises assorted errors on truncated input
            raise DecodeError(f"undecodable payload ({len(payload)} bytes): {exc!r}") from None
        return self.from_dict(data)

    def from_dict(self, data: Any) -> NodeBatch:
        """Validate plain data (as decoded) into a :class:`NodeBatch`."""
        if not isinstance(data, dict):
            raise DecodeError(f"envelope is {type(data).__name__}: expected an object/map")
        schema = data.get("schema")
        if schema == PACKED_SCHEMA_VERSION:
            return self._packed(data)
        if schema != SCHEMA_VERSION:
            raise DecodeError(
                f"field 'schema' is {schema!r}: expected {SCHEMA_VERSION} or "
                f"{PACKED_SCHEMA_VERSION}"
            )
        job, node, ts, interval_s, labels = _header(data)
        columns = data.get("columns")
        if columns is not None:
            if "samples" in data:
                raise DecodeError("envelope has both 'samples' and 'columns': expected one of them")
            samples = _columns(columns)
        else:
            samples = _samples(data.get("samples", []))
        events = _events(data.get("events", []))
        summaries = data.get(BATCH_FIELD)
        return NodeBatch(
            job=job,
            node=node,
            ts=ts,
            interval_s=interval_s,
            labels=labels,
            samples=samples,
            events=events,
            schema=SCHEMA_VERSION,
            flight_recorder=[] if summaries is None else _flight_recorder(summaries, node),
        )

    def _packed(self, data: dict[str, Any]) -> NodeBatch:
        job, node, ts, interval_s, labels = _header(data)
        lid = data.get("layout")
        raw = data.get("values")
        events = _events(data.get("events", []))
        summaries = data.get(BATCH_FIELD)
        flight_recorder = [] if summaries is None else _flight_recorder(summaries, node)
        if lid is None:
            if raw is not None and raw != b"":
                raise DecodeError(
                    "field 'layout' is None while 'values' is not empty: expected the layout id "
                    "of the values"
                )
            return NodeBatch(
                job,
                node,
                ts,
                interval_s,
                labels,
                [],
                events,
                schema=PACKED_SCHEMA_VERSION,
                flight_recorder=flight_recorder,
            )
        if lid.__class__ is not int or not 0 <= lid < 2**64:
            raise DecodeError(
                f"field 'layout' is {lid!r}: expected a layout id (an integer in [0, 2**64))"
            )
        if raw.__class__ is not bytes:
            raise DecodeError(
                f"field 'values' is {type(raw).__name__}: expected bytes of little-endian float32 "
                "(schema 2 travels as msgpack)"
            )
        layout = self.layouts.get(lid)
        if layout is None:
            definition = data.get("layout_def")
            if definition is not None:
                layout = self.layouts.learn_announced(definition, lid)
            else:
                try:
                    layout = self.layouts.from_store(lid)
                    stored = ""
                except DecodeError as exc:
                    layout, stored = None, f"; the layout store's definition is invalid: {exc}"
                if layout is None:
                    raise DecodeError(
                        f"unknown layout 0x{lid:016x} from job {job[:64]!r} node {node[:64]!r}: "
                        "expected a layout announced earlier to this worker, in the layout "
                        f"store, or a 'layout_def' (nodes re-announce theirs periodically){stored}"
                    )
        elif "layout_def" in data and self.layouts.store is not None:
            self.layouts.announced(layout)  # saved unless it is already (one set lookup)
        n = len(layout.metrics)
        if len(raw) != 4 * n:
            raise DecodeError(
                f"field 'values' has {len(raw)} bytes: expected {4 * n} (a float32 for each of "
                f"the {n} pairs of layout 0x{lid:016x})"
            )
        values = np.frombuffer(raw, dtype=_F32)
        bits = layout.upper_bits
        if bits is None or not (values.view(_U32) <= bits).all():
            ok = (values >= layout.lower) & (values <= layout.upper)  # NaN fails both
            if not ok.all():
                i = int(np.argmin(ok))
                spec = METRICS[layout.metrics[i]]
                raise DecodeError(
                    f"values[{i}] {layout.metrics[i]}{{{layout.devices[i]}}} is "
                    f"{float(values[i])!r}: expected a finite number in [{spec.lower:g}, "
                    f"{spec.upper:g}] ({spec.unit})"
                )
        return NodeBatch(
            job,
            node,
            ts,
            interval_s,
            labels,
            [],
            events,
            schema=PACKED_SCHEMA_VERSION,
            layout=layout,
            values=values,
            flight_recorder=flight_recorder,
        )


_DECODER = Decoder()


def decode_batch(payload: bytes) -> NodeBatch:
    """Decode and validate one wire message with the module-wide :class:`Decoder`.

    Raises
    ------
    DecodeError
        The payload is not a well-formed batch; ``reason`` names the field, the value received
        and what was expected.
    """
    return _DECODER.decode(payload)


def batch_from_dict(data: Any) -> NodeBatch:
    """Validate plain data (as decoded) into a :class:`NodeBatch` (module-wide decoder)."""
    return _DECODER.from_dict(data)


def layout_cache() -> LayoutCache:
    """The layouts the module-wide decoder knows (its counters: ``learned``, ``evictions``,
    ``store_*``); the service sets its ``store`` to the database's (``minder.service.stack``)."""
    return _DECODER.layouts


def _layout_from_definition(raw: Any, lid: int) -> Layout:
    """Validate an inlined layout (names, devices, no repeated pair, its hash) into a Layout."""
    if not isinstance(raw, dict):
        raise DecodeError(f"layout_def is {type(raw).__name__}: expected a map")
    parts = [raw.get(key) for key in ("metrics", "devices", "metric", "device")]
    if not all(isinstance(x, list) for x in parts):
        raise DecodeError(
            "layout_def needs lists 'metrics', 'devices', 'metric' and 'device'; got "
            + ", ".join(type(x).__name__ for x in parts)
        )
    names, devices, m_index, d_index = cast("list[list[Any]]", parts)
    n = len(m_index)
    if n != len(d_index) or not 0 < n <= MAX_LAYOUT_PAIRS:
        raise DecodeError(
            f"layout_def has {len(m_index)} metric and {len(d_index)} device indices: expected "
            f"as many of each, 1 to {MAX_LAYOUT_PAIRS}"
        )
    for what, table in (("metrics", names), ("devices", devices)):
        bad = next((x for x in table if not isinstance(x, str)), None)
        if bad is not None:
            raise DecodeError(f"layout_def {what} holds {bad!r}: expected strings")
    try:
        mi = np.asarray(m_index, dtype=np.int64)
        di = np.asarray(d_index, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise DecodeError("layout_def indices: expected integers") from None
    if mi.ndim != 1 or di.ndim != 1:
        raise DecodeError("layout_def indices: expected flat lists of integers")
    for what, index, table in (("metric", mi, names), ("device", di, devices)):
        if ((index < 0) | (index >= len(table))).any():
            i = int(np.argmax((index < 0) | (index >= len(table))))
            raise DecodeError(
                f"layout_def pairs[{i}] has {what} index {int(index[i])}: expected 0 to "
                f"{len(table) - 1}"
            )
    metrics = tuple(names[i] for i in mi.tolist())
    devs = tuple(devices[i] for i in di.tolist())
    seen: dict[tuple[str, str], int] = {}
    for i, pair in enumerate(zip(metrics, devs, strict=True)):
        first = seen.setdefault(pair, i)
        if first != i:
            raise DecodeError(
                f"layout_def pairs[{i}] repeats {pair[0]}{{{pair[1]}}} (first at pairs[{first}]): "
                "expected each (metric, device) pair once"
            )
        if pair not in _checked_pairs:
            _check_pair(i, *pair, where="layout_def pairs")
    actual = layout_id(metrics, devs)
    if actual != lid:
        raise DecodeError(
            f"layout_def hashes to 0x{actual:016x} but the batch names layout 0x{lid:016x}: "
            "expected the id of its pairs (minder.core.codec.layout_id)"
        )
    shared = _metric_bounds.get(metrics)
    if shared is None:
        specs = [METRICS[m] for m in metrics]
        lower = np.asarray([sp.lower for sp in specs], dtype=_F32)
        upper = np.asarray([sp.upper for sp in specs], dtype=_F32)
        bits = upper.view(_U32) if not lower.any() and np.isfinite(upper).all() else None
        shared = (metrics, lower, upper, bits)
        if len(_metric_bounds) < _MAX_METRIC_SEQUENCES:
            _metric_bounds[metrics] = shared
    return Layout(lid, shared[0], devs, shared[1], shared[2], shared[3])


def _header(data: dict[str, Any]) -> tuple[str, str, float, float, dict[str, str]]:
    """Job, node, ts, interval and labels of an envelope, validated."""
    job, node, ts = data.get("job"), data.get("node"), data.get("ts")
    interval_s, labels = data.get("interval_s", 1.0), data.get("labels", {})
    # The common case in a few exact class checks; anything else takes the path that names it.
    if (
        job.__class__ is str
        and job
        and node.__class__ is str
        and node
        and ts.__class__ is float
        and MIN_TS < ts < MAX_TS
        and interval_s.__class__ is float
        and 0.0 < interval_s < math.inf
        and labels.__class__ is dict
        and all(k.__class__ is str and v.__class__ is str for k, v in labels.items())
    ):
        return job, node, ts, interval_s, labels
    return _header_checked(data)


def _header_checked(data: dict[str, Any]) -> tuple[str, str, float, float, dict[str, str]]:
    job = _text(data, "job")
    node = _text(data, "node")
    ts = _number(data, "ts")
    if not MIN_TS < ts < MAX_TS:
        raise DecodeError(
            f"field 'ts' is {ts!r}: expected unix seconds between {MIN_TS:.0f} and {MAX_TS:.0f}"
        )
    interval_s = _number(data, "interval_s", default=1.0)
    if interval_s <= 0:
        raise DecodeError(f"field 'interval_s' is {interval_s!r}: expected a positive number")
    labels = data.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise DecodeError(f"field 'labels' is {labels!r}: expected a map of strings to strings")
    return job, node, ts, interval_s, labels


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise DecodeError(f"field {key!r} is {value!r}: expected a non-empty string")
    return value


def _number(data: dict[str, Any], key: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DecodeError(f"field {key!r} is {value!r}: expected a finite number")
    return float(value)


def _columns(raw: Any) -> list[Sample]:
    """Samples in the column form: validated per layout and with numpy, like the fast path."""
    if not isinstance(raw, dict):
        raise DecodeError(
            f"field 'columns' is {type(raw).__name__}: expected a map of 'metric', 'device' and "
            "'value' lists"
        )
    names, devices, values = raw.get("metric"), raw.get("device"), raw.get("value")
    if not (isinstance(names, list) and isinstance(devices, list) and isinstance(values, list)):
        raise DecodeError(
            "field 'columns' needs 'metric', 'device' and 'value' lists; got "
            f"{type(names).__name__}, {type(devices).__name__}, {type(values).__name__}"
        )
    if not len(names) == len(devices) == len(values):
        raise DecodeError(
            f"columns have {len(names)} metrics, {len(devices)} devices and {len(values)} values: "
            "expected the same length"
        )
    if not names:
        return []
    samples = _known_layout(tuple(names), tuple(devices), values)
    if samples is None:
        return _samples_checked([list(t) for t in zip(names, devices, values, strict=True)])
    return samples


def _samples(raw: Any) -> list[Sample]:
    if not isinstance(raw, list):
        raise DecodeError(f"field 'samples' is {type(raw).__name__}: expected a list")
    if not raw:
        return []
    # Fast path: unzip in C, validate the (metric, device) layout once per distinct layout (a
    # node sends the same names every second) and the values with numpy. Any doubt falls back to
    # the exact per-sample check, which names the offending sample.
    try:
        names, devices, values = zip(*raw, strict=True)
    except (TypeError, ValueError):
        return _samples_checked(raw)
    samples = _known_layout(names, devices, values)
    return _samples_checked(raw) if samples is None else samples


def _known_layout(
    names: tuple[Any, ...], devices: tuple[Any, ...], values: Sequence[Any]
) -> list[Sample] | None:
    """Samples of an already validated layout whose values are plain numbers in range.

    ``None`` means the exact per-sample check must decide (a new layout, an unhashable name, a
    value that is not a plain number or out of range); it raises naming the offending sample,
    or learns the layout.
    """
    try:
        bounds = _layout_bounds.get((names, devices))
    except TypeError:
        return None
    if bounds is None or not set(map(type, values)) <= _NUMBER_TYPES:
        return None
    array = np.asarray(values, dtype=np.float64)
    if not ((array >= bounds[0]) & (array <= bounds[1])).all():
        return None
    return list(zip(names, devices, array.tolist(), strict=True))


def _samples_checked(raw: list[Any]) -> list[Sample]:
    out: list[Sample] = []
    append = out.append
    checked = _checked_pairs
    for i, item in enumerate(raw):
        try:
            name, device, value = item
        except (TypeError, ValueError):
            raise DecodeError(
                f"samples[{i}] is {item!r}: expected [metric, device, value]"
            ) from None
        spec = (
            checked.get((name, device))
            if isinstance(name, str) and isinstance(device, str)
            else None
        )
        if spec is None:
            spec = _check_pair(i, name, device)
        # Exact class checks refuse bools and strings; the finite upper bound refuses inf and NaN.
        value_class = value.__class__
        if (value_class is not float and value_class is not int) or not (
            spec.lower <= value <= spec.upper
        ):
            raise DecodeError(
                f"samples[{i}] {name}{{{device}}} has value {value!r}: expected a finite number "
                f"in [{spec.lower:g}, {spec.upper:g}] ({spec.unit})"
            )
        append((name, device, float(value)))
    _remember_layout(out)
    return out


def _remember_layout(samples: list[Sample]) -> None:
    """Keep the value bounds of a validated layout, so the next batch takes the fast path."""
    if not samples or len(_layout_bounds) >= _MAX_LAYOUTS:
        return
    names = tuple(s[0] for s in samples)
    devices = tuple(s[1] for s in samples)
    specs = [METRICS[n] for n in names]
    _layout_bounds[(names, devices)] = (
        np.fromiter((sp.lower for sp in specs), dtype=np.float64, count=len(specs)),
        np.fromiter((sp.upper for sp in specs), dtype=np.float64, count=len(specs)),
    )


def _check_pair(i: int, name: Any, device: Any, *, where: str = "samples") -> MetricSpec:
    """Check pair ``i`` of a batch's samples (or of a layout: ``where``); remember it."""
    if not isinstance(name, str) or not isinstance(device, str):
        raise DecodeError(
            f"{where}[{i}] has metric {name!r} and device {device!r}: expected two strings"
        )
    spec = METRICS.get(name)
    if spec is None:
        raise DecodeError(f"{where}[{i}] has unknown metric {name!r}: expected a name of §3.1")
    try:
        validate_device(spec, device)
    except ValidationError as exc:
        raise DecodeError(f"{where}[{i}]: {exc}") from None
    if len(_checked_pairs) < _MAX_CHECKED_PAIRS:
        _checked_pairs[(name, device)] = spec
    return spec


def _events(raw: Any) -> list[Event]:
    if not isinstance(raw, list):
        raise DecodeError(f"field 'events' is {type(raw).__name__}: expected a list")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise DecodeError(f"events[{i}] is {item!r}: expected an object")
        kind = _EVENT_KINDS.get(item.get("kind"))  # type: ignore[arg-type]
        if kind is None:
            raise DecodeError(
                f"events[{i}] has kind {item.get('kind')!r}: expected one of {sorted(_EVENT_KINDS)}"
            )
        device = item.get("device", "")
        if not isinstance(device, str):
            raise DecodeError(f"events[{i}] has device {device!r}: expected a string")
        ts = _number(item, "ts")
        code = item.get("code")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise DecodeError(f"events[{i}] has code {code!r}: expected an integer")
        message = item.get("message", "")
        if not isinstance(message, str):
            raise DecodeError(f"events[{i}] has message {message!r}: expected a string")
        out.append(Event(kind=kind, device=device, ts=ts, code=code, message=message))
    return out


def _flight_recorder(raw: Any, node: str) -> list[RankSummary]:
    """The envelope's flight-recorder summaries (:data:`~minder.core.hang.BATCH_FIELD`),
    validated.

    A summary names the node its rank ran on; in a batch that is the batch's node (the agent
    that read the dump), so an empty one is set to it and another one is refused: a node's
    batch, signed with that node's key, speaks for that node's ranks only.
    """
    if not isinstance(raw, list):
        raise DecodeError(
            f"field {BATCH_FIELD!r} is {type(raw).__name__}: expected a list of rank summaries"
        )
    if len(raw) > MAX_SUMMARIES_PER_BATCH:
        raise DecodeError(
            f"field {BATCH_FIELD!r} has {len(raw)} summaries: expected at most "
            f"{MAX_SUMMARIES_PER_BATCH}"
        )
    out: list[RankSummary] = []
    for i, item in enumerate(raw):
        where = f"{BATCH_FIELD}[{i}]"
        try:
            summary = RankSummary.from_dict(item, where)
        except ValidationError as exc:
            raise DecodeError(str(exc)) from None
        except (TypeError, ValueError, OverflowError) as exc:  # a value from_dict did not expect
            raise DecodeError(f"{where} is malformed: {exc!r:.200}") from None
        if not summary.node:
            summary = dataclasses.replace(summary, node=node)
        elif summary.node != node:
            raise DecodeError(
                f"{where}.node is {summary.node[:64]!r}: expected the batch's node {node[:64]!r} "
                "(an agent sends the dumps of its own node's ranks)"
            )
        out.append(summary)
    return out
