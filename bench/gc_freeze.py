"""Does freezing the heap out of CPython's cyclic collector, or raising its thresholds, speed up
the detection path? An A/B in separate processes.

Usage::

    python bench/gc_freeze.py --jobs 8 --machines 1250 --seconds 24 --rounds 2 \\
        --ways thawed,frozen,tuned

Simulated jobs (``bench/ingest_e2e.py``'s own: 8 GPUs, 8 NICs a machine) go through the
real detection service one data second at a time: ingest, then tick, as ``minder serve`` does
after a poll. The seconds are generated as they are used. Each way runs in a process of its own,
and the ways alternate for ``--rounds`` rounds.

- ``frozen``: after ``--warm-s`` seconds, collects once and freezes everything alive
  (``gc.collect``, ``gc.freeze``), as a warm service would.
- ``tuned``: sets ``gc.set_threshold(*--threshold)``.
- ``thawed``: leaves the collector as Python starts it.

Nothing is collected by hand after that. ``gc.callbacks`` count the collections that start
inside the timed ingest and tick, per generation, with their CPU seconds.

What it found (bench/RESULTS.md, *Third session*): ingest and tick start no collection. The
collections are started where the batches are made: here the simulator, outside the timing, and
in a worker the decoder. So this bench times the detection path alone, and cannot see what
freezing saves a worker. That takes ``bench/ingest_e2e.py``, with its noise.

Prints one JSON object per child, then a summary:
- each way's CPU seconds over the measured seconds;
- its collections of each generation, and their CPU seconds;
- ``vs_thawed``: how many times less total CPU (medians) each way took than ``thawed``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ME = Path(__file__).resolve()
WAYS = ("thawed", "frozen", "tuned")


def child(args: argparse.Namespace) -> None:
    from ingest_e2e import scenario  # noqa: PLC0415  (this folder: the same simulated jobs)
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from collectors.sim import iter_batches  # noqa: PLC0415
    from detectors.methods import method_factory  # noqa: PLC0415
    from minder.service.engine import DetectionService  # noqa: PLC0415
    from minder.service.telemetry import ServiceMetrics  # noqa: PLC0415

    jobs = {f"job{i}": args.machines for i in range(args.jobs)}
    simulated = scenario(jobs, args.seconds, time.time() - args.seconds - 5)
    now = [simulated.start_ts]
    service = DetectionService(
        method_factory("minder"),
        grace_s=2,
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=lambda: now[0],
    )
    counts = [0, 0, 0]
    gc_cpu = [0.0, 0.0, 0.0]
    started = [0.0]
    measuring = [False]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if not measuring[0]:
            return
        if phase == "start":
            started[0] = time.thread_time()
        else:
            counts[info["generation"]] += 1
            gc_cpu[info["generation"]] += time.thread_time() - started[0]

    if args.way == "tuned":
        gc.set_threshold(*args.threshold)
    gc.callbacks.append(on_gc)
    cpu = 0.0
    measured = 0
    frozen = 0
    for second, (_, batches) in enumerate(iter_batches(simulated)):
        if second == args.warm_s and args.way == "frozen":
            gc.collect()
            gc.freeze()
            frozen = gc.get_freeze_count()
        measuring[0] = second >= args.warm_s
        began = time.process_time()
        now[0] = batches[-1].ts + 1
        service.ingest(batches)
        service.tick()
        if measuring[0]:
            cpu += time.process_time() - began
            measured += 1
        measuring[0] = False  # the simulator's own allocations (the next second's) are not ours
    print(
        json.dumps(
            {
                "way": args.way,
                "seconds": measured,
                "cpu_s": round(cpu, 3),
                "frozen_objects": frozen,
                "tracked_objects": len(gc.get_objects()),
                "collections": counts,
                "collection_cpu_s": [round(c, 3) for c in gc_cpu],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--machines", type=int, default=1250, help="per job")
    parser.add_argument("--seconds", type=int, default=24, help="data seconds in all")
    parser.add_argument("--warm-s", type=int, default=8, help="seconds before measuring")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--ways",
        default="thawed,frozen",
        help="the ways to compare, of thawed, frozen and tuned (--threshold)",
    )
    parser.add_argument(
        "--threshold",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[10_000, 10, 10],
        help="the tuned way's gc.set_threshold (default 10000,10,10; Python's is 700,10,10)",
    )
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seconds < args.warm_s + 1:
        parser.error(f"--seconds {args.seconds}: expected more than --warm-s ({args.warm_s})")
    if args.way is not None:
        child(args)
        return
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if not ways or not set(ways) <= set(WAYS):
        parser.error(f"--ways {args.ways!r}: expected a list of {', '.join(WAYS)}")
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
    common = [f"--jobs={args.jobs}", f"--machines={args.machines}"]
    common += [f"--seconds={args.seconds}", f"--warm-s={args.warm_s}"]
    common += ["--threshold=" + ",".join(map(str, args.threshold))]
    for _ in range(args.rounds):
        for way in ways:
            done = subprocess.run(
                [sys.executable, str(ME), *common, f"--way={way}"],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(done.stdout)
            print(json.dumps(result), flush=True)
            runs[way].append(result)
    medians = {way: statistics.median(r["cpu_s"] for r in got) for way, got in runs.items()}
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "machines_per_job": args.machines,
                "rounds": args.rounds,
                "median_cpu_s": medians,
                "vs_thawed": {
                    way: round(medians["thawed"] / m, 3)
                    for way, m in medians.items()
                    if "thawed" in medians and way != "thawed"
                },
            }
        )
    )


if __name__ == "__main__":
    main()
