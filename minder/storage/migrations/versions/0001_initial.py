"""Initial schema: jobs, machines, current machine scores, alerts.

Revision ID: 0001
Revises:
Create Date: 2025-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    """Create the tables."""
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("first_seen_ts", sa.Double(), nullable=False),
        sa.Column("last_seen_ts", sa.Double(), nullable=False),
        sa.Column("machine_count", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_last_seen_ts"), "jobs", ["last_seen_ts"])

    op.create_table(
        "machines",
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("group", sa.String(255), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("last_seen_ts", sa.Double(), nullable=True),
        sa.Column("top_score", sa.Double(), nullable=True),
        sa.Column("top_metric", sa.String(128), nullable=True),
        sa.Column("top_device", sa.String(64), nullable=True),
        sa.Column("score_ts", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job"], ["jobs.id"], name=op.f("fk_machines_job_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job", "name", name=op.f("pk_machines")),
    )

    op.create_table(
        "machine_scores",
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("machine", sa.String(255), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job", "machine", "metric", name=op.f("pk_machine_scores")),
    )

    op.create_table(
        "alerts",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(1024), nullable=False),
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("machine", sa.String(255), nullable=False),
        sa.Column("devices", _JSON, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("first_ts", sa.Double(), nullable=False),
        sa.Column("detected_ts", sa.Double(), nullable=False),
        sa.Column("last_seen_ts", sa.Double(), nullable=False),
        sa.Column("occurrences", sa.Integer(), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("evidence", _JSON, nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index(op.f("ix_alerts_detected_ts"), "alerts", ["detected_ts"])
    op.create_index("ix_alerts_key_status", "alerts", ["key", "status"])
    op.create_index("ix_alerts_job_detected_ts", "alerts", ["job", "detected_ts"])
    op.create_index("ix_alerts_machine_detected_ts", "alerts", ["machine", "detected_ts"])
    op.create_index("ix_alerts_status_detected_ts", "alerts", ["status", "detected_ts"])
    op.create_index("ix_alerts_kind_detected_ts", "alerts", ["kind", "detected_ts"])


def downgrade() -> None:
    """Drop the tables."""
    op.drop_table("alerts")
    op.drop_table("machine_scores")
    op.drop_table("machines")
    op.drop_table("jobs")
