"""Who a job runs as: never the server's uid when the server could switch (it runs as root).

Two ways, chosen at install (docs/security.md):

- *dynamic* (the default): every running attempt gets a uid of its own from a reserved range
  (gid = the same number, no supplementary groups), like systemd's DynamicUser. Jobs cannot
  read, write or signal each other, the server or its files. A uid is never handed out while an
  attempt holds it or while any process runs under it, and never when it names an account or a
  group of this machine.
- *user*: the submitting warden user's own Unix account (mapped by name, or through an explicit
  map), with its primary and supplementary groups, as Slurm does. A warden user without an
  account, or one that maps to root or to the server's own uid, gets a dynamic uid instead.

A server that is not root cannot switch: `Identities.fixed()` runs jobs as the server's uid,
and the server says so loudly at start.
"""

from __future__ import annotations

import grp
import os
import pwd
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Key = tuple[str, int]
Mode = Literal["dynamic", "user", "none"]

DEFAULT_JOB_UIDS = range(61000, 62000)
"""61000-61999: above ordinary accounts, and every uid of it that is an account, a group or
owned by a live process is skipped, so it may overlap systemd's dynamic range (61184-65519)."""


class NoIdentity(OSError):
    """No uid is free for a new attempt (every uid of the range is held), or a mapping is broken."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The Unix identity one attempt runs as; `dynamic` when its uid is from the range."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    name: str | None = None
    home: str | None = None
    dynamic: bool = False


def parse_uid_range(text: str) -> range:
    """`LO-HI` (inclusive) as a range of uids; ValueError when malformed, empty or touching 0."""
    lo_text, sep, hi_text = text.partition("-")
    try:
        lo, hi = int(lo_text), int(hi_text if sep else lo_text)
    except ValueError:
        raise ValueError(f"job uids: expected LO-HI, got {text!r}") from None
    if lo <= 0 or hi < lo or hi >= 2**32 - 1:
        raise ValueError(f"job uids: {text!r} must be 1 <= LO <= HI < 4294967295")
    return range(lo, hi + 1)


def parse_user_map(items: Iterable[str]) -> dict[str, str]:
    """`WARDEN_USER=ACCOUNT` pairs (`*` maps every user without a pair of their own)."""
    mapping: dict[str, str] = {}
    for item in items:
        user, sep, account = item.partition("=")
        if not sep or not user or not account:
            raise ValueError(f"user map: expected WARDEN_USER=ACCOUNT, got {item!r}")
        mapping[user] = account
    return mapping


def uids_of_live_processes() -> set[int]:
    """Real, effective, saved and filesystem uids of every process, from /proc."""
    found: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Uid:"):
                        found.update(int(v) for v in line.split()[1:])
                        break
        except OSError:
            continue
    return found


def _is_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        try:
            grp.getgrgid(uid)
        except KeyError:
            return False
    return True


@dataclass
class UidPool:
    """Hands out uids of `uids` to attempts, one each; thread-safe. Picks round-robin from
    the last one given, so a uid is reused as late as possible (files a job left in a shared
    place such as /tmp stay its own the longest)."""

    uids: range
    _held: dict[Key, int] = field(default_factory=dict)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, key: Key) -> int:
        with self._lock:
            if key in self._held:
                return self._held[key]
            held = set(self._held.values())
            busy = uids_of_live_processes()
            for step in range(len(self.uids)):
                index = (self._next + step) % len(self.uids)
                uid = self.uids[index]
                if uid in held or uid in busy or _is_account(uid):
                    continue
                self._held[key] = uid
                self._next = index + 1
                return uid
        raise NoIdentity(f"no free job uid in {self.uids.start}-{self.uids.stop - 1} ({len(held)} held)")

    def claim(self, key: Key, uid: int) -> None:
        """Mark `uid` as held by an attempt found running again (after a restart)."""
        with self._lock:
            self._held[key] = uid

    def release(self, key: Key) -> int | None:
        with self._lock:
            return self._held.pop(key, None)

    def held(self) -> dict[Key, int]:
        with self._lock:
            return dict(self._held)


class Identities:
    """Chooses the identity of each attempt, and remembers the dynamic uids attempts hold."""

    def __init__(
        self, mode: Mode = "dynamic", uids: range = DEFAULT_JOB_UIDS, user_map: Mapping[str, str] | None = None
    ) -> None:
        if mode != "none" and os.geteuid() != 0:
            raise PermissionError(f"running jobs as other users ({mode}) needs a server running as root")
        self.mode = mode
        self.pool = UidPool(uids)
        self.user_map = dict(user_map or {})

    @classmethod
    def fixed(cls) -> Identities:
        """Jobs run as this process's own uid: what a server that is not root can do."""
        return cls("none")

    @classmethod
    def default(cls) -> Identities:
        """Dynamic uids when this process is root, else the process's own uid."""
        return cls("dynamic") if os.geteuid() == 0 else cls.fixed()

    @property
    def switching(self) -> bool:
        return self.mode != "none"

    def acquire(self, key: Key, user: str | None) -> Identity | None:
        """The identity for a new attempt (None: the server's own)."""
        if self.mode == "none":
            return None
        if self.mode == "user" and user is not None:
            mapped = self.account(user)
            if mapped is not None:
                return mapped
        uid = self.pool.acquire(key)
        return Identity(uid=uid, gid=uid, dynamic=True)

    def account(self, user: str) -> Identity | None:
        """The Unix account `user` maps to (`user_map`, else `*`, else the same name); None when
        there is none, or it is root, the server's or in the dynamic range."""
        name = self.user_map.get(user, self.user_map.get("*", user))
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        if entry.pw_uid in (0, os.geteuid()) or entry.pw_uid in self.pool.uids:
            return None
        groups = tuple(g for g in os.getgrouplist(name, entry.pw_gid) if g != 0)
        return Identity(entry.pw_uid, entry.pw_gid, groups, entry.pw_name, entry.pw_dir)

    def claim(self, key: Key, uid: int | None) -> None:
        """An adopted attempt keeps the dynamic uid it runs under."""
        if uid is not None and uid in self.pool.uids:
            self.pool.claim(key, uid)

    def release(self, key: Key) -> None:
        self.pool.release(key)

    def shared_accounts(self) -> dict[str, list[str]]:
        """The Unix accounts `user_map` runs more than one warden user's jobs as, each with whose
        (`*` standing for every user the map does not name). Jobs of one account can read each
        other's environment (report tokens and secrets included) and files, and signal each other:
        nothing on the machine tells them apart."""
        if self.mode != "user":
            return {}
        users: dict[str, list[str]] = {}
        for user, account in sorted(self.user_map.items(), key=lambda item: (item[0] == "*", item[0])):
            users.setdefault(account, []).append(user)
        return {account: names for account, names in users.items() if len(names) > 1 or "*" in names}

    def describe(self) -> str:
        if self.mode == "none":
            return f"jobs run as the server's own uid {os.geteuid()} (no isolation: the server is not root)"
        uids = f"{self.pool.uids.start}-{self.pool.uids.stop - 1}"
        if self.mode == "user":
            return f"jobs run as their user's Unix account (else a uid of {uids})"
        return f"jobs run as a uid of their own from {uids}"
