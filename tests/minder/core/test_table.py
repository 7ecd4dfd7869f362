from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from minder.core.errors import TableError
from minder.core.table import TableReader, read_table, write_table

GOOD = """ts,job,machine,metric,value,device,group,domain
1763700000.0,j1,n1,gpu_util_ratio,0.97,gpu0,pp0,leaf-1
1763700000.0,j1,n1,cpu_util_ratio,0.3,,pp0,leaf-1
1763700001.0,j1,n2,pfc_tx_pause_per_second,12,mlx5_0,pp1,leaf-2
"""


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_csv_with_optional_columns(tmp_path: Path) -> None:
    frame = read_table(_write(tmp_path, GOOD))
    assert list(frame.columns) == [
        "ts",
        "job",
        "machine",
        "metric",
        "value",
        "device",
        "group",
        "domain",
    ]
    assert frame["value"].tolist() == [0.97, 0.3, 12.0]
    assert frame["device"].tolist() == ["gpu0", "", "mlx5_0"]


def test_optional_columns_may_be_absent(tmp_path: Path) -> None:
    frame = read_table(_write(tmp_path, "ts,job,machine,metric,value\n1,j,n,cpu_util_ratio,0.5\n"))
    assert frame.loc[0, "group"] == "" and frame.loc[0, "domain"] == ""


@pytest.mark.parametrize("name", ["t.parquet", "t.csv", "t.csv.gz"])
def test_write_read_round_trip(tmp_path: Path, name: str) -> None:
    frame = read_table(_write(tmp_path, GOOD))
    back = read_table(write_table(frame, tmp_path / name))
    pd.testing.assert_frame_equal(back, frame)


def test_missing_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(TableError) as info:
        read_table(_write(tmp_path, "ts,job,machine,value\n1,j,n,0.5\n"))
    assert info.value.column == "metric" and "missing required column" in str(info.value)


def test_non_numeric_value_names_column_and_row(tmp_path: Path) -> None:
    text = GOOD + "1763700002.0,j1,n2,gpu_util_ratio,high,gpu0,pp1,leaf-2\n"
    with pytest.raises(TableError) as info:
        read_table(_write(tmp_path, text))
    assert (info.value.column, info.value.row) == ("value", 3)
    assert "'high' is not a finite number" in str(info.value)


def test_bad_timestamp_names_column_and_row(tmp_path: Path) -> None:
    text = GOOD.replace("1763700001.0", "yesterday")
    with pytest.raises(TableError) as info:
        read_table(_write(tmp_path, text))
    assert (info.value.column, info.value.row) == ("ts", 2)


def test_unknown_metric_names_row_and_expected(tmp_path: Path) -> None:
    text = GOOD + "1763700002.0,j1,n2,gpu_utilisation,0.5,gpu0,,\n"
    with pytest.raises(TableError) as info:
        read_table(_write(tmp_path, text))
    assert (info.value.column, info.value.row) == ("metric", 3)
    assert "unknown metric 'gpu_utilisation'" in str(info.value)


def test_empty_machine_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TableError) as info:
        read_table(_write(tmp_path, "ts,job,machine,metric,value\n1,j,,cpu_util_ratio,0.5\n"))
    assert (info.value.column, info.value.row) == ("machine", 0)


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "t.xlsx").write_bytes(b"PK")
    with pytest.raises(TableError, match="unknown extension"):
        read_table(tmp_path / "t.xlsx")
    # a missing file is said to be missing, whatever its extension
    for name in ("absent.parquet", "absent", "absent.xlsx"):
        with pytest.raises(FileNotFoundError, match=f"'{tmp_path / name}' does not exist"):
            read_table(tmp_path / name)
        with pytest.raises(FileNotFoundError, match="does not exist: expected a table file"):
            TableReader(tmp_path / name)


