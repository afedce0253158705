"""The engine benchmark of the issue: three configurations, one JSON object on stdout.

    python bench/engine.py [--quick] [--repeat K] [--only a,b,c] [--profile]

(a) 1,000 nodes × 8 GPUs, 10,000 pending, 5,000 running;
(b) 4,000 nodes × 8 GPUs, 100,000 pending, 20,000 running;
(c) linear scaling: 1,000 × 8 with 5,000 running, at 1,000 and at 10,000 pending;
    `scaling_ratio` = time(10×) / time(1×) (10 would be linear in the queue's depth);
(d) a deep queue: 1,000 × 8, 50,000 pending that cannot all fit, 5,000 running; pass after
    pass 30 jobs complete, 30 arrive and the last plan's admissions start, and the engine is
    told only those (`warm_pass_ms_median`, at most 100 changed jobs a pass); a full pass over
    the final snapshot (`full_pass_ms_median`) and a cold one for comparison.

`--quick` shrinks every size 10× for a smoke run. `--profile` also writes a cProfile of one
pass of (a) and (b) (top 15 by cumulative time) to stderr, so stdout stays one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script from a checkout: make the repository's `warden` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.bench.engine import run_churn_bench, run_engine_bench
from warden.engine.synthetic import synthetic_snapshot

CONFIGS: dict[str, dict[str, int]] = {
    "a": {"nodes": 1000, "gpus_per_node": 8, "pending": 10_000, "running": 5_000, "repeat": 5},
    "b": {"nodes": 4000, "gpus_per_node": 8, "pending": 100_000, "running": 20_000, "repeat": 3},
    "c_1x": {"nodes": 1000, "gpus_per_node": 8, "pending": 1_000, "running": 5_000, "repeat": 5},
    "c_10x": {"nodes": 1000, "gpus_per_node": 8, "pending": 10_000, "running": 5_000, "repeat": 5},
    "d": {"nodes": 1000, "gpus_per_node": 8, "pending": 50_000, "running": 5_000, "repeat": 5, "churn": 30},
}


def _shrink(cfg: dict[str, int], factor: int) -> dict[str, int]:
    out = dict(cfg)
    for key in ("nodes", "pending", "running"):
        out[key] = max(1, cfg[key] // factor)
    return out


def _profile(cfg: dict[str, int], seed: int) -> str:
    """cProfile of one pass (after a warm-up), top 15 by cumulative time."""
    from warden.engine.scheduler import schedule

    snapshot, now = synthetic_snapshot(cfg["nodes"], cfg["gpus_per_node"], cfg["pending"], cfg["running"], seed)
    schedule(snapshot, now)
    prof = cProfile.Profile()
    prof.enable()
    schedule(snapshot, now)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(15)
    return out.getvalue()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shrink every configuration 10x")
    parser.add_argument("--repeat", type=int, default=None, help="timed passes per configuration (default 5, 3 for b)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    parser.add_argument("--profile", action="store_true", help="cProfile (a) and (b) to stderr")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {"a", "b", "c", "d"}
    if unknown:
        parser.error(f"--only: unknown configuration(s) {sorted(unknown)}; choose from a, b, c, d")

    configs = {k: (_shrink(v, 10) if args.quick else dict(v)) for k, v in CONFIGS.items()}
    result: dict[str, Any] = {"quick": args.quick, "seed": args.seed}

    def measure(name: str) -> dict[str, Any]:
        cfg = configs[name]
        repeat = args.repeat if args.repeat is not None else cfg["repeat"]
        print(f"bench: {name} {cfg} repeat={repeat}", file=sys.stderr, flush=True)
        return run_engine_bench(
            cfg["nodes"], cfg["gpus_per_node"], cfg["pending"], cfg["running"], seed=args.seed, repeat=repeat
        )

    for name in ("a", "b"):
        if name in only:
            result[name] = measure(name)
            if args.profile:
                print(f"--- profile of {name} ---\n{_profile(configs[name], args.seed)}", file=sys.stderr, flush=True)
    if "c" in only:
        one, ten = measure("c_1x"), measure("c_10x")
        result["c"] = {
            "pending_1x": one["pending"],
            "pending_10x": ten["pending"],
            "pass_ms_1x": one["pass_ms_median"],
            "pass_ms_10x": ten["pass_ms_median"],
            "scaling_ratio": round(ten["pass_ms_median"] / one["pass_ms_median"], 3)
            if one["pass_ms_median"] > 0
            else None,
            "runs": {"1x": one, "10x": ten},
        }
    if "d" in only:
        cfg = configs["d"]
        repeat = args.repeat if args.repeat is not None else cfg["repeat"]
        print(f"bench: d {cfg} repeat={repeat}", file=sys.stderr, flush=True)
        result["d"] = run_churn_bench(
            cfg["nodes"],
            cfg["gpus_per_node"],
            cfg["pending"],
            cfg["running"],
            churn=cfg["churn"],
            seed=args.seed,
            repeat=repeat,
        )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
