"""Which GPUs of each node work that is not warden's holds (`nodes.foreign_indices`, a JSON
list, sorted), beside how many (`foreign_gpus`, which also counts those a substrate cannot
name by index), so that standbys and the dashboard show foreign GPUs where they are.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("foreign_indices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("foreign_indices")
