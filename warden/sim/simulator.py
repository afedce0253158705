"""The discrete-event loop: a trace replayed through the unchanged engine on a virtual clock.

At every moment something happens, the loop handles, in this order, (1) completions and
exits, (2) arrivals, (3) one scheduling pass — when some job waits. A pass hands the engine
a snapshot and the jobs that changed since the previous one (`Engine.plan(…, changed=…)`),
then applies the plan: victims get SIGTERM and exit after their save or at SIGKILL
(`warden.sim.workload`), admitted jobs start. An exit may fall at the same moment as the pass
that caused it (a job that does not handle SIGTERM); the loop then runs another round at that
moment, exits first again.

Jobs are made of pods: one pod holding the whole gang, or, for a policy that schedules pod by
pod (the `k8s` preset), one pod per replica. A job makes progress only while all its pods
run; that stretch is a *segment*. Each pod's time holding GPUs is one `SimAttempt`, split
into startup, checkpoint, useful, lost and idle time (idle: holding GPUs while the rest of
the gang is missing).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from warden.engine import lifecycle
from warden.engine.fairshare import accrue_rates, dominant_share
from warden.engine.model import Attempt, Job, JobState, Node, Snapshot, UsageLedger
from warden.engine.plan import Plan
from warden.engine.quota import QuotaTree
from warden.engine.reasons import engine_time
from warden.engine.scheduler import Engine
from warden.runtime import tune_collector
from warden.sim.presets import SimPolicy
from warden.sim.progress import SimProgress
from warden.sim.records import PreemptionCause, SimAttempt, SimJob, SimRun, Trace, TraceJob
from warden.sim.workload import checkpoint_times, finish_time, progress_at, sigterm_exit


class SimulationLoopError(RuntimeError):
    """The event loop stopped making progress: passes repeat at one moment, or never end.

    A scheduler that admits a job into capacity another job's preemption freed, then preempts
    it again, can cycle forever on a virtual clock; this error ends such a run with the jobs
    involved instead of hanging."""


# Event kinds, in the order they are handled at one moment (arrivals come between 0 and 2).
_DONE, _EXIT, _CKPT, _WAKE = 0, 0, 0, 2
_FINISH_K, _EXIT_K, _CKPT_K, _WAKE_K = "finish", "exit", "ckpt", "wake"


@dataclass(slots=True, eq=False)
class _Pod:
    """One engine job: the whole gang, or one replica of it."""

    eid: str
    gang: _Gang
    job: Job
    token: int = 0
    admitted_at: float = 0.0
    attempt_no: int = 0
    sigterm_at: float | None = None
    borrowing: bool = False
    # What this attempt spent, from segments that ended while it held its GPUs.
    startup: float = 0.0
    checkpoint: float = 0.0
    useful: float = 0.0
    lost: float = 0.0
    preempted: bool = False
    cause: PreemptionCause | None = None


@dataclass(slots=True, eq=False)
class _Gang:
    """One trace job and its progress."""

    spec: TraceJob
    pods: list[_Pod] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    wait_since: float = 0.0
    wait_s: float = 0.0
    saved: float = 0.0
    segment_at: float | None = None
    """When the current segment (all pods running) began; None: no segment."""
    token: int = 0
    interrupted: bool = False
    """A pod of the current segment was signalled: the segment ends at that pod's exit."""
    segment_end: float = 0.0
    """When the last interrupted segment ended (the save on SIGTERM written, or SIGKILL)."""
    finished_at: float | None = None
    records: list[SimAttempt] = field(default_factory=list)
    preemptions: int = 0
    """SIGTERMs its pods received (a loop guard names the jobs preempted most)."""


