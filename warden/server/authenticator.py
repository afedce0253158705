"""Who calls: a request's bearer token looked up in the database, its grant remembered for a
moment (`TOKEN_CACHE_S`) so that a storm of requests does not read the tokens table each time."""

from __future__ import annotations

import threading
import time

from warden.server.auth import CHALLENGE, Principal, bearer
from warden.server.errors import ApiError
from warden.server.explanations import wall_times
from warden.server.serving import ServiceContext
from warden.store.tokens import TokenInfo

TOKEN_CACHE_S = 1.0
"""How long a token's grant is remembered; its expiry is checked on every request anyway."""


class Authenticator:
    """The caller of each request, from its token; the tokens' grants cached per server."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self._tokens: dict[str, tuple[Principal, float, TokenInfo]] = {}
        self._lock = threading.Lock()

    def authenticate(self, header: str | None) -> Principal:
        """The caller of a request. A token's grant is remembered for `TOKEN_CACHE_S`, so a
        storm of requests does not read the tokens table every time; its expiry is checked on
        every request, cached or not. A token revoked through the API is dropped from the cache
        at once (`forget`); one revoked in the database by other means stops working within
        `TOKEN_CACHE_S`."""
        token = bearer(header)
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached is not None and cached[1] > now:
            who, info = cached[0], cached[2]
        else:
            found = self.ctx.store.lookup_token(token)
            if found is None or found.revoked_at is not None:
                self._tokens.pop(token, None)
                why = "unknown token" if found is None else "token revoked"
                raise ApiError(401, "Authorization", "Bearer ***", why, CHALLENGE)
            info = found
            who = Principal(info.user, info.role, tuple(info.queues))
            with self._lock:
                if len(self._tokens) > 10_000:
                    self._tokens.clear()
                self._tokens[token] = (who, now + TOKEN_CACHE_S, info)
        wall = self.ctx.now()
        if info.expires_at is not None and wall >= info.expires_at:
            message = f"token expired at {wall_times(wall)(info.expires_at)}"
            raise ApiError(401, "Authorization", "Bearer ***", message, CHALLENGE)
        return who

    def forget(self, token_id: int) -> None:
        """Drop a revoked token's cached grant: it is refused from the next request on."""
        with self._lock:
            for secret in [k for k, v in self._tokens.items() if v[2].id == token_id]:
                self._tokens.pop(secret, None)
