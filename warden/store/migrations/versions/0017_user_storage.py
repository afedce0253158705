"""What each user's jobs keep: `user_storage`, a row per user with the UTF-8 bytes of the
command, env and workdir of all their jobs (`warden.store.jobs.stored_bytes`), which the
policy's `limits.max_stored_bytes_per_user` bounds, filled from the jobs already stored;
`jobs.command_expired_at`, when a finished job's were dropped to make room under it, with
`ix_jobs_user_command_expired_at_id` to find those a user still keeps; and
`ix_jobs_submit_at_attempt_state`, from which an export finds and counts its jobs.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 50
"""Jobs read at a time while counting: the backfill holds one batch of commands and envs (at
most 50 × 512 KiB under the default limits)."""


def upgrade() -> None:
    storage = op.create_table(
        "user_storage",
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user", name=op.f("pk_user_storage")),
    )
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.Integer()),
        sa.column("user", sa.String()),
        sa.column("command", sa.JSON()),
        sa.column("env", sa.JSON()),
        sa.column("workdir", sa.Text()),
    )
    conn = op.get_bind()
    totals: dict[str, int] = {}
    last = 0
    while True:
        query = sa.select(jobs.c.id, jobs.c.user, jobs.c.command, jobs.c.env, jobs.c.workdir)
        batch = conn.execute(query.where(jobs.c.id > last).order_by(jobs.c.id).limit(_BATCH)).all()
        if not batch:
            break
        for _, user, command, env, workdir in batch:
            totals[user] = totals.get(user, 0) + _stored_bytes(command or [], env or {}, workdir or "")
        last = batch[-1][0]
    if totals:
        op.bulk_insert(storage, [{"user": u, "stored_bytes": n} for u, n in sorted(totals.items())])
    op.create_index("ix_jobs_submit_at_attempt_state", "jobs", ["submit_at", "attempt", "state"])
    op.add_column("jobs", sa.Column("command_expired_at", sa.Double(), nullable=True))
    op.create_index("ix_jobs_user_command_expired_at_id", "jobs", ["user", "command_expired_at", "id"])


def _stored_bytes(command: list[str], env: dict[str, str], workdir: str) -> int:
    """`warden.store.jobs.stored_bytes` as of this revision (a migration keeps its own copy)."""
    words = sum(len(w.encode()) for w in command)
    return words + sum(len(k.encode()) + len(v.encode()) for k, v in env.items()) + len(workdir.encode())


def downgrade() -> None:
    op.drop_index("ix_jobs_user_command_expired_at_id", table_name="jobs")
    op.drop_index("ix_jobs_submit_at_attempt_state", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("command_expired_at")
    op.drop_table("user_storage")