@dataclass
class Simulation:
    """One run of a trace under one policy on one cluster."""

    trace: Trace
    nodes: tuple[Node, ...]
    policy: SimPolicy
    entitlement: dict[str, float] = field(default_factory=dict)
    on_progress: Callable[[SimProgress], None] | None = None
    """Told where the run stands: before the first event, at most once every
    `progress_every_s` of wall time, and at the end (`SimProgress.ended`)."""
    progress_every_s: float = 0.1
    skipped: dict[str, int] = field(default_factory=dict)
    """Trace jobs the cluster can never run, by reason."""
    on_pass: Callable[[Snapshot, Plan, float], None] | None = None
    """Shown every pass with a snapshot that stays as it was (for invariant checks)."""
    max_passes_per_instant: int = 64
    """Passes at one simulated moment beyond this many plus the pods preempted at that moment
    raise `SimulationLoopError`. Another pass at the same moment runs only because the previous
    one's victims exited at once, so a run that needs more passes than it has distinct victims
    is evicting the same jobs again as fast as it admits them."""
    max_passes: int | None = None
    """More passes than this in the whole run raise `SimulationLoopError` (None: no bound); a
    cycle of preemptions that spans simulated time never ends otherwise."""

    def __post_init__(self) -> None:
        self.engine = Engine()
        self.pol = self.policy.policy
        self.behaviour = self.policy.behaviour
        self.capacity = (
            sum(n.gpus for n in self.nodes),
            sum(n.cpu for n in self.nodes),
            sum(n.memory for n in self.nodes),
        )
        self.fair = self.pol.scheduling.order == "governed"
        # Checkpoint times matter to the engine only where it prices victims by lost work.
        self.report_checkpoints = self.pol.preemption.victim_order == "cost" and any(
            t.preemptible for t in self.pol.tiers.values()
        )
        self.charged = {t: spec.charged for t, spec in self.pol.tiers.items()}
        self.grace_poll = self.behaviour.grace_poll
        self.backoff = self.pol.thrash.requeue_backoff
        self.live: dict[str, Job] = {}
        self.pods: dict[str, _Pod] = {}
        self.changed: dict[str, Job] = {}
        self.rates: dict[str, float] = {}
        self.ledger = UsageLedger()
        self.waiting = 0
        self.finished = 0
        self.events: list[tuple[float, int, int, str, object, int]] = []
        self.seq = 0
        self.wakes: set[float] = set()
        self.passes = 0
        self.engine_s = 0.0
        """Seconds spent inside `Engine.plan` (`SimRun.engine_s`)."""
        self.claimed: set[str] = set()
        """Waiting pods whose `claim` is set: what the last plan's `claims` named."""
        self.instant = -math.inf
        self.instant_passes = 0
        self.instant_starts: dict[str, int] = {}
        self.instant_signals: dict[str, list[str]] = {}
        self.reserved: set[str] = set()
        """Jobs the last plan reserved for (`PreemptionCause.reserved`)."""
        """Per engine id, at the moment of `instant`: admissions, and the preemptors of each SIGTERM."""
        self.width = len(str(len(self.trace.jobs)))
        """Engine ids are zero-padded trace positions: their string order is the trace's order."""

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> SimRun:
        tune_collector()
        wall = time.perf_counter()
        gangs = self._admissible()
        arrivals = [g.spec.submit for g in gangs]
        n, i = len(gangs), 0
        events = self.events
        now = arrivals[0] if n else 0.0
        report = self.on_progress
        if report is not None:
            report(self._progress(now, i, arrivals))
        next_report = time.perf_counter() + self.progress_every_s
        while i < n or events:
            now = min(arrivals[i] if i < n else math.inf, events[0][0] if events else math.inf)
            due_pass = False
            while events and events[0][0] == now and events[0][1] == 0:
                _, _, _, kind, obj, token = heapq.heappop(events)
                if kind == _FINISH_K:
                    due_pass |= self._finish(obj, token, now)  # type: ignore[arg-type]
                elif kind == _EXIT_K:
                    due_pass |= self._exit(obj, token, now)  # type: ignore[arg-type]
                else:
                    self._checkpoint(obj, token, now)  # type: ignore[arg-type]
            while i < n and arrivals[i] == now:
                self._arrive(gangs[i], now)
                i += 1
                due_pass = True
            while events and events[0][0] == now and events[0][3] == _WAKE_K:
                heapq.heappop(events)
                self.wakes.discard(now)
                due_pass = True
            if due_pass and self.waiting:
                self._pass(now)
            if report is not None and time.perf_counter() >= next_report:
                report(self._progress(now, i, arrivals))
                next_report = time.perf_counter() + self.progress_every_s
        if report is not None:
            report(replace(self._progress(now, i, arrivals), ended=True))
        records = tuple(self._record(g) for g in gangs)
        started = gangs[0].spec.submit if gangs else 0.0
        return SimRun(
            policy=self.policy.name,
            trace=self.trace.source,
            seed=self.trace.seed,
            gpus=self.capacity[0],
            jobs=records,
            started_at=started,
            ended_at=max(now, started),
            entitlement=dict(self.entitlement),
            max_wait={
                q.name: self.pol.max_wait_for(q.name)
                for q in self.pol.leaves()
                if math.isfinite(self.pol.max_wait_for(q.name))
            },
            charged_tiers=frozenset(t for t, charged in self.charged.items() if charged),
            wall_s=time.perf_counter() - wall,
            passes=self.passes,
            engine_s=self.engine_s,
        )

    def _progress(self, now: float, arrived: int, arrivals: list[float]) -> SimProgress:
        first, last = (arrivals[0], arrivals[-1]) if arrivals else (0.0, 0.0)
        return SimProgress(len(arrivals), arrived, self.finished, now, first, last)

    def _admissible(self) -> list[_Gang]:
        """The trace's jobs this cluster can run at all; the rest are counted in `skipped`.

        A gang runs on one GPU flavor, so a job that names none still needs one flavor with
        GPUs enough for all of it and a node large enough for one replica."""
        largest: dict[str, int] = {}
        flavor_gpus: dict[str, int] = {}
        for node in self.nodes:
            largest[node.flavor] = max(largest.get(node.flavor, 0), node.gpus)
            flavor_gpus[node.flavor] = flavor_gpus.get(node.flavor, 0) + node.gpus
        queues = {q.name for q in self.pol.leaves()}
        quota = QuotaTree(self.pol)
        gangs = []
        for spec in self.trace.jobs:
            flavors = list(flavor_gpus) if spec.flavor is None else [spec.flavor]
            if spec.flavor is not None and spec.flavor not in flavor_gpus:
                self._skip("flavor")
            elif not any(spec.num_gpus <= flavor_gpus[f] and spec.gpus_per_replica <= largest[f] for f in flavors):
                self._skip("larger_than_cluster")
            elif spec.queue not in queues:
                self._skip("queue")
            elif self._never_in_quota(spec, flavors, quota):
                self._skip("beyond_nominal")
            else:
                gangs.append(_Gang(spec))
        return gangs

    def _never_in_quota(self, spec: TraceJob, flavors: list[str], quota: QuotaTree) -> bool:
        """Is the job of a tier never admitted as borrowing (charged, not preemptible: DESIGN
        §4.2), and larger than a nominal quota on its path on every flavor it may use? Then it
        could never start. `quota`: the policy's tree with nothing running."""
        tier = self.pol.tier(spec.tier)
        if tier.preemptible or not tier.charged or not quota.governed():
            return False
        gang = Job(
            str(spec.seq),
            spec.queue,
            spec.tier,
            spec.submit,
            replicas=spec.replicas,
            gpus=spec.gpus_per_replica,
            cpu=spec.cpu,
            memory=spec.memory,
        )
        return not any(quota.in_quota(spec.queue, quota.demand(gang, f)) for f in flavors)

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def _push(self, t: float, order: int, kind: str, obj: object, token: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, order, self.seq, kind, obj, token))

    def _wake(self, t: float) -> None:
        if t not in self.wakes:
            self.wakes.add(t)
            self._push(t, _WAKE, _WAKE_K, None, 0)

    def _update(self, pod: _Pod, job: Job) -> None:
        pod.job = job
        self.changed[pod.eid] = job
        if job.state.terminal:
            del self.live[pod.eid]
        else:
            self.live[pod.eid] = job

    # -- arrivals ---------------------------------------------------------------------------
    def _arrive(self, gang: _Gang, now: float) -> None:
        spec = gang.spec
        split = self.behaviour.pods and spec.replicas > 1
        base = f"{spec.seq:0{self.width}d}"
        shapes = [(f"{base}/{r}", 1) for r in range(spec.replicas)] if split else [(base, spec.replicas)]
        for eid, replicas in shapes:
            job = Job(
                eid,
                spec.queue,
                spec.tier,
                spec.submit,
                JobState.PENDING,
                replicas=replicas,
                gpus=spec.gpus_per_replica,
                cpu=spec.cpu,
                memory=spec.memory,
                flavor=spec.flavor,
                user=spec.user,
                lease=spec.lease,
                time_limit=_runtime_left(spec, 0.0),
                pending_since=now,
            )
            pod = _Pod(eid, gang, job)
            gang.pods.append(pod)
            self.pods[eid] = pod
            self._update(pod, job)
        gang.waiting = len(gang.pods)
        gang.wait_since = now
        self.waiting += len(gang.pods)

    # -- a pass -----------------------------------------------------------------------------
    def _pass(self, now: float) -> None:
        self._count_pass(now)
        if self.fair:
            self._accrue(now)
        snapshot = Snapshot(self.nodes, self.live.values(), self.pol, self.ledger)  # type: ignore[arg-type]
        changed = self.changed.values()
        started = time.perf_counter()
        plan = self.engine.plan(snapshot, now, changed)
        self.engine_s += time.perf_counter() - started
        self.changed = {}
        self.passes += 1
        if self.on_pass is not None:
            self.on_pass(replace(snapshot, jobs=tuple(self.live.values())), plan, now)
        self._apply(plan, now)

    def _accrue(self, now: float) -> None:
        """Bring the usage ledger up to `now` at the rates in force since it was last brought up:
        called before every change of a rate (a start, a release) and before a pass, so each
        stretch of time is charged at the rates that held over it."""
        self.ledger = accrue_rates(self.ledger, self.rates, self.pol.fair_share.half_life, now)

    def _apply(self, plan: Plan, now: float) -> None:
        signals = self.instant_signals
        reserved = self.reserved
        for p in plan.preemptions:
            signals.setdefault(p.job_id, []).append(p.for_job)
            by = self.pods[p.for_job].gang.spec
            pod = self.pods[p.job_id]
            pod.cause = PreemptionCause(by.job_id, by.tier, p.kind, p.for_job in reserved)
            self._signal(pod, now, p.grace)
        self.reserved = {r.job_id for r in plan.reservations}
        limit = self.behaviour.admissions_per_queue
        per_queue: dict[str, int] = {}
        held_back: list[str] = []
        starts = self.instant_starts
        for a in plan.admissions:
            pod = self.pods[a.job_id]
            if limit is not None:
                q = pod.job.queue
                if per_queue.get(q, 0) >= limit:
                    held_back.append(a.job_id)
                    continue
                per_queue[q] = per_queue.get(q, 0) + 1
            self._start(pod, now, a.placement, a.borrowing, a.lent)
            starts[a.job_id] = starts.get(a.job_id, 0) + 1
        claims_moved = self._claims(plan, held_back)
        progress = bool(plan.preemptions) or len(held_back) < len(plan.admissions) or claims_moved
        if held_back:
            self._wake_for(now + self.behaviour.cycle_s, now, progress, held_back)
        for r in plan.reservations:
            if r.due is not None and r.due > now:
                self._wake(r.due)
            if r.signal_at is not None and r.signal_at > now:
                self._wake(r.signal_at)  # the holder preempts a job in its capacity then

    def _claims(self, plan: Plan, held_back: list[str]) -> bool:
        """Mark `Job.claim` on exactly the waiting jobs the plan names (`Plan.claims`), so what
        their victims free stays theirs in the next pass; True when any mark changed.

        An admission the shell held back (Kueue's one per queue per cycle) keeps the claim the
        job came with: the plan gave it the capacity, the shell only postpones the start."""
        keep = set(plan.claims) | {eid for eid in held_back if self.pods[eid].job.claim}
        moved = False
        for eid in self.claimed | keep:
            pod = self.pods[eid]
            want = eid in keep and pod.job.state.waiting
            if pod.job.claim != want:
                self._update(pod, lifecycle.claimed(pod.job, want))
                moved = True
        self.claimed = {eid for eid in keep if self.pods[eid].job.claim}
        return moved

    def _wake_for(self, t: float, now: float, progress: bool, jobs: list[str]) -> None:
        """A pass the plan asks for at `t`. One at this very moment repeats the pass; unless the
        plan changed something, the repeat would see the same snapshot and ask again forever."""
        if t <= now:
            if not progress:
                raise SimulationLoopError(
                    f"the pass at {engine_time(now)} changed nothing (no admission, no preemption, no "
                    f"claim) yet asked for another pass at the same moment, for {self._names(jobs)}"
                )
            t = now
        self._wake(t)

    # -- loop guards ------------------------------------------------------------------------
    def _count_pass(self, now: float) -> None:
        """Refuse to run a pass past either bound, naming the jobs that keep the loop going."""
        if now != self.instant:
            self.instant, self.instant_passes = now, 0
            self.instant_starts, self.instant_signals = {}, {}
        self.instant_passes += 1
        if self.instant_passes > self.max_passes_per_instant + len(self.instant_signals):
            raise SimulationLoopError(
                f"{self.instant_passes} scheduling passes at {engine_time(now)}, more than "
                f"max_passes_per_instant={self.max_passes_per_instant} plus the "
                f"{len(self.instant_signals)} job(s) preempted at that moment: {self._churn()}"
            )
        if self.max_passes is not None and self.passes >= self.max_passes:
            worst = sorted(
                (g for g in {p.gang for p in self.pods.values()} if g.preemptions),
                key=lambda g: (-g.preemptions, g.spec.seq),
            )[:5]
            most = ", ".join(f"{g.spec.job_id} ({g.preemptions})" for g in worst) or "none"
            raise SimulationLoopError(
                f"more than max_passes={self.max_passes} scheduling passes by {engine_time(now)}; "
                f"jobs preempted most (SIGTERMs): {most}"
            )

    def _churn(self) -> str:
        """The jobs signalled at the current moment, most often first, with their preemptors."""
        signalled = sorted(self.instant_signals.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        parts = []
        for eid, by in signalled[:5]:
            parts.append(
                f"job {self._names([eid])} preempted {len(by)} time(s) (for "
                f"{self._names(sorted(set(by)))}) and admitted {self.instant_starts.get(eid, 0)} "
                "time(s) at this moment"
            )
        if not parts:
            return "no job was preempted at this moment"
        return "; ".join(parts)

    def _names(self, eids: list[str], most: int = 5) -> str:
        """Engine ids as the trace's job ids (a pod of a split gang keeps its replica number)."""
        names = []
        for eid in eids[:most]:
            pod = self.pods.get(eid)
            if pod is None:
                names.append(eid)
            else:
                _, _, replica = eid.partition("/")
                names.append(pod.gang.spec.job_id + (f"/{replica}" if replica else ""))
        more = f" and {len(eids) - most} more" if len(eids) > most else ""
        return ", ".join(names) + more

    # -- starting ---------------------------------------------------------------------------
    def _start(self, pod: _Pod, now: float, placement: tuple, borrowing: bool, lent: bool = False) -> None:
        gang = pod.gang
        spec = gang.spec
        pod.token += 1
        pod.attempt_no += 1
        pod.admitted_at = now
        pod.sigterm_at = None
        pod.borrowing = borrowing
        pod.startup = pod.checkpoint = pod.useful = pod.lost = 0.0
        pod.preempted = False
        pod.cause = None
        job = pod.job
        attempt = Attempt(
            pod.attempt_no,
            now,
            placement,
            borrowing,
            startup_s=spec.startup_seconds,
            sigterm_save_s=spec.checkpoint_seconds if spec.resumable else None,
            lent=lent,
        )
        self._update(
            pod,
            lifecycle.admitted(job, now, attempt, starts=True, time_limit=_runtime_left(spec, gang.saved)),
        )
        self.waiting -= 1
        gang.waiting -= 1
        if gang.waiting == 0:
            gang.wait_s += now - gang.wait_since
        gang.running += 1
        if self.fair and self.charged[job.tier]:
            self._accrue(now)
            self.rates[job.queue] = self.rates.get(job.queue, 0.0) + dominant_share(pod.job, self.capacity)
        if gang.running == len(gang.pods):
            self._begin_segment(gang, now)

    def _begin_segment(self, gang: _Gang, now: float) -> None:
        spec = gang.spec
        gang.segment_at = now
        gang.interrupted = False
        gang.token += 1
        self._push(finish_time(spec, now, gang.saved), _DONE, _FINISH_K, gang, gang.token)
        if self.report_checkpoints:
            for t in checkpoint_times(spec, now, gang.saved):
                self._push(t, _CKPT, _CKPT_K, gang, gang.token)

    def _checkpoint(self, gang: _Gang, token: int, now: float) -> None:
        """A periodic save ended: tell the engine, whose victim cost counts from it."""
        if token != gang.token or gang.interrupted or gang.segment_at is None:
            return
        p = progress_at(gang.spec, gang.segment_at, gang.saved, now)
        for pod in gang.pods:
            a = pod.job.attempt
            if a is not None:
                self._update(pod, _checkpointed(pod.job, a, pod.checkpoint + p.checkpoint_s, now))

    # -- ending -----------------------------------------------------------------------------
    def _segment_part(self, gang: _Gang, until: float, saved: float, done: float, checkpoint_s: float) -> None:
        """Book the segment that ran from `gang.segment_at` to `until` on each running pod."""
        start = gang.segment_at
        assert start is not None
        startup = min(gang.spec.startup_seconds, until - start)
        useful = max(0.0, saved - gang.saved)
        lost = max(0.0, done - gang.saved - useful)
        for pod in gang.pods:
            if pod.job.attempt is not None:
                pod.startup += startup
                pod.checkpoint += checkpoint_s
                pod.useful += useful
                pod.lost += lost
        gang.saved = saved
        gang.segment_at = None

    def _finish(self, gang: _Gang, token: int, now: float) -> bool:
        if token != gang.token or gang.interrupted:
            return False
        p = progress_at(gang.spec, gang.segment_at, gang.saved, now)  # type: ignore[arg-type]
        self._segment_part(gang, now, gang.spec.duration, gang.spec.duration, p.checkpoint_s)
        gang.finished_at = now
        self.finished += 1
        gang.token += 1
        for pod in gang.pods:
            self._release(pod, now)
            self._update(pod, lifecycle.finished(pod.job))
        return True

    def _signal(self, pod: _Pod, now: float, grace: float) -> None:
        """SIGTERM to a pod; its exit (after a save, or at SIGKILL) is scheduled."""
        gang = pod.gang
        kill_at = now + grace
        if self.grace_poll:
            kill_at = math.ceil(kill_at / self.grace_poll) * self.grace_poll
        self._update(pod, lifecycle.signalled(pod.job, now, kill_at))
        pod.sigterm_at = now
        pod.preempted = True
        gang.preemptions += 1
        exit_at = now
        if gang.segment_at is not None and not gang.interrupted:
            ex = sigterm_exit(gang.spec, gang.segment_at, gang.saved, now, kill_at)
            gang.interrupted = True
            gang.token += 1
            self._segment_part(gang, ex.at, ex.saved, ex.done, ex.checkpoint_s)
            gang.segment_end = exit_at = ex.at
        elif gang.interrupted and gang.segment_end > now:
            exit_at = gang.segment_end  # signalled with the rest of its gang: it saves with them
        pod.token += 1
        self._push(exit_at, _EXIT, _EXIT_K, pod, pod.token)

    def _exit(self, pod: _Pod, token: int, now: float) -> bool:
        if token != pod.token:
            return False
        assert pod.sigterm_at is not None
        self._release(pod, now)
        job = pod.job
        gone = lifecycle.exited(job, JobState.REQUEUED, preempted_at=pod.sigterm_at)
        requeued = lifecycle.requeued(gone, now, backoff=self.backoff, restart_age=self.behaviour.requeue_restarts_age)
        self._update(pod, requeued)
        not_before = requeued.not_before
        gang = pod.gang
        if gang.waiting == 0:
            gang.wait_since = now
        gang.waiting += 1
        self.waiting += 1
        if not_before is not None:
            self._wake(not_before)
        return True

    def _release(self, pod: _Pod, now: float) -> None:
        """The pod gives its GPUs back: close its attempt record."""
        gang = pod.gang
        job = pod.job
        held = now - pod.admitted_at
        idle = held - pod.startup - pod.checkpoint - pod.useful - pod.lost
        gang.records.append(
            SimAttempt(
                number=pod.attempt_no,
                admitted_at=pod.admitted_at,
                ended_at=now,
                gpus=job.total_gpus,
                startup_s=pod.startup,
                checkpoint_s=pod.checkpoint,
                useful_s=pod.useful,
                lost_s=pod.lost,
                idle_s=idle if idle > 1e-6 else 0.0,
                preempted=pod.preempted,
                cause=pod.cause,
                sigterm_at=pod.sigterm_at,
                borrowing=pod.borrowing,
            )
        )
        gang.running -= 1
        if self.fair and self.charged[job.tier]:
            self._accrue(now)
            rate = self.rates[job.queue] - dominant_share(job, self.capacity)
            self.rates[job.queue] = rate if gang.running or rate > 1e-12 else 0.0

    def _record(self, gang: _Gang) -> SimJob:
        s = gang.spec
        wait = gang.wait_s
        return SimJob(
            s.job_id,
            s.queue,
            s.tier,
            s.user,
            s.submit,
            s.num_gpus,
            s.duration,
            gang.finished_at,
            wait,
            tuple(sorted(gang.records, key=lambda r: (r.admitted_at, r.number))),
        )


def _runtime_left(spec: TraceJob, saved: float) -> float:
    """Seconds an attempt that starts with `saved` progress runs if left alone (startup, the
    rest of the work, its periodic saves): the time limit the engine is given for it.

    Every simulated job carries its true runtime as its limit, as if each user's `--time-limit`
    were exactly how long the job runs. The engine takes an attempt's start plus its limit as
    when its capacity frees; with the runtime there, its forecasts, reservations and backfill
    know when each job ends, and no job runs out its limit (none ends TIMEOUT)."""
    return finish_time(spec, 0.0, saved)


def _checkpointed(job: Job, a: Attempt, checkpoint_s: float, at: float) -> Job:
    """`job` whose attempt `a` has spent `checkpoint_s` checkpointing, the newest save ending
    `at`: the commonest change to a pod's job, written out field by field (`dataclasses.replace`
    costs more than the job is worth at one checkpoint per pod)."""
    attempt = Attempt(
        a.number,
        a.started_at,
        a.assignment,
        a.borrowing,
        a.startup_s,
        checkpoint_s,
        at,
        a.sigterm_save_s,
        a.sigterm_at,
        a.kill_at,
        a.lent,
    )
    return lifecycle.reported(job, attempt)


def simulate(
    trace: Trace,
    nodes: tuple[Node, ...],
    policy: SimPolicy,
    entitlement: dict[str, float] | None = None,
    on_progress: Callable[[SimProgress], None] | None = None,
) -> tuple[SimRun, dict[str, int]]:
    """Replay the trace; returns the run and the trace jobs skipped as impossible, by reason."""
    sim = Simulation(trace, nodes, policy, dict(entitlement or {}), on_progress)
    return sim.run(), dict(sim.skipped)
