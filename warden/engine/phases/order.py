"""Phase 2, order: the waiting jobs in scheduling order (DESIGN §4.1), claimants first.

The sort key is `(tier, starvation breach, fair rank, −waited, submit, id)` under the governed
order; `fifo` ranks by submit time and id alone and `priority` by tier first, either taking a
requeued job's requeue time for its submit time under `requeue_timestamp: eviction`, and
either putting the jobs that would borrow after the others of their tier under `nominal_first`.

A pass never sorts the waiting jobs: `warden.engine.waiting` keeps each class of them in rank
order between passes, by an anchor that does not move with time (−waited is the anchor minus
`now`), and `Order` gives a member its rank key from the anchor and what this pass says of its
queue (fair rank, the anchor at which its wait breaches the queue's maximum). A job holding a
claim goes ahead of every other waiting job of tiers 2–4, behind tier 1 (`claimant_keys`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warden.engine.allocation import Allocation
from warden.engine.fairshare import fair_order
from warden.engine.model import Job, Snapshot
from warden.engine.plan import SortKey
from warden.engine.policy import Policy
from warden.engine.quota import QuotaTree
from warden.engine.waiting import Entry, OrderMode

INF = math.inf

RankKey = tuple[Any, ...]
"""(tier as ranked, 1, breach, fair rank or borrows, anchor, second, id, 0) — or, for a
claimant, (the first tier its claim holds against, 0, its own key as one element): how a pass orders the
waiting jobs. Unique per job (the id is)."""
Prefix = tuple[int, int, float]
"""What a class's members share of their rank keys in a pass (`Order.prefix`)."""
BREACHED, STARVING, NOT_STARVING = 0, 1, 2
"""`SortKey.breach`: past the queue's max wait, past `aging.escalate_at` of it only, neither.
The rank key puts the first two together at the front of the tier (0), the rest after (1)."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """What ranking reads of a policy: the anchor mode, each queue's maximum wait and the
    default one. Worked out once per policy (`ranking_of`): a pass asks for it twice, and the
    per-queue table is a pydantic private attribute, each read of which costs microseconds."""

    mode: OrderMode
    max_waits: Mapping[str, float]
    default_wait: float
    escalate_at: float


_rankings: dict[int, tuple[Policy, Ranking]] = {}


def ranking_of(policy: Policy) -> Ranking:
    """The policy's `Ranking`, kept for the last few policies seen."""
    known = _rankings.get(id(policy))
    if known is not None and known[0] is policy:
        return known[1]
    scheduling = policy.scheduling
    ranking = Ranking(
        OrderMode(governed=scheduling.order == "governed", by_eviction=scheduling.requeue_timestamp == "eviction"),
        policy.max_waits(),
        policy.fair_share.aging.max_wait["default"],
        policy.fair_share.aging.escalate_at,
    )
    if len(_rankings) >= 8:
        _rankings.clear()
    _rankings[id(policy)] = (policy, ranking)
    return ranking


def mode_of(policy: Policy) -> OrderMode:
    return ranking_of(policy).mode


class Order:
    """What one pass ranks by: per queue, its fair rank, ratios, breach and escalation anchors."""

    __slots__ = ("borrows", "by_tier", "governed", "mode", "now", "queues", "unknown")

    def __init__(
        self,
        policy: Policy,
        usage: Mapping[str, float],
        now: float,
        borrows: Callable[[Job], bool] | None = None,
    ) -> None:
        self.now = now
        self.borrows = borrows
        """Under `nominal_first`: would the job's admission borrow (`borrowing_test`)."""
        ranking = ranking_of(policy)
        self.mode = ranking.mode
        self.governed = self.mode.governed
        self.by_tier = self.governed or policy.scheduling.order == "priority"
        fair = fair_order(policy, usage) if self.governed else {}
        default_wait = ranking.default_wait
        max_waits = ranking.max_waits
        escalate = ranking.escalate_at
        self.queues: dict[str, tuple[int, tuple[float, ...], float, float]] = {}
        """Queue → (fair rank, ratios, breach anchor, escalation anchor): a job whose anchor is
        at most the first has waited past the queue's max wait, at most the second past
        `aging.escalate_at` of it; a queue the policy does not know ranks last."""
        for q, (fr, ratios) in fair.items():
            limit = max_waits.get(q, default_wait)
            self.queues[q] = (fr, ratios, now - limit, now - escalate * limit)
        self.unknown = (len(fair), (), now - default_wait, now - escalate * default_wait)

    def prefix(self, job: Job) -> Prefix:
        """(tier as ranked, fair rank, escalation anchor) of the job's class (any member's);
        outside the governed order the fair rank's place says whether the job would borrow (0
        or 1)."""
        if not self.governed:
            borrows = self.borrows is not None and self.borrows(job)
            return (job.tier if self.by_tier else 0), int(borrows), -INF
        fr, _, _, escalate = self.queues.get(job.queue, self.unknown)
        return job.tier, fr, escalate

    def key(self, prefix: Prefix, entry: Entry) -> RankKey:
        tier, fr, escalate = prefix
        anchor = entry[0]
        if not self.governed:
            return (tier, 1, 1, fr, anchor, entry[1], entry[2], 0)
        return (tier, 1, 0 if anchor <= escalate else 1, fr, anchor, entry[1], entry[2], 0)

    def key_of(self, job: Job) -> RankKey:
        return self.key(self.prefix(job), self.mode.entry(job))

    def sort_key(self, job: Job, key: RankKey) -> SortKey:
        """The key shown to users: tier, borrows, breach, fair rank, −waited, submit, id, ratios."""
        new = tuple.__new__
        if not self.governed:
            return new(SortKey, (key[0], key[3], NOT_STARVING, 0, 0.0, key[4], job.id, ()))
        _, ratios, breach_at, _ = self.queues.get(job.queue, self.unknown)
        starving = NOT_STARVING if key[2] else BREACHED if key[4] <= breach_at else STARVING
        since = job.submit if job.pending_since is None else job.pending_since
        now = self.now
        waited = job.waited + (now - since if now > since else 0.0)  # accounting.wait_time
        return new(SortKey, (job.tier, 0, starving, key[3], -waited, job.submit, job.id, ratios))


