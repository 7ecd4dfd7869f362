from __future__ import annotations

import numpy as np

from detectors.config import DetectorConfig
from detectors.engine import MinderDetector
from detectors.window import JobWindow
from minder.core.alert import AlertKind


def test_healthy_job_raises_nothing(run_stream) -> None:
    assert run_stream(machines=24, seconds=150) == []


def test_fail_slow_machine_is_named_after_continuity(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 5 and sec >= 1040:
            for g in range(4):
                s[("gpu_tensor_active_ratio", f"gpu{g}")] *= 0.3
                s[("gpu_power_watts", f"gpu{g}")] *= 0.6
        return s

    cfg = DetectorConfig(continuity_s=20)
    alerts = run_stream(machines=24, seconds=120, mutate=mutate, config=cfg)
    assert [(a.machine, a.kind) for a in alerts] == [("m005", AlertKind.SIMILARITY)]
    alert = alerts[0]
    assert alert.metric in {"gpu_tensor_active_ratio", "gpu_power_watts"}
    # Window mean needs a few seconds to cross, then continuity_s seconds: well under a minute.
    assert 1040 + cfg.continuity_s <= alert.detected_ts <= 1040 + cfg.continuity_s + cfg.window_s
    assert abs(alert.first_ts - 1040) <= cfg.window_s
    ev = alert.evidence
    assert abs(ev["z"]) > cfg.threshold and len(ev["machine_window"]) == len(
        ev["peer_median_window"]
    )
    assert ev["other_metrics"]  # the second deviating metric is named, not alerted twice


def test_short_blip_is_not_alerted(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 3 and 1040 <= sec < 1050:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] = 80.0
        return s

    assert run_stream(machines=16, seconds=120, mutate=mutate) == []


def test_without_continuity_the_blip_would_fire(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 3 and 1040 <= sec < 1050:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] = 80.0
        return s

    alerts = run_stream(
        machines=16, seconds=80, mutate=mutate, config=DetectorConfig(continuity_s=1)
    )
    assert {a.machine for a in alerts} == {"m003"}


def test_two_faulty_machines_are_both_named(run_stream) -> None:
    def mutate(m, sec, s):
        if m in (2, 9) and sec >= 1030:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 0.5
        return s

    alerts = run_stream(machines=20, seconds=90, mutate=mutate)
    assert sorted(a.machine for a in alerts) == ["m002", "m009"]


def test_whole_job_changing_together_is_not_an_outlier(run_stream) -> None:
    def mutate(m, sec, s):
        if 1030 <= sec < 1070:  # checkpoint: every machine idles at once
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] = 90.0 + m
                s[("gpu_tensor_active_ratio", f"gpu{g}")] = 0.0
                s[("gpu_util_ratio", f"gpu{g}")] = 0.0
        return s

    assert run_stream(machines=16, seconds=110, mutate=mutate) == []


def test_heavier_last_stage_is_compared_within_its_group(run_stream) -> None:
    def mutate(m, sec, s):
        if m >= 12:  # last pipeline stage (group pp3) works harder: not a fault
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 1.3
        return s

    assert run_stream(machines=16, seconds=90, mutate=mutate, groups=4) == []


def test_job_with_too_few_machines_skips_peers_but_not_hard_faults(run_stream, caplog) -> None:
    def mutate(m, sec, s):
        if m == 0 and sec == 1005:
            s[("gpu_xid_count", "gpu0")] = 1.0
        if m == 1:  # a deviation that peer scoring would flag in a larger job
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 0.3
        return s

    with caplog.at_level("INFO"):
        alerts = run_stream(machines=3, seconds=60, mutate=mutate)
    assert [(a.machine, a.metric) for a in alerts] == [("m000", "gpu_xid_count")]
    assert "fewer than 4" in caplog.text


