"""Importer of PyTorch profiler (Kineto) traces of every rank of a job.

Each rank's trace (JSON, optionally gzipped) is turned into canonical ops:

* GPU kernels are assigned to a step by the ``ProfilerStep#N`` annotation around their launch
  (the ``cuda_runtime`` call with the same correlation id), and to a phase by the CPU op around
  the launch: ``Optimizer.step…``/``## optimizer ##`` → optimizer, ``autograd::engine::
  evaluate_function…`` → backward, else forward.
* NCCL kernels (``ncclKernel_*`` or ``ncclDevKernel_*``) are collectives; the collective's name,
  process group and sequence number come from the kernel's args, else from the
  ``record_param_comms``/``nccl:*`` CPU ops around the launch, else from the kernel name.
  Point-to-point send/recv become the four p2p op types by phase; all-gather →
  ``params-all-gather``; reduce-scatter → ``grads-reduce-scatter``; all-reduce →
  ``optimizer-clip-main-grad`` in the optimizer phase, ``separate-grads-all-reduce`` in backward;
  all-to-all → ``all-to-all`` (a ``SendRecv`` kernel without a direction on a job of one stage is
  an all-to-all too: NCCL runs all-to-all as grouped send/recv). Other collectives (broadcast,
  forward-phase all-reduce such as tensor parallelism) stay inside compute, as in the what-if
  paper's model.
* Consecutive compute kernels of one phase between two collectives form one compute op
  (``forward-compute``, ``backward-compute`` or ``optimizer``). It starts at its first kernel and
  lasts as long as its kernels kept the GPU busy (the union of their intervals): GPU idle time
  inside the run, when the CPU launched the next kernel late, is not work; the dependency model
  sees it as launch delay of the op after it (``docs/whatif-method.md`` §2.7).

Collectives are matched across ranks by process group and sequence number when the trace records
them (``record_param_comms`` args of newer PyTorch), else by (step, process group, order in the
group), else by (step, collective kind, order among that kind); a mismatch (a rank ran a different
collective, or sends and recvs of a two-rank group do not pair up) is refused. Each matched
collective gives every rank's arrival (its kernel's start): who came last, by how much, whether
its launch was already late (CPU side), and how long the others waited. With the step length, the
GPU busy time (non-NCCL kernels) and the NCCL time per rank and step, these form
``Trace.rank_stats``.

Ranks map to (dp_rank, stage) by Megatron's order (TP fastest, then context parallel, then DP,
then PP) when a meta is given; only TP/CP rank 0 of each worker is kept. Without a meta the ranks
present are taken as the DP ranks of a single stage.
"""

from __future__ import annotations

import gzip
import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from minder.core.errors import TraceError
from whatif import optypes
from whatif.trace import COLUMNS, RANK_STATS_COLUMNS, JobMeta, Trace, normalize_ops

logger = logging.getLogger(__name__)

NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

FORWARD, BACKWARD, OPTIMIZER_PHASE = "forward", "backward", "optimizer"

ARRIVAL_TOLERANCE_S = 50e-6
"""A rank that reaches a collective less than 50 µs after the second-latest is not "last"."""

_OP_COLUMNS = [
    "step",
    "optype",
    "start_ts",
    "duration",
    "pg",
    "collective",
    "pg_known",
    "seqnum",
    "launch_ts",
    "enqueue_ts",
]
"""One rank's ops before the layout is known; the last six describe collectives."""


