"""The node agent's run loop: collect every interval, spool, and deliver to Kafka in order.

Two threads share a :class:`~minder.stream.spool.Spool`:

- the *collector* calls :meth:`collectors.agent.Agent.collect_once` on a fixed cadence
  (``interval_s``, scheduled against the monotonic clock, so a slow interval does not shift the
  next ones), encodes the batch (a :class:`~minder.core.encode.BatchEncoder`: schema 2 by
  default, the node's layout inlined in its first batch, at each change and every few batches)
  and appends it to the spool. It never waits for the network, so the cadence holds while Kafka
  is down;
- the *sender* takes the oldest spooled records, sends them through a record sender
  (:class:`~minder.stream.agent_sender.KafkaRecordSender`), and removes from the spool only those
  the broker acknowledged. On failure it retries with exponential backoff; meanwhile the spool
  fills up to its bound and then drops its oldest records (counted). When the broker is back the
  backlog goes out oldest first.

Delivery is at least once and in order per node: a record is removed only after its
acknowledgement (a lost acknowledgement, or a crash between delivery and removal, sends it again,
right after its first copy). Each spooled record carries its Kafka key (the batch's job), so
batches spooled under one job are still delivered under that job after the agent restarts with
another.

Stopping (:meth:`AgentRunner.stop`, SIGINT or SIGTERM in :meth:`AgentRunner.run`) ends the
collection, spools a *goodbye* (:meth:`collectors.agent.Agent.goodbye`: a batch with no samples
and one :attr:`~minder.core.records.EventKind.LEAVE` event, ``"agent stopped: SIGTERM"``) right
after the last data batch, makes a last attempt to deliver the spool (``final_flush_s``), and
leaves what is left on disk for the next start: a goodbye that could not be delivered (broker
unreachable) goes out at the next start like any spooled batch. A crash (SIGKILL, power loss)
sends no goodbye: the service then sees the node fall silent.

The goodbye tells the detection service that the node leaves its job on purpose, so the service
drops it from the job instead of reporting it silent; the node is back as soon as it reports
again. The agent cannot tell a stop for good (the job ends, the node is drained) from a restart
in place (``systemctl restart``, a DaemonSet rollout): both arrive as SIGTERM. The goodbye is
therefore sent on every clean stop, and a restart costs the node only a drop and a re-join a few
seconds later (the service re-learns it as it does any joining node), never an alert. An agent
that is restarted often and never leaves its job on purpose can be run with ``goodbye=False``
(``minder agent --no-goodbye``): then its stops, a job's end included, look like silence.

The sender never dies: an unexpected error in one pass (the spool's disk full or failing, a bug)
is logged once per exception type, counted in ``send_errors`` and retried with backoff. A spooled
record that cannot be unframed (damaged, or written by something else) would block everything
behind it forever, so it is dropped, counted (``corrupt_dropped``) and logged once.

Flight-recorder summaries (:mod:`collectors.fr_watch`) ride in the data batches like any field,
so they share the spool's ordering and at-least-once delivery; a batch that cannot be spooled
hands its summaries back to the agent for the next one, and the goodbye carries those still
waiting at a clean stop.
"""

from __future__ import annotations

import logging
import math
import signal
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from collectors.agent import Agent, SenderCounters
from minder.core.encode import BatchEncoder
from minder.core.errors import DecodeError, ValidationError
from minder.core.records import NodeBatch
from minder.core.wire import AGENT_FORMAT, WireFormat
from minder.stream.spool import Spool, SpoolRecord

if TYPE_CHECKING:
    from minder.stream.agent_sender import SendResult

logger = logging.getLogger(__name__)

_KEY_LENGTH = struct.Struct("<H")
_ENVELOPE_FIRST_BYTES = frozenset({0x7B, *range(0x80, 0x90), 0xDE, 0xDF})
"""How an encoded batch envelope starts: ``{`` (JSON) or a msgpack map (fixmap, map16, map32)."""


