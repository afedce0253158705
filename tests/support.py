"""Builders for engine tests: small clusters, running jobs with real GPU assignments."""

from __future__ import annotations

from typing import Any

from warden.engine.lifecycle import EDGES, Event
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
    job_fields = {k: facts.pop(k) for k in ("time_limit", "lease", "grace", "preempted_at") if k in facts}
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


def steps(source: JobState, target: JobState) -> list[tuple[Event, JobState]]:
    """The shortest walk of the lifecycle's edges from `source` to `target` (breadth first, edges
    in table order): how a test puts a stored job where it needs it, as the server would."""
    if source is target:
        return [(Event.NOTED, target)]
    paths: dict[JobState, list[tuple[Event, JobState]]] = {source: []}
    frontier = [source]
    while frontier:
        later = []
        for state in frontier:
            for edge in EDGES:
                if state not in edge.source:
                    continue
                for nxt in sorted(edge.target, key=list(JobState).index):
                    if nxt not in paths:
                        paths[nxt] = [*paths[state], (edge.event, nxt)]
                        later.append(nxt)
        frontier = later
    if target not in paths:
        raise ValueError(f"the lifecycle has no way from {source.value} to {target.value}")
    return paths[target]


def move(store: Any, job_id: int | str, to: JobState | str, **kw: Any) -> bool:
    """`store.transition` to `to` through the lifecycle's shortest walk from where the job is;
    `kw` (reason, actor, now, fields) goes with the last step, the others carry `reason`, `actor`
    and `now` alone."""
    job = store.get(job_id)
    walk = steps(job.state, JobState(to))
    plain = {k: kw[k] for k in ("reason", "actor", "now")}
    for event, state in walk[:-1]:
        store.transition(job_id, state, event=event, **plain)
    event, state = walk[-1]
    return bool(store.transition(job_id, state, event=event, **kw))


def engine_runs(preset: str) -> bool:
    """Whether the engine implements every setting the simulator preset names: a preset may name
    a victim order before the engine's rules for it exist, and then cannot run."""
    from warden.engine.preemption import VICTIM_ORDERS
    from warden.sim.presets import build_preset

    return build_preset(preset, {"a": 1}, 1).policy.preemption.victim_order in VICTIM_ORDERS


def preset_params(presets: tuple[str, ...]) -> list[Any]:
    """`presets` for `pytest.mark.parametrize`, each the engine cannot run yet skipped, by name."""
    import pytest

    return [
        pytest.param(p, marks=pytest.mark.skipif(not engine_runs(p), reason=f"the engine cannot run preset {p} yet"))
        for p in presets
    ]
