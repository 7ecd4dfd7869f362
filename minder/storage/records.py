"""Plain records the storage functions take and return (ORM rows never leave the package)."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from minder.core.alert import Alert, AlertStatus
from minder.core.errors import ValidationError


class JobStatus(StrEnum):
    """Where a job is in its life (docs/operations.md, "Job lifecycle").

    ``active`` while a detection worker holds its window (its machines report, or stopped less
    than the idle time ago); ``idle`` once its window was dropped (no data for the idle time,
    or no word from the worker that held it: a restart); ``ended`` when its last machine said
    goodbye, or it stayed idle past the retention. Data for an idle or ended job makes it
    active again.
    """

    ACTIVE = "active"
    IDLE = "idle"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """A stored alert with its bookkeeping.

    Attributes
    ----------
    alert
        The alert as the detectors describe it (``status`` is the stored one).
    last_seen_ts
        Data time of the latest report of the fault.
    occurrences
        How many times the fault was reported (1 at insert).
    created_at, updated_at
        Wall time of the insert and of the latest change, unix seconds.
    """

    alert: Alert
    last_seen_ts: float
    occurrences: int
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as stored, with the number of its open (or acknowledged) alerts and of its current
    job-level findings (:class:`JobFinding`)."""

    id: str
    first_seen_ts: float
    last_seen_ts: float
    machine_count: int
    status: JobStatus
    updated_at: float
    open_alerts: int = 0
    finding_count: int = 0
    active_machines: int = 0
    """Machines in the job now (reported, not departed): ``minder_job_machines``; 0 unless
    active."""
    status_since: float = 0.0
    """Wall time the job entered its status, unix seconds."""
    status_reason: str = ""
    """Why it is idle or ended (empty while active)."""


@dataclass(frozen=True, slots=True)
class JobReport:
    """What a detection worker says about a job it holds (or held): its status, the machines
    in it now, and the newest data time it has of the job (``seen_ts``: a report is ignored
    when the store has newer data of the job, from the worker that holds it now)."""

    job: str
    status: JobStatus
    active_machines: int
    seen_ts: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What the service knows of a machine when it registers it: ``upsert_job_machines`` input."""

    name: str
    group: str = ""
    domain: str = ""
    last_seen_ts: float | None = None

    @classmethod
    def coerce(cls, value: MachineInfo | Mapping[str, Any]) -> MachineInfo:
        """Accept a :class:`MachineInfo` or a mapping with the same keys."""
        if isinstance(value, MachineInfo):
            return value
        if not isinstance(value, Mapping):
            raise ValidationError(
                f"machine must be a MachineInfo or a mapping, got {type(value).__name__}"
            )
        unknown = set(value) - {"name", "group", "domain", "last_seen_ts"}
        if unknown:
            raise ValidationError(
                f"machine has unknown fields {sorted(unknown)}: allowed name, group, domain, "
                "last_seen_ts"
            )
        if not value.get("name"):
            raise ValidationError(f"machine needs a non-empty 'name', got {value!r}")
        last_seen = value.get("last_seen_ts")
        try:
            last_seen_ts = None if last_seen is None else float(last_seen)
        except (TypeError, ValueError):
            raise ValidationError(
                f"machine {value['name']!r} has last_seen_ts {last_seen!r}: expected unix seconds"
            ) from None
        return cls(
            name=str(value["name"]),
            group=str(value.get("group") or ""),
            domain=str(value.get("domain") or ""),
            last_seen_ts=last_seen_ts,
        )


@dataclass(frozen=True, slots=True)
class MachineState:
    """A stored machine with its current top score (``None`` when it has no current score)."""

    job: str
    name: str
    group: str
    domain: str
    last_seen_ts: float | None
    top_score: float | None
    top_metric: str | None
    top_device: str | None
    score_ts: float | None


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One current score, ``save_scores`` input: how anomalous ``machine`` is on ``metric``.

    ``device`` names the device that scored highest (``""`` for machine-level metrics).
    """

    machine: str
    metric: str
    score: float
    device: str = ""

    @classmethod
    def coerce(cls, value: ScoreRow | Mapping[str, Any] | tuple[Any, ...]) -> ScoreRow:
        """Accept a :class:`ScoreRow`, a mapping, or ``(machine, metric, score[, device])``."""
        try:
            if isinstance(value, ScoreRow):
                row = value
            elif isinstance(value, Mapping):
                row = cls(
                    machine=str(value["machine"]),
                    metric=str(value["metric"]),
                    score=float(value["score"]),
                    device=str(value.get("device") or ""),
                )
            elif isinstance(value, tuple) and len(value) in (3, 4):
                device = str(value[3] or "") if len(value) == 4 else ""
                row = cls(str(value[0]), str(value[1]), float(value[2]), device)
            else:
                raise ValidationError(
                    f"score row {value!r} is neither a ScoreRow, a mapping nor a "
                    "(machine, metric, score[, device]) tuple"
                )
        except KeyError as exc:
            raise ValidationError(
                f"score row {value!r} is missing {exc.args[0]!r}: expected machine, metric, "
                "score[, device]"
            ) from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValidationError):
                raise
            raise ValidationError(f"score row {value!r} has a score that is not a number") from None
        if not row.machine or not row.metric:
            raise ValidationError(f"score row {row!r} needs a non-empty machine and metric")
        if not math.isfinite(row.score):
            raise ValidationError(
                f"score of {row.machine}/{row.metric} is {row.score}: expected a finite number"
            )
        return row


