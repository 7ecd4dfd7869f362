"""Build multi-rank PyTorch profiler (Kineto) traces of a small job by simulating its ranks.

Test support for the Kineto importer. A job is a per-step script of ops that every rank runs in
lockstep; each rank has a CPU clock (the Python thread that launches work) and a GPU clock (the
stream). The builder writes what PyTorch's profiler would record:

* ``ProfilerStep#N`` ``user_annotation`` spans on the main thread;
* per kernel a ``cuda_runtime`` ``cudaLaunchKernel`` with a ``correlation`` id and a ``kernel``
  event on a stream that starts at ``max(GPU free, launch + latency)``;
* backward kernels launched from the autograd thread inside an ``autograd::engine::
  evaluate_function`` CPU op, optimizer kernels inside ``Optimizer.step#SGD.step``;
* collectives as an NCCL kernel (``ncclDevKernel_*`` or the older ``ncclKernel_*``; all-to-all is
  a ``SendRecv`` kernel, as NCCL runs it) launched inside ``nccl:<name>`` and, optionally, a
  ``record_param_comms`` op whose args carry the collective name, process group, its ranks, the
  message sizes and the sequence number (newer PyTorch).

A collective instance ends at ``max(arrival over its ranks) + transfer``: ranks that arrive early
wait inside their kernel, which is what real traces show. Perturbations per rank: a CPU stall
before an op's launch (the rank arrives late), a CPU stall between the kernels of compute ops
(the GPU starves), and a factor on compute kernel durations (a slow GPU).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN_TID, AUTOGRAD_TID = 1, 2
COMPUTE_STREAM, NCCL_STREAM = 7, 20
LAUNCH_US = 4.0  # CPU time of one launch call
LATENCY_US = 5.0  # launch to earliest kernel start
STEP_SYNC_US = 20.0  # the end-of-step synchronisation

PHASES = ("forward", "backward", "optimizer")
COLLECTIVES = {
    # kind: (kernel name after the prefix, nccl:<op> CPU op, record_param_comms name)
    "alltoall": ("SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl:all_to_all", "all_to_all"),
    "allreduce": (
        "AllReduce_RING_LL_Sum_float(ncclDevKernelArgsStorage<4096ul>)",
        "nccl:all_reduce",
        "allreduce",
    ),
}


@dataclass(frozen=True)
class Op:
    """One op of the step script.

    ``kind`` is a phase (``forward``, ``backward``, ``optimizer``: ``kernels`` compute kernels
    of ``kernel_us`` each) or a collective (``alltoall``, ``allreduce``: ``transfer_us`` once the
    last rank arrives), launched in ``phase`` on process group ``group``.
    """

    kind: str
    kernels: int = 1
    kernel_us: float = 1000.0
    transfer_us: float = 500.0
    phase: str = "forward"
    group: str = "0"


@dataclass
class RankPlan:
    """How one rank departs from the script."""

    compute_factor: float = 1.0
    """Multiplies its compute kernel durations (a slow GPU)."""
    stall_before: dict[int, float] = field(default_factory=dict)
    """Op index in the step script → CPU stall (µs) before that op's launch."""
    stall_inside_us: float = 0.0
    """CPU stall between consecutive kernels of each compute op (the GPU starves)."""
    steps: Sequence[int] | None = None
    """Only these steps get the stalls (default: every step)."""


@dataclass
class _Rank:
    rank: int
    plan: RankPlan
    cpu: float = 0.0
    gpu: float = 0.0
    correlation: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)


