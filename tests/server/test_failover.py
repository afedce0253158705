"""The clients of several servers (docs/control-plane.md, "Several servers"): real server
processes on a real PostgreSQL, the CLI as a real process, and a real SDK job.

A client given several URLs passes over one that does not answer (nothing listening, a leader
killed with SIGKILL) and sticks to the one that did; a submission whose answer was lost is sent
to the next server with its Idempotency-Key and is not doubled, while a cancel whose answer was
lost is not sent again; `warden status` says who leads, at 80 columns; the dashboard works
from a standby; and a job started by the leader goes on reporting after the leader's SIGKILL,
its reports taken by the standby with the same token.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from clusterproc import Cluster, cluster, health, role  # noqa: F401  (cluster: a fixture)
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import ADMIN, Server, cas, cli, free_port, until_state, wait_for

from warden.client import Client, Unreachable

# An SDK job: reports progress 1, writes its warden environment, then reports each step the
# test writes into NAME.step, noting after each what its reporter sent and failed.
REPORTER = """\
import json, os, sys, time
from pathlib import Path
from warden.workload import default_reporter
out = Path(sys.argv[1])
keys = ("WARDEN_URL", "WARDEN_REPORT_TOKEN", "WARDEN_JOB_ID", "WARDEN_ATTEMPT")
r = default_reporter()
r.progress(1)
r.flush(30)
Path(str(out) + ".env").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
step = 1
while True:
    trigger = Path(str(out) + ".step")
    wanted = int(trigger.read_text() or 0) if trigger.exists() else 0
    if wanted > step:
        step = wanted
        r.progress(step)
        r.flush(30)
        Path(str(out) + ".sent").write_text(f"{step} {r.sent} {r.failed}")
    time.sleep(0.05)
