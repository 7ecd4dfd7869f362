"""Peak memory of offline detection: ``minder detect`` (streamed) against the table in memory.

Run: ``python bench/detect_memory.py [--sizes 128x1800,1024x240] [--no-unsorted] [--dir DIR]
[--base TREE]``.

For each size ``MACHINESxSECONDS`` the simulator writes a canonical Parquet table of one job
with one injected fault (an uncorrectable ECC error at 60 % of the run); with ``--unsorted``
(the default) the first table is also rewritten with its rows ordered by machine, so that
``minder detect`` has to sort it through time-slice files. Each table is then detected twice,
each in its own process: ``minder detect TABLE --format json`` (read in pieces, replayed in time
order) and the in-memory baseline ``detect_table(read_table(TABLE))``. Prints, per run, the wall
time, CPU time (user + system), the process's peak RSS (``wait4``), rows per second of wall and
of CPU time and the alerts; the two runs of a table must name the same alerts. With ``--base
TREE`` (a ``git worktree`` of older code) both runs are repeated with ``PYTHONPATH=TREE`` in the
same run, and the rows per CPU-second of the two codes are compared; ``--new TREE`` measures
another tree than this one (e.g. the older code with one module changed, to isolate it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FAULT_AT = 0.6
"""Onset of the injected fault, as a fraction of the run."""


def _scenario(machines: int, seconds: int) -> dict[str, Any]:
    return {
        "seed": 17,
        "duration_s": seconds,
        "jobs": [
            {
                "name": f"bench-n{machines}",
                "machines": machines,
                "pp_stages": 8,
                "machines_per_domain": 16,
                "step_time_s": 6.0,
                "missing_rate": 0.001,
                "late_rate": 0.001,
            }
        ],
        "faults": [
            {
                "type": "ecc_error",
                "machine": machines // 3,
                "device": "gpu5",
                "start_s": round(seconds * FAULT_AT),
            }
        ],
    }


def _generate(machines: int, seconds: int, path: str) -> None:
    """Child: simulate the scenario and write its table."""
    from collectors.sim import Scenario, write_scenario_table  # noqa: PLC0415

    write_scenario_table(Scenario.model_validate(_scenario(machines, seconds)), path)


def _by_machine(source: str, path: str) -> None:
    """Child: rewrite a table with its rows ordered by machine (then file order)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = pq.read_table(source)
    machine = table.column("machine").combine_chunks()
    order = pc.sort_indices(
        pa.table({"m": machine.indices, "i": pa.array(range(len(table)))}),
        sort_keys=[("m", "ascending"), ("i", "ascending")],
    )
    pq.write_table(table.take(order), path, compression="zstd")


def _in_memory(path: str) -> None:
    """Child: the baseline, the whole table in memory."""
    from detectors.offline import detect_table  # noqa: PLC0415
    from minder.core.table import read_table  # noqa: PLC0415

    run = detect_table(read_table(path))
    print(json.dumps({"alerts": [a.summary() for a in run.alerts], "summary": run.summary()}))


def _run(args: list[str], tree: str | None = None) -> tuple[float, float, str, float]:
    """Run a child process (with ``PYTHONPATH=tree`` when given); its wall seconds, its own
    peak RSS (MB, from wait4), stdout and CPU seconds (user + system)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if tree:
        env["PYTHONPATH"] = tree
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{args} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
        cpu = usage.ru_utime + usage.ru_stime
        return wall, usage.ru_maxrss / 1024, out.read().decode(), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128x1800,1024x240", help="MACHINESxSECONDS,...")
    parser.add_argument("--no-unsorted", action="store_true", help="skip the machine-ordered copy")
    parser.add_argument("--dir", type=Path, default=None, help="where tables go (default: temp)")
    parser.add_argument("--base", default=None, help="a tree of older code to compare (PYTHONPATH)")
    parser.add_argument("--new", default=None, help="the tree to measure (default: this one)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "generate":
            _generate(int(rest[0]), int(rest[1]), rest[2])
        elif kind == "by-machine":
            _by_machine(rest[0], rest[1])
        else:
            _in_memory(rest[0])
        return
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    with tempfile.TemporaryDirectory(prefix="detect-memory-") as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        tables: list[tuple[str, Path]] = []
        for i, size in enumerate(args.sizes.split(",")):
            machines, seconds = (int(x) for x in size.split("x"))
            path = folder / f"n{machines}-s{seconds}.parquet"
            if not path.exists():
                _run([*me, "generate", str(machines), str(seconds), str(path)])
            tables.append((f"{machines} x {seconds} s", path))
            if i == 0 and not args.no_unsorted:
                unsorted = folder / f"n{machines}-s{seconds}-by-machine.parquet"
                if not unsorted.exists():
                    _run([*me, "by-machine", str(path), str(unsorted)])
                tables.append((f"{machines} x {seconds} s, rows by machine", unsorted))
        trees = [("base", args.base), ("new", args.new)] if args.base else [("new", args.new)]
        columns = ["table", "rows", "file MB", "code", "run", "wall s", "CPU s", "peak RSS MB"]
        print("| " + " | ".join([*columns, "rows/s", "rows/CPU-s", "replay", "alerts"]) + " |")
        print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|")
        for name, path in tables:
            per_cpu: dict[tuple[str, str], float] = {}
            for code, tree in trees:
                detect = [sys.executable, "-m", "minder.cli", "detect", str(path), "-f", "json"]
                streamed = _run(detect, tree)
                baseline = _run([*me, "in-memory", str(path)], tree)
                reports = [json.loads(run[2]) for run in (streamed, baseline)]
                if reports[0]["alerts"] != reports[1]["alerts"]:
                    raise SystemExit(f"{name}: the streamed and in-memory alerts differ")
                rows = reports[0]["summary"]["input"]["samples"]
                alerted = ", ".join(reports[0]["summary"]["machines_alerted"]) or "none"
                size_mb = path.stat().st_size / 1e6
                for label, (wall, rss, _, cpu), report in zip(
                    ("`minder detect` (streamed)", "in memory (`detect_table`)"),
                    (streamed, baseline),
                    reports,
                    strict=True,
                ):
                    per_cpu[(code, label)] = rows / cpu
                    modes = ", ".join(sorted(set(report["summary"]["replay"]["modes"].values())))
                    print(
                        f"| {name} | {rows / 1e6:.1f} M | {size_mb:.0f} | {code} | {label} "
                        f"| {wall:.1f} | {cpu:.1f} | {rss:,.0f} | {rows / wall / 1e6:.2f} M "
                        f"| {rows / cpu / 1e6:.2f} M | {modes} | {alerted} |"
                    )
                print(
                    f"| {name} | | | {code} | peak RSS ratio | | | "
                    f"{baseline[1] / streamed[1]:.1f}x less | | | | same alerts |"
                )
                sys.stdout.flush()
            if args.base:
                for label in ("`minder detect` (streamed)", "in memory (`detect_table`)"):
                    ratio = per_cpu[("new", label)] / per_cpu[("base", label)]
                    print(f"| {name} | | | new / base | {label} | | | | | {ratio:.2f}x | | |")


if __name__ == "__main__":
    main()
