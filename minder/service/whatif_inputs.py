"""Inputs of a what-if analysis, checked before anything runs.

Two ways in: the trace's files uploaded (streamed to a :class:`ScratchSpace` by the API,
:mod:`minder.api.whatif_uploads`, then checked by :func:`split_by_kind` and
:func:`check_combination`), or paths on the server (:func:`resolve_server_inputs`: they must lie
under one of the allowed roots, symbolic links resolved). Either way the result is a
:class:`TraceInputs`: one canonical Parquet trace or Kineto JSON traces of ranks, and an optional
job meta YAML, as :func:`whatif.analyze_path` takes.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from minder.core.errors import ValidationError

TraceKind = Literal["canonical", "kineto", "meta"]

# longest suffix first: ".json.gz" before ".json"
_SUFFIXES: tuple[tuple[str, TraceKind], ...] = (
    (".json.gz", "kineto"),
    (".json", "kineto"),
    (".parquet", "canonical"),
    (".pq", "canonical"),
    (".yaml", "meta"),
    (".yml", "meta"),
)
ALLOWED_TYPES = (
    ".parquet/.pq (one canonical trace), .json/.json.gz (Kineto traces, one per rank), "
    ".yaml/.yml (the job meta, optional)"
)

_MAGIC = re.compile(r"[*?\[]")


def trace_kind(name: str) -> TraceKind:
    """What a file is by its name; :class:`ValidationError` naming it for other types."""
    lowered = name.lower()
    for suffix, kind in _SUFFIXES:
        if lowered.endswith(suffix):
            return kind
    raise ValidationError(f"file {name!r} has an unsupported type: expected {ALLOWED_TYPES}")


def trace_kind_or_none(path: Path) -> TraceKind | None:
    """What a file is by its name, ``None`` for other types."""
    try:
        return trace_kind(path.name)
    except ValidationError:
        return None


@dataclass(frozen=True)
class TraceInputs:
    """The files of one analysis: the traces and the optional job meta."""

    traces: tuple[Path, ...]
    meta: Path | None = None

    def describe(self, origin: str, *, full_paths: bool = False) -> str:
        """A one-line description for humans, e.g. ``upload: trace-ST.parquet + meta-ST.yaml``.

        ``full_paths`` names server files by their path rather than their name.
        """

        def name(path: Path) -> str:
            return str(path) if full_paths else path.name

        names = [name(p) for p in self.traces[:5]]
        if len(self.traces) > 5:
            names.append(f"… ({len(self.traces)} files)")
        text = f"{origin}: {', '.join(names)}"
        return f"{text} + {name(self.meta)}" if self.meta is not None else text


def check_combination(traces: Sequence[Path], metas: Sequence[Path]) -> TraceInputs:
    """The inputs, if they make one analysis: one Parquet trace or Kineto traces, ≤ 1 meta.

    Raises
    ------
    ValidationError
        Naming the files for: no trace, several metas, several Parquet traces, or Parquet mixed
        with Kineto.
    """
    if not traces:
        raise ValidationError(f"no trace file given: expected {ALLOWED_TYPES}")
    if len(metas) > 1:
        names = ", ".join(p.name for p in metas)
        raise ValidationError(f"{len(metas)} meta files given ({names}): expected at most 1")
    kinds = {p: trace_kind(p.name) for p in traces}
    canonical = [p.name for p, kind in kinds.items() if kind == "canonical"]
    kineto = [p.name for p, kind in kinds.items() if kind == "kineto"]
    if canonical and kineto:
        raise ValidationError(
            f"mixed inputs {canonical[0]!r} and {kineto[0]!r}: give either one canonical Parquet "
            "trace or Kineto JSON traces"
        )
    if len(canonical) > 1:
        raise ValidationError(
            f"{len(canonical)} Parquet traces given ({', '.join(canonical[:3])}): a canonical "
            "trace is one file"
        )
    return TraceInputs(tuple(traces), metas[0] if metas else None)


def split_by_kind(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """``(traces, metas)`` of ``paths``, refusing unsupported types."""
    traces: list[Path] = []
    metas: list[Path] = []
    for path in paths:
        (metas if trace_kind(path.name) == "meta" else traces).append(path)
    return traces, metas


# ---------------------------------------------------------------------------------------------
# Paths on the server


class PathNotAllowedError(ValidationError):
    """A server path lies outside the allowed roots, or server paths are disabled."""


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


OUTSIDE_ROOTS = "outside the directories this server may read (its what-if roots)"
"""How a refused server path is described; the roots themselves are not shown to clients."""


def relative_to_roots(text: str, roots: Iterable[Path]) -> str:
    """``text`` with each path under one of ``roots`` written relative to it, a root as ``.``.

    Error messages that reach clients name server files this way: the server's own layout
    (where the roots lie, a resolved symbolic link) stays out of them.
    """
    prefixes = sorted({str(root) for root in roots if str(root) != os.sep}, key=len, reverse=True)
    for prefix in prefixes:
        # the root followed by a separator, or by what ends a path in a message
        pattern = re.escape(prefix) + rf"(?:(?P<sep>{re.escape(os.sep)}+)|(?=[\s'\",;:)\]]|$))"
        text = re.sub(pattern, lambda m: "" if m.group("sep") else ".", text)
    return text


def _candidates(raw: str, roots: Sequence[Path]) -> list[Path]:
    # absolute paths as given; relative ones against each root, in order
    path = Path(raw).expanduser()
    return [path] if path.is_absolute() else [root / path for root in roots]


def _resolve_one(raw: str, roots: Sequence[Path], what: str) -> Path:
    resolved = [candidate.resolve() for candidate in _candidates(raw, roots)]
    inside = [path for path in resolved if _inside(path, roots)]
    if not inside:
        raise PathNotAllowedError(f"{what} {raw!r} is {OUTSIDE_ROOTS}")
    for path in inside:
        if path.exists():
            return path
    raise ValidationError(f"{what} {raw!r} does not exist on the server")


def _checked_files(paths: Iterable[Path], roots: Sequence[Path], raw: str) -> list[Path]:
    files = []
    for path in paths:
        real = path.resolve()
        if not _inside(real, roots):  # a symbolic link out of the roots
            shown = relative_to_roots(str(path), roots)
            raise PathNotAllowedError(f"path {raw!r} leads to {shown!r}, {OUTSIDE_ROOTS}")
        if real.is_file():
            files.append(real)
    return files


def _expand_glob(raw: str, roots: Sequence[Path]) -> list[Path]:
    for candidate in _candidates(raw, roots):
        parts = candidate.parts
        fixed = next(i for i, part in enumerate(parts) if _MAGIC.search(part))
        if not _inside(Path(*parts[:fixed]).resolve(), roots):
            raise PathNotAllowedError(f"path {raw!r} is {OUTSIDE_ROOTS}")
        matched = sorted(Path(p) for p in glob.glob(str(candidate)))
        if matched:
            return _checked_files(matched, roots, raw)
    raise ValidationError(f"path {raw!r} matches no file on the server")


def _refuse_unsafe(name: str, value: str | None) -> None:
    """Refuse NUL bytes and ``..`` components before any path is resolved or globbed.

    A glob with ``..`` after its first wildcard would walk out of the roots while matching, and
    the answer (a match or none) would tell a client which files exist elsewhere.
    """
    if value is None:
        return
    if "\x00" in value:
        raise ValidationError(f"{name} contains a NUL byte: expected a file path")
    if ".." in Path(value).parts:
        raise PathNotAllowedError(
            f"{name} {value!r} has a '..' component, refused because it could lead outside the "
            "directories this server may read"
        )


def resolve_server_inputs(path: str, meta: str | None, roots: Sequence[Path] | None) -> TraceInputs:
    """The inputs named by server paths, each checked to lie under ``roots``.

    ``path`` is a trace file, a directory of traces (its ``.parquet``/``.json``/``.json.gz``
    files; a single ``.yaml`` in it is the meta when ``meta`` is not given) or a glob. Relative
    paths are looked up under each root in turn. ``meta`` is a YAML file.

    Raises
    ------
    PathNotAllowedError
        When ``roots`` is ``None`` (server paths disabled) or a path, once symbolic links are
        resolved, lies outside every root.
    ValidationError
        When a path does not exist or matches nothing, or the files do not make one analysis.
    """
    if roots is None:
        raise PathNotAllowedError(
            "server paths are disabled on this server (it was started without what-if roots): "
            "upload the trace files instead"
        )
    if not path.strip():
        raise ValidationError("path is empty: expected a trace file, a directory or a glob")
    for name, value in (("path", path), ("meta", meta)):
        _refuse_unsafe(name, value)
    if _MAGIC.search(path):
        files = _expand_glob(path, roots)
        in_dir_metas: list[Path] = []
    else:
        found = _resolve_one(path, roots, "path")
        if found.is_dir():
            listed = _checked_files(sorted(found.iterdir()), roots, path)
            files = [p for p in listed if trace_kind_or_none(p) in ("canonical", "kineto")]
            if not files:
                raise ValidationError(
                    f"directory {path!r} holds no trace file (*.parquet, *.json, *.json.gz)"
                )
            in_dir_metas = [p for p in listed if trace_kind_or_none(p) == "meta"]
        else:
            files = _checked_files([found], roots, path)
            in_dir_metas = []
    traces, metas = split_by_kind(files)
    if metas:
        raise ValidationError(
            f"path {path!r} names the meta file {metas[0].name!r}: give the trace as 'path' and "
            "the meta as 'meta'"
        )
    if meta is not None:
        meta_path = _resolve_one(meta, roots, "meta")
        if not meta_path.is_file() or trace_kind_or_none(meta_path) != "meta":
            raise ValidationError(f"meta {meta!r} is not a .yaml/.yml file")
        metas = [meta_path]
    elif len(in_dir_metas) == 1:
        metas = in_dir_metas
    return check_combination(traces, metas)


# ---------------------------------------------------------------------------------------------
# Uploads


class ScratchSpace:
    """Where uploads are saved: one directory per report under ``root``.

    Without a ``root`` a temporary directory is made at the first upload and removed by
    :meth:`close`; a given ``root`` is created when missing and left in place.
    """

    def __init__(self, root: Path | None = None) -> None:
        self._root = root
        self._owned: Path | None = None
        self._lock = threading.Lock()

    def directory_for(self, report_id: str) -> Path:
        """A new, empty directory for the files of ``report_id``."""
        with self._lock:
            if self._root is None:
                self._owned = self._root = Path(tempfile.mkdtemp(prefix="minder-whatif-"))
            root = self._root
        root.mkdir(parents=True, exist_ok=True)
        directory = root / report_id
        directory.mkdir()
        return directory

    def close(self) -> None:
        """Remove the temporary directory, when this space made one."""
        with self._lock:
            owned, self._owned = self._owned, None
            if owned is not None:
                self._root = None
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)
