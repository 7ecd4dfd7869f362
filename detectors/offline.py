"""Offline detection over a canonical metric table: the stream replayed second by second.

The table is replayed through the same :class:`JobWindow` and detector the service uses, so an
offline run and a live run of the same data give the same alerts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from detectors.base import DetectorFactory, JobDetector, default_factory
from detectors.window import JobWindow
from minder.core.alert import Alert

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
"""``progress(job, seconds_done, seconds_total)``."""
SecondHook = Callable[[str, int, JobWindow, JobDetector], None]
"""``hook(job, second, window, detector)``, called after each evaluated second."""


@dataclass(slots=True)
class DetectionRun:
    """Alerts of an offline run and what it covered."""

    alerts: list[Alert] = field(default_factory=list)
    jobs: dict[str, dict[str, float]] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """Counts per job and overall, for the CLI's JSON."""
        return {
            "jobs": self.jobs,
            "alerts": len(self.alerts),
            "machines_alerted": sorted({a.machine for a in self.alerts}),
        }


def detect_table(
    table: pd.DataFrame,
    factory: DetectorFactory | None = None,
    progress: Progress | None = None,
    on_second: SecondHook | None = None,
) -> DetectionRun:
    """Replay a validated canonical table (``minder.core.table``) and collect the alerts.

    ``on_second`` sees the window and detector after every evaluated second (training reads
    the scores there).
    """
    factory = factory or default_factory()
    run = DetectionRun()
    jobs = table["job"].cat.remove_unused_categories().cat.categories
    # groupby copies every job's rows; a table of one job (the usual case) is used as it is.
    parts = [(jobs[0], table)] if len(jobs) == 1 else table.groupby("job", observed=True, sort=True)
    for job, rows in parts:
        alerts, covered = _detect_job(str(job), rows, factory, progress, on_second)
        run.alerts.extend(alerts)
        run.jobs[str(job)] = covered
    run.alerts.sort(key=lambda a: (a.detected_ts, a.job, a.machine))
    return run


def _detect_job(
    job: str,
    rows: pd.DataFrame,
    factory: DetectorFactory,
    progress: Progress | None,
    on_second: SecondHook | None,
) -> tuple[list[Alert], dict[str, float]]:
    detector = factory()
    window = JobWindow(job, horizon_s=detector.horizon_s)
    secs = np.floor(rows["ts"].to_numpy()).astype(np.int64)
    order = np.argsort(secs, kind="stable")
    secs = secs[order]
    values = rows["value"].to_numpy(dtype=np.float32)[order]

    # Map names to window indices through the categories, never row by row.
    machine_codes, machine_names = _codes(rows["machine"], order)
    group_codes, group_names = _codes(rows["group"], order)
    domain_codes, domain_names = _codes(rows["domain"], order)
    first_row = np.unique(machine_codes, return_index=True)[1]
    lookup = np.zeros(len(machine_names), dtype=np.int64)
    for i in first_row:
        code = machine_codes[i]
        lookup[code] = window.machine_id(
            machine_names[code], group_names[group_codes[i]], domain_names[domain_codes[i]]
        )
    row_machine = lookup[machine_codes]
    metric_codes, metric_names = _codes(rows["metric"], order)
    device_codes, device_names = _codes(rows["device"], order)
    pair_codes, first_of_pair = np.unique(
        metric_codes.astype(np.int64) * len(device_names) + device_codes, return_inverse=True
    )
    series_ids = np.asarray(
        [
            window.series_id(
                metric_names[p // len(device_names)], device_names[p % len(device_names)]
            )
            for p in pair_codes
        ],
        dtype=np.int64,
    )
    row_series = series_ids[first_of_pair]

    alerts: list[Alert] = []
    # Only seconds with data, and the window's horizon after each: a stray early row must not
    # make the replay walk every empty second in between (the service jumps such gaps too).
    data_secs, starts = np.unique(secs, return_index=True)
    bounds = np.append(starts, len(secs))
    total = int(data_secs[-1] - data_secs[0] + 1)
    done = 0
    for i, sec in enumerate(data_secs.tolist()):
        lo, hi = bounds[i], bounds[i + 1]
        window.add_arrays(sec, row_machine[lo:hi], row_series[lo:hi], values[lo:hi])
        following = int(data_secs[i + 1]) if i + 1 < len(data_secs) else sec + 1
        for now in range(sec, min(following, sec + window.horizon_s)):
            alerts.extend(detector.evaluate(window, now))
            if on_second is not None:
                on_second(job, now, window, detector)
        done = min(total, following - int(data_secs[0]))
        if progress is not None and (i % 60 == 0 or i == len(data_secs) - 1):
            progress(job, done, total)
    covered = {
        "machines": float(window.n_machines),
        "series": float(window.n_series),
        "seconds": float(total),
        "samples": float(len(values)),
    }
    return alerts, covered


def _codes(column: pd.Series, order: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Integer codes (in ``order``) and category names of a text column."""
    categorical = (
        column if isinstance(column.dtype, pd.CategoricalDtype) else column.astype("category")
    )
    codes = categorical.cat.codes.to_numpy()[order]
    return codes, [str(c) for c in categorical.cat.categories]
