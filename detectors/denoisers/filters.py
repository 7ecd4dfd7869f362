"""Filters that need no training: window mean, median, EWMA, and the raw window (no denoising).

They are linear or order statistics, so they commute with the per-metric scaling and run on
values in units; ``transform`` ignores NaN samples.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from detectors.denoisers.base import Denoiser, check_windows


class RawDenoiser(Denoiser):
    """No denoising: the window as measured (the paper's RAW ablation)."""

    kind = "raw"

    def transform(self, windows: np.ndarray) -> np.ndarray:
        check_windows(windows, self.window)
        return np.asarray(windows, dtype=np.float64)


class MeanDenoiser(Denoiser):
    """Every sample replaced by the window's mean of present samples."""

    kind = "mean"

    def transform(self, windows: np.ndarray) -> np.ndarray:
        check_windows(windows, self.window)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows stay NaN
            mean = np.nanmean(windows, axis=-1, keepdims=True)
        return np.broadcast_to(mean, windows.shape).astype(np.float64)


class MedianDenoiser(Denoiser):
    """Every sample replaced by the window's median: ignores up to half the window in spikes."""

    kind = "median"

    def transform(self, windows: np.ndarray) -> np.ndarray:
        check_windows(windows, self.window)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanmedian(windows, axis=-1, keepdims=True)
        return np.broadcast_to(median, windows.shape).astype(np.float64)


class EwmaDenoiser(Denoiser):
    """Exponentially weighted moving average along the window (newest samples weigh most).

    Parameters
    ----------
    alpha
        Weight of each new sample, in (0, 1]; 1 is no smoothing.
    """

    kind = "ewma"

    def __init__(self, window: int = 8, alpha: float = 0.3) -> None:
        super().__init__(window)
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha is {alpha!r}: expected a weight in (0, 1]")
        self.alpha = alpha

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "alpha": self.alpha}

    def transform(self, windows: np.ndarray) -> np.ndarray:
        check_windows(windows, self.window)
        x = np.asarray(windows, dtype=np.float64)
        out = np.empty_like(x)
        level = x[..., 0].copy()
        out[..., 0] = level
        for t in range(1, x.shape[-1]):
            sample = x[..., t]
            fresh = np.isfinite(sample)
            start = ~np.isfinite(level) & fresh
            level = np.where(start, sample, level)
            level = np.where(fresh & ~start, self.alpha * sample + (1 - self.alpha) * level, level)
            out[..., t] = level
        return out