@dataclass
class RankOps:
    """The ops of one rank before the layout is known.

    ``ops`` has the columns of :data:`_OP_COLUMNS` (seconds); ``steps`` has per step the step
    length, GPU busy time and NCCL time (``step, step_s, busy_s, nccl_s``).
    """

    rank: int
    world_size: int
    source: str
    ops: pd.DataFrame
    steps: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def read_json(path: Path) -> dict[str, Any]:
    """Read a (gzipped) JSON trace file."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError, EOFError) as exc:
        raise TraceError(f"cannot read a Kineto JSON trace: {exc}", where=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError("not a Kineto trace: no 'traceEvents' list", where=str(path))
    return data


class _Intervals:
    """CPU intervals per thread, for "which op encloses this launch" queries.

    Ops on one thread nest like a call stack; each interval keeps its parent (the nearest
    interval that encloses it), so the innermost interval around a time is found by a binary
    search and a short climb.
    """

    def __init__(self) -> None:
        self._raw: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
        self._index: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def add(self, tid: object, start: float, end: float, payload: int) -> None:
        self._raw[str(tid)].append((start, end, payload))

    def freeze(self) -> None:
        for tid, rows in self._raw.items():
            rows.sort(key=lambda r: (r[0], -r[1]))  # an enclosing op before the ops inside it
            starts = np.array([r[0] for r in rows])
            ends = np.array([r[1] for r in rows])
            payload = np.array([r[2] for r in rows], dtype=np.int64)
            parent = np.full(len(rows), -1, dtype=np.int64)
            stack: list[int] = []
            for k in range(len(rows)):
                while stack and ends[stack[-1]] < starts[k]:
                    stack.pop()
                parent[k] = stack[-1] if stack else -1
                stack.append(k)
            self._index[tid] = (starts, ends, payload, parent)

    def innermost(self, tid: object, ts: np.ndarray) -> np.ndarray:
        """Per time: the innermost enclosing interval on ``tid`` (index, −1 for none)."""
        key = str(tid)
        if key not in self._index or not len(ts):
            return np.full(len(ts), -1, dtype=np.int64)
        starts, ends, _, parent = self._index[key]
        idx = np.searchsorted(starts, ts, side="right") - 1
        while True:
            outside = (idx >= 0) & (ends[np.maximum(idx, 0)] < ts)
            if not outside.any():
                return idx
            idx[outside] = parent[idx[outside]]

    def payloads(self, tid: object, index: int) -> list[int]:
        """Payloads of interval ``index`` on ``tid`` and of every interval enclosing it."""
        _, _, payload, parent = self._index[str(tid)]
        chain = []
        while index >= 0:
            chain.append(int(payload[index]))
            index = int(parent[index])
        return chain

    def find(self, tid: object, ts: np.ndarray) -> np.ndarray:
        """Per time: the payload of the innermost enclosing interval on ``tid`` (−1 for none)."""
        idx = self.innermost(tid, ts)
        out = np.full(len(ts), -1, dtype=np.int64)
        if str(tid) in self._index:
            payload = self._index[str(tid)][2]
            out[idx >= 0] = payload[idx[idx >= 0]]
        return out


def _collective_name(text: str) -> str:
    """Normalise a collective's name: ``nccl:_all_gather_base`` → ``allgather``."""
    name = text.lower().removeprefix("nccl:").replace("_", "")
    for suffix in ("base", "intotensor", "tensor", "coalesced"):
        name = name.removesuffix(suffix)
    return "alltoall" if name.startswith("alltoall") else name


def _sequence_number(value: object) -> float:
    """A recorded collective sequence number (``Seq``), or NaN when there is none."""
    if isinstance(value, bool) or value in (None, ""):
        return math.nan
    try:
        number = float(str(value))
    except ValueError:
        return math.nan
    return number if math.isfinite(number) and number >= 0 else math.nan


