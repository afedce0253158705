"""A plain-Python training loop (no PyTorch) that honours warden's workload contract.

    python examples/train_plain.py --steps 200 --step-seconds 0.05

- resumes from the newest complete checkpoint in ``$WARDEN_CHECKPOINT_DIR`` (else
  ``./checkpoints``), a JSON object ``{"step": N, "value": x}``;
- reports its startup time, its progress and every checkpoint to warden (no-ops outside it);
- on SIGTERM finishes the current step, saves it, reports, and exits 0, so warden requeues it
  and the next attempt loses no step;
- also saves every ``--checkpoint-every`` steps, and at the end.

The "model" is a running value updated deterministically from the step, so a resumed run ends
with exactly the value of a run that was never interrupted (printed at the end).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script from a checkout: make the repository's `warden` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.workload import CheckpointStore, default_reporter, install


def train_step(value: float, step: int) -> float:
    """One step of "training": deterministic in (value, step), like a seeded optimizer step."""
    return value + math.sin(step) / (step + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="total steps to train")
    parser.add_argument(
        "--step-seconds", type=float, default=0.05, help="time one step takes (the work is simulated by sleeping)"
    )
    parser.add_argument(
        "--startup-seconds",
        type=float,
        default=0.0,
        help="time loading takes before the first step, as a model and its data take (simulated by sleeping)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=100,
        help="periodic checkpoint interval in steps (0: only on SIGTERM/end)",
    )
    args = parser.parse_args(argv)

    guard = install()  # before anything slow: a SIGTERM during startup counts too
    store = CheckpointStore()
    reporter = default_reporter()

    latest = store.load_latest()
    step, value = (0, 0.0) if latest is None else (latest[0], float(latest[1]["value"]))
    if latest is not None:
        print(f"resumed from step {step}", flush=True)
    time.sleep(args.startup_seconds)  # loading the model and the data
    reporter.startup_finished()

    while step < args.steps:
        time.sleep(args.step_seconds)  # the work of one step
        value = train_step(value, step)
        step += 1
        reporter.progress(step)
        print(f"step {step} value {value:.6f}", flush=True)
        if guard.should_stop():
            path = store.save(step, {"step": step, "value": value})
            print(
                f"SIGTERM: saved step {step} to {path.name} ({guard.remaining():.1f}s of grace left); exiting",
                flush=True,
            )
            guard.exit()  # exit 0 after SIGTERM: warden requeues the job
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            store.save(step, {"step": step, "value": value})

    if latest is None or latest[0] != step:  # nothing new to save when resumed at the end
        store.save(step, {"step": step, "value": value})
    print(f"finished at step {step} value {value:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
