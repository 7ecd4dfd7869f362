"""The node's PyTorch flight-recorder dumps: find the new ones, summarise them, hand them on.

A training process with the flight recorder on (``TORCH_FR_BUFFER_SIZE``) writes its ring of
collectives to ``<prefix><rank>`` when a collective times out or when asked to
(``TORCH_FR_DUMP_TEMP_FILE``; older releases ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``; default
``/tmp/nccl_trace_rank_``). :class:`FrWatcher` watches that prefix's directory for such files,
summarises each new one (:func:`collectors.flight_recorder.summarize`: a
:class:`~minder.core.hang.RankSummary`, a few kilobytes) and keeps the summaries until the agent
takes them into its next batch (:attr:`~minder.core.records.NodeBatch.flight_recorder`), so they
travel through the spool and the signed sender like every batch.

Cost. The directory is listed (one ``os.scandir``) at most once per ``poll_s`` (5 s), whatever
the agent's interval; with no directory that is one failed system call, with no dump one listing
of the directory. A dump is read only once it has stopped changing.

Which files, and when:

- a file of the directory named ``<prefix><rank>`` (decimal digits, optionally ``.json``,
  ``.pkl`` or ``.pickle``: :func:`collectors.flight_recorder.rank_of`), a regular file (not a
  link, which is not followed), is taken once its size and modification time are the same at two
  polls in a row (the recorder writes it in place: a file still growing waits);
- a dump rewritten later (another size or modification time) is taken again, unless its bytes
  are those already taken from that file (a dump is never sent twice);
- dumps already there when the watcher starts are taken if they were written at most
  ``max_age_at_start_s`` (10 min) before its first poll: an agent restarted while a job hangs
  still reports it, and days-old dumps of jobs long gone are left alone (a later rewrite of
  such a file is taken);
- at most ``max_per_poll`` dumps are read per poll, and a poll stops reading once it has spent
  ``poll_budget_s`` (the collection interval must hold); the rest are read at the next polls.

A file that is not a flight-recorder dump, or a corrupt or oversized one, is skipped with one
log line per file (each new version of the file logs again) and counted in :attr:`problems`
(reasons ``not_a_dump``, ``unreadable``, ``too_large``), which the agent exports like its
sources' problems (``minder_agent_source_errors_total{source="flight_recorder"}``).

Nothing received is silently lost: summaries wait in the watcher until taken, at most
:data:`MAX_SUMMARIES_PER_BATCH` and ``max_batch_bytes`` per batch (the rest go in the following
batches); beyond ``max_pending`` waiting the oldest are dropped, counted (``dropped``) and
logged.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from collectors.base import ProblemLog
from collectors.flight_recorder import (
    MAX_DUMP_BYTES,
    dump_prefix_from_env,
    parse_dump,
    rank_of,
    summarize,
)
from minder.core.errors import ValidationError
from minder.core.hang import MAX_SUMMARIES_PER_BATCH, RankSummary

__all__ = [
    "DEFAULT_POLL_S",
    "FR_SOURCE",
    "MAX_BATCH_BYTES",
    "MAX_DUMP_BYTES",
    "FrWatcher",
    "split_prefix",
]

logger = logging.getLogger(__name__)

FR_SOURCE = "flight_recorder"
"""The watcher's name in the agent's counters (``source`` label)."""
DEFAULT_POLL_S = 5.0
"""Seconds between two listings of the dump directory."""
MAX_AGE_AT_START_S = 600.0
"""Dumps written this long before the first poll are still taken; older ones are not."""
MAX_PER_POLL = 16
"""Dumps read per poll (a node runs a few dozen ranks at most)."""
POLL_BUDGET_S = 0.5
"""A poll reads no further dump once it has spent this long (the rest wait for the next)."""
MAX_PENDING = 4 * MAX_SUMMARIES_PER_BATCH
"""Summaries kept waiting for a batch; beyond it the oldest are dropped (counted)."""
MAX_BATCH_BYTES = 512 * 1024
"""Encoded bytes of summaries one batch carries at most (a Kafka message stays far below the
brokers' usual 1 MiB limit); a summary larger than this alone is refused (``too_large``)."""
MAX_TRACKED = 4_096
"""Files of the directory the watcher remembers (beyond, matching files are not looked at)."""


def split_prefix(prefix: str) -> tuple[Path, str]:
    """``/tmp/nccl_trace_rank_`` → ``(Path("/tmp"), "nccl_trace_rank_")``.

    Raises
    ------
    ValidationError
        ``prefix`` has no file-name part (it ends with ``/``) or is empty.
    """
    directory, _, name = prefix.rpartition("/")
    if not name:
        raise ValidationError(
            f"flight-recorder prefix is {prefix[:200]!r}: expected DIRECTORY/NAME_PREFIX, e.g. "
            "/tmp/nccl_trace_rank_ (the dumps are NAME_PREFIX<rank>)"
        )
    return Path(directory or "."), name


@dataclass(slots=True)
class _File:
    """What the watcher knows of one dump file."""

    size: int
    mtime_ns: int
    settled: bool = False
    """Seen with this size and time at two polls in a row."""
    done: bool = False
    """This version was taken, refused or left alone: not read again unless it changes."""


@dataclass(slots=True)
class _Pending:
    summary: RankSummary
    size: int
    """Its encoded size (JSON, an upper bound of the msgpack the agent sends)."""


class FrWatcher:
    """Watches a directory for flight-recorder dumps and keeps their summaries for the agent.

    Parameters
    ----------
    prefix
        Path prefix of the dumps (``/tmp/nccl_trace_rank_``): its directory is watched for files
        named by its last part followed by a rank. Default: the one the training processes
        would use (:func:`collectors.flight_recorder.dump_prefix_from_env` of this process's
        environment).
    node
        The node name written into each summary.
    poll_s
        Seconds between two listings of the directory.
    max_age_at_start_s
        Dumps already there at the first poll are taken when written at most this long before.
    max_per_poll, poll_budget_s
        Dumps read per poll, and time after which a poll reads no further one.
    max_pending
        Summaries kept until taken; beyond it the oldest are dropped (counted, logged).
    max_dump_bytes
        Larger files are not read (counted as ``too_large``).
    clock
        Unix seconds, used only for the first poll's age limit when :meth:`poll` is not given
        one (tests pass times explicitly).

    Attributes
    ----------
    problems
        Skipped files and dropped summaries by reason (``not_a_dump``, ``unreadable``,
        ``too_large``, ``dropped``).
    summaries_total
        Dumps summarised since start.
    polls_total, listings_total
        Calls of :meth:`poll`, and directory listings they made.
    """

    name = FR_SOURCE

    def __init__(
        self,
        prefix: str | None = None,
        *,
        node: str = "",
        poll_s: float = DEFAULT_POLL_S,
        max_age_at_start_s: float = MAX_AGE_AT_START_S,
        max_per_poll: int = MAX_PER_POLL,
        poll_budget_s: float = POLL_BUDGET_S,
        max_pending: int = MAX_PENDING,
        max_dump_bytes: int = MAX_DUMP_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if prefix is None:
            prefix = dump_prefix_from_env(os.environ)
        self.directory, self.file_prefix = split_prefix(prefix)
        self.prefix = prefix
        for what, value in (
            ("poll_s", poll_s),
            ("poll_budget_s", poll_budget_s),
        ):
            if not 0 < value < math.inf:
                raise ValidationError(f"{what} is {value!r}: expected a positive number of seconds")
        if not 0 <= max_age_at_start_s <= math.inf:
            raise ValidationError(
                f"max_age_at_start_s is {max_age_at_start_s!r}: expected seconds, 0 or more"
            )
        for what, count in (
            ("max_per_poll", max_per_poll),
            ("max_pending", max_pending),
            ("max_dump_bytes", max_dump_bytes),
        ):
            if count < 1:
                raise ValidationError(f"{what} is {count!r}: expected at least 1")
        self.node = node
        self.poll_s = float(poll_s)
        self.max_age_at_start_s = float(max_age_at_start_s)
        self.max_per_poll = max_per_poll
        self.poll_budget_s = float(poll_budget_s)
        self.max_pending = max_pending
        self.max_dump_bytes = max_dump_bytes
        self.problems = ProblemLog(FR_SOURCE)
        self.summaries_total = 0
        self.polls_total = 0
        self.listings_total = 0
        self._clock = clock
        self._files: dict[str, _File] = {}
        self._digests: dict[str, bytes] = {}  # file name -> digest of the bytes last taken
        self._pending: deque[_Pending] = deque()
        self._last_listing: float | None = None
        self._first_listing_ts: float | None = None
        self._missing_logged = False
        self._list_error_logged: set[str] = set()
        self._tracked_logged = False

    # -- the agent's side ------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Summaries waiting for a batch."""
        return len(self._pending)

    def take(
        self, max_count: int = MAX_SUMMARIES_PER_BATCH, max_bytes: int = MAX_BATCH_BYTES
    ) -> list[RankSummary]:
        """The oldest waiting summaries, at most ``max_count`` of them and ``max_bytes`` encoded
        (at least one when any waits and it fits ``max_bytes``); they are no longer kept."""
        out: list[RankSummary] = []
        used = 0
        pending = self._pending
        while pending and len(out) < max_count and used + pending[0].size <= max_bytes:
            item = pending.popleft()
            used += item.size
            out.append(item.summary)
        return out

    def give_back(self, summaries: Iterable[RankSummary]) -> None:
        """Put summaries taken by :meth:`take` back in front (their batch was not spooled)."""
        items = [_Pending(s, _encoded_size(s)) for s in summaries]
        self._pending.extendleft(reversed(items))
        self._bound_pending()

    def close(self) -> None:
        """Nothing to release; summaries still waiting are logged (they are lost)."""
        if self._pending:
            logger.warning(
                "%d flight-recorder summaries not sent: the agent stops before a batch took them",
                len(self._pending),
            )

    # -- watching ----------------------------------------------------------------------------

    def poll(self, now: float | None = None) -> int:
        """List the directory if ``poll_s`` passed since the last listing, summarise the dumps
        that stopped changing; returns how many were summarised."""
        self.polls_total += 1
        if now is None:
            now = self._clock()
        last = self._last_listing
        if last is not None and 0 <= now - last < self.poll_s:
            return 0
        self._last_listing = now
        listing = self._list()
        if listing is None:
            return 0
        self.listings_total += 1
        first = self._first_listing_ts is None
        if first:
            self._first_listing_ts = now
        ready = self._update(listing, now if first else None)
        return self._read(ready)

    def _list(self) -> dict[str, tuple[int, int]] | None:
        """``{file name: (size, mtime_ns)}`` of the dump-like files, or None (no directory)."""
        prefix = self.file_prefix
        out: dict[str, tuple[int, int]] = {}
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    name = entry.name
                    if not name.startswith(prefix) or rank_of(name, prefix) is None:
                        continue
                    try:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # gone since the listing
                    out[name] = (st.st_size, st.st_mtime_ns)
        except (FileNotFoundError, NotADirectoryError):
            if not self._missing_logged:
                self._missing_logged = True
                logger.info(
                    "no flight-recorder dump directory %s yet (dumps %s<rank> are watched for "
                    "every %g s)",
                    self.directory,
                    self.prefix[:200],
                    self.poll_s,
                )
            return None
        except OSError as exc:
            kind = type(exc).__name__
            if kind not in self._list_error_logged:
                self._list_error_logged.add(kind)
                logger.warning(
                    "cannot list the flight-recorder dump directory %s: %s (retried every %g s, "
                    "logged once)",
                    self.directory,
                    exc,
                    self.poll_s,
                )
            return None
        self._missing_logged = False
        return out

    def _update(self, listing: dict[str, tuple[int, int]], first_ts: float | None) -> list[str]:
        """Bring the file table up to date; return the settled files not yet read, oldest
        first."""
        files = self._files
        for gone in [name for name in files if name not in listing]:
            del files[gone]
        oldest_ns = (
            None
            if first_ts is None or math.isinf(self.max_age_at_start_s)
            else int((first_ts - self.max_age_at_start_s) * 1e9)
        )
        stale = 0
        for name, (size, mtime_ns) in listing.items():
            known = files.get(name)
            if known is None:
                if len(files) >= MAX_TRACKED:
                    if not self._tracked_logged:
                        self._tracked_logged = True
                        logger.warning(
                            "more than %d files %s<rank> in %s: the others are not looked at",
                            MAX_TRACKED,
                            self.file_prefix[:64],
                            self.directory,
                        )
                    continue
                old = oldest_ns is not None and mtime_ns < oldest_ns
                stale += old
                files[name] = _File(size, mtime_ns, done=old)
            elif (known.size, known.mtime_ns) != (size, mtime_ns):
                files[name] = _File(size, mtime_ns)  # written again (or still being written)
            elif not known.settled:
                known.settled = True
        if stale:
            logger.info(
                "%d flight-recorder dump(s) in %s older than %g s left alone (written before "
                "this agent started; a new dump is taken)",
                stale,
                self.directory,
                self.max_age_at_start_s,
            )
        ready = [n for n, f in files.items() if f.settled and not f.done]
        ready.sort(key=lambda n: (files[n].mtime_ns, n))
        return ready

    def _read(self, names: list[str]) -> int:
        started = time.perf_counter()
        made = 0
        for count, name in enumerate(names):
            if count >= self.max_per_poll or time.perf_counter() - started >= self.poll_budget_s:
                break
            if self._read_one(name):
                made += 1
        return made

    def _read_one(self, name: str) -> bool:
        """Summarise one settled file; True when a summary was kept."""
        state = self._files[name]
        state.done = True  # whatever happens below, this version is not read again
        if state.size > self.max_dump_bytes:
            self._skip(
                "too_large",
                name,
                f"{state.size} bytes: expected at most {self.max_dump_bytes}",
            )
            return False
        rank = rank_of(name, self.file_prefix)
        assert rank is not None  # listed only if it is one
        try:
            read = _read(self.directory / name, self.max_dump_bytes)
        except OSError as exc:
            self._skip("unreadable", name, f"{type(exc).__name__}: {exc.strerror or exc}")
            return False
        if read is None:
            self._skip("too_large", name, f"grew beyond {self.max_dump_bytes} bytes")
            return False
        data, st = read
        if (st.st_size, st.st_mtime_ns) != (state.size, state.mtime_ns):
            # Written again since it was listed: read at a later poll, once settled again.
            self._files[name] = _File(st.st_size, st.st_mtime_ns)
            return False
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if digest == self._digests.get(name):
            logger.debug("flight-recorder dump %s rewritten with the same bytes", name[:64])
            return False
        try:
            summary = summarize(
                parse_dump(data, name[:64]),
                rank,
                node=self.node,
                source=name,
                dumped_ts=st.st_mtime,
            )
        except ValidationError as exc:  # DumpError, or a summary out of bounds
            self._skip("not_a_dump", name, str(exc))
            return False
        size = _encoded_size(summary)
        if size > MAX_BATCH_BYTES:
            self._skip(
                "too_large",
                name,
                f"its summary is {size} bytes encoded: expected at most {MAX_BATCH_BYTES}",
            )
            return False
        if len(self._digests) >= MAX_TRACKED and name not in self._digests:
            self._digests.pop(next(iter(self._digests)))
        self._digests[name] = digest
        self._pending.append(_Pending(summary, size))
        self.summaries_total += 1
        self._bound_pending()
        logger.info(
            "flight-recorder dump %s summarised (rank %d, %d groups, %d entries)",
            name[:64],
            summary.rank,
            len(summary.groups),
            summary.entries_total,
        )
        return True

    def _skip(self, reason: str, name: str, detail: str) -> None:
        self.problems.counts[reason] += 1
        logger.warning(
            "flight-recorder file %s skipped (%s): %s",
            (self.directory / name[:64]),
            reason,
            detail[:300],
        )

    def _bound_pending(self) -> None:
        dropped = 0
        while len(self._pending) > self.max_pending:
            self._pending.popleft()
            dropped += 1
        if dropped:
            self.problems.counts["dropped"] += dropped
            total = self.problems.counts["dropped"]
            if total == dropped or math.log2(total).is_integer():
                logger.warning(
                    "%d flight-recorder summaries waiting for a batch: the oldest %d dropped "
                    "(%d so far)",
                    self.max_pending,
                    dropped,
                    total,
                )


def _read(path: Path, limit: int) -> tuple[bytes, os.stat_result] | None:
    """The bytes of a regular file (a link is not followed), with the size and modification
    time it had once read; None beyond ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = f.read(limit + 1)
        st = os.fstat(fd)
    if len(data) > limit:
        return None
    return data, st


def _encoded_size(summary: RankSummary) -> int:
    return len(json.dumps(summary.to_dict(), separators=(",", ":")))
