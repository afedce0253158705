"""Progress counters reported by a workload (training steps, samples) outgrow 32 bits on a
long run: `attempts.progress_step` and `progress_samples` become BigInteger (int8 on
PostgreSQL; SQLite's INTEGER already holds 64 bits).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("progress_step", "progress_samples")


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        for name in COLUMNS:
            batch.alter_column(name, existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        for name in COLUMNS:
            batch.alter_column(name, existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True)
