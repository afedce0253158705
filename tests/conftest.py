"""Run as root (as CI does), warden runs every job as an unprivileged uid (docs/security.md).
Such a job must be able to run this interpreter and to write where a test tells it to. So,
under root, `tmp_path` lies in a directory of this session that every uid may pass through
(pytest's own base is 0700 and reset by every pytest session that starts) and is open to
everyone (0777); and the directories up to the interpreter and the repository are made
passable (o+x, never o+r) once per session."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[1]


def passable(path: Path) -> None:
    """Let every uid pass through `path` and each directory above it (search, not list)."""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)


@pytest.fixture(scope="session")
def _jobs_base() -> Iterator[Path | None]:
    if not ROOT:
        yield None
        return
    passable(Path(sys.prefix))
    passable(Path(sys.executable).resolve().parent)
    passable(REPO)
    base = Path(tempfile.mkdtemp(prefix="warden-tests-"))
    os.chmod(base, 0o711)
    passable(base)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path: Path, _jobs_base: Path | None) -> Path:
    if _jobs_base is None:
        return tmp_path
    name = re.sub(r"[^\w-]", "_", request.node.name)[:40]
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_jobs_base))
    os.chmod(path, 0o777)
    return path


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[object]:
    """A real 4-node Slurm cluster (tests/slurmcluster.py), shared by the session's tests."""
    from slurmcluster import bring_up

    yield from bring_up()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A real Ray cluster of 3 worker nodes (tests/raycluster.py), shared by the session's
    tests: never kill its nodes (bring up a cluster of your own for that)."""
    from raycluster import bring_up

    yield from bring_up()


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist's workers inherit COLUMNS=80 and LINES=24 where a plain pytest run has
    none: the CLI lays its tables out by $COLUMNS, so every test starts without them and sets
    the width it is about."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
