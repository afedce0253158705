"""The `ray` executor against a real Ray cluster (tests/raycluster.py: 3 worker nodes × 4 fake
GPUs), and its parsing of Ray's node table without one."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from raycluster import RayCluster, bring_up, tagged

from warden.engine.model import DEFAULT_FLAVOR, Node
from warden.executors.base import Exit, Handle, LaunchError, LaunchSpec, ReplicaHandle, ReplicaLaunch
from warden.executors.ray import (
    RayError,
    RayExecutor,
    _exit,
    _RankEnd,
    _Tracked,
    group_name,
    inventory_of,
    parse_nodes,
    probe,
)
from warden.executors.ray_launch import bound_gpus
from warden.executors.records import record_killed_at
from warden.executors.shim import TIME_LIMIT_SLACK_S

pytestmark = pytest.mark.xdist_group("ray")  # one xdist worker runs every Ray test: one cluster

# -- Ray's node table ------------------------------------------------------------------------


def entry(name: str, node_id: str, alive: bool = True, **resources: float) -> dict[str, Any]:
    return {
        "NodeName": name,
        "NodeID": node_id,
        "NodeManagerAddress": "10.0.0.1",
        "Alive": alive,
        "Resources": resources if alive else {},
        "Labels": {"ray.io/node-id": node_id},
        "DeathReasonMessage": "" if alive else "health check failed",
    }


def test_nodes_take_gpus_cpus_memory_flavor_and_block_and_leave_out_the_head() -> None:
    a100 = entry("g1", "aa", GPU=8, CPU=32, memory=64 * 2**30, **{"accelerator_type:A100": 1})
    a100["Labels"]["warden.io/block"] = "rack1"
    plain = entry("g2", "bb", GPU=4, CPU=16)
    head = entry("head", "cc", memory=2**30)  # neither GPUs nor CPUs: Ray's own services
    nodes = parse_nodes([plain, head, a100])
    assert [n.node for n in nodes] == [
        Node("g1", 8, cpu=32000, memory=65536, flavor="A100", block="rack1"),
        Node("g2", 4, cpu=16000, memory=0, flavor=DEFAULT_FLAVOR, block=None),
    ]
    assert [(n.node_id, n.addr, n.alive) for n in nodes] == [("aa", "10.0.0.1", True), ("bb", "10.0.0.1", True)]


def test_a_kill_the_shims_kept_before_the_adopter_is_the_attempts_kill(tmp_path: Path) -> None:
    """The deadline came while no server led: each replica's shim sent SIGKILL 0.2 s after it
    and recorded when; the adopter's own came later. The attempt was killed at the shims' time;
    a recorded time outside [deadline, now] is not believed."""
    deadline = time.time() - 5
    handle = Handle("1", 1, tuple(ReplicaHandle.in_dir(tmp_path, rank) for rank in range(3)), tmp_path / "c", ("g",))
    tracked = _Tracked(
        handle, ("a",) * 3, ("n",) * 3, None, [], 0.0, signalled_at=deadline - 3, kill_at=deadline,
        killed_at=deadline + 2,
    )  # fmt: skip
    ranks = [_RankEnd(-9, deadline + 0.25, None, k) for k in (deadline + 0.21, deadline + 0.2, None)]
    ended = _exit(tracked, ranks, None)
    assert ended.killed and ended.killed_at == deadline + 0.2 and ended.exit_codes == (-9, -9, -9)
    assert _exit(dataclasses.replace(tracked, killed_at=None), ranks, None).killed_at == deadline + 0.2
    assert not _exit(dataclasses.replace(tracked, killed_at=None), [_RankEnd(0, deadline, None)], None).killed
    record = {"exit_code": -9, "ended_at": deadline + 0.3, "killed_at": deadline - 1}  # before the deadline: forged
    assert record_killed_at(record, deadline, time.time()) is None
    assert record_killed_at({**record, "killed_at": deadline + 0.2}, deadline, time.time()) == deadline + 0.2


def test_a_replica_runs_on_the_gpu_ids_ray_gave_its_bundle_where_they_are_indices() -> None:
    assert bound_gpus(["3", "0"], "0,1") == (0, 3)
    assert bound_gpus(["0"], "0,1") is None  # not as many as placed: the plan stands
    assert bound_gpus(["GPU-6f1c"], "2") is None  # not indices
    assert bound_gpus([], "") is None and bound_gpus(["0"], "") is None  # a replica placed on no GPU


def test_a_dead_node_keeps_its_last_known_capacity_and_a_live_incarnation_wins() -> None:
    known = {"old": Node("g1", 8, cpu=1000)}
    dead = parse_nodes([entry("g1", "old", alive=False)], known)
    assert [(n.node, n.alive, n.reason) for n in dead] == [(Node("g1", 8, cpu=1000), False, "health check failed")]
    back = parse_nodes([entry("g1", "old", alive=False), entry("g1", "new", GPU=8, CPU=1)], known)
    assert [(n.node_id, n.alive) for n in back] == [("new", True)]


def test_two_live_nodes_with_one_name_are_told_apart_by_their_ids() -> None:
    nodes = parse_nodes([entry("10.0.0.1", "1234567890", GPU=1), entry("10.0.0.1", "abcdefabcd", GPU=1)])
    assert [n.node.name for n in nodes] == ["10.0.0.1-12345678", "10.0.0.1-abcdefab"]


def test_a_node_is_down_while_a_replica_is_pinned_to_it_dead_gone_or_restarted() -> None:
    known = {"d": Node("w2", 4), "g": Node("w3", 4)}
    nodes = parse_nodes(
        [
            entry("w1", "a", GPU=4),
            entry("w2", "d", alive=False),
            entry("w4", "new", GPU=4),
            entry("w5", "x", alive=False),  # dead, and no replica is pinned to it
        ],
        known,
    )
    held = {("w1", "a"), ("w2", "d"), ("w3", "g"), ("w4", "old")}
    inv = inventory_of(nodes, held, known)
    assert [n.name for n in inv.nodes] == ["w1", "w2", "w3", "w4"]
    assert inv.down == {
        "w2": "DEAD (Ray: health check failed)",
        "w3": "GONE (Ray no longer lists it)",
        "w4": "RESTARTED (its earlier Ray node died under a running attempt)",
    }
    assert [n.name for n in inv.usable] == ["w1"]
    assert inventory_of(nodes, set(), known).down == {}  # nothing pinned: the dead are just gone


@pytest.mark.parametrize(
    ("address", "message"),
    [("nowhere", "is not HOST:PORT"), ("host:port", "is not HOST:PORT"), ("127.0.0.2:0", "is not HOST:PORT")],
)
def test_an_address_that_is_not_host_port_is_refused_naming_it(address: str, message: str) -> None:
    with pytest.raises(RayError, match=message) as err:
        probe(address)
    assert repr(address) in str(err.value)


def test_connecting_leaves_this_process_signal_handlers_alone(ray_cluster: RayCluster) -> None:
    import ray

    ray_cluster.connect()
    ray.shutdown()  # connect afresh: ray.init installs its handlers only when it connects
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with RayExecutor(address=ray_cluster.address):
        assert {sig: signal.getsignal(sig) for sig in before} == before


def test_an_address_where_nothing_listens_is_refused_at_once() -> None:
    began = time.monotonic()
    with pytest.raises(RayError, match=re.escape("cannot connect to the Ray cluster at '127.0.0.2:1'")):
        RayExecutor(address="127.0.0.2:1")
    assert time.monotonic() - began < 10


# -- on a real cluster -----------------------------------------------------------------------

# A job's marks are written under a temporary name and renamed, so a test that polls for one
# never reads it half-written.
ENV_DUMP = (
    "import json, os, sys, time\n"
    "out = os.environ['WARDEN_LOG_FILE'] + '.env.json'\n"
    "open(out + '.tmp', 'w').write(json.dumps(dict(os.environ)))\n"
    "os.rename(out + '.tmp', out)\n"
    "time.sleep(float(sys.argv[1]))\n"
)
STUBBORN = (
    "import os, signal, sys, time\n"
    "def term(*_):\n"
    "    open(os.environ['WARDEN_LOG_FILE'] + '.term', 'w').write(repr(time.time()))\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "open(os.environ['WARDEN_LOG_FILE'] + '.up.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(os.environ['WARDEN_LOG_FILE'] + '.up.tmp', os.environ['WARDEN_LOG_FILE'] + '.up')\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def executor(ray_cluster: RayCluster) -> Iterator[RayExecutor]:
    ray_cluster.connect()
    ex = RayExecutor(address=ray_cluster.address, poll_s=0.1, heartbeat_s=0.5)
    try:
        yield ex
    finally:
        for job_id, attempt in ex.running():
            ex.kill(job_id, attempt)
        wait(lambda: ex.exits() is not None and not ex.running(), 30, "every attempt gone")
        ex.close()


def wait(predicate: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def spec(
    tmp_path: Path, job_id: str, placement: list[tuple[str, tuple[int, ...]]], command: str, *args: str
) -> LaunchSpec:
    replicas = tuple(ReplicaLaunch(rank, node, gpus, local_rank=rank) for rank, (node, gpus) in enumerate(placement))
    return LaunchSpec(
        job_id=job_id,
        attempt=1,
        command=(sys.executable, "-c", command, *args),
        replicas=replicas,
        grace_s=1.0,
        workdir=tmp_path,
        log_dir=tmp_path / job_id / "attempt-1",
        checkpoint_dir=tmp_path / job_id / "checkpoints",
        cpu=500,
    )


def exit_of(ex: RayExecutor, job_id: str, timeout: float = 30) -> Exit:
    found: list[Exit] = []

    def done() -> bool:
        found.extend(e for e in ex.exits() if e.job_id == job_id)
        return bool(found)

    wait(done, timeout, f"the exit of job {job_id}")
    return found[0]


def ray_groups() -> dict[str, str]:
    from ray.util.placement_group import placement_group_table

    return {v["name"]: v["state"] for v in placement_group_table().values() if v["name"].startswith("warden.")}


@pytest.mark.slow
def test_a_gang_runs_where_warden_placed_it_with_the_contract_environment_only(
    executor: RayExecutor, tmp_path: Path
) -> None:
    import ray

    ids = {n["NodeName"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    placement = [(node, (g,)) for node in ("w1", "w2", "w3") for g in (1, 3)]
    s = spec(tmp_path, "11", placement, ENV_DUMP, "60")
    handle = executor.start(s)
    assert handle.external == (group_name("11", 1), *(ids[node] for node, _ in placement))
    wait(lambda: ("11", 1) in executor.started(), 60, "every replica running")
    envs = [
        wait(lambda r=r: (p := Path(f"{r.log_path}.env.json")).exists() and json.loads(p.read_text()), 10, "env")
        for r in handle.replicas
    ]
    records = [json.loads(r.status_path.read_text()) for r in handle.replicas]
    assert [len(r["ray_gpus"]) for r in records] == [1] * 6
    # Ray chose each bundle's GPU: the job runs on it, and the executor reports it.
    assert [(e["WARDEN_NODE"], e["CUDA_VISIBLE_DEVICES"], e["RANK"]) for e in envs] == [
        (node, records[rank]["ray_gpus"][0], str(rank)) for rank, (node, _) in enumerate(placement)
    ]
    for node in ("w1", "w2", "w3"):
        assert len({e["CUDA_VISIBLE_DEVICES"] for e in envs if e["WARDEN_NODE"] == node}) == 2
    bound = tuple((int(r["ray_gpus"][0]),) for r in records)
    assert wait(lambda: executor.devices("11", 1) == bound, 10, "Ray's GPUs read back")
    assert {e["WORLD_SIZE"] for e in envs} == {"6"} and {e["MASTER_ADDR"] for e in envs} == {"127.0.0.2"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and envs[0]["MASTER_PORT"].isdigit()
    assert not [k for e in envs for k in e if k.startswith("RAY_")]  # nothing of Ray's reaches the job
    assert [r["ray_node_id"] for r in records] == [ids[node] for node, _ in placement]
    assert ray_groups()[group_name("11", 1)] == "CREATED"
    executor.terminate("11", 1, 1.0)
    ended = exit_of(executor, "11")
    assert ended.exit_codes == (-15,) * 6 and not ended.killed
    assert ended.ended_by is None  # warden ended it
    assert ray_groups()[group_name("11", 1)] == "REMOVED"
    wait(lambda: ray.available_resources().get("GPU") == 12, 10, "Ray's GPUs free again")


@pytest.mark.slow
def test_sigterm_reaches_every_rank_at_once_and_sigkill_comes_at_the_deadline(
    executor: RayExecutor, tmp_path: Path
) -> None:
    s = spec(tmp_path, "12", [("w1", (0,)), ("w1", (1,)), ("w2", (0,)), ("w3", (0,))], STUBBORN)
    handle = executor.start(s)
    wait(lambda: ("12", 1) in executor.started(), 60, "every replica running")
    wait(lambda: all(Path(f"{r.log_path}.up").exists() for r in handle.replicas), 10, "the jobs up")
    deadline = executor.terminate("12", 1, 1.5)
    assert executor.terminate("12", 1, 99.0) == deadline  # idempotent
    ended = exit_of(executor, "12")
    terms = [float(Path(f"{r.log_path}.term").read_text()) for r in handle.replicas]
    assert max(terms) - min(terms) < 0.1, terms
    assert ended.killed and ended.exit_codes == (-9,) * 4 and ended.ended_by is None
    assert ended.killed_at is not None and 0.0 <= ended.killed_at - deadline <= 0.5
    assert ended.signalled_at is not None and deadline - ended.signalled_at >= 1.5  # never before the grace
    control = json.loads((s.log_dir / "control.json").read_text())
    assert control["kill_at"] == deadline


def test_the_supervisor_keeps_the_time_limit_while_nothing_signals_the_attempt(
    executor: RayExecutor, tmp_path: Path
) -> None:
    """No server runs its passes here: the replica's supervisor sends SIGTERM at the time limit
    (plus its slack) and SIGKILL a grace later, and the attempt ends timed out, by warden."""
    s = dataclasses.replace(spec(tmp_path, "13", [("w1", (0,))], STUBBORN), time_limit_s=0.5)
    handle = executor.start(s)
    wait(lambda: Path(f"{handle.replicas[0].log_path}.up").exists(), 60, "the job up")
    pid = int(Path(f"{handle.replicas[0].log_path}.up").read_text())
    started = time.time()
    ended = exit_of(executor, "13")
    term = float(Path(f"{handle.replicas[0].log_path}.term").read_text())
    assert ended.timed_out_at is not None and ended.ended_by is None, ended
    assert ended.signalled_at == ended.timed_out_at and abs(term - ended.timed_out_at) < 0.5
    assert ended.exit_codes == (-9,) and ended.killed_at is not None  # it ignored SIGTERM
    assert ended.killed_at - ended.timed_out_at >= 1.0  # its grace, never less
    assert term - started < 0.5 + TIME_LIMIT_SLACK_S + 2.0
    assert not _alive(pid)


@pytest.mark.slow
def test_a_command_that_cannot_start_is_reported_with_its_exit_status(executor: RayExecutor, tmp_path: Path) -> None:
    s = spec(tmp_path, "13", [("w2", (0,))], "")
    s = LaunchSpec(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "command": ("/no/such/program",)})
    executor.start(s)
    ended = exit_of(executor, "13", 60)
    assert ended.exit_codes == (127,) and "cannot start" in (ended.error or "")


def test_a_placement_on_a_node_ray_does_not_have_is_refused(executor: RayExecutor, tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="node\\(s\\) w9 are not alive"):
        executor.start(spec(tmp_path, "14", [("w9", (0,))], STUBBORN))
    assert executor.running() == []


@pytest.mark.slow
def test_a_gang_ray_cannot_place_fails_after_the_start_timeout(ray_cluster: RayCluster, tmp_path: Path) -> None:
    ray_cluster.connect()
    with RayExecutor(address=ray_cluster.address, poll_s=0.1, start_timeout_s=2.0) as ex:
        s = spec(tmp_path, "15", [("w1", (0, 1, 2, 3, 4))], STUBBORN)  # five GPUs on a node of four
        ex.start(s)
        ended = exit_of(ex, "15")
        assert ended.exit_codes == (None,) and "not running after 2s" in (ended.error or "")
        assert "INFEASIBLE" in (ended.error or "") or "PENDING" in (ended.error or "")
        assert ray_groups()[group_name("15", 1)] == "REMOVED"


@pytest.mark.slow
def test_terminate_while_the_ranks_are_starting_leaves_nothing_running(executor: RayExecutor, tmp_path: Path) -> None:
    s = spec(tmp_path, "16", [("w1", (2,)), ("w3", (2,))], STUBBORN)
    handle = executor.start(s)
    deadline = executor.terminate("16", 1, 0.5)
    ended = exit_of(executor, "16", 60)
    assert ended.signalled_at is not None and ended.ended_at <= deadline + 5
    for r in handle.replicas:
        up = Path(f"{r.log_path}.up")
        if up.exists():  # it started after all: its SIGTERM came the moment it ran, SIGKILL after
            assert not _alive(int(up.read_text()))


@pytest.mark.slow
def test_a_second_executor_adopts_an_attempt_and_kills_it_on_the_recorded_deadline(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    ray_cluster.connect()
    first = RayExecutor(address=ray_cluster.address, poll_s=0.1)
    s = spec(tmp_path, "17", [("w2", (3,)), ("w3", (3,))], STUBBORN)
    handle = first.start(s)
    wait(lambda: ("17", 1) in first.started(), 60, "every replica running")
    wait(lambda: all(Path(f"{r.log_path}.up").exists() for r in handle.replicas), 10, "the jobs up")
    deadline = first.terminate("17", 1, 3.0)
    first.close()  # the server dies in the grace; its jobs do not
    pids = [int(Path(f"{r.log_path}.up").read_text()) for r in handle.replicas]
    assert all(_alive(p) for p in pids)
    with RayExecutor(address=ray_cluster.address, poll_s=0.1) as second:
        second.adopt(handle, kill_at=deadline)
        ended = exit_of(second, "17")
        assert ended.killed and ended.killed_at is not None and 0.0 <= ended.killed_at - deadline <= 0.5
        assert not any(_alive(p) for p in pids)


@pytest.mark.slow
def test_groups_no_attempt_owns_are_removed_and_their_jobs_die_with_their_launchers(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    ray_cluster.connect()
    first = RayExecutor(address=ray_cluster.address, poll_s=0.1)
    s = spec(tmp_path, "18", [("w1", (0,)), ("w2", (0,))], STUBBORN)
    handle = first.start(s)
    wait(lambda: ("18", 1) in first.started(), 60, "every replica running")
    wait(lambda: all(Path(f"{r.log_path}.up").exists() for r in handle.replicas), 10, "the jobs up")
    first.close()
    with RayExecutor(address=ray_cluster.address, poll_s=0.1) as second:
        assert second.recover("18", 1, s.log_dir, 2) == handle
        assert second.cancel_unowned([]) == [group_name("18", 1)]
        wait(lambda: all(r.exit_path.exists() for r in handle.replicas), 10, "the jobs killed")
        for r in handle.replicas:
            record = json.loads(r.exit_path.read_text())
            assert record["exit_code"] == -9 and "was gone" in record["error"]
        assert ray_groups()[group_name("18", 1)] == "REMOVED"
        assert second.recover("18", 1, s.log_dir, 2) is None


def _alive(pid: int) -> bool:
    from warden.executors.shim import process_alive

    return process_alive(pid)


# -- behind warden's back --------------------------------------------------------------------

DRIVER = """
import json, sys, time
import ray, warden
config = ray.job_config.JobConfig()
if sys.argv[2] == "warden-code":  # warden's launchers load by import, never from the GCS: so must a driver's handles
    config = ray.job_config.JobConfig(code_search_path=[warden.__path__[0].rsplit("/", 1)[0]])
