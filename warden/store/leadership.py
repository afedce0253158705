"""The leader's lease: which of the servers on one database leads, and the fencing token that
stops a leader which lost the lead from changing anything (docs/control-plane.md, "Several
servers").

One row of `leader_lease` (id 1) says who holds the lease, until when, and its `epoch`. A
server takes it (`Lease.acquire`) when nobody holds it or it expired, which raises `epoch` by
one: every change of holder gets a new, larger epoch. The holder renews it (`Lease.renew`)
every `RENEW_S`, to `LEASE_S` from then; a renewal succeeds only while the row still names
this holder and its epoch, so a holder that was paused past its lease and replaced learns it
there. Expiry is judged by the database's clock alone (`now()` on PostgreSQL, SQLite's own
'now'), never by a server's: servers on several machines need not agree on the time.

Fencing has two halves:

- **writes**: a store made with `Store.fenced(lease)` checks, inside every write transaction
  and before its first change, that the row still holds this server's epoch (`Lease.check_in`,
  a `SELECT … FOR SHARE`: a contender's takeover waits for the transaction, or the transaction
  sees the new epoch and raises `NotLeader`). The write and the check commit together or not
  at all, so nothing a replaced leader writes ever lands after its successor took over.
- **actions outside the database** (a signal, a start, a `scancel`): the holder may act only
  while its lease is valid by its own clock (`Lease.may_act`): until `LEASE_S − MARGIN_S`
  after it *sent* its last successful renewal. A contender takes over only once the database
  says the lease expired, which is at least `LEASE_S` after that renewal was sent, so the two
  never act at once (the clocks' rates, not their readings, must agree). The clock is
  CLOCK_BOOTTIME, which goes on while the machine sleeps and while the process is stopped.

Why 3 s and 1 s: a leader killed with SIGKILL is replaced when its lease runs out, at most
`LEASE_S` after its last renewal (at least `LEASE_S − RENEW_S` after the kill), plus a
standby's poll (`ACQUIRE_POLL_S`): under 3.3 s, leaving the rest of the 5 s goal for adopting
the running attempts and the first pass. A leader still holds after missing two renewals in a
row (a stall of up to 2 s: a slow disk, a long pause of the interpreter).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import ColumnElement, Connection, Engine, Table, func, literal_column, select, text, update
from sqlalchemy.exc import OperationalError

from warden.engine.durations import span
from warden.store.db import write_turn, writer
from warden.store.schema import LeaseRow

LEASE = cast(Table, LeaseRow.__table__)
LEASE_ID = 1

LEASE_S = 3.0
"""How long a lease lasts after it is taken or renewed, by the database's clock."""
RENEW_S = 1.0
"""How often the holder renews it."""
MARGIN_S = 0.5
"""How long before its lease ends, by its own clock, the holder stops acting outside the
database: room for the clocks' rates to differ and for the time a signal takes to leave."""
ACQUIRE_POLL_S = 0.25
"""How often a standby tries to take the lease."""
FENCED_IDLE_MS = 2000
"""PostgreSQL ends a fenced write transaction of the leader's that sits idle this long (the
process stopped with SIGSTOP in the middle of it): its share lock on the lease row would
otherwise keep every contender waiting for as long as the process stays stopped. Below
`LEASE_S − RENEW_S`, so it is gone before the lease runs out."""
LOCK_WAIT_MS = 5000
"""The longest a lease statement waits for the row's lock before giving up this round."""


def boottime() -> float:
    """Seconds since boot, counting the time the machine slept (monotonic otherwise)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class NotLeader(RuntimeError):
    """This server does not hold the lease (any more): what it was about to do, it must not.
    A leader that meets it steps down."""


@dataclass(frozen=True, slots=True)
class Holder:
    """One run of one server, as the lease row names it."""

    id: str
    host: str
    pid: int
    pid_started: int | None = None
    url: str = ""

    @classmethod
    def this_process(cls, url: str = "", pid_started: int | None = None) -> Holder:
        """This process, under an id no other run of any server will have (host, pid and a
        random part: a restart gets a new id, so it never mistakes its old lease for its own)."""
        host = socket.gethostname() or "localhost"
        pid = os.getpid()
        return cls(f"{host}:{pid}:{secrets.token_hex(4)}", host, pid, pid_started, url)


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The lease row as read, with the database's clock at the read (`now`)."""

    holder: str | None
    epoch: int
    expires_at: float
    acquired_at: float | None
    renewed_at: float | None
    host: str | None
    pid: int | None
    pid_started: int | None
    url: str | None
    now: float

    @property
    def live(self) -> bool:
        """Someone holds it and it has not run out."""
        return self.holder is not None and self.expires_at > self.now

    def describe(self) -> str:
        """The holder in words, for messages: who, where, and how fresh its lease is."""
        if self.holder is None:
            return "nobody holds the lease"
        where = f"pid {self.pid} on {self.host}" + (f", {self.url}" if self.url else "")
        if self.live:
            renewed = self.now - (self.renewed_at if self.renewed_at is not None else self.expires_at - LEASE_S)
            return f"{where} holds the lease (epoch {self.epoch}, renewed {span(renewed)} ago)"
        return f"{where} held the lease (epoch {self.epoch}) until {span(self.now - self.expires_at)} ago"


