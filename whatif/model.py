"""The per-step dependency model of one model-parallel group, and the trace laid out on it.

One step of one model-parallel group (all PP stages of one DP rank) is turned into a template
graph of ops; every (step, DP rank) of the job must have the same ops, so the whole trace becomes
dense ``(op, step, dp)`` arrays and a replay costs Python work per template op only
(``docs/whatif-method.md`` §2). Laying the trace out is linear in its rows: each row's
``(op key, step, DP rank)`` cell is numbered through lookup tables and the dense arrays are
gathered from the cells, with no sort of the table (§3.1).

Rules (Megatron-LM 1F1B / interleaved schedules, ZeRO-style DP):

* compute: all forward/backward compute ops of a stage form one chain in observed start order;
* p2p: each of the four p2p streams is a chain; a recv depends on the compute before the compute
  that consumes it, and that compute depends on the recv; a send depends on the compute that
  produced it; the k-th send from stage s is paired with the k-th recv on its neighbour stage;
* DP: parameter all-gathers and gradient reduce-scatters are chained in observed order; the first
  forward compute of each model chunk depends on that chunk's all-gather;
* after the last compute: ``gc → layernorm-AR → [embedding-AR] → (grads-RS… | separate-AR) → clip
  → optimizer``;
* comm groups (a comm op ends ``transfer`` after the last member starts): p2p pairs; DP
  collectives over every DP rank of the stage; embedding all-reduce between the first and last
  stage; the grad-norm all-reduce (``optimizer-clip-main-grad``) over every worker.

Recorded durations of comm ops include waiting for peers; only ``transfer = end − max(start over
the group)`` is kept. ``launch_delay = start − max(end of deps)`` captures untraced CPU work.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from minder.core.errors import TraceError
from whatif import optypes
from whatif.trace import Trace

logger = logging.getLogger(__name__)

CLOCK_TOLERANCE_S = 0.01
"""Negative transfers and launch delays at or below −10 ms are clock error and set to 0."""

NOOP_DURATION_S = 1e-6
"""A surplus p2p op this short is a no-op call of the schedule (dropped, with a count)."""

_FloatArray = np.ndarray


@dataclass(frozen=True)
class Template:
    """The dependency graph of one step of one model-parallel group.

    Attributes
    ----------
    stage, optype, seq_id, mc
        Per template op.
    is_comm
        Per op: a comm op (ends ``transfer`` after its group's last start).
    deps
        Per op: indices of the ops it waits for.
    group
        Per comm op: its group index (−1 for other ops).
    group_members
        Per group: its member op indices.
    group_dp_synced
        Per group: whether it also spans every DP rank.
    """

    stage: np.ndarray
    optype: np.ndarray
    seq_id: np.ndarray
    mc: np.ndarray
    is_comm: np.ndarray
    deps: tuple[tuple[int, ...], ...]
    group: np.ndarray
    group_members: tuple[tuple[int, ...], ...]
    group_dp_synced: np.ndarray

    @property
    def n_ops(self) -> int:
        """Number of ops in one step of one model-parallel group."""
        return len(self.stage)

    def op_name(self, op: int) -> str:
        """``<optype>_<seq_id>_<stage>``, as the artifact names ops."""
        return f"{self.optype[op]}_{self.seq_id[op]}_{self.stage[op]}"

    def ops_of(self, optypes_: Sequence[str]) -> np.ndarray:
        """Indices of template ops whose type is in ``optypes_``."""
        return np.flatnonzero(np.isin(self.optype, list(optypes_)))


@dataclass
class JobModel:
    """A trace laid out on its template: dense ``(op, step, dp)`` arrays.

    Attributes
    ----------
    template
        The dependency graph of one step of one model-parallel group.
    steps
        Step ids (the trace's ``step`` values) along axis 1.
    dp_size
        Length of axis 2.
    start, duration
        Recorded start (relative to the step's first start) and duration, seconds.
    transfer
        Comm ops: ``end − max(start over the group)``; other ops: their duration.
    launch_delay
        ``start − max(end of deps)`` (from the step's first start for ops without deps).
    ideal
        Per template op: its ideal duration (mean of its type for compute, median transfer of its
        type for comm; of the op itself over steps and DP ranks when ``ideal_pooling`` is
        ``op``).
    worker_rank
        ``(pp, dp)``: the global rank of each worker, −1 where the trace does not say.
    notes
        What was dropped or clamped while building the model, with counts.
    """

    template: Template
    steps: np.ndarray
    dp_size: int
    start: _FloatArray
    duration: _FloatArray
    transfer: _FloatArray
    launch_delay: _FloatArray
    ideal: _FloatArray
    worker_rank: np.ndarray = field(default_factory=lambda: np.empty((0, 0), dtype=np.int64))
    notes: list[str] = field(default_factory=list)
    ideal_pooling: str = "type"

    @property
    def n_steps(self) -> int:
        """Number of steps modelled."""
        return len(self.steps)

    @property
    def n_ops_total(self) -> int:
        """Number of ops in the whole job (all steps, all DP ranks)."""
        return self.template.n_ops * self.n_steps * self.dp_size

    @property
    def pp_size(self) -> int:
        """Number of pipeline stages."""
        return int(self.template.stage.max()) + 1

    @property
    def end(self) -> _FloatArray:
        """Recorded end of every op."""
        return self.start + self.duration


# --------------------------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------------------------


@dataclass
class _TemplateOps:
    """The ops of one step of one model-parallel group, before their dependencies."""

    stage: np.ndarray
    optype: np.ndarray
    seq_id: np.ndarray
    mc: np.ndarray

    def name(self, op: int) -> str:
        return f"{self.optype[op]}_{self.seq_id[op]}_{self.stage[op]}"

    def select(self, ops: np.ndarray) -> _TemplateOps:
        return _TemplateOps(self.stage[ops], self.optype[ops], self.seq_id[ops], self.mc[ops])


def build_model(trace: Trace) -> JobModel:
    """Lay ``trace`` out on the dependency model of one model-parallel group.

    Steps that cannot be modelled (a DP rank or op missing, an op duplicated, an op not in the
    template, a different compute order) are dropped and counted in ``notes``.

    Parameters
    ----------
    trace
        A validated trace.

    Raises
    ------
    TraceError
        No step can be modelled, more than half of the steps cannot, send and recv ops do not
        pair up, or the dependencies have a cycle; the message says which.
    """
    ops = trace.ops
    notes: list[str] = []
    where = trace.source or "trace"
    if len(ops) == 0:
        raise TraceError("the trace has no ops", where=where)
    dp = trace.meta.dp_size
    n_rows = len(ops)
    stage_col = ops["stage"]
    seq_col = ops["seq_id"]
    dp_col = ops["dp_rank"]
    step_col = ops["step"]
    start_col = np.asarray(ops["start_ts"], dtype=np.float64)
    duration_col = np.asarray(ops["duration"], dtype=np.float64)
    # An op is (stage, type, seq), packed into one integer and numbered densely in packed order.
    n_types = len(optypes.ALL)
    seq_min = int(seq_col.min())
    seq_span = int(seq_col.max()) - seq_min + 1
    key_space = (int(stage_col.max()) + 1) * n_types * seq_span
    packed = _pack_keys(stage_col, ops["optype"], seq_col, seq_min, seq_span)
    key_uniques, cell = _dense_codes(packed, key_space)
    del packed
    step_min = int(step_col.min())
    step_values, step_idx = _dense_codes(
        _offset(step_col, step_min), int(step_col.max()) - step_min + 1
    )
    steps_all = step_values + step_min
    n_keys, n_steps_all = len(key_uniques), len(steps_all)
    n_units = n_steps_all * dp
    # Every row's cell in the dense (key, step, dp) table, computed in place.
    n_cells = n_keys * n_units
    cell = cell.astype(_index_dtype(n_cells), copy=False)
    cell *= n_steps_all
    cell += step_idx
    del step_idx
    cell *= dp
    cell += dp_col
    # The row of each cell (the last one when a cell has several): a gather, not a sort.
    cell_row: np.ndarray = np.full(n_cells, -1, dtype=_index_dtype(n_rows))
    cell_row[cell] = np.arange(n_rows, dtype=cell_row.dtype)
    multiple: np.ndarray | None = None
    if int(np.count_nonzero(cell_row >= 0)) < n_rows:
        multiple = _drop_exact_duplicates(cell, cell_row, start_col, duration_col, n_cells, notes)
    del cell

    # The template is the set of ops most (step, DP rank) units have.
    present = (cell_row >= 0).reshape(n_keys, n_units)
    units_present = int(present.any(axis=0).sum())
    template_keys = present.sum(axis=1) * 2 > units_present
    every_key = bool(template_keys.all())
    bad_unit = np.zeros(n_units, dtype=bool)
    reasons: dict[str, int] = {}
    if multiple is not None:
        _flag(
            bad_unit,
            np.flatnonzero(multiple.reshape(n_keys, n_units).any(axis=0)),
            reasons,
            "an op appears twice with different times",
        )
        del multiple
    if not every_key:
        _flag(
            bad_unit,
            np.flatnonzero(present[~template_keys].any(axis=0)),
            reasons,
            "an op that other steps do not have",
        )
    n_template = int(template_keys.sum())
    in_template = present if every_key else present[template_keys]
    _flag(
        bad_unit,
        np.flatnonzero(in_template.sum(axis=0) < n_template),
        reasons,
        "ops or a DP rank missing",
    )
    del present, in_template

    # Template ops sorted by stage, then type, then seq (the packed order) for readable indices.
    template_keys_idx = np.flatnonzero(template_keys)
    tkeys = key_uniques[template_keys_idx]
    tops = _TemplateOps(
        stage=tkeys // (n_types * seq_span),
        optype=np.array(optypes.ALL, dtype=object)[(tkeys // seq_span) % n_types],
        seq_id=tkeys % seq_span + seq_min,
        mc=np.full(len(tkeys), -1, dtype=np.int64),
    )
    op_rows = cell_row.reshape(n_keys, n_steps_all, dp)
    if not every_key:
        op_rows = op_rows[template_keys_idx]
    del cell_row
    n_ops = len(tops.stage)
    start = start_col[op_rows]
    duration = duration_col[op_rows]
    missing = op_rows < 0
    if missing.any():
        start[missing] = np.nan
        duration[missing] = np.nan
    del missing
    # Each template op's chunk is that of its last row in the table.
    tops.mc[:] = ops["mc"][op_rows.reshape(n_ops, -1).max(axis=1)]
    del op_rows

    # A step is modelled only if all its DP ranks are (DP collectives couple them).
    bad_step = bad_unit.reshape(n_steps_all, dp).any(axis=1)
    good_units = ~bad_unit.reshape(n_steps_all, dp)
    if not (~bad_step).any():
        raise TraceError("no step can be modelled: " + _reason_text(reasons), where=where)
    ref_step = int(np.flatnonzero(~bad_step)[0])

    # Compute order must match the reference unit.
    compute_ops = np.flatnonzero(np.isin(tops.optype, list(optypes.COMPUTE)))
    order_ok = _same_compute_order(tops.stage, compute_ops, start, ref_step)
    order_bad_units = ~order_ok & good_units
    if order_bad_units.any():
        units_bad = np.flatnonzero(order_bad_units.ravel())
        _flag(bad_unit, units_bad, reasons, "a different compute order")
        bad_step = bad_unit.reshape(n_steps_all, dp).any(axis=1)
    n_bad = int(bad_step.sum())
    if n_bad * 2 > n_steps_all:
        raise TraceError(
            f"{n_bad} of {n_steps_all} steps cannot be modelled: {_reason_text(reasons)}",
            where=where,
        )
    if n_bad:
        bad_ids = steps_all[bad_step]
        notes.append(
            f"dropped {n_bad} of {n_steps_all} steps (steps {_list(bad_ids)}): "
            f"{_reason_text(reasons)}"
        )
        keep = ~bad_step
        start = start[:, keep, :]
        duration = duration[:, keep, :]
    steps = steps_all[~bad_step]
    # Times are relative to each step's first start.
    step_first = np.nanmin(start, axis=(0, 2))
    start -= step_first[None, :, None]

    template, dropped_ops = _build_template(tops, start, duration, trace.meta.pp_size)
    if dropped_ops is not None:
        keep_ops = np.setdiff1d(np.arange(n_ops), dropped_ops)
        notes.append(
            f"dropped {len(dropped_ops)} no-op p2p op(s) per step and DP rank "
            f"({', '.join(sorted({tops.name(o) for o in dropped_ops})[:_MAX_NAMES])}): "
            "outside the pipeline's send/recv pattern, zero duration"
        )
        start = start[keep_ops]
        duration = duration[keep_ops]
        template, _ = _build_template(tops.select(keep_ops), start, duration, trace.meta.pp_size)
    transfer, n_clamped_tr = _transfer(template, start, duration)
    launch_delay, n_clamped_ld = _launch_delay(template, start, duration)
    if n_clamped_tr:
        notes.append(
            f"{n_clamped_tr} comm op(s) ended over {CLOCK_TOLERANCE_S * 1e3:.0f} ms before their "
            "last peer started (clock skew): transfer set to 0"
        )
    if n_clamped_ld:
        notes.append(
            f"{n_clamped_ld} op(s) started over {CLOCK_TOLERANCE_S * 1e3:.0f} ms before their "
            "dependencies ended (clock skew or a dependency the model lacks): launch delay set to 0"
        )
    model = JobModel(
        template=template,
        steps=steps,
        dp_size=dp,
        start=start,
        duration=duration,
        transfer=transfer,
        launch_delay=launch_delay,
        ideal=np.zeros(template.n_ops),
        worker_rank=_worker_rank(stage_col, dp_col, ops["rank"], trace.meta.pp_size, dp),
        notes=notes,
        ideal_pooling=trace.meta.ideal_pooling,
    )
    model.ideal = ideal_durations(model)
    return model


_MAX_NAMES = 6

_DENSE_SPAN = 1 << 22
"""Key or step spans up to this (or up to twice the rows) are numbered through a lookup table
(linear); larger ones by sorting (``np.unique``)."""


def _index_dtype(size: int) -> type:
    """int32 for indices below ``size`` when it fits, else int64."""
    return np.int32 if size < np.iinfo(np.int32).max else np.int64


def _offset(values: np.ndarray, low: int) -> np.ndarray:
    """``values − low`` in a signed type wide enough for the difference."""
    if not low:
        return values
    high = int(values.max()) - low if len(values) else 0
    return np.subtract(values, low, dtype=np.int64).astype(_index_dtype(high + 1), copy=False)


def _pack_keys(
    stage: np.ndarray, optype: np.ndarray, seq: np.ndarray, seq_min: int, seq_span: int
) -> np.ndarray:
    """Per row: ``(stage · n_types + optype) · seq_span + (seq − seq_min)``, in place in one
    array of the narrowest index type."""
    n_types = len(optypes.ALL)
    space = (int(stage.max()) + 1) * n_types * seq_span + abs(seq_min)
    packed: np.ndarray = stage.astype(_index_dtype(space))
    packed *= n_types
    packed += optype
    packed *= seq_span
    packed += seq
    if seq_min:
        packed -= seq_min
    return packed


def _dense_codes(values: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct ``values`` (all in ``0..space−1``) and each value's index among them.

    A lookup table over the value space when it is not much larger than the data (linear
    time); otherwise ``np.unique`` (a sort)."""
    if space <= max(_DENSE_SPAN, 2 * len(values)):
        seen = np.zeros(space, dtype=bool)
        seen[values] = True
        uniques = np.flatnonzero(seen)
        del seen
        number: np.ndarray = np.full(space, -1, dtype=_index_dtype(len(uniques)))
        number[uniques] = np.arange(len(uniques), dtype=number.dtype)
        return uniques, number[values]
    uniques, codes = np.unique(values, return_inverse=True)
    return uniques, codes.astype(_index_dtype(len(uniques)), copy=False)


def _drop_exact_duplicates(
    cell: np.ndarray,
    cell_row: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    n_cells: int,
    notes: list[str],
) -> np.ndarray:
    """Rows of one cell with the same start and duration are one op recorded twice: all but
    the first are dropped (``cell_row`` then holds the last kept row of each cell). Returns
    which cells still have several rows (an op that appears twice with different times)."""
    counts = np.bincount(cell, minlength=n_cells)
    rows = np.flatnonzero(counts[cell] > 1)
    order = rows[np.lexsort((duration[rows], start[rows], cell[rows]))]
    same = (
        (cell[order][1:] == cell[order][:-1])
        & (start[order][1:] == start[order][:-1])
        & (duration[order][1:] == duration[order][:-1])
    )
    if same.any():
        dropped = order[1:][same]
        np.subtract.at(counts, cell[dropped], 1)
        notes.append(f"dropped {int(same.sum())} exact duplicate row(s)")
        keep_row = np.ones(len(cell), dtype=bool)
        keep_row[dropped] = False
        kept = np.flatnonzero(keep_row)
        cell_row.fill(-1)
        cell_row[cell[kept]] = kept
    return counts > 1


def _worker_rank(
    stage: np.ndarray, dp_rank: np.ndarray, rank: np.ndarray, pp: int, dp: int
) -> np.ndarray:
    """``(pp, dp)``: each worker's global rank (of its last row that names one), −1 if none."""
    ranks = np.full(pp * dp, -1, dtype=np.int64)
    worker: np.ndarray = stage.astype(_index_dtype(pp * dp)) * dp
    worker += dp_rank
    known = rank >= 0
    if known.all():
        ranks[worker] = rank
    else:
        ranks[worker[known]] = rank[known]
    return ranks.reshape(pp, dp)


def _list(values: np.ndarray) -> str:
    shown = ", ".join(str(v) for v in values[:_MAX_NAMES])
    return shown + (f", … ({len(values)} in all)" if len(values) > _MAX_NAMES else "")


def _flag(bad: np.ndarray, units: np.ndarray, reasons: dict[str, int], reason: str) -> None:
    units = units[~bad[units]]
    if len(units):
        bad[units] = True
        reasons[reason] = reasons.get(reason, 0) + len(units)


def _reason_text(reasons: dict[str, int]) -> str:
    if not reasons:
        return "no reason recorded"
    return "; ".join(f"{reason} ({n} step×DP-rank unit(s))" for reason, n in reasons.items())


def _same_compute_order(
    stages: np.ndarray, compute_ops: np.ndarray, start: np.ndarray, ref_step: int
) -> np.ndarray:
    """Per (step, dp): whether every stage runs its compute ops in the reference order."""
    n_steps, dp = start.shape[1], start.shape[2]
    ok = np.ones((n_steps, dp), dtype=bool)
    for stage in np.unique(stages[compute_ops]):
        ops = compute_ops[stages[compute_ops] == stage]
        # The reference order (a stable sort of the reference unit, missing ops last); a unit
        # has it iff each op in it starts after the one before, or at the same time when the
        # earlier one has the lower index (what a stable sort of that unit would give).
        ref = start[ops, ref_step, 0]
        order = ops[np.argsort(np.where(np.isnan(ref), np.inf, ref), kind="stable")]
        ascending = order[1:] > order[:-1]
        for part in _op_chunks(len(order) - 1, n_steps * dp):
            a, b = start[order[part]], start[order[part.start + 1 : part.stop + 1]]
            a[np.isnan(a)] = np.inf
            b[np.isnan(b)] = np.inf
            ok &= ((a < b) | ((a == b) & ascending[part, None, None])).all(axis=0)
    return ok


_CHUNK_VALUES = 1 << 21
"""Values (ops × steps × DP ranks) one vectorised step of the model build handles at once."""


def _op_chunks(n_ops: int, per_op: int) -> list[slice]:
    """Slices of ``range(n_ops)`` of at most :data:`_CHUNK_VALUES` values each (at least one op):
    one slice for a small trace, bounded temporaries for a large one."""
    size = max(1, _CHUNK_VALUES // max(per_op, 1))
    return [slice(a, min(a + size, n_ops)) for a in range(0, n_ops, size)]


def _build_template(
    tops: _TemplateOps,
    start: np.ndarray,
    duration: np.ndarray,
    pp_size: int,
) -> tuple[Template, np.ndarray | None]:
    """Build the dependency graph; return the op indices to drop as no-ops if there are any."""
    stage, optype, seq_id, mc = tops.stage, tops.optype, tops.seq_id, tops.mc
    n = len(stage)
    ref_start = start[:, 0, 0]
    is_compute_op = np.isin(optype, list(optypes.COMPUTE))
    last_chunk = max(int(mc[is_compute_op].max()) if is_compute_op.any() else 0, 0)
    deps: list[set[int]] = [set() for _ in range(n)]
    by_stage_type: dict[tuple[int, str], np.ndarray] = {}
    for s in np.unique(stage):
        for t in np.unique(optype[stage == s]):
            idx = np.flatnonzero((stage == s) & (optype == t))
            by_stage_type[(int(s), str(t))] = idx[np.argsort(seq_id[idx], kind="stable")]

    def of(s: int, t: str) -> np.ndarray:
        return by_stage_type.get((s, t), np.empty(0, dtype=np.int64))

    def chain(idx: Sequence[int] | np.ndarray) -> None:
        for a, b in itertools.pairwise(idx):
            deps[int(b)].add(int(a))

    n_stages = max(pp_size, int(stage.max()) + 1)
    noops: list[int] = []
    # p2p matching: per stage, the computes that need each p2p type, in compute-chain order.
    p2p_valid: dict[tuple[int, str], np.ndarray] = {}
    compute_chain: dict[int, np.ndarray] = {}
    for s in range(n_stages):
        comp = np.concatenate([of(s, optypes.FORWARD_COMPUTE), of(s, optypes.BACKWARD_COMPUTE)])
        comp = comp[np.argsort(ref_start[comp], kind="stable")]
        compute_chain[s] = comp
        chain(comp)
        fwd = comp[optype[comp] == optypes.FORWARD_COMPUTE]
        bwd = comp[optype[comp] == optypes.BACKWARD_COMPUTE]
        needs = {
            optypes.FORWARD_RECV: fwd[~_model_first(s, mc[fwd], pp_size)],
            optypes.FORWARD_SEND: fwd[~_model_last(s, mc[fwd], pp_size, last_chunk)],
            optypes.BACKWARD_RECV: bwd[~_model_last(s, mc[bwd], pp_size, last_chunk)],
            optypes.BACKWARD_SEND: bwd[~_model_first(s, mc[bwd], pp_size)],
        }
        for ptype, consumers in needs.items():
            p2p = of(s, ptype)
            if len(p2p) > len(consumers):
                surplus = _surplus_noops(p2p, len(consumers), duration)
                if surplus is None:
                    raise TraceError(
                        f"stage {s} has {len(p2p)} {ptype} op(s) per step but "
                        f"{len(consumers)} compute op(s) that need one, and the surplus is not a "
                        "run of zero-duration no-ops",
                        where=f"stage {s}, {ptype}",
                    )
                noops.extend(int(o) for o in surplus)
                p2p = np.setdiff1d(p2p, surplus)
                p2p = p2p[np.argsort(seq_id[p2p], kind="stable")]
            elif len(p2p) < len(consumers):
                raise TraceError(
                    f"unmatched send/recv pairs: stage {s} has {len(p2p)} {ptype} op(s) per step "
                    f"but {len(consumers)} compute op(s) that need one",
                    where=f"stage {s}, {ptype}",
                )
            p2p_valid[(s, ptype)] = p2p
            chain(p2p)
            is_recv = ptype in (optypes.FORWARD_RECV, optypes.BACKWARD_RECV)
            same_dir = fwd if ptype == optypes.FORWARD_RECV else bwd
            for op, comp_op in zip(p2p, consumers, strict=True):
                if not is_recv:
                    deps[int(op)].add(int(comp_op))
                    continue
                deps[int(comp_op)].add(int(op))
                # A recv is posted once the previous compute of its direction is done.
                pos = int(np.flatnonzero(same_dir == comp_op)[0])
                if pos > 0:
                    deps[int(op)].add(int(same_dir[pos - 1]))
                elif ptype == optypes.BACKWARD_RECV:
                    # The first backward recv is posted during warm-up, two computes before the
                    # first backward (Megatron's 1F1B issues it with an earlier forward send).
                    first_bwd = int(np.flatnonzero(comp == comp_op)[0])
                    if first_bwd >= 2:
                        deps[int(op)].add(int(comp[first_bwd - 2]))
    if noops:
        return _empty_template(), np.array(sorted(set(noops)), dtype=np.int64)

    # Collectives on the compute path (all-to-all): §2.7.
    for s in range(n_stages):
        _inline_collectives(of(s, optypes.ALL_TO_ALL), compute_chain[s], start, duration, deps)

    # DP stream and the post-backward chain.
    for s in range(n_stages):
        comp = compute_chain[s]
        pag = of(s, optypes.PARAMS_ALL_GATHER)
        rs = of(s, optypes.GRADS_REDUCE_SCATTER)
        sep = of(s, optypes.SEPARATE_GRADS_ALL_REDUCE)
        dp_stream = np.concatenate([pag, rs])
        dp_stream = dp_stream[np.argsort(ref_start[dp_stream], kind="stable")]
        chain(dp_stream)
        fwd = comp[optype[comp] == optypes.FORWARD_COMPUTE]
        for chunk in np.unique(mc[fwd]) if len(fwd) else []:
            first_fwd = fwd[mc[fwd] == chunk][0]
            gathers = pag[mc[pag] == chunk] if (mc[pag] >= 0).any() else pag[:1]
            for g in gathers:
                deps[int(first_fwd)].add(int(g))
        tail: list[list[int]] = []
        gc = of(s, optypes.GC)
        overlapped = len(sep) > 0
        if overlapped:
            bwd = comp[optype[comp] == optypes.BACKWARD_COMPUTE]
            for r in rs:
                same_chunk = bwd[mc[bwd] == mc[r]] if (mc[rs] >= 0).any() else bwd
                if len(same_chunk):
                    deps[int(r)].add(int(same_chunk[-1]))
        head = [int(comp[-1])] if len(comp) else []
        if len(gc):
            tail.append([int(g) for g in gc])
        tail.extend([[int(o)] for o in of(s, optypes.LAYERNORM_GRADS_ALL_REDUCE)])
        tail.extend([[int(o)] for o in of(s, optypes.EMBEDDING_GRADS_ALL_REDUCE)])
        if overlapped:
            tail.extend([[int(o)] for o in sep])
        else:
            tail.extend([[int(o)] for o in rs])
        tail.extend([[int(o)] for o in of(s, optypes.OPTIMIZER_CLIP_MAIN_GRAD)])
        tail.extend([[int(o)] for o in of(s, optypes.OPTIMIZER)])
        previous = head
        for link in tail:
            for op in link:
                deps[op].update(previous)
                if overlapped and len(rs) and optype[op] == optypes.LAYERNORM_GRADS_ALL_REDUCE:
                    deps[op].add(int(rs[-1]))
            previous = link
        # gc runs once per stage; chained gc ops keep their order.
        chain(gc)
        # An inline collective that no compute consumes feeds the optimizer.
        for op in of(s, optypes.ALL_TO_ALL):
            if not any(int(op) in deps[int(c)] for c in comp):
                for o in of(s, optypes.OPTIMIZER):
                    deps[int(o)].add(int(op))

    group = np.full(n, -1, dtype=np.int64)
    members: list[tuple[int, ...]] = []
    synced: list[bool] = []

    def add_group(idx: Sequence[int] | np.ndarray, dp_synced: bool) -> None:
        group[list(idx)] = len(members)
        members.append(tuple(int(i) for i in idx))
        synced.append(dp_synced)

    for s in range(n_stages):
        for send_type, recv_type, step_ in (
            (optypes.FORWARD_SEND, optypes.FORWARD_RECV, 1),
            (optypes.BACKWARD_SEND, optypes.BACKWARD_RECV, -1),
        ):
            sends = p2p_valid.get((s, send_type), np.empty(0, dtype=np.int64))
            if not len(sends):
                continue
            peer = (s + step_) % n_stages
            recvs = p2p_valid.get((peer, recv_type), np.empty(0, dtype=np.int64))
            if len(recvs) != len(sends):
                raise TraceError(
                    f"unmatched send/recv pairs: stage {s} has {len(sends)} {send_type} op(s) per "
                    f"step, stage {peer} has {len(recvs)} {recv_type} op(s)",
                    where=f"stages {s}→{peer}",
                )
            for a, b in zip(sends, recvs, strict=True):
                add_group((a, b), dp_synced=False)
    for t in (*optypes.DP_COMM, *optypes.INLINE_COMM):
        for s in range(n_stages):
            for op in of(s, t):
                add_group((op,), dp_synced=True)
    for t, dp_synced in (
        (optypes.EMBEDDING_GRADS_ALL_REDUCE, False),
        (optypes.OPTIMIZER_CLIP_MAIN_GRAD, True),
    ):
        idx = np.flatnonzero(optype == t)
        for seq in np.unique(seq_id[idx]):
            add_group(idx[seq_id[idx] == seq], dp_synced=dp_synced)
    for op in np.flatnonzero(optype == optypes.LAYERNORM_GRADS_ALL_REDUCE):
        add_group([int(op)], dp_synced=False)
    is_comm = np.isin(optype, list(optypes.COMM))
    ungrouped = np.flatnonzero(is_comm & (group < 0))
    for op in ungrouped:
        add_group([int(op)], dp_synced=False)

    template = Template(
        stage=stage,
        optype=optype,
        seq_id=seq_id,
        mc=mc,
        is_comm=is_comm,
        deps=tuple(tuple(sorted(d)) for d in deps),
        group=group,
        group_members=tuple(members),
        group_dp_synced=np.array(synced, dtype=bool),
    )
    _check_acyclic(template)
    return template, None


def _inline_collectives(
    collectives: np.ndarray,
    compute: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    deps: list[set[int]],
) -> None:
    """Dependencies of collectives on the compute path of one stage (``docs/whatif-method.md``
    §2.7).

    They run in observed order on one stream; each waits for the compute op that started last
    before it (the one whose output it ships). The first later compute op that, in most
    (step, DP rank) units, starts only once the collective has ended waits for it; compute that
    starts while it is still running ran beside it, on another stream. A collective that no
    compute waits for feeds the optimizer (added with the post-backward chain).
    """
    if not len(collectives):
        return
    ref = start[:, 0, 0]
    collectives = collectives[np.argsort(ref[collectives], kind="stable")]
    for a, b in itertools.pairwise(collectives):
        deps[int(b)].add(int(a))
    order = compute[np.argsort(ref[compute], kind="stable")]
    for op in collectives:
        before = order[ref[order] <= ref[op]]
        if len(before):
            deps[int(op)].add(int(before[-1]))
        end = start[op] + duration[op]  # (steps, dp)
        for candidate in order[ref[order] > ref[op]]:
            waited = start[candidate] >= end - _SAME_CLOCK_S
            if np.count_nonzero(waited) * 2 > waited.size:
                deps[int(candidate)].add(int(op))
                break


_SAME_CLOCK_S = 2e-6
"""Kernels of one GPU share a clock: a compute op that starts within 2 µs of a collective's end
started after it."""


def _empty_template() -> Template:
    empty = np.empty(0, dtype=np.int64)
    return Template(
        empty,
        empty.astype(object),
        empty,
        empty,
        empty.astype(bool),
        (),
        empty,
        (),
        empty.astype(bool),
    )


def _model_first(stage: int, mc: np.ndarray, pp_size: int) -> np.ndarray:
    """Whether each compute op (by its chunk ``mc``) is on the model's first virtual stage."""
    chunk = np.maximum(mc, 0)
    return (stage == 0) & (chunk == 0)


def _model_last(stage: int, mc: np.ndarray, pp_size: int, last_chunk: int) -> np.ndarray:
    """Whether each compute op (by its chunk ``mc``) is on the model's last virtual stage."""
    chunk = np.maximum(mc, 0)
    return (stage == pp_size - 1) & (chunk == last_chunk)


def _surplus_noops(p2p: np.ndarray, needed: int, duration: np.ndarray) -> np.ndarray | None:
    """The surplus p2p ops if they are all zero-duration no-ops, else ``None``."""
    mean_duration = np.nanmean(duration[p2p].reshape(len(p2p), -1), axis=1)
    short = p2p[mean_duration <= NOOP_DURATION_S]
    surplus = len(p2p) - needed
    if len(short) < surplus:
        return None
    return short[:surplus] if needed else p2p


def _check_acyclic(template: Template) -> None:
    """Refuse a dependency cycle (comm groups collapsed into one node each)."""
    n = template.n_ops
    node = np.arange(n)
    comm = template.group >= 0
    node[comm] = n + template.group[comm]
    succ: dict[int, set[int]] = {}
    indeg: dict[int, int] = {int(v): 0 for v in np.unique(node)}
    for op, ds in enumerate(template.deps):
        for d in ds:
            a, b = int(node[d]), int(node[op])
            if a == b:
                raise TraceError(
                    f"op {template.op_name(op)} waits for {template.op_name(d)} in its own comm "
                    "group",
                    where="dependency model",
                )
            if b not in succ.setdefault(a, set()):
                succ[a].add(b)
                indeg[b] += 1
    ready = [v for v, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        v = ready.pop()
        seen += 1
        for w in succ.get(v, ()):
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if seen != len(indeg):
        stuck = [v for v, k in indeg.items() if k > 0]
        names = []
        for v in stuck[:_MAX_NAMES]:
            op = v if v < n else int(template.group_members[v - n][0])
            names.append(template.op_name(op))
        raise TraceError(
            f"the dependencies have a cycle through {len(stuck)} op(s), e.g. {names}: the observed "
            "order contradicts the pipeline schedule",
            where="dependency model",
        )


# --------------------------------------------------------------------------------------------
# durations
# --------------------------------------------------------------------------------------------


def group_start_max(template: Template, start: np.ndarray) -> np.ndarray:
    """Per group: the latest start of its members ``(groups, steps, dp)`` (DP-reduced if synced)."""
    n_groups = len(template.group_members)
    out = np.empty((n_groups, *start.shape[1:]))
    for g, members in enumerate(template.group_members):
        latest = start[list(members)].max(axis=0)
        if template.group_dp_synced[g]:
            latest = np.broadcast_to(latest.max(axis=-1, keepdims=True), latest.shape)
        out[g] = latest
    return out


def _transfer(
    template: Template, start: np.ndarray, duration: np.ndarray
) -> tuple[np.ndarray, int]:
    transfer = duration.copy()
    comm = np.flatnonzero(template.is_comm)
    if not len(comm):
        return transfer, 0
    latest = group_start_max(template, start)
    clamped = 0
    for part in _op_chunks(len(comm), latest[0].size):  # bounded temporaries
        ops = comm[part]
        tr = start[ops] + duration[ops]
        tr -= latest[template.group[ops]]
        low = tr <= -CLOCK_TOLERANCE_S
        tr[low] = 0.0
        transfer[ops] = tr
        clamped += int(np.count_nonzero(low))
    return transfer, clamped


def _launch_delay(
    template: Template, start: np.ndarray, duration: np.ndarray
) -> tuple[np.ndarray, int]:
    delay = start.copy()
    clamped = 0
    for op, ds in enumerate(template.deps):  # one op at a time: no whole-trace temporaries
        if ds:
            ready = start[ds[0]] + duration[ds[0]]
            for d in ds[1:]:
                np.maximum(ready, start[d] + duration[d], out=ready)
            delay[op] -= ready
        low = delay[op] <= -CLOCK_TOLERANCE_S
        delay[op][low] = 0.0
        clamped += int(np.count_nonzero(low))
    return delay, clamped


def ideal_durations(model: JobModel) -> np.ndarray:
    """Per template op: mean duration of its type (compute) or median transfer of its type (comm).

    All stages, DP ranks, steps, microbatches and chunks are pooled, so the ideal is a perfectly
    balanced job (``docs/whatif-method.md`` §3.2). With ``ideal_pooling == "op"`` each op pools
    only its own steps and DP ranks: ranks are balanced, the op's place in the step is kept.
    """
    template = model.template
    if model.ideal_pooling == "op":
        flat = model.transfer.reshape(template.n_ops, -1)
        return np.where(template.is_comm, np.median(flat, axis=1), flat.mean(axis=1))
    ideal = np.zeros(template.n_ops)
    for t in np.unique(template.optype):
        ops = np.flatnonzero(template.optype == t)
        values = model.transfer[ops].ravel()
        ideal[ops] = np.median(values) if optypes.is_comm(str(t)) else values.mean()
    return ideal
