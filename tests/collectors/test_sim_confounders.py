"""Confounders of the simulator: the agent restart (our model of counter resets), and the
membership confounders (late joiners, scale-down, rolling restart, job end) in every output."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from collectors.sim import ConfounderType, Scenario, iter_batches, scenario_labels, simulate_table
from collectors.sim.engine import CHUNK_S
from collectors.sim.plan import compile_scenario
from minder.benchmark.replay import job_chunks
from minder.core.errors import ScenarioError
from minder.core.metrics import METRICS, MetricKind
from minder.core.records import EventKind, NodeBatch
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


# -- membership: machines join and leave the job ---------------------------------------------


def reporting(table: pd.DataFrame, scen: Scenario) -> dict[str, set[int]]:
    """Machine -> the seconds it sent samples in."""
    sec = seconds_of(table, scen)
    names = table["machine"].astype(str).to_numpy()
    out: dict[str, set[int]] = {}
    for name in np.unique(names):
        out[str(name)] = {int(x) for x in np.unique(sec[names == name])}
    return out


def streamed(scen: Scenario) -> list[NodeBatch]:
    return [b for _, batches in iter_batches(scen) for b in batches]


def leave_batches(batches: list[NodeBatch]) -> list[NodeBatch]:
    return [b for b in batches if any(e.kind is EventKind.LEAVE for e in b.events)]


def test_late_joiners_report_nothing_before_they_join_then_like_their_peers() -> None:
    scen = build([{"type": "late_join", "machines": [2, "j-n0005"], "start_s": 40}], duration_s=100)
    assert scenario_labels(scen).empty
    table = simulate_table(scen)
    seen = reporting(table, scen)
    for name in ("j-n0002", "j-n0005"):
        assert min(seen[name]) == 40 and seen[name] == set(range(40, 100)), name
        first = rows_of(table, scen, name, 40)
        assert len(first) > 0 and not is_rate(first["metric"]).any()  # the agent primes
        later = rows_of(table, scen, name, 41)
        assert len(later) == len(rows_of(table, scen, "j-n0000", 41))
    for name in set(seen) - {"j-n0002", "j-n0005"}:
        assert seen[name] == set(range(100)), name
    batches = streamed(scen)
    assert not leave_batches(batches)  # nobody left
    joiner = [b for b in batches if b.node == "j-n0002"]
    assert min(b.ts for b in joiner) == scen.start_ts + 41.0


def test_late_join_by_count_draws_distinct_machines_from_the_seed() -> None:
    scen = build([{"type": "late_join", "machines": 3, "start_s": 20}])
    again = build([{"type": "late_join", "machines": 3, "start_s": 20}])
    plan = compile_scenario(scen)[0]
    machines = plan.injections[0].target.machines
    assert len(set(machines)) == 3
    assert machines == compile_scenario(again)[0].injections[0].target.machines
    seen = reporting(simulate_table(scen), scen)
    late = {name for name, secs in seen.items() if min(secs) == 20}
    assert late == {f"j-n{m:04d}" for m in machines}


@pytest.mark.parametrize("goodbye", [False, True])
def test_scale_down_stops_a_batch_of_machines_for_good(goodbye: bool) -> None:
    start, spread = 60.0, 3.0
    scen = build(
        [{"type": "scale_down", "machines": 3, "start_s": start, "goodbye": goodbye}],
        late_rate=0.02,
    )
    assert scenario_labels(scen).empty
    target = compile_scenario(scen)[0].injections[0].target
    leaving = {
        f"j-n{m:04d}": leave for m, (leave, _back) in zip(target.machines, target.away, strict=True)
    }
    assert len(leaving) == 3
    assert all(start <= t < start + spread for t in leaving.values())
    assert all(back == np.inf for _leave, back in target.away)
    table = simulate_table(scen)
    seen = reporting(table, scen)
    for name, seconds in seen.items():
        if name in leaving:
            # Samples up to the second before the one it stops in, then none at all.
            assert seconds == set(range(int(np.floor(leaving[name])))), name
        else:
            assert seconds == set(range(100)), name
    batches = streamed(scen)
    leaves = leave_batches(batches)
    if not goodbye:
        assert not leaves and not any(b.events for b in batches)
        return
    assert sorted(b.node for b in leaves) == sorted(leaving)
    for batch in leaves:
        own = [b for b in batches if b.node == batch.node]
        assert own[-1] is batch and not batch.samples  # the last batch, after the data
        (event,) = batch.events
        assert event.device == "" and event.message == "agent stopped: SIGTERM"
        assert event.ts == pytest.approx(scen.start_ts + leaving[batch.node])
        assert batch.ts == scen.start_ts + 1.0 + np.floor(leaving[batch.node])
        assert max(b.ts for b in own if b.samples) < batch.ts


def test_scale_down_of_listed_machines_with_a_wider_spread() -> None:
    scen = build(
        [
            {
                "type": "scale_down",
                "machines": ["j-n0001", 6],
                "start_s": 30,
                "spread_s": 10,
                "goodbye": False,
            }
        ]
    )
    target = compile_scenario(scen)[0].injections[0].target
    assert target.machines == (1, 6) and not target.goodbye
    assert all(30 <= leave < 40 for leave, _back in target.away)
    seen = reporting(simulate_table(scen), scen)
    assert max(seen["j-n0001"]) < 40 and max(seen["j-n0006"]) < 40
    assert max(seen["j-n0000"]) == 99


def test_rolling_restart_takes_machines_away_one_after_another() -> None:
    scen = build(
        [
            {
                "type": "rolling_restart",
                "machines": [4, 1, 6],
                "start_s": 20,
                "every_s": 25,
                "duration_s": 30,
            }
        ],
        duration_s=150,
    )
    assert scenario_labels(scen).empty
    target = compile_scenario(scen)[0].injections[0].target
    assert target.machines == (4, 1, 6)  # in the listed order
    assert target.away == ((20.0, 50.0), (45.0, 75.0), (70.0, 100.0))
    table = simulate_table(scen)
    seen = reporting(table, scen)
    for name, (leave, back) in zip(("j-n0004", "j-n0001", "j-n0006"), target.away, strict=True):
        gone = set(range(int(leave), int(back)))
        assert seen[name] == set(range(150)) - gone, name
        first_back = rows_of(table, scen, name, int(back))
        assert len(first_back) > 0 and not is_rate(first_back["metric"]).any()
    assert seen["j-n0000"] == set(range(150))
    batches = streamed(scen)
    leaves = leave_batches(batches)
    assert [b.node for b in leaves] == ["j-n0004", "j-n0001", "j-n0006"]
    for batch, (leave, _back) in zip(leaves, target.away, strict=True):
        assert not batch.samples and batch.events[0].ts == scen.start_ts + leave
        # It reports again after its time away.
        assert any(b.node == batch.node and b.samples and b.ts > batch.ts for b in batches)


def test_rolling_restart_of_the_whole_job_stops_at_the_scenario_end() -> None:
    scen = build([{"type": "rolling_restart", "start_s": 10, "every_s": 30}], duration_s=100)
    target = compile_scenario(scen)[0].injections[0].target
    # Leaves at 10, 40, 70 (100 is past the end); each away the default 30 s.
    assert target.machines == (0, 1, 2)
    assert [back - leave for leave, back in target.away] == [30.0] * 3
    assert len(leave_batches(streamed(scen))) == 3


@pytest.mark.parametrize("goodbye", [False, True])
def test_job_end_stops_every_machine_within_the_spread(goodbye: bool) -> None:
    entry: dict[str, Any] = {"type": "job_end", "start_s": 80, "spread_s": 5}
    if not goodbye:
        entry["goodbye"] = False
    scen = build([entry], duration_s=100)
    table = simulate_table(scen)
    seen = reporting(table, scen)
    assert len(seen) == 8
    assert all(75 < max(s) < 85 and min(s) == 0 for s in seen.values())
    assert max(seconds_of(table, scen)) < 85
    batches = streamed(scen)
    assert max(b.ts for b in batches) < scen.start_ts + 86
    leaves = leave_batches(batches)
    if goodbye:
        assert sorted(b.node for b in leaves) == sorted(seen)
        assert all(scen.start_ts + 80 <= b.events[0].ts < scen.start_ts + 85 for b in leaves)
    else:
        assert not leaves


MEMBERSHIP = [
    {"type": "late_join", "machines": 2, "start_s": 25},
    {"type": "scale_down", "machine": 3, "start_s": CHUNK_S - 1.5, "spread_s": 4},
    {"type": "rolling_restart", "machines": 2, "start_s": 90, "every_s": 40, "duration_s": 35},
    {"type": "job_end", "start_s": CHUNK_S + 50, "spread_s": 3, "goodbye": False},
]


def test_membership_only_removes_samples() -> None:
    """The same values as the undisturbed run, minus the absent machines' rows."""
    plain = build([], duration_s=CHUNK_S + 60, missing_rate=0.01)
    moved = build(MEMBERSHIP, duration_s=CHUNK_S + 60, missing_rate=0.01)
    a, b = simulate_table(plain), simulate_table(moved)
    key = ["machine", "metric", "device", "ts"]
    merged = a.astype({c: object for c in key[:3]}).merge(
        b.astype({c: object for c in key[:3]}), on=key, how="left", suffixes=("", "_r")
    )
    dropped = merged["value_r"].isna().to_numpy()
    assert np.array_equal(merged["value"][~dropped], merged["value_r"][~dropped])
    assert len(b) == len(a) - int(dropped.sum()) and dropped.sum() > 0
    assert not b["value"].isna().any()


