"""Fair use of the server: a user's submissions are limited to a rate with a burst, and the
jobs waiting per user and per queue to a count (the policy's `limits:`). A refusal is a 429
that names the limit, and stores nothing. A real server process."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, cli, server_fixture, submit, until_state

from warden.engine.policy import PolicyError, parse_policy
from warden.server.submission_rate_limits import SubmissionRate

# Every job waits for an admin's approval, so each one counts as waiting; the rate refills one
# token in 1000 s, so none comes back during a test.
POLICY = """\
tiers:
  3: {requires_approval: true}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
limits:
  submissions_per_second_per_user: 0.001
  submission_burst_per_user: 5
  max_pending_per_user: 8
  max_pending_per_queue: 12
"""
JOB: dict[str, Any] = {"queue": "vision", "tier": 3, "gpus": 1, "command": [sys.executable, "-c", "pass"]}


server = server_fixture(POLICY)


def client(server: Server, admin: httpx.Client, user: str) -> httpx.Client:
    r = admin.post("/v1/tokens", json={"user": user, "role": "user"})
    assert r.status_code in (200, 201), r.text
    return server.client(r.json()["token"])


def job_count(admin: httpx.Client) -> int:
    return len(admin.get("/v1/jobs", params={"limit": 1000}).json())


def test_a_flood_from_one_user_is_refused_after_its_burst_and_others_still_submit(server: Server) -> None:
    with server.client() as admin, client(server, admin, "flooder") as flooder, client(server, admin, "other") as other:
        answers = [flooder.post("/v1/jobs", json=dict(JOB, workdir=str(Path.cwd()))) for _ in range(20)]
        assert [r.status_code for r in answers] == [201] * 5 + [429] * 15
        refusal = answers[5]
        error = refusal.json()["error"]
        assert error["field"] == "user" and error["value"] == "flooder"
        assert "limit of 0.001 jobs per second after a burst of 5" in error["message"]
        assert "limits.submissions_per_second_per_user" in error["message"]
        assert int(refusal.headers["Retry-After"]) >= 1
        assert job_count(admin) == 5  # the refused ones stored nothing

        submit(other, **JOB)  # another user has a bucket of its own
        assert job_count(admin) == 6
        submit(admin, **JOB)  # admins are not rate-limited


def test_a_replayed_submission_takes_no_second_token(server: Server) -> None:
    with server.client() as admin, client(server, admin, "retrier") as c:
        body = dict(JOB, workdir=str(Path.cwd()))
        first = c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "once"})
        assert first.status_code == 201, first.text
        for _ in range(10):
            replay = c.post("/v1/jobs", json=body, headers={"Idempotency-Key": "once"})
            assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
        for _ in range(4):
            submit(c, **JOB)
        assert c.post("/v1/jobs", json=body).status_code == 429


def test_dry_runs_draw_on_the_submission_rate_and_a_flood_of_them_is_refused(server: Server) -> None:
    """A dry run plans as a pass does: a user's dry runs take tokens of the same bucket as their
    submissions, a refused one (422) none, and past the burst both answer 429 with Retry-After,
    through the API and through `warden submit --dry-run`. An admin's are not limited."""
    with server.client() as admin, client(server, admin, "planner") as planner:
        body = dict(JOB, workdir=str(Path.cwd()))
        bad = planner.post("/v1/jobs", params={"dry_run": "true"}, json=dict(body, queue="nowhere"))
        assert bad.status_code == 422, bad.text
        answers = [planner.post("/v1/jobs", params={"dry_run": "true"}, json=body) for _ in range(8)]
        assert [r.status_code for r in answers] == [200] * 5 + [429] * 3, [r.text for r in answers]
        refusal = answers[5]
        error = refusal.json()["error"]
        assert (error["field"], error["value"]) == ("user", "planner")
        assert "dry-runs and submits faster than the limit of 0.001 jobs per second" in error["message"]
        assert "dry runs counted" in error["message"]
        assert "limits.submissions_per_second_per_user" in error["message"]
        assert int(refusal.headers["Retry-After"]) >= 1
        assert planner.post("/v1/jobs", json=body).status_code == 429  # one bucket for both
        assert job_count(admin) == 0

        token = admin.post("/v1/tokens", json={"user": "planner", "role": "user"}).json()["token"]
        done = cli(
            server.url,
            "submit",
            "-q",
            "vision",
            "-t",
            "3",
            "--dry-run",
            "--",
            sys.executable,
            "-c",
            "pass",
            token=token,
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert "dry-runs and submits faster than the limit" in " ".join(done.stderr.split()), done.stderr

        for _ in range(8):  # an admin's dry runs are not limited
            assert admin.post("/v1/jobs", params={"dry_run": "true"}, json=body).status_code == 200


def test_waiting_jobs_are_limited_per_user_and_per_queue(server: Server) -> None:
    with server.client() as admin, client(server, admin, "alice") as alice, client(server, admin, "bob") as bob:
        source = POLICY.replace("submission_burst_per_user: 5", "submission_burst_per_user: 100")
        source = source.replace("max_pending_per_user: 8", "max_pending_per_user: 3")
        source = source.replace("max_pending_per_queue: 12", "max_pending_per_queue: 5")
        r = admin.put("/v1/policy", json={"source": source})
        assert r.status_code in (200, 201), r.text
        body = dict(JOB, workdir=str(Path.cwd()))

        ids = [submit(alice, **JOB) for _ in range(3)]
        r = alice.post("/v1/jobs", json=body)
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert (error["field"], error["value"]) == ("user", "alice")
        assert "has 3 jobs waiting, the limit of 3" in error["message"]
        assert "limits.max_pending_per_user" in error["message"]

        for _ in range(2):
            submit(bob, **JOB)
        r = bob.post("/v1/jobs", json=body)  # vision holds 5 waiting jobs: its limit
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert (error["field"], error["value"]) == ("queue", "vision")
        assert "has 5 jobs waiting, the limit of 5" in error["message"]
        assert "limits.max_pending_per_queue" in error["message"]
        assert job_count(admin) == 5  # the refused ones stored nothing
        submit(bob, **dict(JOB, queue="language"))  # another queue has room

        # A job that stops waiting frees its place.
        assert alice.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 202
        until_state(alice, ids[0], "CANCELLED")
        submit(alice, **dict(JOB, queue="language"))
        assert job_count(admin) == 6  # the list shows unfinished jobs


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_pending_per_user", -1),
        ("max_pending_per_user", 0),
        ("max_pending_per_queue", -5),
        ("submissions_per_second_per_user", -1),
        ("submissions_per_second_per_user", 0),
        ("submission_burst_per_user", -1),
        ("submission_burst_per_user", 1.5),
    ],
)
def test_a_fair_use_limit_out_of_range_is_refused_naming_it(field: str, value: float) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({"limits": {field: value}})
    assert [i.path for i in info.value.issues] == [f"limits.{field}"]


def test_a_bucket_refills_at_its_rate_and_never_gives_more_than_its_burst_across_threads() -> None:
    now = [0.0]
    rate = SubmissionRate(clock=lambda: now[0])
    taken: list[bool] = []

    def take() -> None:
        for _ in range(50):
            taken.append(rate.take("u", 2.0, 10) is None)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert taken.count(True) == 10
    assert rate.take("u", 2.0, 10) == pytest.approx(0.5)  # one token in half a second
    now[0] = 1.0
    assert [rate.take("u", 2.0, 10) is None for _ in range(3)] == [True, True, False]
    rate.give_back("u", 10)
    assert rate.take("u", 2.0, 10) is None
    now[0] = 1e6
    assert sum(rate.take("u", 2.0, 10) is None for _ in range(20)) == 10  # never more than the burst