class RecordSender(Protocol):
    """What the runner sends through (:class:`~minder.stream.agent_sender.KafkaRecordSender`)."""

    def send(
        self, records: Sequence[tuple[str, bytes]], *, timeout_s: float | None = None
    ) -> SendResult:
        """Send ``(key, value)`` records in order; report the acknowledged prefix."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


@dataclass(slots=True)
class RunnerStats:
    """Counters of one :class:`AgentRunner` (since it was created).

    Attributes
    ----------
    collections
        Batches collected and spooled.
    batches_sent
        Batches the broker acknowledged.
    rejected
        Batches the broker refused for good (dropped; logged).
    send_errors
        Failed delivery attempts (connection, timeout, broker error, an error of the spool or
        of the sender loop itself); each is retried.
    missed_ticks
        Intervals skipped because a collection overran its interval.
    spool_errors
        Batches that could not be written to the spool (disk full, batch larger than the spool).
    corrupt_dropped
        Spooled records dropped because they could not be unframed (damaged or foreign).
    goodbyes
        Goodbye batches (a ``leave`` event, at a clean stop) written to the spool.
    last_error
        The latest delivery error.
    """

    collections: int = 0
    batches_sent: int = 0
    rejected: int = 0
    send_errors: int = 0
    missed_ticks: int = 0
    spool_errors: int = 0
    corrupt_dropped: int = 0
    goodbyes: int = 0
    last_error: str = ""


def frame(key: str, value: bytes) -> bytes:
    """A spool record: the Kafka key (length-prefixed UTF-8), then the encoded batch."""
    raw = key.encode()
    if len(raw) > 0xFFFF:
        raise ValidationError(f"Kafka key of {len(raw)} bytes: expected at most 65535")
    return _KEY_LENGTH.pack(len(raw)) + raw + value


def unframe(record: bytes) -> tuple[str, bytes]:
    """Split a spool record made by :func:`frame` into ``(key, value)``.

    Raises
    ------
    DecodeError
        ``record`` is not a frame around an encoded batch (too short, a key length beyond its
        end, a key that is not UTF-8, or a value that does not start like a batch envelope).
    """
    start = _KEY_LENGTH.size
    if len(record) < start:
        raise DecodeError(f"spool record of {len(record)} bytes: expected at least {start}")
    (length,) = _KEY_LENGTH.unpack_from(record)
    end = start + length
    if end >= len(record):
        raise DecodeError(
            f"spool record of {len(record)} bytes has a key of {length} bytes: expected a key "
            "followed by an encoded batch"
        )
    try:
        key = record[start:end].decode()
    except UnicodeDecodeError as exc:
        raise DecodeError(f"spool record key is not UTF-8: {exc}") from None
    if record[end] not in _ENVELOPE_FIRST_BYTES:
        raise DecodeError(
            f"spool record value starts with 0x{record[end]:02x}: expected a JSON or msgpack "
            "batch envelope"
        )
    return key, record[end:]


class AgentRunner:
    """Runs an :class:`~collectors.agent.Agent` and delivers its batches through a spool.

    Parameters
    ----------
    agent
        Collects the batches.
    spool
        Where batches wait for the broker's acknowledgement.
    sender_factory
        Builds the record sender (called again after a sender raised); ``None`` only spools,
        e.g. for a benchmark.
    interval_s
        Collection interval; default the agent's.
    fmt
        Wire encoding of the batches: ``packed`` (schema 2, the default) or, for detection
        services older than schema 2, ``msgpack`` (schema 1; ``json`` too).
    max_run_records, max_run_bytes
        Largest run of spooled records sent (and acknowledged) at once while catching up.
    backoff_initial_s, backoff_max_s
        Delay before retrying after a failed delivery, doubled at each failure up to the max.
    final_flush_s
        How long :meth:`stop` keeps trying to deliver the spool.
    goodbye
        Spool a goodbye batch (a ``leave`` event) after the last collection of a clean stop,
        before the final flush (see the module's docstring).
    send_timeout_s
        Longest wait for one run's acknowledgements (``None``: the sender's default).
    on_batch
        Called in the collector thread with each collected batch after it was spooled (tests,
        benches); not with the goodbye.
    clock
        Unix time for the batches' ``ts``.
    """

    def __init__(
        self,
        agent: Agent,
        spool: Spool,
        sender_factory: Callable[[], RecordSender] | None,
        *,
        interval_s: float | None = None,
        fmt: WireFormat = AGENT_FORMAT,
        max_run_records: int = 64,
        max_run_bytes: int = 512 * 1024,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        final_flush_s: float = 5.0,
        goodbye: bool = True,
        send_timeout_s: float | None = None,
        on_batch: Callable[[NodeBatch], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        interval = agent.interval_s if interval_s is None else interval_s
        if not interval > 0:
            raise ValidationError(f"interval_s is {interval!r}: expected a positive number")
        if max_run_records < 1 or max_run_bytes < 1:
            raise ValidationError(
                f"max_run_records={max_run_records!r}, max_run_bytes={max_run_bytes!r}: "
                "expected >= 1"
            )
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValidationError(
                f"backoff is {backoff_initial_s!r}..{backoff_max_s!r} s: expected "
                "0 < initial <= max"
            )
        self.agent = agent
        self.spool = spool
        self.interval_s = float(interval)
        self.fmt = WireFormat(fmt)
        self.encoder = BatchEncoder(self.fmt)
        self.stats = RunnerStats()
        self._factory = sender_factory
        self._sender: RecordSender | None = None
        self._max_run_records = max_run_records
        self._max_run_bytes = max_run_bytes
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._final_flush_s = final_flush_s
        self._goodbye = goodbye
        self._stop_reason: str | None = None
        self._send_timeout_s = send_timeout_s
        self._on_batch = on_batch
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._collector_done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failing_since: float | None = None
        self._failures_in_row = 0
        self._lock = threading.Lock()
        self._logged_errors: set[str] = set()

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the collector and sender threads (returns at once)."""
        if self._threads:
            raise RuntimeError("the agent runner was already started")
        self._threads = [
            threading.Thread(target=self._collect_loop, name="minder-agent-collect", daemon=True),
            threading.Thread(target=self._send_loop, name="minder-agent-send", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        logger.info(
            "agent %s/%s collecting every %g s from %s",
            self.agent.job,
            self.agent.node,
            self.interval_s,
            ", ".join(s.name for s in self.agent.sources) or "no source",
        )

    def stop(self, timeout_s: float | None = None, *, reason: str = "stop requested") -> None:
        """Stop collecting, spool the goodbye, try to deliver the spool for up to
        ``final_flush_s``, and join.

        ``reason`` goes into the goodbye's message (``"agent stopped: <reason>"``) unless a
        signal already stopped the runner (then its name does). What is not delivered stays in
        the spool for the next start.
        """
        self._request_stop(reason)
        limit = self._final_flush_s + 30.0 if timeout_s is None else timeout_s
        for thread in self._threads:
            thread.join(timeout=limit)
            if thread.is_alive():
                logger.error("agent thread %s did not stop within %g s", thread.name, limit)

    def _request_stop(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason  # read by the collector thread once it sees the stop
        self._stop.set()
        self._wake.set()

    @property
    def running(self) -> bool:
        """Whether the threads are alive and no stop was asked."""
        return bool(self._threads) and not self._stop.is_set()

    def run(self, *, handle_signals: bool = True) -> None:
        """Start, block until SIGINT/SIGTERM (or :meth:`stop` from another thread), then stop."""
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():

            def on_signal(signum: int, _frame: FrameType | None) -> None:
                name = signal.Signals(signum).name
                logger.info("signal %s: stopping the agent", name)
                self._request_stop(name)

            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, on_signal)
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def sender_counters(self) -> SenderCounters:
        """The sender's counters, for :meth:`collectors.agent.AgentExporter.set_sender`."""
        return SenderCounters(
            batches_sent=self.stats.batches_sent,
            spooled=self.spool.appended_total,
            dropped_oldest=self.spool.dropped_total,
            spool_bytes=self.spool.bytes,
            spool_batches=len(self.spool),
            send_errors=self.stats.send_errors,
            corrupt_dropped=self.stats.corrupt_dropped,
            spool_max_bytes=self.spool.max_bytes,
        )

    # -- collector ------------------------------------------------------------------------

    def collect_and_spool(self) -> NodeBatch:
        """One collection: collect, encode, append to the spool, wake the sender."""
        batch = self.agent.collect_once(self._clock())
        try:
            self.spool.append(frame(batch.job, self.encoder.encode(batch)))
        except (ValidationError, OSError) as exc:
            # the lost batch may have carried the layout: the next one announces it again,
            # and its flight-recorder summaries: the next one carries them
            self.encoder.forget()
            self.agent.give_back(batch)
            self.stats.spool_errors += 1
            if self.stats.spool_errors == 1 or math.log2(self.stats.spool_errors).is_integer():
                logger.error(
                    "batch %s/%s at %.3f not spooled (%d so far): %s",
                    batch.job,
                    batch.node,
                    batch.ts,
                    self.stats.spool_errors,
                    exc,
                )
        self.stats.collections += 1
        self._wake.set()
        if self._on_batch is not None:
            self._on_batch(batch)
        return batch

    def _collect_loop(self) -> None:
        try:
            self._collect_until_stopped()
            if self._goodbye:
                self._spool_goodbye()
        finally:
            self._collector_done.set()

    def _spool_goodbye(self) -> None:
        """Append the goodbye after the last collected batch (the sender flushes it next)."""
        agent = self.agent
        reason = self._stop_reason or "stop requested"
        batch: NodeBatch | None = None
        try:
            batch = agent.goodbye(self._clock(), reason)
            self.spool.append(frame(batch.job, self.encoder.encode(batch)))
        except (ValidationError, OSError) as exc:
            logger.error("goodbye of %s/%s not spooled: %s", agent.job, agent.node, exc)
            if batch is not None:
                agent.give_back(batch)  # counted as unsent when the agent closes
            return
        except Exception:
            logger.exception("goodbye of %s/%s not spooled", agent.job, agent.node)
            return
        self.stats.goodbyes += 1
        self._wake.set()
        logger.info(
            "agent %s/%s stopped (%s): goodbye spooled, the node leaves its job",
            agent.job,
            agent.node,
            reason,
        )

    def _collect_until_stopped(self) -> None:
        interval = self.interval_s
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.collect_and_spool()
            except Exception:
                # The agent isolates its sources, so this is a bug; keep the cadence anyway.
                logger.exception("collection failed")
            next_tick += interval
            delay = next_tick - time.monotonic()
            if delay < 0:
                # Overran: skip the missed ticks rather than collect in a burst.
                missed = math.ceil(-delay / interval)
                self.stats.missed_ticks += missed
                next_tick += missed * interval
                delay = next_tick - time.monotonic()
            self._stop.wait(max(0.0, delay))

    # -- sender ---------------------------------------------------------------------------

    def _send_loop(self) -> None:
        if self._factory is None:
            return
        backoff = self._backoff_initial_s
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            while not self._stop.is_set():
                outcome = self._deliver_guarded()
                if outcome is None:  # spool empty
                    break
                if outcome:
                    backoff = self._backoff_initial_s
                    continue
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)
        # The collection under way when the stop came is spooled before the last flush.
        self._collector_done.wait(timeout=self.interval_s + 30.0)
        try:
            self._final_flush()
        except Exception as exc:  # even the spool's length failed: what is left stays on disk
            self._loop_error(exc)
        if self._sender is not None:
            try:
                self._sender.close()
            except Exception as exc:
                logger.warning("closing the sender: %r", exc)
            self._sender = None

    def _final_flush(self) -> None:
        deadline = time.monotonic() + self._final_flush_s
        while len(self.spool) and time.monotonic() < deadline:
            remaining = deadline - time.monotonic()
            outcome = self._deliver_guarded(timeout_s=max(0.1, remaining))
            if outcome is None:
                break
            if not outcome:
                time.sleep(min(self._backoff_initial_s, max(0.0, deadline - time.monotonic())))
        left = len(self.spool)
        if left:
            logger.warning(
                "agent stopped with %d batch(es) (%d bytes) undelivered in %s: they go out at "
                "the next start",
                left,
                self.spool.bytes,
                self.spool.directory,
            )

    def _deliver_guarded(self, timeout_s: float | None = None) -> bool | None:
        """:meth:`deliver_once`, with any error counted as a failed attempt instead of raised."""
        try:
            return self.deliver_once(timeout_s)
        except Exception as exc:
            self._loop_error(exc)
            return False

    def _loop_error(self, exc: Exception) -> None:
        """An error outside the sender's own reporting (spool I/O, a bug): count, log once."""
        error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.stats.send_errors += 1
            self.stats.last_error = error
        kind = type(exc).__qualname__
        if kind in self._logged_errors:
            logger.debug("sender pass failed again: %s", error)
            return
        self._logged_errors.add(kind)
        logger.error(
            "sender pass failed (%s); retried with backoff, further %s errors are counted in "
            "send_errors, not logged",
            error,
            kind,
            exc_info=exc,
        )

    def deliver_once(self, timeout_s: float | None = None) -> bool | None:
        """Send the oldest run of spooled batches once.

        Returns None when the spool is empty, True when the whole run was acknowledged (and
        removed from the spool) or when the oldest record was dropped as corrupt, False when
        something failed (what was acknowledged is removed).

        Raises
        ------
        OSError
            The spool could not be read or updated (the run loop counts it and retries).
        """
        records = self.spool.peek_many(self._max_run_records, self._max_run_bytes)
        if not records:
            return None
        if self._factory is None:
            return False
        pairs: list[tuple[str, bytes]] = []
        for record in records:
            try:
                pairs.append(unframe(record.payload))
            except DecodeError as exc:
                if pairs:
                    break  # send the good records before it; it is first in the next run
                self._drop_corrupt(record, exc)
                return True
        records = records[: len(pairs)]
        if timeout_s is None:
            timeout_s = self._send_timeout_s
        try:
            if self._sender is None:
                self._sender = self._factory()
            result = self._sender.send(pairs, timeout_s=timeout_s)
        except Exception as exc:
            # A sender that raises (instead of reporting) is dropped and built again next time.
            self._drop_sender()
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        return self._settle(records, result)

    def _drop_corrupt(self, record: SpoolRecord, exc: DecodeError) -> None:
        self.spool.ack(record.seq)
        with self._lock:
            self.stats.corrupt_dropped += 1
            first = self.stats.corrupt_dropped == 1
        (logger.error if first else logger.debug)(
            "spool record %d in %s dropped, it cannot be sent (%s); further corrupt records are "
            "counted in corrupt_dropped, not logged",
            record.seq,
            self.spool.directory,
            exc.reason,
        )

    def _settle(self, records: list[SpoolRecord], result: SendResult) -> bool:
        delivered = min(max(result.delivered, 0), len(records))
        if delivered:
            # Counted before the spool is updated: they were delivered even if that fails.
            with self._lock:
                self.stats.batches_sent += delivered
            self.spool.ack(records[delivered - 1].seq)
        if result.rejected and delivered < len(records):
            with self._lock:
                self.stats.rejected += 1
            self.spool.ack(records[delivered].seq)
            logger.error(
                "batch dropped, refused by the broker for good (%d so far): %s",
                self.stats.rejected,
                result.error,
            )
            if delivered + 1 == len(records):
                self._recovered()
                return True
            return False
        if delivered == len(records) and result.error is None:
            self._recovered()
            return True
        self._failed(result.error or f"only {delivered} of {len(records)} batches acknowledged")
        return False

    def _failed(self, error: str) -> None:
        with self._lock:
            self.stats.send_errors += 1
            self.stats.last_error = error
        self._failures_in_row += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            logger.warning(
                "cannot deliver batches (%s); they wait in the spool %s (%d bytes max) and "
                "delivery is retried with backoff",
                error,
                self.spool.directory,
                self.spool.max_bytes,
            )
        else:
            logger.debug("delivery failed again: %s", error)

    def _recovered(self) -> None:
        if self._failing_since is not None:
            logger.warning(
                "delivering again after %.1f s and %d failed attempt(s); %d batch(es) dropped "
                "from the full spool so far",
                time.monotonic() - self._failing_since,
                self._failures_in_row,
                self.spool.dropped_total,
            )
        self._failing_since = None
        self._failures_in_row = 0

    def _drop_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            try:
                sender.close()
            except Exception as exc:
                logger.debug("closing a failed sender: %r", exc)