ray.init(address=sys.argv[1], namespace="warden", log_to_driver=False, logging_level="ERROR", job_config=config)
sys.argv[1:3] = sys.argv[1:2]
"""


def driver(cluster: RayCluster, code: str, *args: str, warden_code: bool = False) -> str:
    """Run `code` in a driver of its own, as root with the cluster's token (anybody but warden);
    `warden_code`: one that loads classes by import (to take a handle of warden's launchers)."""
    mode = "warden-code" if warden_code else "own-code"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER + code, cluster.address, mode, *args],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def own_cluster() -> Iterator[RayCluster]:
    """A cluster of the test's own, free to break: 2 worker nodes of 2 GPUs."""
    import ray

    clusters = bring_up("--nodes", "2", "--gpus-per-node", "2", "--cpus-per-node", "2")
    cluster = next(clusters)
    try:
        cluster.connect()
        yield cluster
    finally:
        ray.shutdown()  # the next test connects afresh, to the session's cluster
        clusters.close()


@pytest.mark.slow
def test_a_single_node_gang_whose_node_dies_ended_by_the_node_not_by_warden(
    own_cluster: RayCluster, tmp_path: Path
) -> None:
    with RayExecutor(address=own_cluster.address, poll_s=0.1) as ex:
        s = spec(tmp_path, "21", [("w1", (0,)), ("w1", (1,))], STUBBORN)
        handle = ex.start(s)
        wait(lambda: ("21", 1) in ex.started(), 60, "every replica running")
        wait(lambda: all(Path(f"{r.log_path}.up").exists() for r in handle.replicas), 10, "the jobs up")
        own_cluster.kill_worker("w1")
        ended = exit_of(ex, "21", 60)
        assert ended.ended_by is not None and ended.ended_by.startswith("node w1 died (Ray: "), ended
        assert not ended.killed and ended.signalled_at is None


