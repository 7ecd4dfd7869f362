"""Baseline detectors: generic multivariate outlier detection on the same windows as the engine.

These are the comparison points of the benchmark (issue 3, item 6), in the style of the Minder
paper's baselines: pure outlier detection on windows. Every ``stride_s`` seconds each machine of
the job becomes one row of a feature matrix (one column per series the engine scores: its window
mean over ``config.window_s``), the columns are standardised robustly against the machine's
peers, and one unsupervised model scores every row:

- ``mahalanobis``: distance under a Ledoit-Wolf shrunk covariance (defined when features >
  machines, where the sample covariance is singular);
- ``iforest``, ``ecod``, ``copod``, ``lof``: the PyOD models, fitted on the job's machines at that
  second and read back transductively (``fit(X)`` then ``decision_scores_``).

The raw scores become a robust z across machines, so one threshold serves every job size; a
machine above it for ``config.continuity_s`` seconds is alerted once per episode, several at once
if need be. Unlike :class:`~detectors.engine.MinderDetector` the baselines apply **no hard-fault
rules** (XID, ECC, link down, silence), no domain grouping and no metric prioritisation: what they
catch, they catch from the windows alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.config import DetectorConfig, metric_floor
from detectors.scoring import MAD_TO_SIGMA, NOT_SCORED, peer_comparisons, row_nanmedian
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.errors import ValidationError
from minder.core.metrics import MetricKind

logger = logging.getLogger(__name__)

BASELINE_METHODS: tuple[str, ...] = ("mahalanobis", "iforest", "ecod", "copod", "lof")
"""Outlier detectors on the same windows (the names :mod:`detectors.methods` builds them by)."""

__all__ = [
    "BASELINE_METHODS",
    "DEFAULT_STRIDES",
    "DEFAULT_THRESHOLDS",
    "SCORE_SCALE_FLOORS",
    "BaselineDetector",
    "FeatureLayout",
    "FeatureMatrix",
    "baseline_factory",
    "build_features",
    "feature_layout",
    "outlier_scores",
    "robust_z",
]

# Robust-z thresholds on the per-machine outlier score, chosen by measurement (default
# DetectorConfig: window 8 s, continuity 30 s; group-aware features; default strides). For each
# run, the zero-false-alert threshold is the largest, over healthy machines and time, of the
# lowest z a machine keeps through any stretch of continuity_s seconds of evaluations (without
# the MIN_DEVIATION gate, to be safe). Measured values:
#
#   method       sim fault-free  sim three-faults  test-like jobs          max   default
#                (64 machines)   (125 healthy)     (16/32/64 machines, 6
#                                                  seeds, with/without a
#                                                  faulty machine)
#   mahalanobis  0.69            1.62              3.46                    3.46  4
#   iforest      2.62            2.47              4.34                    4.34  5
#   ecod         2.47            1.91              3.48                    3.48  4
#   copod        1.98            1.71              3.53                    3.53  4
#   lof          0.89            1.69              17.12                   17.12 18
#
# The simulator's 'fault-free' run alone asks for very little (its healthy machines are alike:
# rounded up, 1, 3, 3, 2 and 1), and three-faults' healthy machines already break that for
# Mahalanobis and LOF. The jobs of tests/detectors/conftest.py give machines persistent +-2 %
# power offsets, as real fleets have, and a 16-machine LOF sees such a machine as a local
# outlier; so the defaults are the maximum over all three, rounded up to the next integer.
# Sanity on three-faults at these defaults (lowest z held through continuity_s during the
# fault, PCIe downgrade / NIC down / ECC stall): mahalanobis 3270 / 124 / 398, iforest
# 6.5 / 3.9 / 32, ecod 2.5 / 1.4 / 28, copod 2.6 / 2.1 / 33, lof 1560 / 110 / 595: the
# rank-based ECOD/COPOD catch only the stall, the forest misses the NIC.
DEFAULT_THRESHOLDS: dict[str, float] = {
    "mahalanobis": 4.0,
    "iforest": 5.0,
    "ecod": 4.0,
    "copod": 4.0,
    "lof": 18.0,
}

# Mahalanobis costs about 3 ms per job-second at 64-128 machines, so it scores every second
# like the engine. The PyOD models are refitted at every evaluation: they are transductive here (the
# reference is the job's own machines at that second), because a model fitted once on earlier
# seconds would treat every job-wide phase change (checkpoint, evaluation, a stall) as an
# anomaly and would learn a fault present while it was fitted as normal. An isolation forest of
# 100 trees costs tens of milliseconds per fit, so they score every 10 s.
DEFAULT_STRIDES: dict[str, int] = {
    "mahalanobis": 1,
    "iforest": 10,
    "ecod": 10,
    "copod": 10,
    "lof": 10,
}

MISSING_FRACTION = 0.5
"""A machine missing more than this share of the features is not scored at that evaluation."""

MIN_DEVIATION = 3.0
"""A candidate must sit at least this many robust scales from its peers on one feature.

