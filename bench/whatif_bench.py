"""What-if benchmark: the published ST/SE traces, an AR-like trace and large synthetic jobs.

Run:

* ``python bench/whatif_bench.py golden [--repeat 7]``: load + full analysis of ST, SE and AR,
  best of N, one process (the artifact takes 1.2–2.4 s per trace on one core).
* ``python bench/whatif_bench.py synth OUT.parquet [--dp 64 --pp 16 --steps 20 --mb 42]``: write
  the synthetic trace (5.07 M ops with the defaults) and its meta YAML.
* ``python bench/whatif_bench.py ar OUT.parquet``: write the AR trace (below).
* ``/usr/bin/time -v python bench/whatif_bench.py analyze OUT.parquet``: load + full analysis,
  for time and peak RSS (target: a 20 M-op trace in < 30 s and < 3 GB).
* ``python bench/whatif_bench.py scale DIR [--sizes 1,5,20] [--base TREE]``: synthetic traces of
  DP64 x PP16 x 42 microbatches with 4 steps per million ops, each analysed in a child process:
  load, model build and analysis (wall and CPU seconds), peak RSS over the RSS after imports
  (bytes per op), and the growth exponent of build time and peak memory from a log-log fit.
  With ``--base TREE`` (a ``git worktree`` of older code) each size is also run with
  ``PYTHONPATH=TREE``, in the same run.
* ``python bench/whatif_bench.py commands DIR [--repeat 5] [--base TREE]``: the wall and CPU
  seconds of whole ``python -m minder.cli whatif analyze TRACE -f json`` commands on ST, SE and
  AR (process start and imports included), alternating with ``--base``, and the in-process part.

AR: the artifact's third sample (one slow worker) is not among the shared data, so ``ar``
generates its like with :mod:`whatif.synth`: DP4 x PP4 (TP4 in the meta, world size 64), 32
microbatches, 44 steps, compute of the worker (stage 0, DP rank 0) 2.5x slower — the layout
and cause ``docs/whatif-method.md`` §1.2 lists for AR (about 100 k ops).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bytedance-straggler-wia"
ME = Path(__file__).resolve()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def ar_trace() -> Any:
    """The AR-like trace: one slow worker (stage 0, DP rank 0) in DP4 x PP4 x TP4."""
    from whatif import JobMeta  # noqa: PLC0415
    from whatif.synth import SynthJob, synthesize  # noqa: PLC0415

    job = SynthJob(
        dp=4, pp=4, microbatches=32, steps=44, slow_workers={(0, 0): 2.5}, seed=44, name="AR"
    )
    trace = synthesize(job)
    meta = JobMeta(dp_size=4, pp_size=4, tp_size=4, name="AR")
    return replace(trace, meta=meta, source="synthetic:AR")


def golden(repeat: int) -> None:
    from whatif import analyze, load_trace, write_canonical  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: DATA / f"trace-{name}.parquet" for name in ("ST", "SE")}
        paths["AR"] = write_canonical(ar_trace(), Path(tmp) / "trace-AR.parquet")[0]
        for name, path in paths.items():
            if not path.exists():
                print(f"{name}: {path} absent, skipped")
                continue
            analyze(load_trace(path))  # warm imports and caches
            wall, cpu = [], []
            for _ in range(repeat):
                w0, c0 = time.perf_counter(), time.process_time()
                report = analyze(load_trace(path))
                wall.append(time.perf_counter() - w0)
                cpu.append(time.process_time() - c0)
            print(
                f"{name}: {report.n_ops:>7,} ops  S={report.slowdown:.6f}  "
                f"best wall {min(wall) * 1e3:6.1f} ms  best cpu {min(cpu) * 1e3:6.1f} ms  "
                f"median wall {statistics.median(wall) * 1e3:6.1f} ms  "
                f"replays {int(report.timings['replays'])}  verdict {report.verdict.cause}"
            )


def synth(out: Path, dp: int, pp: int, steps: int, microbatches: int) -> None:
    from whatif import write_canonical  # noqa: PLC0415
    from whatif.synth import SynthJob, synthesize  # noqa: PLC0415

    t0 = time.perf_counter()
    job = SynthJob(
        dp=dp,
        pp=pp,
        steps=steps,
        microbatches=microbatches,
        stage_factor={pp - 1: 1.3},
        seq_cv=0.1,
        name=f"synth-dp{dp}-pp{pp}",
    )
    trace = synthesize(job)
    t1 = time.perf_counter()
    parquet, meta = write_canonical(trace, out)
    print(
        f"{len(trace.ops):,} ops generated in {t1 - t0:.1f} s, written to {parquet} and {meta} "
        f"in {time.perf_counter() - t1:.1f} s (peak RSS {_peak_rss_mb():.0f} MB)"
    )


def write_ar(out: Path) -> None:
    from whatif import write_canonical  # noqa: PLC0415

    trace = ar_trace()
    parquet, meta = write_canonical(trace, out)
    print(f"{len(trace.ops):,} ops written to {parquet} and {meta}")


def analyze_file(path: Path) -> None:
    from whatif import analyze, load_trace  # noqa: PLC0415

    t0 = time.perf_counter()
    trace = load_trace(path)
    t1 = time.perf_counter()
    last = [0.0]

    def progress(phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] > 5 or done == total:
            last[0] = now
            print(f"  {phase}: {done}/{total} replays, {now - t1:.1f} s", file=sys.stderr)

    report = analyze(trace, progress=progress)
    t2 = time.perf_counter()
    print(
        f"{report.n_ops:,} ops: load {t1 - t0:.1f} s, analysis {t2 - t1:.1f} s, total "
        f"{t2 - t0:.1f} s; model {report.timings['model_s']:.1f} s, replays "
        f"{int(report.timings['replays'])} in {report.timings['replay_s']:.1f} s; "
        f"S={report.slowdown:.4f} verdict={report.verdict.cause}; "
        f"peak RSS {_peak_rss_mb():.0f} MB"
    )


def measure(path: Path) -> None:
    """Child of ``scale``: one JSON line of phase times and memory for ``path``."""
    import whatif  # noqa: PLC0415
    from whatif import analyze, build_model, load_trace  # noqa: PLC0415

    rss0 = _rss_mb()
    phases: dict[str, float] = {}
    w, c = time.perf_counter(), time.process_time()
    trace = load_trace(path)
    phases["load_wall"], phases["load_cpu"] = time.perf_counter() - w, time.process_time() - c
    w, c = time.perf_counter(), time.process_time()
    model = build_model(trace)
    phases["build_wall"], phases["build_cpu"] = time.perf_counter() - w, time.process_time() - c
    del model
    w, c = time.perf_counter(), time.process_time()
    report = analyze(trace)
    phases["analyze_wall"] = time.perf_counter() - w
    phases["analyze_cpu"] = time.process_time() - c
    out = {
        "package": str(Path(whatif.__file__).parent),
        "ops": report.n_ops,
        "slowdown": report.slowdown,
        "rss_after_imports_mb": rss0,
        "peak_rss_mb": _peak_rss_mb(),
        **phases,
    }
    print(json.dumps(out))


def _child(args: list[str], pythonpath: str | None) -> tuple[float, float, float, str]:
    """Run a child; its wall seconds, CPU seconds (user + sys), peak RSS (MB) and stdout.

    With ``pythonpath`` the child also runs in that tree: ``python -m`` puts its working
    directory ahead of ``PYTHONPATH``, so from this repository it would run this tree's code.
    """
    env = {**os.environ}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=env, cwd=pythonpath or None)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{args} failed: {err.read().decode()[-2000:]}")
        out.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read().decode()


def _fit(ops: list[float], values: list[float]) -> float:
    """Growth exponent k of ``values ≈ a · ops^k`` (least squares in log-log)."""
    import numpy as np  # noqa: PLC0415

    if len(ops) < 2:
        return float("nan")
    return float(np.polyfit(np.log(ops), np.log(values), 1)[0])


def scale(folder: Path, sizes: list[float], base: str | None) -> None:
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    trees = [("base", base), ("new", None)] if base else [("new", None)]
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in trees}
    for size in sizes:
        steps = max(1, round(4 * size))
        path = folder / f"trace-{steps}steps.parquet"
        if not path.exists():
            _child([sys.executable, str(ME), "synth", str(path), "--steps", str(steps)], None)
        for label, tree in trees:
            wall, _, _, out = _child([sys.executable, str(ME), "measure", str(path)], tree)
            row = json.loads(out.strip().splitlines()[-1])
            row["process_wall"] = wall
            rows[label].append(row)
            delta = (row["peak_rss_mb"] - row["rss_after_imports_mb"]) * 2**20
            print(
                f"{label:4} {row['ops']:>11,} ops  load {row['load_wall']:5.1f} s "
                f"(cpu {row['load_cpu']:5.1f})  build {row['build_wall']:5.1f} s "
                f"(cpu {row['build_cpu']:5.1f})  analysis {row['analyze_wall']:5.1f} s "
                f"(cpu {row['analyze_cpu']:5.1f})  load+analysis "
                f"{row['load_wall'] + row['analyze_wall']:5.1f} s  "
                f"peak RSS {row['peak_rss_mb']:6.0f} MB  {delta / row['ops']:5.0f} B/op  "
                f"S={row['slowdown']:.6f}  [{row['package']}]",
                flush=True,
            )
    for label, got in rows.items():
        ops = [float(r["ops"]) for r in got]
        build = [r["build_cpu"] for r in got]
        mem = [(r["peak_rss_mb"] - r["rss_after_imports_mb"]) for r in got]
        print(
            f"{label}: growth exponents (log-log fit over {len(got)} sizes): build CPU "
            f"{_fit(ops, build):.2f}, load+analysis CPU "
            f"{_fit(ops, [r['load_cpu'] + r['analyze_cpu'] for r in got]):.2f}, "
            f"peak RSS delta {_fit(ops, mem):.2f}"
        )


def commands(folder: Path, repeat: int, base: str | None) -> None:
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    ar = folder / "trace-AR.parquet"
    if not ar.exists():
        _child([sys.executable, str(ME), "ar", str(ar)], None)
    traces = {"ST": DATA / "trace-ST.parquet", "SE": DATA / "trace-SE.parquet", "AR": ar}
    trees = [("base", base), ("new", None)] if base else [("new", None)]
    for name, path in traces.items():
        if not path.exists():
            print(f"{name}: {path} absent, skipped")
            continue
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in trees}
        outputs: dict[str, dict[str, Any]] = {}
        for _ in range(repeat):
            for label, tree in trees:
                cmd = [sys.executable, "-m", "minder.cli", "whatif", "analyze", str(path)]
                wall, cpu, _, out = _child([*cmd, "-f", "json"], tree)
                runs[label].append((wall, cpu))
                outputs[label] = json.loads(out)
        for label, tree in trees:
            walls = [w for w, _ in runs[label]]
            cpus = [c for _, c in runs[label]]
            _, _, _, inproc = _child([sys.executable, str(ME), "inprocess", str(path)], tree)
            print(
                f"{name} {label:4}: command wall best {min(walls):.2f} s median "
                f"{statistics.median(walls):.2f} s, CPU best {min(cpus):.2f} s median "
                f"{statistics.median(cpus):.2f} s; in process {inproc.strip()}; "
                f"S={outputs[label]['slowdown']:.6f}",
                flush=True,
            )
        if base:
            ratio = statistics.median(w for w, _ in runs["base"]) / statistics.median(
                w for w, _ in runs["new"]
            )
            cpu_ratio = statistics.median(c for _, c in runs["base"]) / statistics.median(
                c for _, c in runs["new"]
            )
            print(f"{name}: per command {ratio:.2f}x faster (wall, median), {cpu_ratio:.2f}x (CPU)")


def inprocess(path: Path, repeat: int = 5) -> None:
    """Child of ``commands``: the in-process part (load + analysis), best of ``repeat``."""
    from whatif import analyze, load_trace  # noqa: PLC0415

    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        analyze(load_trace(path))
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    pandas = "pandas loaded" if "pandas" in sys.modules else "no pandas"
    print(f"best wall {min(wall) * 1e3:.0f} ms, best CPU {min(cpu) * 1e3:.0f} ms, {pandas}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("golden")
    g.add_argument("--repeat", type=int, default=7)
    s = sub.add_parser("synth")
    s.add_argument("out", type=Path)
    s.add_argument("--dp", type=int, default=64)
    s.add_argument("--pp", type=int, default=16)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--mb", type=int, default=42)
    sub.add_parser("ar").add_argument("out", type=Path)
    sub.add_parser("analyze").add_argument("path", type=Path)
    sub.add_parser("measure").add_argument("path", type=Path)
    sub.add_parser("inprocess").add_argument("path", type=Path)
    sc = sub.add_parser("scale")
    sc.add_argument("dir", type=Path)
    sc.add_argument("--sizes", default="1,5,20", help="millions of ops, comma-separated")
    sc.add_argument("--base", default=None, help="a tree of older code (PYTHONPATH)")
    c = sub.add_parser("commands")
    c.add_argument("dir", type=Path)
    c.add_argument("--repeat", type=int, default=5)
    c.add_argument("--base", default=None, help="a tree of older code (PYTHONPATH)")
    args = parser.parse_args()
    if args.command == "golden":
        golden(args.repeat)
    elif args.command == "synth":
        synth(args.out, args.dp, args.pp, args.steps, args.mb)
    elif args.command == "ar":
        write_ar(args.out)
    elif args.command == "measure":
        measure(args.path)
    elif args.command == "inprocess":
        inprocess(args.path)
    elif args.command == "scale":
        scale(args.dir, [float(x) for x in args.sizes.split(",")], args.base)
    elif args.command == "commands":
        commands(args.dir, args.repeat, args.base)
    else:
        analyze_file(args.path)


if __name__ == "__main__":
    main()
