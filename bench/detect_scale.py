"""Per-second cost of scoring one very large job: 10,000 machines x 32 metrics by default.

Run: ``python bench/detect_scale.py [--machines N] [--metrics K] [--seconds S] [--groups G]
[--denoiser mean|median|ewma|raw] [--scorer median|pairwise]``.

Fills a job window with synthetic per-second values (one device per metric, a few machines
deviating) and times, per second of data, the window update and one detector evaluation
(rules, denoising, peer scores, continuity) on one core. Prints the median and p95.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

from detectors.config import DetectorConfig
from detectors.engine import MinderDetector
from detectors.window import JobWindow
from minder.core.metrics import METRICS, DeviceFamily, MetricKind

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _series(k: int) -> list[tuple[str, str]]:
    """``k`` scored (gauge or rate) metrics, GPU ones on ``gpu0``, host ones machine-level."""
    out = []
    for name, spec in METRICS.items():
        if spec.kind is MetricKind.COUNT or name in {
            "gpu_pcie_link_gen",
            "gpu_pcie_link_width",
            "rdma_port_up",
            "gpu_throttle_reasons",
        }:
            continue
        device = {
            DeviceFamily.GPU: "gpu0",
            DeviceFamily.NIC: "mlx5_0",
            DeviceFamily.HOST: "",
            DeviceFamily.RANK: "rank0",
        }[spec.family]
        out.append((name, device))
    if k > len(out):
        extra = [(name, f"gpu{g}") for g in range(1, 8) for name, d in out if d == "gpu0"]
        out += extra
    return out[:k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--denoiser", default="mean")
    parser.add_argument("--scorer", default="median")
    parser.add_argument("--groups", type=int, default=1, help="peer groups (PP stages)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    series = _series(args.metrics)
    window = JobWindow("big", horizon_s=DetectorConfig().horizon_s)

    def group(i: int) -> str:
        return f"pp{i * args.groups // args.machines}" if args.groups > 1 else ""

    machines = np.asarray(
        [
            window.machine_id(f"n{i:05d}", group(i), f"leaf-{i // 16:03d}")
            for i in range(args.machines)
        ]
    )
    cols = np.asarray([window.series_id(m, d) for m, d in series])
    detector = MinderDetector(DetectorConfig(denoiser=args.denoiser), scorer=args.scorer)
    base = rng.uniform(0.2, 0.9, size=len(series)) * 100
    m_idx = np.repeat(machines, len(cols))
    s_idx = np.tile(cols, len(machines))
    ingest, evaluate = [], []
    start = 1_763_700_000
    for t in range(args.seconds):
        values = base[None, :] * rng.normal(1.0, 0.02, size=(args.machines, len(cols)))
        values[:3] *= 0.5  # three deviating machines
        flat = values.astype(np.float32).ravel()
        c0 = time.process_time()
        window.add_arrays(start + t, m_idx, s_idx, flat)
        c1 = time.process_time()
        detector.evaluate(window, start + t)
        c2 = time.process_time()
        if t >= detector.config.window_s:  # after the window filled
            ingest.append(c1 - c0)
            evaluate.append(c2 - c1)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.machines} machines x {len(cols)} series, denoiser {args.denoiser}, "
        f"scorer {args.scorer}, {args.groups} group(s), {len(evaluate)} timed seconds"
    )
    for name, values in (("window update", ingest), ("evaluate", evaluate)):
        arr = np.asarray(values)
        print(
            f"  {name:14} median {np.median(arr) * 1e3:8.1f} ms   p95 "
            f"{np.percentile(arr, 95) * 1e3:8.1f} ms  (CPU)"
        )
    total = np.asarray(ingest) + np.asarray(evaluate)
    print(
        f"  {'total':14} median {np.median(total) * 1e3:8.1f} ms   p95 "
        f"{np.percentile(total, 95) * 1e3:8.1f} ms; peak RSS {peak_mb:.0f} MB"
    )


if __name__ == "__main__":
    main()
