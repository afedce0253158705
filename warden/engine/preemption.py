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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

from warden.engine.model import Job
from warden.engine.rules import Preemptor, allowed, downward_key

if TYPE_CHECKING:
    from warden.engine.placement import CapacityIndex
    from warden.engine.quota import QuotaTree
    from warden.engine.rules import RuleContext


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running job that could be preempted, with what it would cost, computed once a pass."""

    job: Job
    cost: float
    lost: float
    protected_until: float
    """0.0 when the victim rules let it go now; else when they will (inf: never)."""
    flavor: str
    rank: int
    """Position in victim order."""


class CandidatePool:
    """The running jobs of one pass in victim order, with the lists each search starts from."""

    def __init__(self, candidates: list[Candidate]) -> None:
        self.all = candidates
        self.free_now = [c for c in candidates if c.protected_until == 0.0]
        self._downward: dict[tuple, list[Candidate]] = {}

    def eligible(self, ctx: RuleContext, p: Preemptor, taken: set[str]) -> list[Candidate]:
        """Victims the rules let `p` take now, in victim order, leaving out `taken` ones."""
        key = downward_key(ctx, p)
        lower = self._downward.get(key)
        if lower is None:
            tier = p.job.tier
            lower = self._downward[key] = [c for c in self.free_now if c.job.tier > tier and allowed(ctx, p, c.job)]
        same = [c for c in self.free_now if c.job.tier == p.job.tier and allowed(ctx, p, c.job)]
        merged = heapq.merge(lower, same, key=lambda c: c.rank) if same else lower
        return [c for c in merged if c.job.id not in taken]


def victim_key(order: str, job: Job, cost: float) -> tuple:
    """The one comparator: smaller goes first. `cost`: least cost, then lower tier first, then
    the most recently started; `newest` and `smallest` reproduce Kueue's and Slurm's choices."""
    started = job.attempt.started_at if job.attempt is not None else 0.0
    if order == "newest":
        return (-job.tier, -started, job.id)
    if order == "smallest":
        return (-job.tier, job.total_gpus, -started, job.id)
    return (cost, -job.tier, -started, job.id)


class Workspace(Protocol):
    """What the search needs from a scheduling pass: what-if release and fit tests."""

    index: CapacityIndex
    quota: QuotaTree
    ctx: RuleContext

    def release(self, job: Job) -> None: ...

    def retake(self, job: Job) -> None: ...

    def fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool: ...

    def charged(self, job: Job) -> bool: ...

    def block_nodes(self, block: str) -> Sequence[str]: ...


def search(ws: Workspace, p: Preemptor, flavor: str, pool: CandidatePool, taken: set[str]) -> list[Candidate]:
    """The victims that make `p` fit on `flavor`, released in `ws`; [] (nothing released) if
    no eligible set does. `taken`: ids of jobs already chosen as victims in this pass."""
    job, d = p.job, p.demand
    eligible = pool.eligible(ws.ctx, p, taken)
    if not eligible:
        return []
    victims: list[Candidate] = []
    chosen: set[str] = set()
    for c in _cheapest_slots(ws, job, flavor, eligible):
        if c.job.tier <= job.tier and not still_borrowing(ws.quota, p, c.job):
            continue  # reclaim takes back only what is borrowed
        ws.release(c.job)
        victims.append(c)
        chosen.add(c.job.id)
    if not ws.fits(job, flavor, d) and not _fill(ws, p, flavor, eligible, victims, chosen):
        for c in victims:
            ws.retake(c.job)
        return []
    costliest_first = sorted(victims, key=lambda c: -c.cost)
    needed = {c.job.id for c in drop_unneeded(ws, job, flavor, d, costliest_first)}
    return [c for c in victims if c.job.id in needed]


def _cheapest_slots(ws: Workspace, job: Job, flavor: str, eligible: list[Candidate]) -> list[Candidate]:
    """Price the gang's replicas node by node and take the cheapest domain.

    A node offers replica slots: those its free GPUs hold now (free), then one more each time
    the next victim on it, in victim order, frees enough (the cost of that run). A domain — one
    node for `pack` or a single replica, a block for `block`, the whole flavor for `any` — is
    priced by its cheapest `replicas` slots; the cheapest domain's victims are returned.
    """
    g, want = job.gpus, job.replicas
    if g <= 0:
        return []
    on_node: dict[str, list[tuple[Candidate, int]]] = {}
    for c in eligible:
        if c.flavor != flavor or c.job.attempt is None:
            continue
        here: dict[str, int] = {}
        for rp in c.job.attempt.assignment:
            here[rp.node] = here.get(rp.node, 0) + c.job.gpus
        for node, gpus in here.items():
            on_node.setdefault(node, []).append((c, gpus))

    def offers(node: str) -> list[tuple[float, int]]:
        """(cost so far, victims so far) at which the node holds 1, 2, … replicas."""
        free = ws.index.free(node)[0]
        out = [(0.0, 0)] * min(want, free // g)
        cost, n = 0.0, 0
        for c, gpus in on_node.get(node, ()):
            if len(out) >= want:
                break
            free += gpus
            cost += c.cost
            n += 1
            while len(out) < want and free // g > len(out):
                out.append((cost, n))
        return out

    index = ws.index
    if job.placement == "pack" or want == 1:
        domains: Iterable[Sequence[str]] = ([n] for n in on_node)
    elif job.placement == "block":
        blocks = dict.fromkeys(index.block_of(n) for n in on_node)
        domains = (ws.block_nodes(b) for b in blocks)
    else:
        domains = [list(on_node)]
    best: tuple[float, int, dict[str, int]] | None = None
    for nodes in domains:
        table = {n: o for n in nodes if (o := offers(n))}
        if job.placement == "any" and want > 1:
            # Nodes without victims still offer what their free GPUs hold, at no cost.
            idle = index.slots(flavor, g, want + sum(len(o) for o in table.values()))
            idle -= sum(index.free(n)[0] // g for n in table)
            if idle > 0:
                table[""] = [(0.0, 0)] * min(idle, want)
        if sum(len(o) for o in table.values()) < want:
            continue
        # Take slots cheapest-marginal first; a node's slots come in order.
        heap = [(o[0][0], n, 0) for n, o in table.items()]
        heapq.heapify(heap)
        taken: dict[str, int] = {}
        total = 0.0
        for _ in range(want):
            marginal, n, k = heapq.heappop(heap)
            total += marginal
            taken[n] = k + 1
            o = table[n]
            if k + 1 < len(o):
                heapq.heappush(heap, (o[k + 1][0] - o[k][0], n, k + 1))
        prefix = {n: table[n][k - 1][1] for n, k in taken.items()}
        victims = sum(prefix.values())
        if best is None or (total, victims) < best[:2]:
            best = (total, victims, prefix)
    if best is None:
        return []
    chosen: dict[str, Candidate] = {}
    for n, count in best[2].items():
        for c, _ in on_node.get(n, ())[:count]:
            chosen.setdefault(c.job.id, c)
    return list(chosen.values())


def _fill(ws: Workspace, p: Preemptor, flavor: str, eligible: list[Candidate],
          victims: list[Candidate], chosen: set[str]) -> bool:
    """Add victims in victim order until the job fits; True when it does.

    Only victims that can help are taken: ones on the job's flavor while it lacks GPUs or a
    placement, ones under the queue whose limit it breaks while it lacks quota. Fit is tested
    only once enough GPUs have been freed to possibly make a difference.
    """
    job, d = p.job, p.demand
    index, quota = ws.index, ws.quota
    gpu_short = job.total_gpus - index.free_gpus(flavor)
    broken = quota.violation(job.queue, d) if d else None
    for c in eligible:
        v = c.job
        if v.id in chosen:
            continue
        on_flavor = c.flavor == flavor
        in_subtree = (broken is not None and ws.charged(v)
                      and broken[0] in quota.paths.get(v.queue, ()))
        if not in_subtree and not (on_flavor and (gpu_short > 0 or broken is None)):
            continue
        if v.tier <= job.tier and not still_borrowing(ws.quota, p, v):
            continue
        ws.release(v)
        victims.append(c)
        chosen.add(v.id)
        if on_flavor:
            gpu_short -= v.total_gpus
        if gpu_short > 0:
            continue
        if d:
            broken = quota.violation(job.queue, d)
            if broken is not None:
                continue
        if ws.fits(job, flavor, d):
            return True
    return False


def still_borrowing(quota: QuotaTree, p: Preemptor, v: Job) -> bool:
    """Reclaim takes a victim only while its side is still above nominal."""
    _, _, v_side = quota.lowest_common_ancestor(p.job.queue, v.queue)
    return v_side >= 0 and quota.over_nominal(v_side)


def drop_unneeded(ws: Workspace, job: Job, flavor: str, d: tuple[float, ...],
                  released: Sequence[Candidate | Job]) -> list:
    """Take back, in the given order, each released job the fit does not need; the rest."""
    needed = []
    for item in released:
        v = item.job if isinstance(item, Candidate) else item
        ws.retake(v)
        if ws.fits(job, flavor, d):
            continue
        ws.release(v)
        needed.append(item)
    return needed
