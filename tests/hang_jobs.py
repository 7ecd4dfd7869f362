"""Real hung torch.distributed jobs and their flight-recorder dumps (for the hang tests).

Each :class:`HangCase` is a small gloo job on CPU (4 to 8 ranks: processes forked by one
launcher running the worker script, so torch is imported once per job) with the flight
recorder on (``TORCH_FR_BUFFER_SIZE=2000`` in the ranks' environment). Every rank runs a dozen
collectives on the world group and half as many on each of its subgroups, meets the others at
a world barrier, and then one fault is injected: a rank skips a collective, holds the GIL in a
C call, is killed with SIGKILL, or enters the collective with another tensor size. Each rank
that can still run Python writes its dump once the collective it waits in is enqueued:
``<case>/pickle/<prefix><rank>`` (the bytes of ``torch._C._distributed_c10d._dump_fr_trace()``)
and ``<case>/json/<prefix><rank>`` (of ``_dump_fr_trace_json()``), each written to a temporary
name and renamed. The harness then kills the launcher's whole session; nothing outlives
:func:`run_case`. All six cases take about 40 s on two cores.

How the dumps are taken, and why (torch 2.13, CPU):

- Gloo writes no dump by itself: with ``TORCH_FR_DUMP_TEMP_FILE`` set, a collective that times
  out raises ``Timed out waiting ... for recv operation`` and no file appears (the automatic
  dump on timeout belongs to the NCCL watchdog). So each rank starts a Python thread that
  dumps, as a job's own watchdog hook would.
- Gloo notices a dead peer at once (``Connection closed by peer``) and fails the collective,
  which then counts as completed in ``pg_status``; a timeout does the same. An NCCL job would
  hang instead. So the dumps are taken while every rank still waits, and the harness sends
  SIGKILL to the ``sigkill`` culprit only after the others have dumped; the culprit itself
  never dumps.
- A rank that sleeps in ``ctypes.PyDLL(None).sleep`` (libc's ``sleep``, called without
  releasing the GIL) cannot run its dump thread: the harness checks that it is still alive and
  has written nothing well after the others dumped.
- Gloo checks only that a peer sends no more bytes than expected: a rank that all-reduces a
  larger tensor makes a peer abort (``Received data size doesn't match expected size``); one
  that all-reduces a smaller tensor completes at once, with its peers left waiting. The
  ``size`` case uses the smaller tensor, so every rank dumps and the dumps show the mismatch.
- Gloo leaves every entry's ``state`` at ``scheduled``: completion shows in ``retired`` and
  in ``pg_status`` (keyed by the rank-local ``pg_id``, not by the group name that
  ``process_group[0]`` gives). Its ``pg_config`` has one entry keyed ``''`` whose ``ranks``
  are the world's only while no subgroup exists (``'[]'`` after ``new_group``). The workers
  therefore also write the groups they are in (``<case>/pg/<rank>.json``, merged into
  ``<case>/pg_config.json``), which :func:`nccl_style` uses to write the ``pg_config`` an NCCL
  build records, and without which PyTorch's own analyzer cannot read gloo dumps at all.
- Gloo sets ``last_completed_collective`` from completion callbacks that land late and can
  land out of order, leaving it for good below a collective already retired (seen here: 5
  with 6 retired, under load). Each rank waits after every collective until its
  ``pg_status`` has caught up, so every run's dumps show the same state.

:func:`fr_trace` runs PyTorch's analyzer (``torch.distributed.flight_recorder.fr_trace``) on a
dump directory and returns the ranks it names.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from minder.core.hang import CulpritReason

PREFIX = "nccl_trace_rank_"
"""Dump file names are ``<PREFIX><rank>``, as the recorder's default ``TORCH_FR_DUMP_TEMP_FILE``
(``/tmp/nccl_trace_rank_``) writes them."""
NCCL_VERSION = "2.9"
"""The dump format version :func:`nccl_style` writes."""
NCCL_LIB_VERSION = "2.21.5"
"""The ``comm_lib_version`` :func:`nccl_style` writes (gloo's dumps leave it empty)."""

WARMUP = 12
"""World all-reduces each rank runs before the fault (and half as many in each of its
subgroups), so that the dumps hold a history of completed collectives before the frontier."""

_WORKER = r"""
import ctypes, datetime, json, os, pickle, sys, threading, time, traceback
import torch
import torch.distributed as dist


def rank_main(spec):
    rank, world, role = spec["rank"], spec["world"], spec["role"]
    dist.init_process_group(
        "gloo", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=spec["gloo_timeout_s"]),
    )
    c10d = torch._C._distributed_c10d
    handles = {desc: dist.new_group(ranks, group_desc=desc) for desc, ranks in spec["groups"]}
    t = torch.ones(8)
    for _ in range(spec["warmup"]):
        dist.all_reduce(t)
        settle(c10d)
    for desc, ranks in spec["groups"]:
        if rank in ranks:
            for _ in range(spec["warmup"] // 2):
                dist.all_reduce(t, group=handles[desc])
                settle(c10d)
    dist.barrier()
    settle(c10d)

    roster = {"0": {"desc": "default_pg", "ranks": list(range(world))}}
    for desc, ranks in spec["groups"]:
        if rank in ranks:
            roster[handles[desc].group_name] = {"desc": desc, "ranks": ranks}
    write(spec, spec["pg_dir"], json.dumps({"pid": os.getpid(), "groups": roster}).encode())

    def enqueued():
        status = pickle.loads(c10d._dump_fr_trace(False, False, False))["pg_status"]
        return sum(int(s["last_enqueued_collective"]) for s in status.values())

    before = enqueued()
    joins = role in ("wait", "size")
    ready = threading.Event()

    def dumper():
        ready.wait()
        give_up = time.monotonic() + spec["gloo_timeout_s"] / 2
        while joins and enqueued() <= before and time.monotonic() < give_up:
            time.sleep(0.02)
        time.sleep(spec["grace_s"])
        if role == "size":
            settle(c10d)
        raw, text = c10d._dump_fr_trace(), c10d._dump_fr_trace_json()
        write(spec, spec["json_dir"], text)
        write(spec, spec["pickle_dir"], raw)

    if role != "die":
        threading.Thread(target=dumper, daemon=True).start()
    group = handles[spec["hang_group"]] if spec["hang_group"] else None
    ready.set()
    if role == "wait":
        dist.all_reduce(t, group=group)
    elif role == "size":
        dist.all_reduce(torch.ones(4), group=group)
    elif role == "gil":
        ctypes.PyDLL(None).sleep(int(spec["gil_s"]))
    while True:
        time.sleep(60)


def settle(c10d):
    # Gloo sets pg_status' last_completed from completion callbacks that land late and can
    # land out of order (a late one for seq n after the one for n + 1 leaves n for good): wait
    # after each collective until every group's last completed is its last enqueued, so no
    # callback is pending when the next one starts and the dumps always show the same state.
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        status = pickle.loads(c10d._dump_fr_trace(False, False, False))["pg_status"].values()
        if all(
            s["last_completed_collective"] == s["last_enqueued_collective"] for s in status
        ):
            return
        time.sleep(0.01)
    raise RuntimeError(f"pg_status did not settle: {list(status)}")


def write(spec, directory, data):
    path = os.path.join(directory, spec["prefix"] + str(spec["rank"]))
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


# torch is imported once; each rank is a fork of this process (before any thread or
# process group exists), and this process reaps them, writing how each one ended.
specs = json.loads(sys.argv[1])
ranks = {}
for spec in specs:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            rank_main(spec)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    ranks[pid] = spec
while ranks:
    pid, status = os.wait()
    spec = ranks.pop(pid)
    spec["prefix"] = ""
    write(spec, spec["exit_dir"], str(os.waitstatus_to_exitcode(status)).encode())
"""

Role = str
"""What a rank does once the world barrier is passed: ``wait`` (enter the hung collective),
``skip`` (never enter it), ``gil`` (sleep in C holding the GIL), ``die`` (killed with SIGKILL,
no dump), ``size`` (enter it with another tensor size) or ``idle`` (nothing: its groups are
healthy)."""


class HarnessError(RuntimeError):
    """A job did not reach the state its case promises."""


@dataclass(frozen=True)
class HangCase:
    """One injected fault and what a correct analysis names.

    Attributes
    ----------
    culprits
        The ranks the hang waits on and why.
    groups
        Subgroups created on every rank, in order: ``(desc, ranks)``.
    hang_group
        The desc of the group whose collective hangs (empty: the world group; ``*``: each
        rank's own subgroup).
    roles
        Each rank's :data:`Role` that is not ``wait``.
    directory
        Where :func:`run_case` wrote the case (None before it ran).
    """

    name: str
    world: int
    culprits: Mapping[int, CulpritReason]
    description: str
    roles: Mapping[int, Role] = field(default_factory=dict)
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()
    hang_group: str = ""
    prefix: str = PREFIX
    directory: Path | None = None
    wall_s: float = 0.0

    def role(self, rank: int) -> Role:
        return self.roles.get(rank, "wait")

    @property
    def culprit_ranks(self) -> list[int]:
        return sorted(self.culprits)

    @property
    def dumping_ranks(self) -> list[int]:
        """Ranks that write a dump."""
        return [r for r in range(self.world) if self.role(r) not in ("gil", "die")]

    def _dir(self, name: str) -> Path:
        if self.directory is None:
            raise HarnessError(f"case {self.name} has not run")
        return self.directory / name

    @property
    def pickle_dir(self) -> Path:
        """``<prefix><rank>`` pickle dumps, as the recorder writes them."""
        return self._dir("pickle")

    @property
    def json_dir(self) -> Path:
        """``<prefix><rank>`` JSON dumps (``_dump_fr_trace_json``)."""
        return self._dir("json")

    @property
    def roster_path(self) -> Path:
        """Every group's name, desc and ranks, as the workers knew them."""
        return self._dir("pg_config.json")

    def nccl_dir(self, status_as: str = "int") -> Path:
        """The pickle dumps rewritten by :func:`nccl_style` (made on first use)."""
        out = self._dir(f"nccl_{status_as}")
        if not out.is_dir():
            nccl_style(self.pickle_dir, out, status_as=status_as, prefix=self.prefix)
        return out


_EP = (("ep_even", (0, 2, 4, 6)), ("ep_odd", (1, 3, 5, 7)))
_TP = (("tp_0", (0, 1, 2)), ("tp_1", (3, 4, 5)))

CASES: dict[str, HangCase] = {
    case.name: case
    for case in (
        HangCase(
            "skip",
            4,
            {1: CulpritReason.NOT_JOINED},
            "rank 1 skips a world all_reduce after the barrier; ranks 0, 2, 3 wait in it",
            roles={1: "skip"},
        ),
        HangCase(
            "gil",
            4,
            {2: CulpritReason.NO_DUMP},
            "rank 2 sleeps in libc holding the GIL instead of joining; its dump thread never runs",
            roles={2: "gil"},
        ),
        HangCase(
            "sigkill",
            4,
            {3: CulpritReason.NO_DUMP},
            "rank 3 never joins the all_reduce and is killed with SIGKILL; no dump from it",
            roles={3: "die"},
        ),
        HangCase(
            "size",
            4,
            {2: CulpritReason.MISMATCH},
            "rank 2 all-reduces 4 floats where ranks 0, 1, 3 all-reduce 8 (gloo completes it "
            "on rank 2 and leaves the others waiting)",
            roles={2: "size"},
        ),
        HangCase(
            "two_groups",
            8,
            {2: CulpritReason.NOT_JOINED, 5: CulpritReason.NOT_JOINED},
            "expert-parallel groups {0,2,4,6} and {1,3,5,7}: rank 2 skips its group's "
            "all_reduce and rank 5 its group's; the other six wait in theirs",
            roles={2: "skip", 5: "skip"},
            groups=_EP,
            hang_group="*",
        ),
        HangCase(
            "subgroup",
            6,
            {4: CulpritReason.NOT_JOINED},
            "groups {0,1,2} and {3,4,5}: rank 4 skips an all_reduce of {3,4,5}; ranks 3 and 5 "
            "wait in it; the world group and {0,1,2} completed everything",
            roles={0: "idle", 1: "idle", 2: "idle", 4: "skip"},
            groups=_TP,
            hang_group="tp_1",
        ),
    )
}
"""The cases, by name."""


def gloo_env() -> dict[str, str]:
    """The environment of a one-host gloo job's ranks, with the flight recorder on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return {
        **os.environ,
        "TORCH_FR_BUFFER_SIZE": "2000",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }


def _hang_group(case: HangCase, rank: int) -> str:
    if case.hang_group != "*":
        return case.hang_group
    return next(desc for desc, ranks in case.groups if rank in ranks)


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def run_case(
    name: str,
    directory: Path,
    *,
    timeout_s: float = 120.0,
    grace_s: float = 0.3,
    python: str = sys.executable,
) -> HangCase:
    """Run case ``name`` with its files under ``directory`` and return it with
    ``directory`` and ``wall_s`` set.

    One launcher process imports torch and forks the ranks (so torch is imported once per
    job, not once per rank); it runs in a session of its own, which is killed as a whole at
    the end. Raises :class:`HarnessError` (with the ranks' log tails) when a rank exits early,
    the dumps are not all there within ``timeout_s``, the GIL holder dumped, the killed rank
    did not die of SIGKILL, or the set of dumps is not the one the case promises.
    """
    if name not in CASES:
        raise KeyError(f"hang case {name!r}: expected one of {', '.join(CASES)}")
    case = CASES[name]
    started = time.monotonic()
    dirs = {d: directory / d for d in ("pickle", "json", "pg", "logs", "exits")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = gloo_env()
    specs = [
        {
            "rank": rank,
            "world": case.world,
            "role": case.role(rank),
            "groups": [[desc, list(ranks)] for desc, ranks in case.groups],
            "hang_group": _hang_group(case, rank),
            "prefix": case.prefix,
            "pickle_dir": str(dirs["pickle"]),
            "json_dir": str(dirs["json"]),
            "pg_dir": str(dirs["pg"]),
            "exit_dir": str(dirs["exits"]),
            "log": str(dirs["logs"] / f"rank{rank}.log"),
            "grace_s": grace_s,
            "gloo_timeout_s": timeout_s,
            "gil_s": int(timeout_s),
            "warmup": WARMUP,
        }
        for rank in range(case.world)
    ]

    def dumped(rank: int) -> bool:
        return (dirs["pickle"] / f"{case.prefix}{rank}").exists()

    def exits() -> dict[int, int]:
        return {int(p.name): int(p.read_text()) for p in dirs["exits"].iterdir()}

    def logs() -> str:
        return (
            "; ".join(
                f"rank {r}: {_tail(dirs['logs'] / f'rank{r}.log', 400)!r}"
                for r in range(case.world)
            )
            + f"; launcher: {_tail(dirs['logs'] / 'launcher.log', 400)!r}"
        )

    with open(dirs["logs"] / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(
            [python, "-c", _WORKER, json.dumps(specs)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = started + timeout_s
        expected = set(case.dumping_ranks)
        rosters: dict[int, dict[str, Any]] = {}
        while True:
            for rank in range(case.world):
                path = dirs["pg"] / f"{case.prefix}{rank}"
                if rank not in rosters and path.exists():
                    rosters[rank] = json.loads(path.read_text())
            done = {r for r in expected if dumped(r)}
            if done == expected and len(rosters) == case.world:
                break
            if exits() or launcher.poll() is not None:
                raise HarnessError(f"case {name}: ranks exited early {exits()}: {logs()}")
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"case {name}: dumps from {sorted(done)} of {sorted(expected)} after "
                    f"{timeout_s:.0f} s: {logs()}"
                )
            time.sleep(0.05)

        for rank in range(case.world):
            role = case.role(rank)
            if role == "gil":
                # Its dump thread was due ``grace_s`` after the barrier, like the others':
                # give it five times that more, then check it still runs and wrote nothing.
                time.sleep(max(1.0, 5 * grace_s))
                if rank in exits() or dumped(rank):
                    raise HarnessError(
                        f"case {name}: rank {rank} holding the GIL exited or dumped: {logs()}"
                    )
            elif role == "die":
                os.kill(int(rosters[rank]["pid"]), signal.SIGKILL)
                while rank not in exits() and time.monotonic() < deadline:
                    time.sleep(0.02)
                if exits().get(rank) != -signal.SIGKILL:
                    raise HarnessError(
                        f"case {name}: rank {rank} ended {exits().get(rank)}, not by SIGKILL"
                    )
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)

    ranks = sorted(_ranked(dirs["pickle"], case.prefix))
    if ranks != case.dumping_ranks:
        raise HarnessError(f"case {name}: dumps from {ranks}, expected {case.dumping_ranks}")
    roster: dict[str, Any] = {}
    for rank in range(case.world):
        roster.update(rosters[rank]["groups"])
    (directory / "pg_config.json").write_text(json.dumps(roster, indent=1, sort_keys=True))
    return replace(case, directory=directory, wall_s=time.monotonic() - started)


def load_dump(path: Path) -> dict[str, Any]:
    """A dump this harness wrote (pickle or JSON), as a dict. Only for files of this harness:
    it unpickles without restriction."""
    data = path.read_bytes()
    # Our own job's files: a plain unpickler is fine here (never for files from elsewhere).
    loaded = json.loads(data) if data[:1] == b"{" else pickle.loads(data)
    if not isinstance(loaded, dict):
        raise HarnessError(f"{path}: a dump of {type(loaded).__name__}, expected a dict")
    return loaded


def _ranked(directory: Path, prefix: str) -> dict[int, Path]:
    return {
        int(p.name[len(prefix) :]): p
        for p in directory.iterdir()
        if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()
    }


def nccl_style(
    src_dir: Path,
    dst_dir: Path,
    *,
    status_as: str = "int",
    version: str = NCCL_VERSION,
    prefix: str = PREFIX,
    roster: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Rewrite the gloo pickle dumps of ``src_dir`` as an NCCL build of PyTorch writes them.

    Per the flight recorder's documented format: ``version`` (``2.9``), ``comm_lib_version``
    (an NCCL version), ``pg_config`` keyed by group name with ``name``, ``desc`` and
    ``ranks`` (a string) for each group of the rank (``0``/``default_pg`` for the world),
    ``pg_status`` values as integers (``status_as="int"``) or as strings (``"str"``, as the
    JSON dumps and older releases give them), profiling names ``nccl:...``, and each retired
    entry's ``state`` ``completed`` with its ``time_discovered_completed_ns`` set (gloo
    leaves ``scheduled`` and None). Everything else, the frames included, stays as recorded.

    ``roster`` maps group names to ``{"desc", "ranks"}``; by default it is read from
    ``<src_dir>/../pg_config.json`` (what :func:`run_case` writes).
    """
    if status_as not in ("int", "str"):
        raise ValueError(f"status_as is {status_as!r}: expected 'int' or 'str'")
    if roster is None:
        roster = json.loads((src_dir.parent / "pg_config.json").read_text())
    dst_dir.mkdir(parents=True, exist_ok=True)
    for rank, path in sorted(_ranked(src_dir, prefix).items()):
        dump = load_dump(path)
        dump["version"] = version
        dump["comm_lib_version"] = NCCL_LIB_VERSION
        dump["pg_config"] = {
            name: {"name": name, "desc": str(g["desc"]), "ranks": str(list(g["ranks"]))}
            for name, g in sorted(roster.items())
            if rank in g["ranks"]
        }
        dump["pg_status"] = {
            pg: {k: (int(v) if status_as == "int" else str(int(v))) for k, v in status.items()}
            for pg, status in dump["pg_status"].items()
        }
        for entry in dump["entries"]:
            entry["profiling_name"] = re.sub(r"^gloo:", "nccl:", entry["profiling_name"])
            if entry.get("retired"):
                entry["state"] = "completed"
                entry["time_discovered_completed_ns"] = entry["time_created_ns"]
        (dst_dir / path.name).write_bytes(pickle.dumps(dump))


@dataclass(frozen=True)
class FrTraceVerdict:
    """What ``torch.distributed.flight_recorder.fr_trace`` said about a dump directory.

    Attributes
    ----------
    missing
        Ranks it lists as ``missing ranks`` of a collective not every rank joined.
    culprits
        Ranks it names as ``Culprit rank N`` of a mismatched collective.
    no_dump
        Ranks whose dump it lacked where it could not decide (``missed FR dumps from ranks``).
    """

    returncode: int
    output: str
    missing: frozenset[int] = frozenset()
    culprits: frozenset[int] = frozenset()
    no_dump: frozenset[int] = frozenset()

    @property
    def named(self) -> frozenset[int]:
        """Every rank it names."""
        return self.missing | self.culprits | self.no_dump


def _rank_sets(pattern: str, text: str) -> frozenset[int]:
    ranks: set[int] = set()
    for match in re.finditer(pattern, text):
        ranks.update(int(r) for r in re.findall(r"\d+", match.group(1)))
    return frozenset(ranks)


def fr_trace(
    directory: Path,
    prefix: str = PREFIX,
    *,
    extra: Sequence[str] = ("--allow-incomplete-ranks",),
    python: str = sys.executable,
    timeout_s: float = 120.0,
) -> FrTraceVerdict:
    """Run PyTorch's flight-recorder analyzer on ``directory`` and parse whom it names.

    The analyzer prints its findings (to stderr) rather than returning them; this reads
    ``missing ranks: {..}``, ``Culprit rank N`` and ``missed FR dumps from ranks ({..})``.
    """
    proc = subprocess.run(
        [
            python,
            "-m",
            "torch.distributed.flight_recorder.fr_trace",
            str(directory),
            "--prefix",
            prefix,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    out = proc.stdout + proc.stderr
    return FrTraceVerdict(
        returncode=proc.returncode,
        output=out,
        missing=_rank_sets(r"missing ranks: \{([\d, ]*)\}", out),
        culprits=_rank_sets(r"Culprit rank (\d+)", out),
        no_dump=_rank_sets(r"missed FR dumps from ranks \(\{([\d, ]*)\}\)", out),
    )


class HangDumps:
    """Runs each case at most once, on first request (the session fixture's value)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._done: dict[str, HangCase] = {}

    def __getitem__(self, name: str) -> HangCase:
        if name not in self._done:
            self._done[name] = run_case(name, self._root / name)
        return self._done[name]

    @property
    def ran(self) -> dict[str, HangCase]:
        """The cases run so far."""
        return dict(self._done)


if __name__ == "__main__":  # run every case, print where the dumps are and how long it took
    import tempfile

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="hangs-"))
    total = time.monotonic()
    for case_name in CASES:
        ran = run_case(case_name, root / case_name)
        print(f"{case_name}: {ran.wall_s:.1f} s -> {ran.directory}")
    print(f"all cases: {time.monotonic() - total:.1f} s")
