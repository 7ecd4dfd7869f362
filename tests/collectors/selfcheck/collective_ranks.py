"""Real gloo ranks of the collective self-check on this host, for its tests and for
``bench/selfcheck_collective.py``.

:func:`run_ranks` starts one launcher process (``python collective_ranks.py SPEC``) that imports
torch once, sets one thread per rank, and forks the ranks (before any thread or process group
exists). Each rank calls :func:`collectors.selfcheck.collective.run_collective_check` with the
launcher contract's variables (``MINDER_SELFCHECK_NODES``, ``..._SUSPECT``, ``..._NODE``,
``..._RANK``, ``..._WORLD``, ``..._MASTER`` on 127.0.0.1) and writes its ``CheckResult`` as JSON.

Rank ``r`` is node ``n<r>``; ``MINDER_SELFCHECK_NODES`` lists the suspect first, so NODES order is
not rank order (the check finds the suspect's rank by its all-gather of node names).

The slowdown is the test's own hook, not the product's: the slowed rank passes a ``compute``
step that wraps the default matmul (:func:`collectors.selfcheck.collective.matmul_step`):

* ``work`` (default): the matmul runs ``factor`` times per iteration (a CPU that is ``factor``
  times slower: real extra work, competing for this host's cores like the real thing);
* ``sleep``: the matmul runs once, then the rank sleeps ``factor - 1`` times the matmul's time;
* ``crash``: the matmul runs 20 times, then the step raises (a rank whose work crashes).

A ``missing`` rank is never started: its partners wait at the rendezvous.

:func:`run_checks` runs several checks in one launch: the launcher forks the largest world's
ranks once, and each rank calls ``run_collective_check`` once per check it belongs to (rank
``r`` belongs to the checks of a world above ``r``), in order. ``run_collective_check`` destroys
its process group and drops its TCP store before it returns, so it can be called again in the
same process. Each check has its own rendezvous port, picked by the check's rank 0 just before
the check (a port picked ahead could meanwhile be taken by a gloo connection of an earlier
check) and handed to the other ranks through a file. A rank whose check gave ``error`` stops:
a check that timed out may leave torch blocked in that process, so the launch's later checks
give no result from it (multi-check launches are for healthy and slowed checks).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RanksRun:
    """What one run of the ranks gave."""

    results: dict[int, dict[str, Any]]
    """Per started rank, its ``CheckResult.to_dict()`` plus ``wall_s`` (its call's wall time)."""
    wall_s: float
    """The launcher's wall time, from start to the last rank's exit; in a launch of several
    checks (:func:`run_checks`), from the previous check's last result (the first: from the
    launch's start) to this check's last result."""
    log: str
    """The tail of the ranks' output (for assertion messages)."""

    def suspect_result(self, suspect_rank: int) -> dict[str, Any]:
        return self.results[suspect_rank]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    world: int,
    directory: Path,
    *,
    suspect: int = 0,
    slow: int | None = None,
    factor: float = 3.0,
    mode: str = "work",
    missing: Sequence[int] = (),
    timeout_s: float = 60.0,
    options: dict[str, Any] | None = None,
    python: str = sys.executable,
) -> RanksRun:
    """Run a ``world``-rank collective check on 127.0.0.1 and return every started rank's result.

    Parameters
    ----------
    suspect
        The suspect's rank.
    slow, factor, mode
        The rank slowed ``factor`` times by ``mode`` (``work`` or ``sleep``), or None.
    missing
        Ranks never started.
    timeout_s
        The check's ``timeout_s``; the launcher is killed 60 s after it.
    options
        Keyword arguments of :class:`~collectors.selfcheck.collective.CollectiveOptions`.
    """
    check = CheckSpec(world, suspect=suspect, slow=slow, factor=factor, mode=mode)
    (run,) = run_checks(
        [check],
        directory,
        missing=missing,
        timeout_s=timeout_s,
        options=options,
        python=python,
    )
    return run


@dataclass(frozen=True)
class CheckSpec:
    """One check of :func:`run_checks`: its world, suspect's rank and slowed rank (or None)."""

    world: int
    suspect: int = 0
    slow: int | None = None
    factor: float = 3.0
    mode: str = "work"


