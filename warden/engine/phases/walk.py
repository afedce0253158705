"""The walk over the ranking, where each waiting job gets its reason (phase 6, `phases.explain`).

A job gets its reason from a gate (a claimant in thrash back-off), from a job like it that
already failed in the pass, or from deciding it anew (`Cycle.decide`: admit, preempt, reserve).
A job like one that already failed — same queue, tier, shape and runtime estimate, at least its
CPU and memory — fails the same way: free capacity, and free plus held capacity, only shrank and
quota usage only grew since. Its reason is reused, which is what keeps a deep queue cheap.
`Reserved` depends on which holds exist and says the job would fit without them, so only an
identical job reuses it while the holds are unchanged; where quota governs CPU or memory the
reason names the amounts asked, so the same goes there.

The walk goes class by class (`warden.engine.waiting`): a heap holds the next member of every
class whose outcome is not yet known, so the job it pops is the next job in rank order that a
remembered outcome does not answer. Once every member of a class would reuse one, the class
leaves the heap and its other members are never visited; when the holds change (a claim, a
reservation, a backfill into one) the classes that left are looked at again, and those no
longer answered come back from the first member past that point. Which remembered outcome a
member reuses is fixed by the holds in force at its place in the ranking (an `Epoch`), so the
plan's explanations (`phases.explain.Explanations`) are worked out only when somebody reads
them, and are what a walk over every job one by one would give.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

from warden.engine.model import Job
from warden.engine.phases.memo import Memo, Outcome, OutcomeKey, Usable
from warden.engine.phases.order import Order, Prefix, RankKey, claimant_keys
from warden.engine.phases.state import Hold, PassState
from warden.engine.reasons import Reason, Reserved, ThrashBackoff, WaitingForGrace, WaitingForLease
from warden.engine.waiting import (
    BY_ESTIMATE,
    NO_RESERVATION,
    OPEN,
    JobClass,
    WaitingIndex,
    class_key,
)

_UNKNOWN: Any = object()
"""No remembered outcome applies (a sentinel, never in a plan)."""
_FRONTS_KEPT = 8
"""Outcomes remembered per key: a deep queue of one shape asks a few (CPU, memory) sizes."""

Epoch = tuple[int, int]
"""(hold version, reservations): the holds in force over a stretch of the ranking."""
Entry = tuple[RankKey, int, "_Track"]
"""(rank key, generation, track): the next member of a class that no remembered outcome
answers (an entry whose generation is not its track's is stale)."""


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


class Walker:
    """Walks the ranking of one pass (`run`). What one run builds up lives on the walker, so
    the steps of a visit are methods that share it rather than one long loop."""

    __slots__ = (
        "_values",
        "bounds",
        "decide",
        "epochs",
        "governed",
        "heap",
        "memo",
        "now",
        "order",
        "outcomes",
        "reserved",
        "skipping",
        "state",
    )

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo
        self.now = state.now
        self.outcomes = state.memo.outcomes
        self.governed = state.cpu_memory_governed
        self.reserved = state.reserved
        """The pass's reservations: the list grows in place as the pass reserves."""
        self._values: tuple[int, dict[tuple[int, tuple[bool, ...]], list[Usable]]] = (-1, {})
        """(hold version, (estimate kind, reservations lent whatever the estimate) →
        `usable_values`): until the holds change."""
        self.heap: list[Entry] = []
        self.bounds: list[RankKey] = []
        self.epochs: list[Epoch] = []
        self.skipping: list[_Track] = []
        """Tracks that skip members now or did: what the holds' next change may undo."""

    def run(self, index: WaitingIndex, order: Order, decide: Callable[[Job], Reason | None]) -> Walk:
        """Every waiting job in order, with its reason: a gate's, a remembered one, or
        `decide`'s (None: admitted); only the jobs no remembered outcome answers are visited."""
        memo = self.memo
        now = self.now
        strict = self.state.policy.scheduling.head_of_line_blocking
        self.order, self.decide = order, decide
        claims = claimant_keys(order, index.claimants.values())
        heap = self.heap = self._start(index, claims)
        self.bounds, self.epochs, self.skipping = [], [(memo.hold_version, len(self.reserved))], []
        visited: dict[str, Reason | None] = {}
        head: tuple[Job, RankKey] | None = None
        while heap:
            key, generation, track = heappop(heap)
            if generation != track.generation:
                continue
            i = track.pending
            job = track.cls.members[i][3]
            version = memo.hold_version
            if job.not_before is not None and job.not_before > now:
                visited[job.id] = ThrashBackoff(job.not_before)  # a claimant in back-off: not a head
            else:
                reason = visited[job.id] = self._answer(job, version)
                if reason is not None and strict:
                    head = (job, key)
                    break
            self._passed(track, i)
            if memo.hold_version != version:
                self._holds_changed(track, key)
        return Walk(visited, claims, head, self.bounds, self.epochs)

    def _start(self, index: WaitingIndex, claims: dict[str, RankKey]) -> list[Entry]:
        """The heap as the walk starts: every claimant (a class of one), and the first member
        of every class whose members are considered."""
        order, now = self.order, self.now
        heap: list[Entry] = []
        for job_id, key in claims.items():
            job = index.claimants[job_id]
            heap.append(
                (key, 0, _Track(JobClass(class_key(job, now, index.exact_estimates), [order.mode.entry(job)]), None))
            )
        for cls in index.classes.values():
            if cls.key.gate == OPEN:
                first = order.prefix(cls.members[0][3])
                heap.append((order.key(first, cls.members[0]), 0, _Track(cls, first)))
        heapify(heap)
        return heap

    def _answer(self, job: Job, version: int) -> Reason | None:
        """The job's reason: the outcome it reuses at hold version `version`, else `decide`'s
        (remembered for the jobs alike). The outcome cache is read here, inline: it answers
        most jobs that are visited, and a call per job is a sizeable share of a pass."""
        reserved = self.reserved
        usable: Usable
        if not reserved:
            usable = None
        elif len(reserved) == 1:  # `usable_of`, for the usual case
            usable = self.state.lent(job, reserved[0])
        else:
            usable = usable_of(job, reserved, self.state)
        okey = (job.queue, job.tier, job.flavor, job.replicas, job.gpus, job.placement, usable)
        fronts = self.outcomes.get(okey)
        reason = _UNKNOWN
        if fronts is not None:
            reason = _reuse(fronts, job.cpu, job.memory, version, self.governed)
        if reason is _UNKNOWN:
            reason = self.decide(job)
            remember(self.memo, job, okey, fronts, reason)
        return reason  # type: ignore[no-any-return]

    def _passed(self, track: _Track, i: int) -> None:
        """Member `i` of the track's class was visited: put the next member no remembered
        outcome answers on the heap, and list the track if it skips members."""
        track.done = i + 1
        prefix = track.prefix
        if prefix is None:  # a claimant is a class of one
            return
        cls = track.cls
        nxt, track.fragile = self._unanswered(cls, i + 1)
        if nxt is not None:
            track.pending = nxt
            heappush(self.heap, (self.order.key(prefix, cls.members[nxt]), track.generation, track))
        else:
            track.pending = -1
        if (nxt is None or nxt > i + 1) and not track.listed and i + 1 < len(cls.members):
            track.listed = True
            self.skipping.append(track)

    def _holds_changed(self, track: _Track, key: RankKey) -> None:
        """The holds changed at `key` (while visiting `track`): from here on, outcomes that
        depended on them are gone, and with a new reservation the jobs meet the reservations
        differently. A new epoch begins, and the tracks that skip members are looked at again."""
        count = len(self.reserved)
        grown = count != self.epochs[-1][1]
        self.bounds.append(key)
        self.epochs.append((self.memo.hold_version, count))
        for t in self.skipping:
            if t is not track and (grown or t.fragile):
                self._recheck(t, key)

    def _recheck(self, track: _Track, key: RankKey) -> None:
        """After the holds changed at `key`: the members the track skips past `key` are
        looked at again, and the first one no outcome answers now goes on the heap."""
        members = track.cls.members
        end = track.pending if track.pending >= 0 else len(members)
        if track.done >= end:
            return  # nothing skipped
        prefix = track.prefix
        assert prefix is not None
        order = self.order
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
                heappush(self.heap, (order.key(prefix, members[nxt]), track.generation, track))

    def _unanswered(self, cls: JobClass, start: int) -> tuple[int | None, bool]:
        """The first member of the class from `start` on that no remembered outcome answers
        with the holds as they are now (or None), and whether what answers the members
        before it depends on the holds (a `Reserved` outcome).

        Members differ only in how their runtime estimate meets the reservations: once the
        outcome for one way is known, only members that meet them another way are looked at."""
        if start >= len(cls.members):
            return None, False
        wanted, every, fragile = self._wanted(cls)
        if not wanted:
            return None, fragile
        if cls.key.estimate != BY_ESTIMATE or every:
            return start, False
        return self._first_wanting(cls, start, wanted), fragile

    def _wanted(self, cls: JobClass) -> tuple[list[Usable], bool, bool]:
        """The ways of meeting the reservations (`usable_of`) open to the class's members that
        no remembered outcome answers for them; whether that is every way; and whether an
        outcome that does answer depends on the holds (a `Reserved` one)."""
        memo = self.memo
        key = cls.key
        version = memo.hold_version
        values = self._values
        if values[0] != version:
            values = self._values = (version, {})
        reserved = self.reserved
        taken_back = self.state.taken_back
        first = cls.members[0][3]  # the members are alike in what `taken_back` reads
        lent = tuple([taken_back(first, h) for h in reserved])
        kinds = values[1].get((key.estimate, lent))
        if kinds is None:
            kinds = values[1][key.estimate, lent] = usable_values(key.estimate, reserved, self.now, lent)
        base = (key.queue, key.tier, key.flavor, key.replicas, key.gpus, key.placement)
        outcomes = self.outcomes
        wanted = []
        fragile = False
        for usable in kinds:
            fronts = outcomes.get((*base, usable))
            found = None if fronts is None else _front(fronts, key.cpu, key.memory, version, self.governed)
            if found is None:
                wanted.append(usable)
            elif found[2] != -1:
                fragile = True
        return wanted, len(wanted) == len(kinds), fragile

    def _first_wanting(self, cls: JobClass, start: int, wanted: list[Usable]) -> int | None:
        """The first member from `start` on (of a class whose members have estimates) that
        meets the reservations one of the `wanted` ways, or None."""
        members = cls.members
        reserved, now = self.reserved, self.now
        if len(reserved) != 1:
            for j in range(start, len(members)):
                if usable_of(members[j][3], reserved, self.state) in wanted:
                    return j
            return None
        if self.state.taken_back(members[start][3], reserved[0]):
            return start if wanted[0] is True else None  # every member may use it
        # Only members ending before the due time, or only those ending after it: none may be
        # left (now + estimate grows with the estimate, rounding included).
        due = reserved[0].due
        shortest, longest = cls.estimate_range()
        if wanted[0] is True and not (due is not None and now + shortest <= due):
            return None
        if wanted[0] is False and due is not None and now + longest <= due:
            return None
        if due is None:
            return start  # no member may use it: the first wants False
        want = wanted[0]
        for j in range(start, len(members)):  # `usable_of`, inlined: members have estimates
            if (now + members[j][3].time_limit <= due) is want:  # type: ignore[operator]
                return j
        return None


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


def remember(memo: Memo, job: Job, key: OutcomeKey, fronts: list[Outcome] | None, reason: Reason | None) -> None:
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
        entry = (job.cpu, job.memory, memo.hold_version if isinstance(reason, Reserved) else -1, reason)
        if fronts is None:
            memo.outcomes[key] = [entry]
        elif len(fronts) < _FRONTS_KEPT:
            fronts.append(entry)


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


def usable_of(job: Job, reserved: Sequence[Hold], state: PassState) -> Usable:
    """Which reservations the job may backfill (`PassState.lent`): those it ends before, and
    those whose holders may take it back when due.

    Jobs that meet the same reservations fail the same way, so they share one remembered
    outcome. With one reservation (the default) the answer is a bool rather than a 1-tuple:
    one allocation less per job (`Walker._answer` works that case out the same way, and the
    case of none)."""
    lent = state.lent
    if len(reserved) == 1:
        return lent(job, reserved[0])
    return tuple([lent(job, h) for h in reserved])


def usable_values(kind: int, reserved: Sequence[Hold], now: float, lent: Sequence[bool]) -> list[Usable]:
    """Every `usable_of` a member of a class of this estimate kind can get with these
    reservations, where `lent` says which of them the class may use whatever its estimate
    (their holders may take it back; `PassState.lent`): one for a class without estimates,
    one per stretch between the dues for the rest."""
    if not reserved:
        return [None]
    n = len(reserved)
    if kind == NO_RESERVATION:
        return [lent[0] if n == 1 else tuple(lent)]
    dues = sorted({h.due for h in reserved if h.due is not None})
    ends = [*dues, float("inf")]
    values: list[Usable] = []
    for e in ends:
        each = [ok or (h.due is not None and e <= h.due) for ok, h in zip(lent, reserved)]
        v: Usable = each[0] if n == 1 else tuple(each)
        if v not in values:
            values.append(v)
    return values
