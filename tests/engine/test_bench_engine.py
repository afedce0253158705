"""The engine benchmark (warden.bench.engine, `warden bench engine`).

The numbers it prints are only worth comparing if its input is the same every time and is a
state the engine could really be handed, so these tests pin the generator: deterministic from
the seed, real non-overlapping GPU assignments, no node over capacity, the requested counts.
No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from typer.testing import CliRunner

from warden.bench.engine import run_engine_bench
from warden.cli.main import app
from warden.engine.model import Job, JobState, Snapshot
from warden.engine.synthetic import NOW, synthetic_snapshot

SMALL = (20, 8, 50, 30)
CLI_ARGS = [
    "bench",
    "engine",
    "--nodes",
    "20",
    "--gpus-per-node",
    "8",
    "--pending",
    "50",
    "--running",
    "30",
    "--json",
    "--repeat",
    "1",
]
DOCUMENTED_KEYS = {
    "nodes",
    "gpus_per_node",
    "gpus",
    "pending",
    "running_placed",
    "seed",
    "repeat",
    "pass_ms_median",
    "pass_ms_min",
    "pass_ms_all",
    "admissions",
    "preemptions",
    "admissions_per_s",
    "explanations",
    "python",
}


def _holding(snapshot: Snapshot) -> list[Job]:
    return [j for j in snapshot.jobs if j.state.holds_resources]


@pytest.fixture(scope="module")
def small() -> Snapshot:
    return synthetic_snapshot(*SMALL, seed=0)[0]


@pytest.fixture(scope="module")
def large() -> Snapshot:
    """Two flavors (≥ 200 nodes) and a cluster that R fills, so packing runs out of room."""
    return synthetic_snapshot(256, 8, 500, 3000, seed=3)[0]


# -- determinism -------------------------------------------------------------------------------


def test_same_seed_gives_equal_snapshots() -> None:
    a, now_a = synthetic_snapshot(*SMALL, seed=7)
    b, now_b = synthetic_snapshot(*SMALL, seed=7)
    assert now_a == now_b == NOW
    assert a == b
    assert a.policy.to_dict() == b.policy.to_dict()


def test_different_seed_gives_different_snapshots() -> None:
    a, _ = synthetic_snapshot(*SMALL, seed=1)
    b, _ = synthetic_snapshot(*SMALL, seed=2)
    assert a.jobs != b.jobs


# -- a state the engine could be handed ---------------------------------------------------------


@pytest.mark.parametrize("which", ["small", "large"])
def test_no_overlapping_gpus_and_no_node_over_capacity(which: str, request: pytest.FixtureRequest) -> None:
    snapshot: Snapshot = request.getfixturevalue(which)
    nodes = {n.name: n for n in snapshot.nodes}
    used: dict[str, list[int]] = defaultdict(list)
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    for job in _holding(snapshot):
        assert job.attempt is not None
        assert len(job.attempt.assignment) == job.replicas
        for rp in job.attempt.assignment:
            assert len(rp.gpus) == job.gpus
            assert all(0 <= g < nodes[rp.node].gpus for g in rp.gpus)
            used[rp.node].extend(rp.gpus)
            cpu[rp.node] += job.cpu
            mem[rp.node] += job.memory
    for name, gpus in used.items():
        assert len(gpus) == len(set(gpus)), f"{name} has a GPU assigned twice"
        assert len(gpus) <= nodes[name].gpus
        assert cpu[name] <= nodes[name].cpu
        assert mem[name] <= nodes[name].memory


def test_gangs_take_whole_nodes_in_one_block(large: Snapshot) -> None:
    blocks = {n.name: (n.flavor, n.block) for n in large.nodes}
    gangs = [j for j in _holding(large) if j.replicas > 1]
    assert gangs
    for job in gangs:
        assert job.attempt is not None
        names = [rp.node for rp in job.attempt.assignment]
        assert len(set(names)) == job.replicas
        assert len({blocks[n] for n in names}) == 1
        assert all(len(rp.gpus) == 8 for rp in job.attempt.assignment)


def test_requested_counts(small: Snapshot) -> None:
    assert len(small.nodes) == 20
    assert all(n.gpus == 8 and n.cpu == 64_000 and n.memory == 512_000 for n in small.nodes)
    assert {n.flavor for n in small.nodes} == {"default"}
    assert sum(1 for j in small.jobs if j.state.waiting) == 50
    assert len(_holding(small)) == 30
    assert len({j.id for j in small.jobs}) == len(small.jobs)


def test_running_stops_when_the_cluster_is_full(large: Snapshot) -> None:
    holding = _holding(large)
    assert len(holding) < 3000
    assert sum(j.total_gpus for j in holding) == sum(n.gpus for n in large.nodes)


def test_topology_and_flavors(large: Snapshot) -> None:
    assert [n.flavor for n in large.nodes] == ["h100"] * 192 + ["a100"] * 64
    assert large.nodes[0].block == "blk000" and large.nodes[-1].block == "blk007"
    assert Counter(n.block for n in large.nodes) == {f"blk{i:03d}": 32 for i in range(8)}


def test_the_mix_is_mixed(large: Snapshot) -> None:
    holding = _holding(large)
    waiting = [j for j in large.jobs if j.state.waiting]
    assert {1, 2, 3, 4} <= {j.tier for j in holding}
    assert {1, 2, 3, 4} <= {j.tier for j in waiting}
    assert {1, 2, 4, 8} <= {j.gpus for j in holding}
    assert any(j.state is JobState.PREEMPTING and j.attempt and j.attempt.kill_at for j in holding)
    assert any(j.attempt and j.attempt.sigterm_save_s for j in holding)
    assert any(j.attempt and NOW - j.attempt.started_at < 45 * 60 for j in holding)
    assert {"any", "pack", "block"} <= {j.placement for j in waiting}
    assert any(j.state is JobState.AWAITING_APPROVAL for j in waiting)
    assert any(j.time_limit for j in waiting)
    assert all(j.submit < NOW for j in large.jobs)


def test_queue_tree_and_ledger(small: Snapshot) -> None:
    policy = small.policy
    leaves = policy.leaves()
    assert len(leaves) == 32
    assert policy.queues.name == "cluster" and len(policy.queues.children) == 4
    assert sum(q.nominal["gpu"] for q in leaves) == 160
    assert sum(q.nominal["gpu"] for q in policy.queues.children) == 160
    assert {q.weight for q in policy.queues.children} <= {1, 2, 3}
    names = {q.name for q in leaves}
    assert {j.queue for j in small.jobs} <= names
    assert small.ledger.at == NOW and small.ledger.usage
    assert set(small.ledger.usage) <= names


def test_running_jobs_keep_within_quota_limits(large: Snapshot) -> None:
    """Charged running jobs stay within nominal + borrowing limit on their leaf and department."""
    policy = large.policy
    used: Counter[str] = Counter()
    for job in _holding(large):
        if policy.tier(job.tier).charged:
            for q in policy.path_to(job.queue)[1:]:
                used[q] += job.total_gpus
    for name, gpus in used.items():
        spec = policy.find_queue(name)
        assert spec is not None
        if spec.borrowing_limit and "gpu" in spec.borrowing_limit:
            assert gpus <= spec.nominal["gpu"] + spec.borrowing_limit["gpu"], name


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        synthetic_snapshot(0, 8, 1, 1, seed=0)


# -- the measurement -----------------------------------------------------------------------------


def test_run_engine_bench_reports_the_documented_keys() -> None:
    out = run_engine_bench(*SMALL, seed=0, repeat=2)
    assert set(out) >= DOCUMENTED_KEYS
    assert (out["nodes"], out["gpus_per_node"], out["gpus"], out["pending"]) == (20, 8, 160, 50)
    assert out["running_placed"] == 30 and out["seed"] == 0 and out["repeat"] == 2
    assert len(out["pass_ms_all"]) == 2
    assert 0 < out["pass_ms_min"] <= out["pass_ms_median"] <= max(out["pass_ms_all"])
    assert 0 <= out["admissions"] <= 50 and out["preemptions"] >= 0
    assert 0 <= out["explanations"] <= 50
    assert out["admissions_per_s"] >= 0
    assert out["deterministic"] is True
    assert out["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    json.dumps(out)


def test_repeat_must_be_positive() -> None:
    with pytest.raises(ValueError):
        run_engine_bench(*SMALL, repeat=0)


def _check_cli_output(text: str) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert isinstance(out, dict) and set(out) >= DOCUMENTED_KEYS
    assert out["nodes"] == 20 and out["repeat"] == 1 and out["pending"] == 50


def test_cli_json() -> None:
    result = CliRunner().invoke(app, CLI_ARGS)
    assert result.exit_code == 0, result.output
    _check_cli_output(result.stdout)


def test_cli_table() -> None:
    result = CliRunner().invoke(app, [*CLI_ARGS[:-3], "--repeat", "1"])
    assert result.exit_code == 0, result.output
    assert "pass median" in result.stdout


def test_cli_as_a_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *CLI_ARGS], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    _check_cli_output(proc.stdout)
