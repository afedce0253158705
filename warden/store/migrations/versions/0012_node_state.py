"""What the leader's executor last reported of each node beyond its capacity: why it takes no
job (`down`: Slurm's DOWN or DRAIN, a Ray node lost) and how many of its GPUs work that is not
warden's holds (`foreign_gpus`), so that standbys show and check against the cluster as the
leader sees it (docs/control-plane.md, "Several servers").

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("down", sa.String(length=1024), nullable=True))
    op.add_column("nodes", sa.Column("foreign_gpus", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("foreign_gpus")
        batch.drop_column("down")
