"""Denoisers compared: fit time, transform throughput, reconstruction error.

Run: ``python bench/denoiser_bench.py [--source synthetic|sim] [--metric NAME ...]``

For each denoiser (raw, mean, median, ewma, pca, lstm_vae) prints the fit wall time on the
training windows, the transform throughput on ``--windows`` windows (320,000 = 10,000 machines x
32 metrics, one detection second) with ``--threads`` threads (torch and BLAS), and the mean
squared error of the reconstruction against its input on held-out normal windows. With
``--source synthetic`` (default: level + slow sinusoid + Gaussian noise, about 0 … 1) it also
prints the error against the clean signal, i.e. how much noise the denoiser removes. With
``--source sim`` the windows come from the simulator's fault-free scenario: every series of the
given metrics, min-max normalised on the training machines (the first half), held out on the
other half.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sklearn.decomposition  # noqa: F401 (imported here so PCA's fit time excludes it)
from threadpoolctl import threadpool_limits

from collectors.sim import bundled_scenario, load_scenario, simulate_table
from detectors.denoisers import DENOISER_KINDS, MetricScaler, denoiser_class
from detectors.denoisers.base import Denoiser
from minder.core.errors import ModelError

W = 8


@dataclass
class Data:
    train: np.ndarray  # (n, W), no NaN
    test: np.ndarray  # (m, W), no NaN
    clean: np.ndarray | None  # (m, W) noise-free test windows, when known
    label: str


def synthetic(n_train: int, n_test: int, noise: float, seed: int) -> Data:
    def make(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        t = np.arange(W)
        level = rng.uniform(0.2, 0.8, (n, 1))
        amp = rng.uniform(0.0, 0.2, (n, 1))
        period = rng.uniform(6, 30, (n, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, 1))
        clean = level + amp * np.sin(2 * np.pi * t / period + phase)
        return clean + rng.normal(0, noise, clean.shape), clean

    rng = np.random.default_rng(seed)
    train, _ = make(n_train, rng)
    test, clean = make(n_test, rng)
    return Data(train, test, clean, f"synthetic level+sinusoid, noise sd {noise}")


def simulated(metrics: Sequence[str], n_train: int, n_test: int, seed: int) -> Data:
    table = simulate_table(load_scenario(bundled_scenario("fault-free")))
    table = table[table["metric"].isin(metrics)]
    if table.empty:
        sys.exit(f"no samples of {list(metrics)} in the fault-free scenario")
    sec = np.floor(table["ts"].to_numpy() - table["ts"].min()).astype(int)
    machines = table["machine"].cat.codes.to_numpy()
    half = machines.max() // 2 + 1
    train_parts, test_parts = [], []
    for metric in metrics:
        rows = (table["metric"] == metric).to_numpy()
        values = table["value"].to_numpy()[rows]
        series_key = (
            machines[rows].astype(np.int64) * 64 + table["device"].cat.codes.to_numpy()[rows]
        )
        keys, series = np.unique(series_key, return_inverse=True)
        grid = np.full((len(keys), sec.max() + 1), np.nan)
        grid[series, sec[rows]] = values
        is_train = keys // 64 < half
        scaler = MetricScaler.fit(grid[is_train], floor=1e-9)
        grid = scaler.forward(grid)
        windows = np.lib.stride_tricks.sliding_window_view(grid, W, axis=1)  # (series, t, W)
        train_parts.append(windows[is_train].reshape(-1, W))
        test_parts.append(windows[~is_train].reshape(-1, W))
    rng = np.random.default_rng(seed)

    def complete(parts: list[np.ndarray], n: int) -> np.ndarray:
        x = np.concatenate(parts)
        x = x[np.isfinite(x).all(axis=1)]
        return x[rng.choice(len(x), min(n, len(x)), replace=False)]

    return Data(
        complete(train_parts, n_train),
        complete(test_parts, n_test),
        None,
        f"simulator fault-free, {', '.join(metrics)} (train: first half of machines)",
    )


def build(kind: str, args: argparse.Namespace) -> Denoiser:
    cls = denoiser_class(kind)
    if kind == "pca":
        return cls(window=W, n_components=args.pca_components)  # type: ignore[call-arg]
    if kind == "lstm_vae":
        return cls(  # type: ignore[call-arg]
            window=W, hidden=args.lstm_hidden, epochs=args.lstm_epochs, seed=args.seed
        )
    return cls(window=W)


def throughput(model: Denoiser, windows: np.ndarray, repeat: int) -> tuple[float, float]:
    """Best windows/s over ``repeat`` runs, and the CPU seconds of that run."""
    model.transform(windows[:1000])  # warm-up: lazy imports, first-call allocations
    best, cpu = np.inf, np.nan
    for _ in range(repeat):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        model.transform(windows)
        wall = time.perf_counter() - wall0
        if wall < best:
            best, cpu = wall, time.process_time() - cpu0
    return windows.shape[0] / best, cpu


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=("synthetic", "sim"), default="synthetic")
    parser.add_argument("--metric", action="append", help="sim source: metrics (repeatable)")
    parser.add_argument("--train", type=int, default=20_000, help="training windows")
    parser.add_argument("--test", type=int, default=5_000, help="held-out windows")
    parser.add_argument("--windows", type=int, default=320_000, help="windows per transform")
    parser.add_argument("--threads", type=int, default=1, help="torch and BLAS threads")
    parser.add_argument("--noise", type=float, default=0.02, help="synthetic noise sd")
    parser.add_argument("--pca-components", type=int, default=3)
    parser.add_argument("--lstm-hidden", type=int, default=4, help="LSTM-VAE hidden size")
    parser.add_argument("--lstm-epochs", type=int, default=30, help="LSTM-VAE epochs")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs (best kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", nargs="+", default=list(DENOISER_KINDS))
    args = parser.parse_args(argv)

    if args.source == "sim":
        data = simulated(args.metric or ["gpu_power_watts"], args.train, args.test, args.seed)
    else:
        data = synthetic(args.train, args.test, args.noise, args.seed)
    reps = -(-args.windows // len(data.test))
    big = np.tile(data.test, (reps, 1))[: args.windows].astype(np.float32)

    try:
        import torch  # noqa: PLC0415 (optional: the deep extra)
        import torch._dynamo  # noqa: PLC0415 (once per process, ~2 s: Adam's constructor imports it)

        torch.set_num_threads(args.threads)
    except ImportError:
        pass  # lstm_vae reports the install hint in its row
    print(f"data: {data.label}; {len(data.train):,} training, {len(data.test):,} held-out windows")
    print(
        f"throughput: {len(big):,} windows of {W}, {args.threads} thread(s), best of {args.repeat}"
    )
    clean_col = " MSE vs clean" if data.clean is not None else ""
    print(
        f"{'denoiser':10} {'fit s':>7} {'windows/s':>12} {'cpu s':>6} {'MSE vs input':>13}"
        + clean_col
    )
    with threadpool_limits(args.threads):
        for kind in args.kinds:
            model = build(kind, args)
            try:
                t0 = time.perf_counter()
                model.fit(data.train)
                fit_s = time.perf_counter() - t0
            except ModelError as exc:  # e.g. torch missing: report and go on
                print(f"{kind:10} failed: {exc}")
                continue
            rate, cpu = throughput(model, big, args.repeat)
            out = model.transform(data.test)
            error = np.mean((out - data.test) ** 2)
            line = f"{kind:10} {fit_s:7.2f} {rate:12,.0f} {cpu:6.2f} {error:13.2e}"
            if data.clean is not None:
                line += f" {np.mean((out - data.clean) ** 2):13.2e}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
