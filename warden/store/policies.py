"""Policies: every version applied, as written and as resolved."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from sqlalchemy import Table, func, insert, select

from warden.store.base import StoreBase, _new_id, _record
from warden.store.schema import PolicyRow

POLICIES = cast(Table, PolicyRow.__table__)


class CurrentPolicy(NamedTuple):
    """The policy in force: unpacks as `(version, source, resolved)`."""

    version: int
    source: str
    resolved: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    version: int
    applied_at: float
    applied_by: str
    source: str
    resolved: dict[str, Any]


class PolicyStore(StoreBase):
    """The policies part of `Store`."""

    def apply_policy(self, source_text: str, resolved: Mapping[str, Any], actor: str, now: float) -> int:
        """Record a new policy version (the text as given and its resolved form); return it."""
        with self._write() as conn:
            result = conn.execute(
                insert(POLICIES),
                {"applied_at": now, "applied_by": actor, "source": source_text, "resolved": dict(resolved)},
            )
            return _new_id(result)

    def current_policy(self) -> CurrentPolicy | None:
        """The newest policy as `(version, source, resolved)`, or None before any was applied."""
        query = (
            select(POLICIES.c.version, POLICIES.c.source, POLICIES.c.resolved)
            .order_by(POLICIES.c.version.desc())
            .limit(1)
        )
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else CurrentPolicy(int(row.version), row.source, dict(row.resolved))

    def policy_version(self) -> int | None:
        """The version in force (the highest), read alone: cheap enough for every pass to ask
        whether another server applied a policy. None before any was applied."""
        with self._read() as conn:
            return conn.execute(select(func.max(POLICIES.c.version))).scalar()

    def policy_history(self, limit: int | None = None) -> tuple[PolicyRecord, ...]:
        """Applied policies, newest first."""
        query = select(POLICIES).order_by(POLICIES.c.version.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return tuple(_record(PolicyRecord, row) for row in conn.execute(query))
