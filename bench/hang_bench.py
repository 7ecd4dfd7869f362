"""Hang analysis at scale: read, summarise and analyse the flight-recorder dumps of a
4,096-rank job (targets: < 5 s and < 1 GB; docs/hangs.md).

Run: ``python bench/hang_bench.py [--ranks 4096 --entries 2000 --frames 4] [--workers N]
[--dir DIR] [--per-dump N] [--instructions N] [--interleave K] [--format table|json]``.

It writes one pickle dump per rank (as ``torch._C._distributed_c10d._dump_fr_trace()`` does:
``version``, ``pg_config`` with ranks strings, ``pg_status`` keyed by the rank-local pg_id,
``entries`` with their ``frames``, frame dicts shared between entries as the recorder's
pickler memoizes them) into a temporary directory, then reads the directory in a fresh child
process (``read_dump_dir`` + ``analyze``: what ``minder hang analyze DIR`` does) and reports
its wall time and the peak RSS of the child and of its pool workers.

The machine it runs on may be shared and its speed drift by 2-3x, so the same invocation also
measures the *unpickle floor*: the same pool, same chunks, reads and ``pickle.loads`` every
dump and frees it (no restriction, no summary, no result), once before the reader and once
after, each in a fresh process. ``read_over_floor`` is the reader's time over their mean, and
``cpu_over_floor`` its CPU time (the pool's workers' included) over theirs: CPU time does not
depend on how many cores were idle, so it also tells how the read scales with cores.
``--per-dump N`` adds, on one core, the ways of reading N dumps (the restricted unpickler with
a 1 MiB buffer, ``load_dump``, a pool worker's whole task) as ratios to ``pickle.loads``.
``--instructions N`` counts, with valgrind's callgrind, the instructions per dump of
``pickle.loads``, ``load_dump`` and a worker's task over N dumps: a figure the machine's load
does not move (time here drifts by more than the differences between ways).

The job: a world group, tensor-parallel groups of 8 consecutive ranks, pipeline groups of
ranks ``r, r + world/pp, ...`` (point-to-point sends) and expert-parallel groups of 8 strided
ranks (all-to-all). Every step runs a TP all-reduce, an EP all-to-all, a PP send and a world
all-reduce; the ring has wrapped (sequence ids start near 100,000). Three faults in three TP
groups: a rank that never enqueues the last TP all-reduce, a rank that enters it with another
size, and a rank that wrote no dump. Their TP peers wait there and so never enqueue the last
world all-reduce, where every other rank waits: those peers are victims, not culprits. The
bench exits 1 unless exactly the three faulty ranks are named, with the right reasons.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import pickle
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PREFIX = "nccl_trace_rank_"
TP = 8
EP = 8
PP = 4
BASE_STEP = 25_000
"""Steps before the ring's window: sequence ids start near 100,000 (a wrapped ring)."""
TARGET_S = 5.0
TARGET_MB = 1024.0


