"""``minder train`` and ``minder detect --method/--model``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from minder.cli import app

runner = CliRunner()

SCENARIO = {
    "seed": 5,
    "duration_s": 150,
    "jobs": [{"name": "t", "machines": 16, "machines_per_domain": 8, "step_time_s": 4.0}],
    "faults": [{"type": "cuda_execution_error", "machine": 6, "start_s": 40}],
}


def _simulate(tmp_path: Path) -> tuple[Path, Path]:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    table, labels = tmp_path / "m.parquet", tmp_path / "labels.csv"
    result = runner.invoke(
        app, ["simulate", str(scenario), "-o", str(table), "--labels", str(labels)]
    )
    assert result.exit_code == 0, result.output
    return table, labels


def test_train_writes_a_model_that_detect_loads(tmp_path: Path) -> None:
    table, labels = _simulate(tmp_path)
    model = tmp_path / "model"
    result = runner.invoke(
        app,
        ["train", str(table), "--labels", str(labels), "--out", str(model), "--format", "json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["priority"] and report["denoiser"] == "mean"
    assert (model / "model.json").exists()

    result = runner.invoke(app, ["detect", str(table), "--model", str(model), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert {a["machine"] for a in json.loads(result.stdout)["alerts"]} == {"t-n0006"}

    table_view = runner.invoke(
        app, ["train", str(table), "--labels", str(labels), "-o", str(model)]
    )
    assert table_view.exit_code == 0 and "priority" in table_view.stdout


def test_detect_with_a_baseline_method(tmp_path: Path) -> None:
    table, _ = _simulate(tmp_path)
    result = runner.invoke(
        app, ["detect", str(table), "--method", "mahalanobis", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    assert "alerts" in json.loads(result.stdout)


def test_bad_method_model_and_labels_are_refused(tmp_path: Path) -> None:
    table, _ = _simulate(tmp_path)
    result = runner.invoke(app, ["detect", str(table), "--method", "knn"])
    assert result.exit_code == 2 and "unknown method 'knn'" in result.output
    result = runner.invoke(app, ["detect", str(table), "--model", str(tmp_path)])
    assert result.exit_code == 2 and "detector model" in " ".join(result.output.split())
    bad = tmp_path / "bad.csv"
    bad.write_text("job,machine\nt,t-n0001\n")
    result = runner.invoke(app, ["train", str(table), "--labels", str(bad), "-o", str(tmp_path)])
    assert result.exit_code == 2 and "lack column" in " ".join(result.output.split())
    result = runner.invoke(
        app, ["train", str(table), "--labels", str(tmp_path / "none.csv"), "-o", str(tmp_path)]
    )
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())
