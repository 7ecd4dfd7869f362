"""Self-checks of drained nodes (docs/selfcheck.md): one row per check, from the service's
decision to the consequences of its verdict.

Revision ID: 0008
Revises: 0007
Create Date: 2027-01-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATES = ("pending", "running", "passed", "failed", "inconclusive", "timed_out", "cancelled")


def upgrade() -> None:
    """Create ``selfchecks``."""
    op.create_table(
        "selfchecks",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("alert_id", sa.String(64), nullable=False),
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("machine", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("target", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("partners", sa.JSON(), nullable=False),
        sa.Column("created_ts", sa.Double(), nullable=False),
        sa.Column("started_ts", sa.Double(), nullable=True),
        sa.Column("finished_ts", sa.Double(), nullable=True),
        sa.Column("drained_ts", sa.Double(), nullable=True),
        sa.Column("returned_ts", sa.Double(), nullable=True),
        sa.Column("applied_ts", sa.Double(), nullable=True),
        sa.Column("scheduler_ref", sa.String(255), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("token_sha256", sa.String(64), nullable=True),
        sa.Column("requested_by", sa.String(255), nullable=True),
        sa.Column("claimed_until", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.CheckConstraint(
            "state IN ({})".format(", ".join(f"'{s}'" for s in STATES)),
            name=op.f("ck_selfchecks_state"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_selfchecks")),
        sa.UniqueConstraint("alert_id", "attempt", name=op.f("uq_selfchecks_alert_id_attempt")),
    )
    op.create_index(op.f("ix_selfchecks_alert_id"), "selfchecks", ["alert_id"])
    op.create_index(op.f("ix_selfchecks_created_ts"), "selfchecks", ["created_ts"])
    op.create_index("ix_selfchecks_state_created_ts", "selfchecks", ["state", "created_ts"])
    op.create_index("ix_selfchecks_node_created_ts", "selfchecks", ["node", "created_ts"])


def downgrade() -> None:
    """Drop ``selfchecks``."""
    op.drop_table("selfchecks")
