"""The cross-rank hang analysis on hand-built rank summaries: one test per rule, then property
tests of its invariances (docs/hangs.md). Real hung gloo jobs are in test_hangs_real.py."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.hangs import analyze
from minder.core.hang import (
    MAX_REPORTED,
    CulpritReason,
    EntryState,
    FrEntry,
    GroupState,
    HangAnalysis,
    RankSummary,
    rank_runs,
)

NOT_JOINED, NO_DUMP, MISMATCH = (
    CulpritReason.NOT_JOINED,
    CulpritReason.NO_DUMP,
    CulpritReason.MISMATCH,
)


def group(
    name: str,
    ranks: Sequence[int] | None,
    enq: int | None,
    done: int | None,
    *,
    desc: str = "",
    op: str = "nccl:all_reduce",
    size: int = 8,
    dtype: str = "Float",
    at: Mapping[int, tuple[str, int, str]] | None = None,
) -> GroupState:
    """A group as one rank sees it: completed entries up to ``done``, then open ones up to
    ``enq``; ``at`` overrides (op, size, dtype) at given sequence ids."""
    entries: list[FrEntry] = []
    if enq is not None and done is not None:
        lo = max(1, done - 6)
        hi = min(enq, done + 1)
        for seq in range(lo, hi + 1):
            o, n, d = (at or {}).get(seq, (op, size, dtype))
            entries.append(
                FrEntry(
                    record_id=seq,
                    seq=seq,
                    op=o,
                    state=EntryState.COMPLETED if seq <= done else EntryState.SCHEDULED,
                    input_sizes=((n,),),
                    output_sizes=((n,),),
                    input_dtypes=(d,),
                    output_dtypes=(d,),
                )
            )
    return GroupState(
        group=name,
        desc=desc or ("default_pg" if name == "0" else name),
        ranks=rank_runs(list(ranks)) if ranks else (),
        last_enqueued=enq,
        last_completed=done,
        entries=tuple(entries),
    )


def summary(rank: int, *groups: GroupState, node: str = "", version: str = "2.9") -> RankSummary:
    return RankSummary(rank=rank, version=version, groups=groups, node=node or f"n{rank // 4}")


def world(n: int, stuck_at: int = 10, missing: Sequence[int] = ()) -> list[RankSummary]:
    """``n`` ranks in one group; ``missing`` ranks stopped at ``stuck_at - 1``."""
    ranks = list(range(n))
    return [
        summary(
            r,
            group("0", ranks, stuck_at - 1, stuck_at - 1)
            if r in missing
            else group("0", ranks, stuck_at, stuck_at - 1),
        )
        for r in ranks
    ]


def culprits(a: HangAnalysis) -> dict[int, CulpritReason]:
    return {c.rank: c.reason for c in a.culprits}


# -- one rule at a time ---------------------------------------------------------------------


def test_a_rank_that_never_enqueued_the_collective_is_named() -> None:
    a = analyze(world(8, missing=[5]))
    assert a.hung and culprits(a) == {5: NOT_JOINED}
    c = a.culprits[0]
    assert (c.group, c.group_desc, c.seq, c.op, c.machine) == (
        "0",
        "default_pg",
        10,
        "nccl:all_reduce",
        "n1",
    )
    assert "never enqueued nccl:all_reduce #10 of group 0" in c.detail
    (v,) = a.groups
    assert (v.stuck, v.seq, v.size, v.waiting, v.missing) == (True, 10, 8, 7, (5,))
    assert (a.ranks_seen, a.ranks_expected) == (8, 8)


def test_a_member_without_a_dump_is_named() -> None:
    summaries = [s for s in world(8) if s.rank != 6]
    a = analyze(summaries, {6: "node-b", 0: "node-a"})
    assert culprits(a) == {6: NO_DUMP}
    assert a.culprits[0].machine == "node-b"
    assert a.culprit_machines == ["node-b"]
    assert (a.ranks_seen, a.ranks_expected) == (7, 8)


def test_machines_default_to_the_summaries_nodes() -> None:
    a = analyze(world(8, missing=[2]))
    assert a.culprits[0].machine == "n0"


def test_a_rank_entering_with_another_size_is_named_with_the_mismatch() -> None:
    ranks = list(range(4))
    summaries = [summary(r, group("0", ranks, 10, 9)) for r in (0, 1, 3)]
    # Rank 2 entered #10 with 4 elements (and its backend completed it).
    summaries.append(
        summary(2, group("0", ranks, 10, 10, at={10: ("nccl:all_reduce", 4, "Float")}))
    )
    a = analyze(summaries)
    assert culprits(a) == {2: MISMATCH}
    fields = {m.field: m for m in a.mismatches}
    assert set(fields) == {"input_sizes", "output_sizes"}
    assert list(fields["input_sizes"].values.items()) == [("[[8]]", (0, 1, 3)), ("[[4]]", (2,))]
    assert "input_sizes [[4]] where 3 ranks have [[8]]" in a.culprits[0].detail


def test_a_rank_entering_another_op_or_dtype_is_a_mismatch() -> None:
    ranks = list(range(4))
    summaries = [summary(r, group("0", ranks, 10, 9)) for r in (0, 1)]
    summaries.append(summary(2, group("0", ranks, 10, 9, at={10: ("nccl:broadcast", 8, "Float")})))
    summaries.append(summary(3, group("0", ranks, 10, 9, at={10: ("nccl:all_reduce", 8, "Half")})))
    a = analyze(summaries)
    assert culprits(a) == {2: MISMATCH, 3: MISMATCH}
    assert {m.field for m in a.mismatches} == {"op", "input_dtypes", "output_dtypes"}


def test_backend_prefixes_are_not_a_mismatch() -> None:
    ranks = list(range(4))
    summaries = [summary(r, group("0", ranks, 10, 9, op="nccl:all_reduce")) for r in (0, 1)]
    summaries += [summary(r, group("0", ranks, 10, 9, op="gloo:all_reduce")) for r in (2, 3)]
    a = analyze(summaries)
    assert not a.mismatches and not a.hung


def test_all_to_all_sizes_may_differ() -> None:
    ranks = list(range(2))
    a = analyze(
        [
            summary(0, group("0", ranks, 10, 9, op="nccl:all_to_all", size=8)),
            summary(1, group("0", ranks, 10, 9, op="nccl:all_to_all", size=6)),
        ]
    )
    assert not a.mismatches


def test_two_culprits_in_two_expert_groups_are_both_named() -> None:
    even, odd = [0, 2, 4, 6], [1, 3, 5, 7]
    summaries = []
    for r in range(8):
        ep = "1" if r % 2 == 0 else "2"
        members = even if r % 2 == 0 else odd
        stopped = r in (2, 5)
        summaries.append(
            summary(
                r,
                group("0", range(8), 20, 20),
                group(ep, members, 7 if stopped else 8, 7, desc=f"ep_{ep}"),
            )
        )
    a = analyze(summaries)
    assert culprits(a) == {2: NOT_JOINED, 5: NOT_JOINED}
    assert {c.group for c in a.culprits} == {"1", "2"}
    assert [v.group for v in a.groups] == ["1", "2"]


def test_a_subgroup_hangs_while_the_world_group_is_healthy() -> None:
    summaries = [
        summary(r, group("0", range(6), 30, 30), group("tp0", [0, 1, 2], 5, 5)) for r in (0, 1, 2)
    ]
    summaries += [
        summary(r, group("0", range(6), 30, 30), group("tp1", [3, 4, 5], 5 if r == 4 else 6, 5))
        for r in (3, 4, 5)
    ]
    a = analyze(summaries)
    assert culprits(a) == {4: NOT_JOINED}
    assert [(v.group, v.stuck) for v in a.groups] == [("tp1", True)]


def test_a_rank_blocked_in_another_group_is_not_blamed() -> None:
    # Pipeline: group A = {0, 1}, group B = {1, 2}. Rank 2 stopped before B's #5; rank 1 waits
    # in B's #5 and so never enqueued A's #9, where rank 0 waits. Rank 2 is the culprit; rank
    # 1 only a victim.
    a = analyze(
        [
            summary(0, group("A", [0, 1], 9, 8)),
            summary(1, group("A", [0, 1], 8, 8), group("B", [1, 2], 5, 4)),
            summary(2, group("B", [1, 2], 4, 4)),
        ]
    )
    assert culprits(a) == {2: NOT_JOINED}
    assert {v.group: v.missing for v in a.groups} == {"A": (1,), "B": (2,)}


def test_ranks_waiting_behind_a_mismatch_are_not_blamed_elsewhere() -> None:
    # tp {0, 1, 2}: rank 1 entered #5 with another size; ranks 0 and 2 wait there and so never
    # enqueued the world's #9, where rank 3 waits. Only rank 1 is named.
    ranks = list(range(4))
    a = analyze(
        [
            summary(0, group("0", ranks, 8, 8), group("tp", [0, 1, 2], 5, 4)),
            summary(
                1,
                group("0", ranks, 8, 8),
                group("tp", [0, 1, 2], 5, 4, at={5: ("nccl:all_reduce", 2, "Float")}),
            ),
            summary(2, group("0", ranks, 8, 8), group("tp", [0, 1, 2], 5, 4)),
            summary(3, group("0", ranks, 9, 8)),
        ]
    )
    assert culprits(a) == {1: MISMATCH}


def test_an_even_split_names_both_sides() -> None:
    a = analyze(
        [
            summary(0, group("tp", [0, 1], 5, 4)),
            summary(1, group("tp", [0, 1], 5, 4, at={5: ("nccl:all_reduce", 2, "Float")})),
        ]
    )
    assert culprits(a) == {0: MISMATCH, 1: MISMATCH}
    assert "split evenly" in a.culprits[0].detail


def test_a_chain_of_blocked_groups_ends_at_the_dead_rank() -> None:
    # A={0,1} waits on 1, which waits in B={1,2} on 2, which waits in C={2,3} on 3 (no dump).
    a = analyze(
        [
            summary(0, group("A", [0, 1], 9, 8)),
            summary(1, group("A", [0, 1], 8, 8), group("B", [1, 2], 5, 4)),
            summary(2, group("B", [1, 2], 4, 4), group("C", [2, 3], 3, 2)),
        ]
    )
    assert culprits(a) == {3: NO_DUMP}


def test_ranks_waiting_on_each_other_are_all_named() -> None:
    # Rank 0 waits in A's #5 for rank 1; rank 1 waits in B's #7 for rank 0 (ops issued in
    # different orders): no rank waits on nobody, so both are named and a note says why.
    a = analyze(
        [
            summary(0, group("A", [0, 1], 5, 4), group("B", [0, 1], 6, 6)),
            summary(1, group("A", [0, 1], 4, 4), group("B", [0, 1], 7, 6)),
        ]
    )
    assert culprits(a) == {0: NOT_JOINED, 1: NOT_JOINED}
    assert any("wait on each other" in n for n in a.notes)


def test_a_cycle_is_named_alongside_a_culprit_elsewhere() -> None:
    summaries = [
        summary(0, group("A", [0, 1], 5, 4), group("B", [0, 1], 6, 6)),
        summary(1, group("A", [0, 1], 4, 4), group("B", [0, 1], 7, 6)),
        summary(2, group("C", [2, 3], 3, 2)),
        summary(3, group("C", [2, 3], 2, 2)),
    ]
    assert culprits(analyze(summaries)) == {0: NOT_JOINED, 1: NOT_JOINED, 3: NOT_JOINED}


def test_a_healthy_job_is_not_hung_and_lists_its_groups() -> None:
    summaries = [
        summary(r, group("0", range(4), 12, 12), group("tp", [0, 1, 2, 3], 3, 3)) for r in range(4)
    ]
    a = analyze(summaries, now=123.0)
    assert not a.hung and not a.culprits
    assert {(v.group, v.stuck) for v in a.groups} == {("0", False), ("tp", False)}
    assert a.analysed_ts == 123.0


def test_everyone_in_flight_is_stuck_but_names_nobody() -> None:
    a = analyze([summary(r, group("0", range(4), 12, 11)) for r in range(4)])
    assert not a.hung
    assert [(v.stuck, v.waiting, v.missing) for v in a.groups] == [(True, 4, ())]


def test_a_rank_missing_from_a_group_it_reports_nothing_of() -> None:
    # Rank 3 is listed as a member by the others but its dump holds nothing of the group.
    summaries = [summary(r, group("g", [0, 1, 2, 3], 4, 3)) for r in range(3)]
    summaries.append(summary(3, group("0", range(4), 2, 2)))
    assert culprits(analyze(summaries)) == {3: NOT_JOINED}


def test_group_without_rank_list_uses_reporting_ranks_and_world_for_default() -> None:
    # Gloo with subgroups: no rank lists at all. Rank 3 wrote no dump; the default group is
    # taken as 0..max rank seen, so rank 3 is known to be missing there.
    summaries = [summary(r, group("0", None, 7, 6)) for r in (0, 1, 2, 4)]
    a = analyze(summaries)
    assert culprits(a) == {3: NO_DUMP}
    assert any("group 0 (default_pg) has no rank list: taken as ranks 0..4" in n for n in a.notes)


def test_unknown_membership_names_ranks_without_a_dump() -> None:
    summaries = [summary(r, group("0", None, 7, 7), group("ep", None, 4, 3)) for r in (0, 2, 3)]
    summaries.append(summary(1, group("0", None, 7, 7)))
    summaries.append(summary(5, group("0", None, 7, 7)))
    a = analyze(summaries)
    assert culprits(a) == {4: NO_DUMP}
    assert any("ranks without a dump are named" in n for n in a.notes)


def test_mixed_versions_and_repeated_ranks_are_noted() -> None:
    summaries = world(4, missing=[1])
    summaries[0] = replace(summaries[0], version="2.10")
    summaries.append(replace(summaries[2], dumped_ts=-1.0))
    a = analyze(summaries)
    assert a.versions == ("2.10", "2.9")
    assert any("mixed format versions" in n for n in a.notes)
    assert any("repeat a rank" in n for n in a.notes)
    assert culprits(a) == {1: NOT_JOINED}


def test_a_later_dump_of_a_rank_replaces_an_earlier_one() -> None:
    ranks = list(range(2))
    early = summary(1, group("0", ranks, 9, 9))
    late = replace(summary(1, group("0", ranks, 10, 9)), dumped_ts=50.0)
    base = summary(0, group("0", ranks, 10, 9))
    assert analyze([base, early]).hung
    assert not analyze([base, late, early]).hung


def test_reports_are_bounded() -> None:
    n = 2 * MAX_REPORTED + 10
    a = analyze(world(n, missing=range(0, n, 2)))
    assert len(a.culprits) == MAX_REPORTED
    assert a.culprits_dropped == n // 2 - MAX_REPORTED
    assert HangAnalysis.from_dict(a.to_dict()) == a


def test_group_verdicts_are_bounded() -> None:
    groups = MAX_REPORTED + 5
    summaries = []
    for r in range(2 * groups):
        g = f"g{r // 2}"
        stopped = r % 2 == 1
        summaries.append(summary(r, group(g, [r - r % 2, r - r % 2 + 1], 3 if stopped else 4, 3)))
    a = analyze(summaries)
    assert len(a.groups) == MAX_REPORTED and a.groups_dropped == 5
    assert a.culprits_dropped == groups - MAX_REPORTED


def test_ring_wrapped_without_status_uses_the_entries() -> None:
    # Older dumps without pg_status: progress comes from the frontier entries alone.
    def bare(rank: int, enq: int, done: int) -> RankSummary:
        g = group("0", range(3), enq, done)
        return summary(rank, replace(g, last_enqueued=None, last_completed=None))

    a = analyze([bare(0, 100_010, 100_009), bare(1, 100_010, 100_009), bare(2, 100_009, 100_009)])
    assert culprits(a) == {2: NOT_JOINED}
    assert a.culprits[0].seq == 100_010


# -- invariances ----------------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[RankSummary], dict[int, CulpritReason]]:
    """A job of ``tp`` groups of ``size`` ranks plus the world group; some tp groups hang on
    one rank each (not joined, no dump, or mismatched size)."""
    size = draw(st.integers(2, 4))
    n_groups = draw(st.integers(1, 5))
    n = size * n_groups
    base = draw(st.integers(0, 10_000))
    hung = draw(st.lists(st.integers(0, n_groups - 1), unique=True, max_size=n_groups))
    expected: dict[int, CulpritReason] = {}
    faults: dict[int, CulpritReason] = {}
    for gi in hung:
        rank = gi * size + draw(st.integers(0, size - 1))
        # (a mismatch in a group of two is an even split: both would be named)
        reason = draw(st.sampled_from([NOT_JOINED, NO_DUMP, MISMATCH][: 2 if size < 3 else 3]))
        faults[rank] = expected[rank] = reason
    summaries = []
    for r in range(n):
        if faults.get(r) is NO_DUMP:
            continue
        gi = r // size
        members = list(range(gi * size, (gi + 1) * size))
        tp_done = base + 20
        if gi in hung:
            if faults.get(r) is NOT_JOINED:
                tp = group(f"{gi + 1}", members, tp_done, tp_done, desc=f"tp{gi}")
            elif faults.get(r) is MISMATCH:
                tp = group(
                    f"{gi + 1}",
                    members,
                    tp_done + 1,
                    tp_done + 1,
                    desc=f"tp{gi}",
                    at={tp_done + 1: ("nccl:all_reduce", 4, "Float")},
                )
            else:
                tp = group(f"{gi + 1}", members, tp_done + 1, tp_done, desc=f"tp{gi}")
        else:
            tp = group(f"{gi + 1}", members, tp_done + 1, tp_done + 1, desc=f"tp{gi}")
        summaries.append(summary(r, group("0", range(n), base + 5, base + 5), tp))
    return summaries, expected


def _rename(summaries: list[RankSummary], mapping: Mapping[str, str]) -> list[RankSummary]:
    return [
        replace(s, groups=tuple(replace(g, group=mapping.get(g.group, g.group)) for g in s.groups))
        for s in summaries
    ]


@settings(max_examples=60, deadline=None)
@given(jobs(), st.randoms(use_true_random=False))
def test_culprits_are_the_injected_ones_in_any_order(
    job: tuple[list[RankSummary], dict[int, CulpritReason]], rnd: random.Random
) -> None:
    summaries, expected = job
    assert culprits(analyze(summaries)) == expected
    shuffled = list(summaries)
    rnd.shuffle(shuffled)
    assert analyze(shuffled).culprits == analyze(summaries).culprits


@settings(max_examples=40, deadline=None)
@given(jobs(), st.integers(-50, 10**9))
def test_shifting_sequence_ids_changes_nothing_but_the_ids(
    job: tuple[list[RankSummary], dict[int, CulpritReason]], shift: int
) -> None:
    summaries, expected = job

    def move(g: GroupState) -> GroupState:
        return replace(
            g,
            last_enqueued=None if g.last_enqueued is None else g.last_enqueued + shift + 100,
            last_completed=None if g.last_completed is None else g.last_completed + shift + 100,
            entries=tuple(replace(e, seq=e.seq + shift + 100) for e in g.entries),
        )

    moved = [replace(s, groups=tuple(move(g) for g in s.groups)) for s in summaries]
    a, b = analyze(summaries), analyze(moved)
    assert culprits(b) == culprits(a) == expected
    assert [c.seq for c in b.culprits] == [
        None if c.seq is None else c.seq + shift + 100 for c in a.culprits
    ]


@settings(max_examples=40, deadline=None)
@given(jobs(), st.integers(1, 4))
def test_adding_healthy_groups_changes_nothing(
    job: tuple[list[RankSummary], dict[int, CulpritReason]], extra: int
) -> None:
    summaries, expected = job
    ranks = sorted(s.rank for s in summaries)
    more = [
        replace(
            s,
            groups=s.groups
            + tuple(group(f"dp{i}", ranks, 40 + i, 40 + i, desc=f"dp{i}") for i in range(extra)),
        )
        for s in summaries
    ]
    assert analyze(more).culprits == analyze(summaries).culprits
    assert culprits(analyze(more)) == expected


@settings(max_examples=40, deadline=None)
@given(jobs(), st.sampled_from(["gloo:", "nccl:", "ucc:", ""]))
def test_renumbering_groups_and_backend_prefixes_change_nothing(
    job: tuple[list[RankSummary], dict[int, CulpritReason]], prefix: str
) -> None:
    summaries, expected = job
    names = sorted({g.group for s in summaries for g in s.groups} - {"0"})
    renamed = _rename(summaries, {name: f"{100 + 7 * i}" for i, name in enumerate(names)})
    reprefixed = [
        replace(
            s,
            groups=tuple(
                replace(
                    g,
                    entries=tuple(replace(e, op=prefix + e.collective) for e in g.entries),
                )
                for g in s.groups
            ),
        )
        for s in renamed
    ]
    assert culprits(analyze(reprefixed)) == expected


def test_analysis_of_4096_ranks_is_fast() -> None:
    n = 4096
    tp = 8
    summaries = []
    for r in range(n):
        members = list(range(r - r % tp, r - r % tp + tp))
        world_group = group("0", range(n), 49 if r == 1234 else 50, 49)
        summaries.append(summary(r, world_group, group(f"tp{r // tp}", members, 9, 9)))
    started = time.perf_counter()
    a = analyze(summaries)
    elapsed = time.perf_counter() - started
    assert culprits(a) == {1234: NOT_JOINED}
    assert elapsed < 2.0, f"analysis of {n} ranks took {elapsed:.2f} s"


def _in_recv(state: GroupState, seq: int) -> GroupState:
    """``state`` with an open receive (a pipeline stage waiting on its peer)."""
    recv = FrEntry(record_id=900, seq=seq, op="nccl:recv 0<-1", state=EntryState.SCHEDULED,
                   p2p=True)  # fmt: skip
    return replace(state, entries=(*state.entries, recv))


def test_a_rank_waiting_in_a_receive_is_not_named_while_the_rank_it_waits_for_explains_it() -> None:
    # Two pipeline replicas (0 -> 1, 2 -> 3) and a data-parallel all-reduce over all four:
    # rank 0 stopped (no dump), rank 1 waits in its receive from 0, ranks 2 and 3 wait in the
    # world all-reduce #10 that 1 never reached. Rank 1 is a victim.
    ranks = [0, 1, 2, 3]
    summaries = [
        summary(1, _in_recv(group("0", ranks, 9, 9), 5)),
        summary(2, group("0", ranks, 10, 9)),
        summary(3, group("0", ranks, 10, 9)),
    ]
    found = analyze(summaries)
    assert found.hung
    assert {c.rank: c.reason for c in found.culprits} == {0: NO_DUMP}
    assert any("send or receive" in note for note in found.notes)


def test_ranks_in_receives_are_named_when_nothing_else_explains_the_hang() -> None:
    ranks = [0, 1, 2, 3]
    summaries = [summary(r, group("0", ranks, 10, 9)) for r in (0, 2, 3)]
    summaries.append(summary(1, _in_recv(group("0", ranks, 9, 9), 5)))
    found = analyze(summaries)
    assert {c.rank: c.reason for c in found.culprits} == {1: NOT_JOINED}


def test_a_group_named_with_a_non_ascii_digit_is_analysed() -> None:
    ranks = [0, 1, 2, 3]
    summaries = [
        summary(r, group("0", ranks, 9, 9), group("²", ranks, 5 if r != 2 else 4, 4)) for r in ranks
    ]
    found = analyze(summaries)
    assert found.hung and found.culprit_ranks == [2]