def test_metric_a_machine_never_reports_does_not_make_it_an_outlier(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 4:
            for key in [k for k in s if k[0] == "gpu_tensor_active_ratio"]:
                del s[key]
        return s

    assert run_stream(machines=16, seconds=80, mutate=mutate) == []


def test_missing_samples_are_scored_on_what_is_present(run_stream) -> None:
    rng = np.random.default_rng(7)

    def mutate(m, sec, s):
        if m == 6 and sec >= 1030:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 0.5
        # 20 % of samples of every machine are lost
        for key in [k for k in s if rng.random() < 0.2]:
            del s[key]
        return s

    alerts = run_stream(machines=16, seconds=90, mutate=mutate)
    assert [a.machine for a in alerts] == ["m006"]
    assert "missing_samples" in alerts[0].evidence


def test_scores_are_exposed_per_machine(make_window) -> None:
    detector = MinderDetector()
    window: JobWindow = make_window(machines=8, seconds=10)
    detector.evaluate(window, 1009)
    scores = detector.machine_scores()
    assert "gpu_power_watts" in scores and len(scores["gpu_power_watts"][0]) == 8
    assert "gpu_xid_count" not in scores  # counts are for rules


def _slow_gpu2(m, sec, s):
    if m == 5 and sec >= 1040:
        s[("gpu_tensor_active_ratio", "gpu2")] *= 0.3
        s[("gpu_power_watts", "gpu2")] *= 0.6
    return s


def test_every_scorer_and_filter_names_the_machine_and_its_device(run_stream) -> None:
    cfg_kwargs = {"continuity_s": 20}
    variants = [
        MinderDetector(DetectorConfig(**cfg_kwargs)),
        MinderDetector(DetectorConfig(**cfg_kwargs), scorer="pairwise"),
        MinderDetector(DetectorConfig(**cfg_kwargs, denoiser="median")),
        MinderDetector(DetectorConfig(**cfg_kwargs, denoiser="ewma")),
        MinderDetector(DetectorConfig(**cfg_kwargs), denoise=False, prioritise=False),
    ]
    for detector in variants:
        alerts = run_stream(machines=24, seconds=100, mutate=_slow_gpu2, detector=detector)
        assert [(a.machine, a.devices) for a in alerts] == [("m005", ("gpu2",))], (
            detector.scorer,
            detector.config.denoiser,
        )
        ev = alerts[0].evidence
        assert ev["method"] == f"peer_{detector.scorer}"
        assert ev["direction"] == "below"


def test_priority_names_the_higher_ranked_metric(run_stream) -> None:
    prioritised = run_stream(machines=24, seconds=100, mutate=_slow_gpu2)
    by_score = run_stream(
        machines=24,
        seconds=100,
        mutate=_slow_gpu2,
        detector=MinderDetector(prioritise=False),
    )
    # gpu_power_watts ranks above tensor activity in the paper's order.
    assert prioritised[0].metric == "gpu_power_watts"
    assert prioritised[0].evidence["priority_rank"] == 3
    assert by_score[0].evidence["priority_rank"] is None


def test_a_metric_one_machine_never_reports_does_not_make_it_an_outlier(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 2:
            del s[("cpu_util_ratio", "")]
            for g in range(4):
                del s[("gpu_power_watts", f"gpu{g}")]
        return s

    assert run_stream(machines=16, seconds=100, mutate=mutate) == []


def test_missing_samples_are_scored_and_reported_in_evidence(run_stream) -> None:
    def mutate(m, sec, s):
        s = _slow_gpu2(m, sec, s)
        if m == 5 and sec % 4 == 0:
            del s[("gpu_power_watts", "gpu2")]
        return s

    alerts = run_stream(machines=24, seconds=100, mutate=mutate)
    assert [a.machine for a in alerts] == ["m005"]
    assert alerts[0].evidence["missing_samples"] >= 1


def test_a_severe_deviation_is_confirmed_before_the_mild_continuity(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 4 and sec >= 1040:  # the training process died: GPUs idle
            for g in range(4):
                s[("gpu_util_ratio", f"gpu{g}")] = 0.0
                s[("gpu_tensor_active_ratio", f"gpu{g}")] = 0.0
                s[("gpu_power_watts", f"gpu{g}")] = 60.0
        return s

    cfg = DetectorConfig(continuity_s=60, severe_continuity_s=20)
    alerts = run_stream(machines=24, seconds=120, mutate=mutate, config=cfg)
    assert [a.machine for a in alerts] == ["m004"]
    assert alerts[0].detected_ts - 1040 <= 20 + cfg.window_s


def test_a_gap_in_the_stream_breaks_continuity(run_stream) -> None:
    def mutate(m, sec, s):
        return _slow_gpu2(m, 1040 + sec % 1000, s)  # deviating from the first second

    detector = MinderDetector(DetectorConfig(continuity_s=30))
    first = run_stream(machines=24, seconds=25, mutate=mutate, detector=detector, start=1000)
    # 270 s later: without the reset the 25 s before the gap would count, alerting at once.
    after = run_stream(machines=24, seconds=20, mutate=mutate, detector=detector, start=1300)
    assert first == [] and after == []
    assert detector.continuity.run_length("gpu_power_watts", 5) < 25
