"""The job lifecycle of DESIGN §5, as data and as the functions that move a job along it.

`EDGES` is the state machine: each event with the states it may leave and the states it may
reach. The store refuses a transition the table lacks (`check`). An event that changes more
than the state has a function below, and the server, the simulator, the forecast and the
benchmarks move a job through it, so the shells cannot drift apart: what a requeue does to a job
(its attempt closed, the thrash guard's record of the preemption, the back-off, its age) is
written once, here. An event that changes the state alone (approved, launched, started,
cancelled) is the table's edge and nothing more: the store's check is its whole rule.

`FLAGS` are the events that leave the state as it is and change a flag the passes read: a hold
and its release, a cancel's mark, a claim and its end, a time limit run out. Each names the
states it may happen in and the columns it sets, so a flag changes one way only (`flagged`,
which the store applies) and never through the generic note, which changes no flag.

The shells differ in what they know, and those differences are the functions' arguments: the
server admits a job before its processes exist (`starts=False`, ADMITTED then STARTING and
RUNNING as the executor reports them) and passes a requeue through REQUEUED in its own
transaction, so that a cancel landing in between ends the job; the simulator and the forecast
start an admitted job at once and requeue it in one step (`exited` then `requeued`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from warden.engine.model import Attempt, Job, JobState

_S = JobState
HOLDING = frozenset(s for s in JobState if s.holds_resources)
WAITING = frozenset(s for s in JobState if s.waiting)
TERMINAL = frozenset(s for s in JobState if s.terminal)


class Event(str, Enum):
    """What happened to a job; each is an edge (or a set of edges) of the state machine."""

    SUBMITTED = "submitted"
    APPROVED = "approved"
    ADMITTED = "admitted"
    LAUNCHED = "launched"
    STARTED = "started"
    SIGNALLED = "signalled"
    EXITED = "exited"
    REQUEUED = "requeued"
    UNSTARTED = "unstarted"
    CANCELLED = "cancelled"
    NOTED = "noted"
    HELD = "held"
    RELEASED = "released"
    CANCEL_MARKED = "cancel_marked"
    CLAIMED = "claimed"
    CLAIM_ENDED = "claim_ended"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class Edge:
    """An event, the states it may leave (empty: the job is created by it) and those it may
    reach; `why` is the sentence docs/engine.md shows."""

    event: Event
    source: frozenset[JobState]
    target: frozenset[JobState]
    why: str
    sets: tuple[tuple[str, object], ...] = ()
    """The job's flags the event sets, as column and value, beside the state (`sets`)."""


EDGES: tuple[Edge, ...] = (
    Edge(
        Event.SUBMITTED,
        frozenset(),
        frozenset({_S.AWAITING_APPROVAL, _S.PENDING}),
        "a job is created, AWAITING_APPROVAL where its tier needs an admin's approval",
    ),
    Edge(Event.APPROVED, frozenset({_S.AWAITING_APPROVAL}), frozenset({_S.PENDING}), "an admin approved it"),
    Edge(
        Event.ADMITTED,
        frozenset({_S.PENDING, _S.REQUEUED}),
        frozenset({_S.ADMITTED, _S.RUNNING}),
        "a pass admitted it: ADMITTED where processes start later (server), RUNNING where they "
        "start at once (simulator, forecast)",
    ),
    Edge(Event.LAUNCHED, frozenset({_S.ADMITTED}), frozenset({_S.STARTING}), "handed to the executor"),
    Edge(Event.STARTED, frozenset({_S.STARTING}), frozenset({_S.RUNNING}), "its processes run"),
    Edge(
        Event.SIGNALLED,
        frozenset({_S.ADMITTED, _S.STARTING, _S.RUNNING}),
        frozenset({_S.PREEMPTING}),
        "SIGTERM for a preemption or reclaim: its grace runs, SIGKILL at the deadline",
    ),
    Edge(
        Event.EXITED,
        HOLDING,
        frozenset({_S.REQUEUED, *TERMINAL}),
        "its processes are gone: REQUEUED after SIGTERM or an eviction, CANCELLED once a cancel "
        "marked it, TIMEOUT once it ran out its time limit, else by the exit codes (a launch that "
        "failed is FAILED)",
    ),
    Edge(Event.REQUEUED, frozenset({_S.REQUEUED}), frozenset({_S.PENDING}), "back in the queue, age kept"),
    Edge(
        Event.UNSTARTED,
        HOLDING,
        frozenset({_S.PENDING}),
        "the server stopped before the job's processes started: admitted again later",
    ),
    Edge(
        Event.CANCELLED,
        WAITING,
        frozenset({_S.CANCELLED}),
        "cancelled while it waited",
        (("cancel_requested", True), ("held_reason", None)),
    ),
)

