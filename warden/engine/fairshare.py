"""Decayed dominant-resource usage and the Fair Tree order of queues (DESIGN §4.1).

Usage is ∫ share(t) dt with exponential decay of the policy's half-life, where a job's share
is its dominant resource share (DRF: max over resources of used / capacity). Tiers that are not
charged (tier 4 by default) accrue nothing. The order compares siblings at every level of the
queue tree by `usage share / entitled share` (Slurm's Fair Tree), so a team that used little of
what its weight entitles it to is served first, within its department first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from warden.engine.model import Job, Node, UsageLedger

if TYPE_CHECKING:
    from warden.engine.policy import Policy, QueueSpec


def cluster_capacity(nodes: Iterable[Node]) -> tuple[int, int, int]:
    """Total (gpus, cpu, memory) of the cluster; unavailable GPUs are no capacity."""
    g = c = m = 0
    for n in nodes:
        g += n.usable_gpus
        c += n.cpu
        m += n.memory
    return g, c, m


def dominant_share(job: Job, capacity: tuple[int, int, int]) -> float:
    """max over resources of what the whole gang holds / what the cluster has."""
    r = job.replicas
    best = 0.0
    for used, cap in ((job.gpus * r, capacity[0]), (job.cpu * r, capacity[1]), (job.memory * r, capacity[2])):
        if cap > 0 and used > 0:
            best = max(best, used / cap)
    return best


def accrue(
    ledger: UsageLedger, jobs: Iterable[Job], capacity: tuple[int, int, int], policy: Policy, until: float
) -> UsageLedger:
    """Advance the ledger to `until`, assuming the jobs that hold resources held them throughout.

    Shells call it before every change to the set of running jobs, so the assumption holds.
    """
    holding = (job for job in jobs if job.state.holds_resources)
    return accrue_rates(ledger, queue_rates(holding, capacity, policy), policy.fair_share.half_life, until)


def queue_rates(jobs: Iterable[Job], capacity: tuple[int, int, int], policy: Policy) -> dict[str, float]:
    """Per queue, the summed dominant share of these jobs that are of a charged tier: the rate
    at which their queue's usage grows while they hold what they ask for."""
    rates: dict[str, float] = {}
    for job in jobs:
        if policy.tier(job.tier).charged:
            rates[job.queue] = rates.get(job.queue, 0.0) + dominant_share(job, capacity)
    return rates


def accrue_rates(ledger: UsageLedger, rates: Mapping[str, float], half_life: float, until: float) -> UsageLedger:
    """Advance the ledger to `until` with each queue's summed dominant share held constant.

    A shell that keeps those sums itself (the simulator) pays per queue, not per job.
    """
    dt = until - ledger.at
    if dt <= 0:
        return ledger
    decay = 0.5 ** (dt / half_life)
    # ∫_0^dt s · 2^{-(dt-t)/h} dt = s · h/ln2 · (1 - 2^{-dt/h})
    gain = half_life / math.log(2) * (1.0 - decay)
    usage = {q: u * decay for q, u in ledger.usage.items()}
    for q, rate in rates.items():
        if rate > 0:
            usage[q] = usage.get(q, 0.0) + rate * gain
    return UsageLedger(at=until, usage=MappingProxyType(usage))


def fair_order(policy: Policy, usage: Mapping[str, float]) -> dict[str, tuple[int, tuple[float, ...]]]:
    """Leaf queue → (rank in the Fair Tree walk, usage/entitlement ratios from the root down).

    The ratio of a queue is (its subtree's usage / its siblings' total usage) divided by (its
    weight / its siblings' total weight); with no usage among the siblings every ratio is 0.
    Siblings are ordered by ratio and a depth-first walk in that order ranks the leaves. Siblings
    with equal ratios share a rank, and so do their subtrees' leaves where the ratios below tie
    too, so that aging, not a queue's name, decides between equally served teams.

    Every pass asks this, so the tree's shape is worked out once per policy (`_shape`).
    """
    leaves, inner, children = _shape(policy.queues)
    if len(inner) == 1:  # the root alone has children: they are all leaves
        return _flat_order(children[inner[0]], usage)
    subtree = {leaf: usage.get(leaf, 0.0) for leaf in leaves}
    for name in inner:  # children before parents
        total = 0.0
        for child, _ in children[name]:
            total += subtree[child]
        subtree[name] = total
    walked: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {}
    stack: list[tuple[str, tuple[int, ...], tuple[float, ...]]] = [(policy.queues.name, (), ())]
    while stack:
        name, ranks, ratios = stack.pop()
        kids = children.get(name)
        if kids is None:
            walked[name] = (ranks, ratios)
            continue
        used = subtree[name]
        scored = sorted([((subtree[c] / used if used > 0 else 0.0) / share, c) for c, share in kids])
        distinct = sorted({ratio for ratio, _ in scored})
        for ratio, c in reversed(scored):  # the stack pops them in (ratio, name) order
            stack.append((c, (*ranks, distinct.index(ratio)), (*ratios, ratio)))
    depth = max(len(ranks) for ranks, _ in walked.values())
    padded = {leaf: ranks + (0,) * (depth - len(ranks)) for leaf, (ranks, _) in walked.items()}
    order = {key: n for n, key in enumerate(sorted(set(padded.values())))}
    return {leaf: (order[padded[leaf]], ratios) for leaf, (_, ratios) in walked.items()}


def _flat_order(
    kids: tuple[tuple[str, float], ...], usage: Mapping[str, float]
) -> dict[str, tuple[int, tuple[float, ...]]]:
    """`fair_order` of a root whose children are all leaves (as in every simulator preset),
    without the walk: one sort, and a leaf's rank is its ratio's place among the distinct
    ratios (the same sums, quotients and order as the walk)."""
    get = usage.get
    used = 0.0
    for child, _ in kids:
        used += get(child, 0.0)
    scored = sorted([((get(c, 0.0) / used if used > 0 else 0.0) / share, c) for c, share in kids])
    rank_of = {ratio: n for n, ratio in enumerate(sorted({ratio for ratio, _ in scored}))}
    return {c: (rank_of[ratio], (ratio,)) for ratio, c in scored}


_Shape = tuple[tuple[str, ...], tuple[str, ...], dict[str, tuple[tuple[str, float], ...]]]
_shapes: dict[int, tuple[QueueSpec, _Shape]] = {}


def _shape(root: QueueSpec) -> _Shape:
    """(leaves, inner queues children first, inner queue → its children with their weight
    shares) of a queue tree, kept for the last few trees seen."""
    known = _shapes.get(id(root))
    if known is not None and known[0] is root:
        return known[1]
    leaves: list[str] = []
    inner: list[str] = []
    children: dict[str, tuple[tuple[str, float], ...]] = {}

    def visit(q: QueueSpec) -> None:
        if not q.children:
            leaves.append(q.name)
            return
        weight = sum(c.weight for c in q.children)
        children[q.name] = tuple((c.name, c.weight / weight) for c in q.children)
        for c in q.children:
            visit(c)
        inner.append(q.name)

    visit(root)
    shape = (tuple(leaves), tuple(inner), children)
    if len(_shapes) >= 8:
        _shapes.clear()
    _shapes[id(root)] = (root, shape)
    return shape
