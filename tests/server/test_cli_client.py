"""The CLI verbs against a real server: `submit` prints the id last, listings have `--json`,
refusals exit 2 naming the field, an unreachable server exits 1. One run on PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import ADMIN, Server, cli, kill_leftovers, server_fixture, shared_server_fixture, started, wait_for

from warden.cli.jobs import QUEUE_COLUMNS

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 1s, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
  1: {name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s, requires_approval: true}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""


def warden(
    server: Server, *args: str, token: str | None = ADMIN, check: bool = False, columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    return cli(server.url, *args, token=token, check=check, columns=columns)


server = server_fixture(POLICY)
shared_server = shared_server_fixture(POLICY)
"""For the tests whose commands are refused: they change nothing."""


def test_submit_queue_describe_logs_and_cancel(server: Server, tmp_path: Path) -> None:
    out = warden(
        server,
        "submit",
        "--queue",
        "vision",
        "--tier",
        "3",
        "--gpus",
        "1",
        "--name",
        "hello",
        "--",
        sys.executable,
        "-c",
        "print('hello from warden')",
        check=True,
    ).stdout
    job = out.split()[-1]
    assert job.isdigit()
    wait_for(lambda: json.loads(warden(server, "describe", job, "--json", check=True).stdout)["state"] == "SUCCEEDED")
    assert warden(server, "logs", job, check=True).stdout == "hello from warden\n"
    rows = json.loads(warden(server, "queue", "--all", "--json", check=True).stdout)
    assert [(r["id"], r["name"], r["state"]) for r in rows] == [(job, "hello", "SUCCEEDED")]
    assert "SUCCEEDED" in warden(server, "queue", "--all", check=True).stdout

    big = warden(server, "submit", "-q", "vision", "-t", "3", "--gpus", "4", "--", "sleep", "60", check=True)
    blocked = warden(server, "submit", "-q", "vision", "-t", "3", "--gpus", "2", "--", "true", check=True)
    blocked_id = blocked.stdout.split()[-1]
    detail = wait_for(
        lambda: (d := json.loads(warden(server, "describe", blocked_id, "--json").stdout))["reason"] and d
    )
    assert detail["reason"]["code"] in ("InsufficientCapacity", "QuotaExceeded") and detail["position"] == 1
    text = warden(server, "describe", blocked_id, check=True).stdout
    assert "why pending" in text and detail["reason"]["message"][:30] in text.replace("\n", " ")
    big_id = big.stdout.split()[-1]
    assert "cancel requested" in warden(server, "cancel", big_id, check=True).stdout
    wait_for(lambda: json.loads(warden(server, "describe", blocked_id, "--json").stdout)["state"] == "SUCCEEDED")
    assert json.loads(warden(server, "describe", big_id, "--json").stdout)["state"] == "CANCELLED"


def test_nodes_queues_tokens_audit_and_policy_apply(server: Server, tmp_path: Path) -> None:
    nodes = json.loads(warden(server, "nodes", "--json", check=True).stdout)
    assert len(nodes) == 1 and nodes[0]["gpus"] == 4
    queues = {q["name"]: q for q in json.loads(warden(server, "queues", "--json", check=True).stdout)}
    assert queues["vision"]["nominal"] == {"gpu": 2.0} and queues["cluster"]["leaf"] is False
    token = warden(server, "token", "create", "--user", "carol", "--queues", "language", check=True).stdout.strip()
    refused = warden(server, "submit", "-q", "vision", "-t", "3", "--", "true", token=token)
    assert refused.returncode == 2 and "carol" in refused.stderr and "vision" in refused.stderr
    pending = warden(server, "submit", "-q", "language", "-t", "2", "--", "true", token=token, check=True)
    assert "AWAITING_APPROVAL" in pending.stdout
    assert warden(server, "approve", pending.stdout.split()[-1], token=token).returncode == 2
    assert "PENDING" in warden(server, "approve", pending.stdout.split()[-1], check=True).stdout
    new_policy = tmp_path / "new.yaml"
    new_policy.write_text(POLICY.replace("lease: 1s", "lease: 2s"))
    assert "policy version 2 applied" in warden(server, "policy", "apply", str(new_policy), check=True).stdout
    actions = [a["action"] for a in json.loads(warden(server, "audit", "--json", check=True).stdout)]
    assert {"token.create", "approve", "policy.apply"} <= set(actions)

    # The tables, at 80 columns: nothing past the edge, no cell cut, the values whole.
    listed = {verb: warden(server, verb, columns=80, check=True).stdout for verb in ("nodes", "queues", "audit")}
    for text in listed.values():
        assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text, text
    node = nodes[0]
    assert listed["nodes"].splitlines()[1].split()[:3] == [node["name"], node["flavor"], "4"]
    for name in queues:
        assert any(line.split()[0] == name for line in listed["queues"].splitlines()), listed["queues"]
    flat = " ".join(listed["audit"].split())
    assert all(action in flat for action in actions) and "role: user; queues: language; expires_at: " in flat
    wide = warden(server, "nodes", "--wide", columns=80, check=True).stdout
    assert wide.split()[:5] == ["NODE", "FLAVOR", "BLOCK", "CPU", "MEMORY"]
    assert "WEIGHT" in warden(server, "queues", "-w", check=True).stdout and "WEIGHT" not in listed["queues"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["submit", "-q", "nope", "-t", "3", "--", "true"], ["queue", "nope"]),
        (["submit", "-q", "vision", "-t", "5", "--", "true"], ["tier", "5"]),
        (["submit", "-q", "vision", "-t", "3", "--gpus", "64", "--", "true"], ["gpus", "64"]),
        (["submit", "-q", "vision", "-t", "3", "--grace", "1s", "--", "true"], ["grace"]),
        (["describe", "999"], ["id", "999"]),
        (["cancel", "abc"], ["id", "abc"]),
    ],
)
def test_refusals_name_the_field_and_exit_2(shared_server: Server, args: list[str], words: list[str]) -> None:
    done = warden(shared_server, *args)
    assert done.returncode == 2 and done.stdout == ""
    for w in words:
        assert w in done.stderr
    assert "Traceback" not in done.stderr


def test_refusals_write_durations_in_their_short_form(shared_server: Server) -> None:
    """A refusal names a duration as a person writes it (`8h`, not `28800 s`), its value too."""
    server = shared_server
    done = warden(server, "submit", "-q", "vision", "-t", "3", "--lease", "9h", "--", "true")
    assert done.returncode == 2 and "lease: is above the policy's maximum lease of 8h (got '9h')" in done.stderr
    assert "28800" not in done.stderr and "32400" not in done.stderr
    grace = warden(server, "submit", "-q", "vision", "-t", "3", "--grace", "1s", "--", "true")
    assert grace.returncode == 2 and "minimum grace of 2s (got '1s')" in grace.stderr, grace.stderr


def test_a_wrong_token_and_no_server(shared_server: Server) -> None:
    server = shared_server
    done = warden(server, "queue", token="wrong")
    assert done.returncode == 2 and "token" in done.stderr
    gone = Server(server.state_dir, port=1)
    env_done = warden(gone, "queue")
    assert env_done.returncode == 1 and "cannot reach" in env_done.stderr


def test_the_server_runs_on_postgresql(tmp_path: Path, fresh_postgres_url: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    s = Server(tmp_path / "state", policy=policy, db=fresh_postgres_url).start()
    try:
        out = warden(s, "submit", "-q", "language", "-t", "3", "--", sys.executable, "-c", "print(6*7)", check=True)
        job = out.stdout.split()[-1]
        wait_for(lambda: json.loads(warden(s, "describe", job, "--json").stdout)["state"] == "SUCCEEDED")
        assert warden(s, "logs", job, check=True).stdout == "42\n"
    finally:
        s.stop()


def test_dry_run_and_expected_starts_at_80_columns(tmp_path: Path) -> None:
    """`submit --dry-run` says what would happen and creates nothing; `queue` and `describe`
    show a waiting job's expected start, and every line fits 80 columns."""
    server = started(tmp_path, POLICY, args=("--forecast-interval", "1"))
    try:
        for queue in ("vision", "language"):
            warden(server, "submit", "-q", queue, "-t", "3", "--gpus", "2", "--time-limit", "1h", "--", "sleep", "600")
        wait_for(lambda: [r["state"] for r in json.loads(warden(server, "queue", "--json").stdout)] == ["RUNNING"] * 2)

        job_args = ["-q", "vision", "-t", "3", "--gpus", "2", "--time-limit", "10m"]
        dry = ["submit", "--dry-run", *job_args]
        out = json.loads(warden(server, *dry, "--json", "--", "true", check=True).stdout)
        assert out["dry_run"] is True and out["decision"] == "wait" and out["expected_start"]["at"] is not None
        text = warden(server, *dry, "--", "true", columns=80, check=True).stdout
        assert text.splitlines()[0].startswith("would wait")
        assert "expected start:" in text and re.search(r"in (1h|59m)", text) and "an estimate" in text
        assert all(len(line) <= 80 for line in text.splitlines()), text
        assert len(json.loads(warden(server, "queue", "--json").stdout)) == 2  # nothing submitted

        job = warden(server, "submit", *job_args, "--", "true", check=True).stdout.split()[-1]
        wait_for(
            lambda: (json.loads(warden(server, "describe", job, "--json").stdout)["expected_start"] or {}).get("at")
        )
        queue = warden(server, "queue", columns=80, check=True).stdout
        assert queue.split()[:8] == ["ID", "NAME", "QUEUE", "TIER", "STATE", "GPUS", "START", "REASON"]
        row = next(line for line in queue.splitlines() if line.startswith(f"{job} "))
        assert "in 1h" in row or "in 59m" in row, queue
        assert row.split()[-1] in ("InsufficientCapacity", "QuotaExceeded") and "…" not in queue
        wide = warden(server, "queue", "--wide", columns=80, check=True).stdout
        row = next(line for line in wide.splitlines() if line.startswith(f"{job} "))
        listed = next(r for r in json.loads(warden(server, "queue", "--json").stdout) if r["id"] == job)
        assert wide.split()[: len(QUEUE_COLUMNS)] == [c.header for c in QUEUE_COLUMNS] and listed["user"] in row.split()
        described = warden(server, "describe", job, columns=80, check=True).stdout
        assert "expected start:" in described and "an estimate" in described
        assert all(len(line) <= 80 for line in queue.splitlines() + described.splitlines())
    finally:
        server.stop()
        kill_leftovers(tmp_path)


