"""Lost work that says what it rests on: `jobs.saves_on_sigterm` (the submitter's declaration
that the job saves on SIGTERM), `attempts.lost_work_basis` (`reported`, `declared`, `assumed`,
`cancelled`) and `attempts.last_checkpoint_step` (the step of the newest checkpoint reported).

Attempts measured before this revision get the basis their facts give: `reported` where a
checkpoint was reported, else `assumed`. A cancel is no preemption: an attempt a cancel ended
is charged nothing (NULL where no preemption stopped it, 0 `cancelled` where one did); nor is a
time limit: an attempt that ran out its limit with no preemption has no lost work.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL = (
    "UPDATE attempts SET lost_work_gpu_s = NULL WHERE reason IN ('cancelled', 'timeout') AND preemption_kind IS NULL",
    "UPDATE attempts SET lost_work_gpu_s = 0, lost_work_basis = 'cancelled' "
    "WHERE reason = 'cancelled' AND preemption_kind IS NOT NULL AND lost_work_gpu_s IS NOT NULL",
    "UPDATE attempts SET lost_work_basis = 'reported' "
    "WHERE lost_work_gpu_s IS NOT NULL AND lost_work_basis IS NULL AND last_checkpoint_at IS NOT NULL",
    "UPDATE attempts SET lost_work_basis = 'assumed' WHERE lost_work_gpu_s IS NOT NULL AND lost_work_basis IS NULL",
)


def upgrade() -> None:
    # Not in a batch: SQLite would copy `jobs` for it, which the attempts' foreign keys refuse
    # once there are attempts; an added column with a constant default needs no copy.
    op.add_column("jobs", sa.Column("saves_on_sigterm", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("last_checkpoint_step", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("lost_work_basis", sa.String(length=16), nullable=True))
    for statement in BACKFILL:
        op.execute(statement)


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("lost_work_basis")
        batch.drop_column("last_checkpoint_step")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("saves_on_sigterm")
