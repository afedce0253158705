"""The simulator benchmarks of the issue: one JSON object on stdout.

    python bench/sim.py [--repeat K] [--only rfold,pollux] [--traces DIR]

rfold:  `rfold_philly_trace.csv` (111,539 jobs with a duration) under `fifo_backfill` on
        `--gpus 2816`; target ≥ 10,000 jobs per second of wall time.
pollux: `pollux_philly.csv` (82,247 jobs) under the governed policy with the Philly VCs as
        queues and their quotas from `philly_vc_nodes.csv`, on `--gpus 2816`; target < 2 min.

Wall time covers the simulation alone (the trace is loaded once, before); `load_s` is
reported beside it. With `--repeat K` each figure is the median of K runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.sim.experiment import prepare, run_policy

DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
CASES = {
    "rfold": ("philly/rfold_philly_trace.csv", "fifo_backfill"),
    "pollux": ("philly/pollux_philly.csv", "governed"),
}


def measure(traces: Path, name: str, repeat: int) -> dict[str, Any]:
    file, policy = CASES[name]
    t = time.perf_counter()
    setup = prepare(traces / file, gpus=2816)
    load_s = time.perf_counter() - t
    walls, summary = [], {}
    for _ in range(repeat):
        outcome = run_policy(setup, policy)
        summary = outcome.summary
        walls.append(outcome.run.wall_s)
    wall = statistics.median(walls)
    jobs = summary["jobs"]
    return {
        "trace": file,
        "policy": policy,
        "gpus": 2816,
        "jobs": jobs,
        "repeat": repeat,
        "wall_s_median": round(wall, 3),
        "wall_s_all": [round(w, 3) for w in walls],
        "jobs_per_s": round(jobs / wall, 1),
        "load_s": round(load_s, 3),
        "passes": summary["passes"],
        "avg_jct_s": summary["avg_jct_s"],
        "avg_wait_s": summary["avg_wait_s"],
        "utilization": summary["utilization"],
        "preemptions": summary["preemptions"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", default="rfold,pollux")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(CASES)
    if unknown:
        parser.error(f"--only: unknown case(s) {sorted(unknown)}; choose from {', '.join(CASES)}")
    if not args.traces.is_dir():
        parser.error(f"--traces: {str(args.traces)!r} is not a directory (the shared traces)")
    result = {name: measure(args.traces, name, args.repeat) for name in only}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
