"""Who may preempt whom (DESIGN §4.3), one named rule each, and what a victim would cost (§4.4).

A pending job P may evict a running job V only if every rule of `RULES` lets it. A rule's
check either lets V be taken (None) or returns a `Block` saying until when V is protected
(`until=inf` when time will not help). Each rule is an object that declares what it reads, and
everything the pass needs to ask the rules cheaply is derived from those declarations:

- a *victim rule* (`VictimRule`: preemptible, lease, thrash budget, efficiency floor, time
  limit) reads V alone and says whether its protection ever lifts (`lifts`) or starts later
  (`starts_at`). A pass asks the victim rules once per running job (`protection` and
  `closes_at`: from when until when V may go) and keeps the answer between passes;
- a *pair rule* (`PairRule`: direction, scope) reads P and V, and declares which fields of V it
  reads (`reads`): victims alike in those share an answer, so a search asks the pair rules once
  per (tier, queue) rather than once per victim (`allowed_for`, `pair_key`, and the release
  index's kinds). It declares which fields of P it reads (`of_preemptor`): preemptors alike in
  those are allowed the same victims (`preemptor_key`, which keys the pass's memo of "has P
  any victim at all?"). And it declares what it reads of P when V is of a strictly lower tier
  (`downward`): preemptors with the same `downward_key` share one list of lower-tier victims
  for the whole pass;
- *reclaim* (`ReclaimRule`: `RECLAIM`), the way P takes back a borrower's capacity whatever
  the tiers, which `direction` and `scope` let P use, is declared as the pair rules are (the
  fields of V and of P it reads, in the same keys), with its three steps: could P reclaim at
  all (`may`), may it take V's kind back (`kind`), may it take this very V now (`per_victim`);
- every rule gives a necessary condition on the two tiers alone (`tiers`), from which the
  pass's cheap test "could this P take any running job at all?" follows (`could_preempt`).

The preemption search takes only victims no rule blocks; the reservation forecast also counts
victims whose blocks all lift at a known time, which is how a job learns it is
`WaitingForLease`. The last rule of §4.3, *gang*, is not a filter: a victim is one `Job`,
evicted whole (`Preemption` names the job, and every replica is signalled at once).

To add a rule: write its check next to the others, wrap it in a `VictimRule` or `PairRule` with
its declarations, and add it to `VICTIM_RULES` or `PAIR_RULES`; the keys the pass's fast paths
use (`pair_key`, `preemptor_key`) are built from the declarations. `tests/engine/test_rules.py`
checks every declaration against its check on random jobs (a pair rule that reads a field of V
or P it does not declare would make victims or preemptors share answers they must not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from warden.engine.accounting import (
    assumed_checkpoint,
    assumed_startup,
    effective_grace,
    effective_lease,
    eta,
    predicted_lost_work,
    save_fits_grace,
    unsaved_since,
    within_attempt,
)
from warden.engine.model import Job

if TYPE_CHECKING:
    from warden.engine.policy import Policy
    from warden.engine.quota import QuotaTree

INF = math.inf


@dataclass(frozen=True, slots=True)
class Block:
    rule: str
    """The name of the rule that blocks (`VictimRule.name`, `PairRule.name`)."""
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


@dataclass(frozen=True, slots=True)
class RuleContext:
    policy: Policy
    quota: QuotaTree
    """The pass's quota usage: the pair rules read it (reclaim), so their answers hold only
    while it is unchanged."""
    now: float
    owed: Sequence[float] | None = None
    """GPUs owed now to each queue of the quota tree (by its index; an inner queue: the sum over
    its leaves), `accounting.owed_now` over the charged demand of the pass; None where no owed
    share is known (no governed GPU quota, or a forecast): fair-share reclaim is then off."""


def lease_of(policy: Policy, job: Job) -> float:
    """The job's minimum runtime: its own request, else its tier's, never above max_lease."""
    return effective_lease(policy, job.tier, job.lease)


def grace_of(policy: Policy, job: Job) -> float:
    """The job's grace: its own request, else its tier's, never below min_grace."""
    return effective_grace(policy, job.tier, job.grace)


def startup_of(policy: Policy, job: Job) -> float:
    """The attempt's measured startup, else the policy's restart overhead."""
    return assumed_startup(policy, None if job.attempt is None else job.attempt.startup_s)


def checkpoint_of(policy: Policy, job: Job) -> float:
    """The one save the efficiency floor counts for the attempt (`accounting.assumed_checkpoint`):
    its last measured save, else the save on SIGTERM it reported, else the policy's checkpoint
    overhead; never a sum of reports, so a job cannot move its floor by reporting."""
    a = job.attempt
    if a is None:
        return 0.0
    return assumed_checkpoint(policy, a.checkpoint_s, a.sigterm_save_s)


def efficiency(policy: Policy, job: Job, now: float) -> float:
    """η of the current attempt as the efficiency floor counts it: (T_run − (T_startup +
    T_checkpoint)) / T_run, with `startup_of` and `checkpoint_of`, each at most the attempt's
    age (`accounting.within_attempt`)."""
    a = job.attempt
    if a is None:
        return 1.0
    startup = within_attempt(startup_of(policy, job), a.started_at, now)
    checkpoint = within_attempt(checkpoint_of(policy, job), a.started_at, now)
    return eta(now - a.started_at, startup, checkpoint)


def at_risk_since(policy: Policy, job: Job) -> float | None:
    """Start of the progress a preemption would throw away: the later of the end of startup
    and the last checkpoint; None when nothing would be lost (a SIGTERM save fits the grace)."""
    a = job.attempt
    if a is None or save_fits_grace(a.sigterm_save_s, grace_of(policy, job)):
        return None
    return unsaved_since(a.started_at, startup_of(policy, job), a.last_checkpoint_at)


def lost_work(policy: Policy, job: Job, now: float) -> float:
    """GPU-seconds a preemption now would throw away (`accounting.predicted_lost_work`)."""
    a = job.attempt
    if a is None:
        return 0.0
    return predicted_lost_work(
        job.total_gpus,
        now,
        a.started_at,
        startup_of(policy, job),
        a.last_checkpoint_at,
        a.sigterm_save_s,
        grace_of(policy, job),
    )


def victim_cost(policy: Policy, job: Job, now: float) -> tuple[float, float]:
    """(cost, lost work): lost work + restart overhead × GPUs, in GPU-seconds."""
    return cost_at(job, at_risk_since(policy, job), startup_of(policy, job) * job.total_gpus, now)


def cost_at(job: Job, since: float | None, restart: float, now: float) -> tuple[float, float]:
    """`victim_cost` from its parts that do not change with time (a pass keeps them per job);
    its lost work is `accounting.predicted_lost_work`, from `at_risk_since`.

    The pass prices thousands of victims with this arithmetic written out inline
    (`warden.engine.phases.victims`); `tests/engine/test_victims.py` checks the two agree."""
    lost = 0.0 if since is None else job.total_gpus * max(0.0, now - since)
    return lost + restart, lost


# -- the rules --------------------------------------------------------------------------------

VictimCheck = Callable[[RuleContext, Job], "Block | None"]
PairCheck = Callable[[RuleContext, Preemptor, Job], "Block | None"]
TierTest = Callable[[RuleContext, int, int], bool]
"""(context, P's tier, V's tier) → could the rule let some job of P's tier take some job of V's
tier? A necessary condition: False only where it never could, so it reads the policy and the
shape of the quota tree alone, never the usage or `now` (`takeable_tiers` asks it once per
policy)."""


VictimCheckTime = Callable[[RuleContext, Job], float]


def _any_tiers(ctx: RuleContext, p_tier: int, v_tier: int) -> bool:
    """A rule that does not look at tiers alone never rules a pair of tiers out."""
    return True


def _never(policy: Policy) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class VictimRule:
    """A rule that reads V alone: asked once per running job, its answer kept per job.

    Its answer changes at most once: a protection that lifts (`Block.until`: V may go from
    then on), or one that starts (`starts_at`: V may go until then, never after). A pass keeps
    the answer between passes as the window in which V may go (`protection`, `closes_at`), so
    the answer computed at one `now` holds at every later one.
    """

    name: str
    check: VictimCheck
    lifts: bool
    """Can its protection lift with time (a finite `Block.until`)? False: a block from it is
    for good (`until` inf), so a job it blocks is nobody's victim, now or in any forecast."""
    tiers: TierTest = _any_tiers
    thrash_guard: bool = False
    """It has the thrash guard's reach: it protects V against preemptors of tiers 2–4 and
    against reclaims, never against a tier-1 preemptor taking V by priority (`guarded`)."""
    starts_at: VictimCheckTime | None = None
    """For a protection that starts later: when it starts for V (inf: never), asked at any
    `now`. `check` blocks for good (inf) from then on and lets V go before."""
    reads_estimate: Callable[[Policy], bool] = _never
    """Does the check read V's time limit (`Job.time_limit`, its runtime estimate) under this policy?
    Jobs of one waiting class differ in it, so what a reservation's holder may take back of
    them (`phases.state.PassState.taken_back`) is then asked per job (`estimate_matters`)."""


