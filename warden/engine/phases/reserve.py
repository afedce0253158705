"""Phase 5, reserve: the top blocked jobs hold the capacity that frees first (DESIGN §4.2).

Up to `scheduling.reservations` jobs that neither fit nor can make room look for the earliest
time they would fit (`Reserve.forecast`) and hold the part of that future placement that is
free now; a lower job may start in it only if it ends before the reservation is due, or if the
holder may preempt it at due − its grace (`phases.admit`, `PassState.lent`). Without expected
ends nothing can be forecast and nothing is reserved.

The holder takes such jobs back itself. Its forecast counts the running jobs of a strictly
lower tier that started in reserved capacity (`Attempt.lent`) as jobs it may preempt, whatever
the `scope` rule says (`Reserve._takes`); they never set when it is due, they only fill out a
placement that something else frees. A pass at or after due − a needed victim's grace
(`rules.reservation_takes`) signals that victim on the holder's behalf (`Reserve.take_back`),
so it is gone when the reservation is due; the reservation tells the shell when the next such
signal is due (`Reservation.signal_at`), so that a pass runs then.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from warden.engine.model import Job
from warden.engine.phases.nextstep import NextSteps
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.placement import CapacityIndex
from warden.engine.plan import Preemption, Reservation
from warden.engine.preemption import Candidate, search, set_cost
from warden.engine.quota import QuotaTree
from warden.engine.reasons import Fragmented, InsufficientCapacity, PreemptionWouldNotPay, Reason
from warden.engine.rules import (
    PAIR_READS,
    PRODUCTION,
    RECLAIM,
    PairKey,
    Preemptor,
    RuleContext,
    allowed,
    downward_allowed,
    grace_of,
    kind_of,
    pair_key,
    preemptor,
    preemptors,
    reservation_takes,
    victim_cost,
)

INF = math.inf

Freeing = tuple[float, str, Job, int]
"""(when, job id, job, how it frees: `ITSELF`, `TAKEN` or `LENT`): a running job whose capacity
a forecast counts on."""
ITSELF, TAKEN, LENT = 0, 1, 2
"""It ends or exits by itself; the job preempts it under the rules; or the job takes it back
from the reserved capacity it was started in (`Attempt.lent`; a strictly lower tier, preempted
whatever `scope` says, `Reserve._takes`)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """When and where a blocked job would fit first."""

    due: float
    names: tuple[str, ...]
    """Its placement then: one node per replica."""
    waits_for: tuple[Job, ...]
    """The jobs whose exits it waits for, in the order they free capacity."""
    taken: tuple[Job, ...] = ()
    """Those of them it needs preempted (none it could do without), in release order: what
    `Reserve.take_back` signals ahead of `due`, and all its reason names."""
    flavor: str = ""
    """The flavor it fits on then."""


