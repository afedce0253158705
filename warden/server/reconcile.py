"""The reconcile loop: the engine driven by the real clock (DESIGN §1, §5).

On every change (a submission, an exit, a cancel, an approval — `poke`) and at least once a
second, one pass runs this fixed sequence under one lock:

1. **exits** — attempts whose every process is gone end: a preempted job is requeued
   (`PREEMPTING → REQUEUED → PENDING`, with the policy's requeue back-off), a cancelled one is
   `CANCELLED`, the rest `SUCCEEDED` (all replicas exited 0) or `FAILED`;
2. **snapshot** — the nodes, every job that is not finished with its attempt's facts, the
   policy and the fair-share ledger (advanced to now);
3. **plan** — `Engine.plan(snapshot, now)`;
4. **preempt** — each victim gets SIGTERM and its SIGKILL deadline through the executor and
   enters `PREEMPTING`;
5. **admit** — each admitted job gets its attempt row (which holds its GPUs in the database)
   *before* its processes start, then `ADMITTED → STARTING → RUNNING`;
6. **explain** — the explanations that changed since the last pass are stored.

Every transition is an event with time, reason and actor. Nothing here holds state the
database does not also hold, except timers the executor re-arms on `adopt`, so the server can
be killed at any moment and started again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from warden.engine.fairshare import accrue, cluster_capacity
from warden.engine.model import JobState, Node, ReplicaPlacement, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.engine.scheduler import Engine
from warden.executors.base import Executor, Exit, Handle, LaunchSpec, ReplicaLaunch
from warden.store.repo import ActiveJob, Store

log = logging.getLogger("warden.reconcile")

WAITING = frozenset(s for s in JobState if s.waiting)


@dataclass
class PassStats:
    """What the last pass did, for metrics and tests."""

    at: float = 0.0
    duration_s: float = 0.0
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    passes: int = 0


class Reconciler:
    """Owns the engine and the executor; every change of a job's state goes through it."""

    def __init__(self, store: Store, executor: Executor, nodes: tuple[Node, ...], policy: Policy,
                 state_dir: Path, clock: Callable[[], float] = time.time,
                 report_env: Callable[[str, int], dict[str, str]] | None = None) -> None:
        self.store = store
        self.executor = executor
        self.nodes = nodes
        self.policy = policy
        self.state_dir = state_dir
        self.clock = clock
        self.report_env = report_env
        """The environment that lets an attempt's SDK report to this server."""
        self.engine = Engine()
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self.ledger = store.load_ledger().to_engine()
        self._explained: dict[str, Any] = {}
        self.stats = PassStats()
        self.last_plan: Plan | None = None
        self.metrics: Any | None = None
        """`warden.server.metrics.ServerMetrics`, fed as passes go."""
        self._last_pass_at: float | None = None

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
                        self.store.transition(job.id, JobState.PENDING, reason="requeued: the server stopped "
                                              "before the job's processes started", actor="warden", now=now,
                                              pending_since=now)
                        continue
                    handle = recovered.to_dict()
                    self.store.update_attempt(job.id, attempt.number, handle=handle)
                self.executor.adopt(Handle.from_dict(handle), attempt.kill_at)
                for state in (JobState.STARTING, JobState.RUNNING):
                    if job.state in (JobState.ADMITTED, JobState.STARTING) and job.state is not state:
                        self.store.transition(job.id, state, reason="processes started (recovered)",
                                              actor="warden", now=now)
                        job = self.store.get(job.id) or job
        self.poke()

    def _recover_without_attempt(self, job: Any, now: float) -> None:
        """A job holding resources without a live attempt: its attempt ended (or was never
        written) but the job's own transition was lost. Finish it from the attempt's record."""
        last = self.store.attempt(job.id, job.attempt) if job.attempt else None
        if last is None:  # the attempt was numbered but never written: undo the number too
            self.store.transition(job.id, JobState.PENDING, reason="requeued: the server stopped before "
                                  "the job started", actor="warden", now=now, pending_since=now,
                                  attempt=max(0, job.attempt - 1))
            return
        if last.reason in ("preempted", "killed") and not job.cancel_requested:
            self.store.transition(job.id, JobState.REQUEUED, reason=f"{last.reason} (recovered)", actor="warden",
                                  now=now, preempted_at=[*job.preempted_at, last.sigterm_at or now])
            self.store.transition(job.id, JobState.PENDING, reason="requeued", actor="warden", now=now,
                                  pending_since=now)
            return
        codes = list(last.exit_codes or ())
        if job.cancel_requested:
            to = JobState.CANCELLED
        else:
            to = JobState.SUCCEEDED if last.reason == "completed" else JobState.FAILED
        self.store.transition(job.id, to, reason=f"{last.reason} (recovered): exit {_codes(codes)}",
                              actor="warden", now=now, exit_code=next((c for c in codes if c != 0), 0))

    # -- one pass ---------------------------------------------------------------------------
    def reconcile(self) -> Plan:
        with self.lock:
            t0 = time.perf_counter()
            now = self.clock()
            self._collect_exits(now)
            active = self.store.active()
            snapshot = self._snapshot(active, now)
            self._account(snapshot, now)
            plan = self.engine.plan(snapshot, now)
            by_id = {a.job.job_id: a for a in active}
            for p in plan.preemptions:
                victim = by_id[p.job_id]
                assert victim.attempt is not None
                self._preempt(victim.job, victim.attempt, p.grace, p.for_job, p.kind, p.lost_work, now)
            for a in plan.admissions:
                self._admit(by_id[a.job_id].job, a.placement, a.flavor, a.borrowing, now)
            self._explain(plan)
            self.store.save_ledger(self.ledger.at, dict(self.ledger.usage))
            self.last_plan = plan
            s = self.stats
            s.at, s.duration_s, s.passes = now, time.perf_counter() - t0, s.passes + 1
            s.admitted += len(plan.admissions)
            s.preempted += len(plan.preemptions)
            if self.metrics is not None:
                self.metrics.pass_took(s.duration_s)
            return plan

    def _account(self, snapshot: Snapshot, now: float) -> None:
        """GPU-seconds held per queue since the previous pass (held throughout it, as every
        change of the set of running jobs happens inside a pass)."""
        last, self._last_pass_at = self._last_pass_at, now
        if self.metrics is None or last is None:
            return
        held: dict[str, int] = {}
        for j in snapshot.jobs:
            if j.state.holds_resources:
                held[j.queue] = held.get(j.queue, 0) + j.total_gpus
        self.metrics.held(now - last, held, sum(n.gpus for n in self.nodes))

    def _snapshot(self, active: tuple[ActiveJob, ...], now: float) -> Snapshot:
        engine_jobs = tuple(a.to_engine() for a in active)
        capacity = cluster_capacity(self.nodes)
        self.ledger = accrue(self.ledger, (j for j in engine_jobs if j.state.holds_resources),
                             capacity, self.policy, now)
        return Snapshot(self.nodes, engine_jobs, self.policy, self.ledger)

    # -- exits ------------------------------------------------------------------------------
    def _collect_exits(self, now: float) -> None:
        for ex in self.executor.exits():
            self._ended(ex, now)

    def _ended(self, ex: Exit, now: float) -> None:
        job = self.store.get(int(ex.job_id))
        attempt = self.store.attempt(int(ex.job_id), ex.attempt)
        if job is None or attempt is None or attempt.ended_at is not None:
            return
        codes = list(ex.exit_codes)
        clean = all(c == 0 for c in codes)
        first_bad = next((c for c in codes if c != 0), None)
        if attempt.sigterm_at is not None:
            lost = lost_work(attempt, job.gpus * job.replicas)
            self.store.update_attempt(job.id, ex.attempt, lost_work_gpu_s=lost)
            if self.metrics is not None and not job.cancel_requested:
                self.metrics.lost_work(job.queue, lost)
        if job.cancel_requested:
            reason, to = "cancelled", JobState.CANCELLED
        elif attempt.sigterm_at is not None:
            reason, to = ("killed" if ex.killed else "preempted"), JobState.REQUEUED
        elif clean:
            reason, to = "completed", JobState.SUCCEEDED
        else:
            reason, to = "failed", JobState.FAILED
        # An exit status nobody could read (the supervisor was lost) is recorded as -1.
        self.store.end_attempt(job.id, ex.attempt, ended_at=ex.ended_at,
                               exit_codes=[-1 if c is None else c for c in codes], reason=reason)
        self.stats.finished += 1
        actor = "warden"
        if to is JobState.REQUEUED:
            detail = f"exited {_codes(codes)} after SIGTERM" + (" and SIGKILL at the deadline" if ex.killed else "")
            self.store.transition(job.id, JobState.REQUEUED, reason=detail, actor=actor, now=now,
                                  preempted_at=[*job.preempted_at, attempt.sigterm_at])
            backoff = self.policy.thrash.requeue_backoff
            self.store.transition(job.id, JobState.PENDING, reason="requeued", actor=actor, now=now,
                                  pending_since=now, not_before=now + backoff if backoff > 0 else None)
        else:
            code = first_bad if first_bad is not None else 0
            self.store.transition(job.id, to, reason=f"{reason}: exit {_codes(codes)}", actor=actor,
                                  now=now, exit_code=code)

    # -- preempt ----------------------------------------------------------------------------
    def _preempt(self, job: Any, attempt: Any, grace: float, for_job: str, kind: str, lost: float,
                 now: float) -> None:
        kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
        self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=now, kill_at=kill_at,
                                  preempted_for=for_job)
        self.store.transition(job.id, JobState.PREEMPTING, now=now, actor="warden",
                              reason=f"preempted for job {for_job} ({kind}); grace {grace:.0f}s, "
                                     f"SIGKILL at {kill_at:.3f}; expected lost work {lost:.0f} GPU-s")
        if self.metrics is not None:
            self.metrics.preemption(job.queue, job.tier, kind)

    def cancel(self, job: Any, actor: str) -> None:
        """Cancel through the same path as a preemption: SIGTERM, grace, SIGKILL, then CANCELLED."""
        with self.lock:
            now = self.clock()
            state = job.state
            if state.terminal:
                return
            if state in WAITING:
                self.store.transition(job.id, JobState.CANCELLED, reason="cancelled", actor=actor, now=now,
                                      expect_state={state}, cancel_requested=True)
                return
            self.store.update(job.id, cancel_requested=True)
            attempt = self.store.attempt(job.id, job.attempt)
            if attempt is not None and attempt.ended_at is None and attempt.sigterm_at is None:
                grace = job.grace_s if job.grace_s is not None else self.policy.tier(job.tier).grace
                kill_at = self.executor.terminate(str(job.id), attempt.number, grace)
                self.store.update_attempt(job.id, attempt.number, state="terminating", sigterm_at=now,
                                          kill_at=kill_at)
        self.poke()

    # -- admit ------------------------------------------------------------------------------
    def _admit(self, job: Any, placement: tuple[ReplicaPlacement, ...], flavor: str, borrowing: bool,
               now: float) -> None:
        number = job.attempt + 1
        attempt_dir = self.state_dir / "jobs" / str(job.id) / f"attempt-{number}"
        waited = job.waited_s + max(0.0, now - (job.pending_since if job.pending_since is not None else job.submit_at))
        if not self.store.transition(job.id, JobState.ADMITTED, reason=_placed(placement, borrowing),
                                     actor="warden", now=now, expect_state={JobState.PENDING,
                                                                            JobState.REQUEUED},
                                     attempt=number, waited_s=waited, pending_since=None):
            return  # cancelled meanwhile
        # The attempt row holds the GPUs in the database before any process exists.
        self.store.start_attempt(job.id, number, started_at=now, assignment=placement, flavor=flavor,
                                 borrowing=borrowing, handle=None, log_dir=str(attempt_dir))
        self._explained.pop(str(job.id), None)
        if self.metrics is not None:
            self.metrics.admission(job.queue, job.tier, waited)
        spec = LaunchSpec(
            job_id=str(job.id), attempt=number, command=tuple(job.command),
            replicas=_replicas(placement),
            grace_s=job.grace_s if job.grace_s is not None else self.policy.tier(job.tier).grace,
            workdir=Path(job.workdir), log_dir=attempt_dir,
            checkpoint_dir=self.state_dir / "jobs" / str(job.id) / "checkpoints",
            env={**(job.env or {}), **(self.report_env(str(job.id), number) if self.report_env else {})})
        try:
            handle = self.executor.start(spec)
        except OSError as err:
            self.store.end_attempt(job.id, number, ended_at=now, exit_codes=[], reason="failed")
            self.store.transition(job.id, JobState.FAILED, reason=f"could not start: {err}",
                                  actor="warden", now=now)
            return
        self.store.update_attempt(job.id, number, handle=handle.to_dict())
        self.store.transition(job.id, JobState.STARTING, reason="processes started", actor="warden", now=now)
        self.store.transition(job.id, JobState.RUNNING, reason="running", actor="warden", now=now)

    # -- explain ----------------------------------------------------------------------------
    def _explain(self, plan: Plan) -> None:
        """Store the explanations that changed. A job's wait grows every pass, so it is left
        out of the comparison (the API adds the current wait when it shows the sort key)."""
        changed = {}
        for job_id, e in plan.explanations.items():
            k = e.sort_key
            seen = (e.reason, e.position, k.tier, k.breach, k.fair_rank, k.fair_share)
            if self._explained.get(job_id) != seen:
                self._explained[job_id] = seen
                changed[int(job_id)] = {"reason": e.reason.to_dict(), "sort_key": k.to_dict(),
                                        "position": e.position}
        if changed:
            self.store.set_explanations(changed)


