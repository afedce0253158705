"""A job submitted without a name is named after its program, or the script an interpreter or a
launcher runs, as Slurm names a job after its script."""

from __future__ import annotations

import pytest

from warden.server.submissions import default_name


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python3", "train.py"], "train.py"),
        (["/usr/bin/python3", "-u", "jobs/train.py", "--lr", "0.1"], "train.py"),
        (["python3", "-m", "pkg.train", "--epochs", "3"], "pkg.train"),
        (["python3", "-c", "print('hello')"], "python3"),
        (["python3"], "python3"),
        (["/usr/bin/env", "python3"], "python3"),
        (["/usr/bin/env", "-i", "A=1", "python3", "eval.py"], "eval.py"),
        (["env"], "env"),
        (["bash", "-x", "./scripts/run.sh"], "run.sh"),
        (["bash", "-c", "sleep 1"], "bash"),
        (["torchrun", "--nproc_per_node", "8", "train.py"], "train.py"),
        (["sleep", "600"], "sleep"),
        (["./scripts/run.sh"], "run.sh"),
        (["bin/"], "bin"),
        (["/"], "/"),
        (["x" * 300], "x" * 255),
    ],
)
def test_the_default_name_is_the_programs(command: list[str], name: str) -> None:
    assert default_name(command, 255) == name
