"""Reader and writer of the canonical metric table (docs/architecture.md §3.3).

Long format, one row per sample: ``ts, job, machine, metric, value`` and the optional
``device, group, domain`` (empty string when absent). Parquet or CSV, chosen by the file
extension; CSV may be gzip-compressed (``.csv.gz``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from minder.core.errors import TableError
from minder.core.metrics import METRICS
from minder.core.records import NodeBatch

REQUIRED_COLUMNS = ("ts", "job", "machine", "metric", "value")
OPTIONAL_COLUMNS = ("device", "group", "domain")
COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
_TEXT_COLUMNS = ("job", "machine", "metric", "device", "group", "domain")
_SUFFIXES = (".parquet", ".pq", ".csv", ".csv.gz")
DEFAULT_CHUNK_ROWS = 1 << 20
"""Rows of one piece of :class:`TableReader` (about 60 MB in canonical dtypes)."""


def table_format(path: str | Path) -> str:
    """Return ``"parquet"`` or ``"csv"`` for ``path``, refusing other extensions."""
    name = str(path).lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    raise TableError(f"file {str(path)!r} has an unknown extension: expected one of {_SUFFIXES}")


def _check_file(path: Path) -> str:
    """The format of the table file ``path`` (:func:`table_format`), once it is known to be a
    file: a missing path is said before its extension is judged."""
    if not path.exists():
        raise FileNotFoundError(
            f"metric table {str(path)!r} does not exist: expected a table file "
            f"({', '.join(_SUFFIXES)})"
        )
    if path.is_dir():
        raise TableError(
            f"metric table {str(path)!r} is a directory: expected a table file "
            f"({', '.join(_SUFFIXES)})"
        )
    return table_format(path)


def _unreadable(path: Path, fmt: str, exc: BaseException) -> TableError:
    """One line for a table file its reader could not parse (pyarrow's or pandas' own message
    names no file)."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    if isinstance(exc, PermissionError):
        # The file may be fine; this user cannot open it.
        return TableError(
            f"metric table {str(path)!r} cannot be opened ({exc.strerror or reason}): expected "
            "a file this user can read"
        )
    kind = "Parquet" if fmt == "parquet" else "CSV (optionally gzip-compressed)"
    return TableError(
        f"metric table {str(path)!r} cannot be read as {kind} ({reason}): expected a "
        f"{kind} table with columns {list(REQUIRED_COLUMNS)}"
    )


