"""The pass as a walk over every waiting job, one by one, in rank order: what the engine's
class-by-class walk (`phases.explain.Explain.walk`) must give.

Built from the same phases (`Cycle.decide`, the outcome memo's rule, the reasons), but it
visits every job, sorts them all, and moves claimants with a list rule of its own, so a class
skipped that should not have been, a wrong epoch, or a claimant in the wrong place shows up
as a different plan.
"""

from __future__ import annotations

from warden.engine.allocation import Allocation
from warden.engine.demand import Demand, cluster_gpus
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.phases.explain import _UNKNOWN, _reuse, usable_of
from warden.engine.phases.order import Order, borrowing_test, mode_of
from warden.engine.plan import Explanation, Plan
from warden.engine.reasons import AwaitingApproval, Position, Reason, ThrashBackoff
from warden.engine.scheduler import Cycle, _classify
from warden.engine.waiting import WaitingIndex


def claimants_first(ranking: list[Job], claims: dict[str, Job], order: Order) -> list[Job]:
    """Every claimant (not awaiting approval) ahead of every other job of tiers 2–4 as ranked
    (all jobs under `fifo`, which ranks no tier), behind every job of tier 1 (a tier-1
    claimant: ahead of the other tier-1 jobs); claimants among themselves in rank order."""
    first = {j.id for j in ranking if j.id in claims and j.state is not JobState.AWAITING_APPROVAL}

    def group(j: Job) -> int:
        return min(order.key_of(j)[0], 2)

    out: list[Job] = []
    for g in sorted({group(j) for j in ranking}):
        of_group = [j for j in ranking if group(j) == g]
        out += [j for j in of_group if j.id in first] + [j for j in of_group if j.id not in first]
    return out


def one_by_one(snapshot: Snapshot, now: float) -> Plan:
    """The plan of a pass that visits every waiting job."""
    policy = snapshot.policy
    alloc = Allocation(snapshot.nodes, policy)
    waiting, terminating, holding = _classify(snapshot.jobs)
    claims = {i: j for i, j in waiting.items() if j.claim}
    alloc.sync(holding)
    index = WaitingIndex(mode_of(policy))
    index.sync(waiting.values(), now)
    demand = Demand()
    demand.sync(policy, snapshot.jobs)
    owed = demand.owed(policy, alloc.quota, cluster_gpus(snapshot.nodes)) if alloc.quota.gpu >= 0 else None
    cycle = Cycle(snapshot, now, alloc, index, waiting.values(), terminating, claims, owed)
    state = cycle.state
    state.count_leaving()
    order = Order(
        policy,
        snapshot.ledger.usage,
        now,
        borrowing_test(policy, state.quota, alloc.index.flavors(), state.charged_tiers),
    )
    ranking = claimants_first(sorted(waiting.values(), key=order.key_of), claims, order)
    strict = policy.scheduling.head_of_line_blocking
    head: Job | None = None
    explanations: dict[str, Explanation] = {}
    for position, job in enumerate(ranking, 1):
        reason: Reason | None
        if job.state is JobState.AWAITING_APPROVAL:
            reason = AwaitingApproval(job.tier)
        elif job.not_before is not None and job.not_before > now:
            reason = ThrashBackoff(job.not_before)
        elif head is not None:
            reason = Position(position, head.id)
        else:
            usable = usable_of(job, state.reserved, state) if state.reserved else None
            okey = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, usable)
            fronts = state.memo.outcomes.get(okey)
            reason = _UNKNOWN
            if fronts is not None:
                reason = _reuse(fronts, job.cpu, job.memory, state.memo.hold_version, state.cpu_memory_governed)
            if reason is _UNKNOWN:
                reason = cycle.decide(job)
                cycle.explain._remember(job, okey, fronts, reason)
            if reason is not None and strict:
                head = job
        if reason is not None:
            explanations[job.id] = Explanation(job.id, reason, order.sort_key(job, order.key_of(job)), position)
    kept = frozenset(state.claimants)
    return Plan(
        now=now,
        admissions=tuple(state.admissions),
        preemptions=tuple(state.preemptions),
        reservations=tuple(state.reservations),
        explanations=explanations,
        claims=kept,
        released_claims=tuple(sorted(i for i in claims if i in explanations and i not in kept)),
    )
