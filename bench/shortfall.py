"""Why a queue gets less than it is owed: one JSON object on stdout.

    python bench/shortfall.py [--setting philly/pollux_philly.csv@750] [--policy governed]
                              [--limit N] [--traces DIR] [--markdown]

Replays one setting under one policy (a preset name or a policy YAML) and, pass by pass,
measures each queue's *shortfall*: what it is owed at that moment (the cluster's GPUs
water-filled over the queues' demand by their shares, `warden.engine.accounting.waterfill`, the
definition of owed GPU-hours in `warden/sim/metrics.py`) less the GPUs it holds. The shortfall
from one pass to the next is charged to the reasons the plan gives the queue's waiting jobs, in
proportion to their GPUs, and summed per queue as GPU-hours by (reason, tier of the waiting job),
and apart, the shortfall that accrued while the queue held at least its nominal quota (the part
of its owed share above the quota: no reclaim takes that back from other borrowers, only fair
share's order of admissions can bring it); below the quota, by the tier of the jobs that held
borrowed capacity at the time (a nominal reclaim takes from any preemptible tier, a fair-share
reclaim from the claimant's tier and lower ones). Only jobs of charged tiers are owed and
delivered, as in the metrics.
So for a queue under 98 % of what it is owed, the figures say what held it: a lease that had
not ended (`WaitingForLease`), a preemption that would not pay, strict tiers
(`InsufficientCapacity` while higher tiers hold the pool), its own quota, a reservation, …

The demand and holdings are sampled at passes; between two passes they change only at
moments without waiting jobs (then nothing is short), so the integral is that of the metrics
up to when a job's demand starts (its arrival runs a pass) — close to `owed_gpu_hours`, not
equal to it: the metrics count a gang's GPUs, this counts the engine's jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from warden.engine.accounting import policy_entitlement, queue_weights, waterfill
from warden.engine.model import Snapshot
from warden.engine.plan import Plan
from warden.sim.experiment import prepare
from warden.sim.presets import PRESETS, resolve_policy
from warden.sim.simulator import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outcomes import parse_setting  # the sibling benchmark's TRACE@GPUS

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


class Shortfall:
    """The `on_pass` hook: integrates each queue's owed, held and short GPU-seconds between
    passes, the shortfall split by the reasons of the queue's waiting jobs."""

    def __init__(
        self, queues: list[str], shares: dict[str, float], gpus: int, nominal: dict[str, float], charged: set[int]
    ) -> None:
        self.queues = queues
        self.nominal = np.array([nominal.get(q, 0.0) for q in queues])
        self.charged = charged
        self.col = {q: i for i, q in enumerate(queues)}
        self.weights = queue_weights(shares, queues)
        self.gpus = float(gpus)
        self.owed = np.zeros(len(queues))
        self.short = np.zeros(len(queues))
        self.short_over_nominal = np.zeros(len(queues))
        """Of `short`, what accrued while the queue held at least its nominal quota: the part of
        its owed share above the quota, which no reclaim can take back from other borrowers."""
        self.by_reason: dict[str, dict[tuple[str, int], float]] = defaultdict(lambda: defaultdict(float))
        self.below_by_borrower: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        """Per queue, its shortfall while below its nominal quota, split by the tier of the jobs
        that held borrowed capacity then (a tier-3 job reclaims only from tiers 3 and 4)."""
        self._last: tuple[Any, ...] | None
        self._last = None

    def __call__(self, snapshot: Snapshot, plan: Plan, now: float) -> None:
        self._charge(now)
        n = len(self.queues)
        held, waiting = np.zeros(n), np.zeros(n)
        admitted = {a.job_id: a.borrowing for a in plan.admissions}
        borrowed: dict[str, float] = defaultdict(float)
        waiting_jobs = []
        for job in snapshot.jobs:
            if job.tier not in self.charged:
                continue  # owed nothing, and what it holds is not delivered (metrics.py)
            c = self.col[job.queue]
            if job.state.holds_resources or job.id in admitted:
                held[c] += job.total_gpus
                a = job.attempt
                if admitted.get(job.id, a is not None and a.borrowing):
                    borrowed[f"tier {job.tier}"] += job.total_gpus
            elif job.state.waiting:
                waiting[c] += job.total_gpus
                waiting_jobs.append(job)
        owed = self._owed(held + waiting)
        short = np.maximum(owed - held, 0.0)
        split: dict[str, dict[tuple[str, int], float]] = {}
        if short.any():  # which of the short queues' waiting GPUs wait for what, per GPU short
            explanations = plan.explanations
            for job in waiting_jobs:
                c = self.col[job.queue]
                if short[c] > 0:
                    reason = type(explanations[job.id].reason).__name__
                    per = split.setdefault(job.queue, defaultdict(float))
                    per[(reason, job.tier)] += job.total_gpus * short[c] / waiting[c]
        total = sum(borrowed.values())
        below = {k: v / total for k, v in borrowed.items()} if total > 0 else {"nothing borrowed": 1.0}
        self._last = (now, owed, held, short, split, below)

    def _owed(self, demand: np.ndarray) -> np.ndarray:
        positive = self.weights > 0
        out = np.zeros_like(demand)
        if positive.any():
            out[positive] = waterfill(demand[positive][None, :], self.weights[positive], self.gpus)[0]
        return out

    def _charge(self, until: float) -> None:
        if self._last is None:
            return
        at, owed, held, short, split, below = self._last
        dt = until - at
        if dt <= 0:
            return
        self.owed += owed * dt
        self.short += short * dt
        at_nominal = held >= self.nominal
        self.short_over_nominal += np.where(at_nominal, short, 0.0) * dt
        for c in np.flatnonzero((short > 0) & ~at_nominal):
            by_holder = self.below_by_borrower[self.queues[c]]
            for holder, part in below.items():
                by_holder[holder] += short[c] * part * dt
        for queue, parts in split.items():
            mine = self.by_reason[queue]
            for key, gpus in parts.items():
                mine[key] += gpus * dt

    def result(self, until: float) -> dict[str, Any]:
        self._charge(until)
        out = {}
        for q, c in self.col.items():
            if self.owed[c] <= 0:
                continue
            parts = sorted(self.by_reason.get(q, {}).items(), key=lambda kv: -kv[1])
            out[q] = {
                "owed_gpu_hours": round(self.owed[c] / 3600, 1),
                "held_within_owed_gpu_hours": round((self.owed[c] - self.short[c]) / 3600, 1),
                "short_gpu_hours": round(self.short[c] / 3600, 1),
                "short_share": round(self.short[c] / self.owed[c], 4),
                "short_while_at_nominal_share": round(self.short_over_nominal[c] / max(self.short[c], 1e-9), 4),
                "below_nominal_borrowed_by": {
                    k: round(v / self.short[c], 4) for k, v in sorted(self.below_by_borrower.get(q, {}).items())
                },
                "short_by_reason": [
                    {
                        "reason": r,
                        "tier": t,
                        "gpu_hours": round(v / 3600, 1),
                        "share_of_short": round(v / self.short[c], 4),
                    }
                    for (r, t), v in parts
                    if v > 0
                ],
            }
        return out


