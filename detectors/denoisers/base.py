"""The denoiser contract: one model per metric that maps a window to its denoised window.

Denoisers follow the scikit-learn estimator shape (docs/architecture.md §5): ``__init__`` stores
parameters, ``fit(windows)`` learns from *normal* windows and returns ``self``, learned attributes
end in ``_``. ``transform`` maps windows ``(..., w)`` to denoised windows of the same shape.

Learned denoisers take inputs normalised per metric (:class:`MetricScaler`) and fill missing
samples themselves (:func:`fill_nearest`); filters skip them. A window that was entirely
missing stays NaN and comes out NaN.
Models are saved as JSON parameters plus named numpy arrays (``state``/``from_state``), so a
model directory needs no pickle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np

from minder.core.errors import ModelError


class Denoiser(ABC):
    """Base of every per-metric denoiser."""

    kind: ClassVar[str]
    """Registry name (``mean``, ``median``, ``ewma``, ``raw``, ``pca``, ``lstm_vae``)."""
    needs_fit: ClassVar[bool] = False
    """Whether :meth:`fit` learns anything (filters do not)."""

    def __init__(self, window: int = 8) -> None:
        if window < 1:
            raise ValueError(f"window is {window!r}: expected a positive number of samples")
        self.window = window

    def fit(self, windows: np.ndarray) -> Self:
        """Learn from normal windows ``(n, window)``; filters learn nothing."""
        check_windows(windows, self.window)
        return self

    @abstractmethod
    def transform(self, windows: np.ndarray) -> np.ndarray:
        """Denoised windows, same shape as ``windows`` ``(..., window)``."""

    def params(self) -> dict[str, Any]:
        """JSON-serialisable constructor parameters."""
        return {"window": self.window}

    def state(self) -> dict[str, np.ndarray]:
        """Learned arrays, by name (empty for filters)."""
        return {}

    @classmethod
    def from_state(cls, params: dict[str, Any], state: dict[str, np.ndarray]) -> Self:
        """Rebuild a fitted denoiser from :meth:`params` and :meth:`state`."""
        model = cls(**params)
        model.load_state(state)
        return model

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore learned arrays (filters have none)."""
        if state:
            raise ModelError(
                f"{self.kind} denoiser got learned arrays {sorted(state)}: expected none"
            )


def check_windows(windows: np.ndarray, window: int) -> None:
    """Refuse input that is not ``(..., window)`` floats."""
    if windows.ndim < 1 or windows.shape[-1] != window:
        raise ValueError(
            f"windows have shape {windows.shape}: expected (..., {window}) for window {window}"
        )


def fill_nearest(windows: np.ndarray) -> np.ndarray:
    """Fill NaN samples of each window with the nearest present sample (earlier on a tie).

    Minder aligns machines' series and fills a missing second with the value at the nearest
    timestamp; a window with nothing present stays all-NaN.
    """
    out = np.array(windows, dtype=np.float64, copy=True)
    missing = np.isnan(out)
    if not missing.any():
        return out
    w = out.shape[-1]
    flat = out.reshape(-1, w)
    miss = missing.reshape(-1, w)
    positions = np.arange(w)
    # Index of the last present sample at or before each position, and the first at or after.
    before = np.where(~miss, positions, -1)
    before = np.maximum.accumulate(before, axis=1)
    after = np.where(~miss, positions, w)
    after = np.minimum.accumulate(after[:, ::-1], axis=1)[:, ::-1]
    use_before = (before >= 0) & ((after >= w) | (positions - before <= after - positions))
    source = np.where(use_before, before, after)
    rows = np.arange(flat.shape[0])[:, None]
    filled = flat[rows, np.clip(source, 0, w - 1)]
    filled[source >= w] = np.nan
    return filled.reshape(out.shape)


@dataclass(frozen=True, slots=True)
class MetricScaler:
    """Min-max normalisation of one metric, learned from normal data (Minder §4.2).

    ``low``/``high`` are robust extremes (the 0.5th and 99.5th percentiles) so that one bad
    sample in the training data does not squash everything else.
    """

    low: float
    high: float

    @classmethod
    def fit(cls, values: np.ndarray, floor: float) -> MetricScaler:
        """Learn from every finite value of a metric; ``floor`` is the smallest span."""
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return cls(0.0, max(floor, 1e-12))
        low, high = (float(v) for v in np.percentile(finite, [0.5, 99.5]))
        return cls(low, max(high, low + max(floor, 1e-12)))

    @property
    def span(self) -> float:
        """``high - low`` (positive)."""
        return self.high - self.low

    def forward(self, values: np.ndarray) -> np.ndarray:
        """Values in units → normalised (about 0 … 1 on normal data)."""
        return (values - self.low) / self.span

    def inverse(self, values: np.ndarray) -> np.ndarray:
        """Normalised → units."""
        return values * self.span + self.low
