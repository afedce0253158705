"""A real Ray cluster on this machine for the tests that need one (scripts/ray-cluster): a head
and 3 worker nodes of 4 fake GPUs and 8 CPUs, every 2 workers in one topology block (w1 and w2
in block b1, w3 in b2), brought up once per test session (the `ray_cluster` fixture).

A test that breaks a node (`RayCluster.kill_worker`) must not do it to the session's cluster,
which later tests share: it brings up a cluster of its own, in a function-scoped fixture,

    @pytest.fixture
    def own_cluster() -> Iterator[RayCluster]:
        yield from bring_up("--nodes", "2", "--gpus-per-node", "2")

(options given to `bring_up` override the defaults). Each cluster costs about 10 s and about
110 MB per worker node on this two-core machine, so keep them small and few.

Without Ray those tests skip, unless WARDEN_REQUIRE_RAY=1 (CI sets it), where they fail: CI
must never pass by skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "ray-cluster"
REQUIRE_ENV = "WARDEN_REQUIRE_RAY"
NODES, GPUS, CPUS, PER_BLOCK = 3, 4, 8, 2

NODES_SCRIPT = """
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
try:
    print("nodes", json.dumps(ray.nodes()))
finally:
    ray.shutdown()
"""


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def require_ray() -> None:
    """Skip (or, under WARDEN_REQUIRE_RAY=1, fail) where Ray is not installed."""
    if ray_available():
        return
    hint = "Ray is not installed (pip install 'gpu-warden[ray]')"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {hint}", pytrace=False)
    pytest.skip(f"{hint} (set {REQUIRE_ENV}=1 to make its absence an error)")


def run_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run scripts/ray-cluster. Its nodes, and so their workers (warden's launchers and shims),
    import warden from this checkout first, whatever else is installed: the code under test."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def auth_env(token_path: Path | None) -> dict[str, str]:
    """Ray's variables that present the cluster's token (`disabled`: a cluster without one)."""
    if token_path is None:
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}


def ray_env(address: str, token_path: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    return {**env, "WARDEN_RAY_ADDRESS": address, "RAY_USAGE_STATS_ENABLED": "0", **auth_env(token_path)}


def ray_nodes(address: str, token_path: Path | None = None) -> list[dict[str, Any]]:
    """`ray.nodes()` of the cluster at `address`, asked by a driver in a process of its own
    (never this one: no Ray state stays behind in the test process)."""
    done = subprocess.run(
        [sys.executable, "-c", NODES_SCRIPT, address],
        capture_output=True,
        text=True,
        env=ray_env(address, token_path),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    nodes: list[dict[str, Any]] = json.loads(tagged(done.stdout, "nodes"))
    return nodes


def tagged(stdout: str, tag: str) -> str:
    """What follows `tag` on the last line of a driver's output that starts with it: Ray's
    drivers print messages of their own on stdout (a node's death, for one)."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"{tag} ")]
    assert lines, f"no line {tag!r} in: {stdout}"
    return lines[-1][len(tag) + 1 :]


@dataclass(frozen=True)
class RayCluster:
    root: Path
    address: str
    workers: dict[str, int]
    """Node name (w1, w2, ...) -> the pid of its raylet."""
    token_path: Path | None = None
    """The file of the cluster's token (Ray's RAY_AUTH_TOKEN_PATH); None: no authentication."""

    @property
    def env(self) -> dict[str, str]:
        """This environment, pointed at the cluster, with its token."""
        return ray_env(self.address, self.token_path)

    @property
    def temp_dir(self) -> Path:
        """Ray's temp dir of the cluster (cluster.json)."""
        return Path(json.loads((self.root / "cluster.json").read_text())["temp_dir"])

    def nodes(self) -> list[dict[str, Any]]:
        return ray_nodes(self.address, self.token_path)

    def connect(self) -> None:
        """Point this process's Ray at the cluster's token (and drop what Ray cached of another
        cluster's): for the tests that drive the cluster from the test process itself."""
        import ray
        from ray._raylet import AuthenticationTokenLoader, Config

        if ray.is_initialized() and all(os.environ.get(k) == v for k, v in auth_env(self.token_path).items()):
            return  # already with this cluster's token (the session's cluster: the tests' usual case)
        ray.shutdown()
        for k in AUTH_VARS:
            os.environ.pop(k, None)
        os.environ.update(auth_env(self.token_path))
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()

    def kill_worker(self, name: str) -> None:
        """SIGKILL the raylet of node `name`: the node dies as when its machine fails (its
        agents follow; what its workers started may linger). Never on the session's cluster."""
        os.kill(self.workers[name], signal.SIGKILL)


def parse_up(stdout: str) -> tuple[str, dict[str, int], Path | None]:
    """The address, the workers' raylet pids and the token's file that `up` printed."""
    lines = stdout.strip().splitlines()
    assert lines and lines[0].startswith("export WARDEN_RAY_ADDRESS="), stdout
    token_path = None
    if len(lines) > 1 and lines[1].startswith("export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="):
        token_path = Path(lines.pop(1).split("RAY_AUTH_TOKEN_PATH=", 1)[1])
    workers = {}
    for line in lines[1:]:
        word, name, pid = line.split()
        assert word == "worker", stdout
        workers[name] = int(pid)
    return lines[0].split("=", 1)[1], workers, token_path


def bring_up(*extra: str) -> Iterator[RayCluster]:
    """The cluster, torn down (`down`) when the generator closes; `extra` options go to `up`
    after the defaults, so that they override them."""
    require_ray()
    root = Path(tempfile.mkdtemp(prefix="warden-ray-"))
    up = run_script(
        "up",
        "--nodes",
        str(NODES),
        "--gpus-per-node",
        str(GPUS),
        "--cpus-per-node",
        str(CPUS),
        "--nodes-per-block",
        str(PER_BLOCK),
        *extra,
        "--dir",
        str(root),
        timeout=180,
    )
    try:
        assert up.returncode == 0, up.stderr
        address, workers, token_path = parse_up(up.stdout)
        yield RayCluster(root, address, workers, token_path)
    finally:
        run_script("down", "--dir", str(root))
        shutil.rmtree(root, ignore_errors=True)
