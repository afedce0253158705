"""Why a job is pending (DESIGN §4.5): one primary reason, a plain sentence, machine details.

Codes are stable: they are shown by the CLI and API and matched by scripts. `details()` is
JSON-ready; the sentence is built only when somebody reads it, so a pass over a deep queue stays
cheap. Every sentence ends with what the user can do, worked out from the details (true for the
job it explains, never a stock hint), and names the rule that holds the job.

The engine has no clock, so a sentence writes its times through a `TimeText`: `message` (the
engine's own) writes `t=…s`; `render` takes the writer of the reader's moment: `virtual_times`
("t=900s (in 9m)", the simulator's virtual clock) or the server's wall-clock one
(`warden.server.explanations.wall_times`: "at 14:05 (in 9m)"). `from_dict` rebuilds a reason
from the `{code, details}` a shell stored, so the shell renders it when it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar

from warden.engine.durations import relative, span

TimeText = Callable[[float], str]
"""How a sentence writes a time (seconds on the caller's clock): "t=900s", "14:05 (in 9m)"."""


def engine_time(t: float) -> str:
    """The engine's own way to write a time: its seconds, as the caller's clock counts them."""
    return f"t={t:.0f}s"


def virtual_times(now: float) -> TimeText:
    """The simulator's writer: its virtual seconds and how far they are from `now`."""

    def text(t: float) -> str:
        return f"{engine_time(t)} ({relative(t, now)})"

    return text


def _when(at: TimeText, t: float | None) -> str:
    return "an unknown time" if t is None else at(t)


def _ids(ids: tuple[str, ...], shown: int = 5) -> str:
    """Job ids in a sentence: the first `shown`, then how many more."""
    text = ", ".join(ids[:shown])
    return text if len(ids) <= shown else f"{text} and {len(ids) - shown} more"


def _jobs(ids: tuple[str, ...]) -> str:
    """Job ids in a sentence, said to be jobs ("job 5", "jobs 5, 6"): bare numbers read as
    counts."""
    return f"{'job' if len(ids) == 1 else 'jobs'} {_ids(ids)}"


def _reserved_tail(at: TimeText, reserved_at: float | None) -> str:
    """The end of a message for a job that may hold a reservation."""
    return "" if reserved_at is None else f"; capacity is reserved for it from {at(reserved_at)}"


@dataclass(frozen=True, slots=True)
class Reason:
    code: ClassVar[str] = "Unknown"

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        """The sentence, its times written by `at`; `job_id` names the job where the next step
        is a command about it."""
        raise NotImplementedError

    @property
    def message(self) -> str:
        """The sentence with the engine's times (`t=…s`)."""
        return self.render()

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
    used: int | None = None
    """The queue's usage of the resource as the job was looked at."""
    limit: int | None = None
    """What the queue may use of it (its nominal quota)."""
    frees_at: float | None = None
    """When enough of the queue's usage is expected to end for the job to fit (the expected ends
    of its running jobs), if any is known."""
    frees_by: str | None = None
    """The running job whose expected end frees enough."""
    open_tier: int | None = None
    """A tier not charged to quota (`charged: false`) on whose idle GPUs the job would fit as
    it was looked at; None when there is no such tier or not enough idle GPUs. (How many are
    idle is left out: it moves every pass, and a stored reason is rewritten when it changes.)"""
    """Idle GPUs of the job's flavor as it was looked at."""
    no_borrow_tier: int | None = None
    """The job's tier where it may not borrow (a tier that is not preemptible: what it holds
    could never be taken back, DESIGN §4.2): `limit` is then the queue's nominal, whatever its
    borrowing limit and however much is idle."""
    cluster: bool = False
    """`queue` is the root of the tree: the cluster itself is full (its quota is the capacity).
    The fields below say who borrows, as Kueue names a cohort's borrowing."""
    own_queue: str | None = None
    """cluster: the job's queue."""
    lent: int | None = None
    """cluster: how much of the job's queue's nominal it does not use (others may be using it)."""
    borrowers: tuple[str, ...] = ()
    """cluster: the other team queues holding more than their nominal, the most above it first."""
    borrowed: int | None = None
    """cluster: how much they hold beyond their nominal, together."""
    reclaim_at: float | None = None
    """cluster: when enough of what they borrow is no longer protected (their leases, the
    efficiency floor, the thrash budget) for the job to take it back; None when it cannot."""
    reclaimable: bool | None = None
    """cluster, where others borrow: whether the job may take back what they borrow at all (it
    would be in-quota, and the reclaim rules let it take their jobs); True without `reclaim_at`
    when what it may take would not make room for it."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        if self.cluster:
            return self._render_cluster(at)
        if self.no_borrow_tier is not None:
            head = (
                f"Tier {self.no_borrow_tier} is not preemptible, so its jobs never borrow: queue "
                f"{self.queue} uses {self.used} of its nominal {self.limit} {self.resource} ({self.available} left)"
            )
        elif self.used is None or self.limit is None:
            head = f"Queue {self.queue} has {self.available} {self.resource} left within its quota"
        else:
            head = (
                f"Queue {self.queue} uses {self.used} of its {self.limit} {self.resource} quota ({self.available} left)"
            )
        return f"{head} and the job needs {self.requested}{_quota_next(self, at)}."

    def _render_cluster(self, at: TimeText) -> str:
        """The cluster is full: who borrows from the job's queue, whether and when the job takes
        it back, or that nothing is owed to it."""
        r = self.resource
        if self.available <= 0:
            if self.limit is None or self.used is None or self.used >= self.limit:
                used = f"no {r} is free" if self.limit is None else f"all {self.limit} {r} are in use"
            else:
                used = (
                    f"{self.used} of its {self.limit} {r} are in use and queues keep the other "
                    f"{self.limit - self.used} for themselves (`lending_limit`)"
                )
            head = f"The cluster is full: {used}"
        else:
            head = f"The cluster has {self.available} {r} free" + ("" if self.limit is None else f" of {self.limit}")
        head += f" and the job needs {self.requested}"
        own = self.own_queue or "?"
        if len(self.borrowers) == 1:
            holders = f"queue {self.borrowers[0]} holds {self.borrowed} beyond its nominal"
        else:
            holders = f"queues {_ids(self.borrowers)} hold {self.borrowed} beyond their nominal"
        if self.borrowers and self.lent:
            lending = f"; queue {own} lends the {self.lent} {r} of its nominal it does not use: {holders}"
            if self.reclaim_at is not None:
                lending += f", which the job may take back (reclaim) from {at(self.reclaim_at)}, as their leases end"
            elif self.reclaimable is False:
                lending += ", and the job may not take them back (`preemption.reclaim`)"
            elif self.reclaimable:
                lending += ", but what the job may take back of them would not make room for it"
            else:
                lending += ", and their leases never end (a tier that is not preemptible)"
        elif self.borrowers:
            lending = f"; queue {own} uses all of its nominal, so nothing is owed to the job: {holders}"
        else:
            lending = f"; every queue is within its nominal, queue {own} included"
        return f"{head}{lending}{_quota_next(self, at)}."


@dataclass(frozen=True, slots=True)
class BorrowingLimit(Reason):
    """The job would take a queue past nominal + borrowing limit, or past what lenders lend."""

    code: ClassVar[str] = "BorrowingLimit"
    queue: str
    resource: str
    requested: int
    available: int
    used: int | None = None
    """The queue's usage of the resource as the job was looked at."""
    limit: int | None = None
    """What the queue may use of it: nominal plus borrowing limit."""
    frees_at: float | None = None
    """As `QuotaExceeded.frees_at`."""
    frees_by: str | None = None
    open_tier: int | None = None
    """As `QuotaExceeded.open_tier`."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        usage = "" if self.used is None or self.limit is None else f" (it uses {self.used} of {self.limit})"
        return (
            f"Queue {self.queue} can borrow only {self.available} more {self.resource}{usage} "
            f"and the job needs {self.requested}{_quota_next(self, at)}."
        )


def _quota_next(r: QuotaExceeded | BorrowingLimit, at: TimeText) -> str:
    """What a job held by its queue's quota can do: wait for the queue's job whose expected end
    frees enough, or run now on idle capacity at a tier quota does not charge."""
    cluster = isinstance(r, QuotaExceeded) and r.cluster
    if r.frees_at is not None and r.frees_by is not None:
        of = "" if cluster else " of the queue"
        wait = f"; enough frees at {at(r.frees_at)} when job {r.frees_by}{of} is expected to end"
    else:
        of = "" if cluster else f" of queue {r.queue}"
        wait = f"; no running job{of} has a time limit that says when enough frees"
    if r.open_tier is None:
        return wait
    return f"{wait}, or submit at tier {r.open_tier} to run on idle GPUs now"


@dataclass(frozen=True, slots=True)
class InsufficientCapacity(Reason):
    """Not enough free GPUs (of the job's flavor) in the whole cluster."""

    code: ClassVar[str] = "InsufficientCapacity"
    resource: str
    requested: int
    free: int
    reserved_at: float | None = None
    """When this job's reservation is due, if it holds one."""
    reservations: int | None = None
    """`scheduling.reservations`, where they are all taken."""
    unreserved: str | None = None
    """Why it holds none: "taken" (higher-ranked blocked jobs hold every reservation) or
    "no_forecast" (no time can be forecast: the running jobs it would wait for have no expected
    end); None when it holds one or nothing was asked."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        head = f"The cluster has {self.free} free {self.resource} and the job needs {self.requested}"
        if self.reserved_at is not None:
            return (
                f"{head}; capacity is reserved for it from {at(self.reserved_at)}, when it starts without any action."
            )
        if self.unreserved == "taken":
            if not self.reservations:
                return (
                    f"{head}; no reservation can be taken (`scheduling.reservations` is {self.reservations}), "
                    f"so it starts only once {self.requested} GPUs are free at once."
                )
            return (
                f"{head}; all {self.reservations} reservations (`scheduling.reservations`) are taken by "
                "higher-ranked blocked jobs, so it gets one once they start, or starts when enough frees first."
            )
        if self.unreserved == "no_forecast":
            return (
                f"{head}; there is no forecast of when enough frees (the running jobs it would wait for "
                "have no time limit), so nothing is reserved and it starts as soon as they end."
            )
        return f"{head}."


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
    any_fits: bool = False
    """Would the same gang fit now with `placement: any`?"""
    split_gpus: int | None = None
    """GPUs per replica with which the same total would fit now (`placement: any`): fewer than
    the job asks; None when no such split was found."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        head = (
            f"{self.free} GPUs are free but scattered: no `{self.placement}` placement holds the "
            f"gang's {self.requested} (the largest has {self.largest})"
        )
        if self.any_fits:
            step = "; it would fit now with `--placement any`"
        elif self.split_gpus is not None:
            step = f"; it would fit now as replicas of {self.split_gpus} GPUs each with `--placement any`"
        else:
            step = ""
        return f"{head}{step}{_reserved_tail(at, self.reserved_at)}."


@dataclass(frozen=True, slots=True)
class WaitingForLease(Reason):
    """Preempting would make room, but the victims are still protected: by their lease, by the
    efficiency floor that stretches it, or by their thrash budget (`rule`, the one that lifts
    last, with its inputs)."""

    code: ClassVar[str] = "WaitingForLease"
    victims: tuple[str, ...]
    earliest_at: float
    rule: str = "lease"
    """The victim rule that holds the job longest: "lease", "efficiency" or "thrash_budget"."""
    victim: str | None = None
    """The victim it holds."""
    lease_s: float | None = None
    """That victim's lease (its own request, else its tier's)."""
    startup_s: float | None = None
    """efficiency: the victim's startup the floor counts, measured or assumed."""
    startup_measured: bool | None = None
    """efficiency: True when the victim reported it, False when it is `preemption.restart_overhead`."""
    checkpoint_s: float | None = None
    """efficiency: the one save the floor counts for the victim (`accounting.assumed_checkpoint`)."""
    min_efficiency: float | None = None
    """efficiency: `thrash.min_efficiency`."""
    thrash_count: int | None = None
    """thrash_budget: `thrash.max_preemptions.count`, used up within the window."""
    thrash_window_s: float | None = None
    """thrash_budget: `thrash.max_preemptions.per`."""
    checkpoint_measured: bool | None = None
    """efficiency: True when `checkpoint_s` is the victim's last measured save; False when the attempt
    has saved nothing yet and it is the save a preemption forces, reported or assumed."""
    save_measured: bool | None = None
    """efficiency, before the victim's first save: True when that save's duration is the
    victim's own (reported, or given by its trace), False when it is
    `preemption.checkpoint_overhead`."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        when = at(self.earliest_at)
        who = _jobs(self.victims)
        v = self.victim or (self.victims[-1] if self.victims else "?")
        lease = "" if self.lease_s is None else f" of {span(self.lease_s)}"
        tail = "; capacity is reserved for the job, so it starts then without any action"
        if self.rule == "efficiency" and self.startup_s is not None:
            return (
                f"The job will preempt {who} at {when}, when job {v}'s efficiency floor lifts: its lease{lease} "
                f"ends before that, but with {self._overheads(v)} a preemption sooner would push its η below "
                f"{self.min_efficiency:g} (`thrash.min_efficiency`){tail}."
            )
        if self.rule == "thrash_budget" and self.thrash_count is not None and self.thrash_window_s is not None:
            return (
                f"The job will preempt {who} at {when}, when job {v}'s thrash budget allows it again: "
                f"it was preempted {self.thrash_count} times within {span(self.thrash_window_s)} "
                f"(`thrash.max_preemptions`){tail}."
            )
        return f"The job will preempt {who} when job {v}'s minimum-runtime lease{lease} ends at {when}{tail}."

    def _overheads(self, v: str) -> str:
        """The startup and checkpoint time the efficiency floor counts, and where each is from."""
        startup_s, checkpoint_s = self.startup_s or 0.0, self.checkpoint_s or 0.0
        if self.startup_measured:
            startup = f"its measured startup of {span(startup_s)}"
        else:
            startup = (
                f"an assumed startup of {span(startup_s)} (`preemption.restart_overhead`: job {v} has reported none)"
            )
        if self.checkpoint_measured is None:  # a reason stored before the floor counted a save
            checkpoint = f"{span(checkpoint_s)} of checkpoints"
        elif self.checkpoint_measured:
            checkpoint = f"one save of {span(checkpoint_s)}, as long as its last measured save took"
        elif self.save_measured:
            checkpoint = f"one save of {span(checkpoint_s)}, as long as its reported save takes"
        else:
            checkpoint = (
                f"an assumed save of {span(checkpoint_s)} (`preemption.checkpoint_overhead`: job {v} has reported none)"
            )
        return f"{startup} and {checkpoint}"


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

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        tail = _reserved_tail(at, self.reserved_at)
        if not self.victims:
            return (
                f"Capacity frees by itself at {at(self.frees_at)}, before any job preempted now "
                f"could be gone, so the job waits for it (`preemption.only_if_it_pays`){tail}."
            )
        return (
            f"Preempting {_jobs(self.victims)} would throw away {self.cost / 3600:.2f} GPU-hours of "
            f"their work and restarts; capacity frees by itself at {at(self.frees_at)}, sooner "
            f"than that is worth, so the job waits for it (`preemption.only_if_it_pays`){tail}."
        )


@dataclass(frozen=True, slots=True)
class WaitingForGrace(Reason):
    """Victims were signalled and are still inside their grace period."""

    code: ClassVar[str] = "WaitingForGrace"
    victims: tuple[str, ...]
    eta: float | None

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        return (
            f"Waiting for {_jobs(self.victims)} to exit after SIGTERM (at the latest by {_when(at, self.eta)}); "
            f"{'its' if len(self.victims) == 1 else 'their'} GPUs are claimed for the job, so it starts then "
            "without any action."
        )


@dataclass(frozen=True, slots=True)
class Reserved(Reason):
    """The capacity the job would fit in is held for a higher-ranked blocked job."""

    code: ClassVar[str] = "Reserved"
    for_job: str
    due: float | None
    backfill_s: float | None = None
    """A runtime estimate (`--time-limit`) shorter than this lets the job start now in the held
    capacity (it would end before every hold is due); None when no estimate would."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        head = (
            f"The free capacity is reserved for job {self.for_job} (due {_when(at, self.due)}) "
            "and this job would not end before then"
        )
        if self.backfill_s is None:
            return f"{head}."
        return f"{head}; a time limit under {span(self.backfill_s)} (`--time-limit`) would let it start now in that capacity."


