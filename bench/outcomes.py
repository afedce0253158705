"""What each policy delivers on contended traces: one JSON object on stdout.

    python bench/outcomes.py [--setting TRACE@GPUS ...] [--policies a,b,FILE,PRESET[path=value;…]]
                             [--limit N] [--traces DIR] [--workers N] [--markdown]
    python bench/outcomes.py --merge RESULT.json ... [--markdown]

A setting is a trace under the shared traces folder and a pool of GPUs, e.g.
`philly/pollux_philly.csv@680` (the Philly VCs as queues, their quotas from
`philly_vc_nodes.csv`, scaled to the pool). By default: all of Philly at 600, 680 and 750 GPUs
and Alibaba PAI 2023 at 48 GPUs (contended in bursts: `fifo_backfill` waits 27 h at p95 there,
nothing at 64 GPUs and over 200 h at 32), every preset. A policy is a preset name or a policy YAML.

Per setting and policy: utilization; p50/p95 wait overall, per tier and per queue; starvation
breaches and how long past the maximum wait they ran; delivered over owed GPU-hours per queue;
preemptions by cause (preemptor tier → victim tier, downward or reclaim, after a reservation
or not) with the work they lost and the startups they cost; and, for every policy that is
not a FIFO, the goals of the governed policy checked against `fifo_backfill` and the peers,
PASS or FAIL. By default the policies are `governed`, `fifo_backfill` and every peer preset
that preempts.

A starvation breach is *forced* (by the tier contract) when, at every instant the job waited,
the cluster's GPUs less those demanded by jobs of strictly higher tiers (submitted and not
finished, waiting or running) were fewer than the job's GPUs: no policy that keeps tiers
strict could have started it. It is computed here from the run's records alone, not by the
engine's rules. The goals on breaches count the breaches that were not forced.
`--workers N` runs N simulations at a time (one per core). `--merge` prints the JSON results
of several runs (settings or policies run apart) as one, with the goals checked anew.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from numpy.typing import NDArray

from warden.engine.policy import parse_policy
from warden.sim.experiment import Setup, prepare, run_policy
from warden.sim.presets import PRESETS, SimPolicy, build_preset
from warden.sim.records import SimJob, SimRun

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
PHILLY = "philly/pollux_philly.csv"
PAI = "alibaba_pai_v2023/openb_pod_list_default.csv"
DEFAULT_SETTINGS = (f"{PHILLY}@600", f"{PHILLY}@680", f"{PHILLY}@750", f"{PAI}@48")
ORDER = ("governed", "fifo_backfill", "slurm", "kueue", "kueue_fair", "kai", "k8s")
BASELINE = "fifo_backfill"
PEERS = ("slurm", "kueue", "kueue_fair", "kai", "k8s")
"""The peer presets that preempt: the governed policy should preempt less than each."""
FIFOS = ("fifo_strict", "fifo_backfill")
SERVED = 0.98
"""Delivered over owed GPU-hours a queue with demand should reach."""


def parse_setting(text: str) -> tuple[str, int]:
    trace, sep, gpus = text.rpartition("@")
    if not sep or not trace or not gpus.isdigit() or int(gpus) <= 0:
        raise ValueError(f"--setting: {text!r} is not TRACE@GPUS (e.g. {PHILLY}@680)")
    return trace, int(gpus)


@lru_cache(maxsize=4)
def _setup(traces: str, trace: str, gpus: int, limit: int | None) -> Setup:
    return prepare(Path(traces) / trace, gpus=gpus, limit=limit)


def waiting_intervals(job: SimJob, run_end: float) -> list[tuple[float, float]]:
    """The stretches of time the job waited: from its submission, and from each moment it held
    fewer than all its GPUs (a requeue, or a gang's evicted pod), to the moment it held them all
    again, or to the run's end if it never did."""
    deltas: dict[float, int] = {}
    for a in job.attempts:
        deltas[a.admitted_at] = deltas.get(a.admitted_at, 0) + a.gpus
        deltas[a.ended_at] = deltas.get(a.ended_at, 0) - a.gpus
    held = 0
    since: float | None = job.submit
    out: list[tuple[float, float]] = []
    for t in sorted(deltas):
        if job.finished_at is not None and t >= job.finished_at:
            break
        held += deltas[t]
        if since is None and held < job.num_gpus:
            since = t
        elif since is not None and held >= job.num_gpus:
            out.append((since, t))
            since = None
    if since is not None and job.finished_at is None and run_end > since:
        out.append((since, run_end))
    return [(a, b) for a, b in out if b > a]


def higher_tier_demand(run: SimRun, tier: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """GPUs demanded by the jobs of tiers strictly above `tier` as a step function: the value
    `demand[i]` holds from `times[i]` to `times[i + 1]` (a job demands from its submission to
    its end, the run's end if it never finished)."""
    jobs = [j for j in run.jobs if j.tier < tier]
    starts = np.array([j.submit for j in jobs], dtype=np.float64)
    ends = np.array([run.ended_at if j.finished_at is None else j.finished_at for j in jobs], dtype=np.float64)
    gpus = np.array([j.num_gpus for j in jobs], dtype=np.float64)
    at = np.concatenate([starts, ends])
    change = np.concatenate([gpus, -gpus])
    times, where = np.unique(at, return_inverse=True)
    demand = np.cumsum(np.bincount(where, weights=change, minlength=times.size))
    return np.concatenate([[-np.inf], times]), np.concatenate([[0.0], demand])


def forced(job: SimJob, gpus: int, run_end: float, demand: tuple[NDArray[np.float64], NDArray[np.float64]]) -> bool:
    """Whether higher tiers' demand alone left fewer than the job's GPUs of a `gpus`-GPU
    cluster at every instant the job waited (`higher_tier_demand` of the job's tier)."""
    times, values = demand
    intervals = waiting_intervals(job, run_end)
    if not intervals:
        return False
    for start, end in intervals:
        first = int(np.searchsorted(times, start, side="right")) - 1
        last = int(np.searchsorted(times, end, side="left")) - 1
        if gpus - values[first : last + 1].min() >= job.num_gpus:
            return False
    return True


def breach_kinds(run: SimRun) -> dict[str, int]:
    """Starvation breaches (a wait of at least the queue's maximum, as the metrics count them)
    that the tier contract forced, all of them and those of twice the maximum wait or more."""
    counts = {"forced_breaches": 0, "forced_breaches_over_twice_max_wait": 0}
    demand: dict[int, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
    for job in run.jobs:
        limit = run.max_wait.get(job.queue, np.inf)
        if job.wait_s < limit:
            continue
        if job.tier not in demand:
            demand[job.tier] = higher_tier_demand(run, job.tier)
        if forced(job, run.gpus, run.ended_at, demand[job.tier]):
            counts["forced_breaches"] += 1
            counts["forced_breaches_over_twice_max_wait"] += int(limit > 0 and job.wait_s >= 2 * limit)
    return counts


def variant(name: str, setup: Setup) -> str | SimPolicy:
    """A policy name as given, or for `PRESET[path=value,…]` the preset with those settings
    changed (dotted paths into the policy, `;` between them, e.g.
    `governed[preemption.reclaim.fair_share=never;preemption.reclaim.nominal=not_higher]`): how
    a table shows what each rule does, one rule at a time."""
    if not name.endswith("]") or "[" not in name:
        return name
    base, _, changes = name[:-1].partition("[")
    data = build_preset(base, setup.nominal, setup.gpus)
    policy = data.policy.to_dict()
    for change in filter(None, changes.split(";")):
        path, sep, value = change.partition("=")
        if not sep:
            raise ValueError(f"--policies: {change!r} in {name!r} is not PATH=VALUE")
        *parents, last = path.split(".")
        node = policy
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return SimPolicy(name, parse_policy(policy, f"<{name}>"), data.behaviour)


def outcome(traces: str, setting: str, policy: str, limit: int | None) -> dict[str, Any]:
    """One simulation, reduced to what the tables read."""
    trace, gpus = parse_setting(setting)
    setup = _setup(traces, trace, gpus, limit)
    done = run_policy(setup, variant(policy, setup))
    s = done.summary
    queues = s["per_queue"]
    served = {q: r["delivered_over_owed"] for q, r in queues.items() if (r["owed_gpu_hours"] or 0) > 0}
    ratios = [v for v in served.values() if v is not None]
    delivered = s["admitted_gpu_hours"] or 0.0
    return {
        "policy": s["policy"],
        "jobs": s["jobs"],
        "unfinished": s["unfinished"],
        "utilization": s["utilization"],
        "p50_wait_s": s["p50_wait_s"],
        "p95_wait_s": s["p95_wait_s"],
        "breaches": s["starvation_breaches"],
        "breach_wait_over_max_p50": s["breach_wait_over_max_p50"],
        "breach_wait_over_max_max": s["breach_wait_over_max_max"],
        "breaches_over_twice_max_wait": s["breaches_over_twice_max_wait"],
        **breach_kinds(done.run),
        "per_tier": s["per_tier"],
        "per_queue": {
            q: {
                k: r[k]
                for k in ("jobs", "p50_wait_s", "p95_wait_s", "breaches", "owed_gpu_hours", "delivered_over_owed")
            }
            for q, r in queues.items()
        },
        "least_delivered_over_owed": min(ratios) if ratios else None,
        "queues_under_served": sorted(q for q, v in served.items() if v is not None and v < SERVED),
        "preemptions": s["preemptions"],
        "preemptions_per_job_max": s["preemptions_per_job"]["max"],
        "lost_gpu_hours": s["lost_gpu_hours"],
        "lost_share_of_delivered": round(s["lost_gpu_hours"] / delivered, 6) if delivered else None,
        "restart_startup_gpu_hours": s["restart_startup_gpu_hours"],
        "preemptions_by_cause": s["preemptions_by_cause"],
        "wall_s": s["wall_s"],
    }


def unforced(row: dict[str, Any]) -> tuple[int, int]:
    """The breaches the tier contract did not force: all of them, and those of twice the
    maximum wait or more."""
    return (
        row["breaches"] - row["forced_breaches"],
        row["breaches_over_twice_max_wait"] - row["forced_breaches_over_twice_max_wait"],
    )


def tier2_p95(row: dict[str, Any]) -> float | None:
    return (row["per_tier"].get("2") or {}).get("p95_wait_s")


def goals(rows: dict[str, dict[str, Any]], name: str) -> dict[str, bool | None]:
    """The governed policy's goals (issue: the policy earns its keep) for policy `name` against
    the baseline and the peers run alongside it; None where a needed run is missing. Breaches
    count only those the tier contract did not force."""
    r, base = rows[name], rows.get(BASELINE)
    peers = [rows[p] for p in PEERS if p in rows and p != name]
    breaches, over_twice = unforced(r)
    least = r["least_delivered_over_owed"]
    return {
        "every_queue_served": least is None or least >= SERVED,
        "breaches_at_most_baseline": None if base is None else breaches <= unforced(base)[0],
        "no_breach_past_twice_max_wait": over_twice == 0,
        "utilization_at_least_97pct_of_baseline": None
        if base is None
        else (r["utilization"] or 0.0) >= 0.97 * (base["utilization"] or 0.0),
        "lost_at_most_half_a_percent": r["lost_share_of_delivered"] is None or r["lost_share_of_delivered"] <= 0.005,
        "fewer_preemptions_than_every_peer": None
        if not peers
        else all(r["preemptions"] < p["preemptions"] for p in peers),
        "tier2_p95_at_most_baseline": None if base is None else (tier2_p95(r) or 0.0) <= (tier2_p95(base) or 0.0),
    }


def verdict(met: bool | None) -> str | None:
    """A goal as the tables show it."""
    return None if met is None else ("PASS" if met else "FAIL")


def measure(
    traces: Path, settings: list[str], policies: list[str], limit: int | None = None, workers: int = 1
) -> dict[str, Any]:
    tasks = [(s, p) for s in settings for p in policies]
    args = [(str(traces), s, p, limit) for s, p in tasks]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(outcome, *zip(*args, strict=True)))
    else:
        done = [outcome(*a) for a in args]
    result: dict[str, Any] = {"limit": limit, "settings": {}}
    for (setting, policy), row in zip(tasks, done, strict=True):
        result["settings"].setdefault(setting, {"policies": {}})["policies"][policy] = row
    return judged(result)


def judged(result: dict[str, Any]) -> dict[str, Any]:
    """The result with each setting's goals checked for every policy that is not a FIFO."""
    for block in result["settings"].values():
        rows = block["policies"]
        block["goals"] = {
            name: {goal: verdict(met) for goal, met in goals(rows, name).items()} for name in rows if name not in FIFOS
        }
    return result


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results as one (the rows of a setting side by side, in `ORDER` first), the
    goals checked anew: how settings and policies run apart, one at a time or on several
    machines, make one table. A row given twice keeps the last."""
    limits = {r.get("limit") for r in results}
    if len(limits) > 1:
        raise ValueError(f"--merge: the results were run with different --limit values ({sorted(map(str, limits))})")
    out: dict[str, Any] = {"limit": limits.pop() if limits else None, "settings": {}}
    for r in results:
        for setting, block in r["settings"].items():
            out["settings"].setdefault(setting, {"policies": {}})["policies"].update(block["policies"])
    for block in out["settings"].values():
        rows = block["policies"]
        rank = {name: i for i, name in enumerate(ORDER)}
        block["policies"] = dict(sorted(rows.items(), key=lambda kv: rank.get(kv[0], len(ORDER))))
    return judged(out)


def _hours(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 3600:.2f} h"


def _pct(fraction: float | None) -> str:
    return "–" if fraction is None else f"{100 * fraction:.2f} %"


def markdown(result: dict[str, Any]) -> str:
    out: list[str] = []
    for setting, block in result["settings"].items():
        rows = block["policies"]
        out += [
            f"**{setting}**",
            "",
            "| policy | breaches (≥ 2× max) | forced (≥ 2× max) | least delivered/owed (queues < 98 %) | util. | "
            "lost GPU-h (% delivered) | preemptions (most on a job) | restart GPU-h | tier-2 p95 wait | p95 wait | wall |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in rows.items():
            least = r["least_delivered_over_owed"]
            out.append(
                f"| `{name}` | {r['breaches']:,} ({r['breaches_over_twice_max_wait']:,}) | "
                f"{r['forced_breaches']:,} ({r['forced_breaches_over_twice_max_wait']:,}) | "
                f"{'–' if least is None else f'{least:.3f}'} ({len(r['queues_under_served'])}) | "
                f"{r['utilization']:.3f} | {r['lost_gpu_hours']:.1f} ({_pct(r['lost_share_of_delivered'])}) | "
                f"{r['preemptions']:,} ({r['preemptions_per_job_max']}) | {r['restart_startup_gpu_hours']:.1f} | "
                f"{_hours(tier2_p95(r))} | {_hours(r['p95_wait_s'])} | {r['wall_s']:.0f} s |"
            )
        judged = list(block["goals"])
        if judged:
            out += [
                "",
                "| goal (breaches: not forced) | " + " | ".join(f"`{n}`" for n in judged) + " |",
                "|---|" + "---|" * len(judged),
            ]
            for goal in block["goals"][judged[0]]:
                marks = [block["goals"][n][goal] or "–" for n in judged]
                out.append(f"| {goal.replace('_', ' ')} | " + " | ".join(marks) + " |")
        for name, r in rows.items():
            causes = r["preemptions_by_cause"]
            if not causes:
                continue
            out += ["", f"`{name}` preemptions by cause:", ""]
            out += [
                "| preemptor → victim tier | kind | after a reservation | preemptions | lost GPU-h |",
                "|---|---|---|---|---|",
            ]
            for c in causes[:8]:
                out.append(
                    f"| {c['preemptor_tier']} → {c['victim_tier']} | {c['kind']} | "
                    f"{'yes' if c['after_reservation'] else 'no'} | {c['preemptions']:,} | {c['lost_gpu_hours']:.1f} |"
                )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", action="append", help="TRACE@GPUS under --traces (repeatable)")
    parser.add_argument("--policies", default=",".join(ORDER), help="preset names or policy files, comma-separated")
    parser.add_argument("--limit", type=int, default=None, help="the first N jobs of each trace")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="JSON", help="print these runs' JSON results as one, run nothing"
    )
    args = parser.parse_args(argv)
    if args.merge:
        try:
            result = merged([json.loads(f.read_text()) for f in args.merge])
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--merge: {e}")
        print(markdown(result) if args.markdown else json.dumps(result, indent=2))
        return result
    settings = args.setting or list(DEFAULT_SETTINGS)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p.partition("[")[0] not in PRESETS and not Path(p).is_file():
            parser.error(f"--policies: {p!r} is neither a preset ({', '.join(PRESETS)}) nor a policy file")
    if not args.traces.is_dir():
        parser.error(f"--traces: {str(args.traces)!r} is not a directory (the shared traces)")
    for s in settings:
        try:
            trace, _ = parse_setting(s)
        except ValueError as e:
            parser.error(str(e))
        if not (args.traces / trace).is_file():
            parser.error(f"--setting: {trace!r} is not a file under {str(args.traces)!r}")
    if args.limit is not None and args.limit <= 0:
        parser.error(f"--limit: {args.limit} must be a positive number of jobs")
    if not 1 <= args.workers <= 64:
        parser.error(f"--workers: {args.workers} must be between 1 and 64")
    result = measure(args.traces, settings, policies, args.limit, args.workers)
    print(markdown(result) if args.markdown else json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