def measure(traces: Path, setting: str, policy: str, limit: int | None) -> dict[str, Any]:
    trace, gpus = parse_setting(setting)
    setup = prepare(traces / trace, gpus=gpus, limit=limit)
    sp = resolve_policy(policy, setup.nominal, setup.gpus)
    if sp.name in PRESETS:
        total = sum(setup.nominal.values())
        shares = {q: n / total for q, n in setup.nominal.items()} if total > 0 else {}
    else:
        shares = policy_entitlement(sp.policy)
    queues = sorted({j.queue for j in setup.trace.jobs} | set(shares))
    nominal = {q.name: float(q.nominal.get("gpu", 0.0)) for q in sp.policy.leaves()}
    charged = {t for t, spec in sp.policy.tiers.items() if spec.charged}
    hook = Shortfall(queues, shares, setup.gpus, nominal, charged)
    wall = time.perf_counter()
    sim = Simulation(setup.trace, setup.nodes, sp, shares, on_pass=hook)
    run = sim.run()
    per_queue = hook.result(run.ended_at)
    return {
        "setting": setting,
        "policy": policy,
        "limit": limit,
        "wall_s": round(time.perf_counter() - wall, 1),
        "queues": dict(sorted(per_queue.items(), key=lambda kv: -kv[1]["short_share"])),
    }


def markdown(result: dict[str, Any], top: int = 4) -> str:
    lines = [
        f"**{result['setting']}, `{result['policy']}`**",
        "",
        "| queue | owed GPU-h | short GPU-h (share) | of it, while at its nominal | below it, while borrowers of … held the excess | what its waiting jobs waited for, share of the shortfall |",
        "|---|---|---|---|---|---|",
    ]
    for q, r in result["queues"].items():
        below = ", ".join(f"{k} {100 * v:.0f} %" for k, v in r["below_nominal_borrowed_by"].items() if v >= 0.005)
        parts = ", ".join(
            f"{p['reason']} (tier {p['tier']}) {100 * p['share_of_short']:.0f} %" for p in r["short_by_reason"][:top]
        )
        lines.append(
            f"| `{q}` | {r['owed_gpu_hours']:,.0f} | {r['short_gpu_hours']:,.0f} ({100 * r['short_share']:.1f} %) | "
            f"{100 * r['short_while_at_nominal_share']:.0f} % | {below} | {parts} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", default="philly/pollux_philly.csv@750", help="TRACE@GPUS under --traces")
    parser.add_argument("--policy", default="governed")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    try:
        parse_setting(args.setting)
    except ValueError as e:
        parser.error(str(e))
    result = measure(args.traces, args.setting, args.policy, args.limit)
    print(markdown(result) if args.markdown else json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
