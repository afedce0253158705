"""Jobs never run with the server's authority (docs/security.md), checked with a real server
process (running as root, as in CI) and real jobs: a job that tries to read the admin token
and the database (which holds the report secret), to write the database and the state directory, to reach
another job's log and checkpoint, to signal another job, the server and its own supervisor,
and to forge a report for another job, fails at each; it writes what happened to its log,
which the test reads. Secrets never appear on the server's command line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import ADMIN, Server, kill_leftovers, submit, until_state, wait_for

from warden.executors.identity import DEFAULT_JOB_UIDS

needs_root = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="jobs run as other uids only under a server running as root (CI runs the tests as root)",
)

POLICY = """\
min_grace: 1s
tiers:
  3: {name: experimentation, lease: 1h, grace: 1s}
queues:
  name: cluster
  children:
    - {name: vision}
"""

VICTIM = """\
import os, sys, time
with open(os.path.join(os.environ["WARDEN_CHECKPOINT_DIR"], "secret"), "w") as f:
    f.write("the victim's checkpoint")
print("the victim's log", flush=True)
time.sleep(3600)
"""

# Every attempt prints one JSON line; `ok` is whether it worked.
ATTACKER = """\
import json, os, signal, ssl, sys, urllib.error, urllib.request

log = os.environ["WARDEN_LOG_FILE"]
state = log.split("/jobs/")[0]  # what the audit did: ${WARDEN_LOG_FILE%/jobs/*}
victim, victim_pid, server_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
other = f"{state}/jobs/{victim}"

def attempt(name, fn):
    try:
        fn()
        out = {"name": name, "ok": True}
    except Exception as exc:
        out = {"name": name, "ok": False, "error": type(exc).__name__}
    print(json.dumps(out), flush=True)

def read(path):
    with open(path, "rb") as f:
        f.read(1)

def write(path):
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND))

def create(path):
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

def leave_cgroup():
    # into the root of the pids hierarchy (v1), else the unified one: the server's (root's) to write
    for line in sorted(open("/proc/self/mounts"), key=lambda line: "pids" not in line.split()[3].split(",")):
        fields = line.split()
        if fields[2] == "cgroup2" or (fields[2] == "cgroup" and "pids" in fields[3].split(",")):
            with open(os.path.join(fields[1], "cgroup.procs"), "w") as out:
                out.write(str(os.getpid()))
            return
    raise FileNotFoundError("no cgroup hierarchy")