Without it, on near-noiseless data the MAD of the outlier scores collapses and numerical
wobble becomes an outlier; with realistic noise every real outlier clears it easily.
"""

CLIP_FOR_COVARIANCE = 3.0
"""Standardised features are clipped to this many robust scales to estimate the covariance."""

SCORE_SCALE_FLOORS: dict[str, float] = {"lof": 0.1}
"""Smallest spread of a method's raw score worth one z unit.

Inliers' local outlier factors all sit within a few hundredths of 1, so their MAD alone would
make a factor of 1.3 (a mild local outlier) a z of 20 or more, and the z of the same factor
would depend on the job's size; 0.1 is a density 10 % below the neighbours'. The other
methods' scores spread enough on their own (measured on the simulator: 1.4826 MAD of 0.5-0.8
for Mahalanobis, 0.02-0.03 for the forest, 1.5-11 for ECOD/COPOD).
"""

_MIN_PEERS = 3
_NEVER = -(2**62)


@dataclass(frozen=True, slots=True)
class FeatureLayout:
    """The window's scored series in feature order; rebuilt when new series appear."""

    n_series: int
    cols: np.ndarray
    metrics: list[str]
    devices: list[str]
    floors: np.ndarray


@dataclass(frozen=True, slots=True)
class FeatureMatrix:
    """Standardised features of the machines scored at one evaluation.

    Attributes
    ----------
    values
        ``[len(machines), len(features)]`` robust z of each window mean against the machine's
        peers; a missing value is imputed with the peers' median (0 here).
    machines
        Window indices of the scored machines.
    features
        Positions in the layout of the kept features (a feature fewer than three machines
        report is dropped).
    missing
        Per scored machine, how many kept features it did not report.
    """

    values: np.ndarray
    machines: np.ndarray
    features: np.ndarray
    missing: np.ndarray


def feature_layout(window: JobWindow) -> FeatureLayout:
    """The series the engine scores (no counts, no levels or bitmasks), one feature each."""
    cols: list[int] = []
    for i, (metric, _) in enumerate(window.series):
        if window.series_spec[i].kind is MetricKind.COUNT or metric in NOT_SCORED:
            continue
        cols.append(i)
    return FeatureLayout(
        n_series=window.n_series,
        cols=np.asarray(cols, dtype=np.int64),
        metrics=[window.series[i][0] for i in cols],
        devices=[window.series[i][1] for i in cols],
        floors=np.asarray(
            [metric_floor(window.series[i][0], window.series_spec[i].unit) for i in cols]
        ),
    )


