"""Generate one chunk of seconds of one job: every machine's samples, gaps and events.

Chunks are fixed, aligned blocks of CHUNK_S seconds, each with its own random stream, so the
offline table (all chunks) and the real-time stream (one chunk at a time) hold the same values.
Each chunk is computed over a look-back of THERMAL_WINDOW_S extra seconds for the temperature's
thermal inertia; no state passes between chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectors.sim.contexts import PlannedEvent, SignalContext, StateContext
from collectors.sim.faults import apply_signals, apply_states
from collectors.sim.physics import (
    DEFAULT_STATE_OF_PHASE,
    N_PHASES,
    N_STATES,
    THERMAL_WINDOW_S,
    Phase,
    State,
)
from collectors.sim.plan import STREAM_CHUNK, STREAM_RANK_NOISE, JobPlan, event_second
from collectors.sim.signals import (
    SignalInputs,
    clean_signals,
    gpu_power,
    gpu_temperature,
    reported,
)
from collectors.sim.timeline import EVAL_INTENSITY
from minder.core.metrics import METRICS, DeviceFamily, MetricKind
from minder.core.records import EventKind

CHUNK_S = 120
OWN_NOISE_STREAM = frozenset({"train_busy_seconds", "train_step_number"})
"""Metrics added after the others, whose noise is drawn from a stream of their own, so that
emitting them leaves every other metric's values as they were."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Seconds ``first … first + T - 1`` of one job.

    Attributes
    ----------
    first
        Index of the first second (offset from the scenario start).
    values
        ``(T, N, S)`` reported values (meaningless where not ``present``).
    present
        ``(T, N, S)`` the sample was sent.
    sent
        ``(T, N)`` the machine sent a batch that second (samples or events; a goodbye is a
        batch of one ``leave`` event and no samples).
    events
        Events per ``(second offset within the chunk, machine)``.
    """

    first: int
    values: np.ndarray
    present: np.ndarray
    sent: np.ndarray
    events: dict[tuple[int, int], list[PlannedEvent]]

    @property
    def seconds(self) -> int:
        """Number of seconds in the chunk."""
        return int(self.values.shape[0])


def chunk_count(duration_s: int) -> int:
    """Number of chunks covering ``duration_s`` seconds."""
    return -(-duration_s // CHUNK_S)


def generate_chunk(plan: JobPlan, index: int) -> Chunk:
    """Generate chunk ``index`` (seconds ``index * CHUNK_S`` onwards) of ``plan``'s job."""
    spec = plan.spec
    first = index * CHUNK_S
    stop = min(first + CHUNK_S, plan.duration_s)
    if not 0 <= first < stop:
        raise IndexError(f"chunk {index} is outside the scenario's {plan.duration_s} s")
    window = THERMAL_WINDOW_S
    seconds_ext = np.arange(first - window, stop, dtype=np.float64)
    n, g = spec.machines, spec.gpus_per_machine
    rng = plan.rng(STREAM_CHUNK, index)

    edges = np.arange(first - window, stop + 1, dtype=np.float64)[:, None] - plan.skew[None, :]
    phases_ext = plan.timeline.phase_fractions(edges)
    t_ext = len(seconds_ext)
    states = StateContext(
        seconds=seconds_ext,
        state_map=np.broadcast_to(DEFAULT_STATE_OF_PHASE, (t_ext, n, g, N_PHASES)).copy(),
        clock=np.ones((t_ext, n, g)),
        hot=np.zeros((t_ext, n, g)),
        power_scale=np.ones((t_ext, n, g)),
        dead=np.zeros((t_ext, n), dtype=bool),
        sync=spec.sync,
    )
    for injection in plan.injections:
        apply_states(injection, states)
    states.state_map[states.dead] = State.OFF
    gpu_states_ext = _state_fractions(phases_ext, states.state_map)
    if plan.fleet is not None:
        gpu_states_ext = _fleet_states(
            gpu_states_ext, states.state_map, plan.fleet.duty(seconds_ext)
        )

    intensity = np.where(plan.effects.eval_at(seconds_ext + 0.5), EVAL_INTENSITY, 1.0)
    boost_ext = plan.load[None, :, None] * intensity[:, None, None] - 1.0
    power_ext = gpu_power(
        gpu_states_ext, boost_ext, states.clock, plan.power_mult[None], states.power_scale
    )
    temperature = gpu_temperature(power_ext, states.hot, plan.temp_offset[None], window)

    out = slice(window, None)
    seconds = seconds_ext[out]
    gpu_states = gpu_states_ext[out]
    inputs = SignalInputs(
        gpu_states=gpu_states,
        host_states=gpu_states.mean(axis=2),
        boost=boost_ext[out],
        clock=states.clock[out],
        power=power_ext[out],
        temperature=temperature,
        comm_factor=plan.effects.comm_factor_at(seconds + 0.5),
        memory_extra=plan.memory_extra,
        sample_end=seconds[:, None] + 1.0 - plan.skew[None, :],
        rank_waits=states.state_map[out][..., Phase.WAIT] != State.COMPUTE,
        timeline=plan.timeline,
        n_nics=spec.nics_per_machine,
        paces=plan.paces,
    )
    ctx = SignalContext(
        seconds=seconds,
        phases=phases_ext[out],
        values=clean_signals(plan.layout.metrics, inputs),
        gpu_absent=np.zeros((len(seconds), n, g), dtype=bool),
        silent=np.zeros((len(seconds), n), dtype=bool),
        away=np.zeros((len(seconds), n), dtype=bool),
        rates_absent=np.zeros((len(seconds), n), dtype=bool),
        nic_of_gpu=plan.nic_of_gpu,
        n_nics=spec.nics_per_machine,
        rng=rng,
    )
    for injection in plan.injections:
        apply_signals(injection, ctx)

    layout = plan.layout
    values = np.empty((len(seconds), n, layout.n_series))
    own_rng = plan.rng(STREAM_RANK_NOISE, index)
    for name in layout.metrics:
        noise_rng = own_rng if name in OWN_NOISE_STREAM else rng
        values[:, :, layout.slices[name]] = reported(name, ctx.values[name], noise_rng, spec.noise)
    present = _present(plan, ctx, states.dead[out], rng)
    events = _events(plan, first, stop, ctx.silent, ctx.away)
    sent = np.asarray(present.any(axis=2))
    for t, m in events:
        sent[t, m] = True
    return Chunk(first=first, values=values, present=present, sent=sent, events=events)


