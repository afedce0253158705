"""Who may preempt whom (DESIGN §4.3), one small rule each, and what a victim would cost (§4.4).

A rule either lets a victim V be taken or returns a `Block` saying until when V is protected
(`until=inf` when time will not help). *Victim rules* look at V alone (preemptible, lease,
thrash budget, efficiency floor), so a pass evaluates them once per running job; *pair rules*
also look at the preemptor P (direction, scope). The preemption search takes only victims no
rule blocks; the reservation forecast also counts victims whose blocks all lift at a known
time, which is how a job learns it is `WaitingForLease`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from warden.engine.model import Job

if TYPE_CHECKING:
    from warden.engine.policy import Policy
    from warden.engine.quota import QuotaTree

INF = math.inf


@dataclass(frozen=True, slots=True)
class Block:
    rule: str
    until: float = INF


@dataclass(frozen=True, slots=True)
class Preemptor:
    """What the rules need to know about P, computed once per preemption attempt."""

    job: Job
    in_quota: bool
    """In-quota, counting what it could reclaim from branches above their nominal."""
    demand: tuple[float, ...]
    reclaims: bool = False
    """In-quota only by that count: the victims must leave it in-quota (`preemption.search`)."""


@dataclass(slots=True)
class RuleContext:
    policy: Policy
    quota: QuotaTree
    now: float


def lease_of(policy: Policy, job: Job) -> float:
    """The job's minimum runtime: its own request, else its tier's, never above max_lease."""
    lease = policy.tier(job.tier).lease if job.lease is None else job.lease
    return min(lease, policy.max_lease)


def grace_of(policy: Policy, job: Job) -> float:
    grace = policy.tier(job.tier).grace if job.grace is None else job.grace
    return max(grace, policy.min_grace)


def startup_of(policy: Policy, job: Job) -> float:
    a = job.attempt
    if a is not None and a.startup_s is not None:
        return a.startup_s
    return policy.preemption.restart_overhead


def efficiency(policy: Policy, job: Job, now: float) -> float:
    """η of the current attempt: (T_run − (T_startup + T_checkpoint)) / T_run."""
    a = job.attempt
    if a is None:
        return 1.0
    t_run = now - a.started_at
    if t_run <= 0:
        return 0.0
    return (t_run - (startup_of(policy, job) + a.checkpoint_s)) / t_run


def at_risk_since(policy: Policy, job: Job) -> float | None:
    """Start of the progress a preemption would throw away: the later of the end of startup
    and the last checkpoint; None when nothing would be lost (a SIGTERM save fits the grace)."""
    a = job.attempt
    if a is None:
        return None
    if a.sigterm_save_s is not None and a.sigterm_save_s <= grace_of(policy, job):
        return None
    since = a.started_at + startup_of(policy, job)
    return since if a.last_checkpoint_at is None else max(since, a.last_checkpoint_at)


def lost_work(policy: Policy, job: Job, now: float) -> float:
    """GPU-seconds a preemption now would throw away (zero if a SIGTERM save fits the grace)."""
    since = at_risk_since(policy, job)
    return 0.0 if since is None else job.total_gpus * max(0.0, now - since)


def victim_cost(policy: Policy, job: Job, now: float) -> tuple[float, float]:
    """(cost, lost work): lost work + restart overhead × GPUs, in GPU-seconds."""
    return cost_at(job, at_risk_since(policy, job), startup_of(policy, job) * job.total_gpus, now)


def cost_at(job: Job, since: float | None, restart: float, now: float) -> tuple[float, float]:
    """`victim_cost` from its parts that do not change with time (a pass keeps them per job)."""
    lost = 0.0 if since is None else job.total_gpus * max(0.0, now - since)
    return lost + restart, lost


# -- the rules --------------------------------------------------------------------------------

def direction(ctx: RuleContext, p: Preemptor, v: Job) -> Block | None:
    """Downward (strictly lower tier), or reclaim of capacity borrowed from P's side."""
    if v.tier > p.job.tier:
        return None
    if v.tier >= p.job.tier and reclaimable(ctx, p, v):
        return None
    return Block("direction")


def reclaimable(ctx: RuleContext, p: Preemptor, v: Job) -> bool:
    """V's side of the common ancestor is above nominal while P's side would stay within it."""
    q = ctx.quota
    if not may_reclaim(ctx, p) or v.queue == p.job.queue:
        return False
    if not ctx.policy.tier(v.tier).charged:
        return False
    _, _, v_side = q.lowest_common_ancestor(p.job.queue, v.queue)
    return v_side >= 0 and q.over_nominal(v_side)


