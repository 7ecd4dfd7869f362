"""The independent generator and its suite: valid tables, labels that match the data,
determinism, a seed stream of its own, and the harness end to end (matching, per-cadence report,
CLI), without asserting any score of the detector (it changes in parallel)."""

from __future__ import annotations

import ast
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from detectors.window import JobWindow
from minder.benchmark import runner as runner_module
from minder.benchmark import suite as tuned_suite
from minder.benchmark.independent import generator as generator_module
from minder.benchmark.independent import run as run_module
from minder.benchmark.independent.cases import (
    INDEPENDENT_STREAM,
    INTERVALS,
    MIN_FAULT_SAMPLES,
    TWO_FAULTS,
    IndependentCase,
    build_independent_suite,
    draw_case,
    recipe,
)
from minder.benchmark.independent.generator import (
    FAULT_KINDS,
    GPUS,
    HALTING,
    LABEL_COLUMNS,
    NICS,
    RANKS,
    FaultSpec,
    Halt,
    JobSpec,
    Pattern,
    generate_table,
    job_labels,
)
from minder.benchmark.independent.report import markdown_independent
from minder.benchmark.independent.run import run_independent
from minder.benchmark.runner import BenchOptions, run_benchmark
from minder.cli.bench import bench_app
from minder.core.alert import Alert, AlertKind
from minder.core.metrics import METRICS, validate_device
from minder.core.table import validate_table

PACKAGE = Path(run_module.__file__).parent


def small_case(kind: str, interval_s: int, machines: int = 16, index: int = 3) -> IndependentCase:
    """A case of the suite's own draws, small enough for a test."""
    return draw_case(kind, machines, seed=11, index=index, interval_s=interval_s)


