"""The collective self-check (collectors/selfcheck/collective.py): its configuration, its pairing
and judging on plain numbers (examples and hypothesis properties), and real gloo ranks on this
host (:mod:`collective_ranks`: 2 to 8 forked processes on 127.0.0.1, one partner or the suspect
slowed 3 times by the test's own compute step), among them issue 24's figure: 50 healthy checks
of 4 to 8 processes all pass, and 10 with a partner slowed 3x all name it and pass the
suspect."""

from __future__ import annotations

import importlib.util
import math
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from collective_ranks import CheckSpec, RanksRun, run_checks, run_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.selfcheck.collective import (
    CHECK_NAME,
    MAX_WORLD,
    NO_PARTNER,
    CollectiveConfig,
    CollectiveOptions,
    RoundTimes,
    _measurements,
    judge,
    next_round,
    pair_round1,
    pair_round2,
    run_collective_check,
)
from minder.core.errors import ValidationError
from minder.core.selfcheck import MAX_MEASUREMENTS, CheckResult, CheckStatus, Measurement

NAN = math.nan


def env(**extra: str) -> dict[str, str]:
    base = {
        "MINDER_SELFCHECK_NODES": "n7,n3,n4,n5",
        "MINDER_SELFCHECK_SUSPECT": "n7",
        "MINDER_SELFCHECK_NODE": "n3",
        "MINDER_SELFCHECK_RANK": "1",
        "MINDER_SELFCHECK_WORLD": "4",
        "MINDER_SELFCHECK_MASTER": "10.0.0.7:29500",
    }
    base.update(extra)
    return {k: v for k, v in base.items() if v != "<unset>"}


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def test_from_env_reads_the_launcher_contract() -> None:
    config = CollectiveConfig.from_env(env())
    assert config == CollectiveConfig(("n7", "n3", "n4", "n5"), "n7", "n3", 1, 4, "10.0.0.7", 29500)


def test_from_env_falls_back_to_slurm_variables() -> None:
    config = CollectiveConfig.from_env(
        env(
            MINDER_SELFCHECK_NODE="<unset>",
            MINDER_SELFCHECK_RANK="<unset>",
            MINDER_SELFCHECK_WORLD="<unset>",
            SLURMD_NODENAME="n5",
            SLURM_PROCID="3",
            SLURM_NTASKS="4",
            MINDER_SELFCHECK_MASTER="[fd00::7]:29500",
        )
    )
    assert (config.node, config.rank, config.world) == ("n5", 3, 4)
    assert (config.master_host, config.master_port) == ("fd00::7", 29500)


