"""What the engine answers: admissions, preemptions, reservations and explanations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from warden.engine.model import ReplicaPlacement
from warden.engine.reasons import Reason


class SortKey(NamedTuple):
    """A pending job's rank (DESIGN §4.1); smaller sorts first. Shown to users as is.

    A named tuple, not a dataclass: a pass over 100,000 pending jobs builds one per job.
    `fair_rank` is the position of the job's leaf queue in the Fair Tree walk and `fair_share`
    the usage/entitlement ratios on its path from the root down (never compared: `id` is unique).
    """

    tier: int
    borrows: int
    """1 when the job would borrow and its policy ranks such jobs after the others of their tier
    (`nominal_first`), else 0."""
    breach: int
    """0 when the job has waited past its queue's max_wait, 1 when only past
    `fair_share.aging.escalate_at` of it (both are starving and go first in their tier), else 2."""
    fair_rank: int
    neg_waited: float
    submit: float
    id: str
    fair_share: tuple[float, ...] = ()

    @property
    def waited(self) -> float:
        return -self.neg_waited

    def to_dict(self) -> dict[str, Any]:
        return {
            "would_borrow": self.borrows == 1,
            "tier": self.tier,
            "starvation_breach": self.breach == 0,
            "starving": self.breach <= 1,
            "fair_rank": self.fair_rank,
            "fair_share": list(self.fair_share),
            "waited_s": self.waited,
            "submit": self.submit,
            "id": self.id,
        }


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: str
    placement: tuple[ReplicaPlacement, ...]
    flavor: str
    borrowing: bool
    """True when the job runs above its queue's nominal quota (reclaimable)."""
    lent: bool = False
    """True when it starts in capacity reserved for a higher-ranked job that may take it back
    when the reservation is due (`Attempt.lent`): the shell records it on the attempt."""


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    for_job: str
    kind: str
    """`downward` (strictly lower tier, by priority), `reclaim` (nominal reclaim: capacity borrowed
    from the preemptor's side) or `fair_share` (fair-share reclaim between borrowers)."""
    grace: float
    cost: float
    """Lost work + restart overhead, in GPU-seconds (DESIGN §4.4)."""
    lost_work: float


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    due: float | None
    """When the reserved capacity is expected to be free (None: unknown)."""
    nodes: tuple[str, ...]
    waits_for: tuple[str, ...] = ()
    signal_at: float | None = None
    """When the job will next preempt a job of a lower tier in this capacity, so that it is gone
    by `due` (at due − that job's grace, DESIGN §4.2; None: it will not): a shell runs a pass
    then, as at `due`."""


class Explanation(NamedTuple):
    """Why one waiting job did not start in this pass, and where it stands."""

    job_id: str
    reason: Reason
    sort_key: SortKey
    position: int
    """1-based rank among all waiting jobs of the pass."""


@dataclass(frozen=True, slots=True)
class Plan:
    now: float
    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    explanations: Mapping[str, Explanation] = field(default_factory=dict)
    """Every waiting job not admitted, in rank order; worked out when first read
    (`phases.explain.Explanations`)."""
    claims: frozenset[str] = frozenset()
    """Waiting jobs that, after this pass, wait for capacity their victims are freeing (their
    reason is `WaitingForGrace`). A shell marks exactly these jobs `Job.claim` for the next pass,
    and no others: the capacity stays theirs until they are admitted."""
    released_claims: tuple[str, ...] = ()
    """Jobs that held a claim coming into this pass and neither were admitted nor hold one now:
    they no longer need what their victims free, which is open to every job again."""