def build_features(
    window: JobWindow,
    now: int,
    layout: FeatureLayout,
    config: DetectorConfig,
    *,
    group_aware: bool = True,
) -> FeatureMatrix:
    """Window means of every machine, standardised against its peers, missing values imputed.

    With ``group_aware`` each machine is compared with its ``group`` (small groups with the whole
    job), as :class:`~detectors.engine.MinderDetector` does, so a pipeline stage that systematically
    carries more load is not every baseline's outlier.
    """
    n = window.n_machines
    empty = FeatureMatrix(
        np.zeros((0, 0)), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    )
    if layout.cols.size == 0 or n == 0:
        return empty
    values = window.window(now, config.window_s, layout.cols)
    counts = np.isfinite(values).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, np.nansum(values, axis=0) / np.maximum(counts, 1), np.nan)
    present = np.isfinite(means)
    # A feature (nearly) nobody reports has no peers to compare with; dropping it keeps a metric
    # one machine alone sends from making that machine an outlier.
    kept = np.flatnonzero(present.sum(axis=0) >= min(_MIN_PEERS, n))
    if kept.size == 0:
        return empty
    means, present = means[:, kept], present[:, kept]
    missing = kept.size - present.sum(axis=1)
    scored = missing <= MISSING_FRACTION * kept.size
    means[~scored] = np.nan  # a machine that is not scored is nobody's peer either
    comparisons = (
        peer_comparisons(window, config.min_group)
        if group_aware
        else [(np.arange(n), np.arange(n))]
    )
    z = _standardise(means, comparisons, config.rel_floor, layout.floors[kept])
    rows = np.flatnonzero(scored)
    return FeatureMatrix(
        values=np.nan_to_num(z[rows], nan=0.0),
        machines=rows,
        features=kept,
        missing=missing[rows].astype(np.int64),
    )


def _standardise(
    means: np.ndarray,
    comparisons: list[tuple[np.ndarray, np.ndarray]],
    rel_floor: float,
    floors: np.ndarray,
) -> np.ndarray:
    """``(value - peers' median) / scale`` per column; scale = 1.4826 MAD, floored per unit."""
    z = np.full(means.shape, np.nan)
    for targets, members in comparisons:
        pooled = means[members].T  # features x peers
        median = row_nanmedian(pooled)
        mad = row_nanmedian(np.abs(pooled - median[:, None]))
        scale = np.maximum(np.maximum(MAD_TO_SIGMA * mad, rel_floor * np.abs(median)), floors)
        with np.errstate(invalid="ignore"):
            z[targets] = (means[targets] - median[None, :]) / scale[None, :]
    return z


