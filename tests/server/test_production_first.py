"""Production first, on a real server with real job processes (DESIGN §4.3, §4.4, invariant 11).

A tier-1 job is bound by its victims' leases and grace alone: the thrash guard (efficiency
floor, preemption budget) never holds it back, while it still holds tiers 2–4. The efficiency
floor counts one save, so a victim that reports a checkpoint every second cannot push its own
floor ahead of time. What a dry run says the job will preempt is what it preempts, and no more
than it needs.

The victims exit at once on SIGTERM (`sleep`, or a loop that exits on it), so "within their
grace" is a pass or two.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import Server, kill_leftovers, server_fixture, submit, until_state, wait_for

REPO = Path(__file__).resolve().parents[2]
SLEEP = ["sleep", "600"]

# The server's default policy: restart overhead 60 s and checkpoint overhead 30 s assumed for a
# job that reports nothing, min_efficiency 0.9: the floor holds such a victim for
# (60 + 30) / (1 − 0.9) = 900 s after its start.
DEFAULT_FLOOR_S = (60.0 + 30.0) / (1 - 0.9)


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[Server]:
    """A server with no policy file (the default policy: one queue, `default`) on 4 fake GPUs."""
    s = Server(tmp_path / "state", gpus=4).start()
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def _passes(c: httpx.Client) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("warden_scheduling_pass_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no pass count in /metrics")


def more_passes(c: httpx.Client, n: int) -> None:
    """Return once the server has made `n` more scheduling passes."""
    seen = _passes(c)
    wait_for(lambda: _passes(c) >= seen + n, 15, f"{n} more passes", interval=0.1)


def preemptions_for(c: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return [p for p in c.get("/v1/preemptions").json() if p["preemptor"] == job_id]


def job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def full_of_quiet_jobs(c: httpx.Client) -> tuple[list[str], list[str]]:
    """4 one-GPU jobs that report nothing on the default queue: two of tier 4 (no lease), then
    two of tier 3 with a 1 s lease, waited out. Their ids: (tier 4, tier 3)."""
    t4 = [submit(c, queue="default", tier=4, gpus=1, command=SLEEP, name=f"t4-{i}") for i in range(2)]
    t3 = [submit(c, queue="default", tier=3, gpus=1, lease="1s", command=SLEEP, name=f"t3-{i}") for i in range(2)]
    starts = [until_state(c, j, "RUNNING")["attempts"][0]["started_at"] for j in t4 + t3]
    wait_for(lambda: time.time() > max(starts) + 1.5, 5, "the tier-3 leases to pass")
    return t4, t3


def test_a_tier1_job_takes_lease_expired_victims_at_once_whatever_the_efficiency_floor(
    default_server: Server,
) -> None:
    """Under the default thrash guard every victim is held 900 s by the efficiency floor
    against tiers 2–4; a tier-1 job for 2 GPUs preempts two one-GPU jobs at once, starts as
    soon as they exited, and leaves the other two running."""
    with default_server.client() as c:
        t4, t3 = full_of_quiet_jobs(c)
        prod = submit(c, queue="default", tier=1, gpus=2, command=SLEEP, name="prod")
        submitted = job(c, prod)["submit_at"]
        running = until_state(c, prod, "RUNNING", timeout=10)

        # Each victim would lose its assumed startup and nothing more (none has run 60 s): the
        # costs tie, and the lower tier goes first.
        taken = preemptions_for(c, prod)
        assert sorted(p["victim"] for p in taken) == sorted(t4), (t4, t3, taken)
        assert all(p["at"] <= submitted + 3.0 for p in taken), (submitted, taken)
        assert running["attempts"][-1]["started_at"] <= max(p["ended_at"] for p in taken) + 3.0
        # Every preemption was for the tier-1 job: nothing else was taken, and nothing is now.
        more_passes(c, 3)
        assert [p["preemptor"] for p in c.get("/v1/preemptions").json()] == [prod, prod]
        others = set(t4 + t3) - {p["victim"] for p in taken}
        for other in others:
            j = job(c, other)
            assert (j["state"], j["attempt"]) == ("RUNNING", 1), j
        assert job(c, prod)["state"] == "RUNNING"


@pytest.mark.parametrize("tier", [2, 3])
def test_a_tier2_or_tier3_job_still_waits_for_the_efficiency_floor(default_server: Server, tier: int) -> None:
    """The same cluster and a job of tier 2 (which may take tiers 3 and 4) or tier 3 (tier 4
    only): the thrash guard still holds the victims, for the floor's 900 s after their start,
    and the job says so; nobody is preempted."""
    with default_server.client() as c:
        t4, t3 = full_of_quiet_jobs(c)
        waiting = submit(c, queue="default", tier=tier, gpus=2, command=SLEEP, name=f"t{tier}")
        reason = wait_for(
            lambda: (r := job(c, waiting)["reason"]) and r["code"] == "WaitingForLease" and r,
            10,
            "a WaitingForLease reason",
        )
        details = reason["details"]
        assert details["rule"] == "efficiency", reason
        assert len(details["victims"]) == 2 and set(details["victims"]) <= set(t4 if tier == 3 else t4 + t3), reason
        starts = {j: job(c, j)["attempts"][0]["started_at"] for j in details["victims"]}
        assert details["earliest_at"] == pytest.approx(max(starts.values()) + DEFAULT_FLOOR_S, abs=0.01), reason
        more_passes(c, 3)
        assert c.get("/v1/preemptions").json() == []
        assert job(c, waiting)["state"] == "PENDING"
        assert all(job(c, j)["state"] == "RUNNING" for j in t4 + t3)


# -- the dry run names what the plan takes -------------------------------------------------------

TWO_QUEUES = """\
queues:
  name: cluster
  children:
    - {name: serving, nominal: {gpu: 5}}
    - {name: research, nominal: {gpu: 3}}
