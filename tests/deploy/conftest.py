"""Shared fixtures of the deployment tests: the repository and the external validators.

The validators (promtool, docker-compose, systemd-analyze, kubectl, kubernetes-validate,
hadolint) are installed by ``.ci/install-deploy-tools.sh``; a test whose tool is missing skips
and says which tool and how to get it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run .ci/install-deploy-tools.sh .venv (CI does)"


def find_tool(name: str) -> str | None:
    """``name`` beside this interpreter (the venv's bin, active or not), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tool() -> Callable[[str], str]:
    """Returns the path of an external tool, or skips the test naming what to install."""

    def get(name: str) -> str:
        path = find_tool(name)
        if path is None:
            pytest.skip(f"{name} is not installed: {INSTALL_HINT}")
        return path

    return get


def run_command(
    args: Sequence[str | Path], *, cwd: Path | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a validator, capturing its output (shown by the assertions that use it)."""
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


@pytest.fixture(scope="session")
def run() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_command


def describe(result: subprocess.CompletedProcess[str]) -> str:
    """A failure message: the command, its exit status and everything it printed."""
    return (
        f"$ {' '.join(result.args)}\nexit status {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


@pytest.fixture(scope="session")
def explain() -> Callable[[subprocess.CompletedProcess[str]], str]:
    return describe
