"""`servers.ca`: the CA that signed each server's own TLS certificate, so that a job given the
URLs of every server of the database trusts each of them (`WARDEN_CA`).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("servers", sa.Column("ca", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("servers") as batch:
        batch.drop_column("ca")