class Reserve:
    __slots__ = ("state", "steps", "victims")

    def __init__(self, state: PassState, victims: Victims, steps: NextSteps) -> None:
        self.state = state
        self.victims = victims
        self.steps = steps
        """Names the rule that holds a job waiting for its victims' protection to lift."""

    def attempt(self, job: Job, blocked: Reason, natural: bool = False, first: Forecast | None = None) -> Reason | None:
        """Reserve for the job where capacity frees first (by itself alone, `natural`: the job
        declined to preempt), and say why it waits (`blocked`, with the reservation's due
        time); None when none can be made. `first`: that forecast, where the caller has it
        already for the state the pass is in. (The caller keeps count of
        `scheduling.reservations`.)"""
        state = self.state
        best = first if first is not None else self.earliest(job, state.flavors(job), INF, natural)
        if best is None:
            return None
        early = self._early(job, best)
        state.hold(job, best.names, best.due, backfill=True)
        waiting_for, signal_at = self.take_back(job, best, early)
        state.reservations.append(
            Reservation(
                job.id, best.due, tuple(dict.fromkeys(best.names)), tuple(j.id for j in best.waits_for), signal_at
            )
        )
        if waiting_for:
            return self.steps.lease(job, waiting_for, best.due)
        if isinstance(blocked, (InsufficientCapacity, Fragmented, PreemptionWouldNotPay)):
            return replace(blocked, reserved_at=best.due)
        return blocked

    def _early(self, job: Job, best: Forecast) -> bool:
        """May the reservation signal those of its victims whose time has come ahead of the
        others? Only where the search at `due`, with them gone, still takes the others and no
        more (their leaving may change what it finds: a queue they left borrows no more, or
        makes the job in-quota, or another node becomes the cheaper place). Else the preempt
        phase's search takes the whole set at `due`, as named."""
        state = self.state
        if best.due <= state.now or not best.taken:
            return True
        now = state.now
        early = [v for v in best.taken if reservation_takes(state.ctx, job.tier, v, best.due) <= now]
        if not early or len(early) == len(best.taken):
            return True
        taken = {v.id for v in best.taken}
        gone = [v for v in best.waits_for if v.id not in taken] + early
        mark = state.mark()
        for v in gone:
            state.release_job(v, only=best.flavor)
        rest = self._search_at(job, best.flavor, best.due, [(v, ITSELF) for v in gone])
        state.rollback(mark)
        return rest is not None and {v.id for v in rest} == taken - {v.id for v in early}

    def take_back(self, job: Job, best: Forecast, early: bool = True) -> tuple[tuple[Job, ...], float | None]:
        """Signal, on the job's behalf, each victim its forecast counts on whose time has come
        (`rules.reservation_takes`: due − its grace, or when its protection lifts if later):
        then it is gone when the reservation is due (where `early`, `_early`; else none now). Every victim it needs, signalled now or
        later, and no more (what its reason names: what it preempts), and when the first still
        to be signalled will be (None: none)."""
        state = self.state
        now, policy = state.now, state.policy
        signal_at: float | None = None
        if best.due <= now:
            return best.taken, None  # it fits now: the preempt phase's business
        times = [reservation_takes(state.ctx, job.tier, v, best.due) for v in best.taken]
        if not early:
            return best.taken, min((t for t in times if t > now), default=None)  # all at `due`
        if INF in times:
            # One of them it may take only by the preempt phase's search at `due` (a reclaim):
            # the set is taken there whole, as the search chose it. Taking the others ahead
            # would change what that search finds (a queue that no longer borrows).
            return best.taken, None
        signalled = False
        for v, at in zip(best.taken, times):
            if at > now:
                if at < INF and (signal_at is None or at < signal_at):
                    signal_at = at
                continue
            grace = grace_of(policy, v)
            cost, lost = victim_cost(policy, v, now)
            state.preemptions.append(Preemption(v.id, job.id, kind_of(job, v), grace, cost, lost))
            quota = state.quota
            if state.charged(v) and v.queue in quota.paths:
                quota.depart(v.queue, quota.demand(v, state.flavor_of_job[v.id]))
                state.memo.quota_version += 1
            state.claimed.add(v.id)
            self.victims.taken(v)
            signalled = True
        if signalled:
            # Its victims leave for it, as a claim's do: what it will need of its queues'
            # quota is kept from the jobs after it in this pass, and no borrower takes it.
            state.claiming(job)
            d = state.demand(job, best.flavor)
            if d:
                state.quota.add(job.queue, d)
                state.memo.quota_version += 1
        return best.taken, signal_at

    def earliest(self, job: Job, flavors: Sequence[str], before: float, natural: bool) -> Forecast | None:
        """`forecast` on whichever of `flavors` frees first (the first flavor on a tie), if
        before `before`."""
        best: Forecast | None = None
        for flavor in flavors:
            found = self.forecast(job, flavor, before if best is None else best.due, natural)
            if found is not None:
                best = found  # strictly earlier than the bound, so than any before it
        return best

    def forecast(self, job: Job, flavor: str, before: float = INF, natural: bool = False) -> Forecast | None:
        """Release jobs in the order they will free capacity until the job fits on `flavor`.
        None when it never fits, or not before `before` (the due time another flavor already
        has). `natural`: count only what frees by itself (jobs leaving, jobs ending), none the
        job would preempt. The state is left as it was."""
        state = self.state
        d = state.demand(job, flavor)
        freeing = self._natural() if natural else self._freeing(preemptor(state.ctx, job, d))
        mark = state.mark()
        released: list[tuple[Job, int]] = []
        found = None
        now = state.now
        waits = False  # has a job been released that the holder did not lend capacity to?
        for t, _, v, how in freeing:
            if max(t, now) >= before:
                break  # due no earlier than `before`, as is every later release
            state.release_job(v, only=flavor)  # the fit is tested on `flavor` alone
            released.append((v, how))
            waits = waits or how != LENT
            if waits and state.fits(job, flavor, d):
                fit = state.mark()
                kept = self._needed(job, flavor, d, released)
                if kept and all(how == LENT for _, how in kept):
                    # Jobs it takes back never set when it is due: they only fill out a
                    # placement that something else frees. Go on without those it dropped.
                    released, waits = kept, False
                    continue
                taken = tuple(v for v, how in kept if how)
                if any(how == TAKEN for _, how in kept):
                    # What it will preempt then is what the preempt phase's search takes then.
                    state.rollback(fit)
                    chosen = self._search_at(job, flavor, max(t, now), released)
                    if chosen is None:
                        continue  # no set the search may take fits yet: wait for more to free
                    taken = chosen
                names = state.find(flavor, job)
                assert names is not None
                found = Forecast(max(t, now), names, tuple(v for v, _ in released), taken, flavor)
                break
        state.rollback(mark)
        return found

    def _search_at(self, job: Job, flavor: str, at: float, released: list[tuple[Job, int]]) -> tuple[Job, ...] | None:
        """The victims the preempt phase's search (`preemption.search`, every way the scope
        rule lets the job look, the cheapest set) takes for the job on `flavor` in a pass at
        `at`, with what frees by itself by then freed: the set its reason names, so that what
        warden says it will preempt is what it preempts (DESIGN §4.4). None when none makes
        room. The victims stay released in the state (the caller rolls it back)."""
        state = self.state
        itself = [v for v, how in released if how == ITSELF]
        mark = state.mark()
        for v, how in released:
            if how != ITSELF:
                state.retake_job(v, only=flavor)
        ws = _At(state, replace(state.ctx, now=at))
        d = state.demand(job, flavor)
        gone = {v.id for v in itself}
        best: list[Candidate] = []
        for p in preemptors(ws.ctx, job, d):
            pool = self.victims.pool_at(at, job.tier == PRODUCTION, gone)
            inner = state.mark()
            chosen = search(ws, p, flavor, pool, [])
            state.rollback(inner)
            if chosen and (not best or not set_cost(best) <= set_cost(chosen)):
                best = chosen
        if not best:
            state.rollback(mark)
            return None
        for c in best:
            state.release(c)
        return tuple(c.job for c in sorted(best, key=lambda c: c.rank))

    def _needed(
        self, job: Job, flavor: str, d: tuple[float, ...], released: list[tuple[Job, int]]
    ) -> list[tuple[Job, int]]:
        """The released jobs the job needs gone to fit: all that free by themselves, and of
        those it would preempt each, the latest first, unless it still fits without it (that
        one is taken back: the state is the caller's to roll back).

        A placement the job has (`at`) stays one while the jobs taken back hold nothing on its
        nodes, so only their quota is asked then: a forecast that released thousands of jobs
        places the job once per job that lands on where it would run, not once per job."""
        state = self.state
        names = state.find(flavor, job)
        at = set() if names is None else set(names)
        kept: list[tuple[Job, int]] = []
        for v, how in reversed(released):
            if how:
                state.retake_job(v, only=flavor)
                assert v.attempt is not None
                if names is not None and all(rp.node not in at for rp in v.attempt.assignment):
                    if state.within_quota(job, d):
                        continue
                elif state.fits(job, flavor, d):
                    names = state.find(flavor, job)
                    at = set() if names is None else set(names)
                    continue
                state.release_job(v, only=flavor)
            kept.append((v, how))
        kept.reverse()
        return kept

    def _natural(self) -> Iterator[Freeing]:
        """What frees by itself, soonest first (ties by id): terminating jobs nobody counts on
        at their SIGKILL deadline, running ones at their expected end."""
        state = self.state
        index = self.victims.releases()
        claimed, terminating = state.claimed, state.terminating
        jobs = index.jobs
        leaving = self._leaving()
        ending = ((end, i, jobs[i], ITSELF) for end, i in index.ending if i not in terminating and i not in claimed)
        return heapq.merge(leaving, ending, key=_time_and_id)

    def _leaving(self) -> list[Freeing]:
        """Terminating jobs nobody counts on yet, by SIGKILL deadline (then id)."""
        state = self.state
        claimed, now = state.claimed, state.now
        leaving: list[Freeing] = []
        for gone in state.terminating.values():
            if gone.id not in claimed:
                kill_at = gone.attempt.kill_at if gone.attempt is not None else None
                leaving.append((now if kill_at is None else kill_at, gone.id, gone, ITSELF))
        leaving.sort(key=_time_and_id)
        return leaving

    def _freeing(self, p: Preemptor) -> Iterator[Freeing]:
        """The jobs whose exits free capacity, soonest first (ties by id), each once.

        A terminating job frees its capacity at its SIGKILL deadline; a running one at its
        expected end, or — if P may preempt it (pair rules) and its protection lifts before
        that — when the protection lifts (`now` for a job the rules let go already, its end if
        that is earlier); a job started in reserved capacity (`LENT`, `_takes`) counts the
        same way whatever `scope` says. A job the rules will protect again before it ends (the
        last stretch of its time limit, `rules.closes_at`) counts at its end alone: a forecast
        never counts on preempting it, though the search at its due time takes it where a pass
        then may. The running jobs come in those orders from
        `Allocation.releases`, kept sorted between passes, and are merged here, each job taken
        from the order that applies to it: a forecast costs what it releases, not a walk over
        every running job.
        """
        state = self.state
        tier1 = p.job.tier == PRODUCTION
        index = self.victims.releases(tier1)
        # The pair rules read the quota usage, which the releases change: ask them first.
        may = {kind: self._takes(p, kind, v) for kind, v in index.kind_jobs().items()}
        claimed, terminating, now = state.claimed, state.terminating, state.now
        jobs, facts = index.jobs, index.facts
        kind_of = pair_key  # what `may` is keyed by: the index's kinds
        leaving = self._leaving()

        # A job P takes by a reclaim, not by priority, must also pass what depends on the job
        # itself (`RECLAIM.per_victim`: never below its queue's nominal, the swap, the shield),
        # judged as the forecast begins.
        ctx = state.ctx
        refused = {
            i
            for kind, v in index.kind_jobs().items()
            if may[kind] == TAKEN and not downward_allowed(ctx, p, v)
            for i in index.kinds[kind]
            if RECLAIM.per_victim(ctx, p, jobs[i], state.demand(jobs[i], state.flavor_of_job[i])) is None
        }

        def taken(way: int, v: Job) -> bool:
            return (way == TAKEN and v.id not in refused) or (way == LENT and _lent(v))

        def takes(v: Job) -> bool:
            return taken(may[kind_of(v)], v)

        def ending() -> Iterator[Freeing]:
            for end, i in index.ending:
                if i in terminating or i in claimed:
                    continue
                protected, _, closes = facts[i]
                v = jobs[i]
                # Taken from the lifting orders instead: its protection lifts before it ends.
                if (0.0 if protected <= now else protected) < end and closes == INF and takes(v):
                    continue
                yield end, i, v, ITSELF

        def free(i: str) -> bool:
            return i not in terminating and i not in claimed

        def lifted(kind: PairKey, way: int) -> Iterator[Freeing]:
            """The kind's jobs the rules let go now, taken `way` (`_takes`)."""
            for i in index.lifted.get(kind, ()):
                if _after(facts[i][1], now) and facts[i][2] == INF and free(i) and taken(way, jobs[i]):
                    yield now, i, jobs[i], way

        def lifting(kind: PairKey, way: int) -> Iterator[Freeing]:
            """The kind's jobs whose protection lifts before they end, taken `way`."""
            for t, i in index.protected_of.get(kind, ()):
                if t < facts[i][1] and facts[i][2] == INF and free(i) and taken(way, jobs[i]):
                    yield t, i, jobs[i], way

        # Only the kinds P may take. Jobs the rules let go count from 0.0: lifted "before" any
        # end after it; one that should have ended already frees at its end, the others now.
        kinds = [(kind, way) for kind, way in may.items() if way != ITSELF]
        overdue = (
            (end, i, jobs[i], may[kind_of(jobs[i])])
            for end, i in self.victims.overdue(tier1)
            if end > 0.0 and takes(jobs[i]) and free(i)
        )
        lifts = [lifted(kind, way) for kind, way in kinds] + [lifting(kind, way) for kind, way in kinds]
        return heapq.merge(leaving, ending(), overdue, *lifts, key=_time_and_id)

    def _takes(self, p: Preemptor, kind: PairKey, v: Job) -> int:
        """How the reservation's holder P may count on the running jobs of V's kind freeing
        capacity: `TAKEN`, all of them, where the pair rules let P preempt them; `LENT`, those
        of a strictly lower tier that started in reserved capacity (`Attempt.lent`), which P
        takes back whatever `scope` says (DESIGN §4.2); else `ITSELF`, none but by ending."""
        if allowed(self.state.ctx, p, v):
            return TAKEN
        if kind[_TIER] > p.job.tier:
            return LENT
        return ITSELF


