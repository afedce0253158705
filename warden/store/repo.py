"""The repository: every read and write the control plane makes, one short transaction each.

`Store` wraps an Engine and holds no other state, so one instance may be shared by threads.
Reads return plain frozen dataclasses (never live ORM objects): they can cross threads, be
cached and compared, and cannot lazily hit the database after the transaction is gone. JSON
lists come back as tuples; JSON objects as fresh dicts the caller owns.

Its methods live by what they store, one module each, all on the one transaction helper of
`warden.store.base`: jobs, attempts and events (`warden.store.jobs`), tokens and the audit
trail (`warden.store.tokens`), policies (`warden.store.policies`), the ledger, history and
preemptions (`warden.store.history`) and nodes (`warden.store.nodes`).
"""

from __future__ import annotations

import copy
import threading
from typing import cast

from sqlalchemy import Table, insert, select

from warden.store.base import Fence, _advisory_lock
from warden.store.db import connect, migrate
from warden.store.history import HistoryStore
from warden.store.jobs import JobStore
from warden.store.nodes import NodeStore
from warden.store.policies import PolicyStore
from warden.store.schema import MetaRow
from warden.store.tokens import TokenStore

META = cast(Table, MetaRow.__table__)
SECRET_LOCK_KEY = 0x7761726465_6E03
"""PostgreSQL advisory lock: two servers' first `shared_secret` store one secret."""


class Store(JobStore, TokenStore, PolicyStore, HistoryStore, NodeStore):
    """The control plane's database. Every method is one transaction; see the module docstring."""

    @classmethod
    def open(cls, url: str | None = None, *, upgrade: bool = True) -> Store:
        """Connect to `url` (default: the user's SQLite file) and, unless told not to, migrate."""
        engine = connect(url)
        if upgrade:
            migrate(engine)
        return cls(engine)

    def fenced(self, fence: Fence) -> Store:
        """This store as a leader writes through it: every write transaction first checks
        `fence` (the lease's epoch, `warden.store.leadership.Lease.check_in`) and commits
        nothing once another server took the lead. It shares the engine and, on SQLite, the
        queue of writers; `submit` stays unfenced (a user's submission is never refused for
        who leads)."""
        other = copy.copy(self)
        other.fence = fence
        other._active = {}
        other._active_lock = threading.Lock()
        return other

    def close(self) -> None:
        """Close the pooled connections."""
        self.engine.dispose()

    # --- the database itself --------------------------------------------------------------------

    def database_id(self) -> str:
        """The database's identity, made once by its migration: what a state directory is bound to."""
        with self._read() as conn:
            value = conn.execute(select(META.c.value).where(META.c.key == "database_id")).scalar_one_or_none()
        if value is None:
            raise RuntimeError("the database has no database_id in its meta table: it was not migrated by warden")
        return str(value)

    def shared_secret(self, key: str, candidate: bytes) -> bytes:
        """The secret `key` of the `meta` table, every server's alike: `candidate` is stored
        and returned when the database has none yet (the first server to ask), else the
        stored one is returned."""
        with self._write() as conn:
            _advisory_lock(conn, SECRET_LOCK_KEY)
            value = conn.execute(select(META.c.value).where(META.c.key == key)).scalar_one_or_none()
            if value is None:
                conn.execute(insert(META).values(key=key, value=candidate.hex()))
                return candidate
        return bytes.fromhex(str(value))
