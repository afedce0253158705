"""The dashboard (`/ui/`) in headless Chromium against a real server with fake GPUs and real
jobs: sign-in, the node grid, a pending job's reason as the cluster changes, a preemption on
the timeline, approval for admins only, and what a user's token cannot see. Every page is
screenshotted into $WARDEN_UI_ARTIFACTS (else a temporary directory); no page may log an error
to the browser's console but the answers it asks for on purpose."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import ADMIN, Server, kill_leftovers, started, submit, until_state, wait_for
from uipage import Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

# Short leases and graces, no efficiency floor: jobs run, wait and are preempted in seconds.
POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s, requires_approval: true}
  3: {name: experimentation, lease: 1s, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 2}}
    - {name: language, nominal: {gpu: 2}}
"""

SLEEPER = [sys.executable, "-c", "import time; print('hello from warden', flush=True); time.sleep(600)"]
# Saves nothing, but leaves at once and cleanly on SIGTERM (a preempted job is then requeued).
POLITE = [
    sys.executable,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(600)",
]
# Ignores SIGTERM: it stays in its grace until SIGKILL.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
]


def serve(tmp_path: Path, tls_args: tuple[str, ...], gpus: int = 4) -> Iterator[Server]:
    # Each of the two queues is promised half of the GPUs.
    # A sample of history every second, so that the charts have a line to draw.
    policy = POLICY.replace("{gpu: 2}", f"{{gpu: {gpus // 2}}}")
    s = started(tmp_path, policy, gpus=gpus, args=("--history-interval", "1", *tls_args))
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp_path)


@pytest.fixture
def server(tmp_path: Path, tls_args: tuple[str, ...]) -> Iterator[Server]:
    yield from serve(tmp_path, tls_args)


@pytest.fixture
def big_server(tmp_path: Path, tls_args: tuple[str, ...]) -> Iterator[Server]:
    yield from serve(tmp_path, tls_args, gpus=8)


@pytest.fixture
def page(driver: Any, artifacts: Path) -> Iterator[Page]:
    p = Page(driver, "", artifacts)
    yield p
    driver.get("about:blank")  # no page of this test's server polls on after it stops
    p.console()  # what this test left in the log is not the next one's


def at(page: Page, server: Server) -> Page:
    page.url = server.url
    page.console()
    return page


def cells_of(c: httpx.Client, job: str) -> list[tuple[str, int]]:
    placement = c.get(f"/v1/jobs/{job}").json()["attempts"][-1]["placement"]
    return [(p["node"], g) for p in placement for g in p["gpus"]]


def token_for(c: httpx.Client, user: str, queues: list[str]) -> str:
    r = c.post("/v1/tokens", json={"user": user, "role": "user", "queues": queues})
    assert r.status_code == 201, r.text
    return r.json()["token"]


# ------------------------------------------------------------------------------ the node grid


