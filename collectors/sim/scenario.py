"""The scenario file of the cluster simulator: jobs, injected faults and confounders.

A scenario is YAML (or a dict) validated by :class:`Scenario`; every bad value is refused with a
:class:`~minder.core.errors.ScenarioError` that names the field, the value and what was expected.

Example::

    seed: 7
    duration_s: 1800            # whole seconds; one sample per machine, metric, device a second
    start_ts: 1763700000.0      # unix time of the first interval's start (the demo passes now)
    jobs:
      - name: llm
        machines: 128
        pp_stages: 4            # label group = pp0..pp3; the last stage carries +8 % load
        machines_per_domain: 16 # label domain = leaf-00..leaf-07
        step_time_s: 6.0
        checkpoint_every_s: 600
    faults:
      - {type: ecc_error, job: llm, machine: 17, device: gpu3, start_s: 300}
      - {type: pcie_downgrade, machine: llm-n0042, start_s: 700, duration_s: 600}
      - {type: slow_worker, machine: 77, factor: 1.1, start_s: 900}   # a straggler
      - {type: slow_stage, stage: pp2, factor: 1.3, start_s: 1500, duration_s: 120}
      - {type: intermittent_straggler, machine: 40, start_s: 1000}  # bursts with dips
      - {type: nic_down, machine: 3, device: mlx5_1, start_s: 1200, halt_after_s: 120}
    confounders:
      - {type: blip, machine: 5, start_s: 120}
      - {type: eval_phase, start_s: 1000, duration_s: 120}
      - {type: agent_restart, machine: 9, start_s: 400, duration_s: 6}
      - {type: late_join, machines: [llm-n0120, llm-n0121], start_s: 90}
      - {type: scale_down, machines: 8, start_s: 900, spread_s: 3, goodbye: false}
      - {type: rolling_restart, machines: 4, start_s: 1200, every_s: 45, duration_s: 40}
      - {type: job_end, start_s: 1790, spread_s: 5}
      - {type: job_wide_slowdown, factor: 1.15, start_s: 600, duration_s: 300}

Machines are addressed by index (``0`` … ``machines-1``) or by name; ``job`` may be left out when
the scenario has one job; ``machine`` and ``device`` left out are chosen from the seed (but a
straggler's ``device`` defaults to all the machine's ranks). A job is synchronous unless it says
``sync: false`` (asynchronous or parameter-server training: each rank steps at its own pace).
``machines`` (membership confounders) is a count of machines drawn from the seed, or a list of
indices and names. What each confounder does: :class:`~collectors.sim.kinds.ConfounderType`.

Real jobs move in phases the whole job shares: ``host_fraction`` gives each step a host-bound
phase (data preparation, an offloaded optimiser) in which every GPU waits together, so gauges
(power, utilisation) swing several-fold in lockstep from one scrape to the next. ``fleet`` makes
a job of mixed load, as a serving fleet is: most machines idle, a rotating few busy
(``fleet: {busy_share: 0.15, dwell_s: 300}``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Self

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from collectors.sim.kinds import (
    GPU_FAULTS,
    MEMBERSHIP_CONFOUNDERS,
    NIC_FAULTS,
    RANK_FAULTS,
    STRAGGLER_FAULTS,
    ConfounderType,
    FaultType,
)
from collectors.sim.specs import (
    DEFAULT_METRICS,
    DEFAULT_START_TS,
    MAX_DURATION_S,
    STRAGGLER_METRICS,
    ConfounderSpec,
    FaultSpec,
    FleetSpec,
    JobSpec,
)
from collectors.sim.targets import resolve_confounder, resolve_fault
from minder.core.errors import ScenarioError

__all__ = [
    "DEFAULT_METRICS",
    "DEFAULT_START_TS",
    "GPU_FAULTS",
    "MEMBERSHIP_CONFOUNDERS",
    "NIC_FAULTS",
    "RANK_FAULTS",
    "STRAGGLER_FAULTS",
    "STRAGGLER_METRICS",
    "ConfounderSpec",
    "ConfounderType",
    "FaultSpec",
    "FaultType",
    "FleetSpec",
    "JobSpec",
    "Scenario",
    "bundled_scenario",
    "bundled_scenarios",
    "load_scenario",
    "resolve_scenario",
]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class Scenario(BaseModel):
    """A whole simulation: seed, time span, jobs, faults, confounders.

    ``Scenario.model_validate(data)`` raises :class:`ScenarioError` (not pydantic's error) with
    one line per problem, each naming the field path and the value.
    """

    model_config = _STRICT

    description: str = ""
    seed: int = Field(default=0, ge=0)
    start_ts: float = Field(default=DEFAULT_START_TS, ge=0.0)
    duration_s: int = Field(ge=1, le=MAX_DURATION_S)
    jobs: tuple[JobSpec, ...] = Field(min_length=1)
    faults: tuple[FaultSpec, ...] = ()
    confounders: tuple[ConfounderSpec, ...] = ()

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        """Validate ``obj``; raise :class:`ScenarioError` naming every bad field and value."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except pydantic.ValidationError as exc:
            raise ScenarioError(_describe(exc)) from None

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names {names} repeat: expected unique names")
        machines: set[str] = set()
        for job in self.jobs:
            own = set(job.machine_names())
            if machines & own:
                raise ValueError(
                    f"job {job.name!r} reuses machine names of another job (e.g. "
                    f"{sorted(machines & own)[0]!r}): give it another machine_prefix"
                )
            machines |= own
        for index in range(len(self.faults)):
            resolve_fault(self, index)
        for index in range(len(self.confounders)):
            resolve_confounder(self, index)
        return self

    def job(self, name: str | None, where: str) -> tuple[int, JobSpec]:
        """Index and spec of job ``name`` (None: the only job); ``where`` prefixes errors."""
        if name is None:
            if len(self.jobs) == 1:
                return 0, self.jobs[0]
            raise ValueError(
                f"{where}: job is required when the scenario has several jobs: expected one "
                f"of {[j.name for j in self.jobs]}"
            )
        for index, job in enumerate(self.jobs):
            if job.name == name:
                return index, job
        raise ValueError(
            f"{where}: unknown job {name!r}: expected one of {[j.name for j in self.jobs]}"
        )

    @property
    def machines(self) -> int:
        """Machines of all the scenario's jobs."""
        return sum(job.machines for job in self.jobs)


def _describe(exc: pydantic.ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
        ).lstrip(".")
        if error["type"] == "value_error":
            message = str(error.get("ctx", {}).get("error", error["msg"]))
        else:
            message = f"{error['msg']} (got {_short(error.get('input'))})"
        lines.append(f"{where}: {message}" if where else message)
    head = "invalid scenario" + (f" ({len(lines)} problems)" if len(lines) > 1 else "")
    return head + ": " + "; ".join(lines)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file.

    Raises
    ------
    ScenarioError
        The file is missing, is not YAML, is not a mapping, or holds a bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(
            f"scenario file {str(path)!r} does not exist: expected a YAML file or one of the "
            f"bundled scenarios {bundled_scenarios()} (see bundled_scenario())"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(
            f"scenario file {str(path)!r} holds {type(data).__name__}: expected a mapping with "
            "seed, duration_s, jobs, faults, confounders"
        )
    try:
        return Scenario.model_validate(data)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def resolve_scenario(name: str) -> Scenario:
    """A scenario file, or the name of a bundled one (``demo``: a name that is no file and does
    not end in ``.yaml`` or ``.yml``), read and validated.

    Raises
    ------
    ScenarioError
        No such file or bundled scenario, or the file is not a valid scenario.
    """
    path = Path(name)
    if not path.exists() and not name.endswith((".yaml", ".yml")):
        path = bundled_scenario(name)
    return load_scenario(path)


def bundled_scenarios() -> list[str]:
    """Names of the example scenarios shipped with the package."""
    folder = resources.files("collectors.sim") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def bundled_scenario(name: str) -> Path:
    """Path of a bundled example scenario (``demo``, ``three-faults`` … with or without .yaml)."""
    stem = name.removesuffix(".yaml")
    path = Path(str(resources.files("collectors.sim") / "scenarios" / f"{stem}.yaml"))
    if not path.is_file():
        raise ScenarioError(f"no bundled scenario {name!r}: expected one of {bundled_scenarios()}")
    return path
