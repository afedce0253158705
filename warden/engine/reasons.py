"""Why a job is pending (DESIGN §4.5): one primary reason, a plain sentence, machine details.

Codes are stable: they are shown by the CLI and API and matched by scripts. `details()` is
JSON-ready; `message` is built only when somebody reads it, so a pass over a deep queue stays
cheap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar


def _fmt_t(t: float | None) -> str:
    return "an unknown time" if t is None else f"t={t:.0f}s"


def _reserved_tail(reserved_at: float | None) -> str:
    """The end of a message for a job that may hold a reservation."""
    return "" if reserved_at is None else f"; capacity is reserved for it from {_fmt_t(reserved_at)}"


@dataclass(frozen=True, slots=True)
class Reason:
    code: ClassVar[str] = "Unknown"

    @property
    def message(self) -> str:
        raise NotImplementedError

    def details(self) -> dict[str, Any]:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details()}


@dataclass(frozen=True, slots=True)
class QuotaExceeded(Reason):
    """The job would take a queue on its path past its nominal quota and may not borrow."""

    code: ClassVar[str] = "QuotaExceeded"
    queue: str
    resource: str
    requested: int
    available: int

    @property
    def message(self) -> str:
        return (
            f"Queue {self.queue} has {self.available} {self.resource} left within its quota "
            f"and the job needs {self.requested}."
        )


@dataclass(frozen=True, slots=True)
class BorrowingLimit(Reason):
    """The job would take a queue past nominal + borrowing limit, or past what lenders lend."""

    code: ClassVar[str] = "BorrowingLimit"
    queue: str
    resource: str
    requested: int
    available: int

    @property
    def message(self) -> str:
        return (
            f"Queue {self.queue} can borrow only {self.available} more {self.resource} "
            f"and the job needs {self.requested}."
        )


@dataclass(frozen=True, slots=True)
class InsufficientCapacity(Reason):
    """Not enough free GPUs (of the job's flavor) in the whole cluster."""

    code: ClassVar[str] = "InsufficientCapacity"
    resource: str
    requested: int
    free: int
    reserved_at: float | None = None
    """When this job's reservation is due, if it holds one."""

    @property
    def message(self) -> str:
        tail = _reserved_tail(self.reserved_at)
        return f"The cluster has {self.free} free {self.resource} and the job needs {self.requested}{tail}."


@dataclass(frozen=True, slots=True)
class Fragmented(Reason):
    """Enough free GPUs in total, but no set of nodes satisfies the gang's placement."""

    code: ClassVar[str] = "Fragmented"
    placement: str
    requested: int
    free: int
    largest: int
    """Most GPUs free in one placement domain (a node for `pack`, a block for `block`)."""
    reserved_at: float | None = None

    @property
    def message(self) -> str:
        tail = _reserved_tail(self.reserved_at)
        return (
            f"{self.free} GPUs are free but scattered: no `{self.placement}` placement holds the "
            f"gang's {self.requested} (the largest has {self.largest}){tail}."
        )


@dataclass(frozen=True, slots=True)
class WaitingForLease(Reason):
    """Preempting would make room, but the victims are still inside their lease."""

    code: ClassVar[str] = "WaitingForLease"
    victims: tuple[str, ...]
    earliest_at: float

    @property
    def message(self) -> str:
        return (
            f"The job will preempt {', '.join(self.victims)} when their minimum-runtime lease "
            f"ends at {_fmt_t(self.earliest_at)}."
        )


@dataclass(frozen=True, slots=True)
class PreemptionWouldNotPay(Reason):
    """Preempting would make room, but capacity frees by itself before the preemption would
    be worth what the victims lose (`preemption.only_if_it_pays`)."""

    code: ClassVar[str] = "PreemptionWouldNotPay"
    victims: tuple[str, ...]
    """None when capacity frees before any victim's grace could end: no set was searched."""
    cost: float
    """GPU-seconds the victims would lose: work since their last save, and their restart."""
    frees_at: float
    """When capacity frees by itself: jobs ending, jobs already leaving."""
    reserved_at: float | None = None
    """When this job's reservation is due, if it holds one."""

    @property
    def message(self) -> str:
        tail = _reserved_tail(self.reserved_at)
        if not self.victims:
            return (
                f"Capacity frees by itself at {_fmt_t(self.frees_at)}, before any job preempted now "
                f"could be gone, so the job waits for it{tail}."
            )
        return (
            f"Preempting {', '.join(self.victims)} would throw away {self.cost / 3600:.2f} GPU-hours of "
            f"their work and restarts; capacity frees by itself at {_fmt_t(self.frees_at)}, sooner "
            f"than that is worth, so the job waits for it{tail}."
        )


@dataclass(frozen=True, slots=True)
class WaitingForGrace(Reason):
    """Victims were signalled and are still inside their grace period."""

    code: ClassVar[str] = "WaitingForGrace"
    victims: tuple[str, ...]
    eta: float | None

    @property
    def message(self) -> str:
        return f"Waiting for {', '.join(self.victims)} to exit after SIGTERM (at the latest by {_fmt_t(self.eta)})."


@dataclass(frozen=True, slots=True)
class Reserved(Reason):
    """The capacity the job would fit in is held for a higher-ranked blocked job."""

    code: ClassVar[str] = "Reserved"
    for_job: str
    due: float | None

    @property
    def message(self) -> str:
        return (
            f"The free capacity is reserved for job {self.for_job} (due {_fmt_t(self.due)}) "
            "and this job would not end before then."
        )


@dataclass(frozen=True, slots=True)
class Position(Reason):
    """Strict ordering: jobs ahead of this one must start first."""

    code: ClassVar[str] = "Position"
    n: int
    ahead_by: str
    """The job at the head that blocks the queue."""

    @property
    def message(self) -> str:
        return f"The job is number {self.n} in line behind job {self.ahead_by}, which must start first."


@dataclass(frozen=True, slots=True)
class AwaitingApproval(Reason):
    code: ClassVar[str] = "AwaitingApproval"
    tier: int

    @property
    def message(self) -> str:
        return f"Tier {self.tier} jobs start only after an admin approves them."


@dataclass(frozen=True, slots=True)
class ThrashBackoff(Reason):
    """A requeued job is held back before it may start again."""

    code: ClassVar[str] = "ThrashBackoff"
    until: float

    @property
    def message(self) -> str:
        return f"The job was preempted recently and may start again from {_fmt_t(self.until)}."


@dataclass(frozen=True, slots=True)
class UnknownQueue(Reason):
    """The job names a queue that is not a leaf of the current policy's tree."""

    code: ClassVar[str] = "UnknownQueue"
    queue: str

    @property
    def message(self) -> str:
        return f"Queue {self.queue} is not a team queue of the current policy."


REASON_CODES: tuple[str, ...] = tuple(
    c.code
    for c in (
        QuotaExceeded,
        BorrowingLimit,
        InsufficientCapacity,
        Fragmented,
        WaitingForLease,
        PreemptionWouldNotPay,
        WaitingForGrace,
        Reserved,
        Position,
        AwaitingApproval,
        ThrashBackoff,
        UnknownQueue,
    )
)
