"""The canonical op table of a job trace (docs/architecture.md §3.5) and its job meta.

One row per op: ``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id``
(seconds), plus a meta of ``dp_size, pp_size, tp_size, dsp_size, vpp_size, world_size``. Stored as a
Parquet file with a YAML meta beside it, as in the what-if paper's artifact.

Validation here covers what one row or the meta can get wrong (columns, types, values, ranks out of
range, a world size that does not divide). What only the whole step can get wrong (unmatched
send/recv pairs, a step that lacks ops) is checked when the dependency model is built
(:mod:`whatif.model`).

The table is held as NumPy arrays (:class:`OpsTable`): a plain Parquet trace goes from Arrow to
NumPy and through the analysis without pandas. pandas is imported only where a DataFrame is given
(:func:`make_trace`, Kineto imports, Parquet files that are not plain), asked for
(:meth:`OpsTable.to_frame`, :func:`write_canonical`), or a bad value is reported.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from minder.core.errors import TraceError
from whatif import optypes

if TYPE_CHECKING:
    import pandas as pd

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


class OpsTable:
    """The canonical op table: one NumPy array per column of :data:`COLUMNS`, all of one length.

    Times are float64 seconds, integer columns int32 when they fit (:func:`narrow_ints`), and
    ``optype`` holds int8 codes into :data:`whatif.optypes.ALL`. :func:`normalize_ops` (or
    :func:`make_trace`) builds a validated one; ``table["stage"]`` is a column's array (shared,
    not copied: treat it as read-only), :meth:`to_frame` the pandas DataFrame of the table.
    """

    __slots__ = ("_columns",)

    def __init__(self, columns: Mapping[str, np.ndarray]) -> None:
        missing = [c for c in COLUMNS if c not in columns]
        extra = [c for c in columns if c not in COLUMNS]
        if missing or extra:
            raise ValueError(
                f"op table columns {list(columns)} lack {missing} or have unknown {extra}; "
                f"expected {list(COLUMNS)}"
            )
        arrays = {c: np.asarray(columns[c]) for c in COLUMNS}
        lengths = {len(a) for a in arrays.values()}
        if len(lengths) > 1:
            raise ValueError(
                f"op table columns differ in length ({sorted(lengths)}); expected one length"
            )
        self._columns = arrays

    def __len__(self) -> int:
        return len(self._columns["dp_rank"])

    def __getitem__(self, column: str) -> np.ndarray:
        try:
            return self._columns[column]
        except KeyError:
            raise KeyError(f"no column {column!r}; expected one of {list(COLUMNS)}") from None

    def __contains__(self, column: object) -> bool:
        return column in self._columns

    def __repr__(self) -> str:
        return f"OpsTable({len(self):,} ops)"

    @property
    def columns(self) -> tuple[str, ...]:
        """The column names (:data:`COLUMNS`)."""
        return COLUMNS

    def take(self, rows: np.ndarray) -> OpsTable:
        """The rows selected by ``rows`` (indices or a boolean mask), in that order."""
        return OpsTable({c: a[rows] for c, a in self._columns.items()})

    def to_frame(self) -> pd.DataFrame:
        """The table as a pandas DataFrame (``optype`` a categorical over every known op type);
        imports pandas. The frame shares the table's arrays: copy it before changing it."""
        return _frame_of(self._columns)


@dataclass
class Trace:
    """A validated job trace: the op table, the job meta and what loading had to fix.

    Attributes
    ----------
    ops
        The canonical op table (columns :data:`COLUMNS`; times as float64 seconds, integers as
        int32 when they fit, else as they came: a 20-million-op trace holds about 50 bytes per
        op, see :func:`narrow_ints`); :meth:`OpsTable.to_frame` gives it as a DataFrame.
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

    ops: OpsTable
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

    def with_ops(self, ops: pd.DataFrame | OpsTable, note: str | None = None) -> Trace:
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


def normalize_ops(
    frame: pd.DataFrame | OpsTable, meta: JobMeta, *, where: str = "trace"
) -> OpsTable:
    """Check and normalise a canonical op table (a DataFrame, or an :class:`OpsTable` to check
    against another meta).

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
    if isinstance(frame, OpsTable):
        return _normalize_arrays(frame._columns, meta, where)
    return _normalize_frame(frame, meta, where)


def _normalize_arrays(raw: Mapping[str, np.ndarray], meta: JobMeta, where: str) -> OpsTable:
    """:func:`normalize_ops` of columns that are NumPy arrays already (``optype`` as int8 codes),
    without pandas when they are plain and valid. Anything else (a column missing, another
    type, a value :func:`normalize_ops` refuses) goes to the DataFrame path, whose result or
    message is the one a DataFrame of the same columns gets."""
    columns = _plain_columns(raw, meta)
    if columns is None:
        return _normalize_frame(_frame_of(raw), meta, where)
    _derive_optional(columns, columns["optype"])
    return OpsTable(columns)