def test_membership_is_the_same_in_the_table_the_stream_and_the_replay_chunks() -> None:
    scen = build(MEMBERSHIP, duration_s=CHUNK_S + 60, late_rate=0.03, duplicate_rate=0.01)
    table = simulate_table(scen)
    batches = streamed(scen)
    from_stream = batches_to_table(batches)
    assert len(from_stream) == len(table)
    assert np.array_equal(from_stream["value"].to_numpy(), table["value"].to_numpy())
    # The chunked delivery the benchmark replays: the same samples and the same goodbyes.
    plan = compile_scenario(scen)[0]
    samples = 0
    per_machine: dict[int, set[int]] = {}
    leaves: list[tuple[int, float]] = []
    for chunk in job_chunks(plan, scen.start_ts):
        for second in range(chunk.first, chunk.stop):
            for measured, machines, _series, values in chunk.batches(second):
                samples += len(values)
                for m in np.unique(machines):
                    per_machine.setdefault(int(m), set()).add(measured)
        for row in chunk.event_rows:
            leaves += [(row.machine, e.ts) for e in row.events if e.kind is EventKind.LEAVE]
    # Duplicated batches repeat their samples in the stream and in the chunks alike.
    assert samples == len(from_stream)
    seen = reporting(table, scen)
    assert {plan.layout.machines[m]: s for m, s in per_machine.items()} == seen
    stream_leaves = sorted(
        (plan.layout.machines.index(b.node), b.events[0].ts) for b in leave_batches(batches)
    )
    # scale_down and rolling_restart say goodbye (job_end here does not); duplicates aside.
    assert sorted(set(leaves)) == sorted(set(stream_leaves)) and len(set(leaves)) == 3


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"type": "blip", "machine": 1, "start_s": 5, "spread_s": 2}, "spread_s is for"),
        ({"type": "late_join", "start_s": 5, "goodbye": True}, "goodbye is for"),
        ({"type": "scale_down", "start_s": 5, "every_s": 10}, "every_s is for"),
        ({"type": "agent_restart", "start_s": 5, "machines": 2}, "machines is for"),
        ({"type": "scale_down", "start_s": 5, "duration_s": 10}, "lasts until the scenario"),
        ({"type": "job_end", "start_s": 5, "machine": 1}, "job_end stops every machine"),
        ({"type": "late_join", "start_s": 5, "machine": 1, "machines": [2]}, "both machine"),
        ({"type": "scale_down", "start_s": 5, "machines": 0}, "machines is 0"),
        ({"type": "scale_down", "start_s": 5, "machines": []}, "empty list"),
        ({"type": "scale_down", "start_s": 5, "machines": [1, 1]}, "name a machine twice"),
        ({"type": "scale_down", "start_s": 5, "machines": [1, "j-n0001"]}, "by index and by"),
        ({"type": "scale_down", "start_s": 5, "machines": 9}, r"9 machines asked.*1\.\.8"),
        ({"type": "late_join", "start_s": 5, "machines": [99]}, r"machines: index 99"),
        ({"type": "late_join", "start_s": 5, "machines": ["x"]}, "unknown machine 'x'"),
        ({"type": "job_end", "start_s": 100}, "before the scenario's end"),
        ({"type": "job_end", "start_s": 5, "spread_s": -1}, "spread_s"),
        ({"type": "rolling_restart", "start_s": 5, "every_s": 0}, "every_s"),
    ],
)
def test_bad_membership_confounders_are_refused_in_one_line(
    entry: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ScenarioError, match=expected) as caught:
        build([entry])
    assert "\n" not in str(caught.value)
    assert "confounders[0]" in str(caught.value)


