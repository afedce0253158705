"""The JSON the API returns, with DESIGN's names (`id`, `state`, `tier`, `queue`, `reason`, …).

Every derived number (a wait, a grace, the work a preemption would lose, owed and delivered
GPU-hours) comes from `warden.engine.accounting`, so the API shows what the engine and the
simulator compute.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from warden.engine import accounting, lifecycle
from warden.engine.cycles import Preempted, PreemptionCycle, preemption_cycles
from warden.engine.durations import format_duration, span
from warden.engine.fairshare import cluster_capacity, fair_order
from warden.engine.forecast import ASSUMES, Estimate
from warden.engine.model import Job, JobState, Node, UsageLedger
from warden.engine.policy import Policy
from warden.engine.quota import QuotaTree
from warden.engine.rules import RuleContext, efficiency, protection
from warden.engine.whatif import Verdict
from warden.executors.base import Inventory
from warden.server.explanations import KILL_AT, event_message, rendered, wall_times
from warden.store.history import PreemptionRecord
from warden.store.jobs import EventRecord, JobHead, StoredAttempt, StoredJob, job_key
from warden.store.repo import Store


def wait_s(job: JobHead, now: float) -> float:
    """Seconds pending over all attempts, up to now for a job that still waits."""
    return accounting.wait_time(job.waited_s, job.pending_since, job.submit_at, now, job.state.waiting)


def shown_state(job: JobHead, attempt: StoredAttempt | None) -> str:
    """The state a person reads of `job` whose current attempt is `attempt` (None or ended:
    none runs), the one rule the API's views, the CLI and the dashboard show (`lifecycle.shown`):
    STOPPING needs the SIGTERM that only the attempt records."""
    live = attempt if attempt is not None and attempt.number == job.attempt and attempt.ended_at is None else None
    stopping = live is not None and live.sigterm_at is not None and live.kill_at is not None
    return lifecycle.shown(job.state, cancel_requested=job.cancel_requested, stopping=stopping)


def action_view(job: JobHead, attempt: StoredAttempt | None) -> dict[str, Any]:
    """What `POST /v1/jobs/{id}/cancel`, `/approve` and `/release` answer: the job's id, its
    state after the action and the state a person reads (`shown_state`; CANCELLING for a job a
    cancel is stopping)."""
    return {"id": str(job.id), "state": job.state.value, "shown_state": shown_state(job, attempt)}


def job_summary(
    job: JobHead,
    now: float,
    attempt: StoredAttempt | None = None,
    policy: Policy | None = None,
    expected_start: dict[str, Any] | None = None,
    in_cycle: bool = False,
) -> dict[str, Any]:
    """A job as `GET /v1/jobs` lists it. Given its current `attempt` and the `policy`, a job
    that holds resources shows the nodes it runs on, when it started, checkpointed, and may
    first be preempted (`lease_end_at`) or will be killed (`kill_at`; `cancel_requested` when a
    cancel stops it), and its attempt's η; `shown_state` is the state a person reads
    (`lifecycle.shown`: CANCELLING, STOPPING where it is being stopped); a waiting one its
    `expected_start` as the forecast gives it (`Forecasts.view`); `in_cycle`: whether it is in
    a preemption cycle (`cycles_of`). `preemptible` says whether the policy lets its tier be
    preempted at all, so that a null `lease_end_at` reads "never" rather than "unknown"."""
    e = job.explanation or {}
    reason = rendered(e.get("reason"), now, str(job.id)) if job.state.waiting else None
    live = attempt if attempt is not None and attempt.number == job.attempt and attempt.ended_at is None else None
    lease_end_at = eta = None
    if live is not None and policy is not None:
        engine_job = job.to_engine(live)
        lease_end_at = lease_end(policy, engine_job) if live.sigterm_at is None else None
        eta = round(efficiency(policy, engine_job, now), 4)
    return {
        "id": str(job.id),
        "name": job.name,
        "user": job.user,
        "queue": job.queue,
        "tier": job.tier,
        "state": job.state.value,
        "shown_state": shown_state(job, live),
        "replicas": job.replicas,
        "gpus": job.gpus * job.replicas,
        "gpus_per_replica": job.gpus,
        "submit_at": job.submit_at,
        "wait_s": round(wait_s(job, now), 3),
        "position": e.get("position") if reason else None,
        "reason": reason,
        "attempt": job.attempt,
        "exit_code": job.exit_code,
        "finished_at": job.finished_at,
        "held_reason": job.held_reason,
        "claim": job.claim,
        "cancel_requested": job.cancel_requested,
        "nodes": sorted({p.node for p in live.assignment}) if live else [],
        "started_at": live.started_at if live else None,
        "last_checkpoint_at": live.last_checkpoint_at if live else None,
        "kill_at": live.kill_at if live and live.sigterm_at is not None else None,
        "lease_end_at": lease_end_at,
        "preemptible": policy.tier(job.tier).preemptible if policy is not None else None,
        "efficiency": eta,
        "expected_start": expected_start if job.state.waiting else None,
        "preemption_cycle": in_cycle,
    }


def lease_end(policy: Policy, job: Job) -> float | None:
    """When the job's attempt may first be preempted, as the engine's victim rules say
    (`rules.protection`: preemptible tier, lease, thrash budget, efficiency floor), asked as of
    the attempt's start. Each of those protections only lifts as time passes, so that is the
    moment the last one lifts: the time a pass asking now would name while the job is still
    protected, and the time it stopped being so once it is not. The attempt's start when no
    rule protected it; None when one protects it for good (a tier that is not preemptible) or
    it has no live attempt."""
    a = job.attempt
    if a is None:
        return None
    until = protection(victim_rules(policy, a.started_at), job)
    return None if math.isinf(until) else max(until, a.started_at)


_trees: dict[tuple[int, tuple[tuple[str, int], ...]], tuple[Policy, QuotaTree]] = {}


def victim_rules(policy: Policy, now: float, capacity: Mapping[str, int] | None = None) -> RuleContext:
    """The context the victim rules are asked in at `now`. They never read the quota usage, so
    one tree of `policy` (and the cluster's `capacity`, its root's limit) serves every job a
    listing shows (building one per job would cost a page of running jobs more than the rest of
    its listing)."""
    key = (id(policy), tuple(sorted((capacity or {}).items())))
    seen = _trees.get(key)
    if seen is None or seen[0] is not policy:
        _trees.clear()
        seen = _trees[key] = (policy, QuotaTree(policy, capacity))
    return RuleContext(policy, seen[1], now)


def listing_order(job: JobHead) -> tuple[int, float, int]:
    """`GET /v1/jobs`'s order: the jobs that hold resources by id, then the waiting ones in
    rank order (their `position`; held and not yet ranked ones after them, by id), then the
    finished ones by id."""
    if job.state.terminal:
        return (2, 0.0, job.id)
    if job.state.waiting:
        position = (job.explanation or {}).get("position")
        if isinstance(position, int) and job.held_reason is None:
            return (1, float(position), job.id)
        return (1, math.inf, job.id)
    return (0, 0.0, job.id)


class Listing(NamedTuple):
    """A page of `GET /v1/jobs` (`listed_jobs`)."""

    total: int
    """How many jobs match the filters, whatever the page (`X-Total-Count`)."""
    page: list[tuple[JobHead, StoredAttempt | None]]
    """The page's jobs in `listing_order`, each with its live attempt (None for a finished one)."""


