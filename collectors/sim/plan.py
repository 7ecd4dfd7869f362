"""Compile a scenario into per-job plans: layout, static machine traits, timeline, injections.

Everything random is drawn from streams keyed by the seed and what they are for
(``numpy.random.default_rng([seed, job, purpose, …])``), so any chunk of seconds can be
generated on its own and the same scenario always yields the same values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collectors.sim.contexts import Injection, PlannedEvent
from collectors.sim.faults import add_job_effects, planned_events
from collectors.sim.layout import Layout, build_layout
from collectors.sim.physics import GPU_MEMORY_LAST_STAGE_B, MACHINE_SKEW_S, THERMAL_WINDOW_S
from collectors.sim.scenario import FaultType, FleetSpec, JobSpec, Scenario
from collectors.sim.targets import resolve_confounder, resolve_fault
from collectors.sim.timeline import JobEffects, RankPace, Timeline, build_paces, build_timeline

STREAM_STATIC = 0
STREAM_TIMELINE = 1
STREAM_CHUNK = 2
STREAM_RANK_NOISE = 3
"""Noise of the straggler metrics (``train_busy_seconds``, ``train_step_number``): a stream of
their own, so that emitting them changes no other metric's values."""
STREAM_FLEET = 7
"""Busy and idle spans of the machines of a fleet job (``JobSpec.fleet``)."""
_STREAM_FLAPS = 19
POWER_SPREAD = 0.03
TEMP_SPREAD_C = 3.0
FLEET_DUTY = (0.35, 1.0)
"""Range of the duty cycle of a fleet machine's busy span (drawn per span)."""
FLEET_MIN_SPAN_S = 20.0
"""Shortest busy or idle span of a fleet machine."""


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """When each machine of a fleet job is busy, and how busy: per machine, the cumulative
    busy time (duty-weighted) at span edges, read by interpolation as the timeline is.

    Attributes
    ----------
    edges, cum
        Per machine: span edges (scenario seconds, increasing) and the duty-weighted busy
        seconds before each.
    """

    edges: tuple[np.ndarray, ...]
    cum: tuple[np.ndarray, ...]

    def duty(self, seconds: np.ndarray) -> np.ndarray:
        """``(T, N)`` each machine's busy share of the intervals ``[s, s + 1)``."""
        bounds = np.append(seconds, seconds[-1] + 1.0)
        out = np.empty((len(seconds), len(self.edges)))
        for m, (edges, cum) in enumerate(zip(self.edges, self.cum, strict=True)):
            out[:, m] = np.diff(np.interp(bounds, edges, cum))
        return out


