"""How long the `warden` command takes to answer: one JSON object on stdout.

    python bench/cli.py [--runs N] [--jobs J]

Each figure is the median wall time over N runs of the command in a process of its own
(`python -m warden.cli.main`, as the installed `warden` script runs it), from its start to its
exit, with an 80-column terminal (`COLUMNS=80`):

- `queue_s`: `warden queue` against a real server (SQLite, 4 fake GPUs) where J jobs exist,
  one running and the others waiting, printed as the table. Target ≤ 0.3 s.
- `help_s`: `warden --help`. Target ≤ 0.3 s.
- `startup_s`: `warden queue` against a port nothing listens on: the start-up alone (imports,
  the app, the refused connection).
- `python_s`: `python -c pass`, the interpreter's own start, which every figure includes.

`*_all` lists every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))

from serverproc import ADMIN, kill_jobs_of, started, submit, wait_for

POLICY = """\
queues:
  name: cluster
  children:
    - {name: team}
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting `argv` to its exit."""
    t0 = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False, env=env)
    return time.perf_counter() - t0


def remove(directory: Path) -> None:
    """Remove the server's directory once the killed jobs' supervisors have written their last
    records into it (they outlive the job's process group by a moment)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            shutil.rmtree(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def median_of(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, list[float]]:
    times = [timed(argv, env) for _ in range(runs)]
    return round(statistics.median(times), 3), [round(t, 3) for t in times]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args(argv)
    warden = [sys.executable, "-m", "warden.cli.main"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    base.update({"COLUMNS": "80", "WARDEN_TOKEN": ADMIN})
    out: dict[str, Any] = {"runs": args.runs, "jobs": args.jobs}
    d = tempfile.mkdtemp()
    try:
        Path(d).chmod(0o755)  # jobs run as other uids when the server runs as root
        server = started(Path(d), POLICY, gpus=4)
        try:
            with server.client() as c:
                first = submit(c, queue="team", tier=3, gpus=4, command=["sleep", "600"], workdir=d)
                wait_for(lambda: c.get(f"/v1/jobs/{first}").json()["state"] == "RUNNING")
                for _ in range(args.jobs - 1):
                    submit(c, queue="team", tier=3, gpus=1, command=["true"], workdir=d)
            here = {**base, "WARDEN_URL": server.url, "WARDEN_CA": str(server.ca)}
            out["queue_s"], out["queue_s_all"] = median_of([*warden, "queue"], here, args.runs)
        finally:
            server.stop()
            kill_jobs_of(server.state_dir)
    finally:
        remove(Path(d))
    nowhere = {**base, "WARDEN_URL": "http://127.0.0.1:9"}
    out["help_s"], out["help_s_all"] = median_of([*warden, "--help"], nowhere, args.runs)
    out["startup_s"], out["startup_s_all"] = median_of([*warden, "queue"], nowhere, args.runs)
    out["python_s"], out["python_s_all"] = median_of([sys.executable, "-c", "pass"], base, args.runs)
    return out


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
