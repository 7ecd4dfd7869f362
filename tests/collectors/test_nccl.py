"""NcclSource: tails NCCL Inspector dumps (fixtures in the plugin's exact format)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

import collectors.nccl as nccl_module
from collectors.base import Collected, Source
from collectors.nccl import NcclSource
from minder.core.metrics import validate_sample

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nccl"
V42 = FIXTURES / "v4.2" / "gpu-node-017-pid41872.log"  # global rank 0
V43 = FIXTURES / "v4.3" / "gpu-node-017-pid41873.log"  # global rank 1
V40 = FIXTURES / "v4.0" / "gpu-node-017-pid41874.log"  # global rank 2
DAMAGED = FIXTURES / "damaged" / "gpu-node-017-pid41875.log"  # global rank 3

US, GB = 1e-6, 1e9


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def values(out: Collected) -> dict[tuple[str, str], float]:
    for sample in out.samples:
        validate_sample(*sample)
    result = {(metric, device): value for metric, device, value in out.samples}
    assert len(result) == len(out.samples), "one sample per metric and rank"
    return result


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


@pytest.fixture
def dump_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "nccl-inspector-4242"
    directory.mkdir()
    return directory


@pytest.fixture
def source(dump_dir: Path, tmp_path: Path) -> NcclSource:
    """A source started on an empty directory (no /proc entries: communicator ranks apply)."""
    (tmp_path / "proc").mkdir()
    src = NcclSource(dump_dir, proc_root=tmp_path / "proc")
    assert values(src.collect(0.0)) == {}
    return src


def test_is_a_source(source: NcclSource) -> None:
    assert isinstance(source, Source)
    assert source.name == "nccl"


def test_v42_dump_means_per_rank(source: NcclSource, dump_dir: Path) -> None:
    (dump_dir / V42.name).write_bytes(V42.read_bytes())
    got = values(source.collect(1.0))
    # Four collectives (TP AllReduce/ReduceScatter/AllGather, world AllReduce); the Send is P2P.
    # Rank 0 of the 16-rank world communicator is the global rank.
    assert got == {
        ("nccl_collective_seconds", "rank0"): pytest.approx((1734 + 812 + 798 + 10420) / 4 * US),
        ("nccl_busbw_bytes_per_second", "rank0"): pytest.approx(
            (270.912369 + 289.262345 + 294.337123 + 96.60585) / 4 * GB
        ),
    }
    assert source.problems.total == 0
    assert values(source.collect(2.0)) == {}, "nothing new, nothing emitted"


def test_v43_payload_lines_take_the_marker_context(source: NcclSource, dump_dir: Path) -> None:
    (dump_dir / V43.name).write_bytes(V43.read_bytes())
    got = values(source.collect(1.0))
    # TP AllReduce + AllGather, DP AllReduce, world ReduceScatter (verbose); P2P/proxy skipped.
    assert got == {
        ("nccl_collective_seconds", "rank1"): pytest.approx((1750 + 805 + 41500 + 9603) / 4 * US),
        ("nccl_busbw_bytes_per_second", "rank1"): pytest.approx(
            (268.435456 + 291.77767 + 25.873297 + 104.824842) / 4 * GB
        ),
    }
    assert source.problems.total == 0


def test_v40_self_contained_lines(source: NcclSource, dump_dir: Path) -> None:
    (dump_dir / V40.name).write_bytes(V40.read_bytes())
    got = values(source.collect(1.0))
    assert got[("nccl_collective_seconds", "rank2")] == pytest.approx((1741 + 2210) / 2 * US)
    assert got[("nccl_busbw_bytes_per_second", "rank2")] == pytest.approx(
        (269.823118 + 60.732004) / 2 * GB
    )


def test_several_ranks_in_one_interval(source: NcclSource, dump_dir: Path) -> None:
    for fixture in (V42, V43, V40):
        (dump_dir / fixture.name).write_bytes(fixture.read_bytes())
    got = values(source.collect(1.0))
    assert sorted({device for _, device in got}) == ["rank0", "rank1", "rank2"]
    assert len(got) == 6


def test_appended_lines_are_read_once(source: NcclSource, dump_dir: Path) -> None:
    content = lines(V42)
    path = dump_dir / V42.name
    path.write_bytes(b"".join(content[:3]))  # marker + AllReduce + ReduceScatter
    got = values(source.collect(1.0))
    assert got[("nccl_collective_seconds", "rank0")] == pytest.approx((1734 + 812) / 2 * US)

    append(path, b"".join(content[3:]))  # AllGather, world marker, world AllReduce, Send
    got = values(source.collect(2.0))
    assert got[("nccl_collective_seconds", "rank0")] == pytest.approx((798 + 10420) / 2 * US)
    assert values(source.collect(3.0)) == {}


def test_partial_last_line_waits(source: NcclSource, dump_dir: Path) -> None:
    content = lines(V43)
    path = dump_dir / V43.name
    head, cut = b"".join(content[:2]), len(content[2]) // 2
    path.write_bytes(head + content[2][:cut])  # marker, AllReduce, half an AllGather
    got = values(source.collect(1.0))
    assert got[("nccl_collective_seconds", "rank1")] == pytest.approx(1750 * US)

    assert values(source.collect(2.0)) == {}, "still no newline: nothing to read"
    append(path, content[2][cut:])
    got = values(source.collect(3.0))
    assert got[("nccl_collective_seconds", "rank1")] == pytest.approx(805 * US)
    assert source.problems.total == 0, "the split line was never parsed half"


def test_truncated_file_is_read_from_the_start(source: NcclSource, dump_dir: Path) -> None:
    path = dump_dir / V42.name
    path.write_bytes(V42.read_bytes())
    source.collect(1.0)
    content = lines(V42)
    with open(path, "r+b") as handle:  # same inode, shorter content
        handle.truncate(0)
        handle.write(b"".join(content[:2]))
    got = values(source.collect(2.0))
    assert got[("nccl_collective_seconds", "rank0")] == pytest.approx(1734 * US)


def test_replaced_file_is_read_from_the_start(source: NcclSource, dump_dir: Path) -> None:
    path = dump_dir / V42.name
    path.write_bytes(V42.read_bytes())
    source.collect(1.0)
    # A new file under the same name, longer than the old offset (rotation with a new inode).
    fresh = dump_dir / "incoming.tmp"
    fresh.write_bytes(V42.read_bytes() + b"".join(lines(V42)[1:3]))
    keep_alive = open(path, "rb")  # noqa: SIM115 - hold the old inode so it is not reused
    try:
        os.replace(fresh, path)
        got = values(source.collect(2.0))
    finally:
        keep_alive.close()
    # Whole file again: the 4 collectives plus 2 repeated self-contained lines.
    assert got[("nccl_collective_seconds", "rank0")] == pytest.approx(
        (1734 + 812 + 798 + 10420 + 1734 + 812) / 6 * US
    )


def test_files_present_at_start_are_read_from_their_end(dump_dir: Path, tmp_path: Path) -> None:
    path = dump_dir / V43.name
    content = lines(V43)
    path.write_bytes(b"".join(content[:2]) + content[2][:40])  # ends in a partial line
    src = NcclSource(dump_dir, proc_root=tmp_path / "noproc")
    assert values(src.collect(0.0)) == {}, "history is not this interval's"

    # The rest of the open dump: payload lines whose marker was skipped are dropped quietly;
    # the next marker brings the context back.
    append(path, content[2][40:] + b"".join(content[3:]))
    got = values(src.collect(1.0))
    assert got[("nccl_collective_seconds", "rank1")] == pytest.approx((41500 + 9603) / 2 * US)
    assert src.problems.total == 0


def test_new_files_are_picked_up(source: NcclSource, dump_dir: Path) -> None:
    (dump_dir / V42.name).write_bytes(V42.read_bytes())
    assert {d for _, d in values(source.collect(1.0))} == {"rank0"}
    (dump_dir / V40.name).write_bytes(V40.read_bytes())
    assert {d for _, d in values(source.collect(2.0))} == {"rank2"}


def test_bad_lines_are_skipped_counted_and_logged_once(
    source: NcclSource, dump_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = dump_dir / DAMAGED.name
    path.write_bytes(DAMAGED.read_bytes())
    with caplog.at_level(logging.WARNING, logger="collectors.base"):
        got = values(source.collect(1.0))
        assert got == {
            ("nccl_collective_seconds", "rank3"): pytest.approx((1800 + 1810) / 2 * US),
            ("nccl_busbw_bytes_per_second", "rank3"): pytest.approx(
                (260.978916 + 259.537043) / 2 * GB
            ),
        }
        assert dict(source.problems.counts) == {
            "not_json": 2,  # the stray NCCL log line and the JSON array
            "missing_field": 1,  # no coll_exec_time_us
            "not_numeric": 2,  # busbw "nan" and a string header rank
            "invalid_timing": 1,  # 0 us
            "no_context": 1,  # a 6th coll_perf after a marker announcing 5
            "unknown_record": 1,
        }
        append(path, DAMAGED.read_bytes())  # the same damage again: counted, not logged
        values(source.collect(2.0))
    assert source.problems.counts["not_json"] == 4
    assert source.problems.counts["no_context"] == 2
    for reason in source.problems.counts:
        assert sum(f"({reason})" in r.getMessage() for r in caplog.records) == 1, reason


def test_overlong_line_is_skipped(
    source: NcclSource, dump_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nccl_module, "_MAX_LINE_BYTES", 100)
    path = dump_dir / V40.name
    path.write_bytes(b"x" * 200)
    assert values(source.collect(1.0)) == {}
    assert source.problems.counts["line_too_long"] == 1
    append(path, b"\n" + V40.read_bytes())
    got = values(source.collect(2.0))
    assert got[("nccl_collective_seconds", "rank2")] == pytest.approx((1741 + 2210) / 2 * US)


def test_missing_directory_is_absent_once(tmp_path: Path) -> None:
    directory = tmp_path / "not-yet"
    src = NcclSource(directory, proc_root=tmp_path)
    for now in range(3):
        assert src.collect(float(now)).samples == []
    assert dict(src.problems.counts) == {"absent": 1}
    directory.mkdir()  # the plugin creates it on its first dump
    (directory / V40.name).write_bytes(V40.read_bytes())
    assert {d for _, d in values(src.collect(3.0))} == {"rank2"}, "new files read from the start"


def test_single_rank_communicator_has_no_bus_bandwidth(source: NcclSource, dump_dir: Path) -> None:
    line = lines(V40)[0].replace(b'"n_ranks":8', b'"n_ranks":1').replace(b'"rank":2', b'"rank":0')
    line = line.replace(b'"coll_busbw_gbs":269.823118', b'"coll_busbw_gbs":0.000000')
    (dump_dir / V40.name).write_bytes(line)
    got = values(source.collect(1.0))
    assert got == {("nccl_collective_seconds", "rank0"): pytest.approx(1741 * US)}


def test_p2p_only_dump_emits_nothing(source: NcclSource, dump_dir: Path) -> None:
    content = lines(V42)
    (dump_dir / V42.name).write_bytes(content[-1])  # the self-contained Send line
    assert values(source.collect(1.0)) == {}
    assert source.problems.total == 0


def test_other_files_are_ignored(source: NcclSource, dump_dir: Path) -> None:
    (dump_dir / "notes.txt").write_text("not a dump\n")
    (dump_dir / "GPU-3f1c.prom").write_text("nccl_bus_bandwidth_gbs 1\n")
    assert values(source.collect(1.0)) == {}
    assert source.problems.total == 0


# -- global rank --------------------------------------------------------------------------------


def write_environ(proc: Path, pid: int, **env: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "environ").write_bytes(
        b"".join(f"{key}={value}".encode() + b"\0" for key, value in env.items())
    )


def test_global_rank_from_the_process_environment(dump_dir: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_environ(proc, 41874, RANK="12", NCCL_PROFILER_PLUGIN="/opt/libnccl-profiler-inspector.so")
    src = NcclSource(dump_dir, proc_root=proc)
    src.collect(0.0)
    local = socket.gethostname()
    (dump_dir / f"{local}-pid41874.log").write_bytes(V40.read_bytes())
    assert {d for _, d in values(src.collect(1.0))} == {"rank12"}, "not the TP rank 2"


def test_slurm_procid_when_rank_is_not_set(dump_dir: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_environ(proc, 41874, SLURM_PROCID="5", NCCL_INSPECTOR_ENABLE="1")
    src = NcclSource(dump_dir, proc_root=proc)
    src.collect(0.0)
    (dump_dir / f"{socket.gethostname()}-pid41874.log").write_bytes(V40.read_bytes())
    assert {d for _, d in values(src.collect(1.0))} == {"rank5"}


def test_environment_of_an_unrelated_process_is_not_trusted(dump_dir: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_environ(proc, 41874, RANK="12", HOME="/root")  # no NCCL profiler: pid reused
    src = NcclSource(dump_dir, proc_root=proc)
    src.collect(0.0)
    (dump_dir / f"{socket.gethostname()}-pid41874.log").write_bytes(V40.read_bytes())
    assert {d for _, d in values(src.collect(1.0))} == {"rank2"}


def test_pid_of_another_host_is_not_looked_up(dump_dir: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_environ(proc, 41874, RANK="12", NCCL_PROFILER_PLUGIN="x")
    src = NcclSource(dump_dir, proc_root=proc)
    src.collect(0.0)
    (dump_dir / "some-other-node-pid41874.log").write_bytes(V40.read_bytes())
    assert {d for _, d in values(src.collect(1.0))} == {"rank2"}


def test_hostname_filter_for_a_shared_directory(dump_dir: Path, tmp_path: Path) -> None:
    src = NcclSource(dump_dir, hostname="gpu-node-017", proc_root=tmp_path)
    src.collect(0.0)
    (dump_dir / V40.name).write_bytes(V40.read_bytes())
    (dump_dir / "gpu-node-018-pid41874.log").write_bytes(V42.read_bytes())
    assert {d for _, d in values(src.collect(1.0))} == {"rank2"}


def dp_only_dump(pid: int, exec_us: int) -> bytes:
    """A v4.2 line of rank 0 in a 2-rank DP communicator (no world communicator seen)."""
    line = lines(V40)[0].replace(b'"n_ranks":8', b'"n_ranks":2').replace(b'"rank":2', b'"rank":0')
    return line.replace(b'"coll_exec_time_us":1741', f'"coll_exec_time_us":{exec_us}'.encode())


def test_clashing_fallback_ranks_are_dropped_and_reported(
    source: NcclSource, dump_dir: Path
) -> None:
    (dump_dir / "gpu-node-017-pid100.log").write_bytes(dp_only_dump(100, 1000))
    (dump_dir / "gpu-node-017-pid101.log").write_bytes(dp_only_dump(101, 3000))
    assert values(source.collect(1.0)) == {}, "two processes cannot both be rank 0"
    assert source.problems.counts["rank_conflict"] == 1


def test_environment_rank_wins_a_clash(dump_dir: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_environ(proc, 100, RANK="0", NCCL_PROFILER_PLUGIN="x")
    src = NcclSource(dump_dir, proc_root=proc)
    src.collect(0.0)
    local = socket.gethostname()
    (dump_dir / f"{local}-pid100.log").write_bytes(dp_only_dump(100, 1000))
    (dump_dir / f"{local}-pid101.log").write_bytes(dp_only_dump(101, 3000))  # no environ
    got = values(src.collect(1.0))
    assert got[("nccl_collective_seconds", "rank0")] == pytest.approx(1000 * US)
    assert src.problems.counts["rank_conflict"] == 1


def test_close_forgets_positions(source: NcclSource, dump_dir: Path) -> None:
    (dump_dir / V40.name).write_bytes(V40.read_bytes())
    assert values(source.collect(1.0))
    source.close()
    assert values(source.collect(2.0)) == {}, "reopened sources skip history like a fresh start"
