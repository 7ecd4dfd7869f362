"""Wire codec of the per-node batch (docs/architecture.md §3.2).

Two encodings share one envelope: msgpack (the default, chosen by ``bench/codec.py``: see the
README) and JSON (orjson; readable with any Kafka tool). The decoder recognises either from the
first byte, validates the whole message, and raises :class:`DecodeError` with the reason, so the
consumer can route it to the dead-letter topic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import msgpack
import numpy as np
import orjson

from minder.core.errors import DecodeError, ValidationError
from minder.core.metrics import METRICS, MetricSpec, validate_device
from minder.core.records import SCHEMA_VERSION, Event, EventKind, NodeBatch, Sample


class WireFormat(StrEnum):
    """Encodings the codec writes."""

    MSGPACK = "msgpack"
    JSON = "json"


DEFAULT_FORMAT = WireFormat.MSGPACK

_EVENT_KINDS = {kind.value: kind for kind in EventKind}
# (metric, device) pairs already checked: a node reports the same few hundred pairs every second,
# so the device-name check runs once per pair instead of once per sample.
_checked_pairs: dict[tuple[str, str], MetricSpec] = {}
_MAX_CHECKED_PAIRS = 1_000_000
# Value bounds of each distinct (names, devices) layout already validated.
_layout_bounds: dict[tuple[tuple[Any, ...], tuple[Any, ...]], tuple[np.ndarray, np.ndarray]] = {}
_MAX_LAYOUTS = 65_536
_NUMBER_TYPES = frozenset({float, int})
MIN_TS = 0.0
MAX_TS = 4_102_444_800.0  # 2100-01-01: beyond it a timestamp is a broken clock, not data


def batch_to_dict(batch: NodeBatch, *, columns: bool = True) -> dict[str, Any]:
    """Return the envelope as plain data (the form both encodings carry).

    Samples travel as three parallel lists (``"columns": {"metric", "device", "value"}``): two to
    three times cheaper to encode and decode than one ``[metric, device, value]`` list per
    sample (``bench/codec.py``). ``columns=False`` gives that readable triple form, which the
    decoder accepts too.
    """
    data: dict[str, Any] = {
        "schema": batch.schema,
        "job": batch.job,
        "node": batch.node,
        "ts": batch.ts,
        "interval_s": batch.interval_s,
        "labels": batch.labels,
    }
    if columns:
        data["columns"] = {
            "metric": [s[0] for s in batch.samples],
            "device": [s[1] for s in batch.samples],
            "value": [s[2] for s in batch.samples],
        }
    else:
        data["samples"] = [list(s) for s in batch.samples]
    data["events"] = [_event_to_dict(e) for e in batch.events]
    return data


def _event_to_dict(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": event.kind.value, "device": event.device, "ts": event.ts}
    if event.code is not None:
        out["code"] = event.code
    if event.message:
        out["message"] = event.message
    return out


def encode_batch(batch: NodeBatch, fmt: WireFormat = DEFAULT_FORMAT) -> bytes:
    """Encode one batch for the wire."""
    data = batch_to_dict(batch)
    if fmt is WireFormat.JSON:
        return orjson.dumps(data)
    packed: bytes = msgpack.packb(data, use_bin_type=True)
    return packed


def decode_batch(payload: bytes) -> NodeBatch:
    """Decode and validate one wire message.

    Raises
    ------
    DecodeError
        The payload is not a well-formed batch; ``reason`` names the field, the value received
        and what was expected.
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
    return batch_from_dict(data)


def batch_from_dict(data: Any) -> NodeBatch:
    """Validate plain data (as decoded) into a :class:`NodeBatch`."""
    if not isinstance(data, dict):
        raise DecodeError(f"envelope is {type(data).__name__}: expected an object/map")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise DecodeError(f"field 'schema' is {schema!r}: expected {SCHEMA_VERSION}")
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
    columns = data.get("columns")
    if columns is not None:
        if "samples" in data:
            raise DecodeError("envelope has both 'samples' and 'columns': expected one of them")
        samples = _columns(columns)
    else:
        samples = _samples(data.get("samples", []))
    events = _events(data.get("events", []))
    return NodeBatch(
        job=job,
        node=node,
        ts=ts,
        interval_s=interval_s,
        labels=labels,
        samples=samples,
        events=events,
        schema=SCHEMA_VERSION,
    )


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


def _check_pair(i: int, name: Any, device: Any) -> MetricSpec:
    if not isinstance(name, str) or not isinstance(device, str):
        raise DecodeError(
            f"samples[{i}] has metric {name!r} and device {device!r}: expected two strings"
        )
    spec = METRICS.get(name)
    if spec is None:
        raise DecodeError(f"samples[{i}] has unknown metric {name!r}: expected a name of §3.1")
    try:
        validate_device(spec, device)
    except ValidationError as exc:
        raise DecodeError(f"samples[{i}]: {exc}") from None
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
