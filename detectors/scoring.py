"""Peer scores of denoised windows: the O(N) distance to the peers' median, and the paper's
pairwise Euclidean sum as the reference.

A *block* holds one bucket of metrics that share a device count: ``(machine, metric, device,
time)``. A metric's peers pool every device of every peer machine, so GPU 3 of one machine is
compared with all GPUs of its peers, and the score names the device that deviates.

Both scores end as a signed robust z: distance over a robust scale (1.4826 x the peers' median
distance, floored per unit and relative to the level), so one threshold serves jobs of 8 and of
10,000 machines. The sign says whether the machine reads above or below its peers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from detectors.config import (
    FAULT_BELOW_ONLY,
    IDLE_AT_ZERO,
    METRIC_REL_FLOORS,
    RISES_WITH_LOAD,
    metric_floor,
)
from detectors.window import JobWindow
from minder.core.metrics import MetricKind

NOT_SCORED: frozenset[str] = frozenset(
    {
        # Levels and bitmasks are handled by rules, not by distance to peers.
        "gpu_pcie_link_gen",
        "gpu_pcie_link_width",
        "rdma_port_up",
        "gpu_throttle_reasons",
        # A rank paused on purpose (rank 0 writing a checkpoint) is no outlier.
        "train_paused_seconds",
        # Per-step observations, held between steps: one slow step would read as a deviation
        # lasting a whole step's worth of samples. The straggler detector judges them step by
        # step (docs/detection-method.md §9).
        "train_step_seconds",
        "train_busy_seconds",
        # What a host's processes allocated: software state that follows the job's processes,
        # not the machine (a leak, a bigger cache), and no machine fault shows there first.
        "memory_used_bytes",
    }
)
"""Metrics the peer comparison does not score (docs/detection-method.md §12). They stay in the
window, on the dashboards and in the rules."""
MAD_TO_SIGMA = 1.4826
_PAIRWISE_CHUNK = 512


@dataclass(frozen=True, slots=True)
class ScoreBucket:
    """Scored metrics that share a device count: ``columns[metric, device]`` series indices."""

    metrics: list[str]
    columns: np.ndarray
    floors: np.ndarray
    idle_at_zero: np.ndarray
    """Per metric: an activity that reads 0 when idle (:data:`detectors.config.IDLE_AT_ZERO`)."""
    with_load: np.ndarray
    """Per metric: it rises with load (:data:`detectors.config.RISES_WITH_LOAD`)."""
    below_only: np.ndarray
    """Per metric: only a deviation below the peers is a fault
    (:data:`detectors.config.FAULT_BELOW_ONLY`)."""
    rel_floors: np.ndarray
    """Per metric: its own relative scale floor, 0 where the detector's applies
    (:data:`detectors.config.METRIC_REL_FLOORS`)."""


@dataclass(frozen=True, slots=True)
class ScoreLayout:
    """How the window's series are scored; rebuilt when new series appear."""

    n_series: int
    buckets: list[ScoreBucket]
    all_cols: np.ndarray


@dataclass(frozen=True, slots=True)
class BlockScores:
    """Scores of one block: ``z`` per ``(machine, metric, device)``; per ``(machine, metric)``
    the peers' median level and the scale the machine was compared with."""

    z: np.ndarray
    medians: np.ndarray
    scales: np.ndarray


def score_layout(window: JobWindow) -> ScoreLayout:
    """Bucket the window's scored metrics by device count, so each bucket is one numpy block.

    Counts go to the rules; levels and bitmasks (:data:`NOT_SCORED`) too.
    """
    by_metric: dict[str, list[int]] = {}
    for i, (metric, _) in enumerate(window.series):
        spec = window.series_spec[i]
        if spec.kind is MetricKind.COUNT or metric in NOT_SCORED:
            continue
        by_metric.setdefault(metric, []).append(i)
    by_width: dict[int, list[str]] = {}
    for metric, cols in by_metric.items():
        by_width.setdefault(len(cols), []).append(metric)
    buckets = []
    for metrics in by_width.values():
        columns = np.asarray([by_metric[m] for m in metrics], dtype=np.int64)
        floors = np.asarray(
            [metric_floor(m, window.series_spec[by_metric[m][0]].unit) for m in metrics]
        )
        idle_at_zero = np.asarray([m in IDLE_AT_ZERO for m in metrics], dtype=bool)
        with_load = np.asarray([m in RISES_WITH_LOAD for m in metrics], dtype=bool)
        below_only = np.asarray([m in FAULT_BELOW_ONLY for m in metrics], dtype=bool)
        rel_floors = np.asarray([METRIC_REL_FLOORS.get(m, 0.0) for m in metrics])
        buckets.append(
            ScoreBucket(metrics, columns, floors, idle_at_zero, with_load, below_only, rel_floors)
        )
    all_cols = (
        np.concatenate([b.columns.ravel() for b in buckets])
        if buckets
        else np.zeros(0, dtype=np.int64)
    )
    return ScoreLayout(window.n_series, buckets, all_cols)