class KinetoJob:
    """A job of ``ranks`` ranks running ``script`` for ``steps`` steps (see the module docstring).

    Parameters
    ----------
    ranks
        Number of ranks (one process each).
    script
        The ops of one step, in launch order.
    steps
        How many steps to record; step ids start at ``first_step``.
    nccl_prefix
        ``ncclDevKernel_`` (newer NCCL) or ``ncclKernel_`` (older).
    param_comms
        Write ``record_param_comms`` CPU ops with collective name, process group, its ranks,
        sizes and sequence number.
    kernel_args
        Also put the collective name and process group in the NCCL kernel's args.
    """

    def __init__(
        self,
        ranks: int,
        script: Sequence[Op],
        steps: int = 4,
        *,
        nccl_prefix: str = "ncclDevKernel_",
        param_comms: bool = True,
        kernel_args: bool = False,
        first_step: int = 10,
    ) -> None:
        self.script = list(script)
        self.steps = steps
        self.first_step = first_step
        self.prefix = nccl_prefix
        self.param_comms = param_comms
        self.kernel_args = kernel_args
        self.ranks = [_Rank(r, RankPlan()) for r in range(ranks)]
        self._seq: dict[str, int] = {}

    def plan(self, rank: int, plan: RankPlan) -> KinetoJob:
        """Give ``rank`` a perturbation plan; returns the job for chaining."""
        self.ranks[rank].plan = plan
        return self

    # -- simulation ---------------------------------------------------------------------------

    def _cpu(self, r: _Rank, name: str, ts: float, dur: float, tid: int, **extra: Any) -> None:
        event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": r.rank, "tid": tid}
        event.update({"ts": ts, "dur": dur, "args": {}, **extra})
        r.events.append(event)

    def _launch(self, r: _Rank, tid: int) -> float:
        """Launch one kernel at the rank's CPU time; returns its start (not yet recorded)."""
        r.correlation += 1
        launch = r.cpu
        r.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": r.rank,
                "tid": tid,
                "ts": launch,
                "dur": LAUNCH_US,
                "args": {"correlation": r.correlation, "External id": r.correlation},
            }
        )
        r.cpu += LAUNCH_US
        return max(r.gpu, launch + LATENCY_US)

    def _kernel(
        self, r: _Rank, name: str, start: float, dur: float, stream: int, **args: Any
    ) -> None:
        r.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": r.rank,
                "tid": stream,
                "ts": start,
                "dur": dur,
                "args": {"correlation": r.correlation, "stream": stream, "device": r.rank, **args},
            }
        )

    def _stalled(self, r: _Rank, step: int) -> bool:
        return r.plan.steps is None or step in r.plan.steps

    def _compute(self, r: _Rank, op: Op, step: int) -> None:
        tid = AUTOGRAD_TID if op.kind == "backward" else MAIN_TID
        first = r.cpu
        for k in range(op.kernels):
            if k and self._stalled(r, step):
                r.cpu += r.plan.stall_inside_us
            if op.kind == "backward":
                self._cpu(r, "autograd::engine::evaluate_function: MmBackward0", r.cpu, 9.0, tid)
                r.cpu += 1.0
            start = self._launch(r, tid)
            dur = op.kernel_us * r.plan.compute_factor
            name = "sm90_xmma_gemm_bf16bf16_bf16f32" if k % 2 == 0 else "vectorized_elementwise"
            self._kernel(r, f"void {name}_kernel", start, dur, COMPUTE_STREAM)
            r.gpu = start + dur
            r.cpu += 2.0
        if op.kind == "optimizer":
            self._cpu(
                r,
                "Optimizer.step#SGD.step",
                first - 1.0,
                r.cpu - first + 2.0,
                tid,
                cat="user_annotation",
            )

    def _collective(self, op: Op, step: int, starts: dict[int, float]) -> None:
        kernel, nccl_op, coll_name = COLLECTIVES[op.kind]
        seq = self._seq.get(op.group, 0)
        self._seq[op.group] = seq + 1
        members = "[" + ", ".join(str(r.rank) for r in self.ranks) + "]"
        meta = {
            "Collective name": coll_name,
            "Process Group Name": op.group,
            "Process Group Description": "default_pg",
            "Process Group Ranks": members,
            "Group size": len(self.ranks),
            "In msg nelems": 4096,
            "Out msg nelems": 4096,
            "dtype": "Float",
            "Seq": seq,
        }
        arrivals: dict[int, float] = {}
        for r in self.ranks:
            tid = AUTOGRAD_TID if op.phase == "backward" else MAIN_TID
            enqueue = r.cpu
            if op.phase == "backward":
                self._cpu(r, "autograd::engine::evaluate_function: MmBackward0", enqueue, 30.0, tid)
            if op.phase == "optimizer":
                self._cpu(r, "Optimizer.step#SGD.step", enqueue, 30.0, tid, cat="user_annotation")
            r.cpu += 1.0
            if self.param_comms:
                self._cpu(r, "record_param_comms", r.cpu, 20.0, tid, args=dict(meta))
            self._cpu(r, nccl_op, r.cpu + 0.5, 18.0, tid)
            r.cpu += 2.0
            arrivals[r.rank] = self._launch(r, tid)
            starts[r.rank] = arrivals[r.rank]
            r.cpu += 14.0
        end = max(arrivals.values()) + op.transfer_us
        for r in self.ranks:
            args = (
                {"Collective name": coll_name, "Process Group Name": op.group}
                if self.kernel_args
                else {}
            )
            # The correlation of this rank's last launch is the collective's.
            self._kernel(
                r,
                self.prefix + kernel,
                arrivals[r.rank],
                end - arrivals[r.rank],
                NCCL_STREAM,
                **args,
            )
            r.gpu = end

    def build(self) -> dict[int, dict[str, Any]]:
        """Simulate every step; returns the trace JSON object of each rank."""
        for r in self.ranks:
            r.cpu = 1000.0 + 3.0 * r.rank
            r.gpu = 0.0
        for s in range(self.steps):
            step = self.first_step + s
            step_start = {r.rank: r.cpu for r in self.ranks}
            for index, op in enumerate(self.script):
                for r in self.ranks:
                    if self._stalled(r, step):
                        r.cpu += r.plan.stall_before.get(index, 0.0)
                if op.kind in PHASES:
                    for r in self.ranks:
                        self._compute(r, op, step)
                else:
                    self._collective(op, step, {})
            for r in self.ranks:
                r.cpu = max(r.cpu, r.gpu) + STEP_SYNC_US
                self._cpu(
                    r,
                    f"ProfilerStep#{step}",
                    step_start[r.rank],
                    r.cpu - step_start[r.rank],
                    MAIN_TID,
                    cat="user_annotation",
                )
                r.cpu += 30.0
        return {
            r.rank: {
                "schemaVersion": 1,
                "distributedInfo": {
                    "backend": "nccl",
                    "rank": r.rank,
                    "world_size": len(self.ranks),
                },
                "traceEvents": r.events,
            }
            for r in self.ranks
        }

    def write(self, out_dir: Path, *, gzip_files: bool = False) -> list[Path]:
        """Write one trace file per rank (``rank-N.json`` or ``.json.gz``); returns the paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for rank, data in self.build().items():
            raw = json.dumps(data).encode()
            path = out_dir / (f"rank-{rank}.json.gz" if gzip_files else f"rank-{rank}.json")
            path.write_bytes(gzip.compress(raw) if gzip_files else raw)
            paths.append(path)
        return paths


def recsys_script(
    *,
    forward_kernels: int = 3,
    kernel_us: float = 1000.0,
    a2a_transfer_us: float = 800.0,
    allreduce_transfer_us: float = 1500.0,
    two_all_to_all: bool = False,
) -> list[Op]:
    """A recommendation-model step: forward, all-to-all (embeddings), forward, backward, a
    gradient all-reduce, optimizer."""
    ops = [Op("forward", forward_kernels, kernel_us)]
    ops.append(Op("alltoall", transfer_us=a2a_transfer_us))
    if two_all_to_all:
        ops.append(Op("forward", 1, kernel_us))
        ops.append(Op("alltoall", transfer_us=a2a_transfer_us))
    ops += [
        Op("forward", forward_kernels, kernel_us),
        Op("backward", 2 * forward_kernels, kernel_us),
        Op("allreduce", transfer_us=allreduce_transfer_us, phase="backward"),
        Op("optimizer", 2, kernel_us / 2),
    ]
    return ops
