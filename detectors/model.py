"""A trained detector model: per-metric scalers and denoisers, and the metric priorities.

On disk a model is a directory with ``model.json`` (format name, version, parameters, training
summary) and ``arrays.npz`` (every learned array, by name), so it holds no pickle and can be
inspected with any JSON and numpy tool. A directory of another format version is refused.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detectors.denoisers import Denoiser, MetricScaler, denoiser_class
from detectors.priority import MetricPriority
from minder.core.errors import ModelError

logger = logging.getLogger(__name__)

MODEL_FORMAT = "minder-detector-model"
MODEL_VERSION = 1
"""Bumped whenever a saved model would be read differently."""
_MANIFEST = "model.json"
_ARRAYS = "arrays.npz"


@dataclass(slots=True)
class DetectorModel:
    """What ``minder train`` learns and the engine loads.

    Attributes
    ----------
    window
        Samples per window the denoisers were trained on (the engine uses this window).
    denoiser
        Kind of the trained denoisers.
    denoisers
        Per metric: the min-max scaler and the fitted denoiser.
    priority
        The learned metric order, or None when trained without labels.
    info
        Training summary (data covered, fit times, created at, library versions).
    """

    window: int
    denoiser: str
    denoisers: dict[str, tuple[MetricScaler, Denoiser]] = field(default_factory=dict)
    priority: MetricPriority | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the model into ``directory`` (created; existing model files are replaced)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        metrics: dict[str, Any] = {}
        for metric, (scaler, denoiser) in sorted(self.denoisers.items()):
            metrics[metric] = {
                "low": scaler.low,
                "high": scaler.high,
                "kind": denoiser.kind,
                "params": denoiser.params(),
            }
            for name, value in denoiser.state().items():
                arrays[f"denoiser/{metric}/{name}"] = np.asarray(value)
        priority = None
        if self.priority is not None:
            priority = self.priority.to_json()
            for name, value in self.priority.tree.items():
                arrays[f"priority/{name}"] = np.asarray(value)
        manifest = {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "window": self.window,
            "denoiser": self.denoiser,
            "metrics": metrics,
            "priority": priority,
            "info": self.info,
            "saved_at": time.time(),
        }
        np.savez(path / _ARRAYS, **arrays)  # type: ignore[arg-type]
        tmp = path / f".{_MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=_json_default))
        tmp.replace(path / _MANIFEST)  # the manifest last: a half-written model has none
        logger.info("saved model (%d metrics) to %s", len(metrics), path)
        return path


def load_model(directory: str | os.PathLike[str]) -> DetectorModel:
    """Read a model directory written by :meth:`DetectorModel.save`.

    Raises
    ------
    ModelError
        The directory has no model, a model of another format or version, or a damaged one.
    """
    path = Path(directory)
    manifest_path = path / _MANIFEST
    if not manifest_path.is_file():
        raise ModelError(f"{path} holds no detector model: expected {_MANIFEST} (minder train)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{manifest_path} is not readable JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MODEL_FORMAT:
        raise ModelError(f"{manifest_path} is not a {MODEL_FORMAT!r} manifest")
    version = manifest.get("version")
    if version != MODEL_VERSION:
        raise ModelError(
            f"model {path} has format version {version!r}: this Minder reads version "
            f"{MODEL_VERSION}; retrain it with 'minder train'"
        )
    try:
        with np.load(path / _ARRAYS, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path / _ARRAYS} is missing or damaged: {exc}") from exc
    try:
        denoisers: dict[str, tuple[MetricScaler, Denoiser]] = {}
        for metric, entry in manifest["metrics"].items():
            prefix = f"denoiser/{metric}/"
            state = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            cls = denoiser_class(str(entry["kind"]))
            denoiser = cls.from_state(dict(entry["params"]), state)
            denoisers[metric] = (MetricScaler(float(entry["low"]), float(entry["high"])), denoiser)
        priority = None
        if manifest.get("priority") is not None:
            tree = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("priority/")}
            priority = MetricPriority.from_json(manifest["priority"], tree)
        return DetectorModel(
            window=int(manifest["window"]),
            denoiser=str(manifest["denoiser"]),
            denoisers=denoisers,
            priority=priority,
            info=dict(manifest.get("info") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"model {path} is malformed: {exc!r}") from exc


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
