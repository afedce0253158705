"""The JSON the API returns, with DESIGN's names (`id`, `state`, `tier`, `queue`, `reason`, …)."""

from __future__ import annotations

from typing import Any, Iterable

from warden.engine.model import JobState, Node
from warden.engine.policy import Policy
from warden.engine.model import UsageLedger
from warden.sim.metrics import owed_gpu_seconds
from warden.sim.presets import policy_entitlement
from warden.sim.records import AttemptRecord, JobRecord, SimRun


def wait_s(job: Any, now: float) -> float:
    """Seconds pending over all attempts, up to now for a job that still waits."""
    if job.state.waiting:
        since = job.pending_since if job.pending_since is not None else job.submit_at
        return job.waited_s + max(0.0, now - since)
    return job.waited_s


def job_summary(job: Any, now: float) -> dict[str, Any]:
    e = job.explanation or {}
    reason = e.get("reason") if job.state.waiting else None
    return {
        "id": str(job.id), "name": job.name, "user": job.user, "queue": job.queue, "tier": job.tier,
        "state": job.state.value, "replicas": job.replicas, "gpus": job.gpus * job.replicas,
        "gpus_per_replica": job.gpus, "submit_at": job.submit_at, "wait_s": round(wait_s(job, now), 3),
        "position": e.get("position") if reason else None, "reason": reason, "attempt": job.attempt,
        "exit_code": job.exit_code, "finished_at": job.finished_at,
    }


def job_detail(job: Any, events: Iterable[Any], attempts: Iterable[Any], now: float,
               policy: Policy) -> dict[str, Any]:
    out = job_summary(job, now)
    e = job.explanation or {}
    out.update({
        "command": list(job.command), "workdir": job.workdir, "placement": job.placement,
        "flavor": job.flavor, "cpu": job.cpu, "memory": job.memory,
        "lease_s": job.lease_s if job.lease_s is not None else policy.tier(job.tier).lease,
        "grace_s": job.grace_s if job.grace_s is not None else policy.tier(job.tier).grace,
        "time_limit_s": job.expected_duration_s, "approved_by": job.approved_by,
        "sort_key": ({**e["sort_key"], "waited_s": round(wait_s(job, now), 3)}
                     if job.state.waiting and e.get("sort_key") else None),
        "events": [{"at": ev.at, "from": ev.from_state, "to": ev.to_state, "reason": ev.reason,
                    "actor": ev.actor} for ev in events],
        "attempts": [attempt_view(a) for a in attempts],
    })
    out["warnings"] = warnings(job, attempts, now, out["grace_s"])
    return out


def warnings(job: Any, attempts: Iterable[Any], now: float, grace: float) -> list[str]:
    """What a person should know before this job is preempted: a measured save that does
    not fit the grace means a preemption loses the work since the last checkpoint."""
    live = [a for a in attempts if a.ended_at is None and a.number == job.attempt]
    if not live:
        return []
    a = live[0]
    if a.sigterm_save_s is None or a.sigterm_save_s <= grace:
        return []
    since = a.started_at + (a.startup_s or 0.0)
    if a.last_checkpoint_at is not None:
        since = max(since, a.last_checkpoint_at)
    lost_min = job.gpus * job.replicas * max(0.0, now - since) / 60
    return [f"its measured checkpoint save takes {a.sigterm_save_s:.0f} s, longer than its grace of "
            f"{grace:.0f} s: a preemption now would lose {lost_min:.1f} GPU-minutes"]


def attempt_view(a: Any) -> dict[str, Any]:
    return {"number": a.number, "state": a.state, "started_at": a.started_at, "ended_at": a.ended_at,
            "placement": [{"node": p.node, "gpus": list(p.gpus)} for p in a.assignment], "borrowing": a.borrowing, "exit_codes": a.exit_codes,
            "sigterm_at": a.sigterm_at, "kill_at": a.kill_at, "reason": a.reason,
            "preempted_for": a.preempted_for, "startup_s": a.startup_s, "checkpoint_s": a.checkpoint_s,
            "last_checkpoint_at": a.last_checkpoint_at, "sigterm_save_s": a.sigterm_save_s,
            "log_dir": a.log_dir, "progress_step": a.progress_step, "progress_samples": a.progress_samples,
            "progress_at": a.progress_at, "checkpoints": a.checkpoints, "lost_work_gpu_s": a.lost_work_gpu_s}


