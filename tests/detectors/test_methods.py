"""Methods by name: the engine, its ablations and the baselines."""

from __future__ import annotations

import pytest

from detectors.base import CompositeDetector
from detectors.engine import MinderDetector
from detectors.hang_watch import HangDetector
from detectors.methods import ABLATIONS, BASELINE_METHODS, METHODS, method_factory
from detectors.straggler import StragglerDetector


def engine(built: object) -> MinderDetector:
    """The peer engine of an engine method, with the straggler and hang detectors beside it."""
    assert isinstance(built, CompositeDetector)
    first, second, third = built.parts
    assert isinstance(first, MinderDetector) and isinstance(second, StragglerDetector)
    assert isinstance(third, HangDetector)
    return first


def test_engine_methods_and_ablations() -> None:
    detector = engine(method_factory("pairwise")())
    assert detector.scorer == "pairwise"
    ablated = engine(method_factory("minder", ablations=ABLATIONS)())
    assert not ablated.denoise and not ablated.prioritise
    assert ablated.config.continuity_s == 1 and ablated.config.severe_continuity_s == 1
    assert ablated.denoiser_for("cpu_util_ratio").denoiser.kind == "raw"


def test_every_method_builds_a_detector() -> None:
    for method in METHODS:
        detector = method_factory(method)()
        assert detector.horizon_s > 0, method


def test_bad_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown method 'knn'.*mahalanobis"):
        method_factory("knn")
    with pytest.raises(ValueError, match="no_denoiser"):
        method_factory("minder", ablations=["no_rules"])
    with pytest.raises(ValueError, match="no model and no ablations"):
        method_factory(BASELINE_METHODS[0], ablations=["no_denoiser"])
