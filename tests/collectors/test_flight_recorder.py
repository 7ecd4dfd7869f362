"""Reading flight-recorder dumps: the restricted unpickler, pickle and JSON, the summary, and
directories of one job's dumps.

Real dumps: ``fixtures/flight_recorder`` (a 2-rank gloo job of torch 2.13 CPU, pickle and JSON,
written by ``fr_dumps.py``). Hand-built dumps follow the same format for the cases a small gloo
job does not produce (NCCL's string statuses, a wrapped ring, p2p entries, older versions).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collectors.flight_recorder as fr
from collectors.flight_recorder import (
    DumpError,
    dump_prefix_from_env,
    infer_prefix,
    load_dump,
    read_dump_dir,
    read_summary,
    summarize,
)
from minder.core.hang import (
    MAX_DIMS,
    MAX_ENTRIES,
    MAX_GROUPS,
    MAX_RANK_RUNS,
    MAX_SEQ,
    MAX_TEXT,
    EntryState,
    FrEntry,
    GroupState,
    RankSummary,
    group_order,
    rank_runs,
)

FIXTURES = Path(__file__).parent / "fixtures" / "flight_recorder"
ROOT = Path(__file__).resolve().parents[2]
PREFIX = "nccl_trace_rank_"


def entry(
    seq: int,
    *,
    pg: tuple[str, str] = ("0", "default_pg"),
    pg_id: int = 0,
    op: str = "nccl:all_reduce",
    state: str = "scheduled",
    retired: bool | None = None,
    p2p: bool = False,
    record_id: int | None = None,
    sizes: list[list[int]] | None = None,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "record_id": seq if record_id is None else record_id,
        "pg_id": pg_id,
        "process_group": pg,
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "op_id": seq,
        "profiling_name": op,
        "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "input_sizes": sizes if sizes is not None else [[8]],
        "input_dtypes": ["Float"],
        "output_sizes": sizes if sizes is not None else [[8]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "timeout_ms": 600000,
        "is_p2p": p2p,
        "thread_id": "1",
        "thread_name": "python",
        "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 3245}],
    }
    if retired is not None:
        e["retired"] = retired
    return e


def dump(
    entries: list[dict[str, Any]],
    status: dict[str, dict[str, Any]] | None = None,
    config: dict[str, dict[str, str]] | None = None,
    version: str = "2.9",
) -> dict[str, Any]:
    return {
        "version": version,
        "pg_config": config
        if config is not None
        else {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "comm_lib_version": "2.21.5",
        "pg_status": status if status is not None else {},
        "entries": entries,
    }


def status(enq: Any, started: Any, done: Any) -> dict[str, Any]:
    return {
        "last_enqueued_collective": enq,
        "last_started_collective": started,
        "last_completed_collective": done,
    }


# -- the restricted unpickler ---------------------------------------------------------------


class _RunsSystem:
    """Unpickling this calls os.system (what a malicious dump would do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (self.command,))


def test_a_pickle_naming_a_callable_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = {"version": "2.10", "entries": [_RunsSystem(f"touch {marker}")]}
    path = tmp_path / f"{PREFIX}0"
    path.write_bytes(pickle.dumps(payload))
    with pytest.raises(DumpError, match=r"refused global (posix|os)\.system") as info:
        load_dump(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists()


def test_every_global_is_refused_even_harmless_ones(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "when": complex(1, 2)}))
    with pytest.raises(DumpError, match=r"refused global builtins\.complex"):
        load_dump(path)


def test_real_dumps_name_no_global_and_load() -> None:
    loaded = load_dump(FIXTURES / "v1" / f"{PREFIX}0")
    assert loaded["version"].startswith("2.")
    assert loaded["entries"] and "frames" in loaded["entries"][0]


# -- pickle and JSON, told apart by content ------------------------------------------------


def test_pickle_and_json_dumps_summarise_the_same(tmp_path: Path) -> None:
    for rank in (0, 1):
        # The JSON dump under a name without suffix: the content decides, not the name.
        src = FIXTURES / "v1" / f"{PREFIX}{rank}.json"
        shutil.copy(src, tmp_path / f"x{rank}")
        a = read_summary(FIXTURES / "v1" / f"{PREFIX}{rank}", prefix=PREFIX)
        b = read_summary(tmp_path / f"x{rank}", prefix="x")
        assert a.rank == b.rank == rank
        assert a.groups == b.groups
        assert a.entries_total == b.entries_total > 0


