"""``minder detect``: the table streamed from the file, bad input counted in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from collectors.sim import Scenario, simulate_table
from minder.cli import app
from minder.core.table import write_table

runner = CliRunner()

SCENARIO = {
    "seed": 11,
    "duration_s": 150,
    "jobs": [
        {
            "name": "t",
            "machines": 16,
            "machines_per_domain": 8,
            "step_time_s": 4.0,
            "late_rate": 0.01,
            "duplicate_rate": 0.01,
        }
    ],
    "faults": [
        {"type": "pcie_downgrade", "machine": 4, "device": "gpu1", "link_width": 8, "start_s": 30},
        {"type": "machine_unreachable", "machine": 9, "start_s": 80},
    ],
}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return simulate_table(Scenario.model_validate(SCENARIO))


def _detect(path: Path) -> dict:
    result = runner.invoke(app, ["detect", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_sorted_parquet_and_shuffled_csv_give_the_same_alerts(
    table: pd.DataFrame, tmp_path: Path
) -> None:
    ordered = _detect(write_table(table, tmp_path / "t.parquet"))
    assert {(a["machine"], a["kind"]) for a in ordered["alerts"]} == {
        ("t-n0004", "rule"),
        ("t-n0009", "silence"),
    }
    summary = ordered["summary"]
    assert summary["replay"]["modes"] == {"t": "stream"}
    assert summary["input"]["samples"] == len(table)
    assert summary["input"]["duplicates"] > 0 and summary["input"]["out_of_order"] > 0

    shuffled = table.sample(frac=1.0, random_state=0).reset_index(drop=True)
    unsorted = _detect(write_table(shuffled, tmp_path / "shuffled.csv.gz"))
    assert unsorted["alerts"] == ordered["alerts"]
    assert unsorted["summary"]["input"]["backwards"] > len(table) // 2
    assert unsorted["summary"]["input"]["duplicates"] == summary["input"]["duplicates"]


def test_table_output_has_a_line_counting_bad_input(tmp_path: Path) -> None:
    rows = [
        f"{1763700000 + s},j,n{m},cpu_util_ratio,0.5"
        for s in [*range(100), 10, 10]  # second 10 twice more: 90 s back, beyond the horizon
        for m in range(4)
    ]
    path = tmp_path / "bad.csv"
    path.write_text("ts,job,machine,metric,value\n" + "\n".join(rows) + "\n")
    result = runner.invoke(app, ["detect", str(path)])
    assert result.exit_code == 0, result.output
    line = " ".join(result.stdout.split())  # the console may wrap it
    assert "Input: 408 row(s); 8 out of time order (8 by the detector's horizon or more)" in line
    assert "8 repeated sample(s)" in line and "0 too old for the window" in line


def test_a_missing_table_is_one_line_on_stderr(tmp_path: Path) -> None:
    result = runner.invoke(app, ["detect", str(tmp_path / "absent.parquet")])
    assert result.exit_code == 2
    assert "absent.parquet" in result.output and "does not exist" in result.output


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        # a path without a table's extension that does not exist: said so, not its extension
        ("nonexistent", None, "'{path}' does not exist: expected a table file (.parquet,"),
        ("a-directory", "dir", "'{path}' is a directory: expected a table file (.parquet,"),
        (
            "corrupt.parquet",
            b"PAR1 not a parquet file at all",
            "'{path}' cannot be read as Parquet (Parquet magic bytes not found in footer",
        ),
        (
            "truncated.parquet",
            "truncated",
            "'{path}' cannot be read as Parquet (",
        ),
        (
            "corrupt.csv.gz",
            b"\x1f\x8b\x08 broken gzip stream",
            "'{path}' cannot be read as CSV (optionally gzip-compressed) (",
        ),
    ],
)
def test_an_unreadable_table_is_one_line_naming_the_file(
    table: pd.DataFrame, tmp_path: Path, name: str, content: bytes | str | None, expected: str
) -> None:
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif content == "truncated":  # a real table cut in the middle: its footer is gone
        whole = write_table(table, tmp_path / "whole.parquet").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    result = runner.invoke(app, ["detect", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: metric table "), result.output
    assert expected.format(path=path) in lines[0]
    assert "Traceback" not in result.output


def test_json_counts_are_integers(table: pd.DataFrame, tmp_path: Path) -> None:
    summary = _detect(write_table(table, tmp_path / "t.parquet"))["summary"]
    job = summary["jobs"]["t"]
    assert job["machines"] == 16 and type(job["machines"]) is int
    assert all(type(v) is int for v in job.values()), job
    assert all(type(v) is int for v in summary["input"].values()), summary["input"]
    assert type(summary["replay"]["peak_rows"]) is int


def test_a_scale_down_is_reported_as_membership_not_alerts(tmp_path: Path) -> None:
    scenario = Scenario.model_validate(
        {
            "seed": 5,
            "duration_s": 240,
            "jobs": [{"name": "s", "machines": 16, "machines_per_domain": 4, "step_time_s": 4.0}],
            "confounders": [
                {"type": "scale_down", "machines": [1, 6, 11], "start_s": 120, "goodbye": False}
            ],
        }
    )
    path = write_table(simulate_table(scenario), tmp_path / "scale-down.parquet")
    result = runner.invoke(app, ["detect", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["alerts"] == []
    [change] = data["summary"]["membership"]
    assert change["change"] == "left_together"
    assert sorted(change["machines"]) == ["s-n0001", "s-n0006", "s-n0011"]
    assert data["summary"]["jobs"]["s"]["interval_s"] == 1.0
    text = runner.invoke(app, ["detect", str(path)])
    assert "Membership (not a fault): job s left together" in text.stdout


def _mixed_fleet(tmp_path: Path) -> Path:
    """Power of 40 machines over 40 minutes at one sample a minute: a fifth of them do another
    job (undeclared), the rest are alike; the last third, all alike again."""
    rng = np.random.default_rng(2)
    rows = []
    for t in range(40):
        for m in range(40):
            other = m % 5 == 0 and t < 27
            for g in range(2):
                rows.append(
                    {
                        "ts": 1_700_000_000 + 60 * t,
                        "job": "fleet",
                        "machine": f"p{m:02d}",
                        "metric": "gpu_power_watts",
                        "device": f"gpu{g}",
                        "value": (250.0 if other else 650.0) + rng.normal(0, 8),
                    }
                )
    return write_table(pd.DataFrame(rows), tmp_path / "fleet.parquet")


def test_detect_reports_a_metric_on_which_machines_are_not_peers(tmp_path: Path) -> None:
    path = _mixed_fleet(tmp_path)
    found = _detect(path)
    assert found["alerts"] == []
    (finding,) = found["summary"]["findings"]
    assert finding["job"] == "fleet" and finding["finding"] == "not_peer_comparable"
    assert finding["metric"] == "gpu_power_watts"
    assert finding["outliers"] == 8 and 0.7 < finding["coherence"] < 0.85
    table = runner.invoke(app, ["detect", str(path)])
    assert table.exit_code == 0, table.output
    assert "machines are not alike on gpu_power_watts" in table.stdout
    assert table.stdout.count("Job finding") == 1