def test_tokens_expire_are_listed_and_revoked(server: Server) -> None:
    made = json.loads(
        warden(server, "token", "create", "--user", "dora", "--expires", "30d", "--json", check=True).stdout
    )
    dora = made["token"]
    assert made["expires_at"] == pytest.approx(time.time() + 30 * 86400, abs=60)
    assert warden(server, "queue", token=dora, check=True).returncode == 0
    default = json.loads(warden(server, "token", "create", "--user", "eve", "--json", check=True).stdout)
    assert default["expires_at"] == pytest.approx(time.time() + 90 * 86400, abs=60)  # the server's default

    listed = json.loads(warden(server, "token", "list", "--json", check=True).stdout)
    by_user = {t["user"]: t for t in listed}
    assert by_user["admin"]["expires_at"] is None  # the bootstrap token never expires
    assert by_user["dora"]["expires_at"] == made["expires_at"] and by_user["dora"]["revoked_at"] is None
    assert not any(dora in json.dumps(t) for t in listed) and "token_hash" not in json.dumps(listed)
    table = warden(server, "token", "list", check=True).stdout
    assert "dora" in table and "never" in table and dora not in table
    assert warden(server, "token", "list", token=dora).returncode == 2  # admins only
    assert warden(server, "token", "revoke", str(by_user["admin"]["id"]), token=dora).returncode == 2

    # Revoked: refused on the very next request, though the grant was cached a moment ago.
    revoked = warden(server, "token", "revoke", str(by_user["dora"]["id"]), check=True)
    assert "revoked" in revoked.stdout
    refused = warden(server, "queue", token=dora)
    assert refused.returncode == 2 and "token revoked" in refused.stderr
    again = warden(server, "token", "revoke", str(by_user["dora"]["id"]))
    assert again.returncode == 2 and "revoked already" in again.stderr
    assert warden(server, "token", "revoke", "999999").returncode == 2
    after = {t["user"]: t for t in json.loads(warden(server, "token", "list", "--json", check=True).stdout)}
    assert after["dora"]["revoked_at"] is not None and after["eve"]["revoked_at"] is None

    # Expired: a token of one second works, then is refused saying when it expired.
    with server.client() as admin:
        short = admin.post("/v1/tokens", json={"user": "fay", "expires_in_s": 1}).json()
    with server.client(short["token"]) as fay:
        first = fay.get("/v1/jobs")
        if time.time() < short["expires_at"]:
            assert first.status_code == 200, first.text
        gone = wait_for(lambda: (r := fay.get("/v1/jobs")).status_code == 401 and r, what="the token to expire")
    assert time.time() >= short["expires_at"]
    assert re.search(r"token expired at \d\d:\d\d \((now|[\w ]+ ago)\)", gone.text), gone.text
    assert gone.headers["WWW-Authenticate"] == "Bearer"

    audit = json.loads(warden(server, "audit", "--json", check=True).stdout)
    creates = [a for a in audit if a["action"] == "token.create" and a["target"] == "user/dora"]
    assert [a["details"]["expires_at"] for a in creates] == [made["expires_at"]]
    revokes = [a for a in audit if a["action"] == "token.revoke"]
    assert [(a["target"], a["details"]["user"]) for a in revokes] == [(f"token/{by_user['dora']['id']}", "dora")]


