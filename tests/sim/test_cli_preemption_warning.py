"""`warden sim`: preemptions per admitted job in the JSON and the table, a warning naming the
most-preempted job past `--max-preemptions-per-job`, and exit 3 when a loop guard stops a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from warden.cli.main import app
from warden.sim import experiment
from warden.sim.simulator import SimulationLoopError

runner = CliRunner()


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """One long tier-3 job that does not save on SIGTERM, and a tier-2 job every 1000 s that
    needs the whole pool for 10 s: under `slurm` the long job is preempted by each of them.
    (Tier 2: the thrash guard's budget holds back tiers 2–4, never tier 1.)"""
    lines = ["job_id,submit,num_gpus,duration,tier,resumable,lease", "long,0,8,20000,3,false,0"]
    lines += [f"hi{k},{1000 * (k + 1)},8,10,2,false,0" for k in range(4)]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def sim(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["sim", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_json_has_preemptions_per_job_and_no_warning_under_the_limit(trace: Path) -> None:
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "8", "--policy", "slurm", "--json")
    assert code == 0 and "warning" not in err
    data = json.loads(out)
    assert data["preemptions"] == 4
    assert data["preemptions_per_job"] == {
        "mean": 0.8,
        "p95": 3.2,
        "max": 4,
        "worst_job": "long",
        "admitted_jobs": 5,
        "limit": 10,
        "over_limit": 0,
    }
    assert data["preemption_warning"] is None


def test_a_job_over_the_limit_is_named_in_a_warning(trace: Path) -> None:
    code, out, err = sim(
        "compare",
        "--trace",
        str(trace),
        "--gpus",
        "8",
        "--policies",
        "slurm,fifo_backfill",
        "--max-preemptions-per-job",
        "3",
    )
    assert code == 0
    assert "warning: slurm: job long was preempted 4 times, more than the limit of 3" in " ".join(err.split())
    assert "fifo_backfill:" not in err  # it never preempts
    assert "0.8 / 3.2 / 4!" in out  # the table's column, flagged


def test_the_limit_must_be_positive(trace: Path) -> None:
    code, _, err = sim("run", "--trace", str(trace), "--gpus", "8", "--max-preemptions-per-job", "0")
    assert code == 2 and "--max-preemptions-per-job" in err


def test_a_run_stopped_by_a_loop_guard_exits_3_naming_the_jobs(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def spin(*args: object, **kw: object) -> None:
        raise SimulationLoopError("65 scheduling passes at t=10s, more than max_passes_per_instant=64: job x …")

    monkeypatch.setattr("warden.cli.sim.run_policy", spin)
    assert experiment.run_policy is not spin
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "8", "--policy", "kueue")
    assert code == 3 and out == ""
    assert "kueue: the simulation stopped: 65 scheduling passes at t=10s" in " ".join(err.split())


def test_jobs_in_a_preemption_cycle_are_counted_against_one_budget_for_every_policy(trace: Path) -> None:
    """Under `slurm` (no thrash guard) the long job is preempted 4 times within 24 h, more than
    DESIGN's budget of 3: one job over budget. The governed policy's guard stops at 3."""
    code, out, _ = sim("compare", "--trace", str(trace), "--gpus", "8", "--policies", "slurm,governed", "--json")
    assert code == 0
    slurm, governed = json.loads(out)
    assert slurm["preemption_cycles"] == {
        "alternating": 0,
        "over_budget": 1,
        "jobs": 1,
        "budget": {"count": 3, "per_s": 86400.0},
    }
    assert governed["preemptions"] <= 3 and governed["preemption_cycles"]["jobs"] == 0
    code, out, _ = sim("compare", "--trace", str(trace), "--gpus", "8", "--policies", "slurm,governed")
    assert code == 0 and "cycles" in out
    rows = [line for line in out.splitlines() if line.lstrip("│ ").startswith(("slurm", "governed"))]
    assert len(rows) == 2 and "1 / 0" in rows[0] and "0 / 0" in rows[1]
