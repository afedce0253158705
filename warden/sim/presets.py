"""The policies a simulation can run: warden's governed policy, any policy file, and presets
that reproduce FIFO and how Slurm, Kueue (with and without Fair Sharing), KAI and plain
Kubernetes decide.

Every preset is an ordinary engine policy plus a few `Behaviour` settings for what the peer
does outside its scheduling decision (when SIGKILL really lands, how many admissions a cycle
makes, whether a gang is scheduled pod by pod). The queue tree comes from the trace: one leaf
per trace queue under a root `cluster`. The exact semantics of each preset are in
docs/simulator.md; the facts they rest on in the peers' own documentation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warden.engine.accounting import policy_entitlement  # noqa: F401  (re-exported for warden.sim.experiment)
from warden.engine.policy import Policy, PolicyError, PolicyIssue, load_policy, parse_policy
from warden.sim.queuemap import QueueMap, check_leaves


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What a simulated scheduler does besides the engine's plan."""

    grace_poll: float | None = None
    """SIGKILL lands on the first tick of this period at or after the grace deadline (Slurm
    checks GraceTime every 30 s); None: exactly at the deadline, as warden's own timer does."""
    admissions_per_queue: int | None = None
    """At most this many admissions per leaf queue per pass (Kueue admits one workload per
    ClusterQueue per cycle); None: no limit."""
    cycle_s: float = 1.0
    """How soon a pass that held admissions back runs again."""
    pods: bool = False
    """Schedule every replica of a gang as its own pod (Kubernetes without a queueing layer):
    a gang makes progress only while all its pods run; evicting one pod interrupts the job and
    strands the others, which hold their GPUs idle until the evicted pod runs again."""
    requeue_restarts_age: bool = False
    """A requeued job's earlier waiting no longer counts towards its age (Slurm resets the
    submit time of a requeued job, so its age factor starts again from zero)."""


@dataclass(frozen=True)
class SimPolicy:
    name: str
    policy: Policy
    behaviour: Behaviour = Behaviour()


PRESETS = ("governed", "fifo_strict", "fifo_backfill", "slurm", "kueue", "kueue_fair", "kai", "k8s")

_NO_GUARD = {"min_efficiency": 0.0, "max_preemptions": {"per": "24h", "count": 1_000_000}}


def _reclaim(nominal: str = "never", fair_share: str = "never") -> dict[str, Any]:
    """`preemption.reclaim` for a peer: no peer shields a starving job from reclaim, and a
    fair-share swap needs no more than the rule's own imbalance (Kueue's test; KAI's
    `reclaimerUtilizationMultiplier` defaults to 1)."""
    return {"nominal": nominal, "fair_share": fair_share, "fair_share_margin": 1.0, "starvation_shield": "off"}


def _tiers(preemptible: Callable[[int], bool], grace: str, lease: str = "0s") -> dict[int, dict[str, Any]]:
    names = {1: "production-inference", 2: "pretraining", 3: "experimentation", 4: "opportunistic"}
    return {
        t: {
            "name": names[t],
            "preemptible": preemptible(t),
            "grace": grace,
            "lease": lease,
            "requires_approval": False,
            "scope": "cluster",
        }
        for t in names
    }


def entitlements(queues: Mapping[str, float], names: Iterable[str], gpus: int) -> dict[str, int]:
    """Nominal GPUs per trace queue: the trace's quotas, scaled down to the cluster when they
    exceed it (floored to whole GPUs); queues without a quota get 0. A trace without quotas
    splits the cluster equally (the first `gpus mod n` queues, in name order, get one more)."""
    names = sorted(set(names))
    if not queues:
        share, extra = divmod(gpus, len(names)) if names else (0, 0)
        return {q: share + (1 if i < extra else 0) for i, q in enumerate(names)}
    total = sum(queues.get(q, 0.0) for q in names)
    scale = gpus / total if total > gpus else 1.0
    return {q: int(queues.get(q, 0.0) * scale) for q in names}


def _queue_tree(nominal: Mapping[str, int], gpus: int, governed: bool) -> dict[str, Any]:
    """Root `cluster` with one leaf per trace queue; quotas only where the policy governs them.

    Fair-share weights follow the nominal quotas (1 for a queue without one)."""
    leaves = []
    for q in sorted(nominal):
        leaf: dict[str, Any] = {"name": q, "weight": max(1, nominal[q])}
        if governed:
            leaf["nominal"] = {"gpu": nominal[q]}
        leaves.append(leaf)
    root: dict[str, Any] = {"name": "cluster", "children": leaves}
    if governed:
        root["nominal"] = {"gpu": gpus}
    return root


