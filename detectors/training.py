"""``minder train``: fit the per-metric denoisers and the priority tree from labelled data.

1. Replay the canonical table through the same job window the service uses and collect, every
   ``step_s`` seconds, each machine's window of every scored series where no labelled fault is
   near that machine (normal windows).
2. Per metric: a min-max scaler from the normal values, then the denoiser fitted on the scaled,
   gap-filled normal windows.
3. Replay again with those denoisers and record, per second, each metric's maximum |peer z|
   over the job's machines (Minder §4.4's features), labelled 1 when a fault was active in the
   job, and fit the decision tree that orders the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from detectors.config import DetectorConfig, metric_floor
from detectors.denoisers import Denoiser, MetricScaler, denoiser_class, fill_nearest
from detectors.engine import MinderDetector
from detectors.model import DetectorModel
from detectors.offline import detect_table
from detectors.priority import MetricPriority
from detectors.scoring import score_layout
from detectors.window import JobWindow
from minder.core.alert import Alert
from minder.core.errors import ModelError, TableError
from minder.core.metrics import METRICS

logger = logging.getLogger(__name__)

LABEL_COLUMNS = ("job", "machine", "start_ts", "end_ts", "fault")
MIN_TRAIN_WINDOWS = 50
"""A learned denoiser needs at least this many normal windows; with fewer, the metric keeps
the default filter."""
AFTER_FAULT_S = 60.0
"""A machine's windows this long after its fault ended are not used as normal data."""

Progress = Callable[[str, int, int], None]


def validate_labels(labels: pd.DataFrame) -> pd.DataFrame:
    """Check a labels table (``job, machine, start_ts, end_ts, fault``) and normalise types."""
    missing = [c for c in LABEL_COLUMNS if c not in labels.columns]
    if missing:
        raise TableError(
            f"labels lack column(s) {missing}: expected {', '.join(LABEL_COLUMNS)}", column=None
        )
    out = labels.copy()
    for column in ("job", "machine", "fault"):
        out[column] = out[column].astype(str)
    for column in ("start_ts", "end_ts"):
        values = pd.to_numeric(out[column], errors="coerce")
        bad = np.flatnonzero(~np.isfinite(values.to_numpy(dtype=float)))
        if bad.size:
            raise TableError(
                f"labels column {column!r} row {int(bad[0])} is {out[column].iloc[bad[0]]!r}: "
                "expected unix seconds",
                column=column,
                row=int(bad[0]),
            )
        out[column] = values.astype(float)
    backwards = np.flatnonzero(out["end_ts"].to_numpy() < out["start_ts"].to_numpy())
    if backwards.size:
        raise TableError(
            f"labels row {int(backwards[0])} ends before it starts: expected end_ts >= start_ts",
            column="end_ts",
            row=int(backwards[0]),
        )
    return out


@dataclass(slots=True)
class _Faults:
    """Labelled intervals of one job: per machine name, and for the whole job."""

    by_machine: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    job: list[tuple[float, float]] = field(default_factory=list)

    def machine_busy(self, machine: str, start: float, end: float) -> bool:
        """A fault of ``machine`` overlaps ``[start, end]`` (with the after-fault margin)."""
        return any(
            s <= end and start <= e + AFTER_FAULT_S for s, e in self.by_machine.get(machine, ())
        )

    def active(self, second: float, settle_s: float) -> bool:
        """A fault of the job is active at ``second`` (and has shown for ``settle_s``)."""
        return any(s + settle_s <= second <= e for s, e in self.job)


def _faults_by_job(labels: pd.DataFrame) -> dict[str, _Faults]:
    out: dict[str, _Faults] = {}
    columns = zip(
        labels["job"].tolist(),
        labels["machine"].tolist(),
        labels["start_ts"].to_numpy(dtype=float).tolist(),
        labels["end_ts"].to_numpy(dtype=float).tolist(),
        strict=True,
    )
    for job, machine, start, end in columns:
        faults = out.setdefault(str(job), _Faults())
        faults.by_machine.setdefault(str(machine), []).append((start, end))
        faults.job.append((start, end))
    return out


class _NullDetector:
    """Evaluates nothing: the first replay only reads windows."""

    def __init__(self, horizon_s: int) -> None:
        self.horizon_s = horizon_s

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        return []

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        return {}


