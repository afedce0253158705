"""`CheckpointStore`: formats, the atomic write protocol, retention, verification and the
clean-up of abandoned temp files. The SIGKILL torture test is in test_crash_safety.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from reportsink import ReportSink, env_for

import warden.workload.checkpoint as checkpoint_mod
from warden.workload import CheckpointStore, PreemptionGuard, Reporter

REPO = Path(__file__).resolve().parents[2]
QUIET = Reporter.from_env({})


def store_at(path: Path, **kwargs: Any) -> CheckpointStore:
    return CheckpointStore(path, reporter=QUIET, **kwargs)


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# -- formats -------------------------------------------------------------------------------------


def test_bytes_roundtrip_with_sidecar(tmp_path: Path) -> None:
    store = store_at(tmp_path / "ck")
    path = store.save(5, b"\x00hello\xff")
    assert path == tmp_path / "ck" / "ckpt-000000000005.bin"
    assert path.read_bytes() == b"\x00hello\xff"  # the file is the raw bytes, nothing added
    meta = json.loads((tmp_path / "ck" / "ckpt-000000000005.bin.meta").read_text())
    assert meta["step"] == 5 and meta["format"] == "bin" and meta["size"] == 7
    assert meta["sha256"] == hashlib.sha256(b"\x00hello\xff").hexdigest()
    assert store.load_latest() == (5, b"\x00hello\xff")
    assert names(tmp_path / "ck") == ["ckpt-000000000005.bin", "ckpt-000000000005.bin.meta"]


def test_json_roundtrip_is_plain_json(tmp_path: Path) -> None:
    store = store_at(tmp_path, prefix="state")
    state = {"step": 3, "value": 1.5, "history": [1, 2], "nested": {"a": None}}
    path = store.save(3, state)
    assert path.name == "state-000000000003.json"
    assert json.loads(path.read_text()) == state
    assert store.load_latest() == (3, state)


def test_what_json_cannot_hold_is_refused_before_writing(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    with pytest.raises(TypeError, match="save_torch"):
        store.save(1, {"x": object()})
    with pytest.raises(TypeError, match="save_torch"):
        store.save(1, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step"):
        store.save(-1, b"")
    with pytest.raises(ValueError, match="step"):
        store.save(True, b"")
    assert names(tmp_path) == []


def test_torch_state_dicts_roundtrip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    store = store_at(tmp_path)
    path = store.save_torch(9, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 9})
    assert path.suffix == ".pt"
    # A standard torch file: loadable without warden.
    assert torch.load(path, weights_only=True)["step"] == 9
    latest = store.load_latest(map_location="cpu")
    assert latest is not None
    step, state = latest
    assert step == 9 and state["step"] == 9
    for k, v in model.state_dict().items():
        assert torch.equal(state["model"][k], v)
    restored = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1, momentum=0.9)
    restored.load_state_dict(state["optimizer"])  # momentum buffers included


def test_torch_objects_weights_only_refuses_are_an_error_not_a_skip(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    store = store_at(tmp_path)
    store.save(1, b"older")
    store.save_torch(2, {"obj": Path("/x")})  # pickles fine, but is no plain value
    with pytest.raises(RuntimeError, match="weights_only"):
        store.load_latest()


def test_the_sdk_imports_without_torch() -> None:
    code = (
        "import sys; import warden.workload as w; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'urllib.request' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


# -- the write protocol --------------------------------------------------------------------------


def test_write_order_is_temp_fsync_sidecar_rename_fsync_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        log.append(f"fsync {'dir' if os.path.isdir(target) else Path(target).name}")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        log.append(f"rename {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store_at(tmp_path).save(1, b"abc")
    assert [e.split(".")[0] if e.startswith("fsync .") else e for e in log] == [
        "fsync ",  # the hidden temp data file
        "fsync ",  # the hidden temp sidecar
        "rename ckpt-000000000001.bin.meta",
        "fsync dir",
        "rename ckpt-000000000001.bin",
        "fsync dir",
    ]


def test_a_failing_write_leaves_no_files(tmp_path: Path) -> None:
    pytest.importorskip("torch")

    class Unpicklable:
        def __reduce__(self) -> Any:
            raise RuntimeError("boom")

    store = store_at(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        store.save_torch(1, {"x": Unpicklable()})
    assert names(tmp_path) == []


# -- retention -----------------------------------------------------------------------------------


def test_only_the_newest_keep_survive(tmp_path: Path) -> None:
    store = store_at(tmp_path, keep=3)
    for step in range(10):
        store.save(step, {"step": step})
    assert [i.step for i in store.checkpoints()] == [7, 8, 9]
    assert len(names(tmp_path)) == 6
    everything = store_at(tmp_path / "all", keep=None)
    for step in range(5):
        everything.save(step, b"x")
    assert [i.step for i in everything.checkpoints()] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)


def test_a_save_supersedes_higher_steps(tmp_path: Path) -> None:
    store = store_at(tmp_path, keep=3)
    for step in (10, 20, 30):
        store.save(step, b"old run")
    store.save(5, b"new run")  # started over: the newest save must be what resumes
    assert store.load_latest() == (5, b"new run")
    assert [i.step for i in store.checkpoints()] == [5]


def test_default_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_CHECKPOINT_DIR", str(tmp_path / "from-env"))
    assert CheckpointStore().directory == tmp_path / "from-env"
    monkeypatch.delenv("WARDEN_CHECKPOINT_DIR")
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore(reporter=QUIET)
    assert store.directory == tmp_path / "checkpoints"
    assert store.load_latest() is None  # no directory yet: nothing, no error
    store.save(1, b"x")
    assert (tmp_path / "checkpoints" / "ckpt-000000000001.bin").exists()


# -- verification --------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "sidecar", "no-sidecar"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: str, capfd: pytest.CaptureFixture[str]
) -> None:
    store = store_at(tmp_path)
    store.save(1, b"a" * 1000)
    newest = store.save(2, b"b" * 1000)
    meta = newest.with_name(newest.name + ".meta")
    if damage == "flip":
        raw = bytearray(newest.read_bytes())
        raw[500] ^= 1
        newest.write_bytes(bytes(raw))
    elif damage == "truncate":
        newest.write_bytes(newest.read_bytes()[:999])
    elif damage == "extend":
        newest.write_bytes(newest.read_bytes() + b"!")
    elif damage == "sidecar":
        meta.write_text("{not json")
    else:
        meta.unlink()
    assert store.load_latest() == (1, b"a" * 1000)
    assert store.load_latest() == (1, b"a" * 1000)
    err = capfd.readouterr().err
    if damage != "no-sidecar":  # without a sidecar it is no checkpoint at all: skipped silently
        assert err.count("skipping checkpoint") == 1, err


def test_nothing_verifiable_means_none(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    assert store.load_latest() is None
    path = store.save(1, b"x")
    path.write_bytes(b"y")
    assert store.load_latest() is None


# -- temp files ----------------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_files_are_ignored_and_abandoned_ones_removed(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.save(1, b"good")
    host = checkpoint_mod._WRITER_HOST
    abandoned = tmp_path / f".ckpt-000000000002.bin.{host}.{dead_pid()}.0a0b0c0d.tmp"
    live = tmp_path / f".ckpt-000000000003.bin.{host}.{os.getpid()}.01020304.tmp"
    remote_fresh = tmp_path / ".ckpt-000000000004.bin.otherhost-1.1234.01020304.tmp"
    remote_old = tmp_path / ".ckpt-000000000005.bin.otherhost-1.1234.01020305.tmp"
    unrelated = tmp_path / ".notes.tmp"
    for p in (abandoned, live, remote_fresh, remote_old, unrelated):
        p.write_bytes(b"partial")
    hour_ago = time.time() - 7200
    os.utime(remote_old, (hour_ago, hour_ago))
    assert store.load_latest() == (1, b"good")
    left = set(names(tmp_path))
    assert abandoned.name not in left and remote_old.name not in left
    assert {live.name, remote_fresh.name, unrelated.name} <= left


def test_orphan_sidecars_of_dead_writers_are_removed(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.save(1, b"good")
    host = checkpoint_mod._WRITER_HOST
    orphan = tmp_path / "ckpt-000000000002.bin.meta"
    orphan.write_text(json.dumps({"writer": f"{host}:{dead_pid()}", "size": 1, "sha256": ""}))
    mine = tmp_path / "ckpt-000000000003.bin.meta"  # its data may be renamed any moment
    mine.write_text(json.dumps({"writer": f"{host}:{os.getpid()}", "size": 1, "sha256": ""}))
    assert store.load_latest() == (1, b"good")
    assert not orphan.exists() and mine.exists()


# -- reports -------------------------------------------------------------------------------------


def test_saves_report_start_and_finish(tmp_path: Path) -> None:
    sink = ReportSink()
    try:
        reporter = Reporter.from_env(env_for(sink))
        store = CheckpointStore(tmp_path, reporter=reporter)
        path = store.save(1, b"x" * 4096)
        assert sink.kinds() == ["checkpoint_started", "checkpoint_finished"]
        finished = sink.of("checkpoint_finished")[0]
        assert finished["size_bytes"] == 4096 == path.stat().st_size
        assert 0 < finished["duration_s"] < 5 and finished["on_sigterm"] is False
        assert finished["step"] == 1 == sink.of("checkpoint_started")[0]["step"]

        store.save(2, b"y", on_sigterm=True)
        assert sink.of("checkpoint_finished")[1]["on_sigterm"] is True
    finally:
        sink.close()


def test_on_sigterm_follows_the_installed_guard(tmp_path: Path) -> None:
    sink = ReportSink()
    before = signal.getsignal(signal.SIGTERM)
    try:
        store = CheckpointStore(tmp_path, reporter=Reporter.from_env(env_for(sink)))
        with PreemptionGuard(env={}) as guard:
            store.save(1, b"x")
            guard.request_stop()
            store.save(2, b"x")
        assert [b["on_sigterm"] for b in sink.of("checkpoint_finished")] == [False, True]
    finally:
        signal.signal(signal.SIGTERM, before)
        sink.close()


# -- concurrency ---------------------------------------------------------------------------------


def test_readers_never_see_a_partial_checkpoint_while_a_thread_saves(tmp_path: Path) -> None:
    store = store_at(tmp_path, keep=2)
    reader = store_at(tmp_path)
    stop = threading.Event()
    problems: list[str] = []

    def content(step: int) -> bytes:
        return hashlib.sha256(str(step).encode()).digest() * (step % 7 * 3000 + 1)

    def read() -> None:
        while not stop.is_set():
            got = reader.load_latest()
            if got is not None and got[1] != content(got[0]):
                problems.append(f"step {got[0]} has wrong content")

    t = threading.Thread(target=read)
    t.start()
    try:
        for step in range(150):
            store.save(step, content(step))
    finally:
        stop.set()
        t.join()
    assert problems == []
    assert reader.load_latest() == (149, content(149))
