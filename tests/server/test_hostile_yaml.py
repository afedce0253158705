"""Hostile policy YAML and expensive requests: an alias bomb is refused by the parser, before
anything walks it, and without the server's memory growing; `POST /v1/policy/diff` and
`GET /v1/history/export` are limited to one in progress per user, and all of them, dry runs
too, to the server's budget (`limits.expensive_requests_at_once`, 1 by default) whoever sends
them. In process, on the real app and store; the reconcile loop is not started."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from warden.server.app import Settings, build_service, create_app
from warden.server.export import Export
from warden.server.service import Service

TOKEN = "hostile-admin-token"
POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"


def alias_bomb(levels: int) -> str:
    """A few hundred bytes that stand for 4**levels strings: each level repeats the one below
    four times by alias. Twelve levels: some 16 million strings once expanded."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}, *l{i - 1}]" for i in range(1, levels)]
    lines.append(f"queues: {{name: cluster, children: [{{name: team, quota: *l{levels - 1}}}]}}")
    return "\n".join(lines) + "\n"


BOMB = alias_bomb(12)


def rss_bytes() -> int:
    """This process's resident memory, as the kernel counts it now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    svc = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=lambda _: None
    )
    try:
        yield svc
    finally:
        svc.executor.close()
        svc.store.close()


_APPS: dict[int, Any] = {}


def client_for(svc: Service, token: str) -> TestClient:
    """A client of the service's one app (its limits are the app's, as in a server process)."""
    app = _APPS.get(id(svc))
    if app is None or app.state.service is not svc:
        app = _APPS[id(svc)] = create_app(svc)
        app.state.service = svc
        app.router.lifespan_context = no_lifespan  # no reconcile loop
    return TestClient(app, headers={"Authorization": f"Bearer {token}"}, raise_server_exceptions=False)


def test_the_bomb_is_small_and_really_expands() -> None:
    """The input the tests below send: under a kilobyte, and a bomb (each level's aliases are
    four times the level below), so that refusing it is what keeps it cheap."""
    import yaml

    assert len(BOMB.encode()) < 1024
    small = yaml.safe_load(alias_bomb(3))
    assert len(str(small["queues"]["children"][0]["quota"]).split("lol")) - 1 == 4**3


@pytest.mark.parametrize("role", ["user", "admin"])
def test_an_alias_bomb_is_refused_fast_and_without_memory(service: Service, role: str) -> None:
    token = service.store.create_token(f"ana-{role}", role, ["*"], "test", time.time())
    client = client_for(service, token)
    version = service.store.current_policy()
    before = rss_bytes()
    answers = [
        client.post("/v1/policy/diff", json={"source": BOMB}),
        client.put("/v1/policy", json={"source": BOMB}),
    ]
    grown = rss_bytes() - before
    client.close()
    diff, apply = answers
    assert diff.status_code == 422, diff.text
    assert diff.json()["error"]["field"] == "source"
    assert "YAML aliases (*l0) are not accepted" in diff.json()["error"]["message"]
    if role == "admin":
        assert apply.status_code == 422, apply.text
        assert "YAML aliases (*l0) are not accepted" in apply.json()["error"]["message"]
    else:
        assert apply.status_code == 403, apply.text
    assert service.store.current_policy() == version
    assert grown < 50 << 20, f"the server grew by {grown >> 20} MiB"


def test_anchors_without_aliases_are_still_accepted(service: Service) -> None:
    client = client_for(service, TOKEN)
    source = "queues: &root\n  name: cluster\n  children:\n    - {name: team, weight: 2}\n"
    answer = client.post("/v1/policy/diff", json={"source": source})
    client.close()
    assert answer.status_code == 200, answer.text


class Gate:
    """Holds every call made through it until released; counts the calls that have entered."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *_: Any) -> Any:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(20), "the test never released the gate"
        return self.result

    def wait_calls(self, n: int) -> None:
        deadline = time.monotonic() + 20
        while self.calls < n:
            assert time.monotonic() < deadline, f"{self.calls} calls entered the gate, not {n}"
            time.sleep(0.01)


