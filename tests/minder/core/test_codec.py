from __future__ import annotations

import math

import msgpack
import orjson
import pytest

from minder.core.codec import WireFormat, batch_to_dict, decode_batch, encode_batch
from minder.core.errors import DecodeError
from minder.core.records import Event, EventKind, NodeBatch


def _batch() -> NodeBatch:
    return NodeBatch(
        job="j42",
        node="n0017",
        ts=1763700000.25,
        interval_s=1.0,
        labels={"rack": "r3", "switch": "leaf-12", "group": "pp3"},
        samples=[
            ("gpu_util_ratio", "gpu0", 0.97),
            ("gpu_power_watts", "gpu0", 612),
            ("pfc_tx_pause_per_second", "mlx5_1", 12.5),
            ("cpu_util_ratio", "", 0.31),
            ("train_step_seconds", "rank7", 5.2),
        ],
        events=[Event(EventKind.XID, "gpu3", 1763700000.1, code=79, message="fell off the bus")],
    )


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_round_trip(fmt: WireFormat) -> None:
    batch = _batch()
    decoded = decode_batch(encode_batch(batch, fmt))
    expected = NodeBatch(
        job=batch.job,
        node=batch.node,
        ts=batch.ts,
        interval_s=batch.interval_s,
        labels=batch.labels,
        samples=[(n, d, float(v)) for n, d, v in batch.samples],
        events=batch.events,
    )
    assert decoded == expected
    assert decoded.group == "pp3" and decoded.domain == "leaf-12"
    assert isinstance(decoded.samples[1][2], float)


def test_formats_are_recognised_from_the_payload() -> None:
    batch = _batch()
    assert encode_batch(batch, WireFormat.JSON).startswith(b"{")
    assert decode_batch(encode_batch(batch, WireFormat.MSGPACK)).node == "n0017"
    # A layout seen once takes the fast path afterwards: same answer.
    assert decode_batch(encode_batch(batch)) == decode_batch(encode_batch(batch))


def _envelope(**changes: object) -> dict[str, object]:
    data = batch_to_dict(_batch(), columns=False)
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "empty message"),
        (b"\xc1\x00garbage", "undecodable payload"),
        (b"{not json", "undecodable payload"),
        (orjson.dumps([1, 2]), "expected an object"),
        (orjson.dumps(_envelope(schema=2)), "'schema' is 2: expected 1"),
        (orjson.dumps(_envelope(job="")), "'job' is '': expected a non-empty string"),
        (orjson.dumps(_envelope(ts="soon")), "'ts' is 'soon': expected a finite number"),
        (orjson.dumps(_envelope(ts=-1e19)), "expected unix seconds between"),
        (orjson.dumps(_envelope(samples=[["gpu_util_ratio", ["gpu0"], 0.5]])), "two strings"),
        (orjson.dumps(_envelope(interval_s=0)), "expected a positive number"),
        (orjson.dumps(_envelope(labels={"rack": 3})), "map of strings to strings"),
        (orjson.dumps(_envelope(samples={"a": 1})), "expected a list"),
        (orjson.dumps(_envelope(samples=[["gpu_util", "gpu0", 0.5]])), "unknown metric 'gpu_util'"),
        (orjson.dumps(_envelope(samples=[["gpu_util_ratio", "nic0", 0.5]])), "expected 'gpu0'"),
        (orjson.dumps(_envelope(samples=[["gpu_util_ratio", "gpu0", 1.7]])), "in [0, 1]"),
        (orjson.dumps(_envelope(samples=[["gpu_util_ratio", "gpu0", "0.5"]])), "value '0.5'"),
        (orjson.dumps(_envelope(samples=[["gpu_util_ratio", "gpu0", True]])), "value True"),
        (orjson.dumps(_envelope(samples=[["gpu_util_ratio", "gpu0"]])), "expected [metric"),
        (orjson.dumps(_envelope(samples=[["cpu_util_ratio", "cpu0", 0.5]])), "carry no device"),
        (orjson.dumps(_envelope(events=[{"kind": "meteor", "ts": 1}])), "expected one of"),
        (orjson.dumps(_envelope(events=[{"kind": "xid", "ts": 1, "code": "79"}])), "integer"),
    ],
)
def test_rejection_names_the_problem(payload: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_batch(payload)
    assert message in info.value.reason


def _columns(**columns: object) -> bytes:
    data = batch_to_dict(_batch())
    data["columns"] = {**data["columns"], **columns}  # type: ignore[dict-item]
    return msgpack.packb(data)


def test_column_form_is_validated_like_the_triples() -> None:
    batch = _batch()
    assert "columns" in batch_to_dict(batch) and "samples" not in batch_to_dict(batch)
    assert (
        decode_batch(encode_batch(batch)).samples
        == decode_batch(orjson.dumps(batch_to_dict(batch, columns=False))).samples
    )
    with pytest.raises(DecodeError, match="expected the same length"):
        decode_batch(_columns(value=[0.5]))
    with pytest.raises(DecodeError, match=r"samples\[0\] gpu_util_ratio\{gpu0\} has value 7"):
        decode_batch(_columns(value=[7, 612, 12.5, 0.31, 5.2]))
    with pytest.raises(DecodeError, match="unknown metric 'gpu_utilization'"):
        decode_batch(
            _columns(metric=["gpu_utilization", *batch_to_dict(batch)["columns"]["metric"][1:]])
        )
    with pytest.raises(DecodeError, match="needs 'metric', 'device' and 'value' lists"):
        decode_batch(_columns(device="gpu0"))
    both = batch_to_dict(batch)
    both["samples"] = []
    with pytest.raises(DecodeError, match="both 'samples' and 'columns'"):
        decode_batch(msgpack.packb(both))


def test_non_finite_values_are_refused_in_msgpack() -> None:
    data = _envelope(samples=[["gpu_power_watts", "gpu0", math.inf]])
    with pytest.raises(DecodeError, match="expected a finite number"):
        decode_batch(msgpack.packb(data))
    data = _envelope(samples=[["gpu_power_watts", "gpu0", math.nan]])
    with pytest.raises(DecodeError, match="expected a finite number"):
        decode_batch(msgpack.packb(data))


def test_a_bad_value_in_a_known_layout_is_still_refused() -> None:
    good = _batch()
    decode_batch(encode_batch(good))  # warms the layout cache
    bad = _batch()
    bad.samples[0] = ("gpu_util_ratio", "gpu0", 3.0)
    with pytest.raises(DecodeError, match=r"samples\[0\] gpu_util_ratio\{gpu0\} has value 3.0"):
        decode_batch(encode_batch(bad))


def test_unhashable_names_in_columns_are_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="two strings"):
        decode_batch(
            _columns(metric=[["gpu_util_ratio"], *batch_to_dict(_batch())["columns"]["metric"][1:]])
        )