def test_real_dump_summary(tmp_path: Path) -> None:
    s = read_summary(FIXTURES / "v2" / f"{PREFIX}1", prefix=f"/some/dir/{PREFIX}", node="n7")
    assert (s.rank, s.node, s.source) == (1, "n7", f"{PREFIX}1")
    (g,) = s.groups
    assert (g.group, g.desc, g.rank_list()) == ("0", "default_pg", [0, 1])
    # gloo marks completion by `retired` only: the statuses and the entries agree it is done.
    assert g.last_enqueued == g.last_completed == 7
    assert g.last_started is None  # -1 in the dump
    assert [e.seq for e in g.entries] == [1, 2, 3, 4, 5, 6, 7]  # 7 collectives, all done
    assert all(e.state is EntryState.COMPLETED for e in g.entries)
    assert s.dumped_ts == pytest.approx((FIXTURES / "v2" / f"{PREFIX}1").stat().st_mtime)
    assert "frames" not in json.dumps(s.to_dict())
    assert RankSummary.from_dict(s.to_dict()) == s


# -- bad files ------------------------------------------------------------------------------


def test_truncated_pickle_is_named(tmp_path: Path) -> None:
    raw = (FIXTURES / "v1" / f"{PREFIX}0").read_bytes()
    path = tmp_path / f"{PREFIX}0"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DumpError, match=r"truncated or corrupt pickle") as info:
        load_dump(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_truncated_json_is_named(tmp_path: Path) -> None:
    raw = (FIXTURES / "v1" / f"{PREFIX}0.json").read_bytes()
    path = tmp_path / f"{PREFIX}0"
    path.write_bytes(raw[:100])
    with pytest.raises(DumpError, match=r"truncated or corrupt JSON"):
        load_dump(path)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (pickle.dumps([1, 2]), "a list is not a flight-recorder dump"),
        (pickle.dumps({"step": 3}), "a dict of step is not a flight-recorder dump"),
        (json.dumps({"entries": []}).encode(), "not a flight-recorder dump"),
        (b"", "empty file"),
        (pickle.dumps({"version": "3.0", "entries": []}), r"version '3.0': expected a 2.x"),
        (pickle.dumps({"version": "1.5", "entries": []}), r"version '1.5'"),
        (pickle.dumps({"version": "2.10", "entries": {}}), "entries is dict: expected a list"),
    ],
)
def test_files_that_are_not_dumps(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / f"{PREFIX}3"
    path.write_bytes(content)
    with pytest.raises(DumpError, match=match):
        load_dump(path)


def test_any_2x_version_is_read(tmp_path: Path) -> None:
    for version in ("2.0", "2.4", "2.9", "2.10", "2.99"):
        path = tmp_path / f"{PREFIX}0"
        path.write_bytes(pickle.dumps(dump([entry(1)], version=version)))
        assert read_summary(path, prefix=PREFIX).version == version


def test_file_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / f"{PREFIX}0"
    path.write_bytes(pickle.dumps(dump([entry(i) for i in range(1, 200)])))
    monkeypatch.setattr(fr, "MAX_DUMP_BYTES", 1000)
    with pytest.raises(DumpError, match=r"bytes: expected a flight-recorder dump of at most 1000"):
        load_dump(path)


def test_file_name_must_carry_the_rank(tmp_path: Path) -> None:
    path = tmp_path / "trace_rank_x"
    path.write_bytes(pickle.dumps(dump([entry(1)])))
    with pytest.raises(DumpError, match=r"expected trace_rank_<rank>"):
        read_summary(path, prefix="trace_rank_")
    other = tmp_path / "trace_rank_12.pkl"
    other.write_bytes(pickle.dumps(dump([entry(1)])))
    assert read_summary(other, prefix="trace_rank_").rank == 12


# -- the summary ----------------------------------------------------------------------------


def test_statuses_as_strings_or_ints_and_minus_one_is_none() -> None:
    entries = [entry(i, state="completed") for i in range(1, 5)] + [entry(5, state="started")]
    for enq, started, done in ((5, 5, 4), ("5", "5", "4")):
        s = summarize(dump(entries, {"0": status(enq, started, done)}), 0)
        g = s.groups[0]
        assert (g.last_enqueued, g.last_started, g.last_completed) == (5, 5, 4)
    g = summarize(dump(entries, {"0": status("5", "-1", -1)}), 0).groups[0]
    assert (g.last_started, g.last_completed) == (None, None)


def test_frontier_is_oldest_open_after_newest_completed() -> None:
    entries = [entry(i, state="completed") for i in range(1, 21)]
    entries += [entry(i, state="scheduled") for i in range(21, 25)]
    g = summarize(dump(entries, {"0": status(24, 20, 20)}), 2).groups[0]
    assert [e.seq for e in g.entries] == list(range(21 - MAX_ENTRIES + 1, 22))
    assert g.entries[-1].state is EntryState.SCHEDULED
    assert all(e.state is EntryState.COMPLETED for e in g.entries[:-1])


def test_wrapped_ring_starts_at_a_high_sequence_id() -> None:
    entries = [entry(i, state="completed") for i in range(500_001, 502_000)] + [entry(502_000)]
    g = summarize(dump(entries, {"0": status(502_000, 502_000, 501_999)}), 1).groups[0]
    assert g.entries[-1].seq == 502_000 and g.entries[-1].state is EntryState.SCHEDULED
    assert len(g.entries) == MAX_ENTRIES


def test_retired_or_before_last_completed_counts_as_completed() -> None:
    # gloo: state stays `scheduled`; retired marks completion. pg_status may lag behind.
    entries = [entry(1, retired=True), entry(2, retired=True), entry(3, retired=False)]
    g = summarize(dump(entries, {"0": status(3, -1, 1)}), 0).groups[0]
    assert [(e.seq, e.state) for e in g.entries] == [
        (1, EntryState.COMPLETED),
        (2, EntryState.COMPLETED),
        (3, EntryState.SCHEDULED),
    ]


def test_pg_status_is_keyed_by_local_pg_id_not_group_name() -> None:
    # This rank's group "2" (ep_odd) has local pg_id 1; pg_status says "1".
    entries = [
        entry(1, retired=True),
        entry(1, pg=("2", "ep_odd"), pg_id=1, retired=True, record_id=10),
        entry(2, pg=("2", "ep_odd"), pg_id=1, record_id=11),
    ]
    config = {"": {"name": "", "desc": "", "ranks": "[]"}}
    s = summarize(dump(entries, {"0": status(1, -1, 1), "1": status(2, -1, 1)}, config), 1)
    by = {g.group: g for g in s.groups}
    assert set(by) == {"0", "2"}
    assert (by["2"].desc, by["2"].last_enqueued, by["2"].last_completed) == ("ep_odd", 2, 1)
    assert (by["0"].last_enqueued, by["0"].ranks) == (1, ())  # gloo's '[]': no rank list


def test_gloo_default_group_config_keyed_empty() -> None:
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    g = summarize(dump([entry(1)], {"0": status(1, -1, 0)}, config), 0).groups[0]
    assert (g.group, g.desc, g.rank_list()) == ("0", "default_pg", [0, 1, 2, 3])


def test_group_with_no_entry_left_keeps_its_status_by_name() -> None:
    config = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
        "5": {"name": "5", "desc": "pp", "ranks": "[0, 8]"},
    }
    s = summarize(dump([entry(1)], {"0": status(1, 1, 1), "5": status(9, 9, 9)}, config), 0)
    by = {g.group: g for g in s.groups}
    assert (by["5"].rank_list(), by["5"].last_completed, by["5"].entries) == ([0, 8], 9, ())