@dataclass(slots=True)
class _WindowSampler:
    """A uniform sample of at most ``limit`` normal windows per metric over the whole replay.

    Each window gets a random key and the ``limit`` smallest keys are kept (pruned whenever twice
    that many wait), so the first jobs of a table do not crowd out the later ones.
    """

    faults: dict[str, _Faults]
    window_s: int
    step_s: int
    limit: int
    seed: int
    windows: dict[str, list[np.ndarray]] = field(default_factory=dict)
    keys: dict[str, list[np.ndarray]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    _rng: np.random.Generator | None = None

    def __call__(self, job: str, now: int, window: JobWindow, _detector: object) -> None:
        if now % self.step_s:
            return
        layout = score_layout(window)
        if not layout.buckets:
            return
        values = window.window(now, self.window_s, layout.all_cols)  # time, machine, col
        faults = self.faults.get(job, _Faults())
        normal = np.asarray(
            [
                not faults.machine_busy(info.name, now - self.window_s, now)
                for info in window.machines
            ]
        )
        offset = 0
        for bucket in layout.buckets:
            k, width = bucket.columns.shape
            block = values[:, normal, offset : offset + k * width].reshape(
                self.window_s, -1, k, width
            )
            offset += k * width
            for j, metric in enumerate(bucket.metrics):
                part = block[:, :, j, :].reshape(self.window_s, -1).T  # windows, time
                part = part[np.isfinite(part).any(axis=1)]
                if part.size:
                    self._keep(metric, part.astype(np.float64))

    def _keep(self, metric: str, part: np.ndarray) -> None:
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        self.counts[metric] = self.counts.get(metric, 0) + len(part)
        self.windows.setdefault(metric, []).append(part)
        self.keys.setdefault(metric, []).append(self._rng.random(len(part)))
        if sum(len(p) for p in self.windows[metric]) > 2 * self.limit:
            self.windows[metric], self.keys[metric] = (
                [self.sample(metric)],
                [np.sort(np.concatenate(self.keys[metric]))[: self.limit]],
            )

    def sample(self, metric: str) -> np.ndarray:
        """The kept windows of ``metric`` (at most ``limit``)."""
        windows = np.concatenate(self.windows[metric])
        keys = np.concatenate(self.keys[metric])
        if len(windows) <= self.limit:
            return windows
        return windows[np.argsort(keys, kind="stable")[: self.limit]]


@dataclass(slots=True)
class _FeatureRecorder:
    """Per job-second: each metric's maximum |peer z| over machines, and the label."""

    faults: dict[str, _Faults]
    step_s: int
    settle_s: float
    metrics: list[str] = field(default_factory=list)
    rows: list[dict[str, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    def __call__(self, job: str, now: int, _window: JobWindow, detector: object) -> None:
        if now % self.step_s or not isinstance(detector, MinderDetector):
            return
        row = {
            metric: float(np.max(top)) if len(top) else 0.0
            for metric, (top, _) in detector.last_scores.items()
        }
        if not row:
            return
        for metric in row:
            if metric not in self.metrics:
                self.metrics.append(metric)
        self.rows.append(row)
        self.labels.append(int(self.faults.get(job, _Faults()).active(now, self.settle_s)))


def train_model(
    table: pd.DataFrame,
    labels: pd.DataFrame,
    *,
    denoiser: str = "mean",
    config: DetectorConfig | None = None,
    step_s: int = 4,
    max_windows: int = 20_000,
    seed: int = 0,
    progress: Progress | None = None,
) -> DetectorModel:
    """Fit a model from a validated canonical table and its labels.

    Parameters
    ----------
    table
        Canonical metric table (``minder.core.table.read_table``).
    labels
        ``job, machine, start_ts, end_ts, fault`` per faulty machine; an empty table trains the
        denoisers only (no priority tree).
    denoiser
        Kind of the per-metric denoisers (:data:`detectors.denoisers.DENOISER_KINDS`).
    step_s
        Seconds between sampled windows (neighbouring windows overlap and add little).
    max_windows
        Normal windows per metric the denoisers see at most.
    """
    cfg = config or DetectorConfig()
    labels = validate_labels(labels)
    faults = _faults_by_job(labels)
    cls = denoiser_class(denoiser)
    started = time.perf_counter()
    sampler = _WindowSampler(faults, cfg.window_s, step_s, max_windows, seed)
    detect_table(
        table,
        lambda: _NullDetector(cfg.horizon_s),
        progress=progress,
        on_second=sampler,
    )
    if not sampler.windows:
        raise ModelError("the table has no scored metric windows to train on")
    denoisers: dict[str, tuple[MetricScaler, Denoiser]] = {}
    fit_s: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for metric in sorted(sampler.windows):
        windows = sampler.sample(metric)
        floor = metric_floor(metric, METRICS[metric].unit if metric in METRICS else "1")
        scaler = MetricScaler.fit(windows, floor)
        fitted = cls(window=cfg.window_s)
        tic = time.perf_counter()
        if fitted.needs_fit:
            filled = fill_nearest(scaler.forward(windows))
            complete = filled[np.isfinite(filled).all(axis=1)]
            try:
                if len(complete) < MIN_TRAIN_WINDOWS:
                    raise ValueError(
                        f"{len(complete)} complete normal windows: expected at least "
                        f"{MIN_TRAIN_WINDOWS}"
                    )
                fitted.fit(complete)
            except ValueError as exc:
                # Too little data for this metric: it keeps the default filter.
                logger.warning("not training a %s denoiser for %s: %s", denoiser, metric, exc)
                skipped[metric] = str(exc)
                continue
        fit_s[metric] = round(time.perf_counter() - tic, 3)
        denoisers[metric] = (scaler, fitted)
    model = DetectorModel(window=cfg.window_s, denoiser=denoiser, denoisers=denoisers)

    priority = None
    if len(labels):
        recorder = _FeatureRecorder(faults, step_s, settle_s=float(cfg.window_s))
        detect_table(
            table,
            lambda: MinderDetector(cfg, model=model, prioritise=False),
            progress=progress,
            on_second=recorder,
        )
        features = np.asarray(
            [[row.get(m, 0.0) for m in recorder.metrics] for row in recorder.rows]
        )
        priority = MetricPriority.fit(features, np.asarray(recorder.labels), recorder.metrics)
        logger.info("metric priority: %s", ", ".join(priority.order))
    model.priority = priority
    model.info = {
        "rows": len(table),
        "jobs": int(table["job"].nunique()),
        "machines": int(table["machine"].nunique()),
        "labels": len(labels),
        "faults": sorted(labels["fault"].unique().tolist()) if len(labels) else [],
        "windows_per_metric": {m: min(c, max_windows) for m, c in sampler.counts.items()},
        "fit_seconds": fit_s,
        "skipped_metrics": skipped,
        "train_seconds": round(time.perf_counter() - started, 2),
        "created_at": time.time(),
    }
    return model