def test_sign_in_and_the_node_grid_shows_each_job_on_its_gpus(big_server: Server, page: Page) -> None:
    page = at(page, big_server)
    with big_server.client() as c:
        jobs = {
            "t1": submit(c, queue="language", tier=1, gpus=1, name="serving", command=SLEEPER),
            "t2": submit(c, queue="vision", tier=2, gpus=1, name="pretrain", command=SLEEPER),
            "t3": submit(c, queue="vision", tier=3, gpus=2, name="finetune", command=SLEEPER),
            "leaving": submit(c, queue="language", tier=3, gpus=2, grace="90s", name="sweep", command=STUBBORN),
            "t4": submit(c, queue="language", tier=4, gpus=1, name="scavenger", command=SLEEPER),
        }
        for job in jobs.values():
            until_state(c, job, "RUNNING")
        # And two that wait: one above its queue's quota, one for GPUs.
        waiting = [
            submit(c, queue="vision", tier=3, gpus=4, name="sweep-large", command=SLEEPER),
            submit(c, queue="language", tier=4, gpus=2, name="backfill", command=SLEEPER),
        ]

        page.open()
        page.until(lambda d: d.find_element("id", "signin-token").is_displayed(), "the sign-in form")
        assert page.driver.current_url.endswith("#/signin")
        page.shot("signin")
        page.sign_in(ADMIN)
        assert ADMIN not in page.driver.current_url
        assert page.driver.execute_script("return sessionStorage.getItem('warden.token')") == ADMIN
        assert page.driver.execute_script("return localStorage.length") == 0

        for name, job in jobs.items():
            tier = c.get(f"/v1/jobs/{job}").json()["tier"]
            for node, gpu in cells_of(c, job):
                cell = f'li.gpu[data-node="{node}"][data-gpu="{gpu}"]'
                page.until(
                    lambda d, cell=cell, job=job: page.css(cell).get_attribute("data-job") == job, f"{name} on {cell}"
                )
                assert f"tier-{tier}" in page.css(cell).get_attribute("class").split()
                assert f"#{job}" in page.css(cell).text
        assert len(page.all("li.gpu.free")) == 1 and not page.all("li.gpu.down")

        # A job in its grace: its GPUs are marked, with the SIGKILL deadline counting down.
        assert c.post(f"/v1/jobs/{jobs['leaving']}/cancel").status_code == 202
        leaving = f'li.gpu.terminating[data-job="{jobs["leaving"]}"]'
        page.until(lambda d: len(page.all(leaving)) == 2, "the cancelled job's GPUs in their grace")
        first = page.css(f"{leaving} .countdown").text
        assert re.fullmatch(r"SIGKILL in 1:[0-2]\d", first), first
        assert page.css(f"{leaving} a").get_attribute("title").endswith("), CANCELLING")
        page.until(lambda d: page.css(f"{leaving} .countdown").text != first, "the countdown to move")
        page.shot("cluster")
        page.driver.set_window_size(390, 844)  # a phone
        page.shot("cluster-phone")
        page.driver.set_window_size(1366, 900)
        page.go("#/jobs")
        for job in waiting:
            page.until(
                lambda d, job=job: page.all(f'#pending tr[data-job="{job}"] .reason-code'), f"job {job}'s reason"
            )
        page.until(lambda d: len(page.all("#running tbody tr")) == len(jobs), "the running jobs")
        # The cancelled job reads as the API's `shown_state`, the CLI's word: its `state` is RUNNING.
        badge = page.css(f'#running tr[data-job="{jobs["leaving"]}"] .state')
        assert badge.text == "cancelling" and "state-cancelling" in badge.get_attribute("class").split()
        assert page.css(f'#running tr[data-job="{jobs["t1"]}"] .state').text == "running"
        page.shot("jobs-busy")
        assert page.console_errors() == []

        # A token the server refuses (revoked, say) sends the page back to the sign-in form.
        page.driver.execute_script("sessionStorage.setItem('warden.token', 'not-a-token')")
        page.until(lambda d: d.current_url.endswith("#/signin"), "the sign-in page after a 401", timeout=15)
        page.until(lambda d: "refused" in page.css("#signin-message").text, "the refusal said")
        assert page.driver.execute_script("return sessionStorage.getItem('warden.token')") is None
        assert page.console_errors(r" 401 ") == []


# ------------------------------------------------------------------------------ jobs and reasons


