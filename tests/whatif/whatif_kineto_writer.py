"""Write a canonical trace as per-rank PyTorch profiler (Kineto) JSON files, as PyTorch would.

Test support for the Kineto importer: compute ops become two back-to-back kernels (launched from
the main thread, or from the autograd thread inside ``evaluate_function`` for backward), comm ops
become NCCL kernels with the collective's name and process group in their args (newer PyTorch),
combined p2p calls one ``SendRecv`` kernel. A forward tensor-parallel all-reduce, described by a
``record_param_comms`` CPU op around its launch (older PyTorch), is slipped inside each forward
compute.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd

from whatif.trace import Trace

_NCCL = {
    "params-all-gather": ("AllGather_RING_LL_Sum_bf16", "allgather"),
    "grads-reduce-scatter": ("ReduceScatter_RING_LL_Sum_bf16", "reduce_scatter"),
    "optimizer-clip-main-grad": ("AllReduce_RING_LL_Sum_float", "allreduce"),
    "separate-grads-all-reduce": ("AllReduce_RING_LL_Sum_float", "allreduce"),
}
_COMPUTE = ("forward-compute", "backward-compute", "optimizer")
_MAIN, _AUTOGRAD, _STREAM = 100, 200, 7


class _RankWriter:
    """The events of one rank's trace."""

    def __init__(self, rank: int, stage: int, dp_rank: int, prefix: str, directions: bool):
        self.rank, self.stage, self.dp_rank = rank, stage, dp_rank
        self.prefix, self.directions = prefix, directions
        self.events: list[dict[str, Any]] = []
        self.correlation = 1000

    def launch(self, ts: float, tid: int, name: str, dur: float, args: dict[str, Any]) -> None:
        self.correlation += 1
        common = {"ph": "X", "pid": self.rank}
        self.events.append(
            {
                **common,
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "tid": tid,
                "ts": ts - 3.0,
                "dur": 2.0,
                "args": {"correlation": self.correlation},
            }
        )
        self.events.append(
            {
                **common,
                "cat": "kernel",
                "name": name,
                "tid": _STREAM,
                "ts": ts,
                "dur": dur,
                "args": {"correlation": self.correlation, "stream": _STREAM, **args},
            }
        )

    def cpu(
        self,
        name: str,
        ts: float,
        dur: float,
        tid: int,
        cat: str = "cpu_op",
        args: dict[str, Any] | None = None,
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.rank,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args or {},
            }
        )

    def compute(self, kind: str, start: float, dur: float) -> None:
        tid = _AUTOGRAD if kind == "backward-compute" else _MAIN
        if kind == "backward-compute":
            self.cpu("autograd::engine::evaluate_function: MmBackward0", start - 10.0, dur, tid)
        if kind == "optimizer":
            self.cpu(
                "Optimizer.step#FusedAdam.step", start - 10.0, dur + 5.0, tid, cat="user_annotation"
            )
        half = dur / 2
        # Kernels run back to back: the GPU is busy for the whole op (its busy time is its
        # duration); in forward a tensor-parallel all-reduce fills the last fifth of the first half.
        first = half * 0.8 if kind == "forward-compute" else half
        self.launch(start, tid, "sm90_xmma_gemm_bf16bf16_bf16f32", first, {})
        if kind == "forward-compute":
            # A tensor-parallel all-reduce inside forward stays part of compute.
            self.cpu(
                "record_param_comms",
                start + half * 0.8 - 8.0,
                6.0,
                tid,
                args={"Collective name": "allreduce", "Process Group Name": "tp"},
            )
            self.launch(
                start + half * 0.8, tid, self.prefix + "AllReduce_RING_LL_Sum_bf16", half * 0.2, {}
            )
        self.launch(
            start + half, tid, "void at::native::vectorized_elementwise_kernel", dur - half, {}
        )

    def collective(self, kind: str, start: float, dur: float) -> None:
        kernel, name = _NCCL[kind]
        clip = kind == "optimizer-clip-main-grad"
        group = "world" if clip else f"dp_stage{self.stage}"
        if clip:
            self.cpu(
                "Optimizer.step#FusedAdam.step",
                start - 10.0,
                dur + 5.0,
                _MAIN,
                cat="user_annotation",
            )
        self.launch(
            start,
            _MAIN,
            self.prefix + kernel,
            dur,
            {"Collective name": name, "Process Group Name": group},
        )

    def p2p(self, kind: str, start: float, dur: float, combined: bool) -> None:
        args: dict[str, Any] = {}
        if combined:
            group = f"pp_dp{self.dp_rank}"
        else:
            if self.directions:
                args = {"Collective name": "send" if kind.endswith("send") else "recv"}
            peer = self.stage + (1 if kind in ("forward-send", "backward-recv") else -1)
            lo, hi = sorted((self.stage, peer))
            group = f"p2p_dp{self.dp_rank}_{lo}_{hi}"
        self.launch(
            start,
            _MAIN,
            self.prefix + "SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            dur,
            {**args, "Process Group Name": group},
        )

    def step(self, step: int, rows: pd.DataFrame) -> None:
        ordered = rows.sort_values("start_ts", kind="stable")
        t0 = ordered["start_ts"].min() * 1e6 - 50.0
        t1 = (ordered["start_ts"] + ordered["duration"]).max() * 1e6 + 50.0
        self.cpu(f"ProfilerStep#{step}", t0, t1 - t0, _MAIN, cat="user_annotation")
        records = list(ordered.itertuples(index=False))
        done: set[int] = set()
        for i, op in enumerate(records):
            start, dur, kind = op.start_ts * 1e6, op.duration * 1e6, str(op.optype)
            if i in done or kind == "gc" or dur <= 0:
                continue
            if kind in _COMPUTE:
                self.compute(kind, start, dur)
            elif kind in _NCCL:
                self.collective(kind, start, dur)
            else:
                # A combined p2p call is two rows with the same times and one kernel.
                partner = next(
                    (
                        j
                        for j in range(i + 1, len(records))
                        if records[j].start_ts == op.start_ts
                        and records[j].duration == op.duration
                        and str(records[j].optype).endswith(("send", "recv"))
                    ),
                    None,
                )
                if partner is not None:
                    done.add(partner)
                self.p2p(kind, start, dur, combined=partner is not None)


def write_kineto(
    trace: Trace,
    out_dir: Path,
    *,
    with_directions: bool = True,
    new_nccl_names: bool = True,
    gzip_files: bool = True,
) -> list[Path]:
    """Write one Kineto JSON per worker of ``trace`` (rank = stage · dp + dp_rank)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dp = trace.meta.dp_size
    prefix = "ncclDevKernel_" if new_nccl_names else "ncclKernel_"
    paths = []
    for (stage, d), rows in trace.ops.to_frame().groupby(["stage", "dp_rank"], sort=True):
        rank = int(stage) * dp + int(d)
        writer = _RankWriter(rank, int(stage), int(d), prefix, with_directions)
        for step, step_rows in rows.groupby("step", sort=True):
            writer.step(int(step), step_rows)
        data = {
            "schemaVersion": 1,
            "distributedInfo": {
                "backend": "nccl",
                "rank": rank,
                "world_size": int(trace.meta.world_size),
            },
            "traceEvents": writer.events,
        }
        path = out_dir / (f"rank-{rank}.json.gz" if gzip_files else f"rank-{rank}.json")
        raw = json.dumps(data).encode()
        path.write_bytes(gzip.compress(raw) if gzip_files else raw)
        paths.append(path)
    return paths
