"""scripts/ray-cluster: a real multi-node Ray cluster on this machine, brought up with the
nodes, GPUs, CPUs and blocks asked, a node declared dead soon after its raylet is killed, and
torn down with nothing of it left running — a job that an actor started in a session of its
own included.

The session's `ray_cluster` (tests/raycluster.py) is checked as it is; the tests that break a
node or tear a cluster down bring up a small one of their own. Without Ray they skip, unless
WARDEN_REQUIRE_RAY=1 (CI sets it), where they fail: CI must never pass by skipping.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raycluster import SCRIPT, RayCluster, bring_up, parse_up, ray_env, require_ray, run_script, tagged

DEATH_BOUND_S = 5.0
"""How soon a node whose raylet is SIGKILLed must be dead in `ray.nodes()` (about 2 s with the
head's health checks of scripts/ray-cluster; about 14 s with Ray's defaults)."""

WATCH = """
import json, sys, time
import ray

address, name = sys.argv[1], sys.argv[2]
ray.init(address=address, log_to_driver=False, logging_level="ERROR")
alive = lambda: {n["NodeName"]: n["Alive"] for n in ray.nodes()}
print("nodes", json.dumps(alive()), flush=True)
killed_at = float(sys.stdin.readline())  # time.monotonic() of the test: one clock for the machine
deadline = killed_at + 30
while alive().get(name) and time.monotonic() < deadline:
    time.sleep(0.05)
print("dead", json.dumps({"after_s": time.monotonic() - killed_at, "alive": alive()}), flush=True)
ray.shutdown()
"""
"""A driver that reports the nodes alive, waits for the test to kill a raylet, then measures
how long the node takes to be dead in `ray.nodes()`."""

LAUNCH = """
import json, os, subprocess, sys
import ray

