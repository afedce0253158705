"""`warden policy diff`: what a new policy would change for the jobs in the system now,
before anybody applies it.

Both answers come from the engine itself, asked the same question twice: the live snapshot
(`Snapshots.live`) and one `now`, planned by two fresh engines, one under the
policy in force and one under the new policy. Nothing is written and no pass is disturbed.

- a job that holds resources is *preemptible from* the moment the victim rules (preemptible
  tier, lease, thrash budget, efficiency floor) let it go: `rules.protection`, the function
  every pass asks; and it is *preempted now* when that policy's next pass would signal it;
- a waiting job has a *position* in the scheduling order (`scheduler.rank`: DESIGN §4.1's
  sort key) and an outcome in the next pass: it starts, or it waits for a reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from warden.engine.model import Job, Snapshot
from warden.engine.overcommit import cluster_totals, quota_warnings
from warden.engine.plan import Plan
from warden.engine.policy import Policy
from warden.engine.quota import QuotaTree
from warden.engine.rules import RuleContext, protection
from warden.engine.scheduler import rank, schedule


def policy_diff(snapshot: Snapshot, new: Policy, now: float) -> dict[str, Any]:
    """What changes, job by job, when `new` replaces `snapshot.policy` at `now` (the JSON
    `POST /v1/policy/diff` answers; docs/policy.md, *Before applying*)."""
    old = snapshot.policy
    leaves = {q.name for q in new.leaves()}
    orphaned = [j for j in snapshot.jobs if j.queue not in leaves]
    after = replace(snapshot, policy=new)
    before_side = _Side(snapshot, now)
    after_side = _Side(after, now)
    running, pending = [], []
    same_running = same_pending = 0
    for job in snapshot.jobs:
        if job.state.waiting:
            b, a = before_side.waiting(job), after_side.waiting(job)
            if b == a:
                same_pending += 1
                continue
            pending.append(
                {
                    **_who(job),
                    "moved": b["position"] - a["position"],
                    "reason_changed": (b["starts"], b["reason"]) != (a["starts"], a["reason"]),
                    "before": b,
                    "after": a,
                }
            )
        elif _runs(job):
            b, a = before_side.running(job), after_side.running(job)
            if b == a:
                same_running += 1
                continue
            running.append({**_who(job), "before": b, "after": a})
    return {
        "now": now,
        "applicable": not orphaned,
        "queues_missing": [{**_who(j), "state": j.state.value} for j in orphaned],
        "settings": settings_changed(old.to_dict(), new.to_dict()),
        "running": running,
        "pending": sorted(pending, key=lambda p: p["after"]["position"]),
        "unchanged": {"running": same_running, "pending": same_pending},
        "warnings": [w.to_dict() for w in quota_warnings(new, snapshot.nodes)],
    }


class _Side:
    """One policy's answers on the snapshot: its plan, its ranking, its victim rules."""

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.plan: Plan = schedule(snapshot, now)
        self.positions = {job.id: i for i, (_, job) in enumerate(rank(snapshot, now), 1)}
        self.starts = {a.job_id for a in self.plan.admissions}
        self.preempted = {p.job_id for p in self.plan.preemptions}
        self.ctx = RuleContext(snapshot.policy, QuotaTree(snapshot.policy, cluster_totals(snapshot.nodes)), now)
        self.now = now

    def waiting(self, job: Job) -> dict[str, Any]:
        e = self.plan.explanations.get(job.id)
        reason = None if e is None else {"code": e.reason.code, "message": e.reason.message}
        return {"position": self.positions[job.id], "starts": job.id in self.starts, "reason": reason}

    def running(self, job: Job) -> dict[str, Any]:
        until = protection(self.ctx, job)
        return {
            "preemptible_from": None if math.isinf(until) else max(until, self.now),
            "preempted": job.id in self.preempted,
        }


def _runs(job: Job) -> bool:
    """Holds resources and is not on its way out already (no victim rule applies to it then)."""
    return job.state.holds_resources and job.attempt is not None and job.attempt.sigterm_at is None


def _who(job: Job) -> dict[str, Any]:
    return {"id": job.id, "queue": job.queue, "tier": job.tier, "user": job.user}


def settings_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every resolved setting that differs, by dotted path (queues by name:
    `queues.research.vision.weight`), with its value `before` and `after` (a setting only one
    side has, a queue added or dropped, lacks the other)."""
    flat_before, flat_after = _flatten(before), _flatten(after)
    out = []
    for path in sorted(flat_before.keys() | flat_after.keys()):
        b, a = flat_before.get(path, _ABSENT), flat_after.get(path, _ABSENT)
        if b != a:
            out.append(
                {
                    "path": path,
                    **({"before": b} if b is not _ABSENT else {}),
                    **({"after": a} if a is not _ABSENT else {}),
                }
            )
    return out


_ABSENT = object()


def _flatten(value: Any, path: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {} if out is None else out
    if isinstance(value, Mapping):
        if "name" in value and "children" in value:  # a queue: its children are found by name
            for key, child in value.items():
                if key == "children":
                    for c in child:
                        _flatten(c, f"{path}.{c['name']}" if path else str(c["name"]), out)
                elif key != "name":
                    _flatten(child, f"{path}.{key}", out)
            return out
        for key, child in value.items():
            _flatten(child, f"{path}.{key}" if path else str(key), out)
        return out
    out[path] = value
    return out
