"""Assembling the server: store, executor, nodes, policy, tokens, the reconcile loop and the
HTTP app; `serve` runs it under uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from warden.engine.overcommit import quota_warnings
from warden.engine.policy import Policy, default_policy, load_policy, parse_policy
from warden.executors import registry
from warden.executors.identity import DEFAULT_JOB_UIDS, Identities
from warden.paths import default_state_dir, make_dirs
from warden.runtime import tune_collector
from warden.server.api import (
    build_router,
    install_error_handlers,
    install_request_limits,
    install_role_header,
    metrics_route,
)
from warden.server.auth import DEFAULT_TOKEN_LIFETIME_S
from warden.server.connections import connection_settings, listening
from warden.server.forecasts import INTERVAL_S as FORECAST_INTERVAL_S
from warden.server.history import INTERVAL_S as HISTORY_INTERVAL_S
from warden.server.leader import take_sqlite_lease, this_holder
from warden.server.listen import inherited_sockets, listen_sockets
from warden.server.service import Service
from warden.server.statedir import bind_database, check_reachable, interpreter_warning, lock_server
from warden.server.tls import (
    ServerTls,
    admin_certificate,
    fingerprint,
    no_certificate,
    own_certificate,
    serving_names,
)
from warden.server.ui import mount_ui
from warden.server.watchdog import Watchdog
from warden.store.db import connect, default_url, migrate, secure_sqlite_files
from warden.store.leadership import Lease
from warden.store.nodes import NodeRecord
from warden.store.pgtrust import trust_warning
from warden.store.repo import Store

log = logging.getLogger("warden.server")


@dataclass(frozen=True)
class Settings:
    db: str | None = None
    policy: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8765
    advertise_url: str | None = None  # where jobs and the other servers reach it; default from host and port
    fake_gpus: int | None = None
    state_dir: Path | None = None
    bootstrap_token: str | None = None
    run_as: Literal["dynamic", "user"] = "dynamic"  # who jobs run as when the server is root
    job_uids: range = DEFAULT_JOB_UIDS
    user_map: tuple[tuple[str, str], ...] = ()  # (warden user or "*", Unix account), for run_as="user"
    executor: str = registry.DEFAULT  # the name of a kind in `warden.executors.registry.KINDS`
    slurm_partition: str | None = None  # default: the cluster's default partition
    ray_address: str | None = None  # the Ray cluster's head, for executor="ray"
    ray_trust_unauthenticated: bool = False  # govern a Ray cluster without token authentication
    history_interval_s: float = HISTORY_INTERVAL_S  # between the samples of GET /v1/history
    forecast_interval_s: float = FORECAST_INTERVAL_S  # between two forecasts of expected starts
    token_lifetime_s: float | None = DEFAULT_TOKEN_LIFETIME_S  # of a token created without one; None: never
    private_data: Literal["jobs", "none"] = "jobs"  # "jobs": other users' commands, workdirs and logs hidden
    tls_cert: Path | None = None  # an admin's certificate (PEM, its chain after it); default: the server's own
    tls_key: Path | None = None  # its key
    plain_http: bool = False  # serve plain HTTP: tokens cross the network in clear (docs/service.md)

    def __post_init__(self) -> None:
        registry.kind(self.executor)  # UnknownExecutor, a ValueError, for a name no executor has

    @property
    def scheme(self) -> str:
        return "http" if self.plain_http else "https"


def _policy(store: Store, path: Path | None, now: float) -> Policy:
    """The policy file given at start (a new version when it differs), else the stored one,
    else the default."""
    current = store.current_policy()
    if path is not None:
        policy = load_policy(path)  # refuses a file that cannot be read or is not UTF-8
        source = path.read_text(encoding="utf-8")
        if current is None or current.source != source:
            version = store.apply_policy(source, policy.to_dict(), "server", now)
            store.audit("server", "policy.apply", f"file/{path}", {"version": version}, now)
        return policy
    if current is not None:
        return parse_policy(yaml.safe_load(current.source), "stored policy")
    policy = default_policy()
    store.apply_policy(yaml.safe_dump(policy.to_dict(), sort_keys=False), policy.to_dict(), "server", now)
    return policy


def _warn(message: str, say: Callable[[str], None]) -> None:
    """Say it, and into the server's log too, where one is configured."""
    if log.hasHandlers():
        log.warning(message)
    say(message)


def _say_containment(line: str, unbounded: bool, say: Callable[[str], None]) -> None:
    """The executor's containment line at start: a warning where something is left unbounded."""
    if unbounded:
        _warn(f"WARNING: containment: {line}", say)
    else:
        say(f"containment: {line}")


