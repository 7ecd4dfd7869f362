"""PCA reconstruction: project each window onto the main components of normal windows.

Normal windows of one metric vary along a few directions (level, slope, the phase of a
compute/communicate rhythm); projecting onto the first ``n_components`` principal components
keeps those and drops the rest, which on normal data is mostly noise. A window unlike the
training windows keeps its level and gross shape, so outliers stay outliers.

scikit-learn fits the components; once fitted, reconstruction is one ``(w, w)`` matrix product
in numpy, so a saved model loads and runs without scikit-learn.
"""

from __future__ import annotations

import logging
from typing import Any, Self

import numpy as np

from detectors.denoisers.base import Denoiser, check_windows, fill_nearest
from minder.core.errors import ModelError

logger = logging.getLogger(__name__)

_STATE_KEYS = ("components_", "mean_", "explained_variance_")


class PcaDenoiser(Denoiser):
    """Reconstruction from the first principal components of normal windows.

    Parameters
    ----------
    window
        Samples per window ``w``.
    n_components
        Components kept, 1 … ``window`` (``window`` reproduces the input).

    Attributes
    ----------
    components_ : ndarray of shape (n_components, window)
        Principal axes, unit rows.
    mean_ : ndarray of shape (window,)
        Mean of the training windows.
    explained_variance_ : ndarray of shape (n_components,)
        Variance of the training windows along each axis.
    """

    kind = "pca"
    needs_fit = True

    def __init__(self, window: int = 8, n_components: int = 3) -> None:
        super().__init__(window)
        if not 1 <= n_components <= window:
            raise ValueError(
                f"n_components is {n_components!r}: expected 1 … {window} (the window length)"
            )
        self.n_components = n_components
        self.components_: np.ndarray | None = None
        self.mean_: np.ndarray | None = None
        self.explained_variance_: np.ndarray | None = None
        # x @ _projection + _offset == (x - mean_) @ components_.T @ components_ + mean_
        self._projection: np.ndarray | None = None
        self._offset: np.ndarray | None = None

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "n_components": self.n_components}

    def fit(self, windows: np.ndarray) -> Self:
        """Learn the components from normal windows ``(n, window)``; rows with NaN are dropped."""
        check_windows(windows, self.window)
        x = np.asarray(windows, dtype=np.float64).reshape(-1, self.window)
        complete = x[np.isfinite(x).all(axis=1)]
        if complete.shape[0] < max(2, self.n_components):
            raise ValueError(
                f"PCA denoiser got {complete.shape[0]} complete windows out of {x.shape[0]}: "
                f"expected at least {max(2, self.n_components)} without missing samples"
            )
        if complete.shape[0] < x.shape[0]:
            logger.debug(
                "PCA fit dropped %d windows with missing samples", x.shape[0] - len(complete)
            )
        from sklearn.decomposition import PCA  # noqa: PLC0415 (only fitting needs scikit-learn)

        pca = PCA(n_components=self.n_components, svd_solver="full").fit(complete)
        self._set(pca.components_, pca.mean_, pca.explained_variance_)
        return self

    def transform(self, windows: np.ndarray) -> np.ndarray:
        """Reconstructed windows, same shape as ``windows``; all-NaN windows stay NaN."""
        check_windows(windows, self.window)
        if self._projection is None or self._offset is None:
            raise ModelError("PCA denoiser is not fitted: call fit(windows) or load a saved state")
        x = fill_nearest(windows)  # float64 copy; windows with nothing present stay all-NaN
        flat = x.reshape(-1, self.window)
        # A row's result depends on that row only, so all-NaN rows give NaN rows, nothing else.
        out = flat @ self._projection + self._offset
        return out.reshape(x.shape)

    def state(self) -> dict[str, np.ndarray]:
        if self.components_ is None or self.mean_ is None or self.explained_variance_ is None:
            raise ModelError("PCA denoiser is not fitted: nothing to save")
        return {
            "components_": self.components_.copy(),
            "mean_": self.mean_.copy(),
            "explained_variance_": self.explained_variance_.copy(),
        }

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        if sorted(state) != sorted(_STATE_KEYS):
            raise ModelError(
                f"PCA denoiser got arrays {sorted(state)}: expected {sorted(_STATE_KEYS)}"
            )
        expected = {
            "components_": (self.n_components, self.window),
            "mean_": (self.window,),
            "explained_variance_": (self.n_components,),
        }
        for name, shape in expected.items():
            if np.shape(state[name]) != shape:
                raise ModelError(
                    f"PCA denoiser array {name} has shape {np.shape(state[name])}: expected "
                    f"{shape} for window {self.window} and n_components {self.n_components}"
                )
        self._set(state["components_"], state["mean_"], state["explained_variance_"])

    def _set(self, components: np.ndarray, mean: np.ndarray, variance: np.ndarray) -> None:
        self.components_ = np.array(components, dtype=np.float64)
        self.mean_ = np.array(mean, dtype=np.float64)
        self.explained_variance_ = np.array(variance, dtype=np.float64)
        self._projection = self.components_.T @ self.components_
        self._offset = self.mean_ - self.mean_ @ self._projection
