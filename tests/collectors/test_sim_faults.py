"""Each injected fault shows its signature on the injected machine, and only there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest

from collectors.sim import (
    ConfounderType,
    FaultType,
    Scenario,
    iter_batches,
    simulate_table,
)
from collectors.sim.physics import SAMPLE_MODELS
from minder.core.records import EventKind

FAULTY = "j-n0005"
ONSET = 50
DURATION = 160


def build(entries: list[dict[str, Any]], key: str = "faults", **job: Any) -> Scenario:
    spec = {
        "name": "j",
        "machines": 12,
        "step_time_s": 4.0,
        "pp_stages": 2,
        "machines_per_domain": 4,
        "metrics": list(SAMPLE_MODELS),  # every metric the simulator knows
        **job,
    }
    return Scenario.model_validate(
        {"seed": 21, "duration_s": DURATION, "jobs": [spec], key: entries}
    )


@dataclass
class Run:
    scenario: Scenario
    table: pd.DataFrame

    def values(self, metric: str, device: str | None = None) -> pd.DataFrame:
        """seconds x machines (mean over devices, or the one ``device``)."""
        rows = self.table[self.table["metric"] == metric]
        if device is not None:
            rows = rows[rows["device"] == device]
        sec = (rows["ts"] - self.scenario.start_ts - 1).round().astype(int)
        return rows.assign(sec=sec).pivot_table(
            index="sec", columns="machine", values="value", aggfunc="mean", observed=True
        )

    def window(
        self, metric: str, device: str | None = None, lo: int = ONSET + 15, hi: int = DURATION
    ) -> pd.Series:
        """Mean per machine over seconds [lo, hi)."""
        frame = self.values(metric, device)
        return frame.loc[(frame.index >= lo) & (frame.index < hi)].mean()

    def faulty_vs_peers(self, metric: str, device: str | None = None) -> tuple[float, pd.Series]:
        means = self.window(metric, device)
        return float(means[FAULTY]), means.drop(FAULTY)


def run(entry: dict[str, Any], **job: Any) -> Run:
    where = {} if "machines" in entry else {"machine": FAULTY}  # slow_group names its machines
    scen = build([{**where, "start_s": ONSET, **entry}], **job)
    return Run(scen, simulate_table(scen))


def events_of(scen: Scenario) -> list[tuple[str, Any]]:
    return [
        (batch.node, event)
        for _, batches in iter_batches(scen)
        for batch in batches
        for event in batch.events
    ]


def assert_process_died(r: Run) -> None:
    util, peers_util = r.faulty_vs_peers("gpu_util_ratio")
    cpu, peers_cpu = r.faulty_vs_peers("cpu_util_ratio")
    _, peers_tensor = r.faulty_vs_peers("gpu_tensor_active_ratio")
    power, peers_power = r.faulty_vs_peers("gpu_power_watts")
    assert util < 0.05 and peers_util.min() > 0.9  # peers spin in NCCL
    assert cpu < 0.05 and peers_cpu.min() > 0.15
    assert peers_tensor.max() < 0.05  # the job stalled
    assert power < 90 < peers_power.min() and peers_power.max() < 250
    ranks = r.values("train_step_seconds")
    assert ranks[FAULTY].loc[ONSET + 3 :].isna().all()  # no process, no step probe
    assert ranks.drop(columns=FAULTY).loc[DURATION - 1].min() > 50  # a hung step grows


def count_at_onset(r: Run, metric: str, device: str) -> None:
    counts = r.values(metric, device)
    assert counts.loc[ONSET, FAULTY] >= 1
    assert np.nansum(counts.drop(index=ONSET).to_numpy()) == 0
    assert np.nansum(counts.drop(columns=FAULTY).to_numpy()) == 0


def check_gpu_xid(r: Run) -> None:
    count_at_onset(r, "gpu_xid_count", "gpu2")
    assert_process_died(r)
    xids = [e for node, e in events_of(r.scenario) if e.kind is EventKind.XID]
    assert [(e.device, e.code) for e in xids] == [("gpu2", 119)]


def check_ecc_error(r: Run) -> None:
    count_at_onset(r, "gpu_ecc_dbe_count", "gpu2")
    count_at_onset(r, "gpu_xid_count", "gpu2")
    assert_process_died(r)
    kinds = {(e.kind, e.code) for node, e in events_of(r.scenario) if node == FAULTY}
    assert kinds == {(EventKind.ECC, None), (EventKind.XID, 48)}


def check_gpu_lost(r: Run) -> None:
    count_at_onset(r, "gpu_xid_count", "gpu2")
    lost = r.values("gpu_power_watts", "gpu2")[FAULTY]
    assert lost.loc[: ONSET - 1].notna().all() and lost.loc[ONSET + 1 :].isna().all()
    other = r.values("gpu_power_watts", "gpu3")[FAULTY]
    assert other.notna().all()  # the machine's other GPUs keep reporting
    kinds = {(e.kind, e.device, e.code) for _, e in events_of(r.scenario)}
    assert kinds == {(EventKind.XID, "gpu2", 79), (EventKind.GPU_LOST, "gpu2", None)}
    util, peers = r.faulty_vs_peers("gpu_util_ratio", "gpu3")
    assert util < 0.05 < 0.9 < peers.min()


def check_nic_down(r: Run) -> None:
    up = r.values("rdma_port_up", "mlx5_1")
    assert up.loc[ONSET + 1 :, FAULTY].max() == 0 and up.drop(columns=FAULTY).min().min() == 1
    assert r.values("rdma_port_up", "mlx5_0")[FAULTY].min() == 1
    count_at_onset(r, "rdma_link_downed_count", "mlx5_1")
    tx, _ = r.faulty_vs_peers("rdma_tx_bytes_per_second", "mlx5_1")
    assert tx == 0
    assert_job_slowed(r, 1.15)


def assert_job_slowed(r: Run, factor: float) -> None:
    step = r.values("train_step_seconds").median(axis=1)
    before, after = step.loc[10:ONSET].mean(), step.loc[ONSET + 20 :].mean()
    assert after > factor * before


def check_pcie_downgrade(r: Run) -> None:
    width = r.values("gpu_pcie_link_width")
    assert width.loc[ONSET + 1 :, FAULTY].min() == 16 * 7 / 8 + 8 / 8  # one of 8 GPUs at x8
    assert r.values("gpu_pcie_link_width", "gpu2").loc[ONSET + 1 :, FAULTY].max() == 8
    assert width.drop(columns=FAULTY).min().min() == 16
    pfc, peers = r.faulty_vs_peers("pfc_tx_pause_per_second")
    assert pfc > 50 * peers.max()
    before = r.window("rdma_tx_bytes_per_second", lo=5, hi=ONSET).drop(FAULTY).median()
    after = r.window("rdma_tx_bytes_per_second").drop(FAULTY).median()
    assert after < 0.9 * before  # the whole job's throughput falls
    assert_job_slowed(r, 1.1)


def check_nvlink_error(r: Run) -> None:
    errors = r.values("gpu_nvlink_error_count")
    assert errors[FAULTY].loc[ONSET + 1 :].sum() > 50
    assert errors.drop(columns=FAULTY).to_numpy().sum() == 0
    bw, peers = r.faulty_vs_peers("gpu_nvlink_tx_bytes_per_second", "gpu2")
    assert bw < 0.7 * peers.min()
    assert any(e.kind is EventKind.NVLINK_ERROR for _, e in events_of(r.scenario))


def check_thermal_throttle(r: Run) -> None:
    temp, peers_temp = r.faulty_vs_peers("gpu_temperature_celsius", "gpu2")
    assert temp >= 88 and peers_temp.max() < 80
    clock, peers_clock = r.faulty_vs_peers("gpu_sm_clock_hertz", "gpu2")
    assert clock < 0.8 * peers_clock.min()
    reasons = r.values("gpu_throttle_reasons", "gpu2")[FAULTY].loc[ONSET + 1 :]
    assert ((reasons.astype(int) & 0x60) == 0x60).all()
    power, peers_power = r.faulty_vs_peers("gpu_power_watts", "gpu2")
    assert power < 0.95 * peers_power.min()
    assert_job_slowed(r, 1.2)
    # The others wait for it: their collectives take longer than the hot rank's own.
    coll, peers_coll = r.faulty_vs_peers("nccl_collective_seconds", "rank2")
    assert coll < peers_coll.min()


def check_machine_unreachable(r: Run) -> None:
    seen = r.values("cpu_util_ratio")[FAULTY]
    assert seen.loc[: ONSET - 1].notna().all() and seen.loc[ONSET:].isna().all()
    assert r.values("cpu_util_ratio").drop(columns=FAULTY).notna().all().all()
    _, peers_tensor = r.faulty_vs_peers("gpu_tensor_active_ratio")
    assert peers_tensor.max() < 0.05  # the job stalled without it


def check_switch_reboot(r: Run) -> None:
    up = r.values("rdma_port_up").loc[ONSET + 1 :]
    domain = [f"j-n{i:04d}" for i in range(4, 8)]
    assert up[domain].max().max() == 0
    assert up.drop(columns=domain).min().min() == 1
    links = [(node, e.device) for node, e in events_of(r.scenario)]
    assert sorted(links) == [(m, f"mlx5_{k}") for m in domain for k in range(4)]


def check_aoc_error(r: Run) -> None:
    symbols = r.values("rdma_symbol_error_count", "mlx5_1")
    assert symbols[FAULTY].loc[ONSET + 1 :].min() > 0
    assert symbols.drop(columns=FAULTY).to_numpy().sum() == 0
    flaps = r.values("rdma_link_downed_count", "mlx5_1")[FAULTY]
    assert flaps.loc[ONSET] == 1 and flaps.sum() >= 1
    pfc, peers = r.faulty_vs_peers("pfc_tx_pause_per_second")
    assert pfc > 10 * peers.max()


def check_cuda_execution_error(r: Run) -> None:
    assert r.values("gpu_xid_count").to_numpy().sum() == 0
    assert not events_of(r.scenario)
    assert_process_died(r)


def check_gpu_execution_error(r: Run) -> None:
    sm, peers_sm = r.faulty_vs_peers("gpu_sm_active_ratio", "gpu2")
    util, peers_util = r.faulty_vs_peers("gpu_util_ratio", "gpu2")
    tensor, _ = r.faulty_vs_peers("gpu_tensor_active_ratio", "gpu2")
    assert sm > 0.8 > 0.1 > peers_sm.max()
    assert util > 0.95 and peers_util.min() > 0.9
    assert tensor < 0.01
    power, _ = r.faulty_vs_peers("gpu_power_watts", "gpu2")
    assert power < 300
    assert r.values("gpu_xid_count").to_numpy().sum() == 0


def check_hdfs_error(r: Run) -> None:
    rx, peers_rx = r.faulty_vs_peers("net_rx_bytes_per_second")
    cpu, peers_cpu = r.faulty_vs_peers("cpu_util_ratio")
    util, peers_util = r.faulty_vs_peers("gpu_util_ratio")
    assert rx < 0.3 * peers_rx.min()
    assert cpu < 0.7 * peers_cpu.min()
    assert util < 0.6 < 0.9 < peers_util.min()
    assert_job_slowed(r, 2.0)


def assert_stragglers(r: Run, slow: list[str], lo: int = ONSET + 15, hi: int = DURATION) -> None:
    """``slow`` compute longest and wait least; every rank steps together; the job slowed."""
    busy = r.window("train_busy_seconds", lo=lo, hi=hi)
    coll = r.window("nccl_collective_seconds", lo=lo, hi=hi)
    assert busy[slow].min() > 1.15 * busy.drop(slow).max()
    assert coll[slow].max() < coll.drop(slow).min()
    step = r.window("train_step_seconds", lo=lo, hi=hi)
    assert step.std() / step.mean() < 0.01
    before = r.window("train_step_seconds", lo=10, hi=ONSET).mean()
    assert step.mean() > 1.1 * before
    assert r.values("gpu_xid_count").to_numpy().sum() == 0 and not events_of(r.scenario)


def check_slow_worker(r: Run) -> None:
    assert_stragglers(r, [FAULTY])


def check_transient_straggler(r: Run) -> None:
    # 2x for 20 steps (80 s) by default, then the job runs at its pace again.
    assert_stragglers(r, [FAULTY], hi=ONSET + 75)
    busy = r.values("train_busy_seconds")
    after = busy.loc[ONSET + 90 :]
    assert (after[FAULTY] / after.drop(columns=FAULTY).median(axis=1)).max() < 1.05


def check_intermittent_straggler(r: Run) -> None:
    # ~20 of its steps (4 s nominal, ~1.65x compute on average: ~110 s), peaks and single dips.
    assert_stragglers(r, [FAULTY], hi=ONSET + 100)
    busy = r.values("train_busy_seconds")
    ratio = busy[FAULTY] / busy.drop(columns=FAULTY).median(axis=1)
    during = ratio.loc[ONSET + 10 : ONSET + 100]
    assert during.max() > 1.7 and during.min() < 1.35  # bursts and steps back


def check_slow_stage(r: Run) -> None:
    assert_stragglers(r, [f"j-n{i:04d}" for i in range(6)])  # pp0, the faulty machine's


def check_flapping_worker(r: Run) -> None:
    busy = r.values("train_busy_seconds")
    ratio = busy[FAULTY] / busy.drop(columns=FAULTY).median(axis=1)
    assert ratio.loc[ONSET + 9 : ONSET + 19].min() > 1.4
    assert ratio.loc[ONSET + 29 : ONSET + 39].max() < 1.05
    assert ratio.loc[ONSET + 49 : ONSET + 59].min() > 1.4


def check_slow_group(r: Run) -> None:
    assert_stragglers(r, ["j-n0001", "j-n0005", "j-n0009"])


CASES: dict[FaultType, tuple[dict[str, Any], Callable[[Run], None]]] = {
    FaultType.GPU_XID: ({"device": "gpu2"}, check_gpu_xid),
    FaultType.ECC_ERROR: ({"device": "gpu2"}, check_ecc_error),
    FaultType.GPU_LOST: ({"device": "gpu2"}, check_gpu_lost),
    FaultType.NIC_DOWN: ({"device": "mlx5_1"}, check_nic_down),
    FaultType.PCIE_DOWNGRADE: ({"device": "gpu2", "link_width": 8}, check_pcie_downgrade),
    FaultType.NVLINK_ERROR: ({"device": "gpu2"}, check_nvlink_error),
    FaultType.THERMAL_THROTTLE: ({"device": "gpu2"}, check_thermal_throttle),
    FaultType.MACHINE_UNREACHABLE: ({}, check_machine_unreachable),
    FaultType.SWITCH_REBOOT: ({}, check_switch_reboot),
    FaultType.AOC_ERROR: ({"device": "mlx5_1"}, check_aoc_error),
    FaultType.CUDA_EXECUTION_ERROR: ({}, check_cuda_execution_error),
    FaultType.GPU_EXECUTION_ERROR: ({"device": "gpu2"}, check_gpu_execution_error),
    FaultType.HDFS_ERROR: ({}, check_hdfs_error),
    FaultType.SLOW_WORKER: ({"factor": 1.3}, check_slow_worker),
    FaultType.TRANSIENT_STRAGGLER: ({}, check_transient_straggler),
    FaultType.SLOW_STAGE: ({}, check_slow_stage),
    FaultType.FLAPPING_WORKER: ({"period_s": 20}, check_flapping_worker),
    FaultType.SLOW_GROUP: ({"machines": [1, 5, 9]}, check_slow_group),
    FaultType.INTERMITTENT_STRAGGLER: ({}, check_intermittent_straggler),
}


def test_every_fault_type_has_a_signature_test() -> None:
    assert set(CASES) == set(FaultType)


@pytest.mark.parametrize("fault", list(CASES), ids=str)
def test_fault_signature(fault: FaultType) -> None:
    entry, check = CASES[fault]
    check(run({"type": fault.value, **entry}))


def test_fault_with_duration_recovers() -> None:
    r = run({"type": "gpu_xid", "device": "gpu1", "duration_s": 40})
    util = r.values("gpu_util_ratio")
    assert util.loc[ONSET + 5 : ONSET + 35, FAULTY].max() < 0.05
    assert util.loc[ONSET + 45 :, FAULTY].min() > 0.5
    tensor = r.values("gpu_tensor_active_ratio").median(axis=1)
    assert tensor.loc[ONSET + 45 :].max() > 0.4  # the job computes again


def test_switch_reboot_can_silence_the_domain() -> None:
    r = run({"type": "switch_reboot", "silent": True, "duration_s": 60})
    cpu = r.values("cpu_util_ratio")
    domain = [f"j-n{i:04d}" for i in range(4, 8)]
    assert cpu.loc[ONSET : ONSET + 59, domain].isna().all().all()
    assert cpu.loc[ONSET + 61 :, domain].notna().all().all()


def test_blip_is_short_and_on_one_machine() -> None:
    scen = build([{"type": "blip", "machine": FAULTY, "start_s": ONSET}], key="confounders")
    r = Run(scen, simulate_table(scen))
    cpu = r.values("cpu_util_ratio")
    excess = cpu[FAULTY] - cpu.drop(columns=FAULTY).median(axis=1)
    assert (excess > 0.2).sum() == 10
    assert excess.loc[ONSET : ONSET + 9].min() > 0.2
    assert not r.table["metric"].isin(["gpu_xid_count"]).pipe(lambda m: r.table[m]["value"].any())


def test_eval_phase_changes_everyones_rhythm() -> None:
    scen = build(
        [{"type": ConfounderType.EVAL_PHASE.value, "start_s": ONSET, "duration_s": 60}],
        key="confounders",
    )
    r = Run(scen, simulate_table(scen))
    step = r.values("train_step_seconds")
    during = step.loc[ONSET + 10 : ONSET + 55]
    assert during.max().max() < 0.6 * step.loc[10:ONSET].min().min()
    tensor = r.values("gpu_tensor_active_ratio").loc[ONSET + 10 : ONSET + 55]
    spread = tensor.std(axis=1) / tensor.mean(axis=1)
    assert np.nanmedian(spread) < 0.2  # still all in step


def test_pcie_generation_downgrade_keeps_the_width() -> None:
    r = run({"type": "pcie_downgrade", "device": "gpu4", "link_gen": 3})
    assert r.values("gpu_pcie_link_gen", "gpu4").loc[ONSET + 1 :, FAULTY].max() == 3
    assert r.values("gpu_pcie_link_width", "gpu4")[FAULTY].min() == 16
    pfc, peers = r.faulty_vs_peers("pfc_tx_pause_per_second")
    assert pfc > 50 * peers.max()
