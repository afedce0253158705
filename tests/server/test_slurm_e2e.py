"""`warden server --executor slurm` governing a real Slurm cluster (tests/slurmcluster.py: 4
nodes × 8 fake GPUs): jobs run where warden placed them, a tier-1 job preempts a tier-3 gang
with warden's own signals and exactly one victim, a gang on a node that goes down is evicted
whole and requeued, and a server killed with SIGKILL mid-grace or mid-launch loses nothing and
doubles nothing."""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gangjobs import POLITE, deaths, deaths_later, job, preempting, run_trainer, running_pids
from gangjobs import trainer as trainer  # the fixture
from serverproc import Server, submit, until_state, wait_for
from slurmcluster import Cluster

from warden.executors.slurm import expand_hostlist, job_name

# A real Slurm cluster and a server per test, about two minutes; one xdist worker runs every
# test of the session's Slurm cluster.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

POLICY = """\
min_grace: 2s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  1: {name: production-inference, preemptible: false, grace: 2s, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s}
  3: {name: experimentation, lease: 1s, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 16}}
    - {name: language, nominal: {gpu: 16}}
"""


@pytest.fixture
def server(tmp_path: Path, slurm_cluster: Cluster) -> Iterator[Server]:
    s = slurm_server(tmp_path, slurm_cluster).start()
    try:
        yield s
    finally:
        s.stop()
        slurm_cluster.cancel_all()
        wait_for(lambda: not live(slurm_cluster), 30, "the cluster's jobs gone")


