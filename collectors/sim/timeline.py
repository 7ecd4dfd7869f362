"""The rhythm of one job: its sequence of phases (compute, wait, communication, checkpoint).

The whole job shares one timeline (data-parallel training is synchronous). It is built once per
job, step by step (a few hundred steps an hour), and then read vectorised: the time a machine
spent in each phase during any one-second interval is a difference of the phase's cumulative
time, a piecewise-linear function of time (``np.interp``), so a 1 Hz sample is the average over
its interval, as DCGM reports it, with phases partly overlapping seconds.

A step is an optional host-bound phase (``JobSpec.host_fraction``: the GPUs wait together while
the host prepares the next batch or runs an offloaded optimiser), compute, a wait for the slowest
rank, and communication.

Ranks slowed by a straggler injection get a :class:`RankPace` of their own: in a synchronous job
their steps are the job's (the job waits for the slowest) with a longer busy time and a shorter
wait in the collective; in an asynchronous one they run their own, longer steps and fall behind.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from collectors.sim.physics import N_PHASES, STEP_JITTER, Phase
from collectors.sim.scenario import JobSpec

EVAL_STEP_FACTOR = 0.4
EVAL_COMM_FRACTION = 0.08
EVAL_INTENSITY = 0.8


@dataclass(slots=True)
class JobEffects:
    """Job-wide consequences of the faults and confounders, as time intervals (seconds).

    Attributes
    ----------
    stalls
        ``(onset, end)``: from the next collective after ``onset`` the job makes no progress.
    comm_factors
        ``(start, end, factor)``: communication phases take ``factor`` times longer.
    stretches
        ``(start, end, factor)``: the slowest rank's compute takes ``factor`` times longer;
        the others wait for it (the extra time is a WAIT phase).
    data_waits
        ``(start, end, seconds)``: every step first waits this long for input data.
    evals
        ``(start, end)``: evaluation: short steps with little communication.
    compute_factors
        ``(start, end, factor)``: every rank's compute takes ``factor`` times longer.
    rank_slowdowns
        Ranks whose compute is slower than their peers' (stragglers); in a synchronous job each
        of their slow spans is a stretch too.
    step_stretches
        ``(start, end, factors)``: as ``stretches``, with a factor of its own for each step
        that starts in the span, in order (an intermittent straggler of a synchronous job).
    """

    stalls: list[tuple[float, float]] = field(default_factory=list)
    comm_factors: list[tuple[float, float, float]] = field(default_factory=list)
    stretches: list[tuple[float, float, float]] = field(default_factory=list)
    data_waits: list[tuple[float, float, float]] = field(default_factory=list)
    evals: list[tuple[float, float]] = field(default_factory=list)
    compute_factors: list[tuple[float, float, float]] = field(default_factory=list)
    rank_slowdowns: list[RankSlowdown] = field(default_factory=list)
    step_stretches: list[tuple[float, float, tuple[float, ...]]] = field(default_factory=list)

    def comm_factor_at(self, t: np.ndarray) -> np.ndarray:
        """Product of the communication slow-downs active at times ``t``."""
        out = np.ones(np.shape(t))
        for start, end, factor in self.comm_factors:
            out = np.where((t >= start) & (t < end), out * factor, out)
        return out

    def eval_at(self, t: np.ndarray) -> np.ndarray:
        """True where an evaluation phase is active."""
        out = np.zeros(np.shape(t), dtype=bool)
        for start, end in self.evals:
            out |= (t >= start) & (t < end)
        return out

    def conditions_at(self, t: float) -> tuple[float, float, float, bool, float]:
        """Communication factor, compute stretch, data wait, evaluation and compute factor at
        time ``t``."""
        comm = 1.0
        for start, end, factor in self.comm_factors:
            if start <= t < end:
                comm *= factor
        stretch = max((f for s, e, f in self.stretches if s <= t < e), default=1.0)
        data_wait = sum(w for s, e, w in self.data_waits if s <= t < e)
        evaluating = any(s <= t < e for s, e in self.evals)
        compute = 1.0
        for start, end, factor in self.compute_factors:
            if start <= t < end:
                compute *= factor
        return comm, stretch, data_wait, evaluating, compute

    def merged_stalls(self) -> list[tuple[float, float]]:
        """Stall intervals sorted and merged where they overlap."""
        out: list[tuple[float, float]] = []
        for start, end in sorted(self.stalls):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        return out


@dataclass(frozen=True, slots=True)
class RankSlowdown:
    """Ranks whose compute takes ``factor`` times longer during ``spans``.

    Attributes
    ----------
    machines, ranks
        Machine indices, and the local ranks slowed on each of them.
    spans
        ``(start, end)`` in which they are slow (``end`` may be ``inf``).
    factor
        How many times longer their compute (busy time) takes.
    step_factors
        When given, the factor of each of their steps that starts in a span, in order (read
        cyclically), instead of ``factor``.
    """

    machines: tuple[int, ...]
    ranks: tuple[int, ...]
    spans: tuple[tuple[float, float], ...]
    factor: float
    step_factors: tuple[float, ...] = ()

    def step_factor(self, index: int) -> float:
        """The factor of the ``index``-th step (from 0) that starts in the slow spans."""
        if not self.step_factors:
            return self.factor
        return self.step_factors[index % len(self.step_factors)]


@dataclass(frozen=True, slots=True)
class Timeline:
    """Phases and steps of one job between ``bounds[0]`` and ``bounds[-1]`` (scenario seconds).

    Attributes
    ----------
    bounds
        Segment boundaries, strictly increasing.
    cum
        ``cum[i, p]``: seconds spent in phase ``p`` before ``bounds[i]``.
    it_start, it_end
        Step start and completion times; ``inf`` for a step cut by a stall (never completed).
    it_compute, it_wait, it_comm
        Length of each step's phases.
    it_host
        Length of each step's host-bound phase (its first; zeros without ``host_fraction``).
    nominal_step_s, nominal_comm_s
        The undisturbed step and communication times.
    """

    bounds: np.ndarray
    cum: np.ndarray
    it_start: np.ndarray
    it_end: np.ndarray
    it_compute: np.ndarray
    it_wait: np.ndarray
    it_comm: np.ndarray
    nominal_step_s: float
    nominal_comm_s: float
    it_host: np.ndarray

    def phase_fractions(self, edges: np.ndarray) -> np.ndarray:
        """Fraction of each interval spent in each phase.

        Parameters
        ----------
        edges
            ``(T + 1, N)`` interval edges (each machine's own, skewed clock).

        Returns
        -------
        numpy.ndarray
            ``(T, N, N_PHASES)``, summing to 1 over the last axis.
        """
        out = np.empty((edges.shape[0] - 1, edges.shape[1], N_PHASES))
        for phase in range(N_PHASES):
            cumulative = np.interp(edges, self.bounds, self.cum[:, phase])
            out[:, :, phase] = np.diff(cumulative, axis=0)
        return out

    def _current(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        j = np.clip(np.searchsorted(self.it_start, t, side="right") - 1, 0, None)
        return j, self.it_end[j] <= t

    def step_seconds(self, t: np.ndarray) -> np.ndarray:
        """What a step probe reports at ``t``: the last step's duration, or the running step's
        elapsed time once that is longer (so a hung job shows a growing step time)."""
        return step_seconds_of(self.it_start, self.it_end, self.nominal_step_s, t)

    def collective_seconds(self, t: np.ndarray, waits: np.ndarray) -> np.ndarray:
        """Mean collective time of the last step at ``t``.

        ``waits`` (broadcastable to ``t``) is False for the rank that others wait for (its own
        collective does not include the wait).
        """
        j, done = self._current(t)
        with_wait = self.it_comm + self.it_wait
        complete = np.isfinite(self.it_end)
        last_with = _forward_fill_previous(np.where(complete, with_wait, np.inf), with_wait[0])
        last_own = _forward_fill_previous(
            np.where(complete, self.it_comm, np.inf), self.nominal_comm_s
        )
        entered = self.it_start + self.it_host + self.it_compute
        running_with = np.maximum(last_with[j], t - entered[j])
        running_own = np.maximum(last_own[j], t - entered[j] - self.it_wait[j])
        finished = np.where(waits, with_wait[j], self.it_comm[j])
        running = np.where(waits, running_with, running_own)
        return np.where(done, finished, running)


def step_seconds_of(
    starts: np.ndarray, ends: np.ndarray, nominal_s: float, t: np.ndarray
) -> np.ndarray:
    """The last step's duration at ``t`` of steps ``starts``/``ends`` (``inf``: never ended),
    or the running step's elapsed time once that is longer."""
    j = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, None)
    done = ends[j] <= t
    duration = ends - starts
    last_done = _forward_fill_previous(duration, nominal_s)
    running = np.maximum(last_done[j], t - starts[j])
    return np.where(done, duration[j], running)


