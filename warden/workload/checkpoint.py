"""Atomic checkpoints that survive SIGKILL at any instant, and resume from the newest good one.

A preempted job may be killed in the middle of a write (its grace period ran out) and the
machine may lose power. A checkpoint written in place would then be torn, and a job resuming
from it would crash or, worse, silently train from garbage. So every save goes:

1. serialize into a temporary file in the checkpoint directory (same filesystem, so the rename
   below is atomic), hashing the bytes as they are written;
2. ``flush`` + ``os.fsync``: the bytes are on disk before any name points at them;
3. write the sidecar ``<name>.meta`` (format, step, size, SHA-256) the same way;
4. rename the sidecar, fsync the directory, rename the data file, fsync the directory: the
   rename is the commit point, the directory fsync makes the new name itself durable, and the
   sidecar is committed first, so a data file under its final name always has one.

A checkpoint is *complete* when its data file and its sidecar both exist and the data's length
and SHA-256 match the sidecar. ``load_latest()`` returns the newest complete one, skipping any
that fail verification, and never looks at temporary files (hidden ``.…tmp`` names), which it
removes once their writer is gone.

Files stay in their native formats, so they can be inspected without warden: ``.bin`` (raw
bytes), ``.json`` (a JSON object; no pickle, so loading a checkpoint cannot run code) and
``.pt`` (``torch.save``; loaded with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from warden.workload.report import Reporter, default_reporter

__all__ = ["CheckpointInfo", "CheckpointStore", "CorruptCheckpoint"]

FORMATS = ("bin", "json", "pt")
_META_SUFFIX = ".meta"
_META_VERSION = 1
_TMP_SUFFIX = ".tmp"


class CorruptCheckpoint(Exception):
    """A checkpoint that fails verification (missing or unreadable sidecar, wrong length or
    checksum, unparseable content)."""


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A checkpoint whose data file and sidecar both exist (not yet verified)."""

    step: int
    path: Path
    format: str

    @property
    def meta_path(self) -> Path:
        return self.path.with_name(self.path.name + _META_SUFFIX)


