"""Fair admission of new jobs once a detection worker holds ``max_jobs`` of them.

A worker keeps at most ``ServiceLimits.max_jobs`` job windows. Before, the first jobs to arrive
kept their places until they fell silent for ``idle_job_s``: a producer that sent batches for
thousands of made-up job ids, and kept re-sending them, locked every later job out. Now a job
that arrives at the bound may take the place of one that is worth less (docs/operations.md,
*Limits against hostile or broken producers*):

- **rank** 2: the scheduler confirms the job (a Slurm job of that id runs, a pod carrying the
  job's label runs): :class:`JobConfirmations` asks it in a thread of its own, never in the
  poll loop, and keeps the answers for a while;
- rank 1: several machines report for the job (with signed batches, each machine is a node key:
  a producer holding one key speaks for one machine only);
- rank 0: one machine reports for it.

A newcomer takes the place of a job of a lower rank, or of a *one-shot* job (at most
:data:`ONE_SHOT_BATCHES` batches from one machine and none for :data:`ONE_SHOT_IDLE_S`), which
any newcomer may take. Victims go in order: one-shot jobs, then the lowest rank, the longest
idle first. Below the bound every new job is admitted at once (the live jobs are still looked
up, so that their answers are known when the bound is reached).

The module also holds what the service remembers of refused jobs (:class:`RefusedJobs`, for
``minder_refused_jobs_total`` and the candidates' machines) and the rate-limited log lines that
name refused and evicted jobs (:class:`LogDigest`).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "CONFIRMED",
    "ONE_SHOT_BATCHES",
    "ONE_SHOT_IDLE_S",
    "SEVERAL_MACHINES",
    "SINGLE_MACHINE",
    "Confirmation",
    "Digest",
    "JobConfirmations",
    "JobConfirmer",
    "LogDigest",
    "RefusedJob",
    "RefusedJobs",
    "job_key",
    "rank_of",
]

logger = logging.getLogger(__name__)

SINGLE_MACHINE = 0
SEVERAL_MACHINES = 1
CONFIRMED = 2
"""Ranks of a job for admission at the bound (:func:`rank_of`)."""
ONE_SHOT_BATCHES = 3
"""A job of one machine with at most this many batches, silent for :data:`ONE_SHOT_IDLE_S`,
is a one-shot job: any newcomer may take its place."""
ONE_SHOT_IDLE_S = 60.0
MAX_NODES_KEPT = 16
"""Distinct nodes remembered per refused job (two make it rank 1; the rest is for the logs)."""
MAX_PRIORITY = 64
"""Lookup priorities (machines reporting) are capped here: more machines do not go first."""
KEY_CHARS = 256
"""Job ids longer than this are remembered by a prefix and a digest (a 64 KiB id is not kept)."""


def rank_of(confirmed: bool, machines: int) -> int:
    """The admission rank of a job: :data:`CONFIRMED` by the scheduler, else
    :data:`SEVERAL_MACHINES` when at least two machines report, else :data:`SINGLE_MACHINE`."""
    if confirmed:
        return CONFIRMED
    return SEVERAL_MACHINES if machines >= 2 else SINGLE_MACHINE


def job_key(job: str) -> str:
    """``job`` as kept in memory and logs: itself up to :data:`KEY_CHARS` characters, else its
    first 64 characters, its length and a digest (distinct long ids stay distinct)."""
    if len(job) <= KEY_CHARS:
        return job
    digest = hashlib.blake2b(job.encode("utf-8", "replace"), digest_size=6).hexdigest()
    return f"{job[:64]}...({len(job)} chars, {digest})"


# -- the scheduler's confirmation ---------------------------------------------------------------


class JobConfirmer(Protocol):
    """Who says whether a job runs: the scheduler (``minder.actions.base.SchedulerView``; the
    Slurm and Kubernetes targets are one)."""

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        """The scheduler's nodes of job ``job_id`` now; None when it knows no such running job.

        May be slow (a subprocess, an HTTP call) and raise when the scheduler cannot be asked.
        """
        ...


class Confirmation(enum.Enum):
    """The scheduler's last answer about a job."""

    UNKNOWN = "unknown"
    """Not asked yet, or every ask failed."""
    CONFIRMED = "confirmed"
    NOT_FOUND = "not_found"