def test_p2p_entries_keep_their_own_sequence() -> None:
    entries = [
        entry(1, state="completed"),
        entry(1, p2p=True, op="nccl:send 0->1", record_id=5, state="completed"),
        entry(2, p2p=True, op="nccl:send 0->1", record_id=6),
        entry(2, record_id=7),
    ]
    g = summarize(dump(entries, {"0": status(2, 2, 1)}), 0).groups[0]
    assert [(e.seq, e.p2p, e.state) for e in g.entries] == [
        (1, False, EntryState.COMPLETED),
        (2, True, EntryState.SCHEDULED),
        (2, False, EntryState.SCHEDULED),
    ]


def test_older_versions_without_optional_fields() -> None:
    old = []
    for i in range(1, 4):
        e = entry(i, state="completed" if i < 3 else "scheduled")
        for key in ("is_p2p", "p2p_seq_id", "retired", "timeout_ms", "pg_id", "output_sizes"):
            e.pop(key, None)
        old.append(e)
    d = dump(old)
    del d["pg_status"]
    g = summarize(d, 3).groups[0]
    assert (g.last_enqueued, g.last_completed) == (None, None)
    assert [(e.seq, e.state, e.timeout_ms) for e in g.entries][-1] == (
        3,
        EntryState.SCHEDULED,
        None,
    )


