"""The engine's guard: each pass's call to the engine, told only what changed since its previous
call, and what happens when that call raises.

A pass whose engine call raises is counted (`warden_scheduling_pass_failures_total`) and logged
with the waiting jobs, and changes nothing but the exits; when the next pass fails the same
way, the waiting job that makes it fail is found by halving the waiting jobs and *held* (it
stays waiting, left out of the snapshot, with the reason shown by `describe`) until an admin
releases it or it is cancelled, and the pass goes on without it. The last failure's kind is
kept in memory only: a restart may forget it, and then takes one more failure to hold the job.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from warden.engine import lifecycle
from warden.engine.model import Job, Node, Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.engine.scheduler import Engine
from warden.server.context import Duty, ReconcileContext, log
from warden.store.jobs import ActiveJob

HELD = "Held"
"""The reason code a held job shows instead of the engine's explanation."""
LOGGED_IDS = 20
"""How many job ids a failure's log line names before it counts the rest."""


@dataclass(frozen=True, slots=True)
class PassFailure:
    """How an engine call failed. Two failures are the same when the same exception type was
    raised at the same place: the message may differ (it often names a job or a time)."""

    kind: str
    where: str
    message: str

    @classmethod
    def of(cls, err: BaseException) -> PassFailure:
        frames = traceback.extract_tb(err.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        return cls(type(err).__name__, where, str(err))

    def same_as(self, other: PassFailure | None) -> bool:
        return other is not None and (self.kind, self.where) == (other.kind, other.where)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


class EngineJobs:
    """The jobs of the last snapshot in the engine's form, kept between passes so that a pass
    converts only the rows whose `version` moved, and names the jobs that changed since.

    A job's engine form (`ActiveJob.to_engine`) is a function of its row and its live attempt
    alone, and every write to either bumps the row's `version`: a job at the version it was
    converted at is the same `Job` object as before. A row whose version moved for something
    the engine does not read (its stored explanation) converts to an equal `Job`; the old object
    is kept then and the job does not count as changed.
    """

    __slots__ = ("changed", "jobs")

    def __init__(self) -> None:
        self.jobs: dict[int, tuple[int, Job]] = {}
        """The last snapshot's jobs by store id, each with the version it was converted at."""
        self.changed: list[Job] = []
        """What changed between the two last snapshots (`Engine.plan`'s `changed`): jobs new
        in the last one or converted anew, and the jobs that left it in a terminal state."""

    def update(self, active: Iterable[ActiveJob]) -> tuple[Job, ...]:
        """The engine's jobs of `active`, in its order; `changed` becomes what changed since
        the previous call."""
        known = self.jobs
        current: dict[int, tuple[int, Job]] = {}
        changed: list[Job] = []
        out: list[Job] = []
        for a in active:
            row = a.job
            seen = known.get(row.id)
            if seen is not None and seen[0] == row.version:
                job = seen[1]
            else:
                job = a.to_engine()
                if seen is not None and seen[1] == job:
                    job = seen[1]
                else:
                    changed.append(job)
            current[row.id] = (row.version, job)
            out.append(job)
        if changed or len(current) != len(known):  # else every known job is still here
            changed.extend(lifecycle.left(job) for i, (_, job) in known.items() if i not in current)
        self.jobs, self.changed = current, changed
        return tuple(out)


class EngineGuard(Duty):
    """Owns the engine and what it keeps between passes; plans each snapshot, holding the
    waiting job that makes passes fail."""

    def __init__(self, ctx: ReconcileContext) -> None:
        super().__init__(ctx)
        self.engine = Engine()
        self.engine_jobs = EngineJobs()
        self._planned_on: tuple[tuple[Node, ...], Policy] | None = None
        """The nodes and policy of the last snapshot `jobs` built, once `engine` planned it
        (whole or told what changed); None when its next call must be a full one: it is new, a
        call failed or planned another snapshot, or the last snapshot built never reached it."""
        self._changed: list[Job] | None = None
        """What the engine is told changed in the snapshot `jobs` built last (None: a full
        pass)."""
        self._last_failure: PassFailure | None = None
        """How the previous engine call failed (None: it did not)."""
        self._unattributed: tuple[PassFailure, frozenset[str]] | None = None
        """A failure no single waiting job caused, and the waiting jobs then: not searched
        again until they change."""

    def jobs(self, active: Iterable[ActiveJob]) -> tuple[Job, ...]:
        """The engine's jobs of the next snapshot: every unfinished job but the held ones (each
        converted only when its row moved; `EngineJobs`), planned on the current nodes and
        policy."""
        # Until `plan` hands this snapshot to the engine, its next call must be a full one.
        basis, self._planned_on = self._planned_on, None
        engine_jobs = self.engine_jobs.update(a for a in active if not a.job.held)
        warm = basis is not None and basis == (self.nodes, self.policy)
        self._changed = self.engine_jobs.changed if warm else None
        return engine_jobs

    def plan(self, snapshot: Snapshot, now: float) -> Plan | None:
        """The engine's plan, or None when it raised. A failure like the previous pass's holds
        the waiting job that causes it, and the pass is tried once more without that job; a
        pass therefore holds at most one job, and costs a bounded number of trial passes.

        The engine is told only the jobs that changed since the snapshot of its previous call
        (`EngineJobs.changed`), unless that call failed, planned another snapshot (one without
        a job just held) or other nodes or another policy: then it is given the whole snapshot."""
        changed, self._changed = self._changed, None
        try:
            plan = self.engine.plan(snapshot, now, changed)
            self._planned_on = (snapshot.nodes, snapshot.policy)
        except Exception as err:
            failure = self._failed(err, snapshot)
            repeated = failure.same_as(self._last_failure)
            self._last_failure = failure
            if not repeated:
                return None
            waiting = frozenset(j.id for j in snapshot.jobs if j.state.waiting)
            if (
                self._unattributed is not None
                and failure.same_as(self._unattributed[0])
                and self._unattributed[1] == waiting
            ):
                return None
            culprit = self._culprit(snapshot, now, failure)
            if culprit is None:
                self._unattributed = (failure, waiting)
                log.error(
                    "no single waiting job makes the scheduling pass fail with %s: nobody is held, "
                    "and the pass is retried",
                    failure,
                )
                return None
            self._hold(culprit, failure, now)
            rest = replace(snapshot, jobs=tuple(j for j in snapshot.jobs if j.id != culprit.id))
            try:
                plan = self.engine.plan(rest, now)  # a fresh engine (`_failed`): a full pass
            except Exception as again:
                self._last_failure = self._failed(again, rest)
                return None
            # `_planned_on` stays None: the engine planned `rest`, not the snapshot
            # `engine_jobs` holds, so its next call is a full one.
        self._last_failure = self._unattributed = None
        return plan

    def _failed(self, err: Exception, snapshot: Snapshot) -> PassFailure:
        """Count and log a failed engine call (its traceback when it differs from the previous
        one's); start the next pass from a fresh engine, since what it keeps between passes may
        have been left half updated."""
        self.engine = Engine()
        self._planned_on = None
        failure = PassFailure.of(err)
        self.stats.failures += 1
        if self.metrics is not None:
            self.metrics.pass_failed()
        waiting = [j.id for j in snapshot.jobs if j.state.waiting]
        log.error(
            "scheduling pass failed with %s; it was scheduling %d waiting job(s): %s",
            failure,
            len(waiting),
            _ids(waiting),
            exc_info=None if failure.same_as(self._last_failure) else err,
        )
        return failure

    def _culprit(self, snapshot: Snapshot, now: float, failure: PassFailure) -> Job | None:
        """The waiting job without which the pass does not fail `failure`'s way, found by
        halving: at most 2·log2(waiting) + 2 trial passes, each on a fresh engine. None when
        the pass fails without any waiting job (it is not theirs to fix) or only with several
        of them together."""
        fixed = tuple(j for j in snapshot.jobs if not j.state.waiting)
        suspects: Sequence[Job] = [j for j in snapshot.jobs if j.state.waiting]

        def fails(jobs: Sequence[Job]) -> bool:
            try:
                Engine().plan(replace(snapshot, jobs=fixed + tuple(jobs)), now)
            except Exception as err:
                return PassFailure.of(err).same_as(failure)
            return False

        if not suspects or fails(()) or not fails(suspects):
            return None
        while len(suspects) > 1:
            half = len(suspects) // 2
            if fails(suspects[:half]):
                suspects = suspects[:half]
            elif fails(suspects[half:]):
                suspects = suspects[half:]
            else:
                return None
        return suspects[0]

    def _hold(self, job: Job, failure: PassFailure, now: float) -> None:
        """Quarantine a job: it stays in its waiting state, out of every snapshot, with the
        reason as its event and its explanation, until an admin releases it."""
        reason = f"quarantined: scheduling passes failed with {failure} while this job waited"
        message = (
            f"Held: {reason}. An admin may release it (warden release {job.id}) once the cause "
            "is fixed, or it can be cancelled."
        )
        explanation = {
            "reason": {
                "code": HELD,
                "message": message,
                "details": {"by": "warden", "error": str(failure), "where": failure.where},
            },
            "sort_key": None,
            "position": None,
        }
        held = self.store.flag(
            int(job.id),
            job.state,
            lifecycle.Event.HELD,
            reason=reason,
            now=now,
            given=reason,
            explanation=explanation,
        )
        self._explained.pop(job.id, None)
        if held:
            log.error("job %s held: %s", job.id, reason)


def _ids(ids: Sequence[str]) -> str:
    """Job ids for a log line: the first `LOGGED_IDS`, then how many more."""
    shown = ", ".join(ids[:LOGGED_IDS]) or "none"
    return shown + (f" and {len(ids) - LOGGED_IDS} more" if len(ids) > LOGGED_IDS else "")
