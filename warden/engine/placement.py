"""Gang placement over a free-capacity index (DESIGN §2 "placement", §4.2 (b)).

The scheduler asks "where would this gang go now?" for every pending job of every pass, so
`CapacityIndex.find` must not scan every node in the common case. Per GPU flavor the index keeps
nodes bucketed by their free GPU count (with a sorted list of the distinct counts, so "the
smallest free count >= n" is one bisect), the same per topology block, and the blocks bucketed
by their free total. Queries then touch only the buckets that can matter.

Why greedy best-fit is exact here: every replica of a gang is identical, so a node can host
``n_i = min(free_gpus // gpus, free_cpu // cpu, free_mem // mem)`` replicas (untracked or
unrequested dimensions are unlimited), and placing one replica lowers exactly that node's
``n_i`` by one. A gang is therefore feasible in a domain iff ``sum(n_i) >= replicas``, and a
greedy that only ever picks nodes that fit finds a placement whenever one exists. The same
monotonicity makes a negative answer stay negative while capacity only shrinks, which is what
the per-flavor cache of failed shapes relies on: an entry is dropped when capacity grows (a
give), and entries recorded after a mark are dropped when the index rolls back to it.

Pure code: no I/O, no clock, no randomness; every choice is ordered by free count and then by
the node's (or block's) position in the constructor's sequence, so answers are deterministic.
CPU is in millicores and memory in MiB; a node declaring 0 of either does not track it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence

from warden.engine.model import Node

__all__ = ["CONSTRAINTS", "CapacityIndex", "assign_gpu_indices", "check_unavailable", "gpu_mask"]

CONSTRAINTS: tuple[str, ...] = ("pack", "block", "any")
_FAILED_CACHE_MAX = 4096
"""Bound on remembered infeasible shapes per flavor, so a pass over many distinct shapes
cannot grow memory without limit."""


class _Buckets:
    """Items (node or block positions) grouped by a count, with the distinct counts sorted.

    Each bucket is a sorted list of positions, so the earliest item of a count is ``[0]`` and
    iteration follows constructor order without sorting at query time.
    """

    __slots__ = ("by_count", "counts")

    def __init__(self) -> None:
        self.by_count: dict[int, list[int]] = {}
        self.counts: list[int] = []

    def add(self, count: int, item: int) -> None:
        bucket = self.by_count.get(count)
        if bucket is None:
            self.by_count[count] = [item]
            insort(self.counts, count)
        else:
            insort(bucket, item)

    def remove(self, count: int, item: int) -> None:
        bucket = self.by_count[count]
        del bucket[bisect_left(bucket, item)]
        if not bucket:
            del self.by_count[count]
            del self.counts[bisect_left(self.counts, count)]

    def move(self, old: int, new: int, item: int) -> None:
        """`remove(old, item)` then `add(new, item)`, written out: every take and give moves a
        node in three of these, and the calls were a sizeable part of it."""
        if old == new:
            return
        by_count = self.by_count
        bucket = by_count[old]
        del bucket[bisect_left(bucket, item)]
        if not bucket:
            del by_count[old]
            del self.counts[bisect_left(self.counts, old)]
        into = by_count.get(new)
        if into is None:
            by_count[new] = [item]
            insort(self.counts, new)
        else:
            insort(into, item)

    def largest(self) -> int:
        return self.counts[-1] if self.counts else 0

    def replica_bound(self, gpus: int, replicas: int) -> int:
        """Whole replicas of `gpus` the items could host on GPUs alone, counted up to `replicas`.

        Walks the distinct counts from the top, so it stops after a few buckets when the answer
        is yes and costs O(distinct counts) when it is no; it never visits items.
        """
        counts, by_count = self.counts, self.by_count
        total = 0
        for j in range(len(counts) - 1, -1, -1):
            k = counts[j]
            if k < gpus:
                break
            total += len(by_count[k]) * (k // gpus)
            if total >= replicas:
                break
        return total


class _Multiset:
    """Counts of values with the distinct values sorted: the largest is O(1), updates O(log)."""

    __slots__ = ("n", "values")

    def __init__(self) -> None:
        self.n: dict[int, int] = {}
        self.values: list[int] = []

    def add(self, v: int) -> None:
        c = self.n.get(v, 0)
        if not c:
            insort(self.values, v)
        self.n[v] = c + 1

    def remove(self, v: int) -> None:
        c = self.n[v] - 1
        if c:
            self.n[v] = c
        else:
            del self.n[v]
            del self.values[bisect_left(self.values, v)]

    def largest(self) -> int:
        return self.values[-1] if self.values else 0

    def replace(self, old: int, new: int) -> None:
        """`remove(old)` then `add(new)`, written out (see `_Buckets.move`)."""
        n = self.n
        c = n[old] - 1
        if c:
            n[old] = c
        else:
            del n[old]
            del self.values[bisect_left(self.values, old)]
        c = n.get(new, 0)
        if not c:
            insort(self.values, new)
        n[new] = c + 1


class _Block:
    """The nodes of one flavor inside one topology block."""

    __slots__ = ("free", "name", "nodes", "pos")

    def __init__(self, pos: int, name: str) -> None:
        self.pos = pos
        self.name = name
        self.free = 0
        self.nodes = _Buckets()


class _Flavor:
    """Everything indexed for one GPU flavor."""

    __slots__ = (
        "block_list",
        "blocks",
        "capacity",
        "cpu",
        "cpu_untracked",
        "failed",
        "failed_at",
        "free",
        "memory",
        "memory_untracked",
        "name",
        "nodes",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.free = 0
        self.capacity = 0
        self.nodes = _Buckets()
        self.blocks = _Buckets()
        self.block_list: list[_Block] = []
        # Free cpu / memory of the nodes that track them, for an O(1) "no node has enough"
        # reject; a flavor with any untracked node can never be rejected on that dimension.
        self.cpu = _Multiset()
        self.memory = _Multiset()
        self.cpu_untracked = False
        self.memory_untracked = False
        # Shapes known infeasible, each with the log position it was found at (nondecreasing
        # in `failed_at`, so a rollback drops the newer ones from the tail).
        self.failed: dict[tuple[str, int, int, int, int], int] = {}
        self.failed_at: list[tuple[int, tuple[str, int, int, int, int]]] = []

    def may_hold(self, replicas: int, gpus: int, cpu: int, memory: int, constraint: str) -> bool:
        """False when totals and maxima already rule the gang out: O(1) or O(distinct free
        counts), never per node. True: a placement may exist."""
        need = replicas * gpus
        if self.free < need:
            return False
        pack = constraint == "pack"
        if pack:
            if self.nodes.largest() < need:
                return False
        else:
            if constraint == "block" and self.blocks.largest() < need:
                return False
            if gpus and self.nodes.replica_bound(gpus, replicas) < replicas:
                return False
        if cpu and not self.cpu_untracked and self.cpu.largest() < (replicas * cpu if pack else cpu):
            return False
        return not (
            memory and not self.memory_untracked and self.memory.largest() < (replicas * memory if pack else memory)
        )

    def remember_failure(self, key: tuple[str, int, int, int, int], at: int) -> None:
        """The shape has no placement as of log position `at` (a full cache is emptied first)."""
        if len(self.failed) >= _FAILED_CACHE_MAX:
            self.forget_failures()
        self.failed[key] = at
        self.failed_at.append((at, key))

    def forget_failures(self, after: int | None = None) -> None:
        """Drop every remembered failure, or those recorded at a log position > `after`."""
        if after is None:
            self.failed.clear()
            self.failed_at.clear()
            return
        failed_at = self.failed_at
        while failed_at and failed_at[-1][0] > after:
            del self.failed[failed_at.pop()[1]]


class CapacityIndex:
    """Free capacity of every node, indexed per GPU flavor by free GPU count; mutable with undo.

    `mark()`/`rollback()` let the scheduler try a gang (or a preemption) and take it back
    cheaply; changes are logged only while a mark is open.
    """

    __slots__ = (
        "_base",
        "_block",
        "_cc",
        "_cg",
        "_cm",
        "_fc",
        "_fg",
        "_flavor",
        "_flavor_names",
        "_flavors",
        "_fm",
        "_log",
        "_marks",
        "_names",
        "_next_token",
        "_pos",
    )

    def __init__(self, nodes: Sequence[Node]) -> None:
        self._names: list[str] = []
        self._pos: dict[str, int] = {}
        self._fg: list[int] = []
        self._fc: list[int] = []
        self._fm: list[int] = []
        self._cg: list[int] = []
        self._cc: list[int] = []
        self._cm: list[int] = []
        self._flavor: list[_Flavor] = []
        self._block: list[_Block] = []
        self._flavors: dict[str, _Flavor] = {}
        self._log: list[tuple[int, int, int, int]] = []
        self._base = 0
        # Open marks as runs [first token, last token, log position], tokens increasing.
        # Consecutive marks at one position share a run, so try-and-roll-back loops stay O(1)
        # in memory; tokens are never reused, so a stale token is always caught.
        self._marks: list[list[int]] = []
        self._next_token = 0
        block_of: dict[tuple[str, bool, str], _Block] = {}
        for i, node in enumerate(nodes):
            if node.name in self._pos:
                raise ValueError(f"duplicate node name {node.name!r}")
            if node.gpus < 0 or node.cpu < 0 or node.memory < 0:
                raise ValueError(f"node {node.name!r} declares a negative capacity")
            check_unavailable(node)
            gpus = node.gpus - len(node.unavailable)
            self._pos[node.name] = i
            self._names.append(node.name)
            self._fg.append(gpus)
            self._cg.append(gpus)
            self._fc.append(node.cpu)
            self._cc.append(node.cpu)
            self._fm.append(node.memory)
            self._cm.append(node.memory)
            fl = self._flavors.get(node.flavor)
            if fl is None:
                fl = self._flavors[node.flavor] = _Flavor(node.flavor)
            # A node without a block label is a block of its own; keep its key apart from
            # labelled blocks so a label equal to some node's name cannot merge the two.
            label = node.name if node.block is None else node.block
            key = (node.flavor, node.block is None, label)
            blk = block_of.get(key)
            if blk is None:
                blk = block_of[key] = _Block(len(fl.block_list), label)
                fl.block_list.append(blk)
            self._flavor.append(fl)
            self._block.append(blk)
            fl.nodes.add(gpus, i)
            blk.nodes.add(gpus, i)
            blk.free += gpus
            fl.free += gpus
            fl.capacity += gpus
            if node.cpu:
                fl.cpu.add(node.cpu)
            else:
                fl.cpu_untracked = True
            if node.memory:
                fl.memory.add(node.memory)
            else:
                fl.memory_untracked = True
        for fl in self._flavors.values():
            for blk in fl.block_list:
                fl.blocks.add(blk.free, blk.pos)
        self._flavor_names = tuple(sorted(self._flavors))

    # ----------------------------------------------------------------- reading

    def free(self, node: str) -> tuple[int, int, int]:
        """(gpus, cpu, memory) free on `node`; an untracked dimension reads 0."""
        i = self._pos[node]
        return self._fg[i], self._fc[i], self._fm[i]

    def capacity(self, node: str) -> tuple[int, int, int]:
        """(gpus, cpu, memory) the node declared, its unavailable GPUs left out; 0 cpu/memory
        means not tracked."""
        i = self._pos[node]
        return self._cg[i], self._cc[i], self._cm[i]

    def flavors(self) -> tuple[str, ...]:
        return self._flavor_names

    def flavor_of(self, node: str) -> str:
        return self._flavor[self._pos[node]].name

    def block_of(self, node: str) -> str:
        """The node's placement block: its label, or its own name when it has none."""
        return self._block[self._pos[node]].name

    def free_gpus(self, flavor: str) -> int:
        """Total free GPUs in `flavor` (0 for an unknown flavor), O(1)."""
        fl = self._flavors.get(flavor)
        return 0 if fl is None else fl.free

    def capacity_gpus(self, flavor: str) -> int:
        fl = self._flavors.get(flavor)
        return 0 if fl is None else fl.capacity

    def slots(self, flavor: str, gpus: int, cap: int) -> int:
        """How many replicas of `gpus` GPUs the flavor's nodes hold now, counted up to `cap`
        (GPUs alone; O(distinct free counts), never visits nodes)."""
        fl = self._flavors.get(flavor)
        if fl is None or gpus <= 0:
            return 0
        return min(cap, fl.nodes.replica_bound(gpus, cap))

    def largest_domain(self, flavor: str, constraint: str) -> int:
        """Most free GPUs in one placement domain (for the `Fragmented` explanation).

        One node for "pack", one block for "block", the whole flavor for "any".
        """
        if constraint not in CONSTRAINTS:
            raise ValueError(f"unknown placement constraint {constraint!r}")
        fl = self._flavors.get(flavor)
        if fl is None:
            return 0
        if constraint == "pack":
            return fl.nodes.largest()
        if constraint == "block":
            return fl.blocks.largest()
        return fl.free

    def check(self) -> None:
        """Recount every index from the per-node free values; AssertionError on any drift.

        O(nodes): for tests and debugging, never called on the hot path.
        """
        for fl in self._flavors.values():
            members = [i for i, f in enumerate(self._flavor) if f is fl]
            assert fl.free == sum(self._fg[i] for i in members)
            assert fl.capacity == sum(self._cg[i] for i in members)
            _check_buckets(fl.nodes, {i: self._fg[i] for i in members})
            for blk in fl.block_list:
                inside = {i: self._fg[i] for i in members if self._block[i] is blk}
                assert blk.free == sum(inside.values())
                _check_buckets(blk.nodes, inside)
            _check_buckets(fl.blocks, {b.pos: b.free for b in fl.block_list})
            cpu = sorted(self._fc[i] for i in members if self._cc[i])
            mem = sorted(self._fm[i] for i in members if self._cm[i])
            assert sorted(v for v, n in fl.cpu.n.items() for _ in range(n)) == cpu
            assert sorted(v for v, n in fl.memory.n.items() for _ in range(n)) == mem
            assert fl.cpu.values == sorted(set(cpu)) and fl.memory.values == sorted(set(mem))
            assert fl.cpu_untracked == any(not self._cc[i] for i in members)
            assert fl.memory_untracked == any(not self._cm[i] for i in members)
            assert sorted(fl.failed.items(), key=lambda kv: kv[1]) == [(k, at) for at, k in fl.failed_at]
            at = self._base + len(self._log)
            assert all(p <= at for p, _ in fl.failed_at)
            assert [p for p, _ in fl.failed_at] == sorted(p for p, _ in fl.failed_at)
        assert all(a[1] < b[0] and a[2] <= b[2] for a, b in zip(self._marks, self._marks[1:]))
        assert self._marks or not self._log

    # ----------------------------------------------------------------- finding

    def find(
        self, flavor: str, replicas: int, gpus: int, cpu: int = 0, memory: int = 0, constraint: str = "any"
    ) -> tuple[str, ...] | None:
        """One node name per replica (repeated when replicas share a node), or None.

        None means no placement of the whole gang exists now under `constraint`; the answer is
        exact (see the module docstring). The index is not changed.
        """
        if replicas < 1 or gpus < 0 or cpu < 0 or memory < 0 or constraint not in CONSTRAINTS:
            _invalid_shape(replicas, gpus, cpu, memory, constraint)
        fl = self._flavors.get(flavor)
        if fl is None or not fl.may_hold(replicas, gpus, cpu, memory, constraint):
            return None
        key = (constraint, replicas, gpus, cpu, memory)
        if key in fl.failed:
            return None
        if constraint == "pack":
            out = self._find_pack(fl, replicas, gpus, cpu, memory)
        elif constraint == "block":
            out = self._find_block(fl, replicas, gpus, cpu, memory)
        else:
            out = self._fill(fl.nodes, replicas, gpus, cpu, memory)
        if out is None:
            fl.remember_failure(key, self._base + len(self._log))
            return None
        return tuple(out)

    def _find_pack(self, fl: _Flavor, replicas: int, gpus: int, cpu: int, memory: int) -> list[str] | None:
        """Best fit: the node with the fewest free GPUs that holds the whole gang."""
        counts, by_count = fl.nodes.counts, fl.nodes.by_count
        start = bisect_left(counts, replicas * gpus)
        if not cpu and not memory:
            if start == len(counts):
                return None
            return [self._names[by_count[counts[start]][0]]] * replicas
        want_c, want_m = replicas * cpu, replicas * memory
        fc, fm, cc, cm = self._fc, self._fm, self._cc, self._cm
        for j in range(start, len(counts)):
            for i in by_count[counts[j]]:
                if cpu and cc[i] and fc[i] < want_c:
                    continue
                if memory and cm[i] and fm[i] < want_m:
                    continue
                return [self._names[i]] * replicas
        return None

    def _find_block(self, fl: _Flavor, replicas: int, gpus: int, cpu: int, memory: int) -> list[str] | None:
        """The block with the fewest free GPUs that hosts the gang; best fit inside it.

        Blocks are visited in (free, block order) from the first with enough free GPUs; each is
        rejected by its GPU replica bound (O(distinct counts in the block)) before any node is
        looked at, so the work is proportional to the number of blocks at most.
        """
        counts, by_count = fl.blocks.counts, fl.blocks.by_count
        blocks = fl.block_list
        for j in range(bisect_left(counts, replicas * gpus), len(counts)):
            for b in by_count[counts[j]]:
                blk = blocks[b]
                if gpus and blk.nodes.replica_bound(gpus, replicas) < replicas:
                    continue
                out = self._fill(blk.nodes, replicas, gpus, cpu, memory)
                if out is not None:
                    return out
        return None

    def _fill(self, nodes: _Buckets, replicas: int, gpus: int, cpu: int, memory: int) -> list[str] | None:
        """Greedy best fit over `nodes`: each replica on the fitting node with fewest free GPUs.

        Placing a replica on the best node leaves that node the best one for as long as it
        still fits (every node with fewer free GPUs was already found not to fit), so the
        greedy fills nodes one by one in (free, position) order without simulating takes.
        """
        counts, by_count = nodes.counts, nodes.by_count
        names = self._names
        out: list[str] = []
        left = replicas
        tracked = bool(cpu or memory)
        fc, fm, cc, cm = self._fc, self._fm, self._cc, self._cm
        for j in range(bisect_left(counts, gpus), len(counts)):
            k = counts[j]
            per = k // gpus if gpus else left
            for i in by_count[k]:
                n = per
                if tracked:
                    if cpu and cc[i]:
                        n = min(n, fc[i] // cpu)
                    if memory and cm[i]:
                        n = min(n, fm[i] // memory)
                    if n <= 0:
                        continue
                if n >= left:
                    out.extend([names[i]] * left)
                    return out
                out.extend([names[i]] * n)
                left -= n
        return None

    # ----------------------------------------------------------------- changing

    def take(self, node: str, gpus: int, cpu: int = 0, memory: int = 0) -> None:
        """Allocate on `node`; ValueError (and no change) if a tracked dimension would go < 0.

        cpu/memory on a node that does not track them are accepted and not recorded. An
        unknown node is a KeyError.
        """
        i = self._pos[node]
        if gpus < 0 or cpu < 0 or memory < 0:
            raise ValueError("take amounts must not be negative")
        dc = cpu if self._cc[i] else 0
        dm = memory if self._cm[i] else 0
        if gpus > self._fg[i] or dc > self._fc[i] or dm > self._fm[i]:
            raise ValueError(
                f"node {node!r} has {self.free(node)} (gpus, cpu, memory) free; cannot take ({gpus}, {cpu}, {memory})"
            )
        self._apply(i, -gpus, -dc, -dm)

    def give(self, node: str, gpus: int, cpu: int = 0, memory: int = 0) -> None:
        """Release on `node`; ValueError (and no change) if it would exceed the node's capacity."""
        i = self._pos[node]
        if gpus < 0 or cpu < 0 or memory < 0:
            raise ValueError("give amounts must not be negative")
        dc = cpu if self._cc[i] else 0
        dm = memory if self._cm[i] else 0
        if self._fg[i] + gpus > self._cg[i] or self._fc[i] + dc > self._cc[i] or self._fm[i] + dm > self._cm[i]:
            raise ValueError(
                f"node {node!r} has {self.free(node)} (gpus, cpu, memory) free of "
                f"{self.capacity(node)}; cannot give back ({gpus}, {cpu}, {memory})"
            )
        self._apply(i, gpus, dc, dm)

    def place(self, names: Sequence[str], gpus: int, cpu: int = 0, memory: int = 0) -> None:
        """take() one replica's resources per entry of `names`, all or nothing.

        All nodes are checked before any is changed, so a failed place leaves no half gang.
        """
        if gpus < 0 or cpu < 0 or memory < 0:
            raise ValueError("per-replica resources must not be negative")
        per_node: dict[str, int] = {}
        for name in names:
            per_node[name] = per_node.get(name, 0) + 1
        for name, n in per_node.items():
            i = self._pos[name]
            if (
                n * gpus > self._fg[i]
                or (self._cc[i] and n * cpu > self._fc[i])
                or (self._cm[i] and n * memory > self._fm[i])
            ):
                raise ValueError(
                    f"node {name!r} has {self.free(name)} (gpus, cpu, memory) free; cannot "
                    f"place {n} replica(s) of ({gpus}, {cpu}, {memory})"
                )
        for name, n in per_node.items():
            self.take(name, n * gpus, n * cpu, n * memory)

    def mark(self) -> int:
        """A token for the current state, to `rollback` to or `release` later (marks nest, LIFO)."""
        token = self._next_token
        self._next_token += 1
        at = self._base + len(self._log)
        marks = self._marks
        if marks and marks[-1][2] == at and marks[-1][1] == token - 1:
            marks[-1][1] = token
        else:
            marks.append([token, token, at])
        return token

    def rollback(self, token: int) -> None:
        """Undo every take/give since `mark()` returned `token`.

        The mark stays open (roll back to it again after more changes, or `release` it); marks
        made after it are discarded. ValueError for a token that was discarded or released.
        """
        j = self._mark_at(token)
        run = self._marks[j]
        del self._marks[j + 1 :]
        run[1] = token
        at = run[2]
        log = self._log
        stop = at - self._base
        while len(log) > stop:
            i, dg, dc, dm = log.pop()
            self._apply(i, -dg, -dc, -dm, record=False)
        # Failures found since the mark may be feasible again in the restored state; those
        # found before it still hold (the state is back to one no larger than theirs).
        for fl in self._flavors.values():
            fl.forget_failures(after=at)

    def release(self, token: int) -> None:
        """Keep the changes since `token`: close that mark and discard every later one.

        Once no mark is open the undo log is dropped, so a long pass that marks and keeps
        does not grow memory.
        """
        j = self._mark_at(token)
        run = self._marks[j]
        del self._marks[j + 1 :]
        if token == run[0]:
            del self._marks[j]
        else:
            run[1] = token - 1
        if not self._marks:
            self._base += len(self._log)
            self._log.clear()

    def _mark_at(self, token: int) -> int:
        """Index of the open run holding `token`; ValueError if it is not open."""
        marks = self._marks
        j = bisect_right(marks, token, key=_first) - 1
        if j < 0 or token > marks[j][1]:
            raise ValueError(f"unknown, discarded or released mark {token}")
        return j

    def _apply(self, i: int, dg: int, dc: int, dm: int, record: bool = True) -> None:
        """Change node `i` by the given (already validated) deltas and keep every index in step."""
        if not (dg or dc or dm):
            return
        fl = self._flavor[i]
        if dg:
            old = self._fg[i]
            new = old + dg
            self._fg[i] = new
            fl.nodes.move(old, new, i)
            blk = self._block[i]
            blk.nodes.move(old, new, i)
            fl.blocks.move(blk.free, blk.free + dg, blk.pos)
            blk.free += dg
            fl.free += dg
        if dc:
            old = self._fc[i]
            self._fc[i] = old + dc
            fl.cpu.replace(old, old + dc)
        if dm:
            old = self._fm[i]
            self._fm[i] = old + dm
            fl.memory.replace(old, old + dm)
        if record and (dg > 0 or dc > 0 or dm > 0) and fl.failed:
            fl.forget_failures()
        if record and self._marks:
            self._log.append((i, dg, dc, dm))


def _invalid_shape(replicas: int, gpus: int, cpu: int, memory: int, constraint: str) -> None:
    """Raise the ValueError `CapacityIndex.find` gives for a shape no gang can have."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if gpus < 0 or cpu < 0 or memory < 0:
        raise ValueError("per-replica resources must not be negative")
    raise ValueError(f"unknown placement constraint {constraint!r}")


def _check_buckets(b: _Buckets, expect: dict[int, int]) -> None:
    """Assert `b` holds exactly the items of `expect` (item -> count), in sorted buckets."""
    want: dict[int, list[int]] = {}
    for item in sorted(expect):
        want.setdefault(expect[item], []).append(item)
    assert b.by_count == want, (b.by_count, want)
    assert b.counts == sorted(want)


def _first(run: list[int]) -> int:
    return run[0]


def check_unavailable(node: Node) -> None:
    """ValueError naming the node unless its `unavailable` GPU indices are sorted, distinct and
    each in range(gpus)."""
    bad = node.unavailable
    if any(not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < node.gpus for g in bad):
        raise ValueError(f"node {node.name!r}: unavailable: GPU indices must be in range({node.gpus}), got {bad!r}")
    if any(a >= b for a, b in zip(bad, bad[1:])):
        raise ValueError(f"node {node.name!r}: unavailable: GPU indices must be sorted and distinct, got {bad!r}")


def gpu_mask(indices: Iterable[int]) -> int:
    """GPU indices as a bit set (bit i: GPU i), the form the engine keeps per node."""
    mask = 0
    for g in indices:
        mask |= 1 << g
    return mask


def assign_gpu_indices(capacity: int, used: int, count: int) -> tuple[tuple[int, ...], int]:
    """The `count` lowest GPU indices in range(capacity) not in the bit set `used`, and their
    bit set.

    Lowest-first keeps assignments stable and reproducible (same inputs, same CUDA devices).
    A bit set costs a few machine words per node however many GPUs it has (a simulated pool
    has thousands). ValueError if fewer than `count` are free or `used` names an index outside
    the node.
    """
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    if used >> capacity:
        raise ValueError(f"GPU index {used.bit_length() - 1} is outside range({capacity})")
    free = ~used & ((1 << capacity) - 1)
    if free.bit_count() < count:
        raise ValueError(f"{count} GPU indices wanted, {free.bit_count()} free of {capacity}")
    out: list[int] = []
    taken = 0
    for _ in range(count):
        low = free & -free
        out.append(low.bit_length() - 1)
        taken |= low
        free ^= low
    return tuple(out), taken
