"""The leader's lease: `leader_lease`, one row (id 1, epoch 0, expired, no holder), which the
server that leads holds and renews, and whose `epoch` fences every write the leader makes
(docs/control-plane.md, "Several servers"; `warden.store.leadership`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    lease = op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("acquired_at", sa.Double(), nullable=True),
        sa.Column("renewed_at", sa.Double(), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_started", sa.BigInteger(), nullable=True),
        sa.Column("url", sa.String(length=1024), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leader_lease")),
    )
    op.bulk_insert(lease, [{"id": 1, "holder": None, "epoch": 0, "expires_at": 0.0}])


def downgrade() -> None:
    op.drop_table("leader_lease")
