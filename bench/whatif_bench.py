"""What-if analysis benchmark: the published ST/SE traces and a 5-million-op synthetic job.

Run:

* ``python bench/whatif_bench.py golden [--repeat 7]``: load + full analysis of ST and SE, best
  of N, one process (the artifact takes 1.2–2.4 s per trace on one core).
* ``python bench/whatif_bench.py synth OUT.parquet [--dp 64 --pp 16 --steps 20 --mb 42]``: write
  the synthetic trace (5.09 M ops with the defaults) and its meta YAML.
* ``/usr/bin/time -v python bench/whatif_bench.py analyze OUT.parquet``: load + full analysis,
  for time and peak RSS (target: < 60 s, < 4 GB).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from whatif import analyze, load_trace, write_canonical
from whatif.synth import SynthJob, synthesize

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bytedance-straggler-wia"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def golden(repeat: int) -> None:
    for name in ("ST", "SE"):
        path = DATA / f"trace-{name}.parquet"
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
            f"median wall {sorted(wall)[len(wall) // 2] * 1e3:6.1f} ms  "
            f"replays {int(report.timings['replays'])}  verdict {report.verdict.cause}"
        )


def synth(out: Path, dp: int, pp: int, steps: int, microbatches: int) -> None:
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


def analyze_file(path: Path) -> None:
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
    a = sub.add_parser("analyze")
    a.add_argument("path", type=Path)
    args = parser.parse_args()
    if args.command == "golden":
        golden(args.repeat)
    elif args.command == "synth":
        synth(args.out, args.dp, args.pp, args.steps, args.mb)
    else:
        analyze_file(args.path)


if __name__ == "__main__":
    main()
