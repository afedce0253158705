"""What running jobs could give a pass: victims to preempt now, capacity already on its way
out, and the order in which capacity frees (read by the preempt and reserve phases).

Everything about a victim but its cost at `now` is kept between passes (`Victims.facts`,
`Allocation.victim_facts`), so a pass prices each running job with a few float operations and
sorts only the jobs the victim rules let go now; and it prices them only once a search has
something to take (`any_eligible`, read off `Allocation.releases`, which also gives the
forecast its order of releases without a walk over every running job).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection
from typing import Any

from warden.engine.accounting import expected_end
from warden.engine.allocation import VictimFacts
from warden.engine.model import Job
from warden.engine.phases.memo import Part
from warden.engine.phases.state import PassState
from warden.engine.preemption import VICTIM_ORDERS, Candidate, CandidatePool, freed_gpus, ties, with_share
from warden.engine.releases import ReleaseIndex
from warden.engine.rules import (
    PREEMPTOR_READS,
    PRODUCTION,
    RECLAIM,
    Preemptor,
    allowed_for,
    at_risk_since,
    closes_at,
    getter,
    protection,
    share,
    startup_of,
)

INF = math.inf

Row = tuple[float, tuple[Any, ...], Job, float, float, tuple[tuple[str, int], ...], str, float]
"""(cost or 0.0, ties, job, cost, lost work, GPUs freed per node, flavor, guarded until): a
priced victim, with when the thrash guard lets preemptors of tiers 2–4 take it (0.0: now).

