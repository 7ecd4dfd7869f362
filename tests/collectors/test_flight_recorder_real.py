"""The flight-recorder reader on real dumps of hung gloo jobs (tests/hang_jobs.py): versions,
groups (named as the entries name them, whatever a rank's local ``pg_id``), ``pg_status``,
frontier entries, no frames, a small summary, and the restricted unpickler."""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hang_jobs import CASES, NCCL_VERSION, HangCase, HangDumps, load_dump

from collectors.flight_recorder import RestrictedUnpickler, read_dump_dir
from minder.core.hang import MAX_ENTRIES, EntryState, RankSummary

pytestmark = pytest.mark.slow

FORMATS = ("pickle", "json", "nccl_int", "nccl_str")


def dumps_of(case: HangCase, fmt: str) -> Path:
    if fmt == "pickle":
        return case.pickle_dir
    if fmt == "json":
        return case.json_dir
    return case.nccl_dir(fmt.removeprefix("nccl_"))


def read(case: HangCase, fmt: str) -> dict[int, tuple[RankSummary, dict[str, Any]]]:
    """Each rank's summary and its raw dump."""
    directory = dumps_of(case, fmt)
    return {
        s.rank: (s, load_dump(directory / f"{case.prefix}{s.rank}"))
        for s in read_dump_dir(directory, prefix=case.prefix)
    }


def raw_groups(dump: dict[str, Any]) -> dict[str, tuple[str, int, int]]:
    """Group name -> (desc, last enqueued, last completed), mapping ``pg_status``'s rank-local
    keys to names through the entries' ``pg_id``."""
    names = {
        str(e["pg_id"]): (e["process_group"][0], e["process_group"][1]) for e in dump["entries"]
    }
    return {
        names[key][0]: (
            names[key][1],
            int(s["last_enqueued_collective"]),
            int(s["last_completed_collective"]),
        )
        for key, s in dump["pg_status"].items()
    }


def keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from keys(v)


@pytest.mark.parametrize("name", list(CASES))
def test_the_restricted_unpickler_loads_every_real_dump_whole(
    real_hang_dumps: HangDumps, name: str
) -> None:
    case = real_hang_dumps[name]
    for directory in (case.pickle_dir, case.nccl_dir("int"), case.nccl_dir("str")):
        files = sorted(directory.iterdir())
        assert len(files) == len(case.dumping_ranks)
        for path in files:
            data = path.read_bytes()
            loaded = RestrictedUnpickler(io.BytesIO(data)).load()
            assert loaded == pickle.loads(data)
            assert loaded["entries"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(CASES))
def test_versions_groups_and_pg_status(real_hang_dumps: HangDumps, name: str, fmt: str) -> None:
    case = real_hang_dumps[name]
    roster = json.loads(case.roster_path.read_text())
    for rank, (summary, dump) in read(case, fmt).items():
        assert summary.version == (NCCL_VERSION if fmt.startswith("nccl") else dump["version"])
        assert summary.entries_total == len(dump["entries"])
        expected = raw_groups(dump)
        assert {g.group for g in summary.groups} == set(expected)
        assert {g.group for g in summary.groups} == {
            n for n, g in roster.items() if rank in g["ranks"]
        }
        for group in summary.groups:
            desc, enqueued, completed = expected[group.group]
            assert (group.desc, group.last_enqueued, group.last_completed) == (
                desc,
                enqueued,
                completed,
            )
            assert group.last_started is None  # -1: gloo does not time collectives
            true_ranks = roster[group.group]["ranks"]
            if fmt.startswith("nccl") or not case.groups:
                assert group.rank_list() == true_ranks
            else:  # gloo's pg_config lists no ranks once subgroups exist: none, never wrong ones
                assert group.rank_list() in ([], true_ranks)


def test_pg_status_is_mapped_through_each_ranks_local_pg_id(real_hang_dumps: HangDumps) -> None:
    """Rank 1 knows ``ep_odd`` (group ``2``) as its ``pg_id`` 1; rank 0 knows ``ep_even``
    (group ``1``) by the same local id."""
    runs = read(real_hang_dumps["two_groups"], "pickle")
    (_, dump1), (_, dump0) = runs[1], runs[0]
    assert set(dump1["pg_status"]) == set(dump0["pg_status"]) == {"0", "1"}

    odd = runs[1][0].group("2")
    even = runs[0][0].group("1")

    assert odd is not None and odd.desc == "ep_odd"
    assert even is not None and even.desc == "ep_even"
    assert runs[1][0].group("1") is None
    assert (odd.last_enqueued, odd.last_completed) == (even.last_enqueued, even.last_completed)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(CASES))
def test_frontier_ends_at_the_collective_each_rank_waits_in(
    real_hang_dumps: HangDumps, name: str, fmt: str
) -> None:
    case = real_hang_dumps[name]
    roster = json.loads(case.roster_path.read_text())
    hung = {n for n, g in roster.items() if g["desc"] == (case.hang_group or "default_pg")}
    if case.hang_group == "*":
        hung = {n for n, g in roster.items() if g["desc"] != "default_pg"}
    for rank, (summary, _) in read(case, fmt).items():
        for group in summary.groups:
            entries = group.entries
            assert 0 < len(entries) <= MAX_ENTRIES
            seqs = [e.seq for e in entries]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert all(e.state is EntryState.COMPLETED for e in entries[:-1])
            last = entries[-1]
            assert last.seq == group.last_enqueued
            role = case.role(rank) if group.group in hung else "idle"
            if role == "wait":
                assert last.state is not EntryState.COMPLETED
                assert group.last_completed == last.seq - 1
                assert last.collective == "all_reduce"
                assert last.input_sizes == last.output_sizes == ((8,),)
                assert last.input_dtypes == ("Float",)
            else:  # idle, skipped or completed alone: nothing outstanding
                assert last.state is EntryState.COMPLETED
                assert group.last_completed == last.seq
            if role == "size":
                assert (last.collective, last.input_sizes) == ("all_reduce", ((4,),))
        assert summary.entries_total > sum(len(g.entries) for g in summary.groups)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["skip", "two_groups"])
def test_summary_has_no_frames_and_stays_small(
    real_hang_dumps: HangDumps, name: str, fmt: str
) -> None:
    case = real_hang_dumps[name]
    for summary, dump in read(case, fmt).values():
        if fmt != "json":  # the JSON dump leaves the frames out itself
            assert all(e["frames"] for e in dump["entries"])
        data = summary.to_dict()
        text = json.dumps(data)
        assert "frames" not in set(keys(data))
        assert "distributed_c10d.py" not in text
        assert "rank_main" not in text
        packed = msgpack.packb(data)
        assert len(packed) <= 256 + len(summary.groups) * (128 + MAX_ENTRIES * 192)
        assert len(text) <= 2 * len(packed)


@pytest.mark.parametrize("name", list(CASES))
def test_pickle_and_json_dumps_summarise_alike(real_hang_dumps: HangDumps, name: str) -> None:
    case = real_hang_dumps[name]

    def plain(fmt: str) -> dict[int, RankSummary]:
        return {r: replace(s, source="", dumped_ts=0.0) for r, (s, _) in read(case, fmt).items()}

    assert plain("pickle") == plain("json")
    assert plain("nccl_int") == plain("nccl_str")
