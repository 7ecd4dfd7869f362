"""``bench/gc_freeze.py`` stays runnable and measures what it says: each way in its own process,
the frozen one with its heap frozen, the collections of each counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gc_freeze.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def test_a_small_run_measures_both_ways() -> None:
    args = ["--jobs", "2", "--machines", "8", "--seconds", "10", "--warm-s", "4", "--rounds", "1"]
    done = _run(args, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    *children, summary = (json.loads(line) for line in done.stdout.splitlines())
    ways = {child["way"]: child for child in children}
    assert set(ways) == {"frozen", "thawed"} and len(children) == 2
    assert ways["frozen"]["frozen_objects"] > 10_000  # the imports and the service, at least
    assert ways["thawed"]["frozen_objects"] == 0
    assert all(child["seconds"] == 6 and child["cpu_s"] > 0 for child in children)
    assert all(len(child["collections"]) == 3 for child in children)
    assert summary["rounds"] == 1 and summary["vs_thawed"]["frozen"] > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--seconds", "8"], "--seconds 8: expected more than --warm-s (8)"),
        (["--ways", "thawed,cold"], "--ways 'thawed,cold': expected a list of"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args: list[str], expected: str) -> None:
    done = _run(args, timeout=60)
    assert done.returncode == 2 and expected in done.stderr
