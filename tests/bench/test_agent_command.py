"""``bench/agent_command.py`` stays runnable: the real ``minder agent`` for a few seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.kafka
def test_the_agent_command_runs_and_reports_its_peak_memory() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "agent_command.py"),
            "--seconds",
            "3",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    [line] = done.stdout.splitlines()
    result = json.loads(line)
    assert result["tree"] == str(ROOT) and result["exit"] == 0
    assert 10 < result["peak_rss_mib"] < 1000 and result["cpu_percent_incl_startup"] > 0