def listed_jobs(
    store: Store,
    queue: str | None,
    states: set[str] | None,
    user: str | None,
    offset: int = 0,
    limit: int | None = None,
) -> Listing:
    """The jobs `GET /v1/jobs` lists, `limit` of them (None: all) from `offset`, in
    `listing_order`: the unfinished ones from the store's `active()` (rows cached between
    reads, their number bounded by the policy's limits on waiting jobs), ranked here; then,
    when `states` takes any (None: every state), the finished ones, counted and paged by the
    database, and read without what they wrote to run (`Store.finished_part`), so that a
    page costs the same however many jobs have finished."""

    def wanted(job: JobHead) -> bool:
        return (
            (queue is None or job.queue == queue)
            and (user is None or job.user == user)
            and (states is None or job.state.value in states)
        )

    active: list[tuple[JobHead, StoredAttempt | None]] = sorted(
        ((a.job, a.attempt) for a in store.active() if wanted(a.job)), key=lambda row: listing_order(row[0])
    )
    finished = {s.value for s in JobState if s.terminal}
    finished = finished if states is None else finished & states
    if not finished:
        return Listing(len(active), active[offset : None if limit is None else offset + limit])
    # Read after `active()`: a job that ended in between is listed once, ended.
    part = store.finished_part(
        states=finished, queue=queue, user=user, before=[j.id for j, _ in active], offset=offset, limit=limit
    )
    first = [row for row in active if row[0].id not in part.ended]
    page = first[offset : None if limit is None else offset + limit]
    return Listing(len(first) + part.total, page + [(head, None) for head in part.page])


