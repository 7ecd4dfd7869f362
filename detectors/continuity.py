"""Continuity computed incrementally as the stream advances, with per-severity durations.

Minder re-scans 15 minutes of windows every 8 minutes and asks for one machine to stay the top
outlier for 4 minutes. Here each (metric, machine) keeps the length of its current run above
threshold and the peak score of that run, updated once per second in O(N): nothing is re-scanned.
A severe deviation (a process that died: utilisation at zero) is confirmed sooner than a mild one
(a slow link), because the longer wait buys nothing there but latency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Severity:
    """A |z| level and how many consecutive seconds above it confirm a culprit."""

    min_z: float
    seconds: int

    def __post_init__(self) -> None:
        if self.min_z <= 0 or self.seconds < 1:
            raise ValueError(
                f"severity (min_z={self.min_z!r}, seconds={self.seconds!r}): expected min_z > 0 "
                "and at least 1 second"
            )


@dataclass(slots=True)
class Confirmed:
    """Machines of one metric whose run is long enough at this second."""

    machines: np.ndarray
    run_s: np.ndarray
    peak: np.ndarray


class ContinuityTracker:
    """Run lengths per metric and machine; call :meth:`update` once per second per metric.

    Parameters
    ----------
    severities
        Levels from mild to severe (increasing ``min_z``); a machine is confirmed when, for
        any level, it has stayed above ``min_z`` for ``seconds`` consecutive seconds.
    """

    def __init__(self, severities: list[Severity], memory: int = 0) -> None:
        if not severities:
            raise ValueError("severities is empty: expected at least one level")
        if memory < 0:
            raise ValueError(f"memory is {memory!r}: expected 0 or more evaluations")
        levels = sorted(severities, key=lambda s: s.min_z)
        self.severities = levels
        self.memory = memory
        """Evaluations a finished run is kept for :meth:`runs` (the largest of those that
        ended within it)."""
        self._min_z = np.asarray([s.min_z for s in levels])
        self._seconds = np.asarray([s.seconds for s in levels], dtype=np.int64)
        self._runs: dict[str, np.ndarray] = {}
        self._peaks: dict[str, np.ndarray] = {}
        self._sums: dict[str, np.ndarray] = {}
        self._count: dict[str, int] = {}
        """Per metric, evaluations so far."""
        self._ended: dict[str, np.ndarray] = {}
        """Per metric, ``(4, machines)``: the finished run kept for each machine (the largest
        sum of |z| of those that ended within ``memory``), its peak and sum of |z|, and the
        evaluation count of its last evaluation above the level (NaN: none)."""

    @property
    def threshold(self) -> float:
        """The mildest level: below it a machine is not an outlier."""
        return float(self._min_z[0])

    def _state(self, metric: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Run lengths ``(levels, machines)``, and the mildest level's run peaks and sums of
        |z| ``(machines,)``, grown to ``n``.

        All grow with the job's machines (a window never forgets one).
        """
        runs = self._runs.get(metric)
        if runs is None or runs.shape[1] < n:
            grown = np.zeros((len(self.severities), n), dtype=np.int64)
            peaks, sums = np.zeros(n), np.zeros(n)
            if runs is not None:
                grown[:, : runs.shape[1]] = runs
                peaks[: runs.shape[1]] = self._peaks[metric]
                sums[: runs.shape[1]] = self._sums[metric]
            self._runs[metric], self._peaks[metric], self._sums[metric] = grown, peaks, sums
        return self._runs[metric], self._peaks[metric], self._sums[metric]

    def update(
        self,
        metric: str,
        score: np.ndarray,
        scale: float | np.ndarray = 1.0,
        lengths: tuple[int, ...] | None = None,
    ) -> Confirmed:
        """Advance ``metric`` by one evaluation with each machine's |z| ``score`` (NaN = not
        scored).

        ``scale`` multiplies every level (a metric the priority model trusts less needs a
        larger deviation), or each level by its own factor (one per level); ``lengths`` replaces
        the levels' run lengths for this metric (one sampled more coarsely than the job needs
        longer runs). A missing score breaks the run: continuity means seen deviating.
        """
        n = score.shape[0]
        runs, peaks, sums = self._state(metric, n)
        value = np.where(np.isfinite(score), score, 0.0)
        above = value[None, :] > (self._min_z * scale)[:, None]
        count = self._count.get(metric, 0) + 1
        self._count[metric] = count
        ends = ~above[0] & (runs[0, :n] > 0)
        if ends.any() and self.memory > 0:
            ended = self._ended_of(metric, n)
            kept = ended[:, :n]
            stale = ~(count - kept[3] <= self.memory)  # NaN (none kept) is stale too
            keep = ends & (stale | (sums[:n] >= kept[2]))
            finished = np.stack([runs[0, :n], peaks[:n], sums[:n], np.full(n, float(count - 1))])
            ended[:, :n] = np.where(keep, finished, kept)
        runs[:, :n] = np.where(above, runs[:, :n] + 1, 0)
        peaks[:n] = np.where(above[0], np.maximum(peaks[:n], value), 0.0)
        sums[:n] = np.where(above[0], sums[:n] + value, 0.0)
        needed = self._seconds if lengths is None else np.asarray(lengths, dtype=np.int64)
        confirmed = (runs[:, :n] >= needed[:, None]).any(axis=0)
        machines = np.flatnonzero(confirmed)
        return Confirmed(machines, runs[0, machines].copy(), peaks[machines].copy())

    def reset(self) -> None:
        """Forget every run (the stream skipped seconds: nothing is continuous across a gap)."""
        self._runs.clear()
        self._peaks.clear()
        self._sums.clear()
        self._count.clear()
        self._ended.clear()

    def _ended_of(self, metric: str, n: int) -> np.ndarray:
        ended = self._ended.get(metric)
        if ended is None or ended.shape[1] < n:
            grown = np.full((4, n), np.nan)
            if ended is not None:
                grown[:, : ended.shape[1]] = ended
            self._ended[metric] = ended = grown
        return ended

    def runs(
        self, metric: str, n: int, within: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For the first ``n`` machines on ``metric``: a run above the mildest level
        (evaluations), its peak |z|, its sum of |z| and how many evaluations before the latest
        its last one above the level was (zeros where none).

        The run is the current one; with ``within``, the finished run kept for the machine
        instead when its last evaluation above the level was at most ``within`` evaluations
        before the latest one and its sum is the larger (one flicker above the level after a
        long run does not hide that run)."""
        out = (np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64))
        runs = self._runs.get(metric)
        if runs is None:
            return out
        k = min(n, runs.shape[1])
        out[0][:k] = runs[0, :k]
        out[1][:k] = self._peaks[metric][:k]
        out[2][:k] = self._sums[metric][:k]
        ended = self._ended.get(metric)
        if within > 0 and ended is not None:
            k = min(k, ended.shape[1])
            kept = ended[:, :k]
            ago = self._count[metric] - kept[3]
            use = (ago <= within) & (kept[2] > out[2][:k])  # NaN compares False
            out[0][:k] = np.where(use, kept[0], out[0][:k]).astype(np.int64)
            out[1][:k] = np.where(use, kept[1], out[1][:k])
            out[2][:k] = np.where(use, kept[2], out[2][:k])
            out[3][:k] = np.where(use, np.nan_to_num(ago), 0).astype(np.int64)
        return out

    def run_length(self, metric: str, machine: int) -> int:
        """Seconds ``machine`` has been above the mildest level on ``metric``."""
        runs = self._runs.get(metric)
        if runs is None or machine >= runs.shape[1]:
            return 0
        return int(runs[0, machine])
