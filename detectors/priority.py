"""Metric prioritisation learned by a decision tree (Minder §4.4).

Features: for each labelled window (one job-second), per metric the maximum |peer z| over the
job's machines. Label: a fault was active in that job at that second. A decision tree separates
fault windows from normal ones; a metric used closer to the root is more telling and is checked
first. Metrics the tree never uses are checked last and need a larger deviation (they did not
separate faults from normal windows in the training data, so their outliers are more often
noise).

The tree is kept as plain arrays (no pickle), so a model directory can be inspected and loaded
across scikit-learn versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minder.core.errors import ModelError
from minder.core.metrics import METRICS

DEFAULT_PRIORITY: tuple[str, ...] = (
    "pfc_tx_pause_per_second",
    "cpu_util_ratio",
    "gpu_util_ratio",
    "gpu_power_watts",
    "gpu_gr_engine_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_nvlink_tx_bytes_per_second",
)
"""The paper's top-7 by learned priority (docs/detection-method.md §2), used without a model."""

_TREE_ARRAYS = ("children_left", "children_right", "feature", "threshold")


@dataclass(slots=True)
class MetricPriority:
    """Order in which metrics are checked, and which metrics the tree trusts.

    Attributes
    ----------
    order
        Metrics, most telling first; metrics not listed come after, in canonical order.
    trusted
        Metrics the tree used; the others need ``untrusted_factor`` x the threshold.
    importances
        The tree's impurity-based importance per metric.
    tree
        ``children_left``, ``children_right``, ``feature``, ``threshold`` of the fitted tree,
        with ``features`` naming the feature columns.
    """

    order: list[str]
    trusted: set[str]
    importances: dict[str, float] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)
    tree: dict[str, np.ndarray] = field(default_factory=dict)
    trust_all: bool = False

    @classmethod
    def default(cls) -> MetricPriority:
        """The paper's order; every metric trusted (no training data to say otherwise)."""
        return cls(order=list(DEFAULT_PRIORITY), trusted=set(), trust_all=True)

    def trusts(self, metric: str) -> bool:
        """Whether ``metric`` is held to the plain threshold."""
        return self.trust_all or metric in self.trusted

    @classmethod
    def fit(
        cls,
        features: np.ndarray,
        labels: np.ndarray,
        metrics: Sequence[str],
        *,
        max_depth: int = 6,
        random_state: int = 0,
    ) -> MetricPriority:
        """Learn the order from ``features[window, metric]`` and ``labels[window]`` (1 = fault).

        Missing features (a metric not scored that second) count as 0: no deviation seen.
        """
        x = np.nan_to_num(np.asarray(features, dtype=np.float64), nan=0.0, posinf=1e6)
        y = np.asarray(labels).astype(int)
        if x.ndim != 2 or x.shape[1] != len(metrics) or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"features {x.shape} and labels {y.shape} for {len(metrics)} metrics: expected "
                "(windows, metrics) and (windows,)"
            )
        if len(np.unique(y)) < 2:
            raise ModelError(
                f"priority training needs fault and normal windows; got only label {y[:1]}: "
                "give a labels file whose faults overlap the table's time range"
            )
        from sklearn.tree import DecisionTreeClassifier  # noqa: PLC0415  (fit-time only)

        tree = DecisionTreeClassifier(
            max_depth=max_depth, class_weight="balanced", random_state=random_state
        ).fit(x, y)
        arrays = {name: np.asarray(getattr(tree.tree_, name)) for name in _TREE_ARRAYS}
        importances = {m: float(v) for m, v in zip(metrics, tree.feature_importances_, strict=True)}
        return cls.from_tree(arrays, list(metrics), importances)

    @classmethod
    def from_tree(
        cls, tree: dict[str, np.ndarray], features: list[str], importances: dict[str, float]
    ) -> MetricPriority:
        """Order metrics by the depth of their first split (breadth first), then importance."""
        depth_of: dict[str, int] = {}
        left, right, feature = tree["children_left"], tree["children_right"], tree["feature"]
        frontier = [(0, 0)] if len(left) else []
        while frontier:
            node, depth = frontier.pop(0)
            if left[node] == -1:  # a leaf
                continue
            name = features[int(feature[node])]
            depth_of.setdefault(name, depth)
            frontier += [(int(left[node]), depth + 1), (int(right[node]), depth + 1)]
        order = sorted(depth_of, key=lambda m: (depth_of[m], -importances.get(m, 0.0), m))
        return cls(
            order=order,
            trusted=set(order),
            importances=importances,
            features=features,
            tree=tree,
        )

    def rank(self, metric: str) -> int:
        """Position of ``metric`` in the checking order (unlisted metrics after all listed)."""
        try:
            return self.order.index(metric)
        except ValueError:
            canonical = list(METRICS)
            position = canonical.index(metric) if metric in canonical else len(canonical)
            return len(self.order) + position

    def to_json(self) -> dict[str, Any]:
        """Parameters for the model manifest (the tree arrays go with the model's arrays)."""
        return {
            "order": self.order,
            "trusted": sorted(self.trusted),
            "importances": self.importances,
            "features": self.features,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], arrays: dict[str, np.ndarray]) -> MetricPriority:
        """Rebuild from :meth:`to_json` and the tree arrays."""
        try:
            return cls(
                order=[str(m) for m in data["order"]],
                trusted={str(m) for m in data["trusted"]},
                importances={str(k): float(v) for k, v in data.get("importances", {}).items()},
                features=[str(m) for m in data.get("features", [])],
                tree={k: arrays[k] for k in _TREE_ARRAYS if k in arrays},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"priority section of the model is malformed: {exc!r}") from exc
