from __future__ import annotations

import math

import msgpack
import numpy as np
import orjson
import pytest

from minder.core.codec import (
    BatchEncoder,
    Decoder,
    LayoutCache,
    WireFormat,
    batch_to_dict,
    decode_batch,
    encode_batch,
    layout_definition,
    layout_id,
)
from minder.core.errors import DecodeError
from minder.core.hang import EntryState, FrEntry, GroupState, RankSummary, rank_runs
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


@pytest.mark.parametrize("fmt", [WireFormat.MSGPACK, WireFormat.JSON])
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
        (orjson.dumps(_envelope(schema=3)), "'schema' is 3: expected 1 or 2"),
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


# -- schema 2: the packed layout -----------------------------------------------------------------


def _node(node: str, ts: float, gpus: int = 4, rank0: int = 0) -> NodeBatch:
    samples: list[tuple[str, str, float]] = []
    for g in range(gpus):
        samples += [
            ("gpu_util_ratio", f"gpu{g}", 0.25 * (g % 4)),
            ("gpu_power_watts", f"gpu{g}", 300.0 + g),
        ]
    samples += [("cpu_util_ratio", "", 0.5), ("train_step_seconds", f"rank{rank0}", 1.5)]
    return NodeBatch(job="j2", node=node, ts=ts, labels={"group": "pp0"}, samples=samples)


def _fields(payload: bytes) -> dict[str, object]:
    data = msgpack.unpackb(payload, raw=False)
    assert isinstance(data, dict)
    return data


def test_packed_round_trip_keeps_samples_as_float32_and_events_as_structures() -> None:
    batch = _batch()
    decoded = Decoder().decode(encode_batch(batch, WireFormat.PACKED))
    assert decoded.schema == 2 and decoded.samples == [] and decoded.layout is not None
    assert decoded.sample_count == len(batch.samples)
    got = decoded.all_samples()
    assert [(m, d) for m, d, _ in got] == [(m, d) for m, d, _ in batch.samples]
    assert [v for _, _, v in got] == pytest.approx([v for _, _, v in batch.samples], rel=1e-6)
    assert decoded.values is not None and decoded.values.dtype == np.float32
    assert decoded.events == batch.events and decoded.labels == batch.labels
    assert (decoded.job, decoded.node, decoded.ts) == (batch.job, batch.node, batch.ts)
    # A decoded packed batch is written back with named samples (schema 1) on request.
    again = decode_batch(encode_batch(decoded, WireFormat.MSGPACK))
    assert again.schema == 1 and again.samples == got


def test_packed_payload_is_much_smaller_than_named_samples() -> None:
    batch = _node("n1", 1763700000.0, gpus=8)
    encoder = BatchEncoder()
    first, second = encoder.encode(batch), encoder.encode(batch)
    named = encode_batch(batch, WireFormat.MSGPACK)
    assert len(second) < len(first) < len(named)
    assert len(_fields(second)["values"]) == 4 * len(batch.samples)  # type: ignore[arg-type]
    assert len(second) * 3 < len(named)


def test_encoder_inlines_the_layout_first_periodically_and_on_change() -> None:
    encoder = BatchEncoder(announce_every=4, announce_every_s=100.0)
    inlined = []
    for i in range(9):
        inlined.append("layout_def" in _fields(encoder.encode(_node("n1", 1763700000.0 + i))))
    assert inlined == [True, False, False, False, True, False, False, False, True]
    # A GPU falls off the bus: the next batch carries the new layout at once.
    changed = _fields(encoder.encode(_node("n1", 1763700010.0, gpus=3)))
    assert (
        "layout_def" in changed
        and changed["layout"] != _fields(encoder.encode(_node("n1", 1763700011.0)))["layout"]
    )
    assert encoder.stats.layout_changes == 2
    # Data seconds count too: a slow node re-announces after announce_every_s.
    slow = BatchEncoder(announce_every=100, announce_every_s=30.0)
    marks = [
        "layout_def" in _fields(slow.encode(_node("n1", 1763700000.0 + 15 * i))) for i in range(5)
    ]
    assert marks == [True, False, True, False, True]
    # Schema 1 on request (for consumers older than schema 2).
    assert (
        _fields(BatchEncoder(WireFormat.MSGPACK).encode(_node("n1", 1763700000.0)))["schema"] == 1
    )