def lost_work(attempt: Any, gpus: int) -> float:
    """GPU-seconds of progress a SIGTERM threw away, from what the attempt reported: none if
    a checkpoint finished after SIGTERM (the save on SIGTERM), else the progress since the
    later of the end of startup and the last checkpoint."""
    sigterm = attempt.sigterm_at
    if sigterm is None:
        return 0.0
    if attempt.last_checkpoint_at is not None and attempt.last_checkpoint_at >= sigterm:
        return 0.0
    since = attempt.started_at + (attempt.startup_s or 0.0)
    if attempt.last_checkpoint_at is not None:
        since = max(since, attempt.last_checkpoint_at)
    return gpus * max(0.0, sigterm - since)


def _replicas(placement: tuple[ReplicaPlacement, ...]) -> tuple[ReplicaLaunch, ...]:
    """Ranks in placement order; LOCAL_RANK counts the replicas before it on the same node."""
    on_node: dict[str, int] = {}
    out = []
    for rank, p in enumerate(placement):
        local = on_node.get(p.node, 0)
        on_node[p.node] = local + 1
        out.append(ReplicaLaunch(rank=rank, node=p.node, gpus=p.gpus, local_rank=local))
    return tuple(out)


def _codes(codes: list[int | None]) -> str:
    return ",".join("?" if c is None else str(c) for c in codes) or "?"


def _placed(placement: tuple[ReplicaPlacement, ...], borrowing: bool) -> str:
    where = "; ".join(f"{p.node} GPUs {','.join(map(str, p.gpus)) or '-'}" for p in placement)
    return f"admitted on {where}" + (" (borrowing)" if borrowing else "")