@dataclass(frozen=True, slots=True)
class PairRule:
    """A rule that reads P and V (and the quota usage)."""

    name: str
    check: PairCheck
    reads: tuple[str, ...]
    """The fields of V the check reads: two victims equal in them get the same answer."""
    of_preemptor: tuple[str, ...]
    """The fields of P the check reads (attribute paths of `Preemptor`, as `operator.attrgetter`
    takes them), beyond the quota usage: two preemptors equal in them get the same answer."""
    downward: Callable[[RuleContext, Preemptor], tuple[object, ...]]
    """What the check reads of P when V is of a strictly lower tier (beyond P's tier); it must
    not read the quota usage then, so one list of lower-tier victims serves the whole pass."""
    tiers: TierTest = _any_tiers


@dataclass(frozen=True, slots=True)
class ReclaimRule:
    """Reclaim, the way P may take V back as a borrower's capacity whatever their tiers
    (DESIGN §4.3: nominal and fair-share reclaim), declared as the pair rules are. The
    `direction` and `scope` rules let P take V by it; the pass asks it in three steps, each
    declared here: whether P could reclaim anything at all (`may`), whether it may take V's
    kind back judged on the queues alone (`kind`, a necessary condition that reads the fields
    of V in `reads` and the quota usage), and whether it may take this very V now (`per_victim`:
    its size against what its side borrows, the swap, the starvation shield), which a search
    asks again before each victim it takes."""

    name: str
    may: Callable[[RuleContext, Preemptor], bool]
    kind: Callable[[RuleContext, Preemptor, Job], str | None]
    per_victim: Callable[[RuleContext, Preemptor, Job, tuple[float, ...]], str | None]
    reads: tuple[str, ...]
    """The fields of V `kind` reads: victims equal in them get the same answer."""
    of_preemptor: tuple[str, ...]
    """The fields of P `may` and `kind` read, beyond the quota usage."""
    tiers: TierTest


