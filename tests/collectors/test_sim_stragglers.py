"""Stragglers in the simulator: per-rank busy time, collectives, step times and step numbers in
synchronous and asynchronous jobs; the straggler injections, their labels (with the true
slowdown S) and their validation; and the outputs of existing scenarios left as they were."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from collectors.sim import (
    ConfounderType,
    FaultType,
    Scenario,
    iter_batches,
    scenario_labels,
    simulate_table,
)
from collectors.sim.engine import CHUNK_S
from collectors.sim.kinds import DEFAULT_FACTOR, DEFAULT_TRANSIENT_STEPS, STRAGGLER_FAULTS
from collectors.sim.optrace import OP_COLUMNS, op_table
from collectors.sim.scenario import STRAGGLER_METRICS
from minder.core.errors import ScenarioError
from minder.core.table import batches_to_table

ONSET = 60
DURATION = 240
STEP_S = 2.0
COMM = 0.3
SLOW = "j-n0005"
METRICS = [*STRAGGLER_METRICS, "gpu_power_watts", "gpu_util_ratio"]


def build(
    faults: list[dict[str, Any]] | None = None,
    confounders: list[dict[str, Any]] | None = None,
    **job: Any,
) -> Scenario:
    spec = {
        "name": "j",
        "machines": 16,
        "gpus_per_machine": 4,
        "pp_stages": 4,
        "machines_per_domain": 4,
        "step_time_s": STEP_S,
        "comm_fraction": COMM,
        "metrics": METRICS,
        **job,
    }
    return Scenario.model_validate(
        {
            "seed": 8,
            "duration_s": DURATION,
            "jobs": [spec],
            "faults": faults or [],
            "confounders": confounders or [],
        }
    )


class Run:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.table = simulate_table(scenario)
        self.table["sec"] = (self.table["ts"] - scenario.start_ts - 1).round().astype(int)

    def frame(self, metric: str) -> pd.DataFrame:
        """seconds x (machine, device)."""
        rows = self.table[self.table["metric"] == metric]
        return rows.pivot_table(
            index="sec", columns=["machine", "device"], values="value", observed=True
        )

    def mean(self, metric: str, lo: int = ONSET + 20, hi: int = DURATION) -> pd.Series:
        """Mean per (machine, device) over seconds [lo, hi)."""
        frame = self.frame(metric)
        return frame.loc[(frame.index >= lo) & (frame.index < hi)].mean()

    def machines(self, metric: str, lo: int = ONSET + 20, hi: int = DURATION) -> pd.Series:
        """Mean per machine over seconds [lo, hi)."""
        return self.mean(metric, lo, hi).groupby(level=0, observed=True).mean()


def slow_worker(**extra: Any) -> dict[str, Any]:
    return {"type": "slow_worker", "machine": SLOW, "factor": 1.3, "start_s": ONSET, **extra}


# --- synchronous jobs ------------------------------------------------------------------------


def test_sync_straggler_everyone_steps_together_the_straggler_busiest_and_waiting_least() -> None:
    r = Run(build([slow_worker()]))
    step = r.mean("train_step_seconds")
    assert step.std() / step.mean() < 0.005, "every rank's step takes the job's time"
    before = r.mean("train_step_seconds", 10, ONSET).mean()
    assert step.mean() == pytest.approx(STEP_S * (1 - COMM) * 1.3 + STEP_S * COMM, rel=0.02)
    assert step.mean() > 1.15 * before
    busy, coll = r.mean("train_busy_seconds"), r.mean("nccl_collective_seconds")
    slow_busy, peers_busy = busy.loc[SLOW], busy.drop(SLOW, level=0)
    slow_coll, peers_coll = coll.loc[SLOW], coll.drop(SLOW, level=0)
    assert slow_busy.min() > 1.25 * peers_busy.max()
    assert slow_coll.max() < 0.7 * peers_coll.min(), "the straggler arrives last, waits least"
    assert slow_busy.mean() == pytest.approx(STEP_S * (1 - COMM) * 1.3, rel=0.02)
    assert peers_busy.mean() == pytest.approx(STEP_S * (1 - COMM), rel=0.02)
    # Busy time plus collective time is the step, for every rank.
    np.testing.assert_allclose((busy + coll).to_numpy(), step.to_numpy(), rtol=0.01)
    # Before the onset nobody stands out.
    early = r.mean("train_busy_seconds", 10, ONSET)
    assert early.max() < 1.03 * early.min()


def test_sync_straggler_shows_only_mildly_in_the_healthy_ranks_gpu_signals() -> None:
    r = Run(build([slow_worker(factor=1.1)]))
    power = r.machines("gpu_power_watts")
    before = r.machines("gpu_power_watts", 10, ONSET)
    peers = (power / before).drop(SLOW)
    assert 0.9 < peers.median() < 0.995, "they spin a little longer each step"
    stage = ["j-n0004", "j-n0006", "j-n0007"]  # its own stage's (the last stage draws more)
    assert power[SLOW] > power[stage].max(), "the straggler computes while they wait"
    util = r.machines("gpu_util_ratio").drop(SLOW)
    assert util.min() > 0.9


def test_sync_step_numbers_advance_together_one_per_step() -> None:
    r = Run(build([slow_worker()]))
    numbers = r.frame("train_step_number")
    assert (numbers.to_numpy() == np.round(numbers.to_numpy())).all()
    last = numbers.iloc[-1]
    assert last.max() - last.min() <= 1, "clock skew at most"
    early = (numbers.iloc[ONSET] - numbers.iloc[10]).median()
    assert early == pytest.approx((ONSET - 10) / STEP_S, abs=2)
    late = (numbers.iloc[-1] - numbers.iloc[ONSET + 20]).median()
    assert late < 0.85 * (DURATION - 1 - ONSET - 20) / STEP_S, "the whole job slowed"
    assert numbers.diff().min().min() >= 0


def test_listed_ranks_only() -> None:
    r = Run(build([slow_worker(device=["rank1", "rank2"])]))
    busy = r.mean("train_busy_seconds")
    slow = busy.loc[[(SLOW, "rank1"), (SLOW, "rank2")]]
    rest = busy.drop([(SLOW, "rank1"), (SLOW, "rank2")])
    assert slow.min() > 1.25 * rest.max()
    assert busy.loc[(SLOW, "rank0")] < 1.03 * busy.drop(SLOW, level=0).median()
    labels = scenario_labels(r.scenario)
    assert labels[["machine", "device"]].values.tolist() == [[SLOW, "rank1,rank2"]]


def test_slow_stage_slows_every_rank_of_one_stage() -> None:
    r = Run(build([{"type": "slow_stage", "stage": "pp2", "factor": 1.2, "start_s": ONSET}]))
    busy = r.machines("train_busy_seconds")
    stage = [f"j-n{i:04d}" for i in range(8, 12)]
    assert busy[stage].min() > 1.15 * busy.drop(stage).max()
    assert busy[stage].max() < 1.02 * busy[stage].min(), "the stage is slow as one"
    coll = r.machines("nccl_collective_seconds")
    assert coll[stage].max() < coll.drop(stage).min()
    labels = scenario_labels(r.scenario)
    assert labels["machine"].tolist() == stage
    assert set(labels["group"]) == {"pp2"} and labels["fault_index"].nunique() == 1


def test_slow_stage_by_index_by_machine_or_drawn() -> None:
    def stage_of(entry: dict[str, Any], seed: int = 8) -> set[str]:
        scen = build([{"type": "slow_stage", "start_s": ONSET, **entry}])
        scen = scen.model_copy(update={"seed": seed})
        return set(scenario_labels(scen)["group"])

    assert stage_of({"stage": 1}) == {"pp1"}
    assert stage_of({"machine": 13}) == {"pp3"}
    drawn = {frozenset(stage_of({}, seed)) for seed in range(12)}
    assert all(len(d) == 1 for d in drawn) and len(drawn) > 1


def test_slow_group_of_several_machines() -> None:
    r = Run(build([{"type": "slow_group", "machines": [2, "j-n0009", 14], "start_s": ONSET}]))
    busy = r.machines("train_busy_seconds")
    group = ["j-n0002", "j-n0009", "j-n0014"]
    assert busy[group].min() > 1.15 * busy.drop(group).max()
    labels = scenario_labels(r.scenario)
    assert labels["machine"].tolist() == group and labels["fault_index"].nunique() == 1
    drawn = scenario_labels(build([{"type": "slow_group", "machines": 4, "start_s": ONSET}]))
    assert len(set(drawn["machine"])) == 4
    default = scenario_labels(build([{"type": "slow_group", "start_s": ONSET}]))
    assert len(default) == 3


def test_transient_straggler_lasts_its_default_steps() -> None:
    r = Run(build([{"type": "transient_straggler", "machine": SLOW, "start_s": ONSET}]))
    length = DEFAULT_TRANSIENT_STEPS * STEP_S
    busy = r.frame("train_busy_seconds").T.groupby(level=0, observed=True).mean().T
    ratio = busy[SLOW] / busy.drop(columns=SLOW).median(axis=1)
    during = ratio.loc[ONSET + 2 * STEP_S + 1 : ONSET + length - 1]
    assert during.min() > 1.8, "2x by default"
    assert ratio.loc[ONSET + length + 2 * STEP_S + 1 :].max() < 1.05, "then back to normal"
    assert ratio.loc[: ONSET - 1].max() < 1.05
    label = scenario_labels(r.scenario).iloc[0]
    assert label["end_ts"] - label["start_ts"] == length


def test_flapping_worker_alternates() -> None:
    period = 30
    entry = {"type": "flapping_worker", "machine": SLOW, "period_s": period, "start_s": ONSET}
    r = Run(build([entry]))
    busy = r.frame("train_busy_seconds").T.groupby(level=0, observed=True).mean().T
    ratio = busy[SLOW] / busy.drop(columns=SLOW).median(axis=1)
    for turn in range(3):
        start = ONSET + 2 * period * turn
        slow = ratio.loc[start + 2 * STEP_S + 1 : start + period - 1]
        normal = ratio.loc[start + period + 2 * STEP_S + 1 : start + 2 * period - 1]
        assert len(slow) and slow.min() > 1.4, turn  # 1.5 by default
        assert len(normal) and normal.max() < 1.05, turn
    label = scenario_labels(r.scenario).iloc[0]
    assert label["end_ts"] == r.scenario.start_ts + DURATION, "one label over the whole span"


# --- asynchronous jobs ------------------------------------------------------------------------


def test_async_slow_worker_steps_slower_and_falls_behind() -> None:
    r = Run(build([slow_worker()], sync=False))
    step = r.machines("train_step_seconds")
    assert step[SLOW] == pytest.approx(STEP_S * (1 - COMM) * 1.3 + STEP_S * COMM, rel=0.02)
    assert step.drop(SLOW).max() < 1.02 * STEP_S, "the others go at their own pace"
    coll = r.machines("nccl_collective_seconds")
    assert coll.max() < 1.05 * coll.min(), "nobody waits for the slow worker"
    numbers = r.frame("train_step_number").T.groupby(level=0, observed=True).mean().T
    lag = numbers.drop(columns=SLOW).median(axis=1) - numbers[SLOW]
    assert lag.loc[: ONSET - 1].abs().max() <= 1
    assert lag.iloc[-1] > 10 and lag.iloc[-1] > lag.loc[ONSET + 60] > lag.loc[ONSET + 10]
    # Its loss in steps is what its longer steps cost.
    expected = (DURATION - ONSET) / STEP_S * (1 - STEP_S / step[SLOW])
    assert lag.iloc[-1] == pytest.approx(expected, abs=3)


def test_async_lag_stays_after_a_slowdown_ends() -> None:
    r = Run(build([slow_worker(duration_s=60)], sync=False))
    step = r.machines("train_step_seconds", ONSET + 80)
    assert step[SLOW] < 1.02 * STEP_S, "its steps are back to normal"
    numbers = r.frame("train_step_number").T.groupby(level=0, observed=True).mean().T
    lag = numbers.drop(columns=SLOW).median(axis=1) - numbers[SLOW]
    assert lag.loc[ONSET + 80 :].min() >= 4, "but it does not catch up"


# --- not a straggler --------------------------------------------------------------------------


def test_job_wide_slowdown_slows_everyone_alike_and_is_no_fault() -> None:
    entry = {"type": "job_wide_slowdown", "factor": 1.3, "start_s": ONSET}
    r = Run(build(confounders=[entry]))
    busy = r.mean("train_busy_seconds")
    before = r.mean("train_busy_seconds", 10, ONSET)
    assert (busy / before).min() > 1.25
    assert busy.max() < 1.03 * busy.min(), "no rank stands out"
    coll = r.mean("nccl_collective_seconds")
    assert coll.max() < 1.1 * coll.min()
    assert r.machines("train_step_seconds").mean() > 1.15 * STEP_S
    assert scenario_labels(r.scenario).empty
    assert ConfounderType.JOB_WIDE_SLOWDOWN.value not in {t.value for t in FaultType}


# --- labels: the true slowdown S --------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "slow_worker", "machine": SLOW, "factor": 1.3},
        {"type": "slow_stage", "stage": "pp1", "factor": 1.15},
        {"type": "slow_group", "machines": 5, "factor": 1.4},
        {"type": "slow_worker", "machine": SLOW, "device": "rank0", "factor": 1.5},
    ],
    ids=["worker", "stage", "group", "one-rank"],
)
def test_slowdown_label_is_what_the_straggler_costs(entry: dict[str, Any]) -> None:
    """S = observed step time / step time with the slow ranks at the mean busy time."""
    r = Run(build([{**entry, "start_s": ONSET}]))
    step = r.mean("train_step_seconds").mean()
    busy = r.mean("train_busy_seconds")
    comm = step - busy.max()  # the slowest rank waits for nobody: its collective is the comm
    balanced = busy.mean() + comm
    labels = scenario_labels(r.scenario)
    assert labels["slowdown"].nunique() == 1
    assert labels["slowdown"].iloc[0] == pytest.approx(step / balanced, rel=0.01)
    assert labels["slowdown"].iloc[0] > 1.0


def test_slowdown_of_other_faults_is_absent() -> None:
    scen = build(
        [
            {"type": "thermal_throttle", "machine": 1, "device": "gpu0", "start_s": 10},
            slow_worker(),
        ]
    )
    labels = scenario_labels(scen)
    assert math.isnan(labels["slowdown"].iloc[0]) and labels["slowdown"].iloc[1] > 1
    assert labels["group"].tolist() == ["pp0", "pp1"]


def test_default_factors() -> None:
    for kind in STRAGGLER_FAULTS:
        entry: dict[str, Any] = {"type": kind.value, "start_s": ONSET}
        if kind is FaultType.SLOW_STAGE:
            entry["stage"] = 0
        elif kind is not FaultType.SLOW_GROUP:
            entry["machine"] = 0
        spec = build([entry]).faults[0]
        assert spec.factor_in_effect == DEFAULT_FACTOR[kind] > 1.0
    assert DEFAULT_FACTOR[FaultType.TRANSIENT_STRAGGLER] == 2.0


# --- streaming, rhythm bounds -----------------------------------------------------------------


def test_stream_equals_table_with_stragglers_across_chunks() -> None:
    scen = build(
        [
            slow_worker(),
            {"type": "flapping_worker", "machine": 2, "period_s": 25, "start_s": 30},
            {"type": "gpu_xid", "machine": 9, "start_s": 150, "duration_s": 30},
        ],
        [{"type": "job_wide_slowdown", "start_s": 100, "duration_s": 50}],
        sync=False,
        missing_rate=0.01,
        late_rate=0.05,
    )
    assert scen.duration_s > CHUNK_S
    streamed = batches_to_table(b for _, bs in iter_batches(scen) for b in bs)
    table = simulate_table(scen)
    assert len(streamed) == len(table)
    np.testing.assert_array_equal(streamed["value"].to_numpy(), table["value"].to_numpy())
    assert np.isfinite(table["value"].to_numpy()).all()


@pytest.mark.parametrize("step_s", [0.3, 60.0])
def test_fast_and_slow_rhythms(step_s: float) -> None:
    r = Run(build([slow_worker(factor=1.2)], step_time_s=step_s))
    busy = r.machines("train_busy_seconds", ONSET + 2 * int(step_s) + 10)
    assert busy[SLOW] == pytest.approx(1.2 * busy.drop(SLOW).median(), rel=0.03)
    numbers = r.frame("train_step_number")
    advanced = (numbers.iloc[-1] - numbers.iloc[0]).median()
    slow_step = step_s * ((1 - COMM) * 1.2 + COMM)
    expected = ONSET / step_s + (DURATION - 1 - ONSET) / slow_step
    assert advanced == pytest.approx(expected, abs=max(1.5, 0.03 * expected))


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"type": "gpu_xid", "start_s": 1, "factor": 1.5}, r"factor is for flapping_worker, .*"),
        ({"type": "slow_worker", "start_s": 1, "factor": 0.9}, r"factor: .*greater than 1"),
        ({"type": "slow_worker", "start_s": 1, "factor": 11}, r"factor: .*less than or equal"),
        ({"type": "slow_worker", "start_s": 1, "period_s": 5}, r"period_s is for flapping_worker"),
        ({"type": "slow_worker", "start_s": 1, "device": "rank9"}, r"unknown rank 'rank9'"),
        ({"type": "slow_worker", "start_s": 1, "device": "gpu1"}, r"unknown rank 'gpu1'"),
        ({"type": "slow_stage", "start_s": 1, "device": "rank1"}, r"slow_stage takes no device"),
        ({"type": "slow_stage", "start_s": 1, "stage": "pp7"}, r"unknown stage 'pp7'.*pp0"),
        ({"type": "slow_stage", "start_s": 1, "stage": 4}, r"unknown stage 4 .*0\.\.3"),
        ({"type": "slow_stage", "start_s": 1, "stage": 1, "machine": 2}, r"both stage 1 and"),
        ({"type": "slow_worker", "start_s": 1, "stage": 1}, r"stage is for slow_stage"),
        ({"type": "slow_group", "start_s": 1, "machines": 1}, r"machines is 1: expected a count"),
        ({"type": "slow_group", "start_s": 1, "machines": [3]}, r"names fewer than 2"),
        ({"type": "slow_group", "start_s": 1, "machines": [3, 3]}, r"name a machine twice"),
        ({"type": "slow_group", "start_s": 1, "machines": 17}, r"17 machines asked .* 16"),
        ({"type": "slow_group", "start_s": 1, "machines": [1, "j-n0001"]}, r"twice \(by index"),
        ({"type": "slow_group", "start_s": 1, "machine": 3}, r"takes machines .*not machine 3"),
        ({"type": "slow_worker", "start_s": 1, "machines": 2}, r"machines is for slow_group"),
        ({"type": "flapping_worker", "start_s": 1, "period_s": 0}, r"period_s: .*greater than 0"),
    ],
)
def test_bad_straggler_values_are_named_in_one_line(entry: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScenarioError, match=expected) as info:
        build([entry])
    assert "\n" not in str(info.value)


def test_bad_stage_job_and_confounder_values() -> None:
    with pytest.raises(ScenarioError, match=r"slow_stage needs a job of pp_stages >= 2"):
        build([{"type": "slow_stage", "start_s": 1}], pp_stages=1)
    with pytest.raises(ScenarioError, match=r"factor is for job_wide_slowdown, not blip"):
        build(confounders=[{"type": "blip", "start_s": 1, "factor": 1.2}])
    with pytest.raises(ScenarioError, match=r"job_wide_slowdown hits every machine"):
        build(confounders=[{"type": "job_wide_slowdown", "start_s": 1, "machine": 2}])
    with pytest.raises(ScenarioError, match=r"step_time_s: .*greater than or equal to 0\.1"):
        build(step_time_s=0.05)
    with pytest.raises(ScenarioError, match=r"sync: Input should be a valid boolean"):
        build(sync="sometimes")


# --- existing outputs unchanged ---------------------------------------------------------------

_GOLDEN_METRICS = (
    "gpu_util_ratio",
    "gpu_power_watts",
    "gpu_tensor_active_ratio",
    "gpu_temperature_celsius",
    "gpu_pcie_link_width",
    "gpu_throttle_reasons",
    "rdma_tx_bytes_per_second",
    "pfc_tx_pause_per_second",
    "cpu_util_ratio",
    "net_rx_bytes_per_second",
    "train_step_seconds",
    "nccl_collective_seconds",
    "nccl_busbw_bytes_per_second",
)
# Rows and value sums per metric of the scenario below, computed with the simulator as committed
# before stragglers were added (commit 29ad509): existing faults and confounders must still
# produce the same values.
_GOLDEN_ROWS = 165320
_GOLDEN_TS_SUM = 291574898217624.0
_GOLDEN = {
    "cpu_util_ratio": (2022, 617.3061),
    "gpu_pcie_link_width": (16160, 258008.0),
    "gpu_power_watts": (16163, 7128053.0),
    "gpu_temperature_celsius": (16165, 1016301.0),
    "gpu_tensor_active_ratio": (16187, 4689.4925),
    "gpu_throttle_reasons": (16167, 5366.0),
    "gpu_util_ratio": (16160, 14366.25),
    "nccl_busbw_bytes_per_second": (16048, 3414363060404000.0),
    "nccl_collective_seconds": (16066, 34360.749820000005),
    "net_rx_bytes_per_second": (2019, 302269165980.0),
    "pfc_tx_pause_per_second": (8054, 878137.0),
    "rdma_tx_bytes_per_second": (8059, 65625214715376.0),
    "train_step_seconds": (16050, 65719.3832),
}


def _golden_scenario(metrics: tuple[str, ...]) -> Scenario:
    job = {
        "name": "g",
        "machines": 12,
        "pp_stages": 2,
        "machines_per_domain": 4,
        "step_time_s": 3.0,
        "checkpoint_every_s": 90,
        "checkpoint_duration_s": 15,
        "missing_rate": 0.01,
        "late_rate": 0.02,
        "duplicate_rate": 0.01,
        "metrics": list(metrics),
    }
    faults = [
        {
            "type": "thermal_throttle",
            "machine": 2,
            "device": "gpu1",
            "start_s": 30,
            "duration_s": 40,
        },
        {"type": "hdfs_error", "machine": 7, "start_s": 75, "duration_s": 20, "severity": 0.5},
        {"type": "pcie_downgrade", "machine": 9, "device": "gpu4", "start_s": 100},
        {"type": "gpu_xid", "machine": 4, "start_s": 140, "duration_s": 15},
    ]
    confounders = [
        {"type": "blip", "machine": 1, "start_s": 20},
        {"type": "eval_phase", "start_s": 110, "duration_s": 25},
        {"type": "agent_restart", "machine": 3, "start_s": 60},
        {"type": "late_join", "machines": [10], "start_s": 15},
    ]
    return Scenario.model_validate(
        {
            "seed": 11,
            "duration_s": 170,
            "jobs": [job],
            "faults": faults,
            "confounders": confounders,
        }
    )


def test_existing_faults_produce_what_they_did_before_stragglers() -> None:
    table = simulate_table(_golden_scenario(_GOLDEN_METRICS))
    assert len(table) == _GOLDEN_ROWS
    assert math.fsum(table["ts"].tolist()) == _GOLDEN_TS_SUM
    for metric, rows in table.groupby("metric", observed=True):
        count, total = _GOLDEN[str(metric)]
        assert len(rows) == count, metric
        assert math.fsum(rows["value"].tolist()) == pytest.approx(total, rel=1e-9), metric


def test_emitting_the_new_metrics_changes_no_other_value() -> None:
    """Their noise has a stream of its own (no missing samples here: those are drawn over every
    series)."""
    old = ["gpu_util_ratio", "gpu_power_watts", "train_step_seconds", "nccl_collective_seconds"]
    plain = build([slow_worker()], metrics=old)
    more = build([slow_worker()], metrics=[*old, "train_busy_seconds", "train_step_number"])
    a, b = simulate_table(plain), simulate_table(more)
    b = b[b["metric"].isin(old)]
    np.testing.assert_array_equal(a["value"].to_numpy(), b["value"].to_numpy())
    assert (a["ts"].to_numpy() == b["ts"].to_numpy()).all()


@pytest.mark.parametrize(
    ("fault", "stages"),
    [
        (slow_worker(), 1),
        (slow_worker(factor=1.1, device="rank2"), 1),
        ({"type": "slow_group", "machines": [1, 9], "factor": 1.25, "start_s": ONSET}, 1),
        ({"type": "slow_stage", "stage": "pp2", "factor": 1.2, "start_s": ONSET}, 4),
    ],
    ids=["worker", "one-rank", "group", "stage"],
)
def test_the_labelled_slowdown_is_what_the_whatif_replay_measures(
    fault: dict[str, Any], stages: int
) -> None:
    """The simulator's true S of a synchronous straggler is what the offline what-if analysis
    measures on the simulator's own op trace of the job while the straggler is slow: the live
    estimate, scored against this S by the benchmark, and the offline analysis check each
    other."""
    from whatif.analysis import analyze
    from whatif.trace import JobMeta, make_trace

    scenario = build([fault], pp_stages=stages)
    labels = scenario_labels(scenario)
    assert labels["slowdown"].nunique() == 1  # one S per fault, on each of its machines' rows
    frame = op_table(scenario, start_s=ONSET, max_steps=40)
    trace = make_trace(frame, JobMeta(dp_size=16 * 4, pp_size=1))
    replayed = analyze(trace).slowdown
    assert labels["slowdown"].iloc[0] == pytest.approx(replayed, rel=0.01)


# --- the op trace of a simulated job ----------------------------------------------------------


def test_the_op_trace_is_the_steps_the_job_ran() -> None:
    scenario = build([slow_worker(device=["rank1"])])
    frame = op_table(scenario, start_s=ONSET + 10, end_s=ONSET + 70)
    assert list(frame.columns) == list(OP_COLUMNS)
    steps = frame["step"].unique()
    # The steps wholly inside the 60 s (a part-step at either end is left out).
    assert len(steps) == pytest.approx(60 / (STEP_S * ((1 - COMM) * 1.3 + COMM)) - 1, abs=1)
    per_rank = frame.pivot_table(
        index=["step", "rank"], columns="optype", values="duration", observed=True
    )
    busy = (per_rank["forward-compute"] + per_rank["backward-compute"]).unstack("rank")
    coll = per_rank["grads-reduce-scatter"].unstack("rank")
    slow = 5 * 4 + 1  # j-n0005, rank1
    others = busy.drop(columns=slow)
    np.testing.assert_allclose(busy[slow], 1.3 * others.median(axis=1), rtol=1e-9)
    assert (others.max(axis=1) - others.min(axis=1)).max() < 1e-9, "everyone else alike"
    # Everyone ends the step together: the straggler waits least in the collective.
    ends = frame.assign(end=frame["start_ts"] + frame["duration"])
    last = ends[ends["optype"] == "grads-reduce-scatter"].groupby("step")["end"]
    assert (last.max() - last.min()).max() < 1e-9
    assert (coll[slow] < coll.drop(columns=slow).min(axis=1)).all()
    assert frame["start_ts"].min() >= ONSET + 10
    assert (ends["end"] <= ONSET + 70 + 1e-9).all()


def test_the_op_trace_keeps_the_last_or_evenly_spaced_steps() -> None:
    scenario = build([slow_worker()])
    every = op_table(scenario, start_s=ONSET)["step"].unique()
    last = op_table(scenario, start_s=ONSET, last_steps=10)["step"].unique()
    assert last.tolist() == every[-10:].tolist()
    thinned = op_table(scenario, start_s=ONSET, max_steps=7)["step"].unique()
    assert len(thinned) == 7 and thinned[0] == every[0] and thinned[-1] == every[-1]
    assert op_table(scenario, start_s=DURATION - 0.5).empty


@pytest.mark.parametrize(
    ("job", "kw", "expected"),
    [
        ({"sync": False}, {}, r"job 'j' is asynchronous: expected a synchronous job"),
        ({}, {"job": 1}, r"job 1: expected an index in 0\.\.0"),
        ({}, {"start_s": 50.0, "end_s": 50.0}, r"span \[50\.0, 50\.0\): expected start_s < end_s"),
        ({}, {"last_steps": 0}, r"last_steps is 0: expected at least 1"),
        ({}, {"max_steps": -2}, r"max_steps is -2: expected at least 1"),
    ],
)
def test_bad_op_trace_requests_are_named_in_one_line(
    job: dict[str, Any], kw: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ScenarioError, match=expected) as info:
        op_table(build([slow_worker()], **job), **kw)
    assert "\n" not in str(info.value)
