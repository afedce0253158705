"""Every cache and version counter of one pass, in one place, each with what invalidates it.

Within a pass free capacity only shrinks and quota usage only grows (a claim holds the part of
its placement that is free now, and charges its quota where its victims' usage does not already
cover it), so a failure found once stays one for the rest of the pass. An answer that names
amounts, or a success, holds only until what it read changes: the three version counters say
when. The phases bump them where they change the state for good; a what-if under a mark that
is rolled back changes nothing and bumps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warden.engine.reasons import PreemptionWouldNotPay, Reason

if TYPE_CHECKING:
    from warden.engine.model import Job
    from warden.engine.preemption import Candidate, CandidatePool

Part = tuple[str, int, int, int]
"""(node, gpus, cpu, memory): a share of one node's capacity."""
Shape = tuple[int, int, int, int, str]
"""(replicas, gpus, cpu, memory, placement) of a job."""
PlaceKey = tuple[str, int, int, int, int, str]
"""(flavor, *shape): what a placement question depends on."""
PreemptKey = tuple[str, int, str | None, int, int, int, int, str]
"""(queue, tier, flavor asked for, replicas, gpus, cpu, memory, placement)."""
BackfillKey = tuple[str, int, int, int, int, str, tuple[int, ...]]
"""(flavor, *shape, the `id`s of the reservations the job may use)."""
Usable = bool | tuple[bool, ...] | None
"""Which reservations a job may backfill (`walk.usable_of`): None when there are none, a bool
for one (the usual case), else one bool per reservation."""
OutcomeKey = tuple[str, int, str | None, int, int, str, Usable]
"""(queue, tier, flavor asked for, replicas, gpus, placement, usable): the jobs that fail alike."""
Outcome = tuple[int, int, int, Reason]
"""(CPU, memory, hold version or −1, reason): why a job asking that much failed."""
HeldParts = tuple[list[Part], list[Part], int, dict[str, list[int]]]
"""Held parts on a flavor, elsewhere, the GPUs of the first, and the first summed per node."""


@dataclass(slots=True)
class Memo:
    """What one pass remembers so that it need not ask again."""

    quota_version: int = 0
    """Bumped whenever quota usage changes for good: an admission, a claim's charge."""
    capacity_version: int = 0
    """Bumped whenever free capacity changes for good: an admission, a hold, a backfill."""
    hold_version: int = 0
    """Bumped whenever the holds change: a new claim or reservation, a backfill into one."""

    quota_seen: dict[tuple[str, tuple[float, ...]], tuple[int, Reason | None, bool]] = field(default_factory=dict)
    """(queue, demand) → (quota version, why it does not fit or None, in-quota). A refusal
    stands for the pass (usage only grows); a fit only at the quota version it was found at."""
    capacity_seen: dict[PlaceKey, tuple[int, Reason]] = field(default_factory=dict)
    """(flavor, shape) → (capacity version, `InsufficientCapacity` or `Fragmented`): the reason
    names free GPUs, so it stands only at its capacity version. (Which shapes do not fit at all
    the capacity index remembers itself, per flavor.)"""
    held_fail: set[PlaceKey] = field(default_factory=set)
    """Shapes that do not fit even with every hold released: free plus held capacity only
    shrinks, so for the pass."""
    held_ok: dict[PlaceKey, tuple[int, Reason]] = field(default_factory=dict)
    """Shapes that would fit but for the holds → (hold version, `Reserved`): until the holds
    change."""
    lent: dict[tuple[int, int, float | None, float | None, tuple[float, ...], float | None], bool] = field(
        default_factory=dict
    )
    """(hold `id`, tier, lease, grace, preemption record, runtime estimate where a victim rule
    reads it) → may a job of those start in the reservation's capacity although it does not end
    before it is due (`PassState.lent`)."""
    backfill_fail: dict[BackfillKey, int] = field(default_factory=dict)
    """Shapes that do not fit even in the reservations they may use → the hold version it was
    found at: free plus usable held capacity only shrinks while the holds stay as they are."""
    held_parts: dict[tuple[str, tuple[int, ...]], tuple[int, HeldParts]] = field(default_factory=dict)
    """(flavor, `id`s of some holds) → (hold version, their parts on and off the flavor): until
    the holds change."""
    outcomes: dict[OutcomeKey, list[Outcome]] = field(default_factory=dict)
    """Why jobs alike failed (`walk.Walker`): at most 8 fronts of (CPU, memory) per key. A job
    asking at least that much fails the same way for the pass; a `Reserved` outcome, or any
    outcome where quota governs CPU or memory (the reason names the amounts), only for a job
    asking exactly that much, and a `Reserved` one only at its hold version."""
    preempt_fail: set[PreemptKey] = field(default_factory=set)
    """Jobs whose victim search failed: free capacity and the candidates only shrink, and quota
    usage only grows, so for the pass (and a claim charges quota: it never makes room)."""
    preempt_declined: dict[PreemptKey, PreemptionWouldNotPay] = field(default_factory=dict)
    """Jobs whose victims would not pay (`Preempt.declined`) → why: for the pass. Free capacity
    only shrinks, so what frees by itself comes no sooner later in the pass: a job alike
    declines again at once instead of searching again (at worst it waits a pass longer)."""
    eligible: dict[tuple[object, ...], tuple[int, int, bool]] = field(default_factory=dict)
    """What `Victims.any_eligible` reads of P (what the pair rules declare they read,
    `rules.PREEMPTOR_READS`, with its tier and in-quota) → (quota version, hold version, the
    answer): until quota usage or the holds change (a claim signals its victims and holds
    capacity in one go)."""
    victim_tiers: tuple[int, ...] | None = None
    """Tiers with a running job not already leaving when the pass began: for the pass."""
    every: tuple[list[Candidate], dict[str, int], bool, bool] | None = None
    """Every running job a tier-1 preemptor may take now, priced (`Victims._every`): once a
    pass; both pools of `candidates` are drawn from it."""
    candidates: dict[bool, CandidatePool] = field(default_factory=dict)
    """The running jobs the rules let go now, priced, as preemptors of tiers 2–4 (False) and a
    tier-1 preemptor (True) see them (`rules.guarded`): each once a pass (a claim drops its
    victims from both)."""
    lifted: dict[bool, dict[int, list[tuple[list[str], Job]]]] = field(default_factory=dict)
    """The jobs the rules let go, by tier and (tier, queue) (`Victims.lifted`), as from tiers
    2–4 and from tier 1: once a pass."""
    releases_fresh: set[bool] = field(default_factory=set)
    """Which of `Allocation.releases` (False) and `Allocation.releases_t1` (True) were refreshed
    to `now` (`Victims.releases`): once a pass."""
    overdue: dict[bool, list[tuple[float, str]]] = field(default_factory=dict)
    """(expected end, id) of the jobs the rules let go that should have ended before `now`
    (`Victims.overdue`), as from tiers 2–4 and from tier 1: once a pass."""
    leaving: list[Candidate] | None = None
    """Capacity already on its way out (`Victims.leaving`): until the next claim."""
