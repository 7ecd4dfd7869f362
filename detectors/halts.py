"""Who stopped first: a machine apart from its peers shortly before the whole job halted.

A fail-stop fault (a GPU that hangs, a NIC that drops, a process that dies) often halts a
synchronous job seconds later: every rank waits in the next collective until the job gives up,
and then every machine idles alike. Peer similarity sees the faulty machine apart only between
the fault and the halt, often 8 to 16 samples, which at the agent's 1 s is shorter than the
25-30 evaluations a similarity alert needs. After the halt nothing tells the machines apart.

The order tells what the values cannot: the machine whose GPUs stood apart from their peers for
several evaluations *before* the job went idle is the one that stopped it (a dead GPU reads below
its peers; a hung one may read above them while they wait for it). When the job goes from
working to idle (most machines' peers read idle GPUs, :func:`detectors.scoring.gpu_activity`) and
stays idle (a lull of a few seconds is no halt), the machines that were apart from their peers
on a GPU activity metric or on power for at least ``lead`` evaluations, ending at most a window
before the halt, are named, provided they are few (the coherence allowance: a job that halts
when many machines had already fallen has no one culprit). A job that goes idle with nobody
ahead of it (a checkpoint, the end of the job, an evaluation pause) names nobody.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.scoring import GPU_ACTIVITY

LOW_METRICS: frozenset[str] = frozenset(GPU_ACTIVITY) | {"gpu_power_watts"}
"""Metrics on which a stopped or hung GPU stands apart from its working (or waiting) peers."""


@dataclass(frozen=True, slots=True)
class Culprit:
    """A machine that was below its peers before the job halted."""

    machine: int
    metric: str
    device: int
    z: float
    """Its largest z (signed) while it was ahead of the halt."""
    run: int
    """Evaluations it was apart from its peers before the halt."""
    end_tick: int
    """The last tick of that run."""


class HaltWatch:
    """Per machine, its latest run below its peers on :data:`LOW_METRICS`, and whether the job
    is working; names the machines ahead of a halt.

    Parameters
    ----------
    lead
        Evaluations a machine must have been below its peers, before the halt.
    memory
        How many ticks before the halt that run may have ended (the window mean needs a window
        to follow the peers down to idle: a machine already at 0 stops being apart from them
        before they read idle).
    worked
        Evaluations in a row a job must work before :attr:`last_working` counts it as a job
        that works (a fleet whose first windows read busy for a moment is not).
    confirm
        Evaluations the job must stay idle before it halted: the culprits are chosen when it
        goes idle and named once it stayed so; a lull that ends sooner (a data-loading phase,
        a short checkpoint) names nobody.
    """

    def __init__(self, lead: int, memory: int, confirm: int = 1, worked: int = 1) -> None:
        if lead < 1 or memory < 0 or confirm < 1 or worked < 1:
            raise ValueError(
                f"lead={lead!r}, memory={memory!r}, confirm={confirm!r}: expected lead >= 1, "
                "memory >= 0, confirm >= 1"
            )
        self.lead = lead
        self.memory = memory
        self.confirm = confirm
        self.worked = worked
        self._pending: list[Culprit] = []
        self._idle_for = 0
        self._working_for = 0
        self.last_working: int | None = None
        """The last tick at which the job had been working for ``worked`` evaluations in a row
        (None: never): a job that works, not a fleet whose busy share crossed half a moment."""
        self._run = np.zeros(0, dtype=np.int64)
        self._best: list[tuple[str, int, float] | None] = []
        self._last: list[Culprit | None] = []
        self._working = False
        self.just_halted = False
        """The last :meth:`update` saw the job go from working to idle."""

    def _grow(self, n: int) -> None:
        if self._run.shape[0] < n:
            extra = n - self._run.shape[0]
            self._run = np.concatenate([self._run, np.zeros(extra, dtype=np.int64)])
            self._best.extend([None] * extra)
            self._last.extend([None] * extra)

    def update(
        self,
        tick: int,
        low: list[tuple[str, np.ndarray, np.ndarray, float]],
        threshold: float,
        scored: np.ndarray,
        idle: np.ndarray,
        allowance: int,
        busy: np.ndarray,
    ) -> list[Culprit]:
        """Take one evaluation; return the culprits of a halt that began at ``tick``.

        ``low`` holds, per metric of :data:`LOW_METRICS` scored now, each machine's signed z at
        its most deviating device, that device, and the metric's threshold factor (a metric
        the priority model trusts less needs a larger z); ``idle`` and ``busy`` say whose peers'
        GPUs read idle, and whose work (:func:`detectors.scoring.gpu_activity`).
        """
        n = scored.shape[0]
        self._grow(n)
        lowest = np.zeros(n)  # the signed z of the most deviating metric, in thresholds
        which_metric = np.full(n, -1, dtype=np.int64)
        which_device = np.zeros(n, dtype=np.int64)
        for j, (_, z, device, factor) in enumerate(low):
            scaled = np.nan_to_num(z, nan=0.0) / factor
            better = np.abs(scaled) > np.abs(lowest)
            lowest[better] = scaled[better]
            which_metric[better] = j
            which_device[better] = device[better]
        below = scored & (np.abs(lowest) >= threshold)
        for m in np.flatnonzero(~below[:n] & (self._run[:n] > 0)).tolist():
            best = self._best[m]
            if best is not None:
                self._last[m] = Culprit(m, best[0], best[1], best[2], int(self._run[m]), tick - 1)
            self._best[m] = None
        self._run[:n] = np.where(below, self._run[:n] + 1, 0)
        for m in np.flatnonzero(below).tolist():
            best = self._best[m]
            if best is None or abs(lowest[m]) * low[int(which_metric[m])][3] > abs(best[2]):
                metric, _, _, factor = low[int(which_metric[m])]
                self._best[m] = (metric, int(which_device[m]), float(lowest[m]) * factor)
        in_job = int(scored.sum())
        # Working: most machines' peers' GPUs are known to work (not merely not known idle,
        # as while the first windows fill).
        working = in_job > 0 and int((busy[:n] & scored).sum()) * 2 > in_job
        halted = self._working and not working
        self.just_halted = halted
        self._working = working
        self._idle_for = 0 if working else self._idle_for + 1
        self._working_for = self._working_for + 1 if working else 0
        if self._working_for >= self.worked:
            self.last_working = tick
        if working:
            self._pending = []
        if halted:
            self._pending = self._ahead(n, tick, allowance)
        if self._pending and self._idle_for >= self.confirm:
            out, self._pending = self._pending, []
            return out
        return []

    @property
    def idle_for(self) -> int:
        """Evaluations the job has been idle (0 while it works)."""
        return self._idle_for

    def _ahead(self, n: int, tick: int, allowance: int) -> list[Culprit]:
        """The machines below their peers for ``lead`` evaluations as the job went idle."""
        culprits = []
        for m in range(n):
            best = self._best[m]
            if self._run[m] >= self.lead and best is not None:
                culprits.append(Culprit(m, best[0], best[1], best[2], int(self._run[m]), tick))
                continue
            last = self._last[m]
            if last is not None and last.run >= self.lead and tick - last.end_tick <= self.memory:
                culprits.append(last)
        return culprits if len(culprits) <= allowance else []
