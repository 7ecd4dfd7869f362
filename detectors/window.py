"""Per-job sliding window of the newest samples: machine × series ring buffer.

A *series* is one ``(metric, device)`` pair. Samples are bucketed by *tick*, the job's sampling
interval: one second for the node agent, 15 or 60 s for a Prometheus scrape. The window learns
the tick from the data (each series' spacing, :meth:`JobWindow.calibrate`), re-buckets what it
holds once it knows, and keeps the newest ``slots`` ticks, so detection never re-scans history.
Series sampled more coarsely than the tick (a 15 s scrape beside 1 s agent data) are known by
their own spacing (:attr:`JobWindow.series_every`), which the detector follows per metric.

The window also keeps the job's membership: a machine that said goodbye (a ``leave`` event) or
left with a batch of others is *departed* until it reports again; a machine that (re)joins is
compared with its peers only once it has a full window (:attr:`JobWindow.joined_sec`). The
changes are queued as :class:`MembershipChange` for the service to log and count.

Flight-recorder summaries that batches carry (:attr:`NodeBatch.flight_recorder`) are kept, the
latest per rank, until a detector takes them (:meth:`JobWindow.take_flight_records`).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from minder.core.hang import RankSummary
from minder.core.metrics import METRICS, MetricSpec
from minder.core.records import Event, EventKind, NodeBatch

logger = logging.getLogger(__name__)

NEVER = -(2**62)
"""``last_seen`` value of something never seen."""
MAX_TICK_S = 300
"""Coarsest sampling interval the window follows (longer spacing is a gap, not a cadence)."""
CALIBRATE_MIN_S = 3
"""Seconds of data before the sampling interval is first estimated."""
CALIBRATE_MAX_S = 600
"""Seconds of data after which the interval is estimated from whatever was seen."""
CALIBRATE_EVERY_S = 5
"""Once the tick is known, how often the intervals of rarer series are estimated again."""


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """A change of a job's membership: not a fault, but what an operator wants to see.

    ``change`` is ``joined`` (a machine reported for the first time, or again after leaving),
    ``left`` (it said goodbye), ``left_together`` (a batch fell silent together while the rest
    kept reporting: a scale-down) or ``quiet`` (most of the job stopped reporting: it ended,
    or its stream did).
    """

    job: str
    change: str
    machines: tuple[str, ...]
    ts: float
    reason: str = ""


@dataclass(slots=True)
class MachineInfo:
    """What the window knows of one machine."""

    name: str
    group: str = ""
    domain: str = ""


@dataclass(frozen=True, slots=True)
class WindowLimits:
    """Bounds on what one job's window holds, against hostile or broken producers.

    Each is counted when hit (:attr:`WindowStats.rejected`), never silently.

    Attributes
    ----------
    max_machines
        Machines per job; a new machine beyond it is refused.
    max_series_per_machine
        ``(metric, device)`` series one machine may add; a new series beyond it (and beyond
        ``max_series`` for the job) is refused.
    max_name_length
        Longest machine, metric or device name (characters).
    max_pending_events
        Events waiting for their second; more are refused.
    event_skew_s
        An event dated farther than this from its batch's time is refused (a broken or
        hostile clock: an onset in 1970 or in 2096).
    max_flight_records
        Distinct ranks whose flight-recorder summary waits for a detector; a summary of a
        further rank is refused (a newer one of a rank already held replaces it).
    """

    max_machines: int = 20_000
    max_series_per_machine: int = 4_096
    max_series: int = 65_536
    max_name_length: int = 256
    max_pending_events: int = 10_000
    event_skew_s: float = 300.0
    max_flight_records: int = 32_768


@dataclass(slots=True)
class WindowStats:
    """Counts of samples the window could not place (reported, never silently lost)."""

    samples: int = 0
    too_old: int = 0
    events: int = 0
    flight_records: int = 0
    """Flight-recorder summaries received (kept, replaced or refused)."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Samples, events and batches refused, by reason (:class:`WindowLimits`)."""

    def reject(self, reason: str, count: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + count


@dataclass(slots=True)
class PendingEvent:
    """An event waiting for the detector, with the machine that sent it."""

    machine: int
    event: Event


class JobWindow:
    """Ring buffer of one job's newest ticks.

    Parameters
    ----------
    job
        Job id.
    horizon_s
        Ticks kept (seconds at the 1-second tick; :attr:`horizon_s` is then in seconds); must
        cover the detection window and the rules' look-back.
    tick_s
        The job's sampling interval, when known; learnt from the data otherwise.
    limits
        Bounds on what the window holds (:class:`WindowLimits`).
    """

    def __init__(
        self,
        job: str,
        horizon_s: int = 64,
        *,
        tick_s: int | None = None,
        limits: WindowLimits | None = None,
    ) -> None:
        if horizon_s < 2:
            raise ValueError(f"horizon_s is {horizon_s!r}: expected at least 2 ticks")
        if tick_s is not None and not 1 <= tick_s <= MAX_TICK_S:
            raise ValueError(f"tick_s is {tick_s!r}: expected 1 to {MAX_TICK_S} seconds")
        self.job = job
        self.limits = limits or WindowLimits()
        self.slots = horizon_s
        """Ticks kept (seconds at the agent's 1-second tick)."""
        self.first_sec = NEVER
        """First second of data the job sent (alert onsets are never earlier)."""
        self.tick_s = tick_s or 1
        """Seconds per tick: the job's finest sampling interval, learnt unless given."""
        self.calibrated = tick_s is not None
        self.cadence_known = tick_s is not None
        """The tick has been estimated (or given) at least once: detection may start."""
        self.fixed_tick = tick_s is not None
        """The tick was given: calibration learns the series' intervals only."""
        self.series_every = np.ones(0, dtype=np.int64)
        """Per series, its sampling interval in ticks (1 unless sampled more coarsely)."""
        self.machine_interval_s = np.ones(0)
        """Per machine, the interval of its finest series, seconds."""
        self._first_seen = np.full((0, 0), NEVER, dtype=np.int64)
        self._n_seen = np.zeros((0, 0), dtype=np.int32)
        self._calibrate_from = NEVER
        self._calibrated_at = NEVER
        self.departed = np.zeros(0, dtype=bool)
        """Machines that left the job (goodbye, or silent with a batch of others)."""
        self.departed_sec = np.full(0, NEVER, dtype=np.int64)
        """Second each departed machine left: only a later sample brings it back."""
        self.joined_sec = np.full(0, NEVER, dtype=np.int64)
        """Second each machine (re)joined: its first sample, or its first after leaving."""
        self.membership: list[MembershipChange] = []
        self.cadence_version = 0
        """Incremented each time the tick or a series' interval changes."""
        self.machines: list[MachineInfo] = []
        self.machine_index: dict[str, int] = {}
        self.series: list[tuple[str, str]] = []
        self.series_index: dict[tuple[str, str], int] = {}
        self.series_spec: list[MetricSpec] = []
        self._values = np.full((horizon_s, 0, 0), np.nan, dtype=np.float32)
        self._rows_ready = 0
        """Machine rows of ``_values`` filled so far (the rest is reserved: see :meth:`_grow`)."""
        self._slot_tick = np.full(horizon_s, NEVER, dtype=np.int64)
        self._last_seen = np.full((0, 0), NEVER, dtype=np.int64)
        self._machine_last_seen = np.full(0, NEVER, dtype=np.int64)
        self.newest_sec = NEVER
        self.stats = WindowStats()
        self.events: list[PendingEvent] = []
        self._flight: dict[int, RankSummary] = {}
        """The latest flight-recorder summary of each rank, until a detector takes them."""
        # Column indices of each node's sample list, keyed by the tuple of names it sends: a node
        # sends the same names every second, so the per-sample dictionary work happens once.
        self._layout_cache: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
        # The same for packed batches, keyed by their layout's id (no tuple to build and hash).
        self._packed_cache: dict[int, np.ndarray] = {}
        self._series_added: dict[int, int] = {}
        self._columns_cache: dict[str, tuple[np.ndarray, list[str]]] = {}
        self._columns_cache_size = 0

    # -- registries -------------------------------------------------------------------------
    @property
    def n_machines(self) -> int:
        return len(self.machines)

    @property
    def n_series(self) -> int:
        return len(self.series)

    @property
    def horizon_s(self) -> int:
        """Seconds of history the buffer covers (``slots`` ticks)."""
        return self.slots * self.tick_s

    def tick_of(self, sec: int) -> int:
        """Tick holding second ``sec``."""
        return sec // self.tick_s

    def tick_end(self, tick: int) -> int:
        """Last second of ``tick``."""
        return (tick + 1) * self.tick_s - 1

    def interval_of(self, cols: np.ndarray) -> np.ndarray:
        """Sampling interval (seconds) of each series in ``cols``."""
        return self.series_every[cols] * self.tick_s

    def machine_id(self, name: str, group: str = "", domain: str = "") -> int:
        """Index of ``name``, registering it (and updating its labels) as needed."""
        idx = self.machine_index.get(name)
        if idx is None:
            idx = len(self.machines)
            self.machines.append(MachineInfo(name, group, domain))
            self.machine_index[name] = idx
            self._grow(machines=idx + 1)
        else:
            info = self.machines[idx]
            if group and info.group != group:
                info.group = group
            if domain and info.domain != domain:
                info.domain = domain
        return idx

    def series_id(self, metric: str, device: str) -> int:
        """Index of ``(metric, device)``, registering it as needed (metric must be canonical)."""
        key = (metric, device)
        idx = self.series_index.get(key)
        if idx is None:
            idx = len(self.series)
            self.series.append(key)
            self.series_index[key] = idx
            self.series_spec.append(METRICS[metric])
            self._grow(series=idx + 1)
            if self.calibrated and self.newest_sec != NEVER:
                # A series that appears mid-job: learn its interval too.
                self.calibrated = False
                self._calibrate_from = self.newest_sec
        return idx

    def _grow(self, machines: int | None = None, series: int | None = None) -> None:
        # Capacity of the (machine, series) arrays and of the value buffer (same shape).
        m_now, k_now = self._last_seen.shape
        m_need = max(m_now, machines or 0)
        k_need = max(k_now, series or 0)
        if m_need <= m_now and k_need <= k_now:
            self._ready_rows(machines or 0)
            return
        # Grow by doubling so registering many machines costs amortised O(1) copies (callers
        # that know how many are coming ask for them at once: :meth:`add_batches`).
        m_cap = m_now if m_need <= m_now else max(m_need, 2 * m_now, 8)
        k_cap = k_now if k_need <= k_now else max(k_need, 2 * k_now, 16)
        # The value buffer (slots x machines x series) is the window's largest array by far.
        # Its new rows are filled (their memory touched) only as machines come and only in the
        # slots that hold a tick; no room is reserved beyond the doubling (a reserve is resident
        # memory where huge pages round it up, and committed memory under strict overcommit).
        ready = self._rows_ready
        values = np.empty((self.slots, m_cap, k_cap), dtype=np.float32)
        for slot in self._live_slots():
            values[slot, :ready, :k_now] = self._values[slot, :ready, :k_now]
            values[slot, :ready, k_now:] = np.nan
        self._values = values
        self._ready_rows(machines or 0)
        self._last_seen = _grown(self._last_seen, (m_cap, k_cap), NEVER)
        self._first_seen = _grown(self._first_seen, (m_cap, k_cap), NEVER)
        self._n_seen = _grown(self._n_seen, (m_cap, k_cap), 0)
        self._machine_last_seen = _grown(self._machine_last_seen, (m_cap,), NEVER)
        self.joined_sec = _grown(self.joined_sec, (m_cap,), NEVER)
        self.departed = _grown(self.departed, (m_cap,), False)
        self.departed_sec = _grown(self.departed_sec, (m_cap,), NEVER)
        self.machine_interval_s = _grown(self.machine_interval_s, (m_cap,), float(self.tick_s))
        self.series_every = _grown(self.series_every, (k_cap,), 1)

    def _live_slots(self) -> list[int]:
        """Slots holding a tick: the others were never written (:meth:`_slot` clears a slot
        when it takes a tick) and are never read."""
        return np.flatnonzero(self._slot_tick != NEVER).tolist()

    def _ready_rows(self, rows: int) -> None:
        """Make the buffer's machine rows up to ``rows`` (at least) NaN in the slots that hold
        a tick: rows beyond :attr:`_rows_ready` are reserved memory, never written before, and
        a slot that takes a tick later is cleared then."""
        ready = self._rows_ready
        if rows <= ready:
            return
        # Machines registered one at a time: a few rows ahead, not one fill per machine.
        rows = min(self._values.shape[1], max(rows, ready + ready // 8, 64))
        for slot in self._live_slots():
            self._values[slot, ready:rows, :] = np.nan
        self._rows_ready = rows

    def ensure_slots(self, slots: int) -> None:
        """Keep at least ``slots`` ticks (a metric sampled coarsely needs a longer window)."""
        if slots > self.slots:
            self._rebucket(self.tick_s, slots)

    # -- ingest -----------------------------------------------------------------------------
    def _slot(self, sec: int) -> int | None:
        """Slot of ``sec``'s tick, clearing a slot that still holds an older tick; None if too
        old."""
        tick = sec // self.tick_s
        newest_tick = self.newest_sec // self.tick_s if self.newest_sec != NEVER else NEVER
        if newest_tick != NEVER and tick <= newest_tick - self.slots:
            return None
        slot = tick % self.slots
        if self._slot_tick[slot] != tick:
            self._values[slot, : self._rows_ready] = np.nan
            self._slot_tick[slot] = tick
        self.newest_sec = max(self.newest_sec, sec)
        return slot

    def add_batch(self, batch: NodeBatch) -> None:
        """Place one node batch (samples and events) in the window: :meth:`add_batches`."""
        self.add_batches((batch,))

    def add_batches(self, batches: Iterable[NodeBatch]) -> None:
        """Place node batches of this job (samples and events) in the window.

        Events, labels, membership and limits are handled batch by batch; the samples are
        gathered per second and placed with one :meth:`add_arrays` per second, in the order the
        seconds first appear. A batch with a goodbye (a ``leave`` event) or without
        samples first places what was gathered before it, so membership follows the batches'
        order. A packed batch (schema 2) maps its layout to the window's series once per layout
        (cached by the layout's id), a batch of named samples (schema 1) once per distinct
        sequence of names.

        Within :attr:`limits`: a batch of a machine beyond ``max_machines`` or with a name too
        long is refused whole, new series beyond the series bounds and events too far from the
        batch's time or beyond ``max_pending_events`` are refused; each counted by reason.
        """
        lim = self.limits
        stats = self.stats
        if not isinstance(batches, Sequence):
            batches = list(batches)
        # The machines new to the window, registered below one by one: room for all of them at
        # once (a job's first seconds bring thousands), not one doubling after another.
        index = self.machine_index
        longest = lim.max_name_length
        new = {b.node for b in batches if b.node not in index and len(b.node) <= longest}
        if new:
            self._grow(machines=min(self.n_machines + len(new), lim.max_machines))
        # second -> the machines, series indices and values gathered for it
        groups: dict[int, _Group] = {}
        for batch in batches:
            if len(batch.node) > lim.max_name_length:
                stats.reject("name_too_long")
                continue
            if batch.node not in self.machine_index and self.n_machines >= lim.max_machines:
                stats.reject("too_many_machines")
                continue
            sec = math.floor(batch.ts)
            m = self.machine_id(
                batch.node, batch.group[: lim.max_name_length], batch.domain[: lim.max_name_length]
            )
            leaving = False
            if batch.events:
                leaving = self._add_events(m, batch)
            if batch.flight_recorder:
                self._add_flight_records(batch)
            placed = self._gather(m, sec, batch, groups)
            if not placed or leaving:
                self._place_groups(groups)
                if not placed and (not batch.events or not _only_leave(batch)):
                    self._mark_machine(m, sec)
            if leaving:
                reason = next(
                    e.message for e in reversed(batch.events) if e.kind is EventKind.LEAVE
                )
                # Dated by its batch: a goodbye's own clock could keep the machine out for good.
                self.depart([m], "left", batch.ts, (reason or "goodbye")[:160])
        self._place_groups(groups)

    def _add_events(self, m: int, batch: NodeBatch) -> bool:
        """Queue a batch's events (within the limits); True when it says goodbye."""
        lim = self.limits
        stats = self.stats
        leaving = False
        for event in batch.events:
            if event.kind is EventKind.LEAVE:
                leaving = True
                continue
            skew = abs(event.ts - batch.ts) > lim.event_skew_s
            if skew or len(event.device) > lim.max_name_length:
                stats.reject("event_time" if skew else "name_too_long")
                continue
            if len(self.events) >= lim.max_pending_events:
                stats.reject("too_many_events")
                continue
            self.events.append(PendingEvent(m, event))
            stats.events += 1
        return leaving

    def _add_flight_records(self, batch: NodeBatch) -> None:
        """Keep a batch's flight-recorder summaries, the latest per rank (by dump time, then
        arrival), naming the batch's node where a summary names none; beyond
        ``max_flight_records`` ranks, refused and counted."""
        held = self._flight
        for summary in batch.flight_recorder:
            self.stats.flight_records += 1
            old = held.get(summary.rank)
            if old is None and len(held) >= self.limits.max_flight_records:
                self.stats.reject("too_many_flight_records")
                continue
            if old is not None and summary.dumped_ts < old.dumped_ts:
                self.stats.reject("older_flight_record")
                continue
            held[summary.rank] = summary if summary.node else replace(summary, node=batch.node)

    def take_flight_records(self) -> list[RankSummary]:
        """Remove and return the flight-recorder summaries received since the last call (the
        latest per rank), ordered by rank."""
        if not self._flight:
            return []
        out = [self._flight[r] for r in sorted(self._flight)]
        self._flight = {}
        return out

    def _gather(self, m: int, sec: int, batch: NodeBatch, groups: dict[int, _Group]) -> bool:
        """Add a batch's samples to its second's group; False when it has none."""
        layout = batch.layout
        if layout is not None and batch.values is not None:
            cols = self._packed_cache.get(layout.id)
            if cols is None:
                cols = self._columns_for(m, tuple(zip(layout.metrics, layout.devices, strict=True)))
                if len(self._packed_cache) < _MAX_CACHED_LAYOUTS and (cols >= 0).all():
                    self._packed_cache[layout.id] = cols
            values: np.ndarray = batch.values
        elif batch.samples:
            layout_key = tuple((name, dev) for name, dev, _ in batch.samples)
            cols = self._layout_cache.get(layout_key)
            if cols is None:
                cols = self._columns_for(m, layout_key)
                if len(self._layout_cache) < _MAX_CACHED_NAMED and (cols >= 0).all():
                    self._layout_cache[layout_key] = cols
            values = np.fromiter((s[2] for s in batch.samples), dtype=np.float32, count=len(cols))
        else:
            return False
        group = groups.get(sec)
        if group is None:
            groups[sec] = group = _Group(sec)
        group.machines.append(m)
        group.cols.append(cols)
        group.values.append(values)
        return True

    def _place_groups(self, groups: dict[int, _Group]) -> None:
        """One :meth:`add_arrays` per gathered second, then forget them."""
        for group in groups.values():
            if len(group.machines) == 1:
                cols, values = group.cols[0], group.values[0]
                machines = np.full(len(cols), group.machines[0], dtype=np.int64)
            else:
                cols = np.concatenate(group.cols)
                values = np.concatenate(group.values)
                machines = np.repeat(
                    np.asarray(group.machines, dtype=np.int64), [len(c) for c in group.cols]
                )
            keep = cols >= 0
            reporting = np.asarray(group.machines, dtype=np.int64)
            if not keep.all():  # refused series (counted when mapped): place the others
                machines, cols, values = machines[keep], cols[keep], values[keep]
                reporting = np.unique(machines)
            self.add_arrays(group.sec, machines, cols, values, reporting=reporting)
        groups.clear()

    def _columns_for(self, m: int, layout: tuple[tuple[str, str], ...]) -> np.ndarray:
        """Series indices of a batch's layout; -1 for a series refused (a name too long, or
        a new series beyond the machine's or the job's bound), counted."""
        lim = self.limits
        out = np.empty(len(layout), dtype=np.int64)
        added = self._series_added.get(m, 0)
        # Room for the layout's new series at once (a node's first batch brings all of them);
        # only for those that will be taken (refused names and series beyond the bounds are not).
        longest = lim.max_name_length
        fresh = sum(
            1
            for key in layout
            if key not in self.series_index and len(key[0]) <= longest and len(key[1]) <= longest
        )
        fresh = min(fresh, max(0, lim.max_series_per_machine - added))
        if fresh:
            self._grow(series=min(self.n_series + fresh, lim.max_series))
        for i, (name, dev) in enumerate(layout):
            idx = self.series_index.get((name, dev))
            if idx is None:
                if len(name) > lim.max_name_length or len(dev) > lim.max_name_length:
                    self.stats.reject("name_too_long")
                    idx = -1
                elif added >= lim.max_series_per_machine or self.n_series >= lim.max_series:
                    self.stats.reject("too_many_series")
                    idx = -1
                else:
                    idx = self.series_id(name, dev)
                    added += 1
            out[i] = idx
        self._series_added[m] = added
        return out

    def _mark_machine(self, m: int, sec: int) -> None:
        if self._machine_last_seen[m] == NEVER or (self.departed[m] and sec > self.departed_sec[m]):
            self._join(np.asarray([m]), sec)
        self._machine_last_seen[m] = max(self._machine_last_seen[m], sec)

    def add_arrays(
        self,
        sec: int,
        machines: np.ndarray,
        cols: np.ndarray,
        values: np.ndarray,
        *,
        reporting: np.ndarray | None = None,
    ) -> int:
        """Place samples of one second given as parallel index arrays; returns how many fit.

        ``reporting``: the machines of the call, each once or more (default ``machines``, one
        entry per sample): their membership is updated from it, far fewer entries for a poll.
        """
        self.stats.samples += len(values)
        newer = self.newest_sec == NEVER or sec > self.newest_sec
        slot = self._slot(sec)
        if slot is None:
            self.stats.too_old += len(values)
            return 0
        # One flat index into the (machine, series) planes, instead of a 2-D fancy index each
        # (in intp: int32 indices would overflow once machines x series passes 2**31).
        flat = machines.astype(np.intp, copy=False) * self._last_seen.shape[1] + cols
        _plane(self._values[slot])[flat] = values
        if self.first_sec == NEVER or sec < self.first_sec:
            self.first_sec = sec
        last_seen = _plane(self._last_seen)
        last = last_seen[flat]
        if not self.calibrated:
            fresh = sec > last
            n_seen = _plane(self._n_seen)
            n_seen[flat] += fresh
            first_seen = _plane(self._first_seen)
            first = first_seen[flat]
            first_seen[flat] = np.where(first == NEVER, sec, first)
            if self._calibrate_from == NEVER:
                self._calibrate_from = sec
        last_seen[flat] = np.maximum(last, sec)
        rows = machines if reporting is None else reporting
        if len(rows) and len(values):
            # Every sample of the call has the same second: a plain (duplicate-safe) assignment.
            seen = self._machine_last_seen[rows]
            joining = (seen == NEVER) | (self.departed[rows] & (sec > self.departed_sec[rows]))
            if joining.any():
                self._join(np.unique(rows[joining]), sec)
            self._machine_last_seen[rows] = np.maximum(seen, sec)
        if (
            newer
            and not self.calibrated
            and sec - self._calibrate_from >= CALIBRATE_MIN_S
            and sec - self._calibrated_at >= (CALIBRATE_EVERY_S if self.cadence_known else 1)
        ):
            self._calibrated_at = sec
            self.calibrate(final=sec - self._calibrate_from >= CALIBRATE_MAX_S)
        return len(values)

    # -- membership -------------------------------------------------------------------------
    def _join(self, machines: np.ndarray, sec: int) -> None:
        back = machines[self.departed[machines]]
        self.joined_sec[machines] = sec
        self.departed[machines] = False
        if back.size:
            self.membership.append(
                MembershipChange(
                    self.job, "joined", tuple(self.machines[m].name for m in back), float(sec)
                )
            )

    def depart(self, machines: Sequence[int], change: str, ts: float, reason: str = "") -> None:
        """Drop ``machines`` from the job until they report again (not a fault)."""
        idx = np.asarray(sorted(set(machines)), dtype=np.int64)
        idx = idx[~self.departed[idx]]
        if not idx.size:
            return
        self.departed[idx] = True
        # Only samples newer than the machine's own last one bring it back (a batch departs
        # at its earliest onset; a late sample of a later-silent member is not a return).
        self.departed_sec[idx] = np.maximum(math.floor(ts), self._machine_last_seen[idx])
        names = tuple(self.machines[m].name for m in idx)
        self.membership.append(MembershipChange(self.job, change, names, float(ts), reason))
        logger.info(
            "job %s: %d machine(s) %s (%s): %s",
            self.job,
            len(names),
            change.replace("_", " "),
            reason[:120] or "no reason given",
            ", ".join(n[:64] for n in names[:8]) + (" …" if len(names) > 8 else ""),
        )

    def note(self, change: str, ts: float, reason: str = "") -> None:
        """Queue a job-level membership change that drops no machine (``quiet``)."""
        self.membership.append(MembershipChange(self.job, change, (), float(ts), reason))

    def take_membership(self) -> list[MembershipChange]:
        """Remove and return the queued membership changes."""
        out, self.membership = self.membership, []
        return out

    def active(self) -> np.ndarray:
        """Machines that are part of the job: reported at least once and not departed."""
        n = self.n_machines
        return (self._machine_last_seen[:n] != NEVER) & ~self.departed[:n]

    # -- sampling interval ------------------------------------------------------------------
    def calibrate(self, *, final: bool = False) -> bool:
        """Estimate the tick and each series' interval from the samples' spacing so far.

        A series' interval is the median, over machines with three samples or more, of its
        mean spacing (missing samples stretch it a little; duplicates and late samples do not
        count); the tick is the finest series interval, in whole seconds. Returns True once
        estimated; until most series have three samples (or ``final``), nothing changes.
        """
        n, k = self.n_machines, self.n_series
        counts = self._n_seen[:n, :k]
        seen = counts >= 1
        enough = counts >= 3
        if not seen.any() or (enough.sum() < 0.5 * seen.sum() and not final):
            return False
        with np.errstate(invalid="ignore", divide="ignore"):
            spacing = np.where(
                enough,
                (self._last_seen[:n, :k] - self._first_seen[:n, :k]) / np.maximum(counts - 1, 1),
                np.nan,
            )
        if not np.isfinite(spacing).any():
            if final:
                self.calibrated = self.cadence_known = True
                self._first_seen[:] = NEVER
            return self.calibrated
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # series with no estimate yet
            per_series = np.nanmedian(spacing, axis=0)
            per_machine = np.nanmin(spacing, axis=1)
        known = np.isfinite(per_series)
        tick = int(min(MAX_TICK_S, max(1, round(float(per_series[known].min())))))
        if self.fixed_tick:
            tick = self.tick_s
        every = np.ones(k, dtype=np.int64)
        every[known] = np.clip(np.rint(per_series[known] / tick), 1, None).astype(np.int64)
        changed = tick != self.tick_s or not np.array_equal(every, self.series_every[:k])
        if tick != self.tick_s:
            logger.info(
                "job %s: sampling interval %d s (was %d s); window re-bucketed",
                self.job,
                tick,
                self.tick_s,
            )
            self._rebucket(tick, self.slots)
        self.series_every[:k] = every
        self.machine_interval_s[:n] = np.where(
            np.isfinite(per_machine), np.maximum(per_machine, tick), tick
        )
        if changed:
            self.cadence_version += 1
            slow = sorted({int(e) * tick for e in every.tolist() if e > 1})
            if slow:
                logger.info(
                    "job %s: series sampled every %s s beside the %d s tick",
                    self.job,
                    ", ".join(map(str, slow)),
                    tick,
                )
        self.cadence_known = True
        if (seen.any(axis=0) & ~known).any() and not final:
            # Series seen too rarely so far (a slow scrape beside agent data): keep counting.
            return True
        self.calibrated = True
        self._n_seen[:] = 0
        self._first_seen[:] = NEVER
        return True

    def _rebucket(self, tick_s: int, slots: int) -> None:
        """Move what the buffer holds to ticks of ``tick_s`` seconds and ``slots`` slots."""
        old_values, old_ticks, old_tick_s = self._values, self._slot_tick, self.tick_s
        ready = self._rows_ready
        # Cleared slot by slot below as they take a tick (see _live_slots).
        values = np.empty((slots, *old_values.shape[1:]), dtype=np.float32)
        slot_tick = np.full(slots, NEVER, dtype=np.int64)
        newest = self.newest_sec // tick_s if self.newest_sec != NEVER else NEVER
        for old_slot in np.argsort(old_ticks).tolist():  # oldest first: newer values win
            old = int(old_ticks[old_slot])
            if old == NEVER:
                continue
            tick = old * old_tick_s // tick_s
            if newest != NEVER and tick <= newest - slots:
                continue
            slot = tick % slots
            if slot_tick[slot] != tick:
                values[slot, :ready] = np.nan
                slot_tick[slot] = tick
            src = old_values[old_slot, :ready]
            present = np.isfinite(src)
            values[slot, :ready][present] = src[present]
        self._values, self._slot_tick = values, slot_tick
        self.slots, self.tick_s = slots, tick_s

    def add_samples(
        self,
        sec: int,
        machine: str,
        samples: Iterable[tuple[str, str, float]],
        group: str = "",
        domain: str = "",
    ) -> None:
        """Convenience form of :meth:`add_batch` for one machine's samples."""
        self.add_batch(
            NodeBatch(
                job=self.job,
                node=machine,
                ts=float(sec),
                labels={"group": group, "domain": domain},
                samples=list(samples),
            )
        )

    # -- views ------------------------------------------------------------------------------
    def window(self, end_sec: int, length: int, cols: np.ndarray | None = None) -> np.ndarray:
        """Values of the ``length`` ticks up to the one holding ``end_sec``, as
        ``[length, machines, series]`` (seconds at the 1-second tick).

        ``cols`` restricts the series (and the copy) to those indices. Seconds the buffer no
        longer (or never) held are all-NaN.
        """
        length = min(length, self.slots)
        m, k = self.n_machines, self.n_series
        end = end_sec // self.tick_s
        ticks = np.arange(end - length + 1, end + 1)
        slots = ticks % self.slots
        stale = self._slot_tick[slots] != ticks
        runs = _runs(cols, k)
        if runs is None:
            assert cols is not None
            out = self._values[slots[:, None], :m, cols[None, :]].transpose(0, 2, 1).copy()
            out[stale] = np.nan
            return out
        # A few runs of consecutive series (a metric's devices are registered together): copied
        # slice by slice, slot by slot (a fancy index over slots and series gathers far slower).
        width = k if cols is None else len(cols)
        out = np.empty((length, m, width), dtype=self._values.dtype)
        for i, (slot, old) in enumerate(zip(slots.tolist(), stale.tolist(), strict=True)):
            if old:
                out[i] = np.nan
                continue
            plane = self._values[slot, :m]
            for lo, hi, at in runs:
                out[i, :, at : at + hi - lo] = plane[:, lo:hi]
        return out

    def at(self, sec: int) -> np.ndarray:
        """Values of the tick holding ``sec`` as ``[machines, series]`` (NaN where absent)."""
        return self.window(sec, 1)[0]

    def last_seen(self) -> np.ndarray:
        """Last second each ``[machine, series]`` reported."""
        return self._last_seen[: self.n_machines, : self.n_series]

    def machine_last_seen(self) -> np.ndarray:
        """Last second each machine reported anything."""
        return self._machine_last_seen[: self.n_machines]

    def take_events(self, up_to_sec: int) -> list[PendingEvent]:
        """Remove and return the pending events of seconds up to ``up_to_sec``."""
        ready = [e for e in self.events if math.floor(e.event.ts) <= up_to_sec]
        if ready:
            self.events = [e for e in self.events if math.floor(e.event.ts) > up_to_sec]
        return ready

    def columns_of(self, metric: str) -> tuple[np.ndarray, list[str]]:
        """Series indices of ``metric`` and their device names."""
        if self._columns_cache_size != len(self.series):
            self._columns_cache = {}
            self._columns_cache_size = len(self.series)
        cached = self._columns_cache.get(metric)
        if cached is None:
            cols = [i for i, (name, _) in enumerate(self.series) if name == metric]
            cached = (np.asarray(cols, dtype=np.int64), [self.series[i][1] for i in cols])
            self._columns_cache[metric] = cached
        return cached

    def metrics(self) -> Sequence[str]:
        """Metric names present, in first-seen order."""
        return list(dict.fromkeys(name for name, _ in self.series))


_MAX_CACHED_LAYOUTS = 65_536
"""Packed layouts whose series indices a window keeps (8 bytes per pair)."""
_MAX_CACHED_NAMED = 4_096
"""Sequences of sample names whose series indices a window keeps (their keys are large)."""


@dataclass(slots=True)
class _Group:
    """Samples of one second gathered from several batches (one entry per batch)."""

    sec: int
    machines: list[int] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)


_MAX_RUNS = 16
"""Runs of consecutive series above which :meth:`JobWindow.window` gathers with one index."""


def hold_forward(values: np.ndarray, step: int) -> np.ndarray:
    """``values`` (``[tick, ...]``) with each sample held for the ``step - 1`` ticks after it
    where nothing newer came, NaN beyond: a series sampled every ``step`` ticks (at its own
    offset) read at every tick."""
    if step <= 1:
        return values
    ticks = np.arange(values.shape[0]).reshape((-1,) + (1,) * (values.ndim - 1))
    seen = np.where(np.isfinite(values), ticks, -1)
    latest = np.maximum.accumulate(seen, axis=0)
    held = np.take_along_axis(values, np.clip(latest, 0, None), axis=0)
    return np.where((latest >= 0) & (ticks - latest < step), held, np.nan)


def _runs(cols: np.ndarray | None, k: int) -> list[tuple[int, int, int]] | None:
    """``cols`` (every series: ``None``) as runs of consecutive indices ``(lo, hi, at)``: series
    ``lo:hi`` go to ``at:at + hi - lo`` of the output; ``None`` for more than ``_MAX_RUNS``."""
    if cols is None:
        return [(0, k, 0)]
    if cols.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(cols) != 1) + 1
    if breaks.size >= _MAX_RUNS:
        return None
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), int(cols.size)]
    first = cols[starts].tolist()
    return [(lo, lo + (b - a), a) for lo, a, b in zip(first, starts, ends, strict=True)]


def _plane(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array as a flat view (writes go to ``array``)."""
    if not array.flags.c_contiguous:
        raise ValueError("window planes must be C-contiguous")
    return array.reshape(-1)


def _only_leave(batch: NodeBatch) -> bool:
    return all(e.kind is EventKind.LEAVE for e in batch.events)


def _grown(array: np.ndarray, shape: tuple[int, ...], fill: object) -> np.ndarray:
    """``array`` copied into a larger one of ``shape`` filled with ``fill``."""
    out = np.full(shape, fill, dtype=array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out
