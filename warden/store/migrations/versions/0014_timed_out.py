"""Attempts that ran out their job's time limit: `attempts.timed_out`, which makes their exit
end the job TIMEOUT (docs/engine.md, "The job lifecycle"); false for every attempt made before
this revision.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("timed_out", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("timed_out")