def slurm_server(tmp_path: Path, cluster: Cluster) -> Server:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Server(
        tmp_path / "state",
        policy=policy,
        gpus=None,  # Slurm's nodes; as root, jobs run as `nobody` (serverproc.AS_NOBODY)
        args=("--executor", "slurm"),
        env={"SLURM_CONF": str(cluster.conf), "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def live(cluster: Cluster) -> list[str]:
    return [i for i, (_, state, _) in cluster.jobs().items() if state in ("PENDING", "RUNNING", "COMPLETING")]


def test_jobs_run_on_the_nodes_and_gpus_warden_chose_with_the_contract_environment(
    server: Server, slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    assert server.log is not None  # how Slurm contains its jobs, said at start
    assert "containment: Slurm's cgroups (proctrack/cgroup)" in server.log.read_text()
    assert "opens only the GPU devices Slurm allocated it" in server.log.read_text()
    with server.client() as c:
        nodes = c.get("/v1/nodes").json()
        assert [(n["name"], n["gpus"], n["block"], n["down"]) for n in nodes] == [
            ("n0", 8, "block0", None), ("n1", 8, "block0", None), ("n2", 8, "block1", None), ("n3", 8, "block1", None),
        ]  # fmt: skip
        one = run_trainer(c, trainer, tmp_path / "one", queue="vision", tier=3, gpus=1)
        gang = run_trainer(
            c, trainer, tmp_path / "gang", queue="language", tier=3, gpus=8, replicas=2, placement="block"
        )
        for job_id, out, ranks in ((one, tmp_path / "one", 1), (gang, tmp_path / "gang", 2)):
            until_state(c, job_id, "RUNNING")
            running_pids(out, 1, ranks)
            placement = job(c, job_id)["attempts"][0]["placement"]
            envs = [json.loads((out / f"env-1-{r}.json").read_text()) for r in range(ranks)]
            assert [(e["WARDEN_NODE"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [
                (p["node"], ",".join(map(str, p["gpus"]))) for p in placement
            ]
            assert all(e["WARDEN_JOB_ID"] == job_id for e in envs)
            if os.geteuid() == 0:  # the submitting user's account (mapped to nobody), never root
                assert (out / "pid-1-0").stat().st_uid == pwd.getpwnam("nobody").pw_uid
            # Running now: the cluster keeps ended jobs for a while, and other tests' databases name theirs alike.
            slurm = [v for v in slurm_cluster.jobs().values() if v[0] == job_name(job_id, 1) and v[1] == "RUNNING"]
            assert sorted(n for v in slurm for n in expand_hostlist(v[2])) == sorted({p["node"] for p in placement})
            assert {v[1] for v in slurm} == {"RUNNING"}
        gang_nodes = [p["node"] for p in job(c, gang)["attempts"][0]["placement"]]
        assert len(set(gang_nodes)) == 2
        blocks = {n["name"]: n["block"] for n in nodes}
        assert len({blocks[n] for n in gang_nodes}) == 1  # one leaf switch of Slurm's topology
        envs = [json.loads((tmp_path / "gang" / f"env-1-{r}.json").read_text()) for r in range(2)]
        assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
        assert len({e["MASTER_PORT"] for e in envs}) == 1 and envs[0]["MASTER_PORT"]
        logs = wait_for(
            lambda: (got := c.get(f"/v1/jobs/{gang}/logs", params={"rank": 1}).json())["text"] and got,
            10,
            "rank 1's log",
        )
        assert logs["text"] == "rank 1 of attempt 1 runs\n"
        for job_id in (one, gang):
            assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
            until_state(c, job_id, "CANCELLED", timeout=30)
    assert wait_for(lambda: not live(slurm_cluster), 30, "the Slurm jobs ended")


def test_tier1_preempts_a_tier3_gang_with_one_sigterm_instant_sigkill_on_time_and_a_resume(
    server: Server, slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    with server.client() as c:
        # The cluster is full: the gang holds two whole nodes, tier-2 fillers inside their
        # lease the other two, so the gang is the one possible victim.
        low = run_trainer(c, trainer, tmp_path / "low", queue="vision", tier=3, gpus=8, replicas=2)
        until_state(c, low, "RUNNING")
        fillers = [run_trainer(c, trainer, tmp_path / f"f{i}", queue="language", tier=2, gpus=8) for i in range(2)]
        for f in fillers:
            until_state(c, f, "RUNNING")
        pids = running_pids(tmp_path / "low", 1, 2)
        time.sleep(1.2)  # past the tier-3 lease of 1 s
        # In the gang's own queue, within its nominal: a tier that is not preemptible never borrows.
        high = run_trainer(c, trainer, tmp_path / "high", queue="vision", tier=1, gpus=8, replicas=2)
        gone = deaths(pids)
        detail = wait_for(lambda: (j := job(c, low))["attempts"][0]["state"] == "exited" and j, 30, "the victim's exit")
        first = detail["attempts"][0]
        assert first["reason"] == "killed" and first["preempted_for"] == high
        assert first["last_checkpoint_at"] is not None  # the SDK's report reached the server from the node
        terms = [float((tmp_path / "low" / f"term-1-{r}").read_text().split()[0]) for r in range(2)]
        terms.append(float((Path(first["log_dir"]) / "job" / "batch.signals").read_text().split()[0]))
        assert max(terms) - min(terms) < 0.1, terms  # both replicas and the batch supervisor
        # SIGKILL is due the grace after the SIGTERM the processes saw (the pass that decided
        # the preemption, `sigterm_at`, comes a moment before the signal on a loaded machine):
        # the deadline is taken once both `scancel` calls have returned, so never before the
        # grace has run from the signal, and later by their exit at most (18 ms seen under load).
        assert 1.75 <= first["kill_at"] - min(terms) <= 2.1, (first["kill_at"], terms)
        assert first["sigterm_at"] <= min(terms)
        lateness = [t - first["kill_at"] for t in gone]
        assert all(0.0 <= late <= 0.5 for late in lateness), lateness
        until_state(c, high, "RUNNING", timeout=30)
        assert preempting(c, [low, *fillers]) == [low]
        # The gang is requeued and, once the tier-1 job is cancelled, resumes from its checkpoint.
        assert c.post(f"/v1/jobs/{high}/cancel").status_code == 202
        until_state(c, high, "CANCELLED", timeout=30)
        until_state(c, low, "RUNNING", timeout=30)
        wait_for(lambda: (tmp_path / "low" / "resumed-2-0").exists(), 30, "the second attempt")
        assert (tmp_path / "low" / "resumed-2-0").read_text() != "none"


def test_a_victim_that_exits_cleanly_in_its_grace_is_requeued_not_done(
    server: Server, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    polite = tmp_path / "polite.py"
    polite.write_text(POLITE)
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    with server.client() as c:
        lows = [
            submit(
                c,
                queue="vision",
                tier=3,
                gpus=8,
                workdir=str(out),
                command=[sys.executable, str(polite), str(out / f"up{i}")],
            )
            for i in range(4)
        ]
        for low in lows:
            until_state(c, low, "RUNNING")
        time.sleep(1.2)
        high = submit(c, queue="language", tier=1, gpus=8, workdir=str(out), command=[sys.executable, "-c", "pass"])
        until_state(c, high, "SUCCEEDED", timeout=30)
        (victim,) = preempting(c, lows)
        detail = job(c, victim)
        first = detail["attempts"][0]
        assert first["reason"] == "preempted" and first["exit_codes"] == [0]  # Slurm says COMPLETED
        assert "REQUEUED" in [e["to"] for e in detail["events"]]
        until_state(c, victim, "RUNNING", timeout=30)  # and it runs again


def test_no_needless_victim_while_the_first_is_still_completing(
    server: Server, slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    with server.client() as c:
        lows = [run_trainer(c, trainer, tmp_path / f"low{i}", queue="vision", tier=3, gpus=8) for i in range(4)]
        for low in lows:
            until_state(c, low, "RUNNING")
        time.sleep(1.2)  # past their leases: every one of them is a candidate
        high = run_trainer(c, trainer, tmp_path / "high", queue="language", tier=1, gpus=8)
        until_state(c, high, "RUNNING", timeout=30)  # after the victim's 2 s grace and SIGKILL
        assert len(preempting(c, lows)) == 1
        victim = preempting(c, lows)[0]
        victim_node = job(c, victim)["attempts"][0]["placement"][0]["node"]
        assert job(c, high)["attempts"][0]["placement"][0]["node"] == victim_node
        wait_for(lambda: (tmp_path / "high" / "pid-1-0").exists(), 30, "the tier-1 job's process")
        assert sum(1 for v in slurm_cluster.jobs().values() if v[1] == "RUNNING") == 4


def test_a_gang_on_a_node_that_goes_down_is_evicted_whole_and_requeued(
    server: Server, slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    with server.client() as c:
        gang = run_trainer(c, trainer, tmp_path / "gang", queue="vision", tier=3, gpus=8, replicas=2)
        until_state(c, gang, "RUNNING")
        pids = running_pids(tmp_path / "gang", 1, 2)
        nodes = [p["node"] for p in job(c, gang)["attempts"][0]["placement"]]
        slurm_cluster.set_node(nodes[1], "down", "disk failure")
        try:
            deaths(pids)
            detail = wait_for(
                lambda: (
                    (j := job(c, gang))["attempts"][0]["state"] == "exited"
                    and any(e["to"] == "REQUEUED" for e in j["events"])
                    and j
                ),
                30,
                "the gang requeued",
            )
            evicted = [e for e in detail["events"] if e["to"] == "PREEMPTING"]
            assert len(evicted) == 1 and f"node {nodes[1]} is DOWN" in evicted[0]["reason"]
            assert "disk failure" in evicted[0]["reason"]
            assert (tmp_path / "gang" / "term-1-0").exists()  # the replica on the live node had its grace
            until_state(c, gang, "RUNNING", timeout=30)
            second = [p["node"] for p in job(c, gang)["attempts"][1]["placement"]]
            assert nodes[1] not in second
            down = {n["name"]: n["down"] for n in c.get("/v1/nodes").json()}
            assert down[nodes[1]] is not None and "DOWN" in down[nodes[1]]
            assert job(c, gang)["attempts"][0]["reason"] in ("preempted", "killed")
        finally:
            slurm_cluster.set_node(nodes[1], "resume")


def test_a_server_killed_mid_grace_keeps_the_deadline_and_doubles_nothing(
    slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    server = slurm_server(tmp_path, slurm_cluster)
    server.start()
    try:
        with server.client() as c:
            # A grace longer than the server takes to start again, so that the new one keeps it.
            lows = [
                run_trainer(c, trainer, tmp_path / f"low{i}", queue="vision", tier=3, gpus=8, replicas=2, grace="10s")
                for i in range(2)
            ]
            for low in lows:
                until_state(c, low, "RUNNING")
            time.sleep(1.2)
            high = run_trainer(c, trainer, tmp_path / "high", queue="language", tier=1, gpus=8, replicas=2)
            victim = wait_for(lambda: preempting(c, lows), 30, "a victim")[0]
            out = tmp_path / f"low{lows.index(victim)}"
            pids = running_pids(out, 1, 2)
            kill_at = job(c, victim)["attempts"][0]["kill_at"]
        server.kill9()  # in the victim's grace
        watcher = deaths_later(pids)
        server.start()
        gone = watcher()
        assert all(0.0 <= t - kill_at <= 0.5 for t in gone), [t - kill_at for t in gone]
        with server.client() as c:
            until_state(c, high, "RUNNING", timeout=30)
            assert preempting(c, lows) == [victim]
            assert [a["number"] for a in job(c, high)["attempts"]] == [1]
        names = [v[0] for v in slurm_cluster.jobs().values() if v[1] == "RUNNING"]
        assert sorted(names) == sorted([job_name(high, 1), *(job_name(i, 1) for i in lows if i != victim)])
    finally:
        server.stop()
        slurm_cluster.cancel_all()


def test_a_root_server_refuses_to_run_slurm_jobs_as_uids_no_node_knows(slurm_cluster: Cluster, tmp_path: Path) -> None:
    server = slurm_server(tmp_path, slurm_cluster)
    server.run_as = ("--run-as", "dynamic")
    with pytest.raises(AssertionError, match="server exited 2") as err:
        server.start()
    assert "--run-as user" in str(err.value) and "dynamic uids" in str(err.value)


def test_a_server_killed_mid_launch_adopts_the_held_job_and_cancels_strays(
    slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    """The server died after `sbatch --hold` and marking the job as warden's, before it stored the
    handle or released it: the restarted server finds the job by name and mark, releases it and
    runs it once; a Slurm job named as warden's that no attempt owns is cancelled."""
    server = slurm_server(tmp_path, slurm_cluster)
    server.start()
    try:
        with server.client() as c:
            job_id = run_trainer(c, trainer, tmp_path / "one", queue="vision", tier=3, gpus=2)
            until_state(c, job_id, "RUNNING")
            running_pids(tmp_path / "one", 1, 1)
        server.kill9()
        (ours,) = [i for i, v in slurm_cluster.jobs().items() if v[0] == job_name(job_id, 1) and v[1] == "RUNNING"]
        # Rewind to mid-launch: the job is held again by its name, and the handle is unknown.
        slurm_cluster.run("scancel", "--signal=KILL", f"{ours}.0")
        wait_for(lambda: slurm_cluster.jobs()[ours][1] not in ("RUNNING", "COMPLETING"), 30, "the first job gone")
        log_dir = tmp_path / "state" / "jobs" / job_id / "attempt-1"
        for stale in (log_dir / "job").glob("rank-*"):
            stale.unlink()
        (tmp_path / "one" / "pid-1-0").unlink()
        resubmitted = slurm_cluster.run(
            "sbatch", "--parsable", "--hold", f"--job-name={job_name(job_id, 1)}", "-p", "main", "-w", "n0",
            "--gres=gpu:2", "--no-requeue", "--export=NONE", f"--output={log_dir / 'job' / 'batch.log'}", f"--chdir={log_dir / 'job'}",
            f"--wrap=PYTHONPATH={Path(__file__).resolve().parents[2]} exec {sys.executable} "
            f"-m warden.executors.slurm_launch batch {log_dir}",
        ).strip()  # fmt: skip
        slurm_cluster.run("scontrol", "update", f"JobId={resubmitted}", "AdminComment=warden")
        stray = slurm_cluster.run(
            "sbatch", "--parsable", "--hold", f"--job-name={job_name('999999', 1)}", "-p", "main", "--wrap", "sleep 60"
        ).strip()  # fmt: skip
        db = sqlite3.connect(tmp_path / "state" / "warden.db")
        db.execute("UPDATE attempts SET handle = NULL WHERE job_id = ?", (int(job_id),))
        db.commit()
        db.close()
        server.start()
        with server.client() as c:
            wait_for(lambda: (tmp_path / "one" / "pid-1-0").exists(), 30, "the held job released and running")
            detail = job(c, job_id)
            assert detail["state"] == "RUNNING" and [a["number"] for a in detail["attempts"]] == [1]
        jobs = slurm_cluster.jobs()
        assert jobs[resubmitted][1] == "RUNNING"
        assert wait_for(lambda: slurm_cluster.jobs()[stray][1] == "CANCELLED", 30, "the stray cancelled")
    finally:
        server.stop()
        slurm_cluster.cancel_all()


def test_gpus_a_job_outside_warden_holds_are_never_given_to_a_warden_job(
    server: Server, slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    """An admin's own Slurm jobs (submitted as root, not through warden) hold all 8 GPUs of
    two nodes and GPUs 0,1 of a third: warden places its 8-GPU job on the fourth, a second
    one waits rather than land on a node whose GPUs are taken, and a 2-GPU job runs beside
    the admin's on GPUs 2,3, where warden planned it, Slurm bound it and warden records it."""
    outside = [
        slurm_cluster.run(
            "sbatch", "--parsable", "-p", "main", "-w", node, f"--gres=gpu:{gpus}", "-o", "/dev/null",
            "--wrap", "sleep 600",
        ).strip()
        for node, gpus in (("n0", 8), ("n1", 8), ("n2", 2))
    ]  # fmt: skip
    with server.client() as c:
        wait_for(
            lambda: (
                {n["name"]: (n["gpus_foreign"], n["gpu_indices_foreign"]) for n in c.get("/v1/nodes").json()}
                == {"n0": (8, list(range(8))), "n1": (8, list(range(8))), "n2": (2, [0, 1]), "n3": (0, [])}
            ),
            30,
            "the outside jobs' GPUs seen as foreign, where they are",
        )
        first = run_trainer(c, trainer, tmp_path / "first", queue="vision", tier=3, gpus=8)
        until_state(c, first, "RUNNING", timeout=60)
        assert [p["node"] for p in job(c, first)["attempts"][0]["placement"]] == ["n3"]
        second = run_trainer(c, trainer, tmp_path / "second", queue="language", tier=3, gpus=8)
        waiting = wait_for(lambda: (j := job(c, second))["reason"] is not None and j, 30, "the second job's reason")
        assert waiting["state"] == "PENDING" and not waiting["attempts"], waiting
        metrics = c.get("/metrics").text
        assert 'warden_gpus_foreign{node="n0"} 8.0' in metrics and 'warden_gpus_foreign{node="n2"} 2.0' in metrics
        beside = run_trainer(c, trainer, tmp_path / "beside", queue="vision", tier=3, gpus=2)
        until_state(c, beside, "RUNNING", timeout=60)
        running_pids(tmp_path / "beside", 1, 1)
        env = json.loads((tmp_path / "beside" / "env-1-0.json").read_text())
        # Slurm confines the job to GPUs 2,3 (ConstrainDevices): CUDA, seeing only those, numbers them 0,1.
        assert (env["WARDEN_NODE"], env["CUDA_VISIBLE_DEVICES"]) == ("n2", "0,1")
        assert job(c, beside)["attempts"][0]["placement"] == [{"node": "n2", "gpus": [2, 3]}]
        [ours] = [i for i, v in slurm_cluster.jobs().items() if v[0] == job_name(beside, 1) and v[1] == "RUNNING"]
        assert "IDX:2-3" in slurm_cluster.run("scontrol", "-d", "-o", "show", "job", ours)
        slurm_cluster.run("scancel", *outside)
        until_state(c, second, "RUNNING", timeout=60)  # the GPUs came back to warden
        assert job(c, second)["attempts"][0]["placement"][0]["node"] in ("n0", "n1")


def test_a_warden_job_cancelled_outside_warden_is_requeued_with_what_happened(
    server: Server, slurm_cluster: Cluster, trainer: Path, tmp_path: Path
) -> None:
    with server.client() as c:
        victim = run_trainer(c, trainer, tmp_path / "victim", queue="vision", tier=3, gpus=1)
        until_state(c, victim, "RUNNING")
        running_pids(tmp_path / "victim", 1, 1)
        ids = [i for i, (name, s, _) in slurm_cluster.jobs().items() if name == f"warden.{victim}.1" and s == "RUNNING"]
        assert ids
        slurm_cluster.run("scancel", *ids)  # an operator's scancel, not warden's
        detail = wait_for(
            lambda: (j := job(c, victim))["attempts"][0]["state"] == "exited" and len(j["attempts"]) and j,
            60,
            "the attempt ended",
        )
        assert detail["attempts"][0]["reason"] == "evicted", detail["attempts"][0]
        requeued = [e for e in job(c, victim)["events"] if e["to"] == "REQUEUED"]
        assert requeued and "cancelled by someone other than warden" in requeued[0]["reason"], requeued
        assert job(c, victim)["state"] != "FAILED"
        until_state(c, victim, "RUNNING", timeout=60)  # it runs again
