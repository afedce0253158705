"""The servers of one database (docs/control-plane.md, "Several servers"): each running server
keeps a row of `servers`, keyed by its API's URL, so that the leader can give every job the
URLs of all of them to report to, and a job's reports reach the database after the server that
started it died.

A server writes its row at start and refreshes it every `BEAT_S` (`Roster.beat`, which reads
back the servers seen within `SEEN_S`), and deletes it when it stops (`Roster.leave`). Times
are the database's clock, as the lease's are. A row keeps the last run at its URL: a server
restarted at the same address takes its row over. Rows not seen for `FORGET_S` are deleted.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Engine, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from warden.store.db import writer
from warden.store.leadership import RENEW_S, Holder, db_now
from warden.store.schema import ServerRow

SERVERS = cast(Table, ServerRow.__table__)

BEAT_S = RENEW_S
"""How often a server refreshes its row: as often as a leader renews its lease."""
SEEN_S = 10.0
"""A server whose row was refreshed within this long counts as up (ten missed beats: a server
stalled or cut off from the database longer than that is left out of new jobs' lists)."""
FORGET_S = 86_400.0
"""A row not refreshed for a day is deleted (a server that was killed and never came back)."""


class Roster:
    """One server's side of the `servers` table."""

    def __init__(self, engine: Engine, holder: Holder, *, seen_s: float = SEEN_S, ca: str | None = None) -> None:
        """`ca`: the PEM certificate of the CA that signed this server's TLS certificate, when
        it is the server's own: what jobs given this server's URL must trust."""
        if not holder.url:
            raise ValueError("a server without a URL has no row in the servers table")
        self.holder = holder
        self.ca = ca
        self.cas: tuple[str, ...] = ()
        """The CAs of the servers the last `beat` saw, each once, in their URLs' order."""
        self.seen_s = seen_s
        self._writer = writer(engine)
        self._forgot = False

    def beat(self) -> tuple[str, ...]:
        """Write this server's row, seen now, and return the URLs of every server seen within
        `seen_s` (this one among them), in order."""
        h = self.holder
        row = {"holder": h.id, "host": h.host, "pid": h.pid, "ca": self.ca}
        try:
            with self._writer.begin() as conn:
                now = db_now(conn)
                if not self._forgot:
                    conn.execute(delete(SERVERS).where(SERVERS.c.seen_at < now - FORGET_S))
                changed = conn.execute(update(SERVERS).where(SERVERS.c.url == h.url).values(seen_at=now, **row))
                if changed.rowcount == 0:
                    conn.execute(insert(SERVERS).values(url=h.url, seen_at=now, **row))
                seen = conn.execute(
                    select(SERVERS.c.url, SERVERS.c.ca)
                    .where(SERVERS.c.seen_at >= now - self.seen_s)
                    .order_by(SERVERS.c.url)
                ).all()
        except IntegrityError:  # another run at this URL inserted it meanwhile: next time
            return ()
        self._forgot = True
        self.cas = tuple(dict.fromkeys(str(ca) for _, ca in seen if ca))
        return tuple(str(url) for url, _ in seen)

    def leave(self) -> None:
        """Delete this server's row, if it is still this run's (the server stops)."""
        with self._writer.begin() as conn:
            conn.execute(delete(SERVERS).where(SERVERS.c.url == self.holder.url, SERVERS.c.holder == self.holder.id))
