"""The paper's denoiser (Minder §4.3): one small LSTM variational autoencoder per metric.

The encoder LSTM reads the window one sample per step; its last hidden state gives the mean
and log-variance of a Gaussian latent. The decoder maps the latent to one vector, feeds it to a
second LSTM at every step of the window and reads one sample per step out of it. Trained on
normal windows, it reconstructs them as a smooth version of themselves; a window unlike them
comes out as the nearest thing the model knows how to draw, which is still far from the normal
reconstructions, so outliers stay outliers.

Defaults follow the paper: window 8, hidden 4, latent 8, one layer. PyTorch is an optional
dependency (the ``deep`` extra) and is imported only when a model is built, so importing this
module, or any other denoiser, never needs it.

Training (all of it seeded, so the same seed and data give the same model):

- The loss is the mean squared reconstruction error per sample plus ``beta`` times the KL
  divergence of the latent from N(0, 1) (per window, summed over latent dimensions). The usual
  ``beta = 1`` would cost far more than the 1e-3 … 1e-4 reconstruction error we want and make the
  reconstruction the mean window; ``beta = 1e-4`` keeps a little of the VAE's regularisation (a
  bounded, smooth latent). On smooth windows ``beta = 1e-3`` cost about 10 % more error.
- The network standardises its input with the training data's mean and standard deviation
  (saved with the weights). On raw 0 … 1 data the level alone pushes the tiny LSTMs' units
  towards saturation, and training stalls on the plateau where every window reconstructs to its
  mean.
- Warm-up: the first 30 % of the epochs train a plain autoencoder (no sampling noise, no KL);
  noise and KL weight then ramp to full over the next 20 %. With full noise from the start the
  window's shape drowns in the sampling noise and the model also stalls on the mean plateau.

Denoising uses the latent mean, never a sample, so it is deterministic.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from types import ModuleType
from typing import Any, Self

import numpy as np

from detectors.denoisers.base import Denoiser, check_windows, fill_nearest
from minder.core.errors import ModelError

logger = logging.getLogger(__name__)

INSTALL_HINT = "install the deep extra: pip install 'minder[deep]' (torch==2.13.0)"

_HOLD_FRACTION = 0.3
"""Share of the epochs trained as a plain autoencoder (no sampling noise, no KL term)."""
_WARMUP_FRACTION = 0.2
"""Share of the epochs over which sampling noise and KL weight then ramp from 0 to full."""

_MIN_INPUT_STD = 0.01
"""Floor of the learned input scale: a metric that was constant in training (on 0 … 1 data) is
not blown up by more than 100x."""

_INFERENCE_BATCH = 4_096
"""Windows per forward pass in :meth:`LstmVaeDenoiser.transform`: large enough to amortise the
per-call overhead, small enough for the LSTMs' activations to stay in cache (measured: batches of
2k-4k ran about 1.5x faster than one batch of 320k)."""


def _torch() -> ModuleType:
    """PyTorch, or a :class:`ModelError` that says how to install it."""
    try:
        import torch  # noqa: PLC0415 (optional dependency, loaded on first use)
    except ImportError as exc:
        raise ModelError(f"the LSTM-VAE denoiser needs PyTorch: {INSTALL_HINT}") from exc
    return torch


@functools.cache
def _net_class() -> Any:
    """The ``torch.nn.Module`` class of the LSTM-VAE, defined once torch is importable."""
    torch = _torch()
    nn: Any = torch.nn

    class LstmVae(nn.Module):
        """Encoder LSTM → (mu, logvar) → decoder LSTM, over windows ``(B, w)``."""

        def __init__(self, window: int, hidden: int, latent: int, layers: int) -> None:
            super().__init__()
            self.window = window
            # Standardisation of the input, learned from the training windows at fit and saved
            # with the weights (buffers are part of the state_dict).
            self.register_buffer("input_mean", torch.zeros(()))
            self.register_buffer("input_std", torch.ones(()))
            self.encoder = nn.LSTM(1, hidden, layers, batch_first=True)
            self.to_mu = nn.Linear(hidden, latent)
            self.to_logvar = nn.Linear(hidden, latent)
            self.from_latent = nn.Linear(latent, hidden)
            self.decoder = nn.LSTM(hidden, hidden, layers, batch_first=True)
            self.to_sample = nn.Linear(hidden, 1)

        def encode(self, x: Any) -> tuple[Any, Any]:
            x = (x - self.input_mean) / self.input_std
            _, (h, _) = self.encoder(x.unsqueeze(-1))
            last = h[-1]  # the top layer's hidden state after the last sample
            return self.to_mu(last), self.to_logvar(last)

        def decode(self, z: Any) -> Any:
            steps = self.from_latent(z).unsqueeze(1).expand(-1, self.window, -1)
            out, _ = self.decoder(steps)
            return self.to_sample(out).squeeze(-1) * self.input_std + self.input_mean

        def forward(self, x: Any, noise: Any = None) -> tuple[Any, Any, Any]:
            mu, logvar = self.encode(x)
            z = mu if noise is None else mu + noise * torch.exp(0.5 * logvar)
            return self.decode(z), mu, logvar

    return LstmVae


class LstmVaeDenoiser(Denoiser):
    """LSTM variational autoencoder trained on normal windows of one metric.

    Parameters
    ----------
    window
        Samples per window ``w`` (paper: 8).
    hidden
        LSTM hidden size of encoder and decoder (paper: 4).
    latent
        Latent dimensions (paper: 8).
    layers
        Stacked LSTM layers (paper: 1).
    epochs
        Passes over the training windows.
    batch_size
        Windows per optimiser step.
    lr
        Adam learning rate.
    beta
        Weight of the KL term (see the module docstring for why it is small).
    seed
        Seeds initialisation, shuffling and the reparameterisation noise: the same seed and data
        give the same model.
    max_train_windows
        Larger training sets are subsampled (seeded) to this many windows to bound ``fit`` time.

    Attributes
    ----------
    net_ : torch.nn.Module
        The fitted network (after :meth:`fit` or :meth:`load_state`).
    train_mse_ : float
        Reconstruction MSE (from the latent mean) on the training windows after the last epoch.
    fit_seconds_ : float
        Wall time of :meth:`fit`.
    """

    kind = "lstm_vae"
    needs_fit = True

    def __init__(
        self,
        window: int = 8,
        hidden: int = 4,
        latent: int = 8,
        layers: int = 1,
        epochs: int = 30,
        batch_size: int = 128,
        lr: float = 1e-2,
        beta: float = 1e-4,
        seed: int = 0,
        max_train_windows: int = 20_000,
    ) -> None:
        super().__init__(window)
        for name, value in (
            ("hidden", hidden),
            ("latent", latent),
            ("layers", layers),
            ("epochs", epochs),
            ("batch_size", batch_size),
            ("max_train_windows", max_train_windows),
        ):
            if value < 1:
                raise ValueError(f"{name} is {value!r}: expected a positive integer")
        if not lr > 0:
            raise ValueError(f"lr is {lr!r}: expected a positive learning rate")
        if not beta >= 0:
            raise ValueError(f"beta is {beta!r}: expected a KL weight >= 0")
        self.hidden = hidden
        self.latent = latent
        self.layers = layers
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.beta = beta
        self.seed = seed
        self.max_train_windows = max_train_windows
        self.net_: Any = None
        self.train_mse_ = math.nan
        self.fit_seconds_ = math.nan

    def params(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "hidden": self.hidden,
            "latent": self.latent,
            "layers": self.layers,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "beta": self.beta,
            "seed": self.seed,
            "max_train_windows": self.max_train_windows,
        }

    def _new_net(self) -> Any:
        net = _net_class()(self.window, self.hidden, self.latent, self.layers)
        return net.float()

    def fit(self, windows: np.ndarray) -> Self:
        """Train on normal, normalised windows ``(n, window)``; rows with NaN are dropped."""
        check_windows(windows, self.window)
        torch = _torch()
        x = np.asarray(windows, dtype=np.float64).reshape(-1, self.window)
        complete = x[np.isfinite(x).all(axis=1)]
        if complete.shape[0] < 2:
            raise ValueError(
                f"LSTM-VAE denoiser got {complete.shape[0]} complete windows out of "
                f"{x.shape[0]}: expected at least 2 without missing samples"
            )
        rng = np.random.default_rng(self.seed)
        if complete.shape[0] > self.max_train_windows:
            keep = np.sort(rng.choice(complete.shape[0], self.max_train_windows, replace=False))
            complete = complete[keep]
        started = time.perf_counter()
        threads = torch.get_num_threads()
        deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        # One thread: the batches are tiny, so more threads buy little and would take cores
        # from the detection loop running beside a retrain.
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        try:
            # fork_rng: seeding here must not change the caller's global torch RNG.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                net, mse = self._train(torch, torch.from_numpy(complete.astype(np.float32)))
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        self.net_ = net
        self.train_mse_ = mse
        self.fit_seconds_ = time.perf_counter() - started
        logger.info(
            "LSTM-VAE fitted on %d windows in %.1f s, training reconstruction MSE %.2e",
            complete.shape[0],
            self.fit_seconds_,
            mse,
        )
        return self

    def _train(self, torch: ModuleType, data: Any) -> tuple[Any, float]:
        """Seeded training loop; returns the network in eval mode and its training MSE."""
        net = self._new_net()
        # Standardise around the training data: on 0 … 1 data the level alone would drive the
        # LSTMs' tanh units towards saturation, and training stalls on the "window mean" plateau.
        net.input_mean.fill_(float(data.mean()))
        net.input_std.fill_(max(float(data.std()), _MIN_INPUT_STD))
        optimiser = torch.optim.Adam(net.parameters(), lr=self.lr)
        # Decay the learning rate to a tenth over the run: fast start, fine finish.
        steps_per_epoch = math.ceil(data.shape[0] / self.batch_size)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimiser, T_max=self.epochs * steps_per_epoch, eta_min=self.lr / 10
        )
        generator = torch.Generator().manual_seed(self.seed)
        net.train()
        hold = _HOLD_FRACTION * self.epochs
        warmup = max(1.0, _WARMUP_FRACTION * self.epochs)
        for epoch in range(self.epochs):
            # Warm-up (module docstring): 0 while a plain autoencoder, then up to 1.
            ramp = min(1.0, max(0.0, epoch - hold) / warmup)
            order = torch.randperm(data.shape[0], generator=generator)
            for start in range(0, data.shape[0], self.batch_size):
                batch = data[order[start : start + self.batch_size]]
                noise = torch.randn(batch.shape[0], self.latent, generator=generator)
                recon, mu, logvar = net(batch, noise * ramp)
                mse = torch.mean((recon - batch) ** 2)
                kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu**2 - logvar.exp(), dim=1))
                loss = mse + ramp * self.beta * kl
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                schedule.step()
        net.eval()
        with torch.inference_mode():
            final = float(torch.mean((self._forward(torch, net, data) - data) ** 2))
        return net, final

    @staticmethod
    def _forward(torch: ModuleType, net: Any, data: Any) -> Any:
        """Reconstructions from the latent mean, in batches of :data:`_INFERENCE_BATCH`."""
        parts = [
            net.decode(net.encode(data[start : start + _INFERENCE_BATCH])[0])
            for start in range(0, data.shape[0], _INFERENCE_BATCH)
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def transform(self, windows: np.ndarray) -> np.ndarray:
        """Reconstructed windows (float64), same shape as ``windows``; all-NaN windows stay NaN."""
        check_windows(windows, self.window)
        if self.net_ is None:
            raise ModelError(
                "LSTM-VAE denoiser is not fitted: call fit(windows) or load a saved state"
            )
        torch = _torch()
        filled = fill_nearest(windows)
        flat = filled.reshape(-1, self.window)
        present = ~np.isnan(flat[:, 0])  # after filling, a row is all-NaN or has no NaN
        out = np.full(flat.shape, np.nan, dtype=np.float64)
        if present.any():
            data = torch.from_numpy(np.ascontiguousarray(flat[present], dtype=np.float32))
            with torch.inference_mode():
                out[present] = self._forward(torch, self.net_, data).numpy()
        return out.reshape(filled.shape)

    def state(self) -> dict[str, np.ndarray]:
        """The network's ``state_dict`` as float32 numpy arrays, under the same names."""
        if self.net_ is None:
            raise ModelError("LSTM-VAE denoiser is not fitted: nothing to save")
        return {
            name: tensor.detach().cpu().numpy().copy()
            for name, tensor in self.net_.state_dict().items()
        }

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Rebuild the network from :meth:`state`; names and shapes must match the parameters."""
        torch = _torch()
        net = self._new_net()
        expected = {name: tuple(t.shape) for name, t in net.state_dict().items()}
        if sorted(state) != sorted(expected):
            raise ModelError(
                f"LSTM-VAE denoiser got arrays {sorted(state)}: expected {sorted(expected)} "
                f"for hidden {self.hidden}, latent {self.latent}, layers {self.layers}"
            )
        for name, shape in expected.items():
            if tuple(np.shape(state[name])) != shape:
                raise ModelError(
                    f"LSTM-VAE denoiser array {name} has shape {np.shape(state[name])}: "
                    f"expected {shape} for window {self.window}, hidden {self.hidden}, "
                    f"latent {self.latent}, layers {self.layers}"
                )
        net.load_state_dict(
            {name: torch.from_numpy(np.array(state[name], dtype=np.float32)) for name in state}
        )
        net.eval()
        self.net_ = net
