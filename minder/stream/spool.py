"""A bounded on-disk FIFO of encoded batches: what the node agent has not delivered yet.

The agent appends every encoded batch here and its sender removes a batch only once the broker
has acknowledged it, so a Kafka outage (or an agent restart during one) loses nothing until the
spool is full; then the *oldest* batches are dropped first and counted, because the detectors need
the freshest data most.

Layout of the directory:

- ``seg-<first sequence number, 20 digits>.spool``: append-only segment files of records
  ``magic (4 bytes) | payload length (u32 LE) | CRC-32 of the payload (u32 LE) | payload``;
  a record's sequence number is its segment's first one plus its index in the segment;
- ``head``: the sequence number of the oldest live record, replaced atomically (write a temporary
  file, then :func:`os.replace`) at every acknowledgement or drop.

Crash safety: every record is written with one ``write`` call to a file opened for appending, so
a process crash leaves at worst a torn last record; reopening detects it (short header, short
payload, bad magic or bad CRC), truncates it away and logs it. A crash between the delivery of a
record and the head update makes the record go out again after the restart (at least once). With
``fsync=True`` every append and head update is also flushed to the device (power loss); the
default leaves that to the OS page cache.

Disk use is bounded by ``max_bytes`` for live records plus at most one segment of already
acknowledged records (``segment_bytes``) before it is deleted.
"""

from __future__ import annotations

import builtins
import fcntl
import logging
import os
import re
import struct
import threading
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self

from minder.core.errors import ValidationError

logger = logging.getLogger(__name__)

MAGIC = b"MSP1"
_HEADER = struct.Struct("<4sII")
HEADER_BYTES = _HEADER.size
"""Bytes each record costs besides its payload (counted against ``max_bytes``)."""
_SEGMENT = re.compile(r"seg-(\d{20})\.spool")
_MAX_SEGMENT_BYTES = 16 * 2**20


class SpoolRecord(NamedTuple):
    """One spooled payload and its sequence number (for :meth:`Spool.ack`)."""

    seq: int
    payload: bytes


@dataclass(slots=True)
class _Entry:
    seq: int
    segment: int  # first sequence number of the segment file holding the record
    offset: int  # of the payload in that file
    length: int

    @property
    def size(self) -> int:
        return HEADER_BYTES + self.length


