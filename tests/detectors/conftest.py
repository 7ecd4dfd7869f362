"""Builders of small job windows with a training-like rhythm for the detector tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from detectors.window import JobWindow

Mutator = Callable[[int, int, dict[tuple[str, str], float]], dict[tuple[str, str], float] | None]


def healthy_sample(
    rng: np.random.Generator, sec: int, offset: float
) -> dict[tuple[str, str], float]:
    """One machine-second of a job that computes 4 s then communicates 2 s."""
    computing = sec % 6 < 4
    out: dict[tuple[str, str], float] = {}
    for g in range(4):
        dev = f"gpu{g}"
        out[("gpu_util_ratio", dev)] = float(np.clip(0.97 + rng.normal(0, 0.01), 0, 1))
        out[("gpu_tensor_active_ratio", dev)] = float(
            np.clip((0.55 if computing else 0.1) + rng.normal(0, 0.02), 0, 1)
        )
        out[("gpu_power_watts", dev)] = (600 if computing else 350) * (1 + offset) + rng.normal(
            0, 8
        )
        out[("gpu_pcie_link_width", dev)] = 16.0
        out[("gpu_pcie_link_gen", dev)] = 5.0
        out[("gpu_xid_count", dev)] = 0.0
        out[("gpu_ecc_dbe_count", dev)] = 0.0
        out[("gpu_nvlink_error_count", dev)] = 0.0
    for n in range(2):
        dev = f"mlx5_{n}"
        out[("rdma_port_up", dev)] = 1.0
        out[("rdma_link_downed_count", dev)] = 0.0
        out[("pfc_tx_pause_per_second", dev)] = max(0.0, 50 + rng.normal(0, 10))
        out[("rdma_tx_bytes_per_second", dev)] = (2e9 if not computing else 2e8) * (
            1 + rng.normal(0, 0.02)
        )
    out[("cpu_util_ratio", "")] = float(np.clip(0.3 + rng.normal(0, 0.01), 0, 1))
    return out


@pytest.fixture
def make_window() -> Callable[..., JobWindow]:
    """``make_window(machines, seconds, mutate=None, start=1000, seed=0, domains=1, groups=1)``.

    ``mutate(machine, sec, sample)`` may edit a machine-second in place or return None to drop
    the whole machine-second (silence).
    """

    def build(
        machines: int = 16,
        seconds: int = 60,
        mutate: Mutator | None = None,
        start: int = 1000,
        seed: int = 0,
        domains: int = 1,
        groups: int = 1,
        window: JobWindow | None = None,
        horizon_s: int = 64,
    ) -> JobWindow:
        rng = np.random.default_rng(seed)
        offsets = rng.normal(0, 0.02, machines)
        w = window or JobWindow("job", horizon_s=horizon_s)
        for sec in range(start, start + seconds):
            for m in range(machines):
                sample = healthy_sample(rng, sec, offsets[m])
                if mutate is not None:
                    result = mutate(m, sec, sample)
                    if result is None:
                        continue
                    sample = result
                w.add_samples(
                    sec,
                    f"m{m:03d}",
                    [(name, dev, v) for (name, dev), v in sample.items()],
                    group=f"pp{m * groups // machines}" if groups > 1 else "",
                    domain=f"leaf-{m * domains // machines}",
                )
        return w

    return build


@pytest.fixture
def run_stream(make_window: Callable[..., JobWindow]) -> Callable[..., list]:
    """Stream ``seconds`` of data one second at a time through a MinderDetector; return alerts."""
    from detectors.config import DetectorConfig
    from detectors.engine import MinderDetector

    def run(
        machines: int = 16,
        seconds: int = 120,
        mutate: Mutator | None = None,
        config: DetectorConfig | None = None,
        start: int = 1000,
        detector: object | None = None,
        **kwargs: object,
    ) -> list:
        detector = detector or MinderDetector(config or DetectorConfig())
        window = JobWindow("job", horizon_s=detector.horizon_s)  # type: ignore[attr-defined]
        alerts = []
        rng_seed = int(kwargs.pop("seed", 0))  # type: ignore[call-overload]
        for i, sec in enumerate(range(start, start + seconds)):
            make_window(
                machines=machines,
                seconds=1,
                mutate=mutate,
                start=sec,
                seed=rng_seed * 100000 + i,
                window=window,
                **kwargs,
            )
            alerts.extend(detector.evaluate(window, sec))  # type: ignore[attr-defined]
        return alerts

    return run
