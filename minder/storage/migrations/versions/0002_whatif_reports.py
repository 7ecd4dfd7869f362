"""What-if reports: one row per analysis of a job trace submitted to the API.

Revision ID: 0002
Revises: 0001
Create Date: 2025-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``whatif_reports``."""
    op.create_table(
        "whatif_reports",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("job", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("slowdown", sa.Double(), nullable=True),
        sa.Column("verdict", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        # plain JSON on every backend (see the model): the report keeps its key order
        sa.Column("report", sa.JSON(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'done', 'failed')",
            name=op.f("ck_whatif_reports_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_whatif_reports")),
    )
    op.create_index(op.f("ix_whatif_reports_created_at"), "whatif_reports", ["created_at"])
    op.create_index("ix_whatif_reports_job_created_at", "whatif_reports", ["job", "created_at"])


def downgrade() -> None:
    """Drop ``whatif_reports``."""
    op.drop_table("whatif_reports")