def test_from_env_by_hand_is_a_world_of_this_host() -> None:
    config = CollectiveConfig.from_env({})
    assert config.world == 1
    assert config.nodes == (socket.gethostname(),) == (config.suspect,)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"MINDER_SELFCHECK_RANK": "4"}, "MINDER_SELFCHECK_RANK 4: expected a rank of 0 to 3"),
        ({"MINDER_SELFCHECK_RANK": "-1"}, "expected a rank of 0 to 3"),
        ({"MINDER_SELFCHECK_RANK": "one"}, "MINDER_SELFCHECK_RANK 'one': expected an integer"),
        ({"MINDER_SELFCHECK_WORLD": "0"}, "MINDER_SELFCHECK_WORLD 0: expected 1 to 16 nodes"),
        ({"MINDER_SELFCHECK_WORLD": "17"}, "expected 1 to 16 nodes"),
        ({"MINDER_SELFCHECK_WORLD": "3"}, "has 4 nodes for a world of 3"),
        ({"MINDER_SELFCHECK_SUSPECT": "n9"}, "MINDER_SELFCHECK_SUSPECT 'n9': expected one of"),
        ({"MINDER_SELFCHECK_SUSPECT": "<unset>"}, "MINDER_SELFCHECK_SUSPECT '': expected one of"),
        ({"MINDER_SELFCHECK_NODE": "n9"}, "this node 'n9': expected one of the check's nodes"),
        ({"MINDER_SELFCHECK_NODES": "n7,n3,n3,n5"}, "names a node twice"),
        ({"MINDER_SELFCHECK_NODES": "n7,,n4,n5"}, "entry '': expected a printable node name"),
        ({"MINDER_SELFCHECK_NODES": "<unset>"}, "MINDER_SELFCHECK_NODES is unset with a world"),
        ({"MINDER_SELFCHECK_MASTER": "<unset>"}, "MINDER_SELFCHECK_MASTER is unset"),
        ({"MINDER_SELFCHECK_MASTER": "10.0.0.7"}, "'10.0.0.7': expected host:port"),
        ({"MINDER_SELFCHECK_MASTER": "10.0.0.7:0"}, "expected host:port with a port of 1-65535"),
        ({"MINDER_SELFCHECK_MASTER": "10.0.0.7:70000"}, "port of 1-65535"),
        ({"MINDER_SELFCHECK_MASTER": ":29500"}, "expected host:port"),
        ({"MINDER_SELFCHECK_MASTER": "fd00::7:29500"}, "an IPv6 host in brackets"),
    ],
)
def test_from_env_refuses_bad_values_in_one_line(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        CollectiveConfig.from_env(env(**overrides))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_options_refuse_bad_values() -> None:
    with pytest.raises(ValidationError, match=r"threshold 1\.0: expected a number above 1"):
        CollectiveOptions(threshold=1.0)
    with pytest.raises(ValidationError, match="min_iterations 0"):
        CollectiveOptions(min_iterations=0)
    with pytest.raises(ValidationError, match="allreduce_bytes 2"):
        CollectiveOptions(allreduce_bytes=2)
    with pytest.raises(ValidationError, match="round_s nan"):
        CollectiveOptions(round_s=math.nan)


def test_a_bad_environment_is_an_error_result_not_an_exception() -> None:
    result = run_collective_check(env(MINDER_SELFCHECK_SUSPECT="n9"), timeout_s=5)
    assert result.name == CHECK_NAME
    assert result.status is CheckStatus.ERROR
    assert "MINDER_SELFCHECK_SUSPECT 'n9'" in result.summary
    for bad in (0, -1.0, math.inf, math.nan):
        assert run_collective_check(env(), timeout_s=bad).status is CheckStatus.ERROR


def test_world_of_one_is_skipped_without_a_partner() -> None:
    result = run_collective_check(
        {
            "MINDER_SELFCHECK_NODES": "n7",
            "MINDER_SELFCHECK_SUSPECT": "n7",
            "MINDER_SELFCHECK_NODE": "n7",
            "MINDER_SELFCHECK_RANK": "0",
            "MINDER_SELFCHECK_WORLD": "1",
        },
        timeout_s=5,
    )
    assert result.status is CheckStatus.SKIPPED
    assert result.summary == NO_PARTNER == "no healthy partner was available"


def test_without_torch_it_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes ``import torch`` raise ImportError, as on a host without torch.
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    result = run_collective_check(env(), timeout_s=5)
    assert result.status is CheckStatus.SKIPPED
    assert "torch.distributed is not installed" in result.summary


def test_two_nodes_without_a_compute_step_are_skipped() -> None:
    result = run_collective_check(
        env(
            MINDER_SELFCHECK_NODES="n7,n3",
            MINDER_SELFCHECK_WORLD="2",
        ),
        timeout_s=5,
        options=CollectiveOptions(matmul=False),
    )
    assert result.status is CheckStatus.SKIPPED
    assert "cannot tell which node is slow" in result.summary


# --------------------------------------------------------------------------------------------
# Pairing
# --------------------------------------------------------------------------------------------


def test_round1_pairs_in_rank_order() -> None:
    assert pair_round1(2) == ((0, 1),)
    assert pair_round1(4) == ((0, 1), (2, 3))
    assert pair_round1(8) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_round1_with_an_odd_world_sits_out_a_partner_never_the_suspect() -> None:
    assert pair_round1(5) == ((0, 1), (2, 3))  # rank 4 out
    assert pair_round1(5, suspect=4) == ((0, 1), (2, 4))  # rank 3 out
    assert pair_round1(7, suspect=6) == ((0, 1), (2, 3), (4, 6))
    assert pair_round1(3, suspect=2) == ((0, 2),)
    with pytest.raises(ValueError, match="world size 1: expected at least 2"):
        pair_round1(1)
    with pytest.raises(ValueError, match="suspect rank 5: expected a rank of 0 to 4"):
        pair_round1(5, suspect=5)


def test_round2_pairs_slowest_with_fastest() -> None:
    # slowest 2, then 0, 3, fastest 1
    assert pair_round2([3.0, 1.0, 9.0, 2.0]) == ((1, 2), (0, 3))
    # the slow pair of round 1 (0, 1) is split, each member with one of the fast pair
    assert pair_round2([3.0, 3.0, 1.0, 1.0]) == ((0, 3), (1, 2))


def test_round2_breaks_ties_by_rank() -> None:
    assert pair_round2([1.0, 1.0, 1.0, 1.0]) == ((0, 3), (1, 2))
    assert pair_round2([2.0] * 6) == ((0, 5), (1, 4), (2, 3))


def test_round2_with_an_odd_world_plays_the_rank_that_sat_out() -> None:
    # rank 4 sat round 1 out (NaN); the partner of median round-1 time sits round 2 out
    times = [1.0, 1.1, 3.0, 3.2, NAN]
    groups = pair_round2(times, suspect=2)
    ranks = sorted(r for g in groups for r in g)
    assert 4 in ranks and 2 in ranks and len(ranks) == 4
    # partners that played: 0 (1.0), 1 (1.1), 3 (3.2); the median one, rank 1, sits out
    assert 1 not in ranks
    assert groups == ((0, 3), (2, 4))  # 3 slowest with 0 fastest; 2 with 4 (taken as median)


def test_round2_refuses_bad_times() -> None:
    with pytest.raises(ValueError, match=r"round-1 time of rank 1 is -1\.0"):
        pair_round2([1.0, -1.0])
    with pytest.raises(ValueError, match=r"round-1 times of ranks \[1\] are NaN"):
        pair_round2([1.0, NAN, 1.0, 1.0])  # an even world leaves nobody out
    with pytest.raises(ValueError, match=r"ranks \[0\] are NaN"):
        pair_round2([NAN, 1.0, 1.0], suspect=0)  # the suspect never sits out
    with pytest.raises(ValueError, match="round-1 time of rank 0 is inf"):
        pair_round2([math.inf, 1.0])


def test_next_round_plans() -> None:
    two = RoundTimes(((0, 1),), [1.0, 1.0], [1.0, 1.0])
    assert next_round(2, []) == ((0, 1),)
    assert next_round(2, [two]) is None
    tri = RoundTimes(((0, 1),), [1.0, 1.0, NAN], [1.0, 1.0, NAN])
    assert [next_round(3, [tri] * k) for k in range(4)] == [((0, 1),), ((0, 2),), ((1, 2),), None]
    r1 = RoundTimes(((0, 1), (2, 3)), [3.0, 3.0, 1.0, 1.0], [1.0] * 4)
    assert next_round(4, []) == ((0, 1), (2, 3))
    assert next_round(4, [r1]) == ((0, 3), (1, 2))
    assert next_round(4, [r1, r1]) is None


# --------------------------------------------------------------------------------------------
# Judging: examples
# --------------------------------------------------------------------------------------------


def rounds_of(
    n: int,
    compute: list[float],
    net: list[float] | None = None,
    *,
    suspect: int = 0,
    noise: list[list[float]] | None = None,
) -> list[RoundTimes]:
    """The rounds of the plan of ``next_round`` on nodes with ``compute`` times and network
    factors ``net`` (an all-reduce of 1 on healthy links): a rank's compute is its own; its
    all-reduce is its group's slowest link; ``noise[round][rank]`` multiplies both."""
    net = net or [1.0] * n
    done: list[RoundTimes] = []
    while (groups := next_round(n, done, suspect=suspect)) is not None:
        k = len(done)
        c = [NAN] * n
        a = [NAN] * n
        for group in groups:
            link = max(net[r] for r in group)
            for r in group:
                f = noise[k][r] if noise else 1.0
                c[r] = compute[r] * f
                a[r] = link * f
        done.append(RoundTimes(groups, c, a))
    return done


def test_a_slow_suspect_fails_in_both_rounds() -> None:
    j = judge(rounds_of(4, [3.0, 1.0, 1.0, 1.0]))
    assert j.failed(0)
    assert [e.round for e in j.of(0)] == [1, 2]
    assert all(e.slow and e.part == "compute" and e.ratio == 3.0 for e in j.of(0))
    assert j.failed_ranks == (0,)
    assert j.references[1] == (1.0, 1.0)  # two pairs: the faster pair's times
    assert j.compute_ratio[0] == 3.0


def test_a_slow_partner_does_not_fail_the_suspect() -> None:
    j = judge(rounds_of(4, [1.0, 3.0, 1.0, 1.0]))
    suspect = j.of(0)
    assert [e.slow for e in suspect] == [True, False]  # its partner's victim in round 1
    assert not j.failed(0)
    assert j.failed(1)


def test_a_slow_network_fails_by_the_allreduce_part() -> None:
    j = judge(rounds_of(6, [1.0] * 6, [1.0, 1.0, 1.0, 1.0, 3.0, 1.0], suspect=4), threshold=2.0)
    assert j.failed_ranks == (4,)
    assert all(e.part == "allreduce" and e.reference == "median" for e in j.of(4))


def test_exactly_twice_the_median_is_not_slow() -> None:
    j = judge(rounds_of(6, [2.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    assert [e.ratio for e in j.of(0)] == [2.0, 2.0]
    assert not j.failed(0)
    assert judge(rounds_of(6, [2.01, 1, 1, 1, 1, 1])).failed(0)


def test_compute_only_judging_ignores_the_compute_part() -> None:
    rounds = rounds_of(4, [3.0, 1.0, 1.0, 1.0])
    assert not judge(rounds, parts=("allreduce",)).failed(0)


def test_three_nodes_judge_each_node_by_its_pairs_against_the_pair_without_it() -> None:
    j = judge(rounds_of(3, [1.0, 1.0, 3.0], suspect=2))
    assert j.failed_ranks == (2,)
    assert [(e.round, e.members) for e in j.of(2)] == [(2, (0, 2)), (3, (1, 2))]
    assert all(e.reference == "the pair (0, 1)" and e.ratio == 3.0 for e in j.of(2))
    # node 0's pairs: (0, 1) 1x the pair (1, 2), (0, 2) 1x it: not slow
    assert [e.slow for e in j.of(0)] == [False, False]


def test_two_nodes_are_judged_by_local_compute() -> None:
    j = judge(rounds_of(2, [3.0, 1.0]))
    assert j.decided_by == "local compute times"
    assert j.failed(0) and not j.failed(1)
    assert j.of(0)[0].ratio == 3.0
    # a slow link alone cannot be attributed: nobody fails
    assert judge(rounds_of(2, [1.0, 1.0], [1.0, 5.0])).failed_ranks == ()


def test_a_partner_that_sat_a_round_out_cannot_fail() -> None:
    # 5 nodes: rank 4 sits round 1 out, so it is judged in round 2 only
    j = judge(rounds_of(5, [1.0, 1.0, 1.0, 1.0, 3.0], suspect=0))
    assert len(j.of(4)) == 1 and j.of(4)[0].slow
    assert j.failed_ranks == ()
    assert len(j.of(0)) == 2  # the suspect plays both rounds


def test_judge_refuses_what_is_not_a_plan() -> None:
    good = rounds_of(4, [1.0] * 4)
    with pytest.raises(ValueError, match="expected two rounds of two or more pairs"):
        judge(good[:1])
    with pytest.raises(ValueError, match=r"compute time of rank 0 is 0\.0"):
        judge([RoundTimes(good[0].groups, [0.0, 1, 1, 1], [1.0] * 4), good[1]])
    with pytest.raises(ValueError, match="expected distinct ranks"):
        judge([RoundTimes(((0, 1), (1, 2)), [1.0] * 4, [1.0] * 4), good[1]])
    with pytest.raises(ValueError, match="threshold 1: expected a number above 1"):
        judge(good, threshold=1)
    with pytest.raises(ValueError, match="parts"):
        judge(good, parts=("gpu",))
    with pytest.raises(ValueError, match="expected 'compute' in parts"):
        judge(rounds_of(2, [1.0, 1.0]), parts=("allreduce",))
    with pytest.raises(ValueError, match="expected the pairs"):
        judge(rounds_of(3, [1.0] * 3)[:2])


def test_measurements_of_the_largest_world_fit_a_report() -> None:
    n = MAX_WORLD
    rounds = rounds_of(n, [1.0 + r / 100 for r in range(n)], suspect=n - 1)
    j = judge(rounds)
    setup: dict[str, Measurement] = {"backend": "gloo", "device": "cpu", "allreduce_bytes": 1 << 20, "matmul_dim": 128,
             "compute_step": "matmul", "warmup": 5, "round_s": 2.0, "min_iterations": 10}  # fmt: skip
    names = [f"node-{r:03d}.cluster.example" for r in range(n)]
    m = _measurements(j, rounds, n - 1, names, setup, [[10] * n] * 2, ("compute", "allreduce"))
    assert len(m) <= MAX_MEASUREMENTS
    result = CheckResult(CHECK_NAME, CheckStatus.PASS, "ok", m, 1.0)
    assert CheckResult.from_dict(result.to_dict()).measurements == m


# --------------------------------------------------------------------------------------------
# Judging: properties
# --------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 100.0), min_size=2, max_size=MAX_WORLD, unique=True))
def test_round2_pairs_the_slowest_with_the_fastest(times: list[float]) -> None:
    if len(times) % 2:
        times = times[:-1]
    groups = pair_round2(times)
    slowest = max(range(len(times)), key=times.__getitem__)
    fastest = min(range(len(times)), key=times.__getitem__)
    assert (min(slowest, fastest), max(slowest, fastest)) in groups
    assert sorted(r for g in groups for r in g) == list(range(len(times)))
    assert all(len(g) == 2 for g in groups)


@settings(max_examples=200, deadline=None)
@given(st.integers(5, MAX_WORLD).filter(lambda n: n % 2), st.data())
def test_odd_worlds_always_play_the_suspect_and_the_rank_that_sat_out(
    n: int, data: st.DataObject
) -> None:
    suspect = data.draw(st.integers(0, n - 1))
    r1 = pair_round1(n, suspect=suspect)
    played = {r for g in r1 for r in g}
    (sat_out,) = set(range(n)) - played
    assert suspect in played
    times = [data.draw(st.floats(0.001, 10.0)) if r in played else NAN for r in range(n)]
    r2 = pair_round2(times, suspect=suspect)
    played2 = {r for g in r2 for r in g}
    assert {suspect, sat_out} <= played2
    assert len(played2) == n - 1


worlds = st.integers(2, MAX_WORLD)


@st.composite
def checks(draw: st.DrawFn) -> tuple[int, list[float], list[float], int, list[list[float]]]:
    """A world of healthy nodes (compute and links within 20% of each other), maybe one node 3
    to 10 times slower in compute or in its link (its index, or -1), and per-round noise of
    ±5%."""
    n = draw(worlds)
    compute = [draw(st.floats(1.0, 1.2)) for _ in range(n)]
    net = [draw(st.floats(1.0, 1.2)) for _ in range(n)]
    slow = draw(st.none() | st.integers(0, n - 1))
    if slow is not None:
        factor = draw(st.floats(3.0, 10.0))
        # a 2-node check can only see compute
        if n == 2 or draw(st.booleans()):
            compute[slow] *= factor
        else:
            net[slow] *= factor
    noise = [[draw(st.floats(0.95, 1.05)) for _ in range(n)] for _ in range(3)]
    return n, compute, net, -1 if slow is None else slow, [*noise, [1.0] * n]


@settings(max_examples=300, deadline=None)
@given(checks(), st.floats(0.001, 1000.0))
def test_verdict_is_unchanged_when_every_time_is_scaled(
    check: tuple[int, list[float], list[float], int, list[list[float]]], scale: float
) -> None:
    n, compute, net, _slow, noise = check
    base = judge(rounds_of(n, compute, net, noise=noise))
    scaled = judge(
        rounds_of(n, [c * scale for c in compute], [a * scale for a in net], noise=noise)
    )
    assert scaled.failed_ranks == base.failed_ranks
    for a, b in zip(base.evidence, scaled.evidence, strict=True):
        assert math.isclose(a.ratio, b.ratio, rel_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(checks(), st.randoms(use_true_random=False))
def test_verdict_is_the_slow_node_whatever_the_rank_numbering(
    check: tuple[int, list[float], list[float], int, list[list[float]]], rng: object
) -> None:
    import random

    assert isinstance(rng, random.Random)
    n, compute, net, slow, noise = check
    for _ in range(3):
        order = list(range(n))  # order[new rank] = node
        rng.shuffle(order)
        c = [compute[node] for node in order]
        a = [net[node] for node in order]
        for suspect_node in range(n):
            suspect = order.index(suspect_node)
            j = judge(rounds_of(n, c, a, suspect=suspect, noise=noise))
            assert j.failed(suspect) == (suspect_node == slow), (order, suspect_node, j)


# --------------------------------------------------------------------------------------------
# Real gloo ranks on this host
# --------------------------------------------------------------------------------------------

real = pytest.mark.slow
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the real collective check needs torch"
)


def same_everywhere(run: RanksRun, world: int) -> dict[str, Any]:
    """Every rank's result, checked to carry the same status, summary and measurements (but
    the rank's own set-up: the slowed rank runs the test's compute step, not the matmul)."""
    assert sorted(run.results) == list(range(world)), run.log
    first = run.results[0]
    local = {"compute_step", "matmul_dim", "device"}

    def shared(result: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in result["measurements"].items() if k not in local}

    for result in run.results.values():
        assert result["status"] == first["status"]
        assert result["summary"] == first["summary"]
        assert shared(result) == shared(first)
        assert CheckResult.from_dict(result).name == CHECK_NAME
    return first


@real
@needs_torch
def test_real_healthy_set_passes(tmp_path: Path) -> None:
    run = run_ranks(4, tmp_path, suspect=2, timeout_s=60)
    result = same_everywhere(run, 4)
    assert result["status"] == "pass", (result["summary"], run.log)
    assert result["summary"].startswith("suspect n2 within 2x in both rounds: round 1 pair (n2,n3)")
    m = result["measurements"]
    assert m["backend"] == "gloo" and m["world"] == 4 and m["suspect_rank"] == 2
    for rnd in (1, 2):
        for rank in range(4):
            assert m[f"round{rnd}.rank{rank}.allreduce_s"] > 0
            assert m[f"round{rnd}.rank{rank}.iterations"] >= 10
    assert m["round1.group0.ranks"] == "0,1" and m["round1.group1.ranks"] == "2,3"


SLOWED = "sleep"
"""How the real tests slow a rank 3x: its matmul once, then a sleep of twice the matmul's time.
Here 3-8 ranks share this host's 2 cores, so extra work (``work`` mode) also slows the healthy
ranks it competes with; on a shared, slow host (2026-11-30) the 3x rank then measured 1.5-2.2x
its peers and two tests failed. A slow device on a real node (a throttled GPU, a slow link)
takes no CPU from its peers on other nodes: the sleep keeps the rank 3x its own measured
compute whatever the contention."""


@real
@needs_torch
def test_real_slowed_suspect_fails_in_both_rounds(tmp_path: Path) -> None:
    run = run_ranks(5, tmp_path, suspect=3, slow=3, factor=3, mode=SLOWED, timeout_s=60)
    result = same_everywhere(run, 5)
    assert result["status"] == "fail", (result["summary"], run.log)
    summary = result["summary"]
    # round 1: (0,1) and (2,3), rank 4 out; round 2: the suspect with the fastest
    assert summary.startswith("suspect n3 slow in both rounds: round 1 pair (n2,n3) "), summary
    assert ", round 2 pair (" in summary and "x the faster pair" in summary
    m = result["measurements"]
    assert m["suspect.round1.slow"] is True and m["suspect.round2.slow"] is True
    assert m["suspect.round1.ratio"] > 2 and m["suspect.round2.ratio"] > 2
    assert m["rank3.compute_ratio"] > 2  # the local compute says where the time went


@real
@needs_torch
def test_real_slowed_partner_is_named_and_does_not_fail_the_suspect(tmp_path: Path) -> None:
    run = run_ranks(4, tmp_path, suspect=0, slow=3, factor=3, mode=SLOWED, timeout_s=60)
    result = same_everywhere(run, 4)
    assert result["status"] == "pass", (result["summary"], run.log)
    assert result["summary"].endswith("; partner n3 slow"), result["summary"]
    assert result["measurements"]["failed_ranks"] == "3"


@real
@needs_torch
def test_real_three_nodes_find_the_slow_suspect_by_its_pairs(tmp_path: Path) -> None:
    run = run_ranks(3, tmp_path, suspect=1, slow=1, factor=3, mode=SLOWED, timeout_s=60)
    result = same_everywhere(run, 3)
    assert result["status"] == "fail", (result["summary"], run.log)
    assert result["summary"].startswith(
        "suspect n1 slow in both its pairs: round 1 pair (n0,n1) "
    ), result["summary"]
    assert "the partners' pair (n0,n2)" in result["summary"]


@real
@needs_torch
def test_real_partner_that_never_starts_gives_error_within_the_timeout(tmp_path: Path) -> None:
    run = run_ranks(4, tmp_path, suspect=0, missing=[2], timeout_s=8)
    assert sorted(run.results) == [0, 1, 3], run.log
    for result in run.results.values():
        assert result["status"] == "error"
        assert "rendezvous at 127.0.0.1:" in result["summary"]
        assert result["wall_s"] <= 8 + 1.0


@real
@needs_torch
def test_real_crashing_compute_gives_error_on_every_rank(tmp_path: Path) -> None:
    run = run_ranks(2, tmp_path, suspect=0, slow=1, mode="crash", timeout_s=20)
    assert sorted(run.results) == [0, 1], run.log
    crashed = run.results[1]
    assert crashed["status"] == "error"
    assert "RuntimeError: the test's compute step crashed" in crashed["summary"]
    assert run.results[0]["status"] == "error"
    assert run.results[0]["wall_s"] < 20 + 1.0


def slowed_partner(world: int, suspect: int) -> int:
    """The first partner after the suspect (cyclically) that plays both rounds: with an odd
    world the highest rank that is not the suspect sits round 1 out, and a partner judged in one
    round only cannot fail (``test_a_partner_that_sat_a_round_out_cannot_fail``)."""
    sits_out = max(r for r in range(world) if r != suspect) if world % 2 else None
    return next(r for r in ((suspect + k) % world for k in range(1, world)) if r != sits_out)


QUICK = {"round_s": 0.5, "warmup": 2}
"""Product-valid options that keep 60 checks near a minute on 2 cores: a 0.5 s window per round
(the product's is 2 s) and 2 warm-up iterations (5); at least ``min_iterations`` (10) timed
iterations per round and the 2x threshold as in the product."""


@real
@needs_torch
def test_real_50_healthy_checks_pass_and_10_slowed_partners_are_named(tmp_path: Path) -> None:
    """Issue 24: "4-8 local processes. A partner slowed 3x is found in two rounds; a healthy set
    passes 50 runs out of 50." One launch runs the 60 checks in the same forked ranks (one torch
    import), each check with its own rendezvous port; worlds cycle through 4 to 8 and the
    suspect through the world's ranks."""
    healthy = [CheckSpec(4 + i % 5, suspect=(i * 3) % (4 + i % 5)) for i in range(50)]
    slowed = []
    for i in range(10):
        world = 4 + i % 5
        suspect = (i * 2) % world
        partner = slowed_partner(world, suspect)
        slowed.append(CheckSpec(world, suspect=suspect, slow=partner, factor=3, mode=SLOWED))
    checks = healthy + slowed
    runs = run_checks(checks, tmp_path, timeout_s=20, options=QUICK)
    lines = []
    false_fails = false_passes = unnamed = errors = 0
    healthy_ratios: list[float] = []  # the suspect's higher round ratio, healthy checks
    partner_ratios: list[float] = []  # the slowed partner's local compute ratio
    for index, (check, run) in enumerate(zip(checks, runs, strict=True)):
        result = run.results.get(check.suspect)
        if result is None or sorted(run.results) != list(range(check.world)):
            errors += 1
            lines.append(f"check {index} world {check.world}: ranks {sorted(run.results)}")
            continue
        status, summary = result["status"], result["summary"]
        m = result["measurements"]
        if status not in ("pass", "fail"):
            errors += 1
        elif check.slow is None and status == "fail":
            false_fails += 1
        elif check.slow is not None:
            if status == "fail":
                false_passes += 1  # the slowed partner failed the healthy suspect
            if not (
                summary.endswith(f"; partner n{check.slow} slow")
                and m["failed_ranks"] == str(check.slow)
                and m[f"rank{check.slow}.compute_ratio"] > 2
            ):
                unnamed += 1
        if status == "pass" and check.slow is None and m["failed_ranks"] != "":
            false_fails += 1  # a healthy partner named slow
        if status in ("pass", "fail") and check.slow is None:
            healthy_ratios.append(max(m["suspect.round1.ratio"], m["suspect.round2.ratio"]))
        elif status in ("pass", "fail"):
            partner_ratios.append(m[f"rank{check.slow}.compute_ratio"])
        assert status not in ("pass", "fail") or (
            m["threshold"] == 2.0 and m["round_s"] == 0.5 and m["world"] == check.world
        )
        lines.append(
            f"check {index} world {check.world} suspect {check.suspect} slow {check.slow}: "
            f"{status} ({run.wall_s:.1f} s): {summary[:160]}"
        )
    total_s = sum(run.wall_s for run in runs)
    report = (
        f"{len(healthy)} healthy: {false_fails} false fails; {len(slowed)} with a partner "
        f"slowed 3x: {false_passes} suspects failed, {unnamed} partners not named; {errors} "
        f"errors; {total_s:.0f} s; highest healthy suspect round ratio "
        f"{max(healthy_ratios, default=math.nan):.2f}, lowest slowed partner compute ratio "
        f"{min(partner_ratios, default=math.nan):.2f}"
    )
    print(report)
    assert (false_fails, false_passes, unnamed, errors) == (0, 0, 0, 0), "\n".join(
        [report, *lines, runs[-1].log]
    )
