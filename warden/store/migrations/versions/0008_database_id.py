"""The database's identity: `meta` holds `database_id`, a random UUID made once, which a
server's state directory records at its first start so that it is never used with another
database (docs/control-plane.md, "Where state lives").

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    meta = op.create_table(
        "meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_meta")),
    )
    op.bulk_insert(meta, [{"key": "database_id", "value": str(uuid.uuid4())}])


def downgrade() -> None:
    op.drop_table("meta")
