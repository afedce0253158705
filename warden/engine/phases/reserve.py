"""Phase 5, reserve: the top blocked jobs hold the capacity that frees first (DESIGN §4.2).

Up to `scheduling.reservations` jobs that neither fit nor can make room look for the earliest
time they would fit (`Reserve.forecast`) and hold the part of that future placement that is
free now; a lower job may start in it only if it ends before the reservation is due, or is
tier 4 (`phases.admit`). Without expected ends nothing can be forecast and nothing is reserved.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from warden.engine.model import Job
from warden.engine.phases.nextstep import NextSteps
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.plan import Reservation
from warden.engine.reasons import Fragmented, InsufficientCapacity, PreemptionWouldNotPay, Reason
from warden.engine.rules import Preemptor, allowed, pair_key, preemptor

INF = math.inf

Freeing = tuple[float, str, Job, bool]
"""(when, job id, job, preempted then): a running job whose capacity a forecast counts on."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """When and where a blocked job would fit first."""

    due: float
    names: tuple[str, ...]
    """Its placement then: one node per replica."""
    waits_for: tuple[Job, ...]
    """The jobs whose exits it waits for, in the order they free capacity."""
    lease_victims: tuple[Job, ...]
    """Those of them it will preempt once their protection lifts."""


class Reserve:
    __slots__ = ("state", "steps", "victims")

    def __init__(self, state: PassState, victims: Victims, steps: NextSteps) -> None:
        self.state = state
        self.victims = victims
        self.steps = steps
        """Names the rule that holds a job waiting for its victims' protection to lift."""

    def attempt(self, job: Job, blocked: Reason, natural: bool = False, first: Forecast | None = None) -> Reason | None:
        """Reserve for the job where capacity frees first (by itself alone, `natural`: the job
        declined to preempt), and say why it waits (`blocked`, with the reservation's due
        time); None when none can be made. `first`: that forecast, where the caller has it
        already for the state the pass is in. (The caller keeps count of
        `scheduling.reservations`.)"""
        state = self.state
        best = first if first is not None else self.earliest(job, state.flavors(job), INF, natural)
        if best is None:
            return None
        state.hold(job, best.names, best.due, backfill=True)
        state.reservations.append(
            Reservation(job.id, best.due, tuple(dict.fromkeys(best.names)), tuple(j.id for j in best.waits_for))
        )
        if best.lease_victims:
            return self.steps.lease(best.lease_victims, best.due)
        if isinstance(blocked, (InsufficientCapacity, Fragmented, PreemptionWouldNotPay)):
            return replace(blocked, reserved_at=best.due)
        return blocked

    def earliest(self, job: Job, flavors: Sequence[str], before: float, natural: bool) -> Forecast | None:
        """`forecast` on whichever of `flavors` frees first (the first flavor on a tie), if
        before `before`."""
        best: Forecast | None = None
        for flavor in flavors:
            found = self.forecast(job, flavor, before if best is None else best.due, natural)
            if found is not None:
                best = found  # strictly earlier than the bound, so than any before it
        return best

    def forecast(self, job: Job, flavor: str, before: float = INF, natural: bool = False) -> Forecast | None:
        """Release jobs in the order they will free capacity until the job fits on `flavor`.
        None when it never fits, or not before `before` (the due time another flavor already
        has). `natural`: count only what frees by itself (jobs leaving, jobs ending), none the
        job would preempt. The state is left as it was."""
        state = self.state
        d = state.demand(job, flavor)
        freeing = self._natural() if natural else self._freeing(preemptor(state.ctx, job, d))
        mark = state.mark()
        released: list[tuple[Job, bool]] = []
        found = None
        now = state.now
        for t, _, v, preempt in freeing:
            if max(t, now) >= before:
                break  # due no earlier than `before`, as is every later release
            state.release_job(v, only=flavor)  # the fit is tested on `flavor` alone
            released.append((v, preempt))
            if state.fits(job, flavor, d):
                names = state.find(flavor, job)
                assert names is not None
                found = Forecast(
                    max(t, now), names, tuple(v for v, _ in released), tuple(v for v, pre in released if pre)
                )
                break
        state.rollback(mark)
        return found

    def _natural(self) -> Iterator[Freeing]:
        """What frees by itself, soonest first (ties by id): terminating jobs nobody counts on
        at their SIGKILL deadline, running ones at their expected end."""
        state = self.state
        index = self.victims.releases()
        claimed, terminating = state.claimed, state.terminating
        jobs = index.jobs
        leaving = self._leaving()
        ending = ((end, i, jobs[i], False) for end, i in index.ending if i not in terminating and i not in claimed)
        return heapq.merge(leaving, ending, key=_time_and_id)

    def _leaving(self) -> list[Freeing]:
        """Terminating jobs nobody counts on yet, by SIGKILL deadline (then id)."""
        state = self.state
        claimed, now = state.claimed, state.now
        leaving: list[Freeing] = []
        for gone in state.terminating.values():
            if gone.id not in claimed:
                kill_at = gone.attempt.kill_at if gone.attempt is not None else None
                leaving.append((now if kill_at is None else kill_at, gone.id, gone, False))
        leaving.sort(key=_time_and_id)
        return leaving

    def _freeing(self, p: Preemptor) -> Iterator[Freeing]:
        """The jobs whose exits free capacity, soonest first (ties by id), each once.

        A terminating job frees its capacity at its SIGKILL deadline; a running one at its
        expected end, or — if P may preempt it (pair rules) and its protection lifts before
        that — when the protection lifts (`now` for a job the rules let go already, its end if
        that is earlier). The running jobs come in those orders from `Allocation.releases`,
        kept sorted between passes, and are merged here, each job taken from the order that
        applies to it: a forecast costs what it releases, not a walk over every running job.
        """
        state = self.state
        index = self.victims.releases()
        # The pair rules read the quota usage, which the releases change: ask them first.
        may = {kind: allowed(state.ctx, p, v) for kind, v in index.kind_jobs().items()}
        claimed, terminating, now = state.claimed, state.terminating, state.now
        jobs, facts = index.jobs, index.facts
        kind_of = pair_key  # what `may` is keyed by: the index's kinds
        leaving = self._leaving()

        def ending() -> Iterator[Freeing]:
            for end, i in index.ending:
                if i in terminating or i in claimed:
                    continue
                protected = facts[i][0]
                v = jobs[i]
                # Taken from the lifting orders instead: its protection lifts before it ends.
                if (0.0 if protected <= now else protected) < end and may[kind_of(v)]:
                    continue
                yield end, i, v, False

        def free(i: str) -> bool:
            return i not in terminating and i not in claimed

        # Only the kinds P may take. Jobs the rules let go count from 0.0: lifted "before" any
        # end after it; one that should have ended already frees at its end, the others now.
        kinds = [kind for kind, ok in may.items() if ok]
        overdue = (
            (end, i, jobs[i], True)
            for end, i in self.victims.overdue()
            if end > 0.0 and may[kind_of(jobs[i])] and free(i)
        )
        lifted = [
            ((now, i, jobs[i], True) for i in index.lifted.get(kind, ()) if _after(facts[i][1], now) and free(i))
            for kind in kinds
        ]
        lifting = [
            ((t, i, jobs[i], True) for t, i in index.protected_of.get(kind, ()) if t < facts[i][1] and free(i))
            for kind in kinds
        ]
        return heapq.merge(leaving, ending(), overdue, *lifted, *lifting, key=_time_and_id)


def _after(end: float, now: float) -> bool:
    """Does a job the rules let go end no earlier than `now` (and after 0.0)?"""
    return end >= now and end > 0.0


def _time_and_id(e: Freeing) -> tuple[float, str]:
    return e[0], e[1]
