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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

from warden.engine.model import Job
from warden.engine.rules import Preemptor, allowed, downward_key, may_reclaim

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
    leaving: bool = False
    """Already on its way out (terminating, or signalled earlier in this pass): its capacity is
    about to free at no further cost."""
    parts: tuple[tuple[str, int, int, int], ...] | None = None
    """For a leaving job part of whose capacity another waiting job already counts on: the
    (node, gpus, cpu, memory) that are still unpromised. None: all it holds."""
    eta: float = 0.0
    """When a leaving job's capacity is certain to be free (its SIGKILL deadline)."""

    def gpus_by_node(self) -> dict[str, int]:
        """GPUs this candidate would free, per node."""
        out: dict[str, int] = {}
        if self.parts is not None:
            for node, gpus, _, _ in self.parts:
                out[node] = out.get(node, 0) + gpus
        elif self.job.attempt is not None:
            for rp in self.job.attempt.assignment:
                out[rp.node] = out.get(rp.node, 0) + self.job.gpus
        return out


class CandidatePool:
    """The running jobs of one pass in victim order, with the lists each search starts from."""

    def __init__(self, candidates: list[Candidate], by_cost: bool) -> None:
        self.all = candidates
        self.by_cost = by_cost
        """True when victim order is ascending cost (the search may stop early)."""
        self.free_now = [c for c in candidates if c.protected_until == 0.0]
        self._downward: dict[tuple, list[Candidate]] = {}

    def eligible(self, ctx: RuleContext, p: Preemptor, taken: set[str]) -> list[Candidate]:
        """Victims the rules let `p` take now, in victim order, leaving out `taken` ones."""
        key = downward_key(ctx, p)
        lower = self._downward.get(key)
        if lower is None:
            tier = p.job.tier
            lower = self._downward[key] = [c for c in self.free_now if c.job.tier > tier and allowed(ctx, p, c.job)]
        same = ([c for c in self.free_now if c.job.tier == p.job.tier and allowed(ctx, p, c.job)]
                if may_reclaim(ctx, p) else [])
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

    def release(self, c: Candidate) -> None: ...

    def retake(self, c: Candidate) -> None: ...

    def fits(self, job: Job, flavor: str, d: tuple[float, ...]) -> bool: ...

    def placeable(self, job: Job, flavor: str) -> bool: ...

    def frees_quota_in(self, c: Candidate, queue: int) -> bool: ...

    def block_nodes(self, block: str) -> Sequence[str]: ...


def search(ws: Workspace, p: Preemptor, flavor: str, pool: CandidatePool, taken: set[str],
           leaving: list[Candidate]) -> list[Candidate]:
    """What makes `p` fit on `flavor`, released in `ws`: jobs already `leaving` (terminating, at
    no cost, so a need they cover never gets a new victim) and new victims; [] (nothing
    released) if no eligible set does. `taken`: ids of jobs already claimed in this pass."""
    job, d = p.job, p.demand
    eligible = leaving + pool.eligible(ws.ctx, p, taken)
    if not eligible:
        return []
    victims: list[Candidate] = []
    chosen: set[str] = set()
    # Price placement only when placement is what is missing; a job short of quota alone
    # takes victims (jobs already leaving first) under the queue whose limit it breaks.
    slots = _cheapest_slots(ws, job, flavor, eligible, pool.by_cost) if not ws.placeable(job, flavor) else []
    for c in slots:
        if not c.leaving and c.job.tier <= job.tier and not still_borrowing(ws.quota, p, c.job):
            continue  # reclaim takes back only what is borrowed
        ws.release(c)
        victims.append(c)
        chosen.add(c.job.id)
    if not ws.fits(job, flavor, d) and not _fill(ws, p, flavor, eligible, victims, chosen):
        for c in victims:
            ws.retake(c)
        return []
    # Give back the costliest first; among jobs already leaving, the one that exits last.
    costliest_first = sorted(victims, key=lambda c: (-c.cost, -c.rank))
    needed = {c.job.id for c in drop_unneeded(ws, job, flavor, d, costliest_first)}
    return [c for c in victims if c.job.id in needed]


