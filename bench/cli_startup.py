"""Start-up of ``minder`` commands: wall and CPU seconds per command, against a baseline checkout.

Runs each command line ``--runs`` times through the ``minder`` console script of this
interpreter's environment (``python -m minder.cli`` where there is none), interleaved with the
same command under ``PYTHONPATH=<--baseline>`` (an older checkout, e.g. ``git worktree add
/tmp/wt-base <commit>``), and prints the median wall and CPU (user + system) seconds of each and
their ratio. ``--importtime`` also prints, per command, the libraries that took longest to import
(``python -X importtime``, summed self time per top-level package).

Example::

    python bench/cli_startup.py --baseline /tmp/wt-base --runs 10 --importtime \\
        --trace ../shared/data/bytedance-straggler-wia/trace-ST.parquet
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HELP_COMMANDS = [
    ["--help"],
    ["whatif", "analyze", "--help"],
    ["detect", "--help"],
    ["serve", "--help"],
    ["agent", "--help"],
    ["bench", "detect", "--help"],
]


def _entry() -> list[str]:
    script = Path(sys.executable).parent / "minder"
    return [str(script)] if script.exists() else [sys.executable, "-m", "minder.cli"]


# Run from a neutral directory: ``python -c``/``-m`` put the working directory first on sys.path,
# ahead of PYTHONPATH, so run from a checkout they would import that checkout's minder.
NEUTRAL = Path(tempfile.gettempdir())


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def _once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and exit status of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(
        argv,
        env=env,
        cwd=NEUTRAL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def _where(env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-c", "import minder; print(minder.__file__)"],
        env=env,
        cwd=NEUTRAL,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _import_top(args: list[str], env: dict[str, str], top: int) -> tuple[float, list[str]]:
    """Summed self import time (s) and the ``top`` packages by it."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "minder.cli", *args],
        env=env,
        cwd=NEUTRAL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    per: Counter[str] = Counter()
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if found:
            per[found.group(2).split(".")[0]] += int(found.group(1))
    total = sum(per.values()) / 1e6
    return total, [f"{name} {us / 1e3:.0f} ms" for name, us in per.most_common(top)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="checkout to compare with (PYTHONPATH)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--trace", help="a canonical trace: also time `whatif analyze TRACE`")
    parser.add_argument("--importtime", action="store_true", help="print the slowest imports")
    parser.add_argument("--top", type=int, default=8)
    options = parser.parse_args()

    commands = [list(c) for c in HELP_COMMANDS]
    commands.append(["alerts", "list", "--api", "http://127.0.0.1:1"])  # fails fast: no API
    if options.trace:
        trace = str(Path(options.trace).resolve())
        commands.append(["whatif", "analyze", trace, "-f", "json", "--no-progress"])
    variants = {"current": _env(None)}
    if options.baseline:
        variants["baseline"] = _env(str(Path(options.baseline).resolve()))
    for name, env in variants.items():
        print(f"{name}: minder from {_where(env)}")
    entry = _entry()
    print(f"entry point: {' '.join(entry)}; {options.runs} runs each, interleaved\n")

    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for command in commands:  # one warm-up run of each
        for env in variants.values():
            _once([*entry, *command], env)
    for _ in range(options.runs):
        for command in commands:
            for name, env in variants.items():
                wall, cpu, code = _once([*entry, *command], env)
                results.setdefault((" ".join(command), name), []).append((wall, cpu))
                if code not in (0, 2):
                    print(f"warning: {name} {' '.join(command)} exited {code}")

    # What any command costs before it does anything: the interpreter (with this environment's
    # site-packages), and typer's rich help, which every --help renders.
    references = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import typer.rich_utils'": [sys.executable, "-c", "import typer.rich_utils"],
    }
    for label, argv in references.items():
        runs = [_once(argv, variants["current"])[:2] for _ in range(options.runs)]
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"reference: {label}: wall {wall:.3f} s, cpu {cpu:.3f} s")

    header = f"{'command':<46} {'wall s':>7} {'cpu s':>7}"
    if options.baseline:
        header += f" {'base wall':>9} {'base cpu':>9} {'wall x':>7} {'cpu x':>6}"
    print(header)
    for command in commands:
        label = " ".join(command)
        wall = statistics.median(w for w, _ in results[(label, "current")])
        cpu = statistics.median(c for _, c in results[(label, "current")])
        shown = label if len(label) <= 46 else label[:20] + "…" + label[-25:]
        row = f"{shown:<46} {wall:7.3f} {cpu:7.3f}"
        if options.baseline:
            b_wall = statistics.median(w for w, _ in results[(label, "baseline")])
            b_cpu = statistics.median(c for _, c in results[(label, "baseline")])
            row += f" {b_wall:9.3f} {b_cpu:9.3f} {b_wall / wall:7.2f} {b_cpu / cpu:6.2f}"
        print(row)

    if options.importtime:
        print("\nself import time, summed per top-level package (-X importtime):")
        for command in commands:
            for name, env in variants.items():
                total, top = _import_top(command, env, options.top)
                print(f"{name:>8} {' '.join(command)[:60]}: {total:.2f} s: {', '.join(top)}")


if __name__ == "__main__":
    main()
