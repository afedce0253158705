"""The terms a server leads, with a lease (`warden.server.leader`): what beginning and ending a
term means, and how a standby keeps up with the database between two tries for the lead.

A term is a reconciler of its own on the fenced store and a fenced executor: what it decided is
done in that term or not at all. Between terms user actions go through the standby's
reconciler, which acts on nothing, to the database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from warden.engine.policy import Policy, PolicyError, parse_policy
from warden.executors.base import Executor, Fenced
from warden.server.leader import Leading
from warden.server.nodes import recorded_inventory
from warden.server.reconcile import Reconciler
from warden.server.serving import ServiceContext, Term, log
from warden.store.leadership import NotLeader
from warden.store.repo import Store
from warden.store.wakeups import listen, listens

FOLLOW_S = 1.0
"""How often a standby reads the policy in force, the cluster and the fair-share ledger."""


class Terms:
    """Begins and ends this server's terms and follows the database while it stands by; the
    reconciler each term runs is made by `make_reconciler` (the service's, sharing its lock)."""

    def __init__(
        self,
        ctx: ServiceContext,
        executor: Executor,
        make_executor: Callable[[], Executor] | None,
        make_reconciler: Callable[[Store, Executor, Policy], Reconciler],
    ) -> None:
        self.ctx = ctx
        self._spare: Executor | None = executor if ctx.lease is not None else None
        """The executor of this server's first term, until one begins."""
        self._make_executor = make_executor
        self._make_reconciler = make_reconciler
        self._next_follow = 0.0
        """When a standby next reads the cluster and the ledger (`follow`, monotonic clock)."""

    @property
    def epoch(self) -> int | None:
        """The epoch of this server's term while it leads; None otherwise (and without a lease)."""
        term = self.ctx.term
        return term.epoch if term is not None and self.ctx.leading else None

    @property
    def role(self) -> Literal["leader", "standby"]:
        return "leader" if self.ctx.leading else "standby"

    def leader_url(self) -> str | None:
        """The API of the server that leads, as far as this one knows (None: unknown, none)."""
        if self.ctx.leading:
            return self.ctx.url or None
        seen = self.ctx.lease.last_seen if self.ctx.lease is not None else None
        return seen.url if seen is not None and seen.live else None

    def leading(self) -> Leading:
        """The loop that contends for the lease and begins and ends the terms (`start`)."""
        assert self.ctx.lease is not None
        return Leading(self.ctx.lease, self.begin, self.end, self.lost, standing_by=self.follow)

    def begin(self, epoch: int) -> None:
        """This server leads, in term `epoch`: a reconciler of its own on the fenced store and
        a fenced executor, the stored policy, then recovery as after a restart (adopting every
        running attempt, re-arming each SIGKILL deadline from the database) and the loop."""
        ctx = self.ctx
        assert ctx.lease is not None
        executor = self._spare if self._spare is not None else self._make_executor() if self._make_executor else None
        self._spare = None
        if executor is None:
            raise RuntimeError("no executor for a new term: the service was given no make_executor")
        fence = ctx.lease.term_fence(epoch)  # what this term decided is done in this term or not at all
        executor.fence(fence.may_act)
        rec = self._make_reconciler(ctx.store.fenced(fence), executor, self.stored_policy())
        rec.follow_policy = self.newer_policy
        term = Term(epoch, rec, executor, threading.Event())
        with ctx.lock:
            ctx.term, ctx.reconciler = term, rec
        # Recovery runs in the term's own thread: the lease thread goes on renewing meanwhile,
        # however many attempts there are to adopt.
        term.thread = threading.Thread(target=self._run, args=(term,), name="warden-reconcile", daemon=True)
        term.thread.start()

    def _run(self, term: Term) -> None:
        """The term's thread: recovery, then the loop, until the term ends or is refused."""
        ctx = self.ctx
        assert ctx.lease is not None
        rec = term.reconciler
        try:
            rec.recover()
        except (NotLeader, Fenced) as err:
            rec.lost = f"recovery was refused: {err}"
            return
        except Exception as err:
            log.exception("recovery at the start of epoch %d failed", term.epoch)
            rec.lost = f"recovery failed: {type(err).__name__}: {err}"
            return
        try:
            with rec.lock:
                rec.follower.record(rec.cluster, ctx.now())
        except (NotLeader, Fenced) as err:
            rec.lost = f"recording the cluster was refused: {err}"
            return
        term.executor.watch(rec.poke)
        if listens(ctx.store.engine):  # a standby's writes wake this term's loop
            threading.Thread(
                target=listen, args=(ctx.store.engine, rec.poke, term.stop), name="warden-wakeups", daemon=True
            ).start()
        rec.run(term.stop, gate=ctx.lease.term_fence(term.epoch).may_act)

    def end(self, why: str) -> None:
        """The term ends (the lease is no longer held): its loop stops, its executor is closed
        (timers and threads; the jobs run on, the next leader adopts them), and user actions go
        to the database again."""
        ctx = self.ctx
        term = ctx.term
        if term is None:
            return
        term.stop.set()
        term.reconciler.poke()
        if term.thread is not None and term.thread is not threading.current_thread():
            term.thread.join(timeout=30)
            if term.thread.is_alive():
                log.error("the reconcile loop of epoch %d did not stop within 30 s; it is fenced", term.epoch)
        term.executor.close()
        assert ctx.standby is not None
        with ctx.lock:
            ctx.standby.ctx.policy = term.reconciler.policy
            ctx.term, ctx.reconciler = None, ctx.standby
        log.warning("term of epoch %d ended: %s", term.epoch, why)

    def lost(self) -> str | None:
        """Why the term's loop stopped by itself (refused a write or an action), else None."""
        term = self.ctx.term
        if term is None or term.thread is None or term.thread.is_alive() or term.stop.is_set():
            return None
        return term.reconciler.lost or "the reconcile loop ended"

    def follow(self) -> None:
        """A standby keeps up with the database, every `FOLLOW_S` between two tries for the
        lead: the policy in force (another server may have applied one), its API's checks and
        answers being against it; the cluster as the leader records it (nodes down,
        GPUs held by others) and the fair-share ledger as the leader saved it, which its dry
        runs and `warden nodes` read, and the snapshot its expected-start forecasts start from
        (a standby runs no pass, so the snapshot is the database's as it is then)."""
        ctx = self.ctx
        standby = ctx.standby
        if standby is None or ctx.term is not None or time.monotonic() < self._next_follow:
            return
        self._next_follow = time.monotonic() + FOLLOW_S
        newer = self.newer_policy()
        if newer is not None:
            standby.set_policy(newer)
        inventory = recorded_inventory(ctx.store.nodes())
        ledger = ctx.store.load_ledger().to_engine()
        with ctx.lock:
            if ctx.term is not None:
                return
            if inventory.nodes and inventory != standby.cluster:
                standby.follower.take(inventory)
            standby.charging.ledger = ledger
            now = ctx.now()
            standby.last_planned = (standby.snapshots.live(now), now)

    def stored_policy(self) -> Policy:
        """The policy in force in the database (another server may have applied one)."""
        current = self.ctx.store.current_policy()
        if current is None:
            return self.ctx.policy
        self.ctx.policy_version = current.version
        return parse_policy(current.source, f"stored policy version {current.version}")

    def newer_policy(self) -> Policy | None:
        """A policy applied since the loop's (on any server), or None."""
        version = self.ctx.store.policy_version()
        if version is None or version == self.ctx.policy_version:
            return None
        try:
            return self.stored_policy()
        except PolicyError as err:
            self.ctx.policy_version = version  # not again every pass
            log.error("stored policy version %s does not load; keeping the one in force: %s", version, err)
            return None

    def close(self) -> None:
        """The first term's executor, should no term have begun (the server stops)."""
        if self._spare is not None:
            self._spare.close()
