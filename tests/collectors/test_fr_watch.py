"""The flight-recorder watcher: real dumps of a gloo job, written into a watched directory.

The dumps are those of ``fixtures/flight_recorder`` (a 2-rank gloo job of torch 2.13 CPU,
written by ``fr_dumps.py``: ``v1`` after 4 collectives, ``v2`` after 7), copied into the watched
directory the way the recorder writes them; one test runs the job live into it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from fr_dumps import PREFIX, write_dumps

from collectors.flight_recorder import read_summary
from collectors.fr_watch import FR_SOURCE, FrWatcher, split_prefix
from minder.core.errors import ValidationError
from minder.core.hang import MAX_SUMMARIES_PER_BATCH, RankSummary

DUMPS = Path(__file__).parent / "fixtures" / "flight_recorder"
POLL = 5.0


def _watcher(directory: Path, **kwargs: object) -> FrWatcher:
    return FrWatcher(f"{directory}/{PREFIX}", node="n1", poll_s=POLL, **kwargs)  # type: ignore[arg-type]


def _put(directory: Path, rank: int, version: str = "v1", *, mtime: float | None = None) -> Path:
    """Write rank ``rank``'s dump of ``version`` into ``directory`` (in place, like the
    recorder), with modification time ``mtime`` (default now)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{PREFIX}{rank}"
    target.write_bytes((DUMPS / version / f"{PREFIX}{rank}").read_bytes())
    if mtime is not None:
        os.utime(target, (mtime, mtime))
    return target


def _expected(version: str, rank: int, target: Path) -> RankSummary:
    """What the reader makes of the file now at ``target`` (the dump of ``version``)."""
    assert target.read_bytes() == (DUMPS / version / f"{PREFIX}{rank}").read_bytes()
    return read_summary(target, prefix=PREFIX, node="n1")


def test_a_new_dump_is_taken_once_it_settles_and_exactly_once(tmp_path: Path) -> None:
    t0 = time.time()
    target = _put(tmp_path, 0)
    watcher = _watcher(tmp_path)
    assert watcher.poll(t0) == 0 and watcher.pending == 0  # seen once: it may still grow
    assert watcher.poll(t0 + 1) == 0  # not listed again before poll_s
    assert watcher.poll(t0 + POLL) == 1
    [summary] = watcher.take()
    assert summary == _expected("v1", 0, target)
    assert (summary.rank, summary.node, summary.version) == (0, "n1", "2.10")
    assert summary.groups and summary.entries_total > 0
    for k in range(2, 6):
        assert watcher.poll(t0 + k * POLL) == 0
    assert watcher.take() == [] and watcher.summaries_total == 1
    assert dict(watcher.problems.counts) == {}


def test_a_growing_dump_waits_until_it_stops_changing(tmp_path: Path) -> None:
    t0 = time.time()
    full = (DUMPS / "v1" / f"{PREFIX}1").read_bytes()
    target = tmp_path / f"{PREFIX}1"
    target.write_bytes(full[:100])  # the recorder is writing it
    watcher = _watcher(tmp_path)
    watcher.poll(t0)
    with target.open("ab") as f:
        f.write(full[100:700])
    assert watcher.poll(t0 + POLL) == 0  # grew since the last poll
    with target.open("ab") as f:
        f.write(full[700:])
    assert watcher.poll(t0 + 2 * POLL) == 0  # grew again
    assert watcher.problems.counts["not_a_dump"] == 0  # a partial dump was never read
    assert watcher.poll(t0 + 3 * POLL) == 1
    assert watcher.take() == [_expected("v1", 1, target)]