NOTED = Edge(
    Event.NOTED,
    frozenset(JobState),
    frozenset(JobState),
    "an event that changes neither the state nor a flag (a SIGTERM for a cancel or a time "
    "limit, a clamped report, a stop of its processes): its state stays what it is",
)


class Given(Enum):
    """The value of a flag that its event carries (a hold's reason), not one the table fixes."""

    VALUE = "given"


GIVEN = Given.VALUE


@dataclass(frozen=True, slots=True)
class Flag:
    """An event that keeps the job's state and changes flags: the states it may happen in, the
    columns it sets to which value (`GIVEN`: the caller's), on the job or, with `attempt`, on
    its current attempt; `why` is the sentence docs/engine.md shows."""

    event: Event
    states: frozenset[JobState]
    sets: tuple[tuple[str, object], ...]
    why: str
    attempt: bool = False


FLAGS: tuple[Flag, ...] = (
    Flag(
        Event.HELD,
        WAITING,
        (("held_reason", GIVEN),),
        "the engine guard held it out of scheduling, for the reason given, until an admin releases it",
    ),
    Flag(Event.RELEASED, WAITING, (("held_reason", None),), "an admin released it: scheduled again"),
    Flag(
        Event.CANCEL_MARKED,
        HOLDING,
        (("cancel_requested", True),),
        "a cancel marked it: SIGTERM, grace, SIGKILL, and its exit ends it CANCELLED",
    ),
    Flag(Event.CLAIMED, WAITING, (("claim", True),), "it claims the capacity its victims are freeing"),
    Flag(Event.CLAIM_ENDED, WAITING, (("claim", False),), "its claim is over"),
    Flag(
        Event.TIMED_OUT,
        HOLDING,
        (("timed_out", True),),
        "its attempt ran out its time limit: SIGTERM, grace, SIGKILL, and its exit ends it TIMEOUT",
        attempt=True,
    ),
)

FLAG_COLUMNS = frozenset(c for f in FLAGS for c, _ in f.sets) | frozenset(c for e in EDGES for c, _ in e.sets)
"""The columns only the lifecycle's events set: no other write of an event may name them."""

CARRIED_FLAGS = frozenset({"claim"})
"""The flags a state edge's function changes on the engine's `Job` as well (an admission or a
requeue ends a claim), which the store writes as that function's result (`jobs.moved`)."""


class IllegalTransition(ValueError):
    """A change of state the lifecycle has no edge for: a bug in the caller, never user input."""


_BY_EVENT = {e.event: e for e in EDGES}
_FLAG_BY_EVENT = {f.event: f for f in FLAGS}


def check(event: Event, source: JobState | None, target: JobState) -> None:
    """Raise IllegalTransition unless `event` may move a job from `source` (None: a new job) to
    `target`."""
    if not allows(event, source, target):
        raise IllegalTransition(f"no {event.value} edge from {source.value if source else 'nothing'} to {target.value}")


def allows(event: Event, source: JobState | None, target: JobState) -> bool:
    """Has the table an `event` edge from `source` (None: a new job) to `target`?"""
    if event is Event.NOTED:
        return source is not None and source is target
    f = _FLAG_BY_EVENT.get(event)
    if f is not None:
        return source is target and source in f.states
    e = _BY_EVENT[event]
    leaves = not e.source if source is None else source in e.source
    return leaves and target in e.target


def sets(event: Event) -> dict[str, object]:
    """The flags a change of state by `event` sets beside the state (a cancel's mark): what the
    store writes with it."""
    e = _BY_EVENT.get(event)
    return dict(e.sets) if e is not None else {}


def flag(event: Event) -> Flag:
    """The table's entry for the flag event `event` (KeyError for an event that is none)."""
    return _FLAG_BY_EVENT[event]


def flagged(event: Event, state: JobState, given: object = None) -> dict[str, object]:
    """The columns the flag event `event` sets on a job in `state` (on its current attempt where
    the table says so), `given` the value of a column the event carries: what the store
    writes, and nothing else. Raises IllegalTransition where the event may not happen in
    `state`, ValueError for an event that is no flag event or a value given where none is
    carried (or none where one is)."""
    f = _FLAG_BY_EVENT.get(event)
    if f is None:
        raise ValueError(f"{event.value} is no flag event")
    check(event, state, state)
    carries = any(v is GIVEN for _, v in f.sets)
    if carries is (given is None):
        raise ValueError(f"{event.value} carries {'a value' if carries else 'no value'}")
    return {c: given if v is GIVEN else v for c, v in f.sets}


