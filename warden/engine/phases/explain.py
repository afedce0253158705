"""Phase 6, explain: every waiting job that is not admitted gets one reason, its sort key and its
position (DESIGN §4.5), and the pass's plan is put together.

The walk over the ranking is where each job gets its reason: from a gate (approval, thrash
backoff, a blocked head under head-of-line blocking), from a job like it that already failed in
the pass, or from deciding it anew (`Cycle.decide`: admit, preempt, reserve). A job like one
that already failed — same queue, tier, shape and runtime estimate, at least its CPU and
memory — fails the same way: free capacity, and free plus held capacity, only shrank and quota
usage only grew since. Its reason is reused, which is what keeps a deep queue cheap. `Reserved`
depends on which holds exist and says the job would fit without them, so only an identical job
reuses it while the holds are unchanged; where quota governs CPU or memory the reason names
the amounts asked, so the same goes there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from warden.engine.model import Job, JobState
from warden.engine.phases.memo import Outcome, OutcomeKey, Usable
from warden.engine.phases.order import Ranked
from warden.engine.phases.state import PassState
from warden.engine.plan import Explanation, Plan
from warden.engine.reasons import (
    AwaitingApproval,
    Position,
    Reason,
    Reserved,
    ThrashBackoff,
    WaitingForGrace,
    WaitingForLease,
)

_AWAITING = JobState.AWAITING_APPROVAL
_UNKNOWN: Any = object()
"""No remembered outcome applies (a sentinel, never in a plan)."""
_FRONTS_KEPT = 8
"""Outcomes remembered per key: a deep queue of one shape asks a few (CPU, memory) sizes."""


class Explain:
    __slots__ = ("approval", "memo", "state")

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo
        self.approval: dict[int, Reason] = {}
        """One `AwaitingApproval` per tier: the reason is the same for every job of it."""

    def walk(self, ranking: Iterable[Ranked], decide: Callable[[Job], Reason | None]) -> dict[str, Explanation]:
        """Every waiting job in order, with its reason: a gate's, a remembered one, or
        `decide`'s (None: admitted). The explanations of those that wait.

        The outcome cache is read here, inline, rather than in a call: it answers most jobs of
        a deep queue, and a call per job is a sizeable share of a pass.
        """
        state, memo = self.state, self.memo
        strict = state.policy.scheduling.head_of_line_blocking
        head: Job | None = None
        explanations: dict[str, Explanation] = {}
        new = tuple.__new__  # Explanation's own constructor is a Python function; this is C
        now = state.now
        outcomes = memo.outcomes
        governed = state.cpu_memory_governed
        reserved = state.reserved  # grows in place during the pass
        for position, (_, _, _, _, key, job) in enumerate(ranking, 1):
            reason: Reason | None
            if job.state is _AWAITING or head is not None or (job.not_before is not None and job.not_before > now):
                reason = self._gated(job, head, position)
            else:
                if not reserved:
                    usable: Usable = None
                elif len(reserved) == 1:  # `usable`, inlined for the usual case
                    if job.tier == 4:
                        usable = True
                    elif job.expected_duration is None:
                        usable = False
                    else:
                        due = reserved[0].due
                        usable = due is not None and now + job.expected_duration <= due
                else:
                    usable = self.usable(job)
                okey = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, usable)
                fronts = outcomes.get(okey)
                reason = _UNKNOWN
                if fronts is not None:
                    # A job asking at least the CPU and memory of one that failed fails too.
                    job_cpu, job_memory = job.cpu, job.memory
                    for cpu, memory, version, known in fronts:
                        if version == -1:
                            if (
                                (job_cpu == cpu and job_memory == memory)
                                if governed
                                else (job_cpu >= cpu and job_memory >= memory)
                            ):
                                reason = known
                                break
                        elif version == memo.hold_version and job_cpu == cpu and job_memory == memory:
                            reason = known
                            break
                if reason is _UNKNOWN:
                    reason = decide(job)
                    self._remember(job, okey, fronts, reason)
                if reason is not None and strict:
                    head = job
            if reason is not None:
                explanations[job.id] = new(Explanation, (job.id, reason, key, position))
        return explanations

    def _gated(self, job: Job, head: Job | None, position: int) -> Reason:
        """Why a job that is not considered at all waits: it awaits approval, it is held back
        after its last preemption, or (head-of-line blocking) a job ahead of it is blocked."""
        if job.state is _AWAITING:
            approval = self.approval.get(job.tier)
            if approval is None:
                approval = self.approval[job.tier] = AwaitingApproval(job.tier)
            return approval
        if job.not_before is not None and job.not_before > self.state.now:
            return ThrashBackoff(job.not_before)
        assert head is not None
        return Position(position, head.id)

    def _remember(self, job: Job, key: OutcomeKey, fronts: list[Outcome] | None, reason: Reason | None) -> None:
        """Remember why the job failed under `key` (`fronts`: what is remembered there already).

        Not remembered: an admission, a reason that names victims (their state is the job's
        own) and one that names a reservation's due time (the job's own reservation)."""
        if (
            reason is not None
            and not isinstance(reason, (WaitingForGrace, WaitingForLease))
            and getattr(reason, "reserved_at", None) is None
        ):
            entry = (job.cpu, job.memory, self.memo.hold_version if isinstance(reason, Reserved) else -1, reason)
            if fronts is None:
                self.memo.outcomes[key] = [entry]
            elif len(fronts) < _FRONTS_KEPT:
                fronts.append(entry)

    def usable(self, job: Job) -> Usable:
        """Which reservations the job may backfill: all that its runtime estimate matters for.

        Jobs that end at different times but before (or after) the same reservations are due
        fail the same way, so they share one remembered outcome. With one reservation (the
        default) the answer is a bool rather than a 1-tuple: one allocation less per job
        (`walk` works that case out inline, the same way, and the case of none)."""
        reserved = self.state.reserved
        now = self.state.now
        if len(reserved) == 1:
            if job.tier == 4:
                return True
            if job.expected_duration is None:
                return False
            due = reserved[0].due
            return due is not None and now + job.expected_duration <= due
        if job.tier == 4:
            return (True,) * len(reserved)
        if job.expected_duration is None:
            return (False,) * len(reserved)
        ends = now + job.expected_duration
        return tuple([h.due is not None and ends <= h.due for h in reserved])

    def plan(self, explanations: dict[str, Explanation]) -> Plan:
        """The pass's plan. A job waiting for its victims holds a claim into the next pass; a
        claimant that waits for nothing any more lets its claim go."""
        state = self.state
        claims = frozenset(state.claimants)
        return Plan(
            now=state.now,
            admissions=tuple(state.admissions),
            preemptions=tuple(state.preemptions),
            reservations=tuple(state.reservations),
            explanations=explanations,
            claims=claims,
            released_claims=tuple(sorted(i for i in state.claims if i in explanations and i not in claims)),
        )