def _plain_columns(raw: Mapping[str, np.ndarray], meta: JobMeta) -> dict[str, np.ndarray] | None:
    """The normalised columns of ``raw`` if every check of :func:`normalize_ops` passes on them
    as they are, else ``None``."""
    if any(c not in raw for c in REQUIRED_COLUMNS):
        return None
    columns: dict[str, np.ndarray] = {}
    for col in ("start_ts", "duration"):
        values = raw[col]
        if values.dtype != np.float64 or not np.isfinite(values).all():
            return None
        columns[col] = values
    for col in _INT_COLUMNS:
        if col in raw:
            if raw[col].dtype.kind not in "iu":
                return None
            columns[col] = narrow_ints(raw[col])
    codes = raw["optype"]
    if codes.dtype != np.int8 or (
        len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(optypes.ALL))
    ):
        return None
    columns["optype"] = codes
    if (columns["duration"] < 0).any():
        return None
    for col, size_name in (("dp_rank", "dp_size"), ("stage", "pp_size")):
        values = columns[col]
        if ((values < 0) | (values >= getattr(meta, size_name))).any():
            return None
    return columns


def _frame_of(columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """A DataFrame of ``columns`` (in :data:`COLUMNS` order; int ``optype`` codes as the
    categorical), as the op tables of earlier versions were."""
    import pandas as pd  # noqa: PLC0415

    out: dict[str, Any] = {c: columns[c] for c in COLUMNS if c in columns}
    codes = out.get("optype")
    if isinstance(codes, np.ndarray) and codes.dtype.kind in "iu":
        known = (codes >= 0) & (codes < len(optypes.ALL))
        if known.all():
            out["optype"] = pd.Categorical.from_codes(codes, dtype=optype_dtype())
        else:  # as names, so that the op-type check names the rows with a code of no type
            names = np.asarray(optypes.ALL, dtype=object)[np.where(known, codes, 0)]
            names[~known] = [f"<op type code {int(c)}>" for c in codes[~known]]
            out["optype"] = names
    return pd.DataFrame(out, copy=False)


def _normalize_frame(frame: pd.DataFrame, meta: JobMeta, where: str) -> OpsTable:
    """:func:`normalize_ops` of a DataFrame."""
    import pandas as pd  # noqa: PLC0415

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
    columns["optype"] = np.asarray(columns["optype"].codes)
    _derive_optional(columns, columns["optype"])
    return OpsTable(columns)


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
    import pandas as pd  # noqa: PLC0415

    if pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
        return column.to_numpy(dtype=dtype, na_value=np.nan)
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=dtype, na_value=np.nan)


@cache
def optype_dtype() -> pd.CategoricalDtype:
    """The pandas dtype of :meth:`OpsTable.to_frame`'s ``optype`` column: a categorical over
    every known op type (its codes are :class:`OpsTable`'s); imports pandas."""
    import pandas as pd  # noqa: PLC0415

    return pd.CategoricalDtype(list(optypes.ALL))


def _optype_column(column: pd.Series, where: str) -> pd.Categorical:
    """``column`` as a categorical of known op types; unknown names are refused with counts."""
    import pandas as pd  # noqa: PLC0415

    dtype = optype_dtype()
    if column.dtype == dtype:
        known = np.asarray(column.cat.codes.to_numpy())
        if len(known) == 0 or int(known.min()) >= 0:  # already the known types, none missing
            return pd.Categorical.from_codes(known, dtype=dtype)
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
    return pd.Categorical.from_codes(known_codes, dtype=dtype)


def _derive_optional(columns: dict[str, Any], codes: np.ndarray) -> None:
    """Fill the optional columns that ``columns`` lacks (see :func:`normalize_ops`); ``codes``
    are the op types' codes."""
    missing = [c for c in OPTIONAL_COLUMNS if c not in columns]
    if not missing:
        return
    compute_codes = [optypes.ALL.index(t) for t in optypes.COMPUTE]
    chunk_codes = compute_codes + [optypes.ALL.index(t) for t in optypes.DP_COMM]
    is_compute = np.isin(codes, compute_codes)
    if "seq_id" not in columns:
        columns["seq_id"] = _sequence_ids(columns, codes)
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


def _sequence_ids(columns: Mapping[str, np.ndarray], codes: np.ndarray) -> np.ndarray:
    """Per row: its index among the rows of its (step, dp_rank, stage, op type) in start order
    (ties in row order)."""
    n = len(codes)
    by_start = np.argsort(columns["start_ts"], kind="stable")
    keys = [columns[k][by_start] for k in ("step", "dp_rank", "stage")] + [codes[by_start]]
    grouped = np.lexsort(keys[::-1])  # stable: start order kept within each group
    rows = by_start[grouped]
    new_group = np.ones(n, dtype=bool)
    for key in keys:
        ordered = key[grouped]
        new_group[1:] &= ordered[1:] == ordered[:-1]
    new_group[1:] = ~new_group[1:]
    first = np.flatnonzero(new_group)
    position = np.arange(n, dtype=np.int64)
    seq = np.empty(n, dtype=np.int64)
    seq[rows] = position - first[np.cumsum(new_group) - 1]
    return seq


