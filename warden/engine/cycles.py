"""Preemption cycles: a job's preemption history read for the thrash the guard did not stop.

The thrash guard (DESIGN §4.3) keeps the engine from preempting a job more than its budget
allows, but a job can still be stopped more often than that through paths the guard does not
cover (evictions from nodes that went down, a policy with a larger budget applied later), and
two jobs can take the same capacity from each other again and again. This module names both,
from the history alone, so every shell flags the same jobs:

- **over budget**: more than `thrash.max_preemptions.count` preemptions of the job within some
  window of `thrash.max_preemptions.per` seconds, counted the way the guard counts them: the
  preemptions at times in `(t - per, t]` for some preemption time `t`. Preemptions exactly
  `per` apart are not in one window. Every kind counts (a preemption, a reclaim, an eviction).
- **alternating**: the job and one other job have preempted each other back and forth. Take
  the preemptions between the two only (the job preempted for the other, or the other
  preempted for the job; every other preemption is ignored), in time order, and merge
  consecutive ones in the same direction into one *turn*: the pair alternates once there are
  at least three turns, that is one round trip and the way back (A preempted for B, then B
  for A, then A for B again). Both jobs of the pair are flagged. Evictions name no other job
  and never alternate.

A job can be both; `preemption_cycles` returns each kind that holds, alternating first (it
names the other job, the more specific finding), and `preemption_cycle` the first of them.
Nothing here reads a clock: the history is all there is, from the job's first preemption.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from warden.engine.policy import MaxPreemptions, format_duration

CYCLE_KINDS: tuple[str, ...] = ("alternating", "over_budget")
"""The kinds of cycle, in the order `preemption_cycles` returns them; stable names."""


@dataclass(frozen=True, slots=True)
class Preempted:
    """One preemption, reclaim or eviction: `victim` got SIGTERM at `at` so that `by` could run
    (None: for no job, as in an eviction from a node that went down). Job ids are strings."""

    at: float
    victim: str
    by: str | None
    kind: str = "preemption"


@dataclass(frozen=True, slots=True)
class PreemptionCycle:
    kind: ClassVar[str] = "cycle"

    @property
    def message(self) -> str:
        raise NotImplementedError

    def details(self) -> dict[str, Any]:
        return asdict(self)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "details": self.details()}


@dataclass(frozen=True, slots=True)
class OverBudget(PreemptionCycle):
    """The busiest window: `count` preemptions from `window_start` to `window_end` (the first
    and the last preemption in it), more than the budget's `limit` per `per_s`."""

    kind: ClassVar[str] = "over_budget"
    count: int
    limit: int
    per_s: float
    window_start: float
    window_end: float

    @property
    def message(self) -> str:
        span = format_duration(round(self.window_end - self.window_start))
        return (
            f"Preempted {self.count} times within {span}, more than the thrash budget of "
            f"{self.limit} per {format_duration(self.per_s)}."
        )


@dataclass(frozen=True, slots=True)
class Alternating(PreemptionCycle):
    """The job and `partner` preempted each other in `turns` alternating turns (at least 3):
    the job was preempted for the partner `preempted_by_partner` times and the partner for
    the job `preempted_partner` times, between `first_at` and `last_at`."""

    kind: ClassVar[str] = "alternating"
    partner: str
    turns: int
    preempted_by_partner: int
    preempted_partner: int
    first_at: float
    last_at: float

    @property
    def message(self) -> str:
        return (
            f"It and job {self.partner} have preempted each other back and forth in {self.turns} "
            f"turns: it was preempted for job {self.partner} {_times(self.preempted_by_partner)}, "
            f"and job {self.partner} for it {_times(self.preempted_partner)}."
        )


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def over_budget(job: str, history: Iterable[Preempted], budget: MaxPreemptions) -> OverBudget | None:
    """The window of `budget.per` with the most preemptions of `job`, when it holds more than
    `budget.count` (the earliest such window on a tie); None otherwise."""
    times = sorted(p.at for p in history if p.victim == job)
    best: tuple[int, float, float] | None = None
    first = 0
    for last, t in enumerate(times):
        while times[first] <= t - budget.per:
            first += 1
        n = last - first + 1
        if n > budget.count and (best is None or n > best[0]):
            best = (n, times[first], t)
    if best is None:
        return None
    return OverBudget(best[0], budget.count, budget.per, best[1], best[2])


def alternating(job: str, history: Iterable[Preempted]) -> Alternating | None:
    """The other job `job` alternated with in the most turns (at least 3; on a tie, the one
    whose third turn came first, then the smaller id); None when it alternated with none."""
    # per partner: [turns, by partner, of partner, first at, last at, direction of the last
    # turn (True: job was the victim), when the third turn began]
    seen: dict[str, list[Any]] = {}
    for p in sorted(history, key=lambda p: p.at):
        if p.by is None or p.victim == p.by:
            continue
        if p.victim == job:
            partner, inbound = p.by, True
        elif p.by == job:
            partner, inbound = p.victim, False
        else:
            continue
        s = seen.setdefault(partner, [0, 0, 0, p.at, p.at, None, None])
        if s[5] is not inbound:
            s[0] += 1
            s[5] = inbound
            if s[0] == 3:
                s[6] = p.at
        s[1 if inbound else 2] += 1
        s[4] = p.at
    found = [(partner, s) for partner, s in seen.items() if s[0] >= 3]
    if not found:
        return None
    partner, s = min(found, key=lambda f: (-f[1][0], f[1][6], f[0]))
    return Alternating(partner, s[0], s[1], s[2], s[3], s[4])


def preemption_cycles(job: str, history: Iterable[Preempted], budget: MaxPreemptions) -> tuple[PreemptionCycle, ...]:
    """Every kind of cycle `job` is in, in `CYCLE_KINDS` order. `history` holds the job's own
    preemptions and those it caused (others are ignored), in any order."""
    events = tuple(history)
    found = (alternating(job, events), over_budget(job, events, budget))
    return tuple(c for c in found if c is not None)


def preemption_cycle(job: str, history: Iterable[Preempted], budget: MaxPreemptions) -> PreemptionCycle | None:
    """The cycle `job` is flagged with: the first of `preemption_cycles`, or None."""
    cycles = preemption_cycles(job, history, budget)
    return cycles[0] if cycles else None
