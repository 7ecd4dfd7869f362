"""``minder hang analyze``: on the dumps of a real hung gloo job (tests/hang_jobs.py: rank 1
skips a world all_reduce), as a table and as JSON, its one-line errors, and that it
stays light (no torch, NumPy or pandas imported to analyse)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from typer.testing import CliRunner

from minder.cli.app import app

if TYPE_CHECKING:
    from hang_jobs import HangDumps

runner = CliRunner()


def minder(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "300"})
    return result.exit_code, result.stdout, result.stderr


def test_names_the_rank_that_skipped_the_all_reduce(real_hang_dumps: HangDumps) -> None:
    case = real_hang_dumps["skip"]
    code, stdout, stderr = minder("hang", "analyze", str(case.pickle_dir))
    assert code == 0, stderr
    assert "hung: 1 culprit, dumps from 4 of 4 ranks" in stdout
    row = next(line for line in stdout.splitlines() if "not_joined" in line)
    assert row.split("│")[1].strip() == "1"
    assert re.search(r"never enqueued gloo:all_reduce #\d+ of group 0 \(default_pg\)", row)

    code, stdout, _ = minder(
        "hang", "analyze", str(case.json_dir), "--prefix", case.prefix, "--format", "json"
    )
    assert code == 0
    data = json.loads(stdout)
    assert data["hung"] is True and data["culprit_ranks"] == [1]
    assert data["culprits"][0]["reason"] == "not_joined"
    assert data["groups"][0]["missing"] == [1] and data["groups"][0]["waiting"] == 3
    assert data["directory"] == str(case.json_dir)


def test_a_healthy_directory_says_no_hang(real_hang_dumps: HangDumps, tmp_path: Path) -> None:
    # The culprit's own dump, alone: it waits on nobody.
    case = real_hang_dumps["skip"]
    shutil.copy(case.pickle_dir / f"{case.prefix}1", tmp_path / f"{case.prefix}1")
    code, stdout, _ = minder("hang", "analyze", str(tmp_path), "--format", "json")
    assert code == 0
    data = json.loads(stdout)
    assert data["hung"] is False and data["culprits"] == []


def test_one_line_errors(real_hang_dumps: HangDumps, tmp_path: Path) -> None:
    case = real_hang_dumps["skip"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, stdout, stderr = minder("hang", "analyze", str(empty))
    assert code == 2 and stdout == ""
    assert stderr.startswith("error: ") and "empty directory" in stderr
    assert stderr.count("\n") == 1

    mixed = tmp_path / "mixed"
    shutil.copytree(case.pickle_dir, mixed)
    shutil.copy(case.json_dir / f"{case.prefix}0", mixed / f"{case.prefix}0.json")
    code, _, stderr = minder("hang", "analyze", str(mixed), "--prefix", case.prefix)
    assert code == 2 and "two files for rank 0" in stderr and stderr.count("\n") == 1

    corrupt = tmp_path / "corrupt"
    shutil.copytree(case.pickle_dir, corrupt)
    target = corrupt / f"{case.prefix}2"
    target.write_bytes(target.read_bytes()[:200])
    code, _, stderr = minder("hang", "analyze", str(corrupt))
    assert code == 2 and f"{case.prefix}2: truncated or corrupt pickle" in stderr

    code, _, stderr = minder("hang", "analyze", str(tmp_path / "absent"))
    assert code == 2 and "not a directory" in stderr


def test_analysis_is_quick_and_light(real_hang_dumps: HangDumps) -> None:
    case = real_hang_dumps["skip"]
    script = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "from minder.cli.app import app\n"
        "try:\n"
        f"    app(['hang', 'analyze', {str(case.pickle_dir)!r}, '--format', 'json'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'pandas', 'pyarrow', 'sqlalchemy')"
        " if m in sys.modules)\n"
        "print('RESULT', time.perf_counter() - t, ','.join(heavy), file=sys.stderr)\n"
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    wall = time.perf_counter() - started
    line = next(x for x in proc.stderr.splitlines() if x.startswith("RESULT"))
    _, elapsed, heavy = [*line.split(" "), ""][:3]
    assert heavy == "", f"analysing imported {heavy}"
    assert json.loads(proc.stdout)["culprit_ranks"] == [1]
    # Under 1 s on an idle machine (about 0.25 s); generous for a loaded CI runner.
    assert float(elapsed) < 3.0, f"in-process {elapsed} s, wall {wall:.2f} s"
