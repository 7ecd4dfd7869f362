"""What a poisoned poll costs: the consumer's isolation pass hands a failed poll's batches to the
handler one at a time (``BatchConsumer._isolate``), so a poll of ``max_poll_records`` batches
must still go through well inside ``max_poll_interval_ms`` (10 s by default) that way.

Usage::

    python bench/poll_isolation.py --machines 1000 --records 5000

A simulated job of ``--machines`` machines warms the real detection service for ``--warm-s``
seconds; then ``--records`` batches of the following seconds go through the service's handler
(ingest, then tick, as ``minder serve`` does) one at a time, and the same number of the seconds
after in one call. Prints one JSON object: CPU seconds of each, and the ratio.

The service here has no store: storing an alert (only when one is raised) and handing a job's
state to the writer thread (a reference, written off the poll loop) are not in the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import time

from prometheus_client import CollectorRegistry

from collectors.sim import Scenario, iter_batches
from detectors.methods import method_factory
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService
from minder.service.telemetry import ServiceMetrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--warm-s", type=int, default=30)
    args = parser.parse_args()
    span = math.ceil(args.records / args.machines)
    scenario = Scenario.model_validate(
        {
            "seed": 1,
            "duration_s": args.warm_s + 2 * span,
            "jobs": [{"name": "big", "machines": args.machines, "step_time_s": 3.0}],
        }
    )
    seconds = [batches for _, batches in iter_batches(scenario)]
    now = [scenario.start_ts]
    service = DetectionService(
        method_factory("minder"),
        grace_s=2,
        metrics=ServiceMetrics(CollectorRegistry()),
        clock=lambda: now[0],
    )

    def handle(batches: list[NodeBatch]) -> None:
        now[0] = batches[-1].ts + 1
        service.ingest(batches)
        service.tick()

    for batches in seconds[: args.warm_s]:
        handle(batches)
    alone = [b for bs in seconds[args.warm_s : args.warm_s + span] for b in bs][: args.records]
    together = [b for bs in seconds[args.warm_s + span :] for b in bs][: args.records]
    start = time.process_time()
    for batch in alone:
        handle([batch])
    one_at_a_time = time.process_time() - start
    start = time.process_time()
    handle(together)
    one_call = time.process_time() - start
    print(
        json.dumps(
            {
                "machines": args.machines,
                "records": len(alone),
                "one_at_a_time_cpu_s": round(one_at_a_time, 3),
                "one_call_cpu_s": round(one_call, 3),
                "us_per_batch_alone": round(1e6 * one_at_a_time / len(alone), 1),
                "ratio": round(one_at_a_time / one_call, 2) if one_call else None,
            }
        )
    )


if __name__ == "__main__":
    main()
