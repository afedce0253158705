"""A trainer without warden's SDK that keeps the preemption contract, for the tests of lost
work and of the export: `python plaintrainer.py MARKS [STEPS]`.

A step every 50 ms, resumed from `state` in $WARDEN_CHECKPOINT_DIR; exit 0 after STEPS steps
in all (0 or none: never). On SIGTERM it finishes its step, waits while MARKS.hold exists and
MARKS.release does not (a test keeps it in its grace so), saves its step atomically (temp
file, fsync, rename, fsync of the directory) and exits 0. It appends its attempt number to
MARKS.started at each start, and its step to MARKS.sigterm at each SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve()
"""This file, for a job's command line: `[sys.executable, str(PATH), marks, steps]`."""


def attempts_started(marks: Path) -> int:
    """How many attempts of the trainer writing MARKS have started so far."""
    started = marks.with_suffix(".started")
    return len(started.read_text().split()) if started.exists() else 0


def main(marks: str, steps: int) -> int:
    directory = os.environ["WARDEN_CHECKPOINT_DIR"]
    path = os.path.join(directory, "state")
    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    step = int(Path(path).read_text()) if os.path.exists(path) else 0
    with open(marks + ".started", "a") as f:
        f.write(os.environ["WARDEN_ATTEMPT"] + "\n")
    while not stop and (steps == 0 or step < steps):
        time.sleep(0.05)
        step += 1
    if not stop:
        return 0
    with open(marks + ".sigterm", "a") as f:
        f.write(f"{step}\n")
    while os.path.exists(marks + ".hold") and not os.path.exists(marks + ".release"):
        time.sleep(0.02)
    with open(path + ".tmp", "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
