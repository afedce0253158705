"""The history the dashboard plots (`GET /v1/history`): a sample of the cluster and of every
queue, taken by the reconcile loop at the end of a pass once `interval_s` has passed since the
last one, and kept in the database (`history_samples`) for `KEEP_S`, so a restart keeps it.

A queue's figures are those `GET /v1/queues` shows at the sample's time (parents add up their
leaves), with what only a history can tell: the waits of its pending jobs, the GPUs it borrows
above its nominal quota, and the preemptions since the previous sample with the work they lost.
No figure is per job, so a sample's size is bounded by the policy's queue tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from warden.engine.model import UsageLedger
from warden.engine.policy import Policy
from warden.executors.base import Fenced, Inventory
from warden.server.context import log
from warden.server.views import queue_views, wait_s
from warden.store.history import HistorySample
from warden.store.leadership import NotLeader
from warden.store.repo import Store

INTERVAL_S = 60.0
"""How often a sample is taken by default (`Service(history_interval_s=…)` for tests)."""
KEEP_S = 30 * 86400.0
"""How long a sample is kept."""
MOST_SAMPLES = 2000
"""The most samples one answer carries: a longer span is thinned evenly."""
SPAN_MAX_S = 31 * 86400.0
"""The longest span one request may ask for."""


class History:
    """When the next sample is due, and taking it. Used by the reconcile loop's thread only."""

    def __init__(self, store: Store, interval_s: float = INTERVAL_S) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"history_interval_s: expected a positive number of seconds, got {interval_s!r}")
        self.store = store
        self.interval_s = interval_s
        self._last: HistorySample | None = None
        """The newest sample: the baseline of the next one's preemptions and lost work."""
        self._tried_at: float | None = None
        """When a sample was last taken or tried (None: not since start; the database says)."""

    def sample(self, now: float, policy: Policy, ledger: UsageLedger, cluster: Inventory) -> None:
        """The sample at `now`, when one is due: taken after a pass and outside its lock (it
        reads every job's attempts, as `GET /v1/queues` does). A sample that fails is logged and
        tried again an interval later; it never fails the pass. A write refused because this
        server no longer leads is raised, and ends the loop as a pass's does."""
        try:
            if self.due(now):
                self.record(now, policy, ledger, cluster)
        except (NotLeader, Fenced):
            raise
        except Exception:
            log.exception("recording the history sample failed; the next try is in %g s", self.interval_s)

    def due(self, now: float) -> bool:
        """A sample is due `interval_s` after the last one (taken before a restart too), or at
        once after the clock went back past it."""
        if self._tried_at is None:
            self._last = self.store.last_sample()
            self._tried_at = self._last.at if self._last is not None else -math.inf
        return now - self._tried_at >= self.interval_s or now < self._tried_at

    def record(self, now: float, policy: Policy, ledger: UsageLedger, cluster: Inventory) -> HistorySample:
        """Take the sample at `now`, store it and drop those older than `KEEP_S`. Should it fail,
        the next try is an interval later (a failing sample must not slow every pass)."""
        self._tried_at = now
        sample = take_sample(self.store, policy, ledger, cluster, now, self._last, self.interval_s)
        self.store.record_sample(sample, keep_after=now - KEEP_S)
        self._last = sample
        return sample


def take_sample(
    store: Store,
    policy: Policy,
    ledger: UsageLedger,
    cluster: Inventory,
    now: float,
    previous: HistorySample | None,
    interval_s: float,
) -> HistorySample:
    """The cluster and every queue of the policy's tree at `now`. Preemptions count the victims
    whose SIGTERM came since `previous` (the last `interval_s` when there is none); lost work is
    what the victims' exits recorded since `previous`, so a victim still in its grace at one
    sample counts its lost work in the next (none for the first sample: it has no baseline)."""
    active = store.active()
    held = [a.job for a in active if a.job.state.holds_resources]
    waiting = [a.job for a in active if a.job.state.waiting]
    waits: dict[str, list[float]] = {}
    for job in waiting:
        waits.setdefault(job.queue, []).append(wait_s(job, now))
    charged: dict[str, int] = {}
    for job in held:
        if policy.tier(job.tier).charged:
            charged[job.queue] = charged.get(job.queue, 0) + job.gpus * job.replicas
    after = previous.at if previous is not None and previous.at < now else now - interval_s
    preempted = store.preemption_counts(after, now)
    totals = store.lost_work_totals()
    lost = (
        {q: max(0.0, total - previous.lost_totals.get(q, 0.0)) for q, total in totals.items()}
        if previous is not None
        else {}
    )
    gpu_governed = _governs_gpus(policy)
    queues: dict[str, Any] = {}
    for row in queue_views(policy, store, ledger, cluster.nodes, now):
        name = row["name"]
        leaves = [leaf.name for leaf in policy.leaves() if name in policy.path_to(leaf.name)]
        nominal = row["nominal"].get("gpu", 0) if gpu_governed else None
        in_quota_use = sum(charged.get(q, 0) for q in leaves)
        queue_waits = [w for q in leaves for w in waits.get(q, ())]
        queues[name] = {
            "gpus_in_use": row["gpus_in_use"],
            "borrowed_gpus": max(0, in_quota_use - nominal) if nominal is not None else 0,
            "pending_jobs": row["pending_jobs"],
            "delivered_gpu_hours": row["delivered_gpu_hours"],
            "owed_gpu_hours": row["owed_gpu_hours"],
            "max_wait_s": round(max(queue_waits, default=0.0), 3),
            "p50_wait_s": round(percentile(queue_waits, 0.5), 3),
            "p95_wait_s": round(percentile(queue_waits, 0.95), 3),
            "starving_jobs": sum(1 for q in leaves for w in waits.get(q, ()) if w > policy.max_wait_for(q)),
            "preemptions": sum(preempted.get(q, 0) for q in leaves),
            "lost_gpu_hours": round(sum(lost.get(q, 0.0) for q in leaves) / 3600, 6),
        }
    down = cluster.down
    sample_cluster = {
        "gpus": sum(n.gpus for n in cluster.nodes),
        "gpus_used": sum(j.gpus * j.replicas for j in held),
        "gpus_down": sum(n.gpus for n in cluster.nodes if n.name in down),
        "pending_jobs": len(waiting),
        "running_jobs": len(held),
    }
    return HistorySample(now, sample_cluster, queues, totals)


def _governs_gpus(policy: Policy) -> bool:
    """Some queue names a nominal `gpu` quota: a queue that names none then has none."""
    specs = (policy.find_queue(name) for name in policy.queue_names())
    return any(spec is not None and "gpu" in spec.nominal for spec in specs)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def sample_view(sample: HistorySample) -> dict[str, Any]:
    """A sample as `GET /v1/history` shows it (the lost-work baseline stays inside)."""
    return {"at": sample.at, "cluster": sample.cluster, "queues": sample.queues}


def history_view(samples: Iterable[HistorySample], interval_s: float) -> dict[str, Any]:
    return {"interval_s": interval_s, "samples": [sample_view(s) for s in samples]}
