"""A tiny deterministic history driver for property tests of the engine.

Not the simulator: it knows just enough to apply plans. It holds the nodes, a policy, the jobs
(frozen `Job`s, moved through the functions of `warden.engine.lifecycle`, as the simulator moves
them, so that the property tests exercise the real lifecycle), the usage ledger and `now`. Every random
choice (arrivals, run times, when a signalled job exits, when an approval comes) is fixed up
front in the `JobSpec`s, so a history is a pure function of its specs and step gaps.

`Driver.step(now)` follows the simulator's event order at one time (DESIGN §8): completions and
exits first, then approvals and arrivals, then one `schedule(snapshot, now)`, whose plan is then
applied:

- an `Admission` makes the job RUNNING with a new `Attempt` on the plan's placement
  (`lifecycle.admitted`);
- a `Preemption` makes the victim PREEMPTING: `sigterm_at=now`, `kill_at=now+grace`
  (`lifecycle.signalled`); the history fixes when in `[sigterm_at, kill_at]` it exits;
- a preempted job that exits releases every replica at once, its `preempted_at` gains its
  SIGTERM's time, and it is requeued in one step, as the simulator requeues it
  (`lifecycle.exited`, then `lifecycle.requeued`): PENDING, with `pending_since=now`, the
  back-off and no attempt;
- exactly the waiting jobs in `Plan.claims` carry `Job.claim` into the next pass.

`Driver.engine` chooses the path a pass takes: `"fresh"` calls `schedule()` (a new `Engine`
every pass), `"warm"` keeps one `Engine` and hands it every snapshot whole, and `"changed"`
keeps one `Engine` and tells it only the jobs that changed since the previous pass (an empty
job list otherwise), the way the simulator and the server drive it. On the warm paths every
plan is compared with a fresh `schedule()` of the same snapshot, and the engine's allocation
with one built afresh (`check_warm_engine`).

`Driver.next_time(gap)` never steps past the next event, so a terminating job always exits at
exactly the time its spec chose: never after `kill_at`, and the ledger is accrued before every
change to the set of jobs holding resources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from walk_reference import one_by_one

from warden.engine import lifecycle
from warden.engine.accounting import expected_end
from warden.engine.allocation import Allocation
from warden.engine.fairshare import accrue, cluster_capacity
from warden.engine.model import Attempt, Job, JobState, Node, Snapshot, UsageLedger
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.engine.rules import RuleContext, closes_at, guarded, protection
from warden.engine.scheduler import Engine, schedule

__all__ = ["Driver", "Eviction", "JobSpec", "StepRecord", "run_history"]


@dataclass(frozen=True)
class JobSpec:
    """A job as submitted plus the facts of its future the history decided in advance."""

    job: Job
    """The job at submission (PENDING or AWAITING_APPROVAL); `submit` is its arrival time."""
    duration: float
    """Seconds of running one attempt needs to finish (every attempt starts over)."""
    approve_after: float | None = None
    """AWAITING_APPROVAL jobs: seconds after arrival an admin approves them (None: never)."""
    startup_s: float | None = None
    """Startup time the job reports once it has started up (None: never reported)."""
    checkpoint_every: float | None = None
    """Seconds of running between checkpoints, counted from the end of startup."""
    checkpoint_cost: float = 0.0
    """Seconds each checkpoint takes (added to the attempt's `checkpoint_s`)."""
    sigterm_save_s: float | None = None
    """Reported duration of a save on SIGTERM (None: the job does not save on SIGTERM)."""
    exit_fracs: tuple[float, ...] = (1.0,)
    """For the k-th preemption, where in [sigterm_at, kill_at] the job exits (cycled)."""

    @property
    def arrival(self) -> float:
        return self.job.submit


@dataclass(frozen=True)
class Eviction:
    """One preemption as the driver carried it out."""

    job_id: str
    attempt: int
    for_job: str
    sigterm_at: float
    kill_at: float
    grace: float
    exit_at: float
    exited: bool = False


@dataclass(frozen=True)
class StepRecord:
    now: float
    snapshot: Snapshot
    plan: Plan
    completed: tuple[str, ...] = ()
    exited: tuple[str, ...] = ()
    arrived: tuple[str, ...] = ()
    approved: tuple[str, ...] = ()


PlanHook = Callable[[Snapshot, Plan, float], None]
EnginePath = Literal["fresh", "warm", "changed"]


def check_warm_engine(engine: Engine, snapshot: Snapshot, plan: Plan, now: float) -> None:
    """The warm engine's plan is a fresh pass's and a walk over every job's (`walk_reference`), and what it keeps between passes equals a
    fresh build from the snapshot, with every derived quota value true to its definition."""
    waiting_for_victims = {i for i, e in plan.explanations.items() if e.reason.code == "WaitingForGrace"}
    assert plan.claims == waiting_for_victims, f"claims {sorted(plan.claims)} != {sorted(waiting_for_victims)}"
    fresh = schedule(snapshot, now)
    assert plan == fresh, f"warm plan differs from a fresh pass at t={now}:\n{plan}\n{fresh}"
    every = one_by_one(snapshot, now)
    assert plan == every, f"plan differs from a walk over every job at t={now}:\n{plan}\n{every}"
    alloc = engine._alloc
    assert alloc is not None
    built = Allocation(snapshot.nodes, snapshot.policy)
    built.sync(j for j in snapshot.jobs if j.state.holds_resources and j.attempt is not None)
    alloc.index.check()
    alloc.quota.check()
    assert engine._index is not None
    engine._index.check()
    ctx = RuleContext(snapshot.policy, built.quota, now)
    alloc.releases.check(alloc.jobs, now, lambda v: (protection(ctx, v), expected_end(v), closes_at(ctx, v)))
    alloc.releases_t1.check(
        alloc.jobs,
        now,
        lambda v: (protection(ctx, v, guarded(1, v.tier)), expected_end(v), closes_at(ctx, v, guarded(1, v.tier))),
    )
    assert alloc.jobs == built.jobs
    assert alloc.flavor_of_job == built.flavor_of_job
    assert {n: u for n, u in alloc.used.items() if u} == {n: u for n, u in built.used.items() if u}
    assert {t: n for t, n in alloc.tiers.items() if n} == {t: n for t, n in built.tiers.items() if n}
    for node in snapshot.nodes:
        assert alloc.index.free(node.name) == built.index.free(node.name), node.name
    for name in ("usage", "held", "child_held", "child_excess", "leaving"):
        ours, theirs = getattr(alloc.quota, name), getattr(built.quota, name)
        assert all(abs(a - b) < 1e-6 for x, y in zip(ours, theirs) for a, b in zip(x, y)), (
            f"quota {name} drifted: {ours} != {theirs}"
        )


@dataclass
class Driver:
    nodes: tuple[Node, ...]
    policy: Policy
    specs: tuple[JobSpec, ...]
    on_plan: PlanHook | None = None
    """Called with (snapshot, plan, now) after every pass, before the plan is applied."""
    engine: EnginePath = "fresh"
    now: float = 0.0
    jobs: dict[str, Job] = field(default_factory=dict)
    """Jobs that have arrived and are not finished, in arrival order."""
    finished: dict[str, Job] = field(default_factory=dict)
    ledger: UsageLedger = field(default_factory=UsageLedger)
    log: list[StepRecord] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    _spec: dict[str, JobSpec] = field(default_factory=dict)
    _arrivals: list[JobSpec] = field(default_factory=list)
    _attempts: dict[str, int] = field(default_factory=dict)
    _exit_at: dict[str, int] = field(default_factory=dict)
    """Job id → index into `evictions` of its eviction in flight."""
    _warm: Engine = field(default_factory=Engine)
    _told: dict[str, Job] = field(default_factory=dict)
    """`"changed"`: the jobs as the warm engine was last told them."""

    def __post_init__(self) -> None:
        ids = [s.job.id for s in self.specs]
        assert len(set(ids)) == len(ids), "job ids must be unique"
        self._spec = {s.job.id: s for s in self.specs}
        self._arrivals = sorted(self.specs, key=lambda s: (s.arrival, s.job.id))
        self._capacity = cluster_capacity(self.nodes)

    # -- time ---------------------------------------------------------------------------------
    def _completion_at(self, job: Job) -> float | None:
        a = job.attempt
        if job.state is not JobState.RUNNING or a is None or a.sigterm_at is not None:
            return None
        return a.started_at + self._spec[job.id].duration

    def _approval_at(self, job: Job) -> float | None:
        after = self._spec[job.id].approve_after
        if job.state is not JobState.AWAITING_APPROVAL or after is None:
            return None
        return job.submit + after

    def next_event(self) -> float | None:
        """The earliest time something happens by itself (arrival, approval, completion, exit)."""
        times: list[float] = []
        if self._arrivals:
            times.append(self._arrivals[0].arrival)
        for job in self.jobs.values():
            for t in (self._completion_at(job), self._approval_at(job)):
                if t is not None:
                    times.append(t)
        times += [self.evictions[i].exit_at for i in self._exit_at.values()]
        return min(times) if times else None

    def next_time(self, gap: float) -> float:
        """`now + gap`, or the next event if it comes first (never a step past an event).
        Before the first pass: the first event (or `gap`)."""
        if not self.log:
            nxt = self.next_event()
            return min(gap, nxt) if nxt is not None else gap
        t = self.now + gap
        nxt = self.next_event()
        if nxt is not None and nxt < t:
            t = nxt
        return t

    # -- one step -----------------------------------------------------------------------------
    def step(self, now: float) -> StepRecord:
        # One pass per point in time (DESIGN §8): every event up to `now` is handled in it.
        assert now > self.now or (not self.log and now == self.now), (
            f"passes at {self.now} and then {now}: time must move forward"
        )
        nxt = self.next_event()
        assert nxt is None or nxt >= now, f"stepping to {now} would skip an event at {nxt}"
        self._accrue(now)
        self.now = now
        completed, exited = self._finish_and_exit(now)
        arrived, approved = self._arrive_and_approve(now)
        self._refresh_facts(now)
        snapshot = Snapshot(self.nodes, tuple(self.jobs.values()), self.policy, self.ledger)
        plan = self._plan(snapshot, now)
        if self.on_plan is not None:
            self.on_plan(snapshot, plan, now)
        self._apply(plan, now)
        record = StepRecord(now, snapshot, plan, completed, exited, arrived, approved)
        self.log.append(record)
        return record

    def _plan(self, snapshot: Snapshot, now: float) -> Plan:
        if self.engine == "fresh":
            return schedule(snapshot, now)
        if self.engine == "warm":
            plan = self._warm.plan(snapshot, now)
        else:
            current = {j.id: j for j in snapshot.jobs}
            changed = [j for i, j in current.items() if self._told.get(i) is not j]
            changed += [self.finished[i] for i in self._told if i not in current]
            first = not self._told and not self.log
            self._told = current
            plan = self._warm.plan(snapshot if first else replace(snapshot, jobs=()), now, None if first else changed)
        check_warm_engine(self._warm, snapshot, plan, now)
        return plan

    def _accrue(self, now: float) -> None:
        self.ledger = accrue(self.ledger, self.jobs.values(), self._capacity, self.policy, now)

    def _finish_and_exit(self, now: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
        completed: list[str] = []
        exited: list[str] = []
        for job_id in list(self.jobs):
            job = self.jobs[job_id]
            if job_id in self._exit_at:
                k = self._exit_at[job_id]
                ev = self.evictions[k]
                # Events are never skipped: an exit is applied at exactly its time.
                assert ev.exit_at >= now, f"{job_id} should have exited at {ev.exit_at}, now {now}"
                if ev.exit_at <= now:
                    assert ev.sigterm_at <= now <= ev.kill_at
                    self.evictions[k] = replace(ev, exited=True)
                    del self._exit_at[job_id]
                    # The whole gang goes at once: the attempt (every replica) is dropped.
                    gone = lifecycle.exited(job, JobState.REQUEUED, preempted_at=ev.sigterm_at)
                    backoff = self.policy.thrash.requeue_backoff
                    self.jobs[job_id] = lifecycle.requeued(gone, now, backoff=backoff)
                    exited.append(job_id)
                continue
            end = self._completion_at(job)
            if end is not None:
                assert end >= now, f"{job_id} should have completed at {end}, now {now}"
                if end <= now:
                    self.finished[job_id] = lifecycle.finished(job)
                    del self.jobs[job_id]
                    completed.append(job_id)
        return tuple(completed), tuple(exited)

    def _arrive_and_approve(self, now: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
        arrived = []
        while self._arrivals and self._arrivals[0].arrival <= now:
            spec = self._arrivals.pop(0)
            self.jobs[spec.job.id] = spec.job
            arrived.append(spec.job.id)
        # After the arrivals, so a job approved the moment it arrives is approved in this pass.
        approved = []
        for job_id, job in self.jobs.items():
            t = self._approval_at(job)
            if t is not None and t <= now:
                # The table's edge is an approval's whole rule (the server's store checks it so).
                lifecycle.check(lifecycle.Event.APPROVED, job.state, JobState.PENDING)
                self.jobs[job_id] = replace(job, state=JobState.PENDING)
                approved.append(job_id)
        return tuple(arrived), tuple(approved)

    def _refresh_facts(self, now: float) -> None:
        """What the SDK would have reported by `now`: startup time and checkpoints."""
        for job_id, job in self.jobs.items():
            a = job.attempt
            if a is None or a.sigterm_at is not None:
                continue
            spec = self._spec[job_id]
            startup = spec.startup_s or 0.0
            facts: dict[str, object] = {}
            if spec.startup_s is not None and now >= a.started_at + spec.startup_s:
                facts["startup_s"] = spec.startup_s
            if spec.checkpoint_every:
                done = int(max(0.0, now - a.started_at - startup) // spec.checkpoint_every)
                if done:
                    facts["last_checkpoint_at"] = a.started_at + startup + done * spec.checkpoint_every
                    facts["checkpoint_s"] = done * spec.checkpoint_cost
            changed = {k: v for k, v in facts.items() if getattr(a, k) != v}
            if changed:
                self.jobs[job_id] = lifecycle.reported(job, replace(a, **changed))  # type: ignore[arg-type]

    def _apply(self, plan: Plan, now: float) -> None:
        for adm in plan.admissions:
            job = self.jobs[adm.job_id]
            assert job.state.waiting, f"admitted {adm.job_id} is {job.state}"
            number = self._attempts.get(job.id, 0) + 1
            self._attempts[job.id] = number
            spec = self._spec[job.id]
            attempt = Attempt(
                number=number,
                started_at=now,
                assignment=adm.placement,
                borrowing=adm.borrowing,
                sigterm_save_s=spec.sigterm_save_s,
                lent=adm.lent,
            )
            self.jobs[job.id] = lifecycle.admitted(job, now, attempt, starts=True)
        for pre in plan.preemptions:
            job = self.jobs[pre.job_id]
            a = job.attempt
            assert a is not None and job.state.holds_resources and a.sigterm_at is None, (
                f"preempted {pre.job_id} is {job.state} with attempt {a}"
            )
            spec = self._spec[job.id]
            frac = spec.exit_fracs[len(job.preempted_at) % len(spec.exit_fracs)]
            frac = min(1.0, max(0.0, frac))
            kill_at = now + pre.grace
            # Exit strictly after the signal (the pass at `now` is over) and never after kill_at.
            exit_at = min(kill_at, now + max(1.0, frac * pre.grace))
            self.jobs[job.id] = lifecycle.signalled(job, now, kill_at)
            self._exit_at[job.id] = len(self.evictions)
            self.evictions.append(Eviction(job.id, a.number, pre.for_job, now, kill_at, pre.grace, exit_at))
        # The shell's side of a claim: exactly the jobs the plan names hold one next pass.
        for job_id, job in self.jobs.items():
            claim = job.state.waiting and job_id in plan.claims
            if job.claim != claim:
                self.jobs[job_id] = lifecycle.claimed(job, claim)


def run_history(
    nodes: tuple[Node, ...],
    policy: Policy,
    specs: tuple[JobSpec, ...],
    gaps: tuple[float, ...],
    on_step: Callable[[Driver, StepRecord], None] | None = None,
    on_plan: PlanHook | None = None,
    engine: EnginePath = "fresh",
) -> Driver:
    """Drive one history: a step per gap (or earlier, at the next event)."""
    driver = Driver(nodes, policy, specs, on_plan=on_plan, engine=engine)
    for gap in gaps:
        record = driver.step(driver.next_time(gap))
        if on_step is not None:
            on_step(driver, record)
    return driver
