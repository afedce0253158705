"""`warden policy check|show|schema`: exit codes, the summary, every error, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import warden
from warden.cli.main import app
from warden.engine.policy import PolicyError, load_policy, parse_policy

DEMO = Path(warden.__file__).parent / "demo" / "policy.yaml"
REPO = Path(warden.__file__).parent.parent

runner = CliRunner()

# Four problems of different kinds; all of them must be printed.
BAD = """\
min_grace: 120s
tiers:
  3: {grace: 60s}
  5: {name: extra}
thrash: {min_efficiency: 2}
queues:
  name: cluster
  children:
    - {name: a, nominal: {tpu: 4}}
"""


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    return path


def test_check_valid_file_prints_a_summary() -> None:
    result = runner.invoke(app, ["policy", "check", str(DEMO)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "valid policy" in out
    for name in ("production-inference", "pretraining", "experimentation", "opportunistic"):
        assert name in out
    assert "cluster" in out and "language" in out
    assert "nominal gpu 96" in out  # the root's resolved quota
    assert "borrowing gpu 64" in out  # research
    assert "lending gpu 16" in out  # platform
    for key, value in (
        ("min_grace", "2m"),
        ("max_lease", "8h"),
        ("half_life", "7d"),
        ("min_efficiency", "0.9"),
        ("max_preemptions", "3 per 1d"),
    ):
        line = next(line for line in out.splitlines() if line.startswith(key))
        assert value in line
    assert result.stderr == ""


def test_check_invalid_file_prints_every_issue_and_exits_2(bad_file: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(bad_file)
    result = runner.invoke(app, ["policy", "check", str(bad_file)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines == [f"{bad_file}: {issue}" for issue in info.value.issues]
    paths = {"tiers.3.grace", "tiers.5", "thrash.min_efficiency", "queues.children[0].nominal.tpu"}
    assert {i.path for i in info.value.issues} == paths
    assert f"{bad_file}: tiers.3.grace: grace 60s is below min_grace 120s (got '60s')" in lines
    assert result.stdout == ""
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["check", "show"])
def test_missing_file_exits_2_without_a_traceback(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "missing.yaml"
    result = runner.invoke(app, ["policy", command, str(missing)])
    assert result.exit_code == 2
    assert str(missing) in result.stderr and "no such file" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def test_yaml_syntax_error_exits_2_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("tiers:\n  1: {name: x\n  2: y\n")
    result = runner.invoke(app, ["policy", "check", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"{path}: <file>: YAML syntax error at line 3")


def test_an_alias_bomb_exits_2_naming_the_alias_at_once(tmp_path: Path) -> None:
    """Twelve levels of aliases, each repeating the one below four times: refused at the
    first alias, before anything is expanded."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}, *l{i - 1}]" for i in range(1, 12)]
    lines.append("queues: {name: cluster, children: [{name: team, quota: *l11}]}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["policy", "check", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"{path}: <file>: YAML aliases (*l0) are not accepted (line 2, column 10)")
    assert "Traceback" not in result.output


def test_show_json_is_one_object_with_defaults_filled(tmp_path: Path) -> None:
    path = tmp_path / "minimal.yaml"
    path.write_text("tiers: {3: {lease: 30m}}\n")
    result = runner.invoke(app, ["policy", "show", "--json", str(path)])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["tiers"]["3"] == {
        "name": "experimentation",
        "preemptible": True,
        "lease": "30m",
        "grace": "2m",
        "requires_approval": False,
        "scope": "quota",
        "charged": True,
        "time_limit": None,
        "max_time_limit": None,
    }
    assert shown["tiers"]["1"]["name"] == "production-inference"
    assert shown["min_grace"] == "2m" and shown["max_lease"] == "8h"
    assert shown["preemption"] == {
        "restart_overhead": "1m",
        "checkpoint_overhead": "30s",
        "max_attempts_per_pass": 16,
        "victim_order": "cost",
        "only_if_it_pays": True,
        "protect_before_time_limit": "0s",
        "reclaim": {
            "nominal": "any",
            "fair_share": "final",
            "fair_share_margin": 1.5,
            "starvation_shield": "max_lease",
        },
    }
    assert shown["queues"]["name"] == "cluster"
    assert [c["name"] for c in shown["queues"]["children"]] == ["default"]


def test_show_json_of_the_demo_resolves_inner_quotas() -> None:
    result = runner.invoke(app, ["policy", "show", str(DEMO), "--json"])
    assert result.exit_code == 0
    shown = json.loads(result.stdout)
    assert shown["queues"]["nominal"] == {"gpu": 96}
    assert parse_policy(shown) == load_policy(DEMO)


def test_show_yaml_reads_back_as_the_same_policy() -> None:
    result = runner.invoke(app, ["policy", "show", str(DEMO)])
    assert result.exit_code == 0
    assert parse_policy(result.stdout) == load_policy(DEMO)
    assert list(yaml.safe_load(result.stdout)["tiers"]) == [1, 2, 3, 4]


def test_show_invalid_file_exits_2(bad_file: Path) -> None:
    result = runner.invoke(app, ["policy", "show", "--json", str(bad_file)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 4


def test_schema_prints_the_json_schema() -> None:
    result = runner.invoke(app, ["policy", "schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert set(schema["properties"]) >= {"tiers", "min_grace", "queues", "fair_share"}
    assert "QueueSpec" in schema["$defs"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_real_process_checks_the_demo_file(tmp_path: Path, bad_file: Path) -> None:
    ok = _cli("policy", "check", str(DEMO), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "valid policy" in ok.stdout and "production-inference" in ok.stdout
    assert ok.stderr == ""

    bad = _cli("policy", "check", str(bad_file), cwd=tmp_path)
    assert bad.returncode == 2
    assert len(bad.stderr.splitlines()) == 4 and "Traceback" not in bad.stderr


OVER = (
    "queues:\n  name: cluster\n  children:\n    - {name: a, nominal: {gpu: 12}}\n    - {name: b, nominal: {gpu: 12}}\n"
)


def test_check_against_a_cluster_warns_when_the_quotas_exceed_it(tmp_path: Path) -> None:
    path = tmp_path / "over.yaml"
    path.write_text(OVER)
    result = runner.invoke(app, ["policy", "check", str(path), "--gpus", "16"])
    assert result.exit_code == 0, result.output
    assert "valid policy" in result.stdout
    assert "add up to 24 but the cluster has 16" in result.stderr and "× 0.667" in result.stderr
    fits = runner.invoke(app, ["policy", "check", str(path), "--gpus", "24"])
    assert fits.exit_code == 0 and "nominal quotas fit the cluster" in fits.stdout and "warning" not in fits.stderr
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {name: n0, gpus: 8, count: 2}\n")
    from_file = runner.invoke(app, ["policy", "check", str(path), "--cluster", str(cluster)])
    assert from_file.exit_code == 0 and "the cluster has 16" in from_file.stderr


def test_check_against_a_cluster_warns_when_the_quotas_cover_less_of_it(tmp_path: Path) -> None:
    """DESIGN §4.2: capacity no queue's nominal covers is reported as quotas beyond it are."""
    path = tmp_path / "over.yaml"
    path.write_text(OVER)
    result = runner.invoke(app, ["policy", "check", str(path), "--gpus", "32"])
    assert result.exit_code == 0, result.output
    assert "8 of the cluster's 32 GPUs are covered by no queue's nominal quota" in result.stderr.replace("\n", " ")
    assert "every queue may borrow them (within its borrowing limit)" in result.stderr.replace("\n", " ")
    assert "nominal quotas fit the cluster" not in result.stdout


@pytest.mark.parametrize(
    "args, words",
    [(["--gpus", "0"], ["--gpus", "0"]), (["--gpus", "8", "--cluster", "c.yaml"], ["--gpus", "--cluster"])],
)
def test_check_refuses_a_bad_cluster_by_name(tmp_path: Path, args: list[str], words: list[str]) -> None:
    path = tmp_path / "over.yaml"
    path.write_text(OVER)
    result = runner.invoke(app, ["policy", "check", str(path), *args])
    assert result.exit_code == 2
    for w in words:
        assert w in result.stderr


def test_check_refuses_a_cluster_file_with_aliases(tmp_path: Path) -> None:
    path = tmp_path / "over.yaml"
    path.write_text(OVER)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("node: &n {name: n0, gpus: 8}\nnodes: [*n]\n")
    result = runner.invoke(app, ["policy", "check", str(path), "--cluster", str(cluster)])
    assert result.exit_code == 2
    assert "YAML aliases (*n) are not accepted" in result.stderr


@pytest.mark.parametrize("text", ["", "# only a comment\n"], ids=["empty", "comments only"])
def test_check_refuses_a_file_without_settings_as_apply_does(tmp_path: Path, text: str) -> None:
    """`policy check` of an empty file says what `policy apply` (and `PUT /v1/policy`) says: in
    force it would reset every setting; `apply` refuses it before asking any server."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    checked = runner.invoke(app, ["policy", "check", str(path)])
    assert checked.exit_code == 2 and checked.output.startswith(f"{path}: holds no settings"), checked.output
    applied = runner.invoke(app, ["policy", "apply", str(path), "--url", "http://127.0.0.1:9", "--token", "t"])
    assert applied.exit_code == 2 and applied.output == checked.output


def test_check_reports_every_problem_of_a_file_at_once(tmp_path: Path) -> None:
    """Duplicate keys come with the validation problems, not one at a time."""
    path = tmp_path / "twice.yaml"
    path.write_text("min_grace: 2m\nmin_grace: 2m\nbogus: 1\ntiers: {3: {grace: 3m, grace: 3m}}\n")
    result = runner.invoke(app, ["policy", "check", str(path)])
    lines = result.output.splitlines()
    assert result.exit_code == 2 and len(lines) == 3, result.output
    assert lines[0].startswith(f"{path}: <file>: duplicate key 'min_grace' at line 2")
    assert lines[1].startswith(f"{path}: <file>: duplicate key 'grace' at line 4")
    assert lines[2].startswith(f"{path}: bogus: unknown field")