def peer_comparisons(
    window: JobWindow, min_group: int, active: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(machines, their peers)`` pairs: each group against itself, small groups against all.

    ``active`` (a mask of machines) leaves out machines that are not in the job (never reported,
    or left): they are neither compared nor peers, and a group counts only its members in it.
    """
    keep = np.ones(window.n_machines, dtype=bool) if active is None else active
    everyone = np.flatnonzero(keep)
    by_label: dict[str, list[int]] = {}
    for i, info in enumerate(window.machines):
        if keep[i]:
            by_label.setdefault(info.group, []).append(i)
    if len(by_label) == 1:
        return [(everyone, everyone)]
    pairs = []
    small: list[int] = []
    for members in by_label.values():
        if len(members) >= min_group:
            group = np.asarray(members)
            pairs.append((group, group))
        else:
            small.extend(members)
    if small:
        pairs.append((np.asarray(sorted(small)), everyone))
    return pairs


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN (NaN for an all-NaN row).

    ``np.nanmedian`` along an axis goes through masked arrays and costs ~50x more on the small
    blocks scored every second.
    """
    ordered = np.sort(values, axis=1)  # NaN sorts last
    count = np.isfinite(values).sum(axis=1)
    low = np.clip((count - 1) // 2, 0, None)
    high = np.clip(count // 2, 0, None)
    rows = np.arange(values.shape[0])
    median = (ordered[rows, low] + ordered[rows, np.minimum(high, values.shape[1] - 1)]) / 2
    return np.where(count > 0, median, np.nan)


def _scale(
    spread: np.ndarray, level: np.ndarray, rel_floor: float | np.ndarray, floors: np.ndarray
) -> np.ndarray:
    return np.maximum(np.maximum(MAD_TO_SIGMA * spread, rel_floor * np.abs(level)), floors)


def median_scores(
    block: np.ndarray,
    comparisons: list[tuple[np.ndarray, np.ndarray]],
    rel_floor: float | np.ndarray,
    floors: np.ndarray,
    own_block: np.ndarray | None = None,
) -> BlockScores:
    """O(N) scores of ``block[machine, metric, device, time]`` against the peers' median window.

    Each machine-device's distance to the peers' median window is the RMS over time of the
    difference; the scale is the peers' median distance (a MAD when the window is one value).
    Missing values are skipped: a window is scored on the samples present, and a series a
    machine never reports stays NaN (never an outlier). Work is proportional to each
    comparison's machines, so many small groups cost no more than one big one.

    ``own_block`` (same shape), when given, is what each machine is judged by, while the peers'
    median and scale come from ``block``: the phase-tolerant means of
    :func:`lag_tolerant_means` judge a machine at its best lag, but its peers' spread is taken
    at lag 0, so choosing a lag never narrows the scale.
    """
    n, k, width, w = block.shape
    z = np.full((n, k, width), np.nan)
    medians = np.full((n, k), np.nan)
    scales = np.full((n, k), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # metrics nobody reported stay NaN
        for targets, members in comparisons:
            peers = block[members]
            pooled = peers.transpose(1, 3, 0, 2).reshape(k * w, -1)  # (metric, time), points
            center = row_nanmedian(pooled).reshape(k, w)
            peer_dist, _ = _distance(peers, center)
            flat = peer_dist.transpose(1, 0, 2).reshape(k, -1)
            enough = np.isfinite(flat).sum(axis=1) >= 3
            if not enough.any():
                continue
            spread = row_nanmedian(flat)
            level = np.nanmean(center, axis=1)
            scale = _scale(spread, level, rel_floor, floors)
            if own_block is not None:
                own = own_block[targets]
            else:
                own = peers if targets is members else block[targets]
            dist, sign = _distance(own, center)
            zt = np.where(sign == 0, 1.0, sign) * dist / scale[None, :, None]
            zt[:, ~enough, :] = np.nan
            z[targets] = zt
            medians[targets] = np.where(enough, level, np.nan)
            scales[targets] = scale
    return BlockScores(z, medians, scales)


def _distance(block: np.ndarray, center: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RMS distance over the present samples of each ``(machine, metric, device)`` window to
    ``center[metric, time]``, and the sign of the mean difference."""
    diff = block - center[None, :, None, :]
    present = np.isfinite(diff)
    counts = present.sum(axis=3)
    filled = np.where(present, diff, 0.0)
    dist = np.where(
        counts > 0, np.sqrt((filled * filled).sum(axis=3) / np.maximum(counts, 1)), np.nan
    )
    return dist, np.sign(filled.sum(axis=3))


def pairwise_scores(
    block: np.ndarray,
    comparisons: list[tuple[np.ndarray, np.ndarray]],
    rel_floor: float | np.ndarray,
    floors: np.ndarray,
) -> BlockScores:
    """The paper's reference: each machine-device's mean Euclidean distance to every peer's
    window (O(N^2) per metric), as a robust z against the peers' own mean distances.

    Missing samples are filled with the window's mean of present samples before distances
    are taken; a series with nothing present stays NaN. Only distances above the peers'
    median count (a machine closer to everyone than usual is no outlier); the sign says
    whether its level is above or below the peers'.
    """
    n, k, width, w = block.shape
    z = np.full((n, k, width), np.nan)
    medians = np.full((n, k), np.nan)
    scales = np.full((n, k), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # series never reported stay NaN
        means = np.nanmean(block, axis=3, keepdims=True)
        filled = np.where(np.isfinite(block), block, means)
        for targets, members in comparisons:
            peers = filled[members].transpose(1, 0, 2, 3).reshape(k, -1, w)  # metric, point, t
            peer_valid = np.isfinite(peers[..., 0])
            peer_scores = _mean_distances(peers, peers, peer_valid)
            if np.array_equal(targets, members):
                own_scores = peer_scores
            else:
                own = filled[targets].transpose(1, 0, 2, 3).reshape(k, -1, w)
                own_scores = _mean_distances(own, peers, peer_valid)
            enough = np.isfinite(peer_scores).sum(axis=1) >= 3
            center = row_nanmedian(peer_scores)
            # The scale of the values themselves (as median_scores): the spread of mean pairwise
            # distances is nearly flat and would shrink as jobs grow.
            pooled = filled[members].transpose(1, 3, 0, 2).reshape(k * w, -1)
            median_window = row_nanmedian(pooled).reshape(k, w)
            peer_dist, _ = _distance(filled[members], median_window)
            spread = row_nanmedian(peer_dist.transpose(1, 0, 2).reshape(k, -1))
            level = row_nanmedian(means[members, :, :, 0].transpose(1, 0, 2).reshape(k, -1))
            scale = _scale(spread, level, rel_floor, floors)
            excess = np.maximum(own_scores - center[:, None], 0.0)  # metric, target point
            excess = excess.reshape(k, targets.size, width).transpose(1, 0, 2)
            sign = np.sign(means[targets, :, :, 0] - level[None, :, None])
            zt = np.where(sign == 0, 1.0, sign) * excess / scale[None, :, None]
            zt[:, ~enough, :] = np.nan
            z[targets] = zt
            medians[targets] = np.where(enough, level, np.nan)
            scales[targets] = scale
    return BlockScores(z, medians, scales)


def _mean_distances(points: np.ndarray, peers: np.ndarray, peer_valid: np.ndarray) -> np.ndarray:
    """``(metric, point)`` mean RMS distance of each point's window to the valid peers'.

    Chunked so the ``(chunk x peers)`` distance matrices stay small; a point with nothing
    present is NaN.
    """
    w = points.shape[2]
    points_valid = np.isfinite(points[..., 0])
    a = np.where(points_valid[..., None], points, 0.0)
    b = np.where(peer_valid[..., None], peers, 0.0)
    b_sq = (b * b).sum(axis=2)
    total = np.zeros(a.shape[:2])
    for start in range(0, a.shape[1], _PAIRWISE_CHUNK):
        part = a[:, start : start + _PAIRWISE_CHUNK]
        # |a-b|^2 = |a|^2 + |b|^2 - 2ab, one (chunk x peers) matrix per metric.
        sq = (part * part).sum(axis=2)[:, :, None] + b_sq[:, None, :]
        sq -= 2 * np.einsum("kct,kpt->kcp", part, b)
        dist = np.sqrt(np.maximum(sq, 0.0) / w)
        total[:, start : start + _PAIRWISE_CHUNK] = (dist * peer_valid[:, None, :]).sum(axis=2)
    # A point among its own peers is at distance 0 from itself: average over the others.
    count = np.maximum(peer_valid.sum(axis=1) - 1, 1)[:, None]
    return np.where(points_valid, total / count, np.nan)


def above_idle_peers(
    result: BlockScores, bucket: ScoreBucket, idle_gpus: np.ndarray | None = None
) -> np.ndarray:
    """``(machine, metric, device)``: scored above peers that sit idle.

    A machine's peers are idle on a metric of :data:`detectors.config.IDLE_AT_ZERO` when their
    median level is within the metric's floor of 0; ``idle_gpus`` (per machine, from
    :func:`gpu_activity`) says its peers' GPUs idle, which covers the metrics that rise with load
    without reading 0 when idle (power, clocks, temperature). Then there is no busy reference
    to fall short of: reading above idle peers (a serving pod taking requests) is no fault
    signal. Reading below them still is, and so is a congestion counter (PFC pauses, CNPs)
    above quiet peers. The engine does not apply this to a job that was working a moment ago:
    there, a machine still busy while the rest halted is a suspect (a hung kernel).
    """
    with np.errstate(invalid="ignore"):
        idle = (result.medians <= bucket.floors[None, :]) & bucket.idle_at_zero[None, :]
        if idle_gpus is not None:
            idle = idle | (idle_gpus[:, None] & bucket.with_load[None, :])
        return idle[:, :, None] & (result.z > 0)


GPU_ACTIVITY: tuple[str, ...] = (
    "gpu_util_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_gr_engine_active_ratio",
)
"""What says a GPU works: when a machine's peers read idle on these, its GPUs have no busy
reference on any metric."""
IDLE_GPU_LEVEL = 0.05
"""A GPU activity ratio at or below this is idle: an idle GPU still runs monitoring and
housekeeping kernels for a few percent of the time (a serving pod between requests)."""


def gpu_activity(
    results: list[tuple[ScoreBucket, BlockScores]], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per machine: whether its peers' GPUs sit idle, and whether they work.

    Idle: on every :data:`GPU_ACTIVITY` metric the job reports the peers' median is at most
    :data:`IDLE_GPU_LEVEL`. Every one, not any: while the host feeds the GPUs (a data-loading
    phase of each step) tensor activity reads 0 but the GPUs still run kernels. Working: one
    such median above it. Neither holds while no median is known yet (the first windows)."""
    seen = np.zeros(n, dtype=bool)
    busy = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        for bucket, result in results:
            for j, metric in enumerate(bucket.metrics):
                if metric in GPU_ACTIVITY:
                    level = result.medians[:, j]
                    known = np.isfinite(level)
                    seen |= known
                    busy |= known & (level > max(bucket.floors[j], IDLE_GPU_LEVEL))
    return seen & ~busy, busy


def lag_tolerant_means(
    values: np.ndarray, comparisons: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """Window means of ``values[time, machine, series]`` (``w + 1`` samples, the oldest only
    for the lag) judged instant by instant, tolerating one sample of phase offset.

    At coarse sampling a scrape reads gauges at one instant of the training step. While the
    whole job moves between the step's phases, a machine whose clock or scrape is a moment
    ahead or behind reads its peers' previous or next sample: that is no fault. Each machine's
    deviation from its peers' per-instant median (per series, over its comparison's members)
    is averaged over the window at the lag (-1, 0 or +1 sample) that fits it best (the smallest
    mean absolute deviation; never further from its peers than at lag 0), and the
    window's level is added back, so the result is in units and, at lag 0 with every sample
    present, equals the window mean. A fault does not fit its peers at any lag: a machine at
    1/8 of its peers' traffic, or stuck in one phase while they alternate, stays apart.

    Returns the means at lag 0 (the peers' reference and spread) and at each machine's best
    lag (what it is judged by): the best of three lags is closer to 0 than one lag, so taking
    the spread from it would narrow the scale and call noise a fault.
    """
    t, n, c = values.shape
    out = np.full((n, c), np.nan)
    plain = np.full((n, c), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # series nobody reported stay NaN
        for targets, members in comparisons:
            peers = values[:, members, :].transpose(0, 2, 1).reshape(t * c, -1)
            center = row_nanmedian(peers).reshape(t, 1, c)
            own = values[:, targets, :]
            gaps = (
                own[1:] - center[1:],  # in step with its peers
                own[1:] - center[:-1],  # a sample behind them
                own[:-1] - center[1:],  # a sample ahead of them
            )
            lags = np.stack([np.nanmean(gap, axis=0) for gap in gaps])
            # The lag that fits is the one whose samples lie closest to the peers', not the one
            # whose deviations cancel: as a job halts when a machine fails, the machine's last
            # working sample read against its peers' first halted one would offset its
            # deviation at the lag ahead, and hide the fault for a window.
            fit = np.stack([np.nanmean(np.abs(gap), axis=0) for gap in gaps])
            size = np.where(np.isfinite(fit), fit, np.inf)
            size[1:] *= 1.0 + 1e-9  # ties keep lag 0
            best = np.take_along_axis(lags, size.argmin(axis=0)[None], axis=0)[0]
            # A lag may excuse, never accuse: no machine is judged further from its peers than
            # in step with them (a noisy machine among peers that ramp could fit a lag best).
            best = np.where(np.abs(best) > np.abs(lags[0]), lags[0], best)
            level = np.nanmean(center[1:, 0, :], axis=0)[None, :]
            out[targets] = level + best
            plain[targets] = level + lags[0]
    return plain, out
