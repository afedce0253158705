"""Which victims (DESIGN §4.4): one comparator, a placement-aware greedy, a minimality pass.

Eligibility lives in `warden.engine.rules`. Here the eligible running jobs are taken in the
policy's victim order (the comparator, `victim_key`) until the preemptor fits, and then every
victim it can do without is given back, the costliest first, so the set is minimal.

Freed GPUs help a gang only where they add up to whole replicas on one node, inside the
domain its placement allows (one node for `pack`, one block for `block`). So the search first
prices replica slots node by node — a node's next slot costs the run of victims on it, in
victim order, that frees enough — and takes the cheapest `replicas` slots of the cheapest
domain; victims scattered over other nodes would free nothing the gang can use. What is still
missing after that (quota, CPU, memory) is filled greedily in victim order.

Exact least-cost selection is a knapsack problem; this finds the least-cost set when the
victims on each node are taken in victim order, and a minimal set always.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from warden.engine.model import Job
from warden.engine.rules import (
    RECLAIM,
    PairKey,
    Preemptor,
    allowed_for,
    downward_allowed,
    downward_key,
    pair_key,
)

if TYPE_CHECKING:
    from warden.engine.placement import CapacityIndex
    from warden.engine.quota import QuotaTree
    from warden.engine.rules import RuleContext


class Candidate(NamedTuple):
    """A running job that could be preempted, with what it would cost, computed once a pass.

    A named tuple, not a dataclass: a pass over 20,000 running jobs builds one per job, and
    `tuple.__new__` builds one several times faster than a frozen dataclass's `__init__`.
    """

    job: Job
    cost: float
    lost: float
    protected_until: float
    """0.0 when the victim rules let every preemptor take it now; else when the thrash guard
    lets preemptors of tiers 2–4 take it (a candidate only a tier-1 preemptor may take now)."""
    flavor: str
    rank: int
    """Position in victim order (jobs already leaving: negative, soonest out first)."""
    freed: tuple[tuple[str, int], ...]
    """GPUs this candidate would free, per node, in the order it holds the nodes (see
    `freed_gpus`): every search walks it, so it is worked out once, not per search."""
    leaving: bool = False
    """Already on its way out (terminating, or signalled earlier in this pass): its capacity is
    about to free at no further cost."""
    parts: tuple[tuple[str, int, int, int], ...] | None = None
    """For a leaving job part of whose capacity another waiting job already counts on: the
    (node, gpus, cpu, memory) that are still unpromised. None: all it holds."""
    eta: float = 0.0
    """When a leaving job's capacity is certain to be free (its SIGKILL deadline)."""


def freed_gpus(job: Job, parts: Iterable[tuple[str, int, int, int]] | None = None) -> tuple[tuple[str, int], ...]:
    """GPUs a job's exit frees per node (of `parts` only, when given), nodes in first-seen order."""
    out: dict[str, int] = {}
    if parts is not None:
        for node, gpus, _, _ in parts:
            out[node] = out.get(node, 0) + gpus
    elif job.attempt is not None:
        for rp in job.attempt.assignment:
            out[rp.node] = out.get(rp.node, 0) + job.gpus
    return tuple(out.items())


def _rank(c: Candidate) -> int:
    return c.rank


def _cost(c: Candidate) -> float:
    return c.cost