def may_reclaim(ctx: RuleContext, p: Preemptor) -> bool:
    """Can P reclaim at all? Only an in-quota job under a governed tree can."""
    return p.in_quota and ctx.quota.governed()


def scope(ctx: RuleContext, p: Preemptor, v: Job) -> Block | None:
    """`scope: quota` tiers preempt outside their own queue only while in-quota."""
    if ctx.policy.tier(p.job.tier).scope == "cluster" or p.in_quota or v.queue == p.job.queue:
        return None
    return Block("scope")


def preemptible(ctx: RuleContext, v: Job) -> Block | None:
    return None if ctx.policy.tier(v.tier).preemptible else Block("preemptible")


def lease(ctx: RuleContext, v: Job) -> Block | None:
    """Never preempt inside the current attempt's lease."""
    a = v.attempt
    if a is None:
        return Block("lease")
    until = a.started_at + lease_of(ctx.policy, v)
    return Block("lease", until) if ctx.now < until else None


def thrash_budget(ctx: RuleContext, v: Job) -> Block | None:
    """At most `count` preemptions of one job per `per` window."""
    mp = ctx.policy.thrash.max_preemptions
    recent = sorted(t for t in v.preempted_at if t > ctx.now - mp.per)
    if len(recent) < mp.count:
        return None
    return Block("thrash_budget", recent[len(recent) - mp.count] + mp.per)


def efficiency_floor(ctx: RuleContext, v: Job) -> Block | None:
    """Stretch the lease so a preemption never pushes the attempt's η below min_efficiency."""
    a = v.attempt
    if a is None:
        return Block("efficiency")
    floor = ctx.policy.thrash.min_efficiency
    overhead = startup_of(ctx.policy, v) + a.checkpoint_s
    until = a.started_at + overhead / (1.0 - floor)
    # Compare with a little slack: 1 − 0.9 is not exactly 0.1 in binary floating point.
    return Block("efficiency", until) if ctx.now < until - 1e-6 else None


VictimRule = Callable[[RuleContext, Job], "Block | None"]
PairRule = Callable[[RuleContext, Preemptor, Job], "Block | None"]
VICTIM_RULES: Sequence[VictimRule] = (preemptible, lease, thrash_budget, efficiency_floor)
PAIR_RULES: Sequence[PairRule] = (direction, scope)


def protection(ctx: RuleContext, v: Job) -> float:
    """When the victim rules let V go: 0.0 now, a time, or inf (never)."""
    until = 0.0
    for rule in VICTIM_RULES:
        b = rule(ctx, v)
        if b is not None:
            if b.until == INF:
                return INF
            until = max(until, b.until)
    return until


def allowed(ctx: RuleContext, p: Preemptor, v: Job) -> bool:
    """Do the pair rules let P take V (leaving time aside)?"""
    for rule in PAIR_RULES:
        if rule(ctx, p, v) is not None:
            return False
    return True


def allowed_for(ctx: RuleContext, p: Preemptor) -> Callable[[Job], bool]:
    """`allowed(ctx, p, v)` as a function of V alone, answered once per (tier, queue) of V.

    The pair rules read nothing of V but its tier and queue (and the quota state, which the
    caller keeps unchanged while it uses the function), so victims of one tier in one queue
    share the answer: a pass over thousands of victims asks the rules a few dozen times.
    Keep it in step with `direction` and `scope`.
    """
    seen: dict[tuple[int, str], bool] = {}

    def ok(v: Job) -> bool:
        key = (v.tier, v.queue)
        answer = seen.get(key)
        if answer is None:
            answer = seen[key] = allowed(ctx, p, v)
        return answer

    return ok


def downward_key(ctx: RuleContext, p: Preemptor) -> tuple:
    """What the pair rules read of P when V is of a strictly lower tier: every victim of a lower
    tier that they allow for one P they allow for any P with the same key (a search may reuse
    the list). Keep it in step with `direction` and `scope`."""
    free = p.in_quota or ctx.policy.tier(p.job.tier).scope == "cluster"
    return (p.job.tier, free, None if free else p.job.queue)


def blocks(ctx: RuleContext, p: Preemptor, v: Job) -> float:
    """0.0 when P may take V now; the time V's protection lifts; inf when it never will for P."""
    return protection(ctx, v) if allowed(ctx, p, v) else INF
