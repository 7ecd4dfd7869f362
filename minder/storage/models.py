"""ORM models. Internal to :mod:`minder.storage`: the repository functions return dataclasses.

Timestamps are unix seconds (``DOUBLE PRECISION``), like everywhere else in Minder: the ``*_ts``
columns are data time (what the machines reported), ``created_at``/``updated_at`` are wall time.
Changing a model needs a new migration in ``migrations/versions`` (a test compares them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# JSONB on PostgreSQL (indexable, compact), JSON text elsewhere.
JsonType = JSON().with_variant(JSONB(), "postgresql")

# Deterministic constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every Minder table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRow(Base):
    """A training job Minder has seen, and where it is in its life (``active``, ``idle``,
    ``ended``: :class:`minder.storage.records.JobStatus`)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    first_seen_ts: Mapped[float] = mapped_column(Double)
    last_seen_ts: Mapped[float] = mapped_column(Double, index=True)
    machine_count: Mapped[int] = mapped_column(Integer, default=0)
    """Machines the job has had (registered rows of ``machines``)."""
    status: Mapped[str] = mapped_column(String(32), default="active", index=True)
    updated_at: Mapped[float] = mapped_column(Double)
    active_machines: Mapped[int] = mapped_column(Integer, default=0)
    """Machines in the job now, as the worker that holds it last reported (0 unless active)."""
    status_since: Mapped[float] = mapped_column(Double)
    """Wall time the job entered its status (the worker's clock)."""
    status_reason: Mapped[str] = mapped_column(String(255), default="")
    reported_at: Mapped[float] = mapped_column(Double)
    """Wall time a worker last said the job is active: an active job without word for a while
    was held by a worker that stopped (a restart), and becomes idle."""


