"""`warden history export` and `warden policy diff` refuse bad input before any request: exit
2, one message naming the option (or the policy's path) and the value. At 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from warden.cli.main import app

UNREACHABLE = ["--url", "http://127.0.0.1:9"]
"""No server listens there: a command that got as far as a request would exit 1, not 2."""

POLICY = {"queues": {"name": "cluster", "children": [{"name": "vision"}, {"name": "language"}]}}


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "80")
    return CliRunner()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["history", "export", "--since", "500d"], "--since: '500d' is more than 400 days"),
        (["history", "export", "--since", "soon"], "--since: 'soon'"),
        (["history", "export", "--since", "0s"], "--since: '0s' must be a positive duration"),
        (["history", "export", "--format", "xlsx"], "--format: 'xlsx' is not a trace format"),
        (["history", "export", "--format", "parquet"], "name a file with -o FILE"),
    ],
)
def test_export_refuses_bad_options(runner: CliRunner, args: list[str], named: str) -> None:
    out = runner.invoke(app, [*args, *UNREACHABLE])
    assert out.exit_code == 2, out.output
    assert named in " ".join(out.output.split())


def test_diff_refuses_a_bad_policy_naming_its_path_and_value(runner: CliRunner, tmp_path: Path) -> None:
    bad = yaml.safe_load(yaml.safe_dump(POLICY))
    bad["queues"]["children"][0]["weight"] = -3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = runner.invoke(app, ["policy", "diff", str(path), *UNREACHABLE])
    assert out.exit_code == 2, out.output
    assert "queues.children[0].weight" in out.output and "-3" in out.output


def test_diff_refuses_a_bad_replay_window(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    for window, named in (("0s", "must be a positive duration"), ("401d", "is more than 400 days")):
        out = runner.invoke(app, ["policy", "diff", str(path), "--replay", window, *UNREACHABLE])
        assert out.exit_code == 2, out.output
        assert f"--replay: '{window}' {named}" in " ".join(out.output.split())


def test_an_unreachable_server_exits_1(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    assert runner.invoke(app, ["policy", "diff", str(path), *UNREACHABLE]).exit_code == 1
    assert runner.invoke(app, ["history", "export", *UNREACHABLE]).exit_code == 1
