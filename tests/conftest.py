"""Run as root (as CI does), warden runs every job as an unprivileged uid (docs/security.md).
Such a job must be able to run this interpreter, import this checkout, and write where a test
tells it to.

The first two are what an admin does on a real machine (docs/security.md, "Setting it up"):
`scripts/test` makes the directories above the interpreter and the checkout passable (o+x,
never o+r), and a session that finds them closed stops at once saying so, rather than failing
every job test. The third is a shared scratch directory, as an admin would give jobs: under
root, `tmp_path` lies in a directory of this session every uid may pass through (0711) and is
open to everyone (0777). Nothing else is prepared: a server's state directory is checked by
the server itself, and tests/server/test_state_dir.py starts one on the real default path."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[1]


def closed_above(path: Path) -> Path | None:
    """The first directory at or above `path` that other uids may not pass through."""
    for directory in reversed((path, *path.parents)):
        if not directory.stat().st_mode & stat.S_IXOTH:
            return directory
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    if not ROOT:
        return
    for what, path in (
        ("this interpreter", Path(sys.executable).resolve().parent),
        ("the Python environment", Path(sys.prefix)),
        ("this checkout", REPO),
    ):
        closed = closed_above(path)
        if closed is not None:
            pytest.exit(
                f"as root, warden runs jobs as other uids, and they cannot reach {what} ({path}): {closed} is "
                f"{stat.filemode(closed.stat().st_mode)}. Run ./scripts/test (it makes the way passable, as "
                "docs/security.md asks of an admin), or chmod o+x each directory above it.",
                returncode=4,
            )


@pytest.fixture(scope="session")
def _jobs_base() -> Iterator[Path | None]:
    if not ROOT:
        yield None
        return
    base = Path(tempfile.mkdtemp(prefix="warden-tests-"))
    os.chmod(base, 0o711)
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


_CLUSTERS: dict[str, tuple[Iterator[object], object]] = {}
"""The real clusters brought up for this session's tests, by fixture name: each generator (its
`finally` tears the cluster down) and the cluster it yielded."""
_GROUPS = {"slurm_cluster": "slurm", "ray_cluster": "ray"}
"""The xdist group whose tests share each cluster (`pytest.mark.xdist_group`)."""


def _cluster(name: str, bring_up: Callable[[], Iterator[object]]) -> object:
    if name not in _CLUSTERS:
        up = bring_up()
        _CLUSTERS[name] = (up, next(up))
    return _CLUSTERS[name][1]


def _tear_down(name: str) -> None:
    up, _ = _CLUSTERS.pop(name)
    up.close()


def _group(item: pytest.Item | None) -> str | None:
    mark = None if item is None else item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With `--dist loadgroup` (scripts/test) a worker runs every test of a group one after the
    other: once the next test is of another group, nothing on this worker needs the group's
    cluster any more, and it is torn down rather than left running idle to the session's end."""
    yield
    if item.config.getoption("dist", "no") != "loadgroup":
        return
    for name in list(_CLUSTERS):
        if _group(nextitem) != _GROUPS[name]:
            _tear_down(name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for name in list(_CLUSTERS):
        _tear_down(name)


@pytest.fixture
def slurm_cluster() -> object:
    """A real 4-node Slurm cluster (tests/slurmcluster.py), shared by the session's tests (by
    the tests of the "slurm" group: see `pytest_runtest_teardown`)."""
    from slurmcluster import bring_up

    return _cluster("slurm_cluster", bring_up)


@pytest.fixture
def ray_cluster() -> object:
    """A real Ray cluster of 3 worker nodes (tests/raycluster.py), shared by the session's
    tests (by the tests of the "ray" group): never kill its nodes (bring up a cluster of your
    own for that)."""
    from raycluster import bring_up

    return _cluster("ray_cluster", bring_up)


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist's workers inherit COLUMNS=80 and LINES=24 where a plain pytest run has
    none: the CLI lays its tables out by $COLUMNS, so every test starts without them and sets
    the width it is about."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
