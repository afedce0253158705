"""The state directory on a real machine: one server at a time on it and on its SQLite
database, bound to the database whose jobs it holds, reachable by the uids jobs run as (the
server refuses to start otherwise), and a cancel recorded before a server died carried out by
the next one. Real servers, real jobs, real signals."""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serverproc import Server, free_port, submit, until_state, wait_for

from warden.server.statedir import set_aside_stale

ROOT = os.geteuid() == 0
POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"


def server_cmd(state: Path, *extra: str, port: int | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "warden.cli.main",
        "server",
        "--port",
        str(port or free_port()),
        "--fake-gpus",
        "2",
        "--state-dir",
        str(state),
        *extra,
    ]


def refused(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """Run a server that must refuse to start: its message (exit 2, at once)."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


def logs(c: httpx.Client, job: str) -> str:
    return c.get(f"/v1/jobs/{job}/logs").json()["text"]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_a_second_server_on_the_state_directory_is_refused_naming_the_first(tmp_path: Path, policy: Path) -> None:
    first = Server(tmp_path / "state", policy=policy).start()
    try:
        message = refused(server_cmd(tmp_path / "state"))
        assert f"state directory {tmp_path / 'state'}" in message
        assert first.proc is not None
        assert f"pid {first.proc.pid}" in message and f"port {first.port}" in message
        # It changed nothing: the first server still answers and still holds the lock.
        with first.client() as c:
            assert c.get("/v1/health").status_code == 200
        # kill -9 leaves no stale lock: the kernel drops it with the process.
        first.kill9()
        again = Server(tmp_path / "state", policy=policy).start()
        again.stop()
    finally:
        first.stop()


def test_a_second_server_on_a_sqlite_database_elsewhere_is_refused(tmp_path: Path, policy: Path) -> None:
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    first = Server(tmp_path / "a", policy=policy, db=db).start()
    try:
        message = refused(server_cmd(tmp_path / "b", "--db", db))
        assert f"SQLite database {tmp_path / 'shared.db'}" in message
        assert f"port {first.port}" in message
        assert not (tmp_path / "b" / "database.json").exists()  # nothing written before refusing
    finally:
        first.stop()


def test_a_state_directory_belongs_to_its_database(tmp_path: Path, policy: Path) -> None:
    a = Server(tmp_path / "state", policy=policy, db=f"sqlite:///{tmp_path / 'a.db'}").start()
    try:
        with a.client() as c:
            job = submit(c, queue="team", tier=3, gpus=1, command=["echo", "first"])
            until_state(c, job, "SUCCEEDED")
    finally:
        a.stop()
    message = refused(server_cmd(tmp_path / "state", "--db", f"sqlite:///{tmp_path / 'b.db'}"))
    assert f"sqlite:///{tmp_path / 'a.db'}" in message and f"sqlite:///{tmp_path / 'b.db'}" in message
    recorded = json.loads((tmp_path / "state" / "database.json").read_text())
    assert recorded["url"] == f"sqlite:///{tmp_path / 'a.db'}"
    # The database it belongs to still starts on it.
    Server(tmp_path / "state", policy=policy, db=f"sqlite:///{tmp_path / 'a.db'}").start().stop()


def test_directories_a_new_job_finds_in_its_place_are_set_aside_never_reused(tmp_path: Path, policy: Path) -> None:
    """A state directory used by another database before it recorded one (or copied by hand):
    the new job 1 sees neither the old job 1's output nor its checkpoints."""
    a = Server(tmp_path / "state", policy=policy, db=f"sqlite:///{tmp_path / 'a.db'}").start()
    try:
        with a.client() as c:
            job = submit(c, queue="team", tier=3, gpus=1, command=["sh", "-c", "echo first"])
            until_state(c, job, "SUCCEEDED")
    finally:
        a.stop()
    checkpoints = tmp_path / "state" / "jobs" / job / "checkpoints"
    (checkpoints / "step-7.json").write_text("{}")
    (tmp_path / "state" / "database.json").unlink()  # as an install that never recorded it
    b = Server(tmp_path / "state", policy=policy, db=f"sqlite:///{tmp_path / 'b.db'}").start()
    try:
        with b.client() as c:
            again = submit(
                c, queue="team", tier=3, gpus=1, command=["sh", "-c", 'echo second; ls "$WARDEN_CHECKPOINT_DIR"']
            )
            assert again == job
            until_state(c, again, "SUCCEEDED")
            assert logs(c, again) == "second\n"
        stale = list((tmp_path / "state" / "stale").iterdir())
        assert len(stale) == 1 and (stale[0] / "checkpoints" / "step-7.json").exists()
        assert (stale[0] / "attempt-1" / "rank-0.log").read_text() == "first\n"
    finally:
        b.stop()


def test_set_aside_moves_only_what_a_new_attempt_would_reuse(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "jobs" / "3" / "attempt-1").mkdir(parents=True)
    (state / "jobs" / "3" / "checkpoints").mkdir()
    assert set_aside_stale(state, 3, 2) is None  # attempt 2's place is free; the job's own stays
    (state / "jobs" / "3" / "attempt-2").mkdir()
    moved = set_aside_stale(state, 3, 2)
    assert moved is not None and moved.parent == state / "stale" and moved.name.startswith("3-attempt-2.")
    assert (state / "jobs" / "3" / "checkpoints").is_dir() and not (state / "jobs" / "3" / "attempt-2").exists()
    moved = set_aside_stale(state, 3, 1)  # before a first attempt, the whole job directory
    assert moved is not None and (moved / "checkpoints").is_dir() and not (state / "jobs" / "3").exists()
    assert set_aside_stale(state, 4, 1) is None


@pytest.mark.skipif(not ROOT, reason="only a root server runs jobs as other uids")
def test_a_state_directory_jobs_cannot_reach_is_refused_naming_the_directory_and_the_fix(
    tmp_path: Path, policy: Path
) -> None:
    closed = tmp_path / "home"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)  # root's home on a fresh machine
    state = closed / ".local" / "state" / "warden"
    message = refused(server_cmd(state, "--policy", str(policy)))
    assert f"{closed} is drwx------ root:root" in message
    assert "job uids 61000-61999" in message and f"chmod o+x {closed}" in message
    assert "/var/lib/warden" in message
    assert not (state / "warden.db").exists()  # refused before the database was made
    # With --run-as user, each mapped account is tried too: `nobody` passes through a 0711 home.
    os.chmod(closed, 0o711)
    server = Server(state, policy=policy, log_dir=tmp_path).start()
    server.stop()


