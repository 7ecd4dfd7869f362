"""``bench/poll_isolation.py`` stays runnable and measures what it says: every batch handed over
alone, then as many in one call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_reports_both_costs() -> None:
    args = ["--machines", "8", "--records", "20", "--warm-s", "4"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "poll_isolation.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["machines"] == 8 and result["records"] == 20
    assert result["one_at_a_time_cpu_s"] > 0 and result["one_call_cpu_s"] > 0
    # per batch from the unrounded time: within the 0.5 ms rounding of the total, spread over 20
    per_batch = 1e6 * result["one_at_a_time_cpu_s"] / 20
    assert abs(result["us_per_batch_alone"] - per_batch) <= 1e6 * 0.0005 / 20 + 0.1
