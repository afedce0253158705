"""`/metrics`: the signals of DESIGN §7 in Prometheus text format.

Base units (seconds, GPU-seconds), `_total` on counters, and no per-job labels: labels are
queue, tier, state or kind only, so the number of series stays bounded by the policy.

- waits: `warden_queue_wait_seconds{queue,tier}` (histogram, observed at admission: p50/p95 per
  queue and tier with `histogram_quantile`), `warden_queue_max_wait_seconds{queue}` (the longest
  current wait; its maximum over queues is the least-served queue's), and
  `warden_starvation_breaches{queue}` (waiting jobs past their queue's `max_wait`);
- utilization: `rate(warden_gpu_seconds_admitted_total) / rate(warden_gpu_seconds_available_total)`;
  `warden_gpus`, `warden_gpus_in_use`;
- cost of the priority scheme: `warden_preemptions_total{queue,tier,kind}`,
  `warden_lost_work_gpu_seconds_total{queue}` (lost work per preemption is their ratio);
- preemption cycles (`warden.engine.cycles`): `warden_jobs_in_preemption_cycle{kind}` (unfinished
  jobs in a cycle of each kind, `over_budget` or `alternating`; a job in both counts under each)
  and `warden_preemption_cycles_total{kind}` (jobs a preemption, reclaim or eviction put into a
  cycle of a kind they were not in);
- delivered GPU-seconds per queue: `warden_gpu_seconds_delivered_total{queue}`;
- `warden_jobs{state}` and `warden_scheduling_pass_seconds` (histogram);
- a failing engine: `warden_scheduling_pass_failures_total` (passes whose engine call raised)
  and `warden_jobs_held` (waiting jobs held out of scheduling, e.g. quarantined for making
  passes fail);
- who leads: `warden_leader` (1 on the server that leads, 0 on a standby) and
  `warden_leader_epoch` (its term's epoch, on the leader only).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from warden.engine.accounting import wait_time
from warden.engine.cycles import CYCLE_KINDS
from warden.engine.model import JobState, Node
from warden.engine.policy import Policy
from warden.executors.base import Inventory
from warden.server.views import cycles_of
from warden.store.repo import Store

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 259200)
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Inventoried(Protocol):
    @property
    def cluster(self) -> Inventory: ...


class Scraped(Protocol):
    """What the gauges read of the server at scrape time; `warden.server.service.Service` is
    one. A protocol, not the service itself: the service imports this module (and the reconcile
    loop, which this module feeds), so naming the service here would make the two import each
    other."""

    @property
    def store(self) -> Store: ...

    @property
    def nodes(self) -> tuple[Node, ...]: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def reconciler(self) -> _Inventoried: ...

    @property
    def leading(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    def now(self) -> float: ...


class ServerMetrics:
    def __init__(self, service: Scraped) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.wait = Histogram(
            "warden_queue_wait_seconds",
            "Queue wait of jobs at admission, all attempts.",
            ["queue", "tier"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.preemptions = Counter("warden_preemptions", "Preemptions ordered.", ["queue", "tier", "kind"], registry=r)
        self.lost = Counter(
            "warden_lost_work_gpu_seconds", "Work lost by preemptions, in GPU-seconds.", ["queue"], registry=r
        )
        self.admitted = Counter("warden_gpu_seconds_admitted", "GPU-seconds held by admitted jobs.", registry=r)
        self.available = Counter("warden_gpu_seconds_available", "GPU-seconds the cluster offered.", registry=r)
        self.delivered = Counter(
            "warden_gpu_seconds_delivered", "GPU-seconds held by each queue's jobs.", ["queue"], registry=r
        )
        self.passes = Histogram(
            "warden_scheduling_pass_seconds", "Duration of one reconcile pass.", buckets=PASS_BUCKETS, registry=r
        )
        self.cycles = Counter(
            "warden_preemption_cycles",
            "Jobs a preemption, reclaim or eviction put into a preemption cycle of this kind.",
            ["kind"],
            registry=r,
        )
        self.pass_failures = Counter(
            "warden_scheduling_pass_failures", "Scheduling passes whose engine call raised.", registry=r
        )
        r.register(_Gauges(service))

    # -- fed by the reconcile loop ----------------------------------------------------------
    def admission(self, queue: str, tier: int, wait_s: float) -> None:
        self.wait.labels(queue, str(tier)).observe(wait_s)

    def preemption(self, queue: str, tier: int, kind: str) -> None:
        self.preemptions.labels(queue, str(tier), kind).inc()

    def cycle_entered(self, kind: str) -> None:
        self.cycles.labels(kind).inc()

    def lost_work(self, queue: str, gpu_s: float) -> None:
        """Measured at the victim's exit, from its checkpoint reports."""
        self.lost.labels(queue).inc(gpu_s)

    def held(self, dt: float, gpus_by_queue: dict[str, int], capacity: int) -> None:
        """GPU-seconds over the `dt` since the previous pass."""
        if dt <= 0:
            return
        self.available.inc(capacity * dt)
        total = 0
        for queue, gpus in gpus_by_queue.items():
            self.delivered.labels(queue).inc(gpus * dt)
            total += gpus
        self.admitted.inc(total * dt)

    def pass_took(self, seconds: float) -> None:
        self.passes.observe(seconds)

    def pass_failed(self) -> None:
        self.pass_failures.inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Gauges:
    """Values read from the database at scrape time."""

    def __init__(self, service: Scraped) -> None:
        self.service = service

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.service
        leader = GaugeMetricFamily(
            "warden_leader", "1 while this server leads (runs the reconcile loop and the executor), 0 on a standby."
        )
        leader.add_metric([], 1 if s.leading else 0)
        yield leader
        epoch = GaugeMetricFamily(
            "warden_leader_epoch", "The lease's epoch of this server's term while it leads (absent on a standby)."
        )
        if s.leading and s.epoch is not None:
            epoch.add_metric([], s.epoch)
        yield epoch
        now = s.now()
        jobs = [a.job for a in s.store.active()]
        gpus = GaugeMetricFamily("warden_gpus", "GPUs in the cluster.")
        gpus.add_metric([], sum(n.gpus for n in s.nodes))
        yield gpus
        foreign = GaugeMetricFamily(
            "warden_gpus_foreign", "GPUs held by work that is not warden's, by node (never scheduled).", labels=["node"]
        )
        for node, count in s.reconciler.cluster.foreign_counts().items():
            foreign.add_metric([node], count)
        yield foreign
        in_use = GaugeMetricFamily("warden_gpus_in_use", "GPUs held by jobs (a job in its grace period included).")
        in_use.add_metric([], sum(j.gpus * j.replicas for j in jobs if j.state.holds_resources))
        yield in_use
        by_state = GaugeMetricFamily("warden_jobs", "Jobs by state (finished ones not counted).", labels=["state"])
        counts: dict[str, int] = {st.value: 0 for st in JobState if not st.terminal}
        for j in jobs:
            counts[j.state.value] = counts.get(j.state.value, 0) + 1
        for state, n in sorted(counts.items()):
            by_state.add_metric([state], n)
        yield by_state
        held = GaugeMetricFamily("warden_jobs_held", "Waiting jobs held out of scheduling (quarantined).")
        held.add_metric([], sum(1 for j in jobs if j.held_reason is not None and j.state.waiting))
        yield held
        policy = s.policy
        in_cycle = GaugeMetricFamily(
            "warden_jobs_in_preemption_cycle",
            "Unfinished jobs in a preemption cycle, by kind (a job in both counts under each).",
            labels=["kind"],
        )
        kinds = dict.fromkeys(CYCLE_KINDS, 0)
        for cycles in cycles_of(s.store, jobs, policy).values():
            for c in cycles:
                kinds[c.kind] += 1
        for kind, n in kinds.items():
            in_cycle.add_metric([kind], n)
        yield in_cycle
        longest = GaugeMetricFamily(
            "warden_queue_max_wait_seconds", "Longest current wait in each queue.", labels=["queue"]
        )
        breaches = GaugeMetricFamily(
            "warden_starvation_breaches", "Waiting jobs past their queue's max_wait.", labels=["queue"]
        )
        worst: dict[str, float] = {q.name: 0.0 for q in policy.leaves()}
        over: dict[str, int] = {q.name: 0 for q in policy.leaves()}
        for j in jobs:
            if j.state.waiting:
                w = wait_time(j.waited_s, j.pending_since, j.submit_at, now)
                worst[j.queue] = max(worst.get(j.queue, 0.0), w)
                if w >= policy.max_wait_for(j.queue):
                    over[j.queue] = over.get(j.queue, 0) + 1
        for q in sorted(worst):
            longest.add_metric([q], worst[q])
            breaches.add_metric([q], over[q])
        yield longest
        yield breaches