@pytest.mark.skipif(not ROOT, reason="only a root server runs jobs as other uids")
def test_a_mapped_account_that_cannot_reach_the_state_directory_is_refused(tmp_path: Path, policy: Path) -> None:
    closed = tmp_path / "group-only"
    closed.mkdir()
    os.chmod(closed, 0o750)  # group root may pass, `nobody` may not; job uids neither
    message = refused(
        server_cmd(closed / "state", "--policy", str(policy), "--run-as", "user", "--user-map", "*=nobody")
    )
    assert f"{closed} is drwxr-x---" in message


def test_a_cancel_recorded_but_never_signalled_is_carried_out_after_a_restart(tmp_path: Path, policy: Path) -> None:
    server = Server(tmp_path / "state", policy=policy).start()
    marker = tmp_path / "alive"
    try:
        with server.client() as c:
            job = submit(
                c,
                queue="team",
                tier=3,
                gpus=1,
                command=["sh", "-c", f'trap "echo term >> {marker}; exit 0" TERM; while :; do sleep 0.1; done'],
            )
            until_state(c, job, "RUNNING")
        server.kill9()
        # The cancel a dying server recorded and never sent: the job holds its GPUs, marked.
        with sqlite3.connect(tmp_path / "state" / "warden.db") as db:
            db.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (int(job),))
        server.start()
        with server.client() as c:
            done = until_state(c, job, "CANCELLED", timeout=30)
            assert done["state"] == "CANCELLED"
            reasons = [e["reason"] for e in c.get(f"/v1/jobs/{job}").json()["events"]]
            assert any("SIGTERM sent for the cancel requested earlier" in r for r in reasons), reasons
        assert marker.read_text() == "term\n"  # SIGTERM, handled: not a SIGKILL
    finally:
        server.stop()


# -- the real default, as the README's commands give it ------------------------------------------

ROOT_STATE = Path("/var/lib/warden")
MADE_HERE = ".made-by-warden-tests"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def default_state() -> Iterator[Path]:
    """/var/lib/warden as a fresh machine has it: absent. One this suite did not make is left
    alone (the test skips); one a crashed run of it left is removed first."""
    if ROOT_STATE.exists():
        if not (ROOT_STATE / MADE_HERE).exists():
            pytest.skip(f"{ROOT_STATE} exists and was not made by this test suite: it is left alone")
        subprocess.run(["rm", "-rf", str(ROOT_STATE)], check=True)
    try:
        yield ROOT_STATE
    finally:
        subprocess.run(["rm", "-rf", str(ROOT_STATE)], check=False)


