"""``bench/gc_freeze.py`` stays runnable: both ways measured, as many seconds each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_measures_both_ways() -> None:
    args = ["--jobs", "2", "--machines", "8", "--seconds", "12", "--warm-s", "6"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gc_freeze.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["jobs"] == 2 and result["seconds_each_way"] == 3
    assert result["frozen_cpu_s"] > 0 and result["thawed_cpu_s"] > 0


def test_too_few_seconds_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gc_freeze.py"), "--seconds", "9"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2 and "--seconds 9: expected at least --warm-s + 2" in done.stderr