"""


two_queue_server = server_fixture(TWO_QUEUES, gpus=8)
"""The default tiers and thrash guard, 8 fake GPUs, two queues whose nominals cover them."""


def test_a_tier1_dry_run_names_the_victims_it_then_preempts_and_no_more(two_queue_server: Server) -> None:
    """`serving` (nominal 5) runs one 4-GPU tier-3 job past its 1 s lease; `research` (nominal
    3) runs three 1-GPU tier-3 jobs inside their 45 min lease and one 1-GPU tier-4 job. A tier-1
    job for 5 GPUs in `serving` must take the 4-GPU job (it is in-quota only without it) and one
    GPU more, which only the tier-4 job may give: the one minimal set. The dry run says it
    preempts those two now; submitted at once, the job preempts exactly them and starts."""
    with two_queue_server.client() as c:
        big = submit(c, queue="serving", tier=3, gpus=4, lease="1s", command=SLEEP, name="big")
        leased = [submit(c, queue="research", tier=3, gpus=1, command=SLEEP, name=f"leased-{i}") for i in range(3)]
        spare = submit(c, queue="research", tier=4, gpus=1, command=SLEEP, name="spare")
        starts = [until_state(c, j, "RUNNING")["attempts"][0]["started_at"] for j in [big, *leased, spare]]
        wait_for(lambda: time.time() > max(starts) + 1.5, 5, "the big job's lease to pass")

        body = {"queue": "serving", "tier": 1, "gpus": 5, "command": SLEEP, "workdir": str(REPO), "name": "prod"}
        r = c.post("/v1/jobs", params={"dry_run": "true"}, json=body)
        assert r.status_code == 200, r.text
        dry = r.json()
        named = {v["id"]: v for v in dry["victims"]}
        assert dry["decision"] == "preempt", dry
        assert set(named) == {big, spare}, dry
        assert sum(v["gpus"] for v in named.values()) == 5, dry  # exactly what it needs: minimal

        prod = submit(c, **body)
        assert prod == dry["id"]
        until_state(c, prod, "RUNNING", timeout=10)
        assert {p["victim"] for p in preemptions_for(c, prod)} == set(named)
        more_passes(c, 3)
        assert {p["victim"] for p in c.get("/v1/preemptions").json()} == set(named)
        assert all(job(c, j)["state"] == "RUNNING" for j in leased)


def test_a_tier1_job_waiting_for_a_lease_names_the_victims_it_takes_and_takes_each_when_it_said(
    two_queue_server: Server,
) -> None:
    """The cluster above, the 4-GPU job inside a 6 s lease. The dry run names the same two
    victims, each with its SIGTERM time: the tier-4 job now (its 120 s grace ends after the
    lease), the 4-GPU job when its lease ends. Submitted, the job says it waits for that lease,
    for those victims, and takes each at the time the dry run named, nothing else."""
    with two_queue_server.client() as c:
        big = submit(c, queue="serving", tier=3, gpus=4, lease="6s", command=SLEEP, name="big")
        leased = [submit(c, queue="research", tier=3, gpus=1, command=SLEEP, name=f"leased-{i}") for i in range(3)]
        spare = submit(c, queue="research", tier=4, gpus=1, command=SLEEP, name="spare")
        for j in [big, *leased, spare]:
            until_state(c, j, "RUNNING")
        lease_end = job(c, big)["attempts"][0]["started_at"] + 6.0

        body = {"queue": "serving", "tier": 1, "gpus": 5, "command": SLEEP, "workdir": str(REPO), "name": "prod"}
        dry = c.post("/v1/jobs", params={"dry_run": "true"}, json=body).json()
        signal_at = {v["id"]: v["signal_at"] for v in dry["victims"]}
        assert set(signal_at) == {big, spare}, dry
        assert signal_at[big] == pytest.approx(lease_end, abs=0.01), dry
        assert signal_at[spare] < lease_end - 1.0, dry  # at once: lease end − its grace is past
        assert dry["reason"]["code"] == "WaitingForLease" and dry["reason"]["details"]["rule"] == "lease", dry
        assert set(dry["reason"]["details"]["victims"]) == {big, spare}, dry

        prod = submit(c, **body)
        assert prod == dry["id"]
        reason = wait_for(lambda: (r := job(c, prod)["reason"]) and r["code"] == "WaitingForLease" and r, 10)
        assert reason["details"]["rule"] == "lease" and reason["details"]["victim"] == big, reason
        assert reason["details"]["earliest_at"] == pytest.approx(lease_end, abs=0.01), reason
        assert set(reason["details"]["victims"]) <= {big, spare} and big in reason["details"]["victims"], reason

        until_state(c, prod, "RUNNING", timeout=lease_end - time.time() + 10)
        at = {p["victim"]: p["at"] for p in preemptions_for(c, prod)}
        assert set(at) == set(signal_at), at
        for victim, when in signal_at.items():
            assert when - 0.01 <= at[victim] <= when + 2.5, (victim, when, at)
        assert {p["victim"] for p in c.get("/v1/preemptions").json()} == set(signal_at)
        assert all(job(c, j)["state"] == "RUNNING" for j in leased)


# -- a victim that reports a save every second ---------------------------------------------------

SAVE_S = 0.5
MIN_EFFICIENCY = 0.95
EAGER = f"""\
import signal, sys, time
sys.path.insert(0, {str(REPO)!r})
from warden.workload.report import Reporter
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
reporter = Reporter.from_env()
reporter.startup_finished()
while True:
    time.sleep(0.5)
    time.sleep({SAVE_S})  # a save
    reporter.checkpoint_finished({SAVE_S}, 1024, on_sigterm=False)
