"""Ids and bodies no client of warden sends, to a real server process: an id in a path that no
stored row can have (past 64 bits, negative, zero, not ASCII digits) and JSON or YAML nested
thousands deep. Each is a 4xx naming the field and the value, in the one error shape, changes
nothing, and leaves no traceback in the server's log."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serverproc import Server, cli, kill_leftovers, started, submit

from warden.engine.safeyaml import MAX_DEPTH

POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"
JOB = {"queue": "team", "tier": 3, "gpus": 0, "command": [sys.executable, "-c", "pass"]}

BAD_IDS = [
    "18446744073709551616",  # 2^64
    "9223372036854775808",  # 2^63: one past a BIGINT
    "99999999999999999999999999999999999999",
    "-1",
    "0",
    "00",
    "abc",
    "1.5",
    "1e3",
    "\uff11",  # a fullwidth 1: str.isdigit says yes
    "\u0663",  # an Arabic-Indic 3
]
# Each route that names a stored row by id, and how to ask it.
ID_ROUTES = [
    ("DELETE", "/v1/tokens/{}", None),
    ("GET", "/v1/jobs/{}", None),
    ("POST", "/v1/jobs/{}/cancel", None),
    ("POST", "/v1/jobs/{}/approve", None),
    ("POST", "/v1/jobs/{}/release", None),
    ("GET", "/v1/jobs/{}/logs", None),
    ("POST", "/v1/jobs/{}/reports", {"attempt": 1, "kind": "progress", "at": 1.0}),
]
# Each route that takes a JSON body.
BODY_ROUTES = [
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs?dry_run=true"),
    ("POST", "/v1/tokens"),
    ("PUT", "/v1/policy"),
    ("POST", "/v1/policy/diff"),
    ("POST", "/v1/jobs/1/reports"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One server for the module: a refusal changes nothing, which each test checks."""
    tmp = Path(tempfile.mkdtemp(prefix="warden-hostile-"))
    tmp.chmod(0o711)  # jobs' uids pass through to their directories
    s = started(tmp, POLICY)
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def job_ids(admin: httpx.Client) -> set[str]:
    return {j["id"] for j in admin.get("/v1/jobs", params={"all": "true"}).json()}


def refusal(r: httpx.Response, status: int, field: str) -> dict[str, object]:
    """The answer's one error, checked to be a `status` naming `field`."""
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["field"] == field, error
    return dict(error)


def clean_log(server: Server) -> None:
    assert server.log is not None
    text = server.log.read_text()
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]


@pytest.mark.parametrize("method, path, body", ID_ROUTES, ids=[f"{m} {p}" for m, p, _ in ID_ROUTES])
def test_an_id_no_row_can_have_is_a_404_naming_it(
    server: Server, admin: httpx.Client, method: str, path: str, body: object
) -> None:
    tokens = admin.get("/v1/tokens").json()
    jobs = job_ids(admin)
    what = "token" if "tokens" in path else "job"
    for bad in BAD_IDS:
        r = admin.request(method, path.format(bad), json=body)
        error = refusal(r, 404, "id")
        assert error["value"] == bad, error
        assert error["message"] == f"no such {what}: a {what} id is ASCII digits, from 1 to 2^63 - 1", error
    # The largest id a row can have is looked up, and is simply not there.
    r = admin.request(method, path.format(2**63 - 1), json=body)
    assert r.status_code in (401, 404), r.text  # a report's bearer is checked against the job's
    assert admin.get("/v1/tokens").json() == tokens
    assert job_ids(admin) == jobs
    clean_log(server)


def test_revoking_a_token_id_past_64_bits_from_the_cli_is_one_line(server: Server, admin: httpx.Client) -> None:
    tokens = admin.get("/v1/tokens").json()
    done = cli(server.url, "token", "revoke", str(2**64))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    flat = " ".join(done.stderr.split())
    assert str(2**64) in flat and "a token id is ASCII digits, from 1 to 2^63 - 1" in flat, done.stderr
    assert admin.get("/v1/tokens").json() == tokens
    clean_log(server)


@pytest.mark.parametrize("method, path", BODY_ROUTES, ids=[f"{m} {p}" for m, p in BODY_ROUTES])
def test_json_nested_thousands_deep_is_a_400_naming_the_body(
    server: Server, admin: httpx.Client, method: str, path: str
) -> None:
    if not job_ids(admin):
        submit(admin, **JOB)  # job 1 exists: its reports route parses the body
    before = job_ids(admin)
    policy = admin.get("/v1/policy").json()
    for deep in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        r = admin.request(method, path, content=deep, headers={"Content-Type": "application/json"})
        error = refusal(r, 400, "body")
        assert error["message"] == "malformed JSON: nested too deeply", error
    # Within the parser's depth, the nesting is a value of the wrong type, named by its field.
    within = "[" * 500 + "]" * 500
    r = admin.request(method, path, content=f'{{"queue": {within}}}', headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text[:500]
    assert r.json()["error"]["field"] != "request", r.text[:500]
    assert job_ids(admin) == before
    assert admin.get("/v1/policy").json() == policy
    clean_log(server)


@pytest.mark.parametrize("method, path", [("PUT", "/v1/policy"), ("POST", "/v1/policy/diff")])
@pytest.mark.parametrize(
    "source",
    ["[" * 10_000 + "]" * 10_000, "{a: " * 10_000 + "1" + "}" * 10_000, "".join("  " * i + "a:\n" for i in range(300))],
    ids=["flow-list", "flow-mapping", "block-mapping"],
)
def test_a_policy_nested_thousands_deep_is_a_422_naming_the_source(
    server: Server, admin: httpx.Client, method: str, path: str, source: str
) -> None:
    policy = admin.get("/v1/policy").json()
    r = admin.request(method, path, json={"source": source})
    error = refusal(r, 422, "source")
    assert f"collections nested more than {MAX_DEPTH} deep are not accepted (line " in str(error["message"]), error
    assert admin.get("/v1/policy").json() == policy
    clean_log(server)


def test_a_policy_file_nested_deep_is_refused_by_the_cli_before_it_is_sent(
    server: Server, admin: httpx.Client, tmp_path: Path
) -> None:
    """`warden policy apply` and `policy diff` read a file a person wrote and send it: its depth
    is refused by name, in one line, with nothing applied."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 10_000 + "]" * 10_000 + "\n")
    policy = admin.get("/v1/policy").json()
    for args in (("policy", "apply", str(deep)), ("policy", "diff", str(deep))):
        done = cli(server.url, *args)
        assert done.returncode != 0, (args, done.stdout)
        assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr[-2000:]
        flat = " ".join(done.stderr.split())
        assert f"nested more than {MAX_DEPTH} deep" in flat, (args, done.stderr[-2000:])
    assert admin.get("/v1/policy").json() == policy
    clean_log(server)
