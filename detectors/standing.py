"""Machines that were apart from their peers from the moment they were first scored
(docs/detection-method.md §11).

Real fleets are not cut from one block. One host runs an extra daemon, one sits behind a busier
switch port, one runs its data loader with more workers: its CPU use, memory or pause frames
stand apart from its peers' on the day it joins, and stay apart for hours while nothing is
wrong. Peer similarity reads such a machine as an outlier at every evaluation and, after the
continuity run, names it: a false alarm at the start of every job it is in.

A fault is a *change*: a machine that was with its peers and left them. So each machine keeps,
per metric and device, its *standing offset*: the mean signed score of its first evaluations
(the continuity run at the job's cadence), kept only when *every* one of those evaluations was
scored and apart (``|z| >= threshold``, half the alert threshold) on the same side. A fault that
strikes during the first run is a change within it, not a standing offset. From then on, that
machine is judged by how far it moves beyond its standing offset, on the same side; moving back
towards its peers is never a deviation, and a move to the other side is judged as usual. A
machine that was with its peers when first scored has no offset and is judged as every other.

Two bounds keep a broken machine from hiding behind it:

* a deviation of the severe level (a dead process, an idle GPU among busy ones) is never an
  offset: a machine that starts the job broken is named as before. On the metrics of the work a
  machine does (utilisation, throughput, clocks, power) the side matters: a machine that does
  *less* than its peers from the start keeps no offset from half the severe level on (under the
  job's phase swings a dead GPU scores about there), and one that does *more* (its samples fall
  in another phase of the step, it serves more) is not the broken one, at any level;
* the offset is fixed once, at the end of the first run, and kept when the job's sampling
  interval changes: a machine that drifts further later is judged by the distance it moved.

What it trades away: a mild fault already present when a machine is first scored (below the
severe level) is not a similarity alert; the hard-fault rules still judge it. The offsets are
in score units, so they keep every invariance the scores keep (renaming and reordering, common
factors, shifts, units) and are measured at whatever cadence the job is sampled at.
"""

from __future__ import annotations

import numpy as np

_NEVER = np.iinfo(np.int64).min // 2
_DONE = _NEVER + 1
"""A machine whose first run is over (or was abandoned at a change of tick): never in it again."""


