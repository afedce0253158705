"""Watch a directory tree with Linux inotify: what `check-workload` sees of a job's saves.

A job that does not use warden's SDK reports nothing, but the kernel tells who created,
wrote, renamed, opened and read which file, in order. That is enough to say from outside
whether a checkpoint appeared whole by a rename or was written in place under its final name,
and whether a second run opened it. Standard library only (ctypes over libc's inotify calls).

Events are numbered in the order the kernel queued them; `mark()` drains the queue first, so
"after the mark" means after whatever the caller did next (send SIGTERM, start a run).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ACCESS = 0x1
MODIFY = 0x2
CLOSE_WRITE = 0x8
CLOSE_NOWRITE = 0x10
OPEN = 0x20
MOVED_FROM = 0x40
MOVED_TO = 0x80
CREATE = 0x100
DELETE = 0x200
Q_OVERFLOW = 0x4000
IGNORED = 0x8000
ISDIR = 0x40000000
_MASK = ACCESS | MODIFY | CLOSE_WRITE | CLOSE_NOWRITE | OPEN | MOVED_FROM | MOVED_TO | CREATE | DELETE
_HEADER = struct.Struct("iIII")
MAX_DIRECTORIES = 4096
"""More directories than this under the root is not a checkpoint directory (each costs a
kernel watch, and the per-user limit is shared with every other program)."""


class WatchUnavailable(OSError):
    """inotify cannot be used here (not Linux, or the per-user watch limit is reached)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One kernel event: `path` relative to the watched root (the entry the event names),
    `cookie` pairing a MOVED_FROM with its MOVED_TO."""

    seq: int
    at: float
    path: str
    mask: int
    cookie: int

    @property
    def is_dir(self) -> bool:
        return bool(self.mask & ISDIR)

    def has(self, flag: int) -> bool:
        return bool(self.mask & flag)


class DirWatch:
    """Every event under `root` (subdirectories included, watched as they appear) from
    `start()` to `close()`, read by a thread as they come."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.events: list[Event] = []
        self.overflowed = False
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}  # watch descriptor -> directory relative to root ("" = root)
        self._closed = threading.Event()
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            init = self._libc.inotify_init1
        except (OSError, AttributeError) as err:
            raise WatchUnavailable(errno.ENOSYS, f"inotify is not available here ({err})") from None
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise WatchUnavailable(code, f"inotify_init1: {os.strerror(code)}")
        self._fd = fd
        try:
            self._add_tree(root, "")
        except OSError:
            os.close(fd)
            raise
        self._thread = threading.Thread(target=self._run, name="warden-check-inotify", daemon=True)
        self._thread.start()

    def mark(self) -> int:
        """Drain what the kernel has queued; events numbered from the returned value on
        happened after this call."""
        self._drain()
        with self._lock:
            return len(self.events)

    def since(self, mark: int) -> list[Event]:
        self._drain()
        with self._lock:
            return self.events[mark:]

    def rescan(self) -> None:
        """Watch every directory under the root again under its current name (a directory
        renamed after it was watched keeps reporting under its old name until then)."""
        with self._lock:
            self._paths.clear()
        self._add_more(self.root, "")

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join()
        os.close(self._fd)

    def __enter__(self) -> DirWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------

    def _add_tree(self, directory: Path, rel: str) -> None:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOENT, errno.ENOTDIR):
                return  # gone again before it could be watched
            raise WatchUnavailable(code, f"inotify_add_watch {directory}: {os.strerror(code)}")
        with self._lock:
            self._paths[wd] = rel
            watched = len(self._paths)
        if watched > MAX_DIRECTORIES:
            raise WatchUnavailable(errno.ENOSPC, f"more than {MAX_DIRECTORIES} directories under {self.root}")
        try:
            children = [entry for entry in os.scandir(directory) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for entry in children:
            self._add_tree(Path(entry.path), f"{rel}/{entry.name}" if rel else entry.name)

    def _run(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if ready:
                self._drain()

    def _drain(self) -> None:
        if self._closed.is_set():
            return
        new_dirs: list[tuple[Path, str]] = []
        with self._lock:
            while True:
                try:
                    data = os.read(self._fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    return
                now = time.time()
                offset = 0
                while offset + _HEADER.size <= len(data):
                    wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
                    raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
                    offset += _HEADER.size + length
                    if mask & Q_OVERFLOW:
                        self.overflowed = True
                        continue
                    if mask & IGNORED:
                        self._paths.pop(wd, None)
                        continue
                    parent = self._paths.get(wd)
                    if parent is None:
                        continue
                    name = os.fsdecode(raw.rstrip(b"\0"))
                    rel = f"{parent}/{name}" if parent and name else (name or parent)
                    self.events.append(Event(len(self.events), now, rel, mask, cookie))
                    if name and mask & ISDIR and mask & (CREATE | MOVED_TO):
                        new_dirs.append((self.root / rel, rel))
        for directory, rel in new_dirs:
            self._add_more(directory, rel)

    def _add_more(self, directory: Path, rel: str) -> None:
        """Watch a directory that appeared; past the limit the record is incomplete."""
        try:
            self._add_tree(directory, rel)
        except WatchUnavailable:
            self.overflowed = True
