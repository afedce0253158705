"""The `slurm` executor against a real Slurm cluster (tests/slurmcluster.py: 4 nodes × 8 fake
GPUs, two leaf switches): placement and environment, warden's own SIGTERM and SIGKILL timing,
adoption after a restart, orphans, the nodes and their states, and the start check. The
parsers of Slurm's output are tested on their own first."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurmcluster import Cluster, bring_up

from warden.engine.model import Node
from warden.executors.base import Exit, Fenced, Handle, LaunchSpec, ReplicaHandle, ReplicaLaunch
from warden.executors.identity import Identities
from warden.executors.records import CONTROL_MODE, read_job_json, write_json_atomic
from warden.executors.shim import TIME_LIMIT_SLACK_S, process_alive
from warden.executors.slurm import (
    Slurm,
    SlurmError,
    SlurmExecutor,
    SlurmJob,
    _changes_cluster,
    _exit,
    _Tracked,
    _tracking_problems,
    check_cluster,
    expand_hostlist,
    gres_indices,
    job_name,
    parse_config,
    parse_gres,
    parse_sinfo,
    parse_squeue_json,
    parse_topology,
    unconstrained,
)
from warden.executors.slurm_launch import bound_gpus

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
with open(f"{out}/.pid-{rank}", "w") as f:
    f.write(str(os.getpid()))
os.rename(f"{out}/.pid-{rank}", f"{out}/pid-{rank}")  # whole when it appears
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


def test_a_kill_the_supervisors_kept_before_the_adopter_is_the_attempts_kill(tmp_path: Path) -> None:
    """The deadline came while no server led: each rank's supervisor sent SIGKILL 0.2 s after it
    and recorded when; the new leader's adopter sent its own later. The attempt was killed at
    the supervisors' time; a recorded time outside [deadline, now] is not believed."""
    deadline = time.time() - 5
    handle = Handle(
        "1", 1, tuple(ReplicaHandle.in_dir(tmp_path, rank) for rank in range(3)), tmp_path / "control.json", ("7",)
    )
    late = _Tracked(handle, ("7",), 0.0, signalled_at=deadline - 3, kill_at=deadline, killed_at=deadline + 2)
    for rank, killed_at in enumerate((deadline + 0.21, deadline + 0.2, deadline - 1)):
        record = {"exit_code": -9, "ended_at": deadline + 0.25, "killed_at": killed_at}
        write_json_atomic(tmp_path / f"rank-{rank}.exit.json", record)
    seen = {"7": SlurmJob("warden.1.1", "COMPLETED", "", True, {})}
    ended = _exit(late, seen)
    assert ended.killed and ended.killed_at == deadline + 0.2 and ended.exit_codes == (-9, -9, -9)
    unkilled = dataclasses.replace(late, killed_at=None)
    assert _exit(unkilled, seen).killed_at == deadline + 0.2  # no server's SIGKILL at all
    forged = dataclasses.replace(late, killed_at=None, kill_at=None)  # no deadline: nothing to keep
    assert not _exit(forged, seen).killed


def test_an_end_time_a_job_wrote_is_kept_inside_what_slurm_saw(tmp_path: Path) -> None:
    """A rank's record is its job's to write: a 33 s attempt that records it ended 3.9 s in is
    believed only back to the last poll that saw it running, and never past the second after
    Slurm's own end time."""
    handle = Handle("1", 1, (ReplicaHandle.in_dir(tmp_path, 0),), tmp_path / "control.json", ("7",))
    submitted = float(int(time.time()) - 40)  # a whole second, as Slurm writes times
    tracked = _Tracked(handle, ("7",), 0.0, floor=submitted, running_at=submitted + 32.5)
    ended = {"7": SlurmJob("warden.1.1", "COMPLETED", "", True, {}, ended_at=submitted + 33)}
    write_json_atomic(tmp_path / "rank-0.exit.json", {"exit_code": 0, "ended_at": submitted + 3.9})
    assert _exit(tracked, ended).ended_at == submitted + 32.5  # the last poll that saw it running
    write_json_atomic(tmp_path / "rank-0.exit.json", {"exit_code": 0, "ended_at": submitted + 39})
    assert _exit(tracked, ended).ended_at == submitted + 34  # Slurm's end, to its second
    write_json_atomic(tmp_path / "rank-0.exit.json", {"exit_code": 0, "ended_at": submitted + 33.2})
    assert _exit(tracked, ended).ended_at == submitted + 33.2  # an honest record keeps its precision
    gone = {"7": None}  # no longer listed: nothing of Slurm's bounds it from above but now
    write_json_atomic(tmp_path / "rank-0.exit.json", {"exit_code": 0, "ended_at": "soon"})
    assert submitted + 32.5 <= _exit(tracked, gone).ended_at <= time.time()