def build_fleet(
    spec: FleetSpec, machines: int, begin: float, end: float, rng: np.random.Generator
) -> FleetPlan:
    """Busy and idle turns of each machine from ``begin`` to past ``end``: exponential spans
    (busy ones ``dwell_s`` on average, idle ones long enough for ``busy_share``), at least
    :data:`FLEET_MIN_SPAN_S`, the first cut at a random point (the fleet was running before),
    each busy span at a duty cycle drawn from :data:`FLEET_DUTY`."""
    share = spec.busy_share
    idle_mean = spec.dwell_s * (1.0 - share) / share
    all_edges: list[np.ndarray] = []
    all_cum: list[np.ndarray] = []
    for _ in range(machines):
        busy = bool(rng.random() < share)
        t, first = begin, True
        edges, cum = [t], [0.0]
        while t < end:
            mean = spec.dwell_s if busy else idle_mean
            length = max(FLEET_MIN_SPAN_S, float(rng.exponential(mean)))
            if first:
                length *= float(rng.uniform(0.05, 1.0))
                first = False
            level = float(rng.uniform(*FLEET_DUTY)) if busy else 0.0
            t += length
            edges.append(t)
            cum.append(cum[-1] + level * length)
            busy = not busy
        all_edges.append(np.asarray(edges))
        all_cum.append(np.asarray(cum))
    return FleetPlan(tuple(all_edges), tuple(all_cum))


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job, ready to generate any range of seconds.

    Attributes
    ----------
    index, spec, layout
        The job's position, spec and series layout.
    seed, duration_s
        Of the scenario.
    timeline, effects
        The job's shared rhythm and the job-wide effects that shaped it.
    injections
        Faults, then confounders, of this job.
    events
        Events the agents report, by time.
    skew
        ``(N,)`` seconds each machine's phases lag the job's.
    power_mult, temp_offset
        ``(N, G)`` silicon lottery: power factor (±3 %) and temperature offset (±3 C).
    load
        ``(N,)`` compute load factor (the last PP stage's is higher).
    memory_extra
        ``(N,)`` extra GPU memory (bytes) of the last PP stage.
    nic_of_gpu
        ``(G,)`` the NIC each GPU's RDMA traffic goes through (PCIe switch affinity).
    paces
        The steps of the ranks slowed by stragglers, one per set of ranks slowed alike.
    fleet
        A fleet job's busy and idle turns (``JobSpec.fleet``), else None.
    """

    index: int
    spec: JobSpec
    layout: Layout
    seed: int
    duration_s: int
    timeline: Timeline
    effects: JobEffects
    injections: tuple[Injection, ...]
    events: tuple[PlannedEvent, ...]
    skew: np.ndarray
    power_mult: np.ndarray
    temp_offset: np.ndarray
    load: np.ndarray
    memory_extra: np.ndarray
    nic_of_gpu: np.ndarray
    paces: tuple[RankPace, ...] = ()
    fleet: FleetPlan | None = None

    def rng(self, *purpose: int) -> np.random.Generator:
        """The random stream of ``purpose`` for this job."""
        return np.random.default_rng([self.seed, self.index, *purpose])


def injections_of(scenario: Scenario) -> list[Injection]:
    """Every fault and confounder of the scenario, resolved."""
    out = []
    for index, fault in enumerate(scenario.faults):
        target = resolve_fault(scenario, index)
        flaps: tuple[float, ...] = ()
        if fault.type is FaultType.AOC_ERROR:
            flaps = _flaps(scenario.seed, index, target.start_s, target.end_s, fault.severity)
        out.append(Injection(fault.type, index, target, fault, flaps))
    for index, confounder in enumerate(scenario.confounders):
        target = resolve_confounder(scenario, index)
        out.append(Injection(confounder.type, index, target, confounder))
    return out


def _flaps(seed: int, index: int, start: float, end: float, severity: float) -> tuple[float, ...]:
    """Link flaps of a bad cable: one at the onset, then about one a minute per severity."""
    rng = np.random.default_rng([seed, _STREAM_FLAPS, index])
    times = [start]
    while True:
        nxt = times[-1] + rng.exponential(60.0 / severity) + 5.0
        if nxt >= end:
            return tuple(times)
        times.append(float(nxt))


def compile_scenario(scenario: Scenario) -> list[JobPlan]:
    """Build the plan of every job of ``scenario``."""
    injections = injections_of(scenario)
    return [
        _compile_job(scenario, index, job, [i for i in injections if i.target.job == index])
        for index, job in enumerate(scenario.jobs)
    ]


def _compile_job(
    scenario: Scenario, index: int, job: JobSpec, injections: list[Injection]
) -> JobPlan:
    layout = build_layout(job)
    effects = JobEffects()
    for injection in injections:
        add_job_effects(injection, job, effects)
    static = np.random.default_rng([scenario.seed, index, STREAM_STATIC])
    n, g = job.machines, job.gpus_per_machine
    skew = static.uniform(-MACHINE_SKEW_S, MACHINE_SKEW_S, n)
    power_mult = static.uniform(1.0 - POWER_SPREAD, 1.0 + POWER_SPREAD, (n, g))
    temp_offset = static.uniform(-TEMP_SPREAD_C, TEMP_SPREAD_C, (n, g))
    last_stage = np.array([job.group_of(i) == f"pp{job.pp_stages - 1}" for i in range(n)])
    if job.pp_stages == 1:
        last_stage[:] = False
    load = np.where(last_stage, 1.0 + job.last_stage_extra_load, 1.0)
    memory_extra = np.where(last_stage, GPU_MEMORY_LAST_STAGE_B, 0.0)
    begin = -(THERMAL_WINDOW_S + MACHINE_SKEW_S + 2.0 + job.step_time_s)
    end = scenario.duration_s + MACHINE_SKEW_S + 2.0
    timeline_rng = np.random.default_rng([scenario.seed, index, STREAM_TIMELINE])
    timeline = build_timeline(job, effects, begin, end, timeline_rng, job.noise)
    paces = build_paces(timeline, effects, n, g, job.sync)
    events = [
        event
        for injection in injections
        for event in planned_events(injection, layout.gpus, layout.nics)
    ]
    events.sort(key=lambda e: (e.offset_s, e.machine))
    nic_of_gpu = (np.arange(g) * job.nics_per_machine) // g
    fleet = None
    if job.fleet is not None:
        fleet_rng = np.random.default_rng([scenario.seed, index, STREAM_FLEET])
        fleet = build_fleet(job.fleet, n, begin, end, fleet_rng)
    return JobPlan(
        index=index,
        spec=job,
        layout=layout,
        seed=scenario.seed,
        duration_s=scenario.duration_s,
        timeline=timeline,
        effects=effects,
        injections=tuple(injections),
        events=tuple(events),
        skew=skew,
        power_mult=power_mult,
        temp_offset=temp_offset,
        load=load,
        memory_extra=memory_extra,
        nic_of_gpu=nic_of_gpu,
        paces=paces,
        fleet=fleet,
    )


def event_second(event: PlannedEvent) -> int:
    """The interval an event falls in."""
    return math.floor(event.offset_s)
