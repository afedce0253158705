"""A seeded synthetic cluster: the state the engine's benchmarks time and its golden plans pin.

Why a synthetic cluster: the engine's cost depends on the shape of the state it is handed (how
full and fragmented the nodes are, how deep and varied the queue is, how many jobs are
terminating or inside their lease), so the generator builds a state that looks like a busy
shared cluster rather than an empty one, and builds it from a seed alone so that two runs, two
machines or two versions of the engine are measured, and pinned, on exactly the same input.

The generator is pure: `random.Random(seed)` is its only source of variation and its clock is
the constant `NOW`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from random import Random
from types import MappingProxyType
from typing import Any

from warden.engine.model import (
    DEFAULT_FLAVOR,
    Attempt,
    Job,
    JobState,
    Node,
    PlacementConstraint,
    ReplicaPlacement,
    Snapshot,
    UsageLedger,
)

NOW = 10_000_000.0
"""The synthetic clock (seconds): far enough from 0 that every start and submit time is positive."""

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

NODE_CPU = 64_000
"""Millicores per node."""
NODE_MEMORY = 512_000
"""MiB per node."""
BLOCK_SIZE = 32
"""Nodes per topology block (a rack / NVLink domain)."""
TWO_FLAVORS_FROM = 200
"""Clusters of at least this many nodes get two GPU flavors, as large clusters usually do."""

DEPARTMENTS: tuple[str, ...] = ("research", "product", "platform", "applied")
TEAMS_PER_DEPARTMENT = 8

FILL = 0.97
"""Share of the GPUs the running jobs aim to occupy when `running` is large enough to fill them."""

_SINGLE_SIZES: tuple[tuple[int, float], ...] = ((1, 0.30), (2, 0.20), (4, 0.20), (8, 0.22))
"""Running single-replica jobs: GPUs and weight. The rest (`_RUNNING_GANG`) are multi-node gangs."""
_RUNNING_GANG = 0.08
_GANG_REPLICAS = (2, 8)


# -- the queue tree ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Queue:
    """What the generator needs to know of a queue to keep running jobs within its limits."""

    name: str
    nominal: int
    limit: float
    """nominal + borrowing_limit (inf when it may borrow without limit)."""
    parent: str | None


def _split(total: int, weights: list[int]) -> list[int]:
    """Integer shares of `total` proportional to `weights` (largest remainder), summing to it."""
    wsum = sum(weights)
    raw = [total * w / wsum for w in weights]
    out = [int(r) for r in raw]
    order = sorted(range(len(weights)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def synthetic_policy(total_gpus: int, rng: Random) -> tuple[dict[str, Any], dict[str, _Queue]]:
    """The policy dict (for `parse_policy`) of 4 departments × 8 teams, and the queues by name.

    Nominal quotas sum to the cluster's GPUs at every level, so the tree is fully subscribed;
    departments and some teams carry borrowing and lending limits so the quota checks have work.
    """
    dept_weights = [rng.randint(1, 3) for _ in DEPARTMENTS]
    dept_nominal = _split(total_gpus, dept_weights)
    queues: dict[str, _Queue] = {"cluster": _Queue("cluster", total_gpus, float(total_gpus), None)}
    children: list[dict[str, Any]] = []
    for d, (dept, weight, nominal) in enumerate(zip(DEPARTMENTS, dept_weights, dept_nominal)):
        dq: dict[str, Any] = {"name": dept, "weight": weight, "nominal": {"gpu": nominal}}
        limit = math.inf
        if d % 2 == 0:
            borrow = nominal // 2 if d == 0 else nominal
            dq["borrowing_limit"] = {"gpu": borrow}
            limit = float(nominal + borrow)
        if d in (1, 3):
            dq["lending_limit"] = {"gpu": nominal // 2 if d == 1 else (nominal * 3) // 4}
        queues[dept] = _Queue(dept, nominal, limit, "cluster")
        team_weights = [rng.randint(1, 4) for _ in range(TEAMS_PER_DEPARTMENT)]
        team_nominal = _split(nominal, team_weights)
        teams: list[dict[str, Any]] = []
        for t, (tw, tn) in enumerate(zip(team_weights, team_nominal)):
            name = f"{dept}-t{t}"
            tq: dict[str, Any] = {"name": name, "weight": tw, "nominal": {"gpu": tn}}
            tlimit = math.inf
            if rng.random() < 0.35:
                borrow = max(8, tn)
                tq["borrowing_limit"] = {"gpu": borrow}
                tlimit = float(tn + borrow)
            if rng.random() < 0.25:
                tq["lending_limit"] = {"gpu": tn // 2}
            teams.append(tq)
            queues[name] = _Queue(name, tn, tlimit, dept)
        dq["children"] = teams
        children.append(dq)
    return {"queues": {"name": "cluster", "children": children}}, queues


# -- nodes and their free GPUs -------------------------------------------------------------------


def synthetic_nodes(count: int, gpus_per_node: int) -> tuple[Node, ...]:
    """`count` identical nodes in blocks of 32; the first 3/4 "h100", the rest "a100" (≥ 200 nodes)."""
    two = count >= TWO_FLAVORS_FROM
    split = (count * 3) // 4
    return tuple(
        Node(
            name=f"node{i:05d}",
            gpus=gpus_per_node,
            cpu=NODE_CPU,
            memory=NODE_MEMORY,
            flavor=("h100" if i < split else "a100") if two else DEFAULT_FLAVOR,
            block=f"blk{i // BLOCK_SIZE:03d}",
        )
        for i in range(count)
    )


class _Packer:
    """Free GPU indices per node, with nodes bucketed by free count so packing is O(G) a job.

    Only the generator uses it: it hands out real, non-overlapping GPU indices the way a
    scheduler that packs (mostly best-fit, sometimes not) would have left them.
    """

    def __init__(self, nodes: tuple[Node, ...], rng: Random) -> None:
        self.nodes = nodes
        self.rng = rng
        self.g = max((n.gpus for n in nodes), default=0)
        self.free: list[list[int]] = [list(range(n.gpus)) for n in nodes]
        self.buckets: list[list[int]] = [[] for _ in range(self.g + 1)]
        self.slot: list[int] = [0] * len(nodes)
        for i, n in enumerate(nodes):
            self._add(n.gpus, i)
        # Whole free nodes per (flavor, block): where multi-node gangs go.
        self.whole: dict[tuple[str, str], list[int]] = {}
        for i, n in enumerate(nodes):
            if n.gpus == self.g and n.gpus > 0:
                self.whole.setdefault((n.flavor, n.block or n.name), []).append(i)
        self.free_total = sum(n.gpus for n in nodes)

    def _add(self, count: int, i: int) -> None:
        bucket = self.buckets[count]
        self.slot[i] = len(bucket)
        bucket.append(i)

    def _remove(self, count: int, i: int) -> None:
        bucket = self.buckets[count]
        last = bucket.pop()
        if last != i:
            bucket[self.slot[i]] = last
            self.slot[last] = self.slot[i]

    def largest_free(self) -> int:
        for c in range(self.g, 0, -1):
            if self.buckets[c]:
                return c
        return 0

    def take(self, i: int, gpus: int) -> tuple[int, ...]:
        """Take the lowest `gpus` free indices of node `i`."""
        free = self.free[i]
        before = len(free)
        got, self.free[i] = tuple(free[:gpus]), free[gpus:]
        self._remove(before, i)
        self._add(before - gpus, i)
        if before == self.g:
            n = self.nodes[i]
            self.whole[(n.flavor, n.block or n.name)].remove(i)
        self.free_total -= gpus
        return got

    def pick_node(self, gpus: int) -> int | None:
        """A node with `gpus` free: best-fit 70 % of the time, any fitting free count otherwise."""
        counts = [c for c in range(gpus, self.g + 1) if self.buckets[c]]
        if not counts:
            return None
        c = counts[0] if self.rng.random() < 0.7 else self.rng.choice(counts)
        return self.rng.choice(self.buckets[c])

    def pick_whole(self, replicas: int) -> list[int] | None:
        """`replicas` whole free nodes of one flavor in one block, or None."""
        keys = [k for k, free in self.whole.items() if len(free) >= replicas]
        if not keys:
            return None
        key = self.rng.choice(keys)
        return sorted(self.rng.sample(self.whole[key], replicas))


# -- jobs ----------------------------------------------------------------------------------------


def _weighted(rng: Random, table: tuple[tuple[Any, float], ...]) -> Any:
    x = rng.random() * sum(w for _, w in table)
    for value, w in table:
        x -= w
        if x < 0:
            return value
    return table[-1][0]


def _resources(rng: Random, gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(cpu, memory) per replica: at most the replica's GPU share of a node, so GPUs bind first."""
    share = max(gpus, 1) / max(gpus_per_node, 1)
    f = rng.choice((1.0, 0.5, 0.25))
    return int(NODE_CPU * share * f), int(NODE_MEMORY * share * rng.choice((1.0, 0.5)))


