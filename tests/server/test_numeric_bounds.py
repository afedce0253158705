"""Every number the API takes, at its boundaries: 0, -1, its limit and one past it, a float
where an integer is expected, NaN and infinity where a float is. A refusal is a 4xx in the one
error shape, names the field, and changes nothing; a value at a limit the API allows is taken.
In process, on the real app and store (as in `test_limits`: 2 fake GPUs, one job, no reconcile
loop), one server for the whole module: a refusal changes nothing, and what is taken only adds
jobs and reports."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_limits import POLICY, TOKEN, Api, assert_error, no_lifespan

from warden.server.app import Settings, build_service, create_app

I32 = 2**31 - 1
I64 = 2**63 - 1
NAN, INF = float("nan"), float("inf")
DAY = 86400

# The job fields with their bounds (the fixture's cluster: one node, 2 GPUs; the default policy:
# tiers 1-4, grace 120s-1h, lease at most 8h, time_limit at most 365d, at most 1024 replicas).
JOB_REFUSED: list[tuple[str, Any]] = [
    *[("gpus", v) for v in (-1, I32, I32 + 1, 1.5, 1.0, "1", True, NAN, INF)],
    *[("replicas", v) for v in (0, -1, 1025, I32, I32 + 1, 1.5, 1.0, NAN, INF)],
    *[("cpu", v) for v in (-1, I32, I32 + 1, 1.5, NAN, INF)],
    *[("memory", v) for v in (-1, I32, I32 + 1, 1.5, NAN, INF)],
    *[("tier", v) for v in (0, -1, 5, I32 + 1, 1.5, NAN)],
    *[("lease", v) for v in (-1, "-1s", 8 * 3600 + 1, "8h1s", 1e300, NAN, INF, "1e400")],
    *[("grace", v) for v in (0, -1, "0s", 119, 3601, "1h1s", NAN, INF)],
    *[("time_limit", v) for v in (0, "0s", -1, 365 * DAY + 1, "366d", NAN, INF)],
]
JOB_TAKEN: list[tuple[str, Any]] = [
    ("gpus", 0),
    ("gpus", 2),
    ("replicas", 1),
    ("cpu", 0),
    ("memory", 0),
    ("tier", 1),
    ("tier", 4),
    ("lease", 0),
    ("lease", "8h"),
    ("grace", 120),
    ("grace", "1h"),
    ("time_limit", 1),
    ("time_limit", "365d"),
]

REPORT_REFUSED: list[tuple[str, str, Any, int]] = [
    *[("attempt", "progress", v, 422) for v in (0, -1, I32 + 1, 1.5, NAN)],
    ("attempt", "progress", I32, 409),  # in bounds, but no such attempt runs
    *[("at", "progress", v, 422) for v in (-1, 1e11 + 1, NAN, INF)],
    *[("startup_s", "startup", v, 422) for v in (-1, 1e9 + 1, NAN, INF)],
    *[("duration_s", "checkpoint_finished", v, 422) for v in (-1, 1e9 + 1, NAN, INF)],
    *[(f, "progress", v, 422) for f in ("step", "samples", "size_bytes") for v in (-1, I64 + 1, 1.5, NAN)],
]
REPORT_TAKEN: list[tuple[str, str, Any]] = [
    *[("at", "progress", v) for v in (0, 1e11)],
    *[("startup_s", "startup", v) for v in (0, 1e9)],
    *[("duration_s", "checkpoint_finished", v) for v in (0, 1e9)],
    *[(f, "progress", v) for f in ("step", "samples", "size_bytes") for v in (0, I64)],
]

# (path with {job}, parameter, value, status)
QUERY_REFUSED: list[tuple[str, str, str, int]] = [
    *[("/v1/jobs", "limit", v, 422) for v in ("0", "-1", "1001", "1.5", "nan", "inf")],
    *[("/v1/jobs", "offset", v, 422) for v in ("-1", str(10**9 + 1), "1.5", "nan")],
    *[("/v1/jobs/{job}/logs", "attempt", v, 422) for v in ("0", "-1", str(I32 + 1), "1.5")],
    ("/v1/jobs/{job}/logs", "attempt", str(I32), 404),  # in bounds, but no such attempt
    *[("/v1/jobs/{job}/logs", "rank", v, 422) for v in ("-1", "1", str(I32), str(I32 + 1), "0.5")],
    *[("/v1/jobs/{job}/logs", "offset", v, 422) for v in ("-1", str(I64 + 1), "1.5")],
    *[("/v1/audit", "limit", v, 422) for v in ("0", "-1", "10001", "1.5")],
    *[("/v1/history", p, v, 422) for p in ("since", "until") for v in ("-1", "100000000001", "nan", "inf", "-inf")],
    ("/v1/history", "since", "0", 422),  # more than 31 days before until
    *[("/v1/preemptions", "since", v, 422) for v in ("-1", "100000000001", "nan", "inf")],
    *[("/v1/preemptions", "limit", v, 422) for v in ("0", "-1", "1001", "1.5")],
    *[("/v1/history/export", "since", v, 422) for v in ("-1", "0", "100000000001", "nan", "inf")],
]
QUERY_TAKEN: list[tuple[str, str, str]] = [
    ("/v1/jobs", "limit", "1"),
    ("/v1/jobs", "limit", "1000"),
    ("/v1/jobs", "offset", "0"),
    ("/v1/jobs", "offset", str(10**9)),
    ("/v1/jobs/{job}/logs", "attempt", "1"),
    ("/v1/jobs/{job}/logs", "rank", "0"),
    ("/v1/jobs/{job}/logs", "offset", "0"),
    ("/v1/jobs/{job}/logs", "offset", str(I64)),
    ("/v1/audit", "limit", "1"),
    ("/v1/audit", "limit", "10000"),
    ("/v1/preemptions", "limit", "1"),
    ("/v1/preemptions", "limit", "1000"),
    ("/v1/preemptions", "since", "0"),
    ("/v1/history", "until", "0"),
]

# The numbers of a policy (PUT /v1/policy, POST /v1/policy/diff): refused naming their path.
POLICY_REFUSED: list[tuple[str, str]] = [
    ("limits: {max_replicas: 0}", "limits.max_replicas"),
    ("limits: {max_replicas: -1}", "limits.max_replicas"),
    (f"limits: {{max_replicas: {I32 + 1}}}", "limits.max_replicas"),
    ("limits: {max_replicas: 1.5}", "limits.max_replicas"),
    ("limits: {max_body_bytes: 0}", "limits.max_body_bytes"),
    ("limits: {max_name_chars: 256}", "limits.max_name_chars"),
    ("max_lease: -1", "max_lease"),
    ("max_lease: .nan", "max_lease"),
    ("max_grace: .inf", "max_grace"),
    ("min_grace: -1s", "min_grace"),
]


def first(api: Api) -> Any:
    """The job the server started with (the one with a running attempt)."""
    return min(api.service.store.list(), key=lambda j: j.id)


def stored(api: Api) -> tuple[Any, ...]:
    """What a refusal must leave as it was: the jobs, the policy version, the audit log, every
    event, and the running attempt's record."""
    store = api.service.store
    job = first(api)
    jobs, version = api.state()
    events = sum(len(store.events(j.id)) for j in store.list())
    return jobs, version, len(store.audit_log(limit=10_000)), events, store.attempt(job.id, 1)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, _jobs_base: Path | None) -> Iterator[Api]:
    """The server, its one job with a running attempt 1 (so that reports and logs reach it);
    under root, in the session's directory job uids can pass through (tests/conftest.py)."""
    tmp = Path(tempfile.mkdtemp(prefix="bounds-", dir=_jobs_base)) if _jobs_base else tmp_path_factory.mktemp("bounds")
    tmp.chmod(0o711)
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    service = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp / "state", bootstrap_token=TOKEN), say=lambda _: None
    )
    app = create_app(service)
    app.router.lifespan_context = no_lifespan  # no reconcile loop: nothing sent here runs
    client = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)
    api = Api(service, client, Path(tmp))
    assert client.post("/v1/jobs", json=api.job()).status_code == 201
    job = first(api)
    service.store.start_attempt(job.id, 1, 0.0, [{"node": service.reconciler.ctx.nodes[0].name, "gpus": [0]}])
    try:
        yield api
    finally:
        client.close()
        service.executor.close()
        service.store.close()


