"""The dependency rule of docs/architecture.md §2, enforced by import-linter, and no import
cycles."""

from __future__ import annotations

import graphlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _importlinter() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]
    return config


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
    assert f"Contracts: {len(_importlinter()['contracts'])} kept" in result.stdout


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


def test_nothing_imports_the_cli_covers_every_package() -> None:
    """The contract names every root package and every part of minder but the CLI, so that a
    package added later is covered too."""
    config = _importlinter()
    [contract] = [c for c in config["contracts"] if c["name"] == "nothing imports minder.cli"]
    minder = ROOT / "minder"
    parts = {
        f"minder.{p.stem if p.is_file() else p.name}"
        for p in minder.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    expected = (parts - {"minder.cli"}) | (set(config["root_packages"]) - {"minder"})
    assert set(contract["source_modules"]) == expected


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between modules, imports inside functions and under TYPE_CHECKING
    included (the acyclic_siblings contract checks packages, with its documented exceptions)."""
    grimp = pytest.importorskip("grimp")
    roots = _importlinter()["root_packages"]
    graph = grimp.build_graph(*roots, cache_dir=None)
    ours = {m for m in graph.modules if m.split(".")[0] in roots}
    sorter = graphlib.TopologicalSorter(
        {m: graph.find_modules_directly_imported_by(m) & ours - {m} for m in ours}
    )
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")