def _parse_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow and pandas raise on a damaged file (pyarrow's ArrowException; pandas'
    parser errors; a damaged gzip stream; bytes that are not UTF-8)."""
    import zlib  # noqa: PLC0415

    import pyarrow as pa  # noqa: PLC0415

    return (
        pa.ArrowException,
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
        UnicodeDecodeError,
        EOFError,
        zlib.error,
        OSError,
    )


def empty_table() -> pd.DataFrame:
    """A canonical table with no rows."""
    return normalize_table(pd.DataFrame({c: [] for c in COLUMNS}))


def read_table(path: str | Path) -> pd.DataFrame:
    """Read and validate a canonical metric table.

    Raises
    ------
    TableError
        A required column is missing, a value or timestamp is not a finite number, a metric name
        is unknown, or a name column is empty; the message names the column and the 0-based
        data row.
    FileNotFoundError
        ``path`` does not exist.
    """
    path = Path(path)
    fmt = _check_file(path)
    try:
        if fmt == "parquet":
            frame = pd.read_parquet(path)
        else:
            # Everything as text first, so a bad cell is reported by row instead of coerced.
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except _parse_errors() as exc:
        raise _unreadable(path, fmt, exc) from None
    return validate_table(frame)


class TableReader:
    """Reads a canonical metric table piece by piece, so memory does not grow with the table.

    Parquet is read by record batches of at most ``chunk_rows`` rows (within its row groups),
    CSV by ``pandas.read_csv`` chunks; only the columns asked for are read. Every piece is
    validated as :func:`read_table` validates the whole table, errors naming the file row.

    Parameters
    ----------
    path
        ``.parquet``/``.pq``/``.csv``/``.csv.gz`` file.
    chunk_rows
        Most rows of one piece.

    Raises
    ------
    TableError
        Unknown extension, a file its format's reader cannot parse (naming the file), a
        required column missing, or ``chunk_rows`` below 1; reading a piece that cannot be
        parsed raises it too.
    FileNotFoundError
        ``path`` does not exist.
    """

    def __init__(self, path: str | Path, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> None:
        self.path = Path(path)
        self.format = _check_file(self.path)
        if chunk_rows < 1:
            raise TableError(f"chunk_rows is {chunk_rows!r}: expected at least 1 row")
        self.chunk_rows = chunk_rows
        self.rows: int | None = None
        """Rows of the file when its metadata says so (Parquet), else None."""
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq  # noqa: PLC0415  (only Parquet readers pay for it)

                metadata = pq.read_metadata(self.path)
                names = list(metadata.schema.to_arrow_schema().names)
                self.rows = int(metadata.num_rows)
            else:
                names = [str(c) for c in pd.read_csv(self.path, nrows=0, dtype=str).columns]
        except _parse_errors() as exc:
            raise _unreadable(self.path, self.format, exc) from None
        _check_columns(names)
        self.columns: list[str] = [c for c in COLUMNS if c in names]
        """The canonical columns the file has, in canonical order."""

    def chunks(self, columns: Iterable[str] | None = None) -> Iterator[tuple[int, pd.DataFrame]]:
        """Yield ``(first_row, piece)``: validated canonical pieces in file order.

        ``columns`` restricts what is read (the required ones are always read); an optional
        column not read, or absent from the file, comes back as ``""``.
        """
        wanted = set(REQUIRED_COLUMNS) | set(columns if columns is not None else COLUMNS)
        read = [c for c in self.columns if c in wanted]
        first_row = 0
        frames = self._raw_chunks(read)
        while True:
            try:
                frame = next(frames)
            except StopIteration:
                return
            except _parse_errors() as exc:  # damaged past its header or footer
                raise _unreadable(self.path, self.format, exc) from None
            if len(frame):
                yield first_row, validate_table(frame, first_row=first_row)
            first_row += len(frame)

    def _raw_chunks(self, read: list[str]) -> Iterator[pd.DataFrame]:
        if self.format == "parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415

            text = [c for c in read if c in _TEXT_COLUMNS]
            parquet = pq.ParquetFile(
                self.path, read_dictionary=text, buffer_size=1 << 23, pre_buffer=False
            )
            try:
                for batch in parquet.iter_batches(batch_size=self.chunk_rows, columns=read):
                    yield batch.to_pandas()
            finally:
                parquet.close()
        else:
            # Everything as text, as read_table reads it: a bad cell is reported by row.
            with pd.read_csv(
                self.path, dtype=str, keep_default_na=False, usecols=read, chunksize=self.chunk_rows
            ) as reader:
                yield from reader


def _check_columns(columns: Sequence[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise TableError(
            f"missing required column(s) {missing}: expected columns {list(REQUIRED_COLUMNS)} "
            f"and optionally {list(OPTIONAL_COLUMNS)}; found {list(columns)}",
            column=missing[0],
        )


def validate_table(frame: pd.DataFrame, *, first_row: int = 0) -> pd.DataFrame:
    """Validate a table held in memory and return it in canonical dtypes.

    ``first_row`` is the file row of the frame's first row (a piece of a larger table): errors
    name the row of the file.
    """
    _check_columns(list(frame.columns))
    if not frame.index.equals(pd.RangeIndex(len(frame))):
        # A CSV chunk's index starts at its file row: columns must not align on it.
        frame = frame.reset_index(drop=True)
    out = pd.DataFrame(index=pd.RangeIndex(len(frame)))
    for column in ("ts", "value"):
        out[column] = _numeric_column(frame[column], column, first_row)
    outside = np.flatnonzero((out["ts"] <= 0) | (out["ts"] >= 4_102_444_800.0))
    if outside.size:
        row = int(outside[0])
        raise TableError(
            f"timestamp {out['ts'].iloc[row]!r} is not plausible: expected unix seconds between "
            "1970 and 2100",
            column="ts",
            row=first_row + row,
        )
    for column in _TEXT_COLUMNS:
        if column in frame.columns:
            values = _stripped_category(frame[column])
        else:
            values = pd.Series(
                pd.Categorical.from_codes(
                    np.zeros(len(frame), dtype=np.int8), categories=pd.Index([""], dtype="string")
                ),
                index=out.index,
            )
        if column in ("job", "machine", "metric") and "" in values.cat.categories:
            empty_code = values.cat.categories.get_loc("")
            empty = np.flatnonzero(values.cat.codes.to_numpy() == empty_code)
            if empty.size:
                raise TableError(
                    "empty value: expected a non-empty name",
                    column=column,
                    row=first_row + int(empty[0]),
                )
        out[column] = values
    metric_codes = out["metric"].cat.codes.to_numpy()
    categories = out["metric"].cat.categories
    used = np.flatnonzero(_code_counts(metric_codes, len(categories)))
    unknown = [str(categories[int(i)]) for i in used if categories[int(i)] not in METRICS]
    if unknown:
        row = int(np.flatnonzero(metric_codes == categories.get_loc(unknown[0]))[0])
        raise TableError(
            f"unknown metric {unknown[0]!r}: expected one of the canonical names of "
            f"docs/architecture.md §3.1 (e.g. 'gpu_util_ratio', 'pfc_tx_pause_per_second')",
            column="metric",
            row=first_row + row,
        )
    return normalize_table(out)


def _stripped_category(series: pd.Series) -> pd.Series:
    """``series`` as a category of stripped strings, missing values as ``""``.

    Works on the categories, never row by row: a 35-million-row table read from Parquet comes
    back categorical, and a row-wise string round trip took minutes and gigabytes.
    """
    cat = series if isinstance(series.dtype, pd.CategoricalDtype) else series.astype("category")
    names = cat.cat.categories.astype("string").fillna("").str.strip().to_numpy(dtype=object)
    codes = cat.cat.codes.to_numpy()
    if (codes < 0).any():
        names = np.append(names, "")
        codes = np.where(codes < 0, len(names) - 1, codes)
    # Sorted unique names; names that only differed by blanks merge.
    uniques, inverse = np.unique(names.astype(str), return_inverse=True)
    mapped = inverse.astype(np.int32)[codes] if len(names) else codes.astype(np.int32)
    categories: pd.Index = pd.Index(uniques, dtype="string")
    return pd.Series(pd.Categorical.from_codes(mapped, categories=categories), index=series.index)


def _numeric_column(series: pd.Series, column: str, first_row: int = 0) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        values = series.to_numpy(dtype="float64", na_value=np.nan)
    else:
        values = pd.to_numeric(series, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = int(bad[0])
        raise TableError(
            f"value {series.iloc[row]!r} is not a finite number: expected a number "
            f"({'unix seconds' if column == 'ts' else 'in the metric base unit'})",
            column=column,
            row=first_row + row,
        )
    return values


def normalize_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Return ``frame`` with the canonical column order and dtypes (names as categories)."""
    out = pd.DataFrame(
        {
            "ts": frame["ts"].astype("float64"),
            "job": frame["job"].astype("category"),
            "machine": frame["machine"].astype("category"),
            "metric": frame["metric"].astype("category"),
            "value": frame["value"].astype("float64"),
        },
        copy=False,  # copy-on-write shares the columns safely; a copy doubled peak memory
    )
    for column in OPTIONAL_COLUMNS:
        source = frame[column] if column in frame.columns else ""
        out[column] = _text_category(pd.Series(source, index=out.index))
    return out.reset_index(drop=True)