CANCELLING = "CANCELLING"
STOPPING = "STOPPING"
SHOWN_ONLY = (CANCELLING, STOPPING)
"""The states a person reads that the table never stores: a job that holds resources while it
is being stopped (`shown`)."""


def shown(state: JobState, *, cancel_requested: bool, stopping: bool) -> str:
    """The state a person reads, as the API, the CLI and the dashboard show it: the stored one,
    except for a job that holds resources while it is being stopped, shown as Slurm shows CG:
    CANCELLING once a cancel marked it (whether or not SIGTERM has come yet: its exit ends it
    CANCELLED), STOPPING once it got SIGTERM for another cause (`stopping`: its time limit ran
    out, say). PREEMPTING says so itself, and stays: its exit requeues it unless a cancel
    marked it. Neither word is a state of the table: the job stays in the one it holds."""
    if not state.holds_resources or state is _S.PREEMPTING:
        return state.value
    if cancel_requested:
        return CANCELLING
    return STOPPING if stopping else state.value


# -- what each event changes on a job ------------------------------------------------------------


def admitted(job: Job, now: float, attempt: Attempt, *, starts: bool, time_limit: float | None = None) -> Job:
    """A waiting job admitted at `now` into `attempt`: its wait so far kept (aging carries over
    the next requeue), its back-off and claim over. `starts`: its processes start at once
    (RUNNING) rather than being handed to an executor (ADMITTED). `time_limit`: the attempt's
    own limit where the caller sets one (the simulator: what is left of the job's runtime),
    else the job's."""
    target = _S.RUNNING if starts else _S.ADMITTED
    check(Event.ADMITTED, job.state, target)
    limit = job.time_limit if time_limit is None else time_limit
    return _job(job, target, attempt, limit, job.wait_at(now), None, None, False, job.preempted_at)


