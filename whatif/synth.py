"""Synthetic Megatron-style 1F1B job traces with known stragglers.

Used by tests (verdict thresholds, bad input, the Kineto importer) and the benchmark (5 M ops). A
job is described by its layout, per-op base durations and perturbations. Its trace is produced by
executing Megatron's 1F1B program: on each stage the main thread issues one call after another
(compute, send, recv, or a combined send+recv), each after the previous one has finished plus a
launch delay; a p2p call completes once its peer has posted the matching call, plus the transfer
time; a combined call completes when both halves have, and is recorded as two rows with the same
start and duration, as NDTimeline records it. This is the execution the dependency model
approximates, not the model itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif import optypes
from whatif.model import JobModel, Template
from whatif.scenarios import Replayer, Scenario
from whatif.trace import JobMeta, Trace, make_trace, optype_dtype


@dataclass(frozen=True)
class SynthJob:
    """A synthetic job.

    Durations are seconds. Perturbations: ``stage_factor`` multiplies compute on one stage (stage
    imbalance); ``seq_cv`` draws a per-microbatch log-normal factor shared by its forward and
    backward (sequence-length imbalance); ``slow_workers`` multiplies compute of (stage, dp)
    workers; ``comm_spike`` multiplies the transfer of a random share ``comm_spike_rate`` of DP
    collectives and p2p ops (congestion); ``gc_rate``/``gc_pause`` add forward-only pauses.
    """

    dp: int = 2
    pp: int = 4
    microbatches: int = 4
    steps: int = 4
    forward: float = 0.06
    backward: float = 0.12
    p2p: float = 0.0005
    params_all_gather: float = 0.02
    grads_reduce_scatter: float = 0.04
    clip: float = 0.004
    optimizer: float = 0.03
    layernorm: float = 0.00004
    embedding: float = 0.01
    launch_delay: float = 0.0002
    noise: float = 0.01
    stage_factor: dict[int, float] = field(default_factory=dict)
    seq_cv: float = 0.0
    slow_workers: dict[tuple[int, int], float] = field(default_factory=dict)
    comm_spike: float = 1.0
    comm_spike_rate: float = 0.0
    gc_rate: float = 0.0
    gc_pause: float = 0.0
    with_layernorm: bool = True
    with_embedding: bool = True
    with_gc: bool = True
    seed: int = 0
    name: str = "synthetic"


Call = list[tuple[str, int]]
"""One call of a stage's program: its ops as (op type, seq id); two for a combined p2p call."""


def program_1f1b(stage: int, pp: int, microbatches: int) -> list[Call]:
    """The calls Megatron's non-interleaved 1F1B schedule issues on ``stage`` (compute and p2p)."""
    first, last = stage == 0, stage == pp - 1
    warmup = min(pp - stage - 1, microbatches)
    remaining = microbatches - warmup
    calls: list[Call] = []

    def add(*ops: tuple[str, int] | None) -> None:
        kept = [op for op in ops if op is not None]
        if kept:
            calls.append(kept)

    rf = (lambda i: None) if first else (lambda i: (optypes.FORWARD_RECV, i))
    sf = (lambda i: None) if last else (lambda i: (optypes.FORWARD_SEND, i))
    rb = (lambda i: None) if last else (lambda i: (optypes.BACKWARD_RECV, i))
    sb = (lambda i: None) if first else (lambda i: (optypes.BACKWARD_SEND, i))
    for i in range(warmup):
        add(rf(i))
        add((optypes.FORWARD_COMPUTE, i))
        add(sf(i))
    if remaining:
        add(rf(warmup))
    for i in range(remaining):
        add((optypes.FORWARD_COMPUTE, warmup + i))
        add(sf(warmup + i), rb(i))
        add((optypes.BACKWARD_COMPUTE, i))
        if i == remaining - 1:
            add(sb(i))
        else:
            add(sb(i), rf(warmup + i + 1))
    for i in range(remaining, microbatches):
        add(rb(i))
        add((optypes.BACKWARD_COMPUTE, i))
        add(sb(i))
    return calls


def _tail(job: SynthJob, stage: int) -> list[str]:
    tail = [optypes.GC] if job.with_gc else []
    if job.with_layernorm:
        tail.append(optypes.LAYERNORM_GRADS_ALL_REDUCE)
    if job.with_embedding and stage in (0, job.pp - 1):
        tail.append(optypes.EMBEDDING_GRADS_ALL_REDUCE)
    return [
        *tail,
        optypes.GRADS_REDUCE_SCATTER,
        optypes.OPTIMIZER_CLIP_MAIN_GRAD,
        optypes.OPTIMIZER,
    ]