def test_oversized_fields_are_cut_to_the_contract() -> None:
    big = entry(1, sizes=[[3] * 20] * 20, op="nccl:" + "x" * 500)
    s = summarize(dump([big], {"0": status(1, 1, 0)}), 0)
    assert RankSummary.from_dict(s.to_dict()) == s  # validates every bound


def test_dump_prefix_from_env() -> None:
    assert dump_prefix_from_env({}) == "/tmp/nccl_trace_rank_"
    assert dump_prefix_from_env({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/t_"}) == "/a/t_"
    both = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/t_", "TORCH_FR_DUMP_TEMP_FILE": "/b/fr_"}
    assert dump_prefix_from_env(both) == "/b/fr_"


# -- directories ----------------------------------------------------------------------------


def _write(directory: Path, rank: int, d: dict[str, Any], prefix: str = PREFIX) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}{rank}"
    path.write_bytes(pickle.dumps(d))
    return path


def test_read_dump_dir_of_real_dumps_infers_the_prefix(tmp_path: Path) -> None:
    for rank in (0, 1):
        shutil.copy(FIXTURES / "v2" / f"{PREFIX}{rank}", tmp_path / f"{PREFIX}{rank}")
    (tmp_path / "README.txt").write_text("not a dump")
    summaries = read_dump_dir(tmp_path)
    assert [s.rank for s in summaries] == [0, 1]
    assert read_dump_dir(tmp_path, prefix=PREFIX) == summaries


def test_empty_directory_and_no_dumps(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="empty directory"):
        read_dump_dir(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DumpError, match=r"no file is named <prefix><rank>"):
        read_dump_dir(tmp_path)
    with pytest.raises(DumpError, match=r"no file is named trace_<rank>"):
        read_dump_dir(tmp_path, prefix="trace_")
    with pytest.raises(DumpError, match="not a directory"):
        read_dump_dir(tmp_path / "absent")


def test_two_files_for_one_rank_are_mixed_jobs(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "v1", tmp_path / "v1")  # holds rank_0 and rank_0.json
    with pytest.raises(DumpError, match=r"two files for rank 0"):
        read_dump_dir(tmp_path / "v1", prefix=PREFIX)


def test_default_groups_that_disagree_are_mixed_jobs(tmp_path: Path) -> None:
    _write(tmp_path, 0, dump([entry(1)]))
    eight = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(8)))}}
    _write(tmp_path, 1, dump([entry(1)], config=eight))
    with pytest.raises(DumpError, match=r"world of 4 ranks and rank 1 one of 8"):
        read_dump_dir(tmp_path)


def test_rank_outside_the_world_is_mixed_jobs(tmp_path: Path) -> None:
    _write(tmp_path, 0, dump([entry(1)]))
    _write(tmp_path, 9, dump([entry(1)]))
    with pytest.raises(DumpError, match=r"rank 9 is outside the world of 4 ranks"):
        read_dump_dir(tmp_path)


def test_a_corrupt_file_in_a_directory_is_named(tmp_path: Path) -> None:
    _write(tmp_path, 0, dump([entry(1)]))
    bad = _write(tmp_path, 1, dump([entry(i) for i in range(1, 50)]))
    bad.write_bytes(bad.read_bytes()[:-30])
    with pytest.raises(DumpError, match=rf"{PREFIX}1: truncated or corrupt pickle"):
        read_dump_dir(tmp_path)


def test_prefixes_cannot_be_inferred_when_several() -> None:
    assert infer_prefix(["a_0", "a_1", "a_2.json"]) == "a_"
    with pytest.raises(DumpError, match="several prefixes"):
        infer_prefix(["a_0", "b_1"])