_KUEUE_SCHEDULING = {"order": "priority", "reservations": 0, "requeue_timestamp": "submit", "nominal_first": True}
"""How Kueue takes a cycle's heads, with or without Fair Sharing: "request under nominal quota
before borrowing", then priority, then the creation timestamp a preempted workload keeps."""


def build_preset(name: str, nominal: Mapping[str, int], gpus: int) -> SimPolicy:
    """The named preset for a cluster of `gpus` GPUs and these trace queues."""
    queues_governed = _queue_tree(nominal, gpus, governed=True)
    queues_free = _queue_tree(nominal, gpus, governed=False)
    never = _tiers(lambda t: False, "120s")
    fifo = {"order": "fifo", "reservations": 0}
    data: dict[str, Any]
    behaviour = Behaviour()
    if name == "governed":
        data = {"queues": queues_governed, "tiers": {1: {"requires_approval": False}, 2: {"requires_approval": False}}}
    elif name == "fifo_strict":
        data = {
            "tiers": never,
            "queues": queues_free,
            "thrash": _NO_GUARD,
            "scheduling": {**fifo, "head_of_line_blocking": True},
        }
    elif name == "fifo_backfill":
        data = {
            "tiers": never,
            "queues": queues_free,
            "thrash": _NO_GUARD,
            "scheduling": {**fifo, "head_of_line_blocking": False},
        }
    elif name == "slurm":
        # PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, PreemptExemptTime unset (its
        # default, -1: no minimum runtime, hence lease 0 s). A requeued job may start again
        # `requeue_delay` (default: cred_expire, 120 s) + 1 s after it was requeued, and its
        # submit time is reset (slurmctld job_mgr.c, slurm.conf AuthInfo cred_expire).
        data = {
            "tiers": _tiers(lambda t: t > 1, "120s"),
            "queues": queues_free,
            "thrash": {**_NO_GUARD, "requeue_backoff": "121s"},
            "preemption": {"victim_order": "smallest", "only_if_it_pays": False, "reclaim": _reclaim()},
            "scheduling": {"order": "governed", "reservations": 1},
        }
        behaviour = Behaviour(grace_poll=30.0, requeue_restarts_age=True)
    elif name == "kueue":
        tiers = _tiers(lambda t: t > 1, "30s")
        for spec in tiers.values():
            spec["scope"] = "quota"
        # A preempted workload keeps its creation timestamp in Kueue's queues: requeuingStrategy
        # .timestamp (Eviction by default) orders by eviction time only the workloads evicted by
        # a waitForPodsReady timeout, and only those get its backoff (workload.go
        # GetQueueOrderTimestamp; kubernetes-sigs/kueue#599). A cycle's heads are taken in the
        # order "request under nominal quota before borrowing", then priority, then timestamp
        # (scheduler.go entryOrdering.Less): `nominal_first`.
        data = {
            "min_grace": "30s",
            "tiers": tiers,
            "queues": queues_governed,
            "thrash": _NO_GUARD,
            "preemption": {
                "victim_order": "newest",
                "only_if_it_pays": False,
                "reclaim": _reclaim(nominal="not_higher"),
            },
            "scheduling": _KUEUE_SCHEDULING,
        }
        behaviour = Behaviour(admissions_per_queue=1, cycle_s=1.0)
    elif name == "kueue_fair":
        # Kueue with Fair Sharing (kubernetes-sigs/kueue): preemption.fairSharing strategies
        # [LessThanOrEqualToFinalShare, LessThanInitialShare] (pkg/scheduler/preemption/fairsharing/
        # strategy.go) → `final_then_initial`; reclaimWithinCohort: Any, within nominal with no
        # share test (FairSharingPreemptWithinNominal, preemption.go) → `nominal: any`;
        # borrowWithinCohort: LowerPriority, so a borrowing workload preempts lower priorities
        # anywhere in the cohort → `scope: cluster`. Victims: the ClusterQueue with the highest
        # share first, then priority, then most recently admitted (fairsharing/ordering.go) →
        # `share`. Heads are taken by lowest DominantResourceShare after admission (0 within
        # nominal), then priority, then timestamp (pkg/scheduler/fair_sharing_iterator.go:
        # entryComparer.less); warden's `priority` order with `nominal_first` keeps the
        # within-nominal-first split and the priority and timestamp ties (docs/simulator.md).
        tiers = _tiers(lambda t: t > 1, "30s")
        data = {
            "min_grace": "30s",
            "tiers": tiers,
            "queues": queues_governed,
            "thrash": _NO_GUARD,
            "preemption": {
                "victim_order": "share",
                "only_if_it_pays": False,
                "reclaim": _reclaim(nominal="any", fair_share="final_then_initial"),
            },
            "scheduling": _KUEUE_SCHEDULING,
        }
        behaviour = Behaviour(admissions_per_queue=1, cycle_s=1.0)
    elif name == "kai":
        # KAI scheduler (NVIDIA/KAI-Scheduler): reclaim ignores workload priority, to the deserved
        # quota and to the fair share (docs/fairness/README.md; pkg/scheduler/plugins/proportion/
        # reclaimable/reclaimable.go: the claimant stays within its fair share) → `nominal: any`,
        # `fair_share: final`; the preempt action only within a queue (actions/preempt) →
        # `scope: queue`; victim queues most over their fair share first (actions/reclaim/
        # reclaim.go, queue_order.go) → `share`. preemptMinRuntime and reclaimMinRuntime default
        # to 0s; the lease is the 10m that docs/plugins/minruntime.md configures for both. The
        # evictor deletes the pod without a grace override (pkg/scheduler/cache/cache.go: evict),
        # so Kubernetes' terminationGracePeriodSeconds (30 s) applies. No reservations (a roadmap
        # item). Queues go first whose allocation is furthest below their fair share
        # (docs/fairness/README.md, "Queue Order"): the governed order's Fair Tree share over a
        # one-minute half-life, i.e. over what each queue holds now; starving only at the breach.
        tiers = _tiers(lambda t: t > 1, "30s", lease="10m")
        for spec in tiers.values():
            spec["scope"] = "queue"
        data = {
            "min_grace": "30s",
            "tiers": tiers,
            "queues": queues_governed,
            "thrash": _NO_GUARD,
            "fair_share": {"half_life": "1m", "aging": {"escalate_at": 1.0}},
            "preemption": {
                "victim_order": "share",
                "only_if_it_pays": False,
                "reclaim": _reclaim(nominal="any", fair_share="final"),
            },
            "scheduling": {"order": "governed", "reservations": 0, "requeue_timestamp": "submit"},
        }
    elif name == "k8s":
        # The default scheduler queues a preempted pod's replacement anew (PrioritySort: priority,
        # then the time it was queued). Ordered so, pod by pod, two gangs of one tier each keep
        # part of the pool and wait for ever, where real pods would time out their rendezvous;
        # the preset keeps the job's submit time, which keeps a gang's pods together.
        data = {
            "min_grace": "30s",
            "tiers": _tiers(lambda t: t > 1, "30s"),
            "queues": queues_free,
            "thrash": _NO_GUARD,
            "preemption": {"victim_order": "newest", "only_if_it_pays": False, "reclaim": _reclaim()},
            "scheduling": {"order": "priority", "reservations": 0, "requeue_timestamp": "submit"},
        }
        behaviour = Behaviour(pods=True)
    else:
        raise _refused(
            "policy", name, "is neither a preset nor a policy file", ", ".join(PRESETS) + ", or a path to a policy YAML"
        )
    return SimPolicy(name, parse_policy(data, f"<preset {name}>"), behaviour)


