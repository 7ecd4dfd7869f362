"""Replay of a job on its dependency model, vectorised across steps, DP ranks and scenarios.

The template graph is compiled once into a max-plus program over three kinds of node per op:

* ``start(o) = max(end(d) for d in deps(o)) + launch_delay(o)`` (0 + delay without deps);
* ``end(o) = start(o) + duration(o)`` for compute, ``end(o) = gmax(g) + transfer(o)`` for comm;
* ``gmax(g) = max(start(m) for m in group g)``, also over every DP rank for DP-synced groups.

Nodes are grouped into topological levels and laid out so that each level's nodes of one kind are
a contiguous slice of the value array; a level then costs a few NumPy gathers into that slice over
arrays of shape ``(nodes, runs, dp)`` where ``runs = scenarios × steps``. The Python work per
replay grows with the depth of one model-parallel group's graph, not with the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from whatif import optypes
from whatif.model import Template

_NEG_INF = -np.inf


@dataclass(frozen=True)
class Level:
    """The nodes of one topological level, as slices of the node layout.

    ``starts``, ``gmax`` and ``compute_ends``/``comm_ends`` are ``(begin, end)`` node ranges;
    ``start_deps`` and ``gmax_members`` list, per node, the nodes it takes the max of (padded with
    the −inf node); ``end_sources`` lists each end's start (compute) or gmax (comm) node.
    """

    starts: tuple[int, int]
    start_rows: int
    start_deps: np.ndarray
    gmax: tuple[int, int]
    gmax_members: np.ndarray
    gmax_synced_from: int
    ends: tuple[int, int]
    end_rows: int
    end_sources: np.ndarray


@dataclass(frozen=True)
class Program:
    """A compiled template.

    Attributes
    ----------
    n_ops, n_nodes
        Sizes.
    start_node, end_node
        Per op: its start and end node in the layout.
    end_order
        Ops in the order of their end nodes: weights are passed in this order.
    start_order
        Ops in the order of their start nodes: launch delays are passed in this order.
    zero_node, neg_node
        Constant nodes (0 and −inf).
    levels
        The levels, in evaluation order.
    finish_ops
        Ops whose latest end is the step time (the optimizer, else every op).
    """

    n_ops: int
    n_nodes: int
    start_node: np.ndarray
    end_node: np.ndarray
    end_order: np.ndarray
    start_order: np.ndarray
    zero_node: int
    neg_node: int
    levels: tuple[Level, ...]
    finish_ops: np.ndarray
    widest: int = 1
    """Most nodes of one kind in one level: the rows of the scratch arrays."""


class Workspace:
    """Arrays reused across replays: a fresh large array is page-faulted in on every use, which
    costs as much system time as the replay's arithmetic."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised float64 array of ``shape``, reusing the storage of ``name``."""
        size = math.prod(shape)
        have = self._arrays.get(name)
        if have is None or have.size < size:
            have = self._arrays[name] = np.empty(size)
        return have[:size].reshape(shape)


def compile_template(template: Template) -> Program:
    """Compile ``template`` into a levelled max-plus program."""
    n = template.n_ops
    n_groups = len(template.group_members)
    # Provisional ids: starts 0..n-1, ends n..2n-1, gmax 2n..2n+g-1.
    n_real = 2 * n + n_groups
    preds: list[list[int]] = [[] for _ in range(n_real)]
    for op, ds in enumerate(template.deps):
        preds[op] = [n + d for d in ds]
        preds[n + op] = [2 * n + int(template.group[op])] if template.is_comm[op] else [op]
    for g, members in enumerate(template.group_members):
        preds[2 * n + g] = list(members)
    level = np.full(n_real, -1, dtype=np.int64)
    for v in _topological(preds, n_real):
        level[v] = 1 + max((int(level[p]) for p in preds[v]), default=-1)
    kind = np.repeat([0, 1, 2], [n, n, n_groups])  # start, end, gmax
    synced = np.zeros(n_real, dtype=bool)
    synced[2 * n :] = template.group_dp_synced
    # Layout: by level, then kind; gmax nodes unsynced before synced.
    layout = np.lexsort((synced, kind, level))
    new_id = np.empty(n_real, dtype=np.int64)
    new_id[layout] = np.arange(n_real)
    zero, neg = n_real, n_real + 1
    start_node = new_id[:n]
    end_node = new_id[n : 2 * n]
    # Each node's operands in the new ids, one padded row per node in layout order.
    counts = np.array([max(len(preds[v]), 1) for v in layout], dtype=np.int64)
    operands = np.full((n_real, int(counts.max(initial=1))), neg, dtype=np.int64)
    for row, v in enumerate(layout):
        operands[row, : counts[row]] = new_id[preds[v]] if preds[v] else zero
    # Launch delays and weights are passed in start/end node order: a level's rows are contiguous.
    start_rows = np.cumsum(kind[layout] == 0) - (kind[layout] == 0)
    end_rows = np.cumsum(kind[layout] == 1) - (kind[layout] == 1)
    block = level[layout] * 3 + kind[layout]  # sorted: level-major, kind-minor
    levels = []
    for lv in range(int(level.max()) + 1):
        spans = []
        for k in range(3):
            a = int(np.searchsorted(block, lv * 3 + k, side="left"))
            b = int(np.searchsorted(block, lv * 3 + k, side="right"))
            spans.append((a, b))
        (sa, sb), (ea, eb), (ga, gb) = spans
        levels.append(
            Level(
                starts=(sa, sb),
                start_rows=int(start_rows[sa]) if sb > sa else 0,
                start_deps=operands[sa:sb, : int(counts[sa:sb].max(initial=1))],
                gmax=(ga, gb),
                gmax_members=operands[ga:gb, : int(counts[ga:gb].max(initial=1))],
                gmax_synced_from=ga + int((~synced[layout[ga:gb]]).sum()),
                ends=(ea, eb),
                end_rows=int(end_rows[ea]) if eb > ea else 0,
                end_sources=operands[ea:eb, 0],
            )
        )
    finish = template.ops_of([optypes.OPTIMIZER])
    if not len(finish):
        finish = np.arange(n)
    return Program(
        n_ops=n,
        n_nodes=n_real + 2,
        start_node=start_node,
        end_node=end_node,
        end_order=np.argsort(end_node, kind="stable"),
        start_order=np.argsort(start_node, kind="stable"),
        zero_node=zero,
        neg_node=neg,
        levels=tuple(levels),
        finish_ops=finish,
        widest=max([1] + [b - a for lv in levels for a, b in (lv.starts, lv.gmax, lv.ends)]),
    )