@pytest.fixture
def api(running: Api) -> Api:
    return running


def post_json(api: Api, path: str, body: dict[str, Any]) -> Any:
    """`body` as JSON, NaN and Infinity written as Python's encoder writes them (not RFC JSON,
    but what a careless client sends)."""
    return api.client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


@pytest.mark.parametrize("dry_run", [False, True], ids=["submit", "dry-run"])
@pytest.mark.parametrize(("field", "value"), JOB_REFUSED, ids=[f"{f}={v!r}" for f, v in JOB_REFUSED])
def test_a_job_number_out_of_bounds_is_refused_naming_it(api: Api, field: str, value: Any, dry_run: bool) -> None:
    before = stored(api)
    path = "/v1/jobs?dry_run=true" if dry_run else "/v1/jobs"
    error = assert_error(post_json(api, path, api.job(**{field: value})), 422, field)
    assert "internal error" not in error["message"]
    assert stored(api) == before, "a refusal changed something"


@pytest.mark.parametrize(("field", "value"), JOB_TAKEN, ids=[f"{f}={v!r}" for f, v in JOB_TAKEN])
def test_a_job_number_at_its_bound_is_taken(api: Api, field: str, value: Any) -> None:
    jobs = api.state()[0]
    extra = {"gpus": 0} if field in ("replicas", "cpu", "memory") else {}
    got = post_json(api, "/v1/jobs", api.job(**{field: value, **extra}))
    assert got.status_code == 201, got.text
    assert api.state()[0] == jobs + 1


