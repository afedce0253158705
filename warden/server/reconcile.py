"""The reconcile loop: the engine driven by the real clock (DESIGN §1, §5).

On every change (a submission, an exit, a cancel, an approval — `poke`) and at least once a
second, one pass runs this fixed sequence under one lock:

1. **exits** — attempts whose every process is gone end: a preempted job is requeued
   (`PREEMPTING → REQUEUED → PENDING`, with the policy's requeue back-off), a cancelled one is
   `CANCELLED`, the rest `SUCCEEDED` (all replicas exited 0) or `FAILED`;
2. **snapshot** — the nodes, every job that is not finished with its attempt's facts, the
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

Every transition is an event with time, reason and actor. Nothing here holds state the
database does not also hold, except timers the executor re-arms on `adopt` (and the last
failure's kind, which a restart may forget: it then takes one more failure to hold the job),
so the server can be killed at any moment and started again.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from warden.engine.accounting import assumed_startup, effective_grace, measured_lost_work, wait_time
from warden.engine.cycles import preemption_cycles
from warden.engine.fairshare import accrue, accrue_rates, cluster_capacity, queue_rates
from warden.engine.model import Job, JobState, Node, ReplicaPlacement, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.engine.scheduler import Engine
from warden.executors.base import Executor, Exit, Handle, Inventory, LaunchSpec, ReplicaLaunch, UnknownAttempt
from warden.server.explanations import KILL_AT
from warden.server.history import INTERVAL_S, History
from warden.server.metrics import ServerMetrics
from warden.server.statedir import set_aside_stale
from warden.store.jobs import ActiveJob, StoredAttempt, StoredJob
from warden.store.nodes import NodeRecord
from warden.store.repo import Store

log = logging.getLogger("warden.reconcile")

WAITING = frozenset(s for s in JobState if s.waiting)
HELD = "Held"
"""The reason code a held job shows instead of the engine's explanation."""
LOGGED_IDS = 20
"""How many job ids a failure's log line names before it counts the rest."""
CAS_TRIES = 3
LAUNCHERS = 8
"""How many admitted attempts are handed to the executor at once."""
"""How often an exit is re-read and decided again when its compare-and-set lost."""


