"""The Alert record (docs/architecture.md §3.4)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from minder.core.errors import ValidationError


class AlertKind(StrEnum):
    """What fired."""

    RULE = "rule"
    """A hard-fault rule (XID, ECC, GPU lost, link down, PCIe downgrade)."""
    SIMILARITY = "similarity"
    """The machine is a lasting outlier among its peers on a metric."""
    STRAGGLER = "straggler"
    """The machine slows the job down (step or collective time)."""
    SILENCE = "silence"
    """The machine stopped reporting while its peers go on."""
    HANG = "hang"
    """The job stopped advancing: every rank waits in a collective (docs/hangs.md). One job-level
    alert per hang (``machine`` empty) holds the analysis; each culprit machine gets its own
    ``hang`` alert, which is what the scheduler actions act on."""
    SUSPICIOUS_SOURCE = "suspicious_source"
    """An alert named a machine that, per the scheduler, does not run the alert's job (a forged or
    misrouted report): raised by the scheduler actions in place of acting, and never acted on."""


class AlertStatus(StrEnum):
    """Life cycle: ``open → acknowledged → resolved | false_positive``, and a self-check's
    verdict on a drained node: ``open | acknowledged → confirmed → resolved | false_positive`` or
    ``open | acknowledged → cleared_by_selfcheck`` (docs/selfcheck.md)."""

    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"
    FALSE_POSITIVE = "false_positive"
    CONFIRMED = "confirmed"
    """A self-check of the alert's drained node failed: the fault is real, the node stays out
    until a person resolves the alert (which returns it) or marks it a false positive."""
    CLEARED_BY_SELFCHECK = "cleared_by_selfcheck"
    """A self-check of the alert's drained node passed and the node was returned (final)."""


SERVICE_STATUSES: frozenset[AlertStatus] = frozenset(
    {AlertStatus.CONFIRMED, AlertStatus.CLEARED_BY_SELFCHECK}
)
"""Statuses only Minder's self-check service sets, from a verdict: a person cannot (the API's
``PATCH`` refuses them)."""

_TRANSITIONS: dict[AlertStatus, frozenset[AlertStatus]] = {
    AlertStatus.OPEN: frozenset(
        {
            AlertStatus.ACKNOWLEDGED,
            AlertStatus.RESOLVED,
            AlertStatus.FALSE_POSITIVE,
            AlertStatus.CONFIRMED,
            AlertStatus.CLEARED_BY_SELFCHECK,
        }
    ),
    AlertStatus.ACKNOWLEDGED: frozenset(
        {
            AlertStatus.RESOLVED,
            AlertStatus.FALSE_POSITIVE,
            AlertStatus.CONFIRMED,
            AlertStatus.CLEARED_BY_SELFCHECK,
        }
    ),
    # A check an operator asked for after a repair may pass: the node is then returned.
    AlertStatus.CONFIRMED: frozenset(
        {AlertStatus.RESOLVED, AlertStatus.FALSE_POSITIVE, AlertStatus.CLEARED_BY_SELFCHECK}
    ),
    AlertStatus.RESOLVED: frozenset(),
    AlertStatus.FALSE_POSITIVE: frozenset(),
    AlertStatus.CLEARED_BY_SELFCHECK: frozenset(),
}


def allowed_statuses(current: AlertStatus, *, by_service: bool = False) -> list[AlertStatus]:
    """The statuses an alert in ``current`` may move to: a person's choices, or (``by_service``)
    the self-check service's too."""
    return [
        status
        for status in AlertStatus
        if status in _TRANSITIONS[current] and (by_service or status not in SERVICE_STATUSES)
    ]