def test_layout_id_is_a_content_hash_shared_across_nodes() -> None:
    a, b, c = _node("a", 1763700000.0), _node("b", 1763700000.0), _node("c", 1763700000.0, rank0=8)
    ids = [_fields(encode_batch(x, WireFormat.PACKED))["layout"] for x in (a, b, c)]
    assert ids[0] == ids[1] != ids[2]
    metrics, devices = zip(*[(m, d) for m, d, _ in a.samples], strict=True)
    assert ids[0] == layout_id(metrics, devices)
    # Learnt from node a, the layout decodes node b's batches that do not carry it.
    decoder = Decoder()
    decoder.decode(BatchEncoder().encode(a))
    encoder_b = BatchEncoder()
    encoder_b.encode(b)
    assert decoder.decode(encoder_b.encode(b)).node == "b"


def test_a_layout_that_changes_mid_stream() -> None:
    decoder = Decoder()
    encoder = BatchEncoder(announce_every=50)
    t0 = 1763700000.0
    before = [decoder.decode(encoder.encode(_node("n1", t0 + i))) for i in range(3)]
    after = [decoder.decode(encoder.encode(_node("n1", t0 + 3 + i, gpus=3))) for i in range(3)]
    assert {b.sample_count for b in before} == {10} and {b.sample_count for b in after} == {8}
    assert before[0].layout is not None and after[0].layout is not None
    assert before[0].layout.id != after[0].layout.id
    assert ("gpu_util_ratio", "gpu3") not in after[-1].layout.pairs()  # type: ignore[union-attr]
    assert len(decoder.layouts) == 2
    # The node comes back with its GPU: the old layout is still known, and announced anyway.
    back = decoder.decode(encoder.encode(_node("n1", t0 + 6)))
    assert back.layout is before[0].layout


def test_a_layout_id_never_announced_is_refused() -> None:
    encoder = BatchEncoder()
    encoder.encode(_node("n1", 1763700000.0))  # the announcement, never seen by this decoder
    with pytest.raises(
        DecodeError, match=r"^unknown layout 0x[0-9a-f]{16} from job 'j2' node 'n1'"
    ):
        Decoder().decode(encoder.encode(_node("n1", 1763700001.0)))


def test_a_worker_joining_mid_stream_learns_each_layout_within_the_announcement_period() -> None:
    encoder = BatchEncoder(announce_every=5, announce_every_s=100.0)
    payloads = [
        encoder.encode(_node(f"n{n}", 1763700000.0 + s)) for s in range(12) for n in range(3)
    ]
    late = Decoder()  # takes the partition over at second 2
    refused = decoded = 0
    for payload in payloads[2 * 3 :]:
        try:
            late.decode(payload)
            decoded += 1
        except DecodeError as exc:
            assert exc.reason.startswith("unknown layout")
            refused += 1
    assert refused == 3 * 3  # seconds 2, 3, 4 of each node: before its announcement at second 5
    assert decoded == 3 * 7


def test_a_truncated_value_block_is_refused() -> None:
    payload = _fields(encode_batch(_node("n1", 1763700000.0), WireFormat.PACKED))
    for cut in (payload["values"][:-1], payload["values"][:-4], payload["values"] + b"\0\0\0\0"):  # type: ignore[index, operator]
        with pytest.raises(
            DecodeError, match=r"^field 'values' has \d+ bytes: expected 40 \(a float32 for each"
        ):
            Decoder().decode(msgpack.packb({**payload, "values": cut}))
    # A payload cut short on the wire is undecodable msgpack.
    with pytest.raises(DecodeError, match="undecodable payload"):
        Decoder().decode(encode_batch(_node("n1", 1763700000.0), WireFormat.PACKED)[:-9])


