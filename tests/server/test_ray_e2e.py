"""`warden server --executor ray` governing a real Ray cluster (tests/raycluster.py: 3 worker
nodes × 4 fake GPUs): jobs run where warden placed them with the contract's environment, a
tier-1 job preempts a tier-3 gang with warden's own signals, a gang whose node dies is evicted
whole and requeued with nothing re-placed behind warden's back, and a server killed with
SIGKILL adopts its running gang instead of restarting it."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gangjobs import POLITE, deaths, job, preempting, run_trainer, running_pids
from gangjobs import trainer as trainer  # the fixture
from raycluster import RayCluster, bring_up
from serverproc import Server, until_state, wait_for

from warden.executors.shim import process_alive

# A real Ray cluster and a server per test; one xdist worker runs every Ray test (one cluster).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

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
    - {name: vision, nominal: {gpu: 8}}
    - {name: language, nominal: {gpu: 4}}
"""


def ray_server(tmp_path: Path, cluster: RayCluster) -> Server:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Server(
        tmp_path / "state",
        policy=policy,
        gpus=None,  # Ray's nodes; as root, jobs run as `nobody` (serverproc.AS_NOBODY)
        args=("--executor", "ray"),
        env={k: v for k, v in cluster.env.items() if k.startswith(("WARDEN_RAY_", "RAY_"))},
    )


@pytest.fixture
def server(tmp_path: Path, ray_cluster: RayCluster) -> Iterator[Server]:
    s = ray_server(tmp_path, ray_cluster).start()
    try:
        yield s
    finally:
        s.stop()
        clear(ray_cluster)


def clear(cluster: RayCluster) -> None:
    """End what a stopped server left running (its jobs outlive it by design): every group
    and launcher named as warden's; the jobs die with their launchers."""
    ray_query(
        cluster,
        "from ray.util.placement_group import remove_placement_group, get_placement_group\n"
        "for name in ray.util.list_named_actors():\n"
        "    if name.startswith('warden.'): ray.kill(ray.get_actor(name))\n"
        "for v in placement_group_table().values():\n"
        "    if v['name'].startswith('warden.') and v['state'] != 'REMOVED':\n"
        "        remove_placement_group(get_placement_group(v['name']))\n"
        "print(json.dumps(True))",
    )
    wait_for(lambda: not groups(cluster), 30, "every placement group removed")


