"""Self-checks: the report a node's ``minder selfcheck run`` gives, and the record the service keeps
of each check it schedules on a drained node (docs/selfcheck.md).

A self-check runs on a node that Minder took out of scheduling. Each check (GPU matmul, NVML
health, DCGM diagnostics, RDMA ports, a collective with healthy partners, clock, disk, memory ECC)
gives one :class:`CheckResult`; :func:`decide` turns them into one :class:`Verdict`:

- ``fail`` when any check failed (the reason names the failing checks);
- otherwise ``inconclusive`` when a check crashed (``error``) or no check could run at all;
- otherwise ``pass``.

A check whose hardware or tool is absent is ``skipped`` with the reason, and does not make the
verdict inconclusive as long as some check ran.

Everything here is plain data with ``to_dict``/``from_dict`` for JSON (the report the node posts
to the API, the database, the API's answers); ``from_dict`` validates bounds and types and raises
:class:`~minder.core.errors.ValidationError` with a one-line reason naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from minder.core.errors import MinderError, ValidationError

REPORT_VERSION = 1
"""Version of :meth:`SelfCheckReport.to_dict` (``schema_version``)."""
MAX_CHECKS = 64
"""Check results one report may carry."""
MAX_MEASUREMENTS = 256
"""Measurements one check result may carry."""
MAX_TEXT = 512
"""Longest summary, reason or measurement text kept."""
MAX_NAME = 64
"""Longest check, measurement or node name."""
TOKEN_HEADER = "Authorization"
"""The header carrying a check's one-time token: ``Authorization: Bearer <token>``."""


class SelfCheckTokenError(MinderError):
    """A report came without the check's token, or with a wrong one (the API answers 401)."""


class SelfCheckConflictError(MinderError):
    """A report came for a check that already has a verdict, or is not running (a replay, or a
    report after a timeout): refused (the API answers 409)."""


_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")
_MEASUREMENT_NAME = re.compile(r"[A-Za-z0-9_.:/\-\[\]]{1,64}")

Measurement = float | int | str | bool | None


class Verdict(StrEnum):
    """A self-check's answer."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class CheckStatus(StrEnum):
    """One check's outcome."""

    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"
    """Its hardware or tool is absent here (the summary says which)."""
    ERROR = "error"
    """It could not give an answer (crashed, timed out, unreadable output)."""


class SelfCheckState(StrEnum):
    """Where a scheduled self-check stands in the service."""

    PENDING = "pending"
    """Decided; waiting for a slot, for the node to be drained of its job, or for partners."""
    RUNNING = "running"
    """Launched on the scheduler; no verdict yet."""
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    """Stopped by a person, or because the alert was closed by a person first."""


FINAL_STATES = frozenset(
    {
        SelfCheckState.PASSED,
        SelfCheckState.FAILED,
        SelfCheckState.INCONCLUSIVE,
        SelfCheckState.TIMED_OUT,
        SelfCheckState.CANCELLED,
    }
)
STATE_OF_VERDICT: Mapping[Verdict, SelfCheckState] = {
    Verdict.PASS: SelfCheckState.PASSED,
    Verdict.FAIL: SelfCheckState.FAILED,
    Verdict.INCONCLUSIVE: SelfCheckState.INCONCLUSIVE,
}


def _text(value: Any, what: str, *, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} is {type(value).__name__}: expected a string")
    return value[:limit]


def _finite(value: Any, what: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"{what} is {str(value)[:40]!r}: expected a finite number")
    if minimum is not None and value < minimum:
        raise ValidationError(f"{what} is {value!r}: expected >= {minimum}")
    return float(value)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME or not _NAME.fullmatch(value):
        raise ValidationError(
            f"{what} {str(value)[:MAX_NAME]!r}: expected a lowercase dotted name such as "
            "'gpu.matmul' (letters, digits, '_', at most 64 characters)"
        )
    return value