def test_a_pending_jobs_reason_follows_the_cluster(server: Server, page: Page) -> None:
    page = at(page, server)
    with server.client() as c:
        # The name is markup: the page must show it as text and run nothing.
        filler = submit(c, queue="vision", tier=3, gpus=4, name='<img src=x onerror="window.__xss=1">', command=POLITE)
        until_state(c, filler, "RUNNING")
        # Same queue and tier: it may not preempt the filler; it waits for GPUs.
        waiting = submit(c, queue="vision", tier=3, gpus=2, name="waits", command=SLEEPER)
        reason = wait_for(lambda: c.get(f"/v1/jobs/{waiting}").json()["reason"], what="the waiting job's reason")

        page.sign_in(ADMIN, "jobs")
        row = f'#pending tr[data-job="{waiting}"]'
        page.until(
            lambda d: "needs 2" in page.css(f"{row} .reason-message").text, "the reason in the waiting job's row"
        )
        assert page.css(f"{row} .reason").get_attribute("data-code") == reason["code"]
        # The page shows the sentence the API rendered, next step included.
        page.until(
            lambda d: (
                page.css(f"{row} .reason-message").text == c.get(f"/v1/jobs/{waiting}").json()["reason"]["message"]
            ),
            "the API's rendered sentence in the row",
        )
        assert page.css(f'#running tr[data-job="{filler}"]')
        assert '<img src=x onerror="window.__xss=1">' in page.css(f'#running tr[data-job="{filler}"]').text
        assert page.driver.execute_script("return window.__xss") is None and not page.all("#view img")
        page.shot("jobs")

        # Cancel the filler from its page, as its owner (an admin) would.
        page.go(f"#/jobs/{filler}")
        page.until(lambda d: page.css("#cancel").is_displayed(), "the cancel button")
        page.css("#cancel").click()
        page.until(lambda d: page.css("#cancel-confirm").is_displayed(), "the confirmation")
        page.css("#cancel-confirm").click()
        until_state(c, filler, "CANCELLED")
        until_state(c, waiting, "RUNNING", timeout=30)

        page.go("#/jobs")
        page.until(lambda d: page.all(f'#running tr[data-job="{waiting}"]'), "the job among the running ones")
        assert not page.all(row)

        page.go(f"#/jobs/{waiting}")
        page.until(lambda d: "hello from warden" in page.css("#log-text").text, "the job's log")
        page.until(lambda d: page.all('tr[data-attempt="1"]'), "its attempt")
        assert page.console_errors() == []
        page.shot("job")


# ------------------------------------------------------------------------------ preemptions, queues


def test_a_preemption_appears_on_the_timeline(server: Server, page: Page) -> None:
    page = at(page, server)
    with server.client() as c:
        low = submit(c, queue="vision", tier=3, gpus=4, name="experiment", command=POLITE)
        until_state(c, low, "RUNNING")
        high = submit(c, queue="language", tier=1, gpus=2, name="inference", command=SLEEPER)
        until_state(c, high, "RUNNING", timeout=30)
        wait_for(lambda: c.get(f"/v1/jobs/{low}").json()["attempts"][0]["reason"] == "preempted", what="the preemption")

        page.sign_in(ADMIN, "queues")
        for queue in ("vision", "language"):
            page.until(lambda d, q=queue: page.all(f'tr[data-queue="{q}"]'), f"queue {queue}")
        page.until(lambda d: page.all("figure.chart-card svg.chart"), "the history charts")
        page.until(
            lambda d: any("L" in (p.get_attribute("d") or "") for p in page.all("figure.chart-card path.series")),
            "a chart drawn through several samples",
            timeout=20,
        )
        page.until(lambda d: "Least-served queue" in page.css("p.callout").text, "the least-served queue")
        # The charts open on what the history holds, not on a fixed day of empty space.
        assert page.css('button[data-window="all"]').get_attribute("aria-pressed") == "true"
        first = c.get("/v1/history", params={"since": time.time() - 3600}).json()["samples"][0]["at"]
        spans = page.until(
            lambda d: [
                (float(e.get_attribute("data-t0")), float(e.get_attribute("data-t1"))) for e in page.all("svg.chart")
            ],
            "the charts' spans",
        )
        assert all(t0 == first and t1 - t0 < 600 for t0, t1 in spans), (first, spans)
        page.shot("queues")

        page.go("#/preemptions")
        item = f'a.tl-item[data-victim="{low}"][data-preemptor="{high}"]'
        page.until(lambda d: page.all(item), "the preemption on the timeline")
        assert page.all(f'tr[data-victim="{low}"][data-preemptor="{high}"]')
        assert "experiment" not in page.css("#timeline").text  # lanes are queues, not names
        assert page.console_errors() == []
        page.shot("preemptions")
        page.go(f"#/jobs/{high}")  # the preemptor's page lists the job it preempted
        page.until(lambda d: page.all(f'#caused tr[data-victim="{low}"]'), "the preemption it caused")
        assert page.console_errors() == []

        # Preempted once more, then a budget of one per 24 h: the victim's page lists both
        # preemptions and flags the cycle.
        assert c.post(f"/v1/jobs/{high}/cancel").status_code == 202
        until_state(c, low, "RUNNING", timeout=30)
        again = submit(c, queue="language", tier=1, gpus=2, name="inference", command=SLEEPER)
        until_state(c, again, "RUNNING", timeout=30)
        stricter = POLICY.replace("{min_efficiency: 0}", "{min_efficiency: 0, max_preemptions: {per: 24h, count: 1}}")
        assert c.put("/v1/policy", json={"source": stricter}).status_code == 200
        page.go(f"#/jobs/{low}")
        for n, by in ((1, high), (2, again)):
            page.until(
                lambda d, n=n, by=by: page.all(f'#preempted tr[data-attempt="{n}"][data-by="{by}"]'), f"preemption {n}"
            )
        page.until(lambda d: page.all('p.cycle-warning[data-cycle="over_budget"]'), "the preemption cycle")
        assert "Preempted 2 times within" in page.css("p.cycle-warning").text
        assert page.console_errors() == []
        page.shot("job-preemptions")


