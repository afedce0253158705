"""Waking the leader when another server stored something for it to act on.

A standby takes users' writes (submissions, cancels, approvals, releases) through the database;
without a word the leader finds them at its next pass, up to a second later. On PostgreSQL the
standby sends a notification on `CHANNEL` after such a write, and the leader, which listens on a
connection of its own while it leads, runs a pass at once. A notification carries nothing: the
database is what the pass reads. One lost (the leader reconnecting) costs only the wait for the
next pass. SQLite serves one server, which pokes its own loop: nothing to send there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine, text

log = logging.getLogger("warden.store")

CHANNEL = "warden_pass"
WAIT_S = 0.5
"""How long the listener waits for a notification before it looks whether it should stop."""
RETRY_S = 1.0
"""How long the listener waits before it connects again after losing its connection."""


def listens(engine: Engine) -> bool:
    """Whether servers on this database wake each other (PostgreSQL)."""
    return engine.dialect.name == "postgresql"


def wake_leader(engine: Engine) -> None:
    """Tell the leader, whichever server it is, to run a pass now."""
    if not listens(engine):
        return
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_notify(:channel, '')"), {"channel": CHANNEL})


def listen(engine: Engine, on_wake: Callable[[], None], stop: threading.Event) -> None:
    """Until `stop`: call `on_wake` once for each batch of notifications that arrived together.
    A lost connection is opened again every `RETRY_S`; the passes run on their interval
    meanwhile."""
    import psycopg  # PostgreSQL's driver: loaded only by a server on PostgreSQL

    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    while not stop.is_set():
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                while not stop.is_set():
                    woken = False
                    for _ in conn.notifies(timeout=WAIT_S, stop_after=1):
                        woken = True
                    if woken:
                        on_wake()
        except psycopg.Error as err:
            log.warning("listening for other servers' writes failed (passes run every second meanwhile): %s", err)
            stop.wait(RETRY_S)
