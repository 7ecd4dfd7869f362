"""Cluster simulator: scenario validation, determinism, table schema, rhythm, outputs agree."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from collectors.sim import (
    FaultType,
    Scenario,
    bundled_scenario,
    bundled_scenarios,
    iter_batches,
    load_scenario,
    resolve_scenario,
    scenario_labels,
    simulate_table,
    write_scenario_labels,
    write_scenario_table,
)
from collectors.sim.engine import CHUNK_S
from minder.core.errors import ScenarioError
from minder.core.records import NodeBatch
from minder.core.table import batches_to_table, read_table, validate_table

TEXT = ("job", "machine", "metric", "device", "group", "domain")


def scenario(**overrides: Any) -> Scenario:
    job = {"name": "j", "machines": 12, "step_time_s": 4.0, "pp_stages": 2}
    job.update(overrides.pop("job", {}))
    data: dict[str, Any] = {"seed": 3, "duration_s": 150, "jobs": [job]}
    data.update(overrides)
    return Scenario.model_validate(data)


def comparable(frame: pd.DataFrame) -> pd.DataFrame:
    """Names as plain Python strings, so tables built with different category sets compare."""
    return frame.astype({c: object for c in TEXT}).reset_index(drop=True)


def assert_same_rows(left: pd.DataFrame, right: pd.DataFrame) -> None:
    """Same columns, same rows in the same order (pandas' own check takes a minute on
    categoricals of strings)."""
    assert list(left.columns) == list(right.columns)
    assert len(left) == len(right)
    for column in left.columns:
        a = np.asarray(left[column].astype(object) if column in TEXT else left[column])
        b = np.asarray(right[column].astype(object) if column in TEXT else right[column])
        assert np.array_equal(a, b), f"column {column!r} differs"


def offsets(table: pd.DataFrame, scen: Scenario) -> pd.Series:
    """Interval index of each row (ts is the end of the interval)."""
    return (table["ts"] - scen.start_ts - 1.0).round().astype(int)


# --- validation -------------------------------------------------------------------------------


def test_unknown_fault_type_names_the_allowed_types() -> None:
    with pytest.raises(ScenarioError) as info:
        scenario(faults=[{"type": "gpu_melted", "start_s": 10}])
    message = str(info.value)
    assert "faults[0].type" in message and "'gpu_melted'" in message
    for allowed in FaultType:
        assert allowed.value in message


def test_machine_index_out_of_range_is_refused() -> None:
    with pytest.raises(
        ScenarioError, match=r"faults\[0\]\.machine: index 12 is out of range.*0\.\.11"
    ):
        scenario(faults=[{"type": "gpu_xid", "machine": 12, "start_s": 10}])


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"type": "gpu_xid", "job": "nope", "start_s": 1}, r"unknown job 'nope'.*\['j'\]"),
        ({"type": "gpu_xid", "machine": "j-n9999", "start_s": 1}, r"unknown machine 'j-n9999'"),
        ({"type": "gpu_xid", "start_s": 1, "duration_s": -5}, r"duration_s.*greater than 0.*-5"),
        ({"type": "gpu_xid", "start_s": 150}, r"start_s: 150.0 is not before the scenario's end"),
        ({"type": "gpu_xid", "device": "gpu8", "start_s": 1}, r"unknown GPU 'gpu8'"),
        ({"type": "nic_down", "device": "gpu1", "start_s": 1}, r"unknown NIC 'gpu1'"),
        ({"type": "hdfs_error", "device": "gpu1", "start_s": 1}, r"hdfs_error takes no device"),
        ({"type": "switch_reboot", "domain": "leaf-99", "start_s": 1}, r"unknown domain 'leaf-99'"),
        ({"type": "gpu_xid", "start_s": 1, "colour": "red"}, r"faults\[0\]\.colour: Extra inputs"),
        ({"type": "nic_down", "start_s": 1, "xid_code": 79}, r"xid_code is for gpu_xid"),
        ({"type": "pcie_downgrade", "start_s": 1, "link_width": 12}, r"link_width 12 is not"),
        ({"type": "pcie_downgrade", "start_s": 1, "link_gen": 5}, r"downgrades nothing"),
        (
            {"type": "switch_reboot", "start_s": 1, "domain": "leaf-00", "machine": 1},
            r"both domain 'leaf-00' and machine 1",
        ),
    ],
)
def test_bad_fault_values_are_named(entry: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScenarioError, match=expected):
        scenario(faults=[entry])


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ({"metrics": ["gpu_utilisation"]}, r"unknown metric 'gpu_utilisation'"),
        ({"pp_stages": 20}, r"pp_stages 20 exceeds machines 12"),
        ({"missing_rate": 1.5}, r"missing_rate: Input should be less than 1"),
        ({"checkpoint_every_s": 10, "checkpoint_duration_s": 30}, r"checkpoint_duration_s 30"),
        ({"name": "bad name"}, r"'bad name' is not a usable name"),
    ],
)
def test_bad_job_values_are_named(job: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScenarioError, match=expected):
        scenario(job=job)


def test_unknown_confounder_type_names_the_allowed_types() -> None:
    with pytest.raises(
        ScenarioError, match=r"unknown confounder type 'solar_flare'.*blip, eval_phase"
    ):
        scenario(confounders=[{"type": "solar_flare", "start_s": 1}])


def test_load_scenario_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1, 2\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="holds list: expected a mapping"):
        load_scenario(listed)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        "duration_s: 10\njobs: [{name: a, machines: 2}]\nfaults: [{type: x, start_s: 1}]\n"
    )
    with pytest.raises(ScenarioError, match=r"wrong\.yaml.*unknown fault type 'x'"):
        load_scenario(wrong)


def test_bundled_scenarios_load_and_unknown_names_list_them() -> None:
    names = bundled_scenarios()
    assert {"demo", "three-faults", "switch-reboot", "fault-free"} <= set(names)
    for name in names:
        loaded = load_scenario(bundled_scenario(name))
        assert loaded.duration_s > 0
    assert bundled_scenario("demo.yaml") == bundled_scenario("demo")
    with pytest.raises(ScenarioError, match=r"no bundled scenario 'nope'.*demo"):
        bundled_scenario("nope")


def test_a_scenario_is_found_by_file_or_bundled_name(tmp_path: Path) -> None:
    demo = resolve_scenario("demo")
    assert demo == load_scenario(bundled_scenario("demo"))
    assert demo.machines == 64
    assert resolve_scenario(str(bundled_scenario("three-faults"))).machines == 128
    with pytest.raises(ScenarioError, match=r"no bundled scenario 'nope'"):
        resolve_scenario("nope")
    with pytest.raises(ScenarioError, match="does not exist"):
        resolve_scenario(str(tmp_path / "missing.yaml"))


def test_bundled_demo_matches_its_brief() -> None:
    demo = load_scenario(bundled_scenario("demo"))
    assert demo.jobs[0].machines == 64 and len(demo.faults) == 1
    assert 30 <= demo.faults[0].start_s <= 60
    three = load_scenario(bundled_scenario("three-faults"))
    assert three.jobs[0].machines == 128 and three.duration_s == 1800
    assert len({f.type for f in three.faults}) == 3
    assert len({f.machine for f in three.faults}) == 3


# --- table ------------------------------------------------------------------------------------


def test_table_is_canonical_and_deterministic() -> None:
    scen = scenario(faults=[{"type": "pcie_downgrade", "machine": 3, "start_s": 40}])
    first = simulate_table(scen)
    again = simulate_table(scen)
    assert_same_rows(first, again)
    assert first.dtypes.equals(validate_table(first).dtypes)
    assert_same_rows(validate_table(first), first)
    other = simulate_table(scen.model_copy(update={"seed": 4}))
    assert len(other) == len(first)
    assert not np.array_equal(other["value"].to_numpy(), first["value"].to_numpy())


def test_labels_and_layout_of_rows() -> None:
    scen = scenario(job={"machines": 20, "pp_stages": 4, "machines_per_domain": 8})
    table = simulate_table(scen)
    machines = table.groupby("machine", observed=True)[["group", "domain"]].first()
    assert machines.loc["j-n0000"].tolist() == ["pp0", "leaf-00"]
    assert machines.loc["j-n0019"].tolist() == ["pp3", "leaf-02"]
    assert (machines["group"] == "pp1").sum() == 5
    per_machine_second = table.groupby(["machine", "ts"], observed=True).size()
    # 14 metrics x 8 GPUs + 7 x 4 NICs + 6 host + 8 ranks
    assert per_machine_second.max() == 14 * 8 + 7 * 4 + 6 + 8
    assert set(table["device"].cat.categories) >= {"", "gpu7", "mlx5_3", "rank7"}
    assert offsets(table, scen).min() == 0 and offsets(table, scen).max() == scen.duration_s - 1


def test_machines_are_in_step() -> None:
    table = simulate_table(scenario(duration_s=120))
    power = table[(table["metric"] == "gpu_power_watts") & (table["device"] == "gpu0")]
    series = power.pivot(index="ts", columns="machine", values="value")
    assert series.std().min() > 100  # the rhythm swings between compute and communication
    assert np.corrcoef(series.to_numpy().T).min() > 0.9


def test_phases_average_over_the_second() -> None:
    table = simulate_table(scenario(job={"noise": 0.0}, duration_s=60))
    tensor = table[table["metric"] == "gpu_tensor_active_ratio"]["value"]
    # Seconds wholly in compute, wholly in communication, and mixed ones in between.
    assert tensor.max() > 0.5 and tensor.min() < 0.05
    assert ((tensor > 0.1) & (tensor < 0.45)).mean() > 0.1


def test_last_pp_stage_carries_more_load() -> None:
    table = simulate_table(scenario(job={"pp_stages": 3}))
    power = table[table["metric"] == "gpu_power_watts"].groupby("group", observed=True)["value"]
    means = power.mean()
    assert means["pp2"] > 1.03 * means["pp0"]
    assert abs(means["pp1"] / means["pp0"] - 1) < 0.02


def test_checkpoints_pause_every_machine_together() -> None:
    scen = scenario(job={"checkpoint_every_s": 60, "checkpoint_duration_s": 20}, duration_s=150)
    table = simulate_table(scen)
    table["sec"] = offsets(table, scen)
    util = table[table["metric"] == "gpu_util_ratio"].groupby(["sec", "machine"], observed=True)
    per_machine = util["value"].mean().unstack()
    paused = per_machine.max(axis=1) < 0.1  # every machine idle in these seconds
    assert 15 <= paused.sum() <= 45
    assert paused.loc[61:120].sum() >= 15 and paused.loc[:59].sum() == 0
    running = per_machine.min(axis=1) > 0.95
    writes = table[table["metric"] == "disk_write_bytes_per_second"].pivot_table(
        index="sec", columns="machine", values="value", observed=True
    )
    assert writes[paused].min().min() > 1e8 > writes[running].max().max()


def test_missing_rate_is_honoured() -> None:
    full = simulate_table(scenario())
    sparse = simulate_table(scenario(job={"missing_rate": 0.05}))
    missing = 1 - len(sparse) / len(full)
    assert 0.04 < missing < 0.06


def test_noiseless_scenario_generates() -> None:
    table = simulate_table(scenario(job={"noise": 0.0, "metrics": ["pfc_tx_pause_per_second"]}))
    assert set(table["metric"].cat.categories) == {"pfc_tx_pause_per_second"}
    assert (table["value"] == table["value"].round()).all()


# --- streaming --------------------------------------------------------------------------------


def test_iter_batches_equals_simulate_table() -> None:
    scen = scenario(
        duration_s=2 * CHUNK_S + 50,  # late batches cross chunk boundaries
        job={"missing_rate": 0.01, "late_rate": 0.05, "duplicate_rate": 0.03},
        faults=[
            {"type": "gpu_lost", "machine": 2, "start_s": 100.5, "duration_s": 60},
            {"type": "machine_unreachable", "machine": 6, "start_s": 30, "duration_s": 20},
            {"type": "aoc_error", "machine": 1, "start_s": 110},
        ],
    )
    items = list(iter_batches(scen))
    assert [ts for ts, _ in items] == [scen.start_ts + 1.0 + s for s in range(scen.duration_s)]
    batches = [b for _, bs in items for b in bs]
    assert all(isinstance(b, NodeBatch) for b in batches)
    assert all(b.labels.keys() == {"group", "domain"} for b in batches)
    late = [(ts, b.ts) for ts, bs in items for b in bs if b.ts < ts]
    assert late and all(ts - own <= 3 for ts, own in late)
    keys = [(b.node, b.ts) for b in batches]
    assert len(keys) > len(set(keys))  # duplicates
    assert_same_rows(batches_to_table(batches), simulate_table(scen))


def test_iter_batches_of_several_jobs_and_a_moved_start() -> None:
    data = {
        "seed": 9,
        "duration_s": 40,
        "jobs": [{"name": "a", "machines": 3}, {"name": "b", "machines": 2, "gpus_per_machine": 4}],
    }
    scen = Scenario.model_validate(data)
    start = 2_000_000_000.0
    items = list(iter_batches(scen, start_ts=start))
    assert items[0][0] == start + 1.0
    assert [b.job for b in items[0][1]] == ["a"] * 3 + ["b"] * 2
    streamed = batches_to_table(b for _, bs in items for b in bs)
    streamed["ts"] += scen.start_ts - start
    order = ["job", "machine", "ts", "metric", "device"]
    expected = comparable(simulate_table(scen)).sort_values(order, kind="stable")
    got = comparable(streamed).sort_values(order, kind="stable")
    assert_same_rows(got, expected)


def test_iter_batches_is_lazy() -> None:
    scen = scenario(duration_s=2 * 24 * 3600, job={"machines": 4})
    stream = iter_batches(scen)
    ts, batches = next(stream)
    assert ts == scen.start_ts + 1.0 and len(batches) == 4


# --- files and labels -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["m.parquet", "m.csv.gz"])
def test_written_table_reads_back(tmp_path: Path, name: str) -> None:
    scen = scenario(duration_s=20, job={"machines": 3})
    path = write_scenario_table(scen, tmp_path / name)
    back = read_table(path)
    table = simulate_table(scen)
    assert len(back) == len(table)
    np.testing.assert_allclose(back["value"].to_numpy(), table["value"].to_numpy(), rtol=1e-8)


def test_labels_give_ground_truth(tmp_path: Path) -> None:
    scen = scenario(
        job={"machines": 12, "machines_per_domain": 4},
        faults=[
            {"type": "ecc_error", "machine": 5, "device": "gpu3", "start_s": 40, "duration_s": 30},
            {"type": "switch_reboot", "domain": "leaf-02", "start_s": 60, "duration_s": 60},
            {"type": "hdfs_error", "machine": "j-n0001", "start_s": 100},
        ],
        confounders=[{"type": "blip", "machine": 2, "start_s": 10}],
    )
    labels = scenario_labels(scen)
    assert list(labels.columns[:5]) == ["job", "machine", "start_ts", "end_ts", "fault"]
    ecc = labels[labels["fault"] == "ecc_error"].iloc[0]
    assert (ecc["machine"], ecc["device"]) == ("j-n0005", "gpu3")
    assert ecc["start_ts"] == scen.start_ts + 40 and ecc["end_ts"] == scen.start_ts + 70
    reboot = labels[labels["fault"] == "switch_reboot"]
    assert reboot["machine"].tolist() == [f"j-n{i:04d}" for i in range(8, 12)]
    assert set(reboot["domain"]) == {"leaf-02"}
    hdfs = labels[labels["fault"] == "hdfs_error"].iloc[0]
    assert hdfs["end_ts"] == scen.start_ts + scen.duration_s
    assert "blip" not in set(labels["fault"])
    moved = scenario_labels(scen, start_ts=0.0)
    assert moved["start_ts"].min() == 40.0
    assert labels["slowdown"].isna().all(), "no straggler here"
    path = write_scenario_labels(scen, tmp_path / "labels.csv")
    back = pd.read_csv(path, keep_default_na=False, na_values={"slowdown": [""]})
    pd.testing.assert_frame_equal(back, labels)
    slow = scenario(faults=[{"type": "slow_worker", "machine": 3, "start_s": 20}])
    labels = scenario_labels(slow)
    assert labels["slowdown"].iloc[-1] > 1.0
    path = write_scenario_labels(slow, tmp_path / "slow.csv")
    back = pd.read_csv(path, keep_default_na=False, na_values={"slowdown": [""]})
    pd.testing.assert_frame_equal(back, labels)
    with pytest.raises(ScenarioError, match=r"expected a \.csv"):
        write_scenario_labels(scen, tmp_path / "labels.json")


def test_defaults_are_drawn_from_the_seed() -> None:
    entry = {"type": "thermal_throttle", "start_s": 10}
    first = scenario_labels(scenario(faults=[entry]))
    assert scenario_labels(scenario(faults=[entry])).equals(first)
    assert first["device"].iloc[0].startswith("gpu")
    picks = {
        tuple(scenario_labels(scenario(seed=seed, faults=[entry]))[["machine", "device"]].iloc[0])
        for seed in range(8)
    }
    assert len(picks) > 1


@pytest.mark.slow
def test_three_faults_scenario_generates_fast_enough() -> None:
    scen = load_scenario(bundled_scenario("three-faults"))
    started = time.perf_counter()
    table = simulate_table(scen)
    elapsed = time.perf_counter() - started
    assert len(table) > 30_000_000
    assert elapsed < 60
