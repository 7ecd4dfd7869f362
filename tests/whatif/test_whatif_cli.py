"""``minder whatif``: analyze (table, json, html), timeline export, convert, errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import typer
from conftest import WIA, need
from typer.testing import CliRunner
from whatif_kineto_writer import write_kineto

from minder.cli.whatif import whatif_app
from whatif import load_trace, write_canonical
from whatif.synth import SynthJob, synthesize

app = typer.Typer()
app.add_typer(whatif_app, name="whatif")
runner = CliRunner()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = synthesize(SynthJob(dp=2, pp=4, microbatches=4, steps=3, stage_factor={3: 1.6}))
    path, _ = write_canonical(trace, tmp_path_factory.mktemp("cli") / "trace-small.parquet")
    return path


def test_analyze_table(small: Path) -> None:
    result = runner.invoke(app, ["whatif", "analyze", str(small), "-w", "pp-comm:free"])
    assert result.exit_code == 0, result.output
    assert "verdict: stage" in result.output
    assert "S by op type" in result.output and "pp-comm:free" in result.output


def test_analyze_json_matches_the_design(small: Path) -> None:
    result = runner.invoke(app, ["whatif", "analyze", str(small), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data)[:11] == [
        "slowdown",
        "waste",
        "model_error",
        "by_optype",
        "by_dp_rank",
        "by_stage",
        "by_worker",
        "mw",
        "ms",
        "verdict",
        "per_step",
    ]
    assert data["verdict"]["cause"] == "stage" and data["verdict"]["target"] == {"stage": 3}
    assert data["waste"] == pytest.approx(1 - 1 / data["slowdown"])
    assert len(data["per_step"]) == 3 and len(data["by_worker"]) == 8
    # counts are integers, not 33.0
    assert type(data["timings"]["replays"]) is int and data["timings"]["replays"] > 0
    assert type(data["ops"]) is int and all(type(s) is int for s in data["steps"])


def test_analyze_json_of_the_published_trace(tmp_path: Path) -> None:
    trace = need(WIA / "trace-ST.parquet")
    out = tmp_path / "st.json"
    result = runner.invoke(app, ["whatif", "analyze", str(trace), "-f", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["slowdown"] == pytest.approx(1.1787021836556841, rel=1e-6)


def test_an_output_path_that_looks_like_markup_is_written_and_named(
    small: Path, tmp_path: Path
) -> None:
    """``wrote PATH`` goes through rich: a path holding ``[/x]`` must not be taken for markup
    (it raised a MarkupError after the report was written)."""
    out = tmp_path / "a[/x]" / "r[/b].json"
    result = runner.invoke(app, ["whatif", "analyze", str(small), "-f", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["slowdown"] > 1
    assert "r[/b].json" in result.output


def test_analyze_html_is_self_contained(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["whatif", "analyze", str(small), "-f", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") >= 4  # heatmap, steps, op types, stages
    assert 'class="heatmap"' in page and "stage 3, dp 1: S_w" in page
    for external in ("http://", "https://", "<script src", "<link"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_analyze_table_to_file(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    result = runner.invoke(app, ["whatif", "analyze", str(small), "-o", str(out)])
    assert result.exit_code == 0
    assert "slowdown S" in out.read_text()


def test_timeline_export(small: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "tl.json.gz"
    result = runner.invoke(app, ["whatif", "timeline", str(small), "-o", str(prefix)])
    assert result.exit_code == 0, result.output
    trace = load_trace(small)
    for kind in ("actual", "ideal"):
        data = json.loads(gzip.decompress((tmp_path / f"tl-{kind}.json.gz").read_bytes()))
        spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
        assert len(spans) == len(trace.ops)
        assert data["metadata"]["replay"] == kind
        assert all(e["dur"] >= 0 for e in spans)
    actual = json.loads(gzip.decompress((tmp_path / "tl-actual.json.gz").read_bytes()))
    first = [e for e in actual["traceEvents"] if e["ph"] == "X" and e["args"]["step"] == 0]
    ops = trace.ops.take(trace.ops["step"] == 0)
    # The actual timeline is the trace (step-relative), in microseconds.
    end = max(e["ts"] + e["dur"] for e in first)
    expected = (ops["start_ts"] + ops["duration"]).max() - ops["start_ts"].min()
    assert end == pytest.approx(expected * 1e6, abs=0.01)


def test_timeline_subset_and_plain_json(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub.json"
    result = runner.invoke(
        app,
        [
            "whatif",
            "timeline",
            str(small),
            "-o",
            str(out),
            "-k",
            "original",
            "--step",
            "1",
            "--dp",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "sub-original.json").read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["step"] for e in spans} == {1}
    assert {e["pid"] % 2 for e in spans} == {0}


def test_convert_kineto(tmp_path: Path) -> None:
    job = synthesize(
        SynthJob(
            dp=2,
            pp=2,
            microbatches=2,
            steps=2,
            with_layernorm=False,
            with_embedding=False,
            with_gc=False,
        )
    )
    write_kineto(job, tmp_path / "ranks")
    meta = tmp_path / "meta.yaml"
    meta.write_text("dp_size: 2\npp_size: 2\n")
    out = tmp_path / "trace-conv.parquet"
    result = runner.invoke(
        app, ["whatif", "convert", str(tmp_path / "ranks"), "--meta", str(meta), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert len(load_trace(out).ops) == len(job.ops)
    result = runner.invoke(
        app,
        [
            "whatif",
            "analyze",
            str(tmp_path / "ranks" / "*.json.gz"),
            "--meta",
            str(meta),
            "-f",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["meta"]["pp_size"] == 2


def test_bad_input_exits_2_with_the_reason(tmp_path: Path, small: Path) -> None:
    result = runner.invoke(app, ["whatif", "analyze", str(tmp_path / "nope.parquet")])
    assert result.exit_code == 2
    assert "does not exist" in " ".join(result.output.split())
    result = runner.invoke(app, ["whatif", "analyze", str(small), "-w", "stage=9:free"])
    assert result.exit_code == 2
    assert "selects no op" in " ".join(result.output.split())


def test_large_job_timeline_defaults_to_two_steps(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import minder.cli.whatif as cli

    monkeypatch.setattr(cli, "_TIMELINE_DEFAULT_LIMIT", 10)
    out = tmp_path / "big.json"
    result = runner.invoke(app, ["whatif", "timeline", str(small), "-o", str(out), "-k", "ideal"])
    assert result.exit_code == 0, result.output
    assert "choose with --step" in " ".join(result.output.split())
    data = json.loads((tmp_path / "big-ideal.json").read_text())
    assert data["metadata"]["steps"] == [0, 1]
