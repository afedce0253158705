"""The bundled demo: the README's main command shows a preemption and pending reasons."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from warden.cli.main import app


def test_demo_json_shows_least_cost_victims_and_reasons() -> None:
    result = CliRunner().invoke(app, ["demo", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    by_victim = {p["id"]: p for p in plan["preemptions"]}
    # The tier-1 service takes the job that saves on SIGTERM within its grace: nothing is lost.
    assert by_victim["lang-eval"]["for_job"] == "plat-serve-2"
    assert by_victim["lang-eval"]["lost_work_gpu_s"] == 0.0
    # The gang takes a whole rack's worth and no more: its claim does not double-count quota.
    assert {p["id"] for p in plan["preemptions"] if p["for_job"] == "plat-gang"} == {"plat-batch", "vis-scavenge"}
    reasons = {p["id"]: p["reason"]["code"] for p in plan["pending"]}
    assert reasons == {
        "plat-serve-2": "WaitingForGrace",
        "lang-pretrain-big": "AwaitingApproval",
        "plat-gang": "WaitingForGrace",
        "vis-hparam": "QuotaExceeded",
    }
    assert [p["position"] for p in plan["pending"]] == sorted(p["position"] for p in plan["pending"])


def test_demo_table_runs_as_a_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "demo"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "Preemptions" in out and "WaitingForGrace" in out and "AwaitingApproval" in out
    # Durations read as everywhere else in warden: the victims' 120 s grace is "2m".
    rows = [line.split() for line in out.splitlines() if line.startswith(("lang-eval ", "plat-batch "))]
    assert rows and all(row[5] == "2m" for row in rows), rows


def test_demo_fits_80_columns_with_every_victim_and_explanation_whole() -> None:
    plan = json.loads(CliRunner().invoke(app, ["demo", "--json"]).output)
    result = CliRunner().invoke(app, ["demo"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in result.output, result.output
    for p in plan["preemptions"]:
        row = next(line for line in lines if line.startswith(p["id"] + " "))
        assert p["for_job"] in row and f"{p['lost_work_gpu_s'] / 60:.0f}" in row.split()
    whole = CliRunner().invoke(app, ["demo"], env={"COLUMNS": None}).output  # a pipe: one line a job
    flat = " ".join(result.output.split())
    for p in plan["pending"]:
        row = next(line for line in whole.splitlines() if f" {p['id']} " in line and p["reason"]["code"] in line)
        explanation = row.split(p["reason"]["code"], 1)[1].strip()
        assert explanation.startswith(p["reason"]["message"][:10]) and f"{p['reason']['code']} {explanation}" in flat
