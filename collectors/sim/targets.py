"""Resolve where and when each fault or confounder applies, defaults drawn from the seed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from collectors.sim.kinds import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_INTERMITTENT_STEPS,
    DEFAULT_PERIOD_S,
    DEFAULT_TRANSIENT_STEPS,
    GPU_FAULTS,
    INTERMITTENT_DIP_CHANCE,
    INTERMITTENT_DIPS,
    INTERMITTENT_PEAKS,
    MEMBERSHIP_CONFOUNDERS,
    NIC_FAULTS,
    RANK_FAULTS,
    STRAGGLER_FAULTS,
    ConfounderType,
    FaultType,
)

if TYPE_CHECKING:
    from collectors.sim.specs import ConfounderSpec, FaultSpec, JobSpec


class ScenarioView(Protocol):
    """What the resolvers read of a :class:`collectors.sim.scenario.Scenario` (which resolves
    every injection when it is validated: it imports this module, not the other way round)."""

    @property
    def seed(self) -> int: ...

    @property
    def duration_s(self) -> int: ...

    @property
    def faults(self) -> tuple[FaultSpec, ...]: ...

    @property
    def confounders(self) -> tuple[ConfounderSpec, ...]: ...

    def job(self, name: str | None, where: str) -> tuple[int, JobSpec]:
        """Index and spec of job ``name`` (None: the only job); ``where`` prefixes errors."""
        ...


_FAULT_STREAM = 17
_CONFOUNDER_STREAM = 18


@dataclass(frozen=True, slots=True)
class Target:
    """An injection with every default resolved.

    Attributes
    ----------
    job
        Index of the job in the scenario.
    machines
        Machine indices hit (several for ``switch_reboot``, none for ``eval_phase``).
    gpus, nics
        Device indices hit on those machines (empty when the type takes no device).
    domain
        The failure domain of the (first) machine hit; the rebooted one for ``switch_reboot``.
    start_s, end_s
        Offsets from the scenario start; ``end_s`` is clipped to the scenario's duration.
    clears
        The injection ends before the scenario does (a stalled job then resumes).
    away
        Membership confounders: for each of ``machines``, the span ``(leave, back)`` it is out
        of the job (``-inf`` for a late joiner's leave, ``inf`` for a ``back`` that never comes).
    goodbye
        Each leaving machine sends a ``leave`` event at its ``leave`` time.
    ranks
        Stragglers: the ranks (local indices, ``rank3`` is 3) slowed on each of ``machines``.
    slow_spans
        Stragglers and ``job_wide_slowdown``: the spans ``(start, end)`` in which the ranks are
        slow (one, or a ``flapping_worker``'s slow turns); the last ends at ``inf`` when the
        injection does not clear before the scenario's end.
    step_factors
        ``intermittent_straggler``: the compute factor of each of the slow ranks' steps that
        start within the slow span, in order (peaks with single dips between them).
    halts
        The job halts at ``end_s`` (a fault with ``halt_after_s`` that ends in the scenario).
    """

    job: int
    machines: tuple[int, ...]
    gpus: tuple[int, ...]
    nics: tuple[int, ...]
    domain: str
    start_s: float
    end_s: float
    clears: bool
    away: tuple[tuple[float, float], ...] = ()
    goodbye: bool = False
    ranks: tuple[int, ...] = ()
    slow_spans: tuple[tuple[float, float], ...] = ()
    step_factors: tuple[float, ...] = ()
    halts: bool = False


def resolve_fault(scenario: ScenarioView, index: int) -> Target:
    """Resolve ``scenario.faults[index]``; raise ValueError naming the bad field and value."""
    spec = scenario.faults[index]
    where = f"faults[{index}]"
    job_index, job = scenario.job(spec.job, where)
    rng = np.random.default_rng([scenario.seed, _FAULT_STREAM, index])
    if spec.type in STRAGGLER_FAULTS:
        return _straggler(scenario, spec, job_index, job, rng, where)
    halt = spec.halt_after_s
    length = halt if halt is not None else spec.duration_s
    start, end, clears = _span(scenario, spec.start_s, length, where)
    halts = halt is not None and clears
    if spec.type is FaultType.SWITCH_REBOOT:
        if spec.domain is not None:
            if spec.domain not in job.domains():
                raise ValueError(
                    f"{where}.domain: unknown domain {spec.domain!r} of job {job.name!r}: "
                    f"expected one of {job.domains()}"
                )
            domain = spec.domain
        else:
            domain = job.domain_of(_machine(job, spec.machine, rng, where))
        machines = tuple(i for i in range(job.machines) if job.domain_of(i) == domain)
        return Target(job_index, machines, (), (), domain, start, end, clears)
    machine = _machine(job, spec.machine, rng, where)
    gpus: tuple[int, ...] = ()
    nics: tuple[int, ...] = ()
    if spec.type in GPU_FAULTS:
        gpus = _devices(spec.device, job.gpu_names(), rng, f"{where}.device", "GPU")
    elif spec.type in NIC_FAULTS:
        nics = _devices(spec.device, job.nic_names(), rng, f"{where}.device", "NIC")
    domain = job.domain_of(machine)
    return Target(job_index, (machine,), gpus, nics, domain, start, end, clears, halts=halts)


def resolve_confounder(scenario: ScenarioView, index: int) -> Target:
    """Resolve ``scenario.confounders[index]``; raise ValueError naming the bad value."""
    spec = scenario.confounders[index]
    where = f"confounders[{index}]"
    job_index, job = scenario.job(spec.job, where)
    rng = np.random.default_rng([scenario.seed, _CONFOUNDER_STREAM, index])
    if spec.type in MEMBERSHIP_CONFOUNDERS:
        return _membership(scenario, spec, job_index, job, rng, where)
    start, end, clears = _span(scenario, spec.start_s, spec.length_s, where)
    if spec.type in (ConfounderType.EVAL_PHASE, ConfounderType.JOB_WIDE_SLOWDOWN):
        if spec.machine is not None:
            raise ValueError(
                f"{where}.machine: {spec.type.value} hits every machine of the job: expected no "
                f"machine, got {spec.machine!r}"
            )
        if spec.type is ConfounderType.JOB_WIDE_SLOWDOWN:
            spans = _slow_spans(start, end, clears, None)
            return Target(job_index, (), (), (), "", start, end, clears, slow_spans=spans)
        return Target(job_index, (), (), (), "", start, end, clears)
    machine = _machine(job, spec.machine, rng, where)
    return Target(job_index, (machine,), (), (), job.domain_of(machine), start, end, clears)


def _straggler(
    scenario: ScenarioView,
    spec: FaultSpec,
    job_index: int,
    job: JobSpec,
    rng: np.random.Generator,
    where: str,
) -> Target:
    """Which ranks of which machines are slow, and when."""
    kind = spec.type
    duration = spec.duration_s
    if kind is FaultType.TRANSIENT_STRAGGLER and duration is None:
        duration = DEFAULT_TRANSIENT_STEPS * job.step_time_s
    step_factors: tuple[float, ...] = ()
    if kind is FaultType.INTERMITTENT_STRAGGLER:
        longest = scenario.duration_s - spec.start_s if duration is None else duration
        step_factors = _intermittent_factors(job, spec.factor_in_effect, longest, rng)
        if duration is None:
            duration = _steps_length(job, step_factors[:DEFAULT_INTERMITTENT_STEPS])
    start, end, clears = _span(scenario, spec.start_s, duration, where)
    every_rank = tuple(range(job.gpus_per_machine))
    ranks = every_rank
    if kind is FaultType.SLOW_STAGE:
        stage = _stage(job, spec, rng, where)
        machines = tuple(i for i in range(job.machines) if job.group_of(i) == stage)
    elif kind is FaultType.SLOW_GROUP:
        machines = _group(job, spec.machines, rng, where)
    else:
        machines = (_machine(job, spec.machine, rng, where),)
        if kind in RANK_FAULTS and spec.device is not None:
            ranks = _devices(spec.device, job.rank_names(), rng, f"{where}.device", "rank")
    period = spec.period_s if spec.period_s is not None else DEFAULT_PERIOD_S
    spans = _slow_spans(start, end, clears, period if kind is FaultType.FLAPPING_WORKER else None)
    return Target(
        job_index,
        machines,
        (),
        (),
        job.domain_of(machines[0]),
        start,
        end,
        clears,
        ranks=ranks,
        slow_spans=spans,
        step_factors=step_factors,
    )


def _intermittent_factors(
    job: JobSpec, factor: float, span_s: float, rng: np.random.Generator
) -> tuple[float, ...]:
    """The compute factor of each step of an ``intermittent_straggler``: peaks of ``0.85`` to
    ``1.2`` times ``factor``, each followed by a single dip of 1.0-1.3x with chance
    :data:`INTERMITTENT_DIP_CHANCE` (else by another peak), starting with a peak; enough of
    them for every step that can start in ``span_s`` (an evaluation step is 0.4 of a nominal one,
    half of it at the shortest jitter; the sequence is read cyclically past its end anyway)."""
    count = min(200_000, math.ceil(max(span_s, 1.0) / (0.2 * job.step_time_s)) + 2)
    low, high = INTERMITTENT_PEAKS
    peaks = rng.uniform(low * factor, high * factor, count)
    dips = rng.uniform(*INTERMITTENT_DIPS, count)
    follow = rng.random(count) < INTERMITTENT_DIP_CHANCE
    out: list[float] = []
    dip = False
    for k in range(count):
        out.append(float(dips[k] if dip else peaks[k]))
        dip = not dip and bool(follow[k])
    return tuple(round(f, 4) for f in out)


def _steps_length(job: JobSpec, factors: tuple[float, ...]) -> float:
    """Nominal seconds of steps whose compute takes ``factors`` times longer (a synchronous
    job's steps, or the slow rank's own)."""
    compute = job.step_time_s * (1.0 - job.comm_fraction - job.host_fraction)
    rest = job.step_time_s - compute
    return round(sum(compute * f + rest for f in factors), 1)


def _stage(job: JobSpec, spec: FaultSpec, rng: np.random.Generator, where: str) -> str:
    """The PP stage of a ``slow_stage``: ``stage``, the stage of ``machine``, or drawn."""
    stages = [f"pp{k}" for k in range(job.pp_stages)]
    if job.pp_stages < 2:
        raise ValueError(
            f"{where}: slow_stage needs a job of pp_stages >= 2, and job {job.name!r} has 1 "
            "stage (the whole job slow is a job_wide_slowdown confounder)"
        )
    if spec.machine is not None:
        return job.group_of(_machine(job, spec.machine, rng, where))
    if spec.stage is None:
        return stages[int(rng.integers(job.pp_stages))]
    stage = spec.stage
    name = f"pp{stage}" if isinstance(stage, int) else stage
    if name not in stages:
        raise ValueError(
            f"{where}.stage: unknown stage {stage!r} of job {job.name!r}: expected one of "
            f"{stages} or an index 0..{job.pp_stages - 1}"
        )
    return name


def _group(
    job: JobSpec,
    machines: int | tuple[int | str, ...] | None,
    rng: np.random.Generator,
    where: str,
) -> tuple[int, ...]:
    """The machines of a ``slow_group``: a count drawn from the seed, or a list."""
    if machines is None or isinstance(machines, int):
        count = DEFAULT_GROUP_SIZE if machines is None else machines
        if count > job.machines:
            raise ValueError(
                f"{where}.machines: {count} machines asked of job {job.name!r}, which has "
                f"{job.machines}: expected a count of 2..{job.machines}"
            )
        drawn = rng.choice(job.machines, size=count, replace=False)
        return tuple(sorted(int(m) for m in drawn))
    out = tuple(_machine(job, m, rng, where, "machines") for m in machines)
    if len(set(out)) != len(out):
        raise ValueError(
            f"{where}.machines: {list(machines)} name a machine twice (by index and by name): "
            "expected each machine once"
        )
    return tuple(sorted(out))


def _slow_spans(
    start: float, end: float, clears: bool, period_s: float | None
) -> tuple[tuple[float, float], ...]:
    """When the ranks are slow: ``[start, end)``, or by turns of ``period_s`` from ``start``;
    an injection that does not clear stays on (by turns) past the scenario's end."""
    if period_s is None:
        return ((start, end if clears else math.inf),)
    # Past the end, a few more turns: the job's timeline runs a little beyond the last second.
    horizon = end if clears else end + 2 * period_s + 60.0
    spans = []
    t = start
    while t < horizon:
        spans.append((t, min(t + period_s, horizon) if clears else t + period_s))
        t += 2 * period_s
    return tuple(spans)


def _membership(
    scenario: ScenarioView,
    spec: ConfounderSpec,
    job_index: int,
    job: JobSpec,
    rng: np.random.Generator,
    where: str,
) -> Target:
    """Who leaves (or joins) and when: ``late_join``, ``scale_down``, ``rolling_restart``,
    ``job_end``."""
    kind = spec.type
    start, _end, _clears = _span(scenario, spec.start_s, None, where)
    if kind is ConfounderType.JOB_END:
        machines: tuple[int, ...] = tuple(range(job.machines))
    elif spec.machines is None and spec.machine is None and kind is ConfounderType.ROLLING_RESTART:
        machines = tuple(range(job.machines))
    elif spec.machines is None:
        machines = (_machine(job, spec.machine, rng, where),)
    elif isinstance(spec.machines, int):
        if spec.machines > job.machines:
            raise ValueError(
                f"{where}.machines: {spec.machines} machines asked of job {job.name!r}, which "
                f"has {job.machines}: expected a count of 1..{job.machines}"
            )
        drawn = rng.choice(job.machines, size=spec.machines, replace=False)
        machines = tuple(sorted(int(m) for m in drawn))
    else:
        machines = tuple(_machine(job, m, rng, where, "machines") for m in spec.machines)
        if len(set(machines)) != len(machines):
            raise ValueError(
                f"{where}.machines: {list(spec.machines)} name a machine twice (by index and "
                "by name): expected each machine once"
            )
    away: list[tuple[float, float]]
    if kind is ConfounderType.LATE_JOIN:
        away = [(-math.inf, start)] * len(machines)
    elif kind is ConfounderType.ROLLING_RESTART:
        every, length = spec.every_in_effect_s, spec.length_s or 0.0
        away = [(start + k * every, start + k * every + length) for k in range(len(machines))]
        # The restarts due after the scenario's end do not happen.
        kept = [k for k, (leave, _back) in enumerate(away) if leave < scenario.duration_s]
        machines = tuple(machines[k] for k in kept)
        away = [away[k] for k in kept]
    else:  # scale_down, job_end: each stops at its own time within the spread
        offsets = rng.uniform(0.0, spec.spread_in_effect_s, len(machines))
        away = [(start + float(o), math.inf) for o in offsets]
    backs = [back for _leave, back in away]
    last = max(backs) if kind is ConfounderType.ROLLING_RESTART else math.inf
    end = float(min(last, scenario.duration_s))
    return Target(
        job_index,
        machines,
        (),
        (),
        job.domain_of(machines[0]),
        start,
        end,
        last < scenario.duration_s,
        away=tuple(away),
        goodbye=spec.says_goodbye,
    )


def _span(
    scenario: ScenarioView, start_s: float, duration_s: float | None, where: str
) -> tuple[float, float, bool]:
    if start_s >= scenario.duration_s:
        raise ValueError(
            f"{where}.start_s: {start_s} is not before the scenario's end: expected "
            f"0 <= start_s < duration_s ({scenario.duration_s})"
        )
    end = scenario.duration_s if duration_s is None else start_s + duration_s
    return float(start_s), float(min(end, scenario.duration_s)), end < scenario.duration_s


def _machine(
    job: JobSpec,
    machine: int | str | None,
    rng: np.random.Generator,
    where: str,
    field: str = "machine",
) -> int:
    if machine is None:
        return int(rng.integers(job.machines))
    if isinstance(machine, int):
        if not 0 <= machine < job.machines:
            raise ValueError(
                f"{where}.{field}: index {machine} is out of range: job {job.name!r} has "
                f"{job.machines} machines (0..{job.machines - 1})"
            )
        return machine
    names = job.machine_names()
    try:
        return names.index(machine)
    except ValueError:
        raise ValueError(
            f"{where}.{field}: unknown machine {machine!r} in job {job.name!r}: expected an "
            f"index 0..{job.machines - 1} or a name {names[0]!r}..{names[-1]!r}"
        ) from None


def _devices(
    device: str | tuple[str, ...] | None,
    names: list[str],
    rng: np.random.Generator,
    where: str,
    family: str,
) -> tuple[int, ...]:
    if device is None:
        return (int(rng.integers(len(names))),)
    if device == "all":
        return tuple(range(len(names)))
    wanted = (device,) if isinstance(device, str) else device
    if not wanted:
        raise ValueError(f"{where}: empty device list: expected at least one {family}")
    out = []
    for name in wanted:
        if name not in names:
            raise ValueError(
                f"{where}: unknown {family} {name!r}: expected one of {names} or 'all'"
            )
        out.append(names.index(name))
    return tuple(sorted(set(out)))