@dataclass(frozen=True, slots=True)
class _Term:
    epoch: int
    valid_until: float
    """By `Lease.clock`: until when this holder may act outside the database."""


class Watch(Protocol):
    """Whatever outlives a stall of this process and ends it when its lease ran out while it
    still led (`warden.server.watchdog.Watchdog`): told each deadline, by `Lease.clock`."""

    def arm(self, until: float) -> None: ...

    def disarm(self) -> None: ...

    def close(self) -> None: ...


LAPSE_POLL_S = 0.05
"""How often the lease's steward looks whether the term ran out unrenewed (`Lease._steward`)."""


class Lease:
    """One server's side of the lease: take it, renew it, give it back, and check it before
    acting (`may_act`, `check`) or writing (`check_in`). Thread-safe: the lease thread renews
    while the reconcile loop and the executor's timers check.

    A term ends by itself the moment it runs out unrenewed by this server's clock: a thread of
    the lease's own (the steward) steps down then, so that the server says at once that it does
    not lead, even while the thread that renews is stuck. With a `watch` (a process of its own,
    `warden.server.watchdog`), a server that cannot even do that, being stopped as a whole
    (SIGSTOP, a long stall), is killed before any other can take the lease over: it never acts
    again on what it decided while it led."""

    def __init__(
        self,
        engine: Engine,
        holder: Holder,
        *,
        lease_s: float = LEASE_S,
        margin_s: float = MARGIN_S,
        clock: Callable[[], float] = boottime,
        watch: Watch | None = None,
    ) -> None:
        if not 0 <= margin_s < lease_s:
            raise ValueError(f"margin_s: {margin_s!r} must be at least 0 and below lease_s ({lease_s!r})")
        self.engine = engine
        self.holder = holder
        self.lease_s = lease_s
        self.margin_s = margin_s
        self.clock = clock
        self.watch = watch
        self._writer = writer(engine)
        self._turn = write_turn(engine)
        """This process's writers' turns: the lease's writes go first (`WriteTurn`)."""
        self._term: _Term | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._steward_thread: threading.Thread | None = None
        self.lapsed: str | None = None
        """Why the last term ended by itself, when the steward ended it (None otherwise)."""
        self.last_seen: LeaseState | None = None
        """The row as the last `acquire` found it (who holds it when this server does not)."""

    # -- what this server holds ---------------------------------------------------------------

    @property
    def epoch(self) -> int | None:
        """The epoch of this server's term; None while it does not lead."""
        term = self._term
        return None if term is None else term.epoch

    @property
    def leading(self) -> bool:
        """Whether this server took the lease and has not lost or given it back since (its
        lease may have run out meanwhile: see `may_act`)."""
        return self._term is not None

    def may_act(self) -> bool:
        """Whether this server may act outside the database now: it leads, and its lease is
        valid by its own clock with `margin_s` to spare."""
        term = self._term
        return term is not None and self.clock() < term.valid_until

    def may_act_in(self, epoch: int) -> bool:
        """`may_act`, and in the term of `epoch`: what a term decided is never done in a later
        term of the same server."""
        term = self._term
        return term is not None and term.epoch == epoch and self.clock() < term.valid_until

    def term_fence(self, epoch: int) -> TermFence:
        """The fence of the term of `epoch`, for its store and its executor."""
        return TermFence(self, epoch)

    def check(self, what: str = "act") -> None:
        """`may_act`, or `NotLeader` naming what was refused."""
        term = self._term
        if term is None:
            raise NotLeader(f"{what}: this server does not lead ({self.holder.id})")
        late = self.clock() - term.valid_until
        if late >= 0:
            raise NotLeader(
                f"{what}: the lease of epoch {term.epoch} ran out {span(late + self.margin_s)} ago by this "
                f"server's clock and was not renewed since"
            )

    def check_in(self, conn: Connection, epoch: int | None = None) -> None:
        """Inside a write transaction, before its first change: the row must still hold this
        server's epoch (and `epoch`, when given), else `NotLeader` (and the transaction rolls
        back). The row is locked for share until the transaction ends, so a takeover either
        waits for it or is seen."""
        term = self._term
        if term is None:
            raise NotLeader(f"write refused: this server does not lead ({self.holder.id})")
        if epoch is not None and term.epoch != epoch:
            raise NotLeader(f"write refused: decided in epoch {epoch}, and this server's term is epoch {term.epoch}")
        columns: list[Any] = [LEASE.c.epoch, LEASE.c.holder]
        if conn.dialect.name == "postgresql":
            # One round trip: the idle limit of this transaction, and the check.
            columns.insert(0, func.set_config("idle_in_transaction_session_timeout", str(FENCED_IDLE_MS), True))
        row = conn.execute(select(*columns).where(LEASE.c.id == LEASE_ID).with_for_update(read=True)).first()
        if row is None:
            raise NotLeader("write refused: the database has no lease row (leader_lease id 1)")
        epoch, holder = row[-2], row[-1]
        if epoch != term.epoch or holder != self.holder.id:
            raise NotLeader(
                f"write refused: the lease is at epoch {epoch}, held by {holder}; this server's was epoch {term.epoch}"
            )

    # -- taking, keeping and giving it back ---------------------------------------------------

    def read(self) -> LeaseState:
        """The row as it is now, with the database's clock."""
        with self.engine.connect() as conn:
            return _read(conn, lock=False)

    def acquire(self, take_from: str | None = None) -> int | None:
        """Take the lease if nobody holds it or it ran out (or it is held by `take_from`, a
        holder the caller knows to be dead); returns the new epoch, or None when another holds
        it (`last_seen` says who) or a contender is taking it at this moment."""
        sent = self.clock()
        if not self._take(sent, take_from):
            return None
        term = self._term
        return None if term is None else term.epoch

    def _take(self, sent: float, take_from: str | None) -> bool:
        try:
            with self._turn.hold(urgent=True), self._writer.begin() as conn:
                _wait_at_most(conn, LOCK_WAIT_MS)
                seen = self.last_seen = _read(conn, lock=True)
                if seen.live and seen.holder != take_from:
                    return False
                now = db_now(conn)
                took = conn.execute(
                    update(LEASE)
                    .where(LEASE.c.id == LEASE_ID, LEASE.c.epoch == seen.epoch)
                    .values(
                        holder=self.holder.id,
                        epoch=seen.epoch + 1,
                        acquired_at=now,
                        renewed_at=now,
                        expires_at=now + self.lease_s,
                        host=self.holder.host,
                        pid=self.holder.pid,
                        pid_started=self.holder.pid_started,
                        url=self.holder.url or None,
                    )
                )
                if took.rowcount != 1:
                    return False
        except OperationalError as err:
            if _lock_timeout(err):
                return False
            raise
        with self._lock:
            self._term = _Term(seen.epoch + 1, sent + self.lease_s - self.margin_s)
            self.lapsed = None
            if self.watch is not None:  # before anything of the term can act: it learns its epoch from here
                self.watch.arm(self._term.valid_until)
            self._changed.notify_all()
        self._stewarding()
        return True

    def renew(self) -> bool:
        """Extend the lease to `lease_s` from now; False, and this server no longer leads, when
        the row holds another holder or epoch (it was taken over). A database error is raised:
        the caller retries while `may_act` still holds."""
        term = self._term
        if term is None:
            return False
        sent = self.clock()
        with self._turn.hold(urgent=True), self._writer.begin() as conn:
            _wait_at_most(conn, LOCK_WAIT_MS)
            now = db_now(conn)
            renewed = conn.execute(
                update(LEASE)
                .where(LEASE.c.id == LEASE_ID, LEASE.c.epoch == term.epoch, LEASE.c.holder == self.holder.id)
                .values(renewed_at=now, expires_at=now + self.lease_s)
            ).rowcount
        with self._lock:
            if self._term is None or self._term.epoch != term.epoch:
                return False  # stepped down meanwhile
            self._term = _Term(term.epoch, sent + self.lease_s - self.margin_s) if renewed == 1 else None
            if self.watch is not None:
                if self._term is not None:
                    self.watch.arm(self._term.valid_until)
                else:
                    self.watch.disarm()
            self._changed.notify_all()
        return renewed == 1

    def step_down(self) -> int | None:
        """Stop leading here at once (nothing is written); the epoch that ended, if any."""
        with self._lock:
            term, self._term = self._term, None
            if term is not None and self.watch is not None:
                self.watch.disarm()
            self._changed.notify_all()
        return None if term is None else term.epoch

    def _stewarding(self) -> None:
        """Start the steward once, with the first term."""
        with self._lock:
            if self._steward_thread is not None:
                return
            self._steward_thread = threading.Thread(target=self._steward, name="warden-lease-steward", daemon=True)
        self._steward_thread.start()

    def _steward(self) -> None:
        """End each term the moment it runs out unrenewed by this server's clock (stepping
        down, and so disarming the watch): the server says at once that it does not lead, and
        is not killed for a renewal that was merely stuck."""
        with self._lock:
            while True:
                term = self._term
                if term is None:
                    self._changed.wait()
                    continue
                left = term.valid_until - self.clock()
                if left > 0:
                    self._changed.wait(min(left, LAPSE_POLL_S))
                    continue
                self._term = None
                self.lapsed = f"the lease of epoch {term.epoch} ran out by this server's clock before it was renewed"
                if self.watch is not None:
                    self.watch.disarm()
                self._changed.notify_all()

    def release(self) -> None:
        """Step down and give the lease back, so that a standby takes over at once rather
        than when it runs out. Only this server's own epoch is given back."""
        epoch = self.step_down()
        if epoch is not None:
            self.give_back(epoch)

    def give_back(self, epoch: int) -> None:
        """Expire the lease now if the row still holds this server's `epoch` (after
        `step_down`); otherwise (taken over meanwhile) nothing."""
        with self._turn.hold(urgent=True), self._writer.begin() as conn:
            _wait_at_most(conn, LOCK_WAIT_MS)
            conn.execute(
                update(LEASE)
                .where(LEASE.c.id == LEASE_ID, LEASE.c.epoch == epoch, LEASE.c.holder == self.holder.id)
                .values(expires_at=db_now(conn))
            )


