"""Composition of the benchmark suites: fault types and shares, sizes, confounders (membership
ones included), seeds."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from collectors.sim import scenario_labels, simulate_table
from collectors.sim.kinds import MEMBERSHIP_CONFOUNDERS
from collectors.sim.plan import compile_scenario
from minder.benchmark.suite import (
    FAIL_SLOW,
    FAIL_STOP,
    MEMBERSHIP,
    MIN_GROUP,
    MIN_PER_TYPE,
    MIN_SLOW_STEPS,
    STRAGGLER_SUITE_METRICS,
    STRAGGLERS,
    SUITES,
    TABLE1_SHARES,
    WARM_UP_S,
    BenchCase,
    _Builder,
    build_suite,
    build_training_suite,
    instance_counts,
)

MOVES = {t.value for t in MEMBERSHIP_CONFOUNDERS}

TABLE1 = {t.value for t in TABLE1_SHARES}


@pytest.fixture(scope="module")
def suites() -> dict[str, list[BenchCase]]:
    return {name: build_suite(name, seed=0) for name in SUITES}


def faults(cases: list[BenchCase]) -> Counter[str]:
    return Counter(c.fault for c in cases if c.fault is not None)


def test_every_case_is_one_job_with_its_labelled_fault(suites: dict[str, list[BenchCase]]) -> None:
    for case in suites["standard"]:
        assert len(case.scenario.jobs) == 1
        assert case.scenario.jobs[0].machines == case.machines
        assert case.scenario.duration_s == case.duration_s
        truth = scenario_labels(case.scenario)
        if case.is_fault_free:
            assert case.fault is None and truth.empty and not case.scenario.faults
            continue
        assert set(truth["fault"]) == {case.fault}
        assert truth["fault_index"].nunique() == 1
        fault = case.scenario.faults[0]
        assert fault.start_s >= WARM_UP_S
        assert case.duration_s - fault.start_s >= 120  # time left to detect it
    names = [c.name for c in suites["full"]]
    assert len(set(names)) == len(names)


def test_quick_has_every_type_once_in_small_jobs(suites: dict[str, list[BenchCase]]) -> None:
    quick = suites["quick"]
    assert set(faults(quick)) == TABLE1 | {"switch_reboot"}
    assert sum(c.is_fault_free for c in quick) >= 2
    assert max(c.machines for c in quick) <= 32
    assert sum(c.machines * c.duration_s for c in quick) < 100_000  # machine-seconds


def test_standard_follows_table1_shares(suites: dict[str, list[BenchCase]]) -> None:
    counts = faults(suites["standard"])
    assert set(counts) == TABLE1 | {"switch_reboot"}
    assert min(counts[t] for t in TABLE1) >= MIN_PER_TYPE
    table1_total = sum(counts[t] for t in TABLE1)
    weight = sum(TABLE1_SHARES.values())
    for kind, share in TABLE1_SHARES.items():
        expected = share / weight
        got = counts[kind.value] / table1_total
        # Shares followed within a few points; the rarest types are lifted to the minimum.
        assert abs(got - expected) < 0.05 or counts[kind.value] == MIN_PER_TYPE, kind
    assert counts.most_common(1)[0][0] == "ecc_error"
    assert counts["cuda_execution_error"] > counts["gpu_execution_error"] > counts["aoc_error"]


def test_standard_sizes_layouts_and_confounders(suites: dict[str, list[BenchCase]]) -> None:
    standard = suites["standard"]
    sizes = {c.machines for c in standard}
    assert min(sizes) == 8 and max(sizes) == 512 and len(sizes) >= 6
    jobs = [c.scenario.jobs[0] for c in standard]
    assert any(j.pp_stages == 2 for j in jobs) and any(j.pp_stages == 4 for j in jobs)
    reboots = [c.scenario.faults[0] for c in standard if c.fault == "switch_reboot"]
    assert {f.silent for f in reboots} == {True, False}
    free = [c for c in standard if c.is_fault_free]
    kinds = {k.type.value for c in free for k in c.scenario.confounders}
    assert kinds == {"blip", "eval_phase", "agent_restart"} | MOVES
    for case in free:
        assert {"blip", "eval_phase", "agent_restart"} <= {
            k.type.value for k in case.scenario.confounders
        }
    assert all(c.scenario.jobs[0].checkpoint_every_s for c in free)
    assert all(
        c.scenario.jobs[0].missing_rate > 0 and c.scenario.jobs[0].late_rate > 0 for c in free
    )
    assert any(c.scenario.jobs[0].pp_stages > 1 for c in free)  # a heavier last stage
    slow = [c.scenario.faults[0].severity for c in standard if c.fault in FAIL_SLOW]
    assert min(slow) < 0.5 < max(slow)  # mild fail-slow faults too
    assert {c.fail_mode for c in standard} == {"fail-stop", "fail-slow", None}
    assert {c.fault for c in standard if c.fail_mode == "fail-stop"} <= FAIL_STOP


def test_full_adds_big_jobs_and_1000_fault_free_machine_hours(
    suites: dict[str, list[BenchCase]],
) -> None:
    full, standard = suites["full"], suites["standard"]
    sizes = {c.machines for c in full}
    assert min(sizes) == 8 and {1024, 2048} <= sizes and max(sizes) == 2048
    assert sum(c.machine_hours for c in full if c.is_fault_free) >= 1000
    assert sum(c.machine_hours for c in standard if c.is_fault_free) < 1000
    # full is standard plus more: the same first cases.
    assert [c.name for c in full[: len(standard)]] == [c.name for c in standard]
    assert full[0].scenario == standard[0].scenario
    big = [c for c in full if c.machines >= 1024 and not c.is_fault_free]
    assert len({c.fault for c in big}) >= 5


def membership(case: BenchCase) -> set[str]:
    """``late_join``, ``rolling_restart``, ``scale_down_silent`` / ``_goodbye``, ``job_end_…``."""
    out = set()
    for c in case.scenario.confounders:
        if c.type.value in ("scale_down", "job_end"):
            out.add(f"{c.type.value}_{'goodbye' if c.says_goodbye else 'silent'}")
        elif c.type.value in MOVES:
            out.add(c.type.value)
    return out


@pytest.mark.parametrize("name", SUITES)
def test_every_suite_has_each_membership_confounder_in_fault_free_cases(
    suites: dict[str, list[BenchCase]], name: str
) -> None:
    cases = suites[name]
    assert not any(membership(c) for c in cases if not c.is_fault_free)
    covered = set().union(*(membership(c) for c in cases if c.is_fault_free))
    wanted = {"late_join", "rolling_restart", "job_end_goodbye", "scale_down_goodbye"}
    wanted |= {"scale_down_silent"}
    if name != "quick":
        wanted |= {"job_end_silent"}
    assert wanted <= covered
    assert any(c.is_fault_free and not membership(c) for c in cases) or name == "quick"
    for case in cases:
        if not case.is_fault_free:
            continue
        assert "membership" not in case.detail
        assert all(kind.split("_")[0] in case.detail for kind in membership(case))


def test_membership_confounders_are_plausible(suites: dict[str, list[BenchCase]]) -> None:
    for case in suites["full"] + suites["quick"] + build_suite("quick", 3):
        job = case.scenario.jobs[0]
        duration = case.duration_s
        for c in case.scenario.confounders:
            if c.type.value not in MOVES:
                continue
            machines = c.machines if isinstance(c.machines, tuple) else ()
            assert all(isinstance(m, int) and 0 <= m < job.machines for m in machines)
            if c.type.value == "scale_down":
                # A batch within seconds, after the warm-up and with time left to see the rest.
                assert 1 <= (c.spread_s or 0) <= 5 and WARM_UP_S < c.start_s <= duration - 240
                groups = Counter(job.group_of(i) for i in range(job.machines))
                smallest = min(groups.values())
                groups.subtract(job.group_of(int(m)) for m in machines)
                if smallest > MIN_GROUP:
                    assert min(groups.values()) >= MIN_GROUP, case.name
                else:  # groups at the minimum already: one machine leaves
                    assert len(machines) == 1, case.name
            elif c.type.value == "rolling_restart":
                assert len(machines) >= 2 and 20 <= (c.duration_s or 0) <= 90
                assert 20 <= c.every_in_effect_s <= 60
            elif c.type.value == "job_end":
                assert 20 <= duration - c.start_s <= 60 and (c.spread_s or 0) <= 5
            else:
                assert 30 <= c.start_s < duration / 4 and machines
        names = [
            set(c.machines) for c in case.scenario.confounders if isinstance(c.machines, tuple)
        ]
        # Each membership confounder of a case moves other machines.
        assert sum(len(n) for n in names) == len(set().union(*names)), case.name
    # Every case still compiles (the simulator accepts what the suite draws).
    for case in suites["quick"]:
        if case.is_fault_free:
            compile_scenario(case.scenario)


def test_membership_draws_leave_every_other_draw_unchanged() -> None:
    """Their own random stream: the job, its seed and its other confounders do not move."""
    plain = _Builder(7, 2, prefix="x").fault_free(32, 1200, pp_stages=2)
    moved = _Builder(7, 2, prefix="x").fault_free(32, 1200, pp_stages=2, membership=MEMBERSHIP)
    assert plain.scenario.jobs == moved.scenario.jobs
    assert plain.scenario.seed == moved.scenario.seed
    others = tuple(c for c in moved.scenario.confounders if c.type.value not in MOVES)
    assert others == plain.scenario.confounders
    assert len(moved.scenario.confounders) == len(others) + len(MEMBERSHIP)
    with pytest.raises(ValueError, match=r"membership confounders \['leave_early'\]"):
        _Builder(7, 2, prefix="x").fault_free(8, 600, membership=("leave_early",))


def test_suites_are_deterministic_per_seed() -> None:
    first, again = build_suite("quick", 3), build_suite("quick", 3)
    assert [c.scenario for c in first] == [c.scenario for c in again]
    other = build_suite("quick", 4)
    assert [c.scenario.seed for c in other] != [c.scenario.seed for c in first]


def test_training_suite_covers_every_type_with_other_seeds() -> None:
    train = build_training_suite(0)
    assert set(faults(train)) >= TABLE1 | {"switch_reboot"}
    assert any(c.is_fault_free for c in train)
    assert max(c.machines for c in train) <= 32
    test_seeds = {c.scenario.seed for name in SUITES for c in build_suite(name, 0)[:20]}
    assert not test_seeds & {c.scenario.seed for c in train}
    assert len({c.scenario.jobs[0].name for c in train}) == len(train)


def test_instance_counts_split_by_share_with_a_minimum() -> None:
    counts = instance_counts(60)
    assert counts[next(iter(TABLE1_SHARES))] == 26  # ECC: 60 x 38.9 / 89.8
    assert min(counts.values()) == MIN_PER_TYPE
    assert sum(instance_counts(1000, minimum=0).values()) == 1000
    with pytest.raises(ValueError, match="positive"):
        instance_counts(0)


def test_unknown_suite_and_bad_seed_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown suite 'huge'.*quick, standard, full"):
        build_suite("huge")
    with pytest.raises(ValueError, match="seed"):
        build_suite("quick", -1)


# -- the stragglers suite ---------------------------------------------------------------------


def _slow_step(case: BenchCase) -> float:
    """The step time of the case's job while its straggler is slow (synchronous: the job's)."""
    job, fault = case.scenario.jobs[0], case.scenario.faults[0]
    return job.step_time_s * ((1 - job.comm_fraction) * fault.factor_in_effect + job.comm_fraction)


def test_stragglers_suite_composition(suites: dict[str, list[BenchCase]]) -> None:
    cases = suites["stragglers"]
    assert 30 <= len(cases) <= 40
    assert len({c.name for c in cases}) == len(cases)
    sizes = {c.machines for c in cases}
    assert min(sizes) == 16 and max(sizes) == 256 and len(sizes) >= 5
    counts = faults(cases)
    assert set(counts) == STRAGGLERS
    assert counts["slow_worker"] >= 8
    assert min(counts.values()) >= 3
    steps = [c.scenario.jobs[0].step_time_s for c in cases]
    assert 0.3 <= min(steps) < 0.5 and 30 < max(steps) <= 60
    jobs = [c.scenario.jobs[0] for c in cases]
    assert all(j.metrics == STRAGGLER_SUITE_METRICS for j in jobs)
    for fault_free in (True, False):
        modes = {c.scenario.jobs[0].sync for c in cases if c.is_fault_free is fault_free}
        assert modes == {True, False}, fault_free
    assert all(c.scenario.jobs[0].sync for c in cases if c.fault == "slow_stage")
    assert {c.fail_mode for c in cases} == {"fail-slow", None}
    assert STRAGGLERS <= FAIL_SLOW and not STRAGGLERS & FAIL_STOP


def test_straggler_cases_are_long_and_strong_enough(suites: dict[str, list[BenchCase]]) -> None:
    for case in suites["stragglers"]:
        if case.is_fault_free:
            continue
        job, (fault,) = case.scenario.jobs[0], case.scenario.faults
        assert fault.start_s >= max(WARM_UP_S, 10 * job.step_time_s), case.name
        labels = scenario_labels(case.scenario)
        assert set(labels["fault"]) == {case.fault} and labels["fault_index"].nunique() == 1
        assert (labels["slowdown"] > 1.0).all(), case.name
        left = case.duration_s - fault.start_s
        if case.fault == "transient_straggler":
            assert fault.factor_in_effect == 2.0
            assert fault.duration_s is not None
            assert 10 <= round(fault.duration_s / job.step_time_s) <= 40, case.name
            assert left - fault.duration_s >= 240  # time to see it end, and a detector recover
        elif case.fault == "flapping_worker":
            assert fault.period_s is not None
            assert left >= 6 * fault.period_s, case.name  # three slow turns
        else:
            assert fault.duration_s is None
            assert left / _slow_step(case) >= MIN_SLOW_STEPS, case.name
        if case.fault == "slow_worker":
            assert 1.05 <= fault.factor_in_effect <= 1.5
        if case.fault == "slow_group":
            assert isinstance(fault.machines, int) and fault.machines >= 2
            assert len(labels) == fault.machines
        if case.fault == "slow_stage":
            assert len(set(labels["group"])) == 1 and job.pp_stages >= 2
            assert len(labels) == case.machines // job.pp_stages
    factors = [c.scenario.faults[0].factor_in_effect for c in suites["stragglers"] if c.fault]
    assert min(factors) < 1.15, "mild stragglers too"
    ranked = [
        c for c in suites["stragglers"] if c.fault == "slow_worker" and c.scenario.faults[0].device
    ]
    assert len(ranked) >= 2, "slow workers of some of a machine's ranks"


def test_stragglers_fault_free_cases_slow_everyone_or_only_confound(
    suites: dict[str, list[BenchCase]],
) -> None:
    free = [c for c in suites["stragglers"] if c.is_fault_free]
    assert len(free) >= 6
    wide = [
        c for c in free if any(k.type.value == "job_wide_slowdown" for k in c.scenario.confounders)
    ]
    assert 3 <= len(wide) < len(free)
    for case in free:
        assert not case.scenario.faults and scenario_labels(case.scenario).empty
        kinds = {k.type.value for k in case.scenario.confounders}
        assert {"blip", "agent_restart", "eval_phase"} <= kinds, case.name
        assert case.scenario.jobs[0].checkpoint_every_s, case.name
    for case in wide:
        entry = next(k for k in case.scenario.confounders if k.type.value == "job_wide_slowdown")
        assert 1.1 <= entry.factor_in_effect <= 1.5 and "job_wide_slowdown" in case.detail


def test_a_straggler_case_shows_its_straggler(suites: dict[str, list[BenchCase]]) -> None:
    """Simulated, the smallest slow-worker case's labelled machine is the busiest after onset."""
    workers = [c for c in suites["stragglers"] if c.fault == "slow_worker"]
    case = min(workers, key=lambda c: c.machines * c.duration_s)
    table = simulate_table(case.scenario)
    (machine,) = set(scenario_labels(case.scenario)["machine"])
    onset = case.scenario.start_ts + case.scenario.faults[0].start_s
    busy = table[(table["metric"] == "train_busy_seconds") & (table["ts"] > onset + 60)]
    per_machine = busy.groupby("machine", observed=True)["value"].max()
    assert per_machine.idxmax() == machine