def direction(ctx: RuleContext, p: Preemptor, v: Job) -> Block | None:
    """Downward (strictly lower tier), or a reclaim of borrowed capacity (`reclaim_kind`)."""
    if v.tier > p.job.tier or RECLAIM.kind(ctx, p, v) is not None:
        return None
    return Block("direction")


def reclaim_kind(ctx: RuleContext, p: Preemptor, v: Job) -> str | None:
    """How P may take V back as a borrower's capacity, judged on the queues alone: "reclaim"
    (nominal reclaim), "fair_share" (fair-share reclaim), or None.

    A necessary condition, read off V's tier and queue and the pass's usage: what depends on V
    itself (its size: never below its queue's nominal, never past the swap; whether it starves)
    the search asks before it takes V (`reclaim_of`), when the victims taken before it have
    lowered what its side borrows.
    """
    return _reclaim_at(ctx, p, v)[0]


def _reclaim_at(ctx: RuleContext, p: Preemptor, v: Job) -> tuple[str | None, int, int]:
    """`reclaim_kind`, with the children of the lowest common ancestor on P's and V's side
    (what `reclaim_of` goes on to read; −1 where there are none)."""
    q = ctx.quota
    if v.queue == p.job.queue or not q.governed() or not ctx.policy.tier(v.tier).charged:
        return None, -1, -1
    if v.queue not in q.paths or p.job.queue not in q.paths:
        return None, -1, -1
    reclaim = ctx.policy.preemption.reclaim
    _, p_side, v_side = q.lowest_common_ancestor(p.job.queue, v.queue)
    if v_side < 0 or p_side < 0 or not q.over_nominal(v_side):
        return None, p_side, v_side
    if may_reclaim(ctx, p) and _nominal_tiers(reclaim.nominal, p.job.tier, v.tier):
        return "reclaim", p_side, v_side
    if v.tier >= p.job.tier and _fair_share_before(ctx, p, p_side, v_side, q.index[v.queue]):
        return "fair_share", p_side, v_side
    return None, p_side, v_side


