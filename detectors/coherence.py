"""Whether a job's machines are peers on a metric at all (docs/detection-method.md §10).

Peer similarity rests on one assumption: the machines of a job behave alike, so a machine that
differs for minutes is faulty, and faults are rare. A serving fleet of mixed load, or a job of
undeclared mixed roles, breaks it: a busy pod among idle ones is not faulty, yet it is an
outlier on every activity metric, and a different pod tomorrow. Alerting there is noise.

What we measure, per job and metric, over a rolling horizon: the *distinct* machines that were
outliers (|z| above the alert threshold for two evaluations in a row) at some moment. In a job of
peers that is the faulty machines only: about two faults a day per job, a handful over the
horizon. In a fleet that is not alike, the outliers rotate and their number grows with the
fleet. Most of one ``domain`` (a switch, a rack) outlying together counts once: a domain fault is
one fault. The measured *coherence* is the share of the job's machines that
stayed with their peers over the horizon, ``1 - distinct / machines``.

A metric is not peer-comparable while the distinct outliers exceed the allowance
``max(min_outliers, share x machines)``; it is comparable again once they fall to half of it
(hysteresis, so the verdict does not flap at the edge). While a metric is not peer-comparable
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
    """Distinct outlying machines (a domain's together count once) over the horizon."""
    allowance: int
    machines: int
    since_sec: int
    """When the current verdict began (unix second)."""


class PeerCoherence:
    """Per metric, how many distinct machines of a job were outliers over a rolling horizon.

    Parameters
    ----------
    share, min_outliers
        The allowance of distinct outliers: ``max(min_outliers, ceil(share x machines))``.
    horizon_ticks
        How many evaluations back an outlier still counts.
    domain_share, domain_min
        Outliers of one domain count once when they are at least this share (and this count) of
        its machines, as the domain rules judge a domain's fault.
    """

    def __init__(
        self,
        share: float,
        min_outliers: int,
        horizon_ticks: int,
        domain_share: float = 0.5,
        domain_min: int = 2,
    ) -> None:
        if not 0 < share < 1 or min_outliers < 1 or horizon_ticks < 1:
            raise ValueError(
                f"share={share!r}, min_outliers={min_outliers!r}, horizon_ticks={horizon_ticks!r}:"
                " expected 0 < share < 1 and positive counts"
            )
        self.share = share
        self.domain_share = domain_share
        self.domain_min = domain_min
        self.min_outliers = min_outliers
        self.horizon_ticks = horizon_ticks
        self._machine_tick: dict[str, np.ndarray] = {}
        self._domain_tick: dict[str, np.ndarray] = {}
        self._previous: dict[str, np.ndarray] = {}
        self._states: dict[str, CoherenceState] = {}

    def allowance(self, machines: int) -> int:
        """Distinct outliers a job of ``machines`` peers may have over the horizon."""
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
        domains: np.ndarray,
        tick: int,
        sec: int,
    ) -> CoherenceState | None:
        """Take one evaluation of ``metric``; return its state when the verdict changed.

        ``absz`` is each machine's |z| (NaN: not scored), ``scored`` the machines in the job
        and scored, ``domains`` each machine's domain code (-1: none).
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
        machine_tick = _sized(self._machine_tick, metric, n)
        n_domains = int(domains.max()) + 1 if domains.size else 0
        domain_tick = _sized(self._domain_tick, metric, n_domains)
        if lasting.size:
            codes = domains[lasting]
            alone = lasting
            if n_domains:
                # Most of a domain (as the domain rules count it), not any two of its machines:
                # a fleet's busy machines spread over its switches are no switch's fault.
                size = np.bincount(
                    domains[:n][scored[:n] & (domains[:n] >= 0)], minlength=n_domains
                )
                needed = np.maximum(self.domain_min, np.ceil(self.domain_share * size))
                together = np.bincount(codes[codes >= 0], minlength=n_domains) >= needed
                domain_tick[: together.size][together] = tick
                alone = lasting[(codes < 0) | ~together[np.clip(codes, 0, None)]]
            machine_tick[alone] = tick
        oldest = tick - self.horizon_ticks
        outliers = int((machine_tick > oldest).sum() + (domain_tick > oldest).sum())
        machines = int(scored[:n].sum())
        allowance = self.allowance(machines)
        before = self._states.get(metric)
        was = True if before is None else before.comparable
        now_comparable = outliers <= (allowance // 2 if not was else allowance)
        coherence = 1.0 - outliers / machines if machines else 1.0
        changed = before is None or now_comparable != was
        state = CoherenceState(
            metric=metric,
            comparable=now_comparable,
            coherence=round(max(coherence, 0.0), 4),
            outliers=outliers,
            allowance=allowance,
            machines=machines,
            since_sec=sec if changed or before is None else before.since_sec,
        )
        self._states[metric] = state
        if before is None:
            return state if not now_comparable else None
        return state if changed else None


def _sized(store: dict[str, np.ndarray], metric: str, n: int) -> np.ndarray:
    """``store[metric]`` grown to ``n`` entries (new ones never seen)."""
    current = store.get(metric)
    if current is None or current.shape[0] < n:
        grown = np.full(n, np.iinfo(np.int64).min // 2, dtype=np.int64)
        if current is not None:
            grown[: current.shape[0]] = current
        store[metric] = grown
        current = grown
    return current
