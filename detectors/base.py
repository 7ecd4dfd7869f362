"""The interface every streaming detector follows, so the service can swap engines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from detectors.window import JobWindow
from minder.core.alert import Alert

if TYPE_CHECKING:
    from detectors.straggler import LateRank
    from minder.core.hang import HangAnalysis


class JobDetector(Protocol):
    """Detector of one job, evaluated once per second of data in increasing order."""

    @property
    def horizon_s(self) -> int:
        """Seconds of history the job window must keep for this detector."""
        ...

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        """Alerts that fire at second ``now`` (each fault once per episode)."""
        ...

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        """Per metric, the latest per-machine score and the device index behind it."""
        ...


DetectorFactory = Callable[[], JobDetector]
"""Builds a fresh detector for a new job."""


class CompositeDetector:
    """Several detectors of one job behind one :class:`JobDetector` (the peer engine and the
    straggler detector): the longest horizon, every part's alerts, every part's scores."""

    def __init__(self, parts: Sequence[JobDetector]) -> None:
        if not parts:
            raise ValueError("parts is empty: expected at least one detector")
        self.parts = list(parts)

    @property
    def horizon_s(self) -> int:
        return max(part.horizon_s for part in self.parts)

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        out: list[Alert] = []
        for part in self.parts:
            out.extend(part.evaluate(window, now))
        return out

    def finish(self, window: JobWindow, now: int) -> list[Alert]:
        """The job's data ended at second ``now``: every part's alerts of its end
        (:func:`finish_of`)."""
        out: list[Alert] = []
        for part in self.parts:
            out.extend(finish_of(part, window, now))
        return out

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        out: dict[str, tuple[list[float], list[int]]] = {}
        for part in self.parts:
            out.update(part.machine_scores())
        return out

    @property
    def live_slowdown(self) -> float | None:
        """The job's live slowdown S, when a part measures it."""
        for part in self.parts:
            value = getattr(part, "live_slowdown", None)
            if value is not None:
                return float(value)
        return None

    def job_findings(self) -> list[dict[str, Any]]:
        """What the parts found about the job as a whole (metrics on which its machines are
        not peers, a job too small to have peers): see
        :meth:`detectors.engine.MinderDetector.job_findings`."""
        return job_findings_of(self.parts)

    def hang_analysis(self) -> HangAnalysis | None:
        """The newest hang analysis of the parts that make one
        (:meth:`detectors.hang_watch.HangDetector.hang_analysis`), if any."""
        found = [
            a
            for a in (getattr(part, "hang_analysis", lambda: None)() for part in self.parts)
            if a is not None
        ]
        return max(found, key=lambda a: a.analysed_ts) if found else None

    def late_ranks(self, k: int) -> list[LateRank]:
        """The job's ``k`` latest ranks, when a part measures lateness."""
        for part in self.parts:
            late_ranks = getattr(part, "late_ranks", None)
            if late_ranks is not None:
                return list(late_ranks(k))
        return []


def finish_of(detector: object, window: JobWindow, now: int) -> list[Alert]:
    """The alerts ``detector`` raises when its job's data ends at second ``now``, the last one
    it evaluated (its ``finish``; a detector without one raises none)."""
    finish = getattr(detector, "finish", None)
    return list(finish(window, now)) if finish is not None else []


def job_findings_of(detectors: Sequence[object]) -> list[dict[str, Any]]:
    """The job-level findings of every detector that has them (others have none)."""
    out: list[dict[str, Any]] = []
    for detector in detectors:
        found = getattr(detector, "job_findings", None)
        if found is not None:
            out.extend(found())
    return out
