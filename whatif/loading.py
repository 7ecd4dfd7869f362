"""One entry point for every trace input: canonical Parquet + YAML, or Kineto JSON of each rank."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from minder.core.errors import TraceError
from whatif.trace import JobMeta, Trace, read_canonical, read_meta

_KINETO_SUFFIXES = (".json", ".json.gz")
_CANONICAL_SUFFIXES = (".parquet", ".pq")


def _is_kineto(path: Path) -> bool:
    return path.name.lower().endswith(_KINETO_SUFFIXES)


def _is_canonical(path: Path) -> bool:
    return path.name.lower().endswith(_CANONICAL_SUFFIXES)


def resolve_inputs(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """Expand a path, a directory, a glob or a list of them into trace files."""
    items = [source] if isinstance(source, str | Path) else list(source)
    files: list[Path] = []
    for item in items:
        text = str(item)
        if any(ch in text for ch in "*?["):
            matched = sorted(Path(p) for p in glob.glob(text))
            if not matched:
                raise FileNotFoundError(f"no file matches {text!r}")
            files.extend(matched)
            continue
        path = Path(item)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if _is_kineto(p) or _is_canonical(p))
            if not inside:
                raise FileNotFoundError(
                    f"directory {text!r} holds no trace (*.parquet, *.json, *.json.gz)"
                )
            files.extend(inside)
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"trace {text!r} does not exist")
    return files


def load_trace(
    source: str | Path | Sequence[str | Path], meta: JobMeta | str | Path | None = None
) -> Trace:
    """Load and validate a job trace.

    Parameters
    ----------
    source
        A canonical ``.parquet`` op table (its meta YAML beside it), or the Kineto traces of a
        job's ranks: one ``.json``/``.json.gz`` file, several, a directory or a glob of them.
    meta
        The job meta (a :class:`JobMeta` or a YAML path). Canonical traces default to the YAML
        beside them; Kineto traces without one are read as DP ranks of a single stage.

    Raises
    ------
    minder.core.errors.TraceError
        The input is malformed (the message names what and where).
    FileNotFoundError
        A path does not exist.
    """
    files = resolve_inputs(source)
    canonical = [f for f in files if _is_canonical(f)]
    kineto = [f for f in files if _is_kineto(f)]
    other = [f for f in files if f not in canonical and f not in kineto]
    if other:
        raise TraceError(
            f"unknown trace format of {[str(f) for f in other[:3]]}: expected .parquet/.pq "
            "(canonical) or .json/.json.gz (Kineto)",
            where=str(other[0]),
        )
    if canonical and kineto:
        raise TraceError(
            "mixed inputs: give either one canonical Parquet trace or Kineto JSON traces",
            where=str(canonical[0]),
        )
    if canonical:
        if len(canonical) > 1:
            raise TraceError(
                f"{len(canonical)} Parquet files given: a canonical trace is one file",
                where=str(canonical[0]),
            )
        return read_canonical(canonical[0], meta)
    job_meta = read_meta(meta) if isinstance(meta, str | Path) else meta
    from whatif.kineto import import_kineto  # noqa: PLC0415  (only Kineto inputs need it)

    return import_kineto(kineto, job_meta)
