"""Preemptions per admitted job for every preset on one Philly setting: one JSON object on stdout.

    python bench/sim_presets.py [--gpus 750] [--limit N] [--policies a,b] [--traces DIR]
                                [--trace philly/pollux_philly.csv] [--markdown]

The trace is `--trace`, under the shared traces folder: by default `pollux_philly.csv` (82,247
jobs; `--limit` takes the first N by submit time) with the Philly VCs as queues and their quotas
from `philly_vc_nodes.csv`, on one pool of `--gpus` GPUs: the same run as
`warden sim compare --trace …/pollux_philly.csv --gpus N --policies …`.
Per policy: total preemptions, their mean, p95 and max per admitted job, the worst job, how many
jobs exceed the default limit of 10, and the wall time of the simulation, and how much of it the engine's passes took. `--markdown` prints
the table for BENCHMARKS.md instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.sim.experiment import prepare, run_policy
from warden.sim.presets import PRESETS

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
ORDER = ("fifo_strict", "fifo_backfill", "slurm", "kueue", "kueue_fair", "kai", "k8s", "governed")


DEFAULT_TRACE = "philly/pollux_philly.csv"


def measure(
    traces: Path, gpus: int, limit: int | None, policies: list[str], trace: str = DEFAULT_TRACE
) -> dict[str, Any]:
    setup = prepare(traces / trace, gpus=gpus, limit=limit)
    rows = {}
    for name in policies:
        s = run_policy(setup, name).summary
        spread = s["preemptions_per_job"]
        rows[name] = {
            "preemptions": s["preemptions"],
            "per_job_mean": spread["mean"],
            "per_job_p95": spread["p95"],
            "per_job_max": spread["max"],
            "worst_job": spread["worst_job"],
            "over_limit": spread["over_limit"],
            "avg_wait_s": s["avg_wait_s"],
            "utilization": s["utilization"],
            "wall_s": s["wall_s"],
            "engine_s": s["engine_s"],
        }
    return {
        "trace": trace,
        "gpus": gpus,
        "jobs": len(setup.trace.jobs),
        "limit": limit,
        "policies": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| policy | preemptions | per admitted job: mean | p95 | max (job) | jobs over 10 | wall | of which engine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["policies"].items():
        worst = f"{r['per_job_max']} ({r['worst_job']})" if r["worst_job"] else str(r["per_job_max"])
        lines.append(
            f"| `{name}` | {r['preemptions']:,} | {r['per_job_mean']:.3f} | {r['per_job_p95']:g} | "
            f"{worst} | {r['over_limit']} | {r['wall_s']:.0f} s | {r['engine_s']:.0f} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=750)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--policies", default=",".join(ORDER))
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="a trace file under --traces")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(PRESETS))
    if unknown:
        parser.error(f"--policies: unknown preset(s) {unknown}; choose from {', '.join(PRESETS)}")
    if not args.traces.is_dir():
        parser.error(f"--traces: {str(args.traces)!r} is not a directory (the shared traces)")
    if not (args.traces / args.trace).is_file():
        parser.error(f"--trace: {args.trace!r} is not a file under {str(args.traces)!r}")
    result = measure(args.traces, args.gpus, args.limit, policies, args.trace)
    print(markdown(result) if args.markdown else json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
