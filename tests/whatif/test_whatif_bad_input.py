"""Bad traces are refused (or their bad rows dropped with a count), naming what and where."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from minder.core.errors import TraceError
from whatif import JobMeta, Trace, analyze, load_trace, make_trace, write_canonical
from whatif.synth import SynthJob, synthesize


@pytest.fixture(scope="module")
def good() -> Trace:
    return synthesize(SynthJob(dp=2, pp=2, microbatches=2, steps=3))


def _write(tmp_path: Path, frame: pd.DataFrame, meta: dict[str, int] | None = None) -> Path:
    path = tmp_path / "trace-bad.parquet"
    frame.to_parquet(path, index=False)
    if meta is not None:
        (tmp_path / "meta-bad.yaml").write_text(yaml.safe_dump(meta))
    return path


def test_missing_columns(tmp_path: Path, good: Trace) -> None:
    path = _write(
        tmp_path,
        good.ops.to_frame().drop(columns=["duration", "stage"]),
        {"dp_size": 2, "pp_size": 2},
    )
    with pytest.raises(TraceError, match=r"missing column\(s\) \['stage', 'duration'\]") as info:
        load_trace(path)
    assert "trace-bad.parquet" in str(info.value)


def test_negative_durations(good: Trace) -> None:
    ops = good.ops.to_frame().copy()
    ops.loc[7, "duration"] = -0.5
    with pytest.raises(TraceError, match=r"1 row\(s\) have a negative duration: row 7 step=0"):
        make_trace(ops, good.meta)


def test_unknown_op_types(good: Trace) -> None:
    ops = good.ops.to_frame().copy()
    ops["optype"] = ops["optype"].astype(str)
    ops.loc[[3, 4], "optype"] = "moe-all-to-all"
    with pytest.raises(
        TraceError,
        match=r"2 row\(s\) have unknown op types: 'moe-all-to-all' "
        r"\(2 rows\) \(first at row 3\)",
    ):
        make_trace(ops, good.meta)


def test_unmatched_send_recv_pairs(good: Trace) -> None:
    ops = good.ops.to_frame()
    drop = (ops["optype"] == "backward-send") & (ops["seq_id"] == 0)
    with pytest.raises(
        TraceError,
        match=r"unmatched send/recv pairs: stage 1 has 1 "
        r"backward-send",
    ):
        analyze(good.with_ops(ops[~drop].reset_index(drop=True)))


def test_world_size_that_does_not_divide(tmp_path: Path, good: Trace) -> None:
    path = _write(
        tmp_path, good.ops.to_frame(), {"dp_size": 2, "pp_size": 2, "tp_size": 2, "world_size": 12}
    )
    with pytest.raises(TraceError, match=r"world_size 12 does not equal .* = 8") as info:
        load_trace(path)
    assert "meta-bad.yaml" in str(info.value)


def test_ranks_outside_the_layout(good: Trace) -> None:
    with pytest.raises(TraceError, match=r"have stage outside 0\.\.0 \(pp_size=1\)"):
        make_trace(good.ops, JobMeta(dp_size=2, pp_size=1))


def test_values_that_are_not_numbers(good: Trace) -> None:
    ops = good.ops.to_frame().copy()
    ops["start_ts"] = ops["start_ts"].astype(object)
    ops.loc[2, "start_ts"] = "soon"
    with pytest.raises(
        TraceError,
        match=r"column 'start_ts' has 1 value\(s\) that are not "
        r"finite numbers: row 2",
    ):
        make_trace(ops, good.meta)
    ops = good.ops.to_frame().copy()
    ops["seq_id"] = ops["seq_id"].astype(float)
    ops.loc[5, "seq_id"] = 1.5
    with pytest.raises(TraceError, match=r"column 'seq_id' has 1 value\(s\) that are not integers"):
        make_trace(ops, good.meta)


def test_meta_yaml_problems(tmp_path: Path, good: Trace) -> None:
    path = _write(tmp_path, good.ops.to_frame(), {"pp_size": 2})
    with pytest.raises(TraceError, match=r"missing key\(s\) \['dp_size'\]"):
        load_trace(path)
    (tmp_path / "meta-bad.yaml").write_text("dp_size: two\npp_size: 2\n")
    with pytest.raises(TraceError, match="dp_size must be an integer, got 'two'"):
        load_trace(path)


def test_not_a_trace_at_all(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(TraceError, match="cannot read Parquet"):
        load_trace(junk)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_trace(tmp_path / "absent.parquet")
    other = tmp_path / "trace.csv"
    other.write_text("a,b\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(other)


def test_partial_last_step_is_dropped_and_the_rest_analysed(good: Trace) -> None:
    # A trace cut mid-step: the analysis is still trustworthy on the complete steps.
    ops = good.ops.to_frame()
    last = ops["step"] == ops["step"].max()
    cut = ops[~last | (ops["start_ts"] < ops.loc[last, "start_ts"].median())]
    report = analyze(good.with_ops(cut.reset_index(drop=True)))
    assert report.steps == [0, 1]
    assert any("dropped 1 of 3 steps (steps 2)" in n for n in report.notes)


def test_canonical_round_trip(tmp_path: Path, good: Trace) -> None:
    parquet, meta = write_canonical(good, tmp_path / "trace-job.parquet")
    assert meta.name == "meta-job.yaml"
    back = load_trace(parquet)
    assert back.meta == good.meta
    pd.testing.assert_frame_equal(back.ops.to_frame(), good.ops.to_frame())
    np.testing.assert_allclose(analyze(back).slowdown, analyze(good).slowdown)


def test_integers_are_stored_narrow_and_read_back_alike(tmp_path: Path, good: Trace) -> None:
    # Index columns are int32 whether the trace comes from memory or from Parquet; a value that
    # does not fit keeps its 64 bits, and the analysis is the same either way.
    assert {str(good.ops[c].dtype) for c in ("dp_rank", "stage", "step", "seq_id")} == {"int32"}
    ops = good.ops.to_frame().assign(step=good.ops["step"].astype(np.int64) + 2**40)
    wide = make_trace(ops, good.meta)
    assert wide.ops["step"].dtype == np.int64
    back = load_trace(write_canonical(wide, tmp_path / "trace-wide.parquet")[0])
    pd.testing.assert_frame_equal(back.ops.to_frame(), wide.ops.to_frame())
    assert analyze(back).slowdown == analyze(good).slowdown


def test_parquet_that_is_not_plain_is_read_by_the_general_reader(
    tmp_path: Path, good: Trace
) -> None:
    # Op types as plain strings, integers stored as floats: read as if they were plain.
    frame = good.ops.to_frame()
    plain = frame.assign(optype=frame["optype"].astype(str), seq_id=frame["seq_id"] * 1.0)
    path = _write(tmp_path, plain, {"dp_size": 2, "pp_size": 2})
    pd.testing.assert_frame_equal(load_trace(path).ops.to_frame(), frame)
    # A missing value still gets the general reader's message naming the row.
    holes = plain.astype({"seq_id": "float64"})
    holes.loc[3, "seq_id"] = np.nan
    path = _write(tmp_path, holes, {"dp_size": 2, "pp_size": 2})
    with pytest.raises(TraceError, match=r"'seq_id' has 1 value\(s\) that are not integers.*row 3"):
        load_trace(path)