def _topological(preds: list[list[int]], n: int) -> list[int]:
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = np.zeros(n, dtype=np.int64)
    for v in range(n):
        for p in preds[v]:
            succ[p].append(v)
            indeg[v] += 1
    ready = [int(v) for v in np.flatnonzero(indeg == 0)]
    order: list[int] = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if len(order) != n:  # the model builder refuses cycles first; this guards the compiler
        raise ValueError("the dependency graph has a cycle")
    return order


def run(
    program: Program,
    weights: np.ndarray,
    launch_delay: np.ndarray | None = None,
    *,
    keep_values: bool = False,
    workspace: Workspace | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Replay ``runs`` independent copies of the template.

    Parameters
    ----------
    program
        The compiled template.
    weights
        ``(ops, runs, dp)`` in ``program.end_order``: duration of compute ops, transfer of comm
        ops.
    launch_delay
        ``(ops, runs, dp)`` in ``program.start_order``, or ``None`` for no launch delay.
    keep_values
        Also return every node's value.
    workspace
        Where the node values and scratch arrays live between calls (default: fresh ones).

    Returns
    -------
    step_time
        ``(runs,)``: latest end of the finishing ops (the optimizer) over every DP rank.
    values
        ``(nodes, runs, dp)`` when ``keep_values`` (an op's start is ``values[start_node[op]]``,
        its end ``values[end_node[op]]``), else ``None``.
    """
    n_ops, runs, dp = weights.shape
    if n_ops != program.n_ops:
        raise ValueError(f"weights have {n_ops} ops, the program {program.n_ops}")
    space = Workspace() if workspace is None else workspace
    shape = (program.n_nodes, runs, dp)
    values = np.empty(shape) if keep_values else space.get("values", shape)
    values[program.zero_node] = 0.0
    values[program.neg_node] = _NEG_INF
    acc_all = space.get("acc", (program.widest, runs, dp))
    tmp_all = space.get("tmp", (program.widest, runs, dp))

    # ndarray.take with mode="clip" writes straight into ``out`` (the default mode buffers);
    # every index is valid, so clipping never applies.
    take = values.take

    def gather_max(index: np.ndarray) -> np.ndarray:
        k = len(index)
        acc = take(index[:, 0], axis=0, out=acc_all[:k], mode="clip")
        for j in range(1, index.shape[1]):
            np.maximum(acc, take(index[:, j], axis=0, out=tmp_all[:k], mode="clip"), out=acc)
        return acc

    for lv in program.levels:
        a, b = lv.starts
        if b > a:
            acc = gather_max(lv.start_deps)
            if launch_delay is None:
                values[a:b] = acc
            else:
                np.add(acc, launch_delay[lv.start_rows : lv.start_rows + b - a], out=values[a:b])
        a, b = lv.gmax
        if b > a:
            values[a:b] = gather_max(lv.gmax_members)
            s = lv.gmax_synced_from
            if b > s:
                values[s:b] = values[s:b].max(axis=-1, keepdims=True)
        a, b = lv.ends
        if b > a:
            np.add(
                take(lv.end_sources, axis=0, out=acc_all[: b - a], mode="clip"),
                weights[lv.end_rows : lv.end_rows + b - a],
                out=values[a:b],
            )
    step_time = values[program.end_node[program.finish_ops]].max(axis=(0, 2))
    return step_time, (values if keep_values else None)
