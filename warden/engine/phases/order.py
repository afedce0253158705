"""Phase 2, order: the waiting jobs in scheduling order (DESIGN §4.1), claimants first.

The sort key is `(tier, starvation breach, fair rank, −waited, submit, id)` under the governed
order; `fifo` ranks by submit time and id alone and `priority` by tier first, either taking a
requeued job's requeue time for its submit time under `requeue_timestamp: eviction`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from warden.engine.fairshare import fair_order
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.plan import SortKey

INF = math.inf
_PENDING, _REQUEUED, _AWAITING = JobState.PENDING, JobState.REQUEUED, JobState.AWAITING_APPROVAL

Ranked = tuple[float, float, str, int, SortKey, Job]
"""(−waited, submit, id, arrival, sort key, job): a job as `ranked` sorts it."""


def rank(snapshot: Snapshot, now: float, waiting: Iterable[Job] | None = None) -> list[tuple[SortKey, Job]]:
    """The waiting jobs of a snapshot in scheduling order, each with its sort key.

    `waiting` may name the snapshot's waiting jobs when the caller already knows them.
    """
    return [(key, job) for *_, key, job in ranked(snapshot, now, waiting)]


def ranked(snapshot: Snapshot, now: float, waiting: Iterable[Job] | None = None) -> list[Ranked]:
    """`rank`, each job as (−waited, submit, id, arrival, sort key, job).

    Jobs are grouped by (tier, breach, fair rank) first and each group sorted by the rest: the
    groups are few, and inside one the first field compared is a float that rarely ties, which
    is several times cheaper than comparing whole keys field by field. The rest leads each
    entry, so a group sorts without a key function; `arrival` (unique) settles any full tie
    as a stable sort would, and the key and job are never compared.
    """
    policy = snapshot.policy
    new = tuple.__new__  # SortKey's own constructor is a Python function; this is C
    groups: dict[tuple[int, int, int], list[Ranked]] = {}
    order = policy.scheduling.order
    fifo = order != "governed"
    by_tier = order == "priority"
    by_eviction = policy.scheduling.requeue_timestamp == "eviction"
    fair = {} if fifo else fair_order(policy, snapshot.ledger.usage)
    default_wait = policy.fair_share.aging.max_wait.get("default", INF)
    # queue → (fair rank, ratios, max wait); a queue the policy does not know ranks last.
    max_waits = policy.max_waits()
    queues = {q: (fr, ratios, max_waits.get(q, default_wait)) for q, (fr, ratios) in fair.items()}
    unknown = (len(fair), (), default_wait)
    for n, j in enumerate(snapshot.jobs if waiting is None else waiting):
        state = j.state
        if not (state is _PENDING or state is _REQUEUED or state is _AWAITING):  # not state.waiting
            continue
        if fifo:
            tier = j.tier if by_tier else 0
            stamp = j.pending_since if by_eviction and j.pending_since is not None else j.submit
            key = new(SortKey, (tier, 1, 0, 0.0, stamp, j.id, ()))
            entry = (0.0, stamp, j.id, n, key, j)
            group_key = (tier, 1, 0)
        else:
            fr, ratios, max_wait = queues.get(j.queue, unknown)
            since = j.submit if j.pending_since is None else j.pending_since
            waited = j.waited + (now - since if now > since else 0.0)  # accounting.wait_time, inlined: hot loop
            breach = 0 if waited >= max_wait else 1
            neg_waited = -waited
            key = new(SortKey, (j.tier, breach, fr, neg_waited, j.submit, j.id, ratios))
            entry = (neg_waited, j.submit, j.id, n, key, j)
            group_key = (j.tier, breach, fr)
        group = groups.get(group_key)
        if group is None:
            groups[group_key] = [entry]
        else:
            group.append(entry)
    out: list[Ranked] = []
    for g in sorted(groups):
        members = groups[g]
        members.sort()
        out.extend(members)
    return out


def claimants_first(ranking: list[Ranked], claims: dict[str, Job]) -> list[Ranked]:
    """The ranking, with each job that holds a claim moved ahead of every job of its own or a
    lower tier (claimants among themselves in rank order).

    A claimant's victims are leaving for it: considered before any job it could preempt in
    turn, it takes what they free (or claims it again while they are still in their grace),
    so nobody is admitted into that capacity only to be preempted for it again. A job of a
    higher tier may still take it: the claimant could not preempt that job, so no loop
    follows, and higher tiers keep going first.
    """
    if not claims:
        return ranking
    first = [r for r in ranking if r[2] in claims and r[5].state is not _AWAITING]
    if not first:
        return ranking
    held = {r[2] for r in first}
    out: list[Ranked] = []
    lowest = min(r[5].tier for r in first)  # the smallest tier among claimants not yet placed
    for r in ranking:
        if r[2] in held:
            continue
        if first and r[5].tier >= lowest:
            tier = r[5].tier
            placed = [c for c in first if c[5].tier <= tier]
            out.extend(placed)
            first = [c for c in first if c[5].tier > tier]
            lowest = min((c[5].tier for c in first), default=0)
        out.append(r)
    out.extend(first)
    return out
