"""Quota along a queue path: nominal, borrowing limit, lending limit (DESIGN §2, §4.2).

For a job of demand d at leaf q0 with path q0 … qk (qk the root), for every governed resource:
- **limits**: U(qi) + d ≤ nominal(qi) + borrowing_limit(qi) on every queue; the root is the
  cluster, its limit (and nominal) the capacity the caller reports (`capacity`), so capacity
  no child's nominal covers is idle capacity any queue may borrow. Where no capacity is known
  the root is unlimited; where the nominal quotas exceed it (reported: `overcommit`) the root
  keeps their sum, so what lenders keep is not held against GPUs that do not exist: in both
  cases placement alone bounds the cluster;
- **lending**: no queue takes capacity that another queue keeps for itself. A queue keeps
  kept(s) = nominal(s) − lending_limit(s); what a subtree holds back unused is
  held(s) = max(0, kept(s) − U(s), Σ_children held(c)). At every queue qi on the path,
  U(qi) + d + Σ held(s) over the siblings s of q0 … q(i−1) ≤ limit(qi).
The job is *in-quota* when it stays within nominal on every queue below the root, else it is
*borrowing*. For preemption, a job is in-quota when it would be once capacity that other
branches borrow beyond their nominal were reclaimed (DESIGN §4.3: "in-quota after admission"). Resources no queue names are not governed. Usage of tiers that are not charged is
never counted. Usage is mutable with undo, so a pass can try admissions and preemptions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warden.engine.reasons import BorrowingLimit, QuotaExceeded, Reason

if TYPE_CHECKING:
    from warden.engine.model import Job
    from warden.engine.policy import Policy, QueueSpec

INF = math.inf
_DEMANDS_KEPT = 4096
"""Job shapes whose demand vectors a tree remembers (`QuotaTree.demand`)."""


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    fits: bool
    in_quota: bool
    reason: Reason | None = None


class QuotaTree:
    """The compiled queue tree with live usage per queue and resource."""

    __slots__ = (
        "_ancestors",
        "_demands",
        "_log",
        "child_excess",
        "child_held",
        "children",
        "depth",
        "gpu",
        "held",
        "index",
        "kept",
        "leaving",
        "limit",
        "names",
        "nominal",
        "parent",
        "paths",
        "resources",
        "usage",
    )

    def __init__(self, policy: Policy, capacity: Mapping[str, int] | None = None) -> None:
        """`capacity`: the cluster's total per resource (`cluster_totals`); a resource it lacks
        or gives as 0 (not reported) leaves the root unlimited in it, and the root never gets
        less than its children's nominal quotas add up to."""
        self.resources: tuple[str, ...] = tuple(policy.governed_resources())
        self.gpu = self.resources.index("gpu") if "gpu" in self.resources else -1
        """Where GPUs are in a demand vector (−1: GPUs are not governed)."""
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self._ancestors: dict[tuple[str, str], tuple[int, int, int]] = {}
        """`lowest_common_ancestor` of the pairs asked: the tree's shape never changes."""
        self.parent: list[int] = []
        self.children: list[list[int]] = []
        self.nominal: list[list[float]] = []
        self.limit: list[list[float]] = []
        self.kept: list[list[float]] = []

        def add(q: QueueSpec, parent: int) -> None:
            i = len(self.names)
            self.names.append(q.name)
            self.index[q.name] = i
            self.parent.append(parent)
            self.children.append([])
            if parent >= 0:
                self.children[parent].append(i)
            nom = [float(q.nominal.get(r, 0)) for r in self.resources]
            borrow = q.borrowing_limit or {}
            lend = q.lending_limit or {}
            if parent < 0:
                cap = [float((capacity or {}).get(r, 0)) for r in self.resources]
                nom = [max(c, n) if c > 0 else n for c, n in zip(cap, nom)]
                lim = [max(c, n) if c > 0 else INF for c, n in zip(cap, nom)]
            else:
                lim = [n + borrow[r] if r in borrow else INF for r, n in zip(self.resources, nom)]
            self.nominal.append(nom)
            self.limit.append(lim)
            self.kept.append([n - lend[r] if r in lend else 0.0 for r, n in zip(self.resources, nom)])
            for c in q.children:
                add(c, i)

        add(policy.queues, -1)
        n, nr = len(self.names), len(self.resources)
        self.usage: list[list[float]] = [[0.0] * nr for _ in range(n)]
        # held(q): capacity q's subtree keeps unused; child_held(q): Σ held over q's children;
        # child_excess(q): Σ over q's children of usage above nominal (what reclaim could free).
        self.held: list[list[float]] = [[0.0] * nr for _ in range(n)]
        self.child_held: list[list[float]] = [[0.0] * nr for _ in range(n)]
        self.child_excess: list[list[float]] = [[0.0] * nr for _ in range(n)]
        for i in reversed(range(n)):  # children come after their parent
            for r in range(nr):
                self.held[i][r] = max(self.kept[i][r], self.child_held[i][r])
                if self.parent[i] >= 0:
                    self.child_held[self.parent[i]][r] += self.held[i][r]
        self.paths: dict[str, tuple[int, ...]] = {
            name: self.paths_to_root(i) for i, name in enumerate(self.names) if not self.children[i]
        }
        self.depth: list[int] = [len(self.paths_to_root(i)) for i in range(n)]
        self.leaving: list[list[float]] = [[0.0] * nr for _ in range(n)]
        self._demands: dict[tuple[int, int, int, int, str], tuple[float, ...]] = {}
        self._log: list[tuple[list[float], int, float]] = []
        """The journal: (row, resource, value replaced), oldest first (`rollback`)."""

    def paths_to_root(self, i: int) -> tuple[int, ...]:
        path = []
        while i >= 0:
            path.append(i)
            i = self.parent[i]
        return tuple(path)

    # -- demand -------------------------------------------------------------------------------
    def demand(self, job: Job, flavor: str) -> tuple[float, ...]:
        """The job's whole-gang demand per governed resource when placed on `flavor`.

        Remembered per shape: a pass asks it for thousands of jobs of a few dozen shapes (and
        the tree lives as long as its policy, so the memory is bounded)."""
        key = (job.replicas, job.gpus, job.cpu, job.memory, flavor)
        d = self._demands.get(key)
        if d is None:
            if len(self._demands) >= _DEMANDS_KEPT:
                self._demands.clear()
            d = self._demands[key] = self._demand(job, flavor)
        return d

    def _demand(self, job: Job, flavor: str) -> tuple[float, ...]:
        r = job.replicas
        out = []
        for name in self.resources:
            if name == "gpu":
                out.append(float(job.gpus * r))
            elif name == "cpu":
                out.append(float(job.cpu * r))
            elif name == "memory":
                out.append(float(job.memory * r))
            elif name == "gpu:" + flavor:
                out.append(float(job.gpus * r))
            else:
                out.append(0.0)
        return tuple(out)

    # -- usage --------------------------------------------------------------------------------
    # Every change to a cell of `usage`, `held`, `child_held`, `child_excess` or `leaving` is
    # journalled with the value it replaced, and `rollback` writes those values back: the state
    # after a rollback is the state at the mark, bit for bit, not a recomputation of it.
    def mark(self) -> int:
        return len(self._log)

    def forget(self) -> None:
        """Drop the journal: what was done so far is kept for good (no mark may be open)."""
        self._log.clear()

    def rollback(self, token: int) -> None:
        log = self._log
        while len(log) > token:
            row, r, old = log.pop()
            row[r] = old

    def depart(self, leaf: str, d: tuple[float, ...]) -> None:
        """Note usage that is leaving (its job was signalled): it still counts against limits
        until the job exits, but a branch is no longer borrowing what is already on its way out."""
        log = self._log
        for q in self.paths[leaf]:
            row = self.leaving[q]
            for r, x in enumerate(d):
                if x:
                    log.append((row, r, row[r]))
                    row[r] += x

    def add(self, leaf: str, d: tuple[float, ...]) -> None:
        self._apply([(q, d) for q in self.paths[leaf]])

    def remove(self, leaf: str, d: tuple[float, ...]) -> None:
        neg = tuple(-x for x in d)
        self._apply([(q, neg) for q in self.paths[leaf]])

    def path_usage(self, leaf: str, d: tuple[float, ...]) -> list[tuple[int, tuple[float, ...]]]:
        """A leaf's demand as per-queue usage along its path, leaf first."""
        return [(q, d) for q in self.paths[leaf]]

    def transfer(
        self, leaf: str, d: tuple[float, ...], leaving: list[list[tuple[int, tuple[float, ...]]]]
    ) -> list[list[tuple[int, tuple[float, ...]]]]:
        """Charge a job that will start once `leaving` usage (per queue) is gone, without
        counting twice; return what of each leaving entry this job does not take over.

        Until they exit both are there, so each queue is charged max(0, job − leaving) on top of
        its usage: the larger of now and after, never less than the truth at any moment. The
        leaving usage the job does not replace will vanish at exit, and the next job waiting on
        the same exits may count on it.
        """
        need = {q: list(d) for q in self.paths[leaf]}
        left_over = []
        for entry in leaving:
            rest = []
            for q, vec in entry:
                want = need.get(q)
                if want is None:
                    rest.append((q, vec))
                    continue
                remaining = []
                for r, x in enumerate(vec):
                    took = min(x, max(0.0, want[r]))
                    want[r] -= took
                    remaining.append(x - took)
                if any(x > 0 for x in remaining):
                    rest.append((q, tuple(remaining)))
            left_over.append(rest)
        self._apply([(q, tuple(max(0.0, x) for x in row)) for q, row in need.items() if any(x > 0 for x in row)])
        return left_over

    def adjust(self, changes: list[tuple[int, tuple[float, ...]]], sign: int) -> None:
        """Add (sign 1) or remove (sign −1) per-queue usage, as `transfer` returns it."""
        self._apply([(q, tuple(sign * x for x in d)) for q, d in changes])

    def _apply(self, changes: list[tuple[int, tuple[float, ...]]]) -> None:
        """Apply per-queue usage deltas, journalled, and keep `held` true up to the root.

        A queue's `held` depends on its own usage and on its children's `held`, so a change
        anywhere on a path is carried upward until a queue's `held` no longer moves; the order
        of `changes` does not matter.
        """
        log = self._log
        usage, child_excess, nominal, parent = self.usage, self.child_excess, self.nominal, self.parent
        for q, d in changes:
            u, n, p = usage[q], nominal[q], parent[q]
            for r, delta in enumerate(d):
                if not delta:
                    continue
                before = u[r]
                after = before + delta
                log.append((u, r, before))
                u[r] = after
                if p >= 0:
                    moved = max(0.0, after - n[r]) - max(0.0, before - n[r])
                    if moved:
                        ce = child_excess[p]
                        log.append((ce, r, ce[r]))
                        ce[r] += moved
                self._carry_held(q, r)

    def _carry_held(self, q: int, r: int) -> None:
        """Recompute held(q) for resource r and carry any change to the ancestors."""
        log, held, child_held, kept, usage, parent = (
            self._log,
            self.held,
            self.child_held,
            self.kept,
            self.usage,
            self.parent,
        )
        while q >= 0:
            h = held[q]
            new = max(0.0, kept[q][r] - usage[q][r], child_held[q][r])
            old = h[r]
            if new == old:
                return
            log.append((h, r, old))
            h[r] = new
            p = parent[q]
            if p >= 0:
                ch = child_held[p]
                log.append((ch, r, ch[r]))
                ch[r] += new - old
            q = p

    def check(self) -> None:
        """Assert that every derived value equals its definition over `usage` (tests call it
        after every pass, beside `CapacityIndex.check`)."""
        n, nr = len(self.names), len(self.resources)
        held = [[0.0] * nr for _ in range(n)]
        child_held = [[0.0] * nr for _ in range(n)]
        child_excess = [[0.0] * nr for _ in range(n)]
        for i in reversed(range(n)):
            for r in range(nr):
                held[i][r] = max(0.0, self.kept[i][r] - self.usage[i][r], child_held[i][r])
                p = self.parent[i]
                if p >= 0:
                    child_held[p][r] += held[i][r]
                    child_excess[p][r] += max(0.0, self.usage[i][r] - self.nominal[i][r])
        for i in range(n):
            for r in range(nr):
                name = f"{self.names[i]}/{self.resources[r]}"
                assert abs(held[i][r] - self.held[i][r]) < 1e-6, f"held {name}: {self.held[i][r]} != {held[i][r]}"
                assert abs(child_held[i][r] - self.child_held[i][r]) < 1e-6, (
                    f"child_held {name}: {self.child_held[i][r]} != {child_held[i][r]}"
                )
                assert abs(child_excess[i][r] - self.child_excess[i][r]) < 1e-6, (
                    f"child_excess {name}: {self.child_excess[i][r]} != {child_excess[i][r]}"
                )

    # -- checks -------------------------------------------------------------------------------
    def violation(self, leaf: str, d: tuple[float, ...]) -> tuple[int, int, float, float] | None:
        """The first limit the demand breaks: (queue, resource, amount over, held by others).

        None when it fits. Only queues in the subtree of the returned queue can make room by
        shrinking their usage. Never changes usage.
        """
        path = self.paths[leaf]
        usage, limit, held, child_held = self.usage, self.limit, self.held, self.child_held
        for r, amount in enumerate(d):
            if not amount:
                continue
            others = 0.0  # what the siblings of the path below this queue keep unused
            for i, q in enumerate(path):
                if i:
                    others += child_held[q][r] - held[path[i - 1]][r]
                over = usage[q][r] + amount + others - limit[q][r]
                if over > 1e-9:
                    return q, r, over, others
        return None

    def verdict(self, leaf: str, d: tuple[float, ...]) -> QuotaVerdict:
        """Would the demand fit along the leaf's path now, and why not? Never changes usage."""
        broken = self.violation(leaf, d)
        if broken is None:
            return QuotaVerdict(True, self.in_quota(leaf, d))
        q, r, _, others = broken
        amount = d[r]
        u = self.usage[q][r]
        if u + amount > self.limit[q][r] + 1e-9 or not others:
            return QuotaVerdict(False, False, self._limit_reason(q, r, amount))
        avail = int(max(0.0, self.limit[q][r] - u - others))
        name = self.resources[r]
        reason: Reason
        if self.in_quota(leaf, d):
            reason = QuotaExceeded(self.names[q], name, int(amount), avail, int(u), _whole(self.limit[q][r]))
        else:
            reason = BorrowingLimit(self.names[self.paths[leaf][0]], name, int(amount), avail)
        return QuotaVerdict(False, False, reason)

    def fits(self, leaf: str, d: tuple[float, ...]) -> bool:
        return self.violation(leaf, d) is None

    def _limit_reason(self, q: int, r: int, amount: float) -> Reason:
        avail = int(max(0.0, self.limit[q][r] - self.usage[q][r]))
        name = self.resources[r]
        used, limit = int(self.usage[q][r]), _whole(self.limit[q][r])
        if self.limit[q][r] <= self.nominal[q][r]:
            return QuotaExceeded(self.names[q], name, int(amount), avail, used, limit)
        return BorrowingLimit(self.names[q], name, int(amount), avail, used, limit)

    def in_quota(self, leaf: str, d: tuple[float, ...], reclaim: bool = False) -> bool:
        """Would the demand stay within nominal on every queue below the root?

        With `reclaim`, usage that other branches hold beyond their own nominal does not count:
        it is what the job could take back.
        """
        if not reclaim:
            return self.over_nominal_at(leaf, d) is None
        path = self.paths[leaf][:-1]
        usage, nominal = self.usage, self.nominal
        for r, amount in enumerate(d):
            if not amount:
                continue
            excess = 0.0
            for i, q in enumerate(path):
                if i:
                    below = path[i - 1]
                    excess += self.child_excess[q][r] - max(0.0, usage[below][r] - nominal[below][r])
                if usage[q][r] + amount - excess > nominal[q][r] + 1e-9:
                    return False
        return True

    def no_borrowing(self, leaf: str, d: tuple[float, ...], tier: int) -> Reason | None:
        """Why a job of a tier that may not borrow (not preemptible) waits: `QuotaExceeded` at the
        first queue below the root the demand would take above its nominal, naming the tier;
        None when the demand is in-quota."""
        q = self.over_nominal_at(leaf, d)
        if q is None:
            return None
        usage, nominal = self.usage[q], self.nominal[q]
        r = next(r for r, amount in enumerate(d) if amount and usage[r] + amount > nominal[r] + 1e-9)
        avail = int(max(0.0, nominal[r] - usage[r]))
        return QuotaExceeded(
            self.names[q], self.resources[r], int(d[r]), avail, int(usage[r]), int(nominal[r]), no_borrow_tier=tier
        )

    def over_nominal_at(self, leaf: str, d: tuple[float, ...]) -> int | None:
        """The first queue below the root the demand would take above its nominal, or None
        (None: the demand is in-quota)."""
        usage, nominal = self.usage, self.nominal
        for q in self.paths[leaf][:-1]:
            for r, amount in enumerate(d):
                if amount and usage[q][r] + amount > nominal[q][r] + 1e-9:
                    return q
        return None

    def nominal_room(self) -> dict[str, tuple[float, ...]]:
        """Per leaf, how much of each resource its usage may still grow by before a queue below
        the root on its path goes above its nominal: a demand within it is in-quota now
        (`over_nominal_at`), read once for many demands."""
        usage, nominal = self.usage, self.nominal
        out: dict[str, tuple[float, ...]] = {}
        for leaf, path in self.paths.items():
            below = path[:-1]
            out[leaf] = tuple(
                min((nominal[q][r] - usage[q][r] for q in below), default=INF) for r in range(len(self.resources))
            )
        return out

    def over_nominal(self, q: int) -> bool:
        """Is the queue above its nominal once the usage already leaving is gone (borrowing)?"""
        usage, leaving, nominal = self.usage[q], self.leaving[q], self.nominal[q]
        for r in range(len(nominal)):  # noqa: SIM110 - a loop, not any(): asked per victim kind, per search
            if usage[r] - leaving[r] > nominal[r] + 1e-9:
                return True
        return False

    def stays_at_nominal(self, leaf: str, upto: int, d: tuple[float, ...]) -> bool:
        """Would every queue from `leaf` up to `upto` that borrows (`over_nominal`) still hold at
        least its nominal of each resource it borrows once `d` is gone, and does each borrow?
        What a nominal reclaim may take from a queue: what it borrows, never more (DESIGN §4.3)."""
        usage, leaving, nominal = self.usage, self.leaving, self.nominal
        for q in self.paths[leaf]:
            over = False
            for r, x in enumerate(d):
                held = usage[q][r] - leaving[q][r]
                if held > nominal[q][r] + 1e-9:
                    over = True
                    if held - x < nominal[q][r] - 1e-9:
                        return False
            if not over:
                return False
            if q == upto:
                return True
        return False

    def lowest_common_ancestor(self, a: str, b: str) -> tuple[int, int, int]:
        """(ancestor, child of it on a's side, child of it on b's side) for two leaves."""
        known = self._ancestors.get((a, b))
        if known is not None:
            return known
        pa, pb = self.paths[a], self.paths[b]
        ia, ib = len(pa) - 1, len(pb) - 1
        while ia > 0 and ib > 0 and pa[ia - 1] == pb[ib - 1]:
            ia -= 1
            ib -= 1
        known = self._ancestors[a, b] = (pa[ia], pa[ia - 1] if ia > 0 else -1, pb[ib - 1] if ib > 0 else -1)
        return known

    def governed(self) -> bool:
        return bool(self.resources)

    def leaves(self) -> Iterable[str]:
        return self.paths.keys()


def _whole(limit: float) -> int | None:
    """A limit as a reason states it: whole units, None where there is none (inf)."""
    return None if limit == INF else int(limit)
