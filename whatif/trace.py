"""The canonical op table of a job trace (docs/architecture.md §3.5) and its job meta.

One row per op: ``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id``
(seconds), plus a meta of ``dp_size, pp_size, tp_size, dsp_size, vpp_size, world_size``. Stored as a
Parquet file with a YAML meta beside it, as in the what-if paper's artifact.

Validation here covers what one row or the meta can get wrong (columns, types, values, ranks out of
range, a world size that does not divide). What only the whole step can get wrong (unmatched
send/recv pairs, a step that lacks ops) is checked when the dependency model is built
(:mod:`whatif.model`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from minder.core.errors import TraceError
from whatif import optypes

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("dp_rank", "stage", "step", "optype", "start_ts", "duration")
"""Columns a canonical trace must have."""

OPTIONAL_COLUMNS = ("rank", "seq_id", "mc", "gmc", "mb_id")
"""Columns that are derived when absent (see :func:`normalize_ops`)."""

COLUMNS = (
    "dp_rank",
    "stage",
    "rank",
    "step",
    "optype",
    "start_ts",
    "duration",
    "seq_id",
    "mc",
    "gmc",
    "mb_id",
)
RANK_STATS_COLUMNS = (
    "rank",
    "dp_rank",
    "stage",
    "steps",
    "step_s",
    "busy_s",
    "nccl_s",
    "waited_s",
    "collectives",
    "last_arrivals",
    "caused_wait_s",
    "caused_wait_cpu_s",
)
"""Columns of :attr:`Trace.rank_stats` (measured per rank by the Kineto importer).

``steps``: steps in the rank's trace; ``step_s``, ``busy_s``, ``nccl_s``: mean step length, GPU
busy time (non-NCCL kernels) and NCCL kernel time per step; ``waited_s``: mean time per step it
reached collectives before the last rank did; ``collectives``: matched collective instances it
took part in; ``last_arrivals``: those it reached last; ``caused_wait_s``,
``caused_wait_cpu_s``: mean time per step every other rank waited for it alone, and the part
where its launch itself was late (``whatif.kineto.arrival_stats``)."""

IDEAL_POOLINGS = ("type", "op")
"""What an op's ideal duration may pool over (:attr:`JobMeta.ideal_pooling`)."""

_INT_COLUMNS = ("dp_rank", "stage", "rank", "step", "seq_id", "mc", "gmc", "mb_id")
_MAX_LISTED = 5
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class JobMeta:
    """The parallel layout of the traced job.

    ``world_size = dp_size · pp_size · tp_size · dsp_size``; the trace holds one TP/DSP rank per
    (dp_rank, stage), so it has ``dp_size · pp_size`` workers. ``ideal_pooling`` says what an
    op's ideal duration pools over (``docs/whatif-method.md`` §3.2): ``type`` (the paper: every
    op of its type) or ``op`` (the same op of every step and DP rank; Kineto imports of one stage,
    whose compute ops are different stretches of the model, not like microbatches).
    """

    dp_size: int
    pp_size: int
    tp_size: int = 1
    dsp_size: int = 1
    vpp_size: int = 1
    world_size: int = 0
    name: str = ""
    ideal_pooling: str = "type"

    def __post_init__(self) -> None:
        if self.ideal_pooling not in IDEAL_POOLINGS:
            raise TraceError(
                f"ideal_pooling must be one of {list(IDEAL_POOLINGS)}, got {self.ideal_pooling!r}",
                where="meta",
            )
        for key in ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size"):
            value = getattr(self, key)
            if not isinstance(value, int | np.integer) or value < 1:
                raise TraceError(f"{key} must be a positive integer, got {value!r}", where="meta")
        expected = self.dp_size * self.pp_size * self.tp_size * self.dsp_size
        if self.world_size == 0:
            object.__setattr__(self, "world_size", expected)
        elif self.world_size != expected:
            raise TraceError(
                f"world_size {self.world_size} does not equal dp_size·pp_size·tp_size·dsp_size = "
                f"{self.dp_size}·{self.pp_size}·{self.tp_size}·{self.dsp_size} = {expected}",
                where="meta",
            )

    @property
    def workers(self) -> int:
        """Number of (dp_rank, stage) workers the trace describes."""
        return self.dp_size * self.pp_size

    def to_dict(self) -> dict[str, Any]:
        """The meta as written to YAML."""
        out: dict[str, Any] = {
            "dp_size": self.dp_size,
            "pp_size": self.pp_size,
            "tp_size": self.tp_size,
            "dsp_size": self.dsp_size,
            "vpp_size": self.vpp_size,
            "world_size": self.world_size,
        }
        if self.name:
            out["trial_name"] = self.name
        if self.ideal_pooling != "type":
            out["ideal_pooling"] = self.ideal_pooling
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, where: str = "meta") -> JobMeta:
        """Build a meta from a YAML mapping, refusing missing or non-integer sizes."""
        if not isinstance(raw, dict):
            raise TraceError(f"expected a mapping of sizes, got {type(raw).__name__}", where=where)
        missing = [k for k in ("dp_size", "pp_size") if k not in raw]
        if missing:
            raise TraceError(f"missing key(s) {missing}; expected dp_size and pp_size", where=where)
        sizes: dict[str, int] = {}
        for key in ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size"):
            if key not in raw:
                continue
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise TraceError(f"{key} must be an integer, got {value!r}", where=where)
            sizes[key] = value
        name = str(raw.get("trial_name", raw.get("name", "")) or "")
        pooling = raw.get("ideal_pooling", "type")
        if not isinstance(pooling, str):
            raise TraceError(
                f"ideal_pooling must be one of {list(IDEAL_POOLINGS)}, got {pooling!r}", where=where
            )
        try:
            return cls(**sizes, name=name, ideal_pooling=pooling)
        except TraceError as exc:
            raise TraceError(str(exc).removeprefix("meta: "), where=where) from None