def node_views(nodes: Iterable[Node], attempts: Iterable[Any]) -> list[dict[str, Any]]:
    used: dict[str, list[int]] = {}
    on: dict[str, list[str]] = {}
    for a in attempts:
        for part in a.assignment:
            used.setdefault(part.node, []).extend(part.gpus)
            on.setdefault(part.node, []).append(str(a.job_id))
    return [{"name": n.name, "gpus": n.gpus, "gpus_used": len(used.get(n.name, [])),
             "gpus_free": n.gpus - len(used.get(n.name, [])), "gpu_indices_used": sorted(used.get(n.name, [])),
             "flavor": n.flavor, "block": n.block, "cpu": n.cpu, "memory": n.memory,
             "jobs": sorted(set(on.get(n.name, [])), key=int)} for n in nodes]


def queue_views(policy: Policy, store: Any, ledger: UsageLedger, nodes: tuple[Node, ...],
                now: float) -> list[dict[str, Any]]:
    """Every queue of the tree with its quota, what its jobs hold now, its fair-share usage,
    and owed vs delivered GPU-hours since the first submission (DESIGN §7)."""
    held: dict[str, int] = {}
    pending: dict[str, int] = {}
    for a in store.active():
        j = a.job
        if j.state.holds_resources:
            held[j.queue] = held.get(j.queue, 0) + j.gpus * j.replicas
        elif j.state.waiting:
            pending[j.queue] = pending.get(j.queue, 0) + 1
    owed, delivered = _owed_delivered(policy, store, nodes, now)
    rows = []
    for name in policy.queue_names():
        spec = policy.find_queue(name)
        assert spec is not None
        leaves = [leaf for leaf in policy.leaves() if name in policy.path_to(leaf.name)]
        rows.append({
            "name": name, "parent": policy.parent_of(name), "leaf": not spec.children, "weight": spec.weight,
            "nominal": dict(spec.nominal), "borrowing_limit": spec.borrowing_limit,
            "lending_limit": spec.lending_limit,
            "gpus_in_use": sum(held.get(q.name, 0) for q in leaves),
            "pending_jobs": sum(pending.get(q.name, 0) for q in leaves),
            "fair_share_usage": round(sum(ledger.usage.get(q.name, 0.0) for q in leaves), 6),
            "owed_gpu_hours": round(sum(owed.get(q.name, 0.0) for q in leaves) / 3600, 6),
            "delivered_gpu_hours": round(sum(delivered.get(q.name, 0.0) for q in leaves) / 3600, 6),
        })
    return rows


def _owed_delivered(policy: Policy, store: Any, nodes: tuple[Node, ...], now: float
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """The simulator's owed/delivered accounting over the server's own history."""
    jobs = store.list()
    if not jobs:
        return {}, {}
    by_job: dict[int, list[AttemptRecord]] = {}
    for a in store.all_attempts():
        end = a.ended_at if a.ended_at is not None else now
        gpus = sum(len(p.gpus) for p in a.assignment)
        by_job.setdefault(a.job_id, []).append(AttemptRecord(
            a.number, a.started_at, end, gpus, 0.0, 0.0, 0.0, 0.0, end - a.started_at))
    records = tuple(JobRecord(str(j.id), j.queue, j.tier, j.user, j.submit_at, j.gpus * j.replicas, 0.0,
                              j.finished_at, 0.0, tuple(by_job.get(j.id, ()))) for j in jobs)
    start = min(j.submit_at for j in jobs)
    run = SimRun(policy="server", trace="server", seed=0, gpus=sum(n.gpus for n in nodes), jobs=records,
                 started_at=start, ended_at=max(now, start), entitlement=policy_entitlement(policy))
    owed = owed_gpu_seconds(run)
    delivered: dict[str, float] = {}
    for r in records:
        delivered[r.queue] = delivered.get(r.queue, 0.0) + sum(a.gpus * (a.ended_at - a.admitted_at) for a in r.attempts)
    return owed, delivered
