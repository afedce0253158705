"""The `ray` executor against a real Ray cluster (tests/raycluster.py: 3 worker nodes × 4 fake
GPUs), and its parsing of Ray's node table without one."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from raycluster import RayCluster

from warden.engine.model import DEFAULT_FLAVOR, Node
from warden.executors.base import Exit, LaunchError, LaunchSpec, ReplicaLaunch
from warden.executors.ray import RayError, RayExecutor, group_name, inventory_of, parse_nodes, probe

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

ENV_DUMP = (
    "import json, os, sys, time\n"
    "out = os.environ['WARDEN_LOG_FILE'] + '.env.json'\n"
    "open(out, 'w').write(json.dumps(dict(os.environ)))\n"
    "time.sleep(float(sys.argv[1]))\n"
)
STUBBORN = (
    "import os, signal, sys, time\n"
    "def term(*_):\n"
    "    open(os.environ['WARDEN_LOG_FILE'] + '.term', 'w').write(repr(time.time()))\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "open(os.environ['WARDEN_LOG_FILE'] + '.up', 'w').write(str(os.getpid()))\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def executor(ray_cluster: RayCluster) -> Iterator[RayExecutor]:
    ex = RayExecutor(address=ray_cluster.address, poll_s=0.1)
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
    assert [(e["WARDEN_NODE"], e["CUDA_VISIBLE_DEVICES"], e["RANK"]) for e in envs] == [
        (node, str(gpus[0]), str(rank)) for rank, (node, gpus) in enumerate(placement)
    ]
    assert {e["WORLD_SIZE"] for e in envs} == {"6"} and {e["MASTER_ADDR"] for e in envs} == {"127.0.0.2"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and envs[0]["MASTER_PORT"].isdigit()
    assert not [k for e in envs for k in e if k.startswith("RAY_")]  # nothing of Ray's reaches the job
    records = [json.loads(r.status_path.read_text()) for r in handle.replicas]
    assert [r["ray_node_id"] for r in records] == [ids[node] for node, _ in placement]
    assert [len(r["ray_gpus"]) for r in records] == [1] * 6  # what Ray assigned, beside warden's choice
    assert ray_groups()[group_name("11", 1)] == "CREATED"
    executor.terminate("11", 1, 1.0)
    ended = exit_of(executor, "11")
    assert ended.exit_codes == (-15,) * 6 and not ended.killed
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
    assert ended.killed and ended.exit_codes == (-9,) * 4
    assert ended.killed_at is not None and 0.0 <= ended.killed_at - deadline <= 0.5
    assert ended.signalled_at is not None and deadline - ended.signalled_at >= 1.5  # never before the grace
    control = json.loads((s.log_dir / "control.json").read_text())
    assert control["kill_at"] == deadline


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
    with RayExecutor(address=ray_cluster.address, poll_s=0.1, start_timeout_s=2.0) as ex:
        s = spec(tmp_path, "15", [("w1", (0, 1, 2, 3, 4))], STUBBORN)  # five GPUs on a node of four
        ex.start(s)
        ended = exit_of(ex, "15")
        assert ended.exit_codes == (None,) and "not running after 2 s" in (ended.error or "")
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