@pytest.mark.parametrize("expires", ["0s", "0.5s", "3651d", "-1d", "soon"])
def test_a_bad_expires_is_refused_before_sending(tmp_path: Path, expires: str) -> None:
    nowhere = Server(tmp_path / "none")  # never started: a refusal must not need the server
    done = warden(nowhere, "token", "create", "--user", "x", "--expires", expires)
    assert done.returncode == 2 and "--expires" in done.stderr, done.stderr


@pytest.mark.parametrize("lifetime", ["-1d", "3651d", "soon"])
def test_a_bad_token_lifetime_stops_the_server(tmp_path: Path, lifetime: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "server", "--state-dir", str(tmp_path), "--token-lifetime", lifetime],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--token-lifetime" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://head:8765", "is not an http:// or https:// URL"),
        ("http://a:1,http://b:2", "names several URLs"),
        ("", "is empty"),
        ("http://head:8765?x=1", "has a query"),
    ],
)
def test_a_bad_advertise_url_stops_the_server(tmp_path: Path, url: str, why: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "server", "--state-dir", str(tmp_path), "--advertise-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"--advertise-url: {url!r} {why}" in done.stderr, done.stderr
    assert not (tmp_path / "warden.db").exists()


@pytest.mark.parametrize("private_data", ["jobs", "none"])
def test_describe_and_logs_of_another_users_job(tmp_path: Path, private_data: str) -> None:
    s = started(tmp_path, POLICY, args=("--private-data", private_data))
    try:
        ana = warden(s, "token", "create", "--user", "ana", "--queues", "vision", check=True).stdout.strip()
        bo = warden(s, "token", "create", "--user", "bo", "--queues", "language", check=True).stdout.strip()
        out = warden(s, "submit", "-q", "language", "-t", "3", "--", "echo", "bo-secret-arg", token=bo, check=True)
        job = out.stdout.split()[-1]
        wait_for(lambda: json.loads(warden(s, "describe", job, "--json", token=bo).stdout)["state"] == "SUCCEEDED")
        assert warden(s, "logs", job, token=bo, check=True).stdout == "bo-secret-arg\n"
        seen = warden(s, "describe", job, token=ana, check=True).stdout
        logs = warden(s, "logs", job, token=ana)
        if private_data == "jobs":
            assert "hidden" in seen and "bo-secret-arg" not in seen and "SUCCEEDED" in seen and "language" in seen
            assert logs.returncode == 2 and "--private-data" in logs.stderr and "bo-secret-arg" not in logs.stdout
        else:
            assert "bo-secret-arg" in seen and logs.stdout == "bo-secret-arg\n"
        assert "bo-secret-arg" in warden(s, "describe", job, check=True).stdout  # the admin reads it
    finally:
        s.stop()
        kill_leftovers(tmp_path)


GRACEFUL = POLICY.replace(
    "3: {name: experimentation, lease: 1s, grace: 2s}", "3: {name: experimentation, lease: 1s, grace: 5m}"
)
"""POLICY with a tier-3 grace of 5 minutes: a job that ignores SIGTERM stays in its grace while
the test reads it."""

STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
)


