"""Hang analysis on real hung torch.distributed jobs (tests/hang_jobs.py): Minder names exactly
the injected ranks, from the recorder's pickle and JSON dumps and from the same dumps in an
NCCL build's format, and every rank PyTorch's own analyzer names."""

from __future__ import annotations

from pathlib import Path

import pytest
from hang_jobs import CASES, HangCase, HangDumps, fr_trace

from collectors.flight_recorder import read_dump_dir
from detectors.hangs import analyze
from minder.core.hang import CulpritReason, HangAnalysis

pytestmark = pytest.mark.slow

FORMATS = ("pickle", "json", "nccl_int", "nccl_str")


def dumps_of(case: HangCase, fmt: str) -> Path:
    if fmt == "pickle":
        return case.pickle_dir
    if fmt == "json":
        return case.json_dir
    return case.nccl_dir(fmt.removeprefix("nccl_"))


def analysis_of(case: HangCase, fmt: str) -> HangAnalysis:
    summaries = read_dump_dir(dumps_of(case, fmt), prefix=case.prefix)
    assert [s.rank for s in summaries] == case.dumping_ranks
    return analyze(summaries)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(CASES))
def test_names_exactly_the_injected_ranks(real_hang_dumps: HangDumps, name: str, fmt: str) -> None:
    case = real_hang_dumps[name]
    analysis = analysis_of(case, fmt)

    assert analysis.hung
    assert analysis.culprit_ranks == case.culprit_ranks
    assert sorted((c.rank, c.reason) for c in analysis.culprits) == sorted(case.culprits.items())
    assert analysis.ranks_seen == len(case.dumping_ranks)
    assert analysis.ranks_expected == case.world


@pytest.mark.parametrize("fmt", FORMATS)
def test_skip_waits_in_the_world_collective_the_culprit_never_enqueued(
    real_hang_dumps: HangDumps, fmt: str
) -> None:
    analysis = analysis_of(real_hang_dumps["skip"], fmt)

    (group,) = analysis.groups
    assert (group.desc, group.size, group.waiting, group.missing) == ("default_pg", 4, 3, (1,))
    assert group.op.endswith("all_reduce")
    (culprit,) = analysis.culprits
    assert (culprit.group, culprit.seq) == (group.group, group.seq)
    assert not analysis.mismatches


@pytest.mark.parametrize("name", ["gil", "sigkill"])
def test_a_rank_without_a_dump_is_named_in_the_group_that_waits_for_it(
    real_hang_dumps: HangDumps, name: str
) -> None:
    case = real_hang_dumps[name]
    analysis = analysis_of(case, "pickle")

    (group,) = analysis.groups
    assert group.missing == tuple(case.culprit_ranks)
    assert group.waiting == case.world - 1
    (culprit,) = analysis.culprits
    assert culprit.reason is CulpritReason.NO_DUMP
    assert culprit.seq == group.seq


@pytest.mark.parametrize("fmt", FORMATS)
def test_size_mismatch_shows_the_sizes_and_the_lone_rank(
    real_hang_dumps: HangDumps, fmt: str
) -> None:
    analysis = analysis_of(real_hang_dumps["size"], fmt)

    by_field = {m.field: m for m in analysis.mismatches}
    assert set(by_field) == {"input_sizes", "output_sizes"}
    for m in by_field.values():
        assert dict(m.values) == {"[[8]]": (0, 1, 3), "[[4]]": (2,)}
    (group,) = analysis.groups
    assert group.stuck
    assert group.missing == ()
    assert by_field["input_sizes"].seq == group.seq


@pytest.mark.parametrize("fmt", FORMATS)
def test_two_expert_groups_each_name_their_own_culprit(
    real_hang_dumps: HangDumps, fmt: str
) -> None:
    analysis = analysis_of(real_hang_dumps["two_groups"], fmt)

    stuck = {g.desc: (g.size, g.waiting, g.missing) for g in analysis.groups if g.stuck}
    assert stuck == {"ep_even": (4, 3, (2,)), "ep_odd": (4, 3, (5,))}
    assert {c.rank: c.group_desc for c in analysis.culprits} == {2: "ep_even", 5: "ep_odd"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_stuck_subgroup_is_found_while_the_world_group_is_healthy(
    real_hang_dumps: HangDumps, fmt: str
) -> None:
    analysis = analysis_of(real_hang_dumps["subgroup"], fmt)

    stuck = [(g.desc, g.size, g.waiting, g.missing) for g in analysis.groups if g.stuck]
    assert stuck == [("tp_1", 3, 2, (4,))]
    (culprit,) = analysis.culprits
    assert culprit.group_desc == "tp_1"


@pytest.mark.parametrize("name", list(CASES))
def test_names_every_rank_pytorchs_analyzer_names(real_hang_dumps: HangDumps, name: str) -> None:
    """``fr_trace`` cannot read gloo's own dumps (their ``pg_config`` is keyed ``''``, the
    entries name group ``0``), so it and Minder both read the NCCL-format ones."""
    case = real_hang_dumps[name]
    directory = case.nccl_dir("int")
    verdict = fr_trace(directory, case.prefix)
    assert verdict.returncode == 0, verdict.output[-2000:]
    assert verdict.named, verdict.output[-2000:]

    analysis = analyze(read_dump_dir(directory, prefix=case.prefix))

    assert verdict.named <= set(analysis.culprit_ranks)
