"""Phase 3, admit: a job starts where its quota path and a placement of its whole gang fit.

Three steps per flavor the job may use (in name order; the first that fits wins):

- **assign** — the quota path (`QuotaTree.verdict`; within nominal for a tier that is not
  preemptible, which is never admitted as borrowing), then a placement on free capacity;
- **backfill** — failing that, a placement in capacity reserved for higher-ranked jobs, if the
  job may use it: it ends before the reservation is due, or the holder may preempt it at
  due − its grace (DESIGN §4.2, `PassState.lent`);
- **held** — failing that, `Reserved` if the job would fit but for capacity held for a
  higher-ranked job (a claim or a reservation), else the capacity it lacks.

A job that would borrow waits (`Claimed`) while a claimant of a tier that starts only in-quota
(tier 1) shares a queue below the root with it: what such a claim counts on is also quota, and
a job of that queue borrowing what the claimant needs would be preempted again at once, and
again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from warden.engine.model import Job, ReplicaPlacement
from warden.engine.phases.memo import HeldParts, Part, PlaceKey, Shape
from warden.engine.phases.state import Hold, PassState
from warden.engine.placement import assign_gpu_indices
from warden.engine.plan import Admission
from warden.engine.reasons import Claimed, Fragmented, InsufficientCapacity, Reason, Reserved, UnknownQueue

INF = math.inf


class Admit:
    __slots__ = ("index", "memo", "quota", "state")

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.memo = state.memo
        self.index = state.index
        self.quota = state.quota

    def attempt(self, job: Job) -> Reason | None:
        """Admit the job on the first flavor where it fits (None), or say why the first flavor
        refuses it; `UnknownQueue` when no flavor can help."""
        quota = self.quota
        if job.queue not in quota.paths:
            return UnknownQueue(job.queue, tuple(sorted(quota.leaves())))
        charged = self.state.charged(job)
        shape = (job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        first: Reason | None = None
        quota_seen = self.memo.quota_seen
        for flavor in (job.flavor,) if job.flavor is not None else self.index.flavors():
            d = quota.demand(job, flavor) if charged else ()
            in_quota = True
            if charged:
                # A refusal stays one for the pass; a fit holds until quota usage changes.
                seen = quota_seen.get((job.queue, d))
                if seen is None or (seen[1] is None and seen[0] != self.memo.quota_version):
                    seen = self._quota(job.queue, d)
                if not seen[2] and job.tier in self.state.in_quota_tiers:
                    refused = quota.no_borrowing(job.queue, d, job.tier)
                    if refused is not None:  # it would borrow: a tier that may not
                        first = first or refused
                        continue
                if seen[1] is not None:
                    first = first or seen[1]
                    continue
                in_quota = seen[2]
            names, failed, lent = self._place(job, flavor, shape)
            if names is not None and not in_quota:
                holder = self._claimed(job)
                if holder is not None:  # it would borrow what a claim counts on
                    first = first or Claimed(holder)
                    continue
            if names is not None:
                self.admit(job, flavor, names, d, borrowing=not in_quota, lent=lent)
                return None
            first = first or failed
        if first is None:  # a cluster without nodes
            first = InsufficientCapacity("gpu", job.total_gpus, 0)
        return first

    def _claimed(self, job: Job) -> str | None:
        """A claimant the job may not borrow against, or None: one of a tier that starts only
        in-quota sharing a queue below the root with it, whose usage that claimant counts on."""
        queues = self.state.claim_queues
        if not queues:
            return None
        return next((queues[q] for q in self.quota.paths[job.queue][:-1] if queues.get(q, job.id) != job.id), None)

    def _quota(self, queue: str, d: tuple[float, ...]) -> tuple[int, Reason | None, bool]:
        """(quota version, why the demand does not fit the queue's path or None, whether it is
        in-quota), remembered (`Memo.quota_seen`; `attempt` reads it inline)."""
        memo = self.memo
        verdict = self.quota.verdict(queue, d)
        seen = memo.quota_seen[queue, d] = (memo.quota_version, verdict.reason, verdict.in_quota)
        return seen

    def _place(self, job: Job, flavor: str, shape: Shape) -> tuple[tuple[str, ...] | None, Reason | None, bool]:
        """Where the gang goes on the flavor: free capacity, else reservations it may backfill;
        else (None) why not — `Reserved`, or the capacity it lacks. And whether it goes into
        a reservation it would not leave before it is due (`Attempt.lent`)."""
        names = self.index.find(flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement)
        if names is not None:
            return names, None, False
        pkey = (flavor, *shape)
        memo = self.memo
        seen = memo.capacity_seen.get(pkey)
        failed = (
            seen[1]
            if seen is not None and seen[0] == memo.capacity_version
            else self._capacity_reason(job, flavor, pkey)
        )
        if self.state.holds:
            if self.state.reserved:
                names = self.backfill(job, flavor)
                if names is not None:
                    return names, None, not self._ends_in_time(job)
            failed = self.held(job, flavor, pkey) or failed
        return None, failed, False

    def _ends_in_time(self, job: Job) -> bool:
        """Does the job end before every reservation is due (so none needs to take it back)?"""
        d = self.state.now + job.time_limit if job.time_limit is not None else INF
        return all(h.due is not None and d <= h.due for h in self.state.reserved)

    def _capacity_reason(self, job: Job, flavor: str, pkey: PlaceKey) -> Reason:
        """InsufficientCapacity or Fragmented, with the free GPUs now, remembered until free
        capacity changes (`Memo.capacity_seen`; `_place` reads it inline)."""
        memo = self.memo
        need = job.total_gpus
        index = self.index
        free = index.free_gpus(flavor) if flavor in index.flavors() else 0
        reason: Reason
        if free >= need and need > 0:
            reason = Fragmented(job.placement, need, free, index.largest_domain(flavor, job.placement))
        else:
            reason = InsufficientCapacity("gpu" if flavor == "default" else f"gpu:{flavor}", need, free)
        memo.capacity_seen[pkey] = (memo.capacity_version, reason)
        return reason

    def admit(
        self, job: Job, flavor: str, names: Sequence[str], d: tuple[float, ...], borrowing: bool, lent: bool = False
    ) -> None:
        """Place the gang for good: capacity, quota usage, GPU indices, the admission."""
        state, memo = self.state, self.memo
        self.index.place(names, job.gpus, job.cpu, job.memory)
        memo.capacity_version += 1
        if d:
            self.quota.add(job.queue, d)
            memo.quota_version += 1
        placement = []
        used_on = state.used
        for name in names:
            used = used_on.get(name, 0)
            gpus, taken = assign_gpu_indices(state.node_gpus[name], used, job.gpus)
            used_on[name] = used | taken
            placement.append(ReplicaPlacement(name, gpus))
        state.admissions.append(Admission(job.id, tuple(placement), flavor, borrowing, lent))

    # -- backfill into reservations -------------------------------------------------------------
    def backfill(self, job: Job, flavor: str) -> tuple[str, ...] | None:
        """Try the capacity reserved for higher-ranked jobs that this job may use until due:
        the reservations it ends before, or whose holders may take it back then
        (`PassState.lent`)."""
        state, memo = self.state, self.memo
        lent = state.lent
        usable = [h for h in state.reserved if lent(job, h)]
        if not usable:
            return None
        # Free plus usable held capacity only shrinks while the holds stay as they are.
        ids = tuple([id(h) for h in usable])
        key = (flavor, job.replicas, job.gpus, job.cpu, job.memory, job.placement, ids)
        if memo.backfill_fail.get(key) == memo.hold_version:
            return None
        # Only the flavor's own nodes matter to a placement on it: release the holds there
        # first, and the rest only once the job is found to fit.
        here, elsewhere, _, per_node = self._held_parts(usable, ids, flavor)
        names = None
        if job.replicas > 1 or self._one_fits_with(job, per_node):
            names = self._share(job, flavor, usable, here, elsewhere)
        if names is None:
            memo.backfill_fail[key] = memo.hold_version
        return names

    def _share(
        self, job: Job, flavor: str, usable: list[Hold], here: list[Part], elsewhere: list[Part]
    ) -> tuple[str, ...] | None:
        """Place the job in free capacity plus the usable holds' parts (`here` on the flavor,
        `elsewhere` not); each reservation keeps what is left of its part. None: no room."""
        state, memo, index = self.state, self.memo, self.index
        mark = index.mark()
        for part in here:
            index.give(*part)
        names = state.find(flavor, job)
        if names is None:
            index.rollback(mark)
            return None
        for part in elsewhere:
            index.give(*part)
        index.place(names, job.gpus, job.cpu, job.memory)
        for h in usable:
            h.parts = state.take_free(h.parts)
        memo.hold_version += 1
        memo.capacity_version += 1
        for name in names:
            index.give(name, job.gpus, job.cpu, job.memory)
        index.release(mark)
        return names

    # -- held for others ------------------------------------------------------------------------
    def held(self, job: Job, flavor: str, pkey: PlaceKey) -> Reason | None:
        """`Reserved` when the job would fit but for capacity held for a higher-ranked job.

        Free plus held capacity only shrinks during a pass, so a shape that does not fit even
        with every hold released never will; a `Reserved` answer holds until the holds change.
        """
        state, memo = self.state, self.memo
        if pkey in memo.held_fail:
            return None
        known = memo.held_ok.get(pkey)
        if known is not None and known[0] == memo.hold_version:
            return known[1]
        # Only the flavor's own nodes matter to a placement on it: release the holds there.
        parts, _, held, per_node = self._held_parts(state.holds, state.hold_ids, flavor)
        if self.index.free_gpus(flavor) + held < job.total_gpus:
            memo.held_fail.add(pkey)
            return None
        if job.replicas == 1:
            fits = self._one_fits_with(job, per_node)
        else:
            mark = self.index.mark()
            for part in parts:
                self.index.give(*part)
            fits = state.find(flavor, job) is not None
            self.index.rollback(mark)
        if not fits:
            memo.held_fail.add(pkey)
            return None
        holder = state.holds[0]
        reason = Reserved(holder.job_id, holder.due)
        memo.held_ok[pkey] = (memo.hold_version, reason)
        return reason

    def _held_parts(self, holds: Sequence[Hold], ids: tuple[int, ...], flavor: str) -> HeldParts:
        """The parts of `holds` (whose `id`s are `ids`) on the flavor's nodes, those elsewhere,
        the GPUs of the first, and the first summed per node; kept until the holds change."""
        memo = self.memo
        key = (flavor, ids)
        seen = memo.held_parts.get(key)
        if seen is not None and seen[0] == memo.hold_version:
            return seen[1]
        flavor_of = self.index.flavor_of
        here: list[Part] = []
        elsewhere: list[Part] = []
        for h in holds:
            for part in h.parts:
                (here if flavor_of(part[0]) == flavor else elsewhere).append(part)
        per_node: dict[str, list[int]] = {}
        for node, g, c, m in here:
            total = per_node.setdefault(node, [0, 0, 0])
            total[0] += g
            total[1] += c
            total[2] += m
        found = (here, elsewhere, sum(part[1] for part in here), per_node)
        memo.held_parts[key] = (memo.hold_version, found)
        return found

    def _one_fits_with(self, job: Job, extra: dict[str, list[int]]) -> bool:
        """Would one replica of the job fit on one of these nodes, with `extra` (node → gpus,
        cpu, memory) added to what is free there?

        `find` after giving `extra` back, for a single-replica job the current free capacity
        cannot place, without changing the index: every placement constraint then asks for one
        node with room (`placement` module docstring), and only the nodes given to can have it.
        Untracked CPU or memory (a node declaring 0) never limits, as in the index.
        """
        g, c, m = job.gpus, job.cpu, job.memory
        index = self.index
        for node, (hg, hc, hm) in extra.items():
            fg, fc, fm = index.free(node)
            if fg + hg < g:
                continue
            _, cc, cm = index.capacity(node)
            if (c and cc and fc + hc < c) or (m and cm and fm + hm < m):
                continue
            return True
        return False