def _cheapest_slots(ws: Workspace, job: Job, flavor: str, eligible: list[Candidate],
                    by_cost: bool) -> list[Candidate]:
    """Price the gang's replicas node by node and take the cheapest domain.

    A node offers replica slots: those its free GPUs hold now (free), then one more each time
    the next victim on it, in victim order, frees enough (the cost of that run). A domain — one
    node for `pack` or a single replica, a block for `block`, the whole flavor for `any` — is
    priced by its cheapest `replicas` slots; the cheapest domain's victims are returned.
    When victims come in cost order (`by_cost`) the scan stops as soon as no later victim can
    make a cheaper choice: every slot it completes costs at least its own cost.
    """
    g, want = job.gpus, job.replicas
    if g <= 0:
        return []
    index = ws.index
    per_node = job.placement == "pack" or want == 1
    # node → (cost, new victims, candidates taken) at 1, 2, … slots
    offers: dict[str, list[tuple[float, int, int]]] = {}
    runs: dict[str, list] = {}  # node → [free GPUs, cost, new victims, candidates] so far
    on_node: dict[str, list[Candidate]] = {}
    bound = math.inf
    for i, c in enumerate(eligible):
        if by_cost and c.cost >= bound:
            break
        if c.flavor != flavor:
            continue
        for node, gpus in c.gpus_by_node().items():
            o = offers.get(node)
            if o is None:
                free = index.free(node)[0]
                o = offers[node] = [(0.0, 0, 0)] * min(want, free // g)
                runs[node] = [free, 0.0, 0, 0]
            if len(o) >= want:
                continue
            run = runs[node]
            run[0] += gpus
            run[1] += c.cost
            run[2] += 0 if c.leaving else 1
            run[3] += 1
            on_node.setdefault(node, []).append(c)
            while len(o) < want and run[0] // g > len(o):
                o.append((run[1], run[2], run[3]))
            if per_node and len(o) >= want:
                bound = min(bound, run[1])
        if by_cost and not per_node and i % 256 == 255:
            best = _best_domain(ws, job, flavor, offers)
            if best is not None:
                bound = best[3]
    best = _best_domain(ws, job, flavor, offers)
    if best is None:
        return []
    chosen: dict[str, Candidate] = {}
    for n, count in best[2].items():
        for c in on_node.get(n, ())[:count]:
            chosen.setdefault(c.job.id, c)
    return list(chosen.values())


def _best_domain(ws: Workspace, job: Job, flavor: str, offers: dict[str, list[tuple[float, int, int]]]
                 ) -> tuple[float, int, dict[str, int], float] | None:
    """The cheapest domain's (cost, new victims, candidates taken per node, bound), fewer new
    victims breaking ties (jobs already leaving are free and no victim); the bound is what a
    later victim must cost less than to improve on it."""
    g, want = job.gpus, job.replicas
    index = ws.index
    if job.placement == "pack" or want == 1:
        domains: Iterable[Sequence[str]] = ([n] for n in offers)
    elif job.placement == "block":
        domains = (ws.block_nodes(b) for b in dict.fromkeys(index.block_of(n) for n in offers))
    else:
        domains = [list(offers)]
    best: tuple[float, int, dict[str, int], float] | None = None
    for nodes in domains:
        table = {n: o for n in nodes if (o := offers.get(n))}
        if job.placement == "block":
            # Block nodes without victims still offer what their free GPUs hold, at no cost.
            for n in nodes:
                if n not in table and (k := index.free(n)[0] // g):
                    table[n] = [(0.0, 0, 0)] * min(k, want)
        elif job.placement == "any" and want > 1:
            idle = index.slots(flavor, g, want + sum(len(o) for o in table.values()))
            idle -= sum(index.free(n)[0] // g for n in table)
            if idle > 0:
                table[""] = [(0.0, 0, 0)] * min(idle, want)
        if sum(len(o) for o in table.values()) < want:
            continue
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
        if best is None or (total, victims) < best[:2]:
            best = (total, victims, prefix, bound)
    return best


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
        in_subtree = broken is not None and ws.frees_quota_in(c, broken[0])
        if not in_subtree and not (on_flavor and (gpu_short > 0 or broken is None)):
            continue
        if not c.leaving and v.tier <= job.tier and not still_borrowing(ws.quota, p, v):
            continue
        ws.release(c)
        victims.append(c)
        chosen.add(v.id)
        if on_flavor:
            gpu_short -= sum(c.gpus_by_node().values())
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
                  released: Sequence[Candidate]) -> list[Candidate]:
    """Take back, in the given order, each released job the fit does not need; the rest."""
    needed = []
    for c in released:
        ws.retake(c)
        if ws.fits(job, flavor, d):
            continue
        ws.release(c)
        needed.append(c)
    return needed