def _text_category(values: pd.Series) -> pd.Series:
    """``values`` as a category of strings, missing ones as ``""``, categories sorted and used.

    A column that is already categorical has its few categories converted instead of its rows:
    the row-wise round trip through strings took 46 s on a 37-million-row simulator table.
    """
    if isinstance(values.dtype, pd.CategoricalDtype):
        text = values.cat.categories.astype("string").fillna("")
        if text.is_unique:
            names = text.to_numpy(dtype=object)
            codes = values.cat.codes.to_numpy()
            if codes.size and codes.min() < 0:
                if "" not in text:
                    names = np.append(names, "")
                empty = int(np.flatnonzero(names == "")[0])
                codes = np.where(codes < 0, empty, codes.astype(np.int32))
            used = np.flatnonzero(_code_counts(codes, len(names)))
            kept = pd.Index(names[used], dtype="string")
            order = kept.argsort()
            if len(used) == len(names) and (order == np.arange(len(order))).all():
                # Already canonical: keep the codes, only retype the categories.
                return pd.Series(
                    pd.Categorical.from_codes(codes, categories=kept), index=values.index
                )
            new_code = np.full(len(names), -1, dtype=np.int32)
            new_code[used[order]] = np.arange(len(order))
            return pd.Series(
                pd.Categorical.from_codes(
                    new_code.astype(codes.dtype)[codes], categories=kept[order]
                ),
                index=values.index,
            )
    return values.astype("string").fillna("").astype("category")


