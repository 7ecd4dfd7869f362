"""``bench/hang_bench.py`` stays runnable and checks what it says: a small job's synthetic dumps
are read in a child process, the three injected culprits are named and nobody else."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "hang_bench.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        check=False,
    )


def test_a_small_run_names_the_injected_culprits(tmp_path: Path) -> None:
    done = _run(
        "--ranks",
        "192",
        "--entries",
        "64",
        "--workers",
        "2",
        "--dir",
        str(tmp_path),
        "--interleave",
        "5",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["correct"] is True
    assert report["culprits"] == report["expected"]
    assert sorted(report["culprits"].values()) == ["mismatch", "no_dump", "not_joined"]
    # one rank wrote no dump; the rest are pickles with frames, kept in --dir
    dumps = sorted(tmp_path.iterdir())
    assert len(dumps) == 191 and report["dump_bytes_per_rank"] > 1000
    assert report["read_s"] > 0 and report["peak_rss_mb"] > 0
    # the unpickle floor ran twice in the same invocation, and the ratio is read against it
    assert len(report["floor_runs_s"]) == 2 and all(f > 0 for f in report["floor_runs_s"])
    # (both rounded to ms in the report: the ratio of the rounded figures is close, not equal)
    ratio = report["read_s"] / report["floor_s"]
    assert report["read_over_floor"] == pytest.approx(ratio, rel=0.1, abs=0.05)
    # CPU, the pool's workers' included: the read's per dump, and against the floor's
    assert report["read_cpu_s"] > 0 and report["floor_cpu_s"] > 0
    cpu_ratio = report["read_cpu_s"] / report["floor_cpu_s"]
    assert report["cpu_over_floor"] == pytest.approx(cpu_ratio, rel=0.1, abs=0.05)
    per_dump_ms = report["read_cpu_s"] / 191 * 1e3
    assert report["read_cpu_ms_per_dump"] == pytest.approx(per_dump_ms, rel=0.05)
    # in turns: every dump read by the reader once, in as many slices as leave each one large
    # enough for the pool (5 asked, 191 dumps: 2 of 95 and 96), the ratios of the sums
    turns = report["interleaved"]
    assert turns["turns"] == 2 and turns["smallest_slice"] == 95 and turns["summaries"] == 191
    assert turns["reader_s"] > 0 and turns["floor_s"] > 0 and turns["floor_cpu_s"] > 0
    assert turns["read_over_floor"] == pytest.approx(turns["reader_s"] / turns["floor_s"])
    assert turns["cpu_over_floor"] == pytest.approx(turns["reader_cpu_s"] / turns["floor_cpu_s"])


def test_table_output_and_bad_sizes() -> None:
    done = _run("--ranks", "64", "--entries", "16", "--workers", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "correct           yes" in done.stdout
    assert "unpickle floor" in done.stdout and "x it)" in done.stdout
    assert "ms per dump), floor" in done.stdout


def test_per_dump_ratios_cover_every_way_over_the_same_dumps(tmp_path: Path) -> None:
    done = _run(
        "--ranks", "64", "--entries", "200", "--workers", "1", "--per-dump", "30",
        "--dir", str(tmp_path), "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    per_dump = json.loads(done.stdout)["per_dump"]
    assert per_dump["dumps"] == 30
    ways = {"loads", "buffer_1_mib", "load_dump", "worker_task"}
    assert set(per_dump["over_loads"]) == set(per_dump["per_dump_ms"]) == ways
    assert per_dump["over_loads"]["loads"] == 1.0
    assert all(ms > 0 for ms in per_dump["per_dump_ms"].values())
    bad = _run("--ranks", "100")
    assert bad.returncode == 2 and "expected a multiple of 64" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instructions_per_dump_are_counted_without_start_up(tmp_path: Path) -> None:
    """Instructions per dump, counted by callgrind, less the same process's count over no
    dump: what ``--instructions`` reports, a figure the machine's load does not move."""
    done = _run("--ranks", "64", "--entries", "200", "--workers", "1", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    spec = importlib.util.spec_from_file_location("hang_bench", ROOT / "bench" / "hang_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    counted = bench.measure_instructions(tmp_path, 2, ways=("loads", "load_dump"))
    assert counted is not None
    per_dump = counted["per_dump"]
    # a 200-entry dump's unpickling: some millions of instructions, not the interpreter's
    # start-up (a few hundred millions), which is subtracted
    assert 2e5 < per_dump["loads"] < 5e7
    # the restricted unpickler, the size bound and the checks cost more than the bare loads
    assert per_dump["load_dump"] > per_dump["loads"]
    assert counted["over_loads"]["load_dump"] == pytest.approx(
        per_dump["load_dump"] / per_dump["loads"], rel=1e-3
    )