def _enum(cls: type[StrEnum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(member.value for member in cls)
        raise ValidationError(f"{what} {str(value)[:40]!r}: expected one of {allowed}") from None


def _measurements(value: Any, what: str) -> dict[str, Measurement]:
    if not isinstance(value, Mapping):
        raise ValidationError(f"{what} is {type(value).__name__}: expected an object")
    if len(value) > MAX_MEASUREMENTS:
        raise ValidationError(
            f"{what} has {len(value)} entries: expected at most {MAX_MEASUREMENTS}"
        )
    out: dict[str, Measurement] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _MEASUREMENT_NAME.fullmatch(key):
            raise ValidationError(
                f"{what} key {str(key)[:MAX_NAME]!r}: expected 1-64 of letters, digits, _.:/-[]"
            )
        if item is None or isinstance(item, bool):
            out[key] = item
        elif isinstance(item, int | float):
            out[key] = item if isinstance(item, int) else _finite(item, f"{what}[{key}]")
        elif isinstance(item, str):
            out[key] = item[:MAX_TEXT]
        else:
            raise ValidationError(
                f"{what}[{key}] is {type(item).__name__}: expected a number, string, bool or null"
            )
    return out


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome on one node.

    Attributes
    ----------
    name
        Dotted check name: ``gpu.matmul``, ``gpu.nvml``, ``gpu.dcgm``, ``network.rdma``,
        ``network.ib_write_bw``, ``collective.allreduce``, ``host.clock``, ``host.disk``,
        ``host.memory_ecc``.
    status
        See :class:`CheckStatus`.
    summary
        One line for humans: what was measured against what, or why it was skipped or failed.
    measurements
        The figures behind the status (throughputs, baselines, counters, times), flat and named.
    duration_s
        Wall time the check took.
    """

    name: str
    status: CheckStatus
    summary: str
    measurements: Mapping[str, Measurement] = field(default_factory=dict)
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        _name(self.name, "check name")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "measurements": dict(self.measurements),
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, data: Any, what: str = "check") -> CheckResult:
        if not isinstance(data, Mapping):
            raise ValidationError(f"{what} is {type(data).__name__}: expected an object")
        return cls(
            name=_name(data.get("name"), f"{what}.name"),
            status=_enum(CheckStatus, data.get("status"), f"{what}.status"),
            summary=_text(data.get("summary", ""), f"{what}.summary"),
            measurements=_measurements(data.get("measurements", {}), f"{what}.measurements"),
            duration_s=_finite(data.get("duration_s", 0.0), f"{what}.duration_s", minimum=0.0),
        )


def decide(checks: Sequence[CheckResult]) -> tuple[Verdict, str]:
    """The verdict of a set of check results, and its one-line reason."""
    failed = [c.name for c in checks if c.status is CheckStatus.FAIL]
    if failed:
        return Verdict.FAIL, "failed: " + ", ".join(failed)
    errors = [c for c in checks if c.status is CheckStatus.ERROR]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return Verdict.INCONCLUSIVE, f"{first.name} gave no answer: {first.summary}{more}"
    passed = [c.name for c in checks if c.status is CheckStatus.PASS]
    if not passed:
        return Verdict.INCONCLUSIVE, "no check could run here: every check was skipped"
    return Verdict.PASS, "passed: " + ", ".join(passed)


@dataclass(frozen=True, slots=True)
class SelfCheckReport:
    """What ``minder selfcheck run`` reports for one node (docs/selfcheck.md, "Report").

    ``verdict`` and ``reason`` are :func:`decide` of ``checks``; ``from_dict`` recomputes them and
    refuses a report whose stated verdict disagrees with its checks.
    """

    node: str
    started_ts: float
    finished_ts: float
    checks: tuple[CheckResult, ...]
    verdict: Verdict
    reason: str
    check_id: str | None = None
    """The service's id of the check this report answers (None for a check run by hand)."""
    schema_version: int = REPORT_VERSION

    @classmethod
    def of(
        cls,
        node: str,
        started_ts: float,
        finished_ts: float,
        checks: Iterable[CheckResult],
        check_id: str | None = None,
    ) -> SelfCheckReport:
        """A report with its verdict decided from ``checks``."""
        results = tuple(checks)
        verdict, reason = decide(results)
        return cls(node, started_ts, finished_ts, results, verdict, reason, check_id)

    def failing(self) -> list[str]:
        """The names of the failed checks."""
        return [c.name for c in self.checks if c.status is CheckStatus.FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "check_id": self.check_id,
            "node": self.node,
            "started_ts": self.started_ts,
            "finished_ts": self.finished_ts,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "checks": [c.to_dict() for c in self.checks],
        }

    @classmethod
    def from_dict(cls, data: Any) -> SelfCheckReport:
        if not isinstance(data, Mapping):
            raise ValidationError(f"self-check report is {type(data).__name__}: expected an object")
        version = data.get("schema_version")
        if version != REPORT_VERSION:
            raise ValidationError(
                f"self-check report schema_version {str(version)[:20]!r}: expected {REPORT_VERSION}"
            )
        node = _text(data.get("node"), "report.node", limit=MAX_NAME * 4)
        if not node:
            raise ValidationError("report.node is empty: expected the node's name")
        check_id = data.get("check_id")
        if check_id is not None:
            check_id = _text(check_id, "report.check_id", limit=MAX_NAME)
        raw_checks = data.get("checks")
        if not isinstance(raw_checks, list):
            raise ValidationError(
                f"report.checks is {type(raw_checks).__name__}: expected a list of checks"
            )
        if len(raw_checks) > MAX_CHECKS:
            raise ValidationError(
                f"report.checks has {len(raw_checks)} entries: expected at most {MAX_CHECKS}"
            )
        checks = tuple(
            CheckResult.from_dict(item, f"report.checks[{i}]") for i, item in enumerate(raw_checks)
        )
        names = [c.name for c in checks]
        if len(set(names)) != len(names):
            raise ValidationError("report.checks names a check twice: expected each once")
        started = _finite(data.get("started_ts"), "report.started_ts", minimum=0.0)
        finished = _finite(data.get("finished_ts"), "report.finished_ts", minimum=started)
        stated = _enum(Verdict, data.get("verdict"), "report.verdict")
        report = cls.of(node, started, finished, checks, check_id)
        if stated is not report.verdict:
            raise ValidationError(
                f"report.verdict {stated.value!r} disagrees with its checks: they give "
                f"{report.verdict.value!r} ({report.reason[:120]})"
            )
        return report


@dataclass(frozen=True, slots=True)
class SelfCheckRecord:
    """The service's record of one self-check it scheduled (``GET /api/v1/selfchecks``).

    Attributes
    ----------
    id
        The check's id (also the scheduler's job name suffix).
    alert_id, job, machine
        The alert whose drain the check answers.
    node
        The scheduler's name of the machine.
    target
        ``slurm`` or ``kubernetes``.
    state
        See :class:`SelfCheckState`.
    attempt
        1 for the first check of this alert, 2 for a retry, …
    partners
        The healthy nodes the collective check ran with.
    created_ts, started_ts, finished_ts
        When the check was decided, launched and given its final state.
    drained_ts
        When Minder took the node out (the alert's applied action).
    returned_ts
        When the node went back to scheduling after a pass (None otherwise).
    scheduler_ref
        The scheduler's handle: Slurm job id and reservation, Kubernetes Job name.
    detail
        One line: why it is pending, what the verdict was, why it was inconclusive.
    report
        The node's report once received.
    """

    id: str
    alert_id: str
    job: str
    machine: str
    node: str
    target: str
    state: SelfCheckState
    attempt: int
    created_ts: float
    partners: tuple[str, ...] = ()
    started_ts: float | None = None
    finished_ts: float | None = None
    drained_ts: float | None = None
    returned_ts: float | None = None
    scheduler_ref: str | None = None
    detail: str = ""
    report: SelfCheckReport | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self.report.verdict if self.report is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "alert_id": self.alert_id,
            "job": self.job,
            "machine": self.machine,
            "node": self.node,
            "target": self.target,
            "state": self.state.value,
            "attempt": self.attempt,
            "partners": list(self.partners),
            "created_ts": self.created_ts,
            "started_ts": self.started_ts,
            "finished_ts": self.finished_ts,
            "drained_ts": self.drained_ts,
            "returned_ts": self.returned_ts,
            "scheduler_ref": self.scheduler_ref,
            "detail": self.detail,
            "verdict": self.verdict.value if self.verdict is not None else None,
            "report": self.report.to_dict() if self.report is not None else None,
        }
