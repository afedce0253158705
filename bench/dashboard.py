"""Whether the dashboard stays fast with 5,000 pending jobs: one JSON object.

    python bench/dashboard.py [--pending 5000] [--gpus 8] [--runs 5] [--api-runs 9] [--soak 60]

A real server (`warden server`, SQLite, G fake GPUs on one node, two queues `vision` and
`language` of G/2 GPUs each) in a temporary directory. Four tier-4 jobs fill the cluster, then
four tier-3 jobs preempt them (so that `/v1/preemptions` has rows and REQUEUED jobs wait), then
N jobs are submitted through `POST /v1/jobs` by 8 client threads, as two users (`alice` in
`vision`, `bob` in `language`): tiers 3 and 4, and 1 in 20 of tier 2 (AWAITING_APPROVAL), 1 to 8
GPUs, a third with a time limit. None can start: the running tier-3 jobs hold every GPU inside
their queues' quotas, and nothing waiting outranks them.

- `fill`: `submit_per_s` (N over the time to submit them all), `settled_s` (from the last
  submission to the last page of waiting jobs all explained by a pass), `states` (the jobs by
  state then), `preemptions` (rows of `/v1/preemptions`).
- `api_ms`: each request's latency from this process (keep-alive, the body read and parsed),
  admin token, one warm-up then `--api-runs`: `pending_first_page` and `pending_last_page`
  (`GET /v1/jobs?state=AWAITING_APPROVAL,PENDING,REQUEUED&limit=100&offset=0`, and the offset
  of the last full page: what the dashboard's Jobs view asks), `running_page` (its other
  request, `state=ADMITTED,STARTING,RUNNING,PREEMPTING&limit=50`), `whole_list` (`GET /v1/jobs`,
  every unfinished job, for comparison), `nodes`, `queues`, `history` (24 h) and `preemptions`
  (24 h, `limit=1000`, as the dashboard asks). `bytes` is each answer's size, `items` how many
  rows it held (a fresh server has taken one or two history samples, one a minute: not a
  day's 1,440).
- `browser`: headless Chromium (Debian's, as tests/ui) signed in as the admin. Times are the
  page's own (`performance.now()`), from a script Chromium runs at the start of every document
  (a MutationObserver on the view's `data-updates`, which the app bumps after each redraw):
  `drawn` is when the view had redrawn itself, `painted` the end of the next frame after it.
  `nav_to_jobs_ms`: from `location.hash = "#/jobs"` (coming from `#/cluster`) to the first
  100 waiting rows (`#pending tbody tr`) painted; `nav_api_ms` of it until the last API answer
  had arrived (`/v1/queues` for the queue filter, `nav_queues_ms`, then both pages of jobs),
  `nav_after_api_ms` the rest (parsing and building the DOM, and the frame). `cold_load_ms`:
  a full load of `/ui/#/jobs` (the token already in the tab's sessionStorage) from navigation
  start to the rows painted. `next_page_ms` / `prev_page_ms`: the pager's Next (rows 101–200)
  and back. `forced_refresh_ms`: one refresh
  cycle forced as the app does when the tab becomes visible again (a `visibilitychange` event).
  `auto_refresh_ms`: the cycles of the 5 s poll during `--soak` seconds left alone on the
  Jobs view, each from its first request's start (Resource Timing) to painted. Then
  `heap_used_mb` (`performance.memory.usedJSHeapSize`, Chromium with
  `--enable-precise-memory-info`) when the soak began and ended, and after a garbage
  collection (`HeapProfiler.collectGarbage`); `dom_nodes`, and the long tasks (> 50 ms on the
  page's main thread) during the soak.
- `passes`: the server's reconcile passes (`warden_scheduling_pass_seconds` in `/metrics`):
  per window (`fill`: while the N were submitted; `settle`: until they were all explained;
  `idle`: 10 s after that, nothing asked; `api`; `browser`), how many, per second, the mean
  and the p50/p95 interpolated in the histogram's buckets.

Medians over the runs, every value in `*_all`. Progress goes to stderr. Everything it starts
(the server, the jobs' processes, chromedriver and Chromium) is ended on the way out, on an
error or SIGTERM too. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "server"))
sys.path.insert(0, str(REPO / "tests" / "ui"))

import httpx  # noqa: E402
from serverproc import ADMIN, Server, kill_leftovers, wait_for  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

POLICY = """\
min_grace: 1s
thrash: {{min_efficiency: 0}}
preemption: {{restart_overhead: 0s}}
tiers:
  1: {{name: production-inference, preemptible: false, grace: 1s, requires_approval: true, scope: cluster}}
  2: {{name: pretraining, lease: 1h, grace: 1s, requires_approval: true}}
  3: {{name: experimentation, lease: 1h, grace: 1s}}
  4: {{name: opportunistic, lease: 0s, grace: 1s, charged: false}}
