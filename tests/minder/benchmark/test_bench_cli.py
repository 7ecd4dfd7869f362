"""``minder bench detect`` end to end: variants, skips, tables, JSON and markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from collectors.sim import Scenario
from minder.benchmark import runner as runner_module
from minder.benchmark.report import markdown
from minder.benchmark.runner import (
    BenchOptions,
    Variant,
    command_line,
    plan_variants,
    run_benchmark,
)
from minder.benchmark.suite import BenchCase
from minder.cli.bench import bench_app, parse_limits

app = typer.Typer()
app.add_typer(bench_app, name="bench")
cli = CliRunner()


def case(name: str, machines: int, fault: dict[str, Any] | None, seconds: int = 200) -> BenchCase:
    scenario = Scenario.model_validate(
        {
            "seed": 5,
            "duration_s": seconds,
            "jobs": [{"name": name, "machines": machines, "step_time_s": 4.0}],
            "faults": [fault] if fault else [],
            "confounders": [{"type": "blip", "machine": 1, "start_s": 90}],
        }
    )
    return BenchCase(
        name,
        scenario,
        fault["type"] if fault else None,
        machines,
        seconds,
        fault is None,
        "test case",
    )


TINY = [
    case("a", 8, {"type": "machine_unreachable", "machine": 2, "start_s": 100}),
    case("b", 12, {"type": "ecc_error", "machine": 5, "device": "gpu0", "start_s": 120}),
    case("c", 8, None),
]


@pytest.fixture
def tiny_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "build_suite", lambda name, seed: list(TINY))


def test_variants_and_command_line() -> None:
    options = BenchOptions(
        suite="quick",
        methods=("minder", "ecod"),
        ablations=True,
        denoisers=("mean", "pca"),
        train=False,
    )
    labels = [v.label for v in plan_variants(options)]
    assert labels == [
        "minder",
        "ecod",
        "minder (no_denoiser)",
        "minder (no_continuity)",
        "minder (no_prioritisation)",
        "minder [pca]",  # minder [mean] is the plain minder row
    ]
    assert plan_variants(options)[-1] == Variant("minder [pca]", "minder", (), "pca")
    assert command_line(options) == (
        "minder bench detect --suite quick --methods minder,ecod --ablations "
        "--denoisers mean,pca --seed 0 --no-train"
    )
    assert parse_limits("pairwise=64, lof=128") == {"pairwise": 64, "lof": 128}
    assert parse_limits("none") == {}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"methods": ("minder", "svm")}, "unknown method.*svm"),
        ({"suite": "huge"}, "unknown suite"),
        ({"denoisers": ("wavelet",)}, "unknown denoiser.*wavelet"),
        ({"max_machines": {"knn": 5}}, "max_machines names unknown method"),
        ({"methods": ()}, "no method to run"),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        BenchOptions(**kwargs)


def test_runner_skips_big_cases_and_reports_them() -> None:
    progress: list[tuple[str, float, int]] = []
    result = run_benchmark(
        BenchOptions(suite="quick", methods=("minder",), train=False, max_machines={"minder": 8}),
        cases=TINY,
        progress=lambda *args: progress.append(args),
    )
    (row,) = result.rows
    assert row.cases_run == 2
    assert row.skipped == [{"case": "b", "machines": 12, "reason": "12 machines > 8 for minder"}]
    assert row.summary.overall.instances == 1  # the skipped case's fault is not counted
    assert row.summary.false_alarms.machine_hours == pytest.approx(8 * 200 / 3600)
    assert progress[-1][1:] == (3, 3)
    assert "skipped 1 case(s): b" in markdown(result)


def test_cli_json_output_and_markdown(tiny_suite: None, tmp_path: Path) -> None:
    out, md = tmp_path / "results.json", tmp_path / "section.md"
    args = ["bench", "detect", "--suite", "quick", "--methods", "minder", "--no-train"]
    result = cli.invoke(
        app, [*args, "--format", "json", "--output", str(out), "--markdown", str(md)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert json.loads(out.read_text()) == data
    assert data["suite"] == "quick" and data["train"] is False
    assert data["suite_summary"]["cases"] == 3 and data["suite_summary"]["fault_free_cases"] == 1
    (row,) = data["rows"]
    assert row["label"] == "minder" and row["cases_run"] == 3
    assert row["overall"]["instances"] == 2
    assert {c["case"] for c in row["cases"]} == {"a", "b", "c"}
    text = md.read_text()
    assert "minder bench detect --suite quick --methods minder --seed 0 --no-train" in text
    assert "| variant | cases | P | R | F1 |" in text
    table = cli.invoke(app, [*args, "--no-progress"])
    assert table.exit_code == 0, table.output
    assert "overall" in table.stdout and "per fault type" in table.stdout


def test_cli_refuses_bad_values(tiny_suite: None) -> None:
    bad = cli.invoke(app, ["bench", "detect", "--methods", "minder,svm"])
    assert bad.exit_code == 2 and "svm" in bad.output
    bad = cli.invoke(app, ["bench", "detect", "--max-machines-for", "lof:3"])
    assert bad.exit_code == 2 and "METHOD=MACHINES" in bad.output


@pytest.mark.slow
def test_quick_suite_end_to_end() -> None:
    args = ["bench", "detect", "--suite", "quick", "--methods", "minder", "--format", "json"]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (row,) = data["rows"]
    assert row["cases_run"] == data["suite_summary"]["cases"] == 13
    overall = row["overall"]
    for name in ("precision", "recall", "f1"):
        assert isinstance(overall[name], float) and 0.0 <= overall[name] <= 1.0
    assert overall["instances"] == 11
    assert set(row["by_fault"]) == set(data["suite_summary"]["faults"])
    assert row["false_alarms"]["machine_hours"] > 0
    assert row["cpu"]["per_job_second"] > 0
    assert row["fail_stop"]["onset_to_alert_s"]["n"] <= overall["detected"]