class Spool:
    """Bounded, persistent FIFO of byte strings (thread-safe).

    Parameters
    ----------
    directory
        Where the segment and head files live (created if missing). One spool per directory.
    max_bytes
        Bound on the live records (payloads plus :data:`HEADER_BYTES` each); appending beyond it
        drops the oldest records first and counts them in :attr:`dropped_total`.
    segment_bytes
        Size at which a new segment file is started; default ``max_bytes / 8`` capped at 16 MiB.
    fsync
        Flush every append and head update to the device, not only to the OS.

    Attributes
    ----------
    dropped_total
        Records dropped (oldest first) to stay within ``max_bytes`` since this object was opened.
    appended_total
        Records appended since this object was opened.
    torn_total
        Torn or corrupt records found and discarded when the spool was opened.

    Raises
    ------
    ValidationError
        Bad sizes, or the directory cannot be used: not creatable, locked by another process,
        or a file in it that cannot be read (the message names the path).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        *,
        segment_bytes: int | None = None,
        fsync: bool = False,
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValidationError(f"spool max_bytes is {max_bytes!r}: expected an integer > 0")
        if segment_bytes is None:
            segment_bytes = max(1, min(max_bytes // 8, _MAX_SEGMENT_BYTES))
        if segment_bytes <= 0:
            raise ValidationError(f"spool segment_bytes is {segment_bytes!r}: expected > 0")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.dropped_total = 0
        self.appended_total = 0
        self.torn_total = 0
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._segments: dict[int, int] = {}  # first seq -> file size, oldest first
        self._tail: int | None = None  # segment being appended to
        self._tail_fd: int | None = None
        self._read_fds: dict[int, int] = {}
        self._head = 0
        self._next_seq = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(
                self.directory / "lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600
            )
        except OSError as exc:
            raise ValidationError(
                f"cannot use the spool directory {self.directory}: {exc}"
            ) from exc
        try:
            # Two agents appending to one spool would interleave their records: refuse the second.
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ValidationError(
                f"spool directory {self.directory} is in use by another process: give each agent "
                "its own spool directory"
            ) from None
        try:
            self._load()
        except OSError as exc:  # an unreadable segment, head or directory listing
            self._close_files()
            raise ValidationError(
                f"cannot open the spool in {self.directory}: {exc} (fix its permissions or move "
                "the damaged file away)"
            ) from exc
        except BaseException:
            self._close_files()
            raise

    # -- public API ----------------------------------------------------------------------

    def append(self, payload: bytes) -> int:
        """Append ``payload`` and return its sequence number; drops the oldest when full.

        Raises
        ------
        ValidationError
            ``payload`` alone is larger than ``max_bytes``.
        """
        size = HEADER_BYTES + len(payload)
        if size > self.max_bytes:
            raise ValidationError(
                f"a record of {len(payload)} bytes (+{HEADER_BYTES} header) cannot fit a spool of "
                f"max_bytes={self.max_bytes}: raise the spool size"
            )
        with self._lock:
            dropped = 0
            while self._entries and self._bytes + size > self.max_bytes:
                self._pop_oldest()
                dropped += 1
            if dropped:
                self.dropped_total += dropped
                self._write_head()
                self._delete_consumed()
                logger.warning(
                    "spool %s full (%d bytes max): dropped the %d oldest batch(es), %d so far",
                    self.directory,
                    self.max_bytes,
                    dropped,
                    self.dropped_total,
                )
            if self._tail is None or self._segments[self._tail] >= self.segment_bytes:
                self._roll()
            assert self._tail is not None and self._tail_fd is not None
            seq = self._next_seq
            offset = self._segments[self._tail]
            record = _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
            written = os.write(self._tail_fd, record)
            if written != len(record):  # a short write on a regular file: disk full
                os.ftruncate(self._tail_fd, offset)
                raise OSError(f"short write to the spool {self.directory}: {written} of {size}")
            if self.fsync:
                os.fsync(self._tail_fd)
            self._segments[self._tail] = offset + len(record)
            self._entries.append(_Entry(seq, self._tail, offset + HEADER_BYTES, len(payload)))
            self._bytes += size
            self._next_seq = seq + 1
            self.appended_total += 1
            return seq

    def peek(self) -> SpoolRecord | None:
        """The oldest live record, or None when the spool is empty."""
        records = self.peek_many(1)
        return records[0] if records else None

    def peek_many(self, max_records: int, max_bytes: int | None = None) -> list[SpoolRecord]:
        """Up to ``max_records`` oldest live records, in order, at most ``max_bytes`` of payload
        (but always at least one record when the spool is not empty)."""
        out: list[SpoolRecord] = []
        total = 0
        with self._lock:
            for entry in self._entries:
                if len(out) >= max_records or (
                    out and max_bytes is not None and total + entry.length > max_bytes
                ):
                    break
                out.append(SpoolRecord(entry.seq, self._read(entry)))
                total += entry.length
        return out

    def ack(self, seq: int) -> int:
        """Remove every live record with a sequence number up to ``seq``; return how many.

        A record already dropped (the spool overflowed while it was being sent) is simply no
        longer there, so acknowledging never removes a record newer than ``seq``.
        """
        with self._lock:
            removed = 0
            while self._entries and self._entries[0].seq <= seq:
                self._pop_oldest()
                removed += 1
            if removed:
                self._write_head()
                self._delete_consumed()
            return removed

    def __len__(self) -> int:
        """Live records."""
        with self._lock:
            return len(self._entries)

    @property
    def bytes(self) -> int:
        """Bytes of live records, headers included (bounded by ``max_bytes``)."""
        with self._lock:
            return self._bytes

    @property
    def oldest_seq(self) -> int | None:
        """Sequence number of the oldest live record."""
        with self._lock:
            return self._entries[0].seq if self._entries else None

    def close(self) -> None:
        """Close the files; the records stay on disk for the next :class:`Spool` here."""
        with self._lock:
            self._close_files()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Spool({str(self.directory)!r}, records={len(self._entries)}, bytes={self._bytes}, "
            f"max_bytes={self.max_bytes})"
        )

    # -- internals (called with the lock held) -------------------------------------------

    def _segment_path(self, first: int) -> Path:
        return self.directory / f"seg-{first:020d}.spool"

    def _load(self) -> None:
        head_path = self.directory / "head"
        try:
            self._head = int(head_path.read_text().strip() or 0)
        except FileNotFoundError:
            self._head = 0
        except (OSError, ValueError) as exc:
            # Without a readable head, every record still on disk is live: at least once.
            logger.error(
                "spool head file %s unreadable (%s): resending all records", head_path, exc
            )
            self._head = 0
        firsts = sorted(
            int(m.group(1)) for p in self.directory.iterdir() if (m := _SEGMENT.fullmatch(p.name))
        )
        self._next_seq = self._head
        for index, first in enumerate(firsts):
            last_segment = index == len(firsts) - 1
            size, count = self._scan(first, last_segment)
            self._segments[first] = size
            self._next_seq = max(self._next_seq, first + count)
        self._delete_consumed()
        # Appends go to a fresh segment: the old tail may have been cut short by a crash.
        self._tail = None
        over = 0
        while self._entries and self._bytes > self.max_bytes:  # max_bytes lowered since
            self._pop_oldest()
            over += 1
        if over:
            self.dropped_total += over
            logger.warning(
                "spool %s held more than max_bytes=%d: dropped the %d oldest batch(es)",
                self.directory,
                self.max_bytes,
                over,
            )
        if over or self._entries:
            self._write_head()
            self._delete_consumed()
        if self._entries:
            logger.info(
                "spool %s reopened with %d batch(es), %d bytes, to send",
                self.directory,
                len(self._entries),
                self._bytes,
            )

    def _scan(self, first: int, last_segment: bool) -> tuple[int, int]:
        """Index the records of one segment; cut off a torn or corrupt end. (size, records)"""
        path = self._segment_path(first)
        data = path.read_bytes()
        offset = 0
        count = 0
        problem = ""
        while offset < len(data):
            if len(data) - offset < HEADER_BYTES:
                problem = f"a torn header of {len(data) - offset} bytes"
                break
            magic, length, crc = _HEADER.unpack_from(data, offset)
            start = offset + HEADER_BYTES
            if magic != MAGIC:
                problem = f"bad magic {magic!r}"
                break
            if start + length > len(data):
                problem = f"a torn record ({len(data) - start} of {length} payload bytes)"
                break
            if zlib.crc32(data[start : start + length]) != crc:
                problem = "a record with a bad CRC"
                break
            seq = first + count
            if seq >= self._head:
                self._entries.append(_Entry(seq, first, start, length))
                self._bytes += HEADER_BYTES + length
            count += 1
            offset = start + length
        if problem:
            self.torn_total += 1
            (logger.warning if last_segment else logger.error)(
                "spool segment %s ends in %s at byte %d: discarded the last %d bytes%s",
                path,
                problem,
                offset,
                len(data) - offset,
                "" if last_segment else " (not the last segment: the file was damaged)",
            )
            with path.open("r+b") as handle:
                handle.truncate(offset)
        return offset, count

    def _roll(self) -> None:
        self._close_tail()
        first = self._next_seq
        path = self._segment_path(first)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._tail_fd = os.open(path, flags, 0o600)
        self._tail = first
        self._segments[first] = os.fstat(self._tail_fd).st_size
        if self.fsync:
            _fsync_dir(self.directory)

    def _close_files(self) -> None:
        self._close_tail()
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def _close_tail(self) -> None:
        if self._tail_fd is not None:
            os.close(self._tail_fd)
            self._tail_fd = None

    def _pop_oldest(self) -> None:
        entry = self._entries.popleft()
        self._bytes -= entry.size
        self._head = entry.seq + 1

    def _write_head(self) -> None:
        path = self.directory / "head"
        tmp = self.directory / "head.tmp"
        with tmp.open("w") as handle:
            handle.write(f"{self._head}\n")
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)

    def _delete_consumed(self) -> None:
        """Delete the segment files all of whose records are acknowledged or dropped."""
        # Records live in segments up to the tail, in order: every segment before the one that
        # holds the oldest live record is consumed (all of them, tail included, when none is live).
        oldest_live = self._entries[0].segment if self._entries else None
        for first in list(self._segments):
            if first == oldest_live:
                break
            if first == self._tail:
                self._close_tail()
                self._tail = None
            fd = self._read_fds.pop(first, None)
            if fd is not None:
                os.close(fd)
            self._segment_path(first).unlink(missing_ok=True)
            del self._segments[first]

    def _read(self, entry: _Entry) -> builtins.bytes:
        fd = self._read_fds.get(entry.segment)
        if fd is None:
            fd = os.open(
                self._segment_path(entry.segment), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
            )
            self._read_fds[entry.segment] = fd
        data = os.pread(fd, entry.length, entry.offset)
        if len(data) != entry.length:
            raise OSError(
                f"spool segment {self._segment_path(entry.segment)} is shorter than its index "
                f"(record {entry.seq}): was it modified while open?"
            )
        return data


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
