"""What every part of `Store` shares: the one transaction helper and the small helpers of rows.

Writes on SQLite start with BEGIN IMMEDIATE (see `warden.store.db.WRITE_OPTION`), so two
writers queue on the lock instead of failing half-way; on PostgreSQL a row is locked with
SELECT ... FOR UPDATE where a compare-and-set needs it, and submissions take an advisory lock.
A leader's store (`Store.fenced`) checks its lease's epoch in every write transaction.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from typing import Any, Protocol

from sqlalchemy import Connection, CursorResult, Engine, Row, text

from warden.store.db import write_turn, writer


class Fence(Protocol):
    """What a fenced store checks in each write transaction (`warden.store.leadership.Lease`)."""

    def check_in(self, conn: Connection) -> None:
        """Raise (rolling the transaction back) unless the writer still leads."""
        ...


class StoreBase:
    """The engine and the transactions every part of `Store` runs in: `_write` for one that
    changes rows, `_read` for one that only reads them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.fence: Fence | None = None
        """Checked at the start of every write transaction (a leader's store); None: unfenced."""
        self._writer = writer(engine)
        self._turn = write_turn(engine)

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        # This process's writers take turns (`WriteTurn`): on SQLite each gets the database
        # the moment the last commit ends, and the lease's renewal before any of them.
        with self._turn.hold(), self._writer.begin() as conn:
            if self.fence is not None:
                self.fence.check_in(conn)
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn


def _new_id(result: CursorResult[Any]) -> int:
    """The autoincrement key of the row a single-row INSERT created."""
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise RuntimeError("the database returned no key for the inserted row")
    return int(key[0])


def _advisory_lock(conn: Connection, key: int) -> None:
    """Serialize a read-then-write on PostgreSQL until commit. SQLite needs nothing: its
    writers already hold the database's single write lock (BEGIN IMMEDIATE)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


_READ_CHUNK = 500
"""Ids per `IN (...)` when re-reading changed rows (well under every backend's bound)."""


def _str_list(name: str, items: Sequence[str]) -> builtins.list[str]:
    if isinstance(items, str) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{name}: expected a list of strings, got {items!r}")
    return builtins.list(items)


def _record(cls: Any, row: Row[Any]) -> Any:
    """A dataclass whose fields are all columns of `row`, with JSON objects copied."""
    m = row._mapping
    return cls(**{f.name: (dict(m[f.name]) if isinstance(m[f.name], dict) else m[f.name]) for f in fields(cls)})
