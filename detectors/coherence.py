"""Whether a job's machines are peers on a metric at all (docs/detection-method.md §10).

Peer similarity rests on one assumption: the machines of a job behave alike, so a machine that
differs for minutes is faulty, and faults are rare. A serving fleet of mixed load, or a job of
undeclared mixed roles, breaks it: a busy pod among idle ones is not faulty, yet it is an
outlier on every activity metric, and a different pod tomorrow. Alerting there is noise.

What we measure, per job and metric, over a rolling horizon: the distinct outlier *events*,
machines becoming outliers (|z| above the alert threshold for two evaluations in a row) for the
first time in the horizon, those that do within a few evaluations of each other counting as one
event (machines that fail together, a switch, a bad batch, are one fault). In a job of peers
that is its faults: about two a day per job, a handful over the horizon. In a fleet that is not
alike the outliers rotate, each at its own moment, and their number grows with the fleet. The
measured *coherence* is the share of the job's machines that stayed with their peers over the
horizon, ``1 - outlying machines / machines``.

A metric is not peer-comparable while the events exceed the allowance
``max(min_outliers, share x machines)``, or while more than a quarter of the machines (and more
than the allowance) are outliers at once (no fault takes that many apart from the median of the
rest); it is comparable again once the events fall to half the allowance (hysteresis, so the
verdict does not flap at the edge). While a metric is not peer-comparable
its similarity findings are dropped, and the job carries one finding that says so, naming the
metric and its coherence; hard-fault rules, silence and straggler detection are untouched.

The measure is invariant to what the scores are invariant to (renaming, reordering, common
factors and shifts, units): it only counts which machines the scorer found outlying.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoherenceState:
    """One metric's verdict at the last evaluation."""

    metric: str
    comparable: bool
    coherence: float
    """Share of the job's machines that stayed with their peers over the horizon."""
    outliers: int
    """Distinct outlier events over the horizon (machines outlying together count once)."""
    allowance: int
    machines: int
    since_sec: int
    """When the current verdict began (unix second)."""


