"""The op table as NumPy arrays: a canonical Parquet trace is analysed without importing pandas,
and the table, its derived columns and its messages are those of the DataFrame path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from minder.core.errors import TraceError
from whatif import (
    JobMeta,
    OpsTable,
    Trace,
    analyze,
    load_trace,
    make_trace,
    optypes,
    write_canonical,
)
from whatif.synth import SynthJob, synthesize
from whatif.trace import COLUMNS

REPO = Path(__file__).resolve().parents[2]

_NO_PANDAS = """
import json, runpy, sys
path, how = sys.argv[1], sys.argv[2]
if how == "cli":
    sys.argv = ["minder", "whatif", "analyze", path, "-f", "json", "--no-progress"]
    try:
        runpy.run_module("minder.cli", run_name="__main__")
    except SystemExit as exc:
        assert not exc.code, exc.code
else:
    from whatif import analyze_path
    print(json.dumps({"slowdown": analyze_path(path).to_dict()["slowdown"]}))
# pandas: never for a Parquet trace; rich: not for a report written as JSON
heavy = ("pandas", "rich")
loaded = sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy)))
print("LOADED " + json.dumps(loaded), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def job() -> Trace:
    return synthesize(SynthJob(dp=2, pp=2, microbatches=3, steps=3, seq_cv=0.2, seed=4))


@pytest.fixture(scope="module")
def parquet(job: Trace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_canonical(job, tmp_path_factory.mktemp("canonical") / "trace-job.parquet")[0]


@pytest.mark.parametrize("how", ["library", "cli"])
def test_a_canonical_trace_is_analysed_without_pandas_or_rich(
    parquet: Path, job: Trace, how: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_PANDAS, str(parquet), how],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["slowdown"] == analyze(job).slowdown
    loaded = json.loads(done.stderr.rsplit("LOADED ", 1)[1])
    assert loaded == [], f"the analysis imported {loaded[:5]}"


def test_the_table_and_its_frame_are_the_same_table(job: Trace, parquet: Path) -> None:
    table = job.ops
    assert isinstance(table, OpsTable) and table.columns == COLUMNS
    frame = table.to_frame()
    assert list(frame.columns) == list(COLUMNS) and len(frame) == len(table)
    assert frame["optype"].dtype == pd.CategoricalDtype(list(optypes.ALL))
    np.testing.assert_array_equal(frame["optype"].cat.codes.to_numpy(), table["optype"])
    # A table, its DataFrame and its Parquet file give the same table.
    for again in (make_trace(table, job.meta).ops, make_trace(frame, job.meta).ops):
        pd.testing.assert_frame_equal(again.to_frame(), frame)
    pd.testing.assert_frame_equal(load_trace(parquet).ops.to_frame(), frame)
    # Selection keeps the dtypes; a mask and its indices select alike.
    mask = table["step"] == 1
    part = table.take(mask)
    assert len(part) == int(mask.sum())
    pd.testing.assert_frame_equal(
        part.to_frame(), table.take(np.flatnonzero(mask)).to_frame(), check_exact=True
    )
    assert {c: part[c].dtype for c in COLUMNS} == {c: table[c].dtype for c in COLUMNS}


def test_a_table_is_refused_with_columns_missing_or_uneven() -> None:
    columns = {c: np.zeros(3, dtype=np.int32) for c in COLUMNS}
    with pytest.raises(ValueError, match=r"lack \['mb_id'\]"):
        OpsTable({c: v for c, v in columns.items() if c != "mb_id"})
    with pytest.raises(ValueError, match=r"differ in length \(\[2, 3\]\)"):
        OpsTable(columns | {"step": np.zeros(2, dtype=np.int32)})
    with pytest.raises(KeyError, match="no column 'when'"):
        OpsTable(columns)["when"]


def test_derived_columns_match_the_dataframe_path(job: Trace, tmp_path: Path) -> None:
    # Sequence ids are derived from start order (ties in row order) per step, DP rank, stage
    # and op type, alike from NumPy columns (a Parquet file) and from a DataFrame, and as
    # pandas' grouped cumulative count gives them.
    frame = job.ops.to_frame().sample(frac=1.0, random_state=3).reset_index(drop=True)
    frame.loc[frame.index[::7], "start_ts"] = 0.5  # ties
    bare = frame.drop(columns=["rank", "seq_id", "mc", "gmc", "mb_id"])
    path = tmp_path / "trace-bare.parquet"
    bare.to_parquet(path, index=False)
    (tmp_path / "meta-bare.yaml").write_text(yaml.safe_dump(job.meta.to_dict()))
    from_arrays = load_trace(path).ops.to_frame()
    from_frame = make_trace(bare, job.meta).ops.to_frame()
    pd.testing.assert_frame_equal(from_arrays, from_frame, check_exact=True)
    keys = ["step", "dp_rank", "stage", "optype"]
    expected = (
        bare.sort_values("start_ts", kind="stable")
        .groupby(keys, sort=False, observed=True)
        .cumcount()
        .reindex(bare.index)
    )
    np.testing.assert_array_equal(from_arrays["seq_id"].to_numpy(), expected.to_numpy())
    assert (from_arrays["rank"] == -1).all()


def _write_arrow(tmp_path: Path, job: Trace, change: dict[str, np.ndarray]) -> Path:
    """``job`` written by Arrow itself (a NaN stays a value, not a null) with ``change``."""
    frame = job.ops.to_frame()
    arrays = {c: pa.array(frame[c].to_numpy()) for c in COLUMNS if c != "optype"}
    arrays["optype"] = pa.DictionaryArray.from_arrays(
        pa.array(frame["optype"].cat.codes.to_numpy()),
        pa.array([str(c) for c in frame["optype"].cat.categories]),
    )
    arrays |= {c: pa.array(v) for c, v in change.items()}
    path = tmp_path / "trace-arrow.parquet"
    pq.write_table(pa.table(arrays), path)
    (tmp_path / "meta-arrow.yaml").write_text(yaml.safe_dump(job.meta.to_dict()))
    return path


def test_bad_values_in_a_plain_parquet_file_get_the_dataframe_messages(
    job: Trace, tmp_path: Path
) -> None:
    ops = job.ops
    start = ops["start_ts"].copy()
    start[4] = np.nan
    path = _write_arrow(tmp_path, job, {"start_ts": start})
    with pytest.raises(
        TraceError, match=r"column 'start_ts' has 1 value\(s\) that are not finite numbers: row 4"
    ):
        load_trace(path)
    duration = ops["duration"].copy()
    duration[7] = -0.5
    path = _write_arrow(tmp_path, job, {"duration": duration})
    with pytest.raises(TraceError, match=r"1 row\(s\) have a negative duration: row 7 step="):
        load_trace(path)
    stage = ops["stage"].copy()
    stage[[2, 9]] = 5
    path = _write_arrow(tmp_path, job, {"stage": stage})
    with pytest.raises(
        TraceError, match=r"2 row\(s\) have stage outside 0\.\.1 \(pp_size=2\): row 2 step="
    ):
        load_trace(path)
    # And a table checked against another layout gets the message a DataFrame gets.
    with pytest.raises(TraceError) as from_table:
        make_trace(ops, JobMeta(dp_size=1, pp_size=2))
    with pytest.raises(TraceError) as from_frame:
        make_trace(ops.to_frame(), JobMeta(dp_size=1, pp_size=2))
    assert str(from_table.value) == str(from_frame.value)


def test_an_op_type_code_of_no_type_is_a_trace_error_naming_the_row(job: Trace) -> None:
    columns = {c: job.ops[c].copy() for c in job.ops.columns}
    columns["optype"][1] = len(optypes.ALL) + 3
    with pytest.raises(TraceError, match=r"op type code 18") as raised:
        make_trace(OpsTable(columns), job.meta)
    assert "row 1" in str(raised.value)