def _state_fractions(phases: np.ndarray, state_map: np.ndarray) -> np.ndarray:
    """(T, N, G, N_STATES): each GPU's time share in each state."""
    out = np.zeros((*state_map.shape[:3], N_STATES))
    flat = out.reshape(-1, N_STATES)
    cells = np.arange(flat.shape[0])
    for phase in range(N_PHASES):
        share = np.broadcast_to(phases[:, :, None, phase], state_map.shape[:3])
        # One state per GPU and phase, so the cells of one call never repeat.
        flat[cells, state_map[..., phase].ravel()] += share.ravel()
    return out


FLEET_IDLE_STATE = State.DATA_WAIT
"""What an idle fleet machine's GPUs do: the process alive, its model in memory, no work."""


def _fleet_states(gpu_states: np.ndarray, state_map: np.ndarray, duty: np.ndarray) -> np.ndarray:
    """A fleet machine follows the job's rhythm for its ``duty`` ``(T, N)`` share of each
    second and idles the rest; GPUs a fault changed (dead, hung, throttled …) keep their
    states."""
    idle = np.zeros(N_STATES)
    idle[FLEET_IDLE_STATE] = 1.0
    share = duty[:, :, None, None]
    blended = share * gpu_states + (1.0 - share) * idle
    untouched = (state_map == DEFAULT_STATE_OF_PHASE).all(axis=-1)
    return np.where(untouched[..., None], blended, gpu_states)


def _present(
    plan: JobPlan, ctx: SignalContext, dead: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    layout = plan.layout
    t, n = ctx.silent.shape
    present = np.ones((t, n, layout.n_series), dtype=bool)
    gpu_series = layout.family_mask(DeviceFamily.GPU)
    if ctx.gpu_absent.any():
        present[:, :, gpu_series] &= ~ctx.gpu_absent[:, :, layout.series_index[gpu_series]]
    rank_series = layout.family_mask(DeviceFamily.RANK)
    if rank_series.any() and dead.any():
        # The step probe lives in the training process: no process, no step times.
        present[:, :, rank_series] &= ~dead[:, :, None]
    if ctx.rates_absent.any():
        rate_series = np.array([METRICS[m].kind is MetricKind.RATE for m in layout.series_metric])
        present[:, :, rate_series] &= ~ctx.rates_absent[:, :, None]
    present[ctx.silent] = False
    present[ctx.away] = False
    if plan.spec.missing_rate > 0:
        # Drop a binomial number of random samples (a draw per sample costs 10x more).
        dropped = rng.binomial(present.size, plan.spec.missing_rate)
        present.reshape(-1)[rng.integers(0, present.size, dropped)] = False
    return present


def _events(
    plan: JobPlan, first: int, stop: int, silent: np.ndarray, away: np.ndarray
) -> dict[tuple[int, int], list[PlannedEvent]]:
    """Events by (second offset, machine): none from a silent machine, and only the goodbye
    (a ``leave`` event, sent as the agent stops) from a machine out of the job."""
    out: dict[tuple[int, int], list[PlannedEvent]] = {}
    for event in plan.events:
        second = event_second(event)
        if not first <= second < stop:
            continue
        cell = (second - first, event.machine)
        if silent[cell] or (away[cell] and event.kind is not EventKind.LEAVE):
            continue
        out.setdefault(cell, []).append(event)
    return out
