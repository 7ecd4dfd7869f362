"""The hang records: rank runs, round trips through plain data, and one-line refusals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minder.core.errors import ValidationError
from minder.core.hang import (
    MAX_ENTRIES,
    Culprit,
    CulpritReason,
    EntryState,
    FrEntry,
    GroupState,
    GroupVerdict,
    HangAnalysis,
    Mismatch,
    RankSummary,
    expand_runs,
    rank_runs,
)


@given(st.lists(st.integers(0, 5000), max_size=200))
def test_rank_runs_give_back_the_ranks_in_their_order(ranks: list[int]) -> None:
    assert list(expand_runs(rank_runs(ranks))) == ranks


def test_contiguous_and_strided_groups_are_one_run_each() -> None:
    assert rank_runs(list(range(4096))) == ((0, 4096, 1),)
    assert rank_runs(list(range(3, 4096, 8))) == ((3, 4092, 8),)
    assert rank_runs([5]) == ((5, 6, 1),)
    assert rank_runs([]) == ()


def _summary() -> RankSummary:
    entry = FrEntry(
        record_id=7,
        seq=12,
        op="nccl:all_reduce",
        state=EntryState.SCHEDULED,
        input_sizes=((8, 1024),),
        output_sizes=((8, 1024),),
        input_dtypes=("Float",),
        output_dtypes=("Float",),
        created_ns=1_795_910_082_186_015_972,
        timeout_ms=600_000,
    )
    group = GroupState(
        group="3",
        desc="ep_group_1",
        ranks=rank_runs([1, 3, 5, 7]),
        last_enqueued=12,
        last_started=11,
        last_completed=11,
        entries=(entry,),
    )
    return RankSummary(
        rank=3, version="2.10", groups=(group,), node="n07", dumped_ts=1.7e9, source="r3"
    )


def test_summary_round_trips_through_json() -> None:
    summary = _summary()
    back = RankSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert back == summary
    assert back.groups[0].rank_list() == [1, 3, 5, 7]
    assert back.groups[0].entries[0].collective == "all_reduce"
    assert back.group("3") is back.groups[0] and back.group("0") is None


def test_analysis_round_trips_through_json() -> None:
    analysis = HangAnalysis(
        hung=True,
        culprits=(
            Culprit(5, CulpritReason.NOT_JOINED, "n02", "3", "ep_group_1", "gloo:all_reduce", 12),
            Culprit(2, CulpritReason.NO_DUMP, "n01", "0", "default_pg"),
        ),
        mismatches=(Mismatch("0", 4, "input_sizes", {"[[8]]": (0, 1, 3), "[[9]]": (2,)}),),
        groups=(GroupVerdict("3", "ep_group_1", 4, True, 12, "gloo:all_reduce", 3, (5,)),),
        ranks_seen=7,
        ranks_expected=8,
        versions=("2.10",),
        notes=("rank 2 wrote no dump",),
    )
    data = json.loads(json.dumps(analysis.to_dict()))
    assert data["culprit_ranks"] == [2, 5] and data["culprit_machines"] == ["n01", "n02"]
    assert HangAnalysis.from_dict(data) == analysis


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(v=9), "summary.v is 9: expected summary version 1"),
        (lambda d: d.update(rank=-1), "summary.rank is -1: expected an integer in 0.."),
        (lambda d: d.update(rank=True), "summary.rank is True: expected an integer"),
        (lambda d: d.update(groups="x"), "summary.groups is str: expected a list"),
        (
            lambda d: d["groups"][0].update(ranks=[[0, 4, 0]]),
            "summary.groups[0].ranks[0] is [0, 4, 0]: expected a run of ranks >= 0",
        ),
        (
            lambda d: d["groups"][0]["entries"][0].update(state="lost"),
            "summary.groups[0].entries[0].state is 'lost': expected one of scheduled, started",
        ),
        (
            lambda d: d["groups"][0].update(entries=[d["groups"][0]["entries"][0]] * 9),
            f"summary.groups[0].entries has 9 items: expected at most {MAX_ENTRIES}",
        ),
        (
            lambda d: d["groups"][0]["entries"][0].update(input_sizes=[[-1]]),
            "summary.groups[0].entries[0].input_sizes[0] is -1: expected an integer in 0..",
        ),
        (lambda d: d.update(dumped_ts=float("nan")), "summary.dumped_ts is nan: expected"),
    ],
)
def test_malformed_summaries_are_refused_in_one_line(mutate: object, message: str) -> None:
    data = _summary().to_dict()
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ValidationError) as caught:
        RankSummary.from_dict(data)
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text


def test_long_strings_are_cut_not_refused() -> None:
    data = _summary().to_dict()
    data["groups"][0]["desc"] = "d" * 10_000
    assert len(RankSummary.from_dict(data).groups[0].desc) == 128


def test_a_group_of_billions_of_ranks_is_refused_without_expanding_it() -> None:
    data = _summary().to_dict()
    data["groups"][0]["ranks"] = [[0, 2**31 - 1, 1]]
    with pytest.raises(ValidationError, match="lists more than 1048576 ranks"):
        RankSummary.from_dict(data)
    data["groups"][0]["ranks"] = [[5, -3, -1]]
    with pytest.raises(ValidationError, match=r"ranks\[0\] is -3: expected an integer"):
        RankSummary.from_dict(data)