@dataclass(frozen=True, slots=True)
class Claimed(Reason):
    """The job would borrow quota that a tier-1 job of a queue it shares counts on: that job
    preempted jobs to start within its nominal quota, and a borrower started there now would
    be preempted for it again at once."""

    code: ClassVar[str] = "Claimed"
    for_job: str

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        return (
            f"The job would borrow quota that job {self.for_job} needs: it preempted jobs to start "
            "within its queue's nominal quota and waits for them to leave; no job of that queue "
            "starts borrowing until it has: the job starts then, or at once within its queue's "
            "nominal quota."
        )


@dataclass(frozen=True, slots=True)
class Position(Reason):
    """Strict ordering: jobs ahead of this one must start first."""

    code: ClassVar[str] = "Position"
    n: int
    ahead_by: str
    """The job at the head that blocks the queue."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        return (
            f"The job is number {self.n} in line behind job {self.ahead_by}, which must start first "
            "(`scheduling.head_of_line_blocking`); it moves once that job starts."
        )


@dataclass(frozen=True, slots=True)
class AwaitingApproval(Reason):
    code: ClassVar[str] = "AwaitingApproval"
    tier: int

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        command = "`warden approve` with the job's id" if job_id is None else f"`warden approve {job_id}`"
        return f"Tier {self.tier} jobs start only after an admin approves them: an admin runs {command}."


@dataclass(frozen=True, slots=True)
class ThrashBackoff(Reason):
    """A requeued job is held back before it may start again."""

    code: ClassVar[str] = "ThrashBackoff"
    until: float

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        return (
            f"The job was preempted recently and may start again from {at(self.until)} "
            "(`thrash.requeue_backoff`); it is scheduled then without any action."
        )


@dataclass(frozen=True, slots=True)
class UnknownQueue(Reason):
    """The job names a queue that is not a leaf of the current policy's tree."""

    code: ClassVar[str] = "UnknownQueue"
    queue: str
    queues: tuple[str, ...] = ()
    """The team (leaf) queues the policy has, by name."""

    def render(self, at: TimeText = engine_time, job_id: str | None = None) -> str:
        head = f"Queue {self.queue} is not a team queue of the current policy"
        if not self.queues:
            return f"{head}."
        return f"{head}; submit it again to one that is: {_ids(self.queues, 8)}."


_CLASSES: tuple[type[Reason], ...] = (
    QuotaExceeded,
    BorrowingLimit,
    InsufficientCapacity,
    Fragmented,
    WaitingForLease,
    PreemptionWouldNotPay,
    WaitingForGrace,
    Reserved,
    Claimed,
    Position,
    AwaitingApproval,
    ThrashBackoff,
    UnknownQueue,
)
REASON_CODES: tuple[str, ...] = tuple(c.code for c in _CLASSES)
_BY_CODE: dict[str, type[Reason]] = {c.code: c for c in _CLASSES}


def from_dict(stored: Mapping[str, Any]) -> Reason | None:
    """The reason a shell stored as `to_dict()` (its `code` and `details`), rebuilt so it can be
    rendered anew; None for a code the engine does not give (a shell's own, such as a held
    job's) or details that do not fit it. Detail keys the class lacks are left out, lists become
    tuples, and a field a stored row lacks takes its default."""
    cls = _BY_CODE.get(str(stored.get("code")))
    details = stored.get("details")
    if cls is None or not isinstance(details, Mapping):
        return None
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in details:
            value = details[f.name]
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
        elif f.default is MISSING:
            return None
    try:
        return cls(**kwargs)
    except TypeError:
        return None