class CheckpointStore:
    """Checkpoints ``{prefix}-{step:012d}.{bin|json|pt}`` in one directory, newest ``keep``.

    One process (in a gang: rank 0, ``guard.is_writer``) should save; any number may load.
    Saving is serialized within a process by a lock.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        keep: int | None = 3,
        prefix: str = "ckpt",
        *,
        reporter: Reporter | None = None,
        stale_after: float = 3600.0,
    ) -> None:
        """``directory`` defaults to ``WARDEN_CHECKPOINT_DIR``, else ``./checkpoints`` (created
        on the first save). ``keep`` None keeps every checkpoint. ``reporter`` receives the
        checkpoint reports (default: the process-wide one). A temporary file whose writer
        cannot be checked (another host) counts as abandoned once it has not been modified for
        ``stale_after`` seconds."""
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be at least 1 (or None for all), got {keep!r}")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", prefix):
            raise ValueError(f"prefix must be a plain file name part, got {prefix!r}")
        if directory is None:
            directory = os.environ.get("WARDEN_CHECKPOINT_DIR") or "checkpoints"
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.prefix = prefix
        self.stale_after = stale_after
        self._reporter = reporter
        self._name = re.compile(rf"{re.escape(prefix)}-(\d{{12,}})\.({'|'.join(FORMATS)})")
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    # -- saving --------------------------------------------------------------------------------

    def save(
        self, step: int, data: bytes | bytearray | memoryview | Mapping[str, Any], *, on_sigterm: bool | None = None
    ) -> Path:
        """Saves bytes (``.bin``) or a JSON-able mapping (``.json``) as checkpoint ``step``;
        returns its path once it is durable. See ``_save`` for ``on_sigterm`` and retention."""
        started = time.monotonic()
        if isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
            return self._save(step, "bin", lambda f: f.write(payload), on_sigterm, started)
        if isinstance(data, Mapping):
            try:
                text = json.dumps(dict(data))
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"checkpoint data is not JSON-able ({e}); save tensors and state dicts with save_torch()"
                ) from e
            payload = text.encode()
            return self._save(step, "json", lambda f: f.write(payload), on_sigterm, started)
        raise TypeError(
            f"save() takes bytes or a JSON-able mapping, not {type(data).__name__}; "
            f"use save_torch() for PyTorch objects"
        )

    def save_torch(self, step: int, obj: Any, *, on_sigterm: bool | None = None) -> Path:
        """Saves a PyTorch object (state dicts, tensors, numbers) with ``torch.save`` as
        checkpoint ``step`` (``.pt``). Keep it to what ``torch.load(weights_only=True)``
        accepts: ``load`` refuses to unpickle anything else."""
        import torch

        return self._save(step, "pt", lambda f: torch.save(obj, f), on_sigterm, time.monotonic())

    def _save(
        self, step: int, fmt: str, write: Callable[[BinaryIO], object], on_sigterm: bool | None, started: float
    ) -> Path:
        """The atomic save, its reports and retention. The reported duration runs from
        ``started`` (before serialization) to the directory fsync, without the reports.

        ``on_sigterm`` None means "the installed guard's flag is up". After the save, only the
        newest ``keep`` checkpoints are kept, and any with a *higher* step than this one are
        removed: they belong to a run that was abandoned (or failed verification), and the
        checkpoint saved last must be the one ``load_latest`` finds.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if on_sigterm is None:
            from warden.workload.guard import active_guard

            guard = active_guard()
            on_sigterm = guard is not None and guard.should_stop()
        reporter = self._reporter if self._reporter is not None else default_reporter()
        reported = time.monotonic()
        reporter.checkpoint_started(step)
        started += time.monotonic() - reported  # the report is not part of the save
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{self.prefix}-{step:012d}.{fmt}"
            size = self._commit(path, fmt, step, write)
            duration = time.monotonic() - started
            self._prune(keep_step=step)
        reporter.checkpoint_finished(duration, size, on_sigterm, step)
        return path

    def _commit(self, path: Path, fmt: str, step: int, write: Callable[[BinaryIO], object]) -> int:
        """Temp file, fsync, sidecar, rename, fsync dir. Returns the data's size."""
        data_tmp, size, digest = self._write_temp(path.name, write)
        try:
            meta = {
                "version": _META_VERSION,
                "step": step,
                "format": fmt,
                "size": size,
                "sha256": digest,
                "created_at": time.time(),
                "writer": f"{_WRITER_HOST}:{os.getpid()}",
            }
            meta_bytes = json.dumps(meta).encode()
            meta_tmp, _, _ = self._write_temp(path.name + _META_SUFFIX, lambda f: f.write(meta_bytes))
            os.replace(meta_tmp, path.with_name(path.name + _META_SUFFIX))
            _fsync_dir(self.directory)  # the sidecar's name is durable before the data's
            os.replace(data_tmp, path)
        except BaseException:
            _unlink(data_tmp)
            raise
        _fsync_dir(self.directory)
        return size

    def _write_temp(self, final_name: str, write: Callable[[BinaryIO], object]) -> tuple[Path, int, str]:
        """Writes a new hidden temp file next to ``final_name``, fsynced; (path, size, sha256).
        The name carries the writer (host, pid namespace, pid) so that others can tell an
        abandoned file from one being written."""
        tmp = self.directory / (f".{final_name}.{_WRITER_HOST}.{os.getpid()}.{os.urandom(4).hex()}{_TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                hashing = _HashingWriter(f)
                write(hashing)  # type: ignore[arg-type]  # a file-like with write/flush
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _unlink(tmp)
            raise
        return tmp, hashing.size, hashing.sha256.hexdigest()

    def _prune(self, keep_step: int) -> None:
        """Retention (see ``_save``), then stale temp files. Data before sidecar, so a crash in
        between leaves at worst a sidecar without data, which is ignored and cleaned later."""
        infos = self.checkpoints()
        older = [i for i in infos if i.step < keep_step]
        doomed = [i for i in infos if i.step > keep_step]
        if self.keep is not None:
            doomed += older[: max(0, len(older) - (self.keep - 1))]
        for info in doomed:
            _unlink(info.path)
            _unlink(info.meta_path)
        self.cleanup()

    # -- loading -------------------------------------------------------------------------------

    def checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints whose data file and sidecar both exist, oldest first (not verified)."""
        try:
            names = set(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            m = self._name.fullmatch(name)
            if m and name + _META_SUFFIX in names:
                found.append(CheckpointInfo(int(m[1]), self.directory / name, m[2]))
        found.sort(key=lambda i: (i.step, FORMATS.index(i.format)))
        return found

    def load(self, info: CheckpointInfo, *, map_location: Any = None) -> Any:
        """The verified content of one checkpoint: ``bytes``, a ``dict`` (JSON) or the object
        ``torch.load(weights_only=True)`` gives. Raises ``CorruptCheckpoint``,
        ``FileNotFoundError`` if it was removed meanwhile, and ``RuntimeError`` for an intact
        ``.pt`` that ``weights_only`` refuses (an object that is not a plain value).

        The file is read once into memory, verified, and parsed from those same bytes, so what
        is returned is exactly what was verified (a ``.pt`` briefly needs twice its size)."""
        try:
            meta = json.loads(info.meta_path.read_bytes())
            expected_size, expected_sha = int(meta["size"]), str(meta["sha256"])
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptCheckpoint(f"{info.meta_path}: unreadable sidecar ({e})") from e
        if info.path.stat().st_size != expected_size:
            raise CorruptCheckpoint(f"{info.path}: {info.path.stat().st_size} bytes, sidecar says {expected_size}")
        raw = info.path.read_bytes()
        if len(raw) != expected_size or hashlib.sha256(raw).hexdigest() != expected_sha:
            raise CorruptCheckpoint(f"{info.path}: SHA-256 does not match its sidecar")
        return _parse(info, raw, map_location)

    def load_latest(self, *, map_location: Any = None) -> tuple[int, Any] | None:
        """``(step, data)`` of the newest complete, verified checkpoint; None if there is none.

        A checkpoint failing verification is skipped (with a line on stderr, once) in favour
        of the next older one. Abandoned temp files are removed first. ``map_location`` is
        passed to ``torch.load`` for ``.pt`` checkpoints."""
        try:
            self.cleanup()
        except OSError:
            pass  # a read-only mount: loading must still work
        for info in reversed(self.checkpoints()):
            try:
                return info.step, self.load(info, map_location=map_location)
            except FileNotFoundError:
                continue  # removed by the writer's retention while we looked
            except CorruptCheckpoint as e:
                self._warn(str(info.path), f"warden.workload: skipping checkpoint: {e}")
        return None

    def latest_step(self) -> int | None:
        """The step of the newest checkpoint present (by name; not verified)."""
        infos = self.checkpoints()
        return infos[-1].step if infos else None

    # -- housekeeping --------------------------------------------------------------------------

    def cleanup(self) -> int:
        """Removes abandoned temp files and sidecars without data; returns how many.

        Abandoned: its writer (named in the temp file's name or the sidecar) was on this host
        and pid namespace and is gone, or it was not modified for ``stale_after`` seconds. A
        file that is still being written is never touched."""
        try:
            names = set(os.listdir(self.directory))
        except FileNotFoundError:
            return 0
        removed = 0
        for name in names:
            path = self.directory / name
            writer: str | None
            if name.startswith(".") and name.endswith(_TMP_SUFFIX):
                parts = name[: -len(_TMP_SUFFIX)].rsplit(".", 3)
                if len(parts) != 4 or not parts[0].startswith(f".{self.prefix}-"):
                    continue
                writer = f"{parts[1]}:{parts[2]}"
            elif name.endswith(_META_SUFFIX) and name[: -len(_META_SUFFIX)] not in names:
                if not self._name.fullmatch(name[: -len(_META_SUFFIX)]):
                    continue
                writer = _meta_writer(path)
            else:
                continue
            if self._abandoned(path, writer):
                removed += _unlink(path)
        return removed

    def _abandoned(self, path: Path, writer: str | None) -> bool:
        host, _, pid = (writer or "").rpartition(":")
        if host == _WRITER_HOST and pid.isdigit() and not _pid_alive(int(pid)):
            return True
        try:
            return time.time() - path.stat().st_mtime > self.stale_after
        except FileNotFoundError:
            return False

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(message, file=sys.stderr, flush=True)


# -- helpers -----------------------------------------------------------------------------------


class _HashingWriter:
    """A write-only file wrapper that hashes and counts what passes through: the checksum costs
    no second read of a checkpoint (``torch.save`` writes straight into it)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.sha256.update(data)
        n = self._f.write(data)
        self.size += n
        return n

    def flush(self) -> None:
        self._f.flush()


def _parse(info: CheckpointInfo, raw: bytes, map_location: Any) -> Any:
    if info.format == "bin":
        return raw
    if info.format == "json":
        try:
            return json.loads(raw)
        except ValueError as e:
            raise CorruptCheckpoint(f"{info.path}: not JSON ({e})") from e
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"{info.path} is a PyTorch checkpoint; loading it needs torch") from e
    try:
        return torch.load(io.BytesIO(raw), map_location=map_location, weights_only=True)
    except Exception as e:
        # The bytes are the ones written (verified above), so this is no torn file: most likely
        # an object that weights_only refuses to unpickle. Raise rather than skip it: skipping
        # would silently resume from an older checkpoint, or from scratch.
        raise RuntimeError(
            f"{info.path} is intact but torch.load(weights_only=True) refuses "
            f"it; save only state dicts, tensors and plain values ({e})"
        ) from e


def _meta_writer(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_bytes()).get("writer"))
    except (OSError, ValueError, AttributeError):
        return None


def _writer_host() -> str:
    """This host and pid namespace, as a file name part without dots: two processes can
    judge each other's pids only when this matches."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", os.uname().nodename)[:63] or "host"
    try:
        ns = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))
    except OSError:
        ns = ""
    return f"{host}-{ns}" if ns else host


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie counts as gone: it will never write again)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 :][:1] != b"Z"
    except (OSError, ValueError):
        return True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> int:
    try:
        path.unlink()
        return 1
    except FileNotFoundError:
        return 0


_WRITER_HOST = _writer_host()
