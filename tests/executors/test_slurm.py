"""The `slurm` executor against a real Slurm cluster (tests/slurmcluster.py: 4 nodes × 8 fake
GPUs, two leaf switches): placement and environment, warden's own SIGTERM and SIGKILL timing,
adoption after a restart, orphans, the nodes and their states, and the start check. The
parsers of Slurm's output are tested on their own first."""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurmcluster import Cluster

from warden.engine.model import Node
from warden.executors.base import Exit, Handle, LaunchSpec, ReplicaLaunch
from warden.executors.records import read_job_json
from warden.executors.slurm import (
    Slurm,
    SlurmError,
    SlurmExecutor,
    check_cluster,
    expand_hostlist,
    job_name,
    parse_gres,
    parse_sinfo,
    parse_topology,
)

pytestmark = pytest.mark.xdist_group("slurm")  # one xdist worker runs every Slurm test: one cluster

# Records the time of each SIGTERM (and the pid) and keeps running until SIGKILL, printing
# the environment warden set first.
STUBBORN = """\
import json, os, signal, sys, time
out = sys.argv[1]
rank = os.environ.get("RANK", "0")
def on_term(signum, frame):
    with open(f"{out}/term-{rank}", "a") as f:
        f.write(f"{time.time():.6f}\\n")
signal.signal(signal.SIGTERM, on_term)
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
         "WARDEN_NODE", "WARDEN_JOB_ID", "WARDEN_ATTEMPT", "WARDEN_CHECKPOINT_DIR", "SLURM_JOB_ID")
with open(f"{out}/env-{rank}.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in names}, f)
with open(f"{out}/pid-{rank}", "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.01)
"""


# -- parsers ---------------------------------------------------------------------------------


def test_hostlists_expand_ranges_lists_and_padding() -> None:
    assert expand_hostlist("n[0-2,5],gpu[08-10]-a,login") == [
        "n0", "n1", "n2", "n5", "gpu08-a", "gpu09-a", "gpu10-a", "login",
    ]  # fmt: skip
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    with pytest.raises(ValueError, match="'x'"):
        expand_hostlist("n[x]")


def test_gres_gives_the_gpu_count_and_type_and_refuses_two_types() -> None:
    assert parse_gres("gpu:8") == (8, None)
    assert parse_gres("gpu:a100:4(S:0-1),mps:100") == (4, "a100")
    assert parse_gres("(null)") == (0, None)
    with pytest.raises(ValueError, match="several types"):
        parse_gres("gpu:a100:4,gpu:v100:4")


def test_sinfo_lines_become_nodes_with_flavor_block_and_state() -> None:
    text = "a1|10.0.0.1|mixed|gpu:h100:8|96|512000|none\na2|10.0.0.2|drained*|gpu:h100:8|96|512000|bad fan\n"
    a1, a2 = parse_sinfo(text + text, {"a1": "leaf1"})  # a node in two partitions is listed twice
    assert a1.node == Node("a1", 8, cpu=96_000, memory=512000, flavor="h100", block="leaf1")
    assert a1.usable and a1.addr == "10.0.0.1"
    assert not a2.usable and a2.reason == "bad fan" and a2.node.block is None


@pytest.mark.parametrize("state", ["down*", "drained", "draining", "idle~", "idle*", "mixed#", "reserved"])
def test_node_states_that_take_no_job(state: str) -> None:
    (node,) = parse_sinfo(f"a1|a1|{state}|gpu:8|8|1000|none\n", {})
    assert not node.usable


def test_records_a_job_wrote_are_read_without_following_links_or_trusting_their_size(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"exit_code": 0}')
    (tmp_path / "link.json").symlink_to(secret)
    (tmp_path / "big.json").write_text('{"x": "' + "a" * 70_000 + '"}')
    (tmp_path / "bad.json").write_text("{not json")
    assert read_job_json(secret) == {"exit_code": 0}
    for name in ("link.json", "big.json", "bad.json", "missing.json"):
        assert read_job_json(tmp_path / name) is None
    os.mkfifo(tmp_path / "fifo.json")
    assert read_job_json(tmp_path / "fifo.json") is None  # never blocks on a FIFO


def test_leaf_switches_are_blocks() -> None:
    text = (
        "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n[0-1]\n"
        "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n2,n3\n"
        "SwitchName=top Level=1 LinkSpeed=1 Nodes=n[0-3] Switches=s[0-1]\n"
    )
    assert parse_topology(text) == {"n0": "s0", "n1": "s0", "n2": "s1", "n3": "s1"}


