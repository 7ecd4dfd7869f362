"""Priority tree, model directories, and training from a labelled table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collectors.sim import bundled_scenario, load_scenario, scenario_labels, simulate_table
from detectors.config import DetectorConfig
from detectors.denoisers import MetricScaler, denoiser_class
from detectors.engine import MinderDetector
from detectors.methods import method_factory
from detectors.model import MODEL_VERSION, DetectorModel, load_model
from detectors.offline import detect_table
from detectors.priority import DEFAULT_PRIORITY, MetricPriority
from detectors.training import train_model, validate_labels
from minder.core.errors import ModelError, TableError


def test_the_tree_puts_the_separating_metric_first() -> None:
    rng = np.random.default_rng(0)
    n = 400
    labels = rng.random(n) < 0.3
    pfc = np.where(labels, rng.uniform(8, 30, n), rng.uniform(0, 4, n))
    noise = rng.uniform(0, 10, n)  # says nothing about faults
    cpu = np.where(labels & (rng.random(n) < 0.5), rng.uniform(6, 9, n), rng.uniform(0, 5, n))
    features = np.column_stack([noise, cpu, pfc])
    priority = MetricPriority.fit(
        features, labels, ["gpu_power_watts", "cpu_util_ratio", "pfc_tx_pause_per_second"]
    )
    assert priority.order[0] == "pfc_tx_pause_per_second"
    assert priority.rank("pfc_tx_pause_per_second") == 0
    assert priority.rank("gpu_util_ratio") >= len(priority.order)  # unused: checked last
    assert "pfc_tx_pause_per_second" in priority.trusted


def test_priority_needs_both_kinds_of_window() -> None:
    with pytest.raises(ModelError, match="fault and normal"):
        MetricPriority.fit(np.ones((10, 1)), np.zeros(10), ["cpu_util_ratio"])
    with pytest.raises(ValueError, match="expected"):
        MetricPriority.fit(np.ones((10, 2)), np.zeros(9), ["cpu_util_ratio"])


def test_default_priority_is_the_papers() -> None:
    default = MetricPriority.default()
    assert default.order == list(DEFAULT_PRIORITY)
    assert default.trusts("gpu_sm_clock_hertz") and default.trusts("my_custom_ratio")


def _model() -> DetectorModel:
    rng = np.random.default_rng(0)
    windows = 0.5 + 0.1 * np.sin(np.linspace(0, 20, 8 * 300)).reshape(300, 8)
    windows += rng.normal(0, 0.01, windows.shape)
    pca = denoiser_class("pca")(window=8).fit(windows)
    features = rng.uniform(0, 10, size=(50, 2))
    labels = features[:, 0] > 5
    priority = MetricPriority.fit(features, labels, ["gpu_power_watts", "cpu_util_ratio"])
    return DetectorModel(
        window=8,
        denoiser="pca",
        denoisers={"gpu_power_watts": (MetricScaler(100.0, 700.0), pca)},
        priority=priority,
        info={"rows": 1},
    )


def test_model_round_trip(tmp_path: Path) -> None:
    model = _model()
    model.save(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.window == 8 and loaded.denoiser == "pca"
    assert loaded.priority is not None and model.priority is not None
    assert loaded.priority.order == model.priority.order
    scaler, denoiser = loaded.denoisers["gpu_power_watts"]
    assert (scaler.low, scaler.high) == (100.0, 700.0)
    x = np.random.default_rng(1).uniform(0.3, 0.7, size=(5, 8))
    np.testing.assert_allclose(
        denoiser.transform(x), model.denoisers["gpu_power_watts"][1].transform(x)
    )
    assert not list((tmp_path / "m").glob("*.pkl"))


def test_a_model_of_another_version_is_refused(tmp_path: Path) -> None:
    _model().save(tmp_path / "m")
    manifest = tmp_path / "m" / "model.json"
    data = json.loads(manifest.read_text())
    data["version"] = MODEL_VERSION + 1
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelError, match=f"version {MODEL_VERSION + 1}.*reads version"):
        load_model(tmp_path / "m")


def test_missing_and_damaged_models_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="holds no detector model"):
        load_model(tmp_path)
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(ModelError, match="not readable JSON"):
        load_model(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ModelError, match="manifest"):
        load_model(tmp_path)


def test_labels_are_validated() -> None:
    with pytest.raises(TableError, match="lack column"):
        validate_labels(pd.DataFrame({"job": ["j"]}))
    bad = pd.DataFrame(
        {"job": ["j"], "machine": ["m"], "start_ts": ["soon"], "end_ts": [2.0], "fault": ["x"]}
    )
    with pytest.raises(TableError, match="start_ts"):
        validate_labels(bad)
    backwards = bad.assign(start_ts=[5.0])
    with pytest.raises(TableError, match="ends before it starts"):
        validate_labels(backwards)


def test_a_trained_denoiser_needs_a_model() -> None:
    with pytest.raises(ModelError, match="must be trained"):
        MinderDetector(DetectorConfig(denoiser="pca"))
    with pytest.raises(ValueError, match="unknown denoiser"):
        MinderDetector(DetectorConfig(denoiser="fourier"))


@pytest.mark.slow
def test_train_then_detect_with_the_model(tmp_path: Path) -> None:
    scenario = load_scenario(bundled_scenario("demo"))
    table = simulate_table(scenario)
    labels = scenario_labels(scenario)
    model = train_model(table, labels, denoiser="pca", step_s=8, max_windows=2000)
    assert model.priority is not None and model.priority.order
    assert model.denoisers and model.info["labels"] == 1
    model.save(tmp_path / "model")
    loaded = load_model(tmp_path / "model")
    run = detect_table(table, method_factory("minder", model=loaded))
    assert {a.machine for a in run.alerts} == set(labels["machine"])
    alert = run.alerts[0]
    assert alert.detected_ts - labels["start_ts"].iloc[0] <= 5


def _two_job_table() -> pd.DataFrame:
    from minder.core.table import normalize_table

    rng = np.random.default_rng(0)
    rows = []
    for job, level in (("a", 0.3), ("b", 0.7)):
        for m in range(8):
            for sec in range(300):
                value = level + rng.normal(0, 0.005)
                rows.append((1000.0 + sec, job, f"{job}{m}", "cpu_util_ratio", value, ""))
    frame = pd.DataFrame(rows, columns=["ts", "job", "machine", "metric", "value", "device"])
    return normalize_table(frame.assign(group="", domain=""))


def test_training_samples_windows_from_the_whole_table() -> None:
    empty = pd.DataFrame(columns=["job", "machine", "start_ts", "end_ts", "fault"])
    model = train_model(_two_job_table(), empty, denoiser="pca", step_s=2, max_windows=300)
    scaler, _ = model.denoisers["cpu_util_ratio"]
    # Both jobs' levels are inside the learned range: job b was not crowded out by job a.
    assert scaler.low < 0.31 and scaler.high > 0.69
    assert model.priority is None  # no labels: denoisers only


def test_a_metric_with_too_few_windows_keeps_the_default_filter() -> None:
    table = _two_job_table()
    rare = table.iloc[:1].copy()
    rare["metric"] = pd.Categorical(["disk_read_bytes_per_second"])
    from minder.core.table import normalize_table

    both = normalize_table(pd.concat([table.astype({"metric": str}), rare.astype({"metric": str})]))
    empty = pd.DataFrame(columns=["job", "machine", "start_ts", "end_ts", "fault"])
    model = train_model(both, empty, denoiser="pca", step_s=2, max_windows=300)
    assert "cpu_util_ratio" in model.denoisers
    assert "disk_read_bytes_per_second" not in model.denoisers
    assert "disk_read_bytes_per_second" in model.info["skipped_metrics"]
