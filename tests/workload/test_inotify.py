"""How check-workload tells an atomic save from a torn one: real file operations under a real
inotify watch, then `arrival` on the events after the mark, for each way a checkpoint can come
to be under its final name."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from warden.workload.inotify import OPEN, DirWatch
from warden.workload.saves import Target, arrival

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "elsewhere").mkdir()
    yield tmp_path / "ckpt"


def observe(root: Path, act: Callable[[Path], None], rel: str) -> tuple[bool, str] | None:
    with DirWatch(root) as watch:
        mark = watch.mark()
        act(root)
        return arrival(watch.since(mark), rel)


def write(path: Path, data: bytes = b"weights") -> None:
    with open(path, "wb") as f:
        f.write(data[:3])
        f.flush()
        f.write(data[3:])


def test_a_rename_inside_the_directory_is_atomic(root: Path) -> None:
    def act(d: Path) -> None:
        write(d / "s.tmp")
        os.replace(d / "s.tmp", d / "s.pt")

    assert observe(root, act, "s.pt") == (True, "s.pt appeared by rename from s.tmp")


def test_a_rename_from_another_directory_is_atomic(root: Path) -> None:
    def act(d: Path) -> None:
        write(d.parent / "elsewhere" / "s.tmp")
        os.replace(d.parent / "elsewhere" / "s.tmp", d / "s.pt")

    assert observe(root, act, "s.pt") == (True, "s.pt appeared by rename from outside the directory")


def test_a_hard_link_of_a_whole_file_is_atomic(root: Path) -> None:
    def act(d: Path) -> None:
        write(d.parent / "elsewhere" / "s.tmp")
        os.link(d.parent / "elsewhere" / "s.tmp", d / "s.pt")

    assert observe(root, act, "s.pt") == (True, "s.pt appeared whole (linked into place)")


def test_a_new_file_written_under_its_final_name_is_torn(root: Path) -> None:
    assert observe(root, lambda d: write(d / "s.pt"), "s.pt") == (
        False,
        "s.pt was created and written in place under its final name",
    )


def test_an_existing_file_overwritten_in_place_is_torn(root: Path) -> None:
    write(root / "s.pt", b"old weights")
    assert observe(root, lambda d: write(d / "s.pt"), "s.pt") == (
        False,
        "s.pt was written in place under its final name",
    )


def test_a_rename_then_a_write_under_the_final_name_is_torn(root: Path) -> None:
    def act(d: Path) -> None:
        write(d / "s.tmp")
        os.replace(d / "s.tmp", d / "s.pt")
        with open(d / "s.pt", "ab") as f:
            f.write(b"more")

    assert observe(root, act, "s.pt") == (False, "s.pt was written in place under its final name")


def test_a_directory_renamed_into_place_is_atomic(root: Path) -> None:
    def act(d: Path) -> None:
        (d / "step-5.tmp").mkdir()
        write(d / "step-5.tmp" / "model.pt")
        os.replace(d / "step-5.tmp", d / "step-5")

    assert observe(root, act, "step-5/model.pt") == (True, "step-5/model.pt arrived inside step-5/, renamed into place")


def test_a_directory_created_under_its_final_name_and_filled_is_torn(root: Path) -> None:
    def act(d: Path) -> None:
        (d / "step-5").mkdir()
        write(d / "step-5" / "model.pt")

    way = observe(root, act, "step-5/model.pt")
    assert way is not None and way[0] is False
    # Watched in time, the file's creation and write are seen; a little late, the write alone;
    # too late for both, the directory's creation says it.
    assert way[1] in (
        "step-5/model.pt was created and written in place under its final name",
        "step-5/model.pt was written in place under its final name",
        "step-5/model.pt was written inside step-5/, created under its final name",
    )


def test_a_file_untouched_after_the_mark_did_not_arrive_and_opens_are_seen(root: Path) -> None:
    write(root / "old.pt")
    with DirWatch(root) as watch:
        mark = watch.mark()
        (root / "old.pt").read_bytes()
        events = watch.since(mark)
    assert arrival(events, "old.pt") is None
    assert [e.path for e in events if e.has(OPEN) and not e.is_dir] == ["old.pt"]


def test_checkpoint_targets_name_a_directory_a_file_or_a_glob(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    assert Target.parse("runs", tmp_path) == Target(tmp_path / "runs")
    assert Target.parse("new/", tmp_path) == Target(tmp_path / "new")
    assert Target.parse("runs/last.pt", tmp_path) == Target(tmp_path / "runs", "last.pt")
    glob = Target.parse("runs/*/ckpt-*.pt", tmp_path)
    assert glob == Target(tmp_path / "runs", "*/ckpt-*.pt")
    assert glob.matches("a/ckpt-3.pt") and not glob.matches("a/ckpt-3.pt.tmp")
    assert Target.parse("/abs/x-*.bin", tmp_path) == Target(Path("/abs"), "x-*.bin")


def test_a_tree_too_large_to_watch_is_refused_not_walked_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warden.workload.inotify as inotify

    monkeypatch.setattr(inotify, "MAX_DIRECTORIES", 3)
    for name in "abcd":
        (tmp_path / name).mkdir()
    with pytest.raises(inotify.WatchUnavailable, match="more than 3 directories under"):
        DirWatch(tmp_path)