def _nominal_tiers(mode: str, p_tier: int, v_tier: int) -> bool:
    """May nominal reclaim take a victim of `v_tier` for a preemptor of `p_tier`?"""
    return mode == "any" or (mode == "not_higher" and v_tier >= p_tier)


def share(ctx: RuleContext, queue: int, delta: float = 0.0) -> float:
    """s(X): GPUs the queue holds (less what is already leaving), plus `delta`, ÷ GPUs owed to
    it now; inf for GPUs held where none are owed (DESIGN §4.3, fair-share reclaim)."""
    q, owed = ctx.quota, ctx.owed
    g = q.gpu
    if owed is None or g < 0:
        return 0.0
    held = q.usage[queue][g] - q.leaving[queue][g] + delta
    if owed[queue] > 0:
        return held / owed[queue]
    return INF if held > 1e-9 else 0.0


def _fair_share_before(ctx: RuleContext, p: Preemptor, p_side: int, v_side: int, v_leaf: int) -> bool:
    """Fair-share reclaim, as far as V's size does not matter: V's queue borrows, and P's side
    with P would be at most its owed share and at most V's side's share as it stands (taking V
    only lowers the latter)."""
    mode = ctx.policy.preemption.reclaim.fair_share
    q = ctx.quota
    if mode == "never" or ctx.owed is None or q.gpu < 0 or not q.over_nominal(v_leaf):
        return False
    mine = share(ctx, p_side, p.demand[q.gpu] if p.demand else 0.0)
    theirs = share(ctx, v_side)
    lower = mine * ctx.policy.preemption.reclaim.fair_share_margin <= theirs + 1e-9
    if mode == "final":
        return mine <= 1.0 + 1e-9 and lower
    if mode == "above_share":
        return mine <= 1.0 + 1e-9 and lower and theirs > 1.0 + 1e-9
    return lower


def reclaim_of(ctx: RuleContext, p: Preemptor, v: Job, d: tuple[float, ...]) -> str | None:
    """`reclaim_kind` for this very victim, whose quota demand is `d`, in the state the search
    is in: a nominal reclaim never leaves V's queues below their nominal; a fair-share reclaim
    only swaps while P's side with P, times `fair_share_margin`, stays at or below V's side
    without V (Kueue's LessThanOrEqualToFinalShare; with `above_share` V's side also keeps its
    owed share; with `final_then_initial`, else below V's side before, Kueue's
    LessThanInitialShare); and a starving V is no reclaim's victim (`starving_shield`)."""
    kind, p_side, v_side = _reclaim_at(ctx, p, v)
    if kind is None or shielded(ctx, v):
        return None
    q = ctx.quota
    if kind == "reclaim":
        if q.stays_at_nominal(v.queue, v_side, d):
            return kind
        if not _fair_share_before(ctx, p, p_side, v_side, q.index[v.queue]) or v.tier < p.job.tier:
            return None
    g = q.gpu
    reclaim = ctx.policy.preemption.reclaim
    mine = share(ctx, p_side, p.demand[g] if p.demand else 0.0) * reclaim.fair_share_margin
    after = share(ctx, v_side, -(d[g] if d else 0.0))
    if reclaim.fair_share == "above_share":
        return "fair_share" if mine <= after + 1e-9 and after >= 1.0 - 1e-9 else None
    if mine <= after + 1e-9 or (reclaim.fair_share == "final_then_initial" and mine < share(ctx, v_side) - 1e-9):
        return "fair_share"
    return None


def starving(policy: Policy, v: Job) -> bool:
    """Has the running job waited, over all its attempts, as long as it takes to starve?"""
    return v.waited >= starving_after(policy, v.queue)


def starving_after(policy: Policy, queue: str) -> float:
    """How long a job of `queue` waits, over all its attempts, before it is starving:
    `escalate_at` × the queue's `max_wait` (DESIGN §4.1)."""
    by_queue, default = _starving_after(policy)
    return by_queue.get(queue, default)


_STARVING_AFTER: dict[int, tuple[Policy, Mapping[str, float], float]] = {}