def test_squeue_json_gives_the_end_time_of_ended_jobs_only() -> None:
    def job(job_id: int, state: str, end: object) -> dict[str, object]:
        return {"job_id": job_id, "partition": "main", "job_state": state, "end_time": end, "name": "x"}

    text = json.dumps(
        {
            "jobs": [
                job(1, "COMPLETED", 1700000000),
                job(2, "RUNNING", 1700009999),
                job(3, "CANCELLED", {"set": True, "infinite": False, "number": 1700000005}),
                job(4, "FAILED", 0),
                job(5, "TIMEOUT", {"set": False, "number": 0}),
            ]
        }
    )
    ends = {i: j.ended_at for i, j in parse_squeue_json(text, "main").items()}
    assert ends == {"1": 1700000000.0, "2": None, "3": 1700000005.0, "4": None, "5": None}


def test_squeue_json_gives_marks_and_gpus_per_node_of_the_partitions_jobs() -> None:
    text = json.dumps(
        {
            "jobs": [
                {
                    "job_id": 7, "name": "warden.1.1", "job_state": "RUNNING", "state_reason": "None",
                    "partition": "main", "admin_comment": "warden", "gres_detail": ["gpu:4(IDX:0-3)", "gpu:1(IDX:0)"],
                    "job_resources": {"allocated_nodes": [{"nodename": "n0"}, {"nodename": "n1"}]},
                },
                {"job_id": 8, "name": "warden.1.2", "job_state": "PENDING", "partition": "main", "admin_comment": ""},
                {"job_id": 9, "name": "x", "job_state": "RUNNING", "partition": "other"},
            ]
        }
    )  # fmt: skip
    jobs = parse_squeue_json(text, "main")
    assert set(jobs) == {"7", "8"}
    assert jobs["7"].marked and dict(jobs["7"].gpus) == {"n0": 4, "n1": 1} and jobs["7"].state == "RUNNING"
    assert dict(jobs["7"].indices) == {"n0": (0, 1, 2, 3), "n1": (0,)}
    assert not jobs["8"].marked and not jobs["8"].gpus


def test_gres_detail_says_which_gpus_a_job_holds() -> None:
    assert gres_indices("gpu:2(IDX:0-1)") == (0, 1)
    assert gres_indices("gpu:a100:4(IDX:0,2-3,7)") == (0, 2, 3, 7)
    assert gres_indices("gpu:1(IDX:5),mps:100(0)") == (5,)
    assert gres_indices("gpu:2(IDX:N/A)") is None and gres_indices("gpu:2") is None


def test_a_task_takes_its_part_of_the_gpus_slurm_bound_on_its_node_in_rank_order() -> None:
    launch = {"replicas": [{"node": "n1", "gpus": [0, 1]}, {"node": "n2", "gpus": [0]}, {"node": "n1", "gpus": [2, 3]}]}
    # Slurm chose 2,3,5,6 on n1; confining its devices, it names them 0-3 in the step.
    assert bound_gpus(launch, "n1", 0, "2,3,5,6", "0,1,2,3") == ((2, 3), "0,1")
    assert bound_gpus(launch, "n1", 1, "6,5,3,2", "0,1,2,3") == ((5, 6), "2,3")
    assert bound_gpus(launch, "n1", 1, "2,3,5,6", None) == ((5, 6), "5,6")  # no value of Slurm's: the indices
    assert bound_gpus(launch, "n2", 0, "4", "4") == ((4,), "4")
    with pytest.raises(LookupError, match="Slurm bound GPUs 2,3,5 on node n1, fewer than the 4 warden placed there"):
        bound_gpus(launch, "n1", 1, "2,3,5", None)


def test_a_fenced_slurm_client_refuses_every_command_that_changes_the_cluster(tmp_path: Path) -> None:
    """`Slurm.guard` sees every command that changes the cluster, and no query: a server that
    lost the lead may still read Slurm, never cancel, submit or release."""
    slurm = Slurm(tmp_path / "no-such-slurm.conf")

    def refuse(command: str) -> None:
        raise Fenced(command)

    slurm.guard = refuse
    for argv in (
        ("scancel", "12"),
        ("scancel", "--signal=KILL", "12.0"),
        ("sbatch", "--hold", "x.sh"),
        ("scontrol", "release", "12"),
        ("scontrol", "update", "JobId=12", "AdminComment=x"),
    ):
        with pytest.raises(Fenced, match=argv[0]):
            slurm.run(*argv)
        with pytest.raises(Fenced):
            slurm.start(*argv)
    reads = [
        ("squeue", "--json"),
        ("sinfo", "-h"),
        ("scontrol", "-o", "show", "partition"),
        ("scontrol", "show", "topology"),
    ]
    assert not any(_changes_cluster(argv) for argv in reads)


