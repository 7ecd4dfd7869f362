"""The dependency rule of docs/architecture.md §2, enforced by import-linter."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    linter = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(linter).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [linter, "--no-cache"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    # Every contract of pyproject.toml was checked, not silently skipped.
    assert "Contracts: 6 kept" in result.stdout


def test_a_broken_contract_fails(tmp_path: Path) -> None:
    """The same linter on a copy of the config that forbids something we do import must fail."""
    linter = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(linter).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    config = tmp_path / ".importlinter"
    config.write_text(
        "[importlinter]\nroot_packages =\n    minder\n    detectors\n"
        "[importlinter:contract:bad]\nname = detectors may not import minder.core\n"
        "type = forbidden\nsource_modules =\n    detectors\nforbidden_modules =\n    minder.core\n"
    )
    result = subprocess.run(
        [linter, "--no-cache", "--config", str(config)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