def ray_query(cluster: RayCluster, code: str) -> Any:
    """Run `code` in a driver of its own (the test process stays out of Ray); its last line
    prints JSON."""
    prelude = (
        "import json, ray, warden\n"
        # warden's launchers load by import, never from the GCS: a driver that takes their handles must too.
        "code = ray.job_config.JobConfig(code_search_path=[warden.__path__[0].rsplit('/', 1)[0]])\n"
        f"ray.init(address={cluster.address!r}, namespace='warden', log_to_driver=False, logging_level='ERROR', "
        "job_config=code)\n"
        "from ray.util.placement_group import placement_group_table\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, env=cluster.env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def groups(cluster: RayCluster) -> dict[str, dict[str, str]]:
    """warden's placement groups that are not removed: name -> bundle index -> node id."""
    return ray_query(
        cluster,
        "print(json.dumps({v['name']: {str(k): n for k, n in v['bundles_to_node_id'].items()} "
        "for v in placement_group_table().values() if v['name'].startswith('warden.') and v['state'] != 'REMOVED'}))",
    )


def node_ids(cluster: RayCluster) -> dict[str, str]:
    return ray_query(cluster, "print(json.dumps({n['NodeName']: n['NodeID'] for n in ray.nodes() if n['Alive']}))")


def statuses(log_dir: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((log_dir / f"rank-{r}.status.json").read_text()) for r in range(ranks)]


def test_jobs_run_on_the_nodes_and_gpus_warden_chose_with_the_contract_environment(
    server: Server, ray_cluster: RayCluster, trainer: Path, tmp_path: Path
) -> None:
    ids = node_ids(ray_cluster)
    with server.client() as c:
        nodes = c.get("/v1/nodes").json()
        assert [(n["name"], n["gpus"], n["block"], n["down"]) for n in nodes] == [
            ("w1", 4, "b1", None), ("w2", 4, "b1", None), ("w3", 4, "b2", None),
        ]  # fmt: skip
        one = run_trainer(c, trainer, tmp_path / "one", queue="vision", tier=3, gpus=1)
        gang = run_trainer(c, trainer, tmp_path / "gang", queue="language", tier=3, gpus=4, replicas=2)
        for job_id, out, ranks in ((one, tmp_path / "one", 1), (gang, tmp_path / "gang", 2)):
            until_state(c, job_id, "RUNNING", timeout=60)
            running_pids(out, 1, ranks)
            first = job(c, job_id)["attempts"][0]
            placement = first["placement"]
            envs = [json.loads((out / f"env-1-{r}.json").read_text()) for r in range(ranks)]
            bound = [(e["WARDEN_NODE"], e["CUDA_VISIBLE_DEVICES"]) for e in envs]
            # The GPUs Ray bound are the job's, and warden's record says so (corrected where Ray chose others).

            def recorded(j: str = job_id, b: list[tuple[str, str]] = bound) -> list[dict[str, Any]] | None:
                got = job(c, j)["attempts"][0]["placement"]
                return got if [(p["node"], ",".join(map(str, p["gpus"]))) for p in got] == b else None

            placement = wait_for(recorded, 10, "the recorded assignment where the job runs")
            assert all(e["WARDEN_JOB_ID"] == job_id for e in envs)
            # Each replica ran on the Ray node warden placed it on, in a bundle of the job's group.
            records = statuses(Path(first["log_dir"]), ranks)
            assert [r["ray_node_id"] for r in records] == [ids[p["node"]] for p in placement]
            assert groups(ray_cluster)[f"warden.{job_id}.1"] == {
                str(i): ids[p["node"]] for i, p in enumerate(placement)
            }
            if os.geteuid() == 0:  # the submitting user's account (mapped to nobody), never root
                assert (out / "pid-1-0").stat().st_uid == pwd.getpwnam("nobody").pw_uid
        gang_nodes = [p["node"] for p in job(c, gang)["attempts"][0]["placement"]]
        assert len(set(gang_nodes)) == 2
        envs = [json.loads((tmp_path / "gang" / f"env-1-{r}.json").read_text()) for r in range(2)]
        assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
        assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.2"}  # rank 0's node
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
    assert wait_for(lambda: not groups(ray_cluster), 30, "the groups removed")


SQUAT = """
import json, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], namespace="elsewhere", log_to_driver=False, logging_level="ERROR")
node = {n["NodeName"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}[sys.argv[2]]

@ray.remote
class Squatter:
    def gpus(self):
        return [str(g) for g in ray.get_gpu_ids()]

held = {}
for name in sys.argv[3:]:
    actor = Squatter.options(
        name=name, lifetime="detached", num_cpus=0, num_gpus=1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote()
    held[name] = ray.get(actor.gpus.remote(), timeout=60)
print(json.dumps(held))
"""

UNSQUAT = """
import sys, ray
ray.init(address=sys.argv[1], namespace="elsewhere", log_to_driver=False, logging_level="ERROR")
for name in sys.argv[2:]:
    try:
        ray.kill(ray.get_actor(name))
    except ValueError:
        pass
print("{}")
"""


def outside(cluster: RayCluster, script: str, *args: str) -> Any:
    """Run `script` as a driver that is not warden's (detached actors in another namespace)."""
    done = subprocess.run(
        [sys.executable, "-c", script, cluster.address, *args], capture_output=True, text=True, env=cluster.env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_job_runs_on_the_gpus_ray_bound_beside_an_outside_actor_and_warden_records_them(
    server: Server, ray_cluster: RayCluster, trainer: Path, tmp_path: Path
) -> None:
    """An actor that is not warden's holds one GPU of w3, and not the lowest (Ray hands out the
    lowest free ids: two actors took 0 and 1, the first one is gone). Ray says how many GPUs
    are taken, not which: warden counts one foreign GPU there, plans its 3-GPU job on the three
    others it guesses free, and Ray binds the three really free. The job runs on Ray's, and
    warden's record of the attempt follows them, with an event that says so."""
    try:
        held = outside(ray_cluster, SQUAT, "w3", "early", "squatter")
        assert held == {"early": ["0"], "squatter": ["1"]}, held
        outside(ray_cluster, UNSQUAT, "early")
        with server.client() as c:
            wait_for(
                lambda: (n := {n["name"]: n for n in c.get("/v1/nodes").json()}["w3"])["gpus_foreign"] == 1 and n,
                30,
                "one GPU of w3 held outside warden",
            )
            three = run_trainer(c, trainer, tmp_path / "three", queue="vision", tier=3, gpus=3, placement="pack")
            until_state(c, three, "RUNNING", timeout=60)
            running_pids(tmp_path / "three", 1, 1)
            env = json.loads((tmp_path / "three" / "env-1-0.json").read_text())
            assert (env["WARDEN_NODE"], env["CUDA_VISIBLE_DEVICES"]) == ("w3", "0,2,3")
            detail = wait_for(
                lambda: (j := job(c, three))["attempts"][0]["placement"] == [{"node": "w3", "gpus": [0, 2, 3]}] and j,
                10,
                "the assignment recorded where Ray bound it",
            )
            noted = [e for e in detail["events"] if "as the executor bound them" in e["reason"]]
            assert len(noted) == 1 and "w3:0,2,3" in noted[0]["reason"] and "not w3:1,2,3" in noted[0]["reason"]
            assert statuses(Path(detail["attempts"][0]["log_dir"]), 1)[0]["ray_gpus"] == ["0", "2", "3"]
    finally:
        outside(ray_cluster, UNSQUAT, "early", "squatter")


def test_a_gang_of_three_nodes_runs_whole(
    server: Server, ray_cluster: RayCluster, trainer: Path, tmp_path: Path
) -> None:
    with server.client() as c:
        gang = run_trainer(c, trainer, tmp_path / "gang", queue="language", tier=2, gpus=4, replicas=3)
        until_state(c, gang, "RUNNING", timeout=60)
        pids = running_pids(tmp_path / "gang", 1, 3)
        placement = job(c, gang)["attempts"][0]["placement"]
        assert sorted(p["node"] for p in placement) == ["w1", "w2", "w3"]
        envs = [json.loads((tmp_path / "gang" / f"env-1-{r}.json").read_text()) for r in range(3)]
        assert [e["RANK"] for e in envs] == ["0", "1", "2"] and {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0,1,2,3"}
        assert c.post(f"/v1/jobs/{gang}/cancel").status_code == 202
        deaths(pids)
        until_state(c, gang, "CANCELLED", timeout=30)


def test_tier1_preempts_a_tier3_gang_with_one_sigterm_instant_sigkill_on_time_and_a_resume(
    server: Server, ray_cluster: RayCluster, trainer: Path, tmp_path: Path
) -> None:
    with server.client() as c:
        # The cluster is full: the gang holds two whole nodes, a tier-2 filler inside its lease
        # the third, so the gang is the one possible victim.
        low = run_trainer(c, trainer, tmp_path / "low", queue="vision", tier=3, gpus=4, replicas=2)
        until_state(c, low, "RUNNING", timeout=60)
        filler = run_trainer(c, trainer, tmp_path / "filler", queue="language", tier=2, gpus=4)
        until_state(c, filler, "RUNNING", timeout=60)
        pids = running_pids(tmp_path / "low", 1, 2)
        time.sleep(1.2)  # past the tier-3 lease of 1 s
        # In the gang's own queue, within its nominal: a tier that is not preemptible never borrows.
        high = run_trainer(c, trainer, tmp_path / "high", queue="vision", tier=1, gpus=4, replicas=2)
        gone = deaths(pids)
        detail = wait_for(lambda: (j := job(c, low))["attempts"][0]["state"] == "exited" and j, 30, "the victim's exit")
        first = detail["attempts"][0]
        assert first["reason"] == "killed" and first["preempted_for"] == high
        assert first["last_checkpoint_at"] is not None  # the SDK's report reached the server from the node
        assert first["kill_at"] - first["sigterm_at"] == pytest.approx(2.0, abs=0.1)
        terms = [float((tmp_path / "low" / f"term-1-{r}").read_text().split()[0]) for r in range(2)]
        assert max(terms) - min(terms) < 0.1, terms  # every rank at once
        lateness = [t - first["kill_at"] for t in gone]
        assert all(0.0 <= late <= 0.5 for late in lateness), lateness
        until_state(c, high, "RUNNING", timeout=60)
        assert preempting(c, [low, filler]) == [low]
        # The gang is requeued and, once the tier-1 job is cancelled, resumes from its checkpoint.
        assert c.post(f"/v1/jobs/{high}/cancel").status_code == 202
        until_state(c, high, "CANCELLED", timeout=30)
        until_state(c, low, "RUNNING", timeout=60)
        wait_for(lambda: (tmp_path / "low" / "resumed-2-0").exists(), 30, "the second attempt")
        assert (tmp_path / "low" / "resumed-2-0").read_text() != "none"


def test_a_victim_that_exits_cleanly_in_its_grace_is_requeued_not_done(
    server: Server, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    polite = tmp_path / "polite.py"
    polite.write_text(POLITE)
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    with server.client() as c:
        lows = [
            c.post(
                "/v1/jobs",
                json={
                    "queue": "vision",
                    "tier": 3,
                    "gpus": 4,
                    "workdir": str(out),
                    "command": [sys.executable, str(polite), str(out / f"up{i}")],
                },
            ).json()["id"]
            for i in range(3)
        ]
        for low in lows:
            until_state(c, low, "RUNNING", timeout=60)
        time.sleep(1.2)
        high = c.post(
            "/v1/jobs",
            json={
                "queue": "language",
                "tier": 1,
                "gpus": 4,
                "workdir": str(out),
                "command": [sys.executable, "-c", "pass"],
            },
        ).json()["id"]
        until_state(c, high, "SUCCEEDED", timeout=60)
        (victim,) = preempting(c, lows)
        detail = job(c, victim)
        first = detail["attempts"][0]
        assert first["reason"] == "preempted" and first["exit_codes"] == [0]
        assert "REQUEUED" in [e["to"] for e in detail["events"]]
        until_state(c, victim, "RUNNING", timeout=60)  # and it runs again


def test_a_gang_whose_node_dies_is_evicted_whole_and_nothing_is_re_placed(trainer: Path, tmp_path: Path) -> None:
    """On a cluster of its own: the test kills one of its nodes."""
    clusters = bring_up()
    cluster = next(clusters)
    server = ray_server(tmp_path, cluster).start()
    try:
        ids = node_ids(cluster)
        with server.client() as c:
            gang = run_trainer(c, trainer, tmp_path / "gang", queue="vision", tier=3, gpus=4, replicas=2)
            until_state(c, gang, "RUNNING", timeout=60)
            pids = running_pids(tmp_path / "gang", 1, 2)
            placement = [p["node"] for p in job(c, gang)["attempts"][0]["placement"]]
            lost, kept = placement[1], placement[0]
            killed_at = time.monotonic()
            cluster.kill_worker(lost)
            detail = wait_for(
                lambda: (j := job(c, gang)) and any(e["to"] == "PREEMPTING" for e in j["events"]) and j,
                15,
                "the gang evicted",
            )
            assert time.monotonic() - killed_at < 15
            (evicted,) = [e for e in detail["events"] if e["to"] == "PREEMPTING"]
            assert f"node {lost} is DEAD" in evicted["reason"]
            deaths(pids[:1])  # the survivor, after its grace
            wait_for(lambda: not process_alive(pids[1]), 30, "the lost rank gone with its launcher")
            assert (tmp_path / "gang" / "term-1-0").exists()  # the replica on the live node had its grace
            wait_for(lambda: any(e["to"] == "REQUEUED" for e in job(c, gang)["events"]), 30, "the gang requeued")
            # Ray re-placed nothing of the first attempt: its group is gone, not moved to a spare node.
            assert f"warden.{gang}.1" not in groups(cluster)
            until_state(c, gang, "RUNNING", timeout=60)
            second = job(c, gang)["attempts"][1]["placement"]
            assert lost not in [p["node"] for p in second] and kept in ids
            down = {n["name"]: n["down"] for n in c.get("/v1/nodes").json()}
            assert lost not in down or down[lost] is not None
            assert c.post(f"/v1/jobs/{gang}/cancel").status_code == 202
            until_state(c, gang, "CANCELLED", timeout=30)
    finally:
        server.stop()
        clusters.close()


def test_a_server_killed_with_sigkill_adopts_its_running_gang_and_removes_strays(
    ray_cluster: RayCluster, trainer: Path, tmp_path: Path
) -> None:
    server = ray_server(tmp_path, ray_cluster)
    server.start()
    try:
        with server.client() as c:
            gang = run_trainer(c, trainer, tmp_path / "gang", queue="vision", tier=3, gpus=2, replicas=2)
            until_state(c, gang, "RUNNING", timeout=60)
            pids = running_pids(tmp_path / "gang", 1, 2)
        server.kill9()
        # A group and a launcher named as warden's that no attempt owns (a database restored
        # from a backup, say): the restarted server removes them.
        ray_query(
            ray_cluster,
            "from ray.util.placement_group import placement_group\n"
            "placement_group([{'CPU': 0.01}], name='warden.999999.1', lifetime='detached')\n"
            "print(json.dumps(True))",
        )
        assert "warden.999999.1" in groups(ray_cluster)
        server.start()
        with server.client() as c:
            wait_for(lambda: "warden.999999.1" not in groups(ray_cluster), 30, "the stray group removed")
            detail = job(c, gang)
            assert detail["state"] == "RUNNING" and [a["number"] for a in detail["attempts"]] == [1]
            assert all(process_alive(p) for p in pids)  # adopted, not restarted
            assert not (tmp_path / "gang" / "pid-2-0").exists()
            assert c.post(f"/v1/jobs/{gang}/cancel").status_code == 202
            deaths(pids)
            until_state(c, gang, "CANCELLED", timeout=30)
    finally:
        server.stop()
        clear(ray_cluster)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run jobs as other accounts")
def test_a_root_server_refuses_to_run_ray_jobs_as_dynamic_uids(ray_cluster: RayCluster, tmp_path: Path) -> None:
    server = ray_server(tmp_path, ray_cluster)
    server.run_as = ("--run-as", "dynamic")
    with pytest.raises(AssertionError, match="server exited 2") as err:
        server.start()
    assert "--run-as user" in str(err.value) and "dynamic uids" in str(err.value)


def test_a_server_without_a_reachable_cluster_says_so(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = Server(
        tmp_path / "state", policy=policy, gpus=None, args=("--executor", "ray", "--ray-address", "127.0.0.2:1")
    )
    with pytest.raises(AssertionError, match="server exited 2") as err:
        server.start()
    assert "--executor ray: cannot connect to the Ray cluster at '127.0.0.2:1'" in str(err.value)


def test_a_cluster_without_token_authentication_is_refused_unless_trusted_by_name(tmp_path: Path) -> None:
    """On a cluster of its own, brought up without Ray's token authentication."""
    clusters = bring_up("--nodes", "1", "--gpus-per-node", "1", "--cpus-per-node", "1", "--no-auth")
    cluster = next(clusters)
    try:
        assert cluster.token_path is None
        for name in ("refused", "trusted"):
            (tmp_path / name).mkdir()
        refused = ray_server(tmp_path / "refused", cluster)
        with pytest.raises(AssertionError, match="server exited 2") as err:
            refused.start()
        message = " ".join(str(err.value).split())
        assert "accepts clients without a token" in message and "runs as root on every node" in message, message
        assert "--ray-trust-unauthenticated" in message
        trusted = ray_server(tmp_path / "trusted", cluster)
        trusted.args = (*trusted.args, "--ray-trust-unauthenticated")
        trusted.start()
        try:
            with trusted.client() as c:
                assert [n["name"] for n in c.get("/v1/nodes").json()] == ["w1"]
            assert trusted.log is not None and "governing it anyway" in trusted.log.read_text()
        finally:
            trusted.stop()
    finally:
        clusters.close()


def test_trusting_an_unauthenticated_cluster_needs_the_ray_executor(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = Server(tmp_path / "state", policy=policy, args=("--ray-trust-unauthenticated",))
    with pytest.raises(AssertionError, match="server exited 2") as err:
        server.start()
    assert "--ray-trust-unauthenticated: the executor is 'local' (add --executor ray)" in str(err.value)
