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

The walk goes class by class (`warden.engine.waiting`): a heap holds the next member of every
class whose outcome is not yet known, so the job it pops is the next job in rank order that a
remembered outcome does not answer. Once every member of a class would reuse one, the class
leaves the heap and its other members are never visited; when the holds change (a claim, a
reservation, a backfill into one) the classes that left are looked at again, and those no
longer answered come back from the first member past that point. Which remembered outcome a
member reuses is fixed by the holds in force at its place in the ranking (an `Epoch`), so the
plan's explanations (`Explanations`) are worked out only when somebody reads them, and are what
a walk over every job one by one would give.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

from warden.engine.model import Job, JobState
from warden.engine.phases.memo import Outcome, OutcomeKey, Usable
from warden.engine.phases.order import Order, Prefix, RankKey, claimant_keys
from warden.engine.phases.state import Hold, PassState
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
from warden.engine.waiting import (
    ANY_RESERVATION,
    AWAITING,
    BACKOFF,
    BY_ESTIMATE,
    NO_RESERVATION,
    OPEN,
    JobClass,
    WaitingIndex,
    class_key,
)

_AWAITING = JobState.AWAITING_APPROVAL
_UNKNOWN: Any = object()
"""No remembered outcome applies (a sentinel, never in a plan)."""
_FRONTS_KEPT = 8
"""Outcomes remembered per key: a deep queue of one shape asks a few (CPU, memory) sizes."""

Epoch = tuple[int, int]
"""(hold version, reservations): the holds in force over a stretch of the ranking."""