def job_detail(
    job: StoredJob,
    events: Iterable[EventRecord],
    attempts: Sequence[StoredAttempt],
    now: float,
    policy: Policy,
    ledger: UsageLedger | None = None,
    expected_start: dict[str, Any] | None = None,
    links: Iterable[Preempted] = (),
    preemptors: Mapping[int, tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """A job with its events and attempts. A waiting job's sort key shows its wait and, given
    the ledger, its queue's fair-share ratios as they are now (the stored explanation keeps
    them only as of its last change). Its preemptions come from its attempts, with the queue
    and tier of each preemptor from `preemptors`; its preemption cycle from `links` (what
    `Store.preemption_links` returns for it)."""
    live = next((a for a in attempts if a.number == job.attempt and a.ended_at is None), None)
    out = job_summary(job, now, live, policy, expected_start)
    e = job.explanation or {}
    out.update(
        {
            "command": list(job.command),
            "workdir": job.workdir,
            "command_expired_at": job.command_expired_at,
            "placement": job.placement,
            "flavor": job.flavor,
            "cpu": job.cpu,
            "memory": job.memory,
            "lease_s": accounting.effective_lease(policy, job.tier, job.lease_s),
            "grace_s": accounting.effective_grace(policy, job.tier, job.grace_s),
            "time_limit_s": job.time_limit_s,
            "saves_on_sigterm": job.saves_on_sigterm,
            "approved_by": job.approved_by,
            "sort_key": (
                {**e["sort_key"], "waited_s": round(wait_s(job, now), 3), **_live_share(job, policy, ledger)}
                if job.state.waiting and e.get("sort_key")
                else None
            ),
            "events": [
                {
                    "at": ev.at,
                    "from": ev.from_state,
                    "to": ev.to_state,
                    "reason": event_message(ev.reason, ev.details, now),
                    "actor": ev.actor,
                    "details": ev.details,
                }
                for ev in events
            ],
            "attempts": [attempt_view(a, policy, job.saves_on_sigterm, now) for a in attempts],
            "preemptions": preemption_history(attempts, policy, preemptors or {}, job.saves_on_sigterm, now),
        }
    )
    cycles = preemption_cycles(job.job_id, links, policy.thrash.max_preemptions)
    out["preemption_cycle"] = cycles[0].to_dict() if cycles else None
    out["warnings"] = warnings(job, attempts, now, policy)
    return out


def preemption_history(
    attempts: Iterable[StoredAttempt],
    policy: Policy,
    preemptors: Mapping[int, tuple[str, int]],
    declared: bool,
    now: float,
) -> list[dict[str, Any]]:
    """A job's preemptions, reclaims and evictions, oldest first: when, for which job (`by`;
    null for an eviction) of which queue and tier, the work each threw away, what that rests
    on and why (`lost_work_why`), and the grace it used (null while the job is still in its
    grace), and the η of the attempt it ended. `declared`: the job declared it saves on SIGTERM."""
    out = []
    for a in sorted(attempts, key=lambda a: a.number):
        if a.preemption_kind is None or a.sigterm_at is None:
            continue
        key = job_key(a.preempted_for) if a.preempted_for else None
        by = preemptors.get(key) if key is not None else None
        out.append(
            {
                "attempt": a.number,
                "at": a.sigterm_at,
                "by": a.preempted_for,
                "by_queue": by[0] if by else None,
                "by_tier": by[1] if by else None,
                "kind": a.preemption_kind,
                "lost_work_gpu_hours": None if a.lost_work_gpu_s is None else round(a.lost_work_gpu_s / 3600, 6),
                **attempt_loss(a, declared, now),
                "grace_used_s": None if a.ended_at is None else round(a.ended_at - a.sigterm_at, 3),
                "efficiency": attempt_efficiency(a, policy),
            }
        )
    return out


def attempt_loss(a: StoredAttempt, declared: bool, now: float) -> dict[str, Any]:
    """An attempt's `lost_work_basis`, and the sentence `lost_work_why` makes of it."""
    return {
        "lost_work_basis": a.lost_work_basis,
        "lost_work_why": lost_work_why(
            a.lost_work_basis,
            now,
            declared=declared,
            sigterm_at=a.sigterm_at,
            last_checkpoint_at=a.last_checkpoint_at,
            last_checkpoint_step=a.last_checkpoint_step,
            exit_codes=a.exit_codes,
            killed=a.reason == "killed",
        ),
    }


def lost_work_why(
    basis: str | None,
    now: float,
    *,
    declared: bool,
    sigterm_at: float | None,
    last_checkpoint_at: float | None,
    last_checkpoint_step: int | None,
    exit_codes: Sequence[int] | None,
    killed: bool,
) -> str | None:
    """What a preemption's lost work rests on, in a sentence for a person reading it at `now`:
    `reported` (a checkpoint the job reported), `none` (a declared save kept, or a cancel) or
    `assumed` (and why no save counted), then the reason. None while nothing was measured (the
    job is still in its grace, or no preemption stopped the attempt)."""
    if basis is None:
        return None
    if basis == "cancelled":
        return "none: the job was cancelled; a cancel is no preemption, and nothing of this attempt runs again"
    if basis == "declared":
        return "none: exited 0 within its grace after SIGTERM (declared saves-on-sigterm)"
    if basis == "reported" and last_checkpoint_at is not None:
        checkpoint = "checkpoint" + ("" if last_checkpoint_step is None else f" at step {last_checkpoint_step}")
        finished = f"{checkpoint} finished {wall_times(now)(last_checkpoint_at)}"
        if sigterm_at is not None and last_checkpoint_at >= sigterm_at:
            return f"reported: {finished}, after its SIGTERM; nothing lost"
        return f"reported: {finished}; counted from then"
    if not declared:
        why = "no checkpoint was reported and the job did not declare --saves-on-sigterm"
    elif sigterm_at is None:
        why = "it declared --saves-on-sigterm, but it was ended without SIGTERM"
    elif killed:
        why = "it declared --saves-on-sigterm, but it was still running at the end of its grace (SIGKILL)"
    else:
        codes = ",".join(map(str, exit_codes or ())) or "?"
        why = f"it declared --saves-on-sigterm, but exited {codes} after SIGTERM"
    return f"assumed: {why}; counted from its last start"


def attempt_efficiency(a: StoredAttempt, policy: Policy) -> float | None:
    """η of an attempt up to its SIGTERM or exit (`accounting.attempt_eta`); null while it runs."""
    startup = accounting.assumed_startup(policy, a.startup_s)
    eta = accounting.attempt_eta(a.started_at, a.sigterm_at, a.ended_at, startup, a.checkpoint_s)
    return None if eta is None else round(eta, 4)


def cycles_of(store: Store, jobs: Iterable[JobHead], policy: Policy) -> dict[int, tuple[PreemptionCycle, ...]]:
    """The preemption cycles of each of `jobs` that is in one, read in one batch (a job that
    never started was never preempted, and is not read)."""
    ids = [j.id for j in jobs if j.attempt > 0]
    if not ids:
        return {}
    wanted = set(ids)
    involved: dict[int, list[Preempted]] = {}
    for link in store.preemption_links(ids):
        for side in {link.victim, link.by}:
            key = job_key(side) if side is not None else None
            if key in wanted:
                involved.setdefault(key, []).append(link)
    budget = policy.thrash.max_preemptions
    found = {i: preemption_cycles(str(i), links, budget) for i, links in involved.items()}
    return {i: c for i, c in found.items() if c}


def _live_share(job: StoredJob, policy: Policy, ledger: UsageLedger | None) -> dict[str, Any]:
    if ledger is None or policy.scheduling.order != "governed":
        return {}
    ranked = fair_order(policy, ledger.usage).get(job.queue)
    return {} if ranked is None else {"fair_share": list(ranked[1])}


def warnings(job: StoredJob, attempts: Iterable[StoredAttempt], now: float, policy: Policy) -> list[str]:
    """What a person should know before this job is preempted: a measured save that does
    not fit the grace means a preemption loses the work since the last checkpoint (the lost
    work the engine prices the job's preemption with)."""
    live = [a for a in attempts if a.ended_at is None and a.number == job.attempt]
    if not live:
        return []
    a = live[0]
    grace = accounting.effective_grace(policy, job.tier, job.grace_s)
    if a.sigterm_save_s is None or accounting.save_fits_grace(a.sigterm_save_s, grace):
        return []
    lost = accounting.predicted_lost_work(
        job.gpus * job.replicas,
        now,
        a.started_at,
        accounting.assumed_startup(policy, a.startup_s),
        a.last_checkpoint_at,
        a.sigterm_save_s,
        grace,
    )
    return [
        f"its measured checkpoint save takes {span(a.sigterm_save_s)}, longer than its grace of "
        f"{format_duration(grace)}: a preemption now would lose {lost / 60:.1f} GPU-minutes"
    ]


def attempt_view(a: StoredAttempt, policy: Policy, declared: bool, now: float) -> dict[str, Any]:
    """An attempt as `GET /v1/jobs/{id}` lists it; `declared`: its job declared it saves on
    SIGTERM (what its lost work's `lost_work_why` says)."""
    return {
        "number": a.number,
        "state": a.state,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "placement": [{"node": p.node, "gpus": list(p.gpus)} for p in a.assignment],
        "borrowing": a.borrowing,
        "exit_codes": a.exit_codes,
        "sigterm_at": a.sigterm_at,
        "kill_at": a.kill_at,
        "reason": a.reason,
        "preempted_for": a.preempted_for,
        "startup_s": a.startup_s,
        "checkpoint_s": a.checkpoint_s,
        "last_checkpoint_at": a.last_checkpoint_at,
        "sigterm_save_s": a.sigterm_save_s,
        "log_dir": a.log_dir,
        "progress_step": a.progress_step,
        "progress_samples": a.progress_samples,
        "progress_at": a.progress_at,
        "checkpoints": a.checkpoints,
        "lost_work_gpu_s": a.lost_work_gpu_s,
        **attempt_loss(a, declared, now),
        "preemption_kind": a.preemption_kind,
        "timed_out": a.timed_out,
        "efficiency": attempt_efficiency(a, policy),
    }


def node_views(
    nodes: Iterable[Node],
    attempts: Iterable[StoredAttempt],
    down: Mapping[str, str] | None = None,
    jobs: Mapping[int, StoredJob] | None = None,
    cluster: Inventory | None = None,
) -> list[dict[str, Any]]:
    """Each node with what runs on it; `down` says why a node takes no job now (Slurm's state).
    `holders` names the job on each GPU held (`jobs`: the attempts' jobs, for their queue,
    tier, user and state); a job holding no GPU on a node is listed there once, `gpu` null.
    `cluster`: the inventory that says which GPUs of each node work that is not warden's holds
    (`gpu_indices_foreign`, where the substrate can tell) and how many (`gpus_foreign`), never
    free."""
    down = down or {}
    cluster = cluster or Inventory(())
    jobs = jobs or {}
    used: dict[str, list[int]] = {}
    on: dict[str, list[str]] = {}
    holders: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        job = jobs.get(a.job_id)
        for part in a.assignment:
            used.setdefault(part.node, []).extend(part.gpus)
            on.setdefault(part.node, []).append(str(a.job_id))
            held = holders.setdefault(part.node, [])
            if part.gpus:
                held.extend(holder(gpu, a, job) for gpu in part.gpus)
            elif not any(h["gpu"] is None and h["job"] == str(a.job_id) for h in held):
                held.append(holder(None, a, job))
    return [
        {
            "name": n.name,
            "gpus": n.gpus,
            "gpus_used": len(used.get(n.name, [])),
            "gpus_free": max(0, n.gpus - len(used.get(n.name, [])) - cluster.foreign_count(n.name)),
            "gpus_foreign": cluster.foreign_count(n.name),
            "gpu_indices_used": sorted(used.get(n.name, [])),
            "gpu_indices_foreign": list(cluster.foreign.get(n.name, ())),
            "flavor": n.flavor,
            "block": n.block,
            "cpu": n.cpu,
            "memory": n.memory,
            "jobs": sorted(set(on.get(n.name, [])), key=int),
            "down": down.get(n.name),
            "holders": sorted(holders.get(n.name, []), key=lambda h: (h["gpu"] is None, h["gpu"] or 0, int(h["job"]))),
        }
        for n in nodes
    ]


def holder(gpu: int | None, attempt: StoredAttempt, job: StoredJob | None) -> dict[str, Any]:
    """Who holds one GPU (`gpu` None: a replica holding none), its job's `state` and
    `shown_state` as `job_summary` gives them; `kill_at` while its attempt is
    in its grace (preempted, evicted, cancelled or past its time limit), else null; `reserved_for`, the job the
    capacity is being freed for (its preemptor) while it is."""
    grace = attempt.sigterm_at is not None and attempt.ended_at is None
    return {
        "gpu": gpu,
        "job": str(attempt.job_id),
        "queue": job.queue if job else None,
        "tier": job.tier if job else None,
        "user": job.user if job else None,
        "state": job.state.value if job else None,
        "shown_state": shown_state(job, attempt) if job else None,
        "kill_at": attempt.kill_at if grace else None,
        "reserved_for": attempt.preempted_for if grace else None,
    }


def preemption_view(p: PreemptionRecord, now: float) -> dict[str, Any]:
    """One preemption, reclaim or eviction as `GET /v1/preemptions` lists it: `grace_used_s`
    and the lost work (with what it rests on) are null while the victim is still in its grace;
    `reason` ends with the SIGKILL deadline, written for a person reading it at `now`."""
    return {
        "at": p.sigterm_at,
        "victim": str(p.job_id),
        "victim_queue": p.victim_queue,
        "victim_tier": p.victim_tier,
        "victim_user": p.victim_user,
        "preemptor": p.preemptor,
        "preemptor_queue": p.preemptor_queue,
        "preemptor_tier": p.preemptor_tier,
        "kind": p.kind,
        "reason": event_message(p.reason, {KILL_AT: p.kill_at}, now),
        "grace_s": None if p.kill_at is None else round(p.kill_at - p.sigterm_at, 3),
        "grace_used_s": None if p.ended_at is None else round(p.ended_at - p.sigterm_at, 3),
        "kill_at": p.kill_at,
        "ended_at": p.ended_at,
        "lost_work_gpu_hours": None if p.lost_work_gpu_s is None else round(p.lost_work_gpu_s / 3600, 6),
        "lost_work_basis": p.lost_work_basis,
        "lost_work_why": lost_work_why(
            p.lost_work_basis,
            now,
            declared=p.saves_on_sigterm,
            sigterm_at=p.sigterm_at,
            last_checkpoint_at=p.last_checkpoint_at,
            last_checkpoint_step=p.last_checkpoint_step,
            exit_codes=p.exit_codes,
            killed=p.killed,
        ),
    }


def queue_views(
    policy: Policy, store: Store, ledger: UsageLedger, nodes: tuple[Node, ...], now: float
) -> list[dict[str, Any]]:
    """Every queue of the tree with its quota and limits, what its jobs hold now (and of it,
    what they borrow beyond its nominal) and are owed now (`accounting.owed_now`, what fair-share
    reclaim enforces), its fair-share usage, and owed vs delivered GPU-hours since the first
    submission (DESIGN §7)."""
    held: dict[str, int] = {}
    charged: dict[str, int] = {}
    pending: dict[str, int] = {}
    demand: dict[str, int] = {q.name: 0 for q in policy.leaves()}
    for a in store.active():
        j = a.job
        if j.state.holds_resources:
            held[j.queue] = held.get(j.queue, 0) + j.gpus * j.replicas
            if policy.tier(j.tier).charged:
                charged[j.queue] = charged.get(j.queue, 0) + j.gpus * j.replicas
        elif j.state.waiting:
            pending[j.queue] = pending.get(j.queue, 0) + 1
        if j.queue in demand and policy.tier(j.tier).charged:
            demand[j.queue] += j.gpus * j.replicas
    # What each leaf is owed now: the entitlement the engine's fair-share reclaim enforces.
    owed_now = accounting.owed_now(demand, accounting.policy_entitlement(policy), cluster_capacity(nodes)[0])
    owed, delivered = _owed_delivered(policy, store, nodes, now)
    order = fair_order(policy, ledger.usage)
    rows = []
    for name in policy.queue_names():
        spec = policy.find_queue(name)
        assert spec is not None
        leaves = [leaf for leaf in policy.leaves() if name in policy.path_to(leaf.name)]
        rows.append(
            {
                "name": name,
                "parent": policy.parent_of(name),
                "leaf": not spec.children,
                "weight": spec.weight,
                "nominal": dict(spec.nominal),
                "borrowing_limit": spec.borrowing_limit,
                "lending_limit": spec.lending_limit,
                "gpus_in_use": sum(held.get(q.name, 0) for q in leaves),
                # GPUs its charged jobs hold beyond its nominal, lent by queues that use less
                # than theirs (as quota counts them: a tier not charged borrows nothing). None
                # for the root, which is the cluster.
                "gpus_borrowed": None
                if spec is policy.queues
                else max(0, sum(charged.get(q.name, 0) for q in leaves) - nominal_gpus(spec.nominal)),
                "pending_jobs": sum(pending.get(q.name, 0) for q in leaves),
                "fair_share_usage": round(sum(ledger.usage.get(q.name, 0.0) for q in leaves), 6),
                # A leaf's place in the Fair Tree walk (1: the least served, whose jobs go first
                # within a tier); equally served leaves share one. None for an inner queue.
                "fair_share_position": order[name][0] + 1 if name in order else None,
                "owed_gpus": round(sum(owed_now.get(q.name, 0.0) for q in leaves), 6),
                "owed_gpu_hours": round(sum(owed.get(q.name, 0.0) for q in leaves) / 3600, 6),
                "delivered_gpu_hours": round(sum(delivered.get(q.name, 0.0) for q in leaves) / 3600, 6),
            }
        )
    return rows


def nominal_gpus(nominal: Mapping[str, int]) -> int:
    """A queue's nominal GPUs: its `gpu` quota, else the sum of its per-flavor ones (`gpu:…`)."""
    if "gpu" in nominal:
        return nominal["gpu"]
    return sum(v for k, v in nominal.items() if k.startswith("gpu:"))


def _owed_delivered(
    policy: Policy, store: Store, nodes: tuple[Node, ...], now: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Owed and delivered GPU-seconds per leaf queue over the server's whole history, from the
    first submission to now: the accounting the simulator reports."""
    # Only a charged tier's jobs are owed anything (tier 4 runs on idle capacity), and only
    # their attempts are delivered: the definition the simulator's metrics use.
    demands, spans = store.accounting_rows()
    jobs = [j for j in demands if policy.tier(j.tier).charged]
    if not jobs:
        return {}, {}
    queues = sorted({j.queue for j in jobs})
    index = {q: i for i, q in enumerate(queues)}
    start = min(j.submit_at for j in jobs)
    owed = accounting.owed_gpu_seconds(
        queues,
        [index[j.queue] for j in jobs],
        [j.gpus for j in jobs],
        [j.submit_at for j in jobs],
        [math.nan if j.finished_at is None else j.finished_at for j in jobs],
        accounting.policy_entitlement(policy),
        sum(n.gpus for n in nodes),
        start,
        max(now, start),
    )
    # An attempt holds its job's replicas × gpus: each replica's placement has the job's gpus.
    charged = {j.id: j for j in jobs}
    delivered: dict[str, float] = {}
    for a in spans:
        job = charged.get(a.job_id)
        if job is not None:
            held = accounting.held_gpu_seconds(
                float(job.gpus), a.started_at, a.ended_at if a.ended_at is not None else now
            )
            delivered[job.queue] = delivered.get(job.queue, 0.0) + held
    return owed, delivered


def verdict_view(v: Verdict, state: JobState, now: float) -> dict[str, Any]:
    """A dry run's answer (`POST /v1/jobs?dry_run=true`): what the engine would decide for the
    job now, with the id and state a submission would give it."""
    e = v.explanation
    return {
        "dry_run": True,
        "id": v.job_id,
        "state": state.value,
        "decision": v.decision,
        "placement": [{"node": p.node, "gpus": list(p.gpus)} for p in v.placement],
        "borrowing": v.borrowing,
        "victims": [
            {
                "id": x.job_id,
                "queue": x.queue,
                "tier": x.tier,
                "gpus": x.gpus,
                "signal_at": x.signal_at,
                "gone_by": x.gone_by,
                "lost_work_gpu_hours": round(x.lost_work / 3600, 6),
            }
            for x in v.victims
        ],
        "reason": rendered(e.reason.to_dict(), now, v.job_id) if e is not None else None,
        "position": e.position if e is not None else None,
        "sort_key": e.sort_key.to_dict() if e is not None else None,
        "expected_start": None if v.expected_start is None else estimate_view(v.expected_start, now),
    }


def estimate_view(e: Estimate | None, as_of: float | None, missing: str = "") -> dict[str, Any]:
    """An expected start as the API shows it: marked as an estimate, with what it assumes."""
    at, why = (None, missing) if e is None else (e.at, e.why)
    return {"at": at, "why": why or None, "estimate": True, "assumes": ASSUMES, "as_of": as_of}