def test_a_goodbye_never_overtakes_the_machines_late_batches() -> None:
    """The agent delivers its spool in order: a late batch before the goodbye holds it back."""
    scen = build(
        [
            {"type": "scale_down", "machines": 6, "start_s": CHUNK_S - 1, "spread_s": 2},
            {"type": "rolling_restart", "machines": [6, 7], "start_s": 30, "every_s": 20},
        ],
        duration_s=CHUNK_S + 20,
        late_rate=0.5,
        duplicate_rate=0.05,
    )
    delivered: list[NodeBatch] = []
    arrival: dict[int, float] = {}  # id of a batch -> end of the second it was delivered in
    for ts, batches in iter_batches(scen):
        delivered.extend(batches)
        arrival.update((id(b), ts) for b in batches)
    leaves = leave_batches(delivered)
    assert len({(b.node, b.events[0].ts) for b in leaves}) == 8
    held_back = 0
    for goodbye in leaves:
        at = next(i for i, b in enumerate(delivered) if b is goodbye)
        after = [b for b in delivered[at + 1 :] if b.node == goodbye.node]
        # Only its own duplicate, or batches measured after it (back from a restart).
        assert all(b.ts > goodbye.ts or b.events == goodbye.events for b in after), goodbye
        held_back += arrival[id(goodbye)] > goodbye.ts
    # With half the batches late, some goodbye had to wait for a late one (the test bites).
    assert held_back > 0
