"""Opening the control plane's database and bringing its schema up to date.

SQLite is the embedded default (one file in the user's state directory); PostgreSQL is for
production. Both get connection settings that make an answered request durable: on SQLite a
write-ahead log with `synchronous=FULL`, so a transaction whose commit returned is on disk
before the server answers; on PostgreSQL the server's own defaults (`synchronous_commit=on`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, make_url

from warden.paths import default_state_dir, make_dirs

if TYPE_CHECKING:
    from alembic.config import Config

SqliteSync = Literal["FULL", "NORMAL"]

WRITE_OPTION = "warden_write"
"""Execution option marking a connection that will write. On SQLite its transactions start
with BEGIN IMMEDIATE (take the write lock first, wait up to busy_timeout for it) instead of a
deferred BEGIN that could fail half-way with SQLITE_BUSY when it tries to upgrade to a write."""

BUSY_TIMEOUT_MS = 5000
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")
MIGRATE_LOCK_KEY = 0x77617264656E  # "warden": PostgreSQL advisory lock serializing migrations
HEAD_REVISION = "0020"
"""The newest migration's revision (tests/store/test_migrations.py checks that it is Alembic's
head). A database already there is not handed to Alembic: a server (re)starting on it skips
Alembic's import and its scan of the migration scripts."""
VERSION_TABLE = "alembic_version"


def state_dir() -> Path:
    """The default state directory (`warden.paths.default_state_dir`), created when missing."""
    path = default_state_dir()
    make_dirs(path)
    return path


def default_url(directory: Path | None = None) -> str:
    """SQLite file `warden.db` in `directory` (default: the state directory): what a server
    uses when told no URL."""
    return f"sqlite:///{(directory or state_dir()) / 'warden.db'}"


def normalize_url(url: str | URL) -> URL:
    """Pin PostgreSQL URLs to psycopg 3: `postgresql://` and `postgres://` name no driver, and
    SQLAlchemy would otherwise pick psycopg2, which warden does not depend on."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def connect(url: str | URL | None = None, *, sqlite_synchronous: SqliteSync = "FULL", **engine_kw: Any) -> Engine:
    """An Engine for `url` (default: `default_url()`), with warden's connection settings.

    `sqlite_synchronous` exists for measurements (docs/store.md); keep FULL in production.
    """
    parsed = normalize_url(url if url is not None else default_url())
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engine = create_engine(parsed, **engine_kw)
        _configure_sqlite(engine, sqlite_synchronous)
    elif backend == "postgresql":
        engine_kw.setdefault("pool_pre_ping", True)
        engine = create_engine(parsed, **engine_kw)
    else:
        raise ValueError(
            f"database url: unsupported backend {backend!r} in {parsed.render_as_string()!r}; "
            "use sqlite:///PATH or postgresql://USER@HOST/DB"
        )
    return engine


def _configure_sqlite(engine: Engine, synchronous: SqliteSync) -> None:
    """Set the pragmas on every new DBAPI connection, and take over BEGIN from the driver.

    Python's sqlite3 module (3.11) opens transactions itself, lazily and only before DML, so
    reads and DDL would run outside them; with `isolation_level = None` it stops, and the
    "begin" listener below issues BEGIN DEFERRED or BEGIN IMMEDIATE (see WRITE_OPTION).
    """
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"sqlite_synchronous: expected FULL or NORMAL, got {synchronous!r}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = "IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")


def secure_sqlite_files(engine: Engine) -> None:
    """Make the SQLite database and its -wal/-shm/-journal files readable by this uid only
    (0600): it holds every job's `env` and the token hashes. SQLite creates the side files with
    the database's mode; this also fixes files left by an older install. Nothing on PostgreSQL."""
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.chmod(url.database + suffix, 0o600)
        except FileNotFoundError:
            continue


def writer(engine: Engine) -> Engine:
    """The same pool, marked for writing (see WRITE_OPTION); a no-op on PostgreSQL."""
    return engine.execution_options(**{WRITE_OPTION: True})


class WriteTurn:
    """Whose turn it is to write to one SQLite database, among this process's threads.

    SQLite admits one writer at a time and makes the others poll with growing sleeps (its busy
    handler); writers queued here instead get the database the moment a commit ends. An urgent
    writer (the lease's renewal) goes before every queued one: a lease that must be renewed
    every second never polls behind a backlog of submissions, passes and reports, which would
    end the term while nothing is wrong. PostgreSQL queues its writers itself: there a turn is
    taken at once."""

    def __init__(self, queued: bool) -> None:
        self._queued = queued
        self._changed = threading.Condition()
        self._busy = False
        self._urgent = 0
        self.waiting = 0
        """How many writers wait for the turn now."""

    @contextmanager
    def hold(self, urgent: bool = False) -> Iterator[None]:
        """The turn for the body of the `with` (not reentrant)."""
        if not self._queued:
            yield
            return
        with self._changed:
            self._urgent += urgent
            self.waiting += 1
            try:
                while self._busy or (self._urgent and not urgent):
                    self._changed.wait()
            finally:
                self._urgent -= urgent
                self.waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()


_TURNS: weakref.WeakKeyDictionary[Any, WriteTurn] = weakref.WeakKeyDictionary()
_TURNS_LOCK = threading.Lock()


def write_turn(engine: Engine) -> WriteTurn:
    """The one `WriteTurn` of `engine`'s database in this process: every engine on the same
    pool (`writer`'s, a fenced store's, the lease's) shares it."""
    with _TURNS_LOCK:
        turn = _TURNS.get(engine.pool)
        if turn is None:
            turn = _TURNS[engine.pool] = WriteTurn(engine.dialect.name == "sqlite")
        return turn


def alembic_config() -> Config:
    """Alembic's configuration for the migrations shipped in this package: no alembic.ini needed.

    Pass a live connection in `config.attributes["connection"]`; `env.py` then uses it.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    return config


def migrate(engine: Engine) -> None:
    """Upgrade the database to the newest schema, in one transaction. Idempotent.

    Concurrent callers are serialized (SQLite: the write lock; PostgreSQL: an advisory lock),
    so two servers starting at once do not both try to create the tables.
    """
    with writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK_KEY})
        if _revision(conn) == HEAD_REVISION:
            return
        from alembic import command

        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


def _revision(conn: Connection) -> str | None:
    """The migration the database is at, as Alembic records it (one row in `VERSION_TABLE`)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def current_revision(engine: Engine) -> str | None:
    """The migration the database is at; None for a database never migrated."""
    with engine.connect() as conn:
        return _revision(conn)
