"""Tokens and the audit trail: who may call the API, and what admins did with it."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Row, Table, insert, select, update

from warden.store.base import StoreBase, _advisory_lock, _new_id, _record, _str_list
from warden.store.schema import AuditRow, TokenRow

TOKENS = cast(Table, TokenRow.__table__)
AUDIT = cast(Table, AuditRow.__table__)

ROLES = frozenset({"user", "admin"})
ANY_QUEUE = "*"
TOKEN_LOCK_KEY = 0x7761726465_6E02
"""PostgreSQL advisory lock serializing `ensure_token` (look up, then insert or update)."""


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """Who a token belongs to and what it may do; never the token itself."""

    id: int
    user: str
    role: str
    queues: tuple[str, ...]
    created_at: float
    created_by: str
    revoked_at: float | None
    expires_at: float | None = None
    """When the token stops working (epoch seconds); None: never."""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_submit_to(self, queue: str) -> bool:
        return ANY_QUEUE in self.queues or queue in self.queues


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: float
    actor: str
    action: str
    target: str
    details: dict[str, Any]


class TokenStore(StoreBase):
    """The tokens and audit part of `Store`."""

    def create_token(
        self,
        user: str,
        role: str,
        queues: Sequence[str],
        created_by: str,
        now: float,
        expires_at: float | None = None,
    ) -> str:
        """Mint a token, good until `expires_at` (None: until revoked); return it. Only its
        SHA-256 is stored: this is the one time it is seen."""
        if expires_at is not None and not expires_at > now:
            raise ValueError(f"expires_at: {expires_at!r} is not after now ({now!r})")
        token = secrets.token_urlsafe(32)
        values = _token_values(token, user, role, queues)
        with self._write() as conn:
            conn.execute(
                insert(TOKENS), {**values, "created_at": now, "created_by": created_by, "expires_at": expires_at}
            )
        return token

    def ensure_token(
        self, token: str, user: str, role: str, queues: Sequence[str], now: float, created_by: str = "warden"
    ) -> TokenInfo:
        """Make an operator-given (bootstrap) token exist with this user, role and queues.

        Idempotent: a second call updates the grant to what the operator gives now. A token
        that was revoked stays revoked (the returned `revoked_at` says so); restarting the
        server with the same flag must not resurrect it.
        """
        if not token:
            raise ValueError("token: must not be empty")
        values = _token_values(token, user, role, queues)
        with self._write() as conn:
            _advisory_lock(conn, TOKEN_LOCK_KEY)
            by_hash = TOKENS.c.token_hash == values["token_hash"]
            if conn.execute(select(TOKENS.c.id).where(by_hash)).first() is None:
                conn.execute(insert(TOKENS), {**values, "created_at": now, "created_by": created_by})
            else:
                conn.execute(
                    update(TOKENS)
                    .where(by_hash)
                    .values(user=values["user"], role=values["role"], queues=values["queues"])
                )
            row = conn.execute(select(TOKENS).where(by_hash)).one()
        return _token(row)

    def token_for(self, token: str) -> TokenInfo | None:
        """Who presents this token, or None when it is unknown or revoked (an expired one is
        returned: its `expires_at` says so)."""
        info = self.lookup_token(token)
        return None if info is None or info.revoked_at is not None else info

    def lookup_token(self, token: str) -> TokenInfo | None:
        """The grant of this token, revoked or not; None when it is unknown."""
        query = select(TOKENS).where(TOKENS.c.token_hash == hash_token(token))
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else _token(row)

    def token_by_id(self, token_id: int) -> TokenInfo | None:
        with self._read() as conn:
            row = conn.execute(select(TOKENS).where(TOKENS.c.id == token_id)).first()
        return None if row is None else _token(row)

    def revoke_token(self, token_id: int, now: float) -> bool:
        """Revoke by id (as `list_tokens` shows). False when unknown or already revoked."""
        query = update(TOKENS).where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None)).values(revoked_at=now)
        with self._write() as conn:
            return bool(conn.execute(query).rowcount)

    def list_tokens(self) -> tuple[TokenInfo, ...]:
        """Every token's grant, revoked ones included, in creation order; never a secret."""
        with self._read() as conn:
            return tuple(_token(row) for row in conn.execute(select(TOKENS).order_by(TOKENS.c.id)))

    # --- audit ---------------------------------------------------------------------------------

    def audit(self, actor: str, action: str, target: str, details: Mapping[str, Any] | None, now: float) -> int:
        """Append to the audit trail; return the entry's id. The database refuses any change
        to an entry once written."""
        with self._write() as conn:
            result = conn.execute(
                insert(AUDIT),
                {"at": now, "actor": actor, "action": action, "target": target, "details": dict(details or {})},
            )
            return _new_id(result)

    def audit_log(self, limit: int | None = None) -> tuple[AuditEntry, ...]:
        """The audit trail, newest first (`limit`: only the newest that many)."""
        query = select(AUDIT).order_by(AUDIT.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return tuple(_record(AuditEntry, row) for row in conn.execute(query))


def hash_token(token: str) -> str:
    """The stored form of a token: SHA-256, hex. Tokens are 256-bit random, so no salt or
    slow hash is needed: nothing about them can be guessed from the hash."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _token_values(token: str, user: str, role: str, queues: Sequence[str]) -> dict[str, Any]:
    if role not in ROLES:
        raise ValueError(f"role: expected user or admin, got {role!r}")
    if not user:
        raise ValueError("user: must not be empty")
    return {"token_hash": hash_token(token), "user": user, "role": role, "queues": _str_list("queues", queues)}


def _token(row: Row[Any]) -> TokenInfo:
    m = row._mapping
    return TokenInfo(
        m["id"],
        m["user"],
        m["role"],
        tuple(m["queues"]),
        m["created_at"],
        m["created_by"],
        m["revoked_at"],
        m["expires_at"],
    )
