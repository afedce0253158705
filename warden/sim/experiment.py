"""What `warden sim` does, without the terminal: load a trace and a cluster once, run policies
on them, and measure how much a policy's decisions move when one parameter moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warden.engine.accounting import policy_entitlement
from warden.engine.model import Node
from warden.engine.overcommit import quota_warnings
from warden.engine.policy import PolicyError, PolicyIssue, parse_duration, parse_policy
from warden.sim.cluster import load_cluster, pool, total_gpus
from warden.sim.loaders import load_trace
from warden.sim.metrics import DEFAULT_MAX_PREEMPTIONS_PER_JOB, natural_key, preemption_spread, summarize
from warden.sim.presets import PRESETS, SimPolicy, entitlements, resolve_policy
from warden.sim.progress import SimProgress
from warden.sim.queuemap import QueueMap, apply_queue_map, load_queue_map
from warden.sim.records import SimRun, Trace
from warden.sim.simulator import simulate


@dataclass(frozen=True)
class Setup:
    """A trace on a cluster: what every policy of one comparison shares."""

    trace: Trace
    nodes: tuple[Node, ...]
    nominal: dict[str, int]
    """Nominal GPUs per trace queue, fitted to the cluster (`presets.entitlements`)."""
    queue_map: QueueMap | None = None
    """Where the trace's queues were mapped onto a policy's leaves (`queuemap`), if they were."""

    @property
    def gpus(self) -> int:
        return total_gpus(self.nodes)


def prepare(
    trace: str | Path,
    *,
    format: str = "auto",
    gpus: int | None = None,
    cluster: str | Path | None = None,
    seed: int = 0,
    skip_invalid: bool = False,
    limit: int | None = None,
    enrich: bool = True,
    nodes: tuple[Node, ...] | None = None,
    queue_map: str | Path | None = None,
) -> Setup:
    """Load the trace and build the cluster (`gpus`, a cluster file or the `nodes`
    themselves, exactly one); with a `queue_map` file, the trace's queues become its leaves."""
    if (gpus is None) + (cluster is None) + (nodes is None) != 2:
        raise ValueError("give exactly one of --gpus N or --cluster FILE")
    if nodes is None:
        nodes = pool(gpus) if gpus is not None else load_cluster(cluster)  # type: ignore[arg-type]
    qmap = load_queue_map(queue_map) if queue_map is not None else None  # refused before the trace is read
    t = load_trace(trace, format, seed=seed, skip_invalid=skip_invalid, limit=limit, enrich=enrich)
    if qmap is not None:
        t = apply_queue_map(t, qmap)
    names = {j.queue for j in t.jobs} | set(t.queues)
    return Setup(t, nodes, entitlements(t.queues, names or {"default"}, total_gpus(nodes)), qmap)


@dataclass(frozen=True)
class Outcome:
    run: SimRun
    summary: dict[str, Any]


def run_policy(
    setup: Setup,
    policy: str | SimPolicy,
    on_progress: Callable[[SimProgress], None] | None = None,
    max_preemptions_per_job: int = DEFAULT_MAX_PREEMPTIONS_PER_JOB,
) -> Outcome:
    """Simulate one policy (a preset name, a policy file, or a resolved policy); the summary
    warns when a job is preempted more than `max_preemptions_per_job` times."""
    sp = policy if isinstance(policy, SimPolicy) else policy_for(setup, policy)
    share = policy_entitlement(sp.policy) if sp.name not in PRESETS else _shares(setup.nominal)
    run, skipped = simulate(setup.trace, setup.nodes, sp, share, on_progress)
    summary = summarize(run)
    summary.update(preemption_spread(run, max_preemptions_per_job))
    summary["policy_warnings"] = [o.message for o in quota_warnings(sp.policy, setup.nodes)]
    summary["skipped"] = {**setup.trace.skipped_reasons, **skipped}
    summary["trace_format"] = setup.trace.format
    summary["rules"] = list(setup.trace.rules)
    return Outcome(run, summary)


def policy_for(setup: Setup, policy: str) -> SimPolicy:
    """A preset or a policy file, resolved for this trace, cluster and queue map."""
    return resolve_policy(policy, setup.nominal, setup.gpus, setup.queue_map)


