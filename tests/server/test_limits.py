"""Hostile input: every refusal is a 4xx in the one error shape, names the field, and changes
nothing. In process, on the real app and store; the reconcile loop is not started, so nothing
submitted here ever runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from warden.server.app import Settings, build_service, create_app
from warden.server.service import Service

TOKEN = "limits-admin-token"
POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"
JSON = {"content-type": "application/json"}


class Api:
    def __init__(self, service: Service, client: TestClient, workdir: Path) -> None:
        self.service, self.client, self.workdir = service, client, workdir

    def job(self, **fields: Any) -> dict[str, Any]:
        return {"queue": "team", "tier": 3, "command": ["true"], "workdir": str(self.workdir), **fields}

    def state(self) -> tuple[int, int | None]:
        """What a refusal must leave as it was: the jobs and the policy version."""
        current = self.service.store.current_policy()
        return len(self.service.store.list()), current.version if current else None


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    service = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=lambda _: None
    )
    app = create_app(service)
    app.router.lifespan_context = no_lifespan  # no reconcile loop: nothing sent here runs
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)
    created = client.post("/v1/jobs", json={"queue": "team", "tier": 3, "command": ["true"], "workdir": str(tmp_path)})
    assert created.status_code == 201, created.text
    try:
        yield Api(service, client, tmp_path)
    finally:
        client.close()
        service.executor.close()
        service.store.close()


def strict_json(text: str) -> Any:
    """JSON as the RFC has it: NaN and Infinity are not numbers."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in an error body")

    return json.loads(text, parse_constant=refuse)


def assert_error(response: Any, status: int, field: str) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body = strict_json(response.text)
    assert set(body) == {"error", "errors"} and body["errors"][0] == body["error"]
    for error in body["errors"]:
        assert set(error) == {"field", "value", "message"} and error["message"]
        assert len(json.dumps(error["value"])) < 1000, "a huge value is echoed whole"
    assert body["error"]["field"] == field, body
    return body["error"]


BIG = 50 * 1024 * 1024

