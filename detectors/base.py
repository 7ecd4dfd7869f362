"""The interface every streaming detector follows, so the service can swap engines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from detectors.config import DetectorConfig
from detectors.window import JobWindow
from minder.core.alert import Alert


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


def default_factory(config: DetectorConfig | None = None) -> DetectorFactory:
    """Factory of the default engine (:class:`detectors.engine.MinderDetector`)."""
    from detectors.engine import MinderDetector  # noqa: PLC0415  (peer imports base's siblings)

    cfg = config or DetectorConfig()
    return lambda: MinderDetector(cfg)