CONFIG = """\
Configuration data as of 2026-12-07T20:31:40
AccountingStorageType   = accounting_storage/none
ProctrackType           = {proctrack}
TaskPlugin              = {task}
TaskPluginParam         = (null type)

Cgroup Support Configuration:
CgroupMountpoint        = /sys/fs/cgroup
CgroupPlugin            = cgroup/v1
ConstrainDevices        = {devices}
ConstrainRAMSpace       = no
"""


def test_the_start_check_reads_slurms_process_tracking_and_device_confinement() -> None:
    def config(proctrack: str, task: str, devices: str) -> dict[str, str]:
        return parse_config(CONFIG.format(proctrack=proctrack, task=task, devices=devices))

    contained = config("proctrack/cgroup", "task/affinity,task/cgroup", "yes")
    assert contained["CgroupPlugin"] == "cgroup/v1"
    assert not _tracking_problems(contained) and not unconstrained(contained)
    for proctrack in ("proctrack/linuxproc", "proctrack/pgid"):
        (problem,) = _tracking_problems(config(proctrack, "task/cgroup", "yes"))
        assert f"ProctrackType={proctrack}: processes of an ended attempt can outlive it" in problem
        assert "set ProctrackType=proctrack/cgroup" in problem
    (open_devices,) = unconstrained(config("proctrack/cgroup", "task/affinity", "no"))
    assert "TaskPlugin=task/affinity has no task/cgroup and ConstrainDevices=no in cgroup.conf" in open_devices
    assert "a job can open every GPU of its nodes" in open_devices
    (no_cgroup_conf,) = unconstrained(parse_config("ProctrackType = proctrack/cgroup\nTaskPlugin = task/cgroup\n"))
    assert no_cgroup_conf.startswith("GPU devices: ConstrainDevices=no in cgroup.conf")


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
    ex = SlurmExecutor(conf=slurm_cluster.conf, heartbeat_s=HEARTBEAT_S)
    try:
        yield ex
    finally:
        for job_id, attempt in ex.running():
            ex.kill(job_id, attempt)
        ex.close()
        slurm_cluster.cancel_all()


HEARTBEAT_S = 0.5
"""The supervisors' heartbeat here: a silent one is noticed after 2 s (`outside.SILENT_BEATS`)."""


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
    bound = ((0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2, 3))  # Slurm's IDX, split among a node's replicas by rank
    assert wait_for("Slurm's GPUs read back", lambda: executor.devices("41", 1) == bound)
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


def test_a_replica_runs_on_the_gpus_slurm_bound_and_they_are_read_back(executor: SlurmExecutor, tmp_path: Path) -> None:
    # Slurm binds the lowest free GPU (0) to a replica warden placed on GPU 5: it runs there, and says so.
    executor.start(spec(tmp_path, "42", [("n3", (5,))]))
    running(tmp_path, 1)
    assert json.loads((tmp_path / "out" / "env-0.json").read_text())["CUDA_VISIBLE_DEVICES"] == "0"
    assert wait_for("Slurm's GPU read back", lambda: executor.devices("42", 1) == ((0,),))
    assert executor.devices("nothing", 1) == ()


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
    batch = float((s.log_dir / "job" / "batch.signals").read_text().split()[0])
    told = [*terms, batch]
    assert max(told) - min(told) < 0.1, told  # one instant
    lateness = [t - deadline for t in gone.values()]
    assert all(0.0 <= late <= 0.5 for late in lateness), lateness
    ended = exit_of(executor)
    assert ended.exit_codes == (-9, -9) and ended.killed and ended.signalled_at is not None
    assert ended.killed_at is not None and ended.killed_at >= deadline
    assert ended.ended_by is None  # warden's own end is no eviction