@dataclass(frozen=True, slots=True)
class MachineScore:
    """A stored current score."""

    job: str
    machine: str
    metric: str
    score: float
    device: str
    ts: float


FINDING_MAX_LEN = 64
"""Longest finding name the ``job_findings`` table holds."""
METRIC_MAX_LEN = 128
"""Longest metric name the tables hold."""
DETAIL_MAX_LEN = 2_000
"""A finding's ``detail`` is cut to this many characters (it is prose for an operator)."""

_FINDING_FIELDS = frozenset(
    {"finding", "metric", "coherence", "outliers", "allowance", "machines", "since_ts", "detail"}
)


@dataclass(frozen=True, slots=True)
class JobFinding:
    """What a detector found about a job as a whole, not about one machine.

    ``not_peer_comparable``: the job's machines are not alike on ``metric`` (no similarity
    alerts on it while it holds; ``coherence`` is the share of machines that stayed with their
    peers, ``outliers`` the distinct outlier events over the detector's horizon (machines
    that became outliers together count once) and ``allowance`` how many a job of peers may
    have); ``too_few_machines``: fewer than four
    machines, no peers (``metric`` is ``None``). ``since_ts``: data time the finding began;
    ``updated_ts``: data time it was last written (set by the store, ``None`` before).
    """

    finding: str
    metric: str | None
    machines: int
    since_ts: float
    detail: str = ""
    coherence: float | None = None
    outliers: int | None = None
    allowance: int | None = None
    updated_ts: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the finding within its job: ``(finding, metric or "")``."""
        return (self.finding, self.metric or "")

    @classmethod
    def coerce(cls, value: JobFinding | Mapping[str, Any]) -> JobFinding:
        """Accept a :class:`JobFinding` or a detector's finding dict (the keys of
        ``detectors.base.CompositeDetector.job_findings``), checked: a non-empty ``finding``,
        counts that are whole numbers >= 0, a coherence in [0, 1], a finite ``since_ts``."""
        if isinstance(value, JobFinding):
            return value
        if not isinstance(value, Mapping):
            raise ValidationError(
                f"job finding must be a JobFinding or a mapping, got {type(value).__name__}"
            )
        unknown = set(value) - _FINDING_FIELDS
        if unknown:
            raise ValidationError(
                f"job finding has unknown fields {sorted(unknown)}: allowed "
                f"{', '.join(sorted(_FINDING_FIELDS))}"
            )
        name = value.get("finding")
        if not isinstance(name, str) or not name or len(name) > FINDING_MAX_LEN:
            raise ValidationError(
                f"job finding name {name!r}: expected a non-empty string of at most "
                f"{FINDING_MAX_LEN} characters"
            )
        metric = value.get("metric")
        if metric == "":
            metric = None
        if metric is not None and (not isinstance(metric, str) or len(metric) > METRIC_MAX_LEN):
            raise ValidationError(
                f"job finding {name!r} has metric {metric!r}: expected None or a string of at "
                f"most {METRIC_MAX_LEN} characters"
            )
        detail = value.get("detail") or ""
        if not isinstance(detail, str):
            raise ValidationError(f"job finding {name!r} has detail {detail!r}: expected a string")
        if len(detail) > DETAIL_MAX_LEN:
            detail = detail[: DETAIL_MAX_LEN - 1] + "…"
        coherence = _number(name, "coherence", value.get("coherence"), optional=True)
        if coherence is not None and not 0.0 <= coherence <= 1.0:
            raise ValidationError(
                f"job finding {name!r} has coherence {coherence!r}: expected a share in [0, 1]"
            )
        since = _number(name, "since_ts", value.get("since_ts"), optional=False)
        assert since is not None
        machines = _count(name, "machines", value.get("machines"), optional=False)
        assert machines is not None
        return cls(
            finding=name,
            metric=metric,
            machines=machines,
            since_ts=since,
            detail=detail,
            coherence=coherence,
            outliers=_count(name, "outliers", value.get("outliers"), optional=True),
            allowance=_count(name, "allowance", value.get("allowance"), optional=True),
        )


def _number(finding: str, field: str, value: Any, *, optional: bool) -> float | None:
    """``value`` as a finite float (``None`` kept when ``optional``), else ValidationError."""
    if value is None and optional:
        return None
    # numbers only (numpy's too): a numeric string is a producer's bug, not a time or share
    number = float(value) if isinstance(value, numbers.Real) else math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValidationError(
            f"job finding {finding!r} has {field} {value!r}: expected a finite number"
        )
    return number


def _count(finding: str, field: str, value: Any, *, optional: bool) -> int | None:
    """``value`` as an int >= 0 (``None`` kept when ``optional``; numpy ints accepted)."""
    if value is None and optional:
        return None
    try:
        count = operator.index(value)
    except TypeError:
        count = -1
    if isinstance(value, bool) or count < 0:
        raise ValidationError(
            f"job finding {finding!r} has {field} {value!r}: expected a whole number >= 0"
        )
    return count


def parse_status(value: AlertStatus | str) -> AlertStatus:
    """``value`` as an :class:`AlertStatus`, refusing unknown names with the allowed ones."""
    try:
        return AlertStatus(value)
    except ValueError:
        allowed = [s.value for s in AlertStatus]
        raise ValidationError(f"unknown alert status {value!r}: allowed {allowed}") from None


class WhatIfStatus(StrEnum):
    """Where a what-if analysis stands: ``pending → running → done | failed``."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"

    @property
    def final(self) -> bool:
        """Whether the analysis is over (its report or its error is stored)."""
        return self in (WhatIfStatus.DONE, WhatIfStatus.FAILED)


@dataclass(frozen=True, slots=True)
class WhatIfSummary:
    """A stored what-if analysis without its report body (what listings return).

    Attributes
    ----------
    id
        The report id (the API's ``/api/v1/whatif/{id}``).
    job
        The job the trace belongs to: given at submission, else the trace's name once done.
    status
        Where the analysis stands.
    source
        What was analysed, for humans (uploaded file names or the server path).
    created_at, started_at, finished_at
        Wall time of the submission, of the start and of the end of the analysis, unix seconds.
    slowdown
        ``S = T_orig / T_ideal`` when done.
    verdict
        The root cause (``stage``, ``worker``, …) when done.
    error
        Why the analysis failed, when it did.
    """

    id: str
    job: str | None
    status: WhatIfStatus
    source: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    slowdown: float | None
    verdict: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class WhatIfRecord(WhatIfSummary):
    """A stored what-if analysis with its report (docs/architecture.md §3.5), None until done."""

    report: dict[str, Any] | None = None