class Explain:
    __slots__ = ("_values", "approval", "memo", "state")

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo
        self._values: tuple[int, dict[int, list[Usable]]] = (-1, {})
        """(hold version, estimate kind → `usable_values`): until the holds change."""
        self.approval: dict[int, Reason] = {}
        """One `AwaitingApproval` per tier: the reason is the same for every job of it."""

    def walk(self, index: WaitingIndex, order: Order, decide: Callable[[Job], Reason | None]) -> Walk:
        """Every waiting job in order, with its reason: a gate's, a remembered one, or
        `decide`'s (None: admitted); only the jobs no remembered outcome answers are visited.

        The outcome cache is read here, inline, rather than in a call: it answers most jobs
        that are visited, and a call per job is a sizeable share of a pass.
        """
        state, memo = self.state, self.memo
        strict = state.policy.scheduling.head_of_line_blocking
        now = state.now
        outcomes = memo.outcomes
        governed = state.cpu_memory_governed
        reserved = state.reserved  # grows in place during the pass
        claims = claimant_keys(order, index.claimants.values(), index.classes.values())
        heap: list[tuple[RankKey, int, _Track]] = []
        """(rank key, generation, track): the next member of each class that no remembered
        outcome answers (an entry whose generation is not its track's is stale)."""
        for job_id, key in claims.items():
            job = index.claimants[job_id]
            heap.append((key, 0, _Track(JobClass(class_key(job, now), [order.mode.entry(job)]), None)))
        for cls in index.classes.values():
            if cls.key[9] == OPEN:
                first = order.prefix(cls.members[0][3])
                heap.append((order.key(first, cls.members[0]), 0, _Track(cls, first)))
        heapify(heap)
        visited: dict[str, Reason | None] = {}
        bounds: list[RankKey] = []
        epochs: list[Epoch] = [(memo.hold_version, len(reserved))]
        skipping: list[_Track] = []
        """Tracks that skip members now or did: what the holds' next change may undo."""
        head: tuple[Job, RankKey] | None = None
        while heap:
            key, generation, track = heappop(heap)
            if generation != track.generation:
                continue
            cls, i = track.cls, track.pending
            job = cls.members[i][3]
            version = memo.hold_version
            reason: Reason | None
            if job.not_before is not None and job.not_before > now:
                reason = ThrashBackoff(job.not_before)  # a claimant in back-off: not a head
            else:
                if not reserved:
                    usable: Usable = None
                elif len(reserved) == 1:  # `usable_of`, inlined for the usual case
                    if job.tier == 4:
                        usable = True
                    elif job.expected_duration is None:
                        usable = False
                    else:
                        due = reserved[0].due
                        usable = due is not None and now + job.expected_duration <= due
                else:
                    usable = usable_of(job, reserved, now)
                okey = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, usable)
                fronts = outcomes.get(okey)
                reason = _UNKNOWN
                if fronts is not None:
                    reason = _reuse(fronts, job.cpu, job.memory, version, governed)
                if reason is _UNKNOWN:
                    reason = decide(job)
                    self._remember(job, okey, fronts, reason)
                if reason is not None and strict:
                    visited[job.id] = reason
                    head = (job, key)
                    break
            visited[job.id] = reason
            track.done = i + 1
            prefix = track.prefix
            if prefix is not None:  # a claimant is a class of one
                nxt, track.fragile = self._unanswered(cls, i + 1)
                if nxt is not None:
                    track.pending = nxt
                    heappush(heap, (order.key(prefix, cls.members[nxt]), track.generation, track))
                else:
                    track.pending = -1
                if (nxt is None or nxt > i + 1) and not track.listed and i + 1 < len(cls.members):
                    track.listed = True
                    skipping.append(track)
            if memo.hold_version != version:
                # The holds changed: from here on, outcomes that depended on them are gone,
                # and with a new reservation the jobs meet the reservations differently.
                grown = len(reserved) != epochs[-1][1]
                bounds.append(key)
                epochs.append((memo.hold_version, len(reserved)))
                for t in skipping:
                    if t is not track and (grown or t.fragile):
                        self._recheck(t, key, order, heap)
        return Walk(visited, claims, head, bounds, epochs)

    def _recheck(self, track: _Track, key: RankKey, order: Order, heap: list[tuple[RankKey, int, _Track]]) -> None:
        """After the holds changed at `key`: the members the track skips past `key` are
        looked at again, and the first one no outcome answers now goes on the heap."""
        members = track.cls.members
        end = track.pending if track.pending >= 0 else len(members)
        if track.done >= end:
            return  # nothing skipped
        prefix = track.prefix
        assert prefix is not None
        start = bisect_left(members, key, track.done, end, key=lambda e: order.key(prefix, e))
        track.done = start  # those before were passed in the earlier epoch
        if start >= end:
            return
        nxt, track.fragile = self._unanswered(track.cls, start)
        if nxt != (track.pending if track.pending >= 0 else None):
            track.generation += 1
            if nxt is None:
                track.pending = -1
            else:
                track.pending = nxt
                heappush(heap, (order.key(prefix, members[nxt]), track.generation, track))

    def _unanswered(self, cls: JobClass, start: int) -> tuple[int | None, bool]:
        """The first member of the class from `start` on that no remembered outcome answers
        with the holds as they are now (or None), and whether what answers the members
        before it depends on the holds (a `Reserved` outcome).

        Members differ only in how their runtime estimate meets the reservations: once the
        outcome for one way is known, only members that meet them another way are looked at."""
        members = cls.members
        if start >= len(members):
            return None, False
        key = cls.key
        memo = self.memo
        version = memo.hold_version
        values = self._values
        if values[0] != version:
            values = self._values = (version, {})
        kinds = values[1].get(key[8])
        if kinds is None:
            kinds = values[1][key[8]] = usable_values(key[8], self.state.reserved, self.state.now)
        base = key[:6]
        outcomes = memo.outcomes
        governed = self.state.cpu_memory_governed
        wanted = []
        fragile = False
        for usable in kinds:
            fronts = outcomes.get((*base, usable))
            found = None if fronts is None else _front(fronts, key[6], key[7], version, governed)
            if found is None:
                wanted.append(usable)
            elif found[2] != -1:
                fragile = True
        if not wanted:
            return None, fragile
        if key[8] != BY_ESTIMATE or len(wanted) == len(kinds):
            return start, False
        reserved, now = self.state.reserved, self.state.now
        if len(reserved) == 1:
            # Only members ending before the due time, or only those ending after it: none
            # may be left (now + estimate grows with the estimate, rounding included).
            due = reserved[0].due
            shortest, longest = cls.estimate_range()
            if wanted[0] is True and not (due is not None and now + shortest <= due):
                return None, fragile
            if wanted[0] is False and due is not None and now + longest <= due:
                return None, fragile
            if due is None:
                return start, fragile  # no member may use it: the first wants False
            want = wanted[0]
            for j in range(start, len(members)):  # `usable_of`, inlined: members have estimates
                if (now + members[j][3].expected_duration <= due) is want:  # type: ignore[operator]
                    return j, fragile
            return None, fragile
        for j in range(start, len(members)):
            if usable_of(members[j][3], reserved, now) in wanted:
                return j, fragile
        return None, fragile

    def _remember(self, job: Job, key: OutcomeKey, fronts: list[Outcome] | None, reason: Reason | None) -> None:
        """Remember why the job failed under `key` (`fronts`: what is remembered there already).

        Not remembered: an admission, a reason that names victims it signalled or waits to
        signal (their state is the job's own) and one that names a reservation's due time (the
        job's own reservation). `PreemptionWouldNotPay` without a reservation is remembered:
        a job alike declines the same victims for the pass (`Memo.preempt_declined`)."""
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

    def plan(self, walk: Walk, waiting: tuple[Job, ...], order: Order) -> Plan:
        """The pass's plan. A job waiting for its victims holds a claim into the next pass; a
        claimant that waits for nothing any more lets its claim go."""
        state = self.state
        claims = frozenset(state.claimants)
        visited = walk.visited
        explanations = Explanations(
            waiting, order, walk, state.memo.outcomes, tuple(state.reserved), state.cpu_memory_governed
        )
        return Plan(
            now=state.now,
            admissions=tuple(state.admissions),
            preemptions=tuple(state.preemptions),
            reservations=tuple(state.reservations),
            explanations=explanations,
            claims=claims,
            released_claims=tuple(
                sorted(i for i in state.claims if visited.get(i, _UNKNOWN) is not None and i not in claims)
            ),
        )


