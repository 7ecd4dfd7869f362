"""Canonical tables from per-GPU value cubes, for detector tests that shape a job by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from minder.core.table import normalize_table


def cube_table(
    cubes: Sequence[tuple[str, np.ndarray]], interval_s: int, start: int, job: str = "j"
) -> pd.DataFrame:
    """One canonical table of job ``job``: for each ``(metric, cube)``, ``cube[t, m, g]`` is
    machine ``m%02d``'s device ``g`` at ``start + t * interval_s`` (GPU ``gpu<g>``, or NIC
    ``mlx5_<g>`` for the metrics of a NIC)."""
    parts = []
    for metric, cube in cubes:
        samples, machines, gpus = cube.shape
        prefix = "mlx5_" if metric.startswith(("rdma_", "pfc_")) else "gpu"
        parts.append(
            pd.DataFrame(
                {
                    "ts": np.repeat(start + np.arange(samples) * interval_s, machines * gpus),
                    "job": job,
                    "machine": np.tile(
                        np.repeat([f"m{i:02d}" for i in range(machines)], gpus), samples
                    ),
                    "metric": metric,
                    "device": np.tile([f"{prefix}{g}" for g in range(gpus)], samples * machines),
                    "value": cube.reshape(-1),
                }
            )
        )
    return normalize_table(pd.concat(parts, ignore_index=True))
