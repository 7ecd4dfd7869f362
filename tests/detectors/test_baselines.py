"""The baseline detectors (Mahalanobis, PyOD) behind the engine's interface."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from detectors.baselines import (
    BASELINE_METHODS,
    DEFAULT_STRIDES,
    DEFAULT_THRESHOLDS,
    BaselineDetector,
    baseline_factory,
    build_features,
    feature_layout,
    robust_z,
)
from detectors.config import DetectorConfig
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.errors import ValidationError

GPU_METRICS = ("gpu_power_watts", "gpu_tensor_active_ratio", "gpu_util_ratio")
FAULT_START, FAULT_END = 1030, 1090


def _stream(
    make_window: Callable[..., JobWindow],
    detector: BaselineDetector,
    machines: int = 32,
    seconds: int = 120,
    mutate: Callable[..., object] | None = None,
    seed: int = 0,
    start: int = 1000,
) -> tuple[list[Alert], JobWindow]:
    """Replay ``seconds`` of a training-like job one second at a time; return alerts and window.

    The job is generated in one go, so each machine keeps its own small persistent offset (as
    real machines do), then fed to the detector's window second by second.
    """
    recorded = make_window(
        machines=machines,
        seconds=seconds,
        mutate=mutate,
        start=start,
        seed=seed,
        horizon_s=seconds + 1,
    )
    window = JobWindow("job", horizon_s=detector.horizon_s)
    for info in recorded.machines:
        window.machine_id(info.name, info.group, info.domain)
    for metric, device in recorded.series:
        window.series_id(metric, device)
    alerts: list[Alert] = []
    for sec in range(start, start + seconds):
        values = recorded.at(sec)
        machine_idx, cols = np.nonzero(np.isfinite(values))
        window.add_arrays(sec, machine_idx, cols, values[machine_idx, cols])
        alerts.extend(detector.evaluate(window, sec))
    return alerts, window


def _slow_gpus(metrics: tuple[str, ...], machine: int = 5, factor: float = 0.5) -> Callable:
    """``machine``'s GPUs read ``factor`` of their value on ``metrics`` for 60 s."""

    def mutate(m: int, sec: int, sample: dict) -> dict:
        if m == machine and FAULT_START <= sec < FAULT_END:
            for g in range(4):
                for metric in metrics:
                    sample[(metric, f"gpu{g}")] *= factor
        return sample

    return mutate


@pytest.mark.parametrize("method", BASELINE_METHODS)
def test_every_method_names_the_machine_whose_gpus_deviate(
    make_window: Callable[..., JobWindow], method: str
) -> None:
    cfg = DetectorConfig()
    detector = BaselineDetector(method, cfg)
    alerts, window = _stream(make_window, detector, mutate=_slow_gpus(GPU_METRICS))
    assert [(a.machine, a.kind) for a in alerts] == [("m005", AlertKind.SIMILARITY)]
    alert = alerts[0]
    # Continuity: at least continuity_s seconds of data after the window first shows the
    # fault, and no later than a window, a stride and the continuity after the onset.
    assert alert.detected_ts >= FAULT_START + cfg.continuity_s - 1
    assert alert.detected_ts <= FAULT_START + cfg.window_s + detector.stride_s + cfg.continuity_s
    assert FAULT_START - cfg.window_s <= alert.first_ts <= FAULT_START + detector.stride_s
    assert alert.metric in GPU_METRICS and alert.devices and alert.devices[0].startswith("gpu")
    assert alert.score == pytest.approx(alert.evidence["z"], abs=1e-3)
    assert alert.score > detector.threshold
    ev = alert.evidence
    assert ev["method"] == method and ev["threshold"] == DEFAULT_THRESHOLDS[method]
    assert ev["peers"] == 32 and ev["missing_features"] == 0
    assert len(ev["top_features"]) == 3
    for metric, device, value in ev["top_features"]:
        assert metric in GPU_METRICS and device.startswith("gpu") and value < -5
    assert ev["top_features"][0][:2] == [alert.metric, alert.devices[0]]
    scores = detector.machine_scores()
    z, devices = scores[method]
    assert len(z) == len(devices) == window.n_machines and set(devices) == {-1}