def _starving_after(policy: Policy) -> tuple[Mapping[str, float], float]:
    """Per queue, the wait after which a job starves, and the default: read off the policy
    once (a search asks it of every reclaim victim it weighs)."""
    seen = _STARVING_AFTER.get(id(policy))
    if seen is None or seen[0] is not policy:
        if len(_STARVING_AFTER) >= 8:
            _STARVING_AFTER.clear()
        aging = policy.fair_share.aging
        by_queue = {q: aging.escalate_at * w for q, w in policy.max_waits().items()}
        seen = _STARVING_AFTER[id(policy)] = (policy, by_queue, aging.escalate_at * aging.max_wait["default"])
    return seen[1], seen[2]


def shielded(ctx: RuleContext, v: Job) -> bool:
    """The starvation shield: a starving running job is no reclaim's victim, for the first
    `max_lease` of its attempt (`max_lease`), for all of it (`always`), or never (`off`)."""
    mode = ctx.policy.preemption.reclaim.starvation_shield
    if mode == "off" or not starving(ctx.policy, v):
        return False
    if mode == "always" or v.attempt is None:
        return True
    return ctx.now < v.attempt.started_at + ctx.policy.max_lease


def may_reclaim(ctx: RuleContext, p: Preemptor) -> bool:
    """Can P make a nominal reclaim at all? Only an in-quota job under a governed tree, where
    the policy makes nominal reclaims."""
    return p.in_quota and ctx.quota.governed() and ctx.policy.preemption.reclaim.nominal != "never"


def may_take_back(ctx: RuleContext, p: Preemptor) -> bool:
    """Could P reclaim anything, of any kind: a nominal reclaim, or a fair-share one (where an
    owed share is known)?"""
    if not ctx.quota.governed():
        return False
    return may_reclaim(ctx, p) or (ctx.owed is not None and ctx.policy.preemption.reclaim.fair_share != "never")


def kind_of(p: Job, v: Job) -> str:
    """How `direction` let P take V: "downward" or "reclaim" (a `Preemption`'s kind)."""
    return "downward" if v.tier > p.tier else "reclaim"


def _direction_downward(ctx: RuleContext, p: Preemptor) -> tuple[object, ...]:
    return ()  # a strictly lower tier is always allowed


def _direction_tiers(ctx: RuleContext, p_tier: int, v_tier: int) -> bool:
    """Downward, or a reclaim (`RECLAIM.tiers`)."""
    return v_tier > p_tier or RECLAIM.tiers(ctx, p_tier, v_tier)


def _reclaim_tiers(ctx: RuleContext, p_tier: int, v_tier: int) -> bool:
    """Any charged tier under a governed tree, as far as the policy lets reclaims take it."""
    if not ctx.quota.governed() or not ctx.policy.tier(v_tier).charged:
        return False
    reclaim = ctx.policy.preemption.reclaim
    return _nominal_tiers(reclaim.nominal, p_tier, v_tier) or (reclaim.fair_share != "never" and v_tier >= p_tier)


def scope(ctx: RuleContext, p: Preemptor, v: Job) -> Block | None:
    """`scope: quota` tiers preempt outside their own queue only while in-quota, `scope: queue`
    tiers never; a reclaim (of V's tier or a higher one: `reclaim_kind`) is outside scope."""
    if v.queue == p.job.queue or _scope_free(ctx, p):
        return None
    if v.tier <= p.job.tier and RECLAIM.kind(ctx, p, v) is not None:
        return None
    return Block("scope")


def _scope_free(ctx: RuleContext, p: Preemptor) -> bool:
    """May P preempt lower tiers outside its own queue?"""
    mode = ctx.policy.tier(p.job.tier).scope
    return mode == "cluster" or (mode == "quota" and p.in_quota)


def downward_allowed(ctx: RuleContext, p: Preemptor, v: Job) -> bool:
    """May P take V, of a strictly lower tier, by priority alone (no reclaim)? What the pass's
    list of lower-tier victims holds (`preemption.CandidatePool.eligible`)."""
    return v.tier > p.job.tier and (v.queue == p.job.queue or _scope_free(ctx, p))


def _scope_downward(ctx: RuleContext, p: Preemptor) -> tuple[object, ...]:
    free = _scope_free(ctx, p)
    return (free, None if free else p.job.queue)


def preemptor(ctx: RuleContext, job: Job, demand: tuple[float, ...]) -> Preemptor:
    """P as the rules see it: in-quota counting what it could reclaim (uncharged: always)."""
    return Preemptor(job, ctx.quota.in_quota(job.queue, demand, reclaim=True) if demand else True, demand)