class PeerCoherence:
    """Per metric, the distinct outlier events of a job over a rolling horizon.

    Parameters
    ----------
    share, min_outliers
        The allowance of distinct outlier events: ``max(min_outliers, ceil(share x machines))``.
    horizon_ticks
        How many evaluations back an outlier still counts.
    spread_ticks
        Machines that become outliers within this many evaluations of an event's first one
        join that event: machines that fail together (a switch, a bad batch, a cooling row)
        are one fault.
    at_once
        More than this share of the machines outlying at one evaluation is not peer-comparable
        at once: no fault takes that many machines apart from a median of the rest.
    """

    def __init__(
        self,
        share: float,
        min_outliers: int,
        horizon_ticks: int,
        spread_ticks: int = 3,
        at_once: float = 0.25,
    ) -> None:
        if (
            not 0 < share < 1
            or not 0 < at_once < 1
            or min(min_outliers, horizon_ticks, spread_ticks) < 1
        ):
            raise ValueError(
                f"share={share!r}, at_once={at_once!r}, min_outliers={min_outliers!r}, "
                f"horizon_ticks={horizon_ticks!r}, spread_ticks={spread_ticks!r}: expected "
                "0 < share, at_once < 1 and positive counts"
            )
        self.share = share
        self.at_once = at_once
        self.min_outliers = min_outliers
        self.horizon_ticks = horizon_ticks
        self.spread_ticks = spread_ticks
        self._machine_tick: dict[str, np.ndarray] = {}
        self._machine_event: dict[str, np.ndarray] = {}
        self._first_scored: dict[str, np.ndarray] = {}
        self._event: dict[str, tuple[int, int]] = {}
        """Per metric: the latest event's id and first tick."""
        self._ids: dict[str, int] = {}
        self._previous: dict[str, np.ndarray] = {}
        self._states: dict[str, CoherenceState] = {}

    def allowance(self, machines: int) -> int:
        """Distinct outlier events a job of ``machines`` peers may have over the horizon."""
        return max(self.min_outliers, math.ceil(self.share * machines))

    def states(self) -> list[CoherenceState]:
        """The latest verdict of every metric seen, by metric name."""
        return [self._states[m] for m in sorted(self._states)]

    def comparable(self, metric: str) -> bool:
        """False while ``metric`` is not peer-comparable (unknown metrics are)."""
        state = self._states.get(metric)
        return state is None or state.comparable

    def reset(self) -> None:
        """Forget every run (a gap in the data, or a new sampling interval)."""
        self._previous.clear()

    def update(
        self,
        metric: str,
        absz: np.ndarray,
        threshold: float,
        scored: np.ndarray,
        tick: int,
        sec: int,
    ) -> CoherenceState | None:
        """Take one evaluation of ``metric``; return its state when the verdict changed.

        ``absz`` is each machine's |z| (NaN: not scored), ``scored`` the machines in the job
        and scored.
        """
        n = absz.shape[0]
        above = np.isfinite(absz) & (absz > threshold) & scored[:n]
        previous = self._previous.get(metric)
        if previous is None or previous.shape[0] != n:
            grown = np.zeros(n, dtype=bool)
            if previous is not None:
                grown[: min(n, previous.shape[0])] = previous[:n]
            previous = grown
        self._previous[metric] = above
        lasting = np.flatnonzero(above & previous)
        machine_tick = _sized(self._machine_tick, metric, n, _NEVER)
        machine_event = _sized(self._machine_event, metric, n, -1)
        first_scored = _sized(self._first_scored, metric, n, _NEVER)
        first_scored[: scored.shape[0]][(first_scored[:n] == _NEVER) & scored[:n]] = tick
        oldest = tick - self.horizon_ticks
        new = lasting[machine_tick[lasting] <= oldest]
        if new.size:
            next_id = self._ids.get(metric, 0)
            event, first = self._event.get(metric, (-1, _NEVER))
            # Apart from its first evaluations on: a role of its own, not a fault that struck
            # it; machines of other roles are not one event however together they started.
            young = tick - first_scored[new] <= self.spread_ticks + 1
            born, struck = new[young], new[~young]
            if struck.size:
                if tick - first > self.spread_ticks:
                    event, first, next_id = next_id, tick, next_id + 1
                    self._event[metric] = (event, first)
                machine_event[struck] = event
            machine_event[born] = next_id + np.arange(born.size)
            self._ids[metric] = next_id + born.size
        machine_tick[lasting] = tick
        recent = machine_tick > oldest
        events = int(np.unique(machine_event[recent]).size)
        outlying = int(recent.sum())
        machines = int(scored[:n].sum())
        allowance = self.allowance(machines)
        crowd = lasting.size > max(allowance, math.ceil(self.at_once * machines))
        before = self._states.get(metric)
        was = True if before is None else before.comparable
        now_comparable = not crowd and events <= (allowance // 2 if not was else allowance)
        coherence = 1.0 - outlying / machines if machines else 1.0
        changed = before is None or now_comparable != was
        state = CoherenceState(
            metric=metric,
            comparable=now_comparable,
            coherence=round(max(coherence, 0.0), 4),
            outliers=events,
            allowance=allowance,
            machines=machines,
            since_sec=sec if changed or before is None else before.since_sec,
        )
        self._states[metric] = state
        if before is None:
            return state if not now_comparable else None
        return state if changed else None


_NEVER = np.iinfo(np.int64).min // 2


def _sized(store: dict[str, np.ndarray], metric: str, n: int, fill: int) -> np.ndarray:
    """``store[metric]`` grown to ``n`` entries (new ones ``fill``)."""
    current = store.get(metric)
    if current is None or current.shape[0] < n:
        grown = np.full(n, fill, dtype=np.int64)
        if current is not None:
            grown[: current.shape[0]] = current
        store[metric] = grown
        current = grown
    return current