@pytest.mark.parametrize("method", ["mahalanobis", "iforest", "lof"])
def test_one_deviating_metric_is_enough_for_distance_and_isolation(
    make_window: Callable[..., JobWindow], method: str
) -> None:
    # ECOD and COPOD add up per-feature tail probabilities, each capped near log(N): one metric
    # on 4 of 17 features does not lift their sum out of the noise, which the benchmark shows.
    detector = BaselineDetector(method)
    alerts, _ = _stream(make_window, detector, mutate=_slow_gpus(("gpu_power_watts",)))
    assert [a.machine for a in alerts] == ["m005"]
    assert alerts[0].metric == "gpu_power_watts"


@pytest.mark.parametrize("method", BASELINE_METHODS)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_healthy_noisy_job_raises_nothing(
    make_window: Callable[..., JobWindow], method: str, seed: int
) -> None:
    detector = BaselineDetector(method)
    alerts, _ = _stream(make_window, detector, seed=seed)
    assert alerts == []
    assert detector.scored_evaluations == -(-120 // detector.stride_s)


def test_a_short_blip_is_not_alerted(make_window: Callable[..., JobWindow]) -> None:
    def blip(m: int, sec: int, sample: dict) -> dict:
        if m == 3 and 1040 <= sec < 1050:
            for g in range(4):
                sample[("gpu_power_watts", f"gpu{g}")] = 80.0
        return sample

    detector = BaselineDetector("mahalanobis")
    alerts, _ = _stream(make_window, detector, mutate=blip)
    assert alerts == []
    assert max(detector.last_z) < detector.threshold  # the blip has left the window
    without = BaselineDetector("mahalanobis", replace(DetectorConfig(), continuity_s=1))
    # Without continuity the blip fires (and so does any second of noise a mild machine has).
    assert "m003" in {a.machine for a in _stream(make_window, without, mutate=blip)[0]}


def test_a_job_below_min_machines_is_skipped_with_one_log_line(
    make_window: Callable[..., JobWindow], caplog: pytest.LogCaptureFixture
) -> None:
    detector = BaselineDetector("mahalanobis")
    with caplog.at_level(logging.INFO, logger="detectors.baselines"):
        alerts, _ = _stream(make_window, detector, machines=3, seconds=40)
    assert alerts == []
    lines = [r for r in caplog.records if r.name == "detectors.baselines"]
    assert len(lines) == 1
    assert "3 machine(s)" in lines[0].getMessage() and "fewer than 4" in lines[0].getMessage()
    assert detector.scored_evaluations == 0
    assert detector.machine_scores() == {"mahalanobis": ([0.0] * 3, [-1] * 3)}


def test_a_metric_one_machine_never_reports_does_not_make_it_an_outlier(
    make_window: Callable[..., JobWindow],
) -> None:
    def no_cpu(m: int, sec: int, sample: dict) -> dict:
        if m == 7:
            del sample[("cpu_util_ratio", "")]
            del sample[("pfc_tx_pause_per_second", "mlx5_1")]
        return sample

    detector = BaselineDetector("mahalanobis")
    alerts, window = _stream(make_window, detector, mutate=no_cpu)
    assert alerts == []
    features = build_features(window, 1119, feature_layout(window), detector.config)
    row = int(np.flatnonzero(features.machines == 7)[0])
    assert features.missing[row] == 2
    assert features.missing.sum() == 2
    assert np.isfinite(features.values).all()


def test_a_machine_missing_most_features_is_skipped_not_scored(
    make_window: Callable[..., JobWindow],
) -> None:
    def sparse(m: int, sec: int, sample: dict) -> dict:
        if m == 4:
            return {("cpu_util_ratio", ""): 0.99}  # far off, but alone
        return sample

    detector = BaselineDetector("mahalanobis")
    alerts, window = _stream(make_window, detector, mutate=sparse, seconds=60)
    assert alerts == []
    features = build_features(window, 1059, feature_layout(window), detector.config)
    assert 4 not in features.machines and features.machines.size == 31
    assert detector.last_z[4] == 0.0


def test_a_series_nobody_reports_is_dropped(make_window: Callable[..., JobWindow]) -> None:
    window = make_window(machines=16, seconds=20)
    layout_before = feature_layout(window)
    window.series_id("gpu_temperature_celsius", "gpu0")  # registered, never a sample
    # ...and one only two machines report: no peers to compare with either.
    for m in (0, 1):
        window.add_samples(1019, f"m{m:03d}", [("gpu_sm_clock_hertz", "gpu0", 1.4e9)])
    layout = feature_layout(window)
    assert layout.cols.size == layout_before.cols.size + 2
    features = build_features(window, 1019, layout, DetectorConfig())
    kept = {layout.metrics[j] for j in features.features}
    assert "gpu_temperature_celsius" not in kept and "gpu_sm_clock_hertz" not in kept
    assert features.features.size == layout_before.cols.size
    assert features.machines.size == 16


def test_features_compare_each_machine_with_its_group(
    make_window: Callable[..., JobWindow],
) -> None:
    def heavy_last_stage(m: int, sec: int, sample: dict) -> dict:
        if m >= 12:  # group pp3 carries 8 % more load, as a last pipeline stage does
            for g in range(4):
                sample[("gpu_power_watts", f"gpu{g}")] *= 1.08
        return sample

    window = make_window(machines=16, seconds=20, mutate=heavy_last_stage, groups=4)
    layout = feature_layout(window)
    power = [i for i, j in enumerate(layout.cols) if layout.metrics[i] == "gpu_power_watts"]
    cfg = DetectorConfig()
    by_group = build_features(window, 1019, layout, cfg).values[:, power]
    by_job = build_features(window, 1019, layout, cfg, group_aware=False).values[:, power]
    assert np.abs(np.median(by_group[12:], axis=0)).max() < 1
    assert np.median(by_job[12:], axis=0).min() > 1.5


def test_unknown_method_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValidationError, match=r"'knn'.*mahalanobis, iforest, ecod, copod, lof"):
        BaselineDetector("knn")
    with pytest.raises(ValueError, match="one of"):
        baseline_factory("knn")  # at once, before any job
    with pytest.raises(ValidationError, match="stride_s"):
        BaselineDetector("ecod", stride_s=0)