class CandidatePool:
    """The running jobs of one pass the rules let go now, in victim order, with the lists each
    search starts from. (Jobs still protected are no search's victims: a pass does not list them.)

    A job signalled in this pass is `drop`ped from every list a search walks (it is offered
    as capacity on its way out instead), so searches need not filter their lists.
    """

    def __init__(
        self,
        free_now: list[Candidate],
        held_on: dict[str, int] | None = None,
        by_cost: bool = True,
        ascending: bool = False,
    ) -> None:
        self.by_cost = by_cost
        """True when victim order is ascending cost (the search may stop early)."""
        self.ascending = ascending
        """True when, besides, no cost is negative (or NaN): then every list a search walks,
        jobs already leaving (cost 0) first, is in ascending cost, which lets it bisect."""
        self.free_now = free_now
        """The candidates the rules let go now (`protected_until` 0.0), in victim order."""
        self._downward: dict[tuple[object, ...], list[Candidate]] = {}
        """Lower-tier victims per `rules.downward_key`: for the pass."""
        self._of_kind: dict[PairKey, list[Candidate]] | None = None
        self._held_on = held_on

    def held_on(self) -> dict[str, int]:
        """GPUs the candidates hold, per node: no search's victims free more there (with the
        jobs already leaving)."""
        if self._held_on is None:
            held: dict[str, int] = {}
            for c in self.free_now:
                for node, gpus in c.freed:
                    held[node] = held.get(node, 0) + gpus
            self._held_on = held
        return self._held_on

    def eligible(self, ctx: RuleContext, p: Preemptor, leaving: Sequence[Candidate] = ()) -> Eligible:
        """Victims the rules let `p` take now, in victim order, after the jobs already `leaving`.

        The pair rules and reclaim read only a victim's `pair_key` (`allowed_for`), so they
        are evaluated once per kind of victim, not once per victim. Victims of a lower tier taken
        by priority are kept per `downward_key` for the pass; victims of a reclaim (of any tier,
        `RECLAIM.kind`) depend on the quota state and are listed anew, from the pass's lists
        per kind.
        """
        key = downward_key(ctx, p)
        lower = self._downward.get(key)
        if lower is None:
            tier = p.job.tier
            ok = allowed_for(ctx, p)
            lower = self._downward[key] = [
                c for c in self.free_now if c.job.tier > tier and downward_allowed(ctx, p, c.job) and ok(c.job)
            ]
        taken_back: list[Candidate] = []
        if RECLAIM.may(ctx, p):
            runs = [
                members
                for _, members in sorted(self._kinds().items())
                if members
                and not downward_allowed(ctx, p, members[0].job)
                and RECLAIM.kind(ctx, p, members[0].job) is not None
            ]
            taken_back = runs[0].copy() if len(runs) == 1 else sorted(chain.from_iterable(runs), key=_rank)
        return Eligible(leaving, lower, taken_back)

    def _kinds(self) -> dict[PairKey, list[Candidate]]:
        """`free_now` by kind (`rules.pair_key`), in victim order."""
        if self._of_kind is None:
            self._of_kind = {}
            for c in self.free_now:
                self._of_kind.setdefault(pair_key(c.job), []).append(c)
        return self._of_kind

    def drop(self, c: Candidate) -> None:
        """The candidate was signalled: leave it out of every later search (nothing changes
        where it is not one of this pool's candidates: the other pool's may be)."""
        j = bisect_left(self.free_now, c.rank, key=_rank)
        if j >= len(self.free_now) or self.free_now[j] is not c:
            return
        if self._held_on is not None:
            for node, gpus in c.freed:
                self._held_on[node] -= gpus
        lists = [self.free_now, *self._downward.values()]
        if self._of_kind is not None:
            lists.extend(self._of_kind.values())
        for members in lists:
            # Every list is in victim order, so the candidate is found by its rank.
            j = bisect_left(members, c.rank, key=_rank)
            if j < len(members) and members[j] is c:
                del members[j]


class Eligible:
    """The victims one search may take, in the order it takes them: jobs already leaving first,
    then eligible running jobs in victim order (lower tiers and reclaimable same-tier ones
    merged by rank).

    Iterated lazily and anew each time: a search usually stops long before the end (victims
    come in cost order), so building the whole list per search would cost more than the
    search itself.
    """

    __slots__ = ("leaving", "lower", "same")

    def __init__(self, leaving: Sequence[Candidate], lower: list[Candidate], same: list[Candidate]) -> None:
        self.leaving = leaving
        self.lower = lower
        self.same = same

    def __iter__(self) -> Iterator[Candidate]:
        if self.same:
            return chain(self.leaving, heapq.merge(self.lower, self.same, key=_rank))
        return chain(self.leaving, self.lower)

    def __bool__(self) -> bool:
        return bool(self.leaving or self.lower or self.same)


def _lower_tier_first(job: Job) -> int:
    return -job.tier


def _newest_first(job: Job) -> float:
    """The most recently started attempt first."""
    return -(job.attempt.started_at if job.attempt is not None else 0.0)


def _smallest_first(job: Job) -> int:
    return job.total_gpus


def _by_id(job: Job) -> str:
    return job.id


def _least_waited(job: Job) -> float:
    """The job that has waited least over all its attempts first."""
    return job.waited


