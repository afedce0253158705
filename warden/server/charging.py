"""Charging: the time between two passes is charged to the jobs that held resources as the
first left them — the fair-share ledger, and the GPU-seconds delivered.
"""

from __future__ import annotations

from collections.abc import Iterable

from warden.engine.fairshare import accrue, accrue_rates, cluster_capacity, queue_rates
from warden.engine.model import Job, Snapshot, UsageLedger
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.server.context import Duty, ReconcileContext


class Charging(Duty):
    """Owns the fair-share ledger and what the jobs holding resources hold between passes."""

    def __init__(self, ctx: ReconcileContext) -> None:
        super().__init__(ctx)
        self.ledger = self.store.load_ledger().to_engine()
        self._last_pass_at: float | None = None
        self._holding: tuple[dict[str, float], dict[str, int]] | None = None
        """What the jobs holding resources as the last pass left them hold, per queue: the
        fair-share rate of the charged ones, and GPUs (`charge`); None before the first pass."""
        self._saved_half_life: float | None = None
        """The half-life the ledger saved last was decayed with; None before this term saved."""

    def charge(self, now: float) -> None:
        """Charge the time since the previous pass to the jobs that held resources as that pass
        left them — the fair-share ledger and the GPU-seconds delivered. A job keeps its GPUs
        until a pass collects its exit, and every admission happens in a pass, so that set held
        throughout; a job that exited since is charged up to this pass, which collects it."""
        last, self._last_pass_at = self._last_pass_at, now
        if self._holding is None:
            return  # the first pass since start: `caught_up` brings the ledger up to now
        rates, held = self._holding
        self.ledger = accrue_rates(self.ledger, rates, self.policy.fair_share.half_life, now)
        if self.metrics is not None and last is not None:
            self.metrics.held(now - last, held, sum(n.gpus for n in self.nodes))

    def caught_up(self, jobs: Iterable[Job], now: float) -> UsageLedger:
        """The ledger a snapshot at `now` of `jobs` carries. The first pass since a start brings
        it up to now from when it was saved, charging the jobs that hold now, as before the
        restart; every later pass was charged by `charge`."""
        if self._holding is None:
            self.ledger = accrue(
                self.ledger,
                (j for j in jobs if j.state.holds_resources),
                cluster_capacity(self.nodes),
                self.policy,
                now,
            )
        return self.ledger

    def settle(self, snapshot: Snapshot, plan: Plan | None) -> None:
        """After a pass: what the jobs holding resources hold until the next one charges them,
        and the ledger saved, so a restart (or a standby) goes on from it. Not while nothing
        holds resources, before this pass or after it: the ledger then only decays, and the one
        saved last, brought up to now by whoever reads it, is the same; an idle cluster writes
        nothing each second."""
        idle_before = self._holding is not None and not _holds(self._holding)
        self._holding = _holding(snapshot, plan, self.policy, cluster_capacity(self.nodes))
        half_life = self.policy.fair_share.half_life
        if idle_before and not _holds(self._holding) and self._saved_half_life == half_life:
            return
        self.store.save_ledger(self.ledger.at, dict(self.ledger.usage))
        self._saved_half_life = half_life

    def ledger_at(self, jobs: tuple[Job, ...], now: float) -> UsageLedger:
        """The ledger as the next pass at `now` would charge it, for readers: nothing kept is
        changed."""
        capacity = cluster_capacity(self.nodes)
        if self._holding is None:
            return accrue(self.ledger, (j for j in jobs if j.state.holds_resources), capacity, self.policy, now)
        return accrue_rates(self.ledger, self._holding[0], self.policy.fair_share.half_life, now)


def _holds(holding: tuple[dict[str, float], dict[str, int]]) -> bool:
    """Whether any job holds resources or is charged (`Charging._holding`)."""
    rates, held = holding
    return any(held.values()) or any(rates.values())


def _holding(
    snapshot: Snapshot, plan: Plan | None, policy: Policy, capacity: tuple[int, int, int]
) -> tuple[dict[str, float], dict[str, int]]:
    """Per queue, the fair-share rate of the charged jobs that hold resources after the pass
    (those of the snapshot, and the plan's admissions), and their GPUs."""
    admitted = {a.job_id for a in plan.admissions} if plan is not None else set()
    holding = [j for j in snapshot.jobs if j.state.holds_resources or j.id in admitted]
    held: dict[str, int] = {}
    for j in holding:
        held[j.queue] = held.get(j.queue, 0) + j.total_gpus
    return queue_rates(holding, capacity, policy), held
