"""Attempts remember what the workload SDK reported (progress, checkpoints) and the work a
preemption actually lost.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("progress_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("progress_samples", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("progress_at", sa.Double(), nullable=True))
        batch.add_column(sa.Column("checkpoints", sa.Integer(), nullable=False, server_default=sa.text("0")))
        batch.add_column(sa.Column("lost_work_gpu_s", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        for name in ("lost_work_gpu_s", "checkpoints", "progress_at", "progress_samples", "progress_step"):
            batch.drop_column(name)