def test_stragglers_suite_is_deterministic_and_bad_kinds_are_refused() -> None:
    first, again = build_suite("stragglers", 5), build_suite("stragglers", 5)
    assert [c.scenario for c in first] == [c.scenario for c in again]
    other = build_suite("stragglers", 6)
    assert [c.scenario.seed for c in other] != [c.scenario.seed for c in first]
    coarse = build_suite("stragglers", 5, interval_s=60)
    assert all(c.duration_s - c.scenario.faults[0].start_s >= 12 * 60 for c in coarse if c.fault)
    with pytest.raises(ValueError, match=r"straggler kind 'gpu_xid': expected one of"):
        _Builder(0, 6, prefix="x").straggler("gpu_xid", 16, "fast", True)


_SUITE_DIGESTS = {
    "quick": "fde9332e832dc647",
    "standard": "c35cf97e6f432b3a",
    "full": "cfb5193b591a3ac9",
}
"""Digests of the other suites' cases (seed 0): as built before the stragglers suite was added
(commit 29ad509), except that membership confounders no longer land on a machine whose agent
crashes in the same case (standard and full each had one such case)."""


@pytest.mark.parametrize("name", sorted(_SUITE_DIGESTS))
def test_the_other_suites_are_unchanged(name: str) -> None:
    cases = build_suite(name, 0)
    text = repr(
        [(c.name, c.scenario.model_dump_json(exclude_defaults=True), c.detail) for c in cases]
    )
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == _SUITE_DIGESTS[name]
