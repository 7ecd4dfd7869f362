"""Confounders of the simulator: the agent restart (our model of counter resets)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from collectors.sim import ConfounderType, Scenario, iter_batches, scenario_labels, simulate_table
from collectors.sim.engine import CHUNK_S
from minder.core.errors import ScenarioError
from minder.core.metrics import METRICS, MetricKind
from minder.core.table import batches_to_table

MACHINE = "j-n0003"
START = 50


def build(confounders: list[dict[str, Any]], duration_s: int = 100, **job: Any) -> Scenario:
    spec = {"name": "j", "machines": 8, "step_time_s": 4.0, "machines_per_domain": 4, **job}
    return Scenario.model_validate(
        {"seed": 5, "duration_s": duration_s, "jobs": [spec], "confounders": confounders}
    )


def seconds_of(table: pd.DataFrame, scen: Scenario) -> np.ndarray:
    return (table["ts"].to_numpy() - scen.start_ts - 1.0).round().astype(int)


def rows_of(table: pd.DataFrame, scen: Scenario, machine: str, second: int) -> pd.DataFrame:
    mask = (table["machine"] == machine).to_numpy() & (seconds_of(table, scen) == second)
    return table[mask]


def is_rate(metrics: pd.Series) -> np.ndarray:
    return np.array([METRICS[str(m)].kind is MetricKind.RATE for m in metrics])


def test_agent_restart_silences_the_machine_then_drops_its_first_rates() -> None:
    scen = build([{"type": "agent_restart", "machine": MACHINE, "start_s": START}])
    assert scen.confounders[0].length_s == 4.0
    table = simulate_table(scen)
    full = len(rows_of(table, scen, MACHINE, START - 1))
    assert full > 0
    for second in range(START, START + 4):
        assert rows_of(table, scen, MACHINE, second).empty, second
    back = rows_of(table, scen, MACHINE, START + 4)
    assert len(back) > 0
    assert not is_rate(back["metric"]).any()
    assert {"gpu_util_ratio", "gpu_xid_count", "rdma_port_up"} <= set(back["metric"].astype(str))
    after = rows_of(table, scen, MACHINE, START + 5)
    assert len(after) == full and is_rate(after["metric"]).any()
    # Every other machine reports every series throughout.
    others = table[(table["machine"] != MACHINE).to_numpy()]
    per_second = others.groupby(["machine", "ts"], observed=True).size()
    assert per_second.min() == per_second.max() == full


def test_agent_restart_is_no_fault_and_never_a_negative_rate() -> None:
    scen = build(
        [
            {"type": "agent_restart", "machine": MACHINE, "start_s": START, "duration_s": 7},
            {"type": "agent_restart", "machine": 6, "start_s": 20},
        ]
    )
    assert scenario_labels(scen).empty
    table = simulate_table(scen)
    assert (table["value"] >= 0).all()
    rates = table[is_rate(table["metric"])]
    sec = seconds_of(rates, scen)
    own = (rates["machine"] == MACHINE).to_numpy()
    assert not (own & (sec >= START) & (sec <= START + 7)).any()
    assert (own & (sec == START + 8)).any()


def test_agent_restart_only_removes_samples() -> None:
    """The same values as the undisturbed run, minus the restart's rows: no value changes and
    the random streams stay aligned (the simulator's determinism)."""
    plain = build([], missing_rate=0.01)
    restart = build(
        [{"type": "agent_restart", "machine": MACHINE, "start_s": START}], missing_rate=0.01
    )
    a, b = simulate_table(plain), simulate_table(restart)
    key = ["machine", "metric", "device", "ts"]
    merged = a.astype({c: object for c in key[:3]}).merge(
        b.astype({c: object for c in key[:3]}), on=key, how="left", suffixes=("", "_r")
    )
    dropped = merged["value_r"].isna().to_numpy()
    assert np.array_equal(merged["value"][~dropped], merged["value_r"][~dropped])
    sec = seconds_of(merged, plain)
    gone = merged[dropped]
    assert set(gone["machine"]) == {MACHINE}
    assert set(sec[dropped]) == set(range(START, START + 5))
    assert len(b) == len(a) - int(dropped.sum())
    again = simulate_table(restart)
    assert np.array_equal(again["value"].to_numpy(), b["value"].to_numpy())


def test_agent_restart_across_a_chunk_boundary_and_in_the_stream() -> None:
    start = CHUNK_S - 2.5  # silent 117..121 (fractional end), rates back at 122
    scen = build(
        [{"type": ConfounderType.AGENT_RESTART.value, "machine": 1, "start_s": start}],
        duration_s=CHUNK_S + 30,
        late_rate=0.02,
    )
    table = simulate_table(scen)
    name = "j-n0001"
    for second in range(CHUNK_S - 3, CHUNK_S + 2):
        assert rows_of(table, scen, name, second).empty, second
    first_back = rows_of(table, scen, name, CHUNK_S + 2)
    assert len(first_back) > 0 and not is_rate(first_back["metric"]).any()
    assert is_rate(rows_of(table, scen, name, CHUNK_S + 3)["metric"]).any()
    streamed = batches_to_table([b for _, batches in iter_batches(scen) for b in batches])
    assert len(streamed) == len(table)
    assert np.array_equal(streamed["value"].to_numpy(), table["value"].to_numpy())


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"type": "agent_restart", "machine": 99, "start_s": 10}, "out of range"),
        ({"type": "agent_restart", "start_s": 500}, "before the scenario's end"),
        ({"type": "agent_restart", "start_s": 10, "duration_s": -1}, "duration_s"),
    ],
)
def test_bad_agent_restart_is_refused(entry: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScenarioError, match=expected):
        build([entry])
