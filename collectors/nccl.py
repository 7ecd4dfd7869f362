"""NCCL Inspector dumps -> per-rank collective time and bus bandwidth.

The NCCL Inspector profiler plugin (``NVIDIA/nccl:plugins/profiler/inspector``, enabled with
``NCCL_PROFILER_PLUGIN=.../libnccl-profiler-inspector.so NCCL_INSPECTOR_ENABLE=1``) writes one
file per process, ``<NCCL_INSPECTOR_DUMP_DIR>/<hostname>-pid<pid>.log``, holding one compact JSON
object per line. For live data the dump thread must run periodically
(``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS`` > 0, e.g. ``1000000``); its default (-1)
writes only at communicator teardown.

Line formats (README and ``inspector_json.cc`` / ``inspector_json_reader.py`` of NVIDIA/nccl):

* v4.0-v4.2: every operation line is self-contained,
  ``{"header": {"id", "comm_name", "rank", "n_ranks", "nnodes"}, "metadata": {
  "inspector_output_format_version", "dump_timestamp_us", "hostname", "pid", ...},
  "coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us",
  "coll_timing_source", "coll_algobw_gbs", "coll_busbw_gbs", ...}}`` (P2P lines carry
  ``p2p_perf`` instead); v4.2 adds a ``dump_stats`` marker line per communicator dump.
* v4.3: each communicator dump starts with a ``{"header", "metadata", "dump_stats"}`` marker
  whose ``coll_records`` / ``p2p_records`` / ``proxy_records`` count the payload lines
  ``{"coll_perf": {...}}`` / ``{"p2p_perf": {...}}`` / ``{"proxy_trace": {...}}`` that follow;
  payload lines take their header from that marker.

Units: ``coll_exec_time_us`` is an integer number of microseconds (``jsonUint64(...
execTimeUsecs)``; 0 means the plugin had no valid timing); ``coll_busbw_gbs`` is decimal GB/s:
``inspector.cc`` computes ``algoBwGbs = trafficSize / 1.0E9 / timeInSec`` and ``busBwGbs =
algoBwGbs * factor``, so bytes/s = GB/s x 1e9. A bus bandwidth of 0 means the plugin could not
compute one (single-rank communicator, unknown collective) and is left out of the mean.

``header.rank`` is the rank *within the communicator*, not the job-wide rank. The global rank of
a dump file's process is read from that process's environment (``/proc/<pid>/environ``: ``RANK``
as set by torchrun, else ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``) when the file
was written on this host and the environment shows an NCCL profiler process (so a pid from another
PID namespace is not trusted). Otherwise the rank in the largest communicator the file has shown
is used (the world communicator, where the job has one carrying >= 8 KiB collectives); when two
files resolve to the same rank that way, neither is trusted and the clash is reported.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from collectors.base import Collected, ProblemLog

logger = logging.getLogger(__name__)

_FILE_RE = re.compile(r"(?P<host>.+)-pid(?P<pid>\d+)\.log")
"""Inspector JSON dump files: ``<hostname>-pid<pid>.log`` (``inspectorStateDumpJSON``)."""

_PAYLOADS = {"coll_perf": "coll_records", "p2p_perf": "p2p_records", "proxy_trace": "proxy_records"}
"""v4.3 payload key -> the ``dump_stats`` count of such lines after the marker."""

_RANK_ENV = (b"RANK", b"SLURM_PROCID", b"OMPI_COMM_WORLD_RANK", b"PMI_RANK")
_NCCL_PROFILER_ENV = (b"NCCL_PROFILER_PLUGIN", b"NCCL_INSPECTOR_ENABLE")

_NUMBER_TYPES = (int, float)
_MICROSECOND = 1e-6
_GIGABYTE = 1e9
_MAX_READ_BYTES = 8 << 20
"""Most bytes read from one file per interval; a larger backlog is read in later intervals."""
_MAX_LINE_BYTES = 1 << 20
"""A line longer than this (Inspector lines are ~0.2-5 KB) is skipped as corrupt."""
_TAIL_PROBE_BYTES = 64 << 10
"""How far back from the end a file present at start is searched for its last line break."""


@dataclass(slots=True)
class _Context:
    """The v4.3 marker a file's following payload lines belong to."""

    rank: int
    n_ranks: int
    remaining: dict[str, int]


