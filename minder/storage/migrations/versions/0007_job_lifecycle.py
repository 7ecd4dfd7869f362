"""The job lifecycle (docs/operations.md, "Job lifecycle"): active, idle, ended.

``jobs`` gains the machines in the job now (``active_machines``), when and why it entered its
status (``status_since``, ``status_reason``) and when a worker last said it is active
(``reported_at``); ``finished`` (set by no one but tools) becomes ``ended``. Jobs stored as
active keep that status: the service makes those it does not hold idle within a minute of its
start (their ``reported_at`` is their last update).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the lifecycle columns, filled from each job's last update."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("active_machines", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("status_since", sa.Double(), nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("status_reason", sa.String(255), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("reported_at", sa.Double(), nullable=False, server_default="0"))
        batch.create_index(op.f("ix_jobs_status"), ["status"])
    op.execute(
        "UPDATE jobs SET status_since = updated_at, reported_at = updated_at, "
        "active_machines = CASE WHEN status = 'active' THEN machine_count ELSE 0 END"
    )
    op.execute("UPDATE jobs SET status = 'ended', status_reason = 'finished' "
               "WHERE status = 'finished'")  # fmt: skip


def downgrade() -> None:
    """Drop the lifecycle columns; idle and ended jobs become finished."""
    op.execute("UPDATE jobs SET status = 'finished' WHERE status IN ('idle', 'ended')")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_status"))
        batch.drop_column("reported_at")
        batch.drop_column("status_reason")
        batch.drop_column("status_since")
        batch.drop_column("active_machines")