def _shares(nominal: dict[str, int]) -> dict[str, float]:
    """Owed shares follow the trace's quotas; equal when it has none."""
    total = sum(nominal.values())
    if total <= 0:
        return {q: 1.0 / len(nominal) for q in nominal} if nominal else {}
    return {q: n / total for q, n in nominal.items()}


# ------------------------------------------------------------------------------ sensitivity


def nudge(sp: SimPolicy, path: str, delta: str) -> SimPolicy:
    """The policy with the number at the dotted `path` moved by `delta`: an amount in the
    parameter's unit (durations: `90s`, `5m`, or seconds), or a percentage like `10%`."""
    data = sp.policy.to_dict()
    keys = path.split(".")
    node: Any = data
    for k in keys[:-1]:
        node = _child(node, k, path)
    if not isinstance(node, dict):
        raise PolicyError([PolicyIssue(path, keys[-1], "names no setting of the policy")])
    last = _key(node, keys[-1], path)
    old = node[last]
    if isinstance(old, str):  # a duration, shown as written ("7d")
        try:
            old = parse_duration(old)
        except (ValueError, TypeError):
            pass
    if isinstance(old, bool) or not isinstance(old, (int, float)):
        raise PolicyError([PolicyIssue(path, old, "is not a number the policy holds", "a numeric setting")])
    d = delta.strip()
    try:
        if d.endswith("%"):
            new = old * (1 + float(d[:-1]) / 100)
        else:
            new = old + (float(d) if _plain_number(d) else parse_duration(d))
    except (ValueError, TypeError):
        raise PolicyError(
            [PolicyIssue("delta", delta, "is not an amount", "a number, a duration like 5m, or a percentage like 10%")]
        ) from None
    node[last] = round(new) if isinstance(old, int) else new
    return SimPolicy(sp.name, parse_policy(data, f"{sp.name} with {path} {delta}"), sp.behaviour)


def _plain_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _key(node: dict[Any, Any], key: str, path: str) -> Any:
    """The key of `node` that `key` names: itself, or a tier number."""
    if key in node:
        return key
    if key.isdigit() and int(key) in node:
        return int(key)
    raise PolicyError([PolicyIssue(path, key, "names no setting of the policy")])


def _child(node: Any, key: str, path: str) -> Any:
    """One step down a dotted path; a queue's children are found by name
    (`queues.research.vision.weight`)."""
    if isinstance(node, dict):
        if key not in node and isinstance(node.get("children"), list):
            for c in node["children"]:
                if isinstance(c, dict) and c.get("name") == key:
                    return c
        return node[_key(node, key, path)]
    raise PolicyError([PolicyIssue(path, key, "names no setting of the policy")])


def admission_order(run: SimRun) -> list[str]:
    """Job ids by the time each was first admitted (never admitted: last), ties in trace order."""
    first = [(j.attempts[0].admitted_at if j.attempts else float("inf"), i, j.job_id) for i, j in enumerate(run.jobs)]
    first.sort()
    return [job_id for _, _, job_id in first]


def kendall_tau_distance(a: list[str], b: list[str]) -> float:
    """The share of job pairs the two orders put the other way round (0: same order, 1:
    reversed), counted by merge sort in O(n log n)."""
    if sorted(a) != sorted(b):
        raise ValueError("the two orders must hold the same jobs")
    n = len(a)
    if n < 2:
        return 0.0
    pos = {job: i for i, job in enumerate(b)}
    seq = [pos[job] for job in a]
    inversions = _inversions(seq)
    return inversions / (n * (n - 1) / 2)


def _inversions(seq: list[int]) -> int:
    count = 0
    width = 1
    items = list(seq)
    n = len(items)
    while width < n:
        merged: list[int] = []
        for lo in range(0, n, 2 * width):
            left = items[lo : lo + width]
            right = items[lo + width : lo + 2 * width]
            i = j = 0
            while i < len(left) and j < len(right):
                if left[i] <= right[j]:
                    merged.append(left[i])
                    i += 1
                else:
                    merged.append(right[j])
                    count += len(left) - i
                    j += 1
            merged.extend(left[i:])
            merged.extend(right[j:])
        items = merged
        width *= 2
    return count


