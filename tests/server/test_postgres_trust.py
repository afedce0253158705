"""A PostgreSQL on the server's machine that lets warden's role in without its password is
warned about at start, naming the fix; one that asks for the password is not. A real
PostgreSQL (tests/pg.py: trust for everyone) with two roles of this test's: one it trusts, and
one pg_hba.conf gives `scram-sha-256` on its socket and on 127.0.0.1; real server processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pg import PostgresServer, postgres_server  # noqa: F401  (fixtures)
from serverproc import Server

from warden.store import connect
from warden.store.pgtrust import FIX, trust_warning, trusted_address

POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"


@dataclass
class Role:
    name: str
    password: str
    database: str

    def url(self, pg: PostgresServer, socket: bool = False) -> str:
        where = f"?host={pg.socket_dir}" if socket else ""
        return f"postgresql+psycopg://{self.name}:{self.password}@127.0.0.1:{pg.port}/{self.database}{where}"


@pytest.fixture
def roles(postgres_server: PostgresServer) -> Iterator[tuple[Role, Role]]:
    """(trusted, checked): two login roles with passwords and a database each; pg_hba.conf asks
    the second for its password (its lines first: the first matching line decides)."""
    tag = uuid.uuid4().hex[:10]
    trusted = Role(f"trusted_{tag}", f"pw-{uuid.uuid4().hex}", f"db_trusted_{tag}")
    checked = Role(f"checked_{tag}", f"pw-{uuid.uuid4().hex}", f"db_checked_{tag}")
    for role in (trusted, checked):
        postgres_server.execute(f"CREATE ROLE {role.name} LOGIN PASSWORD '{role.password}'")
        postgres_server.execute(f"CREATE DATABASE {role.database} OWNER {role.name}")
    hba = postgres_server.data_dir / "pg_hba.conf"
    original = hba.read_text()
    lines = [
        f"{kind} all {checked.name} {addr} scram-sha-256" for kind, addr in (("local", ""), ("host", "127.0.0.1/32"))
    ]
    hba.write_text("\n".join(lines) + "\n" + original)
    postgres_server.execute("SELECT pg_reload_conf()")
    try:
        yield trusted, checked
    finally:
        hba.write_text(original)
        postgres_server.execute("SELECT pg_reload_conf()")
        for role in (trusted, checked):
            postgres_server.drop_database(role.database)
            postgres_server.execute(f"DROP ROLE IF EXISTS {role.name}")


@pytest.mark.parametrize("socket", [False, True], ids=["127.0.0.1", "unix-socket"])
def test_the_check_finds_a_trusting_server_and_not_one_that_asks(
    postgres_server: PostgresServer,
    roles: tuple[Role, Role],
    socket: bool,
) -> None:
    trusted, checked = roles
    engine = connect(trusted.url(postgres_server, socket))
    expected = str(postgres_server.socket_dir) if socket else f"127.0.0.1:{postgres_server.port}"
    assert trusted_address(engine) == expected
    engine.dispose()

    engine = connect(checked.url(postgres_server, socket))
    with engine.connect():  # the right password is taken ...
        pass
    assert trusted_address(engine) is None  # ... and a wrong one refused
    assert trust_warning(engine) is None
    engine.dispose()


def test_a_server_on_a_trusting_postgresql_warns_at_start_naming_the_fix(
    tmp_path: Path,
    postgres_server: PostgresServer,
    roles: tuple[Role, Role],
) -> None:
    tmp_path.chmod(0o711)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    trusted, checked = roles
    logs = {}
    for role in (trusted, checked):
        server = Server(tmp_path / role.name, policy=policy, db=role.url(postgres_server)).start(timeout=60)
        try:
            assert server.log is not None
            logs[role.name] = " ".join(server.log.read_text().split())
        finally:
            server.stop()
    warned = logs[trusted.name]
    assert (
        f"WARNING: the PostgreSQL at 127.0.0.1:{postgres_server.port} lets role '{trusted.name}' in without "
        "its password" in warned
    ), warned
    assert FIX in warned and "scram-sha-256" in warned and "::1/128" in warned
    assert trusted.password not in warned
    assert "without its password" not in logs[checked.name], logs[checked.name]