# -- against the cluster ---------------------------------------------------------------------


@pytest.fixture
def executor(slurm_cluster: Cluster) -> Iterator[SlurmExecutor]:
    ex = SlurmExecutor(conf=slurm_cluster.conf)
    try:
        yield ex
    finally:
        for job_id, attempt in ex.running():
            ex.kill(job_id, attempt)
        ex.close()
        slurm_cluster.cancel_all()


def spec(tmp_path: Path, job: str, replicas: list[tuple[str, tuple[int, ...]]], grace: float = 2.0) -> LaunchSpec:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ranks = []
    for rank, (node, gpus) in enumerate(replicas):
        local = sum(1 for n, _ in replicas[:rank] if n == node)
        ranks.append(ReplicaLaunch(rank, node, gpus, local))
    return LaunchSpec(
        job_id=job,
        attempt=1,
        command=(sys.executable, str(script), str(out)),
        replicas=tuple(ranks),
        grace_s=grace,
        workdir=tmp_path,
        log_dir=tmp_path / "attempt-1",
        checkpoint_dir=tmp_path / "checkpoints",
    )


def wait_for(what: str, check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def running(tmp_path: Path, ranks: int) -> list[int]:
    out = tmp_path / "out"
    wait_for(f"{ranks} replicas running", lambda: all((out / f"pid-{r}").exists() for r in range(ranks)))
    return [int((out / f"pid-{r}").read_text()) for r in range(ranks)]


def exit_of(ex: SlurmExecutor, timeout: float = 30.0) -> Exit:
    found: list[Exit] = []
    wait_for("the attempt's exit", lambda: found.extend(ex.exits()) or found, timeout)
    (ended,) = found
    return ended


def test_a_gang_runs_where_warden_placed_it_with_the_local_executors_environment(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    # Three replicas of 4 GPUs: two on n1, one on n2 (two Slurm jobs: one per per-node count).
    s = spec(tmp_path, "41", [("n1", (0, 1, 2, 3)), ("n1", (4, 5, 6, 7)), ("n2", (0, 1, 2, 3))])
    handle = executor.start(s)
    assert len(handle.external) == 2
    running(tmp_path, 3)
    envs = [json.loads((tmp_path / "out" / f"env-{r}.json").read_text()) for r in range(3)]
    assert [e["WARDEN_NODE"] for e in envs] == ["n1", "n1", "n2"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1,2,3", "4,5,6,7", "0,1,2,3"]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] and {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in envs}) == 1
    assert {e["WARDEN_JOB_ID"] for e in envs} == {"41"} and {e["SLURM_JOB_ID"] for e in envs} == {None}
    jobs = slurm_cluster.jobs()
    assert sorted(jobs[i][2] for i in handle.external) == ["n1", "n2"]
    assert {jobs[i][0] for i in handle.external} == {job_name("41", 1)}
    executor.kill("41", 1)
    ended = exit_of(executor)
    assert ended.exit_codes == (-9, -9, -9) and ended.killed


def test_gpus_slurm_did_not_bind_are_refused(executor: SlurmExecutor, tmp_path: Path) -> None:
    # Slurm binds the lowest free GPU (0); a replica placed on GPU 5 must not run on it.
    executor.start(spec(tmp_path, "42", [("n3", (5,))]))
    ended = exit_of(executor)
    assert ended.exit_codes == (None,)
    assert ended.error is not None and "Slurm bound GPUs 0 on node n3" in ended.error


def test_sigterm_reaches_batch_and_replicas_together_and_sigkill_comes_at_the_deadline(
    executor: SlurmExecutor, tmp_path: Path
) -> None:
    s = spec(tmp_path, "43", [("n0", tuple(range(8))), ("n1", tuple(range(8)))], grace=2.0)
    executor.start(s)
    pids = running(tmp_path, 2)
    watch = {os.pidfd_open(pid): pid for pid in pids}
    deadline = executor.terminate("43", 1, 2.0)
    assert executor.terminate("43", 1, 2.0) == deadline  # idempotent
    gone: dict[int, float] = {}
    while len(gone) < len(watch):
        ready, _, _ = select.select([fd for fd in watch if fd not in gone], [], [], 30)
        assert ready, "a replica outlived its SIGKILL by 30 s"
        for fd in ready:
            gone[fd] = time.time()
    terms = [float((tmp_path / "out" / f"term-{r}").read_text().split()[0]) for r in range(2)]
    batch = float((s.log_dir / "batch.signals").read_text().split()[0])
    told = [*terms, batch]
    assert max(told) - min(told) < 0.1, told  # one instant
    lateness = [t - deadline for t in gone.values()]
    assert all(0.0 <= late <= 0.5 for late in lateness), lateness
    ended = exit_of(executor)
    assert ended.exit_codes == (-9, -9) and ended.killed and ended.signalled_at is not None
    assert ended.killed_at is not None and ended.killed_at >= deadline


def test_a_restarted_executor_adopts_the_attempt_and_keeps_its_deadline(slurm_cluster: Cluster, tmp_path: Path) -> None:
    first = SlurmExecutor(conf=slurm_cluster.conf)
    s = spec(tmp_path, "44", [("n2", (0, 1))], grace=3.0)
    handle = first.start(s)
    (pid,) = running(tmp_path, 1)
    deadline = first.terminate("44", 1, 3.0)
    first.close()  # the server stops mid-grace; the job lives on
    watch = os.pidfd_open(pid)
    second = SlurmExecutor(conf=slurm_cluster.conf)
    try:
        second.adopt(Handle.from_dict(json.loads(json.dumps(handle.to_dict()))))
        ready, _, _ = select.select([watch], [], [], 30)
        late = time.time() - deadline
        assert ready and 0.0 <= late <= 0.5, late
        ended = exit_of(second)
        assert ended.killed and ended.exit_codes == (-9,)
    finally:
        second.close()
        slurm_cluster.cancel_all()


def test_recover_finds_a_submission_by_name_and_unowned_jobs_are_cancelled(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    s = spec(tmp_path, "45", [("n3", (0,))])
    handle = executor.start(s)
    running(tmp_path, 1)
    found = executor.recover("45", 1, s.log_dir, 1)
    assert found is not None and found.external == handle.external
    assert executor.recover("45", 2, s.log_dir, 1) is None
    stray = slurm_cluster.run(
        "sbatch", "--parsable", "--hold", "-J", job_name("999", 1), "-p", "main", "--wrap", "sleep 100"
    ).strip()
    assert executor.cancel_unowned([("45", 1)]) == [stray]
    assert wait_for("the stray job cancelled", lambda: slurm_cluster.jobs()[stray][1] == "CANCELLED")
    assert slurm_cluster.jobs()[handle.external[0]][1] == "RUNNING"  # an owned one is left alone


def test_nodes_come_from_slurm_and_a_drained_node_is_down(executor: SlurmExecutor, slurm_cluster: Cluster) -> None:
    inventory = executor.inventory()
    assert [(n.name, n.gpus, n.block) for n in inventory.nodes] == [
        ("n0", 8, "block0"), ("n1", 8, "block0"), ("n2", 8, "block1"), ("n3", 8, "block1"),
    ]  # fmt: skip
    assert not inventory.down
    slurm_cluster.set_node("n3", "drain", "bad fan")
    try:
        down = wait_for("n3 drained", lambda: executor.inventory().down)
        assert list(down) == ["n3"] and "DRAIN" in down["n3"] and "bad fan" in down["n3"]
        assert [n.name for n in executor.inventory().usable] == ["n0", "n1", "n2"]
    finally:
        slurm_cluster.set_node("n3", "resume")
    wait_for("n3 back", lambda: not executor.inventory().down)


def test_the_start_check_refuses_a_partition_slurm_would_decide_in(slurm_cluster: Cluster) -> None:
    slurm_cluster.run("scontrol", "create", "PartitionName=open", "Nodes=n3", "MaxTime=60", "OverSubscribe=FORCE:2")
    try:
        with pytest.raises(SlurmError) as err:
            SlurmExecutor(conf=slurm_cluster.conf, partition="open")
        text = str(err.value)
        assert "MaxTime=01:00:00" in text and "OverSubscribe=FORCE:2" in text and "anyone may submit" in text
        with pytest.raises(SlurmError, match=r"nodes n3 are also in partition 'open'"):
            SlurmExecutor(conf=slurm_cluster.conf, partition="main")
    finally:
        slurm_cluster.run("scontrol", "delete", "PartitionName=open")
    with pytest.raises(SlurmError, match="partition 'nope' does not exist"):
        SlurmExecutor(conf=slurm_cluster.conf, partition="nope")
    check_cluster(Slurm(slurm_cluster.conf), "main")  # the real one passes
