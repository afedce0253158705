"""Phase 4, preempt: make room for a job that does not fit (DESIGN §4.3, §4.4).

Capacity already on its way out counts first, at no cost, so a need it covers never gets a new
victim; then eligible running jobs, searched flavor by flavor (`preemption.search`), once per
way the scope rule lets the job look for victims (`rules.preemptors`). The cheapest set wins;
every victim the job can do without on any flavor is then given back, the costliest first, so
the set is minimal overall. Under `preemption.only_if_it_pays`, while a reservation is left,
the set must then pay for itself (`Preempt.declined`): capacity that frees by itself soon
enough makes the job reserve it and wait instead. Last, the job claims what its victims will
free (`phases.claim`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from warden.engine.accounting import wait_time
from warden.engine.model import Job
from warden.engine.phases.claim import Claim
from warden.engine.phases.reserve import Forecast, Reserve
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.preemption import Candidate, search, set_cost
from warden.engine.reasons import PreemptionWouldNotPay, Reason
from warden.engine.rules import PRODUCTION, grace_of, preemptors, starving_after

INF = math.inf

Found = tuple[list[Candidate], bool, dict[str, str]]
"""A victim set, whether it was chosen to leave the job in-quota (`Preemptor.reclaims`), and
how the rules let the search take each victim (`preemption.Workspace.kinds`)."""


class Preempt:
    __slots__ = (
        "attempts_left",
        "claim",
        "frees",
        "memo",
        "pays",
        "reserve",
        "skipped",
        "state",
        "victims",
    )

    def __init__(self, state: PassState, victims: Victims, claim: Claim, reserve: Reserve) -> None:
        self.state = state
        self.memo = state.memo
        self.victims = victims
        self.claim = claim
        self.reserve = reserve
        """Forecasts what frees by itself, for `declined`."""
        self.pays = state.policy.preemption.only_if_it_pays
        """`preemption.only_if_it_pays`, read once a pass."""
        self.attempts_left = state.policy.preemption.max_attempts_per_pass
        """Victim searches this pass may still run (a shape that failed is not searched again)."""
        self.skipped = False
        """The last job was not searched: the pass had run its searches. Its reservation counts
        only what frees by itself, so its reason names no victim this pass does not take."""
        self.frees: tuple[str, Forecast] | None = None
        """The job that last declined, and where capacity frees by itself for it first: what
        its reservation would forecast again (`Reserve.attempt`'s `first`)."""

    def attempt(self, job: Job) -> Reason | None:
        """`WaitingForGrace` once the job's victims are signalled and its placement claimed;
        `PreemptionWouldNotPay` when the victims that would make room cost more than waiting;
        None when no set of victims makes room (or the pass has run out of searches)."""
        self.frees = None
        self.skipped = False
        state = self.state
        if not state.terminating and not state.takeable.get(job.tier):
            return None  # `_could` is False for the whole pass: nothing to claim, nobody to take
        key = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        fail = self.memo.preempt_fail
        if key in fail:
            return None
        if self.attempts_left <= 0:
            self.skipped = True
            return None
        may_decline = self._may_decline(job)  # nothing below adds a reservation
        known = self.memo.preempt_declined.get(key)
        if known is not None and may_decline:
            return known
        if not self._could(job):
            fail.add(key)
            return None
        self.attempts_left -= 1
        flavors = self.state.flavors(job)
        if not self._takes_any(job, flavors):
            fail.add(key)
            return None
        if may_decline:
            first = self._frees_first(job, flavors)
            if first is not None:
                self.memo.preempt_declined[key] = first
                return first
        found = self._cheapest(job, flavors)
        placed = self._minimal(job, flavors, found) if found is not None else None
        if placed is None:
            fail.add(key)
            return None
        flavor, names, needed = placed
        if may_decline:
            declined = self.declined(job, flavors, needed)
            if declined is not None:
                self.memo.preempt_declined[key] = declined
                return declined
        self.state.kinds = found[2] if found is not None else {}
        return self.claim.claim(job, names, self.state.demand(job, flavor), needed)

    def _may_decline(self, job: Job) -> bool:
        """Under `only_if_it_pays`: a job may wait for what frees by itself while a reservation
        is left to hold it, or while it is not starving (DESIGN §4.1: a starving job's wait
        is worth more than the GPU-seconds its victims would lose). Never a tier-1 job: it is
        bound by its victims' leases and grace alone (DESIGN §4.3), not by what they would lose."""
        state = self.state
        if not self.pays or job.tier == PRODUCTION:
            return False
        return len(state.reservations) < state.policy.scheduling.reservations or not self._starving(job)

    def _starving(self, job: Job) -> bool:
        """Has the waiting job waited, over all its attempts and this wait, as long as it
        takes to starve (`rules.starving_after`)?"""
        wait = wait_time(job.waited, job.pending_since, job.submit, self.state.now)
        return wait >= starving_after(self.state.policy, job.queue)

    def declined(self, job: Job, flavors: Sequence[str], needed: Sequence[Candidate]) -> PreemptionWouldNotPay | None:
        """Why preempting `needed` does not pay, or None when it does (asked where
        `_may_decline` lets the job wait). The job could start once its victims are gone (the
        last SIGKILL deadline); waiting instead, once capacity frees by itself
        (`Reserve.forecast(natural=True)`, on any flavor). The preemption pays unless that
        comes before the victims are gone plus their cost (lost work and restart, DESIGN §4.4)
        spread over the job's GPUs: the GPU-seconds the job would wait longer."""
        new = [c for c in needed if not c.leaving]
        cost = sum(c.cost for c in new)
        gpus = job.total_gpus
        if not new or not cost >= 0.0 or gpus <= 0:
            return None  # capacity already on its way out (or a NaN cost)
        now, policy = self.state.now, self.state.policy
        gone = max(c.eta if c.leaving else now + grace_of(policy, c.job) for c in needed)
        frees = self._frees_by_itself(job, flavors, gone + cost / gpus)
        if frees is None:
            return None
        return PreemptionWouldNotPay(tuple(c.job.id for c in new), cost, frees.due)

    def _frees_first(self, job: Job, flavors: Sequence[str]) -> PreemptionWouldNotPay | None:
        """A decline known before any search: capacity frees by itself before any job
        signalled now could be gone (the least grace, `min_grace`), so no victim set can pay
        and none is searched for. Not while capacity already on its way out could be claimed
        instead, nor for a job without GPUs (as in `declined`)."""
        if job.total_gpus <= 0 or self.victims.leaving():
            return None  # the search may find capacity on its way out to claim
        state = self.state
        frees = self._frees_by_itself(job, flavors, state.now + state.policy.min_grace)
        return None if frees is None else PreemptionWouldNotPay((), 0.0, frees.due)

    def _frees_by_itself(self, job: Job, flavors: Sequence[str], before: float) -> Forecast | None:
        """Where capacity for the job frees by itself first on any flavor, if before `before`
        (`Reserve.earliest`, natural); kept in `frees`."""
        best = self.reserve.earliest(job, flavors, before, natural=True)
        self.frees = None if best is None else (job.id, best)
        return best

    def _could(self, job: Job) -> bool:
        """A cheap necessary condition: something terminating that nobody counts on yet, or a
        running job of a tier the rules could let the job's tier take (`Allocation.takeable`)."""
        state, memo = self.state, self.memo
        if any(t not in state.claimed for t in state.terminating):
            return True
        takeable = state.takeable.get(job.tier)
        if not takeable:
            return False
        if memo.victim_tiers is None:
            leaving: dict[int, int] = {}
            for t in state.terminating.values():
                leaving[t.tier] = leaving.get(t.tier, 0) + 1
            memo.victim_tiers = tuple(tier for tier, n in state.tiers.items() if n > leaving.get(tier, 0))
        return not takeable.isdisjoint(memo.victim_tiers)

    def _takes_any(self, job: Job, flavors: Sequence[str]) -> bool:
        """Could any search find something to take: capacity on its way out, or an eligible
        victim for one of the ways the job may look (`Victims.any_eligible`, remembered)?"""
        state, victims = self.state, self.victims
        if victims.leaving():
            return True
        return any(victims.any_eligible(p) for f in flavors for p in preemptors(state.ctx, job, state.demand(job, f)))

    def _cheapest(self, job: Job, flavors: Sequence[str]) -> Found | None:
        """The cheapest victim set over the flavors (the first flavor on a tie), or None."""
        best: tuple[float, int, int, list[Candidate], bool, dict[str, str]] | None = None
        for i, flavor in enumerate(flavors):
            chosen, reclaims, kinds = self._search(job, flavor)
            if chosen:
                found = (*set_cost(chosen), i, chosen, reclaims, kinds)
                if best is None or found[:3] < best[:3]:
                    best = found
        return None if best is None else (best[3], best[4], best[5])

    def _search(self, job: Job, flavor: str) -> Found:
        """The cheapest set that makes room for `job` on `flavor`, searched once per way the
        scope rule lets the job look for victims (the first way on a tie); ([], False) when
        none does. The state is left as it was."""
        state = self.state
        d = state.demand(job, flavor)
        leaving = self.victims.leaving()
        best: Found = ([], False, {})
        for p in preemptors(state.ctx, job, d):
            if not leaving and not self.victims.any_eligible(p):
                continue  # `search` would find no eligible victim: leave the candidates unpriced
            mark = state.mark()
            state.kinds.clear()
            chosen = search(state, p, flavor, self.victims.pool(job.tier == PRODUCTION), leaving)
            state.rollback(mark)
            # A later way wins only where the earlier set is not as cheap (nor a NaN cost).
            if chosen and (not best[0] or not set_cost(best[0]) <= set_cost(chosen)):
                best = (chosen, p.reclaims, {c.job.id: state.kinds[c.job.id] for c in chosen if not c.leaving})
        return best

    def _minimal(
        self, job: Job, flavors: Sequence[str], found: Found
    ) -> tuple[str, tuple[str, ...], list[Candidate]] | None:
        """Give back every victim the job can do without on any flavor, the costliest first;
        the first flavor it then fits on, its placement there, and the victims it needs (in
        victim order). The state is left as it was.

        The search and this fit test read the same state, so they agree; were they ever not to
        (None), the job waits with the reason its placement gives, and the pass goes on.
        """
        state = self.state
        victims, reclaims, _ = found

        def enough(f: str) -> bool:
            """The search's own test: the job fits (and, for a set chosen to reclaim its way
            into quota, is in-quota) on flavor f."""
            d = state.demand(job, f)
            return state.fits(job, f, d) and (not reclaims or state.quota.in_quota(job.queue, d))

        mark = state.mark()
        for c in victims:
            state.release(c)
        needed = []
        for c in sorted(victims, key=lambda c: (-c.cost, -c.rank)):
            state.retake(c)
            if not any(enough(f) for f in flavors):
                state.release(c)
                needed.append(c)
        flavor = next((f for f in flavors if enough(f)), None)
        names = state.find(flavor, job) if flavor is not None else None
        state.rollback(mark)
        if flavor is None or names is None:
            return None
        return flavor, names, sorted(needed, key=lambda c: c.rank)