def test_the_factory_builds_fresh_detectors_with_its_arguments() -> None:
    factory = baseline_factory("iforest", threshold=7.5, stride_s=5)
    first, second = factory(), factory()
    assert first is not second
    assert (first.method, first.threshold, first.stride_s) == ("iforest", 7.5, 5)


@pytest.mark.parametrize(("stride", "fits"), [(None, 2), (1, 20), (7, 3)])
def test_pyod_models_are_fitted_once_per_stride(
    make_window: Callable[..., JobWindow],
    monkeypatch: pytest.MonkeyPatch,
    stride: int | None,
    fits: int,
) -> None:
    from pyod.models.iforest import IForest

    calls: list[int] = []
    real_fit = IForest.fit

    def counting_fit(self: IForest, X: np.ndarray, y: object = None) -> IForest:
        calls.append(X.shape[0])
        return real_fit(self, X, y)

    monkeypatch.setattr(IForest, "fit", counting_fit)
    detector = BaselineDetector("iforest", stride_s=stride)
    _stream(make_window, detector, machines=8, seconds=20)
    assert len(calls) == fits == detector.scored_evaluations
    assert set(calls) == {8}
    assert DEFAULT_STRIDES["iforest"] == 10


def test_continuity_counts_seconds_of_data_not_strided_evaluations(
    make_window: Callable[..., JobWindow],
) -> None:
    cfg = DetectorConfig(continuity_s=30)
    detector = BaselineDetector("mahalanobis", cfg, stride_s=10)
    alerts, _ = _stream(make_window, detector, mutate=_slow_gpus(GPU_METRICS))
    assert len(alerts) == 1
    alert = alerts[0]
    # Evaluations at 1000, 1010, ...: the first that sees the fault starts the run, the one
    # 30 s later (4 candidate evaluations spanning 31 s) fires.
    run_start = alert.first_ts + cfg.window_s // 2
    assert run_start % 10 == 0 and FAULT_START <= run_start <= FAULT_START + 10
    assert alert.detected_ts == run_start + 30