@dataclass
class Trace:
    """A validated job trace: the op table, the job meta and what loading had to fix.

    Attributes
    ----------
    ops
        The canonical op table (columns :data:`COLUMNS`; times as float64 seconds, integers as
        int32 when they fit, else as they came: a 20-million-op trace holds about 50 bytes per
        op, see :func:`narrow_ints`).
    meta
        The job's parallel layout.
    source
        Where the trace came from (a path, or a description).
    notes
        Human-readable notes on what was inferred or dropped while loading (each with a count).
    rank_stats
        Per rank, what the trace measures directly (columns :data:`RANK_STATS_COLUMNS`), when
        the input had it (Kineto traces); ``None`` for canonical traces.
    """

    ops: pd.DataFrame
    meta: JobMeta
    source: str = ""
    notes: list[str] = field(default_factory=list)
    rank_stats: pd.DataFrame | None = None

    @property
    def name(self) -> str:
        """A short name: the meta's trial name, else the source file's stem."""
        if self.meta.name:
            return self.meta.name
        return Path(self.source).stem if self.source else "trace"

    def with_ops(self, ops: pd.DataFrame, note: str | None = None) -> Trace:
        """A copy with another op table (validated against the meta) and one more note."""
        notes = [*self.notes, note] if note else list(self.notes)
        return replace(
            self, ops=normalize_ops(ops, self.meta, where=self.source or "trace"), notes=notes
        )


def _where_row(frame: pd.DataFrame, mask: np.ndarray) -> str:
    """Describe the first rows selected by ``mask`` by step, dp rank, stage and op."""
    rows = frame.loc[mask]
    shown = []
    for idx, row in rows.head(_MAX_LISTED).iterrows():
        parts = [f"row {idx}"]
        for col in ("step", "dp_rank", "stage", "optype", "seq_id"):
            if col in row.index:
                parts.append(f"{col}={row[col]}")
        shown.append(" ".join(parts))
    more = f" (and {len(rows) - _MAX_LISTED} more)" if len(rows) > _MAX_LISTED else ""
    return "; ".join(shown) + more