@dataclass(slots=True)
class _Answer:
    state: Confirmation
    refresh_at: float
    """Monotonic time after which the job is asked again; the answer holds until a new one."""


class JobConfirmations:
    """The scheduler's answers about jobs, cached, and the lookups they need, made in a thread
    of their own: :meth:`state` never waits.

    A job asked for (:meth:`state` with a ``priority``) with no answer, or one due for a
    refresh, is queued; the thread looks up the queued job of the highest priority (machines
    reporting), the oldest first among equals, at most ``lookups_per_s`` a second. An answer
    holds until the next one: a confirmation for ``confirmed_ttl_s`` before it is refreshed, a
    "no such job" for ``not_found_ttl_s``; when the scheduler cannot be asked, the job keeps
    what it had and is asked again after ``error_retry_s``. The queue holds ``max_pending`` jobs
    (a full queue drops the oldest of its lowest priority for a higher one, or else the new
    one), the cache ``max_answers`` (the least recently answered go first).

    ``on_outcome`` is called with ``confirmed``, ``not_found``, ``error`` (each lookup) or
    ``dropped`` (a lookup the full queue dropped).
    """

    def __init__(
        self,
        confirmer: JobConfirmer,
        *,
        confirmed_ttl_s: float = 600.0,
        not_found_ttl_s: float = 120.0,
        error_retry_s: float = 30.0,
        lookups_per_s: float = 20.0,
        max_pending: int = 4_096,
        max_answers: int = 50_000,
        clock: Callable[[], float] = time.monotonic,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        for name, value in (
            ("confirmed_ttl_s", confirmed_ttl_s),
            ("not_found_ttl_s", not_found_ttl_s),
            ("error_retry_s", error_retry_s),
            ("lookups_per_s", lookups_per_s),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name}={value!r}: expected a finite number > 0")
        for name, count in (("max_pending", max_pending), ("max_answers", max_answers)):
            if count < 1:
                raise ValueError(f"{name}={count!r}: expected an integer >= 1")
        self.confirmer = confirmer
        self.confirmed_ttl_s = confirmed_ttl_s
        self.not_found_ttl_s = not_found_ttl_s
        self.error_retry_s = error_retry_s
        self.lookups_per_s = lookups_per_s
        self.max_pending = max_pending
        self.max_answers = max_answers
        self.clock = clock
        self.on_outcome = on_outcome
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._answers: OrderedDict[str, _Answer] = OrderedDict()
        self._pending: dict[str, int] = {}
        self._buckets: dict[int, OrderedDict[str, None]] = {}
        self._in_flight: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors_logged_at = -math.inf
        self._errors_since = 0

    # -- the poll loop's side (never waits for the scheduler) --------------------------------

    def state(self, job: str, priority: int | None = None) -> Confirmation:
        """The scheduler's last answer about ``job`` (``UNKNOWN`` when none yet). With a
        ``priority`` (machines reporting for it), a lookup is queued when there is no answer or
        the answer is due for a refresh."""
        with self._lock:
            answer = self._answers.get(job)
            if priority is not None and (answer is None or self.clock() >= answer.refresh_at):
                self._queue(job, priority)
            return Confirmation.UNKNOWN if answer is None else answer.state

    def states(self, jobs: list[str]) -> list[Confirmation]:
        """:meth:`state` of each of ``jobs`` (nothing queued), under one lock."""
        with self._lock:
            return [
                Confirmation.UNKNOWN if (a := self._answers.get(job)) is None else a.state
                for job in jobs
            ]

    def refresh(self, priorities: dict[str, int]) -> None:
        """Queue the jobs of ``priorities`` (job -> machines) that have no answer or are due."""
        with self._lock:
            now = self.clock()
            for job, priority in priorities.items():
                answer = self._answers.get(job)
                if answer is None or now >= answer.refresh_at:
                    self._queue(job, priority)

    @property
    def pending(self) -> int:
        """Jobs queued for a lookup."""
        with self._lock:
            return len(self._pending)

    def _queue(self, job: str, priority: int) -> None:
        """Queue ``job`` (lock held); an already queued job only moves up."""
        if job == self._in_flight:
            return
        priority = max(0, min(int(priority), MAX_PRIORITY))
        queued = self._pending.get(job)
        if queued is not None:
            if priority > queued:
                self._unbucket(job, queued)
                self._bucket(job, priority)
            return
        if len(self._pending) >= self.max_pending:
            lowest = min(self._buckets)
            if priority <= lowest:
                self._outcome("dropped")
                return
            dropped, _ = self._buckets[lowest].popitem(last=False)
            if not self._buckets[lowest]:
                del self._buckets[lowest]
            del self._pending[dropped]
            self._outcome("dropped")
        self._bucket(job, priority)
        self._wake.notify()

    def _bucket(self, job: str, priority: int) -> None:
        self._pending[job] = priority
        self._buckets.setdefault(priority, OrderedDict())[job] = None

    def _unbucket(self, job: str, priority: int) -> None:
        bucket = self._buckets[priority]
        del bucket[job]
        if not bucket:
            del self._buckets[priority]
        del self._pending[job]

    # -- the lookup thread's side ----------------------------------------------------------

    def lookup_once(self) -> bool:
        """Look the queued job of the highest priority up (waits for the scheduler); False
        when none was queued. The thread calls it; tests call it directly."""
        with self._lock:
            if not self._pending:
                return False
            job, _ = self._buckets[max(self._buckets)].popitem(last=False)
            priority = self._pending.pop(job)
            if not self._buckets[priority]:
                del self._buckets[priority]
            self._in_flight = job
        state: Confirmation | None
        try:
            nodes = self.confirmer.job_nodes(job)
        except Exception as exc:  # the scheduler unreachable (ActionError), or a bad answer
            state = None
            self._log_error(job, exc)
        else:
            state = Confirmation.CONFIRMED if nodes else Confirmation.NOT_FOUND
        with self._lock:
            self._in_flight = None
            now = self.clock()
            answer = self._answers.get(job)
            if state is None:
                if answer is None:
                    answer = _Answer(Confirmation.UNKNOWN, now)
                    self._answers[job] = answer
                answer.refresh_at = now + self.error_retry_s
            else:
                ttl = (
                    self.confirmed_ttl_s
                    if state is Confirmation.CONFIRMED
                    else self.not_found_ttl_s
                )
                self._answers[job] = _Answer(state, now + ttl)
                self._answers.move_to_end(job)
            while len(self._answers) > self.max_answers:
                self._answers.popitem(last=False)
        self._outcome("error" if state is None else state.value)
        return True

    def _log_error(self, job: str, exc: Exception) -> None:
        """One line a minute at most: the scheduler could not say whether a job runs."""
        self._errors_since += 1
        now = time.monotonic()
        if now - self._errors_logged_at < 60.0:
            return
        logger.warning(
            "admission: the scheduler could not say whether job %r runs (%s: %s); %d lookup(s) "
            "failed since the last such line; unconfirmed jobs are ranked by their machines",
            job_key(job)[:64],
            type(exc).__name__,
            " ".join(str(exc).split())[:300],
            self._errors_since,
        )
        self._errors_logged_at = now
        self._errors_since = 0

    def _outcome(self, outcome: str) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def start(self) -> None:
        """Start the lookup thread (once)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="minder-admission", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the lookup thread; a lookup in progress is not waited for beyond ``timeout_s``."""
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        interval = 1.0 / self.lookups_per_s
        while not self._stop.is_set():
            with self._lock:
                while not self._pending and not self._stop.is_set():
                    self._wake.wait(1.0)
            if self._stop.is_set():
                return
            started = time.monotonic()
            self.lookup_once()
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))