class VictimOrder(NamedTuple):
    """One victim order: least cost first or not, then tie-breaks.

    Cost is the only part of the key that moves with time, so it can only lead: the tie-breaks
    on the job alone are worked out once per running job and kept between passes (`ties`); the
    share of the victim's queue (`rules.share`, furthest above what it is owed first) is worked
    out once per pass and goes in at `share_at` (`phases.victims.Victims._price` sorts its rows
    by (cost or 0.0, ties with the share)).
    """

    by_cost: bool
    tie_breaks: tuple[Callable[[Job], float | int | str], ...]
    """In order; the last is the id, which is unique, so no two keys are ever equal."""
    share_at: int | None = None
    """Where the (negated) share of the victim's queue goes among the tie-breaks; None: nowhere."""


VICTIM_ORDERS: dict[str, VictimOrder] = {
    "cost": VictimOrder(True, (_lower_tier_first, _least_waited, _newest_first, _by_id), share_at=1),
    "newest": VictimOrder(False, (_lower_tier_first, _newest_first, _by_id)),
    "smallest": VictimOrder(False, (_lower_tier_first, _smallest_first, _newest_first, _by_id)),
    "share": VictimOrder(False, (_lower_tier_first, _newest_first, _by_id), share_at=0),
}
"""`preemption.victim_order` → its key. `cost` (DESIGN §4.4): least cost, then lower tier first,
then the queue furthest above its owed share, then the job that has waited least in all, then
the most recently started; `newest` and `smallest` reproduce Kueue's and Slurm's choices without
fair sharing, `share` those of Kueue's Fair Sharing and KAI (the queue furthest above its share
first, then lower priority, then the newest)."""


def ties(order: str, job: Job) -> tuple[float | int | str, ...]:
    """The part of the job's victim key that moves neither with time nor with the pass."""
    return tuple([f(job) for f in VICTIM_ORDERS[order].tie_breaks])


def with_share(order: str, tie: tuple[float | int | str, ...], share: float) -> tuple[float | int | str, ...]:
    """The tie-breaks with the share of the victim's queue in its place (`VictimOrder.share_at`)."""
    at = VICTIM_ORDERS[order].share_at
    return tie if at is None else (*tie[:at], -share, *tie[at:])


def victim_key(order: str, job: Job, cost: float, share: float = 0.0) -> tuple[float | int | str, ...]:
    """The one comparator: smaller goes first (`VICTIM_ORDERS`). `share`: of the victim's queue
    (`rules.share`) in this pass."""
    t = with_share(order, ties(order, job), share)
    return (cost, *t) if VICTIM_ORDERS[order].by_cost else t


class Workspace(Protocol):
    """What the search needs from a scheduling pass: what-if release and fit tests."""

    index: CapacityIndex
    quota: QuotaTree
    ctx: RuleContext
    kinds: dict[str, str]
    """How the rules let the last search take each victim: "downward", "reclaim", "fair_share"."""

    def release(self, c: Candidate) -> None: ...

    def retake(self, c: Candidate) -> None: ...

    def fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool: ...

    def placeable(self, job: Job, flavor: str) -> bool: ...

    def frees_quota_in(self, c: Candidate, queue: int) -> bool: ...

    def block_nodes(self, block: str) -> Sequence[str]: ...


def search(ws: Workspace, p: Preemptor, flavor: str, pool: CandidatePool, leaving: list[Candidate]) -> list[Candidate]:
    """What makes `p` fit on `flavor`, released in `ws`: jobs already `leaving` (terminating, at
    no cost, so a need they cover never gets a new victim) and new victims from `pool` (which
    holds no job claimed earlier in this pass); [] (nothing released) if no eligible set does.

    A preemptor that is in-quota only once others' borrowing is reclaimed (`p.reclaims`) fits
    only when the set also leaves it within nominal on its whole path (DESIGN §4.3: "in-quota
    after admission"), so the set takes as much borrowed capacity as that needs."""
    job = p.job
    eligible = pool.eligible(ws.ctx, p, leaving)
    if not eligible:
        return []
    satisfied = _satisfied(ws, p, flavor)
    victims: list[Candidate] = []
    chosen: set[str] = set()
    # Price placement only when placement is what is missing; a job short of quota alone
    # takes victims (jobs already leaving first) under the queue whose limit it breaks.
    if not ws.placeable(job, flavor):
        slots = _cheapest_slots(ws, job, flavor, eligible, pool.by_cost, pool.ascending, _held_on(pool, leaving))
        for c in slots:
            if _takeable(ws, p, c):
                ws.release(c)
                victims.append(c)
                chosen.add(c.job.id)
    if not satisfied() and not _fill(ws, p, flavor, eligible, victims, chosen, satisfied):
        for c in victims:
            ws.retake(c)
        return []
    # Give back the costliest first; among jobs already leaving, the one that exits last.
    costliest_first = sorted(victims, key=lambda c: (-c.cost, -c.rank))
    needed = {c.job.id for c in drop_unneeded(ws, costliest_first, satisfied)}
    return [c for c in victims if c.job.id in needed]