def test_process_pool_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(6)))}}
    for rank in range(6):
        entries = [entry(i, state="completed") for i in range(1, 10 + rank)]
        _write(tmp_path, rank, dump(entries, {"0": status(9 + rank, 9, 9)}, world))
    serial = read_dump_dir(tmp_path, workers=1)
    monkeypatch.setattr(fr, "PARALLEL_FROM", 2)
    assert read_dump_dir(tmp_path, workers=2) == serial
    assert [s.groups[0].last_enqueued for s in serial] == list(range(9, 15))


# -- the summariser against a straightforward full walk -------------------------------------
#
# ``summarize`` groups entries at C speed and walks each group's entries from the newest end,
# stopping once its frontier is complete. The reference below is the plain version it
# replaced: every entry is visited, grouped by (process_group, pg_id) as recorded, and each
# group's frontier searched backwards. Both must give the same summary, field for field.


def _ref_pg_name(e: Any) -> tuple[str, str]:
    pg = e.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        return fr._text(pg[0]), fr._text(pg[1]) if len(pg) > 1 else ""
    pg_id = fr._as_int(e.get("pg_id"))
    return (str(pg_id) if pg_id is not None else fr.DEFAULT_GROUP), ""


def _ref_sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list | tuple):
        return ()
    out: list[tuple[int, ...]] = []
    for shape in value[:MAX_DIMS]:
        if isinstance(shape, list | tuple):
            out.append(tuple(d for d in (fr._as_int(x) for x in shape[:MAX_DIMS]) if d is not None))
    return tuple(tuple(max(0, d) for d in s) for s in out)


def _ref_dtypes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(
        d[:MAX_TEXT] if isinstance(d, str) else str(d)[:MAX_TEXT] for d in value[:MAX_DIMS]
    )


def _ref_entry(e: Any, seq: int, p2p: bool, done: bool) -> FrEntry:
    record_id = fr._as_int(e.get("record_id"))
    created = fr._as_int(e.get("time_created_ns"))
    timeout = fr._as_int(e.get("timeout_ms"))
    state = EntryState.COMPLETED
    if not done:
        try:
            state = EntryState(str(e.get("state", "scheduled")))
        except ValueError:
            state = EntryState.SCHEDULED
    return FrEntry(
        record_id=record_id if record_id is not None and record_id >= 0 else 0,
        seq=seq,
        op=fr._text(e.get("profiling_name", "")),
        state=state,
        p2p=p2p,
        input_sizes=_ref_sizes(e.get("input_sizes")),
        output_sizes=_ref_sizes(e.get("output_sizes")),
        input_dtypes=_ref_dtypes(e.get("input_dtypes")),
        output_dtypes=_ref_dtypes(e.get("output_dtypes")),
        created_ns=created if created is not None and 0 <= created < 2**63 else 0,
        timeout_ms=timeout if timeout is not None and 0 <= timeout <= MAX_SEQ else None,
    )


def _ref_frontier(entries: list[Any], last_completed: int | None) -> tuple[FrEntry, ...]:
    colls: list[tuple[Any, int, bool]] = []
    p2p_open: tuple[Any, int] | None = None
    completed_before = 0
    for e in reversed(entries):
        p2p = bool(e.get("is_p2p", False))
        seq = fr._as_int(e.get("p2p_seq_id" if p2p else "collective_seq_id"))
        if seq is None or not 0 <= seq <= MAX_SEQ:
            continue
        done = e.get("state") == "completed" or e.get("retired") is True
        if p2p:
            if not done:
                p2p_open = (e, seq)
            continue
        if not done and last_completed is not None and seq <= last_completed:
            done = True
        colls.append((e, seq, done))
        if last_completed is not None and seq <= last_completed:
            completed_before += 1
            if completed_before >= MAX_ENTRIES:
                break
    colls.reverse()
    first_open = next((i for i, (_, _, done) in enumerate(colls) if not done), None)
    room = MAX_ENTRIES - (1 if p2p_open is not None else 0)
    end = len(colls) if first_open is None else first_open + 1
    window = [_ref_entry(e, seq, False, done) for e, seq, done in colls[max(0, end - room) : end]]
    if p2p_open is not None:
        window.append(_ref_entry(p2p_open[0], p2p_open[1], True, False))
        window.sort(key=lambda x: x.record_id)
    return tuple(window)