def sensitivity(
    setup: Setup, policy: str, path: str, delta: str, on_progress: Callable[[SimProgress], None] | None = None
) -> dict[str, Any]:
    """Run the policy as written and nudged; how far the admission order and metrics moved."""
    base_policy = policy_for(setup, policy)
    moved_policy = nudge(base_policy, path, delta)
    base = run_policy(setup, base_policy, on_progress)
    moved = run_policy(setup, moved_policy, on_progress)
    keys = (
        "avg_jct_s",
        "avg_wait_s",
        "p95_wait_s",
        "utilization",
        "goodput",
        "preemptions",
        "lost_gpu_hours",
        "max_wait_least_served_queue_s",
    )
    return {
        "policy": base_policy.name,
        "param": path,
        "delta": delta,
        "value": _value_at(base_policy, path),
        "moved_value": _value_at(moved_policy, path),
        "duration": isinstance(_written_at(base_policy, path), str),
        "jobs": base.summary["jobs"],
        "kendall_tau_distance": round(kendall_tau_distance(admission_order(base.run), admission_order(moved.run)), 6),
        "base": {k: base.summary.get(k) for k in keys},
        "moved": {k: moved.summary.get(k) for k in keys},
    }


def _written_at(sp: SimPolicy, path: str) -> Any:
    """The setting at `path` as the resolved policy writes it (a duration as "8h")."""
    node: Any = sp.policy.to_dict()
    for k in path.split("."):
        node = _child(node, k, path)
    return node


def _value_at(sp: SimPolicy, path: str) -> Any:
    node = _written_at(sp, path)
    if isinstance(node, str):
        try:
            return parse_duration(node)
        except (ValueError, TypeError):
            return node
    return node


# ------------------------------------------------------------------------------ side by side

COMPARED_CLUSTER = (
    ("finished", "count"),
    ("avg_wait_s", "s"),
    ("p50_wait_s", "s"),
    ("p95_wait_s", "s"),
    ("max_wait_least_served_queue_s", "s"),
    ("starvation_breaches", "count"),
    ("utilization", "fraction"),
    ("goodput", "fraction"),
    ("preemptions", "count"),
    ("preemptions_per_hour", "number"),
    ("lost_gpu_hours", "gpu_hours"),
    ("lost_work_per_preemption_s", "s"),
)
COMPARED_QUEUE = (
    ("p50_wait_s", "s"),
    ("p95_wait_s", "s"),
    ("max_wait_s", "s"),
    ("breaches", "count"),
    ("owed_gpu_hours", "gpu_hours"),
    ("delivered_gpu_hours", "gpu_hours"),
    ("delivered_over_owed", "number"),
)
COMPARED_TIER = (("p50_wait_s", "s"), ("p95_wait_s", "s"), ("max_wait_s", "s"), ("breaches", "count"))
"""The §7 figures of two summaries (`metrics.summarize`) set side by side, with their kind."""


def side_by_side(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of `scope` (cluster, queue or tier), `name`, `metric`, `kind`, `before`, `after`
    and `difference` (after − before; None where either is undefined), from two summaries of
    the same trace: the figures `summarize` computed, set next to each other."""
    rows = [_row("cluster", "", key, kind, before, after) for key, kind in COMPARED_CLUSTER]
    for scope, table, compared in (("queue", "per_queue", COMPARED_QUEUE), ("tier", "per_tier", COMPARED_TIER)):
        b, a = before.get(table) or {}, after.get(table) or {}
        for name in sorted(b.keys() | a.keys(), key=natural_key):
            rows.extend(_row(scope, name, key, kind, b.get(name) or {}, a.get(name) or {}) for key, kind in compared)
    return rows


def _row(scope: str, name: str, key: str, kind: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    b, a = before.get(key), after.get(key)
    diff = a - b if isinstance(a, int | float) and isinstance(b, int | float) else None
    return {"scope": scope, "name": name, "metric": key, "kind": kind, "before": b, "after": a, "difference": diff}