def _long_table(rows: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ts": 1763700000.0 + np.arange(rows) // 3 + np.where(np.arange(rows) % 7 == 0, 0.25, 0),
            "job": "j",
            "machine": [f"n{i % 3}" for i in range(rows)],
            "metric": "gpu_util_ratio",
            "value": np.linspace(0.0, 1.0, rows),
            "device": [f" gpu{i % 2} " for i in range(rows)],  # blanks are stripped
        }
    )


@pytest.mark.parametrize("name", ["t.parquet", "t.csv.gz"])
def test_reader_gives_the_table_in_pieces_of_at_most_chunk_rows(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name.endswith(".parquet"):
        _long_table(100).to_parquet(path, index=False, row_group_size=40)
    else:
        _long_table(100).to_csv(path, index=False)
    reader = TableReader(path, chunk_rows=15)
    pieces = list(reader.chunks())
    assert all(len(p) <= 15 for _, p in pieces) and len(pieces) >= 7
    assert [first for first, _ in pieces] == list(np.cumsum([0] + [len(p) for _, p in pieces])[:-1])
    joined = pd.concat([p for _, p in pieces], ignore_index=True)
    whole = read_table(path)
    for column in ("ts", "value"):
        np.testing.assert_array_equal(joined[column].to_numpy(), whole[column].to_numpy())
    for column in ("machine", "device", "group"):
        assert joined[column].astype(str).tolist() == whole[column].astype(str).tolist()
    assert set(whole["device"].astype(str)) == {"gpu0", "gpu1"}
    assert reader.rows == (100 if name.endswith(".parquet") else None)
    # Only the columns asked for (and the required ones) are read; the others come back empty.
    _, first = next(iter(reader.chunks(["ts"])))
    assert set(first["device"].astype(str)) == {""}


def test_reader_names_the_file_row_of_a_bad_cell_in_a_later_piece(tmp_path: Path) -> None:
    text = GOOD + "1763700002.0,j1,n2,gpu_util_ratio,0.5,gpu0,,\n" * 5
    text += "1763700003.0,j1,n2,gpu_util_ratio,high,gpu0,,\n"
    path = _write(tmp_path, text)
    with pytest.raises(TableError) as info:
        for _ in TableReader(path, chunk_rows=2).chunks():
            pass
    assert (info.value.column, info.value.row) == ("value", 8)
    with pytest.raises(TableError) as whole:
        read_table(path)
    assert whole.value.row == 8


def test_reader_refuses_a_missing_column_before_reading_and_a_bad_chunk_size(
    tmp_path: Path,
) -> None:
    frame = pd.DataFrame({"ts": [1.0], "job": ["j"], "machine": ["n"], "value": [0.5]})
    frame.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(TableError, match="missing required column") as info:
        TableReader(tmp_path / "t.parquet")
    assert info.value.column == "metric"
    with pytest.raises(TableError, match="chunk_rows is 0"):
        TableReader(_write(tmp_path, GOOD), chunk_rows=0)
    with pytest.raises(FileNotFoundError):
        TableReader(tmp_path / "absent.csv.gz")


@pytest.mark.parametrize("fraction", [0.0, 0.125])
def test_csv_keeps_timestamps_exact(tmp_path: Path, fraction: float) -> None:
    frame = read_table(_write(tmp_path, GOOD))
    frame["ts"] = frame["ts"] + fraction
    back = read_table(write_table(frame, tmp_path / "t.csv.gz"))
    np.testing.assert_array_equal(back["ts"].to_numpy(), frame["ts"].to_numpy())
    assert back["ts"].nunique() == 2


def test_a_table_this_user_cannot_open_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a damaged file: the open fails (as for a user without read permission; the tests run
    as root, which opens everything, so the open is made to fail as the OS would)."""
    path = tmp_path / "locked.csv"
    path.write_text("ts,job,machine,metric,value\n")

    def denied(*_args: object, **_kwargs: object) -> pd.DataFrame:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(pd, "read_csv", denied)
    with pytest.raises(TableError, match="cannot be opened \\(Permission denied\\)") as caught:
        read_table(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert "expected a file this user can read" in str(caught.value)
