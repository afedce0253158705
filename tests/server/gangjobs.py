"""A trainer job and the helpers the end-to-end tests of the cluster executors (Slurm, Ray)
share: run it, find its processes, time their deaths, read its events."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import submit, wait_for

# Prints the contract's environment; on SIGTERM records the time, saves a checkpoint with the
# SDK and keeps running (so SIGKILL must come); a later attempt reports where it resumed.
TRAINER = """\
import json, os, sys, time
from pathlib import Path
from warden.workload import CheckpointStore, install
out = Path(sys.argv[1])
rank = os.environ.get("RANK", "0")
guard = install()
store = CheckpointStore()
latest = store.load_latest()
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
         "WARDEN_NODE", "WARDEN_JOB_ID", "WARDEN_ATTEMPT")
attempt = os.environ["WARDEN_ATTEMPT"]
(out / f"env-{attempt}-{rank}.json").write_text(json.dumps({k: os.environ.get(k) for k in names}))
(out / f"resumed-{attempt}-{rank}").write_text("none" if latest is None else str(latest[0]))
(out / f".pid-{attempt}-{rank}").write_text(str(os.getpid()))
(out / f".pid-{attempt}-{rank}").rename(out / f"pid-{attempt}-{rank}")  # whole when it appears
print(f"rank {rank} of attempt {attempt} runs", flush=True)
step = 0 if latest is None else latest[0]
saved = False
while True:
    time.sleep(0.02)
    step += 1
    if guard.should_stop() and not saved:
        with open(out / f"term-{attempt}-{rank}", "a") as f:
            f.write(f"{guard.signalled_at:.6f}\\n")
        if rank == "0":
            store.save(step, {"step": step})
        saved = True
"""


@pytest.fixture
def trainer(tmp_path: Path) -> Path:
    path = tmp_path / "trainer.py"
    path.write_text(TRAINER)
    return path


POLITE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "open(sys.argv[1], 'w').write('up')\n"
    "while True:\n    time.sleep(0.05)\n"
)
"""A job that says it is up (in the file named by its argument) and exits 0 at SIGTERM."""


def job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    return c.get(f"/v1/jobs/{job_id}").json()


def run_trainer(c: httpx.Client, trainer: Path, out: Path, **body: Any) -> str:
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)  # the job's account writes there
    return submit(c, command=[sys.executable, str(trainer), str(out)], workdir=str(out), **body)


def running_pids(out: Path, attempt: int, ranks: int) -> list[int]:
    wait_for(lambda: all((out / f"pid-{attempt}-{r}").exists() for r in range(ranks)), 30, f"{ranks} replicas")
    return [int((out / f"pid-{attempt}-{r}").read_text()) for r in range(ranks)]


def deaths(pids: list[int], timeout: float = 30.0) -> list[float]:
    """When each process is gone (pidfd: exact, no polling)."""
    fds = [os.pidfd_open(p) for p in pids]
    gone: dict[int, float] = {}
    end = time.monotonic() + timeout
    while len(gone) < len(fds) and time.monotonic() < end:
        ready, _, _ = select.select([f for f in fds if f not in gone], [], [], max(0.0, end - time.monotonic()))
        for fd in ready:
            gone[fd] = time.time()
    assert len(gone) == len(fds), "a replica outlived its SIGKILL"
    return [gone[f] for f in fds]


def preempting(c: httpx.Client, ids: list[str]) -> list[str]:
    """Which of these jobs ever went PREEMPTING."""
    return [i for i in ids if any(e["to"] == "PREEMPTING" for e in job(c, i)["events"])]


def deaths_later(pids: list[int]) -> Callable[[], list[float]]:
    """`deaths`, watched from now on by a thread: the times are exact whatever the test does
    until it calls the function returned, which waits for them."""
    found: list[list[float]] = []
    watcher = threading.Thread(target=lambda: found.append(deaths(pids)), daemon=True)
    watcher.start()

    def wait() -> list[float]:
        watcher.join()
        assert found, "a replica outlived its SIGKILL"
        return found[0]

    return wait