def run_checks(
    checks: Sequence[CheckSpec],
    directory: Path,
    *,
    missing: Sequence[int] = (),
    timeout_s: float = 60.0,
    options: dict[str, Any] | None = None,
    python: str = sys.executable,
) -> list[RanksRun]:
    """Run ``checks`` one after another in one launch (one torch import, one fork per rank),
    and return each check's :class:`RanksRun` in order.

    ``timeout_s`` is each check's ``timeout_s``; the launcher is killed 60 s after the sum of
    them. With one check, its ``wall_s`` is the launcher's; with several, see
    :attr:`RanksRun.wall_s` (the launch's wall time is their sum).
    """
    directory.mkdir(parents=True, exist_ok=True)
    for pattern in ("check*.json", "check*.port"):
        for old in directory.glob(pattern):
            old.unlink()
    spec = {
        "checks": [
            {
                "world": c.world,
                "suspect": c.suspect,
                "slow": c.slow,
                "factor": c.factor,
                "mode": c.mode,
            }
            for c in checks
        ],
        "missing": list(missing),
        "timeout_s": timeout_s,
        "options": options or {},
        "out": str(directory),
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log_path = directory / "ranks.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(
            [python, str(HERE / "collective_ranks.py"), json.dumps(spec)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        launcher.wait(timeout=timeout_s * len(checks) + 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    wall_s = time.monotonic() - started
    log_tail = log_path.read_text(errors="replace")[-3000:]
    runs = []
    previous = started
    for index in range(len(checks)):
        results = {
            int(p.stem.rpartition(".rank")[2]): json.loads(p.read_text())
            for p in sorted(directory.glob(f"check{index}.rank*.json"))
        }
        # CLOCK_MONOTONIC is the host's: the ranks' readings compare with this process's
        done = max((r.pop("done_at") for r in results.values()), default=started + wall_s)
        check_s = wall_s if len(checks) == 1 else max(0.0, done - previous)
        previous = max(previous, done)
        runs.append(RanksRun(results, check_s, log_tail))
    return runs


def _rank_env(spec: dict[str, Any], check: dict[str, Any], rank: int) -> dict[str, str]:
    world, suspect = check["world"], check["suspect"]
    names = [f"n{r}" for r in range(world)]
    order = [names[suspect]] + [n for r, n in enumerate(names) if r != suspect]
    return {
        "MINDER_SELFCHECK_NODES": ",".join(order),
        "MINDER_SELFCHECK_SUSPECT": names[suspect],
        "MINDER_SELFCHECK_NODE": names[rank],
        "MINDER_SELFCHECK_RANK": str(rank),
        "MINDER_SELFCHECK_WORLD": str(world),
        "MINDER_SELFCHECK_MASTER": f"127.0.0.1:{check['port']}",
        "MINDER_SELFCHECK_TIMEOUT_S": str(spec["timeout_s"]),
    }


def _compute_step(check: dict[str, Any], options: Any) -> Callable[[], None]:
    """The slowed rank's compute step (see the module's docstring)."""
    from collectors.selfcheck.collective import matmul_step

    inner = matmul_step(options.matmul_dim or 128)
    factor = float(check["factor"])
    if check["mode"] == "work":
        whole, part = int(factor), factor - int(factor)
        if part:
            raise ValueError(f"work mode needs a whole factor, got {factor}")

        def work() -> None:
            for _ in range(whole):
                inner()

        return work
    if check["mode"] == "crash":
        calls = [0]

        def crash() -> None:
            calls[0] += 1
            if calls[0] > 20:
                raise RuntimeError("the test's compute step crashed")
            inner()

        return crash

    def sleep() -> None:
        t0 = time.perf_counter()
        inner()
        time.sleep((factor - 1) * (time.perf_counter() - t0))

    return sleep


def _port(spec: dict[str, Any], index: int, leader: bool) -> int:
    """Check ``index``'s rendezvous port: picked by its rank 0 now, read by the others."""
    path = Path(spec["out"]) / f"check{index}.port"
    if leader:
        port = free_port()
        path.with_suffix(".tmp").write_text(str(port))
        path.with_suffix(".tmp").replace(path)
        return port
    deadline = time.monotonic() + float(spec["timeout_s"])
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"check {index}: rank 0 gave no rendezvous port")
        time.sleep(0.005)
    return int(path.read_text())


def _rank_main(spec: dict[str, Any], rank: int) -> None:
    from collectors.selfcheck.collective import CollectiveOptions, run_collective_check

    options = CollectiveOptions(**spec["options"])
    ranks = range(max(c["world"] for c in spec["checks"]))
    leader = min(r for r in ranks if r not in spec["missing"])
    for index, planned in enumerate(spec["checks"]):
        if rank >= planned["world"]:
            continue
        check = {**planned, "port": _port(spec, index, rank == leader)}
        compute = _compute_step(check, options) if rank == check["slow"] else None
        t0 = time.monotonic()
        result = run_collective_check(
            _rank_env(spec, check, rank),
            timeout_s=spec["timeout_s"],
            options=options,
            compute=compute,
        )
        t1 = time.monotonic()
        out = {**result.to_dict(), "wall_s": t1 - t0, "done_at": t1}
        path = Path(spec["out"]) / f"check{index}.rank{rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(out))
        path.with_suffix(".tmp").replace(path)
        if out["status"] == "error":
            return


def _launch(spec: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(1)
    import collectors.selfcheck.collective  # noqa: F401 (imported once, before the forks)

    children: dict[int, int] = {}
    for rank in range(max(c["world"] for c in spec["checks"])):
        if rank in spec["missing"]:
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _rank_main(spec, rank)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    while children:
        pid, status = os.wait()
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code:
            print(f"rank {rank} exited {code}", flush=True)


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))


__all__ = ["CheckSpec", "RanksRun", "free_port", "run_checks", "run_ranks"]