def check_transition(current: AlertStatus, new: AlertStatus, *, by_service: bool = False) -> None:
    """Refuse a status change the life cycle does not allow.

    ``by_service`` is True only for the self-check service applying a verdict: without it (a
    person, through the API or the CLI) ``confirmed`` and ``cleared_by_selfcheck`` are refused.
    """
    if new is current:
        return
    if new in _TRANSITIONS[current] and (by_service or new not in SERVICE_STATUSES):
        return
    allowed = sorted(s.value for s in allowed_statuses(current, by_service=by_service))
    shown = allowed or ["none (final status)"]
    why = (
        " (only Minder's self-check sets it, from its verdict)"
        if new in SERVICE_STATUSES and not by_service
        else ""
    )
    raise ValidationError(
        f"alert status cannot go from {current.value!r} to {new.value!r}{why}: allowed {shown}"
    )


def alert_key(job: str, machine: str, kind: AlertKind, metric: str) -> str:
    """Identity of a fault: the same key while an alert is open means the same fault."""
    return f"{job}/{machine}/{kind.value}/{metric}"


def make_alert_id(job: str, machine: str, kind: AlertKind, metric: str, first_ts: float) -> str:
    """A stable id: the fault's key and the second it was first seen.

    The service reuses the id of an open alert with the same key, so a fault reported again (every
    second, or after a replay from Kafka) stays one alert.
    """
    raw = f"{alert_key(job, machine, kind, metric)}@{int(first_ts)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


@dataclass(slots=True)
class Alert:
    """One detected fault.

    Attributes
    ----------
    machine
        The culprit machine, or the domain name for a domain-wide alert (then ``domain`` is set
        and ``evidence["domain_members"]`` lists the machines).
    devices
        Devices of the machine that deviate (``gpu3``, ``mlx5_1``), empty for host-level faults.
    score
        Rule alerts: 1.0 (or the count that fired); similarity: the robust z-score.
    first_ts
        Estimated onset, unix seconds.
    detected_ts
        When the detector fired, in data time (the timestamp of the sample that confirmed it).
    """

    job: str
    machine: str
    kind: AlertKind
    metric: str
    score: float
    first_ts: float
    detected_ts: float
    devices: tuple[str, ...] = ()
    domain: str = ""
    status: AlertStatus = AlertStatus.OPEN
    evidence: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = make_alert_id(self.job, self.machine, self.kind, self.metric, self.first_ts)

    @property
    def key(self) -> str:
        """See :func:`alert_key`."""
        return alert_key(self.job, self.machine, self.kind, self.metric)

    def with_status(self, status: AlertStatus, *, by_service: bool = False) -> Alert:
        """A copy in ``status``, refusing a transition the life cycle forbids (see
        :func:`check_transition` for ``by_service``)."""
        check_transition(self.status, status, by_service=by_service)
        return replace(self, status=status)

    def summary(self) -> dict[str, Any]:
        """The fields ``minder detect --format json`` prints for each alert."""
        return {
            "id": self.id,
            "job": self.job,
            "machine": self.machine,
            "devices": list(self.devices),
            "kind": self.kind.value,
            "metric": self.metric,
            "score": round(float(self.score), 4),
            "first_ts": self.first_ts,
            "detected_ts": self.detected_ts,
            "domain": self.domain,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain data (Kafka, API, storage)."""
        return {**self.summary(), "status": self.status.value, "evidence": self.evidence}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Alert:
        """Inverse of :meth:`to_dict`; refuses unknown kinds and statuses by name."""
        try:
            kind = AlertKind(data["kind"])
            status = AlertStatus(data.get("status", "open"))
            return cls(
                id=str(data.get("id", "")),
                job=str(data["job"]),
                machine=str(data["machine"]),
                devices=tuple(data.get("devices", ())),
                kind=kind,
                metric=str(data["metric"]),
                score=float(data["score"]),
                first_ts=float(data["first_ts"]),
                detected_ts=float(data["detected_ts"]),
                domain=str(data.get("domain", "")),
                status=status,
                evidence=dict(data.get("evidence", {})),
            )
        except KeyError as exc:
            raise ValidationError(f"alert is missing field {exc.args[0]!r}") from None
        except ValueError as exc:
            raise ValidationError(f"alert is malformed: {exc}") from None
