"""Phase 6, explain: every waiting job that is not admitted gets one reason, its sort key and its
position (DESIGN §4.5), and the pass's plan is put together.

The reasons come from the walk over the ranking (`phases.walk`), which visits only the jobs
that no remembered outcome of a job alike answers; the plan's explanations (`Explanations`)
are worked out from what it left, when somebody reads them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping

from warden.engine.model import Job
from warden.engine.phases.memo import Outcome, OutcomeKey
from warden.engine.phases.order import Order, RankKey
from warden.engine.phases.state import Hold, PassState
from warden.engine.phases.walk import _UNKNOWN, Walk, Walker, _reuse, remember, usable_of
from warden.engine.plan import Explanation, Plan
from warden.engine.reasons import AwaitingApproval, Position, Reason, ThrashBackoff
from warden.engine.waiting import AWAITING, BACKOFF, WaitingIndex, gate_of


class Explain:
    __slots__ = ("approval", "memo", "state", "walker")

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo
        self.walker = Walker(state)
        self.approval: dict[int, Reason] = {}
        """One `AwaitingApproval` per tier: the reason is the same for every job of it."""

    def walk(self, index: WaitingIndex, order: Order, decide: Callable[[Job], Reason | None]) -> Walk:
        """Every waiting job in order, with its reason: a gate's, a remembered one, or
        `decide`'s (None: admitted) (`walk.Walker.run`)."""
        return self.walker.run(index, order, decide)

    def _remember(self, job: Job, key: OutcomeKey, fronts: list[Outcome] | None, reason: Reason | None) -> None:
        """The outcome memo's rule (`walk.remember`), for a walk that visits jobs itself."""
        remember(self.memo, job, key, fronts, reason)

    def plan(self, walk: Walk, waiting: tuple[Job, ...], order: Order) -> Plan:
        """The pass's plan. A job waiting for its victims holds a claim into the next pass; a
        claimant that waits for nothing any more lets its claim go."""
        state = self.state
        claims = frozenset(state.claimants)
        visited = walk.visited
        explanations = Explanations(
            waiting, order, walk, state.memo.outcomes, tuple(state.reserved), state.cpu_memory_governed, state
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


class Explanations(Mapping[str, Explanation]):
    """A plan's explanations, in rank order, worked out on first read from what the walk
    left: a visited job's reason; a gate's; under head-of-line blocking, the position behind
    the head; else the outcome the job reuses in its epoch. A shell that never reads them
    (the simulator) never pays for them."""

    __slots__ = ("_done", "_governed", "_jobs", "_order", "_outcomes", "_reserved", "_state", "_walk")

    def __init__(
        self,
        jobs: tuple[Job, ...],
        order: Order,
        walk: Walk,
        outcomes: Mapping[OutcomeKey, list[Outcome]],
        reserved: tuple[Hold, ...],
        governed: bool,
        state: PassState,
    ) -> None:
        self._jobs = jobs
        self._order = order
        self._walk = walk
        self._outcomes = outcomes
        self._reserved = reserved
        self._governed = governed
        self._state = state
        """Which reservations a job may use (`usable_of`), as the pass answered it."""
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
                gate = gate_of(job, now)
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
        usable = usable_of(job, reserved, self._state) if reserved else None
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
