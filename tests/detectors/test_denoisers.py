"""Denoisers: filters, fill_nearest, MetricScaler, PCA reconstruction and the LSTM-VAE."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest

from detectors.denoisers import DENOISER_KINDS, MetricScaler, denoiser_class, fill_nearest
from detectors.denoisers.filters import EwmaDenoiser, MeanDenoiser, MedianDenoiser, RawDenoiser
from detectors.denoisers.pca import PcaDenoiser
from minder.core.errors import ModelError

W = 8
NAN = np.nan


def windows(n: int, seed: int, noise: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """``(noisy, clean)`` windows of a level plus a slow sinusoid, about 0 … 1."""
    rng = np.random.default_rng(seed)
    t = np.arange(W)
    level = rng.uniform(0.25, 0.75, (n, 1))
    amp = rng.uniform(0.0, 0.15, (n, 1))
    period = rng.uniform(8, 30, (n, 1))
    phase = rng.uniform(0, 2 * np.pi, (n, 1))
    clean = level + amp * np.sin(2 * np.pi * t / period + phase)
    return clean + rng.normal(0, noise, clean.shape), clean


def mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a - b) ** 2))


# --- filters -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RawDenoiser, MeanDenoiser, MedianDenoiser, EwmaDenoiser])
def test_filters_keep_any_leading_shape_and_refuse_wrong_window(cls) -> None:
    x = np.random.default_rng(0).random((3, 4, W)).astype(np.float32)
    out = cls().transform(x)
    assert out.shape == x.shape
    assert out.dtype == np.float64
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 8\)"):
        cls().transform(np.zeros((3, W + 1)))
    assert not cls.needs_fit
    assert cls().fit(x) is not None


@pytest.mark.parametrize("cls", [RawDenoiser, MeanDenoiser, MedianDenoiser, EwmaDenoiser])
def test_filters_all_nan_window_stays_nan_without_warnings(cls) -> None:
    x = np.array([[NAN] * W, [1.0] * W])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = cls().transform(x)
    assert np.isnan(out[0]).all()
    assert np.allclose(out[1], 1.0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window is 0"):
        MeanDenoiser(window=0)


def test_raw_is_the_input() -> None:
    x = np.array([[1.0, 2, NAN, 4, 5, 6, 7, 8]])
    assert np.array_equal(RawDenoiser().transform(x), x, equal_nan=True)


def test_mean_ignores_missing_samples() -> None:
    x = np.array([[1.0, 2, 3, NAN, NAN, 4, 5, 6]])
    assert np.allclose(MeanDenoiser().transform(x), 3.5)


def test_median_ignores_spikes_and_missing_samples() -> None:
    x = np.array([[1.0, 1, 1, 100, 1, 1, -50, NAN]])
    assert np.allclose(MedianDenoiser().transform(x), 1.0)
    assert not np.allclose(MeanDenoiser().transform(x), 1.0)


def test_ewma_values_and_missing_samples() -> None:
    x = np.array([[NAN, 2.0, 4.0, NAN, 0.0, 0.0, 0.0, 0.0]])
    out = EwmaDenoiser(alpha=0.5).transform(x)
    # leading NaN stays NaN, the level starts at the first present sample, a gap keeps it
    assert np.isnan(out[0, 0])
    assert np.allclose(out[0, 1:], [2.0, 3.0, 3.0, 1.5, 0.75, 0.375, 0.1875])
    jumpy = np.array([[2.0, 4.0] * 4])
    assert np.array_equal(EwmaDenoiser(alpha=1.0).transform(jumpy), jumpy)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, float("nan")])
def test_ewma_refuses_bad_alpha(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha is"):
        EwmaDenoiser(alpha=alpha)


def test_filters_round_trip_params_and_refuse_learned_arrays() -> None:
    model = EwmaDenoiser(window=6, alpha=0.2)
    params = json.loads(json.dumps(model.params()))
    again = EwmaDenoiser.from_state(params, model.state())
    assert (again.window, again.alpha) == (6, 0.2)
    with pytest.raises(ModelError, match="expected none"):
        MeanDenoiser().load_state({"w": np.zeros(3)})


def test_registry_names_every_kind() -> None:
    assert DENOISER_KINDS == ("raw", "mean", "median", "ewma", "pca", "lstm_vae")
    assert denoiser_class("pca") is PcaDenoiser
    with pytest.raises(ValueError, match="unknown denoiser 'vae'"):
        denoiser_class("vae")


# --- fill_nearest --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ([NAN, NAN, 3.0, 4.0], [3.0, 3.0, 3.0, 4.0]),  # leading gap
        ([1.0, 2.0, NAN, NAN], [1.0, 2.0, 2.0, 2.0]),  # trailing gap
        ([1.0, NAN, NAN, NAN, 5.0], [1.0, 1.0, 1.0, 5.0, 5.0]),  # middle: nearest, tie -> earlier
        ([1.0, NAN, 3.0], [1.0, 1.0, 3.0]),  # tie -> earlier
        ([NAN, 7.0, NAN], [7.0, 7.0, 7.0]),
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
    ],
)
def test_fill_nearest(row: list[float], expected: list[float]) -> None:
    x = np.array([row])
    out = fill_nearest(x)
    assert np.array_equal(out, [expected])
    assert out is not x


def test_fill_nearest_all_nan_stays_nan_and_keeps_shape_and_input() -> None:
    x = np.full((2, 3, 4), 1.0)
    x[0, 1] = NAN
    x[1, 2, 0] = NAN
    before = x.copy()
    out = fill_nearest(x)
    assert out.shape == x.shape
    assert np.isnan(out[0, 1]).all()
    assert np.isfinite(np.delete(out.reshape(-1, 4), 1, axis=0)).all()
    assert np.array_equal(x, before, equal_nan=True)


# --- MetricScaler --------------------------------------------------------------------------------


def test_scaler_fit_forward_inverse() -> None:
    values = np.concatenate([np.linspace(100, 200, 1001), [NAN, np.inf]])
    scaler = MetricScaler.fit(values, floor=1.0)
    assert scaler.low == pytest.approx(100.5)
    assert scaler.high == pytest.approx(199.5)
    assert scaler.forward(np.array([100.5, 199.5])) == pytest.approx([0.0, 1.0])
    x = np.array([120.0, 180.0, 250.0])
    assert scaler.inverse(scaler.forward(x)) == pytest.approx(x)


def test_scaler_one_bad_sample_does_not_squash_the_rest() -> None:
    values = np.concatenate([np.random.default_rng(0).random(10_000), [1e6]])
    scaler = MetricScaler.fit(values, floor=1e-3)
    assert scaler.high < 1.01


def test_scaler_constant_and_empty_data_use_the_floor() -> None:
    constant = MetricScaler.fit(np.full(50, 16.0), floor=0.5)
    assert (constant.low, constant.span) == (16.0, 0.5)
    assert constant.forward(np.array([16.0, 8.0])) == pytest.approx([0.0, -16.0])
    empty = MetricScaler.fit(np.array([NAN, NAN]), floor=2.0)
    assert (empty.low, empty.high) == (0.0, 2.0)
    assert MetricScaler.fit(np.full(5, 3.0), floor=0.0).span > 0


# --- PCA -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pca() -> PcaDenoiser:
    return PcaDenoiser(n_components=3).fit(windows(4000, seed=1)[0])


def test_pca_reduces_noise(pca: PcaDenoiser) -> None:
    noisy, clean = windows(2000, seed=2)
    out = pca.transform(noisy)
    assert out.shape == noisy.shape
    assert mse(out, clean) < 0.6 * mse(noisy, clean)
    assert pca.components_ is not None
    assert pca.components_.shape == (3, W)
    assert np.allclose(pca.components_ @ pca.components_.T, np.eye(3))


def test_pca_state_round_trip_is_identical(pca: PcaDenoiser) -> None:
    state = pca.state()
    assert sorted(state) == ["components_", "explained_variance_", "mean_"]
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float64 for a in state.values())
    params = json.loads(json.dumps(pca.params()))
    again = denoiser_class("pca").from_state(params, state)
    x = windows(100, seed=3)[0].reshape(10, 10, W)
    assert np.array_equal(again.transform(x), pca.transform(x))


def test_pca_matches_sklearn_reconstruction(pca: PcaDenoiser) -> None:
    from sklearn.decomposition import PCA

    train = windows(4000, seed=1)[0]
    x = windows(50, seed=4)[0]
    reference = PCA(n_components=3, svd_solver="full").fit(train)
    assert np.allclose(pca.transform(x), reference.inverse_transform(reference.transform(x)))


def test_pca_missing_samples(pca: PcaDenoiser) -> None:
    x = windows(3, seed=5)[0]
    x[0] = NAN
    x[1, [0, 4, 7]] = NAN
    out = pca.transform(x)
    assert np.isnan(out[0]).all()
    assert np.allclose(out[1], pca.transform(fill_nearest(x[1:2]))[0], rtol=0, atol=1e-12)
    assert np.allclose(out[2], pca.transform(x[2:3])[0], rtol=0, atol=1e-12)


def test_pca_fit_drops_windows_with_missing_samples() -> None:
    train = windows(500, seed=6)[0]
    dirty = train.copy()
    dirty[::5, 3] = NAN
    a = PcaDenoiser(n_components=2).fit(dirty)
    b = PcaDenoiser(n_components=2).fit(train[np.isfinite(dirty).all(axis=1)])
    assert np.allclose(a.state()["components_"], b.state()["components_"])
    with pytest.raises(ValueError, match="1 complete windows out of 3"):
        PcaDenoiser(n_components=2).fit(np.array([[NAN] * W, [1.0] * W, [NAN] + [1.0] * 7]))


def test_pca_refuses_use_before_fit_and_bad_input(pca: PcaDenoiser) -> None:
    with pytest.raises(ModelError, match="not fitted"):
        PcaDenoiser().transform(np.zeros((2, W)))
    with pytest.raises(ModelError, match="not fitted"):
        PcaDenoiser().state()
    with pytest.raises(ValueError, match=r"shape \(2, 7\): expected \(\.\.\., 8\)"):
        pca.transform(np.zeros((2, 7)))
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 8\)"):
        PcaDenoiser().fit(np.zeros((20, 9)))
    for bad in (0, 9):
        with pytest.raises(ValueError, match=f"n_components is {bad}"):
            PcaDenoiser(n_components=bad)


def test_pca_refuses_state_of_another_shape(pca: PcaDenoiser) -> None:
    state = pca.state()
    with pytest.raises(ModelError, match="components_ has shape"):
        PcaDenoiser(n_components=2).load_state(state)
    with pytest.raises(ModelError, match="expected"):
        PcaDenoiser().load_state({"mean_": state["mean_"]})


# --- LSTM-VAE ------------------------------------------------------------------------------------


def test_lstm_vae_imports_without_torch_and_says_how_to_install(monkeypatch) -> None:
    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    model = LstmVaeDenoiser()
    assert model.params()["hidden"] == 4
    with pytest.raises(ModelError, match=r"pip install 'minder\[deep\]' \(torch==2\.13\.0\)"):
        model.fit(np.zeros((10, W)))


def test_lstm_vae_refuses_bad_parameters() -> None:
    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    with pytest.raises(ValueError, match="hidden is 0"):
        LstmVaeDenoiser(hidden=0)
    with pytest.raises(ValueError, match="lr is -1"):
        LstmVaeDenoiser(lr=-1)
    with pytest.raises(ValueError, match="beta is"):
        LstmVaeDenoiser(beta=-1e-3)


FAST = {"epochs": 12, "batch_size": 32, "lr": 2e-2}
"""Small training for tests: a few hundred windows in about a second."""


@pytest.fixture(scope="module")
def vae_data() -> tuple[np.ndarray, np.ndarray]:
    return windows(400, seed=11, noise=0.01)[0], windows(200, seed=12, noise=0.01)[0]


@pytest.fixture(scope="module")
def vae(vae_data):
    pytest.importorskip("torch", reason="LSTM-VAE tests need PyTorch (the deep extra)")
    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    return LstmVaeDenoiser(**FAST).fit(vae_data[0])


def test_lstm_vae_training_lowers_reconstruction_error(vae, vae_data) -> None:
    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    train, held_out = vae_data
    # lr so small that the weights stay where they were initialised
    untrained = LstmVaeDenoiser(**{**FAST, "epochs": 1, "lr": 1e-12}).fit(train)
    trained_mse = mse(vae.transform(held_out), held_out)
    assert trained_mse < 0.2 * mse(untrained.transform(held_out), held_out)
    assert trained_mse < 5e-3
    assert vae.train_mse_ == pytest.approx(mse(vae.transform(train), train), rel=1e-3)


def test_lstm_vae_state_round_trip_reproduces_outputs(vae, vae_data) -> None:
    state = vae.state()
    assert "encoder.weight_ih_l0" in state
    assert "decoder.weight_hh_l0" in state
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in state.values())
    params = json.loads(json.dumps(vae.params()))
    again = denoiser_class("lstm_vae").from_state(params, state)
    x = vae_data[1].reshape(20, 10, W)
    out = again.transform(x)
    assert out.shape == x.shape
    assert out.dtype == np.float64
    assert np.array_equal(out, vae.transform(x))


def test_lstm_vae_is_deterministic_and_leaves_torch_settings_alone(vae, vae_data) -> None:
    import torch

    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    rng_state = torch.get_rng_state()
    threads = torch.get_num_threads()
    small = {**FAST, "epochs": 2}
    a = LstmVaeDenoiser(**small, seed=3).fit(vae_data[0])
    b = LstmVaeDenoiser(**small, seed=3).fit(vae_data[0])
    c = LstmVaeDenoiser(**small, seed=4).fit(vae_data[0])
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert torch.get_num_threads() == threads
    assert not torch.are_deterministic_algorithms_enabled()
    sa, sb, sc = a.state(), b.state(), c.state()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not all(np.array_equal(sa[k], sc[k]) for k in sa)
    x = vae_data[1]
    assert np.array_equal(a.transform(x), b.transform(x))


def test_lstm_vae_level_shift_stays_an_outlier(vae) -> None:
    # Peers of one job: the same rhythm, a little noise each; one machine's level shifts.
    rng = np.random.default_rng(21)
    rhythm = 0.5 + 0.1 * np.sin(2 * np.pi * np.arange(W) / 16)
    peers = rhythm + rng.normal(0, 0.01, (16, W))
    shifted = rhythm + 0.25
    out = vae.transform(np.vstack([peers, shifted]))
    centre = np.median(out[:-1], axis=0)
    normal_spread = np.linalg.norm(out[:-1] - centre, axis=1).max()
    assert np.linalg.norm(out[-1] - centre) > 5 * normal_spread


def test_lstm_vae_missing_samples(vae, vae_data) -> None:
    x = vae_data[1][:3].copy()
    x[0] = NAN
    x[1, [1, 2, 6]] = NAN
    out = vae.transform(x)
    assert np.isnan(out[0]).all()
    assert np.isfinite(out[1:]).all()
    assert np.allclose(out[1], vae.transform(fill_nearest(x[1:2]))[0], atol=1e-6)
    assert np.isnan(vae.transform(np.full((2, W), NAN))).all()


def test_lstm_vae_large_batches_match_small_ones(vae) -> None:
    from detectors.denoisers import lstm_vae

    n = lstm_vae._INFERENCE_BATCH + 7  # crosses a batch boundary
    x = np.tile(windows(n // 4 + 1, seed=13)[0], (4, 1))[:n].astype(np.float32)
    out = vae.transform(x)
    assert out.shape == x.shape
    assert np.allclose(out[:5], vae.transform(x[:5]), atol=1e-6)
    assert np.allclose(out[-5:], vae.transform(x[-5:]), atol=1e-6)


def test_lstm_vae_refuses_use_before_fit_and_foreign_state(vae) -> None:
    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    with pytest.raises(ModelError, match="not fitted"):
        LstmVaeDenoiser().transform(np.zeros((2, W)))
    with pytest.raises(ModelError, match="not fitted"):
        LstmVaeDenoiser().state()
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 8\)"):
        vae.transform(np.zeros((2, 4)))
    with pytest.raises(ModelError, match="has shape"):
        LstmVaeDenoiser(hidden=8).load_state(vae.state())
    partial = dict(vae.state())
    partial.pop("to_mu.bias")
    with pytest.raises(ModelError, match="expected"):
        LstmVaeDenoiser().load_state(partial)


@pytest.mark.slow
def test_lstm_vae_default_training_reaches_low_error() -> None:
    pytest.importorskip("torch", reason="LSTM-VAE tests need PyTorch (the deep extra)")
    from detectors.denoisers.lstm_vae import LstmVaeDenoiser

    train, _ = windows(20_000, seed=31, noise=0.0)
    held_out, _ = windows(1000, seed=32, noise=0.0)
    model = LstmVaeDenoiser().fit(train)  # the defaults
    mean_filter = mse(MeanDenoiser().transform(held_out), held_out)
    # better than the window mean: the model learnt the shape, not only the level
    assert mse(model.transform(held_out), held_out) < 0.5 * mean_filter
