"""What would happen to a job if it were submitted now: the engine's answer, nothing changed.

`what_if` adds the job to a snapshot and plans it exactly as a pass would (`schedule`: the
warm engine of a shell gives the same plan), then reads the plan for that job alone: it would
start now (where), or preempt (whom, what they lose, when they are gone), or wait (its reason,
position and expected start, `warden.engine.forecast`). A submission of the same job on the
same snapshot at the same `now` gets the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from warden.engine.accounting import predicted_lost_work
from warden.engine.forecast import Estimate, expected_starts
from warden.engine.model import Job, ReplicaPlacement, Snapshot
from warden.engine.plan import Explanation
from warden.engine.reasons import WaitingForLease
from warden.engine.rules import grace_of, startup_of
from warden.engine.scheduler import schedule

Decision = Literal["start", "preempt", "wait"]


@dataclass(frozen=True, slots=True)
class Victim:
    """A running job the new one would preempt."""

    job_id: str
    queue: str
    tier: int
    gpus: int
    signal_at: float
    """When it gets SIGTERM: now, or when its protection (lease, efficiency floor) lifts."""
    gone_by: float
    """Its SIGKILL deadline: the capacity is free by then at the latest."""
    lost_work: float
    """GPU-seconds of its work a preemption at `signal_at` throws away (DESIGN §4.4)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The engine's decision for one job, as a pass would make it."""

    job_id: str
    decision: Decision
    placement: tuple[ReplicaPlacement, ...] = ()
    """Where it starts (`start`)."""
    borrowing: bool = False
    victims: tuple[Victim, ...] = ()
    """Whom it preempts (`preempt`), or will preempt once their protection lifts (`wait`
    with `WaitingForLease`)."""
    explanation: Explanation | None = None
    """Why it waits (`preempt`: it waits for its victims to leave; `wait`)."""
    expected_start: Estimate | None = None
    """When it is expected to start (`start`: now)."""


def what_if(snapshot: Snapshot, job: Job, now: float, forecast_passes: int | None = None) -> Verdict:
    """The decision a pass at `now` makes for `job` added to `snapshot` (whose jobs must not
    include it). `forecast_passes` bounds the expected start's forecast."""
    if any(j.id == job.id for j in snapshot.jobs):
        raise ValueError(f"job {job.id} is in the snapshot already")
    trial = replace(snapshot, jobs=(*snapshot.jobs, job))
    plan = schedule(trial, now)
    admitted = next((a for a in plan.admissions if a.job_id == job.id), None)
    if admitted is not None:
        return Verdict(job.id, "start", admitted.placement, admitted.borrowing, expected_start=Estimate(now))
    by_id = {j.id: j for j in trial.jobs}
    explanation = plan.explanations.get(job.id)
    kw = {} if forecast_passes is None else {"max_passes": forecast_passes}
    estimate = expected_starts(trial, now, (job.id,), **kw).starts.get(job.id)
    victims = tuple(
        _victim(by_id[p.job_id], now, now + p.grace, p.lost_work) for p in plan.preemptions if p.for_job == job.id
    )
    later: tuple[Victim, ...] = ()
    if explanation is not None and isinstance(explanation.reason, WaitingForLease):
        # A reservation signals some victims now and the rest when their time comes: its reason
        # names them all, and so does the verdict (what it says it preempts, it preempts).
        at = explanation.reason.earliest_at
        now_ids = {v.job_id for v in victims}
        later = tuple(
            _lease_victim(trial, by_id[v], at) for v in explanation.reason.victims if v in by_id and v not in now_ids
        )
    if victims:
        return Verdict(job.id, "preempt", victims=victims + later, explanation=explanation, expected_start=estimate)
    if later:
        return Verdict(job.id, "wait", victims=later, explanation=explanation, expected_start=estimate)
    return Verdict(job.id, "wait", explanation=explanation, expected_start=estimate)


def _victim(v: Job, signal_at: float, gone_by: float, lost_work: float) -> Victim:
    return Victim(v.id, v.queue, v.tier, v.total_gpus, signal_at, gone_by, lost_work)


def _lease_victim(snapshot: Snapshot, v: Job, signal_at: float) -> Victim:
    """A victim to be signalled once its protection lifts at `signal_at`, priced then."""
    policy = snapshot.policy
    grace = grace_of(policy, v)
    a = v.attempt
    lost = 0.0
    if a is not None:
        lost = predicted_lost_work(
            v.total_gpus, signal_at, a.started_at, startup_of(policy, v), a.last_checkpoint_at, a.sigterm_save_s, grace
        )
    return _victim(v, signal_at, signal_at + grace, lost)
