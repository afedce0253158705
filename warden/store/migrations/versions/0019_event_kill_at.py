"""Events whose text holds their SIGKILL deadline as epoch seconds ("grace 120s, SIGKILL at
1796386481.753", as preemptions and evictions were written before the deadline had a detail of
its own) keep it in their details (`kill_at`) instead, as every event written since does, so
that the reader writes it in local and relative time (`warden.server.explanations.event_message`)
and no text a person reads holds epoch seconds.

The deadline leaves the text with the separator before it; a deadline the details already hold
is kept.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-08
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EPOCH_KILL = re.compile(r"[,;]? ?SIGKILL at (\d{9,}(?:\.\d+)?)")
"""A SIGKILL deadline written into an event's text as epoch seconds, with its separator."""
_BATCH = 500
"""Events read at a time."""


def upgrade() -> None:
    events = sa.table(
        "events",
        sa.column("id", sa.Integer()),
        sa.column("reason", sa.String()),
        sa.column("details", sa.JSON()),
    )
    conn = op.get_bind()
    last = 0
    while True:
        query = sa.select(events.c.id, events.c.reason, events.c.details).where(
            events.c.id > last, events.c.reason.like("%SIGKILL at %")
        )
        batch = conn.execute(query.order_by(events.c.id).limit(_BATCH)).all()
        if not batch:
            break
        for event_id, reason, details in batch:
            moved = _moved(reason, details)
            if moved is not None:
                conn.execute(sa.update(events).where(events.c.id == event_id).values(reason=moved[0], details=moved[1]))
        last = batch[-1][0]


def _moved(reason: str, details: dict[str, object] | None) -> tuple[str, dict[str, object]] | None:
    """The text without its epoch deadline and the details with it, or None when the text holds
    none."""
    found = _EPOCH_KILL.search(reason)
    if found is None:
        return None
    text = (reason[: found.start()] + reason[found.end() :]).strip()
    return text, {"kill_at": float(found.group(1)), **(details or {})}


def downgrade() -> None:
    """The texts stay as they are: a deadline in the details is what every later event has."""