def cli(home: Path, url: str, *args: str) -> str:
    """The CLI as root uses it on the server's machine: the token from the state directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARDEN_", "XDG_"))}
    env.update(HOME=str(home), WARDEN_URL=url)
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


SLURM = pytest.param("slurm", marks=[pytest.mark.slow, pytest.mark.xdist_group("slurm")])


@pytest.mark.skipif(not ROOT, reason="the default state directory of a root server")
@pytest.mark.xdist_group("slurm")  # one worker for every test of /var/lib/warden (and of the Slurm cluster)
@pytest.mark.parametrize("executor", ["local", SLURM])
def test_as_root_with_the_defaults_sdk_jobs_checkpoint_are_preempted_and_resume(
    tmp_path: Path, default_state: Path, executor: str, request: pytest.FixtureRequest
) -> None:
    """`warden server` with no state option, run as root in a HOME as a fresh machine has it
    (0700): state in /var/lib/warden, jobs under uids of their own (local) or as `nobody`
    through Slurm (`--run-as user`), which reach their attempt and checkpoint directories; the
    CLI finds the server's admin token there."""
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    env = {"HOME": str(home)}
    if executor == "local":
        args: tuple[str, ...] = ()
        run_as: tuple[str, ...] = ()  # the default: a uid of its own per attempt
        gpus = 4
        preemptor = ("--gpus", "2")
        owners = range(61000, 62000)
    else:
        cluster = request.getfixturevalue("slurm_cluster")
        args = ("--executor", "slurm")
        run_as = ("--run-as", "user", "--user-map", "*=nobody")
        env["SLURM_CONF"] = str(cluster.conf)
        gpus = 8
        preemptor = ("--gpus", "8", "--replicas", "4")  # every node of the cluster (4 × 8 GPUs)
        nobody = pwd.getpwnam("nobody").pw_uid
        owners = range(nobody, nobody + 1)
    server = Server(
        default_state,
        gpus=None,  # no --fake-gpus: the README's command (the local executor pretends to have 4)
        run_as=run_as,
        args=args,
        bootstrap=False,
        state_option=False,
        log_dir=tmp_path,
        env=env,
    ).start()
    try:
        (default_state / MADE_HERE).touch()
        assert (default_state.stat().st_mode & 0o777) == 0o711
        assert ((default_state / "admin-token").stat().st_mode & 0o777) == 0o600
        token = (default_state / "admin-token").read_text().strip()
        out = cli(
            home,
            server.url,
            "submit", "--queue", "default", "--tier", "3", "--gpus", str(gpus), "--lease", "0s", "--",
            sys.executable, str(EXAMPLES / "train_plain.py"), "--steps", "100000", "--step-seconds", "0.02",
            "--checkpoint-every", "20",
        )  # fmt: skip
        trainer = out.split()[-1]
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10, verify=server.tls()
        ) as c:
            until_state(c, trainer, "RUNNING", timeout=60)

            def saved() -> bool:
                attempts = c.get(f"/v1/jobs/{trainer}").json()["attempts"]
                return bool(attempts) and attempts[0]["checkpoints"] >= 2

            wait_for(saved, 60, "the trainer's checkpoints (in its checkpoint directory, as the job's uid)")
            assert (default_state / "jobs" / trainer / "checkpoints").stat().st_uid in owners
            cli(home, server.url, "submit", "--queue", "default", "--tier", "1", *preemptor, "--", "sleep", "1")  # fmt: skip

            def resumed() -> bool:
                job = c.get(f"/v1/jobs/{trainer}").json()
                if len(job["attempts"]) < 2 or job["state"] != "RUNNING":
                    return False
                return "resumed from step" in c.get(f"/v1/jobs/{trainer}/logs", params={"attempt": 2}).json()["text"]

            wait_for(resumed, 120, "the trainer preempted, running again and resumed from its checkpoint")
            ended = c.get(f"/v1/jobs/{trainer}").json()["attempts"][0]
            assert ended["exit_codes"] == [0] and ended["reason"] == "preempted", ended
            cli(home, server.url, "cancel", trainer)
            until_state(c, trainer, "CANCELLED", timeout=60)
    finally:
        server.stop()
        if executor == "slurm":
            request.getfixturevalue("slurm_cluster").cancel_all()