@dataclass(frozen=True, slots=True)
class PassFailure:
    """How an engine call failed. Two failures are the same when the same exception type was
    raised at the same place: the message may differ (it often names a job or a time)."""

    kind: str
    where: str
    message: str

    @classmethod
    def of(cls, err: BaseException) -> PassFailure:
        frames = traceback.extract_tb(err.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return cls(type(err).__name__, where, str(err))

    def same_as(self, other: PassFailure | None) -> bool:
        return other is not None and (self.kind, self.where) == (other.kind, other.where)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


@dataclass
class PassStats:
    """What the last pass did, for metrics and tests."""

    at: float = 0.0
    duration_s: float = 0.0
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    passes: int = 0
    failures: int = 0
    """Passes whose engine call raised."""


class EngineJobs:
    """The jobs of the last snapshot in the engine's form, kept between passes so that a pass
    converts only the rows whose `version` moved, and names the jobs that changed since.

    A job's engine form (`ActiveJob.to_engine`) is a function of its row and its live attempt
    alone, and every write to either bumps the row's `version`: a job at the version it was
    converted at is the same `Job` object as before. A row whose version moved for something
    the engine does not read (its stored explanation) converts to an equal `Job`; the old object
    is kept then and the job does not count as changed.
    """

    __slots__ = ("changed", "jobs")

    def __init__(self) -> None:
        self.jobs: dict[int, tuple[int, Job]] = {}
        """The last snapshot's jobs by store id, each with the version it was converted at."""
        self.changed: list[Job] = []
        """What changed between the two last snapshots (`Engine.plan`'s `changed`): jobs new
        in the last one or converted anew, and the jobs that left it in a terminal state."""

    def update(self, active: Iterable[ActiveJob]) -> tuple[Job, ...]:
        """The engine's jobs of `active`, in its order; `changed` becomes what changed since
        the previous call."""
        known = self.jobs
        current: dict[int, tuple[int, Job]] = {}
        changed: list[Job] = []
        out: list[Job] = []
        for a in active:
            row = a.job
            seen = known.get(row.id)
            if seen is not None and seen[0] == row.version:
                job = seen[1]
            else:
                job = a.to_engine()
                if seen is not None and seen[1] == job:
                    job = seen[1]
                else:
                    changed.append(job)
            current[row.id] = (row.version, job)
            out.append(job)
        if changed or len(current) != len(known):  # else every known job is still here
            changed.extend(_left(job) for i, (_, job) in known.items() if i not in current)
        self.jobs, self.changed = current, changed
        return tuple(out)


def without_foreign(node: Node, foreign: int, held: set[int]) -> Node:
    """`node` as the engine may use it when `foreign` of its GPUs are held by work that is not
    warden's: that many fewer. The engine names GPUs by index below the node's count, so the
    count never drops below one past the highest index warden's own attempts hold there; while
    they hold the top ones, up to that many foreign GPUs stay offered until those attempts end
    (a job placed on them waits in Slurm or Ray, which never give one GPU to two jobs)."""
    if foreign <= 0:
        return node
    floor = max(held) + 1 if held else 0
    return replace(node, gpus=max(node.gpus - foreign, floor, 0))


def _holding(
    snapshot: Snapshot, plan: Plan | None, policy: Policy, capacity: tuple[int, int, int]
) -> tuple[dict[str, float], dict[str, int]]:
    """Per queue, the fair-share rate of the charged jobs that hold resources after the pass
    (those of the snapshot, and the plan's admissions), and their GPUs."""
    admitted = {a.job_id for a in plan.admissions} if plan is not None else set()
    holding = [j for j in snapshot.jobs if j.state.holds_resources or j.id in admitted]
    held: dict[str, int] = {}
    for j in holding:
        held[j.queue] = held.get(j.queue, 0) + j.total_gpus
    return queue_rates(holding, capacity, policy), held


def _left(job: Job) -> Job:
    """A job that left the snapshot (it finished, or is held), as the engine drops it: in a
    terminal state."""
    return replace(job, state=JobState.CANCELLED, claim=False)


class Reconciler:
    """Owns the engine and the executor; every change of a job's state goes through it."""

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
    ) -> None:
        self.store = store
        self.executor = executor
        self.history = History(store, history_interval_s)
        """The samples `GET /v1/history` reads: one at the end of a pass every interval."""
        self.nodes = nodes
        """The nodes of the last snapshot: the usable ones, and a down node only while jobs
        still hold resources on it (`_follow_nodes`)."""
        self.cluster = Inventory(nodes)
        """Every node the executor has, and which are down, as of the last pass."""
        self.inventory = inventory
        """Where the nodes come from each pass (the Slurm executor's view); None: `nodes`
        never change."""
        self.policy = policy
        self.state_dir = state_dir
        self.clock = clock
        self.report_env = report_env
        """The environment that lets an attempt's SDK report to this server."""
        self.engine = Engine()
        self._engine_jobs = EngineJobs()
        self._planned_on: tuple[tuple[Node, ...], Policy] | None = None
        """The nodes and policy of the last snapshot `_snapshot` built, once `engine` planned it
        (whole or told what changed); None when its next call must be a full one: it is new, a
        call failed or planned another snapshot, or the last snapshot built never reached it."""
        self._changed: list[Job] | None = None
        """What the engine is told changed in the snapshot `_snapshot` built last (None: a
        full pass)."""
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self.ledger = store.load_ledger().to_engine()
        self._explained: dict[str, tuple[object, ...]] = {}
        self.stats = PassStats()
        self.last_plan: Plan | None = None
        self.last_planned: tuple[Snapshot, float] | None = None
        """The snapshot and `now` of `last_plan` (what the expected starts are forecast from)."""
        self.metrics: ServerMetrics | None = None
        """Fed as passes go."""
        self._last_pass_at: float | None = None
        self._holding: tuple[dict[str, float], dict[str, int]] | None = None
        """What the jobs holding resources as the last pass left them hold, per queue: the
        fair-share rate of the charged ones, and GPUs (`_charge`); None before the first pass."""
        self._last_failure: PassFailure | None = None
        """How the previous engine call failed (None: it did not)."""
        self._unattributed: tuple[PassFailure, frozenset[str]] | None = None
        """A failure no single waiting job caused, and the waiting jobs then: not searched
        again until they change."""
        self.phase_hook: Callable[[str], None] | None = None
        """Called inside a pass, under its lock, between a phase's reads and its writes
        ("exit": an exit's job was read; "planned": the snapshot was planned): the seam race
        tests use to interleave a user action there."""

    # -- the loop ---------------------------------------------------------------------------
    def poke(self) -> None:
        """Something changed: run a pass soon."""
        self._wake.set()

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Pass after pass until `stop` is set: on every poke, and at least every `interval`.

        After a pass the loop rests at least as long as the pass took, so that under a storm
        of submissions the API keeps half the interpreter: the submissions that arrive
        meanwhile are all taken by the next pass.
        """
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.reconcile()
            except Exception:  # a failed pass must not stop the loop; the next one retries
                log.exception("reconcile pass failed")
            took = time.monotonic() - t0
            if stop.wait(min(took, interval)):
                return
            self._wake.wait(max(0.0, interval - took))
            self._wake.clear()

    def set_policy(self, policy: Policy) -> None:
        with self.lock:
            self.policy = policy
        self.poke()

    def recover(self) -> None:
        """After a start: finish whatever a killed server left half done, and track every
        attempt that is still running again (its SIGKILL re-armed if it was terminating).

        A pass changes the database in several short transactions; the server may have died
        between any two. Each half-done step is completed or undone here, in the direction
        that never gives one GPU to two jobs: an attempt row holds its GPUs until it ends."""
        with self.lock:
            now = self.clock()
            for active in self.store.active():
                job, attempt = active.job, active.attempt
                if not job.state.holds_resources:
                    continue
                if attempt is None:
                    self._recover_without_attempt(job, now)
                    continue
                handle = attempt.handle
                if handle is None:
                    recovered = self.executor.recover(job.job_id, attempt.number, Path(attempt.log_dir), job.replicas)
                    if recovered is None:  # stopped before any process started
                        self.store.end_attempt(job.id, attempt.number, ended_at=now, exit_codes=[], reason="failed")
                        self.store.transition(
                            job.id,
                            JobState.PENDING,
                            reason="requeued: the server stopped before the job's processes started",
                            actor="warden",
                            now=now,
                            pending_since=now,
                        )
                        continue
                    handle = recovered.to_dict()
                    self.store.update_attempt(job.id, attempt.number, handle=handle)
                self.executor.adopt(
                    Handle.from_dict(handle), self._bounded_kill_at(attempt.sigterm_at, attempt.kill_at)
                )
                for state in (JobState.STARTING, JobState.RUNNING):
                    if job.state in (JobState.ADMITTED, JobState.STARTING) and job.state is not state:
                        self.store.transition(
                            job.id, state, reason="processes started (recovered)", actor="warden", now=now
                        )
                        job = self.store.get(job.id) or job
            self.executor.cancel_unowned(self.executor.running())
        self.poke()

    def _bounded_kill_at(self, sigterm_at: float | None, kill_at: float | None) -> float | None:
        """A recorded SIGKILL deadline no later than SIGTERM + the policy's `max_grace`: one stored
        before that bound existed, or written by hand, cannot keep a job past it."""
        if sigterm_at is None or kill_at is None:
            return kill_at
        return min(kill_at, sigterm_at + self.policy.max_grace)

    def _recover_without_attempt(self, job: StoredJob, now: float) -> None:
        """A job holding resources without a live attempt: its attempt ended (or was never
        written) but the job's own transition was lost. Finish it from the attempt's record."""
        last = self.store.attempt(job.id, job.attempt) if job.attempt else None
        if last is None:  # the attempt was numbered but never written: undo the number too
            self.store.transition(
                job.id,
                JobState.PENDING,
                reason="requeued: the server stopped before the job started",
                actor="warden",
                now=now,
                pending_since=now,
                attempt=max(0, job.attempt - 1),
            )
            return
        if last.reason in ("preempted", "killed", "evicted") and not job.cancel_requested:
            self.store.transition(
                job.id,
                JobState.REQUEUED,
                reason=f"{last.reason} (recovered)",
                actor="warden",
                now=now,
                preempted_at=[*job.preempted_at, last.sigterm_at or now],
            )
            self.store.transition(
                job.id, JobState.PENDING, reason="requeued", actor="warden", now=now, pending_since=now
            )
            return
        codes = list(last.exit_codes or ())
        if job.cancel_requested:
            to = JobState.CANCELLED
        else:
            to = JobState.SUCCEEDED if last.reason == "completed" else JobState.FAILED
        self.store.transition(
            job.id,
            to,
            reason=f"{last.reason} (recovered): exit {_codes(codes)}",
            actor="warden",
            now=now,
            exit_code=next((c for c in codes if c != 0), 0),
        )

    # -- one pass ---------------------------------------------------------------------------
    def reconcile(self) -> Plan | None:
        """One pass; None when the engine failed on it (counted and logged; the exits were
        still collected, and the next pass retries)."""
        with self.lock:
            t0 = time.perf_counter()
            now = self.clock()
            self._charge(now)
            self._running(now)  # before the exits: a job that began and ended since the last pass did run
            self._collect_exits(now)
            if self.inventory is not None:
                self._follow_nodes(self.inventory(), now)
            active = self._cancel_marked(self.store.active(), now)
            active = self._cancels_pending(active, now)
            snapshot = self._snapshot(active, now)
            plan = self._plan(snapshot, now)
            self._phase("planned")
            if plan is not None:
                by_id = {a.job.job_id: a for a in active}
                for p in plan.preemptions:
                    victim = by_id[p.job_id]
                    assert victim.attempt is not None
                    self._preempt(victim.job, victim.attempt, p.grace, p.for_job, p.kind, p.lost_work, now)
                admitted = [
                    self._admit(by_id[a.job_id].job, a.placement, a.flavor, a.borrowing, now) for a in plan.admissions
                ]
                self._launch_all([spec for spec in admitted if spec is not None], now)
                self._claims(plan, by_id, now)
                self._explain(plan)
                self.last_plan, self.last_planned = plan, (snapshot, now)
            self._running(now)
            self._holding = _holding(snapshot, plan, self.policy, cluster_capacity(self.nodes))
            self.store.save_ledger(self.ledger.at, dict(self.ledger.usage))
            s = self.stats
            s.at, s.duration_s, s.passes = now, time.perf_counter() - t0, s.passes + 1
            if plan is not None:
                s.admitted += len(plan.admissions)
                s.preempted += len(plan.preemptions)
            if self.metrics is not None:
                self.metrics.pass_took(s.duration_s)
        self._sample(now)
        return plan

    def _sample(self, now: float) -> None:
        """The history's sample, when one is due: after the pass and outside its lock (it reads
        every job's attempts, as `GET /v1/queues` does). A sample that fails is logged and
        tried again an interval later; it never fails the pass."""
        try:
            if self.history.due(now):
                self.history.record(now, self.policy, self.ledger, self.cluster)
        except Exception:
            log.exception("recording the history sample failed; the next try is in %g s", self.history.interval_s)

    # -- a pass that fails ------------------------------------------------------------------
    def _plan(self, snapshot: Snapshot, now: float) -> Plan | None:
        """The engine's plan, or None when it raised. A failure like the previous pass's holds
        the waiting job that causes it, and the pass is tried once more without that job; a
        pass therefore holds at most one job, and costs a bounded number of trial passes.

        The engine is told only the jobs that changed since the snapshot of its previous call
        (`EngineJobs.changed`), unless that call failed, planned another snapshot (one without
        a job just held) or other nodes or another policy: then it is given the whole snapshot."""
        changed, self._changed = self._changed, None
        try:
            plan = self.engine.plan(snapshot, now, changed)
            self._planned_on = (snapshot.nodes, snapshot.policy)
        except Exception as err:
            failure = self._failed(err, snapshot)
            repeated = failure.same_as(self._last_failure)
            self._last_failure = failure
            if not repeated:
                return None
            waiting = frozenset(j.id for j in snapshot.jobs if j.state.waiting)
            if (
                self._unattributed is not None
                and failure.same_as(self._unattributed[0])
                and self._unattributed[1] == waiting
            ):
                return None
            culprit = self._culprit(snapshot, now, failure)
            if culprit is None:
                self._unattributed = (failure, waiting)
                log.error(
                    "no single waiting job makes the scheduling pass fail with %s: nobody is held, "
                    "and the pass is retried",
                    failure,
                )
                return None
            self._hold(culprit, failure, now)
            rest = replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id != culprit.id))
            try:
                plan = self.engine.plan(rest, now)  # a fresh engine (`_failed`): a full pass
            except Exception as again:
                self._last_failure = self._failed(again, rest)
                return None
            # `_planned_on` stays None: the engine planned `rest`, not the snapshot
            # `_engine_jobs` holds, so its next call is a full one.
        self._last_failure = self._unattributed = None
        return plan

    def _failed(self, err: Exception, snapshot: Snapshot) -> PassFailure:
        """Count and log a failed engine call (its traceback when it differs from the previous
        one's); start the next pass from a fresh engine, since what it keeps between passes may
        have been left half updated."""
        self.engine = Engine()
        self._planned_on = None
        failure = PassFailure.of(err)
        self.stats.failures += 1
        if self.metrics is not None:
            self.metrics.pass_failed()
        waiting = [j.id for j in snapshot.jobs if j.state.waiting]
        log.error(
            "scheduling pass failed with %s; it was scheduling %d waiting job(s): %s",
            failure,
            len(waiting),
            _ids(waiting),
            exc_info=None if failure.same_as(self._last_failure) else err,
        )
        return failure

    def _culprit(self, snapshot: Snapshot, now: float, failure: PassFailure) -> Job | None:
        """The waiting job without which the pass does not fail `failure`'s way, found by
        halving: at most 2·log2(waiting) + 2 trial passes, each on a fresh engine. None when
        the pass fails without any waiting job (it is not theirs to fix) or only with several
        of them together."""
        fixed = tuple(j for j in snapshot.jobs if not j.state.waiting)
        suspects: Sequence[Job] = [j for j in snapshot.jobs if j.state.waiting]

        def fails(jobs: Sequence[Job]) -> bool:
            try:
                Engine().plan(replace(snapshot, jobs=fixed + tuple(jobs)), now)
            except Exception as err:
                return PassFailure.of(err).same_as(failure)
            return False

        if not suspects or fails(()) or not fails(suspects):
            return None
        while len(suspects) > 1:
            half = len(suspects) // 2
            if fails(suspects[:half]):
                suspects = suspects[:half]
            elif fails(suspects[half:]):
                suspects = suspects[half:]
            else:
                return None
        return suspects[0]

    def _hold(self, job: Job, failure: PassFailure, now: float) -> None:
        """Quarantine a job: it stays in its waiting state, out of every snapshot, with the
        reason as its event and its explanation, until an admin releases it."""
        reason = f"quarantined: scheduling passes failed with {failure} while this job waited"
        message = (
            f"Held: {reason}. An admin may release it (warden release {job.id}) once the cause "
            "is fixed, or it can be cancelled."
        )
        explanation = {
            "reason": {
                "code": HELD,
                "message": message,
                "details": {"by": "warden", "error": str(failure), "where": failure.where},
            },
            "sort_key": None,
            "position": None,
        }
        held = self.store.transition(
            int(job.id),
            job.state,
            reason=reason,
            actor="warden",
            now=now,
            expect_state={job.state},
            held_reason=reason,
            explanation=explanation,
        )
        self._explained.pop(job.id, None)
        if held:
            log.error("job %s held: %s", job.id, reason)

    def _charge(self, now: float) -> None:
        """Charge the time since the previous pass to the jobs that held resources as that pass
        left them — the fair-share ledger and the GPU-seconds delivered. A job keeps its GPUs
        until a pass collects its exit, and every admission happens in a pass, so that set held
        throughout; a job that exited since is charged up to this pass, which collects it."""
        last, self._last_pass_at = self._last_pass_at, now
        if self._holding is None:
            return  # the first pass since start: `_snapshot` brings the ledger up to now
        rates, held = self._holding
        self.ledger = accrue_rates(self.ledger, rates, self.policy.fair_share.half_life, now)
        if self.metrics is not None and last is not None:
            self.metrics.held(now - last, held, sum(n.gpus for n in self.nodes))

    def _snapshot(self, active: tuple[ActiveJob, ...], now: float) -> Snapshot:
        """The engine's input: every unfinished job but the held ones (each converted only
        when its row moved; `EngineJobs`)."""
        # Until `_plan` hands this snapshot to the engine, its next call must be a full one.
        basis, self._planned_on = self._planned_on, None
        engine_jobs = self._engine_jobs.update(a for a in active if not a.job.held)
        if self._holding is None:  # since the ledger was saved: the jobs that hold now, as before a restart
            self.ledger = accrue(
                self.ledger,
                (j for j in engine_jobs if j.state.holds_resources),
                cluster_capacity(self.nodes),
                self.policy,
                now,
            )
        warm = basis is not None and basis == (self.nodes, self.policy)
        self._changed = self._engine_jobs.changed if warm else None
        return Snapshot(self.nodes, engine_jobs, self.policy, self.ledger)

    def live_snapshot(self, now: float) -> Snapshot:
        """The snapshot a pass at `now` would plan, as far as the store says now, for readers
        that ask the engine a question (a dry run, a policy diff) and change nothing: nothing
        a pass reads or keeps is touched. Call it holding `lock`.

        It differs from the next pass's own snapshot only by what that pass does first: exits
        it collects, nodes it follows, cancels it completes (a waiting job marked cancelled is
        left out here, as that pass ends it)."""
        jobs = tuple(
            a.to_engine()
            for a in self.store.active()
            if not a.job.held and not (a.job.cancel_requested and a.job.state in WAITING)
        )
        capacity = cluster_capacity(self.nodes)
        if self._holding is None:
            ledger = accrue(self.ledger, (j for j in jobs if j.state.holds_resources), capacity, self.policy, now)
        else:
            ledger = accrue_rates(self.ledger, self._holding[0], self.policy.fair_share.half_life, now)
        return Snapshot(self.nodes, jobs, self.policy, ledger)

    # -- nodes ------------------------------------------------------------------------------
    def _follow_nodes(self, inventory: Inventory, now: float) -> None:
        """Take the executor's current nodes. A gang with a replica on a node that is down
        (DOWN, DRAIN, not responding) is evicted whole: SIGTERM, its grace, SIGKILL, then it is
        requeued. The snapshot keeps a down node only while jobs still hold resources on it,
        shrunk to exactly what they hold, so that nothing new is placed there. GPUs that work
        which is not warden's holds (`Inventory.foreign`) are never offered: the node is shrunk
        by them (`without_foreign`)."""
        if inventory.nodes != self.cluster.nodes:
            self.store.replace_nodes(NodeRecord.from_engine(n, updated_at=now) for n in inventory.nodes)
        for name in inventory.down.keys() - self.cluster.down.keys():
            log.warning("node %s takes no jobs: %s", name, inventory.down[name])
        for name, gpus in sorted(inventory.foreign.items()):
            if gpus != self.cluster.foreign.get(name, 0):
                log.warning(
                    "node %s: %d GPU(s) held by work that is not warden's are kept out of scheduling", name, gpus
                )
        self.cluster = inventory
        if not inventory.down and not inventory.foreign:
            self.nodes = inventory.nodes
            return
        held: dict[str, list[int]] = {}
        indices: dict[str, set[int]] = {}
        for active in self.store.active():
            job, attempt = active.job, active.attempt
            if not job.state.holds_resources or attempt is None or attempt.ended_at is not None:
                continue
            for part in attempt.assignment:
                h = held.setdefault(part.node, [0, 0, 0])
                h[0] += job.gpus
                h[1] += job.cpu
                h[2] += job.memory
                indices.setdefault(part.node, set()).update(part.gpus)
            lost = sorted({p.node for p in attempt.assignment} & inventory.down.keys())
            if lost and attempt.sigterm_at is None:
                self._evict(job, attempt, ", ".join(f"node {n} is {inventory.down[n]}" for n in lost), now)
        nodes = []
        for node in inventory.nodes:
            if node.name not in inventory.down:
                nodes.append(without_foreign(node, inventory.foreign.get(node.name, 0), indices.get(node.name, set())))
            elif node.name in held:
                gpus, cpu, memory = held[node.name]
                nodes.append(replace(node, gpus=gpus, cpu=min(cpu, node.cpu), memory=min(memory, node.memory)))
        self.nodes = tuple(nodes)

    def _evict(self, job: StoredJob, attempt: StoredAttempt, why: str, now: float) -> None:
        """Stop a gang one of whose nodes went down, the way a preemption does (grace, then
        SIGKILL), but for no other job: it is requeued when its processes are gone, and the
        thrash guard does not count it as a preemption."""
        if job.cancel_requested:
            return
        grace = effective_grace(self.policy, job.tier, job.grace_s)
        try:
            kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        except UnknownAttempt:
            return  # not tracked yet: its exit or recovery ends it
        self.store.update_attempt(
            job.id, attempt.number, state="terminating", sigterm_at=now, kill_at=kill_at, preemption_kind="eviction"
        )
        if self.store.transition(
            job.id,
            JobState.PREEMPTING,
            now=now,
            actor="warden",
            reason=f"evicted: {why}; the whole gang stops and is requeued; grace {grace:.0f}s",
            details={KILL_AT: kill_at, "grace_s": grace},
            expect_state={job.state},
            expect_cancel_requested=False,
        ):
            self._count_cycles(job, None, now)

    def _count_cycles(self, victim: StoredJob, by: str | None, at: float) -> None:
        """Count the jobs the preemption of `victim` at `at` (for `by`) put into a preemption
        cycle of a kind they were not in before it (`warden_preemption_cycles_total`)."""
        if self.metrics is None:
            return
        ids = [victim.id, *([int(by)] if by is not None and by.isdigit() else [])]
        links = self.store.preemption_links(ids)
        before = [p for p in links if not (p.victim == victim.job_id and p.at == at)]
        budget = self.policy.thrash.max_preemptions
        for i in ids:
            was = {c.kind for c in preemption_cycles(str(i), before, budget)}
            for c in preemption_cycles(str(i), links, budget):
                if c.kind not in was:
                    self.metrics.cycle_entered(c.kind)

    # -- exits ------------------------------------------------------------------------------
    def _collect_exits(self, now: float) -> None:
        for ex in self.executor.exits():
            self._ended(ex, now)

    def _ended(self, ex: Exit, now: float) -> None:
        attempt = self.store.attempt(int(ex.job_id), ex.attempt)
        job = self.store.get(int(ex.job_id))
        if job is None or attempt is None or attempt.ended_at is not None:
            return
        # An end outside the attempt's life is no fact (a record a job could write): never
        # before it started, never after now, so no charge or lost work comes out negative.
        if not attempt.started_at <= ex.ended_at <= now:  # NaN included
            ex = replace(ex, ended_at=attempt.started_at if ex.ended_at < attempt.started_at else now)
        # Work is lost from a SIGTERM, or from the moment something else ended the attempt.
        stopped_at = attempt.sigterm_at if attempt.sigterm_at is not None else ex.ended_at if ex.ended_by else None
        if stopped_at is not None:
            lost = measured_lost_work(
                job.gpus * job.replicas,
                stopped_at,
                attempt.started_at,
                assumed_startup(self.policy, attempt.startup_s),
                attempt.last_checkpoint_at,
                ex.ended_at,
            )
            self.store.update_attempt(job.id, ex.attempt, lost_work_gpu_s=lost)
            if self.metrics is not None and not job.cancel_requested:
                self.metrics.lost_work(job.queue, lost)
        for _ in range(CAS_TRIES):
            self._phase("exit")
            if self._end(job, attempt, ex, now):
                break
            job = self.store.get(job.id) or job
        else:
            log.error("job %s: its exit could not be recorded (it kept changing); the next restart finishes it", job.id)
        self.stats.finished += 1

    def _end(self, job: StoredJob, attempt: StoredAttempt, ex: Exit, now: float) -> bool:
        """End the attempt and move the job as `job` (just read) says: CANCELLED once a cancel
        marked it, REQUEUED after SIGTERM, else by the exit codes. The move is a
        compare-and-set on the state and cancel mark read, so a cancel landing in between
        makes it fail (False) rather than requeue a cancelled job."""
        codes = list(ex.exit_codes)
        first_bad = next((c for c in codes if c != 0), None)
        if job.cancel_requested:
            reason, to = "cancelled", JobState.CANCELLED
        elif attempt.sigterm_at is not None:
            reason, to = ("killed" if ex.killed else "preempted"), JobState.REQUEUED
        elif ex.ended_by is not None:
            reason, to = "evicted", JobState.REQUEUED
        elif all(c == 0 for c in codes):
            reason, to = "completed", JobState.SUCCEEDED
        else:
            reason, to = "failed", JobState.FAILED
        # An exit status nobody could read (the supervisor was lost) is recorded as -1.
        self.store.end_attempt(
            job.id, ex.attempt, ended_at=ex.ended_at, exit_codes=[-1 if c is None else c for c in codes], reason=reason
        )
        read: dict[str, Any] = {"expect_state": {job.state}, "expect_cancel_requested": job.cancel_requested}
        if to is not JobState.REQUEUED:
            code = first_bad if first_bad is not None else 0
            return self.store.transition(
                job.id, to, reason=f"{reason}: exit {_codes(codes)}", actor="warden", now=now, exit_code=code, **read
            )
        if reason == "evicted":
            detail = f"evicted: {ex.ended_by} (exit {_codes(codes)}); the job is requeued"
        else:
            detail = f"exited {_codes(codes)} after SIGTERM" + (" and SIGKILL at the deadline" if ex.killed else "")
        if not self.store.transition(
            job.id,
            JobState.REQUEUED,
            reason=detail,
            actor="warden",
            now=now,
            # an eviction from a node that went down is no preemption (the thrash guard's count)
            preempted_at=[*job.preempted_at, attempt.sigterm_at] if attempt.preempted_for else job.preempted_at,
            **read,
        ):
            return False
        backoff = self.policy.thrash.requeue_backoff
        # A cancel between the two moves finds the job REQUEUED (waiting) and ends it: then
        # this one does nothing.
        self.store.transition(
            job.id,
            JobState.PENDING,
            reason="requeued",
            actor="warden",
            now=now,
            expect_state={JobState.REQUEUED},
            expect_cancel_requested=False,
            pending_since=now,
            not_before=now + backoff if backoff > 0 else None,
        )
        return True

    # -- preempt ----------------------------------------------------------------------------
    def _preempt(
        self, job: StoredJob, attempt: StoredAttempt, grace: float, for_job: str, kind: str, lost: float, now: float
    ) -> None:
        """SIGTERM a victim the plan chose from the snapshot, unless it changed since (a cancel
        marked it: it is terminating already, and must end CANCELLED)."""
        current = self.store.get(job.id)
        if current is None or current.state is not job.state or current.cancel_requested:
            return
        kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        self.store.update_attempt(
            job.id,
            attempt.number,
            state="terminating",
            sigterm_at=now,
            kill_at=kill_at,
            preempted_for=for_job,
            preemption_kind="reclaim" if kind == "reclaim" else "preemption",
        )
        if not self.store.transition(
            job.id,
            JobState.PREEMPTING,
            now=now,
            actor="warden",
            reason=f"preempted for job {for_job} ({kind}); expected lost work {lost:.0f} GPU-s; grace {grace:.0f}s",
            details={KILL_AT: kill_at, "grace_s": grace, "expected_lost_gpu_s": lost},
            expect_state={job.state},
            expect_cancel_requested=False,
        ):
            return  # cancelled meanwhile: its exit ends it CANCELLED
        if self.metrics is not None:
            self.metrics.preemption(job.queue, job.tier, kind)
        self._count_cycles(job, for_job, now)

    def cancel(self, job: StoredJob, actor: str) -> str | None:
        """Cancel `job` as the caller read it under `lock` (which it holds, so no pass runs in
        between): a waiting job ends CANCELLED now; one holding resources is marked, so that
        its exit ends it CANCELLED (never requeued), and gets SIGTERM, grace, SIGKILL unless
        it is terminating already. Each write is a compare-and-set on what was read. Returns
        what was done, or None when a write found the job changed: read it again and retry."""
        with self.lock:
            try:
                if job.state.terminal:
                    return None
                if job.state in WAITING:
                    return self._cancel_waiting(job, actor, self.clock())
                if job.cancel_requested:
                    return "nothing: a cancel is already under way"
                return self._cancel_holding(job, actor, self.clock())
            finally:
                self.poke()

    def _cancel_waiting(self, job: StoredJob, actor: str, now: float) -> str | None:
        done = self.store.transition(
            job.id,
            JobState.CANCELLED,
            reason=f"cancelled by {actor}",
            actor=actor,
            now=now,
            expect_state={job.state},
            cancel_requested=True,
            held_reason=None,
        )
        return f"cancelled while {job.state.value}, before it started" if done else None

    def _cancel_holding(self, job: StoredJob, actor: str, now: float) -> str | None:
        if not self.store.transition(
            job.id,
            job.state,
            reason=f"cancel requested by {actor}",
            actor=actor,
            now=now,
            expect_state={job.state},
            expect_cancel_requested=False,
            cancel_requested=True,
        ):
            return None
        attempt = self.store.attempt(job.id, job.attempt)
        if attempt is None or attempt.ended_at is not None:
            return f"marked cancelled while {job.state.value} (its attempt has no processes)"
        if attempt.sigterm_at is not None:
            return (
                f"marked cancelled while {job.state.value}: already terminating, its SIGKILL deadline "
                "unchanged; it ends CANCELLED when its processes exit"
            )
        grace = effective_grace(self.policy, job.tier, job.grace_s)
        kill_at = self._signal_cancelled(job, attempt, grace, now)
        if kill_at is None:  # not started or not adopted yet: a later pass signals it
            return f"marked cancelled while {job.state.value}; SIGTERM follows once its processes are tracked"
        return f"SIGTERM sent while {job.state.value}; SIGKILL when its grace of {grace:g}s is over"

    def _signal_cancelled(self, job: StoredJob, attempt: StoredAttempt, grace: float, now: float) -> float | None:
        """SIGTERM a cancelled job's attempt (SIGKILL after `grace`); its SIGKILL deadline, or
        None while the executor does not track its processes (not started or not adopted yet)."""
        try:
            kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        except UnknownAttempt:
            return None
        self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=now, kill_at=kill_at)
        return kill_at

    def _cancels_pending(self, active: tuple[ActiveJob, ...], now: float) -> tuple[ActiveJob, ...]:
        """Carry out every cancel that was recorded but never signalled: one sent while the
        job's processes were not tracked yet, or before a server stopped (a restarted server
        adopts the attempt, then this pass sends its SIGTERM). Returns `active` read again when
        any was signalled."""
        signalled = False
        for a in active:
            job, attempt = a.job, a.attempt
            if not (job.cancel_requested and job.state.holds_resources) or attempt is None:
                continue
            if attempt.sigterm_at is not None or attempt.ended_at is not None or attempt.handle is None:
                continue
            grace = effective_grace(self.policy, job.tier, job.grace_s)
            kill_at = self._signal_cancelled(job, attempt, grace, now)
            if kill_at is None:
                continue
            signalled = True
            self.store.transition(
                job.id,
                job.state,
                reason=f"SIGTERM sent for the cancel requested earlier; grace {grace:g}s",
                details={KILL_AT: kill_at, "grace_s": grace},
                actor="warden",
                now=now,
                expect_state={job.state},
            )
        return self.store.active() if signalled else active

    def _cancel_marked(self, active: tuple[ActiveJob, ...], now: float) -> tuple[ActiveJob, ...]:
        """Waiting jobs a cancel marked (an older server could requeue them) end CANCELLED
        here instead of being scheduled."""
        marked = {a.job.id: a.job for a in active if a.job.cancel_requested and a.job.state in WAITING}
        for job in marked.values():
            self._cancel_waiting(job, "warden", now)
        return tuple(a for a in active if a.job.id not in marked) if marked else active

    def _phase(self, name: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name)

    # -- admit ------------------------------------------------------------------------------
    def _admit(
        self, job: StoredJob, placement: tuple[ReplicaPlacement, ...], flavor: str, borrowing: bool, now: float
    ) -> LaunchSpec | None:
        """Record an admission: ADMITTED, and the attempt row that holds its GPUs in the
        database before any process exists. Returns what to launch (None: cancelled meanwhile)."""
        number = job.attempt + 1
        attempt_dir = self.state_dir / "jobs" / str(job.id) / f"attempt-{number}"
        waited = wait_time(job.waited_s, job.pending_since, job.submit_at, now)
        if not self.store.transition(
            job.id,
            JobState.ADMITTED,
            reason=_placed(placement, borrowing),
            actor="warden",
            now=now,
            expect_state={job.state},
            expect_cancel_requested=False,
            attempt=number,
            waited_s=waited,
            pending_since=None,
            claim=False,
            # The attempt row holds the GPUs in the database before any process exists.
            new_attempt={
                "number": number,
                "started_at": now,
                "assignment": placement,
                "flavor": flavor,
                "borrowing": borrowing,
                "log_dir": str(attempt_dir),
            },
        ):
            return None  # cancelled meanwhile
        stale = set_aside_stale(self.state_dir, job.id, number)
        if stale is not None:
            log.warning(
                "job %s attempt %d: a directory was already where its own goes; moved to %s", job.id, number, stale
            )
        self._explained.pop(str(job.id), None)
        if self.metrics is not None:
            self.metrics.admission(job.queue, job.tier, waited)
        return LaunchSpec(
            job_id=str(job.id),
            attempt=number,
            command=tuple(job.command),
            replicas=_replicas(placement),
            grace_s=effective_grace(self.policy, job.tier, job.grace_s),
            workdir=Path(job.workdir),
            log_dir=attempt_dir,
            checkpoint_dir=self.state_dir / "jobs" / str(job.id) / "checkpoints",
            env={**(job.env or {}), **(self.report_env(str(job.id), number) if self.report_env else {})},
            user=job.user,
            cpu=job.cpu,
            memory=job.memory,
        )

    def _launch_all(self, specs: Sequence[LaunchSpec], now: float) -> None:
        """Hand every admitted attempt to the executor, up to LAUNCHERS at a time: a Slurm
        submission waits on a round trip to the controller, and one pass may admit hundreds."""
        if len(specs) <= 1:
            for spec in specs:
                self._launch(spec, now)
            return
        with ThreadPoolExecutor(max_workers=min(LAUNCHERS, len(specs)), thread_name_prefix="warden-launch") as pool:
            for done in [pool.submit(self._launch, spec, now) for spec in specs]:
                done.result()

    def _launch(self, spec: LaunchSpec, now: float) -> None:
        job_id, number = int(spec.job_id), spec.attempt
        try:
            handle = self.executor.start(spec)
        except OSError as err:
            self.store.end_attempt(job_id, number, ended_at=now, exit_codes=[], reason="failed")
            self.store.transition(
                job_id,
                JobState.FAILED,
                reason=f"could not start: {err}",
                actor="warden",
                now=now,
                expect_state={JobState.ADMITTED},
            )
            return
        self.store.update_attempt(job_id, number, handle=handle.to_dict())
        self.store.transition(
            job_id,
            JobState.STARTING,
            reason="handed to the executor",
            actor="warden",
            now=now,
            expect_state={JobState.ADMITTED},
        )

    def _running(self, now: float) -> None:
        """STARTING → RUNNING for the attempts whose processes the executor saw begin."""
        for job_id, number in self.executor.started():
            job = self.store.get(int(job_id))
            if job is not None and job.state is JobState.STARTING and job.attempt == number:
                self.store.transition(
                    job.id,
                    JobState.RUNNING,
                    reason="processes running",
                    actor="warden",
                    now=now,
                    expect_state={JobState.STARTING},
                )

    # -- claims -----------------------------------------------------------------------------
    def _claims(self, plan: Plan, by_id: dict[str, ActiveJob], now: float) -> None:
        """Exactly the waiting jobs the plan names hold a claim into the next pass: what their
        victims free is theirs (an admission ends a claim with it, in `_admit`)."""
        released = set(plan.released_claims)
        admitted = {a.job_id for a in plan.admissions}
        for job_id, active in by_id.items():
            job = active.job
            if job.state not in WAITING or job_id in admitted:
                continue
            want = job_id in plan.claims
            if job.claim == want:
                continue
            if want:
                reason = "claims the capacity its victims are freeing"
            elif job_id in released:
                reason = "claim released: its victims' capacity is no longer needed"
            else:
                reason = "claim ended"
            self.store.transition(
                job.id, job.state, reason=reason, actor="warden", now=now, expect_state={job.state}, claim=want
            )

    # -- explain ----------------------------------------------------------------------------
    def _explain(self, plan: Plan) -> None:
        """Store the explanations that changed. A job's wait grows every pass and its queue's
        fair-share ratios move with every accrual, so both are left out of the comparison (the
        API shows them as they are now); a rewrite would bump the row's version and make the
        next pass read and convert it again."""
        changed: dict[int | str, dict[str, object] | None] = {}
        for job_id, e in plan.explanations.items():
            k = e.sort_key
            seen = (e.reason, e.position, k.tier, k.breach, k.fair_rank)
            if self._explained.get(job_id) != seen:
                self._explained[job_id] = seen
                changed[int(job_id)] = {"reason": e.reason.to_dict(), "sort_key": k.to_dict(), "position": e.position}
        if changed:
            self.store.set_explanations(changed)


def _replicas(placement: tuple[ReplicaPlacement, ...]) -> tuple[ReplicaLaunch, ...]:
    """Ranks in placement order; LOCAL_RANK counts the replicas before it on the same node."""
    on_node: dict[str, int] = {}
    out = []
    for rank, p in enumerate(placement):
        local = on_node.get(p.node, 0)
        on_node[p.node] = local + 1
        out.append(ReplicaLaunch(rank=rank, node=p.node, gpus=p.gpus, local_rank=local))
    return tuple(out)


def _codes(codes: Sequence[int | None]) -> str:
    return ",".join("?" if c is None else str(c) for c in codes) or "?"


def _placed(placement: tuple[ReplicaPlacement, ...], borrowing: bool) -> str:
    where = "; ".join(f"{p.node} GPUs {','.join(map(str, p.gpus)) or '-'}" for p in placement)
    return f"admitted on {where}" + (" (borrowing)" if borrowing else "")


def _ids(ids: Sequence[str]) -> str:
    """Job ids for a log line: the first `LOGGED_IDS`, then how many more."""
    shown = ", ".join(ids[:LOGGED_IDS]) or "none"
    return shown + (f" and {len(ids) - LOGGED_IDS} more" if len(ids) > LOGGED_IDS else "")
