"""What every node-agent source shares: its output, its problem log and counter-to-rate state.

A source follows prometheus client_python's collector shape (docs/architecture.md §5):
``collect(now)`` returns what it read this interval, keeps no hidden state beyond what a rate needs,
and yields nothing (logging why, once) when its source is absent. A source never raises for bad
input on the node: it records a *problem* (counted per reason, logged once per reason) and goes on.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from minder.core.records import Event, Sample

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Collected:
    """What one source read in one interval."""

    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def add(self, metric: str, device: str, value: float) -> None:
        """Append one canonical sample (non-finite values are the caller's bug: refused)."""
        if not math.isfinite(value):
            raise ValueError(f"{metric}/{device} value is {value!r}: expected a finite number")
        self.samples.append((metric, device, float(value)))

    def extend(self, other: Collected) -> None:
        """Append another source's output."""
        self.samples.extend(other.samples)
        self.events.extend(other.events)


class ProblemLog:
    """Counts a source's problems by reason and logs each reason once, not once per second.

    Parameters
    ----------
    source
        Name of the source, used in log lines and as the agent's metric label.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.counts: Counter[str] = Counter()
        self._logged: set[str] = set()

    def report(self, reason: str, detail: str) -> None:
        """Record one problem; the first of each ``reason`` is logged with its ``detail``.

        ``reason`` is a short, bounded class (``unreadable``, ``not_numeric``, ``timeout`` …):
        it becomes a Prometheus label value, so it must not carry paths or values.
        """
        self.counts[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning(
                "source %s: %s (%s); further %s problems are counted, not logged",
                self.source,
                detail,
                reason,
                reason,
            )

    @property
    def total(self) -> int:
        """Problems seen since start."""
        return sum(self.counts.values())


@runtime_checkable
class Source(Protocol):
    """One source of the node agent."""

    name: str
    """Short name (``nvml``, ``dcgm``, ``rdma``, ``ethtool``, ``host``, ``nccl``, ``probe``)."""
    problems: ProblemLog

    def collect(self, now: float) -> Collected:
        """Read the source at ``now`` (unix seconds); never raises for bad input on the node."""
        ...

    def close(self) -> None:
        """Release handles, sockets and threads."""
        ...


class CounterRates:
    """Turns monotonically increasing counters into per-second rates and interval deltas.

    The first reading of a counter only primes it (no rate yet). A counter that goes backwards
    was reset (driver reload, agent restart, 32-bit wrap): that interval yields no value rather
    than a negative or huge one, and the reset is reported to ``problems`` as ``counter_reset``.

    Each reading is timestamped by ``clock`` at the moment it is handed in, not with the batch
    time: the agent runs its sources one after another, so a source that is slow one interval
    (a hung command, a slow scrape) would otherwise shift every later source's reading against
    the batch time and skew its rate by the delay.

    Parameters
    ----------
    problems
        Where counter resets are reported (None: not reported).
    clock
        Seconds on a monotonic scale, read at each reading without an explicit ``at``; tests
        inject a manual clock to make elapsed time deterministic.
    """

    def __init__(
        self,
        problems: ProblemLog | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._last: dict[tuple[str, ...], tuple[float, float]] = {}
        self._problems = problems
        self._clock = clock

    def delta(
        self, key: tuple[str, ...], value: float, *, at: float | None = None
    ) -> tuple[float, float] | None:
        """``(increase, seconds)`` since the previous reading of ``key``, or None.

        ``at`` is the reading's time on the ``clock``'s scale (default: ``clock()`` now).
        """
        now = self._clock() if at is None else at
        previous = self._last.get(key)
        self._last[key] = (value, now)
        if previous is None:
            return None
        last_value, last_ts = previous
        elapsed = now - last_ts
        if elapsed <= 0:
            return None
        if value < last_value:
            if self._problems is not None:
                self._problems.report("counter_reset", f"counter {'/'.join(key)} went backwards")
            return None
        return value - last_value, elapsed

    def rate(self, key: tuple[str, ...], value: float, *, at: float | None = None) -> float | None:
        """Per-second increase of ``key`` since its previous reading, or None."""
        step = self.delta(key, value, at=at)
        return None if step is None else step[0] / step[1]

    def count(self, key: tuple[str, ...], value: float, *, at: float | None = None) -> float | None:
        """Increase of ``key`` during the interval (for ``_count`` metrics), or None."""
        step = self.delta(key, value, at=at)
        return None if step is None else step[0]

    def forget(self, keep: set[tuple[str, ...]]) -> None:
        """Drop counters not in ``keep`` (a device that disappeared)."""
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]