def _layout(world: int) -> dict[str, Any]:
    """Which ranks fault, and how."""
    tp_groups = world // TP
    return {
        "skip": (tp_groups // 5) * TP + 3,
        "mismatch": (2 * tp_groups // 5) * TP + 5,
        "no_dump": (3 * tp_groups // 5) * TP + 1,
    }


def _groups(rank: int, world: int) -> dict[str, tuple[str, str, list[int], int]]:
    """role -> (name, desc, ranks, local pg_id) of ``rank``'s groups."""
    tp = rank // TP
    pp_stride = world // PP
    pp = rank % pp_stride
    ep_block = (rank // (TP * EP)) * TP * EP
    ep_lane = rank % TP
    ep_ranks = [
        ep_block + ep_lane + TP * i for i in range(EP) if ep_block + ep_lane + TP * i < world
    ]
    n_tp = world // TP
    n_pp = pp_stride
    return {
        "world": ("0", "default_pg", list(range(world)), 0),
        "tp": (str(1 + tp), f"tp_{tp}", list(range(tp * TP, tp * TP + TP)), 1),
        "pp": (str(1 + n_tp + pp), f"pp_{pp}", list(range(pp, world, pp_stride)), 2),
        "ep": (
            str(1 + n_tp + n_pp + ep_block // TP + ep_lane),
            f"ep_{ep_block}_{ep_lane}",
            ep_ranks,
            3,
        ),
    }


def _frames(op: str, n: int) -> list[dict[str, Any]]:
    """A stack of ``n`` frames (shared dicts: pickled once, then referenced)."""
    return [
        {"name": f"{op}_{i}", "filename": f"/opt/train/model/layer_{i}.py", "line": 100 + i}
        for i in range(n)
    ]


def make_dump(rank: int, world: int, entries: int, frames: int) -> dict[str, Any] | None:
    """Rank ``rank``'s dump, or None for the rank that writes none."""
    faults = _layout(world)
    if rank == faults["no_dump"]:
        return None
    groups = _groups(rank, world)
    stacks = {op: _frames(op, frames) for op in ("all_reduce", "all_to_all", "send", "barrier")}
    affected = {r // TP for r in faults.values()}
    in_faulty_tp = rank // TP in affected
    steps = entries // 4
    seq = {role: BASE_STEP for role in groups}
    out: list[dict[str, Any]] = []
    schedule = (
        ("tp", "nccl:all_reduce", [[4096, 1024]], "all_reduce", False),
        ("ep", "nccl:all_to_all", [[2048, 512]], "all_to_all", False),
        ("pp", "nccl:send 0->1", [[1024, 1024]], "send", True),
        ("world", "nccl:all_reduce", [[64]], "all_reduce", False),
    )
    status: dict[str, dict[str, int]] = {}
    record = BASE_STEP * 4
    last = steps - 1
    for step in range(steps):
        for role, op, shape, stack, p2p in schedule:
            final = step == last
            if final and role == "tp" and rank == faults["skip"]:
                continue  # never enqueues the last TP all-reduce
            if final and role == "world" and in_faulty_tp:
                continue  # waits in its TP group: never reaches the world all-reduce
            seq[role] += 1
            done = not final or (role in ("ep", "pp"))
            if final and role == "tp" and not in_faulty_tp:
                done = True
            sizes = shape
            if final and role == "tp" and rank == faults["mismatch"]:
                sizes = [[4096, 512]]
            name, desc, _, pg_id = groups[role]
            out.append(
                {
                    "record_id": record,
                    "pg_id": pg_id,
                    "process_group": (name, desc),
                    "collective_seq_id": 0 if p2p else seq[role],
                    "p2p_seq_id": seq[role] if p2p else 0,
                    "op_id": seq[role],
                    "profiling_name": op,
                    "time_created_ns": 1_790_000_000_000_000_000 + record * 1000,
                    "input_sizes": sizes,
                    "input_dtypes": ["BFloat16"],
                    "output_sizes": sizes,
                    "output_dtypes": ["BFloat16"],
                    "state": "completed" if done else "started",
                    "time_discovered_started_ns": 1_790_000_000_000_000_000 + record * 1000 + 5,
                    "time_discovered_completed_ns": (
                        1_790_000_000_000_000_000 + record * 1000 + 9 if done else None
                    ),
                    "retired": done,
                    "timeout_ms": 600_000,
                    "is_p2p": p2p,
                    "thread_id": "140000000000000",
                    "thread_name": "pt_main_thread",
                    "frames": stacks[stack],
                }
            )
            record += 1
            if not p2p:
                s = status.setdefault(
                    str(pg_id),
                    {
                        "last_enqueued_collective": -1,
                        "last_started_collective": -1,
                        "last_completed_collective": -1,
                    },
                )
                s["last_enqueued_collective"] = seq[role]
                s["last_started_collective"] = seq[role]
                if done:
                    s["last_completed_collective"] = seq[role]
    return {
        "version": "2.9",
        "pg_config": {
            name: {"name": name, "desc": desc, "ranks": str(ranks)}
            for name, desc, ranks, _ in groups.values()
        },
        "comm_lib_version": "2.21.5",
        "pg_status": status,
        "entries": out,
    }


def _write(args: tuple[Path, int, int, int, int, int]) -> int:
    directory, first, last, world, entries, frames = args
    size = 0
    for rank in range(first, last):
        dump = make_dump(rank, world, entries, frames)
        if dump is None:
            continue
        data = pickle.dumps(dump, protocol=2)
        (directory / f"{PREFIX}{rank}").write_bytes(data)
        size += len(data)
    return size


def write_job(directory: Path, world: int, entries: int, frames: int, workers: int) -> int:
    """Write the job's dumps; returns their total size in bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    chunk = max(1, world // (8 * workers))
    jobs = [
        (directory, a, min(world, a + chunk), world, entries, frames)
        for a in range(0, world, chunk)
    ]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return sum(pool.map(_write, jobs))
    return sum(_write(job) for job in jobs)


def expected(world: int) -> dict[int, str]:
    faults = _layout(world)
    return {
        faults["skip"]: "not_joined",
        faults["mismatch"]: "mismatch",
        faults["no_dump"]: "no_dump",
    }


def _cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children (a pool's workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(directory: Path, workers: int) -> dict[str, Any]:
    """In this (fresh) process: read + summarise + analyse ``directory``."""
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    began = time.perf_counter()
    from collectors.flight_recorder import read_dump_dir  # noqa: PLC0415
    from detectors.hangs import analyze  # noqa: PLC0415

    # the floor's clock starts after its imports too: read_s compares with it
    import_s = time.perf_counter() - began
    cpu = _cpu_s()
    started = time.perf_counter()
    summaries = read_dump_dir(directory, PREFIX, workers=workers)
    read_s = time.perf_counter() - started
    read_cpu_s = _cpu_s() - cpu
    t = time.perf_counter()
    analysis = analyze(summaries)
    analyse_s = time.perf_counter() - t
    return {
        "read_s": read_s,
        "read_cpu_s": read_cpu_s,
        "analyse_s": analyse_s,
        "import_s": import_s,
        "total_s": time.perf_counter() - began,
        "summaries": len(summaries),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_at_start_mb": base_rss,
        "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "culprits": {str(c.rank): c.reason.value for c in analysis.culprits},
        "hung": analysis.hung,
    }


def _unpickle_only(path: str) -> None:
    """The floor's work on one dump: read it, unpickle it with the plain C unpickler, free it."""
    with open(path, "rb") as f:
        pickle.loads(f.read())  # the bench's own files, written by this script


def measure_floor(directory: Path, workers: int) -> dict[str, Any]:
    """In this (fresh) process: the least any Python reader of these dumps pays, in the same
    pool as :func:`measure` (same workers, same chunks, collector off in the workers): read
    and unpickle every dump with ``pickle.loads`` and free it, with no restriction, no
    summary and no result. The figures are then read as ratios to it: the machine is shared
    and its speed varies by 2-3x from hour to hour."""
    from collectors.flight_recorder import PARALLEL_FROM, pool_chunksize  # noqa: PLC0415

    paths = sorted(str(p) for p in directory.iterdir() if p.name.startswith(PREFIX))
    cpu = _cpu_s()
    started = time.perf_counter()
    if workers > 1 and len(paths) >= PARALLEL_FROM:
        chunk = pool_chunksize(len(paths), workers)
        with ProcessPoolExecutor(max_workers=workers, initializer=gc.disable) as pool:
            for _ in pool.map(_unpickle_only, paths, chunksize=chunk):
                pass
    else:
        enabled = gc.isenabled()
        gc.disable()
        for path in paths:
            _unpickle_only(path)
        if enabled:
            gc.enable()
    return {
        "floor_s": time.perf_counter() - started,
        "floor_cpu_s": _cpu_s() - cpu,
        "dumps": len(paths),
    }


def measure_interleaved(directory: Path, workers: int, turns: int) -> dict[str, Any]:
    """In this (fresh) process: the reader (``read_dump_dir``, as ``minder hang analyze``
    calls it) and the floor (:func:`measure_floor`) take turns over ``turns`` slices of the
    dumps, each slice read by both, the order swapped every other turn, so that the machine's
    drift falls on both alike. Each slice is a directory of links to its dumps. With a pool
    (``workers`` > 1), fewer turns are taken where ``turns`` would leave a slice too small for
    the pool (:data:`~collectors.flight_recorder.PARALLEL_FROM` dumps)."""
    from collectors.flight_recorder import PARALLEL_FROM, read_dump_dir  # noqa: PLC0415

    paths = sorted(p for p in directory.iterdir() if p.name.startswith(PREFIX))
    most = len(paths) // PARALLEL_FROM if workers > 1 else len(paths)
    taken = max(1, min(turns, most))
    bounds = [round(i * len(paths) / taken) for i in range(taken + 1)]
    spent = {"reader": [0.0, 0.0], "floor": [0.0, 0.0]}  # wall, CPU
    summaries = 0
    with tempfile.TemporaryDirectory(prefix="hang-bench-turns-") as links:
        for turn in range(taken):
            part = Path(links) / str(turn)
            part.mkdir()
            for path in paths[bounds[turn] : bounds[turn + 1]]:
                (part / path.name).symlink_to(path.resolve())
            order = ("reader", "floor") if turn % 2 == 0 else ("floor", "reader")
            for way in order:
                cpu = _cpu_s()
                started = time.perf_counter()
                if way == "reader":
                    summaries += len(read_dump_dir(part, PREFIX, workers=workers))
                else:
                    measure_floor(part, workers)
                spent[way][0] += time.perf_counter() - started
                spent[way][1] += _cpu_s() - cpu
    return {
        "turns": taken,
        "smallest_slice": min(b - a for a, b in itertools.pairwise(bounds)),
        "summaries": summaries,
        "reader_s": spent["reader"][0],
        "reader_cpu_s": spent["reader"][1],
        "floor_s": spent["floor"][0],
        "floor_cpu_s": spent["floor"][1],
        "read_over_floor": spent["reader"][0] / spent["floor"][0],
        "cpu_over_floor": spent["reader"][1] / spent["floor"][1],
    }


WAYS = ("loads", "buffer_1_mib", "load_dump", "worker_task")
"""The ways of reading one dump that ``--per-dump`` compares."""


def _over_loads(per_way: dict[str, float]) -> dict[str, float]:
    """Each way's figure as a ratio to ``pickle.loads``'s; {} when loads was not measured."""
    loads = per_way.get("loads")
    return {k: round(v / loads, 3) for k, v in per_way.items()} if loads else {}


def measure_per_dump(directory: Path, count: int, only: str | None = None) -> dict[str, Any]:
    """In this (fresh) process, on one core: each way of reading ``count`` distinct dumps, as a
    ratio to ``pickle.loads`` of the same bytes. The ways take turns 20 dumps at a time (the
    order reversed every other turn), so that the machine's drift falls on all alike; every
    dump's bytes are read afresh (the page cache warm), as the reader does. With ``only``, that
    way alone (what :func:`measure_instructions` counts)."""
    import io  # noqa: PLC0415

    from collectors import flight_recorder as fr  # noqa: PLC0415

    def loads(path: str) -> None:
        _unpickle_only(path)

    def buffer_1_mib(path: str) -> None:
        """The restricted unpickler through a 1 MiB buffered reader (the reader before
        2026-11-30)."""
        with open(path, "rb") as f:
            data = f.read()
        fr.RestrictedUnpickler(io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)).load()

    def load_dump(path: str) -> None:
        fr.load_dump(path)

    def worker_task(path: str) -> None:
        """What a pool worker does per dump: load, summarise, pickle the result."""
        pickle.dumps(fr._read_one((path, PREFIX)))

    every = (loads, buffer_1_mib, load_dump, worker_task)
    ways = tuple(w for w in every if only in (None, w.__name__))
    every_path = sorted(str(p) for p in directory.iterdir() if p.name.startswith(PREFIX))
    paths = every_path[:count]
    spent = dict.fromkeys((w.__name__ for w in ways), 0.0)
    gc.disable()
    # Each way once, uncounted, on the last dump (also when count is 0, so that a count over
    # none subtracts it): the caches a dump's first reading fills (the rank lists of
    # pg_config, about 1 ms for a world group of 4,096 ranks) are then filled, as they are
    # for all but a pool worker's first dump.
    for way in ways if every_path else ():
        way(every_path[-1])
    for turn, first in enumerate(range(0, len(paths), 20)):
        chunk = paths[first : first + 20]
        for way in ways if turn % 2 else ways[::-1]:
            t = time.perf_counter()
            for path in chunk:
                way(path)
            spent[way.__name__] += time.perf_counter() - t
    n = max(1, len(paths))
    return {
        "dumps": len(paths),
        "per_dump_ms": {k: round(v / n * 1e3, 3) for k, v in spent.items()},
        "over_loads": _over_loads(spent),
    }


_COLLECTED = re.compile(r"Collected : (\d+)")


def measure_instructions(
    directory: Path, count: int, ways: tuple[str, ...] = ("loads", "load_dump", "worker_task")
) -> dict[str, Any] | None:
    """Instructions per dump of ``pickle.loads``, ``load_dump`` and a pool worker's task, on
    one core, counted by valgrind's callgrind: unlike time, the count does not change with the
    machine's load or speed. Each way runs in its own process over ``count`` dumps and over
    none (its start-up and imports, subtracted), with one hash seed for all, so that the
    start-ups count alike to the instruction. None when valgrind is not installed."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    counts: dict[str, float] = {}
    for way in ways:
        collected = []
        for n in (0, count):
            child = subprocess.run(
                [
                    valgrind,
                    "--tool=callgrind",
                    "--callgrind-out-file=/dev/null",
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--measure-per-dump",
                    str(directory),
                    "--per-dump",
                    str(n),
                    "--only",
                    way,
                ],
                capture_output=True,
                text=True,
                check=False,
                env=env,
            )
            found = _COLLECTED.search(child.stderr)
            if child.returncode != 0 or found is None:
                sys.stderr.write(child.stderr[-3000:])
                return None
            collected.append(int(found.group(1)))
        counts[way] = (collected[1] - collected[0]) / max(1, count)
    return {
        "dumps": count,
        "per_dump": {k: round(v) for k, v in counts.items()},
        "over_loads": _over_loads(counts),
    }


def _child(directory: Path, workers: int, mode: str, *options: str) -> dict[str, Any] | None:
    child = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            mode,
            str(directory),
            "--workers",
            str(workers),
            *options,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        sys.stderr.write(child.stderr[-3000:])
        return None
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--dir", type=Path, default=None, help="write the dumps here (kept)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--per-dump",
        type=int,
        default=0,
        metavar="N",
        help="also compare ways of reading N dumps on one core, as ratios to pickle.loads",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="N",
        help="also count instructions per dump over N dumps (valgrind), as ratios to pickle.loads",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="K",
        help="also run the reader and the floor in turns over K slices of the dumps, in one "
        "process",
    )
    parser.add_argument("--measure-floor", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure-per-dump", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure-interleaved", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=WAYS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_per_dump is not None:
        print(json.dumps(measure_per_dump(args.measure_per_dump, args.per_dump, args.only)))
        return 0
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.workers)))
        return 0
    if args.measure_interleaved is not None:
        turns = measure_interleaved(args.measure_interleaved, args.workers, args.interleave)
        print(json.dumps(turns))
        return 0
    if args.measure_floor is not None:
        print(json.dumps(measure_floor(args.measure_floor, args.workers)))
        return 0
    if args.ranks % (TP * EP) or args.ranks < TP * EP or args.entries < 8:
        parser.error(f"--ranks {args.ranks}: expected a multiple of {TP * EP}; --entries >= 8")

    temp = None
    directory = args.dir
    if directory is None:
        temp = tempfile.mkdtemp(prefix="hang-bench-")
        directory = Path(temp)
    try:
        t = time.perf_counter()
        written = write_job(directory, args.ranks, args.entries, args.frames, args.workers)
        write_s = time.perf_counter() - t
        # The floor, then the reader, then the floor again: each in a fresh process, the
        # dumps in the page cache for all three; the floor is the mean of its two runs.
        floors = []
        floor_cpus = []
        result = None
        for mode in ("--measure-floor", "--measure", "--measure-floor"):
            out = _child(directory, args.workers, mode)
            if out is None:
                return 2
            if mode == "--measure":
                result = out
            else:
                floors.append(out["floor_s"])
                floor_cpus.append(out["floor_cpu_s"])
        assert result is not None
        floor_s = sum(floors) / len(floors)
        floor_cpu_s = sum(floor_cpus) / len(floor_cpus)
        per_dump = None
        if args.per_dump > 0:
            per_dump = _child(directory, 1, "--measure-per-dump", "--per-dump", str(args.per_dump))
            if per_dump is None:
                return 2
        interleaved = None
        if args.interleave > 0:
            interleaved = _child(
                directory,
                args.workers,
                "--measure-interleaved",
                "--interleave",
                str(args.interleave),
            )
            if interleaved is None:
                return 2
        instructions = None
        if args.instructions > 0:
            instructions = measure_instructions(directory, args.instructions)
            if instructions is None:
                sys.stderr.write("--instructions: valgrind is missing or failed\n")
                return 2
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)

    want = {str(r): reason for r, reason in expected(args.ranks).items()}
    correct = result["culprits"] == want
    report = {
        "ranks": args.ranks,
        "entries_per_rank": args.entries,
        "frames_per_entry": args.frames,
        "workers": args.workers,
        "dump_bytes_total": written,
        "dump_bytes_per_rank": written // max(1, result["summaries"]),
        "write_s": round(write_s, 2),
        "read_s": round(result["read_s"], 3),
        "analyse_s": round(result["analyse_s"], 3),
        "total_s": round(result["total_s"], 3),
        "floor_s": round(floor_s, 3),
        "floor_runs_s": [round(f, 3) for f in floors],
        "read_over_floor": round(result["read_s"] / floor_s, 3),
        "read_cpu_s": round(result["read_cpu_s"], 3),
        "floor_cpu_s": round(floor_cpu_s, 3),
        "cpu_over_floor": round(result["read_cpu_s"] / floor_cpu_s, 3),
        "read_cpu_ms_per_dump": round(result["read_cpu_s"] / max(1, result["summaries"]) * 1e3, 3),
        "import_s": round(result["import_s"], 3),
        "interleaved": interleaved,
        "per_dump": per_dump,
        "instructions": instructions,
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "worker_peak_rss_mb": round(result["worker_peak_rss_mb"], 1),
        "target_s": TARGET_S,
        "target_mb": TARGET_MB,
        "culprits": result["culprits"],
        "expected": want,
        "correct": correct,
    }
    if args.format == "json":
        print(json.dumps(report))
    else:
        rows = [
            ("ranks x entries", f"{args.ranks} x {args.entries} ({args.frames} frames each)"),
            ("dumps", f"{written / 2**20:.0f} MiB ({report['dump_bytes_per_rank']} B per rank)"),
            ("read + summarise", f"{report['read_s']:.2f} s ({args.workers} workers)"),
            (
                "unpickle floor",
                f"{report['floor_s']:.2f} s (pickle.loads of each dump, same pool; read + "
                f"summarise = {report['read_over_floor']:.2f}x it)",
            ),
            (
                "CPU",
                f"read + summarise {report['read_cpu_s']:.1f} s "
                f"({report['read_cpu_ms_per_dump']:.2f} ms per dump), floor "
                f"{report['floor_cpu_s']:.1f} s: {report['cpu_over_floor']:.2f}x",
            ),
            ("analyse", f"{report['analyse_s']:.3f} s"),
            *(
                [
                    (
                        "per dump, 1 core",
                        ", ".join(f"{k} {v:.2f}x" for k, v in per_dump["over_loads"].items())
                        + f" pickle.loads ({per_dump['dumps']} dumps)",
                    )
                ]
                if per_dump
                else []
            ),
            *(
                [
                    (
                        "in turns",
                        f"reader {interleaved['read_over_floor']:.2f}x the floor's time, "
                        f"{interleaved['cpu_over_floor']:.2f}x its CPU "
                        f"({interleaved['turns']} turns, one process)",
                    )
                ]
                if interleaved
                else []
            ),
            *(
                [
                    (
                        "instructions",
                        ", ".join(
                            f"{k} {v / 1e6:.1f} M ({instructions['over_loads'][k]:.2f}x)"
                            for k, v in instructions["per_dump"].items()
                        )
                        + f" per dump ({instructions['dumps']} dumps, valgrind)",
                    )
                ]
                if instructions
                else []
            ),
            ("total", f"{report['total_s']:.2f} s (target < {TARGET_S:.0f} s)"),
            (
                "peak RSS",
                f"{report['peak_rss_mb']:.0f} MB main, "
                f"{report['worker_peak_rss_mb']:.0f} MB largest worker (target < {TARGET_MB:.0f})",
            ),
            ("culprits", ", ".join(f"{r}:{v}" for r, v in sorted(result["culprits"].items()))),
            ("correct", "yes" if correct else f"NO (expected {want})"),
        ]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