class StandingOffsets:
    """Per metric, each machine's (and device's) standing offset from its peers.

    Parameters
    ----------
    threshold
        A machine is born apart only if every score of its first evaluations is at least this
        far from zero, on one side.
    severe
        Offsets at or beyond this level are not kept: such a machine is broken, not different.
    birth_ticks
        How many evaluations the standing offset is measured over (the continuity run, so that
        a machine apart from the start can never be confirmed before its offset is known).
    """

    def __init__(self, threshold: float, severe: float, birth_ticks: int) -> None:
        if not 0 < threshold <= severe or birth_ticks < 1:
            raise ValueError(
                f"threshold={threshold!r}, severe={severe!r}, birth_ticks={birth_ticks!r}: "
                "expected 0 < threshold <= severe and at least one evaluation"
            )
        self.threshold = threshold
        self.severe = severe
        self.birth_ticks = birth_ticks
        self._first = np.zeros(0, dtype=np.int64)
        self._parts: dict[str, tuple[np.ndarray, ...]] = {}

    def born(self, scored: np.ndarray, tick: int) -> None:
        """Note the scored machines; call once per evaluation, before :meth:`apply`."""
        n = scored.shape[0]
        if self._first.shape[0] < n:
            grown = np.full(n, _NEVER, dtype=np.int64)
            grown[: self._first.shape[0]] = self._first
            self._first = grown
        first = self._first[:n]
        first[(first == _NEVER) & scored] = tick

    def rebase(self, birth_ticks: int) -> None:
        """The job's tick changed (a new sampling interval): ticks are counted anew. Offsets
        already measured are kept (they are in score units); a first run still in progress is
        abandoned without an offset, the cautious side."""
        if birth_ticks < 1:
            raise ValueError(f"birth_ticks={birth_ticks!r}: expected at least one evaluation")
        self.birth_ticks = birth_ticks
        self._first[self._first != _NEVER] = _DONE

    def offset(self, metric: str, machine: int, device: int) -> float:
        """One machine's and device's standing offset on ``metric`` (0 where none)."""
        held = self.offsets(metric)
        if held is None or machine >= held.shape[0] or device >= held.shape[1]:
            return 0.0
        return float(held[machine, device])

    def offsets(self, metric: str) -> np.ndarray | None:
        """The standing offsets of ``metric`` (``(machines, devices)``, 0 where none), if any."""
        parts = self._parts.get(metric)
        return None if parts is None else parts[4]

    def apply(
        self,
        metric: str,
        z: np.ndarray,
        scored: np.ndarray,
        tick: int,
        *,
        work: bool = False,
    ) -> None:
        """Measure and subtract standing offsets of ``metric`` in place.

        ``z`` holds the signed scores ``(machines, devices)`` of this evaluation (NaN: not
        scored), ``scored`` the machines in the job and scored. ``work``: the metric measures
        the work a machine does (:data:`detectors.config.FAULT_BELOW_ONLY`: utilisation,
        throughput, clocks, power), where doing less is the fault side. A machine *below* its
        peers from its first evaluation keeps no offset from half the severe level on (a GPU
        idle from the start scores about there when the job's phases swing every sample); one
        *above* them keeps its offset whatever its level.
        """
        n, width = z.shape
        total, nearest, farthest, sign, offset = self._state(metric, n, width)
        first = self._first[:n]
        age = np.where(first == _NEVER, -1, np.where(first == _DONE, self.birth_ticks + 1, 0))
        age = np.where(age == 0, tick - first + 1, age)
        birth = scored[:n] & (age >= 1) & (age <= self.birth_ticks)
        if birth.any():
            seen = z[birth]
            # A score missing during the first run says nothing steady: the sum turns NaN.
            total[birth] += seen
            nearest[birth] = np.fmin(nearest[birth], np.where(np.isnan(seen), 0.0, np.abs(seen)))
            farthest[birth] = np.fmax(farthest[birth], np.abs(seen))
            sign[birth] += np.sign(seen)
            ends = birth & (age == self.birth_ticks)
            if ends.any():
                mean = total[ends] / self.birth_ticks
                # The offset is the farthest the machine stood in its first run: a machine apart
                # by a steady ratio still scores more at one phase of the step than at another
                # (its peers' spread is not the same at every phase), and only a move beyond the
                # whole of its first-run range is a change.
                held = np.sign(mean) * farthest[ends]
                steady = (nearest[ends] >= self.threshold) & (
                    np.abs(sign[ends]) == self.birth_ticks
                )
                too_far = np.abs(mean) >= self.severe
                if work:
                    # Doing less is the fault side: broken at half the severe level (under the
                    # job's phase swings a dead GPU scores about there); doing more, never.
                    too_far = (mean < 0) & (np.abs(mean) >= self.severe / 2)
                held[~steady | too_far] = 0.0
                offset[ends] = held
        if not offset.any():
            return
        view = z[: offset.shape[0]]
        same = np.sign(view) == np.sign(offset)
        same &= offset != 0
        if same.any():
            beyond = np.maximum(np.abs(view[same]) - np.abs(offset[same]), 0.0)
            view[same] = np.sign(view[same]) * beyond

    def _state(
        self, metric: str, n: int, width: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Sum, nearest and farthest |z| from zero and sum of signs over the first run, and the
        offsets."""
        parts = self._parts.get(metric)
        if parts is None or parts[0].shape != (n, width):
            fills = (0.0, np.inf, 0.0, 0.0, 0.0)
            grown = tuple(np.full((n, width), fill) for fill in fills)
            if parts is not None:
                rows, cols = min(n, parts[0].shape[0]), min(width, parts[0].shape[1])
                for new, old in zip(grown, parts, strict=True):
                    new[:rows, :cols] = old[:rows, :cols]
            self._parts[metric] = grown
        total, nearest, farthest, sign, offset = self._parts[metric]
        return total, nearest, farthest, sign, offset
