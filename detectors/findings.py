"""What a rule or scorer found in one evaluation, before it becomes an alert."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minder.core.alert import AlertKind


@dataclass(slots=True)
class Finding:
    """One machine (or device) that a rule or the peer scorer flags at one second.

    Attributes
    ----------
    machine
        Machine index in the job window.
    family
        Which fault this belongs to (``gpu_fatal``, ``nic``, ``pcie``, ``nvlink``, ``silence`` or,
        for similarity, the metric): one family on one machine is one fault, one alert.
    first_sec
        Estimated onset (whole unix second).
    """

    machine: int
    kind: AlertKind
    family: str
    metric: str
    score: float
    first_sec: int
    devices: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)