def _refused(path: str, value: Any, message: str, allowed: str | None = None) -> PolicyError:
    return PolicyError([PolicyIssue(path, value, message, allowed)])


def resolve_policy(
    name_or_file: str, nominal: Mapping[str, int], gpus: int, queue_map: QueueMap | None = None
) -> SimPolicy:
    """A preset by name, or a policy file whose leaf queues must cover the trace's queues (and
    take every leaf the `queue_map` sends them to)."""
    if name_or_file in PRESETS:
        return build_preset(name_or_file, nominal, gpus)
    path = Path(name_or_file)
    if not path.exists():
        raise _refused(
            "policy",
            name_or_file,
            "is neither a preset nor an existing file",
            ", ".join(PRESETS) + ", or a path to a policy YAML",
        )
    policy = load_policy(path)
    leaves = {q.name for q in policy.leaves()}
    if queue_map is not None:
        check_leaves(queue_map, leaves, str(path))
    missing = sorted(set(nominal) - leaves)
    if missing:
        raise _refused(
            "queues",
            ", ".join(missing),
            f"trace queues are not leaf queues of {path} (--queue-map FILE maps them onto its leaves)",
            ", ".join(sorted(leaves)),
        )
    return sim_policy(path.stem, policy)


def sim_policy(name: str, policy: Policy) -> SimPolicy:
    """A policy as the simulator runs it: every job approved at once, as nothing waits for a
    person on a virtual clock."""
    tiers = {t: spec.model_copy(update={"requires_approval": False}) for t, spec in policy.tiers.items()}
    return SimPolicy(name, policy.model_copy(update={"tiers": tiers}))
