"""The simulator's data: trace jobs going in, per-job and per-attempt records coming out.

Every module of `warden.sim` speaks these types: loaders produce a `Trace`, the event loop
turns it into a `SimRun`, and metrics and reports read only the `SimRun`. Times are seconds
from the start of the trace; GPU amounts are whole GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace, with every optional column resolved to a value.

    Checkpoint behaviour: a `resumable` job resumes from its newest checkpoint after a
    requeue, writes one every `checkpoint_interval` seconds of progress (None: only on
    SIGTERM), each taking `checkpoint_seconds`, and saves on SIGTERM when that save fits its
    grace. A job that is not resumable starts again from zero after every preemption.
    """

    job_id: str
    submit: float
    num_gpus: int
    duration: float
    """Seconds of useful progress the job needs to finish."""
    queue: str = "default"
    tier: int = 3
    user: str = ""
    replicas: int = 1
    gpus_per_replica: int = 1
    lease: float | None = None
    """Requested minimum runtime (None: the tier's)."""
    checkpoint_interval: float | None = None
    checkpoint_seconds: float = 0.0
    startup_seconds: float = 0.0
    resumable: bool = True
    cpu: int = 0
    """Millicores per replica."""
    memory: int = 0
    """MiB per replica."""
    flavor: str | None = None
    """GPU flavor the job asks for (None: any)."""
    duration_basis: str = "observed"
    """What `duration` rests on (`warden.traces.DURATION_BASES`): said by an exported trace,
    never read by the simulator, which runs every job for its `duration`."""
    seq: int = 0
    """Position in the trace after sorting by submit time (then file order): FIFO's tie-break."""


@dataclass(frozen=True)
class Trace:
    """A loaded trace: jobs sorted by (submit, seq), and what loading decided."""

    jobs: tuple[TraceJob, ...]
    source: str
    """The file it came from."""
    format: str
    """native, philly, philly-rfold or pai2023."""
    queues: dict[str, float] = field(default_factory=dict)
    """Nominal GPU quota per queue where the trace comes with one (Philly VCs); else empty."""
    skipped: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    """Rows left out, counted by reason: malformed ones (with `skip_invalid`) and those a
    loader always drops (documented in docs/traces.md)."""
    rules: tuple[str, ...] = ()
    """The documented rules applied to fill what the trace lacks, each in one sentence."""
    seed: int = 0


@dataclass(frozen=True, slots=True)
class PreemptionCause:
    """Who preempted an attempt, and under which rule."""

    by: str
    """The preemptor's trace job id."""
    by_tier: int
    kind: str
    """The engine's `Preemption.kind`: `downward`, `reclaim` or `fair_share`."""
    reserved: bool
    """The preemptor held a reservation in the pass before: it waited for this victim's
    protection to lift (a reservation come due), rather than finding it at once."""


@dataclass(frozen=True, slots=True)
class SimAttempt:
    """One run of a job, from the moment it took its GPUs to the moment it gave them back.

    GPU time is conserved per attempt:
    `ended_at - admitted_at == startup_s + checkpoint_s + useful_s + lost_s + idle_s`.
    """

    number: int
    admitted_at: float
    ended_at: float
    gpus: int
    startup_s: float
    checkpoint_s: float
    """Time spent writing checkpoints (a save cut short by SIGKILL included)."""
    useful_s: float
    """Progress this attempt made that survives (saved, or finished)."""
    lost_s: float
    """Progress this attempt made that a preemption threw away."""
    idle_s: float = 0.0
    """Time the attempt held GPUs without progress (a stranded part of a gang)."""
    preempted: bool = False
    sigterm_at: float | None = None
    borrowing: bool = False
    cause: PreemptionCause | None = None
    """Set on a preempted attempt."""


@dataclass(frozen=True, slots=True)
class SimJob:
    """What happened to one trace job."""

    job_id: str
    queue: str
    tier: int
    user: str
    submit: float
    num_gpus: int
    duration: float
    finished_at: float | None
    """None: the simulation ended before the job finished."""
    wait_s: float
    """Seconds spent waiting (pending or requeued) over all attempts."""
    attempts: tuple[SimAttempt, ...] = ()

    @property
    def preemptions(self) -> int:
        return sum(a.preempted for a in self.attempts)

    @property
    def jct_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.submit


@dataclass(frozen=True)
class SimRun:
    """Everything one simulation produced; metrics and reports are functions of it."""

    policy: str
    trace: str
    seed: int
    gpus: int
    """GPUs in the cluster."""
    jobs: tuple[SimJob, ...]
    started_at: float
    """Time of the first arrival."""
    ended_at: float
    """Time of the last event (the makespan's end)."""
    entitlement: dict[str, float] = field(default_factory=dict)
    """Each leaf queue's share of the cluster it is owed while it has demand (weights,
    normalised to sum 1 over the queues that have any)."""
    max_wait: dict[str, float] = field(default_factory=dict)
    """Per queue, the wait after which a job counts as a starvation breach (absent: none)."""
    charged_tiers: frozenset[int] = frozenset({1, 2, 3, 4})
    """The tiers whose jobs count against quota and fair share (`TierSpec.charged`): only their
    demand is owed GPU-hours, and only their attempts are delivered."""
    wall_s: float = 0.0
    passes: int = 0
    """Scheduling passes the engine ran."""
    engine_s: float = 0.0
    """Of `wall_s`, the time spent inside the engine's passes (`Engine.plan`); the rest is the
    simulator's own event loop and bookkeeping."""