@pytest.mark.slow
def test_a_placement_group_removed_by_another_driver_is_ended_by_it(
    executor: RayExecutor, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    s = spec(tmp_path, "22", [("w2", (2,))], STUBBORN)
    handle = executor.start(s)
    wait(lambda: ("22", 1) in executor.started(), 60, "the replica running")
    wait(lambda: Path(f"{handle.replicas[0].log_path}.up").exists(), 10, "the job up")
    driver(
        ray_cluster,
        "from ray.util.placement_group import get_placement_group, remove_placement_group\n"
        "remove_placement_group(get_placement_group(sys.argv[2]))\n",
        group_name("22", 1),
    )
    ended = exit_of(executor, "22")
    assert ended.ended_by == f"placement group {group_name('22', 1)} removed outside warden", ended


@pytest.mark.slow
def test_a_launcher_killed_by_another_driver_is_ended_by_it(
    executor: RayExecutor, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    s = spec(tmp_path, "23", [("w3", (2,))], STUBBORN)
    handle = executor.start(s)
    wait(lambda: ("23", 1) in executor.started(), 60, "the replica running")
    wait(lambda: Path(f"{handle.replicas[0].log_path}.up").exists(), 10, "the job up")
    driver(
        ray_cluster,
        "ray.kill(ray.get_actor(sys.argv[2], namespace='warden'))\n",
        f"{group_name('23', 1)}.0",
        warden_code=True,
    )
    ended = exit_of(executor, "23")
    assert ended.ended_by is not None and "rank 0" in ended.ended_by and "outside warden" in ended.ended_by, ended


# Saves and exits 0 once its guard saw SIGTERM (warden's SDK): whose SIGTERM it was decides how it ends.
GUARDED = (
    "import os, time\n"
    "from warden.workload import install\n"
    "guard = install()\n"
    "mark = os.environ['WARDEN_LOG_FILE']\n"
    "open(mark + '.up.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(mark + '.up.tmp', mark + '.up')\n"
    "while not guard.should_stop():\n"
    "    time.sleep(0.01)\n"
    "open(mark + '.saved', 'w').write('')\n"
    "guard.exit()\n"
)


def exits_of(ex: RayExecutor, jobs: set[str], timeout: float = 30) -> dict[str, Exit]:
    found: dict[str, Exit] = {}

    def all_there() -> bool:
        found.update((e.job_id, e) for e in ex.exits())
        return jobs <= found.keys()

    wait(all_there, timeout, f"the exits of {sorted(jobs)}")
    return found


def up(handle: Handle) -> int:
    path = Path(f"{handle.replicas[0].log_path}.up")
    wait(path.exists, 60, f"{path} up")
    return int(path.read_text())


@pytest.mark.slow
def test_a_sigterm_another_job_sends_is_an_eviction_even_when_the_guard_saves_and_exits(
    executor: RayExecutor, tmp_path: Path
) -> None:
    """`kill -TERM` of a job's process by another job of its account, against warden's own
    SIGTERM, to two jobs whose guard saves and exits 0: the first ends by the SIGTERM and is
    evicted, the second exits 0, warden's preemption."""
    handles = {
        job: executor.start(spec(tmp_path, job, [(node, (0,))], GUARDED)) for job, node in (("27", "w1"), ("28", "w2"))
    }
    pids = {job: up(handle) for job, handle in handles.items()}
    os.kill(pids["27"], signal.SIGTERM)
    executor.terminate("28", 1, 5.0)
    ended = exits_of(executor, {"27", "28"})
    outside, own = ended["27"], ended["28"]
    assert outside.exit_codes == (-15,) and not outside.succeeded and outside.signalled_at is None
    assert outside.ended_by == "rank 0 was killed by SIGTERM, which warden did not send"
    assert own.exit_codes == (0,) and own.ended_by is None and own.signalled_at is not None and not own.killed
    assert all(Path(f"{h.replicas[0].log_path}.saved").exists() for h in handles.values())


@pytest.mark.slow
def test_a_stopped_replica_is_reported_and_warden_s_sigterm_reaches_it(executor: RayExecutor, tmp_path: Path) -> None:
    handle = executor.start(spec(tmp_path, "29", [("w3", (1,))], STUBBORN))
    pid = up(handle)
    assert executor.stopped() == {}
    os.kill(pid, signal.SIGSTOP)  # another process of its account
    seen = wait(lambda: executor.stopped().get(("29", 1)), 10, "the stop reported")
    assert seen.what == f"rank 0: pid {pid}" and time.time() - 5 < seen.since <= time.time()
    executor.terminate("29", 1, 1.0)  # the eviction: SIGCONT follows SIGTERM, so its handler runs
    wait(Path(f"{handle.replicas[0].log_path}.term").exists, 10, "its SIGTERM handled")
    ended = exit_of(executor, "29")
    assert ended.exit_codes == (-9,) and ended.killed and ended.ended_by is None


# Kills its supervisor, which would write the true record, and writes its own: ended long ago.
FORGER = (
    "import json, os, time\n"
    "mark = os.environ['WARDEN_LOG_FILE']\n"
    "open(mark + '.up.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(mark + '.up.tmp', mark + '.up')\n"
    "time.sleep(1.0)\n"
    "os.kill(os.getppid(), 9)\n"
    "exit_path = mark[: -len('.log')] + '.exit.json'\n"
    "open(exit_path + '.tmp', 'w').write(json.dumps({'exit_code': 0, 'ended_at': 1000.0}))\n"
    "os.rename(exit_path + '.tmp', exit_path)\n"
)


@pytest.mark.slow
def test_a_supervisor_stopped_by_the_job_s_account_is_reported_by_its_silence(
    executor: RayExecutor, tmp_path: Path
) -> None:
    """The launcher's shim runs as the job's account, which can stop it too: then nothing writes
    that anything is stopped, and its heartbeat (0.5 s here) stands still instead."""
    s = spec(tmp_path, "16", [("w1", (0,))], STUBBORN)
    handle = executor.start(s)
    up = Path(f"{handle.replicas[0].log_path}.up")
    wait(up.exists, 60, "the job up")
    supervisor = int(Path(f"/proc/{int(up.read_text())}/stat").read_text().rsplit(")", 1)[1].split()[1])
    wait(lambda: executor.stopped() == {}, 10, "a first look")
    os.kill(supervisor, signal.SIGSTOP)
    try:
        seen = wait(lambda: executor.stopped().get(("16", 1)), 20, "the silent supervisor reported")
        assert "its supervisor" in seen.what, seen
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait(lambda: executor.stopped() == {}, 20, "its heartbeat again")
    executor.terminate("16", 1, 1.0)
    ended = exit_of(executor, "16")
    assert ended.killed and ended.ended_by is None


# Kills its own supervisor (its parent, the shim: same account) once it is up, then runs on.
SUPERVISOR_KILLER = (
    "import os, signal, time\n"
    "open(os.environ['WARDEN_LOG_FILE'] + '.up.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(os.environ['WARDEN_LOG_FILE'] + '.up.tmp', os.environ['WARDEN_LOG_FILE'] + '.up')\n"
    "os.kill(os.getppid(), signal.SIGKILL)\n"
    "time.sleep(600)\n"
)


def test_a_job_that_kills_its_supervisor_is_killed_and_evicted(executor: RayExecutor, tmp_path: Path) -> None:
    """The launcher outlives the shim, which runs as the job's account: once the shim is gone
    without an exit record, the launcher kills the job's group and records the loss, and the
    attempt ends as evicted (requeued), never as the job's success or failure."""
    handle = executor.start(spec(tmp_path, "17", [("w1", (0,))], SUPERVISOR_KILLER))
    up = Path(f"{handle.replicas[0].log_path}.up")
    wait(up.exists, 60, "the job up")
    pid = int(up.read_text())
    ended = exit_of(executor, "17")
    assert ended.ended_by is not None and "its supervisor ended without recording" in ended.ended_by, ended
    assert ended.signalled_at is None and not ended.succeeded
    wait(lambda: not _alive(pid), 5, "the job gone")


def test_an_end_time_a_job_wrote_is_kept_between_the_looks_that_saw_it_running_and_gone(
    executor: RayExecutor, tmp_path: Path
) -> None:
    handle = executor.start(spec(tmp_path, "30", [("w1", (2,))], FORGER))
    up(handle)
    seen_up = time.time()
    ended = exit_of(executor, "30")
    assert seen_up <= ended.ended_at <= time.time()


FOREIGN = """
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
node = {n["NodeName"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}[sys.argv[2]]

@ray.remote
class Squatter:
    def ping(self):
        return True

actor = Squatter.options(
    name="squatter", namespace="elsewhere", lifetime="detached", num_cpus=0, num_gpus=int(sys.argv[3]),
    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
).remote()
print("up", ray.get(actor.ping.remote(), timeout=60))
"""


@pytest.mark.slow
def test_gpus_a_detached_actor_that_is_not_warden_s_holds_are_foreign(
    executor: RayExecutor, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    ours = executor.start(spec(tmp_path, "24", [("w3", (0,))], STUBBORN))  # warden's own GPU there is not foreign
    wait(lambda: ("24", 1) in executor.started(), 60, "warden's replica running")
    assert executor.inventory().foreign_unknown == {}
    try:
        assert "up True" in driver(ray_cluster, FOREIGN, "w3", "2")
        assert wait(lambda: executor.inventory().foreign_unknown, 10, "the foreign GPUs seen") == {"w3": 2}
        assert executor.inventory().foreign == {}  # Ray says how many, not which
    finally:
        driver(ray_cluster, "ray.kill(ray.get_actor('squatter', namespace='elsewhere'))\n")
    wait(lambda: executor.inventory().foreign_unknown == {}, 10, "the foreign GPUs free again")
    assert ours.job_id == "24"


# -- the token -------------------------------------------------------------------------------

SNOOP = r"""
import hashlib, json, os, re, stat, sys
want, token_path, temp_dir, address = sys.argv[1:5]
HEX = re.compile(rb"[0-9a-f]{64}")
report = {"found": [], "read": 0, "denied": 0, "raylet_cmdline": False}

def look(where, data):
    report["read"] += 1
    if any(hashlib.sha256(m).hexdigest() == want for m in HEX.findall(data)):
        report["found"].append(where)

def read(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        report["denied"] += 1
        return
    with os.fdopen(fd, "rb") as f:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            try:
                look(path, f.read(1 << 20))
            except OSError:
                report["denied"] += 1

def walk(top):
    if not os.access(top, os.R_OK | os.X_OK):
        report["denied"] += 1
    for root, _, files in os.walk(top, onerror=lambda e: report.__setitem__("denied", report["denied"] + 1)):
        for name in files:
            read(os.path.join(root, name))

look("environ", b"\0".join(f"{k}={v}".encode() for k, v in os.environ.items()))
for top in (os.environ.get("HOME", "/"), os.getcwd(), temp_dir, os.path.dirname(token_path), "/root/.ray"):
    walk(top)
read(token_path)
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("environ", "cmdline"):
        read(f"/proc/{pid}/{part}")
    try:
        report["raylet_cmdline"] |= b"raylet" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        pass
from ray._raylet import GcsClient
try:
    client = GcsClient(address=address)
    client.internal_kv_put(b"Launcher", b"not warden's", True, b"fun", timeout=10)
    report["gcs"] = "accepted"
except Exception as err:
    report["gcs"] = type(err).__name__
print("snoop " + json.dumps(report), flush=True)
"""


@pytest.mark.slow
def test_a_job_finds_the_cluster_token_nowhere_and_the_gcs_refuses_it(ray_cluster: RayCluster, tmp_path: Path) -> None:
    import hashlib
    import os

    from warden.executors.identity import Identities

    if os.geteuid() != 0:
        pytest.skip("jobs run as another account only under root")
    assert ray_cluster.token_path is not None
    token = ray_cluster.token_path.read_bytes()
    assert len(token) == 64 and ray_cluster.token_path.stat().st_mode & 0o777 == 0o600
    assert ray_cluster.token_path.parent.stat().st_mode & 0o777 == 0o700
    workdir = Path(tempfile.mkdtemp(prefix="warden-snoop-"))
    os.chmod(workdir, 0o755)
    ray_cluster.connect()
    with RayExecutor(
        address=ray_cluster.address, poll_s=0.1, identities=Identities("user", user_map={"*": "nobody"})
    ) as ex:
        s = spec(
            tmp_path,
            "25",
            [("w1", (3,))],
            SNOOP,
            hashlib.sha256(token).hexdigest(),
            str(ray_cluster.token_path),
            str(ray_cluster.temp_dir),
            ray_cluster.address,
        )
        s = LaunchSpec(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "workdir": workdir, "user": "alice"})
        handle = ex.start(s)
        ended = exit_of(ex, "25", 120)
        log = handle.replicas[0].log_path.read_text()
        assert ended.exit_codes == (0,), log
    report = json.loads(tagged(log, "snoop"))
    assert report["found"] == [], report
    assert report["gcs"] == "AuthenticationError", report  # KV namespace `fun` (Ray's function table) included
    assert report["raylet_cmdline"] and report["read"] > 10, report  # it did look: Ray's processes are there
    assert report["denied"] > 0, report
    # The same search, as root, finds the token (in its file): it is a search that can find it.
    env = {k: v for k, v in ray_cluster.env.items() if not k.startswith("RAY_AUTH_")}
    args = [hashlib.sha256(token).hexdigest(), str(ray_cluster.token_path), str(ray_cluster.temp_dir)]
    done = subprocess.run(
        [sys.executable, "-c", SNOOP, *args, ray_cluster.address],
        capture_output=True,
        text=True,
        env={**env, "RAY_AUTH_MODE": "disabled", "HOME": str(workdir)},
        cwd=workdir,
        timeout=120,
    )
    assert str(ray_cluster.token_path) in json.loads(tagged(done.stdout, "snoop"))["found"], done.stderr
    for record in (handle.replicas[0].status_path, handle.replicas[0].exit_path):
        assert record.stat().st_mode & 0o777 == 0o600, record  # the attempt's records: the server's alone


FUNCTION_TABLE = """
from ray._raylet import GcsClient
client = GcsClient(address=sys.argv[1])
keys = client.internal_kv_keys(b"", b"fun", timeout=10)
print("exported", json.dumps(sorted(k.decode(errors="replace") for k in keys
      if b"ray_launch" in (client.internal_kv_get(k, b"fun", timeout=10) or b""))))
"""


@pytest.mark.slow
def test_the_launcher_is_imported_on_the_nodes_never_exported_to_the_function_table(
    executor: RayExecutor, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    executor.start(spec(tmp_path, "26", [("w2", (1,))], STUBBORN))
    wait(lambda: ("26", 1) in executor.started(), 60, "the replica running")  # a launcher ran
    assert json.loads(tagged(driver(ray_cluster, FUNCTION_TABLE), "exported")) == []
