"""Initial schema: jobs, attempts, events, tokens, audit (append-only), policies, ledger, nodes.

Written out in full rather than derived from `warden.store.schema`, so that this revision keeps
creating the same tables after the classes change; tests/store/test_migrations.py checks that
head matches the classes.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AUDIT_REFUSAL = "audit is append-only"

SQLITE_AUDIT_TRIGGERS = (
    f"CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit "
    f"BEGIN SELECT RAISE(ABORT, '{AUDIT_REFUSAL}: UPDATE refused'); END",
    f"CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit "
    f"BEGIN SELECT RAISE(ABORT, '{AUDIT_REFUSAL}: DELETE refused'); END",
)

POSTGRES_AUDIT_TRIGGERS = (
    f"""CREATE FUNCTION warden_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{AUDIT_REFUSAL}: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
    END
    $$""",
    "CREATE TRIGGER audit_no_update_delete BEFORE UPDATE OR DELETE ON audit "
    "FOR EACH ROW EXECUTE FUNCTION warden_audit_append_only()",
    "CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit "
    "FOR EACH STATEMENT EXECUTE FUNCTION warden_audit_append_only()",
)


def _json() -> sa.JSON:
    return sa.JSON()


def _nullable_json() -> sa.JSON:
    return sa.JSON(none_as_null=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("tier", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("cpu", sa.Integer(), nullable=False),
        sa.Column("memory", sa.Integer(), nullable=False),
        sa.Column("flavor", sa.String(length=255), nullable=True),
        sa.Column("placement", sa.String(length=16), nullable=False),
        sa.Column("lease_s", sa.Double(), nullable=True),
        sa.Column("grace_s", sa.Double(), nullable=True),
        sa.Column("expected_duration_s", sa.Double(), nullable=True),
        sa.Column("command", _json(), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=False),
        sa.Column("env", _json(), nullable=False),
        sa.Column("submit_at", sa.Double(), nullable=False),
        sa.Column("pending_since", sa.Double(), nullable=True),
        sa.Column("waited_s", sa.Double(), server_default=sa.text("0"), nullable=False),
        sa.Column("not_before", sa.Double(), nullable=True),
        sa.Column("preempted_at", _json(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("approved_by", sa.String(length=255), nullable=True),
        sa.Column("approved_at", sa.Double(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("explanation", _nullable_json(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("version", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_queue_state", "jobs", ["queue", "state"])
    op.create_index("ix_jobs_user", "jobs", ["user"])

    op.create_table(
        "attempts",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("assignment", _json(), nullable=False),
        sa.Column("flavor", sa.String(length=255), nullable=True),
        sa.Column("borrowing", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("startup_s", sa.Double(), nullable=True),
        sa.Column("checkpoint_s", sa.Double(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_checkpoint_at", sa.Double(), nullable=True),
        sa.Column("sigterm_save_s", sa.Double(), nullable=True),
        sa.Column("sigterm_at", sa.Double(), nullable=True),
        sa.Column("kill_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("exit_codes", _nullable_json(), nullable=True),
        sa.Column("handle", _nullable_json(), nullable=True),
        sa.Column("log_dir", sa.Text(), nullable=False),
        sa.Column("preempted_for", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_attempts_job_id_jobs")),
        sa.PrimaryKeyConstraint("job_id", "number", name=op.f("pk_attempts")),
    )
    op.create_index("ix_attempts_state", "attempts", ["state"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("from_state", sa.String(length=32), nullable=True),
        sa.Column("to_state", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=255), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("details", _json(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("queues", _json(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )

    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("details", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit")),
        sqlite_autoincrement=True,
    )

    op.create_table(
        "policies",
        sa.Column("version", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("applied_at", sa.Double(), nullable=False),
        sa.Column("applied_by", sa.String(length=255), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("resolved", _json(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_policies")),
        sqlite_autoincrement=True,
    )

    op.create_table(
        "ledger",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("usage", sa.Double(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("queue", name=op.f("pk_ledger")),
    )

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("cpu", sa.Integer(), nullable=False),
        sa.Column("memory", sa.Integer(), nullable=False),
        sa.Column("flavor", sa.String(length=255), nullable=False),
        sa.Column("block", sa.String(length=255), nullable=True),
        sa.Column("gpu_names", _json(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )

    _create_audit_triggers()


def _create_audit_triggers() -> None:
    """Make the audit trail append-only in the database itself, not only in warden's code."""
    dialect = op.get_context().dialect.name
    statements = {"sqlite": SQLITE_AUDIT_TRIGGERS, "postgresql": POSTGRES_AUDIT_TRIGGERS}.get(dialect)
    if statements is None:
        raise RuntimeError(f"no append-only audit triggers for the {dialect} dialect")
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_no_truncate ON audit")
        op.execute("DROP TRIGGER IF EXISTS audit_no_update_delete ON audit")
        op.execute("DROP FUNCTION IF EXISTS warden_audit_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_no_update")
        op.execute("DROP TRIGGER IF EXISTS audit_no_delete")
    for table in ("nodes", "ledger", "policies", "audit", "tokens", "events", "attempts", "jobs"):
        op.drop_table(table)