def test_a_rewritten_dump_is_taken_again_but_the_same_bytes_never_twice(tmp_path: Path) -> None:
    t0 = time.time()
    target = _put(tmp_path, 0, mtime=t0 - 30)
    watcher = _watcher(tmp_path)
    watcher.poll(t0)
    watcher.poll(t0 + POLL)
    [first] = watcher.take()
    # The rank dumps again later (the job went on and hung further): a new summary.
    _put(tmp_path, 0, "v2", mtime=t0 + 7)
    assert watcher.poll(t0 + 2 * POLL) == 0
    assert watcher.poll(t0 + 3 * POLL) == 1
    [second] = watcher.take()
    assert second == _expected("v2", 0, target) and second != first
    assert second.entries_total > first.entries_total
    # The same bytes written again (a new modification time, nothing new): not sent again.
    _put(tmp_path, 0, "v2", mtime=t0 + 20)
    for k in range(4, 8):
        assert watcher.poll(t0 + k * POLL) == 0
    assert watcher.take() == [] and watcher.summaries_total == 2


def test_a_file_that_is_not_a_dump_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = time.time()
    (tmp_path / f"{PREFIX}3").write_bytes(b"this is no pickle of a flight recorder")
    (tmp_path / f"{PREFIX}4").write_bytes(b"\x80\x04\x95")  # a truncated pickle
    (tmp_path / f"{PREFIX}x").write_bytes(b"not a rank: not looked at")
    (tmp_path / "other_file").write_bytes(b"not the prefix: not looked at")
    _put(tmp_path, 0)
    watcher = _watcher(tmp_path)
    with caplog.at_level(logging.INFO, logger="collectors.fr_watch"):
        for k in range(6):
            watcher.poll(t0 + k * POLL)
    assert [s.rank for s in watcher.take()] == [0]  # the good dump beside them still goes
    assert dict(watcher.problems.counts) == {"not_a_dump": 2}
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2, skipped
    assert any(f"{PREFIX}3" in line and "not_a_dump" in line for line in skipped)
    assert all("\n" not in line for line in skipped)
    # A later version of the file is looked at (and logged) again.
    (tmp_path / f"{PREFIX}3").write_bytes(b"still no dump, but another file")
    with caplog.at_level(logging.INFO, logger="collectors.fr_watch"):
        for k in range(6, 9):
            watcher.poll(t0 + k * POLL)
    assert watcher.problems.counts["not_a_dump"] == 3