def assert_same_table(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Same columns, dtypes and values (categoricals by categories and codes: pandas' own
    comparison takes seconds on string categories)."""
    assert list(a.columns) == list(b.columns)
    for column in a.columns:
        left, right = a[column], b[column]
        assert left.dtype == right.dtype, column
        if isinstance(left.dtype, pd.CategoricalDtype):
            assert list(left.cat.categories) == list(right.cat.categories), column
            assert np.array_equal(left.cat.codes.to_numpy(), right.cat.codes.to_numpy()), column
        else:
            assert np.array_equal(left.to_numpy(), right.to_numpy()), column


def pivot(table: pd.DataFrame, metric: str, device: str) -> pd.DataFrame:
    """Samples of one series: ts x machine."""
    rows = table[(table["metric"] == metric) & (table["device"] == device)]
    return rows.pivot_table(index="ts", columns="machine", values="value", observed=True)


# -- tables ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "interval_s"),
    [
        *((kind, 5 if i % 2 else 60) for i, kind in enumerate(FAULT_KINDS)),
        (TWO_FAULTS, 10),
        ("lockstep", 30),
        ("serving", 15),
    ],
)
def test_tables_are_canonical(kind: str, interval_s: int) -> None:
    case = small_case(kind, interval_s, machines=8)
    table = case.table()
    assert_same_table(validate_table(table), table)
    for (metric, device), values in table.groupby(["metric", "device"], observed=True)["value"]:
        spec = METRICS[str(metric)]
        validate_device(spec, str(device))
        assert values.between(spec.lower, spec.upper).all(), (metric, device)
    names = case.spec.machine_names()
    assert set(table["machine"].unique()) <= set(names)
    assert table["ts"].min() == case.spec.origin
    spacing = np.diff(np.unique(table["ts"].to_numpy()))
    assert set(spacing.tolist()) == {float(interval_s)}


def test_label_columns_are_the_matchings() -> None:
    from collectors.sim.labels import LABEL_COLUMNS as SIMULATOR_COLUMNS

    assert LABEL_COLUMNS == SIMULATOR_COLUMNS
    labels = small_case("switch_reboot", 15).labels()
    assert tuple(labels.columns) == LABEL_COLUMNS
    assert len(labels) == 8 and labels["domain"].nunique() == 1
    assert labels["fault_index"].nunique() == 1


def test_the_runner_knows_the_independent_suites() -> None:
    from minder.benchmark.independent.cases import SUITES
    from minder.benchmark.suite import INDEPENDENT_SUITES

    assert INDEPENDENT_SUITES == SUITES  # written out in suite.py: no import cycle


def test_generator_shares_no_code_with_the_simulator() -> None:
    """The generator and the case draws import only minder.core of ours."""
    for name in ("generator.py", "cases.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            top = module.split(".")[0]
            assert top not in ("collectors", "detectors", "whatif"), (name, module)
            if top == "minder":
                assert module.startswith(("minder.core", "minder.benchmark.independent")), module


# -- labels against the data -------------------------------------------------------------------


def _ratio(frame: pd.DataFrame, machine: str) -> pd.Series:
    """The machine's value over its peers' median, per sample."""
    peers = frame.drop(columns=[machine]).median(axis=1)
    return frame[machine] / peers


def _signature(spec: JobSpec, fault: FaultSpec) -> tuple[str, str]:
    """The series a fault shows in most plainly."""
    gpu = GPUS[fault.devices[0]] if fault.devices else "gpu0"
    return {
        "nic_down": ("rdma_tx_bytes_per_second", NICS[fault.devices[0]] if fault.devices else ""),
        "cuda_execution_error": ("gpu_util_ratio", "gpu0"),
        "gpu_execution_error": ("gpu_power_watts", gpu),
        "gpu_lost": ("gpu_power_watts", gpu),
        "nvlink_error": ("gpu_nvlink_tx_bytes_per_second", "gpu0"),
        "thermal_throttle": ("gpu_sm_clock_hertz", gpu),
        "switch_reboot": ("rdma_tx_bytes_per_second", "mlx5_0"),
        "flapping_worker": (
            "train_busy_seconds",
            RANKS[fault.devices[0]] if fault.devices else "rank0",
        ),
    }[fault.kind]


@pytest.mark.parametrize("kind", FAULT_KINDS)
@pytest.mark.parametrize("interval_s", [1, 15, 60])
def test_faulty_machine_deviates_over_its_label(kind: str, interval_s: int) -> None:
    case = small_case(kind, interval_s, index=5)
    spec = case.spec
    (fault,) = spec.faults
    table = case.table()
    labels = case.labels()
    assert set(labels["fault"]) == {kind}
    start, end = float(labels["start_ts"].iloc[0]), float(labels["end_ts"].iloc[0])
    assert end - start >= MIN_FAULT_SAMPLES * interval_s
    metric, device = _signature(spec, fault)
    frame = pivot(table, metric, device)
    machine = str(labels["machine"].iloc[0])
    before = frame[frame.index < start - interval_s]
    inside = frame[(frame.index >= start + interval_s) & (frame.index <= end)]
    assert len(before) >= 30
    # Before the onset the faulty machine is one of its peers.
    calm = _ratio(before, machine)
    assert ((calm > 0.75) & (calm < 1.33)).mean() >= 0.95
    if kind == "gpu_lost":
        lost = table[(table["machine"] == machine) & (table["device"] == device)]
        assert lost["ts"].max() < start + 1
        assert inside.drop(columns=[machine]).notna().all().all()
        return
    assert len(inside) >= MIN_FAULT_SAMPLES - 1
    ratio = _ratio(inside, machine)
    # A missed scrape (NaN) is neither zero nor traffic.
    if kind == "nic_down":
        assert (inside[machine].dropna() == 0).all()
        assert (inside.drop(columns=[machine]).fillna(1.0) > 0).all().all()
    elif kind == "switch_reboot":
        domain = list(labels["machine"])
        assert (inside[domain].fillna(0.0) == 0).all().all()
        assert (inside.drop(columns=domain).fillna(1.0) > 0).all().all()
    elif kind == "cuda_execution_error":
        assert (inside[machine].dropna() <= 0.02).all()
        assert (inside.drop(columns=[machine]).median(axis=1) > 0.3).all()
    elif kind == "gpu_execution_error":
        assert ratio.median() < 0.85
    elif kind == "nvlink_error":
        assert ratio.max() < 0.4 and ratio.median() < 0.25
    elif kind == "thermal_throttle":
        assert ratio.max() < 0.85
    elif kind == "flapping_worker":
        assert ratio.max() > 1.2  # slow turns …
        assert ratio.min() < 1.1  # … and normal ones between them
    if fault.halt is Halt.STOP:
        assert table["ts"].max() <= end + interval_s
    elif fault.halt is Halt.IDLE:
        util = pivot(table, "gpu_util_ratio", "gpu0")
        after = util[util.index > end + interval_s + 1]
        assert len(after) > 0 and (after.fillna(0.0) <= 0.02).all().all()


def test_two_faults_are_on_two_machines_at_two_onsets() -> None:
    case = small_case(TWO_FAULTS, 15, machines=32)
    labels = case.labels()
    assert case.fault == TWO_FAULTS
    assert sorted(labels["fault_index"]) == [0, 1]
    assert labels["machine"].nunique() == 2
    assert labels["start_ts"].nunique() == 2


@given(
    seed=st.integers(0, 2**31 - 1),
    interval_s=st.sampled_from(INTERVALS),
    machines=st.sampled_from([8, 16, 32]),
    step_s=st.floats(2.5, 45.0),
)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_lockstep_peers_agree_while_the_job_swings(
    seed: int, interval_s: int, machines: int, step_s: float
) -> None:
    spec = JobSpec("ls", Pattern.LOCKSTEP, machines, interval_s, 60, seed, step_s=step_s)
    table = generate_table(spec)
    assert job_labels(spec).empty
    frame = pivot(table, "gpu_tensor_active_ratio", "gpu3")
    median = frame.median(axis=1)
    within = ((frame.div(median, axis=0) - 1.0).abs() <= 0.2).mean(axis=1)
    assert within.median() >= 0.9  # peers agree at nearly every instant
    power = pivot(table, "gpu_power_watts", "gpu0").median(axis=1)
    assert power.max() / power.min() <= 4.5  # a swing of 4x at most, noise aside


@given(seed=st.integers(0, 2**31 - 1), interval_s=st.sampled_from(INTERVALS))
@settings(max_examples=8, deadline=None)
def test_serving_fleet_idles_with_rotating_busy_machines(seed: int, interval_s: int) -> None:
    spec = JobSpec("sv", Pattern.SERVING, 32, interval_s, 200, seed)
    table = generate_table(spec)
    assert job_labels(spec).empty
    assert set(table["group"].unique()) == {"serve"}
    util = pivot(table, "gpu_util_ratio", "gpu0")
    assert (util < 0.15).to_numpy().mean() > 0.6  # most machines near 0 most of the time
    busy = util > 0.3
    assert busy.sum(axis=1).median() >= 1  # a few busy at a time …
    assert busy.any(axis=0).sum() >= 5  # … and not always the same ones


# -- determinism and seeds ----------------------------------------------------------------------


def test_same_seed_same_table_other_seed_other_table() -> None:
    case = small_case("nvlink_error", 15)
    assert_same_table(case.table(), case.table())
    pd.testing.assert_frame_equal(case.labels(), case.labels())
    assert build_independent_suite("independent", 3, 30) == build_independent_suite(
        "independent", 3, 30
    )
    other = draw_case("nvlink_error", 16, seed=12, index=3, interval_s=15)
    assert other.spec != case.spec
    a, b = case.table(), other.table()
    assert len(a) != len(b) or not np.array_equal(a["value"], b["value"])


def test_the_stream_is_none_of_the_tuned_suites() -> None:
    tuned = {*tuned_suite._STREAMS.values(), tuned_suite._FULL_STREAM}
    assert INDEPENDENT_STREAM not in tuned
    assert tuned_suite._MEMBERSHIP_STREAM != INDEPENDENT_STREAM


def test_every_class_at_every_interval_for_at_least_eight_samples() -> None:
    onsets: dict[str, list[int]] = {}
    for interval in INTERVALS:
        cases = build_independent_suite("independent", 0, interval)
        kinds = {f.kind for c in cases for f in c.spec.faults}
        assert kinds == set(FAULT_KINDS), interval
        alone = Counter(c.fault for c in cases if len(c.spec.faults) == 1)
        assert all(alone[kind] >= 2 for kind in FAULT_KINDS), alone
        for case in cases:
            assert case.interval_s == interval
            for fault in case.spec.faults:
                assert fault.samples >= MIN_FAULT_SAMPLES
                if fault.kind in HALTING:
                    assert 8 <= fault.samples <= 16
            if interval >= 5:
                onsets.setdefault(case.name, []).append(
                    case.spec.faults[0].onset if case.spec.faults else 0
                )
        assert sum(c.is_fault_free for c in cases) == 4
        assert {c.spec.pattern for c in cases if c.is_fault_free} == {
            Pattern.LOCKSTEP,
            Pattern.SERVING,
        }
    # The same shape in samples at every interval past the warm-up's floor in seconds.
    assert all(len(set(v)) == 1 for v in onsets.values())


def test_large_suite_extends_the_default_one() -> None:
    small = build_independent_suite("independent", 0, 60)
    large = build_independent_suite("independent-large", 0, 60)
    assert large[: len(small)] == small
    assert len(large) == len(recipe("independent-large")) > len(small)
    assert max(c.machines for c in large) == 256 and min(c.machines for c in large) == 8


def test_bad_input_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        build_independent_suite("nope")
    with pytest.raises(ValueError, match="interval_s=0"):
        build_independent_suite("independent", 0, 0)
    with pytest.raises(ValueError, match="12"):
        JobSpec("x", Pattern.LOCKSTEP, 12, 1, 50, 0)
    with pytest.raises(ValueError, match="halt"):
        FaultSpec("nic_down", (1,), 5, 10)
    with pytest.raises(ValueError, match="'ecc'"):
        FaultSpec("ecc", (1,), 5, 10)


# -- the harness -------------------------------------------------------------------------------


class _FixedAlert:
    """A test detector: one alert on ``machine`` at the first evaluated second from ``at``."""

    def __init__(self, machine: str, at: float) -> None:
        self.machine = machine
        self.at = at
        self.fired = False

    @property
    def horizon_s(self) -> int:
        return 600

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        if self.fired or now < self.at:
            return []
        self.fired = True
        return [
            Alert(
                job=window.job,
                machine=self.machine,
                kind=AlertKind.RULE,
                metric="rdma_port_up",
                score=1.0,
                first_ts=float(now),
                detected_ts=float(now),
            )
        ]

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        return {}


def test_matching_counts_an_unlabelled_fault_as_a_false_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faulty = small_case("nvlink_error", 30, machines=8)
    spec = faulty.spec
    (fault,) = spec.faults
    machine = spec.machine_names()[fault.machines[0]]
    at = spec.onset_ts(fault) + 2 * spec.interval_s
    # The same job with its fault left unlabelled (the data need not change: the detector here
    # alerts at the same second on the same machine whatever it sees).
    unlabelled = IndependentCase("unlabelled", _without_faults(spec), None, "unlabelled")
    monkeypatch.setattr(
        runner_module, "method_factory", lambda *a, **k: lambda: _FixedAlert(machine, at)
    )
    options = BenchOptions(suite="independent", intervals=(30,), train=False)
    result = run_independent(options, cases=[faulty, unlabelled])
    (row,) = result.rows
    by_case = {c.run.name: c for c in row.summary.cases}
    assert by_case[faulty.name].true_positives == 1
    assert by_case["unlabelled"].false_positives == 1
    summary = row.summary
    assert summary.overall.recall == 1.0 and summary.overall.precision == 0.5
    assert summary.false_alarms.count == 1
    hours = unlabelled.machine_hours
    assert summary.false_alarms.machine_hours == pytest.approx(hours)
    (figures,) = result.per_cadence()
    assert figures["false_alarms_per_1000_machine_hours"] == pytest.approx(1000 / hours)
    onset = spec.onset_ts(fault)
    assert figures["onset_to_alert_median_s"] == pytest.approx(math.ceil(at) - onset)
    assert figures["onset_to_alert_median_samples"] == pytest.approx((math.ceil(at) - onset) / 30)
    assert figures["recall_by_fault"] == {
        "nvlink_error": {"instances": 1, "detected": 1, "recall": 1.0}
    }


def _without_faults(spec: JobSpec) -> JobSpec:
    from dataclasses import replace

    return replace(spec, name="unlabelled", faults=())


def test_an_alert_on_a_peer_or_too_late_is_a_false_positive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = small_case("cuda_execution_error", 60, machines=8)
    spec = case.spec
    (fault,) = spec.faults
    names = spec.machine_names()
    peer = names[(fault.machines[0] + 1) % spec.machines]
    monkeypatch.setattr(
        runner_module,
        "method_factory",
        lambda *a, **k: lambda: _FixedAlert(peer, spec.onset_ts(fault)),
    )
    result = run_independent(
        BenchOptions(suite="independent", intervals=(60,), train=False), cases=[case]
    )
    (row,) = result.rows
    assert row.summary.overall.recall == 0.0
    assert row.summary.overall.fp_alerts == 1


def test_end_to_end_with_the_minder_method_on_a_tiny_suite() -> None:
    cases = [
        small_case(kind, interval, machines=8, index=i)
        for i, kind in enumerate(("nic_down", "lockstep"))
        for interval in (30, 60)
    ]
    options = BenchOptions(suite="independent", intervals=(30, 60), train=False)
    result = run_independent(options, cases=cases)
    assert [r.variant.interval_s for r in result.rows] == [30, 60]
    for row in result.rows:
        assert row.cases_run == 2 and not row.errors
        assert row.summary.overall.instances == 1
        free = [c for c in cases if c.is_fault_free and c.interval_s == row.variant.interval_s]
        assert row.summary.false_alarms.machine_hours == pytest.approx(free[0].machine_hours)
    assert result.learnt_intervals == {
        "30": {c.name: 30.0 for c in cases if c.interval_s == 30},
        "60": {c.name: 60.0 for c in cases if c.interval_s == 60},
    }
    data = json.loads(json.dumps(result.to_dict()))
    assert data["never_tuned"] is True and data["seed_stream"] == INDEPENDENT_STREAM
    assert [f["interval_s"] for f in data["per_cadence"]] == [30, 60]
    assert set(data["per_cadence"][0]) >= {
        "precision",
        "recall",
        "false_alarms_per_1000_machine_hours",
        "onset_to_alert_median_s",
        "recall_by_fault",
    }
    text = markdown_independent(result)
    assert "independent suite" in text and "minder @60s" in text and "nic_down" in text


def test_runner_accepts_the_suite_but_leaves_it_to_run_independent() -> None:
    options = BenchOptions(suite="independent-large", intervals=(60,))
    with pytest.raises(ValueError, match="run_independent"):
        run_benchmark(options)
    with pytest.raises(ValueError, match="independent"):
        BenchOptions(suite="nope")


def test_cli_reports_each_cadence_as_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def tiny(name: str, seed: int, interval_s: int) -> list[IndependentCase]:
        assert name == "independent" and seed == 4
        return [small_case("switch_reboot", interval_s, machines=16)]

    monkeypatch.setattr(run_module, "build_independent_suite", tiny)
    app = typer.Typer()
    app.add_typer(bench_app, name="bench")
    markdown_path = tmp_path / "independent.md"
    outcome = CliRunner().invoke(
        app,
        [
            "bench",
            "detect",
            "--suite",
            "independent",
            "--intervals",
            "15,60",
            "--seed",
            "4",
            "--no-train",
            "--no-progress",
            "--format",
            "json",
            "--markdown",
            str(markdown_path),
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    data: dict[str, Any] = json.loads(outcome.stdout)
    assert data["suite"] == "independent"
    assert "--suite independent" in data["command"] and "--intervals 15,60" in data["command"]
    assert [f["variant"] for f in data["per_cadence"]] == ["minder @15s", "minder @60s"]
    assert data["suite_summary"]["60"]["faults"] == {"switch_reboot": 1}
    assert markdown_path.read_text().startswith("### Detection benchmark — independent suite")


def test_generator_module_is_documented_as_never_tuned() -> None:
    from minder.benchmark.independent import cases as cases_module

    assert "never used for tuning" in (cases_module.__doc__ or "")
    assert generator_module.__doc__ and "shares no signal" in generator_module.__doc__
