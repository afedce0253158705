"""`jobs.expected_duration_s` becomes `jobs.time_limit_s`, the name of what it holds: the time
limit each of the job's attempts may run for from its start (NULL: none), which the server
enforces and the engine plans with. Every stored value stays as it is.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _rename("expected_duration_s", "time_limit_s")


def downgrade() -> None:
    _rename("time_limit_s", "expected_duration_s")


def _rename(old: str, new: str) -> None:
    """Rename one column of `jobs` in place. Never by copying the table: SQLite would copy
    `jobs` for a batch, which the attempts' foreign keys refuse once there are attempts, and
    SQLite renames a column itself (ALTER TABLE ... RENAME COLUMN, SQLite 3.25 and later)."""
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.alter_column(old, new_column_name=new, existing_type=sa.Double(), existing_nullable=True)