# ------------------------------------------------------------------------------ governance


def test_approval_is_for_admins_and_a_user_sees_only_what_the_api_shows(server: Server, page: Page) -> None:
    page = at(page, server)
    with server.client() as admin:
        alice = token_for(admin, "alice", ["vision"])
        with server.client(alice) as c:
            job = submit(c, queue="vision", tier=2, gpus=1, name="big-run", command=SLEEPER)
        assert until_state(admin, job, "AWAITING_APPROVAL")

        page.sign_in(alice, "jobs")
        page.until(lambda d: page.css("#who [data-role]").get_attribute("data-role") == "user", "the user's role")
        row = f'#pending tr[data-job="{job}"]'
        page.until(lambda d: page.all(row), "alice's job awaiting approval")
        page.until(lambda d: page.css(f"{row} .reason").get_attribute("data-code") == "AwaitingApproval", "its reason")
        assert not page.all('[data-nav="governance"]')
        assert not page.all("button[data-approve]")
        page.go(f"#/jobs/{job}")
        page.until(lambda d: page.all("#cancel"), "the job page")  # alice may cancel her job
        assert not page.all("#approve")
        page.go("#/governance")
        assert "admins only" in page.css("#view").text
        assert "token.create" not in page.driver.page_source  # the audit log stays hidden
        assert page.console_errors() == []
        page.sign_out()
        assert page.driver.execute_script("return sessionStorage.getItem('warden.token')") is None

        page.sign_in(ADMIN, "governance")
        approve = f'button[data-approve="{job}"]'
        page.until(lambda d: page.all(approve), "the Approve button")
        page.until(lambda d: "token.create" in page.css("#audit").text, "the audit log")
        # The version in force is named on top, and marked among the versions (the policy file's).
        version = admin.get("/v1/policy").json()["version"]
        assert version >= 1
        page.until(
            lambda d: f"Policy version {version} is in force" in page.css("#policy-in-force").text, "the version"
        )
        assert "by server" in page.css("#policy-in-force").text
        assert "in force" in page.css(f'#policy tr[data-version="{version}"]').text
        assert page.css('[data-nav="governance"]')
        page.shot("governance")
        page.css(approve).click()
        page.until(lambda d: page.all(f'[data-approved="{job}"]'), "the approval said")
        assert until_state(admin, job, "PENDING", "ADMITTED", "STARTING", "RUNNING")["approved_by"] == "admin"
        page.until(lambda d: not page.all(approve), "the job gone from the approvals")
        page.until(lambda d: "approve" in [e.text for e in page.all("#audit td code")], "the approval in the audit log")
        assert page.console_errors() == []


def test_another_users_job_page_shows_its_command_and_logs_as_hidden(server: Server, page: Page) -> None:
    page = at(page, server)
    with server.client() as admin:
        alice = token_for(admin, "alice", ["vision"])
        job = submit(admin, queue="vision", tier=3, gpus=1, name="admins-run", command=SLEEPER)
        page.sign_in(alice, "jobs")
        page.go(f"#/jobs/{job}")
        page.until(lambda d: "hidden (another user's job)" in page.css("#view").text, "the command shown as hidden")
        page.until(lambda d: "--private-data" in page.css("#view").text, "the logs refused, naming the setting")
        assert "undefined" not in page.css("#view").text and " ".join(SLEEPER) not in page.css("#view").text
        assert not page.all("#cancel")
        assert page.console_errors() == []