def set_cost(chosen: Sequence[Candidate]) -> tuple[float, int]:
    """How victim sets compare (DESIGN §4.4): least cost, then fewest new victims."""
    return sum(c.cost for c in chosen), sum(not c.leaving for c in chosen)


def _satisfied(ws: Workspace, p: Preemptor, flavor: str) -> Callable[[], bool]:
    """The search's goal, asked of the state `ws` is in: `p` fits on `flavor` (and, for
    `p.reclaims`, is in-quota)."""
    job, d, quota = p.job, p.demand, ws.quota

    def satisfied() -> bool:
        return ws.fits(job, flavor, d) and (not p.reclaims or quota.in_quota(job.queue, d))

    return satisfied


def _held_on(pool: CandidatePool, leaving: Sequence[Candidate]) -> dict[str, int]:
    """Per node, the most any set of victims can free there: what the pool's candidates and the
    jobs already leaving hold."""
    held = pool.held_on()
    if leaving:
        held = held.copy()
        for c in leaving:
            for node, gpus in c.freed:
                held[node] = held.get(node, 0) + gpus
    return held


def _takeable(ws: Workspace, p: Preemptor, c: Candidate) -> bool:
    """May the search take the candidate now? A reclaim takes back only what is borrowed and
    only while the swap is fair (`RECLAIM.per_victim`, asked again now: every victim taken before
    it lowered what its side borrows). Notes how the rules let P take it (`Workspace.kinds`)."""
    v = c.job
    if c.leaving:
        return True
    if downward_allowed(ws.ctx, p, v):
        ws.kinds[v.id] = "downward"
        return True
    d = ws.quota.demand(v, c.flavor) if ws.ctx.policy.tier(v.tier).charged else ()
    kind = RECLAIM.per_victim(ws.ctx, p, v, d)
    if kind is None:
        return False
    ws.kinds[v.id] = kind
    return True


def _cheapest_slots(
    ws: Workspace,
    job: Job,
    flavor: str,
    eligible: Iterable[Candidate],
    by_cost: bool,
    ascending: bool = False,
    held: dict[str, int] | None = None,
) -> list[Candidate]:
    """Price the gang's replicas node by node and take the cheapest domain.

    A node offers replica slots: those its free GPUs hold now (free), then one more each time
    the next victim on it, in victim order, frees enough (the cost of that run). A domain — one
    node for `pack` or a single replica, a block for `block`, the whole flavor for `any` — is
    priced by its cheapest `replicas` slots; the cheapest domain's victims are returned.
    When victims come in cost order (`by_cost`) the scan stops as soon as no later victim can
    make a cheaper choice: every slot it completes costs at least its own cost. For a gang of
    several nodes the best domain (and so that bound) is worked out again every 256 victims
    (positions counted over all of `eligible`, every flavor). `ascending`: `eligible` is in
    ascending cost (see `CandidatePool.ascending`). `held`: per node, at least the GPUs the
    candidates of `eligible` hold there (none: unknown).
    """
    if job.gpus <= 0:
        return []
    runs = _Runs(ws, job, flavor, by_cost, held)
    if by_cost and not runs.per_node:
        _scan_for_a_gang(runs, flavor, eligible, ascending)
    elif ascending or not by_cost:
        _scan_on_flavor(runs, flavor, eligible)
    else:
        _scan_one_by_one(runs, flavor, eligible)
    return runs.victims()


_CHUNK = 256
"""Victims are scanned this many at a time, those on the flavor picked out at C speed."""


