"""What the fault models read and change while one chunk of seconds is generated."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collectors.sim.scenario import ConfounderSpec, ConfounderType, FaultSpec, FaultType
from collectors.sim.targets import Target
from minder.core.records import EventKind


@dataclass(frozen=True, slots=True)
class Injection:
    """A fault or confounder with its target resolved.

    Attributes
    ----------
    kind
        Fault or confounder type.
    index
        Position in the scenario's ``faults`` or ``confounders``.
    target
        Machines, devices and time span.
    spec
        The scenario entry.
    flaps
        ``aoc_error``: start offsets of the link flaps (the first at the onset).
    """

    kind: FaultType | ConfounderType
    index: int
    target: Target
    spec: FaultSpec | ConfounderSpec
    flaps: tuple[float, ...] = ()

    @property
    def severity(self) -> float:
        """The entry's severity."""
        return self.spec.severity

    @property
    def onset_second(self) -> int:
        """Index of the one-second interval holding the onset."""
        return math.floor(self.target.start_s)

    def active(self, seconds: np.ndarray, after_onset: int = 0) -> np.ndarray:
        """True for the intervals ``[s, s+1)`` overlapping the injection's span.

        ``after_onset`` > 0 starts that many whole intervals after the onset's interval (a
        process dies the second after its XID).
        """
        start = self.target.start_s if after_onset == 0 else self.onset_second + after_onset
        return (seconds + 1 > start) & (seconds < self.target.end_s)

    def onset(self, seconds: np.ndarray) -> np.ndarray:
        """True for the interval holding the onset."""
        return seconds == self.onset_second


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    """An event a node agent reports: at ``offset_s`` from the scenario start, on ``machine``."""

    offset_s: float
    machine: int
    kind: EventKind
    device: str
    code: int | None = None
    message: str = ""


@dataclass(slots=True)
class StateContext:
    """Device states and modifiers over the extended range of a chunk (thermal look-back
    included); fault models change them before power and temperature are derived.

    Attributes
    ----------
    seconds
        ``(T,)`` interval start offsets (scenario seconds).
    state_map
        ``(T, N, G, N_PHASES)`` the :class:`~collectors.sim.physics.State` of each GPU in each
        job phase.
    clock
        ``(T, N, G)`` SM clock factor (thermal throttling).
    hot
        ``(T, N, G)`` 1 where a GPU is thermally throttled.
    power_scale
        ``(T, N, G)`` extra power factor.
    dead
        ``(T, N)`` the machine's training process is gone.
    sync
        The job trains synchronously (ranks wait for each other every step).
    """

    seconds: np.ndarray
    state_map: np.ndarray
    clock: np.ndarray
    hot: np.ndarray
    power_scale: np.ndarray
    dead: np.ndarray
    sync: bool = True


@dataclass(slots=True)
class SignalContext:
    """Clean signals of a chunk's output range, which fault models then change.

    Attributes
    ----------
    seconds
        ``(T,)`` interval start offsets.
    phases
        ``(T, N, N_PHASES)`` job-phase fractions of each machine's intervals.
    values
        Metric → clean values, ``(T, N, devices)`` (host metrics ``(T, N, 1)``); event-rate
        metrics hold the Poisson mean, counts and levels hold final values.
    gpu_absent
        ``(T, N, G)`` the GPU reports nothing (fell off the bus).
    silent
        ``(T, N)`` the machine sends nothing (its events are lost too).
    away
        ``(T, N)`` the machine is out of the job (it has not joined yet, or it left): it sends
        no samples; the batch of a goodbye (a ``leave`` event) still goes out.
    rates_absent
        ``(T, N)`` the machine sends no rate metric (its agent re-primes its counters).
    nic_of_gpu
        ``(G,)`` the NIC each GPU's RDMA traffic uses.
    n_nics
        NICs per machine.
    rng
        The chunk's random stream.
    """

    seconds: np.ndarray
    phases: np.ndarray
    values: dict[str, np.ndarray]
    gpu_absent: np.ndarray
    silent: np.ndarray
    away: np.ndarray
    rates_absent: np.ndarray
    nic_of_gpu: np.ndarray
    n_nics: int
    rng: np.random.Generator

    def set(self, metric: str, where: tuple[np.ndarray, ...], value: float | np.ndarray) -> None:
        """Assign ``value`` into ``metric`` at index ``where`` when the job emits it."""
        array = self.values.get(metric)
        if array is not None:
            array[where] = value

    def scale(self, metric: str, where: tuple[np.ndarray, ...], factor: float | np.ndarray) -> None:
        """Multiply ``metric`` at ``where`` by ``factor`` when the job emits it."""
        array = self.values.get(metric)
        if array is not None:
            array[where] *= factor

    def add(self, metric: str, where: tuple[np.ndarray, ...], amount: float | np.ndarray) -> None:
        """Add ``amount`` to ``metric`` at ``where`` when the job emits it."""
        array = self.values.get(metric)
        if array is not None:
            array[where] += amount
