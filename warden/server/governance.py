"""Governance: the policy in force (applied, versioned and audited; what another would change),
the history exported as a trace, and the API's tokens (created, listed, revoked) — the admin's
side of the API."""

from __future__ import annotations

from typing import Any

from warden.engine.model import Snapshot
from warden.engine.overcommit import quota_warnings
from warden.engine.policy import Policy, PolicyError, parse_policy_source
from warden.server.auth import Principal, require_admin
from warden.server.authenticator import Authenticator
from warden.server.errors import ApiError, shorten
from warden.server.export import Export, export
from warden.server.offload import in_worker
from warden.server.policydiff import policy_diff
from warden.server.requests import TokenRequest, stored_id
from warden.server.serving import ServiceContext, log
from warden.store.tokens import TokenInfo


class Governance:
    """Policies, exports and tokens, each change audited."""

    def __init__(self, ctx: ServiceContext, auth: Authenticator, token_lifetime_s: float | None) -> None:
        self.ctx = ctx
        self.auth = auth
        self.token_lifetime_s = token_lifetime_s
        """The lifetime of a token created without one; None: such a token never expires."""

    def apply_policy(self, source: str, who: Principal) -> tuple[int, bool]:
        """Validate and version a new policy; jobs keep their tier and lease. Returns the
        version in force and whether it is new: the source in force again is no new version.
        An empty source is refused (it would silently reset every setting to its default)."""
        require_admin(who, "apply a policy")
        current = self.ctx.store.current_policy()
        if current is not None and current.source == source:
            return current.version, False
        policy = _parse_source(source)
        leaves = {q.name for q in policy.leaves()}
        orphaned = sorted({a.job.queue for a in self.ctx.store.active()} - leaves)
        if orphaned:
            raise ApiError(
                422, "queues", orphaned[0], "unfinished jobs use this queue, which the new policy does not have"
            )
        now = self.ctx.now()
        version = self.ctx.store.apply_policy(source, policy.to_dict(), who.user, now)
        self.ctx.policy_version = version
        self.ctx.store.audit(who.user, "policy.apply", f"policy/{version}", {}, now)
        self.ctx.reconciler.set_policy(policy)
        self.ctx.changed()
        for w in quota_warnings(policy, self.ctx.nodes):
            log.warning("policy version %s: %s. %s", version, w.headline, w.message)
        return version, True

    def diff_policy(self, source: str) -> dict[str, Any]:
        """What `source` would change for the jobs in the system now, were it applied
        (`warden.server.policydiff`); validated as `apply_policy` validates it, and nothing is
        changed. The snapshot is read under the reconcile lock; the policy is parsed and both
        plans are made after it, in a worker process (`warden.server.offload`)."""
        with self.ctx.reconciler.lock:
            now = self.ctx.now()
            snapshot = self.ctx.reconciler.snapshots.live(now)
        return in_worker(_diff, source, snapshot, now)

    def export_history(self, since: float) -> Export:
        """The jobs submitted at `since` or later that have run, as trace rows read as they are
        sent (`warden.server.export`)."""
        return export(self.ctx.store, since, self.ctx.policy, self.ctx.now())

    def create_token(self, req: TokenRequest, who: Principal) -> tuple[str, float | None]:
        """A new token and when it expires (None: never): after `req.expires_in_s`, else the
        server's `token_lifetime_s`."""
        require_admin(who, "create tokens")
        leaves = {q.name for q in self.ctx.policy.leaves()}
        unknown = [q for q in req.queues if q != "*" and q not in leaves]
        if unknown:
            raise ApiError(422, "queues", unknown[0], f"is not a leaf queue; allowed: {', '.join(sorted(leaves))}")
        now = self.ctx.now()
        lifetime = req.expires_in_s if req.expires_in_s is not None else self.token_lifetime_s
        expires_at = None if lifetime is None else now + lifetime
        token = self.ctx.store.create_token(req.user, req.role, list(req.queues), who.user, now, expires_at)
        details = {"role": req.role, "queues": req.queues, "expires_at": expires_at}
        self.ctx.store.audit(who.user, "token.create", f"user/{req.user}", details, now)
        return token, expires_at

    def list_tokens(self, who: Principal) -> tuple[TokenInfo, ...]:
        require_admin(who, "list tokens")
        return self.ctx.store.list_tokens()

    def revoke_token(self, token: str, who: Principal) -> TokenInfo:
        """Revoke a token by id; it is refused from the next request on (the cache forgets it
        here). 404 when there is no such token, 409 when it is revoked already."""
        require_admin(who, "revoke tokens")
        token_id = stored_id("token", token)
        if self.ctx.store.token_by_id(token_id) is None:
            raise ApiError(404, "id", token, "no such token")
        now = self.ctx.now()
        if not self.ctx.store.revoke_token(token_id, now):
            raise ApiError(409, "id", token, "the token is revoked already")
        self.auth.forget(token_id)
        info = self.ctx.store.token_by_id(token_id)
        assert info is not None
        self.ctx.store.audit(who.user, "token.revoke", f"token/{token_id}", {"user": info.user, "role": info.role}, now)
        return info


def _diff(source: str, snapshot: Snapshot, now: float) -> dict[str, Any]:
    """`Governance.diff_policy`'s work, in a worker process."""
    return policy_diff(snapshot, _parse_source(source), now)


def _parse_source(source: str) -> Policy:
    """A policy from its YAML source, as `PUT /v1/policy` and `POST /v1/policy/diff` take it
    (`parse_policy_source`: one without settings is refused, as `warden policy check` refuses
    it); a refusal names the first problem's path and value and lists every problem (422)."""
    try:
        return parse_policy_source(source, "policy")  # aliases and duplicate keys refused
    except PolicyError as err:
        first = err.issues[0]  # a problem of the YAML itself (syntax, an alias, a key twice): the source's
        field = "source" if first.path in ("", "<file>") else first.path
        raise ApiError(422, field, _plain(first.value), shorten(str(err), 2000)) from None
    except RecursionError:
        raise ApiError(422, "source", None, "the YAML is nested too deeply") from None


def _plain(value: Any) -> Any:
    return None if value.__class__.__name__ == "_Missing" else value