def normalize_ops(frame: pd.DataFrame, meta: JobMeta, *, where: str = "trace") -> pd.DataFrame:
    """Check and normalise a canonical op table.

    Missing optional columns are derived: ``seq_id`` as the op's index among ops of its type on its
    worker in its step (by start time), ``mc`` as 0 for compute and DP collectives and −1 otherwise,
    ``gmc`` as ``stage`` for compute (−1 otherwise), ``mb_id`` as ``seq_id`` for compute (−1
    otherwise), ``rank`` as −1 (unknown).

    Raises
    ------
    TraceError
        A required column is missing, a value is not a finite number, a duration is negative, an op
        type is unknown, or a rank is outside the meta's layout; the message names the rows.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise TraceError(
            f"missing column(s) {missing}; a trace needs {list(REQUIRED_COLUMNS)} "
            f"(optional: {list(OPTIONAL_COLUMNS)})",
            where=where,
        )
    columns: dict[str, Any] = {}
    for col in ("start_ts", "duration"):
        values = _numeric(frame[col], np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            raise TraceError(
                f"column {col!r} has {int(bad.sum())} value(s) that are not finite numbers: "
                f"{_where_row(frame.reset_index(drop=True), bad)}",
                where=where,
            )
        columns[col] = values
    for col in _INT_COLUMNS:
        if col not in frame.columns:
            continue
        dtype = frame[col].dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "iu":
            # NumPy integers hold no missing values; 32 bits or less are kept as they are.
            columns[col] = narrow_ints(frame[col].to_numpy())
            continue
        raw = _numeric(frame[col], np.float64)
        bad = ~np.isfinite(raw) | (raw != np.round(raw))
        if bad.any():
            raise TraceError(
                f"column {col!r} has {int(bad.sum())} value(s) that are not integers: "
                f"{_where_row(frame.reset_index(drop=True), bad)}",
                where=where,
            )
        columns[col] = narrow_ints(raw.astype(np.int64))
    columns["optype"] = _optype_column(frame["optype"], where)
    negative = columns["duration"] < 0
    if negative.any():
        raise TraceError(
            f"{int(negative.sum())} row(s) have a negative duration: "
            f"{_where_row(pd.DataFrame(columns, copy=False), negative)}",
            where=where,
        )
    for col, size_name in (("dp_rank", "dp_size"), ("stage", "pp_size")):
        size = getattr(meta, size_name)
        values = columns[col]
        bad = (values < 0) | (values >= size)
        if bad.any():
            raise TraceError(
                f"{int(bad.sum())} row(s) have {col} outside 0..{size - 1} ({size_name}={size}): "
                f"{_where_row(pd.DataFrame(columns, copy=False), bad)}",
                where=where,
            )
    _derive_optional(columns)
    return pd.DataFrame({c: columns[c] for c in COLUMNS}, copy=False)


def narrow_ints(values: np.ndarray) -> np.ndarray:
    """``values`` as int32 when they are wider integers that fit in it, else unchanged.

    Integer columns of a trace are indices (ranks, steps, sequence ids): int32 halves the
    memory of a large trace, and every reader of the table gets the same widths whether it
    came from Parquet or from memory.
    """
    if values.dtype.kind not in "iu" or values.dtype.itemsize < 4 or values.dtype == np.int32:
        return values
    if len(values) == 0:
        return values.astype(np.int32)
    low, high = int(values.min()), int(values.max())
    if _INT32.min <= low and high <= _INT32.max:
        return values.astype(np.int32)
    return values


_INT32 = np.iinfo(np.int32)


def _numeric(column: pd.Series, dtype: type) -> np.ndarray:
    """``column`` as a NumPy array of ``dtype``; values that are not numbers become NaN."""
    if pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
        return column.to_numpy(dtype=dtype, na_value=np.nan)
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=dtype, na_value=np.nan)


OPTYPE_DTYPE = pd.CategoricalDtype(list(optypes.ALL))
"""The dtype of the ``optype`` column: a categorical over every known op type."""


def _optype_column(column: pd.Series, where: str) -> pd.Categorical:
    """``column`` as a categorical of known op types; unknown names are refused with counts."""
    if column.dtype == OPTYPE_DTYPE:
        known = np.asarray(column.cat.codes.to_numpy())
        if len(known) == 0 or int(known.min()) >= 0:  # already the known types, none missing
            return pd.Categorical.from_codes(known, dtype=OPTYPE_DTYPE)
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()
        uniques = np.array([str(c) for c in column.cat.categories], dtype=object)
    else:
        codes, uniques_index = pd.factorize(column, use_na_sentinel=True)
        uniques = np.array([str(c) for c in uniques_index], dtype=object)
    # Code −1 (a missing value) picks the trailing −1 / "<missing>" entries.
    lookup = np.array([optypes.ALL.index(u) if u in optypes.ALL else -1 for u in uniques] + [-1])
    known_codes = lookup[codes]
    unknown_mask = known_codes < 0
    if unknown_mask.any():
        raw = np.append(uniques, "<missing>")[codes[unknown_mask]]
        names = pd.Series(raw).value_counts()
        listed = ", ".join(f"{n!r} ({c} rows)" for n, c in names.head(_MAX_LISTED).items())
        first = int(np.flatnonzero(unknown_mask)[0])
        raise TraceError(
            f"{int(unknown_mask.sum())} row(s) have unknown op types: {listed} (first at row "
            f"{first}); expected one of {list(optypes.ALL)}",
            where=where,
        )
    return pd.Categorical.from_codes(known_codes, dtype=OPTYPE_DTYPE)


def _derive_optional(columns: dict[str, Any]) -> None:
    """Fill the optional columns that ``columns`` lacks (see :func:`normalize_ops`)."""
    missing = [c for c in OPTIONAL_COLUMNS if c not in columns]
    if not missing:
        return
    codes = np.asarray(columns["optype"].codes)
    compute_codes = [optypes.ALL.index(t) for t in optypes.COMPUTE]
    chunk_codes = compute_codes + [optypes.ALL.index(t) for t in optypes.DP_COMM]
    is_compute = np.isin(codes, compute_codes)
    if "seq_id" not in columns:
        keys = pd.DataFrame(
            {k: columns[k] for k in ("step", "dp_rank", "stage", "start_ts")} | {"optype": codes}
        )
        order = keys.sort_values("start_ts", kind="stable")
        seq = order.groupby(["step", "dp_rank", "stage", "optype"], sort=False).cumcount()
        columns["seq_id"] = seq.reindex(keys.index).to_numpy(dtype=np.int64)
    if "mc" not in columns:
        columns["mc"] = np.where(np.isin(codes, chunk_codes), 0, -1).astype(np.int64)
    if "gmc" not in columns:
        columns["gmc"] = np.where(is_compute, columns["stage"], -1).astype(np.int64)
    if "mb_id" not in columns:
        columns["mb_id"] = np.where(is_compute, columns["seq_id"], -1).astype(np.int64)
    if "rank" not in columns:
        columns["rank"] = np.full(len(codes), -1, dtype=np.int64)
    for col in missing:
        columns[col] = narrow_ints(columns[col])


def infer_meta(frame: pd.DataFrame, *, name: str = "") -> JobMeta:
    """A meta from the ranks present in ``frame`` (no TP/DSP; VPP from the chunk ids)."""
    for col in ("dp_rank", "stage"):
        if col not in frame.columns:
            raise TraceError(f"missing column {col!r}; cannot infer the job layout", where="trace")
    if len(frame) == 0:
        raise TraceError("the trace has no ops", where="trace")
    dp = int(pd.to_numeric(frame["dp_rank"]).max()) + 1
    pp = int(pd.to_numeric(frame["stage"]).max()) + 1
    vpp = int(pd.to_numeric(frame["mc"]).max()) + 1 if "mc" in frame.columns else 1
    return JobMeta(dp_size=max(dp, 1), pp_size=max(pp, 1), vpp_size=max(vpp, 1), name=name)


def find_meta(trace_path: Path) -> Path | None:
    """The meta YAML beside a trace file.

    ``meta-X.yaml`` for ``trace-X.parquet`` (the artifact's naming), else ``<stem>.yaml``.
    """
    stem = trace_path.name
    for suffix in (".parquet", ".pq"):
        stem = stem.removesuffix(suffix)
    candidates = []
    match = re.fullmatch(r"trace[-_](.+)", stem)
    if match:
        candidates.append(trace_path.with_name(f"meta-{match.group(1)}.yaml"))
    candidates += [
        trace_path.with_name(f"{stem}.yaml"),
        trace_path.with_name(f"{stem}.meta.yaml"),
        trace_path.with_name(f"{stem}.yml"),
    ]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    return None


def read_meta(path: str | Path) -> JobMeta:
    """Read a job meta YAML (``dp_size, pp_size, tp_size, dsp_size, vpp_size, world_size``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"meta file {str(path)!r} does not exist")
    try:
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise TraceError(f"not valid YAML: {exc}", where=str(path)) from None
    return JobMeta.from_dict(raw, where=str(path))


def read_canonical(path: str | Path, meta: JobMeta | str | Path | None = None) -> Trace:
    """Read a canonical Parquet trace and its meta, validating both.

    Parameters
    ----------
    path
        The ``.parquet`` op table.
    meta
        A :class:`JobMeta`, a path to its YAML, or ``None`` to use the YAML beside ``path`` (see
        :func:`find_meta`) and, when there is none, to infer the layout from the ranks present.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file {str(path)!r} does not exist")
    frame = _read_parquet_lean(path)
    if frame is None:  # anything unusual: the general reader, whose checks name the rows
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise TraceError(f"cannot read Parquet: {exc}", where=str(path)) from None
    notes: list[str] = []
    if isinstance(meta, JobMeta):
        job_meta = meta
    else:
        meta_path = Path(meta) if meta is not None else find_meta(path)
        if meta_path is not None:
            job_meta = read_meta(meta_path)
        else:
            job_meta = infer_meta(frame, name=path.stem)
            notes.append(
                f"no meta file beside {path.name}: layout inferred from the ranks present "
                f"(dp_size={job_meta.dp_size}, pp_size={job_meta.pp_size})"
            )
    ops = normalize_ops(frame, job_meta, where=str(path))
    return Trace(ops=ops, meta=job_meta, source=str(path), notes=notes)


_READ_BATCH_ROWS = 1 << 18
"""Rows converted at once by :func:`_read_parquet_lean` (its memory beyond the result; larger
batches and Arrow's pre-buffering leave more freed memory in Arrow's allocator)."""


def _read_parquet_lean(path: Path) -> pd.DataFrame | None:
    """The canonical columns of a well-formed Parquet trace, read batch by batch into narrow
    arrays (integers as int32 when they fit, op types as categorical codes).

    Reading the whole file with pandas holds the Arrow table and its int64 copy at once (about
    180 bytes per op); this holds the result and one batch. Returns ``None`` when the file is
    anything but plain: a column missing, a missing value, a type that is not a number where
    one is expected, an unknown op type, or a file Arrow cannot read. The general reader then
    reads it and its validation names what is wrong.
    """
    import pyarrow as pa  # noqa: PLC0415  (pandas imports it for Parquet anyway)
    import pyarrow.compute as pc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        source = pq.ParquetFile(path, pre_buffer=False)
        names = set(source.schema_arrow.names)
        if not set(REQUIRED_COLUMNS) <= names:
            return None
        wanted = [c for c in COLUMNS if c in names]
        n_rows = source.metadata.num_rows
        if n_rows == 0:
            return None
        out: dict[str, np.ndarray] = {}
        done = 0
        known = {name: code for code, name in enumerate(optypes.ALL)}
        for batch in source.iter_batches(
            batch_size=_READ_BATCH_ROWS, columns=wanted, use_threads=False
        ):
            size = batch.num_rows
            for col in wanted:
                array = batch.column(col)
                if array.null_count:
                    return None
                kind = array.type
                if col == "optype":
                    if not pa.types.is_dictionary(kind):
                        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                            return None
                        array = pc.dictionary_encode(array)
                    lookup = np.array(
                        [known.get(str(v), -1) for v in array.dictionary.to_pylist()] + [-1],
                        dtype=np.int8,
                    )
                    values = lookup[array.indices.to_numpy(zero_copy_only=False)]
                    if len(values) and int(values.min()) < 0:
                        return None
                elif col in ("start_ts", "duration"):
                    if not (pa.types.is_floating(kind) or pa.types.is_integer(kind)):
                        return None
                    values = array.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
                else:
                    if not pa.types.is_integer(kind):
                        return None
                    values = narrow_ints(array.to_numpy(zero_copy_only=False))
                target = out.get(col)
                if target is None:
                    target = out[col] = np.empty(n_rows, dtype=values.dtype)
                elif np.result_type(target.dtype, values.dtype) != target.dtype:
                    target = out[col] = target.astype(np.result_type(target.dtype, values.dtype))
                target[done : done + size] = values
            done += size
        if done != n_rows:
            return None
    except (OSError, ValueError, pa.ArrowException):
        return None
    finally:
        # Arrow's allocator keeps the freed batches otherwise (as much again as the result).
        pa.default_memory_pool().release_unused()
    columns: dict[str, Any] = dict(out)
    columns["optype"] = pd.Categorical.from_codes(out["optype"], dtype=OPTYPE_DTYPE)
    return pd.DataFrame({c: columns[c] for c in wanted}, copy=False)


def write_canonical(trace: Trace, path: str | Path) -> tuple[Path, Path]:
    """Write ``trace`` as ``path`` (Parquet) and its meta YAML beside it; return both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    trace.ops.loc[:, list(COLUMNS)].to_parquet(path, index=False)
    stem = path.name.removesuffix(".parquet")
    match = re.fullmatch(r"trace[-_](.+)", stem)
    meta_path = path.with_name(f"meta-{match.group(1)}.yaml" if match else f"{stem}.yaml")
    meta_path.write_text(yaml.safe_dump(trace.meta.to_dict(), sort_keys=False))
    return path, meta_path


def make_trace(frame: pd.DataFrame, meta: JobMeta | None = None, *, source: str = "") -> Trace:
    """Validate an in-memory op table into a :class:`Trace` (meta inferred when ``None``)."""
    notes: list[str] = []
    if meta is None:
        meta = infer_meta(frame)
        notes.append(f"layout inferred: dp_size={meta.dp_size}, pp_size={meta.pp_size}")
    return Trace(ops=normalize_ops(frame, meta), meta=meta, source=source, notes=notes)
