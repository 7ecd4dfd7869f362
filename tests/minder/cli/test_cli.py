"""The ``minder`` command line, run in-process with typer's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from minder.cli import app

runner = CliRunner()

SMALL = {
    "seed": 11,
    "duration_s": 150,
    "jobs": [{"name": "t", "machines": 16, "machines_per_domain": 8, "step_time_s": 4.0}],
    "faults": [
        {"type": "pcie_downgrade", "machine": 4, "device": "gpu1", "link_width": 8, "start_s": 30},
        {"type": "machine_unreachable", "machine": 9, "start_s": 80},
    ],
}


def _scenario(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_simulate_then_detect_names_the_injected_machines(tmp_path: Path) -> None:
    table = tmp_path / "metrics.parquet"
    labels = tmp_path / "labels.csv"
    result = runner.invoke(
        app,
        ["simulate", str(_scenario(tmp_path, SMALL)), "-o", str(table), "--labels", str(labels)],
    )
    assert result.exit_code == 0, result.output
    assert table.exists() and labels.read_text().startswith("job,machine,start_ts,end_ts,fault")

    result = runner.invoke(app, ["detect", str(table), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    named = {(a["machine"], a["kind"]) for a in report["alerts"]}
    assert named == {("t-n0004", "rule"), ("t-n0009", "silence")}
    for alert in report["alerts"]:
        assert set(alert) >= {
            "job",
            "machine",
            "devices",
            "kind",
            "metric",
            "score",
            "first_ts",
            "detected_ts",
        }
    assert report["summary"]["jobs"]["t"]["machines"] == 16

    table_view = runner.invoke(app, ["detect", str(table)])
    assert table_view.exit_code == 0 and "t-n0004" in table_view.stdout


def test_unknown_fault_type_names_the_allowed_ones(tmp_path: Path) -> None:
    bad = {**SMALL, "faults": [{"type": "gremlins", "machine": 1, "start_s": 3}]}
    result = runner.invoke(app, ["simulate", str(_scenario(tmp_path, bad)), "-o", "x.parquet"])
    assert result.exit_code == 2
    assert "gremlins" in result.output and "pcie_downgrade" in result.output


def test_detect_refuses_a_bad_table_naming_column_and_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(
        "ts,job,machine,metric,value\n1,j,n,cpu_util_ratio,0.2\n2,j,n,cpu_util_ratio,x\n"
    )
    result = runner.invoke(app, ["detect", str(path)])
    assert result.exit_code == 2
    assert "column 'value', row 1" in result.output


def test_simulate_needs_an_output(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "demo"])
    assert result.exit_code == 2 and "nothing to do" in result.output


@pytest.mark.slow
@pytest.mark.kafka
def test_demo_names_the_injected_machine_and_no_other(tmp_path: Path) -> None:
    short = {
        "seed": 3,
        "duration_s": 40,
        "jobs": [{"name": "demo", "machines": 16, "machines_per_domain": 8, "step_time_s": 3.0}],
        "faults": [{"type": "gpu_xid", "machine": 6, "device": "gpu5", "start_s": 8}],
    }
    result = runner.invoke(
        app, ["demo", "--scenario", str(_scenario(tmp_path, short)), "--duration", "25", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    verdict = summary["result"]
    assert verdict["injected_named"] == ["demo-n0006"]
    assert verdict["alerts_on_healthy_machines"] == []
    assert verdict["onset_to_alert_s"]["demo-n0006"] < 60
    assert summary["api_url"].startswith("http://127.0.0.1:")
    assert summary["alerts"][0]["devices"] == ["gpu5"]
