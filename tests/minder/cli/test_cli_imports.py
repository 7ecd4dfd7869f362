"""Each command imports only what it uses: the root and unrelated commands stay light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "torch",
    "minder.benchmark",
    "collectors.agent",
    "collectors.sim",
    "detectors.engine",
    "minder.service",
    "sklearn",
    "pyod",
    "whatif",
    "pandas",
)

PROBE = """
import json, sys
from typer.testing import CliRunner
from minder.cli import app
result = CliRunner().invoke(app, {args!r})
print(json.dumps({{"code": result.exit_code,
                  "modules": sorted(m for m in sys.modules if m.split(".")[0] in
                                    {{"torch", "minder", "collectors", "detectors", "sklearn",
                                     "pyod", "whatif", "fastapi", "sqlalchemy", "pandas"}})}}))
"""


def _modules(args: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["code"] == 0
    return set(report["modules"])


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(HEAVY))


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["whatif", "analyze", "--help"],
        ["alerts", "list", "--help"],
        ["breaker", "status", "--help"],
        ["dashboards", "push", "--help"],
        ["serve", "--help"],
    ],
)
def test_help_imports_no_engine_benchmark_agent_or_torch(args: list[str]) -> None:
    assert _heavy(_modules(args)) == []


def test_the_timeline_replays_are_the_ones_whatif_exports() -> None:
    from minder.cli.whatif import Replay
    from whatif.timeline import KINDS

    assert tuple(r.value for r in Replay) == KINDS


def test_the_operator_commands_need_no_database_or_web_framework() -> None:
    modules = _modules(["alerts", "list", "--help"])
    assert not [m for m in modules if m.startswith(("sqlalchemy", "fastapi", "minder.storage"))]
