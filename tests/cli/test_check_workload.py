"""`warden check-workload` on real processes: the example trainer passes, a job that ignores
SIGTERM or does not save fails, each with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "check-workload", *args], capture_output=True, text=True, timeout=120
    )


def verdict(done: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def test_the_example_trainer_honours_the_contract() -> None:
    done = check(
        "--grace",
        "10s",
        "--timeout",
        "60s",
        "--json",
        "--",
        sys.executable,
        str(EXAMPLES / "train_plain.py"),
        "--steps",
        "100000",
        "--step-seconds",
        "0.02",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] and data["resumed_step"] >= data["saved_step"] >= 1
    assert 0 <= data["save_s"] < 10 and data["exit_after_sigterm_s"] < 10
    assert {c["name"] for c in data["checks"]} == {
        "reports progress",
        "exits within the grace",
        "saves a checkpoint on SIGTERM",
        "resumes from the checkpoint",
    }


def test_a_job_that_ignores_sigterm_fails_with_its_reason() -> None:
    done = check(
        "--grace",
        "2s",
        "--timeout",
        "60s",
        "--json",
        "--",
        sys.executable,
        str(EXAMPLES / "ignore_sigterm.py"),
        "--step-seconds",
        "0.05",
    )
    assert done.returncode == 1
    checks = verdict(done)
    assert not checks["exits within the grace"]["ok"] and "SIGKILL" in checks["exits within the grace"]["detail"]
    assert not checks["saves a checkpoint on SIGTERM"]["ok"]


def test_a_job_that_exits_without_saving_fails(tmp_path: Path) -> None:
    script = tmp_path / "nosave.py"
    script.write_text(
        "import time\nfrom warden.workload import Reporter, install\n"
        "guard = install(); r = Reporter.from_env(); step = 0\n"
        "while not guard.should_stop():\n    step += 1; r.progress(step); time.sleep(0.02)\n"
        "guard.exit()\n"
    )
    done = check("--grace", "5s", "--timeout", "60s", "--json", "--", sys.executable, str(script))
    assert done.returncode == 1
    checks = verdict(done)
    assert checks["exits within the grace"]["ok"]
    assert not checks["saves a checkpoint on SIGTERM"]["ok"]


def test_a_bad_duration_is_refused() -> None:
    done = check("--grace", "soon", "--", "true")
    assert done.returncode == 2 and "--grace" in done.stderr and "soon" in done.stderr
