"""Inputs of a what-if analysis sent to the API, checked before anything runs.

Two ways in: the trace's files uploaded (``multipart/form-data``, streamed to disk with the request
size bounded), or paths on the server (which must lie under one of the allowed roots, symbolic
links resolved). Either way the result is a :class:`TraceInputs`: one canonical Parquet trace or
Kineto JSON traces of ranks, and an optional job meta YAML, as :func:`whatif.analyze_path` takes.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Literal

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from minder.core.errors import MinderError, ValidationError

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

logger = logging.getLogger(__name__)

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
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


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


class UploadTooLargeError(MinderError):
    """The request body is larger than the server accepts (HTTP 413)."""

    def __init__(self, limit: int, received: int | None = None) -> None:
        size = f"{received} bytes" if received is not None else f"more than {limit} bytes"
        super().__init__(f"the upload is {size}: this server accepts at most {limit} bytes")
        self.limit = limit


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


@dataclass
class Upload:
    """What a multipart request carried: the saved trace files, the meta and the text fields."""

    inputs: TraceInputs
    fields: dict[str, list[str]] = field(default_factory=dict)
    size: int = 0


def safe_filename(name: str) -> str:
    """The last component of a client's file name, restricted to ``[A-Za-z0-9._+-]``."""
    base = PurePosixPath(name.replace("\\", "/")).name
    cleaned = _UNSAFE.sub("_", base).lstrip(".")
    return cleaned or "upload"


@dataclass
class _Part:
    name: str = ""
    headers: dict[bytes, bytes] = field(default_factory=dict)
    header_name: bytes = b""
    header_value: bytes = b""
    file: IO[bytes] | None = None
    text: bytearray | None = None


class _MultipartSink:
    """python-multipart callbacks that write file parts straight into ``directory``."""

    def __init__(
        self,
        directory: Path,
        text_fields: Sequence[str],
        *,
        max_files: int,
        max_field_bytes: int,
    ) -> None:
        self.directory = directory
        self.text_fields = text_fields
        self.max_files = max_files
        self.max_field_bytes = max_field_bytes
        self.part = _Part()
        self.saved: list[Path] = []
        self.fields: dict[str, list[str]] = {}
        self.pending: list[tuple[IO[bytes], bytes]] = []
        self.to_close: list[IO[bytes]] = []
        self.open_files: list[IO[bytes]] = []
        self.ended = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_end": self.on_end,
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
        }

    def on_end(self) -> None:
        """The closing boundary arrived: the body is complete."""
        self.ended = True

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.part.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.part.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.part.headers[self.part.header_name.lower()] = self.part.header_value
        self.part.header_name = self.part.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.part.headers.get(b"content-disposition", b""))
        self.part.name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" not in options:
            if self.part.name not in self.text_fields:
                raise ValidationError(
                    f"unknown form field {self.part.name!r}: expected files and the text fields "
                    f"{list(self.text_fields)}"
                )
            self.part.text = bytearray()
            return
        client_name = options[b"filename"].decode("utf-8", "replace")
        if not client_name:  # an empty file input of an HTML form
            return
        trace_kind(client_name)  # refuse an unsupported type before reading its bytes
        if len(self.saved) >= self.max_files:
            raise ValidationError(f"more than {self.max_files} files uploaded")
        target = self._unique(safe_filename(client_name))
        handle = target.open("xb")
        self.open_files.append(handle)
        self.saved.append(target)
        self.part.file = handle

    def _unique(self, name: str) -> Path:
        target = self.directory / name
        counter = 1
        while target.exists():
            target = self.directory / f"{counter}-{name}"
            counter += 1
        return target

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part.file is not None:
            self.pending.append((self.part.file, data[start:end]))
        elif self.part.text is not None:
            self.part.text += data[start:end]
            if len(self.part.text) > self.max_field_bytes:
                raise ValidationError(
                    f"form field {self.part.name!r} is longer than {self.max_field_bytes} bytes"
                )

    def on_part_end(self) -> None:
        if self.part.file is not None:
            self.to_close.append(self.part.file)
        elif self.part.text is not None:
            try:
                value = self.part.text.decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError(f"form field {self.part.name!r} is not UTF-8") from None
            self.fields.setdefault(self.part.name, []).append(value)

    def flush(self) -> None:
        """Write the data received so far and close the finished files (blocking: a thread)."""
        for handle, data in self.pending:
            handle.write(data)
        self.pending.clear()
        for handle in self.to_close:
            handle.close()
        self.to_close.clear()

    def close_all(self) -> None:
        for handle in self.open_files:
            handle.close()


async def receive_upload(
    headers: Mapping[str, str],
    stream: AsyncIterator[bytes],
    directory: Path,
    *,
    max_bytes: int,
    text_fields: Sequence[str] = (),
    max_files: int = 10_000,
    max_field_bytes: int = 4096,
) -> Upload:
    """Stream a ``multipart/form-data`` body into ``directory`` and check what it holds.

    File parts, whatever their field name, are saved under their (sanitised) file name and sorted
    by type; an unsupported type is refused as soon as its part header arrives. Text parts must be
    among ``text_fields``. The caller removes ``directory`` when this raises.

    Raises
    ------
    UploadTooLargeError
        When the body exceeds ``max_bytes`` (checked against Content-Length first).
    ValidationError
        For a malformed or truncated body (no closing boundary), an unsupported file type, an
        unknown field, or files that do not make one analysis (see :func:`check_combination`).
    """
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise UploadTooLargeError(max_bytes, int(declared))
    _, params = parse_options_header(headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise ValidationError("multipart/form-data body without a boundary parameter")
    directory.mkdir(parents=True, exist_ok=True)
    sink = _MultipartSink(
        directory, text_fields, max_files=max_files, max_field_bytes=max_field_bytes
    )
    parser = MultipartParser(boundary, sink.callbacks())
    received = 0
    try:
        async for chunk in stream:
            received += len(chunk)
            if received > max_bytes:
                raise UploadTooLargeError(max_bytes)
            _feed(parser, chunk)
            if sink.pending or sink.to_close:
                await run_in_threadpool(sink.flush)
        _feed(parser, None)
        if not sink.ended:
            shown = boundary.decode("latin-1")
            shown = shown if len(shown) <= 70 else shown[:67] + "..."
            raise ValidationError(
                f"the multipart body ends after {received} bytes without its closing boundary "
                f"'--{shown}--': the upload was cut short (expected the complete body)"
            )
        sink.flush()
    finally:
        sink.close_all()
    traces, metas = split_by_kind(sink.saved)
    inputs = check_combination(traces, metas)
    logger.info("received upload of %d bytes into %s: %s", received, directory, inputs)
    return Upload(inputs=inputs, fields=sink.fields, size=received)


def _feed(parser: MultipartParser, chunk: bytes | None) -> None:
    """Give ``parser`` a chunk (``None``: the end), turning its parse errors into ours."""
    try:
        if chunk is None:
            parser.finalize()
        else:
            parser.write(chunk)
    except MinderError:
        raise
    except Exception as exc:  # python-multipart's own errors: the body is malformed
        raise ValidationError(f"malformed multipart body: {exc}") from None
