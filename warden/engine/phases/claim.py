"""Phase 4, claim: a job whose victims are chosen signals them and holds what it will need.

The job's whole future placement is held now — what is free now, and what its victims will
free — so nobody takes it meanwhile; what the jobs it waits for hold beyond that stays theirs,
offered to the next job that needs room as capacity on its way out, again at no cost. The
claim outlives the pass: the plan names the job (`Plan.claims`), and in the next pass it is
considered first (`order.claimant_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence

from warden.engine.model import Job
from warden.engine.phases.memo import Part
from warden.engine.phases.state import Hold, PassState, need_of
from warden.engine.phases.victims import Victims
from warden.engine.plan import Preemption
from warden.engine.preemption import Candidate
from warden.engine.reasons import WaitingForGrace
from warden.engine.rules import grace_of, kind_of

QueueUsage = list[tuple[int, tuple[float, ...]]]
"""Usage per queue (queue, vector), as `QuotaTree.path_usage` and `transfer` give it."""


class Claim:
    __slots__ = ("state", "victims")

    def __init__(self, state: PassState, victims: Victims) -> None:
        self.state = state
        self.victims = victims

    def claim(self, job: Job, names: Sequence[str], d: tuple[float, ...], chosen: list[Candidate]) -> WaitingForGrace:
        """Signal the new victims of `chosen`, hold `names` for the job (its demand `d`), and
        hand on what the jobs it waits for leave over."""
        state = self.state
        state.claimants.add(job.id)
        etas = self._signal(job, chosen)
        state.claiming(job)
        due = max(etas.values(), default=self.state.now)
        hold = self.state.hold(job, names, due, backfill=False)
        footprints = self._promise(job, names, hold, chosen)
        self._hand_on(chosen, footprints, etas)
        self._charge(job, d, chosen)
        return WaitingForGrace(tuple(etas), due)

    def _signal(self, job: Job, chosen: list[Candidate]) -> dict[str, float]:
        """SIGTERM for the new victims (their usage is leaving: no branch borrows it any more);
        when each job the claimant waits for will be gone."""
        state = self.state
        quota = state.quota
        etas = {}
        for c in chosen:
            v = c.job
            if c.leaving:
                etas[v.id] = c.eta
                continue
            grace = grace_of(state.policy, v)
            kind = state.kinds.get(v.id) or kind_of(job, v)
            state.preemptions.append(Preemption(v.id, job.id, kind, grace, c.cost, c.lost))
            if state.charged(v) and v.queue in quota.paths:
                quota.depart(v.queue, quota.demand(v, state.flavor_of_job[v.id]))
            etas[v.id] = state.now + grace
        return etas

    def _promise(self, job: Job, names: Sequence[str], hold: Hold, chosen: list[Candidate]) -> dict[str, list[Part]]:
        """The rest of the placement comes out of the leaving jobs' capacity: promised to this
        job, never shown free (a `Reserved` check releases only what a hold took from free).
        Each leaving job's footprint, all of which is free for now."""
        index = self.state.index
        rest_of_need = need_of(job, names)
        for node, g, cpu, mem in hold.parts:
            n = rest_of_need[node]
            n[0] -= g
            n[1] -= cpu
            n[2] -= mem
        footprints = {c.job.id: _footprint(c) for c in chosen}
        for parts in footprints.values():
            for part in parts:
                index.give(*part)
        for node, (g, cpu, mem) in rest_of_need.items():
            if g or cpu or mem:
                index.take(node, g, cpu, mem)
        return footprints

    def _hand_on(self, chosen: list[Candidate], footprints: dict[str, list[Part]], etas: dict[str, float]) -> None:
        """What each leaving job holds beyond the promise is taken back from free and kept as
        its rest, which the next job that needs room may count on (`Victims.leaving`)."""
        state = self.state
        for c in chosen:
            job_id = c.job.id
            state.claimed.add(job_id)
            self.victims.claimed(c)
            rest = state.take_free(footprints[job_id])
            if rest:
                state.rests[job_id] = (c.job, tuple(rest), etas[job_id])
            else:
                state.rests.pop(job_id, None)

    def _charge(self, job: Job, d: tuple[float, ...], chosen: list[Candidate]) -> None:
        """The leaving usage this job takes over is charged to it; the rest vanishes at exit and
        the next job waiting on the same exits may count on it."""
        state = self.state
        leaving = [self._leaving_usage(c) for c in chosen]
        if d:
            leaving = state.quota.transfer(job.queue, d, leaving)
            state.memo.quota_version += 1
        for c, left in zip(chosen, leaving):
            state.rest_quota[c.job.id] = left

    def _leaving_usage(self, c: Candidate) -> QueueUsage:
        """The quota usage the candidate's exit gives up: what is left of it after earlier
        claims, or all of its own."""
        state = self.state
        if c.parts is not None:
            return state.rest_quota.get(c.job.id, [])
        v = c.job
        if state.charged(v) and v.queue in state.quota.paths:
            return state.quota.path_usage(v.queue, state.quota.demand(v, state.flavor_of_job[v.id]))
        return []


def _footprint(c: Candidate) -> list[Part]:
    """What the candidate holds (of a job others already count on: what is left of it)."""
    if c.parts is not None:
        return list(c.parts)
    a = c.job.attempt
    assert a is not None
    return [(rp.node, c.job.gpus, c.job.cpu, c.job.memory) for rp in a.assignment]
