"""Carrying out a plan's admissions: the attempt row that holds a job's GPUs, its launch
through the executor, STARTING → RUNNING, the claims the plan names, and the explanations
that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from warden.engine import lifecycle
from warden.engine.accounting import effective_grace
from warden.engine.lifecycle import Event
from warden.engine.model import Attempt, JobState, ReplicaPlacement
from warden.engine.plan import Plan
from warden.executors.base import Bounds, LaunchSpec, ReplicaLaunch
from warden.server.context import Duty, ReconcileContext, log
from warden.server.statedir import set_aside_stale
from warden.store.jobs import ActiveJob, StoredJob, moved

LAUNCHERS = 8
"""How many admitted attempts are handed to the executor at once."""


class PlanApplier(Duty):
    """Admits, launches, and records what a plan says of the waiting jobs."""

    def __init__(self, ctx: ReconcileContext, report_env: Callable[[str, int], dict[str, str]] | None) -> None:
        super().__init__(ctx)
        self.report_env = report_env
        """The environment that lets an attempt's SDK report to this server."""

    def admit(
        self,
        job: StoredJob,
        placement: tuple[ReplicaPlacement, ...],
        flavor: str,
        borrowing: bool,
        now: float,
        lent: bool = False,
    ) -> LaunchSpec | None:
        """Record an admission: ADMITTED, and the attempt row that holds its GPUs in the
        database before any process exists. Returns what to launch (None: cancelled meanwhile)."""
        number = job.attempt + 1
        attempt_dir = self.state_dir / "jobs" / str(job.id) / f"attempt-{number}"
        before = job.to_engine()
        admitted = lifecycle.admitted(before, now, Attempt(number, now, placement, borrowing, lent=lent), starts=False)
        waited = admitted.waited
        if not self.store.transition(
            job.id,
            admitted.state,
            event=Event.ADMITTED,
            reason=_placed(placement, borrowing),
            actor="warden",
            now=now,
            expect_state={job.state},
            expect_cancel_requested=False,
            attempt=number,
            **moved(before, admitted),
            # The attempt row holds the GPUs in the database before any process exists.
            new_attempt={
                "number": number,
                "started_at": now,
                "assignment": placement,
                "flavor": flavor,
                "borrowing": borrowing,
                "lent": lent,
                "log_dir": str(attempt_dir),
            },
        ):
            return None  # cancelled meanwhile
        stale = set_aside_stale(self.state_dir, job.id, number)
        if stale is not None:
            log.warning(
                "job %s attempt %d: a directory was already where its own goes; moved to %s", job.id, number, stale
            )
        self._explained.pop(str(job.id), None)
        if self.metrics is not None:
            self.metrics.admission(job.queue, job.tier, waited)
        return LaunchSpec(
            job_id=str(job.id),
            attempt=number,
            command=tuple(job.command),
            replicas=_replicas(placement),
            grace_s=effective_grace(self.policy, job.tier, job.grace_s),
            workdir=Path(job.workdir),
            log_dir=attempt_dir,
            checkpoint_dir=self.state_dir / "jobs" / str(job.id) / "checkpoints",
            env={**(job.env or {}), **(self.report_env(str(job.id), number) if self.report_env else {})},
            user=job.user,
            cpu=job.cpu,
            memory=job.memory,
            bounds=Bounds(
                max_processes=self.policy.containment.max_processes,
                memory_mib=job.memory or self.policy.containment.default_memory,
                open_files=self.policy.containment.open_files,
            ),
            time_limit_s=job.time_limit_s,
        )

    def launch_all(self, specs: Sequence[LaunchSpec], now: float) -> None:
        """Hand every admitted attempt to the executor, up to LAUNCHERS at a time: a Slurm
        submission waits on a round trip to the controller, and one pass may admit hundreds."""
        if len(specs) <= 1:
            for spec in specs:
                self._launch(spec, now)
            return
        with ThreadPoolExecutor(max_workers=min(LAUNCHERS, len(specs)), thread_name_prefix="warden-launch") as pool:
            for done in [pool.submit(self._launch, spec, now) for spec in specs]:
                done.result()

    def _launch(self, spec: LaunchSpec, now: float) -> None:
        job_id, number = int(spec.job_id), spec.attempt
        try:
            handle = self.executor.start(spec)
        except OSError as err:
            self.store.end_attempt(job_id, number, ended_at=now, exit_codes=[], reason="failed")
            self.store.transition(
                job_id,
                JobState.FAILED,
                event=Event.EXITED,
                reason=f"could not start: {err}",
                actor="warden",
                now=now,
                expect_state={JobState.ADMITTED},
            )
            return
        self.store.update_attempt(job_id, number, handle=handle.to_dict())
        self.store.transition(
            job_id,
            JobState.STARTING,
            event=Event.LAUNCHED,
            reason="handed to the executor",
            actor="warden",
            now=now,
            expect_state={JobState.ADMITTED},
        )

    def running(self, now: float) -> None:
        """STARTING → RUNNING for the attempts whose processes the executor saw begin."""
        for job_id, number in self.executor.started():
            job = self.store.get(int(job_id))
            if job is not None and job.state is JobState.STARTING and job.attempt == number:
                self.store.transition(
                    job.id,
                    JobState.RUNNING,
                    event=Event.STARTED,
                    reason="processes running",
                    actor="warden",
                    now=now,
                    expect_state={JobState.STARTING},
                )

    def claims(self, plan: Plan, by_id: dict[str, ActiveJob], now: float) -> None:
        """Exactly the waiting jobs the plan names hold a claim into the next pass: what their
        victims free is theirs (an admission ends a claim with it, in `_admit`)."""
        released = set(plan.released_claims)
        admitted = {a.job_id for a in plan.admissions}
        for job_id, active in by_id.items():
            job = active.job
            if not job.state.waiting or job_id in admitted:
                continue
            want = job_id in plan.claims
            if job.claim == want:
                continue
            if want:
                reason = "claims the capacity its victims are freeing"
            elif job_id in released:
                reason = "claim released: its victims' capacity is no longer needed"
            else:
                reason = "claim ended"
            self.store.flag(job.id, job.state, Event.CLAIMED if want else Event.CLAIM_ENDED, reason=reason, now=now)

    def explain(self, plan: Plan) -> None:
        """Store the explanations that changed. A job's wait grows every pass and its queue's
        fair-share ratios move with every accrual, so both are left out of the comparison (the
        API shows them as they are now); a rewrite would bump the row's version and make the
        next pass read and convert it again."""
        changed: dict[int | str, dict[str, object] | None] = {}
        for job_id, e in plan.explanations.items():
            k = e.sort_key
            seen = (e.reason, e.position, k.tier, k.breach, k.fair_rank)
            if self._explained.get(job_id) != seen:
                self._explained[job_id] = seen
                changed[int(job_id)] = {"reason": e.reason.to_dict(), "sort_key": k.to_dict(), "position": e.position}
        if changed:
            self.store.set_explanations(changed)


def _replicas(placement: tuple[ReplicaPlacement, ...]) -> tuple[ReplicaLaunch, ...]:
    """Ranks in placement order; LOCAL_RANK counts the replicas before it on the same node."""
    on_node: dict[str, int] = {}
    out = []
    for rank, p in enumerate(placement):
        local = on_node.get(p.node, 0)
        on_node[p.node] = local + 1
        out.append(ReplicaLaunch(rank=rank, node=p.node, gpus=p.gpus, local_rank=local))
    return tuple(out)


def _placed(placement: tuple[ReplicaPlacement, ...], borrowing: bool) -> str:
    where = "; ".join(f"{p.node} GPUs {','.join(map(str, p.gpus)) or '-'}" for p in placement)
    return f"admitted on {where}" + (" (borrowing)" if borrowing else "")
