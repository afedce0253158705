"""The engine's input: the snapshot a pass plans (`take`), and the one a reader asks the engine
about without planning it (`live`: a dry run, a policy diff, a standby's forecasts).

Both are every unfinished job on the nodes and under the policy in force, with the fair-share
ledger brought up to now. A pass's own snapshot moves what the loop keeps between passes (the
engine's form of each job, the ledger caught up after a start); a reader's touches nothing a
pass reads or keeps.
"""

from __future__ import annotations

from warden.engine.model import Job, Snapshot
from warden.server.charging import Charging
from warden.server.context import Duty, ReconcileContext
from warden.server.engineguard import EngineGuard
from warden.store.jobs import ActiveJob


class Snapshots(Duty):
    """Builds the engine's snapshots from the store, the guard's jobs and the charged ledger."""

    def __init__(self, ctx: ReconcileContext, guard: EngineGuard, charging: Charging) -> None:
        super().__init__(ctx)
        self.guard = guard
        self.charging = charging

    def take(self, active: tuple[ActiveJob, ...], now: float) -> Snapshot:
        """The pass's snapshot: every unfinished job but the held ones, on the nodes and under
        the policy in force, with the ledger brought up to now."""
        jobs = self.guard.jobs(active)
        return Snapshot(self.nodes, jobs, self.policy, self.charging.caught_up(jobs, now))

    def live(self, now: float) -> Snapshot:
        """The snapshot a pass at `now` would plan, as far as the store says now, for readers
        that ask the engine a question and change nothing: nothing a pass reads or keeps is
        touched. Call it holding the loop's lock.

        It differs from the next pass's own snapshot only by what that pass does first: exits
        it collects, nodes it follows, cancels it completes (a waiting job marked cancelled is
        left out here, as that pass ends it)."""
        jobs: tuple[Job, ...] = tuple(
            a.to_engine()
            for a in self.store.active()
            if not a.job.held and not (a.job.cancel_requested and a.job.state.waiting)
        )
        return Snapshot(self.nodes, jobs, self.policy, self.charging.ledger_at(jobs, now))