class MachineRow(Base):
    """A machine of a job, with its current top score (maintained by ``save_scores``)."""

    __tablename__ = "machines"

    job: Mapped[str] = mapped_column(
        String(255), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    group: Mapped[str] = mapped_column(String(255), default="")
    domain: Mapped[str] = mapped_column(String(255), default="")
    last_seen_ts: Mapped[float | None] = mapped_column(Double, nullable=True)
    top_score: Mapped[float | None] = mapped_column(Double, nullable=True)
    top_metric: Mapped[str | None] = mapped_column(String(128), nullable=True)
    top_device: Mapped[str | None] = mapped_column(String(64), nullable=True)
    score_ts: Mapped[float | None] = mapped_column(Double, nullable=True)


class MachineScoreRow(Base):
    """The current score of one machine on one metric; replaced as a whole per job."""

    __tablename__ = "machine_scores"

    job: Mapped[str] = mapped_column(String(255), primary_key=True)
    machine: Mapped[str] = mapped_column(String(255), primary_key=True)
    metric: Mapped[str] = mapped_column(String(128), primary_key=True)
    score: Mapped[float] = mapped_column(Double)
    device: Mapped[str] = mapped_column(String(64), default="")
    ts: Mapped[float] = mapped_column(Double)


class JobFindingRow(Base):
    """A current job-level finding (``detectors.base.CompositeDetector.job_findings``): what
    the detectors found about the job as a whole. The service replaces a job's rows when its
    set of findings changes; a finding that ended has no row."""

    __tablename__ = "job_findings"

    job: Mapped[str] = mapped_column(
        String(255), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    finding: Mapped[str] = mapped_column(String(64), primary_key=True)
    # '' when the finding is about no one metric (too_few_machines): part of the key
    metric: Mapped[str] = mapped_column(String(128), primary_key=True)
    coherence: Mapped[float | None] = mapped_column(Double, nullable=True)
    outliers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allowance: Mapped[int | None] = mapped_column(Integer, nullable=True)
    machines: Mapped[int] = mapped_column(Integer)
    since_ts: Mapped[float] = mapped_column(Double)
    updated_ts: Mapped[float] = mapped_column(Double)
    detail: Mapped[str] = mapped_column(Text, default="")


class JobHangRow(Base):
    """The latest hang analysis of a job (:class:`minder.core.hang.HangAnalysis`): the
    cross-rank verdict on its flight-recorder dumps, one row per job, replaced by each newer
    analysis (the one that says the hang is over too)."""

    __tablename__ = "job_hangs"

    job: Mapped[str] = mapped_column(
        String(255), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    hung: Mapped[bool] = mapped_column(Boolean)
    culprits: Mapped[int] = mapped_column(Integer)
    """Culprit ranks of the analysis (the distinct ranks named)."""
    analysed_ts: Mapped[float] = mapped_column(Double)
    """When the analysis was made (its ``analysed_ts``), unix seconds."""
    updated_ts: Mapped[float] = mapped_column(Double)
    """Data time at which the service stored it."""
    # plain JSON, not JSONB: read whole only, and its key order is HangAnalysis.to_dict's
    analysis: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Double)


class AlertRow(Base):
    """One alert, deduplicated by id and by open key (see ``minder.storage.alerts``)."""

    __tablename__ = "alerts"
    __table_args__ = (
        # open-key lookup of the dedup, and the job/status filters of the API
        Index("ix_alerts_key_status", "key", "status"),
        Index("ix_alerts_job_detected_ts", "job", "detected_ts"),
        Index("ix_alerts_machine_detected_ts", "machine", "detected_ts"),
        Index("ix_alerts_status_detected_ts", "status", "detected_ts"),
        Index("ix_alerts_kind_detected_ts", "kind", "detected_ts"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(1024))
    job: Mapped[str] = mapped_column(String(255))
    machine: Mapped[str] = mapped_column(String(255))
    devices: Mapped[list[str]] = mapped_column(JsonType)
    kind: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str] = mapped_column(String(128))
    score: Mapped[float] = mapped_column(Double)
    first_ts: Mapped[float] = mapped_column(Double)
    detected_ts: Mapped[float] = mapped_column(Double, index=True)
    last_seen_ts: Mapped[float] = mapped_column(Double)
    occurrences: Mapped[int] = mapped_column(Integer, default=1)
    domain: Mapped[str] = mapped_column(String(255), default="")
    status: Mapped[str] = mapped_column(String(32))
    evidence: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)


WHATIF_STATUSES = ("pending", "running", "done", "failed")
"""Every status of a what-if report (:class:`minder.storage.records.WhatIfStatus`)."""


class WhatIfReportRow(Base):
    """One what-if analysis of a job trace, from submission to its stored report."""

    __tablename__ = "whatif_reports"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s}'" for s in WHATIF_STATUSES)), name="status"
        ),
        # the API lists newest first, optionally for one job
        Index("ix_whatif_reports_job_created_at", "job", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # known at submission only when the client names it; else the trace's name, when done
    job: Mapped[str | None] = mapped_column(String(255), nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Double, index=True)
    started_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    slowdown: Mapped[float | None] = mapped_column(Double, nullable=True)
    verdict: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # plain JSON, not JSONB: the report is only ever read whole, and JSON keeps its key order
    # (docs/architecture.md §3.5 keys first), which JSONB would sort away
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


OUTBOX_STATUSES = ("pending", "delivered", "expired")
"""Every status of an outbox row (:class:`minder.storage.outbox.DeliveryStatus`)."""


class OutboxRow(Base):
    """One event to deliver to one destination, written in the transaction that caused it.

    Rows stay until delivered or expired; ``delivery_id`` is stable across attempts and
    restarts, so receivers can de-duplicate (at-least-once delivery).
    """

    __tablename__ = "outbox"
    __table_args__ = (
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s}'" for s in OUTBOX_STATUSES)), name="status"
        ),
        # what a delivery worker asks for: its destination's pending rows, due first
        Index(
            "ix_outbox_destination_status_next_attempt_at",
            "destination",
            "status",
            "next_attempt_at",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(64), unique=True)
    destination: Mapped[str] = mapped_column(String(128))
    event: Mapped[str] = mapped_column(String(64))
    alert_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    job: Mapped[str | None] = mapped_column(String(255), nullable=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Double, index=True)
    next_attempt_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
    delivered_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    lease_until: Mapped[float] = mapped_column(Double, default=0.0)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ActionAuditRow(Base):
    """One attempt, result or undo of a scheduler action (or why none was taken)."""

    __tablename__ = "action_audit"
    __table_args__ = (Index("ix_action_audit_machine_created_at", "machine", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Double, index=True)
    alert_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    job: Mapped[str | None] = mapped_column(String(255), nullable=True)
    machine: Mapped[str | None] = mapped_column(String(255), nullable=True)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    target: Mapped[str] = mapped_column(String(32))
    operation: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(32), index=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    delivery_id: Mapped[str | None] = mapped_column(String(64), nullable=True)


class BreakerRow(Base):
    """State of a circuit breaker: once tripped, it stays so until an operator resets it."""

    __tablename__ = "breakers"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    tripped: Mapped[int] = mapped_column(Integer, default=0)
    tripped_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    reset_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    reset_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    updated_at: Mapped[float] = mapped_column(Double)


class JobSettingRow(Base):
    """Per-job operator settings (today: whether Minder may act on the job's machines)."""

    __tablename__ = "job_settings"

    job: Mapped[str] = mapped_column(String(255), primary_key=True)
    actions_enabled: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[float] = mapped_column(Double)
    updated_by: Mapped[str | None] = mapped_column(String(255), nullable=True)


class WireLayoutRow(Base):
    """A wire layout (schema 2) some worker learnt from a node's announcement, kept so that any
    worker decodes that layout's batches before the node announces it again (a restart, a
    partition taken over). Written once, never changed: the id is the hash of the definition.
    """

    __tablename__ = "wire_layouts"

    # the 64-bit layout id as 16 lower-case hex digits (as logged: 0x…); portable, unsigned
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    # the definition as the wire carries it ("layout_def"); plain JSON, read whole only
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    first_seen_at: Mapped[float] = mapped_column(Double)


SELFCHECK_STATES = ("pending", "running", "passed", "failed", "inconclusive", "timed_out",
                    "cancelled")  # fmt: skip
"""Every state of a self-check (:class:`minder.core.selfcheck.SelfCheckState`)."""


class SelfCheckRow(Base):
    """One self-check of a node Minder drained (:class:`minder.core.selfcheck.SelfCheckRecord`),
    from the service's decision to the consequences of its verdict (``applied_ts``).

    The check's one-time token is kept only as its SHA-256 (``token_sha256``); ``claimed_until``
    is a short lease of the service replica that is acting on the row's scheduler side, so two
    replicas never launch or release the same check at once.
    """

    __tablename__ = "selfchecks"
    __table_args__ = (
        CheckConstraint(
            "state IN ({})".format(", ".join(f"'{s}'" for s in SELFCHECK_STATES)), name="state"
        ),
        # one check per attempt of an alert: two replicas deciding the same check insert once
        UniqueConstraint("alert_id", "attempt"),
        # the service's passes (by state), the API's lists (newest first, per node or alert)
        Index("ix_selfchecks_state_created_ts", "state", "created_ts"),
        Index("ix_selfchecks_node_created_ts", "node", "created_ts"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    alert_id: Mapped[str] = mapped_column(String(64), index=True)
    job: Mapped[str] = mapped_column(String(255))
    machine: Mapped[str] = mapped_column(String(255))
    node: Mapped[str] = mapped_column(String(255))
    target: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    partners: Mapped[list[str]] = mapped_column(JSON)
    created_ts: Mapped[float] = mapped_column(Double, index=True)
    started_ts: Mapped[float | None] = mapped_column(Double, nullable=True)
    finished_ts: Mapped[float | None] = mapped_column(Double, nullable=True)
    drained_ts: Mapped[float | None] = mapped_column(Double, nullable=True)
    returned_ts: Mapped[float | None] = mapped_column(Double, nullable=True)
    applied_ts: Mapped[float | None] = mapped_column(Double, nullable=True)
    """When the service applied the verdict's consequences (node, alert); None until then."""
    scheduler_ref: Mapped[str | None] = mapped_column(String(255), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    # plain JSON, read whole only (SelfCheckReport.to_dict)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    token_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    requested_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    claimed_until: Mapped[float] = mapped_column(Double, default=0.0)
    updated_at: Mapped[float] = mapped_column(Double)
