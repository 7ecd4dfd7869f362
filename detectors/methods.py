"""Detection methods by name: the engine, its pairwise reference, ablations and the baselines.

``minder detect --method``, the service and ``minder bench detect`` all build detectors here, so a
name means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from detectors.base import DetectorFactory
from detectors.baselines import BASELINE_METHODS, baseline_factory
from detectors.config import DetectorConfig

if TYPE_CHECKING:
    from detectors.model import DetectorModel

ENGINE_METHODS: tuple[str, ...] = ("minder", "pairwise")
"""Our engine with the O(N) median score, and the same engine with the paper's pairwise sum."""
# BASELINE_METHODS (detectors.baselines): outlier detectors on the same windows.
METHODS: tuple[str, ...] = ENGINE_METHODS + BASELINE_METHODS
ABLATIONS: tuple[str, ...] = ("no_denoiser", "no_continuity", "no_prioritisation")
"""Parts of the engine a benchmark run can switch off."""


def method_factory(
    method: str = "minder",
    *,
    config: DetectorConfig | None = None,
    model: DetectorModel | None = None,
    ablations: Collection[str] = (),
) -> DetectorFactory:
    """Factory of fresh per-job detectors for ``method``.

    Parameters
    ----------
    method
        One of :data:`METHODS`.
    config
        Detector parameters (defaults: :class:`DetectorConfig`).
    model
        Trained denoisers and metric priorities (``minder train``); engine methods only.
    ablations
        Names from :data:`ABLATIONS`; engine methods only.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    unknown = sorted(set(ablations) - set(ABLATIONS))
    if unknown:
        raise ValueError(f"unknown ablation(s) {unknown}: expected some of {', '.join(ABLATIONS)}")
    cfg = config or DetectorConfig()
    if method in BASELINE_METHODS:
        if ablations or model is not None:
            raise ValueError(f"method {method!r} takes no model and no ablations")
        return baseline_factory(method, cfg)  # pyod loads lazily, when a detector is built

    from detectors.engine import MinderDetector  # noqa: PLC0415

    if "no_continuity" in ablations:
        cfg = replace(
            cfg,
            continuity_s=1,
            severe_continuity_s=1,
            continuity_samples=1,
            severe_continuity_samples=1,
        )
    from detectors.base import CompositeDetector  # noqa: PLC0415
    from detectors.hang_watch import HangConfig, HangDetector  # noqa: PLC0415
    from detectors.straggler import StragglerDetector  # noqa: PLC0415

    scorer = "pairwise" if method == "pairwise" else "median"
    no_denoiser = "no_denoiser" in ablations
    prioritise = "no_prioritisation" not in ablations

    def build() -> CompositeDetector:
        # The peer engine and, beside it, the step-indexed straggler detector and the live
        # hang detector.
        engine = MinderDetector(
            cfg, model=model, scorer=scorer, denoise=not no_denoiser, prioritise=prioritise
        )
        hang = HangDetector(HangConfig(own_pause_factor=cfg.hang_own_pause_factor))
        return CompositeDetector([engine, StragglerDetector(horizon_s=engine.horizon_s), hang])

    return build


def default_factory(config: DetectorConfig | None = None) -> DetectorFactory:
    """Factory of the default engine: the peer engine (:class:`detectors.engine.MinderDetector`),
    the straggler detector and the live hang detector (:mod:`detectors.hang_watch`)."""
    return method_factory("minder", config=config)
