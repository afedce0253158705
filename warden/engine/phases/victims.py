"""What running jobs could give a pass: victims to preempt now, capacity already on its way
out, and the order in which capacity frees (read by the preempt and reserve phases).

Everything about a victim but its cost at `now` is kept between passes (`Victims.facts`,
`Allocation.victim_facts`), so a pass prices each running job with a few float operations and
sorts only the jobs the victim rules let go now. Where the policy makes reservations, the same
walk lists what the forecast needs of every running job.
"""

from __future__ import annotations

import heapq
import math
from operator import itemgetter
from typing import Any

from warden.engine.allocation import VictimFacts
from warden.engine.model import Job
from warden.engine.phases.memo import Part, Release, ReleaseOrders
from warden.engine.phases.state import PassState
from warden.engine.preemption import Candidate, CandidatePool, freed_gpus, victim_key
from warden.engine.rules import at_risk_since, protection, startup_of

INF = math.inf


class Victims:
    __slots__ = ("memo", "state")

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo

    def pool(self) -> CandidatePool:
        """Running jobs not yet signalled that the rules let go now, in the policy's victim
        order, priced at `now`: once a pass."""
        memo = self.memo
        if memo.candidates is None:
            rows, held_on, nonnegative, releases = self._price()
            by_cost = self.state.policy.preemption.victim_order == "cost"
            memo.candidates = CandidatePool(
                _in_victim_order(rows, by_cost), held_on, by_cost=by_cost, ascending=by_cost and nonnegative
            )
            memo.releases = releases
        return memo.candidates

    def _price(self) -> tuple[list[tuple[Any, ...]], dict[str, int], bool, ReleaseOrders]:
        """One walk over the running jobs not signalled before this pass: a row per job the
        victim rules let go now (its victim key, or the key's fields, first), the GPUs those
        hold per node, whether every cost is nonnegative, and — where the policy makes
        reservations — the lists `release_orders` is made of.

        This loop runs once per running job and pass, so it does all of that in one walk, and
        inlines the cost (`rules.cost_at`: same arithmetic, same floats; tests/engine/
        test_victims.py compares the two).
        """
        state = self.state
        releases = state.policy.scheduling.reservations > 0
        at_end: list[Release] = []
        at_lift: list[Release] = []
        kinds: dict[tuple[int, str], Job] = {}
        order = state.policy.preemption.victim_order
        by_cost = order == "cost"
        now = state.now
        known = state.victim_facts
        terminating = state.terminating
        rows: list[tuple[Any, ...]] = []
        held_on: dict[str, int] = {}
        nonnegative = True
        for v in state.holding.values():
            if v.id in terminating:
                continue
            facts = known.get(v.id)
            if facts is None or facts[0] is not v or facts[1] > now:
                facts = self.facts(v)
            _, _, protected, since, restart, freed, gpus, neg_tier, neg_started, flavor, end = facts
            if protected <= now:
                protected = 0.0
            if releases:
                kind = (v.tier, v.queue)  # `rules.pair_key`, inlined
                if kind not in kinds:
                    kinds[kind] = v
                if end < INF:
                    at_end.append((end, v.id, v, protected))
                if protected < end:
                    lifts = now if now > protected else protected  # max(protected, now)
                    at_lift.append((lifts if lifts < end else end, v.id, v, protected))  # min(end, lifts)
            if protected == 0.0:
                if since is None:
                    lost = 0.0
                else:
                    at_risk = now - since
                    lost = gpus * (at_risk if at_risk > 0.0 else 0.0)  # max(0.0, now - since)
                cost = lost + restart
                if not cost >= 0.0:  # negative, or NaN
                    nonnegative = False
                if by_cost:
                    # `victim_key` leads the row, so rows sort as tuples (no key function;
                    # the id is unique, so nothing after it is ever compared).
                    rows.append((cost, neg_tier, neg_started, v.id, v, lost, freed, flavor))
                else:
                    rows.append((victim_key(order, v, cost), v, cost, lost, freed, flavor))
                for node, g in freed:
                    held_on[node] = held_on.get(node, 0) + g
        return rows, held_on, nonnegative, (at_end, at_lift, kinds)

    def facts(self, v: Job) -> VictimFacts:
        """What pricing a running job as a victim needs that does not change with time, kept
        between passes per job: (job, seen at, protected until, at risk since, restart cost,
        GPUs freed per node, GPUs, −tier, −started, flavor, expected end).

        A job's protection only ever lifts as time passes (a lease or stretched lease runs
        out, old preemptions leave the budget window), so what was computed at an earlier
        `now` holds later; a job whose facts change arrives as a new object and is priced anew.
        """
        state = self.state
        facts = state.victim_facts.get(v.id)
        if facts is None or facts[0] is not v or facts[1] > state.now:
            started = v.attempt.started_at if v.attempt is not None else 0.0
            end = started + v.expected_duration if v.expected_duration is not None else INF
            facts = (
                v,
                state.now,
                protection(state.ctx, v),
                at_risk_since(state.policy, v),
                startup_of(state.policy, v) * v.total_gpus,
                freed_gpus(v),
                v.total_gpus,
                -v.tier,
                -started,
                state.flavor_of_job[v.id],
                end,
            )
            state.victim_facts[v.id] = facts
        return facts

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
            self.pool().drop(c)
        self.memo.leaving = None

    def release_orders(self) -> ReleaseOrders:
        """The running jobs not signalled before this pass, in the order they end (those with an
        expected end), and those whose protection lifts before their end, in the order they
        may be preempted: heaps of (time, id, job, protected until), smallest time and id first;
        and one job of each `rules.pair_key` among them. Once a pass (listed by `pool`, in the
        same walk over the running jobs). Heaps, not sorted lists: a forecast stops after the
        first few hundred."""
        memo = self.memo
        if not memo.releases_heaped:
            self.pool()
            assert memo.releases is not None
            at_end, at_lift, _ = memo.releases
            heapq.heapify(at_end)  # ids are unique: tuples never compare past them
            heapq.heapify(at_lift)
            memo.releases_heaped = True
        assert memo.releases is not None
        return memo.releases


def _in_victim_order(rows: list[tuple[Any, ...]], by_cost: bool) -> list[Candidate]:
    """The priced rows as candidates, sorted by the victim key, each with its rank."""
    new = tuple.__new__  # Candidate's own constructor is a Python function; this is C
    if by_cost:
        rows.sort()
        return [
            new(Candidate, (v, cost, lost, 0.0, flavor, rank, freed, False, None, 0.0))
            for rank, (cost, _, _, _, v, lost, freed, flavor) in enumerate(rows)
        ]
    rows.sort(key=itemgetter(0))
    return [
        new(Candidate, (v, cost, lost, 0.0, flavor, rank, freed, False, None, 0.0))
        for rank, (_, v, cost, lost, freed, flavor) in enumerate(rows)
    ]