def test_the_supervisors_keep_the_time_limit_while_nothing_signals_the_attempt(
    executor: SlurmExecutor, tmp_path: Path
) -> None:
    """No server runs its passes here: the ranks' supervisors send SIGTERM at the time limit
    (plus their slack) and SIGKILL a grace later, and the attempt ends timed out, by warden."""
    s = dataclasses.replace(spec(tmp_path, "44", [("n0", (0,))], grace=1.0), time_limit_s=0.5)
    executor.start(s)
    (pid,) = running(tmp_path, 1)
    started = time.time()
    ended = exit_of(executor, timeout=30)
    term = float((tmp_path / "out" / "term-0").read_text().split()[0])
    assert ended.timed_out_at is not None and ended.ended_by is None, ended
    assert ended.signalled_at == ended.timed_out_at and abs(term - ended.timed_out_at) < 0.5
    assert ended.exit_codes == (-9,) and ended.killed_at is not None  # it ignored SIGTERM
    assert ended.killed_at - ended.timed_out_at >= 1.0  # its grace, never less
    assert term - started < 0.5 + TIME_LIMIT_SLACK_S + 2.0
    assert not process_alive(pid)


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
    # Named like the live attempt, but without warden's mark: never adopted, cancelled.
    impostor = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "-J",
        job_name("45", 1),
        "-p",
        "main",
        "-w",
        "n3",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 100",
    ).strip()
    wait_for("the impostor running", lambda: slurm_cluster.jobs()[impostor][1] == "RUNNING")
    found = executor.recover("45", 1, s.log_dir, 1)
    assert found is not None and found.external == handle.external
    assert sorted(executor.cancel_unowned([("45", 1)])) == sorted([stray, impostor])
    assert wait_for("the stray job cancelled", lambda: slurm_cluster.jobs()[stray][1] == "CANCELLED")
    assert wait_for("the impostor cancelled", lambda: slurm_cluster.jobs()[impostor][1] == "CANCELLED")
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
        assert "MaxTime=01:00:00" in text and "OverSubscribe=FORCE:2" in text
        assert "job_submit.lua has no job_submit rules of warden's for partition 'open'" in text
        with pytest.raises(SlurmError, match=r"nodes n3 are also in partition 'open'"):
            SlurmExecutor(conf=slurm_cluster.conf, partition="main")
    finally:
        slurm_cluster.run("scontrol", "delete", "PartitionName=open")
    with pytest.raises(SlurmError, match="partition 'nope' does not exist"):
        SlurmExecutor(conf=slurm_cluster.conf, partition="nope")
    assert check_cluster(Slurm(slurm_cluster.conf), "main", run_as_user=True) == []  # the real one passes, contained
    slurm_cluster.run("scontrol", "update", "PartitionName=main", "RootOnly=YES")
    try:  # Slurm would never start a job of another account there
        with pytest.raises(SlurmError, match=r"RootOnly=YES: Slurm never starts a job of another account"):
            check_cluster(Slurm(slurm_cluster.conf), "main", run_as_user=True)
    finally:
        slurm_cluster.run("scontrol", "update", "PartitionName=main", "RootOnly=NO")


def test_the_start_check_refuses_a_partition_open_to_direct_submission() -> None:
    for cluster in bring_up("--job-submit", "none"):
        with pytest.raises(SlurmError) as err:
            check_cluster(Slurm(cluster.conf), "main")
        assert "JobSubmitPlugins=(null) has no lua: any account may submit to it" in str(err.value)
        assert "deploy/slurm/job_submit.lua" in str(err.value)


# -- only warden governs the partition -------------------------------------------------------


def as_nobody(cluster: Cluster, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), env={**cluster.env, **(env or {})}, capture_output=True, text=True, timeout=30,
        user="nobody", group="nogroup", extra_groups=[], cwd="/",
    )  # fmt: skip


def test_a_jobs_account_cannot_submit_to_the_partition_or_change_its_jobs_or_see_others(
    slurm_cluster: Cluster,
) -> None:
    for partition in (["-p", "main"], []):  # named, or the default partition
        done = as_nobody(slurm_cluster, "sbatch", *partition, "--gres=gpu:4", "-o", "/dev/null", "--wrap", "sleep 60")
        assert done.returncode != 0 and "governed by warden" in done.stderr, done
    # A job of the same account, as warden submits them: no hold, no new time limit, no mark.
    ours = slurm_cluster.run(
        "sbatch", "--parsable", "-p", "main", "--uid=nobody", "--gid=nogroup", "-J", job_name("70", 1),
        "-o", "/dev/null", "--chdir=/", "--wrap", "sleep 100",
    ).strip()  # fmt: skip
    root_job = slurm_cluster.run("sbatch", "--parsable", "-p", "main", "-o", "/dev/null", "--wrap", "sleep 100").strip()
    try:
        for change in (
            ["hold", ours],
            ["update", f"JobId={ours}", "TimeLimit=5"],
            ["update", f"JobId={ours}", "AdminComment=warden"],
        ):
            done = as_nobody(slurm_cluster, "scontrol", *change)
            assert done.returncode != 0 and "denied" in done.stderr, (change, done)
        listed = as_nobody(slurm_cluster, "squeue", "-h", "-o", "%A").stdout.split()
        assert ours in listed and root_job not in listed  # PrivateData=jobs
        done = as_nobody(slurm_cluster, "scontrol", "update", "PartitionName=main", "AllowGroups=ALL")
        assert done.returncode != 0
        assert "AllowGroups=ALL" not in slurm_cluster.run("scontrol", "-o", "show", "partition", "main")
    finally:
        slurm_cluster.run("scancel", ours, root_job, check=False)


