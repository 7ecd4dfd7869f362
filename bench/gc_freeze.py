"""Does freezing the heap out of CPython's cyclic collector speed detection up? An in-process A/B.

Usage::

    python bench/gc_freeze.py --jobs 8 --machines 1250 --seconds 24

Simulated jobs (8 GPUs, 8 NICs a machine, as ``bench/ingest_e2e.py`` makes them) go through the
real detection service (ingest, then tick, as ``minder serve`` does after a poll), one data
second at a time, generated as they are used. After ``--warm-s`` seconds, the seconds alternate:
even ones run with everything alive frozen out of the collector's walks (``gc.unfreeze``,
``gc.collect``, ``gc.freeze`` just before, not timed), odd ones with nothing frozen
(``gc.unfreeze``, ``gc.collect``). Alternating in one process keeps the shared machine's drift
out of the comparison. Prints one JSON object: the median CPU seconds of a data second each way,
and their ratio.

The question came from single runs of ``bench/ingest_e2e.py``, where a worker with the collector
disabled or its heap frozen drained 1.4-1.8x as many batches per CPU-second. This A/B, and the
same tree measured twice in one invocation of that bench (up to 10 % apart), did not confirm it
(bench/RESULTS.md, *Third session*).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from prometheus_client import CollectorRegistry

from collectors.sim import Scenario, iter_batches
from detectors.base import default_factory
from minder.service.engine import DetectionService
from minder.service.telemetry import ServiceMetrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--machines", type=int, default=1250, help="per job")
    parser.add_argument("--seconds", type=int, default=24, help="data seconds in all")
    parser.add_argument("--warm-s", type=int, default=8, help="seconds before measuring")
    args = parser.parse_args()
    if args.seconds < args.warm_s + 2:
        parser.error(f"--seconds {args.seconds}: expected at least --warm-s + 2")
    scenario = Scenario.model_validate(
        {
            "seed": 14,
            "duration_s": args.seconds,
            "start_ts": time.time() - args.seconds - 5,
            "jobs": [
                {
                    "name": f"job{i}",
                    "machines": args.machines,
                    "gpus_per_machine": 8,
                    "nics_per_machine": 8,
                    "pp_stages": 8 if args.machines >= 64 else 1,
                    "machines_per_domain": 16,
                }
                for i in range(args.jobs)
            ],
        }
    )
    now = [scenario.start_ts]
    service = DetectionService(
        default_factory(),
        grace_s=2,
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=lambda: now[0],
    )
    cpu: dict[str, list[float]] = {"frozen": [], "thawed": []}
    for second, (_, batches) in enumerate(iter_batches(scenario)):
        way = None
        if second >= args.warm_s:
            way = "frozen" if second % 2 == 0 else "thawed"
            gc.unfreeze()
            gc.collect()
            if way == "frozen":
                gc.freeze()
        began = time.process_time()
        now[0] = batches[-1].ts + 1
        service.ingest(batches)
        service.tick()
        if way is not None:
            cpu[way].append(time.process_time() - began)
    gc.unfreeze()
    frozen, thawed = statistics.median(cpu["frozen"]), statistics.median(cpu["thawed"])
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "machines_per_job": args.machines,
                "seconds_each_way": len(cpu["frozen"]),
                "frozen_cpu_s": round(frozen, 4),
                "thawed_cpu_s": round(thawed, 4),
                "thawed_over_frozen": round(thawed / frozen, 3) if frozen else None,
            }
        )
    )


if __name__ == "__main__":
    main()