def _code_counts(codes: np.ndarray, size: int) -> np.ndarray:
    """``np.bincount`` in blocks: it widens its input to int64 (280 MB for 35 million codes)."""
    counts = np.zeros(size, dtype=np.int64)
    for start in range(0, len(codes), 1 << 20):
        counts += np.bincount(codes[start : start + (1 << 20)], minlength=size)
    return counts


def write_table(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a canonical table; the extension picks Parquet or (gzipped) CSV."""
    path = Path(path)
    fmt = table_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = normalize_table(frame)
    if fmt == "parquet":
        frame.to_parquet(path, index=False, compression="zstd")
    else:
        # Values keep 9 significant digits (float32 precision and more); timestamps are written
        # exactly: at 9 digits every second of a day would read back as the same 1.7637e+09.
        ts = frame["ts"].to_numpy()
        exact = ts.astype(np.int64) if bool((np.floor(ts) == ts).all()) else ts.astype(str)
        frame.assign(ts=exact).to_csv(path, index=False, float_format="%.9g")
    return path


def write_table_atomically(frame: pd.DataFrame, path: str | Path) -> Path:
    """Validate ``frame`` (:func:`validate_table`) and write it to a temporary file beside
    ``path``, renamed into place only when complete: an interrupted writer leaves no
    half-written table. Return the path written."""
    output = Path(path)
    table = validate_table(frame)
    suffix = ".csv.gz" if output.name.lower().endswith(".csv.gz") else output.suffix
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial{suffix}")
    try:
        write_table(table, partial)
        os.replace(partial, output)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return output


def batches_to_table(batches: Iterable[NodeBatch]) -> pd.DataFrame:
    """Flatten node batches into canonical rows (events are not rows; their counts are)."""
    ts: list[float] = []
    job: list[str] = []
    machine: list[str] = []
    metric: list[str] = []
    device: list[str] = []
    value: list[float] = []
    group: list[str] = []
    domain: list[str] = []
    for batch in batches:
        samples = batch.all_samples()  # packed (schema 2) batches name their samples here
        n = len(samples)
        if not n:
            continue
        ts.extend([batch.ts] * n)
        job.extend([batch.job] * n)
        machine.extend([batch.node] * n)
        group.extend([batch.group] * n)
        domain.extend([batch.domain] * n)
        for name, dev, val in samples:
            metric.append(name)
            device.append(dev)
            value.append(val)
    if not ts:
        return empty_table()
    return normalize_table(
        pd.DataFrame(
            {
                "ts": ts,
                "job": job,
                "machine": machine,
                "metric": metric,
                "value": value,
                "device": device,
                "group": group,
                "domain": domain,
            }
        )
    )
