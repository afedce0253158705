"""Whether the PostgreSQL the server uses lets a process of this machine in without a password.

Jobs run on the server's machine. A PostgreSQL there that trusts local connections (`trust` in
pg_hba.conf for `local`, `host 127.0.0.1/32` or `host ::1/128`: what `initdb` writes without
`--auth`, and what some packages and containers set up) lets any job connect as warden's role
and rewrite what the server keeps: jobs, tokens, the lease. The server cannot read pg_hba.conf,
so it asks the database: it connects as it does (the same role, database and address) but with
a password that cannot be right. A server that lets that connection in did not ask for the
password. Where peer authentication may have let it in instead (a Unix socket, the role named
as this process's Unix user: the socket proves who connects, and a job runs as another user),
PostgreSQL 16 and later say which (`SYSTEM_USER` is NULL only under `trust`); an older one
cannot, and nothing is concluded.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import pwd
import secrets
import socket
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Engine

__all__ = ["FIX", "trust_warning", "trusted_address"]

log = logging.getLogger(__name__)

FIX = (
    "in pg_hba.conf give warden's role `scram-sha-256` (not `trust`) on the `local` line and on the "
    "`host` lines for 127.0.0.1/32 and ::1/128, then reload PostgreSQL (docs/security.md, *The database*)"
)
PROBE_TIMEOUT_S = 5


def _is_local(host: str) -> bool:
    """A Unix socket directory, or a name or address this machine reaches itself at."""
    if not host or host.startswith(("/", "@")) or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]).is_loopback for info in infos)


def _hosts(params: Mapping[str, Any]) -> list[str]:
    """The addresses libpq would try, as it picks them: `hostaddr`, else `host`, else $PGHOST,
    else the default Unix socket (an empty entry)."""
    value = params.get("hostaddr") or params.get("host") or os.environ.get("PGHOST") or ""
    given = value if isinstance(value, list | tuple) else str(value).split(",")
    return [str(h).strip() for h in given]


def trusted_address(engine: Engine) -> str | None:
    """The address (host:port, or the socket's directory) over which `engine`'s PostgreSQL let
    warden's role in with a wrong password, when it is one of this machine's (loopback or a
    Unix socket); None when it asked for the password, when the database is another machine's
    or not PostgreSQL, or when the probe could not tell."""
    if engine.dialect.name != "postgresql":
        return None
    _, params = engine.dialect.create_connect_args(engine.url)
    if not all(_is_local(h) for h in _hosts(params)):
        return None
    import psycopg

    probe = {k: v for k, v in params.items() if k not in ("password", "passfile")}
    probe["password"] = f"wrong-{secrets.token_hex(16)}"  # never the right one, never empty (libpq's defaults)
    probe["connect_timeout"] = PROBE_TIMEOUT_S
    try:
        with psycopg.connect(**probe) as conn:
            info = conn.info
            where = info.host if info.host.startswith("/") else f"{info.host}:{info.port}"
            if info.host.startswith("/") and info.user == _unix_user():
                if info.server_version < 160000:
                    return None  # peer may have let it in; this PostgreSQL cannot say
                row = conn.execute("SELECT system_user").fetchone()
                if row is not None and row[0] is not None:
                    return None  # peer (or ident, or a certificate) proved who connected
            return where
    except (psycopg.Error, OSError) as err:
        log.debug("the PostgreSQL trust probe was refused: %s", err)
        return None


def _unix_user() -> str | None:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


def trust_warning(engine: Engine) -> str | None:
    """What to log at start when `trusted_address` finds the database trusting this machine."""
    where = trusted_address(engine)
    if where is None:
        return None
    user = engine.url.username or _unix_user() or "?"
    return (
        f"WARNING: the PostgreSQL at {where} lets role {user!r} in without its password (it trusts "
        "connections from this machine), so any job running here can connect as warden and rewrite its "
        f"jobs, tokens and lease. Fix: {FIX}"
    )