@dataclass(slots=True)
class _Tail:
    """Read state of one dump file."""

    host: str
    pid: int
    ident: tuple[int, int]
    """``(st_dev, st_ino)``: a different one under the same name is a new file."""
    offset: int = 0
    """Bytes consumed: everything before it has been parsed (complete lines only)."""
    synced: bool = True
    """False after starting mid-file: payload lines before the first marker are skipped."""
    context: _Context | None = None
    world: tuple[int, int] | None = None
    """``(n_ranks, rank)`` of the largest communicator this file has shown."""
    env_checked: bool = False
    env_rank: int | None = None
    seconds: list[float] = field(default_factory=list)
    busbw: list[float] = field(default_factory=list)

    def restart(self, ident: tuple[int, int]) -> None:
        """Forget everything: the file was replaced or truncated."""
        self.ident = ident
        self.offset = 0
        self.synced = True
        self.context = None
        self.world = None
        self.env_checked = False
        self.env_rank = None

    def note_comm(self, rank: int, n_ranks: int) -> None:
        if self.world is None or n_ranks > self.world[0]:
            self.world = (n_ranks, rank)


class NcclSource:
    """Tails NCCL Inspector JSON dumps and reports each rank's collectives of the interval.

    Each ``collect`` reads only the complete lines appended since the previous one (a partial
    last line waits), follows files that appear, and starts over on a file that shrank or was
    replaced. Files already present at the first ``collect`` are read from their end: their
    history did not happen in this interval. Per global rank it emits the mean execution time of
    the collectives read (``nccl_collective_seconds``) and their mean bus bandwidth
    (``nccl_busbw_bytes_per_second``); P2P and proxy records are not collectives and are skipped.

    Parameters
    ----------
    directory
        ``NCCL_INSPECTOR_DUMP_DIR`` of the jobs on this node.
    hostname
        Read only the files of this host (for a dump directory shared between nodes); None reads
        every Inspector file in the directory.
    proc_root
        Where to read ``<pid>/environ`` for the global rank of a dump file's process.
    """

    name = "nccl"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        hostname: str | None = None,
        proc_root: str | os.PathLike[str] = "/proc",
    ) -> None:
        self.directory = Path(directory)
        self.hostname = hostname
        self.problems = ProblemLog(self.name)
        self._proc_root = Path(proc_root)
        self._local_host = socket.gethostname()
        self._tails: dict[str, _Tail] = {}
        self._started = False
        self._absent = False

    def collect(self, now: float) -> Collected:
        """Read what the Inspector appended since the previous call; never raises for bad input."""
        out = Collected()
        try:
            with os.scandir(self.directory) as listing:
                entries = list(listing)
        except (FileNotFoundError, NotADirectoryError):
            if not self._absent:
                self._absent = True
                self.problems.report("absent", f"no NCCL Inspector directory {self.directory}")
            self._tails.clear()
            self._started = True
            return out
        except OSError as exc:
            self.problems.report("unreadable", f"cannot list {self.directory}: {exc}")
            return out
        self._absent = False

        active: list[_Tail] = []
        seen: set[str] = set()
        for entry in entries:
            match = _FILE_RE.fullmatch(entry.name)
            if match is None or (self.hostname is not None and match["host"] != self.hostname):
                continue
            seen.add(entry.name)
            tail = self._read(entry, match["host"], int(match["pid"]), first=not self._started)
            if tail is not None and tail.seconds:
                active.append(tail)
        for gone in self._tails.keys() - seen:
            del self._tails[gone]
        self._started = True

        by_rank: dict[int, list[tuple[_Tail, bool]]] = {}
        for tail in active:
            resolved = self._rank_of(tail)
            if resolved is not None:
                by_rank.setdefault(resolved[0], []).append((tail, resolved[1]))
        for rank in sorted(by_rank):
            claims = by_rank[rank]
            if len(claims) > 1 and not all(from_env for _, from_env in claims):
                # A rank inferred from a communicator is only trusted when nothing contradicts it.
                self.problems.report(
                    "rank_conflict",
                    f"{len(claims)} dump files resolve to rank {rank}; the process environment "
                    "was unreadable, so ranks fell back to communicator ranks",
                )
                claims = [claim for claim in claims if claim[1]]
            seconds = [value for tail, _ in claims for value in tail.seconds]
            busbw = [value for tail, _ in claims for value in tail.busbw]
            if seconds:
                out.add("nccl_collective_seconds", f"rank{rank}", math.fsum(seconds) / len(seconds))
            if busbw:
                out.add("nccl_busbw_bytes_per_second", f"rank{rank}", math.fsum(busbw) / len(busbw))
        for tail in active:
            tail.seconds.clear()
            tail.busbw.clear()
        return out

    def close(self) -> None:
        """Nothing is held open between intervals; forget the read positions."""
        self._tails.clear()
        self._started = False

    # -- reading ---------------------------------------------------------------------------

    def _read(self, entry: os.DirEntry[str], host: str, pid: int, *, first: bool) -> _Tail | None:
        """Parse the complete lines appended to one file; returns its state."""
        tail = self._tails.get(entry.name)
        try:
            st = entry.stat()
            if (
                tail is not None
                and (st.st_dev, st.st_ino) == tail.ident
                and (st.st_size == tail.offset)
            ):
                return tail  # unchanged: no open() for idle files of finished processes
            with open(entry.path, "rb") as handle:
                st = os.fstat(handle.fileno())
                ident = (st.st_dev, st.st_ino)
                if tail is None:
                    tail = _Tail(host, pid, ident)
                    self._tails[entry.name] = tail
                    if first:
                        tail.offset = self._last_line_end(handle, st.st_size)
                        tail.synced = False
                elif tail.ident != ident:
                    logger.info("NCCL Inspector file %s was replaced; reading it anew", entry.path)
                    tail.restart(ident)
                elif st.st_size < tail.offset:
                    logger.info("NCCL Inspector file %s shrank; reading it anew", entry.path)
                    tail.restart(ident)
                if st.st_size <= tail.offset:
                    return tail
                handle.seek(tail.offset)
                data = handle.read(min(st.st_size - tail.offset, _MAX_READ_BYTES))
        except FileNotFoundError:
            return tail  # removed between listing and reading; forgotten next interval
        except OSError as exc:
            self.problems.report("unreadable", f"cannot read {entry.path}: {exc}")
            return tail

        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > _MAX_LINE_BYTES:
                self.problems.report(
                    "line_too_long", f"{entry.path}: over {_MAX_LINE_BYTES} bytes without a newline"
                )
                tail.offset += len(data)
            return tail  # a partial last line waits for the rest
        tail.offset += end + 1
        for line in data[:end].split(b"\n"):
            if line.strip():
                self._parse(tail, line, entry.path)
        return tail

    @staticmethod
    def _last_line_end(handle: IO[bytes], size: int) -> int:
        """Offset just after the last line break, so reading starts on a line boundary."""
        start = max(0, size - _TAIL_PROBE_BYTES)
        handle.seek(start)
        tail_bytes = handle.read(size - start)
        cut = tail_bytes.rfind(b"\n")
        return size if cut < 0 else start + cut + 1

    def _parse(self, tail: _Tail, line: bytes, path: str) -> None:
        """Fold one Inspector line into ``tail``'s interval (or its context)."""
        try:
            record = orjson.loads(line)  # ~3x faster than json on these lines
        except orjson.JSONDecodeError:
            self.problems.report("not_json", f"{path}: a line is not JSON: {line[:80]!r}")
            return
        if not isinstance(record, dict):
            self.problems.report("not_json", f"{path}: a line is not a JSON object: {line[:80]!r}")
            return

        if "dump_stats" in record:  # v4.2+ marker: context for the v4.3 payload lines after it
            tail.context = None
            tail.synced = True
            header = self._header(record, path)
            stats = record["dump_stats"]
            if header is None:
                return
            tail.note_comm(*header)
            remaining = {}
            for payload, key in _PAYLOADS.items():
                count = stats.get(key, 0) if isinstance(stats, dict) else 0
                remaining[payload] = count if isinstance(count, int) and count > 0 else 0
            tail.context = _Context(header[0], header[1], remaining)
            return

        if "header" in record:  # v4.0-v4.2: the line carries its own context
            header = self._header(record, path)
            if header is None:
                return
            tail.synced = True
            tail.note_comm(*header)
        else:  # v4.3 payload: context from the last marker, within its record counts
            kind = next((key for key in _PAYLOADS if key in record), None)
            if kind is None:
                self.problems.report(
                    "unknown_record", f"{path}: a record of unknown shape: {line[:80]!r}"
                )
                return
            context = tail.context
            if context is None or context.remaining[kind] <= 0:
                if tail.synced:
                    self.problems.report(
                        "no_context", f"{path}: a {kind} line without a dump_stats marker before it"
                    )
                return
            context.remaining[kind] -= 1

        perf = record.get("coll_perf")
        if perf is None:
            return  # P2P or proxy record: not a collective
        try:
            exec_us, busbw_gbs = perf["coll_exec_time_us"], perf["coll_busbw_gbs"]
        except (KeyError, TypeError):
            self.problems.report(
                "missing_field",
                f"{path}: coll_perf lacks coll_exec_time_us or coll_busbw_gbs: {line[:120]!r}",
            )
            return
        # type() rather than isinstance(): a bool is not a number here; the plugin writes a NaN
        # double as the string "nan".
        if (
            type(exec_us) not in _NUMBER_TYPES
            or type(busbw_gbs) not in _NUMBER_TYPES
            or not 0 <= exec_us < math.inf
            or not 0 <= busbw_gbs < math.inf
        ):
            self.problems.report(
                "not_numeric",
                f"{path}: coll_exec_time_us={exec_us!r}, coll_busbw_gbs={busbw_gbs!r}: "
                "expected non-negative numbers",
            )
            return
        if exec_us == 0:
            # The plugin writes 0 when it had no valid timing for the collective.
            self.problems.report("invalid_timing", f"{path}: a collective with 0 us exec time")
            return
        tail.seconds.append(exec_us * _MICROSECOND)
        if busbw_gbs > 0:
            tail.busbw.append(busbw_gbs * _GIGABYTE)

    def _header(self, record: dict[str, object], path: str) -> tuple[int, int] | None:
        """``(rank, n_ranks)`` of a record's communicator header, or None (reported)."""
        header = record.get("header")
        if not isinstance(header, dict) or "rank" not in header or "n_ranks" not in header:
            self.problems.report("missing_field", f"{path}: a record without header.rank/n_ranks")
            return None
        rank, n_ranks = header["rank"], header["n_ranks"]
        if (
            isinstance(rank, bool)
            or isinstance(n_ranks, bool)
            or not isinstance(rank, int)
            or not isinstance(n_ranks, int)
            or not 0 <= rank < n_ranks
        ):
            self.problems.report(
                "not_numeric",
                f"{path}: header rank={rank!r}, n_ranks={n_ranks!r}: expected 0 <= rank < n_ranks",
            )
            return None
        return rank, n_ranks

    # -- global rank -----------------------------------------------------------------------

    def _rank_of(self, tail: _Tail) -> tuple[int, bool] | None:
        """``(global rank, read from the process environment)`` of a file's process."""
        if not tail.env_checked:
            tail.env_checked = True
            tail.env_rank = self._env_rank(tail.host, tail.pid)
        if tail.env_rank is not None:
            return tail.env_rank, True
        if tail.world is not None:
            return tail.world[1], False
        return None

    def _env_rank(self, host: str, pid: int) -> int | None:
        """The launcher's rank variable of ``pid``, if that is an NCCL process of this host."""
        if host != self._local_host:
            return None  # the pid belongs to another machine
        try:
            raw = (self._proc_root / str(pid) / "environ").read_bytes()
        except OSError as exc:
            logger.debug("no environment for pid %d (%s); using communicator ranks", pid, exc)
            return None
        env: dict[bytes, bytes] = {}
        for item in raw.split(b"\0"):
            key, _, value = item.partition(b"=")
            env[key] = value
        if not any(key in env for key in _NCCL_PROFILER_ENV):
            return None  # not the process that wrote the file (pid reused or another namespace)
        for key in _RANK_ENV:
            value = env.get(key, b"").strip()
            if value.isdigit():
                return int(value)
        return None