def test_a_cancelled_job_in_its_grace_shows_cancelling_and_its_sigkill_countdown(tmp_path: Path) -> None:
    """A running job shows its nodes (`queue --wide`), its lease end and η (`describe`). Then,
    ignoring SIGTERM, it is cancelled: the API's `state` still says RUNNING (with
    `cancel_requested` and `kill_at`), its `shown_state` CANCELLING, in the cancel's answer, the
    listing and the job's view; `queue` shows CANCELLING and when SIGKILL comes, and so does
    `describe`, at 80 columns."""
    s = started(tmp_path, GRACEFUL)
    try:
        job = warden(s, "submit", "-q", "vision", "-t", "3", "--", sys.executable, "-c", STUBBORN, check=True)
        job_id = job.stdout.split()[-1]
        wait_for(lambda: warden(s, "logs", job_id).stdout == "up\n", what="the job to start")
        wide = warden(s, "queue", "--wide", check=True).stdout
        row = next(line for line in wide.splitlines() if line.startswith(f"{job_id} "))
        assert "node-0" in row or json.loads(warden(s, "nodes", "--json").stdout)[0]["name"] in row, wide
        running = " ".join(warden(s, "describe", job_id, check=True).stdout.split())
        assert "running: since" in running and "its lease end" in running and "η " in running, running
        assert "CANCELLING (cancel requested)" in warden(s, "cancel", job_id, check=True).stdout
        listed = wait_for(
            lambda: (r := json.loads(warden(s, "describe", job_id, "--json").stdout))["kill_at"] and r,
            what="the SIGTERM",
        )
        assert listed["state"] == "RUNNING" and listed["cancel_requested"] is True
        assert listed["shown_state"] == "CANCELLING"
        (in_list,) = [r for r in json.loads(warden(s, "queue", "--json", check=True).stdout) if r["id"] == job_id]
        assert in_list["state"] == "RUNNING" and in_list["shown_state"] == "CANCELLING"
        queue = warden(s, "queue", columns=80, check=True).stdout
        row = next(line for line in queue.splitlines() if line.startswith(f"{job_id} "))
        assert "CANCELLING" in row and re.search(r"SIGKILL in (4m\d+s|5m)", row), queue
        described = warden(s, "describe", job_id, columns=80, check=True).stdout
        assert "CANCELLING (RUNNING)" in described and "until SIGKILL at" in " ".join(described.split())
        assert all(len(line) <= 80 for line in queue.splitlines() + described.splitlines())
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def test_cancel_several_ids_or_a_selection_within_the_callers_rights(server: Server) -> None:
    """`cancel 1 2 3`, and `--user`/`--queue`/`--state` selections as scancel has: a user's
    selection covers their own jobs; every named job is checked before any is cancelled."""
    ana = warden(server, "token", "create", "--user", "ana", "--queues", "vision", check=True).stdout.strip()
    bo = warden(server, "token", "create", "--user", "bo", "--queues", "language", check=True).stdout.strip()

    def submit(token: str, queue: str, gpus: str = "4") -> str:
        out = warden(server, "submit", "-q", queue, "-t", "3", "--gpus", gpus, "--", "sleep", "600", token=token)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[-1]

    def state(job_id: str) -> str:
        return str(json.loads(warden(server, "describe", job_id, "--json").stdout)["state"])

    a1, a2, a3 = submit(ana, "vision"), submit(ana, "vision"), submit(ana, "vision")
    b1 = submit(bo, "language")

    none = warden(server, "cancel", token=ana)
    assert none.returncode == 2 and "--user, --queue or --state" in none.stderr
    other = warden(server, "cancel", "--user", "bo", token=ana)
    assert other.returncode == 2 and "'bo' is not you" in other.stderr
    unknown = warden(server, "cancel", a1, "999", token=ana)
    assert unknown.returncode == 2 and "999" in unknown.stderr and "nothing was cancelled" in unknown.stderr
    foreign = warden(server, "cancel", a1, b1, token=ana)
    assert foreign.returncode == 2 and f"job {b1} is 'bo'" in foreign.stderr
    assert state(a1) != "CANCELLED" and state(b1) != "CANCELLED"  # nothing changed

    # Ana's selection by state: her waiting jobs, none of Bo's.
    pending = warden(server, "cancel", "--state", "pending", token=ana, check=True).stdout
    waiting = [j for j in (a1, a2, a3) if state(j) == "CANCELLED"]
    assert pending.splitlines()[-1] == f"{len(waiting)} job{'s' if len(waiting) != 1 else ''} cancelled" + (
        " (a running one once its processes exit)"
    )
    assert state(b1) != "CANCELLED"
    left = [j for j in (a1, a2, a3) if j not in waiting]
    assert warden(server, "cancel", *left, token=ana, check=True).stdout.splitlines()[-1].startswith(f"{len(left)} job")
    wait_for(lambda: all(state(j) == "CANCELLED" for j in (a1, a2, a3)))

    # An admin's selection by queue takes every user's jobs there; one that matches nothing says so.
    assert "no unfinished job matches" in warden(server, "cancel", "--queue", "vision", check=True).stdout
    out = warden(server, "cancel", "--queue", "language", "--json", check=True).stdout
    assert [o["id"] for o in json.loads(out)] == [b1]
    wait_for(lambda: state(b1) == "CANCELLED")