def job_identities(settings: Settings, say: Callable[[str], None]) -> Identities:
    """Who jobs run as. Only root can run them as anyone else; a server that is not root says
    loudly that its jobs can do whatever it can (docs/security.md)."""
    if os.geteuid() != 0:
        message = (
            f"WARNING: the server is not root, so jobs run as its own uid {os.geteuid()}: they can read its "
            "database, tokens and report secret and signal it (see docs/security.md)"
        )
        _warn(message, say)
        return Identities.fixed()
    identities = Identities(settings.run_as, settings.job_uids, dict(settings.user_map))
    say(identities.describe())
    for account, users in identities.shared_accounts().items():
        whose = ", ".join("every user not mapped" if u == "*" else u for u in users)
        _warn(
            f"WARNING: the jobs of {whose} all run as the account {account}: each can read the others' "
            "environment (report tokens and secrets included) and files, and signal them; map users to "
            "accounts of their own to keep them apart (docs/security.md)",
            say,
        )
    return identities


def secure_state_dir(state: Path, jobs_switch_uid: bool) -> None:
    """The state directory is the server's alone: 0700, or 0711 when jobs run as other uids
    (they must pass through it to their own checkpoint directory, never list or read it).
    Files an older install left readable (secrets, logs) are made 0600, directories 0711."""
    os.chmod(state, 0o711 if jobs_switch_uid else 0o700)
    jobs = state / "jobs"
    jobs.mkdir(exist_ok=True)
    os.chmod(jobs, 0o711)
    for name in ("admin-token", "report-secret", "ca.key", "server.key"):
        _chmod(state / name, 0o600)
    for job in jobs.iterdir():
        if not job.is_dir() or job.is_symlink():
            continue
        _chmod(job, 0o711)
        for attempt in job.glob("attempt-*"):
            _chmod(attempt, 0o711)
            for path in attempt.iterdir():
                if path.is_file() and not path.is_symlink():
                    _chmod(path, 0o600)
        checkpoints = job / "checkpoints"
        if checkpoints.is_dir() and checkpoints.stat().st_uid == os.geteuid():
            _chmod(checkpoints, 0o700)