def reference_summarize(d: Any, rank: int, *, source: str = "") -> RankSummary:
    """The summary by a plain walk over every entry (the implementation before the fast one)."""
    entries = d.get("entries") or []
    groups: dict[str, dict[str, Any]] = {}
    pg_ids: dict[str, str] = {}

    def get(name: str) -> dict[str, Any]:
        return groups.setdefault(
            name, {"name": name, "desc": "", "ranks": None, "status": None, "entries": []}
        )

    seen: dict[Any, dict[str, Any]] = {}
    for e in entries:
        try:
            pg = e.get("process_group")
            ident = (
                pg if type(pg) is tuple else tuple(pg) if type(pg) is list else pg,
                e.get("pg_id"),
            )
            g = seen.get(ident)
        except (AttributeError, TypeError):
            continue
        if g is None:
            name, desc = _ref_pg_name(e)
            g = seen[ident] = get(name)
            if desc and not g["desc"]:
                g["desc"] = desc
            pg_id = fr._as_int(ident[1])
            if pg_id is not None:
                pg_ids.setdefault(str(pg_id), name)
        g["entries"].append(e)

    default = pg_ids.get("0", fr.DEFAULT_GROUP)
    config = d.get("pg_config")
    if isinstance(config, dict):
        for key, item in config.items():
            if not isinstance(item, dict):
                continue
            ranks = fr._rank_list(item.get("ranks"))
            name = fr._text(key) if key != "" else default
            if key == "" and not ranks:
                continue
            g = get(name)
            if ranks:
                g["ranks"] = ranks
            config_desc = item.get("desc")
            if isinstance(config_desc, str) and config_desc and not g["desc"]:
                g["desc"] = config_desc[:MAX_TEXT]
    if default in groups and not groups[default]["desc"]:
        groups[default]["desc"] = "default_pg"

    statuses = d.get("pg_status")
    if isinstance(statuses, dict):
        mapped = set(pg_ids.values())
        for raw_key, value in statuses.items():
            if not isinstance(value, dict):
                continue
            key = fr._text(raw_key)
            target = pg_ids.get(key)
            if target is None:
                if key in groups and key not in mapped:
                    target = key
                elif key == "0" and default not in mapped:
                    target = default
                else:
                    continue
            get(target)["status"] = value

    ordered = sorted(groups.values(), key=lambda g: group_order(g["name"]))
    kept = ordered[:MAX_GROUPS]
    states = []
    for g in kept:
        s = g["status"] or {}
        last_completed = fr._seq(s.get("last_completed_collective"))
        runs: tuple[tuple[int, int, int], ...] = ()
        if g["ranks"]:
            runs = rank_runs(g["ranks"])
            if len(runs) > MAX_RANK_RUNS:
                runs = ()
        states.append(
            GroupState(
                group=g["name"],
                desc=g["desc"],
                ranks=runs,
                last_enqueued=fr._seq(s.get("last_enqueued_collective")),
                last_started=fr._seq(s.get("last_started_collective")),
                last_completed=last_completed,
                entries=_ref_frontier(g["entries"], last_completed),
            )
        )
    return RankSummary(
        rank=rank,
        version=fr._text(d.get("version", ""))[:16],
        groups=tuple(states),
        source=source[:MAX_TEXT],
        entries_total=len(entries),
        groups_dropped=len(ordered) - len(kept),
    )


def _same_as_reference(d: Any, rank: int = 3) -> RankSummary:
    got = summarize(d, rank, source="s")
    assert got == reference_summarize(d, rank, source="s")
    return got