"""
EAGER_POLICY = f"thrash: {{min_efficiency: {MIN_EFFICIENCY}}}\n"


eager_server = server_fixture(EAGER_POLICY, gpus=4)
"""The default policy but for min_efficiency 0.95, on 4 fake GPUs."""


def eager_victim(c: httpx.Client) -> str:
    """A tier-4 job on all 4 GPUs that reported its startup and at least two saves."""
    victim = submit(c, queue="default", tier=4, gpus=4, command=[sys.executable, "-c", EAGER], name="eager")
    until_state(c, victim, "RUNNING")
    wait_for(lambda: (job(c, victim)["attempts"][0]["checkpoints"] or 0) >= 2, 10, "the victim's first saves")
    assert job(c, victim)["attempts"][0]["startup_s"] is not None
    return victim


def floor_of(attempt: dict[str, Any]) -> float:
    """When the efficiency floor lets the attempt go: its start + (startup + one save) ÷ (1 − η)."""
    return float(attempt["started_at"] + (attempt["startup_s"] + attempt["sigterm_save_s"]) / (1 - MIN_EFFICIENCY))


def test_a_tier1_job_preempts_a_victim_that_reports_saves_every_second_at_once(eager_server: Server) -> None:
    with eager_server.client() as c:
        victim = eager_victim(c)
        prod = submit(c, queue="default", tier=1, gpus=2, command=SLEEP, name="prod")
        submitted = job(c, prod)["submit_at"]
        until_state(c, prod, "RUNNING", timeout=10)
        [taken] = preemptions_for(c, prod)
        assert taken["victim"] == victim and taken["at"] <= submitted + 2.5, (submitted, taken)


def test_a_tier3_job_preempts_a_victim_that_reports_saves_every_second_once_one_save_is_paid_for(
    eager_server: Server,
) -> None:
    """The floor counts the victim's startup and one save, the last it measured: about
    20 × (startup + 0.5 s) ≈ 10–15 s after its start, however many saves it reports meanwhile
    (a sum of them would push the floor 10 s further each second, for ever). The tier-3 job
    waits for it, saying when, and preempts the victim then."""
    with eager_server.client() as c:
        victim = eager_victim(c)
        waiting = submit(c, queue="default", tier=3, gpus=2, command=SLEEP, name="t3")
        reason = wait_for(
            lambda: (r := job(c, waiting)["reason"]) and r["code"] == "WaitingForLease" and r,
            10,
            "a WaitingForLease reason",
        )
        assert reason["details"]["rule"] == "efficiency" and reason["details"]["victims"] == [victim], reason
        attempt = job(c, victim)["attempts"][0]
        floor = floor_of(attempt)
        assert floor < attempt["started_at"] + 30.0, attempt  # the premise: a short floor (here ~14 s)
        assert reason["details"]["earliest_at"] == pytest.approx(floor, abs=0.01), (reason, attempt)
        # Two more saves reported: the floor has not moved.
        saves = attempt["checkpoints"]
        wait_for(lambda: job(c, victim)["attempts"][0]["checkpoints"] >= saves + 2, 10, "two more saves")
        later = job(c, waiting)["reason"]
        assert later is not None and later["details"]["earliest_at"] == pytest.approx(floor, abs=0.01), later

        [taken] = wait_for(lambda: preemptions_for(c, waiting), max(floor - time.time(), 0) + 5, "the preemption")
        assert taken["victim"] == victim
        final = job(c, victim)["attempts"][0]
        assert floor_of(final) == pytest.approx(floor, abs=0.01)
        assert floor - 0.01 <= taken["at"] <= floor + 2.5, (floor, taken)
        until_state(c, waiting, "RUNNING", timeout=10)