def _scan_for_a_gang(runs: _Runs, flavor: str, eligible: Iterable[Candidate], ascending: bool) -> None:
    """A gang of several nodes, victims in cost order: the bound changes only when the best
    domain is worked out again, after the 256th, 512th, … victim (when it is on the flavor).
    Inside each run of 256 it is fixed, so the scan stops at the first victim of the run that
    costs as much (found by bisection when costs only grow)."""
    items = iter(eligible)
    bound = math.inf
    while chunk := list(islice(items, _CHUNK)):
        if ascending:
            stop = bisect_left(chunk, bound, key=_cost)
        else:
            stop = next((k for k, c in enumerate(chunk) if c.cost >= bound), len(chunk))
        runs.take([c for c in chunk[:stop] if c.flavor == flavor], bound)
        if stop < len(chunk) or len(chunk) < _CHUNK:
            return
        if chunk[-1].flavor == flavor:
            best = runs.prices.best()
            if best is not None:
                bound = best[3]


def _scan_on_flavor(runs: _Runs, flavor: str, eligible: Iterable[Candidate]) -> None:
    """Only victims on the flavor change anything, and (costs only growing, or no cost order
    at all) one elsewhere that costs the bound is followed by none on the flavor that costs less."""
    items = iter(eligible)
    bound = math.inf
    while chunk := list(islice(items, _CHUNK)):
        bound, stopped = runs.take([c for c in chunk if c.flavor == flavor], bound)
        if stopped:
            return


def _scan_one_by_one(runs: _Runs, flavor: str, eligible: Iterable[Candidate]) -> None:
    """Victims in cost order, some costs negative: the scan stops at the first victim, on the
    flavor or not, that costs the bound."""
    bound = math.inf
    for c in eligible:
        if c.cost >= bound:
            return
        if c.flavor == flavor:
            bound, _ = runs.take((c,), bound)


Run = list[Any]
"""One node's run of victims in a search: [free GPUs, cost, new victims, candidates taken, its
offers, its candidates, most slots] (a list, not an object: the scan updates it per victim)."""


