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

    def __init__(self, severities: list[Severity]) -> None:
        if not severities:
            raise ValueError("severities is empty: expected at least one level")
        levels = sorted(severities, key=lambda s: s.min_z)
        self.severities = levels
        self._min_z = np.asarray([s.min_z for s in levels])
        self._seconds = np.asarray([s.seconds for s in levels], dtype=np.int64)
        self._runs: dict[str, np.ndarray] = {}
        self._peaks: dict[str, np.ndarray] = {}

    @property
    def threshold(self) -> float:
        """The mildest level: below it a machine is not an outlier."""
        return float(self._min_z[0])

    def _state(self, metric: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Run lengths ``(levels, machines)`` and run peaks ``(machines,)``, grown to ``n``.

        Both grow with the job's machines (a window never forgets one).
        """
        runs = self._runs.get(metric)
        if runs is None or runs.shape[1] < n:
            grown = np.zeros((len(self.severities), n), dtype=np.int64)
            peaks = np.zeros(n)
            if runs is not None:
                grown[:, : runs.shape[1]] = runs
                peaks[: runs.shape[1]] = self._peaks[metric]
            self._runs[metric], self._peaks[metric] = grown, peaks
        return self._runs[metric], self._peaks[metric]

    def update(
        self,
        metric: str,
        score: np.ndarray,
        scale: float = 1.0,
        lengths: tuple[int, ...] | None = None,
    ) -> Confirmed:
        """Advance ``metric`` by one evaluation with each machine's |z| ``score`` (NaN = not
        scored).

        ``scale`` multiplies every level (a metric the priority model trusts less needs a
        larger deviation); ``lengths`` replaces the levels' run lengths for this metric (one
        sampled more coarsely than the job needs longer runs). A missing score breaks the run:
        continuity means seen deviating.
        """
        n = score.shape[0]
        runs, peaks = self._state(metric, n)
        value = np.where(np.isfinite(score), score, 0.0)
        above = value[None, :] > (self._min_z * scale)[:, None]
        runs[:, :n] = np.where(above, runs[:, :n] + 1, 0)
        peaks[:n] = np.where(above[0], np.maximum(peaks[:n], value), 0.0)
        needed = self._seconds if lengths is None else np.asarray(lengths, dtype=np.int64)
        confirmed = (runs[:, :n] >= needed[:, None]).any(axis=0)
        machines = np.flatnonzero(confirmed)
        return Confirmed(machines, runs[0, machines].copy(), peaks[machines].copy())

    def reset(self) -> None:
        """Forget every run (the stream skipped seconds: nothing is continuous across a gap)."""
        self._runs.clear()
        self._peaks.clear()

    def run_length(self, metric: str, machine: int) -> int:
        """Seconds ``machine`` has been above the mildest level on ``metric``."""
        runs = self._runs.get(metric)
        if runs is None or machine >= runs.shape[1]:
            return 0
        return int(runs[0, machine])