def _chmod(path: Path, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except FileNotFoundError:
        pass


def _tokens(store: Store, bootstrap: str | None, state: Path, now: float, say: Callable[[str], None]) -> None:
    """The operator's admin token: the bootstrap token, else one made at the first start into
    `admin-token`. Neither expires (`--token-lifetime` is for the tokens made through the
    API): either can be revoked (`warden token revoke`)."""
    if bootstrap:
        store.ensure_token(bootstrap, "admin", "admin", ["*"], now)
        return
    if store.list_tokens():
        return
    token = store.create_token("admin", "admin", ["*"], "server", now)
    path = state / "admin-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    store.audit("server", "token.create", "user/admin", {"role": "admin", "file": str(path)}, now)
    say(f"created the first admin token; it is in {path} (the CLI on this machine reads it from there)")


def build_service(
    settings: Settings, say: Callable[[str], None] = print, contend: bool = False, ca_pem: str | None = None
) -> Service:
    """The service `settings` describe. With `contend` (a server process, `serve`) it leads
    only while it holds the database's lease (`warden.server.leader`): on SQLite it takes the
    lease now or refuses to start, on PostgreSQL it starts as a standby and contends. Without,
    it leads from `start` to `stop` (in-process use). `ca_pem`: the server's own CA, which the
    jobs it starts trust (`Peers.trusted_cas`)."""
    import time

    state = settings.state_dir or default_state_dir()
    make_dirs(state)
    identities = job_identities(settings, say)
    secure_state_dir(state, identities.switching)
    check_reachable(state, identities, say=lambda line: _warn(line, say))
    warning = interpreter_warning(identities)
    if warning is not None:
        _warn(warning, say)
    url = settings.db or default_url(state)
    engine = connect(url)
    migrate(engine)
    secure_sqlite_files(engine)
    trusting = trust_warning(engine)  # a PostgreSQL that lets jobs in as warden
    if trusting is not None:
        _warn(trusting, say)
    store = Store(engine)
    api_url = settings.advertise_url or f"{settings.scheme}://{_url_host(settings.host)}:{settings.port}"
    lease: Lease | None = None
    if contend:
        # Where another server may take the lease over (PostgreSQL), a watchdog kills this one
        # should it stall past its lease; on SQLite no other server runs while this one lives.
        watch = Watchdog() if engine.dialect.name != "sqlite" else None
        lease = Lease(engine, this_holder(api_url), watch=watch)
        if engine.dialect.name == "sqlite":
            take_sqlite_lease(lease, make_url(url).render_as_string(hide_password=True))
        else:
            say(f"standing by for the lead on {make_url(url).render_as_string(hide_password=True)}")
    bind_database(state, store.database_id(), url)
    now = time.time()
    built = registry.kind(settings.executor).build(settings, identities, state, say)
    if built.containment is not None:
        _say_containment(built.containment.line, built.containment.unbounded, say)
    nodes = built.nodes
    if lease is None:  # else the leader records them, each term (a standby writes nothing of the cluster)
        store.replace_nodes(NodeRecord.from_engine(n, updated_at=now) for n in nodes)
    policy = _policy(store, settings.policy, now)
    for w in quota_warnings(policy, nodes):
        _warn(f"WARNING: {w.headline}. {w.message}", say)
    _tokens(store, settings.bootstrap_token, state, now, say)
    service = Service(
        store,
        built.executor,
        nodes,
        policy,
        state,
        url=api_url,
        inventory=built.inventory,
        history_interval_s=settings.history_interval_s,
        forecast_interval_s=settings.forecast_interval_s,
        token_lifetime_s=settings.token_lifetime_s,
        private_data=settings.private_data,
        lease=lease,
        make_executor=built.make_executor if lease is not None else None,
        ca_pem=ca_pem,
    )
    _chmod(state / "report-secret", 0o600)
    return service


def _url_host(host: str) -> str:
    """The host of the URL jobs on this machine use to reach a server listening on `host`."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def server_tls(settings: Settings, state: Path) -> ServerTls | None:
    """What the server serves HTTPS with (`warden.server.tls`); None for plain HTTP."""
    if settings.plain_http:
        no_certificate(state)
        return None
    if settings.tls_cert is not None and settings.tls_key is not None:
        return admin_certificate(state, settings.tls_cert, settings.tls_key)
    advertised = urlsplit(settings.advertise_url).hostname if settings.advertise_url else None
    return own_certificate(state, serving_names(settings.host, advertised))


def create_app(service: Service) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(
        title="warden",
        version="0.1.0",
        lifespan=lifespan,
        description="A scheduler for shared GPU clusters that governs preemption.",
        # FastAPI's /docs and /redoc pages load their scripts from a CDN; nothing on this origin
        # does. `/openapi.json` describes the API.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    install_request_limits(app, service)
    install_role_header(app, service)
    # The /v1 routes join the app's own: an included router would build each route's models a
    # second time, at the first request.
    app.router.routes.extend(build_router(service).routes)
    metrics_route(app, service)
    mount_ui(app)  # the dashboard, /ui/ (docs/dashboard.md)
    return app


def serve(settings: Settings, say: Callable[[str], None] = print) -> None:
    import uvicorn

    tune_collector()
    os.umask(0o077)  # whatever the server creates is its own: database, secrets, logs
    state = settings.state_dir or default_state_dir()
    # The address first: a server refused for a busy port leaves no state directory behind.
    inherited = inherited_sockets()
    sockets = inherited or listen_sockets(settings.host, settings.port)
    try:
        make_dirs(state)
        # Held until the process exits: the kernel releases them however it ends.
        locks = lock_server(state, settings.db or default_url(state), settings.port)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    tls = server_tls(settings, state)
    service = build_service(settings, say, contend=True, ca_pem=tls.ca_pem if tls is not None else None)
    gpus = sum(n.gpus for n in service.nodes)
    shown = ", ".join(_shown(sock) for sock in sockets) + ("; sockets from systemd" if inherited else "")
    say(
        f"warden serving on {service.url} ({shown}) — {gpus} GPU(s), policy with "
        f"{len(service.policy.leaves())} leaf queue(s), state in {service.state_dir}"
    )
    if tls is None:
        _warn(
            "WARNING: --plain-http: tokens and jobs' data cross the network in clear, and any process that takes "
            'this port while the server is down receives the tokens clients send (docs/service.md, "HTTPS")',
            say,
        )
    elif tls.ca_file is not None and tls.ca_pem is not None:
        say(f"TLS: the server's own CA {tls.ca_file} (SHA-256 {fingerprint(tls.ca_pem)}); clients trust it")
    try:
        config = uvicorn.Config(
            create_app(service),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            ssl_certfile=str(tls.cert_file) if tls is not None else None,
            ssl_keyfile=str(tls.key_file) if tls is not None else None,
            ssl_context_factory=(lambda _config, _default: tls.context()) if tls is not None else None,
            **connection_settings(),
        )
        # bounds: warden.server.connections
        uvicorn.Server(config).run(sockets=[listening(sock, tls=tls is not None) for sock in sockets])
    finally:
        for sock in sockets:
            sock.close()
        for lock in locks:
            lock.release()


def _shown(sock: socket.socket) -> str:
    address = sock.getsockname()
    return f"[{address[0]}]:{address[1]}" if sock.family == socket.AF_INET6 else f"{address[0]}:{address[1]}"
