"""What runs inside a Slurm job that warden launched: the batch supervisor and the task launcher.

The `slurm` executor submits each attempt as a batch job whose script is
`python -m warden.executors.slurm_launch batch ATTEMPT_DIR`. That process, the *batch
supervisor*, runs one `srun` step with one task per replica, each task being
`python -m warden.executors.slurm_launch task ATTEMPT_DIR`, and exits with srun's status.

The supervisor survives SIGTERM (it records when it came, in `batch.signals`): were it to exit,
Slurm would end the job and kill every step after its own `KillWait`, cutting the replicas'
grace short. srun is never signalled by warden either: an srun that gets SIGTERM aborts its
step at once.

ATTEMPT_DIR is the server's (root's when it runs jobs as their users' accounts, which the job
may pass through but not write): it holds `launch.json` (written by the executor, 0600, the
job's to read) and the server's `control.json`. Everything the job writes goes to the job-owned
subdirectory `ATTEMPT_DIR/job/`: the batch log, `batch.signals`, `master.json` and the ranks'
logs and records, none of which the server trusts more than Slurm's own word.

A task finds its replica in `launch.json` by the node it runs
on and its index among the tasks there, takes its part of the GPUs Slurm bound on that node
(`bound_gpus`), and runs the job command under the same supervision as the local executor's shim (`warden.executors.shim.supervise`): a process group of its own,
orphans kept as its children, `rank-N.status.json` once it runs and `rank-N.exit.json` once
its last process is gone. A SIGTERM to the step reaches only the task (Slurm's proctrack/cgroup
signals a step's tasks, not their children): the supervisor passes it on to the job's group.
For a gang whose master port is not fixed, rank 0 picks a free port on its node and writes it
to `master.json`; the other ranks wait for it before they start.

Only the standard library and the shim are imported: a node needs nothing else of warden's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from warden.executors.records import CONTROL_FILE, write_json_atomic
from warden.executors.shim import read_json, supervise

LAUNCH_FILE = "launch.json"
JOB_DIR = "job"
"""The attempt's subdirectory the job's own account writes (everything but the server's files)."""
MASTER_FILE = "master.json"
BATCH_SIGNALS = "batch.signals"
RENDEZVOUS_TIMEOUT_S = 120.0
"""How long a rank waits for rank 0 to publish the master port before it gives up."""


def replica_for(launch: dict[str, Any], node: str, local_id: int) -> dict[str, Any]:
    """The replica the `local_id`-th task on `node` runs: replicas are handed to a node's tasks
    in rank order, as Slurm numbers its tasks on a node from 0."""
    mine = [r for r in launch["replicas"] if r["node"] == node]
    if not 0 <= local_id < len(mine):
        raise LookupError(f"no replica {local_id} on node {node!r} in this attempt ({len(mine)} placed there)")
    return dict(mine[local_id])


def bound_gpus(
    launch: dict[str, Any], node: str, local_id: int, bound: str, visible: str | None
) -> tuple[tuple[int, ...], str]:
    """The GPUs Slurm bound the `local_id`-th task on `node` to, and its CUDA_VISIBLE_DEVICES.

    Slurm allocates a count per node, never the indices warden planned, and binds the step to
    the ones it chose (`SLURM_STEP_GPUS`, the node's indices, sorted). The node's replicas take
    them in rank order, as many each as warden placed, and the server reads the same split
    back from Slurm's `IDX` (`SlurmExecutor.devices`). Slurm's own CUDA_VISIBLE_DEVICES names
    the same GPUs in the same order, as the step's processes must name them (relative to the
    step where Slurm confines its devices), so the task takes its part of that; without one,
    the node's indices. LookupError where Slurm bound fewer GPUs than placed."""
    mine = [r for r in launch["replicas"] if r["node"] == node]
    first = sum(len(r["gpus"]) for r in mine[:local_id])
    want = len(mine[local_id]["gpus"])
    indices = sorted(int(g) for g in bound.split(",") if g.strip().isdigit())
    if len(indices) < first + want:
        raise LookupError(
            f"Slurm bound GPUs {bound or 'none'} on node {node}, fewer than the {first + want} warden placed there"
        )
    gpus = tuple(indices[first : first + want])
    names = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if len(names) == len(indices):
        return gpus, ",".join(names[first : first + want])
    return gpus, ",".join(map(str, gpus))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _master_port(attempt_dir: Path, replica: dict[str, Any]) -> int:
    """Rank 0 publishes a port free on its node; every other rank waits for it."""
    path = attempt_dir / JOB_DIR / MASTER_FILE
    if replica["rank"] == 0:
        port = _free_port()
        write_json_atomic(path, {"port": port})
        return port
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while time.monotonic() < deadline:
        record = read_json(path)
        if record is not None:
            return int(record["port"])
        time.sleep(0.02)
    raise TimeoutError(f"rank 0 did not publish its master port in {path} within {RENDEZVOUS_TIMEOUT_S:g}s")


def task(attempt_dir: Path) -> int:
    """Run this task's replica to its end under the shim's supervision."""
    launch = read_json(attempt_dir / LAUNCH_FILE)
    if launch is None:
        raise FileNotFoundError(f"{attempt_dir / LAUNCH_FILE} is missing")
    node = os.environ["SLURMD_NODENAME"]
    out = attempt_dir / JOB_DIR
    local_id = int(os.environ["SLURM_LOCALID"])
    replica = replica_for(launch, node, local_id)
    rank = replica["rank"]
    bound = os.environ.get("SLURM_STEP_GPUS", os.environ.get("SLURM_JOB_GPUS", ""))
    env = dict(replica["env"])
    try:
        gpus, visible = bound_gpus(launch, node, local_id, bound, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except LookupError as err:
        write_json_atomic(
            out / f"rank-{rank}.exit.json", {"exit_code": None, "ended_at": time.time(), "error": str(err)}
        )
        raise
    if replica["gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if launch["world_size"] > 1 and "MASTER_PORT" not in env:
        env["MASTER_PORT"] = str(_master_port(attempt_dir, replica))
    return supervise(
        {
            "argv": launch["argv"],
            "cwd": launch["cwd"],
            "env": env,
            "log": str(out / f"rank-{rank}.log"),
            "status": str(out / f"rank-{rank}.status.json"),
            "exit": str(out / f"rank-{rank}.exit.json"),
            "seen": str(out / f"rank-{rank}.seen.json"),
            "control": str(attempt_dir / CONTROL_FILE),
            "grace_s": launch.get("grace_s"),
            "time_limit_s": launch.get("time_limit_s"),
            "heartbeat_s": launch.get("heartbeat_s"),
            "forward_sigterm": True,  # Slurm's proctrack/cgroup signals this task, not the job below it
            "extra_status": {
                "node": node,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_gpus": bound,
                "gpus": list(gpus),
            },
        }
    )


def batch(attempt_dir: Path) -> int:
    """Run the attempt's one step and wait for it; SIGTERM is recorded, not obeyed."""
    signals = attempt_dir / JOB_DIR / BATCH_SIGNALS

    def record(signum: int, _frame: object) -> None:
        with open(signals, "a", encoding="utf-8") as out:
            out.write(f"{time.time():.6f} {signum}\n")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, record)
    argv = [
        "srun",
        "--kill-on-bad-exit=0",
        "--no-kill",  # a node that fails does not end the step: warden evicts the gang, with its grace
        "--input=none",
        "--export=ALL",  # the batch's environment (sbatch --export=NONE would otherwise reach srun)
        sys.executable,
        "-m",
        "warden.executors.slurm_launch",
        "task",
        str(attempt_dir),
    ]
    step = subprocess.Popen(argv, preexec_fn=_default_signals)
    while True:
        try:
            return step.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for old kernels
            continue


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("batch", "task"):
        print("usage: python -m warden.executors.slurm_launch {batch|task} ATTEMPT_DIR", file=sys.stderr)
        return 2
    where = Path(argv[1])
    try:
        return batch(where) if argv[0] == "batch" else task(where)
    except (OSError, LookupError, KeyError, ValueError, json.JSONDecodeError) as err:
        print(f"warden-slurm-{argv[0]}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
