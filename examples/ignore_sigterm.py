"""A job that ignores SIGTERM: what warden does with a job that does not honour the contract.

    python examples/ignore_sigterm.py --step-seconds 0.1

It reports startup and progress like a good job (and, with ``--checkpoint-every N``, saves
periodically), but when SIGTERM comes it only says so and carries on. warden waits out the
grace period, sends SIGKILL, and counts everything since the last checkpoint (or since startup)
as lost work: GPU-seconds of progress thrown away, on the job's record and in
``warden_lost_work_gpu_seconds_total``. Having never reported a save on SIGTERM, the job also
stays an expensive victim in the engine's eyes (DESIGN §4.4).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.workload import CheckpointStore, default_reporter


def ignore(signum: int, frame: FrameType | None) -> None:
    print("got SIGTERM; ignoring it (warden will SIGKILL at the end of the grace period)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="periodic checkpoint interval in steps (0: never)"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, ignore)

    store = CheckpointStore()
    reporter = default_reporter()
    latest = store.load_latest() if args.checkpoint_every else None
    step = 0 if latest is None else latest[0]
    reporter.startup_finished()
    while step < args.steps:
        time.sleep(args.step_seconds)
        step += 1
        reporter.progress(step)
        print(f"step {step}", flush=True)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            store.save(step, {"step": step})
    return 0


if __name__ == "__main__":
    sys.exit(main())