def preemptors(ctx: RuleContext, job: Job, demand: tuple[float, ...]) -> tuple[Preemptor, ...]:
    """P once per way the scope rule lets it look for victims: each is searched on its own and
    the cheapest set wins (the first on a tie).

    A `scope: quota` job that is in-quota only once others' borrowing is reclaimed counts as
    in-quota only if it is so *after admission*: either its victims leave it in-quota (they may
    then be anywhere: `Preemptor.reclaims`), or it stays a borrower, whose victims must be in its
    own queue (DESIGN §4.3). A job of a tier that is not preemptible is never admitted as
    borrowing (DESIGN §4.2): it is searched the first way alone. Any other job is in-quota or
    not, and searched once.
    """
    p = preemptor(ctx, job, demand)
    if demand and not ctx.policy.tier(job.tier).preemptible:
        return (Preemptor(job, p.in_quota, demand, reclaims=True),)
    if (
        p.in_quota
        and demand
        and ctx.policy.tier(job.tier).scope == "quota"
        and not ctx.quota.in_quota(job.queue, demand)
    ):
        return Preemptor(job, True, demand, reclaims=True), Preemptor(job, False, demand)
    return (p,)


def preemptible(ctx: RuleContext, v: Job) -> Block | None:
    return None if ctx.policy.tier(v.tier).preemptible else Block("preemptible")


def _preemptible_tiers(ctx: RuleContext, p_tier: int, v_tier: int) -> bool:
    return ctx.policy.tier(v_tier).preemptible


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
    """Stretch the lease so a preemption never pushes the attempt's η below min_efficiency,
    counting what a preemption costs V once: its startup and one save, as the attempt reported
    them or as the policy assumes where it reported none (`startup_of`, `checkpoint_of`). The
    stretched lease never runs past `max_lease`."""
    lifts_at = floor_lifts_at(ctx.policy, v)
    return Block("efficiency", lifts_at) if ctx.now < lifts_at else None


def floor_lifts_at(policy: Policy, v: Job) -> float:
    """When the efficiency floor lets V go: its attempt's start plus (startup + one save) ÷
    (1 − min_efficiency), at most `max_lease` after the start; inf without an attempt."""
    a = v.attempt
    if a is None:
        return INF
    floor = policy.thrash.min_efficiency
    overhead = startup_of(policy, v) + checkpoint_of(policy, v)
    # With a little slack: 1 − 0.9 is not exactly 0.1 in binary floating point. The slack is in
    # the time the block names too, so a protection worked out at an earlier `now` lifts at
    # exactly the instant this rule, asked anew, stops blocking (warm passes equal fresh ones).
    return min(a.started_at + overhead / (1.0 - floor) - 1e-6, a.started_at + policy.max_lease)


def near_time_limit(ctx: RuleContext, v: Job) -> Block | None:
    """No preemption in the last `preemption.protect_before_time_limit` of V's time limit: V
    ends by its limit soon anyway, and keeps the work it would lose."""
    return Block("time_limit") if ctx.now >= time_limit_protects_from(ctx, v) else None


def time_limit_protects_from(ctx: RuleContext, v: Job) -> float:
    """When `near_time_limit` starts to protect V: its attempt's start plus its time limit less
    `protect_before_time_limit`; inf without a time limit, an attempt, or the setting."""
    window = ctx.policy.preemption.protect_before_time_limit
    a = v.attempt
    if window <= 0.0 or a is None or v.time_limit is None:
        return INF
    return a.started_at + v.time_limit - window


def _time_limit_read(policy: Policy) -> bool:
    return policy.preemption.protect_before_time_limit > 0.0


PREEMPTIBLE = VictimRule("preemptible", preemptible, lifts=False, tiers=_preemptible_tiers)
LEASE = VictimRule("lease", lease, lifts=True)
THRASH_BUDGET = VictimRule("thrash_budget", thrash_budget, lifts=True, thrash_guard=True)
EFFICIENCY_FLOOR = VictimRule("efficiency", efficiency_floor, lifts=True, thrash_guard=True)
TIME_LIMIT = VictimRule(
    "time_limit",
    near_time_limit,
    lifts=False,
    thrash_guard=True,
    starts_at=time_limit_protects_from,
    reads_estimate=_time_limit_read,
)
RECLAIM = ReclaimRule(
    "reclaim",
    may=may_take_back,
    kind=reclaim_kind,
    per_victim=reclaim_of,
    reads=("tier", "queue"),
    of_preemptor=("job.tier", "job.queue", "in_quota", "demand"),
    tiers=_reclaim_tiers,
)
DIRECTION = PairRule(
    "direction",
    direction,
    reads=("tier", "queue"),
    of_preemptor=("job.tier", "job.queue", "in_quota", "demand"),
    downward=_direction_downward,
    tiers=_direction_tiers,
)
SCOPE = PairRule(
    "scope",
    scope,
    reads=("tier", "queue"),
    of_preemptor=("job.tier", "job.queue", "in_quota", "demand"),
    downward=_scope_downward,
)

