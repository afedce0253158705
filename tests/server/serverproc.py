"""A real warden server in a child process, on a free port, with fake GPUs — for end-to-end
tests. Waits on conditions with timeouts, never on fixed sleeps."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from warden.server.service import Service

ADMIN = "admin-secret-token"

#: Who jobs run as when the tests run as root: every warden user's jobs as `nobody`, one
#: unprivileged account, so that files a job writes for the test stay writable by its next
#: attempt. tests/server/test_privilege.py checks the default, a uid per attempt.
AS_NOBODY = ("--run-as", "user", "--user-map", "*=nobody")


PROBE = httpx.Client(timeout=2, verify=False)
"""One client for the tests' short probes (health), shared across threads: making a client
costs ~20 ms of CPU (its TLS context), which a probe every 20 ms would pay each time. It does
not check certificates: a probe carries no token and only asks whether a server answers."""

_CAS: dict[str, Path] = {}
"""The CA certificate of each server these tests started, by its URL (`cli` gives a child the
CAs of the servers its `WARDEN_URL` names)."""


_TEMPLATE: list[Path] = []
"""A database this process migrated once, that `seed_database` copies."""


def seed_database(path: Path) -> None:
    """Where no database is yet, put a migrated one, with an identity of its own: what a
    server makes at its first start, without its Alembic run (~0.5 s of CPU per start, some
    250 starts in the suite). A server on it skips the migrations, as on any database at the
    head; migrating from nothing is what tests/store does, and the tests that start
    `warden server` themselves."""
    import sqlite3
    import tempfile
    import uuid
    from contextlib import closing

    if path.exists():
        return
    if not _TEMPLATE:
        from warden.store.db import connect, migrate

        made = Path(tempfile.mkdtemp(prefix="warden-db-template-")) / "warden.db"
        engine = connect(f"sqlite:///{made}")
        migrate(engine)
        engine.dispose()
        _TEMPLATE.append(made)
    with closing(sqlite3.connect(_TEMPLATE[0])) as source, closing(sqlite3.connect(path)) as copy:
        source.backup(copy)
        with copy:
            copy.execute("UPDATE meta SET value = ? WHERE key = 'database_id'", (str(uuid.uuid4()),))
    os.chmod(path, 0o600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition", interval: float = 0.1
) -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@dataclass
class Server:
    state_dir: Path
    policy: Path | None = None
    gpus: int | None = 4  # fake GPUs; None: the executor's own nodes (Slurm's)
    db: str | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    run_as: tuple[str, ...] = AS_NOBODY
    args: tuple[str, ...] = ()  # more options for `warden server`
    bootstrap: bool = True  # pass ADMIN in $WARDEN_BOOTSTRAP_TOKEN
    env: dict[str, str] = field(default_factory=dict)  # more environment (SLURM_CONF, WARDEN_EXECUTOR)
    state_option: bool = True  # False: no --state-dir, the server picks its default (`state_dir` says which)
    log_dir: Path | None = None  # where the server's log goes (default: the state directory)
    sockets: tuple[socket.socket, ...] = ()  # listening sockets handed over as systemd does (LISTEN_FDS)
    nofile: int | None = None  # the server's RLIMIT_NOFILE, soft and hard (default: this process's)
    seeded: bool = True  # a new state directory's database comes migrated already (`seed_database`)

    @property
    def plain_http(self) -> bool:
        return "--plain-http" in self.args

    @property
    def url(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        """What its clients trust: the server's own CA certificate (in its state directory), or
        the chain given in `--tls-cert` (the tests' certificates carry their CA)."""
        if "--tls-cert" in self.args:
            return Path(self.args[self.args.index("--tls-cert") + 1])
        return self.state_dir / "ca.crt"

    def tls(self) -> ssl.SSLContext | bool:
        """What an httpx client checks this server's certificate with."""
        return True if self.plain_http else ssl.create_default_context(cafile=self.ca)

    def start(self, timeout: float = 30) -> Server:
        """Start the server; return once it answers (`timeout`: how long that may take)."""
        if self.state_option:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if self.db is None and self.seeded:
                seed_database(self.state_dir / "warden.db")
        args = [
            sys.executable,
            "-m",
            "warden.cli.main",
            "server",
            "--port",
            str(self.port),
            *(("--fake-gpus", str(self.gpus)) if self.gpus is not None else ()),
            *(("--state-dir", str(self.state_dir)) if self.state_option else ()),
            *(self.run_as if os.geteuid() == 0 else ()),
            *self.args,
        ]
        if self.policy is not None:
            args += ["--policy", str(self.policy)]
        if self.db is not None:
            args += ["--db", self.db]
        self.log = (self.log_dir or self.state_dir) / f"server-{self.port}-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
        env.update(self.env)
        if self.bootstrap:
            env["WARDEN_BOOTSTRAP_TOKEN"] = ADMIN  # a secret: never on the command line
        fds: tuple[int, ...] = ()
        if self.sockets:  # at 3, 4, … with LISTEN_PID the server's own pid: bash (multi-digit fds) execs it
            fds = tuple(s.fileno() for s in self.sockets)
            moves = " ".join(f"{3 + i}<&{fd}" for i, fd in enumerate(fds))
            env["LISTEN_FDS"] = str(len(fds))
            args = ["/bin/bash", "-c", f'LISTEN_PID=$$ exec "$@" {moves}', "bash", *args]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=fds,
                preexec_fn=self._limits if self.nofile else None,
            )
        try:
            wait_for(self._healthy, timeout, f"the server on {self.url} (log {self.log})")
            if not self.plain_http:
                _CAS[self.url] = self.ca
        except BaseException:
            if self.proc.poll() is None:  # never left behind: the test's teardown does not know it
                self.proc.kill()
                self.proc.wait(10)
            raise
        return self

    def _limits(self) -> None:
        """In the child, before it runs the server: its descriptor limit."""
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited {self.proc.returncode}: {self.log.read_text() if self.log else ''}")
        try:
            return PROBE.get(f"{self.url}/v1/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10, verify=self.tls())


def self_signed(directory: Path, name: str = "127.0.0.1") -> Path:
    """A self-signed certificate for the address `name` (nobody's server: a squatter's) and its
    key, as `cert.pem` and `key.pem` in `directory`; the certificate's path."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(name))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return directory / "cert.pem"


def cas(*servers: Server) -> str:
    """The CA certificates of `servers`, as one PEM text (what `WARDEN_CA` and `Client(ca=)` take)."""
    return "".join(s.ca.read_text() for s in servers if not s.plain_http)


def health(server: Server) -> dict[str, Any]:
    """The server's `GET /v1/health`, or {} while it does not answer."""
    try:
        r = PROBE.get(f"{server.url}/v1/health")
    except httpx.TransportError:
        return {}
    return dict(r.json()) if r.status_code == 200 else {}


def leading(servers: list[Server], after_epoch: int = 0) -> tuple[Server, int] | None:
    """The server that leads in an epoch after `after_epoch` and has made its first pass there
    (`passes` in its health: a new term starts counting from 0), and that epoch; None while
    none has."""
    for server in servers:
        h = health(server)
        if h.get("role") == "leader" and (h.get("epoch") or 0) > after_epoch and h.get("passes", 0) >= 1:
            return server, int(h["epoch"])
    return None


def cli(
    url: str, *args: str, token: str | None = ADMIN, check: bool = False, columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    """`warden ARGS` in a child process with `WARDEN_URL=url` (one server's or a list),
    `WARDEN_TOKEN=token`, `WARDEN_CA` the CAs of the servers `url` names, none of this
    process's other WARDEN_ variables, and `COLUMNS` when given; with `check`, exit 0 is
    asserted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    env["WARDEN_URL"] = url
    cas = [ca.read_text() for one in url.split(",") if (ca := _CAS.get(one.strip().rstrip("/"))) and ca.exists()]
    if cas:
        env["WARDEN_CA"] = "".join(cas)
    if token:
        env["WARDEN_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def submit(c: httpx.Client, **body: Any) -> str:
    """POST a job (in this directory unless told); its id."""
    body.setdefault("workdir", os.getcwd())
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def until_state(c: httpx.Client, job_id: str, *states: str, timeout: float = 20) -> dict[str, Any]:
    """The job, once it is in one of `states`."""
    return wait_for(
        lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["state"] in states and j, timeout, f"job {job_id} in {states}"
    )


def started(tmp_path: Path, policy_text: str, **kw: Any) -> Server:
    """A server with this policy, state under `tmp_path`, started."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    return Server(tmp_path / "state", policy=policy, **kw).start()


def server_fixture(policy_text: str, **kw: Any) -> Any:
    """A pytest fixture (`server = server_fixture(POLICY)` in a test module): a server with this
    policy in the test's `tmp_path`, started; stopped after the test, and the processes of the
    jobs it started killed."""
    import pytest

    @pytest.fixture
    def server(tmp_path: Path) -> Iterator[Server]:
        s = started(tmp_path, policy_text, **kw)
        try:
            yield s
        finally:
            s.stop()
            kill_leftovers(tmp_path)

    return server


def shared_server_fixture(policy_text: str, **kw: Any) -> Any:
    """A pytest fixture like `server_fixture`, but one server for every test of the module that
    asks for it: for tests whose requests are refused or only read, so that no test sees what
    another one did. (Under root, its directory is one every job uid may pass, as `tmp_path`'s.)"""
    import tempfile

    import pytest

    @pytest.fixture(scope="module")
    def shared_server(tmp_path_factory: pytest.TempPathFactory, _jobs_base: Path | None) -> Iterator[Server]:
        base = (
            Path(tempfile.mkdtemp(prefix="shared-", dir=_jobs_base))
            if _jobs_base
            else tmp_path_factory.mktemp("shared")
        )
        if _jobs_base:
            os.chmod(base, 0o777)
        s = started(base, policy_text, **kw)
        try:
            yield s
        finally:
            s.stop()
            kill_leftovers(base)

    return shared_server


def kill_leftovers(tmp_path: Path) -> None:
    """Job processes outlive the server by design; end the ones this test started."""
    kill_jobs_of(tmp_path / "state")


def kill_jobs_of(state_dir: Path) -> None:
    """SIGKILL the process group of every job attempt a server with this state directory ran."""
    for status in state_dir.glob("jobs/*/attempt-*/**/*"):
        if status.is_file() and status.suffix == ".json" and "status" in status.name:
            try:
                pgid = json.loads(status.read_text()).get("pgid")
                if pgid:
                    os.killpg(int(pgid), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def end_everything(svc: Service) -> None:
    """Cancel what is unfinished and SIGKILL what still runs in an in-process service,
    recording the exits, so that no job process outlives the test."""
    from warden.server.auth import Principal
    from warden.server.errors import ApiError

    root = Principal("root", "admin", ("*",))
    for active in svc.store.active():
        try:
            svc.actions.cancel(active.job.job_id, root)
        except ApiError:
            pass
    for job_id, attempt in svc.executor.running():
        svc.executor.kill(job_id, attempt)
    deadline = time.monotonic() + 10
    while svc.executor.running() and time.monotonic() < deadline:
        svc.reconciler.reconcile()
        time.sleep(0.01)
