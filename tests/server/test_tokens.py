"""Token lifetimes and revocation against the service's cache of grants: with a cache that
would hold a grant for an hour, an expired token is refused as soon as the clock passes its
expiry, and a token revoked through the API on the very next request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apiclient import Clock, api_service
from fastapi.testclient import TestClient

from warden.engine.model import Node
from warden.server import authenticator
from warden.server.explanations import wall_times
from warden.server.service import Service

T0 = 1_000_000.0
POLICY = {"queues": {"name": "cluster", "children": [{"name": "team"}]}}


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Service, TestClient, Clock]]:
    monkeypatch.setattr(authenticator, "TOKEN_CACHE_S", 3600.0)
    clock = Clock(T0)
    with api_service(tmp_path, POLICY, (Node("node-0", 2, 16_000, 64_000),), clock) as (svc, client):
        yield svc, client, clock


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_cached_token_is_refused_once_it_expires(setup: tuple[Service, TestClient, Clock]) -> None:
    _, c, clock = setup
    made = c.post("/v1/tokens", json={"user": "ana", "queues": ["team"], "expires_in_s": 7200})
    assert made.status_code == 201 and made.json()["expires_at"] == T0 + 7200
    ana = bearer(made.json()["token"])
    assert c.get("/v1/whoami", headers=ana).status_code == 200  # cached from here on
    clock.t = T0 + 7199
    assert c.get("/v1/whoami", headers=ana).status_code == 200
    clock.t = T0 + 7200 + 2 * 3600 + 60
    refused = c.get("/v1/whoami", headers=ana)
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    # The expiry in local time and how long ago, as every time a person reads.
    assert f"token expired at {wall_times(clock.t)(T0 + 7200)}" in refused.text, refused.text
    assert "(2h1m ago)" in refused.text, refused.text


def test_the_server_default_lifetime_applies_and_none_means_never(setup: tuple[Service, TestClient, Clock]) -> None:
    svc, c, _ = setup
    assert c.post("/v1/tokens", json={"user": "ana"}).json()["expires_at"] == T0 + 90 * 86400
    svc.governance.token_lifetime_s = None
    assert c.post("/v1/tokens", json={"user": "bo"}).json()["expires_at"] is None
    for bad in (0, 5e-324, 0.5, -1, 3650 * 86400 + 1):
        r = c.post("/v1/tokens", json={"user": "cy", "expires_in_s": bad})
        assert r.status_code == 422 and "expires_in_s" in r.text, r.text


def test_a_revoked_token_is_refused_at_once_though_cached(setup: tuple[Service, TestClient, Clock]) -> None:
    svc, c, _ = setup
    made = c.post("/v1/tokens", json={"user": "ana", "queues": ["team"]}).json()
    ana = bearer(made["token"])
    assert c.get("/v1/whoami", headers=ana).status_code == 200  # cached for an hour
    assert c.get("/v1/tokens", headers=ana).status_code == 403
    [listed] = [t for t in c.get("/v1/tokens").json() if t["user"] == "ana"]
    assert c.delete(f"/v1/tokens/{listed['id']}", headers=ana).status_code == 403
    assert c.get("/v1/whoami", headers=ana).status_code == 200  # a refused revoke changed nothing
    done = c.delete(f"/v1/tokens/{listed['id']}")
    assert done.status_code == 200 and done.json()["revoked_at"] == T0
    refused = c.get("/v1/whoami", headers=ana)
    assert refused.status_code == 401 and "token revoked" in refused.text
    assert c.delete(f"/v1/tokens/{listed['id']}").status_code == 409
    assert c.delete("/v1/tokens/424242").status_code == 404
    unknown = c.get("/v1/whoami", headers=bearer("nonsense"))
    assert unknown.status_code == 401 and "unknown token" in unknown.text
    entries = [(a.action, a.target) for a in svc.store.audit_log(limit=10)]
    assert ("token.revoke", f"token/{listed['id']}") in entries