@dataclass(frozen=True, slots=True)
class TermFence:
    """One term's fence: its writes (`check_in`) and acts (`may_act`) pass only while this
    server leads in that term's epoch."""

    lease: Lease
    epoch: int

    def may_act(self) -> bool:
        return self.lease.may_act_in(self.epoch)

    def check_in(self, conn: Connection) -> None:
        self.lease.check_in(conn, self.epoch)


def db_now(conn: Connection) -> ColumnElement[float]:
    """The database's clock in epoch seconds, as an SQL expression (the lease's and the
    servers' table's only clock: the servers' clocks need not agree)."""
    if conn.dialect.name == "postgresql":
        return literal_column("CAST(extract(epoch from now()) AS double precision)")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


def _read(conn: Connection, *, lock: bool) -> LeaseState:
    query = select(LEASE, db_now(conn).label("db_now")).where(LEASE.c.id == LEASE_ID)
    row = conn.execute(query.with_for_update() if lock else query).first()
    if row is None:
        raise RuntimeError("the database has no lease row (leader_lease id 1): it was not migrated by warden")
    m = row._mapping
    return LeaseState(
        holder=m["holder"],
        epoch=int(m["epoch"]),
        expires_at=float(m["expires_at"]),
        acquired_at=m["acquired_at"],
        renewed_at=m["renewed_at"],
        host=m["host"],
        pid=m["pid"],
        pid_started=m["pid_started"],
        url=m["url"],
        now=float(m["db_now"]),
    )


def _wait_at_most(conn: Connection, ms: int) -> None:
    """PostgreSQL: give up on a row lock after `ms` (SQLite waits its busy timeout)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SET LOCAL lock_timeout = {int(ms)}"))


def _lock_timeout(err: OperationalError) -> bool:
    """Whether a PostgreSQL error is `lock_timeout` expiring (SQLSTATE 55P03)."""
    return getattr(err.orig, "sqlstate", None) == "55P03"
