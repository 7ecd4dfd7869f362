"""What-if uploads: a ``multipart/form-data`` body streamed to disk with its size bounded.

The saved files are checked as any what-if inputs are (:mod:`minder.service.whatif_inputs`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from minder.core.errors import MinderError, ValidationError
from minder.service.whatif_inputs import TraceInputs, check_combination, split_by_kind, trace_kind

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


class UploadTooLargeError(MinderError):
    """The request body is larger than the server accepts (HTTP 413)."""

    def __init__(self, limit: int, received: int | None = None) -> None:
        size = f"{received} bytes" if received is not None else f"more than {limit} bytes"
        super().__init__(f"the upload is {size}: this server accepts at most {limit} bytes")
        self.limit = limit


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