ray.init(address=sys.argv[1], namespace="warden-test", log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=0, num_gpus=1)
class Launcher:
    def launch(self, supervisor_code):
        supervisor = subprocess.Popen(
            [sys.executable, "-c", supervisor_code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
            text=True,
        )
        return {"actor": os.getpid(), "supervisor": supervisor.pid, "job": int(supervisor.stdout.readline())}

launcher = Launcher.options(name="launcher", lifetime="detached").remote()
print("launched", json.dumps(ray.get(launcher.launch.remote(sys.argv[2]), timeout=60)))
ray.shutdown()
"""
"""A detached actor that starts a supervisor in a session of its own, with an environment of
its own, that starts the job in yet another session: none of them carries the cluster's marker
or an open file of Ray's, so only their descendance from the cluster's processes tells them."""

SUPERVISOR = (
    "import subprocess; job = subprocess.Popen(['sleep', '600'], start_new_session=True);"
    " print(job.pid, flush=True); job.wait()"
)


@pytest.fixture
def own_cluster() -> Iterator[RayCluster]:
    """A cluster of this test alone, free to break: 2 worker nodes of 1 GPU and 1 CPU."""
    yield from bring_up("--nodes", "2", "--gpus-per-node", "1", "--cpus-per-node", "1")


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # on the xdist worker that holds the session's cluster for the Ray tests
def test_the_session_cluster_has_the_nodes_gpus_cpus_and_blocks_asked(ray_cluster: RayCluster) -> None:
    assert re.fullmatch(r"127\.0\.0\.2:\d+", ray_cluster.address), ray_cluster.address
    assert ray_cluster.env["WARDEN_RAY_ADDRESS"] == ray_cluster.address
    assert sorted(ray_cluster.workers) == ["w1", "w2", "w3"]
    recorded = json.loads((ray_cluster.root / "cluster.json").read_text())
    assert recorded["address"] == ray_cluster.address
    assert Path(recorded["temp_dir"]).parent == Path("/tmp") and Path(recorded["temp_dir"]).is_dir()
    # Ray's token authentication: the token in Ray's temp dir, both this account's alone.
    assert ray_cluster.token_path == Path(recorded["token_path"]) == Path(recorded["temp_dir"]) / "auth_token"
    assert Path(recorded["temp_dir"]).stat().st_mode & 0o777 == 0o700
    token = ray_cluster.token_path.stat()
    assert token.st_mode & 0o777 == 0o600 and token.st_uid == os.geteuid()
    assert re.fullmatch(r"[0-9a-f]{64}", ray_cluster.token_path.read_text())
    for node in recorded["nodes"]:  # the token is never on a command line
        assert ray_cluster.token_path.read_text() not in " ".join(node["ray_start"])
    nodes = {n["name"]: n for n in recorded["nodes"]}
    assert sorted(nodes) == ["head", "w1", "w2", "w3"]
    for name, pid in ray_cluster.workers.items():
        assert running(pid) and comm(pid) == "raylet", f"{name}: pid {pid} is not a live raylet"
        assert f"--node-name={name}" in cmdline(pid).split()
        assert nodes[name]["raylet_pid"] == pid
        assert os.getpgid(pid) == nodes[name]["pgid"], f"{name}'s raylet is not in its node's process group"
    seen = {n["NodeName"]: n for n in ray_cluster.nodes() if n["Alive"]}
    assert sorted(seen) == ["head", "w1", "w2", "w3"]
    assert (seen["head"]["Resources"].get("CPU", 0), seen["head"]["Resources"].get("GPU", 0)) == (0, 0)
    for name, block in (("w1", "b1"), ("w2", "b1"), ("w3", "b2")):
        resources = seen[name]["Resources"]
        assert (resources["GPU"], resources["CPU"]) == (4, 8), f"{name}: {resources}"
        assert seen[name]["Labels"].get("warden.io/block") == block, f"{name}: {seen[name]['Labels']}"
        assert seen[name]["NodeManagerAddress"] == "127.0.0.2"


@pytest.mark.slow
def test_a_node_whose_raylet_is_killed_is_dead_within_seconds_and_the_others_live_on(
    own_cluster: RayCluster,
) -> None:
    watch = subprocess.Popen(
        [sys.executable, "-c", WATCH, own_cluster.address, "w1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=own_cluster.env,
    )
    try:
        before = json.loads(read_line(watch, "nodes", timeout=60))
        assert before == {"head": True, "w1": True, "w2": True}
        own_cluster.kill_worker("w1")
        out, err = watch.communicate(input=f"{time.monotonic()}\n", timeout=60)
    finally:
        watch.kill()
        watch.wait()
    assert watch.returncode == 0, err
    after = json.loads(tagged(out, "dead"))
    assert after["alive"] == {"head": True, "w1": False, "w2": True}, after
    assert after["after_s"] < DEATH_BOUND_S, f"w1 took {after['after_s']:.2f} s to be declared dead"
    assert running(own_cluster.workers["w2"])


@pytest.mark.slow
def test_up_then_down_stops_every_process_of_the_cluster_and_again(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    require_ray()
    root = tmp_path_factory.mktemp("down")
    up = run_script(
        "up", "--nodes", "1", "--gpus-per-node", "1", "--cpus-per-node", "1", "--dir", str(root), timeout=180
    )
    assert up.returncode == 0, up.stderr
    address, workers, token_path = parse_up(up.stdout)
    assert re.fullmatch(
        r"export WARDEN_RAY_ADDRESS=127\.0\.0\.2:\d+\n"
        r"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/tmp/wray-\w+/auth_token\nworker w1 \d+\n",
        up.stdout,
    ), up.stdout
    assert running(workers["w1"]) and comm(workers["w1"]) == "raylet"
    recorded = json.loads((root / "cluster.json").read_text())
    try:
        launched = subprocess.run(
            [sys.executable, "-c", LAUNCH, address, SUPERVISOR],
            capture_output=True,
            text=True,
            env=ray_env(address, token_path),
            timeout=120,
        )
        assert launched.returncode == 0, launched.stderr
        pids: dict[str, int] = json.loads(tagged(launched.stdout, "launched"))
        assert all(running(p) for p in pids.values()), pids
        assert os.getpgid(pids["job"]) == pids["job"] != os.getpgid(pids["supervisor"])
    finally:
        down = run_script("down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    left = {name: pid for name, pid in {**workers, **pids}.items() if running(pid)}
    left |= {f"group {n['pgid']}": p for n in recorded["nodes"] for p in all_pids() if in_group(p, n["pgid"])}
    left |= {f"marked {p}": p for p in all_pids() if marked(p, root)}
    assert left == {}, f"processes of the cluster still running: {left}"
    assert not Path(recorded["temp_dir"]).exists()
    again = run_script("down", "--dir", str(root))
    assert again.returncode == 0 and "no cluster in" in again.stderr, again.stderr


def test_bad_arguments_name_the_option_and_the_value() -> None:
    for argv, message in (
        (("up", "--nodes", "0"), "--nodes: 0 is out of range"),
        (("up", "--gpus-per-node", "-1"), "--gpus-per-node: -1 is out of range"),
        (("up", "--cpus-per-node", "-1"), "--cpus-per-node: -1 is out of range"),
        (("up", "--nodes-per-block", "-2"), "--nodes-per-block: -2 is out of range"),
        (("up", "--nodes", "three"), "argument --nodes: invalid int value: 'three'"),
        (("sideways",), "invalid choice: 'sideways'"),
    ):
        bad = run_script(*argv)
        assert bad.returncode == 2 and message in bad.stderr, (argv, bad.stderr)


def test_down_where_there_is_no_cluster_says_so(tmp_path: Path) -> None:
    down = run_script("down", "--dir", str(tmp_path))
    assert down.returncode == 0 and f"no cluster in {tmp_path}" in down.stderr


def test_up_without_ray_says_how_to_install_it(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no ray here')\n")
    root = tmp_path / "cluster"
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    up = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve().parents[2] / "scripts" / "ray-cluster"),
            "up",
            "--dir",
            str(root),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert up.returncode == 1 and "pip install 'gpu-warden[ray]'" in up.stderr, up.stderr
    assert not root.exists()


def test_up_that_fails_shows_the_logs_and_stops_what_it_started(tmp_path: Path) -> None:
    """A `ray start` that leaves a process behind and fails: `up` reports it with the log's
    tail and stops that process (a stand-in for Ray, so that this runs without it)."""
    scripts = tmp_path / "site" / "ray" / "scripts"
    scripts.mkdir(parents=True)
    (scripts.parent / "__init__.py").write_text("")
    (scripts / "__init__.py").write_text("")
    (scripts / "scripts.py").write_text(
        "import os, subprocess, sys\n"
        "def main():\n"
        "    daemon = subprocess.Popen(['sleep', '600'])\n"
        "    with open(os.environ['FAKE_PIDS'], 'a') as f:\n"
        "        f.write(f'{daemon.pid}\\n')\n"
        "    print('the fake ray start fails', file=sys.stderr)\n"
        "    return 1\n"
    )
    pids, root = tmp_path / "pids", tmp_path / "cluster"
    env = {**os.environ, "PYTHONPATH": str(scripts.parent.parent), "FAKE_PIDS": str(pids)}
    up = subprocess.run(
        [sys.executable, str(SCRIPT), "up", "--nodes", "1", "--dir", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert up.returncode == 1, up.stderr
    assert "did not come up: `ray start` of head exited with 1" in up.stderr
    assert "the fake ray start fails" in up.stderr
    started = [int(p) for p in pids.read_text().split()]
    assert started and not any(running(p) for p in started), "up left the process it started running"
    assert not (root / "cluster.json").exists()


def read_line(proc: subprocess.Popen[str], tag: str, timeout: float) -> str:
    """What follows `tag` on the first line of the driver's that starts with it (Ray's drivers
    print messages of their own on stdout too)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no line {tag!r} from the driver within {timeout:g} s")
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the driver ended without a line {tag!r}")
        if line.startswith(f"{tag} "):
            return line[len(tag) + 1 :]


def all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited process whose parent has not reaped it is gone)."""
    fields = stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def in_group(pid: int, pgid: int) -> bool:
    fields = stat(pid)
    return running(pid) and len(fields) > 2 and int(fields[2]) == pgid


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def marked(pid: int, root: Path) -> bool:
    """A live process with the cluster's marker in its environment."""
    if not running(pid) or pid == os.getpid():
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"WARDEN_RAY_CLUSTER={root.resolve()}".encode() in env
