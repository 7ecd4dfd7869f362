"""The fault suite's figures (tests/faults) for one code tree or two: stall seconds, RSS growth,
alert delay, series counts, each case's outcome.

Usage::

    python bench/faults_figures.py --baseline-root /tmp/wt-pre13      # that tree, then this one
    python bench/faults_figures.py -k poison --out /tmp/figures.json

For each tree (``--baseline-root`` first when given, then ``--code-root``, by default the tree
this file is in), the suite of *this* tree runs with that tree first on ``PYTHONPATH`` (checked:
the script stops if ``minder`` is imported from elsewhere) and ``MINDER_FAULT_FIGURES`` set, so
each case writes what it measured; a case that fails records what it measured up to its failing
assertion, and a case that cannot even import the older tree is reported as failed with no
figures. Prints a Markdown table (case, figure, baseline, this tree) and the outcomes; ``--out``
also writes them as JSON. The machine is shared: compare figures of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
DEFAULT_ROOT = HERE.parents[1]


def _imported_from(root: Path, env: dict[str, str], cwd: str) -> Path:
    probe = "import minder, pathlib; print(pathlib.Path(minder.__file__).resolve().parents[1])"
    found = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return Path(found.stdout.strip())


def measure(root: Path, selection: str | None, timeout_s: float) -> dict[str, Any]:
    """Run the fault suite against ``root``; its figures and each case's outcome."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # Run from a scratch directory: Python puts the working directory first on sys.path, which
    # would import this tree's minder whatever PYTHONPATH says.
    with tempfile.TemporaryDirectory(prefix="minder-faults-") as scratch:
        imported = _imported_from(root, env, scratch)
        if imported != root.resolve():
            raise SystemExit(f"minder is imported from {imported}, not {root}: check PYTHONPATH")
        figures_path = Path(scratch) / "figures.jsonl"
        report = Path(scratch) / "report.xml"
        env["MINDER_FAULT_FIGURES"] = str(figures_path)
        command = [sys.executable, "-m", "pytest", str(DEFAULT_ROOT / "tests" / "faults")]
        command += ["--rootdir", str(DEFAULT_ROOT), "-c", str(DEFAULT_ROOT / "pyproject.toml")]
        command += ["-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        command += ["-o", f"timeout={int(timeout_s)}"]
        if selection:
            command += ["-k", selection]
        subprocess.run(command, cwd=scratch, env=env, capture_output=True, check=False)
        figures = (
            [json.loads(line) for line in figures_path.read_text().splitlines()]
            if (figures_path.exists())
            else []
        )
        outcomes: dict[str, str] = {}
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
                failed = case.find("failure") is not None or case.find("error") is not None
                skipped = case.find("skipped") is not None
                outcomes[name] = "failed" if failed else "skipped" if skipped else "passed"
    for figure in figures:
        figure["test"] = figure["test"].rsplit("/", 1)[-1].replace(".py::", "::")
    return {"root": str(root), "figures": figures, "outcomes": outcomes}


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "none (timed out)"
    if unit == "bool":
        return "yes" if value else "no"
    return f"{value:.1f} {unit}" if isinstance(value, float) else f"{value} {unit}"


def table(runs: list[dict[str, Any]]) -> str:
    keys: dict[tuple[str, str], None] = {}
    for run in runs:
        for figure in run["figures"]:
            keys.setdefault((figure["test"], figure["figure"]), None)
    header = ["case", "figure", *(Path(run["root"]).name for run in runs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for test, name in keys:
        cells = [test.split("::")[-1], name]
        for run in runs:
            found = [f for f in run["figures"] if (f["test"], f["figure"]) == (test, name)]
            cells.append(_value(found[-1]["value"], found[-1]["unit"]) if found else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| case | " + " | ".join(Path(r["root"]).name for r in runs) + " |"]
    lines.append("|" + "---|" * (len(runs) + 1))
    cases = sorted({case for run in runs for case in run["outcomes"]})
    for case in cases:
        row = [run["outcomes"].get(case, "not run") for run in runs]
        lines.append(f"| {case.split('::')[-1]} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-root", type=Path, help="an older tree, measured first")
    parser.add_argument("--code-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("-k", dest="selection", help="pytest -k expression: some cases only")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per case")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    roots = [r for r in (args.baseline_root, args.code_root) if r is not None]
    runs = [measure(root.resolve(), args.selection, args.timeout_s) for root in roots]
    if args.out is not None:
        args.out.write_text(json.dumps(runs, indent=2))
    print(table(runs))


if __name__ == "__main__":
    main()