def test_replicas_at_the_policy_limit_is_taken_and_one_past_is_refused(api: Api) -> None:
    limit = api.service.policy.limits.max_replicas
    assert post_json(api, "/v1/jobs", api.job(replicas=limit, gpus=0)).status_code == 201
    before = stored(api)
    error = assert_error(post_json(api, "/v1/jobs", api.job(replicas=limit + 1, gpus=0)), 422, "replicas")
    assert "limits.max_replicas" in error["message"]
    assert stored(api) == before


def test_zero_replicas_is_a_422_that_says_at_least_one(api: Api) -> None:
    before = stored(api)
    error = assert_error(post_json(api, "/v1/jobs", api.job(replicas=0)), 422, "replicas")
    assert error["value"] == 0 and "greater than or equal to 1" in error["message"]
    assert stored(api) == before


@pytest.mark.parametrize(
    ("field", "kind", "value", "status"), REPORT_REFUSED, ids=[f"{f}={v!r}" for f, _, v, _ in REPORT_REFUSED]
)
def test_a_report_number_out_of_bounds_is_refused_naming_it(
    running: Api, field: str, kind: str, value: Any, status: int
) -> None:
    job = first(running)
    before = stored(running)
    body = {"attempt": 1, "kind": kind, field: value}
    assert_error(post_json(running, f"/v1/jobs/{job.id}/reports", body), status, field)
    assert stored(running) == before, "a refusal changed something"


@pytest.mark.parametrize(("field", "kind", "value"), REPORT_TAKEN, ids=[f"{f}={v!r}" for f, _, v in REPORT_TAKEN])
def test_a_report_number_at_its_bound_is_taken(running: Api, field: str, kind: str, value: Any) -> None:
    job = first(running)
    got = post_json(running, f"/v1/jobs/{job.id}/reports", {"attempt": 1, "kind": kind, field: value})
    assert got.status_code == 202, got.text


@pytest.mark.parametrize(
    ("path", "param", "value", "status"), QUERY_REFUSED, ids=[f"{p} {q}={v}" for p, q, v, _ in QUERY_REFUSED]
)
def test_a_query_number_out_of_bounds_is_refused_naming_it(
    running: Api, path: str, param: str, value: str, status: int
) -> None:
    job = first(running)
    before = stored(running)
    got = running.client.get(path.format(job=job.id), params={param: value})
    assert_error(got, status, param)
    assert stored(running) == before, "a refusal changed something"


@pytest.mark.parametrize(("path", "param", "value"), QUERY_TAKEN, ids=[f"{p} {q}={v}" for p, q, v in QUERY_TAKEN])
def test_a_query_number_at_its_bound_is_taken(running: Api, path: str, param: str, value: str) -> None:
    job = first(running)
    got = running.client.get(path.format(job=job.id), params={param: value})
    assert got.status_code == 200, got.text


@pytest.mark.parametrize("method", ["PUT /v1/policy", "POST /v1/policy/diff"])
@pytest.mark.parametrize(("line", "field"), POLICY_REFUSED, ids=[line for line, _ in POLICY_REFUSED])
def test_a_policy_number_out_of_bounds_is_refused_naming_it(api: Api, method: str, line: str, field: str) -> None:
    verb, path = method.split()
    before = stored(api)
    got = api.client.request(verb, path, json={"source": POLICY + line + "\n"})
    assert_error(got, 422, field)
    assert stored(api) == before, "a refusal changed something"
