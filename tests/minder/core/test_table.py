from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from minder.core.errors import TableError
from minder.core.table import read_table, write_table

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
    with pytest.raises(TableError, match="unknown extension"):
        read_table(tmp_path / "t.xlsx")
    with pytest.raises(FileNotFoundError):
        read_table(tmp_path / "absent.parquet")
