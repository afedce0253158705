"""A submission may carry an Idempotency-Key: unique per user, with the digest of the request
that used it, so a retried submission returns its job instead of creating another.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(255), nullable=True))
        batch.add_column(sa.Column("request_digest", sa.String(64), nullable=True))
        batch.create_unique_constraint("uq_jobs_user_idempotency_key", ["user", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_user_idempotency_key", type_="unique")
        batch.drop_column("request_digest")
        batch.drop_column("idempotency_key")
