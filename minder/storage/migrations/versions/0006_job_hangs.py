"""The latest hang analysis of each job (docs/hangs.md): one row per job.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-14
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``job_hangs`` (its row goes with its job)."""
    op.create_table(
        "job_hangs",
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("hung", sa.Boolean(), nullable=False),
        sa.Column("culprits", sa.Integer(), nullable=False),
        sa.Column("analysed_ts", sa.Double(), nullable=False),
        sa.Column("updated_ts", sa.Double(), nullable=False),
        sa.Column("analysis", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job"], ["jobs.id"], name=op.f("fk_job_hangs_job_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job", name=op.f("pk_job_hangs")),
    )


def downgrade() -> None:
    """Drop ``job_hangs``."""
    op.drop_table("job_hangs")