@dataclass
class _Program:
    """The executed program of one step of one DP rank, as a template for the replay engine."""

    template: Template
    record: np.ndarray  # per op: the op whose end ends the recorded row (itself, or a join)
    emitted: np.ndarray  # per op: whether it is a trace row (joins are not)
    same_start: list[tuple[int, int]]  # halves of combined calls


def _program(job: SynthJob) -> _Program:
    stage_l: list[int] = []
    type_l: list[str] = []
    seq_l: list[int] = []
    deps: list[list[int]] = []
    emitted: list[bool] = []
    record: list[int] = []
    same_start: list[tuple[int, int]] = []

    def new(stage: int, optype: str, seq: int, after: list[int], emit: bool = True) -> int:
        stage_l.append(stage)
        type_l.append(optype)
        seq_l.append(seq)
        deps.append(list(after))
        emitted.append(emit)
        record.append(len(record))
        return len(stage_l) - 1

    index: dict[tuple[int, str, int], int] = {}
    for s in range(job.pp):
        previous = [new(s, optypes.PARAMS_ALL_GATHER, 0, [])]
        index[(s, optypes.PARAMS_ALL_GATHER, 0)] = previous[0]
        for call in program_1f1b(s, job.pp, job.microbatches):
            ops = [new(s, t, k, previous) for t, k in call]
            for (t, k), op in zip(call, ops, strict=True):
                index[(s, t, k)] = op
            if len(ops) == 1:
                previous = ops
                continue
            join = new(s, optypes.GC, -1, ops, emit=False)
            for op in ops:
                record[op] = join
            same_start.append((ops[0], ops[1]))
            previous = [join]
        for t in _tail(job, s):
            op = new(s, t, 0, previous)
            index[(s, t, 0)] = op
            previous = [op]
    n = len(stage_l)
    optype = np.array(type_l, dtype=object)
    group = np.full(n, -1, dtype=np.int64)
    members: list[tuple[int, ...]] = []
    synced: list[bool] = []

    def add_group(ops: list[int], dp_synced: bool) -> None:
        group[ops] = len(members)
        members.append(tuple(ops))
        synced.append(dp_synced)

    for s in range(job.pp - 1):
        for k in range(job.microbatches):
            add_group(
                [index[(s, optypes.FORWARD_SEND, k)], index[(s + 1, optypes.FORWARD_RECV, k)]],
                False,
            )
            add_group(
                [index[(s + 1, optypes.BACKWARD_SEND, k)], index[(s, optypes.BACKWARD_RECV, k)]],
                False,
            )
    for s in range(job.pp):
        for t in (optypes.PARAMS_ALL_GATHER, optypes.GRADS_REDUCE_SCATTER):
            add_group([index[(s, t, 0)]], True)
        if job.with_layernorm:
            add_group([index[(s, optypes.LAYERNORM_GRADS_ALL_REDUCE, 0)]], False)
    if job.with_embedding:
        add_group(
            sorted({index[(s, optypes.EMBEDDING_GRADS_ALL_REDUCE, 0)] for s in (0, job.pp - 1)}),
            False,
        )
    add_group([index[(s, optypes.OPTIMIZER_CLIP_MAIN_GRAD, 0)] for s in range(job.pp)], True)
    template = Template(
        stage=np.array(stage_l, dtype=np.int64),
        optype=optype,
        seq_id=np.array(seq_l, dtype=np.int64),
        mc=np.where(np.isin(optype, [*optypes.COMPUTE, *optypes.DP_COMM]), 0, -1),
        is_comm=group >= 0,
        deps=tuple(tuple(d) for d in deps),
        group=group,
        group_members=tuple(members),
        group_dp_synced=np.array(synced, dtype=bool),
    )
    return _Program(template, np.array(record), np.array(emitted), same_start)