# -- what is remembered of refused jobs ------------------------------------------------------


@dataclass(slots=True)
class RefusedJob:
    """A job whose batches were refused, as remembered (:class:`RefusedJobs`)."""

    job: str
    """The job id as kept (:func:`job_key`)."""
    reason: str
    first_wall: float
    last_wall: float
    nodes: set[str] = field(default_factory=set)
    """Distinct nodes that sent its refused batches (up to :data:`MAX_NODES_KEPT`)."""
    batches: int = 0
    counted: bool = False
    """Counted in ``minder_refused_jobs_total``."""


class RefusedJobs:
    """Jobs refused recently, by ``(reason, job)``: at most ``max_kept``, each forgotten after
    ``memory_s`` without a refused batch (the least recently refused go first when full)."""

    def __init__(self, *, max_kept: int = 20_000, memory_s: float = 900.0) -> None:
        if max_kept < 1:
            raise ValueError(f"max_kept={max_kept!r}: expected an integer >= 1")
        if not memory_s > 0:
            raise ValueError(f"memory_s={memory_s!r}: expected seconds > 0")
        self.max_kept = max_kept
        self.memory_s = memory_s
        self._kept: OrderedDict[tuple[str, str], RefusedJob] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def note(self, reason: str, job: str, node: str, now: float) -> RefusedJob:
        """Remember a batch of ``job`` from ``node`` (not yet refused: the caller decides) and
        return what is known of the job."""
        key = (reason, job_key(job))
        entry = self._kept.get(key)
        if entry is None or now - entry.last_wall > self.memory_s:
            entry = RefusedJob(key[1], reason, now, now)
            self._kept[key] = entry
            while len(self._kept) > self.max_kept:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        entry.last_wall = now
        entry.batches += 1
        if len(entry.nodes) < MAX_NODES_KEPT:
            entry.nodes.add(node[:KEY_CHARS])
        return entry

    def forget(self, reason: str, job: str) -> None:
        """Forget ``job`` (admitted after all)."""
        self._kept.pop((reason, job_key(job)), None)


