"""The GPUs each attempt really runs on: warden's record made true to the substrate's binding.

The engine places every replica on GPU indices, and the local executor binds exactly those.
Slurm and Ray are asked only for a count per node and choose the indices themselves (Slurm
allocates the GPUs of a job, Ray the ids of a bundle), so their executors read back what each
replica was bound to once it runs (`Executor.devices`). Where that differs from the attempt's
recorded assignment, the assignment is corrected in the database, with an event that says
from what to what and why: the next pass's engine then knows which GPUs are taken, and the
dashboard shows the job where it runs. An attempt is never failed for it; one whose replicas
got another number of GPUs than placed (which neither substrate does) is evicted and requeued,
with the reason.
"""

from __future__ import annotations

from warden.engine.model import ReplicaPlacement
from warden.server.context import Duty, ReconcileContext, log
from warden.server.preempt import Preemptions

Key = tuple[str, int]


class BoundDevices(Duty):
    """Each pass, reads back the devices of the running attempts it has not settled yet and
    corrects their recorded assignment where the substrate chose other GPUs."""

    def __init__(self, ctx: ReconcileContext, preemptions: Preemptions) -> None:
        super().__init__(ctx)
        self.preemptions = preemptions
        self._settled: set[Key] = set()
        """The attempts whose devices were compared with their record (in memory: after a
        restart, each running attempt is compared once more)."""

    def check(self, now: float) -> None:
        running = set(self.executor.running())
        self._settled &= running
        for job_id, number in sorted(running - self._settled):
            devices = self.executor.devices(job_id, number)
            if devices is None:  # the executor binds what the plan says
                self._settled.add((job_id, number))
            elif devices and all(d is not None for d in devices):
                self._settle(job_id, number, [d for d in devices if d is not None], now)
                self._settled.add((job_id, number))

    def _settle(self, job_id: str, number: int, devices: list[tuple[int, ...]], now: float) -> None:
        job = self.store.get(job_id)
        attempt = self.store.attempt(job_id, number)
        if job is None or attempt is None or attempt.ended_at is not None or job.attempt != number:
            return
        planned = attempt.assignment
        bound = tuple(ReplicaPlacement(p.node, tuple(sorted(d))) for p, d in zip(planned, devices, strict=False))
        if len(devices) != len(planned) or any(
            len(b.gpus) != len(p.gpus) for b, p in zip(bound, planned, strict=False)
        ):
            why = f"its replicas were bound to GPUs {_gpus(bound)}, not as many as placed ({_gpus(planned)})"
            log.warning("job %s attempt %d: %s; it is requeued", job_id, number, why)
            if job.state.holds_resources and attempt.sigterm_at is None:
                self.preemptions.evict(job, attempt, why, now)
            return
        if bound == planned:
            return
        self.store.update_attempt(job_id, number, assignment=bound)
        reason = (
            f"runs on GPUs {_gpus(bound)} as the executor bound them, not {_gpus(planned)} as planned: "
            "its recorded assignment follows the GPUs it holds"
        )
        log.info("job %s attempt %d %s", job_id, number, reason)
        self.store.note(
            job.id,
            job.state,
            reason=reason,
            now=now,
            details={
                "planned": [{"node": p.node, "gpus": list(p.gpus)} for p in planned],
                "bound": [{"node": b.node, "gpus": list(b.gpus)} for b in bound],
            },
        )


def _gpus(placement: tuple[ReplicaPlacement, ...]) -> str:
    """`n3:2,3` per replica, `; ` between them."""
    return "; ".join(f"{p.node}:{','.join(map(str, p.gpus)) or '-'}" for p in placement)