def signalled(job: Job, now: float, kill_at: float) -> Job:
    """SIGTERM at `now` for a preemption: the job holds its resources until it exits, by
    `kill_at` at the latest."""
    a = job.attempt
    assert a is not None, f"job {job.id} is signalled without an attempt"
    check(Event.SIGNALLED, job.state, _S.PREEMPTING)
    attempt = Attempt(
        a.number,
        a.started_at,
        a.assignment,
        a.borrowing,
        a.startup_s,
        a.checkpoint_s,
        a.last_checkpoint_at,
        a.sigterm_save_s,
        now,
        kill_at,
        a.lent,
    )
    return _job(
        job,
        _S.PREEMPTING,
        attempt,
        job.time_limit,
        job.waited,
        job.pending_since,
        job.not_before,
        job.claim,
        job.preempted_at,
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended: the job's next state and the word its event and attempt record."""

    state: JobState
    reason: str


def outcome(
    *,
    cancel_requested: bool,
    timed_out: bool,
    signalled: bool,
    killed: bool,
    evicted: bool,
    exit_codes: Sequence[int | None],
) -> Outcome:
    """What an exit means: CANCELLED once a cancel marked the job (never requeued; an accepted
    cancel always ends so), TIMEOUT once its attempt ran out its time limit (whether it left in
    its grace or by SIGKILL, as Slurm's TIMEOUT; never requeued), REQUEUED after SIGTERM
    (`preempted`, or `killed` when SIGKILL came) or an eviction by the substrate, else SUCCEEDED
    when every process exited 0 and FAILED otherwise."""
    if cancel_requested:
        return Outcome(_S.CANCELLED, "cancelled")
    if timed_out:
        return Outcome(_S.TIMEOUT, "timeout")
    if signalled:
        return Outcome(_S.REQUEUED, "killed" if killed else "preempted")
    if evicted:
        return Outcome(_S.REQUEUED, "evicted")
    if all(c == 0 for c in exit_codes):
        return Outcome(_S.SUCCEEDED, "completed")
    return Outcome(_S.FAILED, "failed")


def exited(job: Job, to: JobState, *, preempted_at: float | None) -> Job:
    """The job's processes are gone and it moves `to` (see `outcome`). A requeued job leaves its
    attempt behind; `preempted_at`, when a preemption's SIGTERM at that time made it go (not
    its node going down, nor a cancel), joins the record the thrash guard's budget counts
    (`Job.preempted_at`)."""
    check(Event.EXITED, job.state, to)
    if to is not _S.REQUEUED:
        return _moved(job, to)
    record = job.preempted_at if preempted_at is None else (*job.preempted_at, preempted_at)
    return _job(job, _S.REQUEUED, None, job.time_limit, job.waited, job.pending_since, job.not_before, False, record)


def requeued(job: Job, now: float, *, backoff: float, restart_age: bool = False) -> Job:
    """A requeued job back in PENDING at `now`: admitted no earlier than the thrash guard's
    back-off, with the age it had (`restart_age`: from zero, as a Slurm requeue resets it)."""
    check(Event.REQUEUED, job.state, _S.PENDING)
    return _pending(job, now, backoff, 0.0 if restart_age else job.waited)


def unstarted(job: Job, now: float) -> Job:
    """A job admitted whose processes never started (the server stopped in between): waiting
    again from `now`, its attempt given up."""
    check(Event.UNSTARTED, job.state, _S.PENDING)
    return _pending(job, now, 0.0, job.waited)


def finished(job: Job) -> Job:
    """A job that ran to its end (simulator, forecast): SUCCEEDED."""
    return exited(job, _S.SUCCEEDED, preempted_at=None)


def claimed(job: Job, on: bool) -> Job:
    """A waiting job whose claim on its victims' capacity begins (`on`) or ends: the CLAIMED or
    CLAIM_ENDED flag event, refused outside the waiting states."""
    flagged(Event.CLAIMED if on else Event.CLAIM_ENDED, job.state)
    j = job
    return _job(j, j.state, j.attempt, j.time_limit, j.waited, j.pending_since, j.not_before, on, j.preempted_at)


def reported(job: Job, attempt: Attempt) -> Job:
    """`job` with its attempt's facts as the job last reported them (startup, saves): no change
    of state (the NOTED edge)."""
    j = job
    return _job(j, j.state, attempt, j.time_limit, j.waited, j.pending_since, j.not_before, j.claim, j.preempted_at)


def left(job: Job) -> Job:
    """The engine's last view of a job that left its snapshot (it finished, or an admin or the
    engine guard held it out of scheduling), as a warm `Engine` is told to drop it: in a
    terminal state. A view for the engine, not a change of the job's recorded state, which the
    event that made it leave has already written."""
    j = job
    return _job(
        j, _S.CANCELLED, j.attempt, j.time_limit, j.waited, j.pending_since, j.not_before, False, j.preempted_at
    )


def _pending(job: Job, now: float, backoff: float, waited: float) -> Job:
    not_before = now + backoff if backoff > 0 else None
    return _job(job, _S.PENDING, None, job.time_limit, waited, now, not_before, False, job.preempted_at)


def _moved(job: Job, state: JobState) -> Job:
    j = job
    return _job(j, state, j.attempt, j.time_limit, j.waited, j.pending_since, j.not_before, j.claim, j.preempted_at)


def _job(
    j: Job,
    state: JobState,
    attempt: Attempt | None,
    time_limit: float | None,
    waited: float,
    pending_since: float | None,
    not_before: float | None,
    claim: bool,
    preempted_at: tuple[float, ...],
) -> Job:
    """`j` with the fields a change of state touches as given: the constructor called with every
    field in order, a fraction of what `dataclasses.replace` costs at the simulator's rate of
    one change per pod event (tests/engine/test_lifecycle.py compares the two)."""
    return Job(
        j.id,
        j.queue,
        j.tier,
        j.submit,
        state,
        j.replicas,
        j.gpus,
        j.cpu,
        j.memory,
        j.flavor,
        j.placement,
        j.user,
        j.lease,
        j.grace,
        time_limit,
        waited,
        pending_since,
        not_before,
        preempted_at,
        claim,
        attempt,
    )


def table() -> str:
    """The state machine as the Markdown table docs/engine.md shows (a test keeps them equal)."""

    def states(found: frozenset[JobState]) -> str:
        order = list(JobState)
        return ", ".join(s.value for s in sorted(found, key=order.index)) if found else "—"

    def changes(found: tuple[tuple[str, object], ...]) -> str:
        return ", ".join(f"`{c}` = {'the value given' if v is GIVEN else v}" for c, v in found) or "—"

    rows = ["| event | from | to | sets | what it means |", "|---|---|---|---|---|"]
    for e in (*EDGES, NOTED):
        source = "any" if e is NOTED else states(e.source)
        target = "the same" if e is NOTED else states(e.target)
        rows.append(f"| `{e.event.value}` | {source} | {target} | {changes(e.sets)} | {e.why} |")
    for f in FLAGS:
        sets_ = changes(tuple((f"attempts.{c}" if f.attempt else c, v) for c, v in f.sets))
        rows.append(f"| `{f.event.value}` | {states(f.states)} | the same | {sets_} | {f.why} |")
    return "\n".join(rows)
