"""`warden sim run|compare|sensitivity`: JSON and tables, reports, and one clear error for every
bad input."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from warden.cli.main import app
from warden.sim.experiment import kendall_tau_distance, nudge
from warden.sim.metrics import TABLE_COLUMNS, TABLE_NAMES, format_span, table_cells
from warden.sim.presets import build_preset

runner = CliRunner()

REQUIRED = {
    "jobs",
    "avg_jct_s",
    "avg_wait_s",
    "p50_wait_s",
    "p95_wait_s",
    "makespan_s",
    "utilization",
    "goodput",
    "preemptions",
    "preemptions_per_hour",
    "lost_gpu_hours",
    "lost_work_per_preemption_s",
    "max_wait_least_served_queue_s",
    "starvation_breaches",
    "eta_p5",
    "eta_p50",
    "per_queue",
    "per_tier",
    "wall_s",
}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """A busy little trace: two teams, four tiers, gangs, jobs that checkpoint and jobs that do not."""
    rng = random.Random(3)
    lines = [
        "job_id,submit,num_gpus,duration,queue,tier,replicas,checkpoint_interval,checkpoint_seconds,"
        "startup_seconds,resumable,lease"
    ]
    for i in range(120):
        gpus = rng.choice([1, 2, 4, 8, 16])
        replicas = 2 if gpus == 16 else 1
        lines.append(
            f"j{i},{i * 90 + rng.randint(0, 60)},{gpus},{rng.randint(300, 20000)},{rng.choice('ab')},"
            f"{rng.choice([1, 2, 3, 3, 4])},{replicas},{rng.choice([600, 1800])},{rng.choice([10, 60])},"
            f"30,{rng.choice(['true', 'false'])},0"
        )
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def sim(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["sim", *args])
    return result.exit_code, result.stdout, result.stderr


def test_run_prints_every_metric_as_json(trace: Path) -> None:
    code, out, _ = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", "governed", "--json")
    assert code == 0
    data = json.loads(out)
    assert data.keys() >= REQUIRED
    # The 8 tier-1 gangs of 16 GPUs exceed a team's nominal 8: never admitted (tier 1 never
    # borrows), so left out.
    assert data["jobs"] == 112 and data["skipped"] == {"beyond_nominal": 8} and data["policy"] == "governed"
    assert 0 < data["utilization"] <= 1
    assert set(data["per_queue"]) == {"a", "b"}
    assert {"owed_gpu_hours", "delivered_gpu_hours"} <= data["per_queue"]["a"].keys()


def test_run_prints_a_table_by_default(trace: Path) -> None:
    code, out, _ = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", "fifo_backfill")
    assert code == 0
    assert "fifo_backfill" in out and "p95" in out


def test_compare_gives_one_object_a_policy_on_the_same_trace(trace: Path, tmp_path: Path) -> None:
    report = tmp_path / "report"
    code, out, _ = sim(
        "compare",
        "--trace",
        str(trace),
        "--gpus",
        "16",
        "--json",
        "--report",
        str(report),
        "--policies",
        "governed,fifo_strict,fifo_backfill,slurm,kueue,k8s",
    )
    assert code == 0, out
    rows = json.loads(out)
    assert [r["policy"] for r in rows] == ["governed", "fifo_strict", "fifo_backfill", "slurm", "kueue", "k8s"]
    assert {r["jobs"] + sum(r["skipped"].values()) for r in rows} == {120}  # beyond_nominal: tier 1
    by = {r["policy"]: r for r in rows}
    # Backfill never waits longer on average than strict FIFO on the same trace.
    assert by["fifo_backfill"]["avg_wait_s"] <= by["fifo_strict"]["avg_wait_s"]
    assert by["fifo_strict"]["preemptions"] == 0 and by["slurm"]["preemptions"] > 0
    assert (report / "index.html").exists()
    assert json.loads((report / "summary.json").read_text()) == rows


def _cells(line: str) -> list[str]:
    bar = "┃" if "┃" in line else "│"
    return [c.strip() for c in line.strip()[1:-1].split(bar)]


def test_compare_at_80_columns_turns_the_table_on_its_side_with_every_value_whole(trace: Path) -> None:
    args = ("compare", "--trace", str(trace), "--gpus", "16", "--limit", "40")
    code, out, _ = sim(*args, "--json")
    assert code == 0, out
    expected = {r["policy"]: dict(zip((k for _, k, _ in TABLE_COLUMNS), table_cells(r))) for r in json.loads(out)}
    done = runner.invoke(app, ["sim", *args], env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in done.stdout, done.stdout
    seen = {}
    name_of = {TABLE_NAMES[k]: k for _, k, _ in TABLE_COLUMNS if k in TABLE_NAMES}
    for line in lines:
        if line.startswith("┃ metric"):
            policies = _cells(line)[1:]
        elif line.startswith("│"):
            name, *values = _cells(line)
            for policy, value in zip(policies, values):
                seen[policy, name_of[name]] = value
    assert seen == {(p, k): cells[k] for p, cells in expected.items() for k in name_of.values()}
    # A pipe with no width: the table as it was, one row a policy, every column whole.
    piped = runner.invoke(app, ["sim", *args], env={"COLUMNS": None})
    assert piped.exit_code == 0
    for policy, cells in expected.items():
        row = next(line for line in piped.stdout.splitlines() if line.startswith(f"│ {policy} "))
        assert _cells(row) == list(cells.values())


def test_a_policy_file_runs_when_it_names_the_trace_queues(trace: Path, tmp_path: Path) -> None:
    policy = tmp_path / "teams.yaml"
    policy.write_text(
        "queues:\n  name: org\n  nominal: {gpu: 16}\n  children:\n"
        "    - {name: a, nominal: {gpu: 12}}\n    - {name: b, nominal: {gpu: 4}}\n"
    )
    code, out, _ = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", str(policy), "--json")
    assert code == 0, out
    assert json.loads(out)["policy"] == "teams"
    assert json.loads(out)["policy_warnings"] == []
    policy.write_text(
        "queues:\n  name: org\n  children:\n    - {name: a, nominal: {gpu: 48}}\n    - {name: b, nominal: {gpu: 16}}\n"
    )
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", str(policy), "--json")
    assert code == 0, out
    (warning,) = json.loads(out)["policy_warnings"]
    assert "add up to 64 but the cluster has 16" in warning and warning in err.replace("\n", " ")
    policy.write_text(
        "queues:\n  name: org\n  children:\n    - {name: a, nominal: {gpu: 8}}\n    - {name: b, nominal: {gpu: 4}}\n"
    )
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", str(policy), "--json")
    assert code == 0, out
    (warning,) = json.loads(out)["policy_warnings"]
    assert warning.startswith("4 of the cluster's 16 GPUs are covered by no queue's nominal quota")
    assert warning in err.replace("\n", " ")
    policy.write_text("queues:\n  name: org\n  children:\n    - {name: a}\n")
    code, _, err = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", str(policy))
    assert code == 2 and "queues" in err and "'b'" in err


@pytest.mark.parametrize(
    "args, words",
    [
        (["--policy", "slurmm"], ["policy", "slurmm", "fifo_backfill"]),
        (["--format", "csvv"], ["--format", "csvv"]),
        (["--limit", "0"], ["--limit", "0"]),
    ],
)
def test_bad_options_are_refused_by_name(trace: Path, args: list[str], words: list[str]) -> None:
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "16", *args)
    assert code == 2 and out == ""
    for w in words:
        assert w in err
    assert "Traceback" not in err


def test_a_cluster_is_required_once(trace: Path, tmp_path: Path) -> None:
    code, _, err = sim("run", "--trace", str(trace))
    assert code == 2 and "--gpus" in err and "--cluster" in err
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: a, count: 2, gpus: -8}\n")
    code, _, err = sim("run", "--trace", str(trace), "--cluster", str(cluster))
    assert code == 2 and "nodes.0.gpus" in err and "-8" in err


def test_a_malformed_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("job_id,submit,num_gpus,duration\na,0,1,10\nb,5,two,10\n")
    code, _, err = sim("run", "--trace", str(path), "--gpus", "4")
    assert code == 2 and "line 3" in err and "num_gpus" in err and "two" in err
    code, out, _ = sim("run", "--trace", str(path), "--gpus", "4", "--skip-invalid", "--json")
    assert code == 0 and json.loads(out)["jobs"] == 1


def test_a_job_larger_than_the_cluster_is_reported_as_skipped(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_text("job_id,submit,num_gpus,duration\na,0,1,10\nb,5,64,10\n")
    code, out, _ = sim("run", "--trace", str(path), "--gpus", "8", "--json")
    assert code == 0 and json.loads(out)["skipped"] == {"larger_than_cluster": 1}


def test_compare_refuses_a_policy_named_twice(trace: Path) -> None:
    code, _, err = sim("compare", "--trace", str(trace), "--gpus", "16", "--policies", "slurm,kueue,slurm")
    assert code == 2 and "slurm" in err


# ------------------------------------------------------------------------------ sensitivity


def test_sensitivity_reports_how_far_the_order_moved(trace: Path) -> None:
    code, out, _ = sim(
        "sensitivity",
        "--trace",
        str(trace),
        "--gpus",
        "16",
        "--policy",
        "governed",
        "--param",
        "fair_share.half_life",
        "--delta",
        "-50%",
        "--json",
    )
    assert code == 0, out
    data = json.loads(out)
    assert data["value"] == 7 * 86400 and data["moved_value"] == 3.5 * 86400
    assert 0.0 <= data["kendall_tau_distance"] <= 1.0
    assert data["base"].keys() == data["moved"].keys()
    # A move that cannot matter leaves the order exactly as it was.
    code, out, _ = sim(
        "sensitivity",
        "--trace",
        str(trace),
        "--gpus",
        "16",
        "--policy",
        "fifo_backfill",
        "--param",
        "fair_share.half_life",
        "--delta",
        "1h",
        "--json",
    )
    assert code == 0 and json.loads(out)["kendall_tau_distance"] == 0.0
    args = ["sensitivity", "--trace", str(trace), "--gpus", "16", "--param", "tiers.3.lease", "--delta", "10m"]
    data = json.loads(sim(*args, "--limit", "40", "--json")[1])
    done = runner.invoke(app, ["sim", *args, "--limit", "40"], env={"COLUMNS": "80"})
    assert done.exit_code == 0 and "…" not in done.stdout
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    rows = {_cells(line)[0]: _cells(line)[1:] for line in done.stdout.splitlines() if line.startswith("│")}
    assert list(rows) == [TABLE_NAMES[key] for key in data["base"]]  # as `sim run` names them
    # Durations in the short form, as `sim run` writes them; no scientific notation anywhere.
    assert done.stdout.splitlines()[0].startswith("governed: tiers.3.lease 45m → 55m (")
    assert rows["average wait"][0] == format_span(data["base"]["avg_wait_s"])
    assert not re.search(r"\de[+-]\d", done.stdout), done.stdout


@pytest.mark.parametrize(
    "param, delta, words",
    [
        ("fair_share.nope", "1", ["fair_share.nope", "nope"]),
        ("scheduling.order", "1", ["scheduling.order", "not a number"]),
        ("tiers.3.lease", "soon", ["delta", "soon"]),
        ("thrash.min_efficiency", "+5", ["min_efficiency"]),
    ],
)
def test_sensitivity_refuses_a_bad_parameter(trace: Path, param: str, delta: str, words: list[str]) -> None:
    code, _, err = sim("sensitivity", "--trace", str(trace), "--gpus", "16", "--param", param, "--delta", delta)
    assert code == 2
    for w in words:
        assert w in err


def test_nudge_moves_durations_percentages_tiers_and_queues() -> None:
    sp = build_preset("governed", {"a": 8, "b": 8}, 16)
    assert nudge(sp, "tiers.3.lease", "15m").policy.tier(3).lease == 45 * 60 + 15 * 60
    assert nudge(sp, "thrash.min_efficiency", "-10%").policy.thrash.min_efficiency == pytest.approx(0.81)
    assert nudge(sp, "queues.a.weight", "2").policy.find_queue("a").weight == 10
    assert nudge(sp, "scheduling.reservations", "1").policy.scheduling.reservations == 2


def test_kendall_tau_distance_counts_discordant_pairs() -> None:
    rng = random.Random(0)
    for n in (0, 1, 2, 5, 30):
        a = [f"j{i}" for i in range(n)]
        for _ in range(20):
            b = a[:]
            rng.shuffle(b)
            pos = {x: i for i, x in enumerate(b)}
            discordant = sum(1 for i in range(n) for j in range(i + 1, n) if pos[a[i]] > pos[a[j]])
            expected = discordant / (n * (n - 1) / 2) if n > 1 else 0.0
            assert kendall_tau_distance(a, b) == pytest.approx(expected)
    assert kendall_tau_distance(["a", "b", "c"], ["c", "b", "a"]) == 1.0
    with pytest.raises(ValueError):
        kendall_tau_distance(["a"], ["b"])


def test_the_installed_command_runs_a_simulation(trace: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "warden.cli.main",
            "sim",
            "run",
            "--trace",
            str(trace),
            "--gpus",
            "16",
            "--policy",
            "kueue",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["policy"] == "kueue"


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ESTIMATE = re.compile(r"(<10s|~[0-9dhms]+) left")


def sim_on_a_terminal(*args: str) -> subprocess.CompletedProcess[str]:
    """`warden sim …` in its own process, its stderr taken for an 80-column terminal."""
    env = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "sim", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_compare_shows_one_estimate_of_the_time_left_for_all_policies_on_stderr(trace: Path) -> None:
    done = sim_on_a_terminal("compare", "--trace", str(trace), "--gpus", "16", "--policies", "governed,kueue")
    assert done.returncode == 0, done.stderr
    shown = ANSI.sub("", done.stderr)
    # 8 of the 120 are tier-1 gangs of 16 GPUs, beyond a team's nominal 8: never admitted (a
    # tier that is not preemptible never borrows), they are skipped (`beyond_nominal`).
    assert "governed (1/2)" in shown and "kueue (2/2)" in shown and "112/112 jobs done" in shown
    assert ESTIMATE.search(shown), shown
    table = ANSI.sub("", done.stdout)
    assert table.startswith("┏") and "left" not in table and "jobs done" not in table


def test_sensitivity_counts_its_two_runs(trace: Path) -> None:
    done = sim_on_a_terminal(
        "sensitivity", "--trace", str(trace), "--gpus", "16", "--param", "tiers.3.lease", "--delta", "10%"
    )
    assert done.returncode == 0, done.stderr
    shown = ANSI.sub("", done.stderr)
    assert "governed as written (1/2)" in shown and "governed with tiers.3.lease 10% (2/2)" in shown
    assert ESTIMATE.search(shown), shown


def test_json_output_on_a_terminal_stays_one_document_without_progress(trace: Path) -> None:
    done = sim_on_a_terminal("compare", "--trace", str(trace), "--gpus", "16", "--policies", "governed,kueue", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["policy"] for r in json.loads(done.stdout)] == ["governed", "kueue"]
    assert "jobs done" not in done.stderr and "left" not in done.stderr