def _with_values(values: list[float]) -> bytes:
    payload = _fields(encode_batch(_node("n1", 1763700000.0, gpus=1), WireFormat.PACKED))
    return msgpack.packb({**payload, "values": np.asarray(values, dtype="<f4").tobytes()})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            [math.nan, 300.0, 0.5, 1.5],
            r"values\[0\] gpu_util_ratio\{gpu0\} is nan: expected a finite number in \[0, 1\]",
        ),
        ([0.5, math.inf, 0.5, 1.5], r"values\[1\] gpu_power_watts\{gpu0\} is inf"),
        ([0.5, 300.0, 1.5, 1.5], r"values\[2\] cpu_util_ratio\{\} is 1.5"),
        ([0.5, -2.0, 0.5, 1.5], r"values\[1\] gpu_power_watts\{gpu0\} is -2.0"),
    ],
)
def test_non_finite_and_out_of_range_values_are_refused(values: list[float], message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        Decoder().decode(_with_values(values))


def test_negative_zero_is_accepted_like_in_schema_1() -> None:
    decoded = Decoder().decode(_with_values([0.5, -0.0, 0.5, 1.5]))
    assert decoded.values is not None and decoded.values[1] == 0.0


def _bad_layout(**changes: object) -> bytes:
    batch = _node("n1", 1763700000.0, gpus=1)
    metrics, devices = zip(*[(m, d) for m, d, _ in batch.samples], strict=True)
    definition = {**layout_definition(metrics, devices), **changes}
    payload = _fields(encode_batch(batch, WireFormat.PACKED))
    try:  # the id of the pairs, so only the named problem is left
        names = [definition["metrics"][i] for i in definition["metric"]]  # type: ignore[index]
        devs = [definition["devices"][i] for i in definition["device"]]  # type: ignore[index]
        lid = layout_id(names, devs)
    except (TypeError, IndexError):
        lid = payload["layout"]
    return msgpack.packb({**payload, "layout": lid, "layout_def": definition})


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            lambda: _bad_layout(
                metrics=["gpu_util", "gpu_power_watts", "cpu_util_ratio", "train_step_seconds"]
            ),
            r"layout_def pairs\[0\] has unknown metric 'gpu_util'",
        ),
        (
            lambda: _bad_layout(devices=["nic0", "", "rank0"]),
            r"layout_def pairs\[0\]: metric 'gpu_util_ratio' got device 'nic0'",
        ),
        (
            lambda: _bad_layout(metric=[0, 0, 2, 3], device=[0, 0, 1, 2]),
            r"layout_def pairs\[1\] repeats gpu_util_ratio\{gpu0\} \(first at pairs\[0\]\)",
        ),
        (
            lambda: _bad_layout(metric=[0, 9, 2, 3]),
            r"layout_def pairs\[1\] has metric index 9: expected 0 to 3",
        ),
        (lambda: _bad_layout(metric=[0, 1]), "layout_def has 2 metric and 4 device indices"),
        (lambda: _bad_layout(metrics="gpu_util_ratio"), "layout_def needs lists"),
        (
            lambda: _bad_layout(devices=["gpu0", 7, "rank0"]),
            "layout_def devices holds 7: expected strings",
        ),
    ],
)
def test_bad_layouts_are_refused(payload: object, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        Decoder().decode(payload())  # type: ignore[operator]


def test_a_layout_that_does_not_hash_to_its_id_is_refused() -> None:
    payload = _fields(encode_batch(_node("n1", 1763700000.0), WireFormat.PACKED))
    with pytest.raises(
        DecodeError,
        match=r"^layout_def hashes to 0x[0-9a-f]{16} but the batch names layout 0x0000000000000007",
    ):
        Decoder().decode(msgpack.packb({**payload, "layout": 7}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layout": "abc"}, "field 'layout' is 'abc': expected a layout id"),
        ({"layout": -1}, "field 'layout' is -1"),
        ({"values": [0.5] * 10}, "field 'values' is list: expected bytes of little-endian float32"),
        ({"layout": None}, "field 'layout' is None while 'values' is not empty"),
        ({"events": [{"kind": "meteor", "ts": 1.0}]}, r"events\[0\] has kind 'meteor'"),
        ({"job": ""}, "field 'job' is '': expected a non-empty string"),
        ({"ts": math.nan}, "field 'ts' is nan: expected a finite number"),
    ],
)
def test_packed_envelope_fields_are_checked(changes: dict[str, object], message: str) -> None:
    payload = _fields(encode_batch(_node("n1", 1763700000.0), WireFormat.PACKED))
    with pytest.raises(DecodeError, match=message):
        Decoder().decode(msgpack.packb({**payload, **changes}))


def test_packed_schema_travels_only_as_msgpack() -> None:
    payload = _fields(encode_batch(_node("n1", 1763700000.0), WireFormat.PACKED))
    payload["values"] = "AAAA"
    payload.pop("layout_def")
    with pytest.raises(DecodeError, match="field 'values' is str"):
        Decoder().decode(orjson.dumps(payload))


def test_a_goodbye_travels_packed_without_a_layout() -> None:
    goodbye = NodeBatch(
        "j2",
        "n1",
        1763700000.0,
        samples=[],
        events=[Event(EventKind.LEAVE, "", 1763700000.0, message="bye")],
    )
    payload = BatchEncoder().encode(goodbye)
    assert "layout" not in _fields(payload)
    decoded = Decoder().decode(payload)
    assert decoded.schema == 2 and decoded.sample_count == 0 and decoded.events == goodbye.events


def test_the_layout_cache_is_bounded_and_counts_evictions() -> None:
    decoder = Decoder(LayoutCache(max_layouts=2))
    encoders = [BatchEncoder() for _ in range(3)]
    for i, encoder in enumerate(encoders):
        decoder.decode(encoder.encode(_node(f"n{i}", 1763700000.0, rank0=i)))
    assert (
        len(decoder.layouts) == 2
        and decoder.layouts.evictions == 1
        and decoder.layouts.learned == 3
    )
    with pytest.raises(DecodeError, match="unknown layout"):  # n0's layout was evicted
        decoder.decode(encoders[0].encode(_node("n0", 1763700001.0, rank0=0)))
    assert decoder.decode(encoders[2].encode(_node("n2", 1763700001.0, rank0=2))).node == "n2"
    by_pairs = Decoder(LayoutCache(max_pairs=15))
    for i in range(2):
        by_pairs.decode(encode_batch(_node(f"n{i}", 1763700000.0, rank0=i), WireFormat.PACKED))
    assert (
        len(by_pairs.layouts) == 1
        and by_pairs.layouts.evictions == 1
        and by_pairs.layouts.pairs == 10
    )


# -- flight-recorder summaries in the envelope ----------------------------------------------------


def _summary(rank: int, node: str = "n1") -> RankSummary:
    waiting = FrEntry(
        record_id=40 + rank,
        seq=12,
        op="gloo:all_reduce",
        state=EntryState.STARTED,
        input_sizes=((8, 1024),),
        output_sizes=((8, 1024),),
        input_dtypes=("Float",),
        output_dtypes=("Float",),
        created_ns=1_795_910_082_186_015_972,
        timeout_ms=600_000,
    )
    group = GroupState(
        group="0",
        desc="default_pg",
        ranks=rank_runs(range(4)),
        last_enqueued=12,
        last_started=12,
        last_completed=11,
        entries=(waiting,),
    )
    return RankSummary(
        rank=rank,
        version="2.10",
        groups=(group,),
        node=node,
        dumped_ts=1763700000.5,
        source=f"nccl_trace_rank_{rank}",
        entries_total=2000,
    )


def _with_summaries(batch: NodeBatch, *summaries: RankSummary) -> NodeBatch:
    batch.flight_recorder = list(summaries)
    return batch


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_flight_recorder_summaries_round_trip_in_every_format(fmt: WireFormat) -> None:
    batch = _with_summaries(_node("n1", 1763700000.0), _summary(0), _summary(3))
    decoded = Decoder().decode(encode_batch(batch, fmt))
    assert decoded.flight_recorder == [_summary(0), _summary(3)]
    assert decoded.flight_recorder[1].groups[0].entries[0].input_sizes == ((8, 1024),)
    assert decoded.sample_count == len(batch.samples)


def test_flight_recorder_summaries_travel_with_a_stream_and_without_samples() -> None:
    encoder = BatchEncoder()
    decoder = Decoder()
    plain = _node("n1", 1763700000.0)
    assert decoder.decode(encoder.encode(plain)).flight_recorder == []
    # A batch of the stream whose layout is not inlined still carries its summaries ...
    carrying = _with_summaries(_node("n1", 1763700001.0), _summary(2))
    payload = encoder.encode(carrying)
    assert "layout_def" not in _fields(payload)
    assert decoder.decode(payload).flight_recorder == [_summary(2)]
    # ... and so does one without samples (a goodbye).
    goodbye = _with_summaries(
        NodeBatch("j2", "n1", 1763700002.0, events=[Event(EventKind.LEAVE, "", 1763700002.0)]),
        _summary(1),
    )
    assert decoder.decode(encoder.encode(goodbye)).flight_recorder == [_summary(1)]


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_a_batch_without_summaries_is_byte_for_byte_what_it_was(fmt: WireFormat) -> None:
    batch = _node("n1", 1763700000.0)
    payload = encode_batch(batch, fmt)
    assert b"flight_recorder" not in payload
    assert encode_batch(_with_summaries(_node("n1", 1763700000.0)), fmt) == payload


def test_a_summary_without_a_node_gets_the_batchs_and_another_nodes_is_refused() -> None:
    batch = _with_summaries(_node("n1", 1763700000.0), _summary(0, node=""))
    assert decode_batch(encode_batch(batch)).flight_recorder == [_summary(0, node="n1")]
    foreign = _with_summaries(_node("n1", 1763700000.0), _summary(0, node="n2"))
    with pytest.raises(
        DecodeError, match=r"^flight_recorder\[0\]\.node is 'n2': expected the batch's node 'n1'"
    ):
        decode_batch(encode_batch(foreign))


def _summary_dict(**changes: object) -> dict[str, object]:
    return {**_summary(0).to_dict(), **changes}


@pytest.mark.parametrize("fmt", [WireFormat.PACKED, WireFormat.MSGPACK, WireFormat.JSON])
@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"v": 1}, r"^field 'flight_recorder' is dict: expected a list of rank summaries$"),
        (
            [_summary_dict()] * 65,
            r"^field 'flight_recorder' has 65 summaries: expected at most 64$",
        ),
        ([_summary_dict(), 7], r"^flight_recorder\[1\] is int: expected an object$"),
        ([_summary_dict(v=9)], r"^flight_recorder\[0\]\.v is 9: expected summary version 1$"),
        ([_summary_dict(rank=-1)], r"^flight_recorder\[0\]\.rank is -1: expected an integer"),
        (
            [_summary_dict(groups=[{"group": "0", "entries": [{"state": "lost"}]}])],
            r"^flight_recorder\[0\]\.groups\[0\]\.entries\[0\]\.state is 'lost'",
        ),
    ],
)
def test_malformed_summaries_are_refused_in_one_line(
    fmt: WireFormat, field: object, message: str
) -> None:
    data = (
        _fields(encode_batch(_node("n1", 1763700000.0), fmt))
        if fmt is WireFormat.PACKED
        else batch_to_dict(_node("n1", 1763700000.0))
    )
    data["flight_recorder"] = field
    payload = orjson.dumps(data) if fmt is WireFormat.JSON else msgpack.packb(data)
    with pytest.raises(DecodeError, match=message) as caught:
        Decoder().decode(payload)
    assert "\n" not in str(caught.value)