_TIER = PAIR_READS.index("tier")
"""Where a victim's tier is in its `pair_key`."""


class _At:
    """The pass's state as a `preemption.Workspace` whose rules are asked at another time: a
    search as a pass at that time would run it (the victims' protections and the starvation
    shield read `ctx.now`). Its own `kinds`: the pass's belong to its claims."""

    __slots__ = ("ctx", "index", "kinds", "quota", "state")

    def __init__(self, state: PassState, ctx: RuleContext) -> None:
        self.state = state
        self.ctx = ctx
        self.index: CapacityIndex = state.index
        self.quota: QuotaTree = state.quota
        self.kinds: dict[str, str] = {}

    def release(self, c: Candidate) -> None:
        self.state.release(c)

    def retake(self, c: Candidate) -> None:
        self.state.retake(c)

    def fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool:
        return self.state.fits(job, flavor, d)

    def placeable(self, job: Job, flavor: str) -> bool:
        return self.state.placeable(job, flavor)

    def frees_quota_in(self, c: Candidate, queue: int) -> bool:
        return self.state.frees_quota_in(c, queue)

    def block_nodes(self, block: str) -> Sequence[str]:
        return self.state.block_nodes(block)


def _lent(v: Job) -> bool:
    """Did the job start in reserved capacity (`Attempt.lent`)?"""
    return v.attempt is not None and v.attempt.lent


def _after(end: float, now: float) -> bool:
    """Does a job the rules let go end no earlier than `now` (and after 0.0)?"""
    return end >= now and end > 0.0


def _time_and_id(e: Freeing) -> tuple[float, str]:
    return e[0], e[1]
