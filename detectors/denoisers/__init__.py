"""Per-metric denoisers (Minder §4.3): filters, PCA reconstruction and the paper's LSTM-VAE."""

from __future__ import annotations

import importlib

from detectors.denoisers.base import Denoiser, MetricScaler, fill_nearest

# kind -> "module:Class"; imported on demand so torch loads only for the LSTM-VAE.
_REGISTRY: dict[str, str] = {
    "raw": "detectors.denoisers.filters:RawDenoiser",
    "mean": "detectors.denoisers.filters:MeanDenoiser",
    "median": "detectors.denoisers.filters:MedianDenoiser",
    "ewma": "detectors.denoisers.filters:EwmaDenoiser",
    "pca": "detectors.denoisers.pca:PcaDenoiser",
    "lstm_vae": "detectors.denoisers.lstm_vae:LstmVaeDenoiser",
}
DENOISER_KINDS: tuple[str, ...] = tuple(_REGISTRY)
"""Every denoiser name ``--denoiser`` and model directories accept."""


def denoiser_class(kind: str) -> type[Denoiser]:
    """The class registered as ``kind``; unknown names are refused naming the choices."""
    try:
        target = _REGISTRY[kind]
    except KeyError:
        raise ValueError(
            f"unknown denoiser {kind!r}: expected one of {', '.join(DENOISER_KINDS)}"
        ) from None
    module_name, class_name = target.split(":")
    cls: type[Denoiser] = getattr(importlib.import_module(module_name), class_name)
    return cls


__all__ = ["DENOISER_KINDS", "Denoiser", "MetricScaler", "denoiser_class", "fill_nearest"]