# ------------------------------------------------------------------------------ reading right

# The policy above with long queue names two levels deep, limits set on some, and a startup
# assumed longer than a fresh attempt has run (η's overheads then outweigh its run).
LONG_POLICY = POLICY.split("queues:")[0].replace(
    "{restart_overhead: 0s, checkpoint_overhead: 0s}", "{restart_overhead: 10m, checkpoint_overhead: 30s}"
).replace("lease: 1s,", "lease: 1h,") + (
    """\
queues:
  name: cluster
  children:
    - name: research-computer-vision-and-multimodal-foundation-models
      children:
        - {name: vision-pretraining-large-scale-experiments, nominal: {gpu: 2}, borrowing_limit: {gpu: 2}}
        - {name: vision-evaluation-and-benchmarking-suite, nominal: {gpu: 1}, lending_limit: {gpu: 1}}
        - {name: multimodal-alignment-reinforcement-learning, nominal: {gpu: 1}}
    - name: language-models-production-and-inference-serving
      children:
        - {name: inference-serving-latency-critical-endpoints, nominal: {gpu: 2}, weight: 2}
        - {name: language-model-finetuning-customer-projects, nominal: {gpu: 1}}
        - {name: language-model-data-processing-pipelines, nominal: {gpu: 1}}
"""
)
SERVING = "inference-serving-latency-critical-endpoints"
PRETRAINING = "vision-pretraining-large-scale-experiments"


@pytest.fixture
def long_server(tmp_path: Path, tls_args: tuple[str, ...]) -> Iterator[Server]:
    s = started(tmp_path, LONG_POLICY, gpus=8, args=("--history-interval", "1", *tls_args))
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp_path)


def test_running_jobs_read_right_and_the_queue_tree_fits_a_laptop(long_server: Server, page: Page) -> None:
    page = at(page, long_server)
    with long_server.client() as c:
        serving = submit(c, queue=SERVING, tier=1, gpus=1, name="endpoint", command=SLEEPER)
        training = submit(c, queue=PRETRAINING, tier=3, gpus=2, name="pretrain", command=SLEEPER)
        for job in (serving, training):
            until_state(c, job, "RUNNING")
        listed = {j["id"]: j for j in c.get("/v1/jobs").json()}
        # 10 min of assumed startup and a 30 s save against seconds of running: η 0, not below.
        assert listed[training]["efficiency"] == 0.0 and listed[serving]["efficiency"] == 0.0
        assert (listed[serving]["preemptible"], listed[training]["preemptible"]) == (False, True)

        page.sign_in(ADMIN, "jobs")
        row = '#running tr[data-job="{}"]'
        page.until(lambda d: page.all(row.format(serving)) and page.all(row.format(training)), "the running jobs")
        assert page.css(f"{row.format(serving)} td.lease-end").text == "not preemptible"
        assert re.fullmatch(r"in (59|60) min\.?", page.css(f"{row.format(training)} td.lease-end").text)
        for job in (serving, training):
            assert page.css(f"{row.format(job)} td.eta").text == "0 %"
        page.go(f"#/jobs/{serving}")
        page.until(lambda d: "not preemptible" in page.css(".facts").text, "the job page's lease")
        assert "protected" not in page.css(".facts").text

        page.driver.set_window_size(1400, 900)
        try:
            page.go("#/queues")
            page.until(lambda d: len(page.all("table.queue-tree tbody tr")) == 9, "the queue tree")
            page.until(lambda d: page.all("figure.chart-card svg.chart"), "the history charts")
            wide = page.driver.execute_script(
                "const t = document.querySelector('table.queue-tree'); const wrap = t.parentElement;"
                "return [t.scrollWidth, wrap.scrollWidth, wrap.clientWidth, t.rows[0].cells.length];"
            )
            table, scrolled, shown, columns = wide
            assert columns == 13 and max(table, scrolled) <= shown, wide
            page.shot("queues-1400")
        finally:
            page.driver.set_window_size(1366, 900)
        assert page.console_errors() == []