def test_whoami_names_the_tokens_user_role_and_queues(shared_server: Server) -> None:
    server = shared_server  # a token of its own is all it adds
    assert warden(server, "whoami", check=True).stdout == "admin (admin); queues: every queue\n"
    carol = warden(server, "token", "create", "--user", "carol", "--queues", "language,vision", check=True)
    me = warden(server, "whoami", token=carol.stdout.strip(), check=True).stdout
    assert me == "carol (user); queues: language, vision\n"
    as_json = json.loads(warden(server, "whoami", "--json", token=carol.stdout.strip(), check=True).stdout)
    assert as_json == {"user": "carol", "role": "user", "queues": ["language", "vision"]}
    refused = warden(server, "whoami", token="wrong")
    assert refused.returncode == 2 and "token" in refused.stderr


def test_queues_show_what_each_queue_borrows_and_its_limits(server: Server) -> None:
    """A 4-GPU job of vision (nominal 2) borrows 2 GPUs: `GET /v1/queues` says so
    (`gpus_borrowed`; null for the root, the cluster), and so does `warden queues`, with the
    borrowing and lending limits under --wide."""
    job = warden(server, "submit", "-q", "vision", "-t", "3", "--gpus", "4", "--", "sleep", "600", check=True)
    job_id = job.stdout.split()[-1]
    try:
        with server.client() as c:
            wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] == "RUNNING")
            api = {q["name"]: q for q in c.get("/v1/queues").json()}
        assert (api["vision"]["gpus_in_use"], api["vision"]["gpus_borrowed"]) == (4, 2)
        assert api["language"]["gpus_borrowed"] == 0 and api["cluster"]["gpus_borrowed"] is None
        assert api["vision"]["borrowing_limit"] is None and api["vision"]["lending_limit"] is None
        text = warden(server, "queues", columns=80, check=True).stdout
        assert all(len(line) <= 80 for line in text.splitlines()), text
        header = text.splitlines()[0]
        assert "BORROWED" in header and "LIMIT" not in header
        vision = next(line for line in text.splitlines() if line.startswith("vision "))
        assert vision.split()[2:6] == ["gpu", "2", "4", "2"], vision
        wide = " ".join(warden(server, "queues", "--wide", check=True).stdout.split())
        assert "BORROW LIMIT" in wide and "LEND LIMIT" in wide and "vision cluster 1 gpu 2 any all 4 2" in wide
    finally:
        warden(server, "cancel", job_id)