def synthesize(job: SynthJob) -> Trace:
    """Generate the trace of ``job`` (one row per op, every step and DP rank)."""
    rng = np.random.default_rng(job.seed)
    prog = _program(job)
    template = prog.template
    n, steps, dp = template.n_ops, job.steps, job.dp
    by_type = {
        optypes.FORWARD_COMPUTE: job.forward,
        optypes.BACKWARD_COMPUTE: job.backward,
        optypes.PARAMS_ALL_GATHER: job.params_all_gather,
        optypes.GRADS_REDUCE_SCATTER: job.grads_reduce_scatter,
        optypes.OPTIMIZER_CLIP_MAIN_GRAD: job.clip,
        optypes.OPTIMIZER: job.optimizer,
        optypes.LAYERNORM_GRADS_ALL_REDUCE: job.layernorm,
        optypes.EMBEDDING_GRADS_ALL_REDUCE: job.embedding,
        optypes.GC: 0.0,
        **dict.fromkeys(optypes.P2P, job.p2p),
    }
    base = np.array([by_type[str(t)] for t in template.optype])
    base[~prog.emitted] = 0.0
    weights = base[:, None, None] * rng.lognormal(0.0, job.noise, size=(n, steps, dp))
    compute = np.isin(template.optype, list(optypes.COMPUTE))
    for slow_stage, factor in job.stage_factor.items():
        weights[compute & (template.stage == slow_stage)] *= factor
    if job.seq_cv > 0:
        # A microbatch's sequences are the same on every stage; drawn per (step, dp, microbatch).
        sigma = np.sqrt(np.log1p(job.seq_cv**2))
        mix = rng.lognormal(-(sigma**2) / 2, sigma, size=(job.microbatches, steps, dp))
        weights[compute] *= mix[template.seq_id[compute]]
    for (slow_stage, d), factor in job.slow_workers.items():
        weights[compute & (template.stage == slow_stage), :, d] *= factor
    if job.comm_spike_rate > 0:
        comm = np.isin(template.optype, [*optypes.DP_COMM, *optypes.P2P])
        spikes = rng.random((int(comm.sum()), steps, dp)) < job.comm_spike_rate
        weights[comm] *= np.where(spikes, job.comm_spike, 1.0)
    if job.gc_rate > 0:
        fwd = template.ops_of([optypes.FORWARD_COMPUTE])
        hit = rng.random((len(fwd), steps, dp)) < job.gc_rate
        weights[fwd] += np.where(hit, job.gc_pause, 0.0)
    delays = (
        rng.exponential(job.launch_delay, size=(n, steps, dp))
        if job.launch_delay
        else np.zeros((n, steps, dp))
    )
    delays[~prog.emitted] = 0.0
    for a, b in prog.same_start:  # the two halves of a combined call are one launch
        delays[b] = delays[a]
    model = JobModel(
        template=template,
        steps=np.arange(steps),
        dp_size=dp,
        start=np.zeros((n, steps, dp)),
        duration=weights,
        transfer=weights,
        launch_delay=delays,
        ideal=base,
    )
    start, end = Replayer(model).timeline(Scenario("actual", launch_delay=True))
    end = end[prog.record]
    step_time = end.max(axis=(0, 2))
    offset = np.concatenate([[0.0], np.cumsum(step_time + 0.05)[:-1]])
    start = start + offset[None, :, None]
    end = end + offset[None, :, None]
    keep = np.flatnonzero(prog.emitted)
    shape = (len(keep), steps, dp)
    op_idx = np.broadcast_to(keep[:, None, None], shape).ravel()
    step_idx = np.broadcast_to(np.arange(steps)[None, :, None], shape).ravel()
    dp_idx = np.broadcast_to(np.arange(dp)[None, None, :], shape).ravel()
    stage = template.stage[op_idx]
    is_compute = compute[op_idx]
    codes = np.array([optypes.ALL.index(str(t)) for t in template.optype])[op_idx]
    seq = template.seq_id[op_idx]
    frame = pd.DataFrame(
        {
            "dp_rank": dp_idx,
            "stage": stage,
            "rank": stage * dp + dp_idx,
            "step": step_idx,
            "optype": pd.Categorical.from_codes(codes, dtype=optype_dtype()),
            "start_ts": start[keep].ravel(),
            "duration": (end[keep] - start[keep]).ravel(),
            "seq_id": seq,
            "mc": template.mc[op_idx],
            "gmc": np.where(is_compute, stage, -1),
            "mb_id": np.where(is_compute, seq, -1),
        }
    )
    meta = JobMeta(dp_size=dp, pp_size=job.pp, name=job.name)
    return make_trace(frame, meta, source=f"synthetic:{job.name}")
