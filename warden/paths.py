"""Where warden keeps its state unless told: one rule for the server and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

ROOT_STATE_DIR = Path("/var/lib/warden")
"""The state directory of a server run as root: systemd's `StateDirectory=` place, under
`/var/lib` (0755), so every uid a job runs as can pass through to its own directories."""


def default_state_dir() -> Path:
    """`$WARDEN_STATE_DIR`; else, for root, /var/lib/warden; else `$XDG_STATE_HOME/warden`,
    else ~/.local/state/warden (the XDG base-directory default). A root server runs jobs as
    other uids, which cannot pass through root's home (0700 on a fresh machine): its state
    cannot live there."""
    explicit = os.environ.get("WARDEN_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "warden"


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """`mkdir -p` whose missing directories get `mode` whatever the umask (a server runs with
    umask 077, which would make a missing `~/.local` 0700). Existing ones are left as they are."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        os.chmod(directory, mode)
