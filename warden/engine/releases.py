"""Running jobs in the order their capacity frees, kept between passes (`ReleaseIndex`).

A forecast (where capacity frees first) and the question "has this preemptor any victim at
all?" both read every running job. Pass after pass the running jobs hardly change, and what
orders them does not move with time: an expected end is a time, and so is the moment the
victim rules let a job go, or protect it again (the last stretch of its time limit). So the
engine keeps them sorted between passes (in `Allocation.releases`), re-indexes only the jobs
that started, stopped or changed, moves a job from "protected" to "may go" once `now` passes
its protection, and out of "may go" for good once `now` passes the protection that starts. A pass then walks only
as far as it needs, in order, and prices the victims (`phases.victims.Victims.pool`) only when
a search has something to take.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable

from warden.engine.model import Job
from warden.engine.rules import PairKey, pair_key

INF = math.inf

Kind = PairKey
"""What the pair rules read of a victim (`rules.pair_key`; today its tier and queue): the
jobs of one kind are allowed or refused together."""
Facts = Callable[[Job], tuple[float, float, float]]
"""A job's (protected until, expected end, protected again from): when the victim rules let it
go, when it ends, and when they protect it for good (inf: never; `rules.closes_at`)."""


class ReleaseIndex:
    """The jobs that hold resources by expected end, and per kind (`Kind`) by when their
    protection lifts; which of them the victim rules let go at the last `refresh`.

    Per kind, because the pair rules decide per kind whether a preemptor may take a victim at
    all: a forecast walks only the kinds it may take. Jobs in their grace
    period stay indexed (they still hold their capacity): readers skip them, as they skip
    jobs a claimant counts on.
    """

    __slots__ = (
        "at",
        "closing",
        "dirty",
        "ending",
        "facts",
        "jobs",
        "kinds",
        "lifted",
        "protected",
        "protected_of",
    )

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        """The indexed jobs, as indexed."""
        self.facts: dict[str, tuple[float, float, float]] = {}
        """Per indexed job, (protected until, expected end, protected again from) as it was
        indexed with."""
        self.dirty: set[str] = set()
        """Jobs that started or changed since the last refresh: indexed at the next one."""
        self.ending: list[tuple[float, str]] = []
        """(expected end, id) of the jobs with an expected end, sorted."""
        self.protected: list[tuple[float, str]] = []
        """(protected until, id) of the jobs the rules did not let go at the last refresh (and
        will some day), sorted: what the next refresh may let go."""
        self.protected_of: dict[Kind, list[tuple[float, str]]] = {}
        """`protected`, per kind."""
        self.lifted: dict[Kind, list[str]] = {}
        """Per kind, the ids of the jobs the rules let go at the last refresh, sorted."""
        self.closing: list[tuple[float, str]] = []
        """(protected again from, id) of the jobs in `lifted` or `protected` that the rules will
        protect for good at that time, sorted: what the next refresh may take out of both."""
        self.kinds: dict[Kind, set[str]] = {}
        """Per kind, every indexed job."""
        self.at = -INF
        """The `now` of the last refresh."""

    # -- keeping it ---------------------------------------------------------------------------
    def add(self, job: Job) -> None:
        """The job holds resources now, or holds them as a new version: index it at the next
        refresh (its facts are priced then, with the pass's rules)."""
        self.forget(job.id)
        self.jobs[job.id] = job
        self.kinds.setdefault(pair_key(job), set()).add(job.id)
        self.dirty.add(job.id)

    def forget(self, job_id: str) -> None:
        """The job no longer holds resources (or is about to be indexed anew)."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        self.dirty.discard(job_id)
        kind = pair_key(job)
        self.kinds[kind].discard(job_id)
        facts = self.facts.pop(job_id, None)
        if facts is None:
            return
        protected, end, closes = facts
        if end < INF:
            _remove(self.ending, (end, job_id))
        if closes <= self.at:
            return  # protected for good: in neither order
        if closes < INF:
            _remove(self.closing, (closes, job_id))
        if protected <= self.at:
            _remove(self.lifted[kind], job_id)
        elif protected < INF:
            _remove(self.protected, (protected, job_id))
            _remove(self.protected_of[kind], (protected, job_id))

    def refresh(self, now: float, facts_of: Facts) -> None:
        """Index the jobs that started or changed, let go those whose protection lifted by
        `now`, and take out those a protection that starts covers by then. A `now` earlier than
        the last one indexes everything anew (what was let go or protected for good earlier may
        be neither at that `now`)."""
        if now < self.at:
            for table in (self.facts, self.protected_of, self.lifted):
                table.clear()
            self.ending.clear()
            self.protected.clear()
            self.closing.clear()
            self.dirty = set(self.jobs)
        self.at = now
        for job_id in self.dirty:  # every order is a sorted list: the order of indexing is moot
            job = self.jobs[job_id]
            self._index(job, facts_of(job), now)
        self.dirty.clear()
        protected = self.protected
        lifts = bisect_left(protected, (now, "\U0010ffff"))  # every entry protected until <= now
        if lifts:
            for entry in protected[:lifts]:
                job = self.jobs[entry[1]]
                kind = pair_key(job)
                _remove(self.protected_of[kind], entry)
                insort(self.lifted.setdefault(kind, []), job.id)
            del protected[:lifts]
        closing = self.closing
        closes = bisect_left(closing, (now, "\U0010ffff"))  # every entry closing at <= now
        if closes:
            for _, job_id in closing[:closes]:
                _remove(self.lifted[pair_key(self.jobs[job_id])], job_id)
            del closing[:closes]

    def _index(self, job: Job, facts: tuple[float, float, float], now: float) -> None:
        protected, end, closes = facts
        self.facts[job.id] = facts
        kind = pair_key(job)
        if end < INF:
            insort(self.ending, (end, job.id))
        if closes <= now:
            return  # protected for good (`rules.protection` is inf once `closes` is not after it)
        if protected <= now:
            insort(self.lifted.setdefault(kind, []), job.id)
        elif protected < INF:
            insort(self.protected, (protected, job.id))
            insort(self.protected_of.setdefault(kind, []), (protected, job.id))
        else:
            return
        if closes < INF:
            insort(self.closing, (closes, job.id))

    # -- reading ------------------------------------------------------------------------------
    def kind_jobs(self) -> dict[Kind, Job]:
        """One indexed job of each kind."""
        jobs = self.jobs
        return {kind: jobs[next(iter(ids))] for kind, ids in self.kinds.items() if ids}

    def is_lifted(self, job_id: str) -> bool:
        """Did the rules let the job go at the last refresh?"""
        facts = self.facts.get(job_id)
        return facts is not None and facts[0] <= self.at < facts[2]

    def check(self, holding: dict[str, Job], now: float, facts_of: Facts) -> None:
        """Bring the index to `now`, then raise AssertionError unless it is what indexing
        `holding` afresh at `now` gives (for the tests: kept incrementally, it must not drift).
        Protection is compared as "let go" or its time: a job indexed earlier keeps the time
        its protection lifted at, a fresh one sees it lifted."""
        self.refresh(now, facts_of)
        fresh = ReleaseIndex()
        for job in holding.values():
            fresh.add(job)
        fresh.refresh(now, facts_of)
        assert set(self.jobs) == set(holding), "indexed jobs differ from the holding ones"
        assert all(self.jobs[i] is j for i, j in holding.items()), "an indexed job is not its current version"

        def lifted_or_time(facts: dict[str, tuple[float, float, float]]) -> dict[str, tuple[float, float, float]]:
            return {
                i: (INF, end, INF) if c <= now else (0.0 if p <= now else p, end, c) for i, (p, end, c) in facts.items()
            }

        assert lifted_or_time(self.facts) == lifted_or_time(fresh.facts), "ReleaseIndex.facts drifted"
        for name in ("ending", "protected", "protected_of", "lifted", "closing", "kinds"):
            mine, theirs = getattr(self, name), getattr(fresh, name)
            if isinstance(mine, dict):
                mine = {k: v for k, v in mine.items() if v}
                theirs = {k: v for k, v in theirs.items() if v}
            assert mine == theirs, f"ReleaseIndex.{name} drifted"


def _remove(items: list, item: object) -> None:  # type: ignore[type-arg]
    i = bisect_left(items, item)
    if i < len(items) and items[i] == item:
        del items[i]