def infer_meta(
    frame: pd.DataFrame | OpsTable | Mapping[str, np.ndarray], *, name: str = ""
) -> JobMeta:
    """A meta from the ranks present in ``frame`` (no TP/DSP; VPP from the chunk ids)."""
    for col in ("dp_rank", "stage"):
        if col not in frame:
            raise TraceError(f"missing column {col!r}; cannot infer the job layout", where="trace")
    if len(frame["dp_rank"]) == 0:
        raise TraceError("the trace has no ops", where="trace")

    def top(col: str) -> int:
        values = frame[col]
        if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
            return int(values.max())
        import pandas as pd  # noqa: PLC0415

        return int(pd.to_numeric(values).max())

    dp = top("dp_rank") + 1
    pp = top("stage") + 1
    vpp = top("mc") + 1 if "mc" in frame else 1
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
    frame: pd.DataFrame | Mapping[str, np.ndarray] | None = _read_parquet_lean(path)
    if frame is None:  # anything unusual: the general reader, whose checks name the rows
        import pandas as pd  # noqa: PLC0415

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
    if isinstance(frame, Mapping):
        ops = _normalize_arrays(frame, job_meta, str(path))
    else:
        ops = _normalize_frame(frame, job_meta, str(path))
    return Trace(ops=ops, meta=job_meta, source=str(path), notes=notes)


_READ_BATCH_ROWS = 1 << 18
"""Rows converted at once by :func:`_read_parquet_lean` (its memory beyond the result; larger
batches and Arrow's pre-buffering leave more freed memory in Arrow's allocator)."""


def _read_parquet_lean(path: Path) -> dict[str, np.ndarray] | None:
    """The canonical columns of a well-formed Parquet trace, read batch by batch into narrow
    NumPy arrays (integers as int32 when they fit, op types as int8 codes into
    :data:`whatif.optypes.ALL`), without pandas.

    Reading the whole file with pandas holds the Arrow table and its int64 copy at once (about
    180 bytes per op); this holds the result and one batch. Returns ``None`` when the file is
    anything but plain: a column missing, a missing value, a type that is not a number where
    one is expected, an unknown op type, or a file Arrow cannot read. The general reader then
    reads it and its validation names what is wrong.
    """
    import pyarrow as pa  # noqa: PLC0415  (only Parquet input needs it)
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
                        import pyarrow.compute as pc  # noqa: PLC0415  (plain strings only)

                        array = pc.dictionary_encode(array)
                    lookup = np.array(
                        [known.get(str(v), -1) for v in array.dictionary.to_pylist()] + [-1],
                        dtype=np.int8,
                    )
                    values = lookup[_arrow_numbers(array.indices)]
                    if len(values) and int(values.min()) < 0:
                        return None
                elif col in ("start_ts", "duration"):
                    if not (pa.types.is_floating(kind) or pa.types.is_integer(kind)):
                        return None
                    values = _arrow_numbers(array).astype(np.float64, copy=False)
                else:
                    if not pa.types.is_integer(kind):
                        return None
                    values = narrow_ints(_arrow_numbers(array))
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
    return {c: out[c] for c in wanted}


def _arrow_numbers(array: Any) -> np.ndarray:
    """The values of an Arrow integer or floating-point array without nulls: a read-only NumPy
    view of its data buffer (``Array.to_numpy`` would import pandas)."""
    import pyarrow as pa  # noqa: PLC0415

    kind = array.type
    # Arrow names its integer types as NumPy does (int8 … uint64); floats by their width.
    dtype = np.dtype(f"float{kind.bit_width}" if pa.types.is_floating(kind) else str(kind))
    data = array.buffers()[1]
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def write_canonical(trace: Trace, path: str | Path) -> tuple[Path, Path]:
    """Write ``trace`` as ``path`` (Parquet) and its meta YAML beside it; return both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    trace.ops.to_frame().to_parquet(path, index=False)
    stem = path.name.removesuffix(".parquet")
    match = re.fullmatch(r"trace[-_](.+)", stem)
    meta_path = path.with_name(f"meta-{match.group(1)}.yaml" if match else f"{stem}.yaml")
    meta_path.write_text(yaml.safe_dump(trace.meta.to_dict(), sort_keys=False))
    return path, meta_path


def make_trace(
    frame: pd.DataFrame | OpsTable, meta: JobMeta | None = None, *, source: str = ""
) -> Trace:
    """Validate an in-memory op table into a :class:`Trace` (meta inferred when ``None``)."""
    notes: list[str] = []
    if meta is None:
        meta = infer_meta(frame)
        notes.append(f"layout inferred: dp_size={meta.dp_size}, pp_size={meta.pp_size}")
    return Trace(ops=normalize_ops(frame, meta), meta=meta, source=source, notes=notes)