def report(job):
    body = json.dumps({"attempt": 1, "kind": "progress", "step": 12345}).encode()
    request = urllib.request.Request(
        f"{os.environ['WARDEN_URL'].split(',')[0]}/v1/jobs/{job}/reports", data=body, method="POST",
        headers={"Authorization": f"Bearer {os.environ['WARDEN_REPORT_TOKEN']}", "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cadata=os.environ["WARDEN_CA"])).close()
    except urllib.error.HTTPError as err:
        raise PermissionError(f"HTTP {err.code}") from None

print(json.dumps({"name": "whoami", "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "euid": os.geteuid(), "env": dict(os.environ)}), flush=True)
attempt("read the admin token", lambda: read(f"{state}/admin-token"))
attempt("read the CA's key", lambda: read(f"{state}/ca.key"))
attempt("read the server's TLS key", lambda: read(f"{state}/server.key"))
attempt("read the database", lambda: read(f"{state}/warden.db"))
attempt("write the database", lambda: write(f"{state}/warden.db"))
attempt("write the database's WAL", lambda: write(f"{state}/warden.db-wal"))
attempt("list the state directory", lambda: os.listdir(state))
attempt("create a file in the state directory", lambda: create(f"{state}/planted"))
attempt("forge its own exit record", lambda: create(log.replace(".log", ".exit.json")))
attempt("forge what its supervisor saw", lambda: create(log.replace(".log", ".seen.json")))
attempt("leave its cgroup", leave_cgroup)
attempt("read another job's log", lambda: read(f"{other}/attempt-1/rank-0.log"))
attempt("read another job's checkpoint", lambda: read(f"{other}/checkpoints/secret"))
attempt("write another job's checkpoint", lambda: create(f"{other}/checkpoints/planted"))
attempt("signal another job", lambda: os.kill(victim_pid, 0))
attempt("signal another job's group", lambda: os.killpg(victim_pid, 0))
attempt("signal the server", lambda: os.kill(server_pid, 0))
attempt("signal its own supervisor", lambda: os.kill(os.getppid(), 0))
attempt("read the server's environment", lambda: read(f"/proc/{server_pid}/environ"))
attempt("report for another job", lambda: report(victim))
# What a job may do: its own checkpoint directory, its HOME, its own reports.
attempt("own: write its checkpoint", lambda: create(os.path.join(os.environ["WARDEN_CHECKPOINT_DIR"], "mine")))
attempt("own: write its HOME", lambda: create(os.path.join(os.environ["HOME"], "mine")))
attempt("own: report", lambda: report(os.environ["WARDEN_JOB_ID"]))
"""

ATTACKS = {
    "read the admin token",
    "read the CA's key",
    "read the server's TLS key",
    "read the database",
    "write the database",
    "write the database's WAL",
    "list the state directory",
    "create a file in the state directory",
    "forge its own exit record",
    "forge what its supervisor saw",
    "leave its cgroup",
    "read another job's log",
    "read another job's checkpoint",
    "write another job's checkpoint",
    "signal another job",
    "signal another job's group",
    "signal the server",
    "signal its own supervisor",
    "read the server's environment",
    "report for another job",
}
OWN = {"own: write its checkpoint", "own: write its HOME", "own: report"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def status_of(state: Path, job: str) -> dict[str, Any]:
    path = state / "jobs" / job / "attempt-1" / "rank-0.status.json"
    return wait_for(lambda: path.exists() and json.loads(path.read_text()), 20, f"{path}")


def lines(c: httpx.Client, job: str) -> list[dict[str, Any]]:
    text = c.get(f"/v1/jobs/{job}/logs", params={"attempt": 1}).json()["text"]
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server in the default mode (a uid per attempt), which has both an admin token file
    (written at the first start) and a bootstrap token given in its environment."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    first = Server(tmp_path / "state", policy=policy, run_as=(), bootstrap=False).start()
    first.stop()
    s = Server(tmp_path / "state", policy=policy, run_as=()).start()
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp_path)


@needs_root
def test_a_job_cannot_use_the_servers_authority(server: Server, tmp_path: Path) -> None:
    state = server.state_dir
    victim_py, attacker_py = tmp_path / "victim.py", tmp_path / "attacker.py"
    victim_py.write_text(VICTIM)
    attacker_py.write_text(ATTACKER)
    assert server.proc is not None
    with server.client() as c:
        victim = submit(c, queue="vision", tier=3, command=[sys.executable, str(victim_py)])
        until_state(c, victim, "RUNNING")
        victim_status = status_of(state, victim)
        checkpoints = state / "jobs" / victim / "checkpoints"
        wait_for(lambda: (checkpoints / "secret").exists(), 20, "the victim's checkpoint")
        attacker = submit(
            c,
            queue="vision",
            tier=3,
            command=[sys.executable, str(attacker_py), victim, str(victim_status["pid"]), str(server.proc.pid)],
        )
        until_state(c, attacker, "SUCCEEDED", "FAILED")
        results = {r["name"]: r for r in lines(c, attacker)}

        who = results.pop("whoami")
        assert who["uid"] == who["euid"] == who["gid"] and who["groups"] == []
        assert who["uid"] in DEFAULT_JOB_UIDS and victim_status["uid"] in DEFAULT_JOB_UIDS
        assert who["uid"] != victim_status["uid"]
        assert "WARDEN_BOOTSTRAP_TOKEN" not in who["env"] and ADMIN not in json.dumps(who["env"])
        assert set(results) == ATTACKS | OWN
        succeeded = sorted(name for name in ATTACKS if results[name]["ok"])
        assert succeeded == [], f"a job could: {succeeded}"
        assert all(results[name]["ok"] for name in OWN), results
        assert results["report for another job"]["error"] == "PermissionError"

        # The files the attacker went for: the server's alone.
        assert mode(state) == 0o711
        for name in ("admin-token", "warden.db", "warden.db-wal", "warden.db-shm"):
            assert (state / name).stat().st_uid == 0 and mode(state / name) == 0o600, name
        assert checkpoints.stat().st_uid == victim_status["uid"] and mode(checkpoints) == 0o700
        assert not (checkpoints / "planted").exists() and not (state / "planted").exists()
        assert c.get(f"/v1/jobs/{victim}").json()["state"] == "RUNNING"  # never signalled

        c.post(f"/v1/jobs/{victim}/cancel")
        until_state(c, victim, "CANCELLED")
    # An attempt that ended gives its private directories back to the server.
    own = state / "jobs" / attacker / "checkpoints"
    for path in (checkpoints, own, state / "jobs" / attacker / "attempt-1" / "home"):
        assert path.stat().st_uid == 0 and mode(path) == 0o700, path


@needs_root
def test_the_bootstrap_token_comes_from_a_file_never_the_command_line(tmp_path: Path) -> None:
    token = "bootstrap-from-a-file-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    s = Server(tmp_path / "state", bootstrap=False, args=("--bootstrap-token-file", str(token_file))).start()
    try:
        assert s.proc is not None
        with s.client(token) as c:
            assert c.get("/v1/jobs").status_code == 200
        cmdline = Path(f"/proc/{s.proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{s.proc.pid}/environ").read_bytes()
        assert token.encode() not in cmdline and token.encode() not in environ
        assert b"--bootstrap-token-file" in cmdline
    finally:
        s.stop()


def test_a_token_on_the_command_line_is_refused(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "server", "--state-dir", str(tmp_path), "--bootstrap-token", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--bootstrap-token-file" in run.stderr and "WARDEN_BOOTSTRAP_TOKEN" in run.stderr