class Completed:
    """The completed ones of a sequence of steps, to read per-step values at sample times.

    Parameters
    ----------
    ends
        ``(J,)`` completion time of each step, ``inf`` for a step that never completed; the
        finite ones increase.
    """

    def __init__(self, ends: np.ndarray) -> None:
        self.index = np.flatnonzero(np.isfinite(ends))
        self.ends = ends[self.index]

    def count(self, t: np.ndarray) -> np.ndarray:
        """Steps completed by ``t`` (any shape)."""
        return np.searchsorted(self.ends, t, side="right")

    def last(self, values: np.ndarray, t: np.ndarray) -> np.ndarray:
        """``values`` of the last step completed by ``t`` (of the first when none is)."""
        done = self.index[np.clip(self.count(t) - 1, 0, None)]
        return values[done]

    def interval_mean(self, values: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Mean of ``values`` over the steps completed in ``(t - 1, t]``, or the last value
        before when none did (a gauge holds it)."""
        cumulative = np.concatenate(([0.0], np.cumsum(values[self.index])))
        hi = self.count(t)
        lo = self.count(t - 1.0)
        held = self.last(values, t)
        steps = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (cumulative[hi] - cumulative[lo]) / steps
        return np.where(steps > 0, mean, held)


@dataclass(frozen=True, slots=True)
class RankPace:
    """The steps of some ranks slowed alike (one or several overlapping slowdowns).

    Attributes
    ----------
    cells
        ``(N, G)`` the ranks (machine, local rank).
    shared
        Synchronous job: their steps start and end with the job's; else their own.
    start, end
        ``(J,)`` when they start and complete each step (``inf``: never).
    busy
        ``(J,)`` their busy time (compute) of each step.
    collective
        ``(J,)`` their time in blocking collectives of each step (``inf`` for a step never
        completed).
    """

    cells: np.ndarray
    shared: bool
    start: np.ndarray
    end: np.ndarray
    busy: np.ndarray
    collective: np.ndarray

    @property
    def completed(self) -> Completed:
        """Their completed steps."""
        return Completed(self.end)


def build_paces(
    timeline: Timeline, effects: JobEffects, machines: int, gpus: int, sync: bool
) -> tuple[RankPace, ...]:
    """A :class:`RankPace` for each set of ranks hit by the same ``effects.rank_slowdowns``.

    A rank's compute factor at a time is the largest of the slowdowns acting on it then. In a
    synchronous job (``sync``) the timeline's steps already last as long as the slowest rank's
    compute (the slow spans are stretches): each slowed rank's step is the job's, its busy time
    its own compute, its collective the rest of the step. Otherwise each slowed rank's step
    ``j`` takes its extra compute longer than the job's and starts when its previous one ended
    (as many seconds behind the job as it lost so far), so its step numbers fall behind.
    """
    slowdowns = effects.rank_slowdowns
    if not slowdowns:
        return ()
    masks = np.zeros((len(slowdowns), machines, gpus), dtype=bool)
    for k, slowdown in enumerate(slowdowns):
        masks[k][np.ix_(list(slowdown.machines), list(slowdown.ranks))] = True
    keys = masks.reshape(len(slowdowns), -1).T
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    paces = []
    for u, key in enumerate(unique):
        if not key.any():
            continue
        cells = (inverse == u).reshape(machines, gpus)
        acting = [slowdowns[k] for k in np.flatnonzero(key)]
        steady = [sd for sd in acting if not sd.step_factors]
        stepwise = [sd for sd in acting if sd.step_factors]
        edges, factors = _piecewise(steady)
        paces.append(_pace(timeline, cells, edges, factors, sync, stepwise))
    return tuple(paces)


def _piecewise(slowdowns: list[RankSlowdown]) -> tuple[np.ndarray, np.ndarray]:
    """``(edges, factors)``: the compute factor is ``factors[searchsorted(edges, t, 'right')]``
    (1 before the first edge), the largest factor of the spans holding ``t``."""
    edges = np.array(sorted({x for sd in slowdowns for span in sd.spans for x in span}))
    if not len(edges):
        return np.array([np.inf]), np.ones(2)
    factors = np.ones(len(edges) + 1)
    for k in range(len(edges)):
        t = edges[k]
        active = [sd.factor for sd in slowdowns for s, e in sd.spans if s <= t < e]
        factors[k + 1] = max(active, default=1.0)
    return edges, factors


def _in_spans(spans: tuple[tuple[float, float], ...], t: np.ndarray) -> np.ndarray:
    out = np.zeros(np.shape(t), dtype=bool)
    for start, end in spans:
        out |= (t >= start) & (t < end)
    return out


def _pace(
    timeline: Timeline,
    cells: np.ndarray,
    edges: np.ndarray,
    factors: np.ndarray,
    sync: bool,
    stepwise: list[RankSlowdown] | None = None,
) -> RankPace:
    """The steps of the ranks ``cells``: compute factors from the steady slowdowns
    (``edges``/``factors``, by time) and the ``stepwise`` ones (a factor per step started in
    their spans), the largest at each step."""
    stepwise = stepwise or []
    compute = timeline.it_compute
    if sync:
        factor = factors[np.searchsorted(edges, timeline.it_start, side="right")]
        for sd in stepwise:
            inside = _in_spans(sd.spans, timeline.it_start)
            order = np.cumsum(inside) - 1
            own = np.asarray(sd.step_factors)[np.maximum(order, 0) % len(sd.step_factors)]
            factor = np.where(inside, np.maximum(factor, own), factor)
        busy = compute * factor
        start, end = timeline.it_start, timeline.it_end
        complete = np.isfinite(end)
        collective = np.where(complete, end - start - busy, np.inf)
        return RankPace(cells, True, start, end, busy, np.maximum(collective, 0.0))
    edge_list, factor_list = edges.tolist(), factors.tolist()
    starts: list[float] = []
    busies: list[float] = []
    lag = 0.0
    counts = [0] * len(stepwise)
    # Sequential: whether a step is slow depends on when this rank, behind the job, starts it.
    for begin, own in zip(timeline.it_start.tolist(), compute.tolist(), strict=True):
        at = begin + lag
        step_factor = factor_list[bisect.bisect_right(edge_list, at)]
        for k, sd in enumerate(stepwise):
            if any(s <= at < e for s, e in sd.spans):
                step_factor = max(step_factor, sd.step_factor(counts[k]))
                counts[k] += 1
        took = own * step_factor
        starts.append(at)
        busies.append(took)
        lag += took - own
    start, busy = np.asarray(starts), np.asarray(busies)
    end = timeline.it_end + (start - timeline.it_start) + (busy - compute)
    collective = np.where(np.isfinite(end), timeline.it_comm + timeline.it_wait, np.inf)
    return RankPace(cells, False, start, end, busy, collective)


class _Conditions:
    """``JobEffects.conditions_at``, recomputed only when ``t`` crosses an effect boundary."""

    def __init__(self, effects: JobEffects) -> None:
        self._effects = effects
        edges = {s for s, _, _ in effects.comm_factors} | {e for _, e, _ in effects.comm_factors}
        for start, end, _ in effects.stretches + effects.data_waits + effects.compute_factors:
            edges |= {start, end}
        for start, end in effects.evals:
            edges |= {start, end}
        self._edges = np.array([*sorted(edges), np.inf])
        self._span = (np.inf, -np.inf)
        self._value = effects.conditions_at(0.0)

    def at(self, t: float) -> tuple[float, float, float, bool, float]:
        lo, hi = self._span
        if not lo <= t < hi:
            i = int(np.searchsorted(self._edges, t, side="right"))
            self._span = (self._edges[i - 1] if i else -np.inf, self._edges[i])
            self._value = self._effects.conditions_at(t)
        return self._value


class _Jitter:
    """Per-step jitter factors of the compute and communication phases, drawn in blocks."""

    def __init__(self, rng: np.random.Generator, scale: float) -> None:
        self._rng = rng
        self._scale = scale
        self._block: list[list[float]] = []
        self._next = 0

    def next(self) -> list[float]:
        if self._next == len(self._block):
            # Python floats: numpy scalars would make the step loop three times slower.
            self._block = (1.0 + self._scale * self._rng.standard_normal((4096, 2))).tolist()
            self._next = 0
        self._next += 1
        return self._block[self._next - 1]


def _forward_fill_previous(values: np.ndarray, initial: float) -> np.ndarray:
    """``out[j]``: the last finite ``values[i]`` with ``i < j`` (``initial`` when none)."""
    shifted = np.concatenate(([initial], values[:-1]))
    finite = np.isfinite(shifted)
    index = np.where(finite, np.arange(len(shifted)), 0)
    np.maximum.accumulate(index, out=index)
    filled = shifted[index]
    return np.where(np.isfinite(filled), filled, initial)


def build_timeline(
    job: JobSpec,
    effects: JobEffects,
    t_begin: float,
    t_end: float,
    rng: np.random.Generator,
    noise: float,
) -> Timeline:
    """Lay out the job's steps, checkpoints and stalls from ``t_begin`` to past ``t_end``.

    A step's host-bound phase (``host_fraction``) comes first. A stall whose onset falls in a
    host or compute phase bites when that step's communication would start (healthy machines
    finish computing first); one that falls in communication or a
    checkpoint bites at once. Checkpoints start at the first step boundary after each multiple
    of ``checkpoint_every_s``.
    """
    bounds = [t_begin]
    phases: list[int] = []
    starts: list[float] = []
    ends: list[float] = []
    computes: list[float] = []
    waits: list[float] = []
    comms: list[float] = []
    hosts: list[float] = []
    stalls = effects.merged_stalls()
    next_stall = 0
    every = job.checkpoint_every_s
    next_checkpoint = every if every is not None else math.inf

    def add(phase: Phase, length: float) -> None:
        if length > 1e-6:  # keeps bounds strictly increasing
            phases.append(phase)
            bounds.append(bounds[-1] + length)

    conditions = _Conditions(effects)
    jitter = _Jitter(rng, STEP_JITTER * noise)
    step_stretches = effects.step_stretches
    started = [0] * len(step_stretches)  # steps started in each step stretch so far
    t = t_begin
    while t < t_end:
        while next_stall < len(stalls) and stalls[next_stall][1] <= t:
            next_stall += 1
        stall = stalls[next_stall] if next_stall < len(stalls) else (math.inf, math.inf)
        if stall[0] <= t:
            resume = min(stall[1], t_end)  # a stall that never clears ends the timeline
            add(Phase.WAIT, resume - t)
            t = resume
            next_stall += 1
            continue
        if t >= next_checkpoint:
            length = min(job.checkpoint_duration_s, stall[0] - t)
            add(Phase.CHECKPOINT, length)
            t += length
            while next_checkpoint <= t:
                next_checkpoint += every if every is not None else math.inf
            continue
        comm_factor, stretch, data_wait, evaluating, compute_factor = conditions.at(t)
        step = job.step_time_s * (EVAL_STEP_FACTOR if evaluating else 1.0)
        comm_fraction = EVAL_COMM_FRACTION if evaluating else job.comm_fraction
        draws = jitter.next()
        # host_fraction 0 leaves (1 - comm_fraction) exactly as it was: the same floats.
        compute = step * (1.0 - comm_fraction - job.host_fraction) * max(draws[0], 0.5)
        host = step * job.host_fraction * max(draws[0], 0.5)
        if compute_factor != 1.0:
            compute *= compute_factor
        for k, (s_start, s_end, factors) in enumerate(step_stretches):
            if s_start <= t < s_end:
                stretch = max(stretch, factors[started[k] % len(factors)])
                started[k] += 1
        wait = compute * (stretch - 1.0) + data_wait
        comm = step * comm_fraction * comm_factor * max(draws[1], 0.5)
        starts.append(t)
        computes.append(compute)
        waits.append(wait)
        comms.append(comm)
        hosts.append(host)
        comm_start = t + host + compute + wait
        if stall[0] < comm_start + comm:
            hang = max(stall[0], comm_start)
            if hang < stall[1]:
                add(Phase.HOST, host)
                add(Phase.COMPUTE, compute)
                add(Phase.WAIT, wait)
                add(Phase.COMM, hang - comm_start)
                resume = min(stall[1], t_end)
                add(Phase.WAIT, resume - hang)
                ends.append(math.inf)
                t = resume
                next_stall += 1
                continue
            next_stall += 1  # over before it could bite
        add(Phase.HOST, host)
        add(Phase.COMPUTE, compute)
        add(Phase.WAIT, wait)
        add(Phase.COMM, comm)
        t = comm_start + comm
        ends.append(t)
    edges = np.asarray(bounds)
    lengths = np.diff(edges)
    phase_of = np.asarray(phases, dtype=np.int64)
    cum = np.zeros((len(edges), N_PHASES))
    for phase in range(N_PHASES):
        cum[1:, phase] = np.cumsum(np.where(phase_of == phase, lengths, 0.0))
    return Timeline(
        bounds=edges,
        cum=cum,
        it_start=np.asarray(starts),
        it_end=np.asarray(ends),
        it_compute=np.asarray(computes),
        it_wait=np.asarray(waits),
        it_comm=np.asarray(comms),
        nominal_step_s=job.step_time_s,
        nominal_comm_s=job.step_time_s * job.comm_fraction,
        it_host=np.asarray(hosts),
    )