def _union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Total length covered by the intervals ``[start, end)`` (overlaps counted once)."""
    if not len(start):
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.concatenate(([-np.inf], np.maximum.accumulate(e)[:-1]))
    return float(np.maximum(0.0, e - np.maximum(s, reach)).sum())


def _rank_of(data: dict[str, Any], path: Path) -> tuple[int, int]:
    info = data.get("distributedInfo") or {}
    rank = info.get("rank")
    world = info.get("world_size")
    if rank is None:
        match = _RANK_IN_NAME.search(path.name)
        if match is None:
            raise TraceError(
                "no distributedInfo.rank and no 'rank-N' in the file name: cannot tell which rank "
                "this trace is",
                where=str(path),
            )
        rank = int(match.group(1))
    return int(rank), int(world) if world is not None else 0


def read_rank(path: str | Path) -> RankOps:
    """Read one rank's Kineto trace into ops (see the module docstring)."""
    path = Path(path)
    data = read_json(path)
    rank, world = _rank_of(data, path)
    notes: list[str] = []
    steps: list[tuple[float, float, int]] = []
    launches: dict[int, tuple[float, Any]] = {}
    kernels: list[tuple[float, float, str, int, Any, dict[str, Any]]] = []
    phase_iv, comm_iv = _Intervals(), _Intervals()
    comm_info: list[dict[str, Any]] = []
    comm_ts: list[float] = []
    for ev in data["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        name = ev.get("name", "")
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        args = ev.get("args") or {}
        if cat in ("kernel", "Kernel"):
            kernels.append(
                (
                    ts,
                    dur,
                    str(name),
                    int(args.get("correlation", -1)),
                    args.get("stream", ev.get("tid")),
                    args,
                )
            )
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = args.get("correlation")
            if corr is not None:
                launches[int(corr)] = (ts, ev.get("tid"))
        elif cat in ("user_annotation", "cpu_op", "python_function"):
            step_match = _STEP.match(str(name))
            if step_match and cat == "user_annotation":
                steps.append((ts, ts + dur, int(step_match.group(1))))
            elif name.startswith("Optimizer.step") or name == "## optimizer ##":
                phase_iv.add(ev.get("tid"), ts, ts + dur, 2)
            elif name.startswith("autograd::engine::evaluate_function"):
                phase_iv.add(ev.get("tid"), ts, ts + dur, 1)
            elif name == "record_param_comms" or name.startswith("nccl:"):
                comm_iv.add(ev.get("tid"), ts, ts + dur, len(comm_info))
                comm_info.append({"op": name, **args})
                comm_ts.append(ts)
    phase_iv.freeze()
    comm_iv.freeze()
    if not kernels:
        raise TraceError("the trace has no GPU kernels", where=str(path))
    frame = pd.DataFrame(
        kernels, columns=["ts", "dur", "name", "corr", "stream", "args"]
    ).sort_values("ts", kind="stable", ignore_index=True)
    launch_ts = np.full(len(frame), np.nan)
    launch_tid = np.empty(len(frame), dtype=object)
    for i, corr in enumerate(frame["corr"].to_numpy()):
        hit = launches.get(int(corr))
        if hit is not None:
            launch_ts[i], launch_tid[i] = hit
    unlaunched = np.isnan(launch_ts)
    if unlaunched.any():
        notes.append(
            f"rank {rank}: {int(unlaunched.sum())} kernel(s) without a matching launch record: "
            "stepped by their own start and taken as forward"
        )
    when = np.where(unlaunched, frame["ts"].to_numpy(), launch_ts)

    # Steps.
    annotated: dict[int, float] = {}
    if steps:
        steps.sort()
        s_arr = np.array(steps)
        idx = np.searchsorted(s_arr[:, 0], when, side="right") - 1
        inside = (idx >= 0) & (when <= s_arr[np.maximum(idx, 0), 1])
        step = np.where(inside, s_arr[np.maximum(idx, 0), 2], -1).astype(np.int64)
        outside = int((~inside).sum())
        if outside:
            notes.append(f"rank {rank}: dropped {outside} kernel(s) launched outside ProfilerStep#")
        for begin, end, number in steps:
            annotated.setdefault(number, end - begin)
    else:
        step = np.zeros(len(frame), dtype=np.int64)
        notes.append(f"rank {rank}: no ProfilerStep# annotations: the whole trace is one step")

    # Phase and collective context, from the CPU ops around each launch on its thread.
    phase = np.zeros(len(frame), dtype=np.int64)
    contexts: list[list[int]] = [[] for _ in range(len(frame))]
    is_nccl = frame["name"].str.match(NCCL_KERNEL.pattern).to_numpy(dtype=bool)
    tid_key = np.array([str(t) for t in launch_tid], dtype=object)
    for tid in np.unique(tid_key):
        rows = np.flatnonzero(tid_key == tid)
        phase[rows] = np.maximum(phase_iv.find(tid, when[rows]), 0)
        comm_rows = rows[is_nccl[rows]]
        for row, inner in zip(comm_rows, comm_iv.innermost(tid, when[comm_rows]), strict=True):
            contexts[row] = comm_iv.payloads(tid, int(inner)) if inner >= 0 else []

    names = frame["name"].to_numpy()
    args_col = frame["args"].to_numpy()
    streams = frame["stream"].to_numpy()
    n = len(frame)
    kind = np.full(n, "", dtype=object)
    pg = np.full(n, "", dtype=object)
    pg_known = np.zeros(n, dtype=bool)
    seqnum = np.full(n, np.nan)
    enqueue = when.astype(np.float64).copy()
    for k in np.flatnonzero(is_nccl):
        i = int(k)
        match = NCCL_KERNEL.match(names[i])
        assert match is not None  # is_nccl
        args = args_col[i]
        # The innermost CPU op's details win; enclosing ops fill in what it lacks.
        ctx: dict[str, Any] = {}
        for payload in reversed(contexts[i]):
            ctx.update({k: v for k, v in comm_info[payload].items() if v not in (None, "")})
        if contexts[i]:
            enqueue[i] = min(comm_ts[p] for p in contexts[i])
        collective = args.get("Collective name") or ctx.get("Collective name")
        nccl_ops = [
            comm_info[p]["op"] for p in contexts[i] if comm_info[p]["op"].startswith("nccl:")
        ]
        if not collective and nccl_ops:
            collective = nccl_ops[0]
        kind[i] = _collective_name(str(collective or match.group(1)))
        group = (
            args.get("Process Group Name")
            or ctx.get("Process Group Name")
            or args.get("Process Group Ranks")
            or ctx.get("Process Group Ranks")
        )
        pg_known[i] = bool(group)
        pg[i] = str(group or f"stream{streams[i]}")
        seqnum[i] = _sequence_number(args.get("Seq", ctx.get("Seq")))
    keep = step >= 0
    kernel_start = frame["ts"].to_numpy(dtype=np.float64)[keep]
    kernel_end = kernel_start + frame["dur"].to_numpy(dtype=np.float64)[keep]
    stats = _step_stats(step[keep], kernel_start, kernel_end, is_nccl[keep], annotated)
    ops = _runs(
        {
            "start": kernel_start * 1e-6,
            "end": kernel_end * 1e-6,
            "step": step[keep],
            "phase": phase[keep],
            "kind": kind[keep],
            "pg": pg[keep],
            "pg_known": pg_known[keep],
            "seqnum": seqnum[keep],
            "launch": launch_ts[keep] * 1e-6,
            "enqueue": enqueue[keep] * 1e-6,
        },
        notes,
        rank,
    )
    return RankOps(rank=rank, world_size=world, source=str(path), ops=ops, steps=stats, notes=notes)


def _step_stats(
    step: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    nccl: np.ndarray,
    annotated: dict[int, float],
) -> pd.DataFrame:
    """Per step (µs in, seconds out): the step length (its ``ProfilerStep#`` span, else the span
    of its kernels), the GPU busy time (union of non-NCCL kernels) and the NCCL time."""
    rows = []
    for s in np.unique(step):
        mine = step == s
        busy = _union_length(start[mine & ~nccl], end[mine & ~nccl])
        comm = _union_length(start[mine & nccl], end[mine & nccl])
        span = annotated.get(int(s), float(end[mine].max() - start[mine].min()))
        rows.append((int(s), span * 1e-6, busy * 1e-6, comm * 1e-6))
    return pd.DataFrame(rows, columns=["step", "step_s", "busy_s", "nccl_s"])


_PHASE_NAMES = (FORWARD, BACKWARD, OPTIMIZER_PHASE)
_COMPUTE_OF_PHASE = (optypes.FORWARD_COMPUTE, optypes.BACKWARD_COMPUTE, optypes.OPTIMIZER)


_P2P_MARKERS = ("send", "recv", "p2p?")
"""Point-to-point kernels whose direction (forward/backward, and for ``p2p?`` send/recv) is
resolved once the rank's stage is known (:func:`_resolve_p2p`)."""

_P2P_KINDS = ("send", "recv", "sendrecv")


def _comm_optype(kind: str, phase: int) -> str | None:
    """The canonical op type of a collective, a p2p marker, or ``None`` to keep it in compute."""
    if kind in ("send", "recv"):
        return kind
    if kind == "sendrecv":
        return "p2p?"
    if kind == "alltoall":
        return optypes.ALL_TO_ALL
    if kind == "allgather":
        return optypes.PARAMS_ALL_GATHER
    if kind == "reducescatter":
        return optypes.GRADS_REDUCE_SCATTER
    if kind == "allreduce":
        if phase == 2:
            return optypes.OPTIMIZER_CLIP_MAIN_GRAD
        if phase == 1:
            return optypes.SEPARATE_GRADS_ALL_REDUCE
    return None


def _runs(kernels: dict[str, np.ndarray], notes: list[str], rank: int) -> pd.DataFrame:
    """Turn one rank's kernels (in start order; seconds) into ops.

    A compute op starts at its first kernel and lasts the union of its kernels' intervals (GPU
    busy time); a comm op is its kernel, with the collective's details.
    """
    start, end, step, phase = (kernels[k] for k in ("start", "end", "step", "phase"))
    kind, pg, pg_known, seqnum = (kernels[k] for k in ("kind", "pg", "pg_known", "seqnum"))
    launch, enqueue = kernels["launch"], kernels["enqueue"]
    rows: list[tuple[Any, ...]] = []
    folded: Counter[str] = Counter()
    run: list[Any] | None = None  # [step, phase, start, reach, busy]
    nan = math.nan

    def close() -> None:
        nonlocal run
        if run is not None:
            rows.append(
                (run[0], _COMPUTE_OF_PHASE[run[1]], run[2], run[4], "", "", False, nan, nan, nan)
            )
            run = None

    for i in range(len(start)):
        comm = _comm_optype(kind[i], int(phase[i])) if kind[i] else None
        if kind[i] and comm is None:
            folded[kind[i]] += 1
        s, e = float(start[i]), float(end[i])
        if comm is None:
            if run is not None and (run[0] != step[i] or run[1] != phase[i]):
                close()
            if run is None:
                run = [int(step[i]), int(phase[i]), s, e, e - s]
            else:
                run[4] += max(0.0, e - max(s, run[3]))
                run[3] = max(run[3], e)
            continue
        close()
        rows.append(
            (
                int(step[i]),
                comm,
                s,
                e - s,
                str(pg[i]),
                str(kind[i]),
                bool(pg_known[i]),
                float(seqnum[i]),
                float(launch[i]),
                float(enqueue[i]),
            )
        )
    close()
    if folded:
        listed = ", ".join(f"{k} ×{n}" for k, n in folded.most_common())
        notes.append(
            f"rank {rank}: kept {sum(folded.values())} collective(s) inside compute ({listed})"
        )
    return pd.DataFrame(rows, columns=_OP_COLUMNS)


def _resolve_p2p(ops: pd.DataFrame, stage: int, pp_size: int) -> tuple[pd.DataFrame, int, int]:
    """Name the p2p kernels of one rank on ``stage``: forward or backward, send or recv.

    Megatron launches p2p from the main thread, so the phase of the launch does not tell the
    direction; the neighbouring compute does. A send ships the output of the compute before it
    (forward-send after a forward, backward-send after a backward), a recv feeds the compute after
    it. Between two computes, a single kernel is a combined call (``send_forward_recv_backward``)
    and takes every role the stage allows, as two rows with the same times; with several kernels
    the first sends and the others receive. A kernel the stage allows no role for (p2p on a job
    of one stage) is dropped. Returns the ops, how many kernels had no recorded send/recv
    direction, and how many were dropped.
    """
    types = ops["optype"].to_numpy()
    marker = np.isin(types, _P2P_MARKERS)
    if not marker.any():
        return ops, 0, 0
    is_compute = np.isin(types, [optypes.FORWARD_COMPUTE, optypes.BACKWARD_COMPUTE])
    steps = ops["step"].to_numpy()
    rows: list[pd.Series] = []
    keep = np.ones(len(ops), dtype=bool)
    dropped = 0
    first, last = stage == 0, stage == pp_size - 1
    i = 0
    n = len(ops)
    while i < n:
        if not marker[i]:
            i += 1
            continue
        j = i
        while j < n and marker[j] and steps[j] == steps[i]:
            j += 1
        before = next(
            (types[k] for k in range(i - 1, -1, -1) if is_compute[k] and steps[k] == steps[i]), None
        )
        after = next(
            (types[k] for k in range(j, n) if is_compute[k] and steps[k] == steps[i]), None
        )
        send_role = None
        if before == optypes.FORWARD_COMPUTE and not last:
            send_role = optypes.FORWARD_SEND
        elif before == optypes.BACKWARD_COMPUTE and not first:
            send_role = optypes.BACKWARD_SEND
        recv_role = None
        if after == optypes.FORWARD_COMPUTE and not first:
            recv_role = optypes.FORWARD_RECV
        elif after == optypes.BACKWARD_COMPUTE and not last:
            recv_role = optypes.BACKWARD_RECV
        for k in range(i, j):
            roles: list[str] = []
            if types[k] == "send":
                roles = [r for r in (send_role,) if r]
                dropped += not roles
            elif types[k] == "recv":
                roles = [r for r in (recv_role,) if r]
                dropped += not roles
            elif j - i == 1:
                roles = [r for r in (send_role, recv_role) if r]
                dropped += not roles
            elif k == i:
                roles = [r for r in (send_role or recv_role,) if r]
                dropped += not roles
            else:
                roles = [r for r in (recv_role or send_role,) if r]
                dropped += not roles
            keep[k] = False
            for role in roles:
                row = ops.iloc[k].copy()
                row["optype"] = role
                rows.append(row)
        i = j
    unknown = int((types == "p2p?").sum())
    out = pd.concat([ops.loc[keep], pd.DataFrame(rows, columns=ops.columns)], ignore_index=True)
    out = out.sort_values(["step", "start_ts"], kind="stable", ignore_index=True)
    return out, unknown, dropped


def _as_all_to_all(ops: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """On a job of one stage, ``SendRecv`` kernels without a direction are all-to-alls."""
    marker = (ops["optype"] == "p2p?").to_numpy()
    if not marker.any():
        return ops, 0
    ops = ops.copy()
    ops.loc[marker, "optype"] = optypes.ALL_TO_ALL
    ops.loc[marker, "collective"] = "alltoall"
    return ops, int(marker.sum())


def _check_p2p_pairs(p2p_rows: pd.DataFrame) -> None:
    """Two-rank p2p groups: every send on one side needs a recv on the other."""
    for (step, group), rows in p2p_rows.groupby(["step", "pg"]):
        members = rows["rank"].unique()
        if len(members) != 2:
            continue
        sends = rows[rows["collective"] == "send"].groupby("rank").size()
        recvs = rows[rows["collective"] == "recv"].groupby("rank").size()
        a, b = (int(m) for m in members)
        if sends.get(a, 0) != recvs.get(b, 0) or sends.get(b, 0) != recvs.get(a, 0):
            raise TraceError(
                f"unmatched send/recv pairs in process group {group!r}, step {step}: rank {a} "
                f"sends {sends.get(a, 0)} and receives {recvs.get(a, 0)}, rank {b} sends "
                f"{sends.get(b, 0)} and receives {recvs.get(b, 0)}",
                where="kineto import",
            )


_INSTANCE_COLUMNS = ["key", "rank", "step", "collective", "start", "end", "launch", "enqueue"]


def _match_collectives(
    ranks: Sequence[RankOps], stage_of: dict[int, int], notes: list[str]
) -> tuple[pd.DataFrame, dict[int, np.ndarray]]:
    """Match collectives across ranks (see the module docstring).

    Returns the collective instances that more than one rank reached (one row per rank and
    instance: :data:`_INSTANCE_COLUMNS`, times in seconds) and, per rank, the position of each
    of its collectives among the instances of its (step, stage, op type), so that the k-th
    template op of a type is the same instance on every rank (NaN for other ops).
    """
    records = []
    for r in ranks:
        ops = r.ops
        rows = np.flatnonzero((ops["collective"] != "").to_numpy())
        if not len(rows):
            continue
        c = ops.iloc[rows]
        start = c["start_ts"].to_numpy(dtype=np.float64)
        records.append(
            pd.DataFrame(
                {
                    "rank": r.rank,
                    "stage": stage_of[r.rank],
                    "row": rows,
                    "step": c["step"].to_numpy(),
                    "optype": c["optype"].to_numpy(),
                    "pg": c["pg"].to_numpy(),
                    "pg_known": c["pg_known"].to_numpy(dtype=bool),
                    "seqnum": c["seqnum"].to_numpy(dtype=np.float64),
                    "collective": c["collective"].to_numpy(),
                    "start": start,
                    "end": start + c["duration"].to_numpy(dtype=np.float64),
                    "launch": c["launch_ts"].to_numpy(dtype=np.float64),
                    "enqueue": c["enqueue_ts"].to_numpy(dtype=np.float64),
                }
            )
        )
    empty = pd.DataFrame(columns=_INSTANCE_COLUMNS)
    if not records:
        return empty, {}
    table = pd.concat(records, ignore_index=True)
    p2p = table["collective"].isin(_P2P_KINDS).to_numpy()
    if len(ranks) > 1:
        _check_p2p_pairs(table.loc[p2p])
    coll = table.loc[~p2p].sort_values(["rank", "start"], kind="stable").copy()
    if coll.empty:
        return empty, {}
    by_seq = (coll["pg_known"] & coll["seqnum"].notna()).to_numpy()
    known = coll["pg_known"].to_numpy()
    in_group = coll.groupby(["rank", "step", "pg"], sort=False).cumcount().to_numpy()
    in_kind = coll.groupby(["rank", "step", "collective"], sort=False).cumcount().to_numpy()
    pg_text = coll["pg"].astype(str).to_numpy()
    step_text = coll["step"].astype(str).to_numpy()
    seq_text = np.where(by_seq, coll["seqnum"].fillna(-1).astype(np.int64).astype(str), "")
    kind_key = "kind " + coll["collective"].astype(str).to_numpy() + " step " + step_text
    group_key = "pg " + pg_text + " step " + step_text + " #" + in_group.astype(str)
    seq_key = "pg " + pg_text + " seq " + seq_text
    coll["key"] = np.where(
        by_seq, seq_key, np.where(known, group_key, kind_key + " #" + in_kind.astype(str))
    )
    coll["order"] = np.where(by_seq, coll["seqnum"].fillna(0.0), np.where(known, in_group, in_kind))
    coll["sort_pg"] = np.where(known, pg_text, "")
    coll["by_seq"] = by_seq
    kinds = coll.groupby("key", sort=False)["collective"].nunique()
    bad = kinds[kinds > 1]
    if len(bad):
        members = coll[coll["key"] == bad.index[0]].sort_values("rank")
        first = members.iloc[0]
        where = (
            f"with sequence number {int(first['seqnum'])}"
            if first["by_seq"]
            else f"#{int(first['order'])}"
        )
        detail = ", ".join(
            f"rank {r}: {c}" for r, c in zip(members["rank"], members["collective"], strict=True)
        )
        raise TraceError(
            f"collective {where} of process group {first['pg']!r} in step {first['step']} "
            f"differs across ranks ({detail}); {len(bad)} mismatched collective(s) in all",
            where="kineto import",
        )
    # Position among the instances of (stage, step, op type), the same on every rank.
    ordered = coll.sort_values(["stage", "step", "optype", "sort_pg", "order"], kind="stable")
    cell = ordered[["stage", "step", "optype"]]
    new_cell = (cell != cell.shift()).any(axis=1).to_numpy()
    value = ordered[["sort_pg", "order"]]
    new_value = new_cell | (value != value.shift()).any(axis=1).to_numpy()
    dense = np.cumsum(new_value)
    base = pd.Series(np.where(new_cell, dense, np.nan)).ffill().to_numpy()
    ordered = ordered.assign(position=dense - base)
    positions: dict[int, np.ndarray] = {}
    for r in ranks:
        mine = ordered[ordered["rank"] == r.rank]
        pos = np.full(len(r.ops), np.nan)
        pos[mine["row"].to_numpy()] = mine["position"].to_numpy()
        positions[r.rank] = pos
    per_key = coll.groupby("key", sort=False)["rank"].nunique()
    multi = per_key[per_key > 1].index
    instances = coll.loc[coll["key"].isin(multi), _INSTANCE_COLUMNS].reset_index(drop=True)
    if len(ranks) > 1:
        matched = coll[coll["key"].isin(multi)].drop_duplicates("key")
        listed = ", ".join(f"{k} ×{n}" for k, n in matched["collective"].value_counts().items())
        method = np.where(
            by_seq, "sequence number", np.where(known, "process group order", "kind order")
        )
        how = Counter(method[coll["key"].isin(multi).to_numpy()].tolist())
        methods = ", ".join(f"{k}: {v} rank-op(s)" for k, v in sorted(how.items()))
        notes.append(
            f"matched {len(multi)} collective(s) across ranks ({listed or 'none'}) by process "
            "group and sequence number where the trace records them, else by order per step "
            f"({methods or 'none'}); {int((per_key == 1).sum())} had only one rank present"
        )
    return instances, positions


def arrival_stats(instances: pd.DataFrame) -> pd.DataFrame:
    """Per rank, from matched collective instances (see :func:`_match_collectives`):

    ``collectives`` (instances it took part in), ``waited_s`` (Σ latest arrival − its arrival),
    ``last_arrivals`` (instances it reached last, by more than :data:`ARRIVAL_TOLERANCE_S`),
    ``caused_wait_s`` (Σ, over those, its lead over the second-latest rank: time every other
    rank waited for it alone) and ``caused_wait_cpu_s`` (the part where even its launch came
    after the others had arrived: CPU-side lateness). Arrival is the kernel's start.
    """
    columns = ["collectives", "waited_s", "last_arrivals", "caused_wait_s", "caused_wait_cpu_s"]
    if instances.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="rank"))
    inst = instances.sort_values(["key", "start"], kind="stable").reset_index(drop=True)
    latest = inst.groupby("key", sort=False)["start"].transform("max")
    inst["waited"] = latest - inst["start"]
    is_last = inst["key"].ne(inst["key"].shift(-1)).to_numpy()
    second = inst["start"].shift(1).to_numpy()
    lead = np.where(is_last, inst["start"].to_numpy() - second, 0.0)
    late = is_last & (lead > ARRIVAL_TOLERANCE_S)
    cpu = late & (inst["launch"].to_numpy() >= second)
    inst["last"] = late.astype(np.int64)
    inst["caused"] = np.where(late, lead, 0.0)
    inst["caused_cpu"] = np.where(cpu, lead, 0.0)
    grouped = inst.groupby("rank")
    out = pd.DataFrame(
        {
            "collectives": grouped.size(),
            "waited_s": grouped["waited"].sum(),
            "last_arrivals": grouped["last"].sum(),
            "caused_wait_s": grouped["caused"].sum(),
            "caused_wait_cpu_s": grouped["caused_cpu"].sum(),
        }
    )
    out.index.name = "rank"
    return out