def test_committed_dumps_summarise_as_the_full_walk() -> None:
    files = sorted(p for p in FIXTURES.rglob("nccl_trace_rank_*") if p.is_file())
    assert len(files) >= 6
    for path in files:
        d = load_dump(path)
        assert fr._locate(d["entries"]) is not None  # the fast grouping takes real dumps
        _same_as_reference(d, int(path.name.split("_")[-1].split(".")[0]))


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("hang_bench", ROOT / "bench" / "hang_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_dumps_summarise_as_the_full_walk() -> None:
    bench = _bench()
    world = 128
    faulty = set(bench.expected(world))
    ranks = sorted(faulty | {0, 7, 8, 63, 64, 127})
    for rank in ranks:
        d = bench.make_dump(rank, world, 400, 2)
        if d is None:
            continue
        d = pickle.loads(pickle.dumps(d, protocol=2))  # as read: tuples, shared objects
        assert fr._locate(d["entries"]) is not None
        got = _same_as_reference(d, rank)
        assert got.entries_total == len(d["entries"])
        assert any(g.entries for g in got.groups)


def test_a_dump_many_times_the_read_buffer_loads_as_pickle_loads_it(tmp_path: Path) -> None:
    """The restricted unpickler takes the bytes through a buffered reader in chunks: a dump
    spanning many of them loads to exactly what the plain unpickler gives."""
    dump = _bench().make_dump(5, 128, 2000, 4)
    data = pickle.dumps(dump, protocol=2)
    assert len(data) > 4 * fr._PICKLE_BUFFER
    assert fr.parse_dump(data) == pickle.loads(data)
    path = tmp_path / "nccl_trace_rank_5"
    path.write_bytes(data)
    assert fr.load_dump(path) == pickle.loads(data)


@pytest.mark.parametrize("case", ["two_groups", "skip"])
def test_real_hang_dumps_summarise_as_the_full_walk(real_hang_dumps: Any, case: str) -> None:
    ran = real_hang_dumps[case]
    dirs = [ran.pickle_dir, ran.json_dir, ran.nccl_dir("str")]
    seen = 0
    for directory in dirs:
        for path in sorted(p for p in directory.iterdir() if p.is_file()):
            rank = fr.rank_of(path.name)
            if rank is None:
                continue
            d = load_dump(path)
            assert fr._locate(d["entries"]) is not None
            _same_as_reference(d, rank)
            seen += 1
    assert seen >= 2 * len(ran.dumping_ranks)


_GROUPS = [
    (("0", "default_pg"), 0),
    (("1", "tp_0"), 1),
    (("5", "pp_1"), 2),
    (("9", "ep_0"), 3),
    (("1", "tp_other_desc"), 4),  # a second pg_id of group "1"
    (("12", ""), 5),
]


@st.composite
def _entry_lists(draw: st.DrawFn) -> dict[str, Any]:
    """Dumps of several groups: collectives and p2p ops, wrapped sequence ids, groups seen
    only in old entries, statuses present, partial or missing, and odd fields now and then."""
    pool = draw(st.lists(st.sampled_from(_GROUPS), min_size=1, max_size=5, unique=True))
    old_only = draw(st.lists(st.sampled_from(_GROUPS), max_size=2, unique=True))
    base = draw(st.sampled_from([0, 100_000, MAX_SEQ - 200]))
    n = draw(st.integers(0, 90))
    old = draw(st.integers(0, n))
    seqs: dict[Any, int] = {}
    p2p_seqs: dict[Any, int] = {}
    entries: list[Any] = []
    for i in range(n):
        pg, pg_id = draw(st.sampled_from(old_only if i < old and old_only else pool))
        p2p = draw(st.integers(0, 9)) < {"5": 9, "12": 5}.get(pg[0], 1)  # pp groups: mostly p2p
        counter = p2p_seqs if p2p else seqs
        counter[pg_id] = counter.get(pg_id, base) + 1
        e = entry(
            counter[pg_id],
            pg=pg,
            pg_id=pg_id,
            p2p=p2p,
            record_id=base + i,
            state=draw(st.sampled_from(["scheduled", "started", "completed"])),
            retired=draw(st.sampled_from([None, True, False])),
        )
        odd = draw(st.integers(0, 40))
        if odd == 0:
            e["collective_seq_id" if not p2p else "p2p_seq_id"] = draw(
                st.sampled_from([-1, "x", str(counter[pg_id]), None, True])
            )
        elif odd == 1:
            e["process_group"] = list(pg)  # JSON's list
        elif odd == 2:
            del e["is_p2p"]
        elif odd == 3:
            e["pg_id"] = str(pg_id)
        elif odd == 4:
            e["process_group"] = None
        elif odd == 5:
            e["retired"] = 1
        entries.append(e)
    if n and draw(st.integers(0, 15)) == 0:
        entries.insert(draw(st.integers(0, n)), draw(st.sampled_from([None, "x", [1], {}])))
    statuses: dict[str, Any] | None = {}
    shape = draw(st.sampled_from(["all", "some", "none", "missing"]))
    if shape == "missing":
        statuses = None
    elif shape != "none":
        assert statuses is not None
        for _pg, pg_id in pool + old_only:
            if shape == "some" and draw(st.booleans()):
                continue
            top = seqs.get(pg_id, base)
            done = draw(st.integers(base - 2, top + 1))
            as_str = draw(st.booleans())
            value = status(top, done, done if done >= 0 else -1)
            statuses[str(pg_id)] = {k: str(v) for k, v in value.items()} if as_str else value
    d = dump(entries, statuses)
    if statuses is None:
        del d["pg_status"]
    return d


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_entry_lists())
def test_any_entry_list_summarises_as_the_full_walk(d: dict[str, Any]) -> None:
    got = _same_as_reference(d)
    assert got.entries_total == len(d["entries"])


