"""Job-level detection findings (a metric on which the job's machines are not peers, a job too
small to have peers), current per job.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``job_findings`` (its rows go with their job)."""
    op.create_table(
        "job_findings",
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("finding", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("coherence", sa.Double(), nullable=True),
        sa.Column("outliers", sa.Integer(), nullable=True),
        sa.Column("allowance", sa.Integer(), nullable=True),
        sa.Column("machines", sa.Integer(), nullable=False),
        sa.Column("since_ts", sa.Double(), nullable=False),
        sa.Column("updated_ts", sa.Double(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job"], ["jobs.id"], name=op.f("fk_job_findings_job_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job", "finding", "metric", name=op.f("pk_job_findings")),
    )


def downgrade() -> None:
    """Drop ``job_findings``."""
    op.drop_table("job_findings")
