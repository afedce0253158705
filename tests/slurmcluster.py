"""A real Slurm cluster on this machine for the tests that need one (scripts/slurm-cluster):
4 nodes of 8 fake GPUs, every 2 nodes under one leaf switch, brought up once per test session,
closed as warden requires: munge, warden's job_submit.lua, PrivateData=jobs.

Without Slurm's binaries (and no way to install them) those tests skip, unless
WARDEN_REQUIRE_SLURM=1 (CI sets it), where they fail: CI must never pass by skipping.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster"
REQUIRE_ENV = "WARDEN_REQUIRE_SLURM"
NEEDED = ("slurmctld", "slurmd", "sinfo", "sbatch", "srun", "squeue", "scancel", "scontrol")
NODES, GPUS, PER_BLOCK = 4, 8, 2


def slurm_available() -> bool:
    """Slurm is installed, or the script can install it (root with apt-get)."""
    return all(shutil.which(b) for b in NEEDED) or (os.geteuid() == 0 and shutil.which("apt-get") is not None)


def require_slurm() -> None:
    """Skip (or, under WARDEN_REQUIRE_SLURM=1, fail) where Slurm cannot be had."""
    if slurm_available():
        return
    hint = "Slurm is not installed (apt-get install slurm-wlm) and cannot be installed here"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {hint}", pytrace=False)
    pytest.skip(f"{hint} (set {REQUIRE_ENV}=1 to make its absence an error)")


def run_script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Cluster:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {done.stderr}")
        return done.stdout

    def jobs(self) -> dict[str, tuple[str, str, str]]:
        """Every job the cluster knows: id -> (name, state, node list)."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%A|%j|%T|%N")
        return {f[0]: (f[1], f[2], f[3]) for f in (line.split("|") for line in out.splitlines())}

    def set_node(self, node: str, state: str, reason: str = "warden test") -> None:
        extra = () if state == "resume" else (f"reason={reason}",)
        self.run("scontrol", "update", f"nodename={node}", f"state={state}", *extra)

    def cancel_all(self) -> None:
        ids = [i for i, (_, state, _) in self.jobs().items() if state in ("PENDING", "RUNNING", "COMPLETING")]
        if ids:
            self.run("scancel", *ids, check=False)


def bring_up(*extra: str) -> Iterator[Cluster]:
    """The cluster, torn down when the generator closes; `extra` options go to `up`."""
    require_slurm()
    root = Path(tempfile.mkdtemp(prefix="wslurm-"))  # short: Slurm's socket paths must fit
    # The tests' servers run as root jobs as `nobody` (tests/server/serverproc.py): its group may submit too.
    groups = {grp.getgrgid(os.getgid()).gr_name, grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name}
    up = run_script(
        "up",
        "--allow-groups",
        ",".join(sorted(groups)),
        "--nodes",
        str(NODES),
        "--gpus-per-node",
        str(GPUS),
        "--nodes-per-block",
        str(PER_BLOCK),
        *extra,
        "--dir",
        str(root),
        timeout=300,
    )
    assert up.returncode == 0, up.stderr
    try:
        yield Cluster(root)
    finally:
        run_script("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)