VICTIM_RULES: tuple[VictimRule, ...] = (PREEMPTIBLE, LEASE, THRASH_BUDGET, EFFICIENCY_FLOOR, TIME_LIMIT)

PRODUCTION = 1
"""Production inference: the tier the thrash guard never delays (DESIGN §4.3). A tier-1 job is
bound by its victims' leases and grace alone: production does not wait for opportunistic work
to become efficient."""


def guarded(p_tier: int, v_tier: int) -> bool:
    """Does the thrash guard protect a victim of `v_tier` against a preemptor of `p_tier`?
    Against every preemptor but a tier-1 one taking a lower tier by priority (a tier-1 job
    takes a job of its own tier only by reclaim, which the guard bounds)."""
    return p_tier != PRODUCTION or v_tier <= PRODUCTION


PAIR_RULES: tuple[PairRule, ...] = (DIRECTION, SCOPE)
RULES: tuple[VictimRule | PairRule, ...] = (*VICTIM_RULES, *PAIR_RULES)

_READERS: tuple[PairRule | ReclaimRule, ...] = (*PAIR_RULES, RECLAIM)
"""The rules that read P and V: what the keys of victims and preemptors are built from."""
PAIR_READS: tuple[str, ...] = tuple(dict.fromkeys(f for rule in _READERS for f in rule.reads))
"""Every field of V a pair rule or reclaim reads, in rule order."""
PREEMPTOR_READS: tuple[str, ...] = tuple(dict.fromkeys(f for rule in _READERS for f in rule.of_preemptor))
"""Every field of P a pair rule or reclaim reads, in rule order: preemptors alike in them are
allowed the same victims, and could reclaim alike (`RECLAIM.may`)."""

PairKey = tuple[Any, ...]
"""A victim's values of `PAIR_READS` (`pair_key`)."""