def _layout(
    ranks: Sequence[RankOps], meta: JobMeta | None, notes: list[str]
) -> tuple[JobMeta, dict[int, tuple[int, int]]]:
    present = sorted(r.rank for r in ranks)
    if meta is None:
        worlds = {r.world_size for r in ranks if r.world_size}
        meta = JobMeta(dp_size=len(present), pp_size=1)
        notes.append(
            f"no meta: the {len(present)} rank(s) present are taken as the DP ranks of one stage "
            f"(the job's world size is {sorted(worlds) or 'unknown'}); pass a meta for PP layouts"
        )
        return meta, {r: (i, 0) for i, r in enumerate(present)}
    mapping: dict[int, tuple[int, int]] = {}
    inner = meta.tp_size * meta.dsp_size
    skipped = 0
    for r in present:
        if r >= meta.world_size:
            raise TraceError(
                f"rank {r} is outside the meta's world size {meta.world_size}",
                where="kineto import",
            )
        if r % inner:
            skipped += 1
            continue
        dp_rank = (r // inner) % meta.dp_size
        stage = r // (inner * meta.dp_size)
        mapping[r] = (dp_rank, stage)
    if skipped:
        notes.append(
            f"kept TP/CP rank 0 of each worker: {skipped} other rank trace(s) not used "
            "(their compute is the same model-parallel work)"
        )
    return meta, mapping


def import_kineto(paths: Iterable[str | Path], meta: JobMeta | None = None) -> Trace:
    """Import the Kineto traces of a job's ranks (one file per rank) as a canonical trace.

    Raises
    ------
    TraceError
        A file is not a Kineto trace, two files claim the same rank, collectives do not line up
        across ranks, or a rank is outside the meta's layout.
    """
    files = [Path(p) for p in paths]
    if not files:
        raise TraceError("no Kineto trace files given", where="kineto import")
    ranks = [read_rank(p) for p in files]
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank in seen:
            raise TraceError(
                f"rank {r.rank} appears twice ({seen[r.rank]} and {r.source})",
                where="kineto import",
            )
        seen[r.rank] = r.source
    notes = [n for r in ranks for n in r.notes]
    job_meta, mapping = _layout(ranks, meta, notes)
    used = [r for r in ranks if r.rank in mapping]
    if job_meta.pp_size == 1:
        job_meta = replace(job_meta, ideal_pooling="op")
        notes.append(
            "one stage: each op's ideal duration is its own mean over steps and ranks (its "
            "compute ops are different stretches of the model, not like microbatches)"
        )
        for r in used:
            r.ops, relabelled = _as_all_to_all(r.ops)
            if relabelled:
                notes.append(
                    f"rank {r.rank}: {relabelled} SendRecv kernel(s) without a recorded "
                    "collective on a job of one stage taken as all-to-all"
                )
    instances, positions = _match_collectives(
        used, {r.rank: mapping[r.rank][1] for r in used}, notes
    )
    arrivals = {
        int(str(rank)): {str(k): v for k, v in row.items()}
        for rank, row in arrival_stats(instances).to_dict("index").items()
    }
    frames = []
    stats = []
    for r in used:
        dp_rank, stage = mapping[r.rank]
        with_pos = r.ops.assign(position=positions.get(r.rank, np.full(len(r.ops), np.nan)))
        ops, unknown, dropped = _resolve_p2p(with_pos, stage, job_meta.pp_size)
        if unknown:
            notes.append(
                f"rank {r.rank}: {unknown} SendRecv kernel(s) without a recorded direction: "
                "send/recv inferred from the compute around them"
            )
        if dropped:
            notes.append(
                f"rank {r.rank}: dropped {dropped} p2p kernel(s) with no pipeline role on stage "
                f"{stage} of {job_meta.pp_size} (no peer stage to send to or receive from)"
            )
        # Collectives take their matched position; other ops their order in (step, type).
        matched = ops["position"].notna().to_numpy()
        seq = np.zeros(len(ops), dtype=np.int64)
        seq[~matched] = ops.loc[~matched].groupby(["step", "optype"], sort=False).cumcount()
        seq[matched] = ops.loc[matched, "position"].to_numpy(dtype=np.int64)
        is_compute = ops["optype"].isin(optypes.COMPUTE).to_numpy()
        chunked = is_compute | ops["optype"].isin(optypes.DP_COMM).to_numpy()
        frames.append(
            pd.DataFrame(
                {
                    "dp_rank": dp_rank,
                    "stage": stage,
                    "rank": r.rank,
                    "step": ops["step"].to_numpy(),
                    "optype": ops["optype"].to_numpy(),
                    "start_ts": ops["start_ts"].to_numpy(),
                    "duration": ops["duration"].to_numpy(),
                    "seq_id": seq,
                    "mc": np.where(chunked, 0, -1),
                    "gmc": np.where(is_compute, stage, -1),
                    "mb_id": np.where(is_compute, seq, -1),
                }
            )
        )
        stats.append(_rank_row(r, dp_rank, stage, arrivals))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
    origin = float(table["start_ts"].min()) if len(table) else 0.0
    table["start_ts"] = table["start_ts"] - origin
    name = files[0].parent.name if len(files) > 1 else files[0].name.split(".")[0]
    source = ", ".join(str(f) for f in files[:3]) + (
        f", … ({len(files)} files)" if len(files) > 3 else ""
    )
    ops_table = normalize_ops(table, job_meta, where="kineto import")
    logger.info("imported %d ops from %d Kineto trace(s)", len(ops_table), len(files))
    return Trace(
        ops=ops_table,
        meta=JobMeta(**{**job_meta.__dict__, "name": job_meta.name or name}),
        source=source,
        notes=notes,
        rank_stats=pd.DataFrame(stats, columns=list(RANK_STATS_COLUMNS)),
    )


def _rank_row(
    r: RankOps, dp_rank: int, stage: int, arrivals: dict[int, dict[str, Any]]
) -> list[Any]:
    """One row of ``Trace.rank_stats``: means per step, arrival counts in all."""
    n_steps = max(len(r.steps), 1)
    got = arrivals.get(r.rank, {})

    def total(column: str) -> float:
        return float(got.get(column, 0.0))

    return [
        r.rank,
        dp_rank,
        stage,
        len(r.steps),
        float(r.steps["step_s"].mean()) if len(r.steps) else 0.0,
        float(r.steps["busy_s"].mean()) if len(r.steps) else 0.0,
        float(r.steps["nccl_s"].mean()) if len(r.steps) else 0.0,
        total("waited_s") / n_steps,
        int(total("collectives")),
        int(total("last_arrivals")),
        total("caused_wait_s") / n_steps,
        total("caused_wait_cpu_s") / n_steps,
    ]
