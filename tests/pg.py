"""A real PostgreSQL server for tests, from Debian's `postgresql` package.

Import the fixtures into a test module (`from pg import fresh_postgres_url, postgres_url`):

- `postgres_server` (session): `initdb` into a temporary directory and `pg_ctl start` on a free
  port on 127.0.0.1 (socket in the same directory), `fsync=off` for speed, trust auth; stopped
  with `pg_ctl stop -m fast` at the end of the session. As root the server runs as the
  `postgres` system user (PostgreSQL refuses to run as root).
- `postgres_url` (session): a database `warden_test` on it.
- `fresh_postgres_url` (function): a database of its own for one test, dropped afterwards.

Without the server binaries the fixtures skip, with how to install them, unless
WARDEN_REQUIRE_POSTGRES=1 (CI sets it), where they fail: CI must never pass by skipping.
Under pytest-xdist each worker starts its own server.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

PG_ROOT = Path("/usr/lib/postgresql")
REQUIRE_ENV = "WARDEN_REQUIRE_POSTGRES"
INSTALL_HINT = (
    "PostgreSQL server binaries not found under /usr/lib/postgresql/<major>/bin; "
    "install them with `apt-get install postgresql` to run the PostgreSQL tests"
)
FAST_SETTINGS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
"""Throwaway data: skip every flush. Pass `settings=""` to `start_server` for a durable server."""
READY_TIMEOUT_S = 60.0
START_TRIES = 5
"""Another process may take the free port between choosing it and the server binding it."""


def find_bin_dir(root: Path = PG_ROOT) -> Path | None:
    """The newest major version's bin directory that has initdb, pg_ctl and pg_isready."""
    found: list[tuple[int, Path]] = []
    for bin_dir in root.glob("*/bin"):
        major = bin_dir.parent.name
        if major.isdigit() and all((bin_dir / tool).is_file() for tool in ("initdb", "pg_ctl", "pg_isready")):
            found.append((int(major), bin_dir))
    return max(found)[1] if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    """A running server and how to reach it."""

    bin_dir: Path
    base_dir: Path
    port: int = 0
    run_as: list[str] = field(default_factory=list)
    """Command prefix that runs a server tool as its owner (`runuser -u postgres --` as root)."""

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "socket"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "server.log"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def tool(
        self, name: str, *args: str | Path, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run a server tool as the server's owner; on failure raise with its output."""
        argv = [*self.run_as, str(self.bin_dir / name), *map(str, args)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}{self.log_tail()}"
            )
        return done

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\nserver log:\n" + "\n".join(text.splitlines()[-lines:])

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database, autocommit=True, connect_timeout=10
        ) as conn:
            conn.execute(sql.encode())  # a composed statement of our own, not user input

    def create_database(self, name: str) -> str:
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server_owner() -> list[str]:
    """As root: the prefix that runs tools as `postgres`; otherwise none (we are the owner)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail(
            "running as root but there is no `postgres` system user to run the server as; "
            "reinstall Debian's postgresql package",
            pytrace=False,
        )
    return ["runuser", "-u", "postgres", "--"]


def _give_to_owner(path: Path, run_as: list[str]) -> None:
    if run_as:
        owner = pwd.getpwnam("postgres")
        os.chown(path, owner.pw_uid, owner.pw_gid)


def wait_until_ready(server: PostgresServer, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll `pg_isready` until the server accepts connections; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done = server.tool(
            "pg_isready", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-t", "2", check=False
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"PostgreSQL on port {server.port} not ready after {timeout:.0f}s: "
                f"{done.stdout.strip()}{server.log_tail()}"
            )
        time.sleep(0.1)


def start_server(bin_dir: Path, settings: str = FAST_SETTINGS) -> PostgresServer:
    """initdb and start a throwaway server; the caller must `stop_server` it."""
    run_as = _server_owner()
    # As root the directory must be reachable by `postgres`: /tmp is, a private $TMPDIR may not be.
    base = Path(tempfile.mkdtemp(prefix="warden-pg-", dir="/tmp" if run_as else None))
    server = PostgresServer(bin_dir=bin_dir, base_dir=base, run_as=run_as)
    server.socket_dir.mkdir()
    for path in (base, server.socket_dir):
        _give_to_owner(path, run_as)
    server.tool(
        "initdb",
        "-D",
        server.data_dir,
        "-U",
        "postgres",
        "--auth=trust",
        "--encoding=UTF8",
        "--no-sync",
        "--no-instructions",
    )
    error = ""
    for _ in range(START_TRIES):
        server.port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {server.port} -k {server.socket_dir} {settings}"
        started = server.tool(
            "pg_ctl",
            "start",
            "-D",
            server.data_dir,
            "-l",
            server.log_file,
            "-w",
            "-t",
            str(int(READY_TIMEOUT_S)),
            "-o",
            options,
            check=False,
        )
        if started.returncode == 0:
            wait_until_ready(server)
            return server
        error = started.stdout + started.stderr + server.log_tail()
    shutil.rmtree(base, ignore_errors=True)
    raise RuntimeError(f"could not start PostgreSQL after {START_TRIES} tries:\n{error}")


def stop_server(server: PostgresServer) -> None:
    try:
        server.tool("pg_ctl", "stop", "-D", server.data_dir, "-m", "fast", "-w", check=False)
    finally:
        shutil.rmtree(server.base_dir, ignore_errors=True)


def _bin_dir_or_skip() -> Path:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {INSTALL_HINT}", pytrace=False)
        pytest.skip(f"{INSTALL_HINT} (set {REQUIRE_ENV}=1 to make their absence an error)")
    return bin_dir


class _Shared:
    """One server per test process, however many modules import the fixtures.

    A fixture imported into two modules is two fixture definitions to pytest, each with its
    own session cache; counting users here keeps them on one server, stopped by the last.
    """

    server: PostgresServer | None = None
    users = 0
    databases: ClassVar[set[str]] = set()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = _bin_dir_or_skip()
    if _Shared.server is None:
        _Shared.server = start_server(bin_dir)
        _Shared.databases = set()
    _Shared.users += 1
    try:
        yield _Shared.server
    finally:
        _Shared.users -= 1
        if _Shared.users == 0:
            server, _Shared.server = _Shared.server, None
            stop_server(server)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """`postgresql+psycopg://postgres@127.0.0.1:PORT/warden_test` on the session's server."""
    name = "warden_test"
    if name not in _Shared.databases:
        postgres_server.create_database(name)
        _Shared.databases.add(name)
    return postgres_server.url(name)


@pytest.fixture
def fresh_postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A database of its own for one test, dropped (connections and all) afterwards."""
    name = f"warden_{uuid.uuid4().hex[:16]}"
    url = postgres_server.create_database(name)
    try:
        yield url
    finally:
        postgres_server.drop_database(name)
