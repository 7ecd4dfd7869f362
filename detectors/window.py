"""Per-job sliding window of the newest seconds: machine × series ring buffer.

A *series* is one ``(metric, device)`` pair. Samples are bucketed by whole second (``floor(ts)``);
the buffer keeps the newest ``horizon_s`` seconds, so detection never re-scans history.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from minder.core.metrics import METRICS, MetricSpec
from minder.core.records import Event, NodeBatch

logger = logging.getLogger(__name__)

NEVER = -(2**62)
"""``last_seen`` value of something never seen."""


@dataclass(slots=True)
class MachineInfo:
    """What the window knows of one machine."""

    name: str
    group: str = ""
    domain: str = ""


@dataclass(slots=True)
class WindowStats:
    """Counts of samples the window could not place (reported, never silently lost)."""

    samples: int = 0
    too_old: int = 0
    events: int = 0


@dataclass(slots=True)
class PendingEvent:
    """An event waiting for the detector, with the machine that sent it."""

    machine: int
    event: Event


class JobWindow:
    """Ring buffer of one job's newest seconds.

    Parameters
    ----------
    job
        Job id.
    horizon_s
        Seconds kept; must cover the detection window and the silence rule's look-back.
    """

    def __init__(self, job: str, horizon_s: int = 64) -> None:
        if horizon_s < 2:
            raise ValueError(f"horizon_s is {horizon_s!r}: expected at least 2 seconds")
        self.job = job
        self.horizon_s = horizon_s
        self.machines: list[MachineInfo] = []
        self.machine_index: dict[str, int] = {}
        self.series: list[tuple[str, str]] = []
        self.series_index: dict[tuple[str, str], int] = {}
        self.series_spec: list[MetricSpec] = []
        self._values = np.full((horizon_s, 0, 0), np.nan, dtype=np.float32)
        self._slot_sec = np.full(horizon_s, NEVER, dtype=np.int64)
        self._last_seen = np.full((0, 0), NEVER, dtype=np.int64)
        self._machine_last_seen = np.full(0, NEVER, dtype=np.int64)
        self.newest_sec = NEVER
        self.stats = WindowStats()
        self.events: list[PendingEvent] = []
        # Column indices of each node's sample list, keyed by the tuple of names it sends: a node
        # sends the same names every second, so the per-sample dictionary work happens once.
        self._layout_cache: dict[tuple[tuple[str, str], ...], np.ndarray] = {}
        self._columns_cache: dict[str, tuple[np.ndarray, list[str]]] = {}
        self._columns_cache_size = 0

    # -- registries -------------------------------------------------------------------------
    @property
    def n_machines(self) -> int:
        return len(self.machines)

    @property
    def n_series(self) -> int:
        return len(self.series)

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
        return idx

    def _grow(self, machines: int | None = None, series: int | None = None) -> None:
        m_now, k_now = self._values.shape[1], self._values.shape[2]
        m_need = max(m_now, machines or 0)
        k_need = max(k_now, series or 0)
        if m_need <= m_now and k_need <= k_now:
            return
        # Grow by doubling so registering many machines costs amortised O(1) copies.
        m_cap = m_now if m_need <= m_now else max(m_need, 2 * m_now, 8)
        k_cap = k_now if k_need <= k_now else max(k_need, 2 * k_now, 16)
        values = np.full((self.horizon_s, m_cap, k_cap), np.nan, dtype=np.float32)
        values[:, :m_now, :k_now] = self._values
        last_seen = np.full((m_cap, k_cap), NEVER, dtype=np.int64)
        last_seen[:m_now, :k_now] = self._last_seen
        machine_last = np.full(m_cap, NEVER, dtype=np.int64)
        machine_last[:m_now] = self._machine_last_seen
        self._values, self._last_seen, self._machine_last_seen = values, last_seen, machine_last

    # -- ingest -----------------------------------------------------------------------------
    def _slot(self, sec: int) -> int | None:
        """Slot of ``sec``, clearing a slot that still holds an older second; None if too old."""
        if self.newest_sec != NEVER and sec <= self.newest_sec - self.horizon_s:
            return None
        slot = sec % self.horizon_s
        if self._slot_sec[slot] != sec:
            self._values[slot] = np.nan
            self._slot_sec[slot] = sec
        self.newest_sec = max(self.newest_sec, sec)
        return slot

    def add_batch(self, batch: NodeBatch) -> None:
        """Place one node batch (samples and events) in the window."""
        sec = math.floor(batch.ts)
        m = self.machine_id(batch.node, batch.group, batch.domain)
        for event in batch.events:
            self.events.append(PendingEvent(m, event))
        self.stats.events += len(batch.events)
        if not batch.samples:
            self._mark_machine(m, sec)
            return
        layout_key = tuple((name, dev) for name, dev, _ in batch.samples)
        cols = self._layout_cache.get(layout_key)
        if cols is None:
            cols = np.fromiter(
                (self.series_id(name, dev) for name, dev in layout_key),
                dtype=np.int64,
                count=len(layout_key),
            )
            if len(self._layout_cache) < 4096:
                self._layout_cache[layout_key] = cols
        values = np.fromiter((s[2] for s in batch.samples), dtype=np.float32, count=len(cols))
        self.add_arrays(sec, np.full(len(cols), m), cols, values)

    def _mark_machine(self, m: int, sec: int) -> None:
        self._machine_last_seen[m] = max(self._machine_last_seen[m], sec)

    def add_arrays(
        self, sec: int, machines: np.ndarray, cols: np.ndarray, values: np.ndarray
    ) -> int:
        """Place samples of one second given as parallel index arrays; returns how many fit."""
        self.stats.samples += len(values)
        slot = self._slot(sec)
        if slot is None:
            self.stats.too_old += len(values)
            return 0
        self._values[slot, machines, cols] = values
        last = self._last_seen[machines, cols]
        self._last_seen[machines, cols] = np.maximum(last, sec)
        np.maximum.at(self._machine_last_seen, machines, sec)
        return len(values)

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
        """Values of seconds ``end_sec-length+1 … end_sec`` as ``[length, machines, series]``.

        ``cols`` restricts the series (and the copy) to those indices. Seconds the buffer no
        longer (or never) held are all-NaN.
        """
        length = min(length, self.horizon_s)
        m, k = self.n_machines, self.n_series
        secs = np.arange(end_sec - length + 1, end_sec + 1)
        slots = secs % self.horizon_s
        if cols is None:
            out = self._values[slots, :m, :k].copy()
        else:
            out = self._values[slots[:, None], :m, cols[None, :]].transpose(0, 2, 1).copy()
        stale = self._slot_sec[slots] != secs
        out[stale] = np.nan
        return out

    def at(self, sec: int) -> np.ndarray:
        """Values of one second as ``[machines, series]`` (NaN where absent)."""
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
