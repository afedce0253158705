"""A job submitted without a name is named after its program, as Slurm names it."""

from __future__ import annotations

import pytest

from warden.server.submissions import default_name


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python3", "train.py"], "python3"),
        (["/usr/bin/env", "python3"], "env"),
        (["./scripts/run.sh"], "run.sh"),
        (["bin/"], "bin"),
        (["/"], "/"),
        (["x" * 300], "x" * 255),
    ],
)
def test_the_default_name_is_the_programs(command: list[str], name: str) -> None:
    assert default_name(command, 255) == name