def test_many_groups_and_shared_pg_ids_are_walked_one_by_one_alike() -> None:
    many = [
        entry(100 + i // 40, pg=(str(i % 40), f"g{i % 40}"), pg_id=i % 40, state="completed")
        for i in range(400)
    ]
    assert fr._locate(many) is None  # more groups than the C-speed grouping takes
    got = _same_as_reference(dump(many, {str(i): status(109, 109, 108) for i in range(40)}))
    assert len(got.groups) == 40
    shared = [entry(i, pg=("1", "a") if i % 3 else ("2", "b"), pg_id=1) for i in range(1, 30)]
    assert fr._locate(shared) is None  # one pg_id, two process groups
    got = _same_as_reference(dump(shared, {"1": status(29, 29, 20)}))
    assert [g.group for g in got.groups] == ["0", "1", "2"]


# -- fields: the usual values are taken at C speed, anything else cleaned to the same result ---


class _Int(int):
    pass


class _Str(str):
    __slots__ = ()


class _Backwards(list[Any]):
    """A list that iterates backwards: its slices (plain lists) do not."""

    def __iter__(self) -> Any:
        return reversed(list(super().__iter__()))


def _typed(value: Any) -> Any:
    """``value`` with every item's type beside it (``==`` holds True for 1, and _Str('a') for
    'a')."""
    if isinstance(value, tuple):
        return ("tuple", tuple(_typed(v) for v in value))
    return (type(value).__name__, value)


_ODD = st.one_of(
    st.integers(-3, 2**40),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.floats(allow_nan=False),
    st.sampled_from(["8", " 8", "-2", "x"]),
    st.builds(_Int, st.integers(-2, 2**20)),
    st.builds(_Str, st.text(max_size=MAX_TEXT + 2)),
)
_SHAPE = st.one_of(
    st.lists(st.integers(0, 2**20), max_size=MAX_DIMS + 3),
    st.lists(_ODD, max_size=MAX_DIMS + 3),
    st.tuples(st.integers(0, 9), st.integers(-9, 9)),
    st.builds(_Backwards, st.lists(st.integers(0, 9), max_size=3)),
    _ODD,
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.lists(st.lists(st.integers(0, 2**31), max_size=4), max_size=3),  # the usual value
        st.lists(_SHAPE, max_size=MAX_DIMS + 3),
        st.tuples(_SHAPE, _SHAPE),
        st.builds(_Backwards, st.lists(_SHAPE, max_size=3)),
        _ODD,
    )
)
def test_sizes_are_the_plain_cleaning_of_any_value(value: Any) -> None:
    assert _typed(fr._sizes(value)) == _typed(_ref_sizes(value))


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.lists(st.sampled_from(["Float", "BFloat16", "Half"]), max_size=3),  # the usual value
        st.lists(st.one_of(st.text(max_size=MAX_TEXT + 20), _ODD), max_size=MAX_DIMS + 3),
        st.lists(st.text(min_size=MAX_TEXT - 1, max_size=MAX_TEXT + 2), max_size=2),
        st.builds(_Backwards, st.lists(st.sampled_from(["Float", "Half"]), max_size=3)),
        _ODD,
    )
)
def test_dtypes_are_the_plain_cleaning_of_any_value(value: Any) -> None:
    assert _typed(fr._dtypes(value)) == _typed(_ref_dtypes(value))


def test_summary_values_follow_the_dataclasses_fields() -> None:
    """A pool worker sends a summary as its fields' values in order; the order is the
    dataclasses' own."""
    assert tuple(f.name for f in dataclasses.fields(FrEntry)) == fr._ENTRY_FIELDS
    assert tuple(f.name for f in dataclasses.fields(GroupState)) == fr._GROUP_FIELDS
    assert tuple(f.name for f in dataclasses.fields(RankSummary)) == fr._SUMMARY_FIELDS
