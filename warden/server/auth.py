"""Who is calling: a bearer token bound to a user, their queues and a role.

Users may submit only to their queues and cancel only their own jobs; admins may do anything,
and only admins approve tier-1/2 jobs, apply policies, create tokens and read the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass

from warden.server.errors import ApiError

CHALLENGE = {"WWW-Authenticate": "Bearer"}


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
