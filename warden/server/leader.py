"""Several servers on one database: which one leads, and what a server does while it leads
or stands by (docs/control-plane.md, "Several servers").

Every server contends for the lease (`warden.store.leadership.Lease`). The one that holds it
*leads* for one term (its epoch): it recovers what the previous leader left (as a restart
does), then runs the reconcile loop, the SIGKILL timers and every executor action, each write
fenced by the epoch and each action by the lease's validity in that term. The others *stand by*: they
answer the API from the database and take users' writes (submissions, cancels, approvals)
through it, and try to take the lease every `ACQUIRE_POLL_S`. A leader that loses the lease
(not renewed in time, taken over, a fenced write or action refused) steps down at once:
its loop stops, its executor is closed (timers and threads; never its jobs), and it stands by
and contends again like any other. A leader that cannot step down, its process stopped past its
lease, is killed by its watchdog before another may lead (`warden.server.watchdog`).

`Leading` is that loop; the service supplies what beginning and ending a term means.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from warden.executors.base import Devices, Exit, Fenced, Handle, LaunchSpec, Stopped, UnknownAttempt
from warden.executors.shim import process_alive, start_ticks
from warden.server.statedir import StateDirError
from warden.store.leadership import ACQUIRE_POLL_S, LEASE_S, RENEW_S, Holder, Lease, LeaseState, NotLeader

log = logging.getLogger("warden.server")

SQLITE_WAIT_S = LEASE_S + 2 * RENEW_S
"""How long a server on SQLite waits at start for a lease someone else holds to run out (a
server that was just stopped) before it refuses to start."""


def this_holder(url: str) -> Holder:
    """This server process as the lease names it."""
    return Holder.this_process(url, start_ticks(os.getpid()))


def gone_from_this_host(seen: LeaseState) -> bool:
    """Whether the lease's holder was a process of this machine that no longer runs (killed:
    its lease is still live for up to `LEASE_S`)."""
    if seen.holder is None or seen.host != this_holder("").host or seen.pid is None:
        return False
    return not process_alive(seen.pid, seen.pid_started)


def take_sqlite_lease(lease: Lease, database: str) -> int:
    """On SQLite, one server: take the lease at start, or refuse to start naming who holds it.
    A holder that was a process of this machine and is gone (killed with SIGKILL) is taken
    over at once; any other live holder is waited for `SQLITE_WAIT_S`, in case it was just
    stopping."""
    deadline = time.monotonic() + SQLITE_WAIT_S
    while True:
        epoch = lease.acquire()
        if epoch is not None:
            return epoch
        seen = lease.last_seen
        if seen is not None and gone_from_this_host(seen):
            epoch = lease.acquire(take_from=seen.holder)
            if epoch is not None:
                return epoch
        if time.monotonic() > deadline:
            who = seen.describe() if seen is not None else "another server holds the lease"
            raise StateDirError(
                f"database {database}: another warden server uses it ({who}). SQLite serves one server at a "
                "time: stop that one first. To run a leader and standbys that take over from each other, put "
                "them all on one PostgreSQL database (--db postgresql://USER@HOST/DB)."
            )
        time.sleep(ACQUIRE_POLL_S)


class Leading:
    """Contends for the lease, and while it holds it keeps it: `begin(epoch)` when a term
    starts, `end(why)` when it ends (the lease no longer held: the term's actions stopped
    first), `lost()` says why the term's own work stopped by itself (None while it runs),
    `standing_by()` after each try that did not take the lease."""

    def __init__(
        self,
        lease: Lease,
        begin: Callable[[int], None],
        end: Callable[[str], None],
        lost: Callable[[], str | None],
        take_from: Callable[[LeaseState], str | None] = lambda seen: None,
        standing_by: Callable[[], None] = lambda: None,
    ) -> None:
        self.lease = lease
        self._standing_by = standing_by
        self._begin = begin
        self._end = end
        self._lost = lost
        self._take_from = take_from
        self.terms = 0
        """How many terms this server has led."""
        self._epoch: int | None = None
        """The epoch of the term this server began and has not ended yet."""

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: contend while standing by, renew while leading. On `stop` a term in
        progress ends and the lease is given back, so a standby takes over at once."""
        try:
            if self.lease.leading and self.lease.renew():  # taken before the loop (SQLite, at start)
                self._start(self.lease.epoch or 0)
            while not stop.is_set():
                if self.lease.leading:
                    next_renewal = time.monotonic() + RENEW_S
                    self._keep()
                    if self.lease.leading:
                        stop.wait(max(0.0, next_renewal - time.monotonic()))
                        continue
                if self._epoch is not None:  # the lease's steward ended the term by itself
                    self._stop_leading(self.lease.lapsed or "the lease ran out before it was renewed", self._epoch)
                if not self._contend():
                    self._follow()
                    stop.wait(ACQUIRE_POLL_S)
        finally:
            if self.lease.leading or self._epoch is not None:
                self._stop_leading("the server is stopping", self._epoch)

    def _contend(self) -> bool:
        """Try to take the lease (and begin a term); whether this server leads now."""
        seen = self.lease.last_seen
        try:
            epoch = self.lease.acquire(take_from=self._take_from(seen) if seen is not None else None)
        except Exception as err:  # the database away: a standby keeps trying
            log.warning("could not contend for the lead: %s", err)
            return False
        if epoch is None:
            return False
        self._start(epoch)
        return self.lease.leading

    def _follow(self) -> None:
        """What a standby keeps up with between two tries (the policy in force)."""
        try:
            self._standing_by()
        except Exception as err:
            log.warning("a standby could not follow the database: %s", err)

    def _start(self, epoch: int) -> None:
        self.terms += 1
        self._epoch = epoch
        log.warning("this server leads now (epoch %d)", epoch)
        try:
            self._begin(epoch)
        except (NotLeader, Fenced) as err:
            self._stop_leading(f"its term began and was refused at once: {err}")
        except Exception:
            log.exception("beginning the term of epoch %d failed; stepping down", epoch)
            self._stop_leading("beginning its term failed")

    def _keep(self) -> None:
        """Renew the lease, or step down: when it was taken over, when the term's work stopped
        by itself, and when it could not be renewed for as long as it lasts."""
        epoch = self.lease.epoch
        why = self._lost()
        if why is not None:
            self._stop_leading(why)
            return
        try:
            if self.lease.renew():
                return
            lapsed = self.lease.lapsed
            self._stop_leading(lapsed or f"the lease was taken over ({self._seen()})", epoch)
        except Exception as err:
            if self.lease.may_act():
                log.warning("renewing the lease failed (retrying while it lasts): %s", err)
                return
            self._stop_leading(f"the lease could not be renewed before it ran out: {err}")

    def _seen(self) -> str:
        try:
            return self.lease.read().describe()
        except Exception as err:
            return f"the lease could not be read: {err}"

    def _stop_leading(self, why: str, lost_epoch: int | None = None) -> None:
        """Stop acting at once (the lease's local checks refuse from here on), end the term,
        then give the lease back if the row still holds this server's epoch (`lost_epoch`: the
        term's epoch when the lease has ended the term already: taken over, or run out by this
        server's clock, when the row may still be this server's until it runs out there)."""
        epoch = self.lease.step_down() or lost_epoch
        self._epoch = None
        try:
            self._end(why)
        finally:
            log.warning("this server stands by now (epoch %s ended: %s)", epoch, why)
            if epoch is not None:
                try:
                    self.lease.give_back(epoch)  # nothing when another holds it now
                except Exception as err:  # it runs out by itself
                    log.warning("giving the lease of epoch %d back failed: %s", epoch, err)