class _Usage:
    """Charged GPUs per queue while running jobs are generated, so they respect quota limits."""

    def __init__(self, queues: dict[str, _Queue]) -> None:
        self.queues = queues
        self.used: dict[str, int] = dict.fromkeys(queues, 0)

    def path(self, leaf: str) -> list[_Queue]:
        out, q = [], self.queues.get(leaf)
        while q is not None:
            out.append(q)
            q = self.queues.get(q.parent) if q.parent else None
        return out

    def fits(self, leaf: str, gpus: int) -> bool:
        return all(self.used[q.name] + gpus <= q.limit for q in self.path(leaf))

    def add(self, leaf: str, gpus: int) -> bool:
        """Charge the GPUs; True when the job is borrowing (above nominal below the root)."""
        borrowing = False
        for q in self.path(leaf):
            self.used[q.name] += gpus
            if q.parent is not None and self.used[q.name] > q.nominal:
                borrowing = True
        return borrowing


def _running_mix(capacity: int, running: int, g: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """(probability of the mixed distribution, single sizes) so `running` jobs can roughly fit.

    Otherwise 5,000 jobs of the mixed mean (~6 GPUs) would fill 8,000 GPUs after ~1,300 jobs;
    the remainder are 1-GPU jobs, which is how a cluster with many more jobs than nodes looks.
    """
    sizes = tuple((s, w) for s, w in _SINGLE_SIZES if s <= g) or ((g, 1.0),)
    wsum = sum(w for _, w in sizes) + _RUNNING_GANG
    mean = (sum(s * w for s, w in sizes) + _RUNNING_GANG * g * sum(_GANG_REPLICAS) / 2) / wsum
    if running <= 0:
        return 1.0, sizes
    target = capacity * FILL / running
    if target >= mean or mean <= 1:
        return 1.0, sizes
    return min(1.0, max(0.05, (target - 1) / (mean - 1))), sizes


def _running_jobs(
    rng: Random,
    nodes: tuple[Node, ...],
    g: int,
    running: int,
    queues: dict[str, _Queue],
    leaves: list[str],
    leaf_weights: list[float],
) -> list[Job]:
    packer = _Packer(nodes, rng)
    usage = _Usage(queues)
    alpha, sizes = _running_mix(packer.free_total, running, g)
    two_flavors = len({n.flavor for n in nodes}) > 1
    jobs: list[Job] = []
    while len(jobs) < running and packer.free_total > 0:
        # Shape: replicas × gpus, placed on real GPU indices.
        if rng.random() < alpha:
            if rng.random() * (sum(w for _, w in sizes) + _RUNNING_GANG) < _RUNNING_GANG:
                replicas, gpus = rng.randint(*_GANG_REPLICAS), g
            else:
                replicas, gpus = 1, _weighted(rng, sizes)
        else:
            replicas, gpus = 1, 1
        assignment: tuple[ReplicaPlacement, ...] | None = None
        first_node = 0
        if replicas > 1:
            whole = packer.pick_whole(replicas)
            if whole is not None:
                assignment = tuple(ReplicaPlacement(nodes[i].name, packer.take(i, gpus)) for i in whole)
                first_node = whole[0]
            else:
                replicas, gpus = 1, g
        if assignment is None:
            i = packer.pick_node(gpus)
            if i is None:
                largest = packer.largest_free()
                gpus = max((s for s, _ in sizes if s <= largest), default=largest)
                i = packer.pick_node(gpus)
                assert i is not None
            assignment = (ReplicaPlacement(nodes[i].name, packer.take(i, gpus)),)
            first_node = i
        total = replicas * gpus

        # Who runs it: tier, queue (within quota limits, else it is opportunistic tier 4).
        tier = _weighted(rng, ((1, 0.03), (2, 0.15), (3, 0.70), (4, 0.12)))
        if replicas > 1 and tier in (3, 4) and rng.random() < 0.5:
            tier = 2
        leaf = rng.choices(leaves, leaf_weights)[0]
        borrowing = False
        if tier != 4:
            for _ in range(3):
                if usage.fits(leaf, total):
                    break
                leaf = rng.choices(leaves, leaf_weights)[0]
            if usage.fits(leaf, total):
                borrowing = usage.add(leaf, total)
            else:
                tier = 4

        # Runtime facts: age (some inside the lease), startup, checkpoints, SIGTERM saves.
        r = rng.random()
        if r < 0.15:
            age = rng.uniform(1 * MINUTE, 45 * MINUTE)
        elif r < 0.30:
            age = rng.uniform(45 * MINUTE, 4 * HOUR)
        else:
            age = rng.uniform(4 * HOUR, 3 * DAY)
        started = NOW - age
        startup = rng.uniform(20.0, 600.0) if rng.random() < 0.7 else None
        last_ckpt: float | None = None
        ckpt_s = 0.0
        if rng.random() < 0.6:
            interval = rng.choice((10 * MINUTE, 30 * MINUTE, HOUR))
            done = int((age - (startup or 0.0)) // interval)
            if done >= 1:
                last_ckpt = started + (startup or 0.0) + done * interval
                ckpt_s = done * rng.uniform(5.0, 60.0)
        sigterm_save = rng.uniform(10.0, 200.0) if rng.random() < 0.3 else None
        state = JobState.RUNNING
        sigterm_at = kill_at = None
        grace = 300.0 if rng.random() < 0.05 else None
        if tier != 1 and rng.random() < 0.01:
            state = JobState.PREEMPTING
            sigterm_at = NOW - rng.uniform(0.0, 110.0)
            kill_at = sigterm_at + (grace or (300.0 if tier == 2 else 120.0))
        number = 1
        preempted_at: tuple[float, ...] = ()
        if rng.random() < 0.03:
            number, preempted_at = 2, (started - rng.uniform(10 * MINUTE, 2 * HOUR),)
        cpu, memory = _resources(rng, gpus, g)
        n = len(jobs)
        jobs.append(
            Job(
                id=f"run-{n:06d}",
                queue=leaf,
                tier=tier,
                submit=(preempted_at[0] if preempted_at else started) - rng.uniform(0.0, 2 * HOUR),
                state=state,
                replicas=replicas,
                gpus=gpus,
                cpu=cpu,
                memory=memory,
                flavor=nodes[first_node].flavor if two_flavors and rng.random() < 0.5 else None,
                placement="block" if replicas > 1 else "any",
                user=f"{leaf}-u{rng.randint(0, 4)}",
                grace=grace,
                time_limit=age + rng.uniform(10 * MINUTE, 2 * DAY) if rng.random() < 0.4 else None,
                preempted_at=preempted_at,
                attempt=Attempt(
                    number=number,
                    started_at=started,
                    assignment=assignment,
                    borrowing=borrowing,
                    startup_s=startup,
                    checkpoint_s=ckpt_s,
                    last_checkpoint_at=last_ckpt,
                    sigterm_save_s=sigterm_save,
                    sigterm_at=sigterm_at,
                    kill_at=kill_at,
                ),
            )
        )
    return jobs


def pending_jobs(
    rng: Random, count: int, g: int, flavors: list[str], leaves: list[str], leaf_weights: list[float]
) -> list[Job]:
    jobs: list[Job] = []
    for n in range(count):
        tier = _weighted(rng, ((1, 0.03), (2, 0.10), (3, 0.67), (4, 0.20)))
        leaf = rng.choices(leaves, leaf_weights)[0]
        shape = _weighted(rng, (("single", 0.85), ("gang", 0.10), ("pack", 0.05)))
        placement: PlacementConstraint = "any"
        if shape == "single":
            replicas, gpus = (
                1,
                _weighted(
                    rng, tuple((s, w) for s, w in ((1, 0.35), (2, 0.2), (4, 0.2), (8, 0.25)) if s <= g) or ((g, 1.0),)
                ),
            )
            if rng.random() < 0.05:
                placement = "pack"
        elif shape == "gang":
            replicas, gpus = rng.randint(*_GANG_REPLICAS), g
            placement = "block" if rng.random() < 0.6 else "any"
        else:
            replicas, gpus = 2, max(1, g // 4)
            placement = "pack"
        submit = NOW - 3 * DAY * rng.random() ** 2 - 1.0
        state = JobState.PENDING
        if tier in (1, 2) and rng.random() < 0.2:
            state = JobState.AWAITING_APPROVAL
        waited, pending_since, not_before = 0.0, None, None
        preempted_at: tuple[float, ...] = ()
        if state is JobState.PENDING and rng.random() < 0.05:
            state = JobState.REQUEUED
            pending_since = submit + (NOW - submit) * rng.random()
            waited = rng.uniform(0.0, 4 * HOUR)
            preempted_at = (pending_since - rng.uniform(60.0, 300.0),)
            if rng.random() < 0.2:
                not_before = NOW + rng.uniform(MINUTE, 30 * MINUTE)
        cpu, memory = _resources(rng, gpus, g)
        flavor: str | None = None
        if len(flavors) > 1:
            flavor = _weighted(rng, ((flavors[0], 0.2), (flavors[1], 0.1), (None, 0.7)))
        jobs.append(
            Job(
                id=f"pend-{n:06d}",
                queue=leaf,
                tier=tier,
                submit=submit,
                state=state,
                replicas=replicas,
                gpus=gpus,
                cpu=cpu,
                memory=memory,
                flavor=flavor,
                placement=placement,
                user=f"{leaf}-u{rng.randint(0, 4)}",
                time_limit=rng.uniform(10 * MINUTE, 2 * DAY) if rng.random() < 0.4 else None,
                waited=waited,
                pending_since=pending_since,
                not_before=not_before,
                preempted_at=preempted_at,
            )
        )
    return jobs


def synthetic_snapshot(
    nodes: int, gpus_per_node: int, pending: int, running: int, seed: int = 0
) -> tuple[Snapshot, float]:
    """A busy cluster and its queue, and the `now` to schedule it at; a function of the arguments.

    `running` is an upper bound: jobs are placed until that many run or no GPU is left.
    """
    from warden.engine.policy import parse_policy

    if nodes < 1 or gpus_per_node < 1 or pending < 0 or running < 0:
        raise ValueError("nodes and gpus_per_node must be at least 1, pending and running at least 0")
    rng = Random(seed)
    cluster = synthetic_nodes(nodes, gpus_per_node)
    total = nodes * gpus_per_node
    policy_dict, queues = synthetic_policy(total, rng)
    policy = parse_policy(policy_dict)
    leaves = [q.name for q in queues.values() if q.name not in DEPARTMENTS and q.parent is not None]
    # Demand follows quota, with a few busy teams (a Zipf tail) so some queues run deep.
    popularity = list(range(1, len(leaves) + 1))
    rng.shuffle(popularity)
    run_weights = [queues[q].nominal + 1.0 for q in leaves]
    pend_weights = [(queues[q].nominal + 1.0) / p for q, p in zip(leaves, popularity)]
    flavors = sorted({n.flavor for n in cluster}, key=lambda f: (f != "h100", f))
    jobs = _running_jobs(rng, cluster, gpus_per_node, running, queues, leaves, run_weights)
    jobs += pending_jobs(rng, pending, gpus_per_node, flavors, leaves, pend_weights)
    usage = {q: queues[q].nominal / total * rng.uniform(0.2, 2.0) * DAY for q in leaves}
    ledger = UsageLedger(at=NOW, usage=MappingProxyType(usage))
    return Snapshot(nodes=cluster, jobs=tuple(jobs), policy=policy, ledger=ledger), NOW


# -- the measurement -----------------------------------------------------------------------------