def test_a_job_without_a_name_is_named_after_its_program_and_describe_quotes_its_command(shared_server: Server) -> None:
    """As Slurm names a job after its script: `/bin/sh -c 'echo hi there'` is `sh`; `describe`
    writes the command as a shell would take it back (shlex.join)."""
    server = shared_server  # two short jobs of its own, found by their ids
    out = warden(server, "submit", "-q", "vision", "-t", "3", "--", "/bin/sh", "-c", "echo 'hi there'", check=True)
    job = out.stdout.split()[-1]
    named = warden(server, "submit", "-q", "vision", "-t", "3", "--name", "mine", "--", "true", check=True)
    rows = {r["id"]: r["name"] for r in json.loads(warden(server, "queue", "--all", "--json", check=True).stdout)}
    assert rows[job] == "sh" and rows[named.stdout.split()[-1]] == "mine"
    text = " ".join(warden(server, "describe", job, check=True).stdout.split())
    assert "command: /bin/sh -c 'echo '\"'\"'hi there'\"'\"''" in text, text


def test_the_command_is_what_follows_the_dashes_and_a_bad_option_submits_nothing(server: Server) -> None:
    out = warden(server, "submit", "-q", "vision", "-t", "3", "--lease", "10m", "--", "echo", "--", "x", check=True)
    job = json.loads(warden(server, "describe", out.stdout.split()[-1], "--json", check=True).stdout)
    assert job["command"] == ["echo", "--", "x"] and job["lease_s"] == 600
    for args in (["--lease", "10", "minutes", "--", "true"], ["--lease", "10", "--", "true"], ["true"]):
        refused = warden(server, "submit", "-q", "vision", "-t", "3", *args)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert len(json.loads(warden(server, "queue", "--all", "--json", check=True).stdout)) == 1


