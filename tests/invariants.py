"""DESIGN §4.6 as checks: every (snapshot, plan, now) of a pass, and a history across passes.

The checks recompute what they need from the snapshot and the plan with models of their own
(`QuotaModel` re-derives quota.py's docstring, `Free` gang feasibility), using the engine only
for `schedule` itself and `rules.lease_of`. Where a check depends on the engine's in-pass state
(what capacity and quota a preemptor saw, which it does not report), it is written to be
sound: it rebuilds a state with no more room than the engine's (or, where it grants a
permission, no less), so a failure is a violation under the reading of DESIGN stated next to
the check, not an artefact of the model. Two readings are choices: a job waiting for its
victims counts as the quota usage it is about to have (quota.py's `transfer`), and a job
already terminating that no waiting job counts on is gone when judging whether a side borrows.

Used by the engine's property tests (`engine/test_invariants.py`) and by the simulator's
(`sim/test_simulator.py`), which hands every pass of a simulated trace to `check_pass`.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from engine_driver import Driver
from hypothesis import note

from warden.engine.model import Job, JobState, Node, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import Policy, QueueSpec
from warden.engine.reasons import REASON_CODES
from warden.engine.rules import grace_of, lease_of
from warden.engine.scheduler import schedule

EPS = 1e-9
INF = math.inf


# ======================================================================= independent models


def _walk(q: QueueSpec) -> Iterable[QueueSpec]:
    yield q
    for c in q.children:
        yield from _walk(c)


class QuotaModel:
    """Queue usage recounted from jobs, and the limits of quota.py's docstring, re-derived. The
    root is the cluster (DESIGN §4.2): its limit is what the nodes have of a resource, summed
    here anew, but never below its nominal (nominal quotas beyond the cluster: the old limit);
    unlimited where they report none of it."""

    def __init__(self, policy: Policy, nodes: Iterable[Node]) -> None:
        self.policy = policy
        self.capacity: dict[str, float] = defaultdict(float)
        for n in nodes:
            usable = n.gpus - len(n.unavailable)  # unavailable GPUs are no capacity
            for r, amount in (("gpu", usable), (f"gpu:{n.flavor}", usable), ("cpu", n.cpu), ("memory", n.memory)):
                self.capacity[r] += amount
        self.root = policy.queues.name
        self.spec: dict[str, QueueSpec] = {}
        self.parent: dict[str, str | None] = {self.root: None}
        for q in _walk(policy.queues):
            self.spec[q.name] = q
            for c in q.children:
                self.parent[c.name] = q.name
        self.leaves = {n for n, q in self.spec.items() if not q.children}
        self.resources = sorted(
            {
                r
                for q in self.spec.values()
                for quota in (q.nominal, q.borrowing_limit or {}, q.lending_limit or {})
                for r in quota
            }
        )
        self.usage: dict[str, dict[str, float]] = {n: defaultdict(float) for n in self.spec}

    def copy(self) -> QuotaModel:
        other = object.__new__(QuotaModel)
        other.__dict__.update(self.__dict__)
        other.usage = {n: defaultdict(float, u) for n, u in self.usage.items()}
        return other

    def path(self, leaf: str) -> list[str]:
        out: list[str] = []
        q: str | None = leaf
        while q is not None:
            out.append(q)
            q = self.parent[q]
        return out

    def nominal(self, q: str, r: str) -> float:
        return float(self.spec[q].nominal.get(r, 0))

    def limit(self, q: str, r: str) -> float:
        spec = self.spec[q]
        if q == self.root:
            capacity = self.capacity.get(r, 0.0)
            return max(capacity, float(spec.nominal.get(r, 0))) if capacity else INF
        borrow = spec.borrowing_limit or {}
        return float(spec.nominal.get(r, 0)) + borrow[r] if r in borrow else INF

    def kept(self, q: str, r: str) -> float:
        lend = self.spec[q].lending_limit or {}
        return float(self.spec[q].nominal.get(r, 0)) - lend[r] if r in lend else 0.0

    def charged(self, job: Job) -> bool:
        return bool(self.resources) and self.policy.tier(job.tier).charged and job.queue in self.leaves

    def demand(self, job: Job, flavor: str) -> dict[str, float]:
        n = job.replicas
        per = {"gpu": job.gpus * n, "cpu": job.cpu * n, "memory": job.memory * n, f"gpu:{flavor}": job.gpus * n}
        return {r: float(per[r]) for r in self.resources if per.get(r)}

    def add(self, job: Job, flavor: str, sign: int = 1) -> None:
        if not self.charged(job):
            return
        d = self.demand(job, flavor)
        for q in self.path(job.queue):
            for r, a in d.items():
                self.usage[q][r] += sign * a

    def held(self, q: str, r: str) -> float:
        """What a subtree holds back unused: max(0, kept(q) − U(q), Σ_children held(c))."""
        below = sum(self.held(c.name, r) for c in self.spec[q].children)
        return max(0.0, self.kept(q, r) - self.usage[q][r], below)

    def excess(self, leaf: str, r: str, amount: float) -> list[tuple[str, float]]:
        """(queue, how far past its limit) along the leaf's path if `amount` of r were added:
        U(qi) + d + Σ held(s) over the siblings s of q0 … q(i−1) ≤ limit(qi) (quota.py)."""
        path = self.path(leaf)
        out = []
        others = 0.0
        for i, q in enumerate(path):
            if i:
                others += sum(self.held(c.name, r) for c in self.spec[q].children if c.name != path[i - 1])
            over = self.usage[q][r] + amount + others - self.limit(q, r)
            if over > EPS:
                out.append((q, over))
        return out

    def fits(self, job: Job, flavor: str) -> bool:
        if not self.charged(job):
            return True
        return not any(self.excess(job.queue, r, a) for r, a in self.demand(job, flavor).items())

    def in_quota(self, job: Job, flavor: str) -> bool:
        """Within nominal on every queue below the root."""
        if not self.charged(job):
            return True
        return all(
            self.usage[q][r] + a <= self.nominal(q, r) + EPS
            for r, a in self.demand(job, flavor).items()
            for q in self.path(job.queue)[:-1]
        )

    def entitled(self, job: Job, flavor: str) -> bool:
        """Within nominal on every queue below the root once the other branches on its path give
        back what they use beyond their own nominal: what its queue is entitled to (DESIGN §4.3
        reclaim: V borrows capacity P's queue is entitled to)."""
        if not self.charged(job):
            return True
        path = self.path(job.queue)[:-1]
        for r, a in self.demand(job, flavor).items():
            others = 0.0
            for i, q in enumerate(path):
                if i:
                    others += sum(
                        max(0.0, self.usage[c.name][r] - self.nominal(c.name, r))
                        for c in self.spec[q].children
                        if c.name != path[i - 1]
                    )
                if self.usage[q][r] + a - others > self.nominal(q, r) + EPS:
                    return False
        return True


class Free:
    """Free (gpus, cpu, memory) per node; untracked cpu/memory (declared 0) are ignored."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.free = {n.name: [n.gpus - len(n.unavailable), n.cpu, n.memory] for n in nodes}

    def copy(self) -> Free:
        other = object.__new__(Free)
        other.nodes = self.nodes
        other.free = {k: list(v) for k, v in self.free.items()}
        return other

    def change(self, node: str, job: Job, sign: int) -> None:
        f, n = self.free[node], self.nodes[node]
        f[0] += sign * job.gpus
        if n.cpu:
            f[1] += sign * job.cpu
        if n.memory:
            f[2] += sign * job.memory

    def take_job(self, job: Job, nodes: Iterable[str]) -> None:
        for node in nodes:
            self.change(node, job, -1)

    def give_job(self, job: Job, nodes: Iterable[str]) -> None:
        for node in nodes:
            self.change(node, job, +1)

    def hold_at_most(self, job: Job, nodes: Iterable[str]) -> None:
        """Take, on each node, as much of the job's whole demand as is free: no engine hold on
        those nodes for this job can have taken more."""
        need = (job.gpus * job.replicas, job.cpu * job.replicas, job.memory * job.replicas)
        for node in nodes:
            f = self.free[node]
            for i in range(3):
                f[i] -= max(0, min(f[i], need[i]))

    def place(self, job: Job, flavor: str) -> None:
        """Take a best-fit placement of the whole gang (fewest free GPUs first); it must fit."""
        nodes = [n.name for n in self.nodes.values() if n.flavor == flavor]
        if job.placement == "pack":
            nodes = [min((n for n in nodes if self.replicas_on(n, job) >= job.replicas), key=lambda n: self.free[n][0])]
        elif job.placement == "block":
            blocks: dict[Any, list[str]] = defaultdict(list)
            for n in nodes:
                blocks[self.nodes[n].block or ("own", n)].append(n)
            ok = [b for b in blocks.values() if sum(self.replicas_on(n, job) for n in b) >= job.replicas]
            nodes = min(ok, key=lambda b: sum(self.free[n][0] for n in b))
        left = job.replicas
        for n in sorted(nodes, key=lambda n: self.free[n][0]):
            k = int(min(left, self.replicas_on(n, job)))
            self.take_job(job, [n] * k)
            left -= k
            if not left:
                return
        raise AssertionError(f"no placement for {job.id} on {flavor}")

    def replicas_on(self, node: str, job: Job) -> int | float:
        f, n = self.free[node], self.nodes[node]
        k: int | float = f[0] // job.gpus if job.gpus else INF
        if n.cpu and job.cpu:
            k = min(k, f[1] // job.cpu)
        if n.memory and job.memory:
            k = min(k, f[2] // job.memory)
        return max(0, k)

    def fits(self, job: Job, flavor: str) -> bool:
        """Exact gang feasibility: each node hosts floor(free / per-replica) replicas."""
        nodes = [n for n in self.nodes.values() if n.flavor == flavor]
        if job.placement == "pack":
            return any(self.replicas_on(n.name, job) >= job.replicas for n in nodes)
        domains: dict[Any, float] = defaultdict(float)
        for n in nodes:
            key = ("all",) if job.placement == "any" else ((n.block,) if n.block is not None else ("own", n.name))
            domains[key] += self.replicas_on(n.name, job)
        return any(v >= job.replicas for v in domains.values())


# ============================================================================ one pass's view


class PassView:
    """A snapshot and its plan, indexed for the checks."""

    def __init__(self, snapshot: Snapshot, plan: Plan, now: float) -> None:
        self.snapshot, self.plan, self.now = snapshot, plan, now
        self.policy = snapshot.policy
        self.jobs = {j.id: j for j in snapshot.jobs}
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.flavors = tuple(sorted({n.flavor for n in snapshot.nodes}))
        self.holding = [j for j in snapshot.jobs if j.state.holds_resources and j.attempt is not None]
        self.terminating = {
            j.id for j in self.holding if j.attempt.sigterm_at is not None or j.state is JobState.PREEMPTING
        }  # type: ignore[union-attr]
        self.waiting = [j for j in snapshot.jobs if j.state.waiting]
        self.admitted = {a.job_id: a for a in plan.admissions}
        self.victims_of: dict[str, list[str]] = defaultdict(list)
        for p in plan.preemptions:
            self.victims_of[p.for_job].append(p.job_id)
        self.quota = QuotaModel(self.policy, snapshot.nodes)

    def flavor_of(self, job: Job) -> str:
        adm = self.admitted.get(job.id)
        if adm is not None:
            return adm.flavor
        assert job.attempt is not None and job.attempt.assignment
        return self.nodes[job.attempt.assignment[0].node].flavor

    def nodes_of(self, job: Job) -> list[str]:
        adm = self.admitted.get(job.id)
        placement = adm.placement if adm is not None else job.attempt.assignment  # type: ignore[union-attr]
        return [rp.node for rp in placement]

    def candidate_flavors(self, job: Job) -> tuple[str, ...]:
        return (job.flavor,) if job.flavor is not None else self.flavors

    def positions(self) -> dict[str, int]:
        """Every waiting job's 1-based rank: explanations carry theirs; admitted jobs take the
        free positions in the order of the plan's admissions (the pass walks the ranking)."""
        pos = {jid: e.position for jid, e in self.plan.explanations.items()}
        free = sorted(set(range(1, len(self.waiting) + 1)) - set(pos.values()))
        assert len(free) == len(self.plan.admissions), "positions do not account for the admissions"
        pos.update({a.job_id: p for a, p in zip(self.plan.admissions, free)})
        return pos


# ================================================================================== the checks


def check_plan_shape(v: PassView) -> None:
    """Invariant 4 (gangs whole; no job named twice) and the explanation contract."""
    plan, jobs = v.plan, v.jobs
    adm_ids = [a.job_id for a in plan.admissions]
    vic_ids = [p.job_id for p in plan.preemptions]
    assert len(set(adm_ids)) == len(adm_ids), f"a job is admitted twice: {adm_ids}"
    assert len(set(vic_ids)) == len(vic_ids), f"a job is preempted twice: {vic_ids}"
    assert not set(adm_ids) & set(vic_ids), "a job is both admitted and preempted"
    for a in plan.admissions:
        job = jobs.get(a.job_id)
        assert job is not None, f"admitted unknown job {a.job_id}"
        assert job.state.waiting and job.state is not JobState.AWAITING_APPROVAL, (
            f"admitted {job.id} in state {job.state}"
        )
        assert job.not_before is None or job.not_before <= v.now, f"admitted {job.id} before not_before"
    for p in plan.preemptions:
        victim = jobs.get(p.job_id)
        assert victim is not None and victim.state.holds_resources and victim.attempt is not None, (
            f"preempted {p.job_id}, which holds no resources"
        )
        pre = jobs.get(p.for_job)
        assert pre is not None and pre.state.waiting and pre.state is not JobState.AWAITING_APPROVAL, (
            f"{p.job_id} preempted for {p.for_job}, which is not a waiting job"
        )
        assert p.for_job not in v.admitted, f"{p.for_job} is admitted and preempts {p.job_id} in one pass"

    waiting = {j.id for j in v.waiting}
    expected = waiting - set(adm_ids)
    assert set(plan.explanations) == expected, (
        f"explanations for {sorted(plan.explanations)}, waiting and not admitted: {sorted(expected)}"
    )
    seen_positions = set()
    signalled = {p.job_id for p in plan.preemptions}
    for jid, e in plan.explanations.items():
        assert e.job_id == jid
        r = e.reason
        assert r.code in REASON_CODES, f"{jid}: unknown reason code {r.code}"
        msg = r.message
        assert isinstance(msg, str) and msg.strip() and msg.endswith(".") and (msg[0].isupper() or msg[0].isdigit()), (
            f"{jid}: reason message is not a sentence: {msg!r}"
        )
        json.dumps(r.to_dict())
        assert 1 <= e.position <= len(waiting) and e.position not in seen_positions, (
            f"{jid}: bad or duplicate position {e.position}"
        )
        seen_positions.add(e.position)
        assert (r.code == "AwaitingApproval") == (jobs[jid].state is JobState.AWAITING_APPROVAL), (
            f"{jid} in state {jobs[jid].state} explained as {r.code}"
        )
        if r.code == "ThrashBackoff":
            nb = jobs[jid].not_before
            assert nb is not None and nb > v.now
        if r.code == "WaitingForGrace":
            mine = set(v.victims_of.get(jid, ()))
            assert mine <= set(r.victims), f"{jid} preempts {mine} but waits for {r.victims}"
            for x in r.victims:
                # Its own victims, or evictions in flight: jobs already terminating or signalled
                # in this pass (an eviction with room for two may serve two waiting jobs).
                assert x in signalled or x in v.terminating, (
                    f"{jid} waits for {x}, which is neither signalled nor terminating"
                )
    reserved = {r.job_id: r for r in plan.reservations}
    for jid, mine in v.victims_of.items():
        assert jid in plan.explanations, f"{jid} preempts {mine} but is not explained"
        if plan.explanations[jid].reason.code == "WaitingForGrace":
            continue
        # Else a reservation's holder taking back lower-tier jobs ahead of its due time
        # (DESIGN §4.2): strictly lower tiers, none signalled before due − its grace.
        r = reserved.get(jid)
        assert r is not None and r.due is not None and r.due > v.now, (
            f"{jid} preempts {mine} but neither waits for them (WaitingForGrace) nor holds a reservation due later"
        )
        for x in mine:
            victim = v.jobs[x]
            assert victim.tier > jobs[jid].tier, f"{jid} takes back {x} of tier {victim.tier} ahead of its reservation"
            assert v.now >= r.due - grace_of(v.policy, victim) - EPS, (
                f"{jid} takes back {x} before due − its grace ({v.now} < {r.due} − {grace_of(v.policy, victim)})"
            )
    v.positions()


def check_capacity(v: PassView) -> None:
    """Invariant 1 (and gang shape of admissions): nothing beyond node capacity, counting
    jobs in their grace period and the new admissions; no GPU index given twice, none of a
    node's unavailable ones."""
    used: dict[str, list[int]] = {n: [0, 0, 0] for n in v.nodes}
    indices: dict[str, dict[int, str]] = defaultdict(dict)

    def charge(job: Job, placement: Iterable[Any]) -> None:
        for rp in placement:
            assert rp.node in v.nodes, f"{job.id} placed on unknown node {rp.node}"
            u = used[rp.node]
            u[0] += job.gpus
            u[1] += job.cpu
            u[2] += job.memory
            assert len(rp.gpus) == job.gpus and len(set(rp.gpus)) == job.gpus, (
                f"{job.id} got GPU indices {rp.gpus} on {rp.node} for {job.gpus} GPUs per replica"
            )
            for g in rp.gpus:
                assert 0 <= g < v.nodes[rp.node].gpus, f"{job.id}: GPU index {g} outside {rp.node}"
                assert g not in v.nodes[rp.node].unavailable, f"{job.id}: GPU {rp.node}:{g} is unavailable"
                other = indices[rp.node].get(g)
                assert other is None, f"GPU {rp.node}:{g} assigned to both {other} and {job.id}"
                indices[rp.node][g] = job.id

    for job in v.holding:
        charge(job, job.attempt.assignment)  # type: ignore[union-attr]
    for a in v.plan.admissions:
        job = v.jobs[a.job_id]
        assert len(a.placement) == job.replicas, (
            f"{job.id}: {len(a.placement)} replicas placed of {job.replicas} (gang not whole)"
        )
        node_flavors = {v.nodes[rp.node].flavor for rp in a.placement if rp.node in v.nodes}
        assert node_flavors <= {a.flavor}, f"{job.id} admitted as {a.flavor} on {node_flavors}"
        assert job.flavor in (None, a.flavor), f"{job.id} wants {job.flavor}, got {a.flavor}"
        names = {rp.node for rp in a.placement}
        if job.placement == "pack":
            assert len(names) == 1, f"{job.id} (pack) spread over {names}"
        if job.placement == "block":
            blocks = {v.nodes[n].block or ("own", n) for n in names}
            assert len(blocks) == 1, f"{job.id} (block) spread over blocks {blocks}"
        charge(job, a.placement)
    for name, (g, c, m) in used.items():
        node = v.nodes[name]
        assert g <= node.gpus - len(node.unavailable), f"{name}: {g} GPUs allocated of {node.usable_gpus} usable"
        assert not node.cpu or c <= node.cpu, f"{name}: {c} cpu allocated of {node.cpu}"
        assert not node.memory or m <= node.memory, f"{name}: {m} memory allocated of {node.memory}"


def _base_quota(v: PassView, terminating: bool, admissions: bool | Iterable[str]) -> QuotaModel:
    """Usage of the jobs holding resources (with or without terminating ones) plus admissions
    (all of them, none, or the ones named)."""
    q = v.quota.copy()
    for job in v.holding:
        if terminating or job.id not in v.terminating:
            q.add(job, v.flavor_of(job))
    chosen = set(v.admitted) if admissions is True else set() if admissions is False else set(admissions)
    for jid in chosen:
        job = v.jobs[jid]
        q.add(job, v.admitted[jid].flavor)
    return q


def check_preemptions(v: PassView) -> None:
    """Invariants 2, 3 and 5 for every Preemption of the plan."""
    pol, now = v.policy, v.now
    # The most favourable usage a preemptor could have been judged with: nothing terminating,
    # no admission, every victim of the plan already gone. The engine's is never lower.
    lenient = _base_quota(v, terminating=False, admissions=False)
    for p in v.plan.preemptions:
        lenient.add(v.jobs[p.job_id], v.flavor_of(v.jobs[p.job_id]), -1)
    # V's side of the common ancestor, with the most usage the engine could have seen on it, to
    # judge reclaims: what holds resources (terminating jobs only where a waiting job counts on
    # them), every admission, and every waiting job's claim as quota.py's `transfer` charges it
    # (a side whose own job is about to start on freed capacity is about to use it).
    side_usage = _base_quota(v, terminating=False, admissions=True)
    claims = [jid for jid, e in v.plan.explanations.items() if e.reason.code == "WaitingForGrace"]
    counted_on = {x for jid in claims for x in v.plan.explanations[jid].reason.victims}  # type: ignore[attr-defined]
    for job in v.holding:
        if job.id in v.terminating and job.id in counted_on:
            side_usage.add(job, v.flavor_of(job))
    _charge_claims(v, side_usage, sorted(claims, key=lambda jid: v.plan.explanations[jid].position))
    reclaims: dict[str, list[Job]] = defaultdict(list)

    for p in v.plan.preemptions:
        victim, pre = v.jobs[p.job_id], v.jobs[p.for_job]
        a = victim.attempt
        assert a is not None
        tier = pol.tier(victim.tier)
        where = f"{p.job_id} (tier {victim.tier}, {victim.queue}) for {p.for_job} (tier {pre.tier}, {pre.queue})"
        # -- 3: lease, preemptible, not terminating, thrash guard
        assert tier.preemptible, f"{where}: tier {victim.tier} is not preemptible"
        assert a.sigterm_at is None and victim.state is not JobState.PREEMPTING, (
            f"{where}: victim is already terminating"
        )
        ran = now - a.started_at
        assert now >= a.started_at + lease_of(pol, victim), (
            f"{where}: preempted after {ran}s, inside its lease {lease_of(pol, victim)}s"
        )
        # The thrash guard holds back preemptors of tiers 2–4 and reclaims, never a tier-1 job
        # taking a lower tier (DESIGN §4.3): tier 1 is bound by the lease and grace alone.
        if pre.tier != 1 or victim.tier <= pre.tier:
            mp = pol.thrash.max_preemptions
            recent = [t for t in victim.preempted_at if t > now - mp.per]
            assert len(recent) < mp.count, f"{where}: preemption budget used up ({recent})"
            # η = (T_run − (T_startup + T_checkpoint)) / T_run ≥ min_efficiency, i.e. the attempt
            # has run at least overhead / (1 − min_efficiency) (also when nothing was spent yet),
            # counting one save — the last measured, else the job's known save, else the assumed
            # one — never a sum of reports; or it has run max_lease, past which nothing stretches.
            startup = a.startup_s if a.startup_s is not None else pol.preemption.restart_overhead
            checkpoint = a.sigterm_save_s if a.sigterm_save_s is not None else pol.preemption.checkpoint_overhead
            overhead = startup + checkpoint
            floor = pol.thrash.min_efficiency
            eta = (ran - overhead) / ran if ran > 0 else (1.0 if overhead == 0 else -INF)
            # The rule lifts 1 µs early on purpose (binary floating point, rules.efficiency_floor):
            # allow that and the rounding of now − started.
            assert ran >= min(overhead / (1.0 - floor) - 2e-6, pol.max_lease), (
                f"{where}: efficiency {eta:.4f} below {floor} (ran {ran}s, overhead {overhead}s)"
            )
            # Nor in the last `protect_before_time_limit` of its time limit (the same reach).
            window = pol.preemption.protect_before_time_limit
            if window > 0 and victim.time_limit is not None:
                assert ran < victim.time_limit - window, (
                    f"{where}: preempted {victim.time_limit - ran}s before its time limit "
                    f"(protect_before_time_limit {window}s)"
                )
        # -- 5: the grace period, at least min_grace and the victim's own
        own = victim.grace if victim.grace is not None else tier.grace
        assert p.grace >= pol.min_grace and p.grace >= own, (
            f"{where}: grace {p.grace} < max(min_grace {pol.min_grace}, own {own})"
        )
        assert 0 <= p.lost_work <= p.cost + EPS
        # -- 2: direction and scope
        pre_in_quota = any(lenient.in_quota(pre, f) for f in v.candidate_flavors(pre))
        scope = pol.tier(pre.tier).scope
        # A job started in reserved capacity is taken back whatever `scope` says (DESIGN §4.2).
        taken_back = a.lent and victim.tier > pre.tier and any(r.job_id == pre.id for r in v.plan.reservations)
        if p.kind == "downward":
            assert victim.tier > pre.tier, f"{where}: kind downward for a victim of tier {victim.tier}"
            if victim.queue != pre.queue and not taken_back:
                assert scope != "queue", f"{where}: scope queue, but the victim is in another queue"
                if scope == "quota":
                    assert pre_in_quota, f"{where}: scope quota, but the preemptor is not in-quota"
            continue
        assert p.kind in ("reclaim", "fair_share"), f"{where}: unknown kind {p.kind}"
        assert victim.queue != pre.queue, f"{where}: reclaim inside one queue"
        assert v.quota.charged(victim), f"{where}: reclaim of an uncharged job"
        # -- 9: a starving job is no reclaim's victim (while the shield lasts)
        shield = pol.preemption.reclaim.starvation_shield
        if shield != "off" and victim.waited >= pol.fair_share.aging.escalate_at * pol.max_wait_for(victim.queue):
            assert shield == "max_lease" and now >= a.started_at + pol.max_lease, (
                f"{where}: a starving job (waited {victim.waited}s) reclaimed"
            )
        reclaim = pol.preemption.reclaim
        if p.kind == "fair_share":
            assert reclaim.fair_share != "never", f"{where}: fair-share reclaim where the policy has none"
            assert victim.tier >= pre.tier, f"{where}: fair-share reclaim of a higher tier"
        else:
            assert reclaim.nominal != "never", f"{where}: nominal reclaim where the policy has none"
            if reclaim.nominal == "not_higher":
                assert victim.tier >= pre.tier, f"{where}: nominal reclaim of a higher tier"
            # Reclaim takes back what P's queue is entitled to: P is in-quota once the other
            # branches on its path give back their borrowing.
            assert any(lenient.entitled(pre, f) for f in v.candidate_flavors(pre)), (
                f"{where}: reclaim by a preemptor its queue's nominal does not entitle"
            )
        pa, pb = v.quota.path(pre.queue), v.quota.path(victim.queue)
        common = next(q for q in pb if q in pa)
        side = pb[pb.index(common) - 1]
        reclaims[side].append(victim)

    # Reclaim takes only from a side above nominal. With victims of one side taken one by one
    # (each counted gone once signalled, whichever job it was signalled for), the last one
    # taken saw the side above nominal with every other victim of that side gone.
    for side, victims in reclaims.items():

        def above(last: Job, side: str = side, victims: list[Job] = victims) -> bool:
            for r in side_usage.resources:
                u = side_usage.usage[side][r] - sum(
                    side_usage.demand(w, v.flavor_of(w)).get(r, 0.0) for w in victims if w is not last
                )
                if u > side_usage.nominal(side, r) + EPS:
                    return True
            return False

        assert any(above(last) for last in victims), (
            f"reclaim of {[w.id for w in victims]} from {side}: usage "
            f"{dict(side_usage.usage[side])} is not above nominal "
            f"{ {r: side_usage.nominal(side, r) for r in side_usage.resources} } once the other victims are gone"
        )


def check_minimal_victims(v: PassView) -> None:
    """Invariant 6: each preemptor's victim set is minimal, and never duplicates an eviction
    already in flight.

    The state P was judged in is rebuilt from the rank order: jobs holding resources, the
    admissions ranked before P, and the capacity and quota held by jobs ranked before P that
    reserved or claimed (bounded from above, so the rebuilt state never has more room than the
    engine's). When nothing was held before P the state is exact, and P must then also fit
    once its victims and the terminating jobs it waits for are gone. Evictions in flight may
    serve several waiting jobs; where P shares one with a job ranked before it, or could have,
    an arrangement of the future (every eviction in flight done, the jobs ranked before P
    placed) decides: if P fits there without one of its victims, that victim was needless.
    """
    plan = v.plan
    pos = v.positions()
    held_by = {r.job_id: r for r in plan.reservations}
    claims = sorted((e.position, jid) for jid, e in plan.explanations.items() if e.reason.code == "WaitingForGrace")
    holders = sorted(
        [(pos[jid], jid, "claim") for _, jid in claims]
        + [(pos[jid], jid, "reservation") for jid in held_by if jid in pos]
    )
    base_free = Free(v.snapshot.nodes)
    for job in v.holding:
        base_free.take_job(job, v.nodes_of(job))

    for p_pos, pid in claims:
        pre = v.jobs[pid]
        reason = plan.explanations[pid].reason
        mine = list(v.victims_of.get(pid, ()))
        relies = [x for x in reason.victims if x not in mine]  # type: ignore[attr-defined]
        admitted_free = base_free.copy()
        admitted_quota = _base_quota(v, terminating=True, admissions=False)
        for a in plan.admissions:
            if pos[a.job_id] < p_pos:
                job = v.jobs[a.job_id]
                admitted_free.take_job(job, [rp.node for rp in a.placement])
                admitted_quota.add(job, a.flavor)
        free, quota = admitted_free.copy(), admitted_quota.copy()
        earlier = [(q, jid, kind) for q, jid, kind in holders if q < p_pos]
        claimed_before: set[str] = set()
        for _, jid, kind in earlier:
            job = v.jobs[jid]
            flavors = v.candidate_flavors(job)
            if kind == "reservation":
                free.hold_at_most(job, held_by[jid].nodes)
            else:
                free.hold_at_most(job, [n.name for n in v.snapshot.nodes if n.flavor in flavors])
                demand: dict[str, float] = defaultdict(float)
                for f in flavors:
                    for r, amount in quota.demand(job, f).items():
                        demand[r] = max(demand[r], amount)
                if quota.charged(job):
                    for q in quota.path(job.queue):
                        for r, amount in demand.items():
                            quota.usage[q][r] += amount
                claimed_before.update(plan.explanations[jid].reason.victims)  # type: ignore[attr-defined]
        exact = not earlier

        # A `scope: quota` preemptor taking victims outside its own queue, other than by
        # fair-share reclaim, must be in-quota once they are gone (DESIGN §4.3), and so must a
        # preemptor of a tier that is not preemptible (never admitted as borrowing, DESIGN
        # §4.2): a victim that only that needs is needed too.
        kinds = {x.job_id: x.kind for x in plan.preemptions if x.for_job == pid}
        tier = v.snapshot.policy.tier(pre.tier)
        in_quota_too = quota.charged(pre) and (
            not tier.preemptible
            or (
                tier.scope == "quota"
                and any(v.jobs[x].queue != pre.queue and kinds.get(x) != "fair_share" for x in mine)
            )
        )

        def fits_without(
            gone: Iterable[str],
            flavors: Iterable[str],
            free: Free = free,
            quota: QuotaModel = quota,
            pre: Job = pre,
            in_quota_too: bool = in_quota_too,
        ) -> bool:
            f, q = free.copy(), quota.copy()
            for x in gone:
                job = v.jobs[x]
                f.give_job(job, v.nodes_of(job))
                q.add(job, v.flavor_of(job), -1)
            return any(
                f.fits(pre, fl) and q.fits(pre, fl) and (not in_quota_too or q.in_quota(pre, fl)) for fl in flavors
            )

        flavors = v.candidate_flavors(pre)  # minimal over every flavor P may use
        where = f"{pid} (tier {pre.tier}, {pre.queue}, {pre.replicas}x{pre.gpus} {pre.placement})"
        if not set(relies) & claimed_before:
            # Nothing P waits for serves a job ranked before it: each victim must be needed.
            for x in mine:
                rest = [y for y in mine + relies if y != x]
                assert not fits_without(rest, flavors), (
                    f"{where}: victim {x} is not needed, {rest} alone make room (set not minimal)"
                )
        if mine:
            in_flight = [j.id for j in v.holding if j.id in v.terminating and j.id not in claimed_before]
            assert not fits_without(in_flight, flavors), (
                f"{where}: picked victims {mine} although terminating {in_flight} already make room"
            )
        if exact:
            assert fits_without(mine + relies, flavors), f"{where}: does not fit even once {mine + relies} are gone"
        if mine and not any(k == "reservation" for _, _, k in earlier):
            earlier_claims = [jid for _, jid, _ in earlier]
            for x in mine:
                others = [y for y in mine if y != x]
                assert not _fits_in_future(
                    v, pre, others, earlier_claims, admitted_free, admitted_quota, in_quota_too
                ), (
                    f"{where}: victim {x} is needless: once the evictions in flight and its other "
                    f"victims {others} are done, it fits beside the waiting jobs ranked before it "
                    f"({earlier_claims})"
                )


def _fits_in_future(
    v: PassView,
    pre: Job,
    also_gone: list[str],
    earlier: list[str],
    free: Free,
    quota: QuotaModel,
    in_quota_too: bool = False,
) -> bool:
    """Does P fit once the evictions in flight after this pass are done and `also_gone` have
    exited, beside the higher-ranked jobs that wait for victims? With `in_quota_too` (P takes
    victims of other queues under `scope: quota`, so it must be in-quota after admission), it
    must be in-quota there too.

    Replays the pass's claims the way the engine makes them: each higher-ranked waiting job,
    in rank order, gets the jobs it waits for released and takes a best-fit placement; then
    every other job already terminating and `also_gone` are released, and P is tried. True
    proves P's remaining victims were needless; False proves nothing.
    """
    f, q = free.copy(), quota.copy()
    released: set[str] = set()

    def release(x: str) -> None:
        if x in released:
            return
        released.add(x)
        job = v.jobs[x]
        f.give_job(job, v.nodes_of(job))
        q.add(job, v.flavor_of(job), -1)

    for cid in earlier:
        for x in v.plan.explanations[cid].reason.victims:  # type: ignore[attr-defined]
            release(x)
        c = v.jobs[cid]
        flavor = next((fl for fl in v.candidate_flavors(c) if f.fits(c, fl)), None)
        if flavor is None:
            return False
        f.place(c, flavor)
        q.add(c, flavor)
    for x in [j.id for j in v.holding if j.id in v.terminating] + also_gone:
        release(x)
    return any(
        f.fits(pre, fl) and q.fits(pre, fl) and (not in_quota_too or q.in_quota(pre, fl))
        for fl in v.candidate_flavors(pre)
    )


def check_quota(v: PassView) -> None:
    """Invariant 7: after the pass's admissions every queue stays within nominal + borrowing
    limit (the root within nominal) if it was before; and each admission, at its turn in the
    pass, takes nothing that lenders keep back (the lending condition of quota.py's docstring).

    For the lending condition a job waiting for its victims counts as the queue usage it is
    about to have: per queue, max(0, its demand − what its victims and the terminating jobs it
    waits for free there) on top of the usage now (quota.py's `transfer`). A lender whose own
    job is about to start on its kept capacity does not keep that capacity back from others.
    """
    before = _base_quota(v, terminating=True, admissions=False)
    after = _base_quota(v, terminating=True, admissions=True)
    for q in after.spec:
        for r in after.resources:
            lim, b, a = after.limit(q, r), before.usage[q][r], after.usage[q][r]
            if b <= lim + EPS:
                assert a <= lim + EPS, f"queue {q} {r}: usage {a} above its limit {lim} after admissions"
            else:
                assert a <= b + EPS, f"queue {q} {r}: already over its limit {lim}, admissions took it to {a}"
    if not after.resources or not v.plan.admissions:
        return
    pos = v.positions()
    claims = sorted((e.position, jid) for jid, e in v.plan.explanations.items() if e.reason.code == "WaitingForGrace")
    for adm in v.plan.admissions:
        job = v.jobs[adm.job_id]
        if not after.charged(job):
            continue
        at = pos[adm.job_id]
        model = _base_quota(
            v, terminating=True, admissions=[a.job_id for a in v.plan.admissions if pos[a.job_id] <= at]
        )
        _charge_claims(v, model, [cid for c_pos, cid in claims if c_pos < at])
        for r in after.demand(job, adm.flavor):
            # The job is already counted: nothing more may be added on its path.
            broken = model.excess(job.queue, r, 0.0)
            assert not broken, (
                f"{job.id} admitted into {job.queue}: {r} past the limit, counting what lenders keep back, at {broken}"
            )


def check_never_borrowing(v: PassView) -> None:
    """Invariant 9, second half: no job of a tier that is not preemptible is admitted borrowing
    (DESIGN §4.2), judged against nominal at its admission. The usage then is that of the jobs
    holding resources (terminating ones too), the admissions up to its own, and the claimants
    ranked before it charged as quota.py's `transfer` does: no more than the engine counted (as
    in `check_quota`), so a queue above its nominal here was above it for the engine too."""
    if not v.quota.resources or not v.plan.admissions:
        return
    pos = v.positions()
    claims = sorted((e.position, jid) for jid, e in v.plan.explanations.items() if e.reason.code == "WaitingForGrace")
    for adm in v.plan.admissions:
        job = v.jobs[adm.job_id]
        if v.policy.tier(job.tier).preemptible or not v.quota.charged(job):
            continue
        assert not adm.borrowing, f"{job.id} (tier {job.tier}, not preemptible) admitted as borrowing"
        at = pos[adm.job_id]
        model = _base_quota(
            v, terminating=True, admissions=[a.job_id for a in v.plan.admissions if pos[a.job_id] <= at]
        )
        _charge_claims(v, model, [cid for c_pos, cid in claims if c_pos < at])
        for q in model.path(job.queue)[:-1]:
            for r in model.demand(job, adm.flavor):
                assert model.usage[q][r] <= model.nominal(q, r) + EPS, (
                    f"{job.id} (tier {job.tier}, not preemptible) admitted into {job.queue} borrowing: "
                    f"queue {q} {r} at {model.usage[q][r]} of its nominal {model.nominal(q, r)}"
                )


def _charge_claims(v: PassView, model: QuotaModel, cids: Iterable[str]) -> None:
    """Charge waiting jobs, given in rank order, as quota.py's `transfer` does: per queue,
    max(0, its demand − the usage there of the jobs it waits for that no higher-ranked waiting
    job has taken over yet). A flavor-specific resource only where the flavor is certain
    (leaving it out keeps usage low and what lenders keep high: the stricter side)."""
    left: dict[str, dict[str, dict[str, float]]] = {}  # leaving job → queue → resource → usage
    for cid in cids:
        c = v.jobs[cid]
        waits_for = list(v.plan.explanations[cid].reason.victims)  # type: ignore[attr-defined]
        for x in waits_for:
            leaving = v.jobs[x]
            if x not in left:
                d = model.demand(leaving, v.flavor_of(leaving)) if model.charged(leaving) else {}
                left[x] = {q: dict(d) for q in model.path(leaving.queue)}
        if not model.charged(c):
            continue
        flavors = v.candidate_flavors(c)
        demand = {r: a for r, a in model.demand(c, flavors[0]).items() if len(flavors) == 1 or not r.startswith("gpu:")}
        for q in model.path(c.queue):
            for r, a in demand.items():
                want = a
                for x in waits_for:
                    have = left[x].get(q, {}).get(r, 0.0)
                    took = min(have, max(0.0, want))
                    if took:
                        left[x][q][r] = have - took
                        want -= took
                if want > 0:
                    model.usage[q][r] += want


def check_determinism(v: PassView, rng: random.Random) -> None:
    """Invariant 8: the same snapshot gives the same plan, whatever the order of its jobs."""
    snap, now, plan = v.snapshot, v.now, v.plan
    again = schedule(snap, now)
    assert again == plan, "schedule() gave two different plans for one snapshot"
    jobs = list(snap.jobs)
    for order in (jobs[::-1], rng.sample(jobs, len(jobs))):
        other = schedule(Snapshot(snap.nodes, tuple(order), snap.policy, snap.ledger), now)
        assert other.admissions == plan.admissions, "shuffling the jobs changed the admissions"
        assert other.preemptions == plan.preemptions, "shuffling the jobs changed the preemptions"
        assert other.reservations == plan.reservations, "shuffling the jobs changed the reservations"
        assert {k: (e.reason, e.position) for k, e in other.explanations.items()} == {
            k: (e.reason, e.position) for k, e in plan.explanations.items()
        }, "shuffling the jobs changed the explanations"


CHECKS = (
    check_plan_shape,
    check_capacity,
    check_preemptions,
    check_minimal_victims,
    check_quota,
    check_never_borrowing,
)


def check_pass(snapshot: Snapshot, plan: Plan, now: float, rng: random.Random) -> None:
    v = PassView(snapshot, plan, now)
    try:
        for check in CHECKS:
            check(v)
        check_determinism(v, rng)
    except AssertionError:
        note(describe(snapshot, plan, now))
        raise


def check_history(driver: Driver) -> None:
    """Invariants 4 and 5 across passes: a signalled job keeps every replica until the exit the
    history chose, which is never before SIGTERM nor after kill_at = SIGTERM + grace."""
    pol = driver.policy
    for ev in driver.evictions:
        assert ev.sigterm_at <= ev.exit_at <= ev.kill_at, f"{ev}: exit outside [SIGTERM, SIGKILL]"
        assert ev.kill_at - ev.sigterm_at >= pol.min_grace - EPS and ev.kill_at - ev.sigterm_at == ev.grace, (
            f"{ev}: SIGKILL earlier than the grace period"
        )
        for rec in driver.log:
            job = next((j for j in rec.snapshot.jobs if j.id == ev.job_id), None)
            if ev.sigterm_at < rec.now < ev.exit_at:
                assert job is not None and job.state is JobState.PREEMPTING and job.attempt is not None, (
                    f"{ev.job_id} released before its exit at {ev.exit_at} (pass at {rec.now})"
                )
                assert job.attempt.number == ev.attempt and job.attempt.kill_at == ev.kill_at
                assert len(job.attempt.assignment) == job.replicas
            elif rec.now >= ev.exit_at and ev.exited and job is not None and job.attempt is not None:
                assert job.attempt.number > ev.attempt, f"{ev.job_id} still holds attempt {ev.attempt} after exit"


def describe(snapshot: Snapshot, plan: Plan, now: float) -> str:
    """The failing pass, as Python a reproduction can start from."""
    lines = [
        f"now = {now!r}",
        f"nodes = {snapshot.nodes!r}",
        f"policy = parse_policy({snapshot.policy.to_dict()!r})",
        "jobs = (",
    ]
    lines += [f"    {j!r}," for j in snapshot.jobs]
    lines += [
        ")",
        f"ledger = {snapshot.ledger!r}",
        f"plan.admissions = {plan.admissions!r}",
        f"plan.preemptions = {plan.preemptions!r}",
        f"plan.reservations = {plan.reservations!r}",
        "explanations = {",
    ]
    lines += [f"    {k!r}: ({e.position}, {e.reason!r})," for k, e in plan.explanations.items()]
    lines.append("}")
    return "\n".join(lines)