def test_one_alert_per_episode_and_a_new_one_after_rearm(
    make_window: Callable[..., JobWindow],
) -> None:
    def twice(m: int, sec: int, sample: dict) -> dict:
        if m == 5 and (1010 <= sec < 1060 or 1110 <= sec < 1160):
            for g in range(4):
                for metric in GPU_METRICS:
                    sample[(metric, f"gpu{g}")] *= 0.5
        return sample

    short = DetectorConfig(rearm_s=30, continuity_s=20)
    alerts, _ = _stream(
        make_window, BaselineDetector("mahalanobis", short), mutate=twice, seconds=180
    )
    assert [a.machine for a in alerts] == ["m005", "m005"]
    assert alerts[0].first_ts < 1060 < 1110 <= alerts[1].first_ts + short.window_s
    long = replace(short, rearm_s=120)
    alerts, _ = _stream(
        make_window, BaselineDetector("mahalanobis", long), mutate=twice, seconds=180
    )
    assert [a.machine for a in alerts] == ["m005"]


def test_two_deviating_machines_are_both_named(make_window: Callable[..., JobWindow]) -> None:
    def two(m: int, sec: int, sample: dict) -> dict:
        if m in (5, 20) and sec >= FAULT_START:
            for g in range(4):
                for metric in GPU_METRICS:
                    sample[(metric, f"gpu{g}")] *= 0.5 if m == 5 else 0.6
        return sample

    alerts, _ = _stream(make_window, BaselineDetector("mahalanobis"), mutate=two)
    assert sorted(a.machine for a in alerts) == ["m005", "m020"]


def test_robust_z_of_identical_scores_is_zero_and_floors_apply() -> None:
    assert robust_z(np.full(8, 3.0)).tolist() == [0.0] * 8
    scores = np.array([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.5])
    assert robust_z(scores)[-1] > 20  # MAD alone: 0.015
    assert robust_z(scores, floor=0.1)[-1] == pytest.approx(5.0)
    with_nan = robust_z(np.array([1.0, np.nan, 2.0, np.inf]))
    assert np.isnan(with_nan[1]) and np.isnan(with_nan[3])


def test_a_job_of_identical_machines_is_not_scored_as_outliers() -> None:
    # Noiseless and identical: every feature sits on its peers' median.
    window = JobWindow("job", horizon_s=64)
    for sec in range(1000, 1012):
        for m in range(8):
            window.add_samples(
                sec, f"m{m}", [("gpu_power_watts", f"gpu{g}", 600.0 + g) for g in range(4)]
            )
    for method in BASELINE_METHODS:
        detector = BaselineDetector(method, stride_s=1)
        alerts = [a for sec in range(1000, 1012) for a in detector.evaluate(window, sec)]
        assert alerts == []
        assert detector.scored_evaluations == 12
        assert detector.last_z.tolist() == [0.0] * 8


@pytest.mark.slow
def test_each_method_on_a_cut_down_three_faults_scenario() -> None:
    """The bundled 'three-faults' cut to 64 machines x 20 min (all five: ~30 s of CPU)."""
    import yaml

    from collectors.sim import Scenario, bundled_scenario, scenario_labels, simulate_table
    from detectors.offline import detect_table

    raw = yaml.safe_load(bundled_scenario("three-faults").read_text())
    raw["duration_s"] = 1200
    raw["jobs"][0].update(machines=64, pp_stages=4)
    pcie, nic, ecc = raw["faults"]
    raw["faults"] = [pcie, {**nic, "machine": 50, "start_s": 700}, {**ecc, "start_s": 1000}]
    raw["confounders"] = [{"type": "blip", "machine": 20, "start_s": 150}]
    scenario = Scenario.model_validate(raw)
    table = simulate_table(scenario)
    labels = scenario_labels(scenario)
    onsets = labels.set_index("machine")["start_ts"].to_dict()
    stall = labels.loc[labels["fault"] == "ecc_error", "machine"].item()
    for method in BASELINE_METHODS:
        alerts = detect_table(table, factory=baseline_factory(method)).alerts
        named = {a.machine for a in alerts}
        assert named <= set(onsets), method  # no false alarm on the 61 healthy machines
        assert stall in named, method  # a stalled machine stands out to every method
        assert len(alerts) == len(named), method  # one alert per fault
        if method in ("mahalanobis", "lof"):
            assert named == set(onsets), method
            for alert in alerts:
                assert 0 <= alert.detected_ts - onsets[alert.machine] <= 60, method
