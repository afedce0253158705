"""What the service's collaborators share: the store, the clock, the state directory, the loop's
lock, the lease and the term this server leads, and a few small helpers.

Each duty behind the API (leadership terms, submissions, job actions, SDK reports, governance,
authentication, logs, the thread watch) is an object of its own module, and all of them are
handed one `ServiceContext`, as the reconcile loop's duties share a `ReconcileContext`. The
`Terms` change what moves with the lead (the term, the reconciler it runs), so every
collaborator reads the current value rather than the one it was built with.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from warden.engine.model import Node
from warden.engine.policy import Policy
from warden.executors.base import Executor
from warden.server.errors import ApiError
from warden.server.metrics import ServerMetrics
from warden.server.reconcile import Reconciler
from warden.server.requests import stored_id
from warden.store.jobs import StoredJob
from warden.store.leadership import Lease
from warden.store.repo import Store
from warden.store.wakeups import wake_leader

log = logging.getLogger("warden.server")
"""Every collaborator logs under the server's name, as the service always has."""


@dataclass(eq=False)
class Term:
    """One term this server leads: its epoch, its reconciler and executor, and its loop."""

    epoch: int
    reconciler: Reconciler
    executor: Executor
    stop: threading.Event
    thread: threading.Thread | None = None


@dataclass(eq=False)
class ServiceContext:
    """The state every collaborator of the service reads, in one place so that a change made by
    one (a term begun or ended, a policy applied) is what the others read next."""

    store: Store
    clock: Callable[[], float]
    state_dir: Path
    url: str
    """This server's API: where the jobs it starts send their reports first."""
    lease: Lease | None
    """The lease this server contends for; None: it leads alone."""
    lock: threading.RLock
    """The reconcile loop's lock, one for every term's reconciler (`Reconciler.lock`)."""
    metrics: ServerMetrics
    reconciler: Reconciler
    """The reconciler of the term this server leads, else the standby's (`Terms`)."""
    standby: Reconciler | None = None
    """A standby's reconciler: it runs no pass and acts on nothing (`StandbyExecutor`); user
    actions go through it to the database."""
    term: Term | None = None
    policy_version: int | None = None
    """The stored policy version the leader's loop runs (`Terms.newer_policy`)."""
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when the server stops, or when one of its helper threads died (`ThreadWatch`)."""

    def now(self) -> float:
        return self.clock()

    @property
    def policy(self) -> Policy:
        return self.reconciler.policy

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node of the cluster, down ones included (a job that fits only there waits)."""
        return self.reconciler.cluster.nodes

    @property
    def leading(self) -> bool:
        """Whether this server leads now (always, without a lease): it began a term and its
        lease is valid by its own clock, in that term. A term whose lease ran out is not led
        any more, even before it has ended (a server that was stalled says so at once)."""
        if self.lease is None:
            return True
        term = self.term
        return term is not None and self.lease.may_act_in(term.epoch)

    def job(self, job_id: str) -> StoredJob:
        job = self.store.get(stored_id("job", job_id))
        if job is None:
            raise ApiError(404, "id", job_id, "no such job")
        return job

    def reread(self, job: StoredJob) -> StoredJob:
        """The job as it is now (as it was, should it have been purged meanwhile)."""
        return self.store.get(job.id) or job

    def changed(self) -> None:
        """A user's write is stored: a pass soon, here or, from a standby, on the leader."""
        self.reconciler.poke()
        if self.leading:
            return
        try:
            wake_leader(self.store.engine)
        except Exception as err:  # the leader's next pass finds the write anyway
            log.warning("could not wake the leader: %s", err)
