"""What a blocked job can do: the facts its reason's next step needs (`warden.engine.reasons`),
worked out in the pass that refuses it, from what the pass already holds.

Each question is answered at most once a pass for each thing it depends on: when a queue's
usage frees enough (one walk of the running jobs by expected end per queue, resource and
amount), whether a gang fits with another placement (per shape, while free capacity is
unchanged). Jobs alike share one reason (`phases.walk`), so each fact is one that holds for
every job that reuses it.
"""

from __future__ import annotations

from dataclasses import replace

from warden.engine.accounting import checkpoint_basis
from warden.engine.model import Job
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.policy import Policy
from warden.engine.reasons import (
    BorrowingLimit,
    Fragmented,
    InsufficientCapacity,
    QuotaExceeded,
    Reason,
    Reserved,
    WaitingForLease,
)
from warden.engine.rules import (
    PRODUCTION,
    RECLAIM,
    binding,
    checkpoint_of,
    guarded,
    lease_of,
    preemptor,
    startup_of,
)


class NextSteps:
    __slots__ = ("_borrowing", "_done", "_fits", "_frees", "_lifting", "_queue_ids", "open_tier", "state", "victims")

    def __init__(self, state: PassState, victims: Victims) -> None:
        self.state = state
        self.victims = victims
        self.open_tier = open_tier(state.policy)
        self._queue_ids: dict[str, int] | None = None
        self._frees: dict[tuple[int, int, float], tuple[float, str] | None] = {}
        """(queue, resource, amount) → (expected end, job) of the queue's running job whose end
        frees that much of it, or None: for the pass."""
        self._fits: dict[tuple[object, ...], tuple[bool, int | None]] = {}
        """(shape, capacity version) → (fits with `any`, GPUs per replica of a split that fits)."""
        self._borrowing: dict[tuple[int, int], dict[str, float]] = {}
        """(resource, quota version) → the team queues above their nominal of it, by how much:
        what a full cluster's reason names, read once while quota usage is unchanged."""
        self._lifting: dict[tuple[int, int], list[tuple[float, int, Job]]] = {}
        """(resource, quota version) → the running jobs of those queues, not leaving, in the
        order their protections lift: read only for a job that may take back what they borrow."""
        self._done: dict[tuple[int, object], tuple[Reason, Reason]] = {}
        """(id of a reason, what else its facts depend on) → (that reason, it with the facts):
        the phases hand the same reason to many jobs (`Memo.capacity_seen`, `Memo.held_ok`,
        `Memo.quota_seen`), and a pass adds the facts to each once."""

    def refused(self, job: Job, reason: Reason) -> Reason:
        """The admission phase's refusal with the facts of its next step."""
        cls = reason.__class__
        if cls is QuotaExceeded or cls is BorrowingLimit:
            return self._quota(job, reason)  # type: ignore[arg-type]
        if cls is Fragmented:
            return self._fragmented(job, reason)  # type: ignore[arg-type]
        if cls is Reserved:
            return self._reserved(job, reason)  # type: ignore[arg-type]
        return reason

    def unreserved(self, reason: Reason, taken: bool) -> Reason:
        """A job short of capacity that holds no reservation: says why (the policy's
        reservations are all taken, or no time could be forecast)."""
        if not isinstance(reason, InsufficientCapacity) or reason.reserved_at is not None:
            return reason
        key = (id(reason), taken)
        done = self._done.get(key)
        if done is None:
            if taken:
                n = self.state.policy.scheduling.reservations
                out = replace(reason, reservations=n, unreserved="taken")
            else:
                out = replace(reason, unreserved="no_forecast")
            done = self._done[key] = (reason, out)
        return done[1]

    # -- quota ------------------------------------------------------------------------------
    def _quota(self, job: Job, reason: QuotaExceeded | BorrowingLimit) -> Reason:
        """When enough of the named queue's usage frees (its running jobs' expected ends), and
        whether the job would fit now on idle GPUs at a tier quota does not charge."""
        state = self.state
        idle = max((state.index.free_gpus(f) for f in state.flavors(job)), default=0)
        tier = self.open_tier
        fits = tier is not None and tier != job.tier and job.total_gpus <= idle
        quota = state.quota
        ids = self._queue_ids
        if ids is None:
            ids = self._queue_ids = {name: i for i, name in enumerate(quota.names)}
        q = ids.get(reason.queue)
        root = q is not None and quota.parent[q] < 0 and isinstance(reason, QuotaExceeded)
        # The cluster's facts depend on the job's own queue and tier too.
        key = (id(reason), (fits, job.queue, job.tier) if root else fits)
        done = self._done.get(key)
        if done is not None:
            return done[1]
        frees = None
        if q is not None and reason.resource in quota.resources:
            frees = self._frees_in(q, quota.resources.index(reason.resource), reason.requested - reason.available)
        out = replace(
            reason,
            frees_at=None if frees is None else frees[0],
            frees_by=None if frees is None else frees[1],
            open_tier=tier if fits else None,
        )
        if root and isinstance(out, QuotaExceeded) and reason.resource in quota.resources:
            out = self._cluster_full(job, out, quota.resources.index(reason.resource))
        self._done[key] = (reason, out)
        return out

    def _cluster_full(self, job: Job, reason: QuotaExceeded, r: int) -> QuotaExceeded:
        """The cluster is full (its root's quota is the capacity): which other team queues hold
        more than their nominal of resource `r` (as Kueue names a cohort's borrowing), how much of
        the job's queue's nominal it does not use, and whether, and from when, the job may take
        back what they borrow: the moment the protections (lease, efficiency floor, thrash
        budget) of enough of their jobs the reclaim rules let it take have lifted."""
        state = self.state
        quota, ctx = state.quota, state.ctx
        own = quota.index.get(job.queue)
        if own is None:
            return replace(reason, cluster=True, own_queue=job.queue)
        over_all = self._borrowers(r)
        over = {name: x for name, x in over_all.items() if name != job.queue}
        borrowers = tuple(sorted(over, key=lambda name: (-over[name], name)))
        lent = int(max(0.0, quota.nominal[own][r] - quota.usage[own][r]))
        out = replace(
            reason,
            cluster=True,
            own_queue=job.queue,
            lent=lent,
            borrowers=borrowers,
            borrowed=int(sum(over.values())),
        )
        if not borrowers or not lent:
            return out
        flavor = job.flavor or next(iter(state.flavors(job)), None)
        p = preemptor(ctx, job, state.demand(job, flavor)) if flavor is not None else None
        if p is None or not p.in_quota:
            return replace(out, reclaimable=False)
        needed, got, takeable = reason.requested - reason.available, 0.0, False
        for until, gpus, v in self._lifting_order(r):
            if v.queue not in over or not RECLAIM.kind(ctx, p, v):
                continue
            takeable = True
            got += gpus
            if got >= needed - 1e-9:
                if until == float("inf"):
                    return out
                return replace(out, reclaimable=True, reclaim_at=max(until, state.now))
        return replace(out, reclaimable=takeable)

    def _borrowers(self, r: int) -> dict[str, float]:
        """The team queues above their nominal of resource `r`, by how much (`_borrowing`)."""
        quota = self.state.quota
        key = (r, self.state.memo.quota_version)
        over = self._borrowing.get(key)
        if over is None:
            usage, nominal, index = quota.usage, quota.nominal, quota.index
            over = self._borrowing[key] = {
                name: usage[i][r] - nominal[i][r]
                for name in quota.leaves()
                if usage[(i := index[name])][r] > nominal[i][r] + 1e-9
            }
        return over

    def _lifting_order(self, r: int) -> list[tuple[float, int, Job]]:
        """The charged running jobs of the queues above their nominal of resource `r` that are
        not leaving, each with when its protections lift and its GPUs, in that order
        (`_lifting`)."""
        state = self.state
        key = (r, state.memo.quota_version)
        jobs = self._lifting.get(key)
        if jobs is None:
            over = self._borrowers(r)
            jobs = self._lifting[key] = sorted(
                ((self.victims.protected_until(v), v.total_gpus, v) for v in state.holding.values()
                 if v.queue in over and v.id not in state.terminating and state.charged(v)),
                key=lambda row: (row[0], row[2].id),
            )  # fmt: skip
        return jobs

    def _frees_in(self, q: int, r: int, amount: float) -> tuple[float, str] | None:
        """The running job of queue `q` (or below it) by whose expected end `amount` of resource
        `r` has freed, counting its jobs in the order they are expected to end; None when their
        known ends never free that much."""
        key = (q, r, amount)
        if key in self._frees:
            return self._frees[key]
        state = self.state
        quota = state.quota
        releases = self.victims.releases()
        jobs, paths, flavor_of = releases.jobs, quota.paths, state.flavor_of_job
        found = None
        got = 0.0
        for end, i in releases.ending:
            v = jobs[i]
            path = paths.get(v.queue)
            if path is None or q not in path or not state.charged(v):
                continue
            got += quota.demand(v, flavor_of[i])[r]
            if got >= amount - 1e-9:
                found = (end, i)
                break
        self._frees[key] = found
        return found

    # -- placement --------------------------------------------------------------------------
    def _fragmented(self, job: Job, reason: Fragmented) -> Reason:
        """Would the gang fit now with `placement: any`, or as replicas of fewer GPUs?"""
        state = self.state
        key = (job.flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement, state.memo.capacity_version)
        known = self._fits.get(key)
        if known is None:
            known = self._fits[key] = self._other_shapes(job)
        any_fits, split = known
        if not any_fits and split is None:
            return reason
        return replace(reason, any_fits=any_fits, split_gpus=split)

    def _other_shapes(self, job: Job) -> tuple[bool, int | None]:
        index = self.state.index
        flavors = [f for f in self.state.flavors(job) if f in index.flavors()]
        if job.placement != "any" and any(
            index.find(f, job.replicas, job.gpus, job.cpu, job.memory, "any") is not None for f in flavors
        ):
            return True, None
        total = job.total_gpus
        for f in flavors:
            widest = index.largest_domain(f, "pack")
            g = next((g for g in range(min(job.gpus - 1, widest), 0, -1) if total % g == 0), None)
            if g is None:
                continue
            cpu, memory = -(-job.cpu * g // job.gpus), -(-job.memory * g // job.gpus)
            if index.find(f, total // g, g, cpu, memory, "any") is not None:
                return False, g
        return False, None

    # -- holds ------------------------------------------------------------------------------
    def _reserved(self, job: Job, reason: Reserved) -> Reason:
        """The runtime under which the job could start in the held capacity now: before every
        hold is due (only reservations let a job in, a claim never does)."""
        state = self.state
        key = (id(reason), state.memo.hold_version)
        done = self._done.get(key)
        if done is None:
            holds = state.holds
            out: Reason = reason
            if holds and all(h.backfill and h.due is not None for h in holds):
                left = min(h.due for h in holds if h.due is not None) - state.now
                if left > 0:
                    out = replace(reason, backfill_s=left)
            done = self._done[key] = (reason, out)
        return done[1]

    # -- protection -------------------------------------------------------------------------
    def lease(self, job: Job, victims: tuple[Job, ...], due: float) -> WaitingForLease:
        """`WaitingForLease` naming the victim rule that holds the job longest, with its inputs
        (as the rules protect the victims from the job: a tier-1 job is not held by the thrash
        guard, `rules.guarded`)."""
        state = self.state
        ctx, policy = state.ctx, state.policy
        ids = tuple(v.id for v in victims)
        # The victim protected longest, by the protection the pass keeps per running job (the
        # first on a tie); the rules are asked again only about it.
        facts = self.victims.releases(job.tier == PRODUCTION).facts
        last = max(victims, key=lambda v: facts[v.id][0] if v.id in facts else 0.0)
        b = binding(ctx, last, guarded(job.tier, last.tier))
        if b is None or b.until == float("inf"):
            return WaitingForLease(ids, due)
        v = last
        reason = WaitingForLease(ids, due, b.rule, v.id, lease_of(policy, v))
        a = v.attempt
        if b.rule == "efficiency" and a is not None:
            basis = checkpoint_basis(a.checkpoint_s, a.sigterm_save_s)
            return replace(
                reason,
                startup_s=startup_of(policy, v),
                startup_measured=a.startup_s is not None,
                checkpoint_s=checkpoint_of(policy, v),
                checkpoint_measured=basis == "measured",
                save_measured=None if basis == "measured" else basis == "save",
                min_efficiency=policy.thrash.min_efficiency,
            )
        if b.rule == "thrash_budget":
            mp = policy.thrash.max_preemptions
            return replace(reason, thrash_count=mp.count, thrash_window_s=mp.per)
        return reason


def open_tier(policy: Policy) -> int | None:
    """The lowest-priority tier a user can submit to that quota does not charge and no admin
    must approve: where a job runs on idle capacity (DESIGN §4.2, tier 4)."""
    tiers = [t for t, spec in policy.tiers.items() if not spec.charged and not spec.requires_approval]
    return max(tiers) if tiers else None