def outlier_scores(method: str, features: np.ndarray, random_state: int = 0) -> np.ndarray:
    """Raw outlier score of each row of ``features`` (higher = more anomalous).

    The PyOD models are fitted on ``features`` and their training scores returned; PyOD is
    imported here so that importing this module stays cheap.
    """
    n = features.shape[0]
    if method == "mahalanobis":
        from sklearn.covariance import LedoitWolf  # noqa: PLC0415

        # Features are already centred on the peers' median; letting the estimator centre on
        # the mean would let the outlier drag the centre towards itself. For the same reason
        # the covariance is estimated on features clipped to +-CLIP_FOR_COVARIANCE: unclipped,
        # one machine 25 scales off on a dozen features inflates the covariance along its own
        # direction (masking) and makes the mildest of the other machines the next outlier.
        clipped = np.clip(features, -CLIP_FOR_COVARIANCE, CLIP_FOR_COVARIANCE)
        model = LedoitWolf(assume_centered=True).fit(clipped)
        return np.sqrt(np.maximum(model.mahalanobis(features), 0.0))
    detector: Any
    if method == "iforest":
        from pyod.models.iforest import IForest  # noqa: PLC0415

        detector = IForest(n_estimators=100, random_state=random_state, n_jobs=1)
    elif method == "ecod":
        from pyod.models.ecod import ECOD  # noqa: PLC0415

        detector = ECOD()
    elif method == "copod":
        from pyod.models.copod import COPOD  # noqa: PLC0415

        detector = COPOD()
    elif method == "lof":
        from pyod.models.lof import LOF  # noqa: PLC0415

        # PyOD's 20 neighbours, but at most half the job: with k = N - 1 every machine's
        # neighbourhood is the whole job, outlier included, and every LOF comes out ~1.
        detector = LOF(n_neighbors=max(1, min(20, n // 2)))
    else:
        raise _unknown(method)
    detector.fit(features)
    return np.asarray(detector.decision_scores_, dtype=np.float64)


def robust_z(scores: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """``(s - median) / max(1.4826 MAD, floor, eps)`` across machines (NaN where not finite).

    ``eps`` (a thousandth of the median, at least 1e-12) keeps a job of identical machines,
    whose scores are all equal, from dividing by zero.
    """
    scores = np.where(np.isfinite(scores), scores, np.nan)
    if not np.isfinite(scores).any():
        return scores
    median = float(np.nanmedian(scores))
    mad = float(np.nanmedian(np.abs(scores - median)))
    scale = max(MAD_TO_SIGMA * mad, floor, 1e-3 * abs(median), 1e-12)
    return (scores - median) / scale


def _unknown(method: object) -> ValidationError:
    return ValidationError(
        f"baseline method is {method!r}: expected one of {', '.join(BASELINE_METHODS)}"
    )


class BaselineDetector:
    """Streaming baseline detector of one job; keep one instance per job.

    Parameters
    ----------
    method
        One of :data:`BASELINE_METHODS`.
    config
        Window, continuity, re-arm and minimum job size are shared with the engine; its
        ``threshold`` (a per-metric z) is not used.
    threshold
        Robust z of the outlier score above which a machine is a candidate; default per method
        (:data:`DEFAULT_THRESHOLDS`).
    stride_s
        Seconds between evaluations that score (default per method, :data:`DEFAULT_STRIDES`).
    random_state
        Seed of the randomised models (isolation forest), fixed so a replay repeats.
    group_aware
        Standardise each machine against its ``group`` (True, as the engine does) or against
        the whole job (False, the paper's baseline setting).
    """

    def __init__(
        self,
        method: str,
        config: DetectorConfig | None = None,
        *,
        threshold: float | None = None,
        stride_s: int | None = None,
        random_state: int = 0,
        group_aware: bool = True,
    ) -> None:
        if method not in BASELINE_METHODS:
            raise _unknown(method)
        self.method = method
        self.config = config or DetectorConfig()
        self.threshold = DEFAULT_THRESHOLDS[method] if threshold is None else float(threshold)
        if not math.isfinite(self.threshold):
            raise ValidationError(f"threshold is {threshold!r}: expected a finite number")
        self.stride_s = DEFAULT_STRIDES[method] if stride_s is None else int(stride_s)
        if self.stride_s < 1:
            raise ValidationError(f"stride_s is {stride_s!r}: expected a positive integer")
        self.random_state = random_state
        self.group_aware = group_aware
        self._layout: FeatureLayout | None = None
        self._last_scored: int | None = None
        self._skipped_logged = False
        # Per machine: first second of the current candidate run (_NEVER when none), last
        # second it was a candidate, and whether its current episode was alerted.
        self._run_start = np.zeros(0, dtype=np.int64)
        self._last_candidate = np.zeros(0, dtype=np.int64)
        self._alerted = np.zeros(0, dtype=bool)
        # Per machine, its largest |standardised feature| at the last scoring (MIN_DEVIATION).
        self._deviation = np.zeros(0)
        self.last_z = np.zeros(0)
        """Robust z of every machine at the last scoring evaluation (0 for machines not scored)."""
        self.scored_evaluations = 0
        """How many evaluations scored (fitted a model)."""

    # -- protocol ---------------------------------------------------------------------------
    @property
    def horizon_s(self) -> int:
        """Seconds of history the job window must keep."""
        return self.config.horizon_s

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        """``{method: (robust z per machine, -1 per machine)}``: no device is behind a score."""
        return {self.method: (self.last_z.tolist(), [-1] * self.last_z.size)}

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        """Score the job at ``now`` if a stride has passed; return the alerts that fire."""
        cfg = self.config
        if self._last_scored is not None and now - self._last_scored < self.stride_s:
            return []
        if self._last_scored is not None and now - self._last_scored > self.stride_s:
            # Evaluations were missed (a gap in the data): continuity was not observed.
            self._run_start[:] = _NEVER
        self._last_scored = now
        n = window.n_machines
        self._grow(n)
        if n < cfg.min_machines:
            if not self._skipped_logged:
                logger.info(
                    "job %s has %d machine(s): fewer than %d, so no peers to compare; the %s "
                    "baseline skips it",
                    window.job,
                    n,
                    cfg.min_machines,
                    self.method,
                )
                self._skipped_logged = True
            self._reset(n)
            return []
        if self._layout is None or self._layout.n_series != window.n_series:
            self._layout = feature_layout(window)
        features = build_features(window, now, self._layout, cfg, group_aware=self.group_aware)
        if features.machines.size < cfg.min_machines or features.features.size == 0:
            logger.debug(
                "job %s at %d: %d machine(s) with enough features, %d feature(s): not scored",
                window.job,
                now,
                features.machines.size,
                features.features.size,
            )
            self._reset(n)
            return []
        z_rows = robust_z(
            outlier_scores(self.method, features.values, self.random_state),
            SCORE_SCALE_FLOORS.get(self.method, 0.0),
        )
        self.scored_evaluations += 1
        z = np.zeros(n)
        z[features.machines] = np.nan_to_num(z_rows, nan=0.0)
        self.last_z = z
        deviation = np.zeros(n)
        deviation[features.machines] = np.abs(features.values).max(axis=1)
        self._deviation = deviation
        candidate = (z > self.threshold) & (deviation >= MIN_DEVIATION)
        return self._advance(window, now, candidate, features)

    # -- continuity and episodes ------------------------------------------------------------
    def _grow(self, n: int) -> None:
        old = self._run_start.size
        if n <= old:
            return
        self._run_start = np.concatenate([self._run_start, np.full(n - old, _NEVER)])
        self._last_candidate = np.concatenate([self._last_candidate, np.full(n - old, _NEVER)])
        self._alerted = np.concatenate([self._alerted, np.zeros(n - old, dtype=bool)])

    def _reset(self, n: int) -> None:
        """An evaluation that scores nobody breaks every run."""
        self._run_start[:] = _NEVER
        self.last_z = np.zeros(n)

    def _advance(
        self, window: JobWindow, now: int, candidate: np.ndarray, features: FeatureMatrix
    ) -> list[Alert]:
        cfg = self.config
        self._alerted &= now - self._last_candidate <= cfg.rearm_s
        self._run_start = np.where(
            candidate, np.where(self._run_start == _NEVER, now, self._run_start), _NEVER
        )
        self._last_candidate[candidate] = now
        # A run of candidate evaluations t0 < t1 < ... < now spans now - t0 + 1 seconds of data
        # whatever the stride (counting evaluations would need continuity_s strides).
        ready = candidate & ~self._alerted & (now - self._run_start + 1 >= cfg.continuity_s)
        alerts = []
        row_of = {int(m): r for r, m in enumerate(features.machines)}
        for m in np.flatnonzero(ready):
            self._alerted[m] = True
            alerts.append(self._alert(window, now, int(m), row_of[int(m)], features))
        return alerts

    def _alert(
        self, window: JobWindow, now: int, machine: int, row: int, features: FeatureMatrix
    ) -> Alert:
        assert self._layout is not None  # set before any scoring
        layout = self._layout
        values = features.values[row]
        order = np.argsort(-np.abs(values), kind="stable")[:3]
        top = [
            [
                layout.metrics[features.features[j]],
                layout.devices[features.features[j]],
                round(float(values[j]), 3),
            ]
            for j in order
        ]
        metric, device = top[0][0], top[0][1]
        z = float(self.last_z[machine])
        info = window.machines[machine]
        return Alert(
            job=window.job,
            machine=info.name,
            kind=AlertKind.SIMILARITY,
            metric=str(metric),
            score=z,
            first_ts=float(self._run_start[machine] - self.config.window_s // 2),
            detected_ts=float(now),
            devices=(str(device),) if device else (),
            domain=info.domain,
            evidence={
                "rule": None,
                "method": self.method,
                "z": round(z, 3),
                "threshold": self.threshold,
                "continuity_s": self.config.continuity_s,
                "stride_s": self.stride_s,
                "top_features": top,
                "peers": int(features.machines.size),
                "features": int(features.features.size),
                "missing_features": int(features.missing[row]),
                "group": info.group,
            },
        )


def baseline_factory(
    method: str, config: DetectorConfig | None = None, **kwargs: Any
) -> Callable[[], BaselineDetector]:
    """Factory of fresh :class:`BaselineDetector` instances (one per job).

    The arguments are checked at once, so a bad method fails before any data is read.
    """
    BaselineDetector(method, config, **kwargs)
    return lambda: BaselineDetector(method, config, **kwargs)