# -- rate-limited log lines ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Digest:
    """What happened since the last line: ``events``, of ``subjects`` distinct ones (at least,
    when ``capped``), and the weightiest subjects with their details."""

    events: int
    subjects: int
    capped: bool
    named: tuple[tuple[str, str], ...]
    span_s: float

    def names(self) -> str:
        """``'a' (detail), 'b' (detail) and N more`` (each name cut to 64 characters)."""
        shown = ", ".join(f"{name[:64]!r} ({detail})" for name, detail in self.named)
        more = self.subjects - len(self.named)
        if more > 0:
            shown += f" and {'at least ' if self.capped else ''}{more} more"
        return shown


class LogDigest:
    """At most one log line every ``every_s`` seconds about one kind of event: the first event
    is said at once; the ones after it are counted and said together when ``every_s`` has
    passed (at the next event, or at :meth:`due`), naming the ``names`` subjects of the highest
    weight (the first come among equals)."""

    def __init__(self, every_s: float = 10.0, names: int = 5, max_distinct: int = 10_000) -> None:
        if not every_s >= 0:
            raise ValueError(f"every_s={every_s!r}: expected seconds >= 0")
        self.every_s = every_s
        self.max_names = names
        self.max_distinct = max_distinct
        self._said_at = -math.inf
        self._since = math.nan
        self._events = 0
        self._subjects: set[str] = set()
        self._capped = False
        self._named: dict[str, tuple[float, str]] = {}

    def add(self, subject: str, weight: float, detail: str, now: float) -> Digest | None:
        """Count one event about ``subject``; the digest to say now, if one is due."""
        if self._events == 0:
            self._since = now
        self._events += 1
        if subject not in self._subjects:
            if len(self._subjects) < self.max_distinct:
                self._subjects.add(subject)
            else:
                self._capped = True
        named = self._named.get(subject)
        if named is not None:
            self._named[subject] = (max(weight, named[0]), detail)
        elif len(self._named) < self.max_names:
            self._named[subject] = (weight, detail)
        else:
            lightest = min(self._named, key=lambda name: self._named[name][0])
            if weight > self._named[lightest][0]:
                del self._named[lightest]
                self._named[subject] = (weight, detail)
        return self.due(now)

    def due(self, now: float) -> Digest | None:
        """The digest of the events not said yet, when ``every_s`` has passed since the last."""
        if self._events == 0 or now - self._said_at < self.every_s:
            return None
        ordered = sorted(self._named.items(), key=lambda item: -item[1][0])
        digest = Digest(
            self._events,
            len(self._subjects),
            self._capped,
            tuple((name, detail) for name, (_, detail) in ordered),
            max(0.0, now - self._since),
        )
        self._said_at = now
        self._events = 0
        self._subjects = set()
        self._capped = False
        self._named = {}
        return digest
