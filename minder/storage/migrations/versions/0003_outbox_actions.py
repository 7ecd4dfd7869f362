"""Outbox of alert events, action audit trail, circuit breakers, per-job settings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``outbox``, ``action_audit``, ``breakers`` and ``job_settings``."""
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.String(64), nullable=False),
        sa.Column("destination", sa.String(128), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("alert_id", sa.String(64), nullable=True),
        sa.Column("job", sa.String(255), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("lease_until", sa.Double(), nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'expired')", name=op.f("ck_outbox_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
        sa.UniqueConstraint("delivery_id", name=op.f("uq_outbox_delivery_id")),
    )
    op.create_index(op.f("ix_outbox_alert_id"), "outbox", ["alert_id"])
    op.create_index(op.f("ix_outbox_created_at"), "outbox", ["created_at"])
    op.create_index(
        "ix_outbox_destination_status_next_attempt_at",
        "outbox",
        ["destination", "status", "next_attempt_at"],
    )
    op.create_table(
        "action_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("alert_id", sa.String(64), nullable=True),
        sa.Column("job", sa.String(255), nullable=True),
        sa.Column("machine", sa.String(255), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("target", sa.String(32), nullable=False),
        sa.Column("operation", sa.String(32), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("delivery_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_action_audit")),
    )
    op.create_index(op.f("ix_action_audit_created_at"), "action_audit", ["created_at"])
    op.create_index(op.f("ix_action_audit_alert_id"), "action_audit", ["alert_id"])
    op.create_index(op.f("ix_action_audit_outcome"), "action_audit", ["outcome"])
    op.create_index("ix_action_audit_machine_created_at", "action_audit", ["machine", "created_at"])
    op.create_table(
        "breakers",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("tripped", sa.Integer(), nullable=False),
        sa.Column("tripped_at", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("reset_at", sa.Double(), nullable=True),
        sa.Column("reset_by", sa.String(255), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_breakers")),
    )
    # The actions breaker exists from the start, so that its row lock serialises the replicas'
    # breaker checks (SELECT … FOR UPDATE locks nothing on a row that does not exist).
    op.bulk_insert(
        sa.table(
            "breakers",
            sa.column("name", sa.String),
            sa.column("tripped", sa.Integer),
            sa.column("updated_at", sa.Double),
        ),
        [{"name": "actions", "tripped": 0, "updated_at": 0.0}],
    )
    op.create_table(
        "job_settings",
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("actions_enabled", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("job", name=op.f("pk_job_settings")),
    )


def downgrade() -> None:
    """Drop the four tables."""
    op.drop_table("job_settings")
    op.drop_table("breakers")
    op.drop_table("action_audit")
    op.drop_table("outbox")