class StandbyExecutor:
    """The executor of a server that does not lead: it runs and tracks nothing. A cancel sent
    to a standby finds the attempt untracked here (`UnknownAttempt`), so it is recorded and its
    SIGTERM left to the leader's next pass (`Cancels.cancels_pending`)."""

    def _refuse(self, what: str) -> Fenced:
        return Fenced(f"{what}: this server stands by; the leader acts")

    def start(self, spec: LaunchSpec) -> Handle:
        raise self._refuse(f"start attempt {spec.attempt} of job {spec.job_id}")

    def terminate(self, job_id: str, attempt: int, grace_s: float) -> float:
        raise UnknownAttempt((job_id, attempt))

    def kill(self, job_id: str, attempt: int) -> None:
        raise UnknownAttempt((job_id, attempt))

    def started(self) -> list[tuple[str, int]]:
        return []

    def exits(self) -> list[Exit]:
        return []

    def devices(self, job_id: str, attempt: int) -> Devices | None:
        return None

    def stopped(self) -> dict[tuple[str, int], Stopped]:
        return {}

    def adopt(self, handle: Handle, kill_at: float | None = None) -> None:
        raise self._refuse(f"adopt attempt {handle.attempt} of job {handle.job_id}")

    def recover(self, job_id: str, attempt: int, log_dir: Path, replicas: int) -> Handle | None:
        raise self._refuse(f"recover attempt {attempt} of job {job_id}")

    def cancel_unowned(self, owned: Iterable[tuple[str, int]]) -> list[str]:
        raise self._refuse("cancel what no attempt owns")

    def running(self) -> list[tuple[str, int]]:
        return []

    def watch(self, wake: Callable[[], None]) -> None:
        pass

    def fence(self, may_act: Callable[[], bool]) -> None:
        pass

    def close(self) -> None:
        pass
