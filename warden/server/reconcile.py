"""The reconcile loop: the engine driven by the real clock (DESIGN §1, §5).

On every change (a submission, an exit, a cancel, an approval — `poke`) and at least once a
second, one pass runs this fixed sequence under one lock:

1. **exits** — attempts whose every process is gone end: a preempted job is requeued
   (`PREEMPTING → REQUEUED → PENDING`, with the policy's requeue back-off), a cancelled one is
   `CANCELLED`, one that ran out its time limit `TIMEOUT`, the rest `SUCCEEDED` (all replicas
   exited 0) or `FAILED`; then every attempt past its job's time limit gets SIGTERM, its grace
   and SIGKILL, as a cancel does (`TimeLimits`);
2. **snapshot** — the nodes (GPUs held outside warden unavailable), and the GPUs each new
   attempt was bound to where the executor chose them (its recorded assignment corrected:
   `BoundDevices`); every job that is not finished with its attempt's facts, the
   policy and the fair-share ledger (advanced to now); a job's engine form is kept between
   passes and built again only once its row's `version` moved (`EngineJobs`);
3. **plan** — `Engine.plan(snapshot, now, changed)`, told only the jobs that changed since the
   snapshot of its previous call (a full pass after a failure, and on other nodes or another
   policy); a pass whose engine call raises is counted
   (`warden_scheduling_pass_failures_total`) and logged with the waiting jobs, and changes
   nothing but the exits; when the next pass fails the same way, the waiting job that makes
   it fail is found by halving the waiting jobs and *held* (it stays waiting, left out of the
   snapshot, with the reason shown by `describe`) until an admin releases it or it is
   cancelled, and the pass goes on without it;
4. **preempt** — each victim gets SIGTERM and its SIGKILL deadline through the executor and
   enters `PREEMPTING`;
5. **admit** — each admitted job gets its attempt row (which holds its GPUs in the database)
   *before* its processes start (`ADMITTED`); then every admitted attempt is handed to the
   executor, several at once (`STARTING`), and each becomes `RUNNING` once the executor reports
   its processes begun (`Executor.started`: at once for the local executor; for Slurm, when
   every task has started);
6. **explain** — the explanations that changed since the last pass are stored.
7. **history** — after the pass, outside its lock: a sample of the cluster and every queue
   for `GET /v1/history`, once `history_interval_s` passed since the last one
   (`warden.server.history`).

Each duty is an object of its own module, handed the store, the executor and the policy in one
shared `ReconcileContext` (`warden.server.context`): `Charging` (the ledger, charged first),
`Exits` (1), `NodeFollower`, `BoundDevices`, `Cancels` and `TimeLimits` (before the snapshot),
`Snapshots` (2, and the live snapshot readers ask the engine about), `EngineGuard` (3, and the held
jobs), `Preemptions` (4, and evictions), `PlanApplier` (5 and 6), `History` (7) and `Recovery` (at start).
The `Reconciler` owns the lock, the loop and the order of the steps; none of its duties
imports it back.

Every transition is an event with time, reason and actor. Nothing here holds state the
database does not also hold, except timers the executor re-arms on `adopt` (and the last
failure's kind, which a restart may forget: it then takes one more failure to hold the job),
so the server can be killed at any moment and started again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from warden.engine.model import Node, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.executors.base import Executor, Fenced, Inventory
from warden.server.apply import PlanApplier
from warden.server.cancels import Cancels
from warden.server.charging import Charging
from warden.server.context import PassStats, ReconcileContext
from warden.server.devices import BoundDevices
from warden.server.engineguard import EngineGuard
from warden.server.exits import Exits
from warden.server.history import INTERVAL_S, History
from warden.server.metrics import ServerMetrics
from warden.server.nodes import NodeFollower
from warden.server.preempt import Preemptions
from warden.server.recovery import Recovery
from warden.server.snapshots import Snapshots
from warden.server.stops import Stops
from warden.server.timelimits import TimeLimits
from warden.store.leadership import NotLeader
from warden.store.repo import Store

log = logging.getLogger("warden.reconcile")


class Reconciler:
    """Owns the lock and the loop, and is the one door through which every change of a job's
    state goes; each duty of a pass is a collaborator of its own, handed the shared context
    (`ReconcileContext`): recovery, exits, cancels, time limits, preemptions, admissions, nodes,
    charging, and the engine's guard."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        nodes: tuple[Node, ...],
        policy: Policy,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        report_env: Callable[[str, int], dict[str, str]] | None = None,
        inventory: Callable[[], Inventory] | None = None,
        history_interval_s: float = INTERVAL_S,
        lock: threading.RLock | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        """`metrics`: fed as passes go (`ReconcileContext.metrics`)."""
        self.store = store
        self.executor = executor
        self.ctx = ReconcileContext(store, executor, policy, nodes, state_dir, clock, metrics=metrics)
        """The state every duty reads; tests set its `phase_hook` to act inside a pass."""
        self.history = History(store, history_interval_s)
        """The samples `GET /v1/history` reads: one at the end of a pass every interval."""
        self.inventory = inventory
        """Where the nodes come from each pass (the Slurm executor's view); None: `nodes`
        never change."""
        self.state_dir = state_dir
        self.clock = clock
        self.report_env = report_env
        """The environment that lets an attempt's SDK report to this server."""
        self.lock = lock if lock is not None else threading.RLock()
        """Held by every pass and by every user action that reads then writes a job; shared by
        the reconcilers of one server's successive terms (`warden.server.leader`)."""
        self._wake = threading.Event()
        self.lost: str | None = None
        """Why `run` stopped by itself: this server was refused a write or an action because
        it no longer leads (`NotLeader`, `Fenced`); None while it runs."""
        self.follow_policy: Callable[[], Policy | None] | None = None
        """Asked at the start of every pass for a policy applied elsewhere since (another
        server on the database); None: the policy changes only through `set_policy`."""
        self.last_plan: Plan | None = None
        self.last_planned: tuple[Snapshot, float] | None = None
        """The snapshot and `now` of `last_plan` (what the expected starts are forecast from)."""
        self.preemptions = Preemptions(self.ctx)
        self.recovery = Recovery(self.ctx, self.preemptions)
        self.guard = EngineGuard(self.ctx)
        self.charging = Charging(self.ctx)
        self.exits = Exits(self.ctx)
        self.cancels = Cancels(self.ctx)
        self.time_limits = TimeLimits(self.ctx, self.cancels)
        self.stops = Stops(self.ctx, self.preemptions)
        self.follower = NodeFollower(self.ctx, self.preemptions)
        self.devices = BoundDevices(self.ctx, self.preemptions)
        self.applier = PlanApplier(self.ctx, report_env)
        self.snapshots = Snapshots(self.ctx, self.guard, self.charging)
        """The engine's input: each pass's snapshot, and the one readers ask the engine about
        (`Snapshots.live`: a dry run, a policy diff, a standby's forecasts)."""

    # -- what the service, its API and its metrics read of the loop ---------------------
    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def cluster(self) -> Inventory:
        """Every node the executor has, and which are down, as of the last pass."""
        return self.ctx.cluster

    @property
    def stats(self) -> PassStats:
        return self.ctx.stats

    # -- the loop ---------------------------------------------------------------------------
    def poke(self) -> None:
        """Something changed: run a pass soon."""
        self._wake.set()

    def run(self, stop: threading.Event, interval: float = 1.0, gate: Callable[[], bool] | None = None) -> None:
        """Pass after pass until `stop` is set: on every poke, and at least every `interval`.
        With `gate`, a pass runs only while it says yes (the lease valid: a leader whose
        renewal is late waits rather than fail half-way through a pass).

        After a pass the loop rests at least as long as the pass took, so that under a storm
        of submissions the API keeps half the interpreter: the submissions that arrive
        meanwhile are all taken by the next pass. A pass refused because this server no
        longer leads ends the loop (`lost` says why): the server steps down.
        """
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if gate is None or gate():
                    self.reconcile()
            except (NotLeader, Fenced) as err:
                self.lost = str(err)
                log.warning("reconcile loop stopped, this server does not lead any more: %s", err)
                return
            except Exception:  # a failed pass must not stop the loop; the next one retries
                log.exception("reconcile pass failed")
            took = time.monotonic() - t0
            if stop.wait(min(took, interval)):
                return
            self._wake.wait(max(0.0, interval - took))
            self._wake.clear()

    def set_policy(self, policy: Policy) -> None:
        with self.lock:
            self.ctx.policy = policy
        self.poke()

    def recover(self) -> None:
        """After a start: finish whatever a killed server left half done, and track every
        attempt that is still running again (`Recovery`)."""
        with self.lock:
            self.recovery.recover()
        self.poke()

    # -- one pass ---------------------------------------------------------------------------
    def reconcile(self) -> Plan | None:
        """One pass; None when the engine failed on it (counted and logged; the exits were
        still collected, and the next pass retries)."""
        with self.lock:
            t0 = time.perf_counter()
            if self.follow_policy is not None:
                newer = self.follow_policy()
                if newer is not None:
                    self.ctx.policy = newer
            now = self.clock()
            self.charging.charge(now)
            self.applier.running(now)  # before the exits: a job that began and ended since the last pass did run
            self.exits.collect(now)
            self.devices.check(now)  # first: which GPUs warden holds is what the follower keeps apart
            if self.inventory is not None:
                self.follower.follow(self.inventory(), now)
            active = self.cancels.cancel_marked(self.store.active(), now)
            active = self.cancels.cancels_pending(active, now)
            active = self.time_limits.enforce(active, now)
            active = self.stops.watch(active, now)
            snapshot = self.snapshots.take(active, now)
            plan = self.guard.plan(snapshot, now)
            self.ctx.phase("planned")
            if plan is not None:
                by_id = {a.job.job_id: a for a in active}
                for p in plan.preemptions:
                    victim = by_id[p.job_id]
                    assert victim.attempt is not None
                    self.preemptions.preempt(victim.job, victim.attempt, p.grace, p.for_job, p.kind, p.lost_work, now)
                admitted = [
                    self.applier.admit(by_id[a.job_id].job, a.placement, a.flavor, a.borrowing, now, lent=a.lent)
                    for a in plan.admissions
                ]
                self.applier.launch_all([spec for spec in admitted if spec is not None], now)
                self.applier.claims(plan, by_id, now)
                self.applier.explain(plan)
                self.last_plan, self.last_planned = plan, (snapshot, now)
            self.applier.running(now)
            self.charging.settle(snapshot, plan)
            s = self.stats
            s.at, s.duration_s, s.passes = now, time.perf_counter() - t0, s.passes + 1
            if plan is not None:
                s.admitted += len(plan.admissions)
                s.preempted += len(plan.preemptions)
            if self.ctx.metrics is not None:
                self.ctx.metrics.pass_took(s.duration_s)
        self.history.sample(now, self.policy, self.charging.ledger, self.cluster)  # outside the lock
        return plan
