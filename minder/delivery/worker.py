"""Delivery workers: one thread per destination sends its outbox rows, with backoff and jitter.

Each destination has its own worker, so a receiver that is slow, hangs or is down delays only its
own rows. A worker claims due rows (:func:`minder.storage.outbox.claim_due`), hands each to its
:class:`Sender`, and marks it delivered, retried later (exponential backoff with full jitter,
``min(cap, base * 2**attempt)``), or expired (a permanent refusal, or past its time to live).
Rows live in the database, so a restart resumes where the last process stopped, and the next
attempt's time survives it too (this is why the backoff is computed here rather than by an
in-process retry loop such as tenacity's).

Claimed rows are leased to the worker for ``lease_s`` (15 s by default), and a heartbeat thread
renews the leases of the rows not finished yet every third of that while the batch is being
sent: a delivery slower than the lease is never sent by a second worker at the same time, and
the rows of a worker that crashed are claimed again at most ``lease_s`` after its last renewal.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from minder.core.errors import MinderError
from minder.storage import SessionFactory
from minder.storage.outbox import (
    DEFAULT_LEASE_S,
    Delivery,
    DeliveryStatus,
    backlog,
    claim_due,
    mark_delivered,
    mark_failed,
    release,
    renew_leases,
)

logger = logging.getLogger(__name__)

MAX_LOGGED_CHARS = 300
"""Longest untrusted text (a receiver's answer) put in a log line."""


class DeliveryError(MinderError):
    """A destination did not take a delivery.

    Parameters
    ----------
    message
        What failed (the destination's answer truncated).
    transient
        True when a later attempt may succeed (timeouts, connection errors, 5xx, 429); False for
        a permanent refusal (4xx): the row expires at once.
    status
        The HTTP status, when there was one.
    retry_after_s
        The destination's own ``Retry-After``, honoured as the earliest next attempt.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status
        self.retry_after_s = retry_after_s


class Deferred(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a sender that must not act yet (a hold): try again at ``until``, no attempt."""

    def __init__(self, until: float, why: str) -> None:
        super().__init__(why)
        self.until = until
        self.why = why


class Sender(Protocol):
    """Delivers one outbox row to one destination."""

    destination: str
    timeout_s: float
    """The longest one :meth:`send` may take (its lease is renewed meanwhile)."""

    def send(self, delivery: Delivery) -> None:
        """Deliver, or raise :class:`DeliveryError` / :class:`Deferred`."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt ``n`` waits ``U(0, min(cap, base*2**n))``,
    at least ``floor_s``."""

    base_s: float = 1.0
    cap_s: float = 60.0
    floor_s: float = 0.2

    def delay(self, attempts: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``attempts``-th failure (1 = the first)."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(attempts, 30))
        return max(self.floor_s, ceiling * rng())


class DeliveryMetrics:
    """Outbox metrics: deliveries by destination and outcome, the backlog per destination."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.deliveries = Counter(
            "minder_outbox_deliveries",
            "Outbox delivery attempts by destination and outcome (delivered, retry, expired, held)",
            ["destination", "outcome"],
            registry=registry,
        )
        self.pending = Gauge(
            "minder_outbox_pending",
            "Outbox rows not delivered yet, per destination",
            ["destination"],
            registry=registry,
        )
        self.oldest_pending = Gauge(
            "minder_outbox_oldest_pending_age_seconds",
            "Age of the oldest undelivered row, per destination (0 when none)",
            ["destination"],
            registry=registry,
        )
        self.expired = Gauge(
            "minder_outbox_expired",
            "Outbox rows given up (permanently refused or past their time to live)",
            ["destination"],
            registry=registry,
        )

    def init(self, destinations: Sequence[str]) -> None:
        """Export every destination from the start (at 0)."""
        for name in destinations:
            for outcome in ("delivered", "retry", "expired", "held"):
                self.deliveries.labels(name, outcome)
            self.pending.labels(name).set(0)
            self.oldest_pending.labels(name).set(0)
            self.expired.labels(name).set(0)


class DeliveryWorker:
    """Sends the outbox rows of one destination from a background thread."""

    def __init__(
        self,
        sender: Sender,
        sessions: SessionFactory,
        *,
        metrics: DeliveryMetrics | None = None,
        backoff: Backoff | None = None,
        batch: int = 50,
        lease_s: float = DEFAULT_LEASE_S,
        idle_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s is {lease_s!r}: expected seconds > 0")
        self.sender = sender
        self.destination = sender.destination
        self.sessions = sessions
        self.metrics = metrics
        self.backoff = backoff or Backoff()
        self.batch = batch
        self.lease_s = lease_s
        self.renew_every_s = lease_s / 3
        """How often the leases of a batch being sent are renewed (two renewals may fail before
        a lease runs out)."""
        self.idle_s = idle_s
        self.clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.owner = f"{self.destination}/{uuid.uuid4().hex[:12]}"
        """Who holds this worker's leases (the marks of a row whose lease ran out are ignored)."""

    def wake(self) -> None:
        """Look for due rows now instead of after the idle wait (new rows were written)."""
        self._wake.set()

    def run_once(self) -> int:
        """Claim and send the due rows once; returns how many were handled."""
        now = self.clock()
        with self.sessions.begin() as session:
            due = claim_due(
                session,
                self.destination,
                now=now,
                owner=self.owner,
                limit=self.batch,
                lease_s=self.lease_s,
            )
        if not due:
            return 0
        # Rows are sent one after another while a heartbeat renews their leases; a batch whose
        # leases could not be renewed stops (its lease may run out mid-send, and another worker
        # may then send the same row, or a later one of its alert, at the same time).
        with _LeaseHeartbeat(self, [d.id for d in due], expires_at=now + self.lease_s) as lease:
            for index, delivery in enumerate(due):
                if self._stop.is_set() or not lease.holding():
                    with self.sessions.begin() as session:
                        release(session, [d.id for d in due[index:]], owner=self.owner)
                    break
                self._send(delivery, lease)
        return len(due)

    def _send(self, delivery: Delivery, lease: _LeaseHeartbeat) -> None:
        outcome = "delivered"
        try:
            self.sender.send(delivery)
        except Deferred as deferred:
            outcome = "held"
            self._fail(delivery, lease, deferred.why, deferred.until, count_attempt=False)
        except DeliveryError as exc:
            retry_at = None
            if exc.transient:
                retry_at = self.clock() + max(
                    self.backoff.delay(delivery.attempts + 1), exc.retry_after_s or 0.0
                )
            status = self._fail(delivery, lease, str(exc), retry_at)
            outcome = "retry" if status is DeliveryStatus.PENDING else "expired"
            log = logger.info if outcome == "retry" else logger.error
            log(
                "%s: delivery %s (%s, alert %s) attempt %d failed: %s%s",
                self.destination,
                delivery.delivery_id,
                delivery.event,
                delivery.alert_id,
                delivery.attempts + 1,
                str(exc)[:MAX_LOGGED_CHARS],
                "; retried later" if outcome == "retry" else "; given up",
            )
        except Exception as exc:
            # A bug in a sender must not lose the row: retried like a transient failure.
            logger.exception("%s: sender raised on delivery %s", self.destination,
                             delivery.delivery_id)  # fmt: skip
            retry_at = self.clock() + self.backoff.delay(delivery.attempts + 1)
            status = self._fail(delivery, lease, f"internal error: {exc!r}", retry_at)
            outcome = "retry" if status is DeliveryStatus.PENDING else "expired"
        else:
            with lease.finishing(delivery.id), self.sessions.begin() as session:
                if not mark_delivered(session, delivery.id, now=self.clock(), owner=self.owner):
                    logger.warning("%s: delivery %s was sent after its lease ran out",
                                   self.destination, delivery.delivery_id)  # fmt: skip
        if self.metrics is not None:
            self.metrics.deliveries.labels(self.destination, outcome).inc()

    def _fail(
        self,
        delivery: Delivery,
        lease: _LeaseHeartbeat,
        error: str,
        retry_at: float | None,
        *,
        count_attempt: bool = True,
    ) -> DeliveryStatus:
        with lease.finishing(delivery.id), self.sessions.begin() as session:
            return mark_failed(
                session,
                delivery.id,
                error=error,
                retry_at=retry_at,
                now=self.clock(),
                count_attempt=count_attempt,
                owner=self.owner,
            )

    def _run(self) -> None:
        logger.info("delivery worker for %s started", self.destination)
        while not self._stop.is_set():
            try:
                handled = self.run_once()
            except Exception as exc:
                # The database may be down: its rows wait there, and so does this worker.
                logger.warning("%s: cannot read the outbox (%s); retrying", self.destination,
                               str(exc).splitlines()[0][:MAX_LOGGED_CHARS])  # fmt: skip
                handled = 0
                self._stop.wait(2.0)
            if handled == 0:
                self._wake.wait(self.idle_s)
                self._wake.clear()
        logger.info("delivery worker for %s stopped", self.destination)

    def start(self) -> None:
        """Run until :meth:`stop`."""
        self._thread = threading.Thread(
            target=self._run, name=f"minder-deliver-{self.destination}", daemon=True
        )
        self._thread.start()

    def signal_stop(self) -> None:
        """Ask the worker to stop after the row it is sending (:meth:`stop` waits for it)."""
        self._stop.set()
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the row being sent; close the sender."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.sender.close()


class _LeaseHeartbeat:
    """Renews a worker's leases of the rows of one batch, from a thread, until the batch ends.

    A row leaves the renewal when the worker marks it (:meth:`finishing`, under the same lock as
    a renewal, so a renewal never counts a just-marked row as lost).
    """

    def __init__(
        self, worker: DeliveryWorker, row_ids: Iterable[int], *, expires_at: float
    ) -> None:
        self._worker = worker
        self._held = set(row_ids)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._renewed = True
        self._lost = False
        self.expires_at = expires_at
        """When the leases run out unless renewed again (the worker's clock)."""
        self._thread = threading.Thread(
            target=self._run, name=f"minder-lease-{worker.destination}", daemon=True
        )

    def __enter__(self) -> _LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def holding(self) -> bool:
        """True while the leases are known to be held: the last renewal worked, kept every row,
        and the lease has not run out."""
        return self._renewed and not self._lost and self._worker.clock() < self.expires_at

    @contextmanager
    def finishing(self, row_id: int) -> Iterator[None]:
        """Mark ``row_id`` (delivered, failed) inside this block: it is renewed no more."""
        with self._lock:
            try:
                yield
            finally:
                self._held.discard(row_id)

    def _run(self) -> None:
        worker = self._worker
        while not self._done.wait(worker.renew_every_s):
            with self._lock:
                held = sorted(self._held)
                if not held:
                    return
                until = worker.clock() + worker.lease_s
                try:
                    with worker.sessions.begin() as session:
                        kept = renew_leases(session, held, owner=worker.owner, until=until)
                except Exception as exc:
                    self._renewed = False
                    logger.warning("%s: cannot renew the leases of %d row(s) being delivered "
                                   "(%s); the batch stops", worker.destination, len(held),
                                   (str(exc).splitlines() or [type(exc).__name__])[0]
                                   [:MAX_LOGGED_CHARS])  # fmt: skip
                    continue
            if kept < len(held):
                self._lost = True
                logger.warning("%s: %d of %d row(s) being delivered were claimed by another "
                               "worker after their lease ran out", worker.destination,
                               len(held) - kept, len(held))  # fmt: skip
            self._renewed = True
            self.expires_at = until


class Periodic:
    """Calls ``fn`` every ``interval_s`` from a daemon thread; an exception is logged, not fatal."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        fn: Callable[[], None],
        *,
        failure_level: int = logging.WARNING,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.fn = fn
        self.failure_level = failure_level
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.fn()
            except Exception as exc:
                message = (str(exc).splitlines() or [type(exc).__name__])[0][:MAX_LOGGED_CHARS]
                logger.log(self.failure_level, "%s failed: %s", self.name, message)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"minder-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class DeliveryHub:
    """The workers of every destination, plus the backlog gauges."""

    def __init__(
        self,
        workers: Sequence[DeliveryWorker],
        sessions: SessionFactory,
        metrics: DeliveryMetrics | None = None,
        *,
        gauge_every_s: float = 5.0,
        gauges: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.workers = list(workers)
        self.gauges = list(gauges)
        self.sessions = sessions
        self.metrics = metrics
        self.gauge_every_s = gauge_every_s
        # a database outage is reported by the workers already: the gauges only log at DEBUG
        self._gauge_thread = Periodic(
            "outbox-gauges", gauge_every_s, self.refresh_gauges, failure_level=logging.DEBUG
        )
        if metrics is not None:
            metrics.init([w.destination for w in self.workers])

    def wake(self) -> None:
        """New rows were written: every worker looks now."""
        for worker in self.workers:
            worker.wake()

    def refresh_gauges(self) -> None:
        """Pending, oldest pending age and expired rows per destination, from the database, and
        the other gauges registered with the hub."""
        for refresh in self.gauges:
            refresh()
        if self.metrics is None:
            return
        names = [w.destination for w in self.workers]
        with self.sessions() as session:
            found = backlog(session, names)
        now = time.time()
        for name in names:
            state = found[name]
            self.metrics.pending.labels(name).set(state.pending)
            oldest = state.oldest_pending_created_at
            self.metrics.oldest_pending.labels(name).set(0 if oldest is None else now - oldest)
            self.metrics.expired.labels(name).set(state.expired)

    def start(self) -> None:
        """Start every worker and the gauge thread."""
        for worker in self.workers:
            worker.start()
        self._gauge_thread.start()

    def stop(self) -> None:
        """Stop every worker (each finishes the row it is sending), all at once."""
        self._gauge_thread.stop()
        for worker in self.workers:
            worker.signal_stop()
        for worker in self.workers:
            worker.stop()