queues:
  name: cluster
  children:
    - {{name: vision, nominal: {{gpu: {half}}}}}
    - {{name: language, nominal: {{gpu: {half}}}}}
"""

# Leaves at once and cleanly on SIGTERM: a preempted tier-4 job is requeued.
POLITE = [
    sys.executable,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(3600)",
]

WAITING = "AWAITING_APPROVAL,PENDING,REQUEUED"
HOLDING = "ADMITTED,STARTING,RUNNING,PREEMPTING"
DAY_S = 86400

# Run by Chromium at the start of every document, before the app's modules: records each
# redraw of the view (the app bumps #view's data-updates after every refresh) with what the
# waiting table shows then, the end of the frame after it, and the page's long tasks.
INSTRUMENT = """\
(() => {
  if (window.__bench) return;
  const b = (window.__bench = { updates: [], longtasks: [] });
  try { performance.setResourceTimingBufferSize(100000); } catch (e) {}
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) b.longtasks.push([e.startTime, e.duration]);
    }).observe({ type: "longtask", buffered: true });
  } catch (e) {}
  new MutationObserver((records) => {
    for (const r of records) {
      const v = r.target;
      if (v.id !== "view") continue;
      const first = document.querySelector("#pending tbody tr");
      const range = document.querySelector("#pending .pager-range");
      const rec = {
        t: performance.now(),
        n: Number(v.dataset.updates || 0),
        route: v.dataset.route || "",
        rows: document.querySelectorAll("#pending tbody tr").length,
        first: first ? first.dataset.job : null,
        range: range ? range.textContent : "",
        painted: null,
      };
      b.updates.push(rec);
      requestAnimationFrame(() => setTimeout(() => { rec.painted = performance.now(); }, 0));
    }
  }).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-updates"] });
})();
"""

_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def median(values: list[float], digits: int = 1) -> float | None:
    return round(statistics.median(values), digits) if values else None


def figures(name: str, values: list[float], digits: int = 1) -> dict[str, Any]:
    """`name`: the median; `name_all`: every value."""
    return {name: median(values, digits), f"{name}_all": [round(v, digits) for v in values]}


# -- the server and its jobs -------------------------------------------------------------------


def user_token(c: httpx.Client, user: str, queue: str) -> str:
    r = c.post("/v1/tokens", json={"user": user, "role": "user", "queues": [queue]})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def post(c: httpx.Client, body: dict[str, Any]) -> str:
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def state_of(c: httpx.Client, job: str) -> str:
    return c.get(f"/v1/jobs/{job}").json()["state"]


def occupy(s: Server, work: Path, gpus: int) -> dict[str, Any]:
    """Tier-4 jobs fill the cluster, tier-3 ones preempt them; the tier-3 ones keep every GPU."""
    size = max(1, gpus // 4)
    count = gpus // size
    with s.client() as c:
        low = [
            post(c, {"queue": ("vision", "language")[i % 2], "tier": 4, "gpus": size, "name": f"scavenger-{i}",
                     "command": POLITE, "workdir": str(work)})
            for i in range(count)
        ]  # fmt: skip
        for job in low:
            wait_for(lambda job=job: state_of(c, job) == "RUNNING", 30, f"job {job} running")
        high = [
            post(c, {"queue": ("vision", "language")[i % 2], "tier": 3, "gpus": size, "name": f"train-{i}",
                     "command": ["sleep", "3600"], "workdir": str(work)})
            for i in range(count)
        ]  # fmt: skip
        for job in high:
            wait_for(lambda job=job: state_of(c, job) == "RUNNING", 60, f"job {job} running")
        return {"running": len(high), "preempted": len(low)}


def pending_body(i: int, rng: random.Random, work: Path) -> dict[str, Any]:
    queue = ("vision", "language")[i % 2]
    tier = 2 if i % 20 == 7 else rng.choice((3, 3, 4))
    body: dict[str, Any] = {
        "queue": queue,
        "tier": tier,
        "gpus": rng.choice((1, 1, 1, 2, 2, 4, 8)),
        "name": f"{queue}-sweep-{i}",
        "command": ["sleep", "600"],
        "workdir": str(work),
    }
    if i % 3 == 0:
        body["time_limit"] = rng.choice(("30m", "2h", "8h"))
    return body


def fill(s: Server, work: Path, pending: int, clients: int = 8) -> dict[str, Any]:
    """`pending` submissions from `clients` threads, as alice (vision) and bob (language)."""
    with s.client() as c:
        tokens = {"vision": user_token(c, "alice", "vision"), "language": user_token(c, "bob", "language")}
    rng = random.Random(0)
    bodies = [pending_body(i, rng, work) for i in range(pending)]
    failures: list[str] = []

    def work_on(k: int) -> None:
        users = {q: s.client(t) for q, t in tokens.items()}
        try:
            for body in bodies[k::clients]:
                r = users[body["queue"]].post("/v1/jobs", json=body)
                if r.status_code != 201:
                    failures.append(f"{r.status_code} {r.text[:200]}")
        finally:
            for u in users.values():
                u.close()

    began = time.monotonic()
    threads = [threading.Thread(target=work_on, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - began
    if failures:
        raise AssertionError(f"{len(failures)} submissions refused, the first: {failures[0]}")
    return {"submitted": pending, "clients": clients, "submit_s": round(took, 1), "submit_per_s": round(pending / took)}


def settle(c: httpx.Client, timeout: float = 120) -> dict[str, Any]:
    """Wait until the last page of waiting jobs (the unranked ones sort last) all have a reason."""
    began = time.monotonic()

    def explained() -> bool:
        total = int(c.get("/v1/jobs", params={"state": WAITING, "limit": 1}).headers["X-Total-Count"])
        tail = c.get("/v1/jobs", params={"state": WAITING, "limit": 100, "offset": max(0, total - 100)}).json()
        return bool(tail) and all(j["reason"] is not None for j in tail)

    try:
        wait_for(explained, timeout, "every waiting job explained", interval=0.5)
        settled: float | None = round(time.monotonic() - began, 1)
    except AssertionError:
        settled = None
    listed = c.get("/v1/jobs").json()
    states: dict[str, int] = {}
    for j in listed:
        states[j["state"]] = states.get(j["state"], 0) + 1
    waiting = [j for j in listed if j["state"] in WAITING.split(",")]
    codes: dict[str, int] = {}
    for j in waiting:
        code = (j["reason"] or {}).get("code", "none")
        codes[code] = codes.get(code, 0) + 1
    preemptions = c.get("/v1/preemptions", params={"since": time.time() - DAY_S, "limit": 1000}).json()
    return {
        "settled_s": settled,
        "states": dict(sorted(states.items())),
        "reasons": dict(sorted(codes.items(), key=lambda kv: -kv[1])),
        "ranked": sum(1 for j in waiting if j["position"] is not None),
        "preemptions": len(preemptions),
    }


# -- the server's passes -----------------------------------------------------------------------


class Passes:
    """The reconcile passes between two readings of `warden_scheduling_pass_seconds`."""

    def __init__(self, c: httpx.Client) -> None:
        self.c = c
        self.last = self.read()

    def read(self) -> dict[str, Any]:
        buckets: dict[float, float] = {}
        total = count = 0.0
        for line in self.c.get("/metrics").text.splitlines():
            if line.startswith("warden_scheduling_pass_seconds_bucket"):
                le = re.search(r'le="([^"]+)"', line)
                assert le is not None
                buckets[float(le.group(1))] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("warden_scheduling_pass_seconds_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("warden_scheduling_pass_seconds_count"):
                count = float(line.rsplit(" ", 1)[1])
        return {"at": time.monotonic(), "buckets": buckets, "sum": total, "count": count}

    def window(self) -> dict[str, Any]:
        """The passes since the last call."""
        now, before = self.read(), self.last
        self.last = now
        n = now["count"] - before["count"]
        buckets = sorted((le, now["buckets"][le] - before["buckets"].get(le, 0.0)) for le in now["buckets"])

        def ms(q: float) -> float | None:
            return round(1000 * quantile(buckets, q), 1) if n else None

        return {
            "seconds": round(now["at"] - before["at"], 1),
            "passes": int(n),
            "per_s": round(n / max(1e-9, now["at"] - before["at"]), 2),
            "mean_ms": round(1000 * (now["sum"] - before["sum"]) / n, 1) if n else None,
            "p50_ms": ms(0.5),
            "p95_ms": ms(0.95),
        }


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus's `histogram_quantile` over cumulative (upper bound, count) buckets."""
    total = buckets[-1][1]
    target = q * total
    prev_le = prev_count = 0.0
    for le, count in buckets:
        if count >= target:
            if le == float("inf"):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (target - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


# -- the API -----------------------------------------------------------------------------------


def api_latencies(c: httpx.Client, pending: int, runs: int) -> dict[str, Any]:
    last = max(0, (pending // 100 - 1) * 100)
    requests: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "pending_first_page": ("/v1/jobs", lambda: {"state": WAITING, "limit": 100, "offset": 0}),
        "pending_last_page": ("/v1/jobs", lambda: {"state": WAITING, "limit": 100, "offset": last}),
        "running_page": ("/v1/jobs", lambda: {"state": HOLDING, "limit": 50, "offset": 0}),
        "whole_list": ("/v1/jobs", dict),
        "nodes": ("/v1/nodes", dict),
        "queues": ("/v1/queues", dict),
        "history": ("/v1/history", lambda: {"since": time.time() - DAY_S, "until": time.time()}),
        "preemptions": ("/v1/preemptions", lambda: {"since": time.time() - DAY_S, "limit": 1000}),
    }
    out: dict[str, Any] = {"pending_last_page_offset": last, "bytes": {}, "items": {}}
    for name, (path, params) in requests.items():
        took: list[float] = []
        for run in range(runs + 1):
            t0 = time.perf_counter()
            r = c.get(path, params=params())
            body = r.json()
            dt = 1000 * (time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            if run:  # the first is a warm-up
                took.append(dt)
        out.update(figures(name, took))
        out["bytes"][name] = len(r.content)
        out["items"][name] = len(body) if isinstance(body, list) else len(body.get("samples", body))
        say(f"  {name}: {median(took)} ms")
    return out


# -- the browser -------------------------------------------------------------------------------


def started_at(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat), None once it is gone:
    a pid with the same start time is the same process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its start time, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if (at := started_at(child)) is not None:
                found[child] = at
            todo.append(child)
    return found


@contextmanager
def browser(profile: Path) -> Iterator[Any]:
    """Headless Chromium as tests/ui/conftest.py starts it, with exact heap sizes; chromedriver
    and every process under it ended on the way out."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1366,900",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--lang=en-US",
        "--enable-precise-memory-info",
        f"--user-data-dir={profile}",
        *(("--no-sandbox",) if os.geteuid() == 0 else ()),
    ):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=os.devnull, popen_kw={"start_new_session": True})
    driver = None
    ours: dict[int, str] = {}  # chromedriver and everything under it

    def note() -> None:
        process = getattr(service, "process", None)
        if process is not None:
            ours.update(descendants(process.pid))
            if (at := started_at(process.pid)) is not None:
                ours[process.pid] = at

    try:
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(60)
        note()
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": INSTRUMENT})
        driver.execute_cdp_cmd("Performance.enable", {})
        yield driver
    finally:
        note()
        if driver is not None:
            try:
                driver.quit()
            except Exception as err:  # the processes are ended below in any case
                say(f"driver.quit: {err!r}")
        else:
            service.stop()
        for pid, at in ours.items():
            if started_at(pid) == at:  # still that process: not a new one with its pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(profile, ignore_errors=True)


class Dashboard:
    """The dashboard in the browser, timed by the page itself (INSTRUMENT)."""

    def __init__(self, driver: Any, url: str) -> None:
        self.d = driver
        self.url = url

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def records(self, start: int = 0) -> list[dict[str, Any]]:
        return self.js("return window.__bench ? window.__bench.updates.slice(arguments[0]) : []", start)

    def redraw(
        self, start: int, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        """The first redraw recorded from `start` on that satisfies `pred`, once it is painted."""

        def found() -> dict[str, Any] | None:
            for rec in self.records(start):
                if pred(rec):
                    return rec if rec["painted"] is not None else None
            return None

        return wait_for(found, timeout, what, interval=0.05)

    def act(self, script: str) -> tuple[float, int]:
        """Run `script` in the page; when it began (the page's clock) and the redraws before it."""
        t0, n = self.js(f"const t0 = performance.now(), n = window.__bench.updates.length; {script}; return [t0, n];")
        return t0, n

    def fetches(self, since: float, until: float) -> list[dict[str, Any]]:
        return self.js(
            "return performance.getEntriesByType('resource')"
            ".filter((e) => e.name.includes('/v1/') && e.startTime >= arguments[0] && e.responseEnd <= arguments[1])"
            ".map((e) => ({name: e.name, start: e.startTime, end: e.responseEnd}))",
            since,
            until,
        )

    def sign_in(self) -> None:
        from uipage import Page

        Page(self.d, self.url, Path(tempfile.gettempdir())).sign_in(ADMIN, "cluster")

    def to_cluster(self) -> None:
        _, n = self.act("location.hash = '#/cluster'")
        self.redraw(n, lambda r: r["route"] == "cluster" and r["n"] >= 1, "the cluster view")

    def timed(self, script: str, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, float]:
        t0, n = self.act(script)
        rec = self.redraw(n, pred, what)
        got = self.fetches(t0 - 1, rec["t"])
        api_end = max((f["end"] for f in got), default=t0)
        queues_end = max((f["end"] for f in got if "/v1/queues" in f["name"]), default=t0)
        return {
            "queues": queues_end - t0,
            "drawn": rec["t"] - t0,
            "painted": rec["painted"] - t0,
            "api": api_end - t0,
            "after_api": rec["painted"] - api_end,
            "first": rec["first"],
        }

    def heap(self) -> dict[str, float]:
        metrics = {m["name"]: m["value"] for m in self.d.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
        return {
            "used_mb": self.js("return performance.memory.usedJSHeapSize") / 2**20,
            "nodes": metrics.get("Nodes", 0),
            "listeners": metrics.get("JSEventListeners", 0),
        }


def browser_figures(d: Dashboard, pending: int, runs: int, soak: float) -> dict[str, Any]:
    rows = min(100, pending)
    d.sign_in()
    say("  signed in")
    out: dict[str, Any] = {}

    def on_jobs(r: dict[str, Any]) -> bool:  # the Jobs view, drawn from the API with a page of rows
        return r["route"] == "jobs" and r["n"] >= 1 and r["rows"] >= rows

    # From the cluster view to the Jobs view, the page already loaded.
    navs = []
    for _ in range(runs):
        d.to_cluster()
        navs.append(d.timed("location.hash = '#/jobs'", on_jobs, "the first waiting rows"))
    out.update(figures("nav_to_jobs_ms", [x["painted"] for x in navs]))
    out.update(figures("nav_drawn_ms", [x["drawn"] for x in navs]))
    out.update(figures("nav_api_ms", [x["api"] for x in navs]))
    out.update(figures("nav_queues_ms", [x["queues"] for x in navs]))
    out.update(figures("nav_after_api_ms", [x["after_api"] for x in navs]))
    say(f"  #/cluster → #/jobs: {out['nav_to_jobs_ms']} ms (API {out['nav_api_ms']} ms)")

    # The pager: Next to rows 101–200, Previous back (each right after a redraw, so that no
    # automatic refresh is under way).
    nexts, prevs = [], []
    for _ in range(runs):
        nexts.append(
            d.timed(
                "document.querySelector('#pending [data-key=\"waiting-next\"]').click()",
                lambda r: r["route"] == "jobs" and r["range"].startswith("101") and r["rows"] >= 1,
                "the second page",
            )
        )
        prevs.append(
            d.timed(
                "document.querySelector('#pending [data-key=\"waiting-prev\"]').click()",
                lambda r: r["route"] == "jobs" and r["range"].startswith("1–") and r["rows"] >= rows,
                "the first page again",
            )
        )
    out.update(figures("next_page_ms", [x["painted"] for x in nexts]))
    out.update(figures("next_page_api_ms", [x["api"] for x in nexts]))
    out.update(figures("prev_page_ms", [x["painted"] for x in prevs]))
    say(f"  next page: {out['next_page_ms']} ms, previous: {out['prev_page_ms']} ms")

    # One refresh cycle, forced the way the app refreshes when the tab becomes visible again.
    forced = []
    for _ in range(runs):
        n_before = int(d.js("return Number(document.getElementById('view').dataset.updates)"))
        forced.append(
            d.timed(
                "document.dispatchEvent(new Event('visibilitychange'))",
                lambda r, n_before=n_before: r["route"] == "jobs" and r["n"] > n_before,
                "a forced refresh",
            )
        )
    out.update(figures("forced_refresh_ms", [x["painted"] for x in forced]))
    out.update(figures("forced_refresh_api_ms", [x["api"] for x in forced]))
    out.update(figures("forced_refresh_after_api_ms", [x["after_api"] for x in forced]))
    say(f"  forced refresh: {out['forced_refresh_ms']} ms (API {out['forced_refresh_api_ms']} ms)")

    # Left alone on the Jobs view: the 5 s poll, the heap, the long tasks.
    start_at, start_n = d.js("return [performance.now(), window.__bench.updates.length]")
    before = d.heap()
    say(f"  on the Jobs view for {soak:g} s")
    time.sleep(soak)
    end_at = d.js("return performance.now()")
    after = d.heap()
    d.d.execute_cdp_cmd("HeapProfiler.collectGarbage", {})
    collected = d.heap()
    cycles = []
    prev_t = start_at
    entries = d.fetches(start_at, end_at)
    for rec in d.records(start_n):
        if rec["painted"] is None or rec["route"] != "jobs":
            continue
        mine = [f for f in entries if prev_t < f["start"] <= rec["t"]]  # this cycle's requests
        if mine:
            began = min(f["start"] for f in mine)
            cycles.append({"ms": rec["painted"] - began, "api": max(f["end"] for f in mine) - began})
        prev_t = rec["t"]
    out.update(figures("auto_refresh_ms", [c["ms"] for c in cycles]))
    out.update(figures("auto_refresh_api_ms", [c["api"] for c in cycles]))
    long_tasks = [dur for at, dur in d.js("return window.__bench.longtasks") if start_at <= at <= end_at]
    out.update(
        {
            "soak_s": round((end_at - start_at) / 1000, 1),
            "auto_refreshes": len(cycles),
            "heap_used_mb_start": round(before["used_mb"], 2),
            "heap_used_mb": round(after["used_mb"], 2),
            "heap_used_mb_after_gc": round(collected["used_mb"], 2),
            "dom_nodes_start": int(before["nodes"]),
            "dom_nodes": int(after["nodes"]),
            "js_event_listeners": int(after["listeners"]),
            "long_tasks": len(long_tasks),
            "long_task_ms_total": round(sum(long_tasks), 1),
            "long_task_ms_max": round(max(long_tasks), 1) if long_tasks else 0,
        }
    )
    say(f"  auto refresh: {out['auto_refresh_ms']} ms, heap {out['heap_used_mb']} MB after {out['soak_s']} s")

    # A whole load of the Jobs view, the token in the tab's sessionStorage.
    colds = []
    for _ in range(max(1, runs // 2 + 1)):
        d.d.get("about:blank")  # the tab keeps its sessionStorage, and the next load is a whole one
        d.d.get(f"{d.url}/ui/#/jobs")
        rec = d.redraw(0, on_jobs, "the first waiting rows after a load")
        colds.append(rec["painted"])
    out.update(figures("cold_load_ms", colds))
    say(f"  cold load: {out['cold_load_ms']} ms")
    return out


# -- the run -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "pending": args.pending,
        "gpus": args.gpus,
    }
    policy = work / "policy.yaml"
    policy.write_text(POLICY.format(half=args.gpus // 2))
    s = Server(work / "state", policy=policy, gpus=args.gpus)
    try:
        s.start()
        say(f"server on {s.url}")
        with s.client() as c:
            c.timeout = httpx.Timeout(60)
            passes = Passes(c)
            result["cluster"] = occupy(s, work, args.gpus)
            say(f"the cluster is full: {result['cluster']}")
            passes.window()
            result["fill"] = fill(s, work, args.pending)
            windows = {"fill": passes.window()}
            say(f"{args.pending} submitted: {result['fill']}")
            result["fill"].update(settle(c))
            windows["settle"] = passes.window()
            say(f"settled: {result['fill']}")
            time.sleep(10)
            windows["idle"] = passes.window()
            say("the API")
            result["api_ms"] = api_latencies(c, args.pending, args.api_runs)
            windows["api"] = passes.window()
            if not args.no_browser:
                say("the browser")
                with browser(Path(tempfile.mkdtemp(prefix="wbench-chromium-"))) as driver:
                    result["browser"] = browser_figures(Dashboard(driver, s.url), args.pending, args.runs, args.soak)
                    driver.get("about:blank")
                windows["browser"] = passes.window()
            result["passes"] = windows
    finally:
        s.stop()
        kill_leftovers(work)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pending", type=int, default=5000, help="jobs waiting (default 5000)")
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs on the one node (default 8)")
    p.add_argument("--runs", type=int, default=5, help="runs of each browser measure (default 5)")
    p.add_argument("--api-runs", type=int, default=9, help="requests of each API call (default 9)")
    p.add_argument("--soak", type=float, default=60, help="seconds left alone on the Jobs view (default 60)")
    p.add_argument("--no-browser", action="store_true", help="the server and the API only")
    args = p.parse_args(argv)
    if not 100 <= args.pending <= 100_000:
        p.error(f"--pending: {args.pending} is out of range; allowed: 100 to 100000")
    if args.gpus < 4 or args.gpus % 4:
        p.error(f"--gpus: {args.gpus} must be a multiple of 4")
    if not 1 <= args.runs <= 50 or not 1 <= args.api_runs <= 100:
        p.error("--runs: 1 to 50; --api-runs: 1 to 100")
    if not 6 <= args.soak <= 600:
        p.error(f"--soak: {args.soak} is out of range; allowed: 6 to 600 seconds")
    if not args.no_browser:
        missing = [str(x) for x in (CHROMIUM, CHROMEDRIVER) if not x.exists()]
        if missing:
            p.error(f"{', '.join(missing)} missing (apt-get install chromium chromium-driver), or --no-browser")
    # SIGTERM ends the run as Ctrl-C does: the server, the jobs and the browser are ended on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="wbench-dash-"))
    os.chmod(work, 0o755)  # the jobs run as nobody, in this directory
    try:
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(result, indent=2), flush=True)
    return result


if __name__ == "__main__":
    main()
