"""Per-second cost of the straggler detector on a large job, against the peer engine on the same
job: 128 machines x 8 ranks (1,024 ranks) by default.

Run: ``python bench/straggler_scale.py [--machines N] [--ranks R] [--seconds S] [--step S]``.

Fills a job window every second with the ranks' step, busy, collective times and step numbers
(a synchronous job whose steps take ``--step`` seconds, three slow ranks) plus 16 GPU metrics per
machine, and times on one core, per second of data, one evaluation of the straggler detector and
one of the peer engine (rules, denoising, peer scores, continuity). The straggler detector's
time includes the 20 latest ranks the service exports. Prints the medians, p95 and their ratio.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from detectors.engine import MinderDetector
from detectors.straggler import StragglerDetector
from detectors.window import JobWindow

os.environ.setdefault("OMP_NUM_THREADS", "1")

GPU_METRICS = ("gpu_util_ratio", "gpu_power_watts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=240)
    parser.add_argument("--step", type=float, default=1.0, help="seconds per training step")
    args = parser.parse_args()
    m, r = args.machines, args.ranks
    rng = np.random.default_rng(0)
    window = JobWindow("scale", horizon_s=64, tick_s=1)
    for i in range(m):
        window.machine_id(f"m{i:05d}")
    rank_cols = {
        name: np.asarray([window.series_id(name, f"rank{j}") for j in range(r)])
        for name in (
            "train_step_seconds",
            "train_busy_seconds",
            "nccl_collective_seconds",
            "train_step_number",
        )
    }
    gpu_cols = np.asarray(
        [window.series_id(name, f"gpu{g}") for name in GPU_METRICS for g in range(8)]
    )
    machines = np.repeat(np.arange(m), r)
    slow = np.zeros((m, r))
    slow[[3, 40, 77], [1, 5, 2]] = 0.15
    stragglers, engine = StragglerDetector(), MinderDetector()
    times_s: list[float] = []
    times_e: list[float] = []
    t0 = 1_000_000
    for sec in range(args.seconds):
        busy = 0.7 * args.step * (1 + slow + rng.normal(0, 0.005, (m, r)))
        step_time = busy.max() + 0.3 * args.step
        values = {
            "train_step_seconds": np.full((m, r), step_time),
            "train_busy_seconds": busy,
            "nccl_collective_seconds": step_time - busy,
            "train_step_number": np.full((m, r), float(sec // max(1, int(args.step)) + 1)),
        }
        for name, cols in rank_cols.items():
            window.add_arrays(t0 + sec, machines, np.tile(cols, m), values[name].ravel())
        gpu = rng.normal(0.9, 0.01, (m, len(gpu_cols)))
        window.add_arrays(
            t0 + sec, np.repeat(np.arange(m), len(gpu_cols)), np.tile(gpu_cols, m), gpu.ravel()
        )
        began = time.process_time()
        stragglers.evaluate(window, t0 + sec)
        late = stragglers.late_ranks(20)  # what the service exports (minder_rank_lateness_seconds)
        mid = time.process_time()
        engine.evaluate(window, t0 + sec)
        end = time.process_time()
        if sec >= 60:  # after the rings and windows filled
            times_s.append(mid - began)
            times_e.append(end - mid)
    s_ms, e_ms = 1000 * np.median(times_s), 1000 * np.median(times_e)
    print(
        f"{m} machines x {r} ranks ({m * r} ranks), step {args.step:g} s: straggler detector "
        f"{s_ms:.2f} ms (p95 {1000 * np.percentile(times_s, 95):.2f}) per job-second; peer "
        f"engine {e_ms:.2f} ms (p95 {1000 * np.percentile(times_e, 95):.2f}); ratio "
        f"{s_ms / e_ms:.2f}; {stragglers.stats.observations} rank-steps read, "
        f"live S {stragglers.live_slowdown:.3f}, latest rank "
        f"{late[0].machine}/{late[0].device} {late[0].seconds:.3f} s"
    )


if __name__ == "__main__":
    main()