def test_no_directory_is_no_error_and_costs_one_listing_per_poll_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.time()
    directory = tmp_path / "not-yet"
    watcher = _watcher(directory)
    listings = []
    real_scandir = os.scandir

    def counting_scandir(path: Path) -> object:
        listings.append(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    for second in range(60):  # a 1 s agent interval for a minute
        assert watcher.poll(t0 + second) == 0
    assert len(listings) == 60 / POLL and watcher.listings_total == 0
    assert watcher.pending == 0 and dict(watcher.problems.counts) == {}
    # The directory appears with a dump: it is taken.
    _put(directory, 1)
    watcher.poll(t0 + 60)
    watcher.poll(t0 + 65)
    assert [s.rank for s in watcher.take()] == [1]


def test_dumps_written_long_before_the_agent_started_are_left_alone(tmp_path: Path) -> None:
    t0 = time.time()
    _put(tmp_path, 0, mtime=t0 - 3600)  # an hour old: a job long gone
    _put(tmp_path, 1, mtime=t0 - 120)  # two minutes old: the agent restarted during a hang
    watcher = _watcher(tmp_path, max_age_at_start_s=600)
    watcher.poll(t0)
    watcher.poll(t0 + POLL)
    assert [s.rank for s in watcher.take()] == [1]
    _put(tmp_path, 0, "v2", mtime=t0 + 6)  # rank 0 dumps anew: taken
    watcher.poll(t0 + 2 * POLL)
    watcher.poll(t0 + 3 * POLL)
    assert [(s.rank, s.source) for s in watcher.take()] == [(0, f"{PREFIX}0")]


def test_json_dumps_links_and_oversized_files(tmp_path: Path) -> None:
    t0 = time.time()
    shutil.copy(DUMPS / "v1" / f"{PREFIX}1.json", tmp_path / f"{PREFIX}1.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(DUMPS / "v1" / f"{PREFIX}0", elsewhere / "dump")
    (tmp_path / f"{PREFIX}0").symlink_to(elsewhere / "dump")  # a link is not followed
    (tmp_path / f"{PREFIX}2").write_bytes(b"\0" * 4096)
    watcher = _watcher(tmp_path, max_dump_bytes=3000)
    watcher.poll(t0)
    watcher.poll(t0 + POLL)
    [summary] = watcher.take()
    pickled = read_summary(DUMPS / "v1" / f"{PREFIX}1", prefix=PREFIX, node="n1")
    assert (summary.rank, summary.groups) == (1, pickled.groups)
    assert dict(watcher.problems.counts) == {"too_large": 1}


def test_reading_is_bounded_per_poll_and_what_waits_is_bounded_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t0 = time.time()
    _put(tmp_path, 0, mtime=t0 - 2)
    _put(tmp_path, 1, mtime=t0 - 1)
    watcher = _watcher(tmp_path, max_per_poll=1, max_pending=1)
    watcher.poll(t0)
    assert watcher.poll(t0 + POLL) == 1  # the oldest first
    assert watcher.pending == 1 and watcher.problems.counts["dropped"] == 0
    with caplog.at_level(logging.WARNING, logger="collectors.fr_watch"):
        assert watcher.poll(t0 + 2 * POLL) == 1  # the other at the next poll
    # One waits at most: the older summary was dropped, counted and logged.
    assert watcher.problems.counts["dropped"] == 1 and "oldest 1 dropped" in caplog.text
    assert [s.rank for s in watcher.take()] == [1]


def test_take_is_bounded_by_count_and_bytes_and_keeps_the_rest_in_order(tmp_path: Path) -> None:
    watcher = _watcher(tmp_path, max_pending=1000)
    summaries = [
        RankSummary(rank=r, version="2.10", groups=(), node="n1")
        for r in range(MAX_SUMMARIES_PER_BATCH + 6)
    ]
    watcher.give_back(summaries)
    first = watcher.take()
    assert [s.rank for s in first] == list(range(MAX_SUMMARIES_PER_BATCH))
    assert [s.rank for s in watcher.take(max_count=4)] == [64, 65, 66, 67]
    assert [s.rank for s in watcher.take(max_bytes=1)] == []  # one does not fit: it waits
    assert [s.rank for s in watcher.take()] == [68, 69]


@pytest.mark.parametrize("prefix", ["", "/var/tmp/"])
def test_a_prefix_without_a_file_name_part_is_refused(prefix: str) -> None:
    with pytest.raises(ValidationError, match="expected DIRECTORY/NAME_PREFIX"):
        FrWatcher(prefix)


def test_the_default_prefix_is_the_training_processes_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TORCH_FR_DUMP_TEMP_FILE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", raising=False)
    assert (FrWatcher().directory, FrWatcher().file_prefix) == (Path("/tmp"), PREFIX)
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", f"{tmp_path}/fr/trace_")
    watcher = FrWatcher()
    assert (watcher.directory, watcher.file_prefix) == (tmp_path / "fr", "trace_")
    assert watcher.name == FR_SOURCE
    assert split_prefix("relative_") == (Path("."), "relative_")


def test_dumps_of_a_live_gloo_job_written_into_the_watched_directory(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the live job needs torch.distributed (gloo)")
    out = tmp_path / "job"
    watcher = FrWatcher(f"{out}/v2/{PREFIX}", node="n1", poll_s=0.01)
    watcher.poll()  # before the job: no directory yet
    write_dumps(out, world=2)
    watcher.poll()
    time.sleep(0.02)
    watcher.poll()
    summaries = sorted(watcher.take(), key=lambda s: s.rank)
    assert [s.rank for s in summaries] == [0, 1]
    for summary in summaries:
        [group] = summary.groups
        assert group.rank_list() == [0, 1]
        assert group.last_enqueued == 7  # 5 all-reduces and 2 barriers
        # (the last barrier may not be marked completed yet on the rank that dumped first)
        assert group.last_completed in (6, 7)
        assert summary.node == "n1" and summary.dumped_ts > 0
    assert dict(watcher.problems.counts) == {}
