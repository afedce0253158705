"""`warden check-workload` on real processes, with and without warden's SDK: the examples and
plain trainers that save by rename pass, each check saying how it was observed, and may be
submitted with `--saves-on-sigterm`; a job that ignores SIGTERM, does not save, writes in
place, never reopens its checkpoint, exits early or shows nothing fails with its reason (the
last two at once, not after minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# A trainer without the SDK: catches SIGTERM, saves `{"step": N}` to `state.json` under
# $WARDEN_CHECKPOINT_DIR (MODE: "rename" atomically, "inplace" under the final name) and exits 0;
# resumes from it unless MODE is "forget"; with "silent" it prints nothing.
PLAIN = """
import json, os, signal, sys, time
mode = sys.argv[1]
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
ckpt = os.environ["WARDEN_CHECKPOINT_DIR"]
path = os.path.join(ckpt, "state.json")
step = 0
if mode != "forget" and os.path.exists(path):
    with open(path) as f:
        step = json.load(f)["step"]
    print("resumed from step", step)
while True:
    time.sleep(0.05)
    step += 1
    if mode != "silent":
        print("step", step)
    if stop:
        if mode == "inplace":
            with open(path, "w") as f:
                f.write('{"step": ')
                f.flush()
                time.sleep(0.05)
                f.write(str(step) + "}")
        else:
            with open(path + ".tmp", "w") as f:
                json.dump({"step": step}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)
        sys.exit(0)
