"""scripts/slurm-cluster: a real multi-node Slurm cluster on this machine, brought up, given a
GPU job pinned to a node, and torn down with nothing of it left running.

Without Slurm's binaries (and no way to install them) the tests skip, unless
WARDEN_REQUIRE_SLURM=1 (CI sets it), where they fail: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-cluster"
REQUIRE_ENV = "WARDEN_REQUIRE_SLURM"
NEEDED = ("slurmctld", "slurmd", "sinfo", "sbatch", "srun", "squeue", "scancel")


def cluster_dir() -> Path:
    """A directory for a cluster that the munge account and job accounts can pass through
    (pytest's own base is 0700), with a short path (Slurm's socket paths must fit)."""
    root = Path(tempfile.mkdtemp(prefix="wslurm-"))
    os.chmod(root, 0o755)
    return root


def slurm_available() -> bool:
    """Slurm is installed, or the script can install it (root with apt-get)."""
    return all(shutil.which(b) for b in NEEDED) or (os.geteuid() == 0 and shutil.which("apt-get") is not None)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    if not slurm_available():
        hint = "Slurm is not installed (apt-get install slurm-wlm) and cannot be installed here"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {hint}", pytrace=False)
        pytest.skip(f"{hint} (set {REQUIRE_ENV}=1 to make its absence an error)")
    root = cluster_dir()
    up = run("up", "--nodes", "2", "--gpus-per-node", "4", "--dir", str(root), timeout=300)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"export SLURM_CONF={root / 'slurm.conf'}"
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf"), "CLUSTER_DIR": str(root)}
    try:
        yield env
    finally:
        run("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0, explain: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; {explain()}")


def state(env: dict[str, str], out: Path) -> str:
    """What the cluster says of its jobs, and the job's output so far."""
    jobs = subprocess.run(["scontrol", "show", "job"], env=env, capture_output=True, text=True).stdout
    return f"jobs: {jobs}\noutput: {out.read_text() if out.exists() else '(none)'}"


def test_up_leaves_every_node_idle_with_its_gpus(cluster: dict[str, str]) -> None:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t %G"], env=cluster, capture_output=True, text=True, check=True
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [["n0", "idle", "gpu:4"], ["n1", "idle", "gpu:4"]]


def test_a_job_pinned_to_a_node_gets_the_gpus_it_asked_for_in_every_step(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "batch $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\n'
        "srun bash -c 'echo \"step $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"'\n"
    )
    out = tmp_path / "job.out"
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodelist=n1", "--gres=gpu:2", f"--output={out}", str(script)],
        env=cluster,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]

    def finished() -> bool:
        q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%t"], env=cluster, capture_output=True, text=True)
        return q.stdout.strip() == "" and out.exists()

    wait_for(f"job {job_id} to finish", finished, explain=lambda: state(cluster, out))
    lines = out.read_text().split("\n")
    assert "batch n1 0,1" in lines and "step n1 0,1" in lines, out.read_text()


def test_down_cancels_running_jobs_and_leaves_no_process_of_the_cluster(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    root = cluster_dir()  # a second cluster beside the module's
    assert run("up", "--nodes", "1", "--gpus-per-node", "1", "--dir", str(root), timeout=300).returncode == 0
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    marker = tmp_path / "started"
    job = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path / 'out'}", "--wrap", f"touch {marker}; srun sleep 6011"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stderr
    wait_for("the job to start", marker.exists, explain=lambda: state(env, tmp_path / "out"))
    daemons = [int(p) for p in (root / "run" / "pids").read_text().split()]
    down = run("down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    left = [p for p in daemons if running(p)] + [p for p in all_pids() if mentions(p, root)]
    assert left == [], f"processes of the cluster still running: {left}"
    # A command of this test alone: other tests run `sleep 600` of their own meanwhile.
    assert not any("sleep 6011" in cmdline(p) for p in all_pids() if running(p))
    shutil.rmtree(root, ignore_errors=True)


def test_bad_arguments_name_the_option_and_the_value() -> None:
    bad = run("up", "--nodes", "0")
    assert bad.returncode == 2 and "--nodes: 0 is out of range" in bad.stderr
    bad = run("up", "--gpus-per-node", "65")
    assert bad.returncode == 2 and "--gpus-per-node: 65 is out of range" in bad.stderr
    deep = "/tmp/" + "d" * 80
    bad = run("up", "--dir", deep)
    assert bad.returncode == 2 and f"--dir: {deep} is too long for Slurm's sockets" in bad.stderr
    assert not Path(deep).exists()


def all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited daemon whose parent has not reaped it is gone)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def mentions(pid: int, root: Path) -> bool:
    """A live process with a working directory or open file in the cluster's directory."""
    if not running(pid) or pid == os.getpid():
        return False
    try:
        links = [os.readlink(f"/proc/{pid}/cwd")] + [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return False
    return any(link == str(root) or link.startswith(f"{root}/") for link in links)