def getter(fields: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function reading `fields` (attribute paths) of an object, as one tuple.

    An `operator.attrgetter`: the pass calls these keys for every victim it filters, and the
    getter runs in C, within a few nanoseconds of attribute reads written into the caller.
    """
    if len(fields) == 1:
        one = attrgetter(fields[0])
        return lambda obj: (one(obj),)
    return attrgetter(*fields)


pair_key: Callable[[Job], PairKey] = getter(PAIR_READS)
"""V's values of `PAIR_READS`: victims with the same key get the same answer from `allowed`
(while the quota usage stays as it is). The pass groups victims by it (`allowed_for`, the
release index's kinds, `phases.reserve.Reserve._freeing`)."""

preemptor_key: Callable[[Preemptor], tuple[Any, ...]] = getter(PREEMPTOR_READS)
"""P's values of `PREEMPTOR_READS`: preemptors with the same key are allowed the same victims
(while the quota usage stays as it is)."""


def reservation_takes(ctx: RuleContext, holder_tier: int, v: Job, due: float) -> float:
    """When a reservation's holder (of `holder_tier`, due at `due`) may preempt V so that V is
    gone by `due` (DESIGN §4.2): at due − V's grace, or once the victim rules (preemptible,
    lease, thrash budget, efficiency floor) let V go if that is later; inf when V is not of a
    strictly lower tier or never goes. `scope` does not apply: the capacity is the holder's,
    lent to V only until then."""
    if v.tier <= holder_tier:
        return INF
    at = max(due - grace_of(ctx.policy, v), ctx.now)
    lifts = protection(RuleContext(ctx.policy, ctx.quota, at), v, guarded(holder_tier, v.tier))
    return at if lifts == 0.0 else lifts


# -- what the pass asks, derived from the rules -----------------------------------------------


def protection(ctx: RuleContext, v: Job, guard: bool = True) -> float:
    """When the victim rules let V go: 0.0 now, a time, or inf (never: a rule blocks for good,
    or one that starts later, `closes_at`, starts before the others have lifted). `guard`: with
    the rules of the thrash guard's reach (against tiers 2–4 and reclaims); without them, as a
    tier-1 preemptor taking V by priority sees V (`guarded`)."""
    until = 0.0
    for rule in VICTIM_RULES:
        if rule.thrash_guard and not guard:
            continue
        b = rule.check(ctx, v)
        if b is not None:
            if b.until == INF:
                return INF
            until = max(until, b.until)
    return INF if until >= closes_at(ctx, v, guard) else until


def closes_at(ctx: RuleContext, v: Job, guard: bool = True) -> float:
    """When a protection that starts later (`VictimRule.starts_at`) starts for V, the first of
    them (with `guard` as in `protection`); inf when none will. V may go from `protection` until
    then: the window a pass keeps per running job."""
    closes = INF
    for rule in VICTIM_RULES:
        if rule.starts_at is None or (rule.thrash_guard and not guard):
            continue
        closes = min(closes, rule.starts_at(ctx, v))
    return closes


def estimate_matters(policy: Policy) -> bool:
    """Does a victim rule read a job's runtime estimate under this policy (`reads_estimate`)?"""
    return any(rule.reads_estimate(policy) for rule in VICTIM_RULES)


def binding(ctx: RuleContext, v: Job, guard: bool = True) -> Block | None:
    """The victim rule whose protection of V lifts last (the one `protection` takes the time
    of, with or without the thrash guard), or None when none protects it; on a tie, the first in
    `VICTIM_RULES`. What an explanation names as the rule that holds a job
    (`reasons.WaitingForLease.rule`)."""
    found: Block | None = None
    for rule in VICTIM_RULES:
        if rule.thrash_guard and not guard:
            continue
        b = rule.check(ctx, v)
        if b is not None and (found is None or b.until > found.until):
            found = b
    return found


def allowed(ctx: RuleContext, p: Preemptor, v: Job) -> bool:
    """Do the pair rules let P take V (leaving time aside)?"""
    for rule in PAIR_RULES:  # noqa: SIM110 - a forecast asks per (tier, queue): no generator
        if rule.check(ctx, p, v) is not None:
            return False
    return True


def allowed_for(ctx: RuleContext, p: Preemptor) -> Callable[[Job], bool]:
    """`allowed(ctx, p, v)` as a function of V alone, answered once per `pair_key` of V.

    The caller keeps the quota usage unchanged while it uses the function: a pass over
    thousands of victims asks the rules a few dozen times.
    """
    seen: dict[PairKey, bool] = {}
    key_of = pair_key

    def ok(v: Job) -> bool:
        key = key_of(v)
        answer = seen.get(key)
        if answer is None:
            answer = seen[key] = allowed(ctx, p, v)
        return answer

    return ok


def downward_key(ctx: RuleContext, p: Preemptor) -> tuple[object, ...]:
    """What the pair rules read of P when V is of a strictly lower tier: every victim of a lower
    tier that they allow for one P they allow for any P with the same key (a search may reuse
    the list)."""
    key: tuple[object, ...] = (p.job.tier,)
    for rule in PAIR_RULES:
        key += rule.downward(ctx, p)
    return key


def could_preempt(ctx: RuleContext, p_tier: int, v_tiers: Iterable[int]) -> bool:
    """A necessary condition, on tiers alone: could some rule-abiding P of tier `p_tier` take a
    running job of one of `v_tiers`?"""
    return any(all(rule.tiers(ctx, p_tier, t) for rule in RULES) for t in v_tiers)


def takeable_tiers(ctx: RuleContext) -> dict[int, frozenset[int]]:
    """Per tier of the policy, the tiers whose running jobs `could_preempt` lets it take: the
    tier tests read nothing that changes while the policy stays, so the engine keeps this
    table as long as its allocation (`Allocation.takeable`) and a pass asks it in O(1)."""
    tiers = ctx.policy.tiers
    return {p: frozenset(v for v in tiers if could_preempt(ctx, p, (v,))) for p in tiers}


def blocks(ctx: RuleContext, p: Preemptor, v: Job) -> float:
    """0.0 when P may take V now; the time V's protection lifts; inf when it never will for P."""
    return protection(ctx, v, guarded(p.job.tier, v.tier)) if allowed(ctx, p, v) else INF