"""


def check(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "check-workload", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def verdict(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def plain(tmp_path: Path, mode: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    return check("--grace", "10s", "--timeout", "20s", *options, "--json", "--", sys.executable, str(script), mode)


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
    checks = verdict(done)
    assert list(checks) == [
        "makes progress",
        "exits within the grace",
        "saves a checkpoint on SIGTERM",
        "saves atomically",
        "resumes from the checkpoint",
    ]
    assert checks["makes progress"]["how"] == "SDK progress report"
    assert checks["saves a checkpoint on SIGTERM"]["how"].startswith("SDK checkpoint report")
    # The SDK's own save, seen from outside too: data and sidecar renamed into place.
    step = data["saved_step"]
    assert f"ckpt-{step:012d}.json" in data["saved_files"] and f"ckpt-{step:012d}.json.meta" in data["saved_files"]
    assert "appeared by rename from .ckpt-" in checks["saves atomically"]["detail"]


def test_a_plain_trainer_without_the_sdk_is_checked_from_outside(tmp_path: Path) -> None:
    done = plain(tmp_path, "rename")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = verdict(done)
    assert all(c["ok"] for c in checks.values())
    assert checks["makes progress"]["how"] == "output"
    assert checks["exits within the grace"]["detail"].startswith("exit 0 after")
    assert checks["saves a checkpoint on SIGTERM"] == {
        "name": "saves a checkpoint on SIGTERM",
        "ok": True,
        "how": "inotify",
        "detail": "wrote state.json after SIGTERM",
    }
    assert checks["saves atomically"]["detail"] == "state.json appeared by rename from state.json.tmp"
    assert checks["resumes from the checkpoint"]["how"] == "inotify, output"
    assert checks["resumes from the checkpoint"]["detail"].startswith("opened state.json; then output kept coming")
    assert json.loads(done.stdout)["saved_files"] == ["state.json"]
    assert json.loads(done.stdout)["saves_on_sigterm"] is True  # it may declare so on submission


def test_a_job_that_writes_its_checkpoint_in_place_fails(tmp_path: Path) -> None:
    done = plain(tmp_path, "inplace")
    assert done.returncode == 1
    checks = verdict(done)
    assert checks["exits within the grace"]["ok"] and checks["saves a checkpoint on SIGTERM"]["ok"]
    atomic = checks["saves atomically"]
    assert atomic["ok"] is False and atomic["how"] == "inotify"
    assert "state.json was created and written in place under its final name" in atomic["detail"]
    assert "half-written" in atomic["detail"]
    assert checks["resumes from the checkpoint"]["ok"] is None  # not run after a failure
    assert json.loads(done.stdout)["saves_on_sigterm"] is False


def test_a_second_run_that_ignores_the_checkpoint_fails(tmp_path: Path) -> None:
    done = plain(tmp_path, "forget", "--timeout", "3s")
    assert done.returncode == 1
    resume = verdict(done)["resumes from the checkpoint"]
    assert resume["ok"] is False
    assert resume["detail"] == "run 2 did not open state.json in 3s: it would start over"


def test_a_silent_job_is_checked_after_a_warmup_and_by_its_checkpoint_glob(tmp_path: Path) -> None:
    """No output and no SDK: `--warmup` says when to send SIGTERM, `--checkpoint` where it saves
    (relative to the working directory, a glob)."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN.replace('os.environ["WARDEN_CHECKPOINT_DIR"]', '"out"').replace("state.json", "s-1.ckpt"))
    (tmp_path / "out").mkdir()
    done = check(
        "--grace",
        "10s",
        "--timeout",
        "20s",
        "--warmup",
        "1s",
        "--checkpoint",
        "out/*.ckpt",
        "--json",
        "--",
        sys.executable,
        str(script),
        "silent",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    checks = verdict(done)
    assert checks["makes progress"] == {
        "name": "makes progress",
        "ok": True,
        "how": "--warmup",
        "detail": "still running after 1s",
    }
    assert data["checkpoint"] == f"{tmp_path}/out/*.ckpt" and data["saved_files"] == ["s-1.ckpt"]
    assert checks["saves atomically"]["detail"] == "s-1.ckpt appeared by rename from s-1.ckpt.tmp"
    assert checks["resumes from the checkpoint"] == {
        "name": "resumes from the checkpoint",
        "ok": True,
        "how": "inotify, --warmup",
        "detail": "opened s-1.ckpt; then still running after 1s",
    }


def test_a_job_that_shows_nothing_fails_fast_with_what_was_watched(tmp_path: Path) -> None:
    done = check("--timeout", "2s", "--json", "--", sys.executable, "-c", "import time; time.sleep(120)", timeout=60)
    assert done.returncode == 1
    progress = verdict(done)["makes progress"]
    assert progress["ok"] is False and progress["how"] == "output, files, reports"
    assert progress["detail"].startswith("nothing observable in 2s: no output, no file written in ")
    assert "--warmup" in progress["detail"] and "--checkpoint" in progress["detail"]


def test_a_job_that_exits_before_any_progress_fails_at_once() -> None:
    done = check(
        "--timeout",
        "10m",
        "--json",
        "--",
        sys.executable,
        "-c",
        "print('no GPU found'); raise SystemExit(3)",
        timeout=60,
    )
    assert done.returncode == 1
    progress = verdict(done)["makes progress"]
    assert progress["ok"] is False and progress["how"] == "process status"
    assert progress["detail"] == (
        "exited with status 3; last output: 'no GPU found' before the check saw it make progress"
    )


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
    save = checks["saves a checkpoint on SIGTERM"]
    assert not save["ok"] and save["detail"].startswith("no file written in ") and "--checkpoint" in save["detail"]


@pytest.mark.slow
def test_a_pytorch_trainer_without_the_sdk_passes() -> None:
    """examples/train_torch_no_sdk.py: torch.save to a temporary name, fsync, os.replace; the
    SDK's own PyTorch path is the same check as train_plain.py's above."""
    pytest.importorskip("torch")
    done = check(
        "--grace",
        "30s",
        "--timeout",
        "60s",
        "--json",
        "--",
        sys.executable,
        str(EXAMPLES / "train_torch_no_sdk.py"),
        "--steps",
        "100000",
        "--step-seconds",
        "0.02",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    checks = verdict(done)
    assert checks["makes progress"]["how"] == "output"
    assert checks["saves atomically"]["detail"].startswith("last.pt appeared by rename from .last.pt.")
    assert checks["resumes from the checkpoint"]["how"] == "inotify, output"
    assert checks["resumes from the checkpoint"]["detail"].startswith("opened last.pt; then ")
    assert json.loads(done.stdout)["saved_files"] == ["last.pt"]


def test_bad_options_are_refused_naming_the_option() -> None:
    for args, field, value in (
        (("--grace", "soon"), "--grace", "soon"),
        (("--timeout", "0s"), "--timeout", "0s"),
        (("--warmup", "2d"), "--warmup", "2d"),
        (("--grace", "10"), "--grace", "'10' has no unit: give one, e.g. 600s or 10m"),
    ):
        done = check(*args, "--", "true")
        assert done.returncode == 2 and field in done.stderr and value in done.stderr, done.stderr


def test_the_table_at_80_columns_says_how_each_check_was_observed(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    argv = [sys.executable, "-m", "warden.cli.main", "check-workload", "--grace", "10s", "--"]
    done = subprocess.run(
        [*argv, sys.executable, str(script), "rename"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines) and "…" not in done.stdout
    assert lines[2].split() == ["RESULT", "CHECK", "OBSERVED", "BY"]
    rows = [line.split(None, 1)[1] for line in lines if line.split()[:1] == ["pass"]]
    assert [" ".join(row.split()) for row in rows] == [
        "makes progress output",
        "exits within the grace process status",
        "saves a checkpoint on SIGTERM inotify",
        "saves atomically inotify",
        "resumes from the checkpoint inotify, output",
    ]
    assert "state.json appeared by rename from state.json.tmp" in done.stdout
    verdict_at = lines.index("the workload honours the preemption contract")
    assert " ".join(" ".join(lines[verdict_at + 1 :]).split()) == (
        "it may be submitted with --saves-on-sigterm, with a grace of at least 10 s: an exit 0 within its grace "
        "after SIGTERM then counts as a save, and its preemption loses no work"
    )
