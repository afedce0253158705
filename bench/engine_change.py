"""What a change costs the engine: a warm pass of configurations (a), (b) and (d) of
bench/engine.py on this work tree and on a base revision, side by side, in CPU time.

    python bench/engine_change.py [--base REV] [--only a,b,d] [--rounds K] [--quick]

The base (default: `HEAD` when the work tree has uncommitted changes to `warden/`, else
`HEAD~1`, the change's parent) is checked out in a temporary git worktree. Each configuration
runs in a fresh process per tree, the trees alternating for `--rounds` rounds (default 2), so
that a machine busy with other work slows both alike; CPU time (`time.process_time`), not wall
time, is what is compared, so a busy machine does not hide a slower pass either. Every figure
is the best of its rounds (the run least disturbed).

One JSON object on stdout: per configuration the base's and this tree's pass in ms, their
ratio, and the admissions and preemptions of each (the same snapshot: a difference is a change
of plan); `slower` names each configuration this tree runs more than `--threshold` (default
10 %) slower. Exit status 0; 2 for bad arguments or a base that cannot be checked out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, time, types
import warden.bench.engine as bench
# CPU time, not wall time, in whatever the tree's benchmark times with perf_counter.
bench.time = types.SimpleNamespace(perf_counter=time.process_time)
name, nodes, gpus, pending, running, repeat, churn = sys.argv[1:8]
nodes, gpus, pending, running, repeat, churn = map(int, (nodes, gpus, pending, running, repeat, churn))
if name == "d":
    out = bench.run_churn_bench(nodes, gpus, pending, running, churn=churn, repeat=repeat)
    print(json.dumps({"ms": min(out["warm_pass_ms_all"]), "full_ms": out["full_pass_ms_median"],
                      "admissions": out["admissions_last"], "preemptions": None, "exact": out["exact"]}))
else:
    out = bench.run_engine_bench(nodes, gpus, pending, running, repeat=repeat)
    print(json.dumps({"ms": out["pass_ms_min"], "admissions": out["admissions"],
                      "preemptions": out["preemptions"]}))
"""

CONFIGS: dict[str, tuple[int, int, int, int, int, int]] = {
    # nodes, GPUs per node, pending, running, timed passes, churn (d only)
    "a": (1000, 8, 10_000, 5_000, 5, 0),
    "b": (4000, 8, 100_000, 20_000, 3, 0),
    "d": (1000, 8, 50_000, 5_000, 5, 30),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine_change", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=None, help="the revision to compare with (default: see above)")
    parser.add_argument("--only", default="a,b,d", help="comma-separated subset of a,b,d (default: all)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree and configuration (default 2)")
    parser.add_argument("--threshold", type=float, default=0.10, help="slower by more than this is named")
    parser.add_argument("--quick", action="store_true", help="every size 10x smaller, for a smoke run")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(CONFIGS))
    if unknown or not only:
        parser.error(f"--only: {args.only!r} names no configuration of a, b, d: {', '.join(unknown)}")
    if not 1 <= args.rounds <= 20:
        parser.error(f"--rounds: {args.rounds} is out of range; allowed: 1 to 20")
    if not 0 <= args.threshold <= 10:
        parser.error(f"--threshold: {args.threshold} is out of range; allowed: 0 to 10")
    base = args.base or default_base()
    with tempfile.TemporaryDirectory(prefix="warden-engine-base-") as tmp:
        tree = Path(tmp) / "base"
        added = subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--quiet", "--detach", str(tree), base],
            capture_output=True,
            text=True,
        )
        if added.returncode != 0:
            print(f"engine_change: --base: cannot check out {base!r}: {added.stderr.strip()}", file=sys.stderr)
            return 2
        try:
            result = compare(tree, only, args.rounds, args.quick)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
    slower = [n for n, r in result.items() if r["ratio"] is not None and r["ratio"] > 1 + args.threshold]
    revision = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", base], capture_output=True, text=True)
    print(json.dumps({"base": revision.stdout.strip() or base, "configurations": result, "slower": slower}))
    for name in slower:
        r = result[name]
        print(f"engine_change: ({name}) is slower: {r['base_ms']} ms before, {r['now_ms']} ms now", file=sys.stderr)
    return 0


def default_base() -> str:
    """The change's parent: HEAD when the engine has uncommitted changes, else HEAD~1."""
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "warden"], capture_output=True, text=True
    ).stdout.strip()
    return "HEAD" if dirty else "HEAD~1"


def compare(base_tree: Path, only: list[str], rounds: int, quick: bool) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for name in only:
        nodes, gpus, pending, running, repeat, churn = CONFIGS[name]
        if quick:
            nodes, pending, running = max(1, nodes // 10), max(1, pending // 10), max(1, running // 10)
        argv = [name, *map(str, (nodes, gpus, pending, running, repeat, churn))]
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "now": []}
        for _ in range(rounds):
            for which, tree in (("base", base_tree), ("now", REPO)):
                runs[which].append(probe(tree, argv))
        best = {which: min(rs, key=lambda r: r["ms"]) for which, rs in runs.items()}
        b, n = best["base"], best["now"]
        result[name] = {
            "base_ms": round(b["ms"], 1),
            "now_ms": round(n["ms"], 1),
            "ratio": round(n["ms"] / b["ms"], 3) if b["ms"] > 0 else None,
            "base_admissions": b["admissions"],
            "now_admissions": n["admissions"],
            "base_preemptions": b["preemptions"],
            "now_preemptions": n["preemptions"],
            **({"full_base_ms": b["full_ms"], "full_now_ms": n["full_ms"]} if "full_ms" in b else {}),
        }
        print(f"engine_change: ({name}) {result[name]}", file=sys.stderr, flush=True)
    return result


def probe(tree: Path, argv: list[str]) -> dict[str, Any]:
    """One configuration's figures from a fresh process importing `tree`'s warden."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise SystemExit(f"engine_change: the probe failed in {tree}: {done.stderr.strip()[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


if __name__ == "__main__":
    sys.exit(main())
