"""The dashboard's history: `history_samples` (a sample of the cluster and every queue, taken
every minute by the reconcile loop, kept 30 days), and what a preemption was:
`attempts.preemption_kind` (`preemption`, `reclaim`, `eviction`; NULL for a cancel's SIGTERM)
with an index on `attempts.sigterm_at` for `GET /v1/preemptions`.

Attempts preempted before this revision get their kind from the PREEMPTING event written at
their SIGTERM (its reason says `(reclaim)`, or starts `evicted:` for a node that went down).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_AT_SIGTERM = (
    "EXISTS (SELECT 1 FROM events e WHERE e.job_id = attempts.job_id AND e.to_state = 'PREEMPTING' "
    "AND e.at = attempts.sigterm_at AND e.reason LIKE '{pattern}')"
)
BACKFILL = (
    "UPDATE attempts SET preemption_kind = 'reclaim' WHERE preempted_for IS NOT NULL AND "
    + _AT_SIGTERM.format(pattern="%(reclaim)%"),
    "UPDATE attempts SET preemption_kind = 'preemption' WHERE preempted_for IS NOT NULL AND preemption_kind IS NULL",
    "UPDATE attempts SET preemption_kind = 'eviction' WHERE preempted_for IS NULL AND sigterm_at IS NOT NULL AND "
    + _AT_SIGTERM.format(pattern="evicted:%"),
)


def upgrade() -> None:
    op.create_table(
        "history_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("lost_totals", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_history_samples")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_history_samples_at", "history_samples", ["at"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("preemption_kind", sa.String(length=16), nullable=True))
    op.create_index("ix_attempts_sigterm_at", "attempts", ["sigterm_at"])
    for statement in BACKFILL:
        op.execute(statement)


def downgrade() -> None:
    op.drop_index("ix_attempts_sigterm_at", table_name="attempts")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("preemption_kind")
    op.drop_index("ix_history_samples_at", table_name="history_samples")
    op.drop_table("history_samples")