class Walk:
    """What a walk found: the reasons of the jobs it visited (None: admitted), the claimants'
    rank keys, the blocked head under head-of-line blocking, and the epochs of the holds
    (`bounds[k]` is where epoch k + 1 begins)."""

    __slots__ = ("bounds", "claims", "epochs", "head", "visited")

    def __init__(
        self,
        visited: dict[str, Reason | None],
        claims: dict[str, RankKey],
        head: tuple[Job, RankKey] | None,
        bounds: list[RankKey],
        epochs: list[Epoch],
    ) -> None:
        self.visited = visited
        self.claims = claims
        self.head = head
        self.bounds = bounds
        self.epochs = epochs


class Explanations(Mapping[str, Explanation]):
    """A plan's explanations, in rank order, worked out on first read from what the walk
    left: a visited job's reason; a gate's; under head-of-line blocking, the position behind
    the head; else the outcome the job reuses in its epoch. A shell that never reads them
    (the simulator) never pays for them."""

    __slots__ = ("_done", "_governed", "_jobs", "_order", "_outcomes", "_reserved", "_walk")

    def __init__(
        self,
        jobs: tuple[Job, ...],
        order: Order,
        walk: Walk,
        outcomes: Mapping[OutcomeKey, list[Outcome]],
        reserved: tuple[Hold, ...],
        governed: bool,
    ) -> None:
        self._jobs = jobs
        self._order = order
        self._walk = walk
        self._outcomes = outcomes
        self._reserved = reserved
        self._governed = governed
        self._done: dict[str, Explanation] | None = None

    def _all(self) -> dict[str, Explanation]:
        done = self._done
        if done is None:
            done = self._done = self._work_out()
        return done

    def _work_out(self) -> dict[str, Explanation]:
        order, walk = self._order, self._walk
        now = order.now
        claims, visited = walk.claims, walk.visited
        keyed = sorted(((claims.get(j.id) or order.key_of(j), j) for j in self._jobs), key=_first)
        head_id, head_key = (walk.head[0].id, walk.head[1]) if walk.head is not None else (None, None)
        approval: dict[int, Reason] = {}
        out: dict[str, Explanation] = {}
        new = tuple.__new__  # Explanation's own constructor is a Python function; this is C
        for position, (key, job) in enumerate(keyed, 1):
            reason = visited.get(job.id, _UNKNOWN)
            if reason is None:
                continue  # admitted
            if reason is _UNKNOWN:
                gate = class_key(job, now)[9]
                if gate == AWAITING:
                    reason = approval.get(job.tier)
                    if reason is None:
                        reason = approval[job.tier] = AwaitingApproval(job.tier)
                elif gate == BACKOFF:
                    assert job.not_before is not None
                    reason = ThrashBackoff(job.not_before)
                elif head_key is not None and key > head_key:
                    assert head_id is not None
                    reason = Position(position, head_id)
                else:
                    reason = self._reused(job, key)
            own = key if len(key) == 8 else key[-1]
            out[job.id] = new(Explanation, (job.id, reason, order.sort_key(job, own), position))
        return out

    def _reused(self, job: Job, key: RankKey) -> Reason:
        """The remembered outcome a job the walk skipped reuses, in the epoch of its place."""
        walk = self._walk
        version, count = walk.epochs[bisect_left(walk.bounds, key)]
        reserved = self._reserved[:count]
        usable = usable_of(job, reserved, self._order.now) if reserved else None
        fronts = self._outcomes.get((job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, usable))
        reason = _UNKNOWN if fronts is None else _reuse(fronts, job.cpu, job.memory, version, self._governed)
        assert reason is not _UNKNOWN, f"job {job.id} was skipped with no outcome to reuse"
        return reason  # type: ignore[no-any-return]

    def __getitem__(self, job_id: str) -> Explanation:
        return self._all()[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        if self._done is not None:
            return len(self._done)
        admitted = sum(1 for r in self._walk.visited.values() if r is None)
        return len(self._jobs) - admitted

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._all()

    def __repr__(self) -> str:
        return f"Explanations({self._all()!r})"


def _first(row: tuple[RankKey, Job]) -> RankKey:
    return row[0]


class _Track:
    """Where the walk is in one class: the first member not yet passed (`done`), the member
    on the heap (`pending`; −1: none, the rest are answered), and whether what answers the
    members between depends on the holds (`fragile`)."""

    __slots__ = ("cls", "done", "fragile", "generation", "listed", "pending", "prefix")

    def __init__(self, cls: JobClass, prefix: Prefix | None) -> None:
        self.cls = cls
        self.prefix = prefix
        """`Order.prefix` of the class; None for a claimant (a class of one)."""
        self.done = 0
        self.pending = 0
        self.fragile = False
        self.generation = 0
        self.listed = False


def _front(fronts: list[Outcome], cpu: int, memory: int, version: int, governed: bool) -> Outcome | None:
    """The remembered outcome a job asking (cpu, memory) reuses, or None: one that failed
    asking at most that much (exactly that much where quota governs CPU or memory), and a
    `Reserved` one only at its hold version and for exactly that much."""
    for front in fronts:
        f_cpu, f_memory, f_version, _ = front
        if f_version == -1:
            if (cpu == f_cpu and memory == f_memory) if governed else (cpu >= f_cpu and memory >= f_memory):
                return front
        elif f_version == version and cpu == f_cpu and memory == f_memory:
            return front
    return None


def _reuse(fronts: list[Outcome], cpu: int, memory: int, version: int, governed: bool) -> Any:
    """The reason of the remembered outcome a job asking (cpu, memory) reuses (`_front`), or
    `_UNKNOWN`."""
    front = _front(fronts, cpu, memory, version, governed)
    return _UNKNOWN if front is None else front[3]


def usable_of(job: Job, reserved: Sequence[Hold], now: float) -> Usable:
    """Which reservations the job may backfill: all that its runtime estimate matters for.

    Jobs that end at different times but before (or after) the same reservations are due
    fail the same way, so they share one remembered outcome. With one reservation (the
    default) the answer is a bool rather than a 1-tuple: one allocation less per job
    (`Explain.walk` works that case out inline, the same way, and the case of none)."""
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


def usable_values(kind: int, reserved: Sequence[Hold], now: float) -> list[Usable]:
    """Every `usable_of` a job of this estimate kind can get with these reservations: one for
    a tier-4 job or one without an estimate, one per stretch between the dues for the rest."""
    if not reserved:
        return [None]
    n = len(reserved)
    if kind == ANY_RESERVATION:
        return [True if n == 1 else (True,) * n]
    if kind == NO_RESERVATION:
        return [False if n == 1 else (False,) * n]
    dues = sorted({h.due for h in reserved if h.due is not None})
    ends = [*dues, float("inf")]
    values: list[Usable] = []
    for e in ends:
        v: Usable = (
            (reserved[0].due is not None and e <= reserved[0].due)
            if n == 1
            else tuple([h.due is not None and e <= h.due for h in reserved])
        )
        if v not in values:
            values.append(v)
    return values
