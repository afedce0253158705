"""`warden sim … --queue-map FILE`: a trace's queues onto a policy's own leaf queues, so that a
two-team policy runs on a trace of many queues; every bad map refused with one message naming
the file and what is wrong, before anything runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from warden.cli.main import app

runner = CliRunner()

REPO = Path(__file__).resolve().parents[2]
TEAMS = """\
queues:
  name: org
  children:
    - {name: vision, nominal: {gpu: 10}}
    - {name: language, nominal: {gpu: 6}}
"""


def sim(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["sim", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Four queues, named as a hashing trace names them (`012` would be a number to YAML)."""
    queues = ["6214e9", "012", "0e4a51", "b436b2"]
    lines = ["job_id,submit,num_gpus,duration,queue,tier"]
    for i in range(40):
        lines.append(f"j{i},{i * 60},{1 + i % 4},{600 + 37 * i},{queues[i % 4]},{3 + i % 2}")
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def write(tmp_path: Path, text: str, name: str = "map.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def teams(tmp_path: Path) -> Path:
    return write(tmp_path, TEAMS, "teams.yaml")


def test_every_policy_of_a_comparison_runs_the_trace_in_the_maps_leaves(
    trace: Path, teams: Path, tmp_path: Path
) -> None:
    qmap = write(tmp_path, '6214e9: vision\n012: vision\n"*": language\n')
    code, out, err = sim(
        "compare", "--trace", str(trace), "--gpus", "16", "--policies", f"governed,slurm,{teams}",
        "--queue-map", str(qmap), "--json",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)
    assert [r["policy"] for r in rows] == ["governed", "slurm", "teams"]
    rule = f"queues: the trace's 4 queues onto 2 leaf queues by {qmap}, 2 of them by its '*' entry."
    for r in rows:
        assert set(r["per_queue"]) == {"vision", "language"} and r["jobs"] == 40 and r["finished"] == 40
        assert rule in r["rules"]
    # The map renames queues and nothing else: the same jobs, and under FIFO the same waits.
    code, out, _ = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", "fifo_strict", "--json")
    plain = json.loads(out)
    code, out, _ = sim(
        "run", "--trace", str(trace), "--gpus", "16", "--policy", "fifo_strict", "--queue-map", str(qmap), "--json"
    )
    mapped = json.loads(out)
    assert code == 0 and set(plain["per_queue"]) == {"6214e9", "012", "0e4a51", "b436b2"}
    assert (mapped["jobs"], mapped["avg_wait_s"], mapped["p95_wait_s"]) == (
        plain["jobs"],
        plain["avg_wait_s"],
        plain["p95_wait_s"],
    )


def test_sensitivity_takes_a_queue_map_too(trace: Path, teams: Path, tmp_path: Path) -> None:
    qmap = write(tmp_path, '"*": language\n')
    code, out, err = sim(
        "sensitivity", "--trace", str(trace), "--gpus", "16", "--policy", str(teams), "--queue-map", str(qmap),
        "--param", "tiers.3.lease", "--delta", "5m", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["jobs"] == 40


def test_without_a_map_a_policy_file_missing_the_trace_queues_points_at_it(trace: Path, teams: Path) -> None:
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "16", "--policy", str(teams))
    assert code == 2 and out == ""
    assert "'012, 0e4a51, 6214e9, b436b2'" in err and "--queue-map" in err


@pytest.mark.parametrize(
    "text, words",
    [
        ('6214e9: visoin\n"*": langauge\n', ["'langauge', 'visoin' are not leaf queues of", "language, vision"]),
        ('6214e9: vision\n"*": visoin\n', ["'visoin' is not a leaf queue of", "teams.yaml"]),
        ("6214e9: vision\n012: language\n", ["2 of the trace's 4 queues are not in the map", "'0e4a51', 'b436b2'"]),
        ("- 6214e9\n- 012\n", ["must map trace queues to leaf queues", "got list"]),
        ("", ["must map trace queues to leaf queues", "got nothing"]),
        ('6214e9: "vi sion"\n', ["the entry for '6214e9'", "not a valid queue name", "'vi sion'"]),
        ("6214e9: [vision, language]\n", ["the entry for '6214e9' must be one leaf queue's name"]),
        ("6214e9: vision\n  oops: [\n", ["YAML syntax error"]),
        ("6214e9: &q vision\n012: *q\n", ["YAML aliases (*q) are not accepted (line 2, column 6)"]),
        ("6214e9: vision\n6214e9: language\n", ["duplicate key '6214e9': given twice (line 2, column 1)"]),
    ],
)
def test_a_bad_map_is_refused_by_name_before_anything_runs(
    trace: Path, teams: Path, tmp_path: Path, text: str, words: list[str]
) -> None:
    qmap = write(tmp_path, text)
    report = tmp_path / "report"
    code, out, err = sim(
        "compare", "--trace", str(trace), "--gpus", "16", "--policies", f"governed,{teams}",
        "--queue-map", str(qmap), "--report", str(report),
    )  # fmt: skip
    flat = " ".join(err.split())
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"--queue-map {qmap}:" in flat
    for w in words:
        assert w in flat, flat
    assert not report.exists()


def test_a_missing_map_is_refused_by_name(trace: Path, tmp_path: Path) -> None:
    code, out, err = sim("run", "--trace", str(trace), "--gpus", "16", "--queue-map", str(tmp_path / "nope.yaml"))
    assert code == 2 and out == ""
    assert f"--queue-map {tmp_path / 'nope.yaml'}: No such file or directory" in " ".join(err.split())


def philly() -> Path:
    traces = Path(os.environ.get("WARDEN_TRACES") or REPO.parent / "shared" / "traces")
    path = traces / "philly" / "pollux_philly.csv"
    if not path.is_file():
        pytest.skip(f"the Philly trace {path} is absent (set WARDEN_TRACES to the shared/traces folder)")
    return path


def test_the_two_team_example_runs_on_philly() -> None:
    """examples/two-teams.yaml names two teams; examples/philly-two-teams.yaml takes the
    trace's many virtual clusters into them with one named line and `"*"`."""
    code, out, err = sim(
        "run", "--trace", str(philly()), "--gpus", "600", "--limit", "1000",
        "--policy", str(REPO / "examples" / "two-teams.yaml"),
        "--queue-map", str(REPO / "examples" / "philly-two-teams.yaml"), "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["policy"] == "two-teams" and set(data["per_queue"]) == {"vision", "language"}
    (rule,) = [r for r in data["rules"] if "--queue-map" in r or "onto 2 leaf queues" in r]
    assert "queues onto 2 leaf queues by" in rule and "by its '*' entry" in rule