"""


def leading_pair(cluster: Cluster, advertise_b: bool = False) -> tuple[Server, Server, str]:
    """Server a leading, server b standing by, each knowing the other (the servers table);
    and the URL b advertises (with `advertise_b`, --advertise-url https://localhost:PORT)."""
    a = cluster.start("a")
    wait_for(lambda: role(a) == "leader", 10, "a to lead")
    port = free_port()
    b_url = f"https://localhost:{port}" if advertise_b else f"https://127.0.0.1:{port}"
    b = cluster.start("b", *(("--advertise-url", b_url + "/") if advertise_b else ()), port=port)
    both = sorted([a.url, b_url])
    wait_for(lambda: sorted(health(a).get("servers", [])) == both, 10, "a to see b in the servers table")
    assert health(a)["servers"][0] == a.url and health(b)["servers"][0] == b_url
    return a, b, b_url


def body(cluster: Cluster, name: str) -> dict[str, Any]:
    return {
        "queue": "team",
        "tier": 3,
        "gpus": 1,
        "name": name,
        "workdir": os.getcwd(),
        "command": [sys.executable, str(cluster.script), str(cluster.marks / name)],
    }


def test_the_client_passes_over_a_dead_url_and_a_killed_leader(cluster: Cluster) -> None:
    a, b, _ = leading_pair(cluster)
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    urls = f"{nobody},{a.url},{b.url}"
    c = Client(urls, ADMIN, ca=cas(a, b))
    job = c.submit(idempotency_key="first", retries=0, **body(cluster, "first"))
    assert c.url == a.url  # the first URL refused; the second answered and is kept
    assert Client(urls, ADMIN, ca=cas(a, b)).url == a.url  # for the rest of the process
    listed = json.loads(cli(urls, "queue", "--json", check=True).stdout)
    assert [r["id"] for r in listed] == [job["id"]]

    a.kill9()
    assert [r["id"] for r in c.jobs()] == [job["id"]]  # answered by b, a standby still or already leading
    assert c.url == b.url
    listed = json.loads(cli(urls, "queue", "--json", check=True).stdout)
    assert [r["id"] for r in listed] == [job["id"]]

    # Every server gone: one error naming each URL and why.
    b.kill9()
    with pytest.raises(Unreachable) as gone:
        c.jobs()
    message = str(gone.value)
    assert "cannot reach any of the 3 warden servers of --url" in message
    assert all(f"{u}: " in message for u in (nobody, a.url, b.url)) and "refused" in message.lower(), message
    done = cli(urls, "queue")
    assert done.returncode == 1 and "cannot reach any of the 3 warden servers of WARDEN_URL" in done.stderr
    assert all(u in done.stderr for u in (nobody, a.url, b.url)), done.stderr


class LosesAnswers:
    """A TLS proxy to one server (with that server's certificate) that passes each request on
    whole, reads the server's whole answer, and then resets the client's connection without a
    byte of it: the request was carried out and its answer lost on the way back."""

    def __init__(self, server: Server) -> None:
        self.port = server.port
        self.answers: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._serving.load_cert_chain(server.state_dir / "server.crt", server.state_dir / "server.key")
        self._upstream = ssl.create_default_context(cafile=server.ca)
        self.url = f"https://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            with self._serving.wrap_socket(raw, server_side=True) as conn:
                request = _message(conn)
                with (
                    socket.create_connection(("127.0.0.1", self.port), timeout=30) as plain,
                    self._upstream.wrap_socket(plain, server_hostname="127.0.0.1") as upstream,
                ):
                    upstream.sendall(request)
                    self.answers.append(_message(upstream))
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close

    def close(self) -> None:
        self._listener.close()


def _message(conn: socket.socket) -> bytes:
    """One HTTP message (head and a Content-Length body) read from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def _json_body(message: bytes) -> Any:
    return json.loads(message.partition(b"\r\n\r\n")[2])


def test_a_submission_whose_answer_was_lost_is_sent_to_the_next_server_and_not_doubled(cluster: Cluster) -> None:
    """Server a stores the job and its answer is lost; the client sends the submission to b
    with the same Idempotency-Key, and b, reading the key from the database, answers with a's
    job. A cancel whose answer was lost is not sent to b: the client says it may have been
    carried out."""
    a, b, _ = leading_pair(cluster)
    proxy = LosesAnswers(a)
    try:
        c = Client(f"{proxy.url},{b.url}", ADMIN, ca=cas(a, b))
        job = c.submit(idempotency_key="once", retries=0, **body(cluster, "once"))
        assert len(proxy.answers) == 1 and b"201 Created" in proxy.answers[0]  # a stored it
        assert job["id"] == _json_body(proxy.answers[0])["id"]  # b answered with a's job
        assert c.url == b.url
        with b.client() as cb:
            named = [j for j in cb.get("/v1/jobs", params={"all": "true"}).json() if j["name"] == "once"]
        assert [j["id"] for j in named] == [job["id"]]

        # Another list (this process keeps b first for the one above): the proxy first.
        lost = Client(f"{proxy.url},{b.url},http://127.0.0.1:{free_port()}", ADMIN, ca=cas(a, b))
        with pytest.raises(Unreachable, match="may or may not have been carried out"):
            lost.cancel(job["id"])
        assert len(proxy.answers) == 2 and b"202 Accepted" in proxy.answers[1]  # a took the cancel once
        assert lost.url == proxy.url  # nothing answered: nothing else is remembered
    finally:
        proxy.close()


def test_warden_status_says_who_leads_at_80_columns(cluster: Cluster) -> None:
    a, b, _ = leading_pair(cluster)
    nobody = f"http://127.0.0.1:{free_port()}"
    urls = f"{a.url},{b.url},{nobody}"

    done = cli(urls, "status", columns=80, token=None)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in done.stdout, done.stdout
    assert lines[0].split() == ["SERVER", "STATUS", "ROLE", "EPOCH", "LEADER"]
    assert lines[1].split() == [a.url, "up", "leader", "1", a.url]
    assert lines[2].split() == [b.url, "up", "standby", a.url]
    assert lines[3].split() == [nobody, "down"]
    assert any(line.startswith(f"{nobody}: ") and "refused" in line.lower() for line in lines), done.stdout
    assert lines[-1] == f"leader: {a.url}, epoch 1"
    out = json.loads(cli(urls, "status", "--json", token=None, check=True).stdout)
    assert (out["ok"], out["leader"], out["epoch"]) == (True, a.url, 1)
    assert [(s["url"], s["status"], s["role"], s["epoch"]) for s in out["servers"]] == [
        (a.url, "up", "leader", 1),
        (b.url, "up", "standby", None),
        (nobody, "down", None, None),
    ]

    a.kill9()
    shown = wait_for(
        lambda: (
            (d := cli(urls, "status", columns=80, token=None)).stdout.splitlines()[2].split()[2:3] == ["leader"] and d
        ),
        15,
        "b to lead in warden status",
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), shown.stdout
    assert lines[1].split() == [a.url, "down"]
    assert lines[2].split() == [b.url, "up", "leader", "2", b.url]
    assert lines[-1] == f"leader: {b.url}, epoch 2"

    # Only servers that do not answer: exit 1, saying so.
    b.kill9()
    done = cli(urls, "status", columns=80, token=None)
    assert done.returncode == 1 and "no server leads: none of the 3 servers answered" in done.stderr
    assert [line.split()[1] for line in done.stdout.splitlines()[1:4]] == ["down"] * 3


def test_the_dashboard_works_from_a_standby(cluster: Cluster) -> None:
    """Every page and every API call of the dashboard, sent to a standby, is answered."""
    a, b, _ = leading_pair(cluster)
    with a.client() as ca:
        job = cluster.job(ca, "shown")
        until_state(ca, job, "RUNNING")
    with httpx.Client(base_url=b.url, timeout=10, verify=b.tls()) as page:
        for path in ("/ui/", "/ui/js/main.js", "/ui/js/api.js", "/ui/style.css", "/openapi.json"):
            r = page.get(path)
            assert r.status_code == 200 and r.headers["x-warden-role"] == "standby", (path, r.status_code)
    with b.client() as cb:
        calls: list[tuple[str, dict[str, Any]]] = [
            ("/v1/whoami", {}),
            ("/v1/jobs", {"limit": 50, "offset": 0}),
            ("/v1/queues", {}),
            ("/v1/nodes", {}),
            ("/v1/policy", {}),
            ("/v1/audit", {"limit": 100}),
            ("/v1/history", {"since": int(time.time()) - 3600}),
            ("/v1/preemptions", {"since": int(time.time()) - 3600, "limit": 1000}),
            (f"/v1/jobs/{job}", {}),
            (f"/v1/jobs/{job}/logs", {"attempt": 1, "rank": 0, "offset": 0}),
        ]
        for path, params in calls:
            r = cb.get(path, params=params)
            assert r.status_code == 200, (path, r.status_code, r.text)
            assert r.headers["x-warden-role"] == "standby" and r.headers["x-warden-leader"] == a.url
        assert cb.get(f"/v1/jobs/{job}").json()["state"] == "RUNNING"
        assert cb.get("/v1/whoami").json()["role"] == "admin"


def test_an_sdk_job_goes_on_reporting_after_its_leader_is_killed(cluster: Cluster) -> None:
    """The leader starts an SDK job with both servers' URLs; the standby takes its reports
    with the token the leader minted, and the leader reads them; after the leader's SIGKILL
    the job's next report reaches the standby, with no report lost. The standby advertises a URL
    of its own choosing (--advertise-url), which is the one the job is given."""
    a, b, b_url = leading_pair(cluster, advertise_b=True)
    script = cluster.root / "reporter.py"
    script.write_text(REPORTER)
    out = cluster.marks / "sdk"
    with a.client() as ca, b.client() as cb:
        r = ca.post(
            "/v1/jobs",
            json={
                **body(cluster, "sdk"),
                "command": [sys.executable, str(script), str(out)],
                "env": {"WARDEN_PROGRESS_INTERVAL": "0"},
            },
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        until_state(ca, job, "RUNNING")
        env = json.loads(wait_for(lambda: Path(f"{out}.env").exists() and Path(f"{out}.env").read_text(), 30, "env"))
        assert env["WARDEN_URL"] == f"{a.url},{b_url}" and env["WARDEN_JOB_ID"] == job

        def step(c: httpx.Client) -> int | None:
            return c.get(f"/v1/jobs/{job}").json()["attempts"][0]["progress_step"]

        wait_for(lambda: step(ca) == 1, 20, "the job's first report")
        # A standby takes a report with the token the leader minted; the leader reads it.
        sent = cb.post(
            f"/v1/jobs/{job}/reports",
            json={"attempt": 1, "kind": "progress", "step": 5},
            headers={"Authorization": f"Bearer {env['WARDEN_REPORT_TOKEN']}"},
        )
        assert sent.status_code == 202, sent.text
        wait_for(lambda: step(ca) == 5, 10, "the leader to read the report the standby took")

        a.kill9()
        Path(f"{out}.step").write_text("1000")  # reported only after the kill
        wait_for(lambda: step(cb) == 1000, 30, "the report sent after the kill")
        noted = wait_for(lambda: Path(f"{out}.sent").exists() and Path(f"{out}.sent").read_text(), 10, "the note")
        assert noted == "1000 2 0"  # both of the job's reports taken, none failed
        wait_for(lambda: role(b) == "leader", 15, "b to take over")
        assert step(cb) == 1000 and cb.get(f"/v1/jobs/{job}").json()["state"] == "RUNNING"
