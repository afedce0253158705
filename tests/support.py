"""Builders for engine tests: small clusters, running jobs with real GPU assignments."""

from __future__ import annotations

from typing import Any

from warden.engine.model import Attempt, Job, JobState, Node, ReplicaPlacement, Snapshot, UsageLedger
from warden.engine.plan import Plan
from warden.engine.policy import Policy, parse_policy
from warden.engine.scheduler import schedule

# DESIGN §3's queue tree.
DESIGN_QUEUES: dict[str, Any] = {
    "name": "cluster",
    "children": [
        {
            "name": "research",
            "weight": 2,
            "nominal": {"gpu": 64},
            "borrowing_limit": {"gpu": 64},
            "children": [{"name": "vision", "nominal": {"gpu": 32}}, {"name": "language", "nominal": {"gpu": 32}}],
        },
        {"name": "platform", "weight": 1, "nominal": {"gpu": 32}, "lending_limit": {"gpu": 16}},
    ],
}


def nodes(count: int, gpus: int = 8, block_size: int | None = None, flavor: str = "default") -> tuple[Node, ...]:
    return tuple(
        Node(f"n{i}", gpus, flavor=flavor, block=None if block_size is None else f"b{i // block_size}")
        for i in range(count)
    )


def policy(**overrides: Any) -> Policy:
    """A small policy: two teams of 8 GPUs each under one root; overrides replace top-level keys."""
    data: dict[str, Any] = {
        "queues": {
            "name": "cluster",
            "children": [
                {"name": "a", "nominal": {"gpu": 8}},
                {"name": "b", "nominal": {"gpu": 8}},
            ],
        },
    }
    data.update(overrides)
    return parse_policy(data)


def running(
    job_id: str,
    queue: str,
    tier: int,
    placement: list[tuple[str, int]] | tuple[str, int],
    started: float,
    *,
    replicas_gpus: int | None = None,
    first_gpu: int = 0,
    state: JobState = JobState.RUNNING,
    **attempt: Any,
) -> Job:
    """A job holding GPUs: `placement` is (node, gpus) per replica, GPUs from `first_gpu` up."""
    if isinstance(placement, tuple):
        placement = [placement]
    gpus = placement[0][1] if replicas_gpus is None else replicas_gpus
    assignment = tuple(ReplicaPlacement(node, tuple(range(first_gpu, first_gpu + g))) for node, g in placement)
    facts = {"startup_s": 0.0}
    facts.update(attempt)
    job_fields = {k: facts.pop(k) for k in ("expected_duration", "lease", "grace", "preempted_at") if k in facts}
    return Job(
        job_id,
        queue,
        tier,
        submit=started - 1,
        state=state,
        replicas=len(placement),
        gpus=gpus,
        attempt=Attempt(number=1, started_at=started, assignment=assignment, **facts),
        **job_fields,
    )


def pending(job_id: str, queue: str, tier: int, gpus: int = 8, submit: float = 0.0, **kw: Any) -> Job:
    return Job(job_id, queue, tier, submit=submit, gpus=gpus, **kw)


def plan_for(
    pol: Policy, cluster: tuple[Node, ...], jobs: list[Job], now: float, usage: dict[str, float] | None = None
) -> Plan:
    return schedule(Snapshot(cluster, tuple(jobs), pol, UsageLedger(now, usage or {})), now)


def admitted(plan: Plan) -> set[str]:
    return {a.job_id for a in plan.admissions}


def preempted(plan: Plan) -> set[str]:
    return {p.job_id for p in plan.preemptions}


def reason(plan: Plan, job_id: str) -> str:
    return plan.explanations[job_id].reason.code