@pytest.mark.parametrize(
    ("method", "attribute", "result", "request_args"),
    [
        ("diff_policy", "diff_policy", {"changes": []}, ("POST", "/v1/policy/diff", {"source": POLICY})),
        ("export_history", "export_history", Export(0, None, iter(())), ("GET", "/v1/history/export", None)),
    ],
    ids=["policy-diff", "history-export"],
)
def test_one_expensive_request_per_user_at_a_time(
    service: Service,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    attribute: str,
    result: Any,
    request_args: tuple[str, str, dict[str, Any] | None],
) -> None:
    verb, path, body = request_args
    gate = Gate(result)
    monkeypatch.setattr(service.governance, attribute, gate)
    ana = client_for(service, service.store.create_token("ana", "user", ["*"], "test", time.time()))
    bob = client_for(service, service.store.create_token("bob", "user", ["*"], "test", time.time()))
    answers: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answers.append(ana.request(verb, path, json=body)))
    first.start()
    try:
        assert gate.entered.wait(20), f"the first {method} never started"
        second = ana.request(verb, path, json=body)
        assert second.status_code == 429, second.text
        assert second.json()["error"]["field"] == "user"
        assert "at most 1 at once per user" in second.json()["error"]["message"]
        assert second.headers["retry-after"] == "1"
        busy = bob.request(verb, path, json=body)  # another user: within his own limit, not the server's
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["field"] == "server"
        assert "at most 1 policy diffs, history exports and dry runs at once" in busy.json()["error"]["message"]
        assert "limits.expensive_requests_at_once" in busy.json()["error"]["message"]
        assert busy.headers["retry-after"] == "2"
    finally:
        gate.release.set()
        first.join(20)
    assert [a.status_code for a in answers] == [200]
    assert ana.request(verb, path, json=body).status_code == 200  # the slots are free again
    assert bob.request(verb, path, json=body).status_code == 200
    ana.close()
    bob.close()


DRY_RUN = {"queue": "team", "tier": 3, "gpus": 1, "command": ["true"], "workdir": "/"}


def test_the_server_budget_holds_dry_runs_and_follows_the_policy(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run counts against the budget as a diff does, and an admin widens the budget with
    the policy: then two users' diffs are worked on at once, and a third request waits for
    neither."""
    gate = Gate({"changes": []})
    monkeypatch.setattr(service.governance, "diff_policy", gate)
    admin = client_for(service, TOKEN)
    ana = client_for(service, service.store.create_token("ana", "user", ["*"], "test", time.time()))
    bob = client_for(service, service.store.create_token("bob", "user", ["*"], "test", time.time()))
    threads: list[threading.Thread] = []
    answers: list[httpx.Response] = []

    def diff_in_thread(client: TestClient) -> None:
        threads.append(
            threading.Thread(target=lambda: answers.append(client.post("/v1/policy/diff", json={"source": POLICY})))
        )
        threads[-1].start()

    try:
        assert admin.post("/v1/jobs", params={"dry_run": "true"}, json=DRY_RUN).status_code == 200
        diff_in_thread(ana)
        gate.wait_calls(1)
        dry = bob.post("/v1/jobs", params={"dry_run": "true"}, json=DRY_RUN)
        assert dry.status_code == 503, dry.text
        assert "1 policy diffs" in dry.json()["error"]["message"]
        wider = POLICY + "limits: {expensive_requests_at_once: 2}\n"
        assert admin.put("/v1/policy", json={"source": wider}).status_code == 200
        diff_in_thread(bob)
        gate.wait_calls(2)  # two at once now
        third = admin.post("/v1/jobs", params={"dry_run": "true"}, json=DRY_RUN)
        assert third.status_code == 503, third.text
        assert "2 policy diffs" in third.json()["error"]["message"]
    finally:
        gate.release.set()
        for t in threads:
            t.join(20)
    assert [a.status_code for a in answers] == [200, 200]
    assert admin.post("/v1/jobs", params={"dry_run": "true"}, json=DRY_RUN).status_code == 200
    for c in (admin, ana, bob):
        c.close()