# (id, method, path, json body or raw bytes, status, field, extra headers)
CASES: list[tuple[str, str, str, Any, int, str, dict[str, Any]]] = [
    # 1, 2: timers and durations
    ("grace beyond TIMEOUT_MAX", "POST", "/v1/jobs", {"grace": "1000000000000s"}, 422, "grace", {}),
    ("numeric grace 1e300", "POST", "/v1/jobs", {"grace": 1e300}, 422, "grace", {}),
    ("grace '1e300s'", "POST", "/v1/jobs", {"grace": "1e300s"}, 422, "grace", {}),
    ("grace above max_grace", "POST", "/v1/jobs", {"grace": "100000000s"}, 422, "grace", {}),
    ("grace below min_grace", "POST", "/v1/jobs", {"grace": "1s"}, 422, "grace", {}),
    ("time_limit above the limit", "POST", "/v1/jobs", {"time_limit": "1000d"}, 422, "time_limit", {}),
    # 3: sizes and counts
    ("50 MB command", "POST", "/v1/jobs", {"command": ["x" * BIG]}, 413, "body", {}),
    ("50 MB name", "POST", "/v1/jobs", {"name": "x" * BIG}, 413, "body", {}),
    ("name above 255 characters", "POST", "/v1/jobs", {"name": "n" * 256}, 422, "name", {}),
    ("command bytes above the limit", "POST", "/v1/jobs", {"command": ["x" * 300_000]}, 422, "command", {}),
    ("100,000 arguments", "POST", "/v1/jobs", {"command": ["a"] * 100_000}, 422, "command", {}),
    ("100,000 env vars", "POST", "/v1/jobs", {"env": {f"V{i}": "" for i in range(100_000)}}, 413, "body", {}),
    ("2,000 env vars", "POST", "/v1/jobs", {"env": {f"V{i}": "" for i in range(2000)}}, 422, "env", {}),
    ("env bytes above the limit", "POST", "/v1/jobs", {"env": {"A": "x" * 300_000}}, 422, "env", {}),
    ("replicas 10**6", "POST", "/v1/jobs", {"replicas": 10**6, "gpus": 0}, 422, "replicas", {}),
    ("workdir too long", "POST", "/v1/jobs", {"workdir": "/" + "d" * 5000}, 422, "workdir", {}),
    # 4: numbers beyond what the database holds, ids, logs, non-finite and non-text input
    ("replicas 10**20", "POST", "/v1/jobs", {"replicas": 10**20}, 422, "replicas", {}),
    ("cpu 10**20", "POST", "/v1/jobs", {"cpu": 10**20}, 422, "cpu", {}),
    ("memory 10**20", "POST", "/v1/jobs", {"memory": 10**20}, 422, "memory", {}),
    ("gpus 10**20", "POST", "/v1/jobs", {"gpus": 10**20}, 422, "gpus", {}),
    ("unicode digit job id", "GET", "/v1/jobs/%C2%B9", None, 404, "id", {}),
    ("arabic digit job id", "POST", "/v1/jobs/%D9%A3/cancel", None, 404, "id", {}),
    ("job id beyond int64", "GET", "/v1/jobs/99999999999999999999", None, 404, "id", {}),
    ("job id 2**63", "GET", f"/v1/jobs/{2**63}", None, 404, "id", {}),
    ("logs attempt=1e20", "GET", "/v1/jobs/1/logs?attempt=1e20", None, 422, "attempt", {}),
    ("logs attempt=10**20", "GET", f"/v1/jobs/1/logs?attempt={10**20}", None, 422, "attempt", {}),
    ("logs offset=2**63", "GET", f"/v1/jobs/1/logs?offset={2**63}", None, 422, "offset", {}),
    ("logs attempt=-1", "GET", "/v1/jobs/1/logs?attempt=-1", None, 422, "attempt", {}),
    ("logs rank=-1", "GET", "/v1/jobs/1/logs?rank=-1", None, 422, "rank", {}),
    ("cpu Infinity", "POST", "/v1/jobs", b'{"queue":"team","tier":3,"command":["true"],"cpu":1e400}', 422, "cpu", {}),
    ("cpu NaN", "POST", "/v1/jobs", b'{"queue":"team","tier":3,"command":["true"],"cpu":NaN}', 422, "cpu", {}),
    ("grace NaN", "POST", "/v1/jobs", b'{"queue":"team","tier":3,"command":["true"],"grace":NaN}', 422, "grace", {}),
    (
        "lone surrogate name",
        "POST",
        "/v1/jobs",
        b'{"queue":"team","tier":3,"command":["t"],"name":"\\ud800"}',
        422,
        "name",
        {},
    ),
    (
        "lone surrogate arg",
        "POST",
        "/v1/jobs",
        b'{"queue":"team","tier":3,"command":["\\udfff"]}',
        422,
        "command.0",
        {},
    ),
    ("NUL in a name", "POST", "/v1/jobs", {"name": "a\x00b"}, 422, "name", {}),
    ("NUL in an env value", "POST", "/v1/jobs", {"env": {"A": "\x00"}}, 422, "env.A", {}),
    ("env name with =", "POST", "/v1/jobs", {"env": {"A=B": "1"}}, 422, "env", {}),
    ("NUL in a query", "GET", "/v1/jobs?queue=%00", None, 422, "queue", {}),
    # 5: strict types, the cluster's shape, malformed bodies, unknown routes
    ("tier true", "POST", "/v1/jobs", {"tier": True}, 422, "tier", {}),
    ("tier 1.0", "POST", "/v1/jobs", {"tier": 1.0}, 422, "tier", {}),
    ("gpus as text", "POST", "/v1/jobs", {"gpus": "1"}, 422, "gpus", {}),
    ("replicas true", "POST", "/v1/jobs", {"replicas": True}, 422, "replicas", {}),
    ("cpu above the largest node", "POST", "/v1/jobs", {"cpu": 10**9}, 422, "cpu", {}),
    ("memory above the largest node", "POST", "/v1/jobs", {"memory": 10**9}, 422, "memory", {}),
    ("gpus per replica above any node", "POST", "/v1/jobs", {"gpus": 3}, 422, "gpus", {}),
    ("replicas x gpus above the cluster", "POST", "/v1/jobs", {"gpus": 1, "replicas": 3}, 422, "gpus", {}),
    ("unknown field", "POST", "/v1/jobs", {"priority": 9}, 422, "priority", {}),
    ("deeply nested JSON", "POST", "/v1/jobs", b"[" * 200_000, 400, "body", {}),
    ("invalid UTF-8", "POST", "/v1/jobs", b'{"queue": "\xff\xfe"}', 400, "body", {}),
    ("malformed JSON", "POST", "/v1/jobs", b'{"queue": ', 400, "body", {}),
    ("oversize body", "POST", "/v1/jobs", b" " * (2 << 20), 413, "body", {}),
    ("unknown route", "GET", "/v2/jobs", None, 404, "path", {}),
    ("wrong method", "DELETE", "/v1/jobs", None, 405, "method", {}),
    ("empty policy", "PUT", "/v1/policy", {"source": ""}, 422, "source", {}),
    ("blank policy", "PUT", "/v1/policy", {"source": "  \n"}, 422, "source", {}),
    ("policy of comments only", "PUT", "/v1/policy", {"source": "# nothing\n"}, 422, "source", {}),
    ("policy max_grace below min_grace", "PUT", "/v1/policy", {"source": "max_grace: 1m\n"}, 422, "max_grace", {}),
    (
        "policy tier grace above max_grace",
        "PUT",
        "/v1/policy",
        {"source": "tiers: {3: {grace: 2h}}\n"},
        422,
        "tiers.3.grace",
        {},
    ),
    (
        "policy with a duplicate key",
        "PUT",
        "/v1/policy",
        {"source": "max_lease: 2h\nmax_lease: 3h\n"},
        422,
        "source",
        {},
    ),
    (
        "policy with a queue name too long",
        "PUT",
        "/v1/policy",
        {"source": "queues: {name: root, children: [{name: " + "q" * 300 + ", nominal: {gpu: 1}}]}\n"},
        422,
        "queues.children[0].name",
        {},
    ),
    ("bad idempotency key", "POST", "/v1/jobs", {}, 422, "Idempotency-Key", {"Idempotency-Key": "has spaces"}),
    # reports: authentication first, the same answer for known and unknown jobs
    (
        "report, no token, unknown job",
        "POST",
        "/v1/jobs/424242/reports",
        {"attempt": 1, "kind": "startup"},
        401,
        "Authorization",
        {"Authorization": ""},
    ),
    (
        "report, no token, known job",
        "POST",
        "/v1/jobs/1/reports",
        {"attempt": 1, "kind": "startup"},
        401,
        "Authorization",
        {"Authorization": ""},
    ),
    (
        "report, no token, unicode id",
        "POST",
        "/v1/jobs/%C2%B9/reports",
        {"attempt": 1, "kind": "startup"},
        401,
        "Authorization",
        {"Authorization": ""},
    ),
    (
        "report, no token, bad body",
        "POST",
        "/v1/jobs/1/reports",
        {"attempt": "x"},
        401,
        "Authorization",
        {"Authorization": ""},
    ),
    (
        "report, bad token",
        "POST",
        "/v1/jobs/424242/reports",
        {"attempt": 1, "kind": "startup"},
        401,
        "Authorization",
        {"Authorization": "Bearer nope"},
    ),
    (
        "report, non-ASCII token",
        "POST",
        "/v1/jobs/1/reports",
        {"attempt": 1, "kind": "startup"},
        401,
        "Authorization",
        {"Authorization": "Bearer caf\xe9".encode("latin-1")},
    ),
    ("report at NaN", "POST", "/v1/jobs/1/reports", b'{"attempt":1,"kind":"startup","at":NaN}', 422, "at", {}),
    (
        "report samples 10**20",
        "POST",
        "/v1/jobs/1/reports",
        {"attempt": 1, "kind": "progress", "samples": 10**20},
        422,
        "samples",
        {},
    ),
    ("token user too long", "POST", "/v1/tokens", {"user": "u" * 300}, 422, "user", {}),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field", "headers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_input_is_refused_in_the_error_shape(
    api: Api, method: str, path: str, body: Any, status: int, field: str, headers: dict[str, Any]
) -> None:
    before = api.state()
    if isinstance(body, dict) and path == "/v1/jobs":
        body = api.job(**body)
    if isinstance(body, bytes):
        response = api.client.request(method, path, content=body, headers={**JSON, **headers})
    elif body is None:
        response = api.client.request(method, path, headers=headers)
    else:
        response = api.client.request(method, path, json=body, headers=headers)
    assert_error(response, status, field)
    assert api.state() == before, "a refusal changed something"


def test_a_refusal_names_the_limit_and_shortens_a_huge_value(api: Api) -> None:
    error = assert_error(api.client.post("/v1/jobs", json=api.job(name="n" * 10_000)), 422, "name")
    assert "255" in error["message"] and len(error["value"]) < 300
    error = assert_error(api.client.post("/v1/jobs", json=api.job(command=["a"] * 5000)), 422, "command")
    assert error["value"] == 5000 and "4096" in error["message"] and "limits.max_command_args" in error["message"]
    error = assert_error(api.client.post("/v1/jobs", json=api.job(cpu=10**9)), 422, "cpu")
    assert "2000" not in error["message"] or "largest" in error["message"]
    error = assert_error(api.client.post("/v1/jobs", json=api.job(grace="2h")), 422, "grace")
    assert "max_grace" in error["message"]


def test_the_policy_limits_are_the_ones_applied(api: Api) -> None:
    source = POLICY + "min_grace: 1s\nmax_grace: 10m\nlimits: {max_replicas: 2, max_name_chars: 8}\n"
    assert api.client.put("/v1/policy", json={"source": source}).json()["changed"] is True
    assert_error(api.client.post("/v1/jobs", json=api.job(name="123456789")), 422, "name")
    assert_error(api.client.post("/v1/jobs", json=api.job(replicas=3, gpus=0)), 422, "replicas")
    assert_error(api.client.post("/v1/jobs", json=api.job(grace="11m")), 422, "grace")
    assert (
        api.client.post("/v1/jobs", json=api.job(name="12345678", grace="10m", replicas=2, gpus=0)).status_code == 201
    )


def test_policy_apply_refuses_empty_and_an_unchanged_source_is_no_new_version(api: Api) -> None:
    version = api.client.get("/v1/policy").json()["version"]
    again = api.client.put("/v1/policy", json={"source": POLICY})
    assert again.status_code == 200 and again.json() == {"version": version, "changed": False, "warnings": []}
    assert [p.version for p in api.service.store.policy_history()] == [version]
    error = assert_error(api.client.put("/v1/policy", json={"source": ""}), 422, "source")
    assert "empty" in error["message"]
    assert api.client.get("/v1/policy").json()["version"] == version
    changed = api.client.put("/v1/policy", json={"source": POLICY + "max_lease: 5h\n"})
    assert changed.json() == {"version": version + 1, "changed": True, "warnings": []}


def test_a_policy_whose_quotas_exceed_the_cluster_is_applied_with_a_warning(api: Api) -> None:
    gpus = sum(n.gpus for n in api.service.nodes)
    source = f"queues:\n  name: cluster\n  children:\n    - {{name: vision, nominal: {{gpu: {2 * gpus}}}}}\n"
    source += f"    - {{name: team, nominal: {{gpu: {gpus}}}}}\n"  # the fixture's job is in team
    out = api.client.put("/v1/policy", json={"source": source}).json()
    assert out["changed"] is True
    (w,) = out["warnings"]
    assert (w["resource"], w["nominal"], w["capacity"]) == ("gpu", 3 * gpus, gpus)
    assert "nothing is ever reclaimed" in w["message"] and "× 0.333" in w["message"]
    assert api.client.get("/v1/policy").json()["warnings"] == out["warnings"]


def test_a_policy_whose_quotas_cover_less_than_the_cluster_is_applied_with_a_warning(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """DESIGN §4.2: the root is the cluster; what no queue's nominal covers is said, with how
    much, in the API's answer and in the server's log."""
    gpus = sum(n.gpus for n in api.service.nodes)
    assert gpus >= 2
    source = "queues:\n  name: cluster\n  children:\n    - {name: team, nominal: {gpu: 1}}\n"
    with caplog.at_level("WARNING", logger="warden.server"):
        out = api.client.put("/v1/policy", json={"source": source}).json()
    assert out["changed"] is True
    (w,) = out["warnings"]
    assert (w["kind"], w["resource"], w["nominal"], w["capacity"]) == ("uncovered", "gpu", 1, gpus)
    assert w["message"].startswith(f"{gpus - 1} of the cluster's {gpus} GPUs are covered by no queue's nominal quota")
    assert api.client.get("/v1/policy").json()["warnings"] == out["warnings"]
    (logged,) = [r.getMessage() for r in caplog.records if "cover less than this cluster" in r.getMessage()]
    assert w["message"] in logged
    exact = f"queues:\n  name: cluster\n  children:\n    - {{name: team, nominal: {{gpu: {gpus}}}}}\n"
    assert api.client.put("/v1/policy", json={"source": exact}).json()["warnings"] == []


def test_the_openapi_document_lists_the_refusals_with_the_error_schema(api: Api) -> None:
    doc = api.client.get("/openapi.json").json()
    assert "ErrorBody" in doc["components"]["schemas"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if path == "/v1/health":
                continue
            answers = operation["responses"]
            assert {"401", "422"} <= set(answers), (method, path)
            for status, answer in answers.items():
                if status.startswith("4"):
                    ref = answer["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody"), (method, path, status)


def test_an_acceptable_job_still_goes_in(api: Api) -> None:
    body = api.job(name="n" * 255, command=["a"] * 4096, env={f"V{i}": "x" for i in range(1024)}, grace="1h")
    assert api.client.post("/v1/jobs", json=body).status_code == 201


def test_a_recorded_sigkill_deadline_is_adopted_no_later_than_max_grace(api: Api) -> None:
    """After a restart the server adopts a terminating job with the SIGKILL deadline it
    recorded, bounded by the policy's max_grace: a deadline stored before the bound existed (or
    edited in the database) cannot keep a job that ignores SIGTERM alive."""
    reconciler = api.service.reconciler
    max_grace = reconciler.policy.max_grace
    assert reconciler.recovery.bounded_kill_at(1000.0, 1e12) == 1000.0 + max_grace
    assert reconciler.recovery.bounded_kill_at(1000.0, 1000.0 + max_grace / 2) == 1000.0 + max_grace / 2
    assert reconciler.recovery.bounded_kill_at(None, 5.0) == 5.0
    assert reconciler.recovery.bounded_kill_at(1000.0, None) is None


def test_report_counters_beyond_32_bits_are_kept(api: Api) -> None:
    job = api.service.store.list()[0]
    api.service.store.start_attempt(job.id, 1, 0.0, [{"node": api.service.reconciler.ctx.nodes[0].name, "gpus": [0]}])
    step, samples = 2**40, 2**62
    got = api.client.post(
        f"/v1/jobs/{job.id}/reports", json={"attempt": 1, "kind": "progress", "step": step, "samples": samples}
    )
    assert got.status_code in (200, 202, 204), got.text
    attempt = api.service.store.attempt(job.id, 1)
    assert attempt is not None and (attempt.progress_step, attempt.progress_samples) == (step, samples)


def test_a_server_started_with_quotas_beyond_its_cluster_says_so(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("queues:\n  name: cluster\n  children:\n    - {name: team, nominal: {gpu: 8}}\n")
    said: list[str] = []
    service = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=said.append
    )
    try:
        (warning,) = [m for m in said if "quotas exceed this cluster" in m]
        assert "add up to 8 but the cluster has 2" in warning
    finally:
        service.executor.close()


def test_a_server_started_with_quotas_that_cover_part_of_its_cluster_says_so(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("queues:\n  name: cluster\n  children:\n    - {name: team, nominal: {gpu: 1}}\n")
    said: list[str] = []
    service = build_service(
        Settings(policy=policy, fake_gpus=4, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=said.append
    )
    try:
        (warning,) = [m for m in said if "quotas cover less than this cluster" in m]
        assert "3 of the cluster's 4 GPUs are covered by no queue's nominal quota" in warning
    finally:
        service.executor.close()
