"""The parts of a simulator scenario: jobs (and fleets), faults and confounders.

Each is a frozen pydantic model validated on its own; :class:`collectors.sim.scenario.Scenario`
puts them together and checks what refers across them (its docstring shows the YAML). They live
apart from it so that :mod:`collectors.sim.targets`, which resolves them against a scenario, and
the scenario, which resolves every injection when it is validated, do not import each other.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from collectors.sim.kinds import (
    DEFAULT_FACTOR,
    GPU_FAULTS,
    HALTING_FAULTS,
    INTERMITTENT_MIN_FACTOR,
    MEMBERSHIP_CONFOUNDERS,
    NIC_FAULTS,
    RANK_FAULTS,
    STRAGGLER_FAULTS,
    ConfounderType,
    FaultType,
)
from minder.core.metrics import METRICS, DeviceFamily, metric_spec

DEFAULT_START_TS = 1763700000.0
"""Fixed default start (2025-11-21 04:40 UTC), so that a scenario file alone fixes the output."""

MAX_DURATION_S = 14 * 24 * 3600


DEFAULT_METRICS: tuple[str, ...] = (
    "gpu_util_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_gr_engine_active_ratio",
    "gpu_power_watts",
    "gpu_temperature_celsius",
    "gpu_sm_clock_hertz",
    "gpu_pcie_link_gen",
    "gpu_pcie_link_width",
    "gpu_nvlink_tx_bytes_per_second",
    "gpu_nvlink_error_count",
    "gpu_ecc_dbe_count",
    "gpu_xid_count",
    "gpu_throttle_reasons",
    "rdma_tx_bytes_per_second",
    "rdma_rx_bytes_per_second",
    "rdma_link_downed_count",
    "rdma_symbol_error_count",
    "rdma_port_up",
    "pfc_tx_pause_per_second",
    "pfc_rx_pause_per_second",
    "cpu_util_ratio",
    "memory_used_bytes",
    "disk_read_bytes_per_second",
    "disk_write_bytes_per_second",
    "net_tx_bytes_per_second",
    "net_rx_bytes_per_second",
    "train_step_seconds",
)
"""Emitted when a job names no ``metrics``: 14 per GPU, 7 per NIC, 6 host, 1 per rank."""

STRAGGLER_METRICS: tuple[str, ...] = (
    "train_step_seconds",
    "train_busy_seconds",
    "train_step_number",
    "nccl_collective_seconds",
)
"""The per-rank signals of stragglers (add them to a job's ``metrics`` to see them)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_STRICT = ConfigDict(extra="forbid", frozen=True)


def _choices(enum: type[StrEnum]) -> str:
    return ", ".join(member.value for member in enum)


class FleetSpec(BaseModel):
    """A job of mixed load, as a serving fleet: most machines idle, a rotating few busy.

    Each machine is busy or idle by turns, for exponentially distributed spans drawn from the
    seed: busy for ``dwell_s`` on average, idle long enough that ``busy_share`` of the machines
    are busy at a time on average. A busy machine follows the job's rhythm at a duty cycle
    drawn for each busy span (35-100 %); an idle one keeps its model in memory and runs nothing
    (GPU utilisation 0, ~115 W). No label says which machine plays which part: a detector must
    not take the busy few for faulty ones.
    """

    model_config = _STRICT

    busy_share: float = Field(gt=0.0, lt=1.0, description="fraction of machines busy at a time")
    dwell_s: float = Field(
        default=300.0, ge=10.0, le=86_400.0, description="mean seconds a machine stays busy"
    )


class JobSpec(BaseModel):
    """One training job: its machines, layout and rhythm.

    Machines are named ``{machine_prefix}{index}`` with the index zero-padded to at least four
    digits (``llm-n0000``); PP stages are contiguous blocks of machines (Megatron's order puts PP
    outermost), failure domains are contiguous blocks of ``machines_per_domain``.
    """

    model_config = _STRICT

    name: str
    machines: int = Field(ge=1, le=20_000)
    machine_prefix: str | None = Field(
        default=None, description="default: '{name}-n'; names must be unique across jobs"
    )
    gpus_per_machine: int = Field(default=8, ge=1, le=16)
    nics_per_machine: int = Field(default=4, ge=1, le=16)
    pp_stages: int = Field(default=1, ge=1, description="peer groups pp0…; label 'group'")
    last_stage_extra_load: float = Field(
        default=0.08, ge=0.0, le=0.5, description="systematic extra compute of the last stage"
    )
    machines_per_domain: int = Field(default=16, ge=1, description="label 'domain' = leaf-NN")
    step_time_s: float = Field(default=6.0, ge=0.1, le=600.0)
    comm_fraction: float = Field(default=0.3, ge=0.02, le=0.9)
    checkpoint_every_s: float | None = Field(default=None, gt=0.0)
    checkpoint_duration_s: float = Field(default=30.0, gt=0.0)
    noise: float = Field(default=1.0, ge=0.0, le=10.0, description="0 = noiseless, 1 = realistic")
    missing_rate: float = Field(default=0.0, ge=0.0, lt=1.0, description="per sample")
    late_rate: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="per batch: delivered 1-3 s late"
    )
    duplicate_rate: float = Field(default=0.0, ge=0.0, lt=1.0, description="per batch: sent twice")
    metrics: tuple[str, ...] | None = Field(
        default=None, description="canonical names to emit; default DEFAULT_METRICS"
    )
    sync: bool = Field(
        default=True,
        description="synchronous training (every rank waits for the slowest each step); false: "
        "asynchronous or parameter-server training, each rank at its own pace",
    )
    host_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=0.6,
        description="share of each step spent host-bound (GPUs waiting together), at its start",
    )
    fleet: FleetSpec | None = Field(
        default=None, description="mixed load: most machines idle, a rotating few busy"
    )

    @field_validator("name", "machine_prefix")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a usable name: expected letters, digits and '_.:-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("metrics")
    @classmethod
    def _check_metrics(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("metrics is empty: expected at least one canonical metric name")
        for name in value:
            metric_spec(name)  # raises naming the close matches
        if len(set(value)) != len(value):
            raise ValueError(f"metrics {list(value)} name a metric twice: expected unique names")
        return value

    @model_validator(mode="after")
    def _check_layout(self) -> Self:
        if self.pp_stages > self.machines:
            raise ValueError(
                f"pp_stages {self.pp_stages} exceeds machines {self.machines}: expected at "
                "least one machine per stage"
            )
        if self.comm_fraction + self.host_fraction > 0.9:
            raise ValueError(
                f"comm_fraction {self.comm_fraction} + host_fraction {self.host_fraction} leave "
                "less than 10 % of the step to compute: expected a sum of at most 0.9"
            )
        if self.fleet is not None and self.metrics is not None:
            ranked = [m for m in self.metrics if METRICS[m].family is DeviceFamily.RANK]
            if ranked:
                raise ValueError(
                    f"a fleet job emits no per-rank metrics (got {ranked}): its machines do not "
                    "step together; expected GPU, NIC and host metrics only"
                )
        if (
            self.checkpoint_every_s is not None
            and self.checkpoint_duration_s >= self.checkpoint_every_s
        ):
            raise ValueError(
                f"checkpoint_duration_s {self.checkpoint_duration_s} is not shorter than "
                f"checkpoint_every_s {self.checkpoint_every_s}"
            )
        return self

    @property
    def prefix(self) -> str:
        """The machine-name prefix in effect."""
        return self.machine_prefix if self.machine_prefix is not None else f"{self.name}-n"

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metrics this job emits, in the canonical order of docs/architecture.md §3.1."""
        chosen = set(self.metrics if self.metrics is not None else DEFAULT_METRICS)
        if self.fleet is not None:  # no steps to report (explicit ones are refused)
            chosen = {m for m in chosen if METRICS[m].family is not DeviceFamily.RANK}
        return tuple(name for name in METRICS if name in chosen)

    def machine_names(self) -> list[str]:
        """Machine names, index order."""
        width = max(4, len(str(self.machines - 1)))
        return [f"{self.prefix}{i:0{width}d}" for i in range(self.machines)]

    def gpu_names(self) -> list[str]:
        """GPU device names of one machine."""
        return [f"gpu{i}" for i in range(self.gpus_per_machine)]

    def nic_names(self) -> list[str]:
        """RDMA device names of one machine."""
        return [f"mlx5_{i}" for i in range(self.nics_per_machine)]

    def rank_names(self) -> list[str]:
        """Local ranks, one per GPU (``rank3`` runs on ``gpu3``)."""
        return [f"rank{i}" for i in range(self.gpus_per_machine)]

    def group_of(self, index: int) -> str:
        """PP stage label of machine ``index``."""
        return f"pp{index * self.pp_stages // self.machines}"

    def domain_of(self, index: int) -> str:
        """Failure-domain (leaf switch) label of machine ``index``."""
        return f"leaf-{index // self.machines_per_domain:02d}"

    def domains(self) -> list[str]:
        """Every domain label of the job, in order."""
        count = -(-self.machines // self.machines_per_domain)
        return [f"leaf-{d:02d}" for d in range(count)]


class _Injection(BaseModel):
    """Fields shared by faults and confounders."""

    model_config = _STRICT

    job: str | None = Field(default=None, description="may be left out with one job")
    machine: int | str | None = Field(default=None, description="index or name; default: seed")
    start_s: float = Field(ge=0.0, description="offset from the scenario start")
    duration_s: float | None = Field(default=None, gt=0.0)
    severity: float = Field(default=1.0, gt=0.0, le=10.0)
    factor: float | None = Field(
        default=None,
        gt=1.0,
        le=10.0,
        description="stragglers and job_wide_slowdown: how many times longer compute takes",
    )


class FaultSpec(_Injection):
    """One injected fault; ``duration_s`` None lasts until the end of the scenario."""

    type: FaultType
    device: str | tuple[str, ...] | None = Field(
        default=None, description="gpuN / mlx5_N, a list of them, or 'all'; default: seed"
    )
    domain: str | None = Field(default=None, description="switch_reboot: leaf-NN")
    xid_code: int | None = Field(default=None, ge=1, le=1000, description="gpu_xid only")
    link_width: int | None = Field(default=None, description="pcie_downgrade: 1, 2, 4 or 8")
    link_gen: int | None = Field(default=None, ge=1, le=5, description="pcie_downgrade")
    silent: bool = Field(default=False, description="switch_reboot: machines go silent")
    period_s: float | None = Field(
        default=None, gt=0.0, description="flapping_worker: seconds slow, then as many normal"
    )
    stage: int | str | None = Field(
        default=None, description="slow_stage: the PP stage, 'ppN' or N; default: seed"
    )
    machines: int | tuple[int | str, ...] | None = Field(
        default=None,
        description="slow_group: a count of machines drawn from the seed, or a list of indices "
        "and names; default 3 drawn",
    )
    halt_after_s: float | None = Field(
        default=None,
        gt=0.0,
        description="fail-stop faults: the job halts this long after the onset (every machine "
        "idles alike after it); the fault lasts until then",
    )

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        if str(value) not in {t.value for t in FaultType}:
            raise ValueError(f"unknown fault type {value!r}: expected one of {_choices(FaultType)}")
        return value

    @property
    def factor_in_effect(self) -> float:
        """``factor``, or the type's default (1.0 for injections that slow no compute)."""
        return self.factor if self.factor is not None else DEFAULT_FACTOR.get(self.type, 1.0)

    @field_validator("link_width")
    @classmethod
    def _check_width(cls, value: int | None) -> int | None:
        if value is not None and value not in (1, 2, 4, 8):
            raise ValueError(f"link_width {value} is not a downgrade of x16: expected 1, 2, 4 or 8")
        return value

    @model_validator(mode="after")
    def _check_fields(self) -> Self:
        if self.xid_code is not None and self.type is not FaultType.GPU_XID:
            raise ValueError(f"xid_code is for gpu_xid faults, not {self.type.value}")
        if (self.link_width or self.link_gen) and self.type is not FaultType.PCIE_DOWNGRADE:
            raise ValueError(f"link_width/link_gen are for pcie_downgrade, not {self.type.value}")
        if self.type is not FaultType.SWITCH_REBOOT and (self.domain is not None or self.silent):
            raise ValueError(f"domain/silent are for switch_reboot, not {self.type.value}")
        if self.domain is not None and self.machine is not None:
            raise ValueError(
                f"switch_reboot got both domain {self.domain!r} and machine {self.machine!r}: "
                "expected one of them (a machine stands for its domain)"
            )
        if self.type is FaultType.PCIE_DOWNGRADE and self.link_width is None and self.link_gen == 5:
            raise ValueError(
                "pcie_downgrade with link_gen 5 and no link_width downgrades nothing: expected "
                "link_width 1/2/4/8 or link_gen 1-4"
            )
        if self.device is not None and self.type not in GPU_FAULTS | NIC_FAULTS | RANK_FAULTS:
            raise ValueError(
                f"{self.type.value} takes no device (got {self.device!r}): devices are for "
                f"{', '.join(sorted(t.value for t in GPU_FAULTS | NIC_FAULTS | RANK_FAULTS))}"
            )
        if self.halt_after_s is not None:
            if self.type not in HALTING_FAULTS:
                raise ValueError(
                    f"halt_after_s is for {', '.join(sorted(t.value for t in HALTING_FAULTS))}, "
                    f"not {self.type.value}"
                )
            if self.duration_s is not None:
                raise ValueError(
                    f"{self.type.value} got both duration_s {self.duration_s!r} and halt_after_s "
                    f"{self.halt_after_s!r}: expected one of them (the fault lasts until the halt)"
                )
        self._check_straggler_fields()
        return self

    def _check_straggler_fields(self) -> None:
        kind = self.type
        if (
            kind is FaultType.INTERMITTENT_STRAGGLER
            and self.factor is not None
            and self.factor < INTERMITTENT_MIN_FACTOR
        ):
            raise ValueError(
                f"intermittent_straggler factor {self.factor} is below "
                f"{INTERMITTENT_MIN_FACTOR}: expected peaks well above its 1.0-1.3x dips"
            )
        if self.factor is not None and kind not in STRAGGLER_FAULTS:
            raise ValueError(
                f"factor is for {', '.join(sorted(t.value for t in STRAGGLER_FAULTS))}, not "
                f"{kind.value}"
            )
        if self.period_s is not None and kind is not FaultType.FLAPPING_WORKER:
            raise ValueError(f"period_s is for flapping_worker, not {kind.value}")
        if self.stage is not None and kind is not FaultType.SLOW_STAGE:
            raise ValueError(f"stage is for slow_stage, not {kind.value}")
        if self.stage is not None and self.machine is not None:
            raise ValueError(
                f"slow_stage got both stage {self.stage!r} and machine {self.machine!r}: "
                "expected one of them (a machine stands for its stage)"
            )
        machines = self.machines
        if kind is FaultType.SLOW_GROUP and self.machine is not None:
            raise ValueError(
                f"slow_group takes machines (a count or a list), not machine {self.machine!r}"
            )
        if machines is None:
            return
        if kind is not FaultType.SLOW_GROUP:
            raise ValueError(f"machines is for slow_group, not {kind.value}")
        if isinstance(machines, int) and machines < 2:
            raise ValueError(
                f"machines is {machines}: expected a count >= 2 or a list (one slow machine "
                "is a slow_worker)"
            )
        if isinstance(machines, tuple):
            if len(machines) < 2:
                raise ValueError(
                    f"machines {list(machines)} names fewer than 2: expected several machines "
                    "(one slow machine is a slow_worker)"
                )
            if len(set(machines)) != len(machines):
                raise ValueError(f"machines {list(machines)} name a machine twice")


_CONFOUNDER_LENGTH_S: dict[ConfounderType, float] = {
    ConfounderType.BLIP: 10.0,
    ConfounderType.EVAL_PHASE: 120.0,
    ConfounderType.AGENT_RESTART: 4.0,
    ConfounderType.ROLLING_RESTART: 30.0,
}
"""Default ``duration_s`` of each confounder type that has one (``rolling_restart``: each
machine's time away); the others last until the scenario's end."""

DEFAULT_SPREAD_S = 3.0
"""``scale_down``, ``job_end``: the machines stop within this many seconds of ``start_s``."""
DEFAULT_EVERY_S = 60.0
"""``rolling_restart``: seconds between one machine's restart and the next one's."""

_PERMANENT = frozenset(
    {ConfounderType.LATE_JOIN, ConfounderType.SCALE_DOWN, ConfounderType.JOB_END}
)
"""Confounders that last until the scenario's end (they take no ``duration_s``)."""
_FIELD_TYPES: dict[str, frozenset[ConfounderType]] = {
    "machines": frozenset(
        {ConfounderType.LATE_JOIN, ConfounderType.SCALE_DOWN, ConfounderType.ROLLING_RESTART}
    ),
    "spread_s": frozenset({ConfounderType.SCALE_DOWN, ConfounderType.JOB_END}),
    "goodbye": frozenset({ConfounderType.SCALE_DOWN, ConfounderType.JOB_END}),
    "every_s": frozenset({ConfounderType.ROLLING_RESTART}),
}
"""The confounder types each membership field applies to."""


class ConfounderSpec(_Injection):
    """A benign disturbance: ``blip`` or ``agent_restart`` on one machine, ``eval_phase`` on the
    whole job, or a change of the job's membership (``late_join``, ``scale_down``,
    ``rolling_restart``, ``job_end``; see :class:`~collectors.sim.kinds.ConfounderType`)."""

    type: ConfounderType
    machines: int | tuple[int | str, ...] | None = Field(
        default=None,
        description="late_join, scale_down, rolling_restart: a count of machines drawn from the "
        "seed, or a list of indices and names",
    )
    spread_s: float | None = Field(
        default=None, ge=0.0, le=3600.0, description="scale_down, job_end: default 3 s"
    )
    goodbye: bool | None = Field(
        default=None, description="scale_down, job_end: send a leave event (default true)"
    )
    every_s: float | None = Field(
        default=None, gt=0.0, description="rolling_restart: spacing of the restarts, default 60 s"
    )

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        if str(value) not in {t.value for t in ConfounderType}:
            raise ValueError(
                f"unknown confounder type {value!r}: expected one of {_choices(ConfounderType)}"
            )
        return value

    @model_validator(mode="after")
    def _check_fields(self) -> Self:
        kind = self.type
        for name, types in _FIELD_TYPES.items():
            if getattr(self, name) is not None and kind not in types:
                raise ValueError(
                    f"{name} is for {', '.join(sorted(t.value for t in types))}, not {kind.value}"
                )
        if kind in _PERMANENT and self.duration_s is not None:
            raise ValueError(
                f"{kind.value} lasts until the scenario's end: expected no duration_s, got "
                f"{self.duration_s!r}"
            )
        if self.factor is not None and kind is not ConfounderType.JOB_WIDE_SLOWDOWN:
            raise ValueError(f"factor is for job_wide_slowdown, not {kind.value}")
        if kind is ConfounderType.JOB_END and self.machine is not None:
            raise ValueError(
                f"job_end stops every machine of the job: expected no machine, got {self.machine!r}"
            )
        machines = self.machines
        if machines is not None and self.machine is not None:
            raise ValueError(
                f"{kind.value} got both machine {self.machine!r} and machines {machines!r}: "
                "expected one of them"
            )
        if isinstance(machines, int) and machines < 1:
            raise ValueError(f"machines is {machines}: expected a count >= 1 or a list")
        if isinstance(machines, tuple):
            if not machines:
                raise ValueError("machines is an empty list: expected at least one machine")
            if len(set(machines)) != len(machines):
                raise ValueError(f"machines {list(machines)} name a machine twice")
        return self

    @property
    def factor_in_effect(self) -> float:
        """``factor``, or the type's default (1.0 for injections that slow no compute)."""
        return self.factor if self.factor is not None else DEFAULT_FACTOR.get(self.type, 1.0)

    @property
    def length_s(self) -> float | None:
        """Duration in effect (defaults: blip 10 s, eval_phase 120 s, agent_restart 4 s,
        rolling_restart 30 s away per machine); None for the confounders that last until the
        scenario's end (late_join, scale_down, job_end)."""
        if self.duration_s is not None:
            return self.duration_s
        return _CONFOUNDER_LENGTH_S.get(self.type)

    @property
    def spread_in_effect_s(self) -> float:
        """``spread_s`` in effect (default :data:`DEFAULT_SPREAD_S`)."""
        return DEFAULT_SPREAD_S if self.spread_s is None else self.spread_s

    @property
    def every_in_effect_s(self) -> float:
        """``every_s`` in effect (default :data:`DEFAULT_EVERY_S`)."""
        return DEFAULT_EVERY_S if self.every_s is None else self.every_s

    @property
    def says_goodbye(self) -> bool:
        """Whether each leaving machine sends a ``leave`` event (rolling_restart: always;
        late_join: nothing leaves)."""
        if self.type is ConfounderType.ROLLING_RESTART:
            return True
        if self.type in MEMBERSHIP_CONFOUNDERS - {ConfounderType.LATE_JOIN}:
            return True if self.goodbye is None else self.goodbye
        return False