def test_without_a_token_the_cli_says_where_it_looked_and_how_to_point_it(tmp_path: Path) -> None:
    """A server started with --state-dir (and no bootstrap token) writes its admin token there;
    the CLI, looking in another state directory, finds none: it names the file it tried and
    WARDEN_STATE_DIR and WARDEN_TOKEN. Pointed at the server's state directory, it works."""
    server = started(tmp_path, POLICY, bootstrap=False)
    try:
        _without_a_token(server, tmp_path)
    finally:
        server.stop()


def _without_a_token(server: Server, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.update({"WARDEN_URL": server.url, "WARDEN_CA": str(server.ca), "COLUMNS": "80"})

    def cli_as(state_dir: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "warden.cli.main", "queue"],
            capture_output=True,
            text=True,
            env={**env, "WARDEN_STATE_DIR": str(state_dir)},
            timeout=60,
        )

    refused = cli_as(elsewhere)
    assert refused.returncode == 2, refused.stderr
    text = " ".join(refused.stderr.split())
    assert "a bearer token is required" in text and f"{elsewhere}/admin-token" in text, text
    assert "--state-dir DIR" in text and "WARDEN_STATE_DIR=DIR" in text and "WARDEN_TOKEN" in text, text
    (elsewhere).mkdir()
    (elsewhere / "admin-token").write_text("not-the-servers\n")
    wrong = " ".join(cli_as(elsewhere).stderr.split())  # not that server's directory: its token stays here
    assert "a bearer token is required" in wrong, wrong
    assert f"the admin token of {elsewhere} is sent only to the server holding that state directory" in wrong, wrong
    assert cli_as(server.state_dir).returncode == 0  # the server's own state directory: its admin token


def test_a_second_server_on_a_busy_port_says_so_before_it_serves(shared_server: Server, tmp_path: Path) -> None:
    """Another server (another state directory) on the port of a running one exits non-zero at
    once, naming the port, without having said it serves or made a state directory of its own."""
    server = shared_server
    other = tmp_path / "other"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    argv = [sys.executable, "-m", "warden.cli.main", "server", "--port", str(server.port), "--fake-gpus", "1"]
    done = subprocess.run([*argv, "--state-dir", str(other)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"--port {server.port}: 127.0.0.1:{server.port} is in use" in done.stderr, done.stderr
    assert "serving" not in done.stdout + done.stderr and not other.exists()  # no state directory left behind
    assert warden(server, "queue", check=True).returncode == 0  # the first one serves on
