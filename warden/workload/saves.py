"""Where a job saves, and how each file it saved came to be under its final name: the part of
`check-workload` that reads inotify's events (warden.workload.inotify)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from warden.workload.inotify import CREATE, MODIFY, MOVED_FROM, MOVED_TO, Event


@dataclass(frozen=True)
class Target:
    """Where to look for checkpoints: a directory watched recursively (also the job's
    `WARDEN_CHECKPOINT_DIR`) and, for `--checkpoint` with a file name or a glob, the pattern
    that names checkpoint files in it (relative to the directory)."""

    root: Path
    pattern: str | None = None

    @classmethod
    def parse(cls, spec: str, base: Path) -> Target:
        """`DIR`, `DIR/` or an existing directory: every file under it; `PATH` or a glob
        (`out/ckpt-*.pt`): the files it names, watched from the glob-free directory above."""
        path = Path(spec).expanduser()
        path = path if path.is_absolute() else base / path
        parts = path.parts
        globbed = next((i for i, part in enumerate(parts) if any(ch in part for ch in "*?[")), None)
        if globbed is not None:
            return cls(Path(*parts[:globbed]), "/".join(parts[globbed:]))
        if spec.endswith("/") or path.is_dir():
            return cls(path)
        return cls(path.parent, path.name)

    def matches(self, rel: str) -> bool:
        return self.pattern is None or fnmatch.fnmatchcase(rel, self.pattern)

    def describe(self) -> str:
        return str(self.root / self.pattern) if self.pattern else f"{self.root}/"


def arrival(events: Sequence[Event], rel: str) -> tuple[bool, str] | None:
    """How the file `rel` got its present content during `events` (those after SIGTERM):
    (True, how) when it appeared whole (renamed or linked into place, or inside a directory
    renamed into place), (False, how) when it was written under its final name or inside a
    directory created under its final name, None when nothing after SIGTERM touched it."""
    own = [e for e in events if e.path == rel]
    moves = [e for e in own if e.has(MOVED_TO)]
    after = moves[-1].seq if moves else -1
    writes = [e for e in own if e.seq > after and e.has(MODIFY)]
    if writes:
        created = any(e.seq > after and e.has(CREATE) for e in own)
        return False, f"{rel} was {'created and ' if created else ''}written in place under its final name"
    if moves:
        sources = [e.path for e in events if e.has(MOVED_FROM) and e.cookie == moves[-1].cookie]
        return True, f"{rel} appeared by rename from {sources[-1] if sources else 'outside the directory'}"
    if any(e.has(CREATE) for e in own):
        return True, f"{rel} appeared whole (linked into place)"
    parts = rel.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        ancestor = "/".join(parts[:depth])
        seen = [e for e in events if e.path == ancestor and e.is_dir]
        if any(e.has(MOVED_TO) for e in seen):
            return True, f"{rel} arrived inside {ancestor}/, renamed into place"
        if any(e.has(CREATE) for e in seen):
            return False, f"{rel} was written inside {ancestor}/, created under its final name"
    return None


def files(target: Target) -> list[str]:
    """Checkpoint files under the target now, relative to its root."""
    out = []
    for directory, _, names in os.walk(target.root):
        rel_dir = os.path.relpath(directory, target.root)
        for name in names:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if target.matches(rel):
                out.append(rel)
    return sorted(out)
