"""Wire layouts (schema 2) learnt from the nodes, shared by every worker.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``wire_layouts``."""
    op.create_table(
        "wire_layouts",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("first_seen_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_wire_layouts")),
    )


def downgrade() -> None:
    """Drop ``wire_layouts``."""
    op.drop_table("wire_layouts")