SPOOF_UID = "#include <sys/types.h>\nuid_t getuid(void){return 0;}\nuid_t geteuid(void){return 0;}\n"


def test_a_client_claiming_uid_0_is_not_believed(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Under munge the controller learns a client's uid from munged, not from the client."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the uid-spoofing library")
    (tmp_path / "spoof.c").write_text(SPOOF_UID)
    library = tmp_path / "spoof.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(tmp_path / "spoof.c")], check=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(library, 0o755)
    claimed = as_nobody(slurm_cluster, "sh", "-c", "id -u", env={"LD_PRELOAD": str(library)})
    assert claimed.stdout.strip() == "0", claimed  # the library does lie about the uid
    done = as_nobody(
        slurm_cluster, "scontrol", "update", "PartitionName=main", "MaxTime=5", env={"LD_PRELOAD": str(library)}
    )
    assert done.returncode != 0, done
    assert "MaxTime=UNLIMITED" in slurm_cluster.run("scontrol", "-o", "show", "partition", "main")


# -- what ended an attempt, and GPUs that are not warden's -----------------------------------


def test_a_slurm_job_cancelled_behind_wardens_back_is_an_eviction(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    handle = executor.start(spec(tmp_path, "46", [("n1", (0,))]))
    running(tmp_path, 1)
    slurm_cluster.run("scancel", handle.external[0])
    ended = exit_of(executor)
    assert ended.ended_by is not None
    assert f"Slurm job {handle.external[0]} cancelled by someone other than warden" in ended.ended_by


def test_gpus_held_by_jobs_that_are_not_wardens_are_foreign(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    executor.start(spec(tmp_path, "47", [("n3", (0, 1))]))
    running(tmp_path, 1)
    admin = slurm_cluster.run(
        "sbatch", "--parsable", "-p", "main", "-w", "n2", "--gres=gpu:4", "-o", "/dev/null", "--wrap", "sleep 100"
    ).strip()  # fmt: skip
    try:
        assert wait_for("the admin's GPUs foreign", lambda: executor.inventory().foreign == {"n2": (0, 1, 2, 3)})
        assert executor.inventory().foreign_counts() == {"n2": 4} and not executor.inventory().foreign_unknown
    finally:
        slurm_cluster.run("scancel", admin, check=False)
    assert wait_for("n2's GPUs back", lambda: not executor.inventory().foreign)


# Saves and exits 0 once its guard saw SIGTERM (warden's SDK): whose SIGTERM it was decides how it ends.
GUARDED = """\
import pathlib, sys, time
from warden.workload import install
guard = install()
out, name = pathlib.Path(sys.argv[1]), sys.argv[2]
(out / f"up-{name}").write_text("")
while not guard.should_stop():
    time.sleep(0.01)
(out / f"saved-{name}").write_text("")
guard.exit()
"""


def exits_of(ex: SlurmExecutor, jobs: set[str], timeout: float = 30.0) -> dict[str, Exit]:
    found: dict[str, Exit] = {}

    def all_there() -> bool:
        found.update((e.job_id, e) for e in ex.exits())
        return jobs <= found.keys()

    wait_for(f"the exits of {sorted(jobs)}", all_there, timeout)
    return found


def test_a_sigterm_warden_did_not_send_is_an_eviction_even_when_the_guard_saves_and_exits(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """`scancel --signal=TERM` by someone else (Slurm then says COMPLETED, 0:0) against warden's
    own SIGTERM, to two jobs whose guard saves and exits 0: the first ends by the SIGTERM and is
    evicted, the second exits 0, warden's preemption."""
    (tmp_path / "guarded.py").write_text(GUARDED)
    handles = {}
    for job, node in (("51", "n2"), ("52", "n3")):
        s = dataclasses.replace(
            spec(tmp_path, job, [(node, (0,))]),
            command=(sys.executable, str(tmp_path / "guarded.py"), str(tmp_path / "out"), job),
            log_dir=tmp_path / job / "attempt-1",
        )
        handles[job] = executor.start(s)
    wait_for("both guards installed", lambda: all((tmp_path / "out" / f"up-{j}").exists() for j in handles))
    slurm_cluster.run("scancel", "--signal=TERM", handles["51"].external[0])
    executor.terminate("52", 1, 5.0)
    ended = exits_of(executor, {"51", "52"})
    outside, own = ended["51"], ended["52"]
    assert outside.exit_codes == (-15,) and not outside.succeeded and outside.signalled_at is None
    assert outside.ended_by == "rank 0 was killed by SIGTERM, which warden did not send"
    assert own.exit_codes == (0,) and own.ended_by is None and own.signalled_at is not None and not own.killed
    assert all((tmp_path / "out" / f"saved-{j}").exists() for j in handles)


def test_a_stopped_replica_is_reported_and_warden_s_sigterm_reaches_it(executor: SlurmExecutor, tmp_path: Path) -> None:
    executor.start(spec(tmp_path, "53", [("n0", (0,))], grace=1.0))
    (pid,) = running(tmp_path, 1)
    assert executor.stopped() == {}
    os.kill(pid, signal.SIGSTOP)  # another process of its account
    seen = wait_for("the stop reported", lambda: executor.stopped().get(("53", 1)))
    assert seen.what == f"rank 0: pid {pid}" and time.time() - 5 < seen.since <= time.time()
    executor.terminate("53", 1, 1.0)  # the eviction: SIGCONT follows SIGTERM, so its handler runs
    wait_for("its SIGTERM handled", (tmp_path / "out" / "term-0").exists)
    ended = exit_of(executor)
    assert ended.exit_codes == (-9,) and ended.killed and ended.ended_by is None
    assert executor.stopped() == {}


def test_a_step_frozen_by_scancel_signal_stop_is_reported_by_its_silent_supervisor(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Under proctrack/cgroup `scancel --signal=STOP` freezes the whole step, its supervisor with
    it (state D, not T), so nothing writes that the job is stopped: its heartbeat stops instead."""
    handle = executor.start(spec(tmp_path, "54", [("n0", (0,))], grace=1.0))
    (pid,) = running(tmp_path, 1)
    wait_for("a first heartbeat", lambda: executor.stopped() == {} and (tmp_path / "attempt-1").exists())
    frozen = time.time()
    slurm_cluster.run("scancel", "--signal=STOP", handle.external[0])
    seen = wait_for("the frozen step reported", lambda: executor.stopped().get(("54", 1)), timeout=20)
    assert "its supervisor" in seen.what and frozen - 2 * HEARTBEAT_S <= seen.since <= time.time(), seen
    executor.terminate("54", 1, 1.0)  # SIGCONT follows SIGTERM: the step thaws and the job gets it
    wait_for("its SIGTERM handled", (tmp_path / "out" / "term-0").exists)
    ended = exit_of(executor)
    assert ended.exit_codes == (-9,) and ended.killed and ended.ended_by is None
    assert not process_alive(pid) and executor.stopped() == {}


# -- containment: nothing of an attempt outlives it, no GPU it was not given ------------------

# Leaves processes behind as a job's account can: a sleeper double-forked into a session of
# its own; with "overlap", a step of its own job (`srun --jobid --overlap`) that does the same;
# with "supervisor", it then kills its task's supervisor (once the test says go). Each pid is
# recorded as `NAME.pid`.
ESCAPER = """\
import os, subprocess, sys, time
out, how = sys.argv[1], sys.argv[2]

def record(name, pid):
    with open(f"{out}/.{name}", "w") as f:
        f.write(str(pid))
    os.rename(f"{out}/.{name}", f"{out}/{name}.pid")

def escape(name):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            record(name, os.getpid())
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)
    os.wait()

record(how, os.getpid())
escape(f"{how}-setsid")
if how == "step":
    time.sleep(600)
supervisor = os.getppid()
with open(f"/proc/{supervisor}/environ") as f:
    slurm = dict(v.split("=", 1) for v in f.read().split("\\0") if v.startswith("SLURM"))
if how == "overlap":
    srun = ["srun", f"--jobid={slurm['SLURM_JOB_ID']}", "--overlap", "--ntasks=1", "--input=none"]
    subprocess.Popen([*srun, sys.executable, sys.argv[0], out, "step"], env={**os.environ, **slurm})
    while not os.path.exists(f"{out}/step-setsid.pid"):
        time.sleep(0.02)
record("ready", os.getpid())
if how == "supervisor":
    while not os.path.exists(f"{out}/go"):  # the test saw every process alive
        time.sleep(0.02)
    os.kill(supervisor, 9)
while True:
    time.sleep(0.05)
"""


def alive(pid: int) -> bool:
    """A process of that pid runs (a zombie's work is done)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def escaper(tmp_path: Path, job: str, how: str) -> LaunchSpec:
    s = spec(tmp_path, job, [("n2", (0,))], grace=1.0)
    (tmp_path / "escaper.py").write_text(ESCAPER)
    return dataclasses.replace(s, command=(sys.executable, str(tmp_path / "escaper.py"), str(tmp_path / "out"), how))


def recorded(tmp_path: Path, names: list[str]) -> dict[str, int]:
    out = tmp_path / "out"
    wait_for("the job's processes", lambda: all((out / f"{n}.pid").exists() for n in [*names, "ready"]))
    pids = {n: int((out / f"{n}.pid").read_text()) for n in names}
    assert all(alive(p) for p in pids.values()), pids
    return pids


def test_no_process_of_a_terminated_attempt_outlives_it_not_one_in_a_step_of_its_own(
    executor: SlurmExecutor, tmp_path: Path
) -> None:
    executor.start(escaper(tmp_path, "51", "overlap"))
    pids = recorded(tmp_path, ["overlap", "overlap-setsid", "step", "step-setsid"])
    executor.terminate("51", 1, 1.0)
    ended = exit_of(executor)
    assert ended.signalled_at is not None and ended.ended_by is None
    assert not {n: p for n, p in pids.items() if alive(p)}


def test_no_process_of_an_attempt_that_killed_its_supervisor_outlives_it(
    executor: SlurmExecutor, tmp_path: Path
) -> None:
    executor.start(escaper(tmp_path, "52", "supervisor"))
    pids = recorded(tmp_path, ["supervisor", "supervisor-setsid"])
    (tmp_path / "out" / "go").touch()
    ended = exit_of(executor)
    assert not ended.succeeded and ended.signalled_at is None
    assert ended.error is not None and "rank 0: no exit record" in ended.error, ended
    assert ended.ended_by is not None and "its supervisor ended without recording" in ended.ended_by, ended
    assert not {n: p for n, p in pids.items() if alive(p)}


# Tries every fake GPU device of its node and records how each open ended.
OPENER = """\
import errno, json, os, sys, time
out, dev = sys.argv[1], sys.argv[2]
seen = {}
for name in os.listdir(dev):
    try:
        os.close(os.open(os.path.join(dev, name), os.O_RDONLY))
        seen[name] = "opened"
    except OSError as err:
        seen[name] = errno.errorcode[err.errno]
with open(f"{out}/.devices.json", "w") as f:
    json.dump(seen, f)
os.rename(f"{out}/.devices.json", f"{out}/devices.json")
while True:
    time.sleep(0.05)
"""


def test_a_job_opens_the_gpus_slurm_gave_it_and_no_other(
    executor: SlurmExecutor, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    s = spec(tmp_path, "53", [("n1", (0, 1))])
    (tmp_path / "opener.py").write_text(OPENER)
    command = (sys.executable, str(tmp_path / "opener.py"), str(tmp_path / "out"), str(slurm_cluster.root / "dev"))
    executor.start(dataclasses.replace(s, command=command))
    (given,) = wait_for("Slurm's GPUs read back", lambda: [d for d in executor.devices("53", 1) or () if d])
    report = tmp_path / "out" / "devices.json"
    wait_for("the job's report", report.exists)
    seen = json.loads(report.read_text())
    # No driver answers a fake GPU: an allowed open fails ENXIO, one the devices cgroup denies EPERM.
    assert seen == {f"nvidia{i}": "ENXIO" if i in given else "EPERM" for i in range(8)}, (given, seen)
    assert len(given) == 2


# -- what a job writes ------------------------------------------------------------------------

FORGER = """\
import json, os, sys
out = os.path.join(sys.argv[1], "job", "rank-0.exit.json")
with open(out, "w") as f:
    json.dump({"exit_code": 0, "ended_at": 1000.0}, f)
os.kill(os.getppid(), 9)  # the supervisor, which would write the true record
"""


def test_a_forged_exit_record_is_not_believed(executor: SlurmExecutor, tmp_path: Path) -> None:
    s = spec(tmp_path, "48", [("n0", (0,))])
    (tmp_path / "forger.py").write_text(FORGER)
    s = dataclasses.replace(s, command=(sys.executable, str(tmp_path / "forger.py"), str(s.log_dir)))
    before = time.time()
    executor.start(s)
    ended = exit_of(executor)
    assert before <= ended.ended_at <= time.time()
    assert ended.exit_codes != (0,) and not ended.succeeded


def test_the_server_never_writes_through_a_link_a_job_planted(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("untouched")
    where = tmp_path / "attempt"
    where.mkdir()
    (where / "control.json").symlink_to(target)
    for pid in range(8):  # every name a predictable temp file could have
        (where / f".control.json.{pid}.tmp").symlink_to(tmp_path / f"created-{pid}")
    write_json_atomic(where / "control.json", {"kill_at": 1.0})
    assert target.read_text() == "untouched"
    assert not list(tmp_path.glob("created-*"))
    assert read_job_json(where / "control.json") == {"kill_at": 1.0}
    assert not (where / "control.json").is_symlink()


# A task's supervisor as the job's account: how far away the SIGKILL deadline it reads is.
KEEPER = """\
import sys
from pathlib import Path
from warden.executors.shim import DeadlineKeeper
print(DeadlineKeeper(Path(sys.argv[1])).until_due(0))
"""


def test_the_job_account_reads_the_sigkill_deadline_whatever_the_servers_umask(tmp_path: Path) -> None:
    """Each task's supervisor runs as the job's account and keeps the deadline the server
    records in control.json: the server's umask (077) must not leave the file the server's alone."""
    control = tmp_path / "control.json"
    old = os.umask(0o077)  # the server's
    try:
        write_json_atomic(control, {"kill_at": time.time() + 60}, mode=CONTROL_MODE)
    finally:
        os.umask(old)
    assert stat.S_IMODE(control.stat().st_mode) == CONTROL_MODE
    if os.geteuid() != 0:
        return
    (tmp_path / "keeper.py").write_text(KEEPER)
    package = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, str(tmp_path / "keeper.py"), str(control)],
        user="nobody",
        group=pwd.getpwnam("nobody").pw_gid,
        extra_groups=[],
        env={**os.environ, "PYTHONPATH": package},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert 59 < float(done.stdout) <= 60.5, done.stdout


def test_the_attempt_directory_is_the_servers_and_the_jobs_part_is_apart(
    executor: SlurmExecutor, tmp_path: Path
) -> None:
    s = spec(tmp_path, "49", [("n0", (0,))])
    handle = executor.start(s)
    running(tmp_path, 1)
    assert s.log_dir.stat().st_uid == os.getuid() and s.log_dir.stat().st_mode & 0o022 == 0
    assert handle.control_path == s.log_dir / "control.json"
    assert all(r.exit_path.parent == s.log_dir / "job" for r in handle.replicas)


PLANTER = """\
import json, os, sys, time
attempt, out = sys.argv[1], sys.argv[2]
tried = {}
for name in ("control.json", ".control.json.1.tmp", "rank-0.exit.json"):
    try:
        os.symlink(os.path.join(out, "victim"), os.path.join(attempt, name))
        tried[name] = "planted"
    except OSError as err:
        tried[name] = err.strerror
with open(os.path.join(out, "planted.json.part"), "w") as f:
    json.dump({"uid": os.getuid(), "tried": tried}, f)
os.rename(os.path.join(out, "planted.json.part"), os.path.join(out, "planted.json"))
while True:
    time.sleep(0.05)
"""


def test_a_job_run_as_its_account_cannot_plant_links_where_the_server_writes(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("running jobs as another account needs a root server")
    ex = SlurmExecutor(conf=slurm_cluster.conf, identities=Identities("user", user_map={"*": "nobody"}))
    try:
        s = spec(tmp_path, "50", [("n1", (0,))])
        (tmp_path / "planter.py").write_text(PLANTER)
        os.chmod(tmp_path / "out", 0o777)
        victim = tmp_path / "out" / "victim"
        victim.write_text("untouched")
        command = (sys.executable, str(tmp_path / "planter.py"), str(s.log_dir), str(tmp_path / "out"))
        ex.start(dataclasses.replace(s, command=command))
        planted = tmp_path / "out" / "planted.json"
        wait_for("the job's attempt to plant links", planted.exists)
        report = json.loads(planted.read_text())
        assert report["uid"] == pwd.getpwnam("nobody").pw_uid
        assert set(report["tried"].values()) == {"Permission denied"}, report
        ex.terminate("50", 1, 0.5)  # the server writes control.json
        ended = exit_of(ex)
        assert ended.exit_codes == (-15,) and ended.ended_by is None  # warden's SIGTERM: no eviction
        assert victim.read_text() == "untouched"
        assert read_job_json(s.log_dir / "control.json") is not None
    finally:
        for job_id, attempt in ex.running():
            ex.kill(job_id, attempt)
        ex.close()
        slurm_cluster.cancel_all()