class _Runs:
    """The run of victims on each node of one search so far, and the slots each node offers.

    A node's offers are (cost, new victims, candidates taken) at 1, 2, … slots, in
    `prices.offers` too. A node never offers more slots than what is free there and what its
    candidates hold can fill (`held`), so once it offers that many, later victims on it change
    nothing and are passed over: on a node where a job that cannot be taken holds GPUs, a
    whole-node gang never gets a slot.
    """

    __slots__ = ("by_cost", "gpus", "held", "index", "per_node", "prices", "runs", "want")

    def __init__(self, ws: Workspace, job: Job, flavor: str, by_cost: bool, held: dict[str, int] | None) -> None:
        self.index = ws.index
        self.gpus = job.gpus
        self.want = job.replicas
        self.held = held
        self.by_cost = by_cost
        self.per_node = job.placement == "pack" or job.replicas == 1
        """Each domain is one node: a node's run completes a domain by itself."""
        self.prices = _Prices(ws, job, flavor)
        self.runs: dict[str, Run] = {}

    def take(self, cands: Iterable[Candidate], bound: float) -> tuple[float, bool]:
        """Add candidates on the flavor to their nodes' runs, in order, until one costs `bound`
        or more (victims in cost order); the bound, lowered as per-node domains complete, and
        whether the scan stopped."""
        by_cost, runs, g, want, per_node = self.by_cost, self.runs, self.gpus, self.want, self.per_node
        held, prices = self.held, self.prices
        for c in cands:
            cost = c.cost
            if by_cost and cost >= bound:
                return bound, True
            fresh = 0 if c.leaving else 1
            for node, gpus in c.freed:
                run = runs.get(node)
                if run is None:
                    # The node's run before any victim: the slots its free GPUs hold, at no
                    # cost. (Inline: a search opens thousands of nodes.)
                    free = self.index.free(node)[0]
                    offers = prices.offers[node] = [(0.0, 0, 0)] * min(want, free // g)
                    most = want if held is None else min(want, (free + held.get(node, 0)) // g)
                    run = runs[node] = [free, 0.0, 0, 0, offers, [], most]
                    prices.created(node)
                o = run[4]
                have = len(o)
                if have >= run[6]:
                    continue
                free = run[0] + gpus
                run[0] = free
                run[1] += cost
                run[2] += fresh
                run[3] += 1
                run[5].append(c)
                if free // g > have:
                    while len(o) < want and free // g > len(o):
                        o.append((run[1], run[2], run[3]))
                    prices.grew(node)
                    if per_node and len(o) >= want:
                        bound = min(bound, run[1])
        return bound, False

    def victims(self) -> list[Candidate]:
        """The victims of the cheapest domain (none: no domain has enough slots)."""
        best = self.prices.best()
        if best is None:
            return []
        chosen: dict[str, Candidate] = {}
        for n, count in best[2].items():
            run = self.runs.get(n)
            for c in (run[5] if run is not None else ())[:count]:
                chosen.setdefault(c.job.id, c)
        return list(chosen.values())


Price = tuple[float, int, dict[str, int], float]
"""A domain's (cost, new victims, candidates taken per node, bound)."""


class _Prices:
    """The offers of one search's nodes, and the cheapest domain among them.

    For `block` gangs the price of each block is kept until an offer of one of its nodes
    grows: the search asks for the best domain every 256 victims, and most blocks have not
    changed since the last time. (A node's first offers are what its free GPUs hold, which is
    what the block counted for it before, so they change no price.) Free capacity does not
    change during a search, so what each node holds free is read once.
    """

    __slots__ = ("blocks", "by_block", "dirty", "flavor", "idle", "job", "offers", "ws")

    def __init__(self, ws: Workspace, job: Job, flavor: str) -> None:
        self.ws = ws
        self.job = job
        self.flavor = flavor
        self.offers: dict[str, list[tuple[float, int, int]]] = {}
        """node → (cost, new victims, candidates taken) at 1, 2, … slots."""
        self.by_block = job.placement == "block" and job.replicas > 1
        self.blocks: dict[str, Price | None] = {}
        """`block` gangs: block → its price (None: too few slots), in first-offer order."""
        self.dirty: set[str] = set()
        """`block` gangs: blocks whose offers changed since they were priced."""
        self.idle: dict[str, int] = {}
        """node → replicas its free GPUs hold now."""

    def created(self, node: str) -> None:
        """The node's offers were created (the slots its free GPUs hold)."""
        if self.by_block:
            b = self.ws.index.block_of(node)
            if b not in self.blocks:
                self.blocks[b] = None
                self.dirty.add(b)

    def grew(self, node: str) -> None:
        """The node's offers grew."""
        if self.by_block:
            self.dirty.add(self.ws.index.block_of(node))

    def free_slots(self, node: str) -> int:
        """Replicas the node's free GPUs hold now (read once a search)."""
        k = self.idle.get(node)
        if k is None:
            k = self.idle[node] = self.ws.index.free(node)[0] // self.job.gpus
        return k

    def best(self) -> Price | None:
        """The cheapest domain's price, fewer new victims breaking ties (jobs already leaving are
        free and no victim); the bound is what a later victim must cost less than to improve
        on it. Among equal domains the first (in first-offer order) wins."""
        job, offers = self.job, self.offers
        want = job.replicas
        best: Price | None = None
        if job.placement == "pack" or want == 1:
            for n, o in offers.items():
                if len(o) >= want:
                    price = _node_price(n, o, want)
                    if best is None or (price[0], price[1]) < best[:2]:
                        best = price
            return best
        if self.by_block:
            blocks = self.blocks
            for b in self.dirty:
                blocks[b] = self._domain_price(self.ws.block_nodes(b))
            self.dirty.clear()
            for priced in blocks.values():
                if priced is not None and (best is None or priced[:2] < best[:2]):
                    best = priced
            return best
        return self._domain_price(list(offers))

    def _domain_price(self, nodes: Sequence[str]) -> Price | None:
        """The price of one domain: its cheapest `replicas` slots. None: it has too few."""
        job, offers, flavor = self.job, self.offers, self.flavor
        g, want = job.gpus, job.replicas
        table = {n: o for n in nodes if (o := offers.get(n))}
        if job.placement == "block":
            # Block nodes without victims still offer what their free GPUs hold, at no cost.
            for n in nodes:
                if n not in table and (k := self.free_slots(n)):
                    table[n] = [(0.0, 0, 0)] * min(k, want)
        elif job.placement == "any" and want > 1:
            idle = self.ws.index.slots(flavor, g, want + sum(len(o) for o in table.values()))
            idle -= sum(self.free_slots(n) for n in table)
            if idle > 0:
                table[""] = [(0.0, 0, 0)] * min(idle, want)
        if sum(len(o) for o in table.values()) < want:
            return None
        # Take slots cheapest-marginal first, fewer new victims on ties; a node's slots in order.
        heap = [(o[0][0], o[0][1], n, 0) for n, o in table.items()]
        heapq.heapify(heap)
        taken: dict[str, int] = {}
        total = top = 0.0
        for _ in range(want):
            marginal, _, n, k = heapq.heappop(heap)
            total += marginal
            top = max(top, marginal)
            taken[n] = k + 1
            o = table[n]
            if k + 1 < len(o):
                heapq.heappush(heap, (o[k + 1][0] - o[k][0], o[k + 1][1] - o[k][1], n, k + 1))
        prefix = {n: table[n][k - 1][2] for n, k in taken.items() if n}
        victims = sum(table[n][k - 1][1] for n, k in taken.items() if n)
        # `any` improves only if a later victim undercuts its dearest slot; one domain of a
        # `block` or `pack` gang only if it costs less than the whole of the best one.
        bound = top if job.placement == "any" and want > 1 else total
        return total, victims, prefix, bound


def _node_price(n: str, o: list[tuple[float, int, int]], want: int) -> Price:
    """`_Prices._domain_price` of one node's first `want` slots (`pack`, or a single replica),
    without the heap: a lone node's slots are taken in order. Sums as the heap would,
    marginal by marginal, so the total is the same float."""
    total = top = 0.0
    prev = 0.0
    for k in range(want):
        marginal = o[k][0] if k == 0 else o[k][0] - prev
        prev = o[k][0]
        total += marginal
        top = max(top, marginal)
    if not n:  # as `_domain_price` reads it: the nameless entry is idle capacity, no victims
        return total, 0, {}, total
    return total, o[want - 1][1], {n: o[want - 1][2]}, total


def _fill(
    ws: Workspace,
    p: Preemptor,
    flavor: str,
    eligible: Iterable[Candidate],
    victims: list[Candidate],
    chosen: set[str],
    satisfied: Callable[[], bool],
) -> bool:
    """Add victims in victim order until `satisfied()`; True when it is.

    Only victims that can help are taken: ones on the job's flavor while it lacks GPUs or a
    placement, ones under the queue whose limit (or, for `p.reclaims`, whose nominal) it breaks
    while it lacks quota. Fit is tested only once enough GPUs have been freed to possibly make
    a difference.
    """
    job, quota = p.job, ws.quota
    gpu_short = job.total_gpus - ws.index.free_gpus(flavor)
    short = _short_of_quota(quota, p)
    for c in eligible:
        v = c.job
        if v.id in chosen:
            continue
        on_flavor = c.flavor == flavor
        in_subtree = short is not None and ws.frees_quota_in(c, short)
        if not in_subtree and not (on_flavor and (gpu_short > 0 or short is None)):
            continue
        if not _takeable(ws, p, c):
            continue
        ws.release(c)
        victims.append(c)
        chosen.add(v.id)
        if on_flavor:
            gpu_short -= sum(gpus for _, gpus in c.freed)
        if gpu_short > 0:
            continue
        short = _short_of_quota(quota, p)
        if short is not None:
            continue
        if satisfied():
            return True
    return False


def _short_of_quota(quota: QuotaTree, p: Preemptor) -> int | None:
    """The queue whose subtree must shrink for the job's quota (the limit it breaks, or for
    `p.reclaims` the nominal), or None."""
    job, d = p.job, p.demand
    if not d:
        return None
    broken = quota.violation(job.queue, d)
    if broken is not None:
        return broken[0]
    return quota.over_nominal_at(job.queue, d) if p.reclaims else None


def drop_unneeded(ws: Workspace, released: Sequence[Candidate], satisfied: Callable[[], bool]) -> list[Candidate]:
    """Take back, in the given order, each released job that `satisfied()` does not need; the rest."""
    needed = []
    for c in released:
        ws.retake(c)
        if satisfied():
            continue
        ws.release(c)
        needed.append(c)
    return needed
