"""The servers of one database: `servers`, a row per running server (its API's URL, which run
of it, when it was last seen by the database's clock), so that the leader gives each job every
server's URL to report to (docs/control-plane.md, "Several servers"; `warden.store.servers`).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "servers",
        sa.Column("url", sa.String(length=1024), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("seen_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("url", name=op.f("pk_servers")),
    )


def downgrade() -> None:
    op.drop_table("servers")