Its first two fields are the job's victim key (`preemption.victim_key`: cost leads when the
order is by cost, and the rest, `preemption.ties`, ends with the unique id), so rows sort as
plain tuples in victim order: no key function, and nothing after the ties is ever compared."""

_ELIGIBLE_READS = getter(PREEMPTOR_READS)
"""What `Victims.any_eligible` reads of P: what the pair rules and reclaim read
(`rules.PREEMPTOR_READS`; its tier too, which tiers it may take)."""


class Victims:
    __slots__ = ("memo", "state")

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo

    def pool(self, tier1: bool = False) -> CandidatePool:
        """Running jobs not yet signalled that the rules let go now, in the policy's victim
        order, priced at `now`: as a tier-1 preemptor sees them (`tier1`: the thrash guard does
        not hold it back, `rules.guarded`), or as preemptors of tiers 2–4 and reclaims do (those
        of them the guard lets go too). Once a pass, from one walk: the two pools share their
        candidates, so a claim drops a victim from both. The tier-1 pool is built first, on the
        walk's own lists: a claim drops its victims from those too, so a pool built after it
        (the other one) never offers a job already signalled as a new victim."""
        pools = self.memo.candidates
        pool = pools.get(tier1)
        if pool is None:
            every = self._every()
            whole = pools.get(True)
            if whole is None:
                whole = pools[True] = self._pool(every[0], every[1], every[2])
            if tier1:
                return whole
            pool = pools[False] = self._pool([c for c in every[0] if c.protected_until == 0.0], None, every[3])
        return pool

    def _every(self) -> tuple[list[Candidate], dict[str, int], bool, bool]:
        """Every running job not signalled that the rules let a tier-1 preemptor take now,
        priced, in victim order (`protected_until` 0.0 for those they let every preemptor
        take); the GPUs they hold per node; whether every cost is nonnegative, and whether
        those of the jobs every preemptor may take are. Once a pass."""
        every = self.memo.every
        if every is None:
            rows, held_on, nonnegative, guarded_nonnegative = self._price()
            every = self.memo.every = (_in_victim_order(rows), held_on, nonnegative, guarded_nonnegative)
        return every

    def _pool(self, candidates: list[Candidate], held_on: dict[str, int] | None, nonnegative: bool) -> CandidatePool:
        by_cost = VICTIM_ORDERS[self.state.policy.preemption.victim_order].by_cost
        return CandidatePool(candidates, held_on, by_cost=by_cost, ascending=by_cost and nonnegative)

    def pool_at(self, at: float, tier1: bool, gone: Collection[str]) -> CandidatePool:
        """The pool a pass at `at` would search, as far as this pass can tell: the running jobs
        not signalled, not in `gone` (a forecast's jobs that have freed their capacity by
        then), that the rules let go by `at` (as from tier 1 where `tier1`), priced at `at`.
        Built anew for each call: what a forecast names as its victims is what the search at
        its due time takes."""
        rows, _, nonnegative, guarded_nonnegative = self._price(at, gone)
        candidates = _in_victim_order(rows)
        if tier1:
            return self._pool(candidates, None, nonnegative)
        return self._pool([c for c in candidates if c.protected_until == 0.0], None, guarded_nonnegative)

    def _price(
        self, at: float | None = None, gone: Collection[str] = ()
    ) -> tuple[list[Row], dict[str, int], bool, bool]:
        """One walk over the running jobs not signalled (nor in `gone`): a row per job the
        victim rules let a tier-1 preemptor take at `at` (default: now), priced then, with the
        time the thrash guard still protects it from other preemptors (0.0: it does not), the
        GPUs those jobs hold per node, whether every cost is nonnegative, and whether those of
        the jobs the guard lets go are.

        This loop runs once per running job and pass, so it inlines the cost (`rules.cost_at`:
        same arithmetic, same floats; tests/engine/test_victims.py compares the two).
        """
        state = self.state
        order = state.policy.preemption.victim_order
        by_cost = VICTIM_ORDERS[order].by_cost
        shares = self.shares() if VICTIM_ORDERS[order].share_at is not None else None
        now = state.now if at is None else at
        known = state.victim_facts
        terminating = state.terminating
        claimed = state.claimed
        rows: list[Row] = []
        held_on: dict[str, int] = {}
        nonnegative = guarded_nonnegative = True
        for v in state.holding.values():
            if v.id in terminating or (claimed and v.id in claimed) or (gone and v.id in gone):
                continue
            facts = known.get(v.id)
            if facts is None or facts[0] is not v or facts[1] > state.now:
                facts = self.facts(v)
            _, _, protected, since, restart, freed, gpus, tie, flavor, _, from_t1, closes, closes_t1 = facts
            if from_t1 <= now < closes_t1:
                if since is None:
                    lost = 0.0
                else:
                    at_risk = now - since
                    lost = gpus * (at_risk if at_risk > 0.0 else 0.0)  # max(0.0, now - since)
                cost = lost + restart
                until = (0.0 if protected <= now else protected) if now < closes else INF
                if not cost >= 0.0:  # negative, or NaN
                    nonnegative = False
                    if not until:
                        guarded_nonnegative = False
                if shares is not None:
                    tie = with_share(order, tie, shares.get(v.queue, 0.0))
                rows.append((cost if by_cost else 0.0, tie, v, cost, lost, freed, flavor, until))
                for node, g in freed:
                    held_on[node] = held_on.get(node, 0) + g
        return rows, held_on, nonnegative, guarded_nonnegative

    def shares(self) -> dict[str, float]:
        """Per leaf queue, its share as the pass begins (`rules.share`: GPUs held ÷ owed now),
        what victim orders that take the queue furthest above its share first read."""
        state = self.state
        q = state.quota
        if state.ctx.owed is None:
            return {}
        return {leaf: share(state.ctx, q.index[leaf]) for leaf in q.paths}

    def releases(self, tier1: bool = False) -> ReleaseIndex:
        """`Allocation.releases` (protection from tiers 2–4 and reclaims), or with `tier1`
        `Allocation.releases_t1` (protection from a tier-1 preemptor), brought up to `now`:
        once a pass."""
        state, memo = self.state, self.memo
        if tier1:
            index = state.releases_t1
            if tier1 not in memo.releases_fresh:
                index.refresh(state.now, self._from_t1_and_end)
        else:
            index = state.releases
            if tier1 not in memo.releases_fresh:
                index.refresh(state.now, self._protected_and_end)
        memo.releases_fresh.add(tier1)
        return index

    def _protected_and_end(self, v: Job) -> tuple[float, float, float]:
        facts = self.facts(v)
        return facts[2], facts[9], facts[11]

    def _from_t1_and_end(self, v: Job) -> tuple[float, float, float]:
        facts = self.facts(v)
        return facts[10], facts[9], facts[12]

    def any_eligible(self, p: Preemptor) -> bool:
        """Could a search for `p` take any running job now (`CandidatePool.eligible` without
        its jobs already leaving)? A job the rules let go, not signalled, of a lower tier or —
        where `p` may reclaim — of its own, that the pair rules let `p` take. Asked before the
        candidates are priced: most searches of a deep queue have nothing to take.

        Remembered per what it reads of P (`Memo.eligible`, `_ELIGIBLE_READS`): the answer
        reads nothing else of P, and of the pass only quota usage and the claims."""
        memo = self.memo
        key = _ELIGIBLE_READS(p)
        seen = memo.eligible.get(key)
        if seen is not None and seen[0] == memo.quota_version and seen[1] == memo.hold_version:
            return seen[2]
        found = self._any_eligible(p)
        memo.eligible[key] = (memo.quota_version, memo.hold_version, found)
        return found

    def _any_eligible(self, p: Preemptor) -> bool:
        state = self.state
        ctx = state.ctx
        ok = allowed_for(ctx, p)
        tier = p.job.tier
        take_back = RECLAIM.may(ctx, p)
        terminating, claimed = state.terminating, state.claimed
        for t, kinds in self.lifted(tier == PRODUCTION).items():
            if t <= tier and not take_back:
                continue
            for ids, v in kinds:
                if t <= tier:  # a reclaim alone may take it: asked first, as it is the cheaper
                    may = RECLAIM.kind(ctx, p, v) is not None and ok(v)
                else:
                    may = ok(v) or (take_back and RECLAIM.kind(ctx, p, v) is not None)
                if may and any(i not in terminating and i not in claimed for i in ids):
                    return True
        return False

    def lifted(self, tier1: bool = False) -> dict[int, list[tuple[list[str], Job]]]:
        """`ReleaseIndex.lifted` brought up to `now` (`releases(tier1)`), by tier: per kind
        (`rules.pair_key`) with a job the rules let go, those jobs' ids and one of them (what the
        pair rules read). Once a pass: the index changes only between passes, and a search for
        a job asks only the tiers it may take."""
        by_tier = self.memo.lifted.get(tier1)
        if by_tier is None:
            index = self.releases(tier1)
            jobs = index.jobs
            by_tier = self.memo.lifted[tier1] = {}
            for ids in index.lifted.values():
                if ids:
                    one = jobs[ids[0]]
                    by_tier.setdefault(one.tier, []).append((ids, one))
        return by_tier

    def facts(self, v: Job) -> VictimFacts:
        """What pricing a running job as a victim needs that does not change with time, kept
        between passes per job: (job, seen at, protected until, at risk since, restart cost,
        GPUs freed per node, GPUs, victim-order ties, flavor, expected end, protected from tier 1
        until, protected again from, protected from tier 1 again from: `allocation.VictimFacts`).

        A job's protection lifts as time passes (a lease or stretched lease runs out, old
        preemptions leave the budget window) and one may start at a known time (the last stretch
        of its time limit), so the window in which it may go, computed at an earlier `now`,
        holds later; a job whose facts change arrives as a new object and is priced anew.
        """
        state = self.state
        facts = state.victim_facts.get(v.id)
        if facts is None or facts[0] is not v or facts[1] > state.now:
            end = expected_end(v)
            protected = protection(state.ctx, v)
            closes = closes_at(state.ctx, v)
            facts = (
                v,
                state.now,
                protected,
                at_risk_since(state.policy, v),
                startup_of(state.policy, v) * v.total_gpus,
                freed_gpus(v),
                v.total_gpus,
                ties(state.policy.preemption.victim_order, v),
                state.flavor_of_job[v.id],
                end,
                protected if v.tier <= PRODUCTION else protection(state.ctx, v, guard=False),
                closes,
                closes if v.tier <= PRODUCTION else closes_at(state.ctx, v, guard=False),
            )
            state.victim_facts[v.id] = facts
        return facts

    def protected_until(self, v: Job) -> float:
        """When the victim rules let preemptors of tiers 2–4 and reclaims take V, as of now:
        its kept protection (`facts`), or inf once a protection that starts later has started."""
        facts = self.facts(v)
        return facts[2] if self.state.now < facts[11] else INF

    def leaving(self) -> list[Candidate]:
        """Capacity already on its way out, soonest first, as free candidates: terminating jobs
        nobody counts on yet, and what is left of those others already count on. Kept until
        the next claim changes either."""
        memo = self.memo
        if memo.leaving is None:
            state = self.state
            rows: list[tuple[float, str, Job, tuple[Part, ...] | None]] = []
            for t in state.terminating.values():
                if t.id not in state.claimed:
                    kill_at = t.attempt.kill_at if t.attempt is not None else None
                    rows.append((state.now if kill_at is None else kill_at, t.id, t, None))
            for job_id, (t, parts, eta) in state.rests.items():
                rows.append((eta, job_id, t, parts))
            rows.sort(key=lambda r: (r[0], r[1]))
            memo.leaving = [
                Candidate(
                    t,
                    0.0,
                    0.0,
                    0.0,
                    state.flavor_of_job[t.id],
                    i - len(rows),
                    freed_gpus(t, parts),
                    leaving=True,
                    parts=parts,
                    eta=eta,
                )
                for i, (eta, _, t, parts) in enumerate(rows)
            ]
        return memo.leaving

    def claimed(self, c: Candidate) -> None:
        """A claimant counts on the candidate from now on: a new victim is no search's
        candidate any more, and what is leaving has changed."""
        if not c.leaving:
            for pool in self.memo.candidates.values():
                pool.drop(c)  # the pools share their candidates
        self.memo.leaving = None

    def taken(self, v: Job) -> None:
        """A claimant or a reservation's holder signalled V (`Reserve.take_back`), which it
        counts on: no search's candidate any more (in either pool), and nobody else's capacity
        on its way out."""
        for pool in self.memo.candidates.values():
            _drop_job(pool, v.id)
        self.memo.leaving = None

    def overdue(self, tier1: bool = False) -> list[tuple[float, str]]:
        """(expected end, id) of the jobs the rules let go (as from tier 1 where `tier1`) whose
        expected end is before `now`, sorted: a forecast counts them free at their end, not at
        `now`. Once a pass."""
        found = self.memo.overdue.get(tier1)
        if found is None:
            index, now = self.releases(tier1), self.state.now
            ending = index.ending
            found = [(end, i) for end, i in ending[: bisect_left(ending, (now, ""))] if index.is_lifted(i)]
            self.memo.overdue[tier1] = found
        return found


def _drop_job(pool: CandidatePool, job_id: str) -> None:
    """Drop the job's candidate from the pool, if it has one."""
    c = next((c for c in pool.free_now if c.job.id == job_id), None)
    if c is not None:
        pool.drop(c)


def _in_victim_order(rows: list[Row]) -> list[Candidate]:
    """The priced rows as candidates, sorted by the victim key, each with its rank."""
    new = tuple.__new__  # Candidate's own constructor is a Python function; this is C
    rows.sort()
    return [
        new(Candidate, (v, cost, lost, until, flavor, rank, freed, False, None, 0.0))
        for rank, (_, _, v, cost, lost, freed, flavor, until) in enumerate(rows)
    ]