def borrowing_test(
    policy: Policy, quota: QuotaTree, flavors: Sequence[str], charged: Mapping[int, bool]
) -> Callable[[Job], bool] | None:
    """Under `nominal_first`, whether a job's admission would take a queue on its path above
    its nominal quota on every flavor it may use, with usage as it is now (the pass's start):
    remembered per queue and shape, so the ranking does not move as the pass admits. None when
    the policy ranks without it or governs no quota."""
    if not policy.scheduling.nominal_first or not quota.governed():
        return None
    room = quota.nominal_room()
    seen: dict[tuple[Any, ...], bool] = {}

    def borrows(job: Job) -> bool:
        key = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.cpu, job.memory)
        found = seen.get(key)
        if found is None:
            left = room.get(job.queue)
            found = False
            if left is not None and charged.get(job.tier, False):
                found = not any(
                    all(a <= r + 1e-9 for a, r in zip(quota.demand(job, f), left))
                    for f in ((job.flavor,) if job.flavor is not None else flavors)
                )
            seen[key] = found
        return found

    return borrows


def claimant_keys(order: Order, claimants: Iterable[Job]) -> dict[str, RankKey]:
    """Each claimant's rank key: ahead of every other waiting job of tiers 2–4 and behind every
    waiting job of tier 1 (a tier-1 claimant: ahead of the other tier-1 jobs); among claimants,
    by their own keys. (Under `order: fifo`, which ranks no tier, ahead of every job.)

    A claimant's victims are leaving for it: considered first, it takes what they free (or
    claims it again while they are still in their grace), so nobody of tiers 2–4 is admitted
    into that capacity — neither a job it would preempt for it again, nor a higher-tier one
    that would leave it to preempt anew the next time (on Philly at 600 GPUs, claims that gave
    way to every higher tier cost the governed policy a p95 wait of 478 h against 87 h). A
    claim never holds against tier 1: production does not wait behind a claim (DESIGN §4.4).
    """
    out: dict[str, RankKey] = {}
    for job in claimants:
        own = order.key_of(job)
        out[job.id] = (min(own[0], _CLAIMS_FROM), 0, own)
    return out


_CLAIMS_FROM = 2
"""The first ranked tier a claim holds against: every tier below production's."""


def rank(snapshot: Snapshot, now: float, waiting: Iterable[Job] | None = None) -> list[tuple[SortKey, Job]]:
    """The waiting jobs of a snapshot in scheduling order (claims aside), each with its sort key.

    `waiting` may name the snapshot's waiting jobs when the caller already knows them.
    """
    policy = snapshot.policy
    borrows = None
    if policy.scheduling.nominal_first:
        alloc = Allocation(snapshot.nodes, policy)
        alloc.sync(j for j in snapshot.jobs if j.state.holds_resources and j.attempt is not None)
        borrows = borrowing_test(policy, alloc.quota, alloc.index.flavors(), alloc.charged_tiers)
    order = Order(policy, snapshot.ledger.usage, now, borrows)
    jobs = [j for j in (snapshot.jobs if waiting is None else waiting) if j.state.waiting]
    keyed = sorted(((order.key_of(j), j) for j in jobs), key=_first)
    return [(order.sort_key(j, k), j) for k, j in keyed]


def _first(row: tuple[RankKey, Job]) -> RankKey:
    return row[0]
