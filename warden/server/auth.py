"""Who is calling: a bearer token bound to a user, their queues and a role.

Users may submit only to their queues and cancel only their own jobs; admins may do anything,
and only admins approve tier-1/2 jobs, apply policies, create, list and revoke tokens and read
the audit log. A token may expire (`expires_at`); an expired or revoked one is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from warden.server.errors import ApiError

CHALLENGE = {"WWW-Authenticate": "Bearer"}
TOKEN_LIFETIME_MAX_S = 3650 * 86400.0
"""The longest lifetime a token may be given: 10 years (of 365 days)."""
DEFAULT_TOKEN_LIFETIME_S = 90 * 86400.0
"""How long a token `POST /v1/tokens` makes lives when neither the request nor the server's
`--token-lifetime` says."""


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    role: str
    queues: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_submit_to(self, queue: str) -> bool:
        return self.is_admin or "*" in self.queues or queue in self.queues


def bearer(header: str | None) -> str:
    """The token of an `Authorization: Bearer …` header; 401 when there is none."""
    if not header:
        raise ApiError(401, "Authorization", None, "a bearer token is required", CHALLENGE)
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Authorization", scheme, "use 'Authorization: Bearer <token>'", CHALLENGE)
    return token.strip()


def forbidden(who: Principal, what: str) -> ApiError:
    return ApiError(403, "token", who.user, f"user {who.user!r} ({who.role}) may not {what}")


def require_admin(who: Principal, what: str) -> None:
    """403 unless `who` is an admin."""
    if not who.is_admin:
        raise forbidden(who, what)
