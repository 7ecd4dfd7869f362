"""False fails and false passes of the collective self-check (``collective.allreduce``) with real
gloo ranks on this host (issue 24; docs/selfcheck-collective.md).

Run: ``python bench/selfcheck_collective.py [--healthy 50] [--slowed 10] [--worlds 4,5,6,7,8]
[--factor 3] [--mode work|sleep] [--round-s S] [--format table|json] [--probe-groups]``.

Each run starts one launcher that forks the world's ranks on 127.0.0.1 (the test harness
``tests/collectors/selfcheck/collective_ranks.py``), every rank calling ``run_collective_check``
with the launcher contract's variables; the world size cycles through ``--worlds`` and the
suspect's rank through the world. Healthy runs slow nobody; slowed runs slow the suspect
``--factor`` times (``work``: its matmul runs that many times per iteration). It reports:

* false fails: healthy runs whose suspect got ``fail``;
* false passes: slowed runs whose suspect did not get ``fail``;
* errors (any run whose suspect got ``error``), and the time per run;
* the suspect's smaller ratio over its two rounds (the figure the 2x rule decides on): the
  highest in healthy runs, the lowest in slowed runs (the margins left on each side of the
  rule), and the highest ratio of any single round in healthy runs.

It exits 1 when there is any false fail, false pass or error.

``--probe-groups`` instead times a plain gloo all-reduce of 1 MiB (200 times, each after a
barrier) in worlds of 2, 3 and 4 ranks on this host: why the check never compares a group of
three with pairs (docs/selfcheck-collective.md, "Why these choices").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests" / "collectors" / "selfcheck"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from collective_ranks import free_port, run_ranks  # noqa: E402


def _suspect_ratios(measurements: dict[str, Any]) -> list[float]:
    """The suspect's ratio in each of its rounds (the smaller one is compared with 2: above
    the threshold in every round means fail)."""
    return [v for k, v in measurements.items() if k.startswith("suspect.") and k.endswith(".ratio")]


def _run(kind: str, index: int, world: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    suspect = index % world
    options = {"round_s": args.round_s} if args.round_s is not None else {}
    run = run_ranks(
        world,
        work / f"{kind}{index}",
        suspect=suspect,
        slow=suspect if kind == "slowed" else None,
        factor=args.factor,
        mode=args.mode,
        timeout_s=args.timeout,
        options=options,
    )
    result = run.results.get(suspect, {})
    ratios = _suspect_ratios(result.get("measurements", {}))
    return {
        "kind": kind,
        "world": world,
        "suspect": suspect,
        "status": result.get("status", "missing"),
        "summary": result.get("summary", run.log[-300:]),
        "ratio": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        "check_s": result.get("duration_s"),
        "run_s": run.wall_s,
    }


def _probe_rank(world: int, rank: int, port: int, sizes: list[int], out: Path) -> None:
    import torch  # noqa: PLC0415 (the probe alone needs torch in this process)
    import torch.distributed as dist  # noqa: PLC0415

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    medians = []
    for size in sizes:
        buffer = torch.zeros(size // 4)
        for _ in range(5):
            dist.all_reduce(buffer)
        times = []
        for _ in range(200):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buffer)
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(medians))


def probe_groups(sizes: list[int]) -> dict[int, list[float]]:
    """Median gloo all-reduce time per world size (2, 3, 4 ranks) and buffer size."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch  # noqa: F401, PLC0415 (imported once, before the forks)

    found: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (2, 3, 4):
            port, out = free_port(), Path(tmp) / f"{world}.json"
            pids = []
            for rank in range(world):
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        _probe_rank(world, rank, port, sizes, out)
                        code = 0
                    finally:
                        os._exit(code)
                pids.append(pid)
            for pid in pids:
                os.waitpid(pid, 0)
            found[world] = json.loads(out.read_text())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthy", type=int, default=50)
    parser.add_argument("--slowed", type=int, default=10)
    parser.add_argument("--worlds", default="4,5,6,7,8")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--mode", choices=("work", "sleep"), default="work")
    parser.add_argument("--round-s", type=float, default=None, help="default: the product's")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--probe-groups", action="store_true")
    args = parser.parse_args(argv)
    if args.probe_groups:
        sizes = [16 << 10, 256 << 10, 1 << 20, 4 << 20]
        for world, medians in probe_groups(sizes).items():
            shown = ", ".join(
                f"{size >> 10} KiB {m * 1e3:.2f} ms" for size, m in zip(sizes, medians, strict=True)
            )
            print(f"{world} ranks: {shown}")
        return 0
    worlds = [int(w) for w in args.worlds.split(",")]

    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="selfcheck-collective-") as tmp:
        plan = [("healthy", i) for i in range(args.healthy)] + [
            ("slowed", i) for i in range(args.slowed)
        ]
        for kind, i in plan:
            world = worlds[i % len(worlds)]
            runs.append(_run(kind, i, world, args, Path(tmp)))
            if args.format == "table":
                r = runs[-1]
                ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
                print(
                    f"{kind:7} {i:3d} world {world} suspect {r['suspect']}: {r['status']:5} "
                    f"ratio {ratio} ({r['run_s']:.1f} s)",
                    flush=True,
                )
    healthy = [r for r in runs if r["kind"] == "healthy"]
    slowed = [r for r in runs if r["kind"] == "slowed"]
    errors = [r for r in runs if r["status"] not in ("pass", "fail")]
    false_fails = [r for r in healthy if r["status"] == "fail"]
    false_passes = [r for r in slowed if r["status"] == "pass"]
    run_s = sorted(r["run_s"] for r in runs)
    check_s = sorted(r["check_s"] for r in runs if r["check_s"] is not None)
    healthy_ratios = [r["ratio"] for r in healthy if r["ratio"] is not None]
    healthy_any = [r["ratio_max"] for r in healthy if r["ratio_max"] is not None]
    slowed_ratios = [r["ratio"] for r in slowed if r["ratio"] is not None]
    summary = {
        "healthy_runs": len(healthy),
        "false_fails": len(false_fails),
        "slowed_runs": len(slowed),
        "false_passes": len(false_passes),
        "errors": len(errors),
        "worlds": worlds,
        "factor": args.factor,
        "mode": args.mode,
        "run_s_median": statistics.median(run_s) if run_s else None,
        "run_s_max": max(run_s) if run_s else None,
        "check_s_median": statistics.median(check_s) if check_s else None,
        "healthy_suspect_ratio_max": max(healthy_ratios) if healthy_ratios else None,
        "healthy_suspect_any_round_ratio_max": max(healthy_any) if healthy_any else None,
        "healthy_suspect_ratio_median": statistics.median(healthy_ratios)
        if healthy_ratios
        else None,
        "slowed_suspect_ratio_min": min(slowed_ratios) if slowed_ratios else None,
        "slowed_suspect_ratio_median": statistics.median(slowed_ratios) if slowed_ratios else None,
        "total_s": time.monotonic() - started,
        "bad_runs": false_fails + false_passes + errors,
    }
    if args.format == "json":
        print(json.dumps({"summary": summary, "runs": runs}, indent=2))
    else:
        for key, value in summary.items():
            if key != "bad_runs":
                print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
        for r in summary["bad_runs"]:
            print(f"BAD {r['kind']} world {r['world']}: {r['status']}: {r['summary']}")
    return 1 if summary["bad_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
