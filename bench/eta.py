"""How far expected starts are from the real ones, on a contended replay: one JSON object on stdout.

    python bench/eta.py [--gpus 250] [--limit 4000] [--every 3600] [--max-passes 2000]
                        [--traces DIR] [--trace philly/pollux_philly.csv] [--markdown]

The governed policy replays the first `--limit` jobs of the trace (by submit time) on one pool of
`--gpus` GPUs, few enough that queues stay deep. Every `--every` simulated seconds, at the
pass then, the forecast the server runs (`warden.engine.forecast.expected_starts`, at most
`--max-passes` passes) estimates the start of every job that pass leaves waiting.
When the replay is over, each estimate is compared with when that job really started next.
The simulator gives the engine exact runtime estimates (the trace's durations), so the error
is what the forecast cannot know: jobs submitted after it, and preemptions they cause.

Reported: how many estimates were given and how many jobs got none (and why), then over the
estimates whose job started before the replay ended, the median and p90 of |actual − estimated|
and the median signed error (positive: later than estimated), with the median wait still ahead
at the time of the estimate for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.engine.forecast import expected_starts
from warden.engine.model import Snapshot
from warden.engine.plan import Plan
from warden.sim.experiment import prepare
from warden.sim.presets import resolve_policy
from warden.sim.simulator import Simulation

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT_TRACE = "philly/pollux_philly.csv"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(traces: Path, trace: str, gpus: int, limit: int, every: float, max_passes: int) -> dict[str, Any]:
    setup = prepare(traces / trace, gpus=gpus, limit=limit)
    sp = resolve_policy("governed", setup.nominal, setup.gpus)
    total = sum(setup.nominal.values())
    share = {q: n / total for q, n in setup.nominal.items()} if total else {}
    estimates: list[tuple[str, float, float]] = []
    """(engine job id, estimated at, estimate)."""
    missing: Counter[str] = Counter()
    forecast_s: list[float] = []
    next_at = [-float("inf")]

    def on_pass(snapshot: Snapshot, plan: Plan, now: float) -> None:
        if now < next_at[0]:
            return
        next_at[0] = now + every
        t0 = time.perf_counter()
        found = expected_starts(snapshot, now, max_passes=max_passes)
        forecast_s.append(time.perf_counter() - t0)
        admitted = {a.job_id for a in plan.admissions}
        for job_id, e in found.starts.items():
            if job_id in admitted:
                continue  # this very pass starts it: no forecast to judge
            if e.at is None:
                missing[e.why.split(" (")[0]] += 1
            else:
                estimates.append((job_id, now, e.at))

    sim = Simulation(setup.trace, setup.nodes, sp, share, on_pass=on_pass)
    run = sim.run()
    by_seq = {j.seq: j.job_id for j in setup.trace.jobs}
    starts: dict[str, list[float]] = {}
    for j in run.jobs:
        starts[j.job_id] = sorted(a.admitted_at for a in j.attempts)
    errors: list[float] = []
    ahead: list[float] = []
    never = 0
    for job_id, at, est in estimates:
        admitted = [t for t in starts.get(by_seq[int(job_id)], []) if t >= at]
        if not admitted:
            never += 1
            continue
        errors.append(admitted[0] - est)
        ahead.append(admitted[0] - at)
    absolute = [abs(e) for e in errors]
    return {
        "trace": trace,
        "gpus": gpus,
        "jobs": len(setup.trace.jobs),
        "every_s": every,
        "max_passes": max_passes,
        "forecasts": len(forecast_s),
        "forecast_s_median": round(statistics.median(forecast_s), 3) if forecast_s else None,
        "estimates": len(estimates),
        "compared": len(errors),
        "not_started_by_the_end": never,
        "no_estimate": dict(missing),
        "abs_error_s_median": round(statistics.median(absolute), 1) if absolute else None,
        "abs_error_s_p90": round(percentile(absolute, 0.9), 1) if absolute else None,
        "signed_error_s_median": round(statistics.median(errors), 1) if errors else None,
        "exact_share": round(sum(1 for e in absolute if e < 1.0) / len(absolute), 3) if absolute else None,
        "wait_ahead_s_median": round(statistics.median(ahead), 1) if ahead else None,
    }


def markdown(r: dict[str, Any]) -> str:
    def h(s: float | None) -> str:
        return "–" if s is None else f"{s / 3600:.2f} h"

    missing = sum(r["no_estimate"].values())
    return "\n".join(
        [
            "| jobs, GPUs | forecasts (median time) | estimates compared | none given | |error| median | p90 | "
            "signed median | exact (< 1 s) | wait ahead, median |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {r['jobs']:,}, {r['gpus']} | {r['forecasts']} ({r['forecast_s_median']} s) | {r['compared']:,} | "
            f"{missing:,} | {h(r['abs_error_s_median'])} | {h(r['abs_error_s_p90'])} | "
            f"{h(r['signed_error_s_median'])} | {r['exact_share']:.0%} | {h(r['wait_ahead_s_median'])} |",
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--gpus", type=int, default=250)
    parser.add_argument("--limit", type=int, default=4000)
    parser.add_argument("--every", type=float, default=3600.0)
    parser.add_argument("--max-passes", type=int, default=2000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if not (args.traces / args.trace).exists():
        parser.exit(2, f"{args.traces / args.trace}: no such trace (--traces DIR)\n")
    result = measure(args.traces, args.trace, args.gpus, args.limit, args.every, args.max_passes)
    print(markdown(result) if args.markdown else json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
