"""What the reconcile loop's collaborators share: the store, the executor, the policy in force,
the nodes of the last snapshot, and a few small helpers.

Each duty of a pass (recovery, exits, cancels, time limits, preemptions, admissions, nodes,
charging, the engine's guard) is an object of its own module, and all of them are handed one
`ReconcileContext`. The `Reconciler` owns it and changes what moves between passes (a new
policy, the metrics once the service has them, the nodes the executor reports), so every duty
reads the current value rather than the one it was built with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from warden.engine.model import Node
from warden.engine.policy import Policy
from warden.executors.base import Executor, Inventory
from warden.server.metrics import ServerMetrics
from warden.store.repo import Store

log = logging.getLogger("warden.reconcile")
"""Every duty logs under the loop's name: an operator follows one logger for the whole pass."""

CAS_TRIES = 3
"""How often an exit is re-read and decided again when its compare-and-set lost."""


@dataclass
class PassStats:
    """What the last pass did, for metrics and tests."""

    at: float = 0.0
    duration_s: float = 0.0
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    passes: int = 0
    failures: int = 0
    """Passes whose engine call raised."""


@dataclass(eq=False)
class ReconcileContext:
    """The state every duty of a pass reads, in one place so that a change made by one (the
    nodes followed, a policy set) is what the next reads."""

    store: Store
    executor: Executor
    policy: Policy
    nodes: tuple[Node, ...]
    """The nodes of the last snapshot: the usable ones, and a down node only while jobs still
    hold resources on it (`NodeFollower.follow`)."""
    state_dir: Path
    clock: Callable[[], float]
    cluster: Inventory = field(init=False)
    """Every node the executor has, and which are down, as of the last pass."""
    metrics: ServerMetrics | None = None
    """Fed as passes go."""
    stats: PassStats = field(default_factory=PassStats)
    explained: dict[str, tuple[object, ...]] = field(default_factory=dict)
    """Per waiting job, what its stored explanation last said (`PlanApplier.explain`); an
    admission or a hold forgets it, since both rewrite the row's explanation."""
    phase_hook: Callable[[str], None] | None = None
    """Called inside a pass, under its lock, between a phase's reads and its writes
    ("exit": an exit's job was read; "planned": the snapshot was planned): the seam race
    tests use to interleave a user action there."""

    def __post_init__(self) -> None:
        self.cluster = Inventory(self.nodes)

    def phase(self, name: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name)


class Duty:
    """A collaborator of the reconcile loop: reads the shared context through the names the
    loop has always used (`self.store`, `self.policy`, …), so a state change reads the same
    wherever its duty lives."""

    def __init__(self, ctx: ReconcileContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.executor = ctx.executor
        self.state_dir = ctx.state_dir
        self.clock = ctx.clock

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def metrics(self) -> ServerMetrics | None:
        return self.ctx.metrics

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.ctx.nodes

    @property
    def stats(self) -> PassStats:
        return self.ctx.stats

    @property
    def _explained(self) -> dict[str, tuple[object, ...]]:
        return self.ctx.explained

    def _phase(self, name: str) -> None:
        self.ctx.phase(name)


def _codes(codes: Sequence[int | None]) -> str:
    return ",".join("?" if c is None else str(c) for c in codes) or "?"
