"""Cgroups for the local executor's replicas: each replica's processes in a cgroup of their own,
with bounds of their own (processes, memory, the GPU device nodes it was not given), so that
nothing of an attempt escapes it and the whole of it can be killed at once. What Slurm's
proctrack/task cgroup plugins, Kubernetes and systemd do.

The replica's shim (`warden.executors.shim`, which runs as the server) makes the cgroup before
it starts the job, puts the job into it between fork and exec, and once the job's main process
and its process group are gone, kills whatever is left in it (double forks, `setsid`) and
removes it. The attempt's end is the moment its cgroup is empty.

Both hierarchies are supported:
- cgroup v1 (a directory per controller: pids, memory, devices, freezer): `pids.max`,
  `memory.limit_in_bytes`, `devices.deny`; killed whole by freezing it (`freezer.state`
  FROZEN), SIGKILL to every process in `cgroup.procs`, THAWED;
- cgroup v2 (one unified hierarchy): `pids.max`, `memory.max`, and device nodes refused by an
  eBPF program attached to the cgroup (v2 has no devices files: `attach_device_filter` loads
  one through the bpf() system call); killed whole by `cgroup.kill` (else frozen with
  `cgroup.freeze` and killed).

warden's cgroups go under `<the server's own cgroup>/<parent>/<name>`, `parent` being
`warden/<an id of the server's state directory>`, so that servers on one machine never collide.

Only the standard library is imported: the shim uses this module.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

V1_CONTROLLERS = ("pids", "memory", "devices", "freezer")
"""The cgroup v1 controllers warden uses, each where it is mounted."""
V2_CONTROLLERS = ("pids", "memory")
"""The cgroup v2 controllers warden enables for its cgroups."""
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_FREEZE_WAIT_S = 2.0


class CgroupError(OSError):
    """A cgroup could not be made, bounded or joined: what and why, in words."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where warden may make cgroups on this machine: the version, and per controller (v1) or
    for the unified hierarchy (v2, controller ""), the directory its cgroups go under."""

    version: int
    bases: tuple[tuple[str, str], ...]

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.bases) if self.version == 1 else V2_CONTROLLERS

    @property
    def unenforced(self) -> tuple[str, ...]:
        """What this layout cannot bound, in words (empty when everything is)."""
        missing = []
        if "pids" not in self.controllers:
            missing.append("the number of processes (no pids controller)")
        if "memory" not in self.controllers:
            missing.append("memory (no memory controller)")
        if self.version == 1 and "devices" not in self.controllers:
            missing.append("GPU device nodes (no devices controller)")
        return tuple(missing)

    def describe(self) -> str:
        where = ", ".join(f"{c}: {d}" if c else d for c, d in self.bases)
        return f"cgroup v{self.version} ({', '.join(self.controllers)}) under {where}"


@dataclass(frozen=True, slots=True)
class Group:
    """One replica's cgroup: its directory in each hierarchy (v1: per controller; v2: one)."""

    version: int
    dirs: tuple[tuple[str, str], ...]

    def record(self) -> dict[str, object]:
        """What the shim writes in its status file, so that an adopter finds the cgroup."""
        return {"version": self.version, "dirs": dict(self.dirs)}

    @classmethod
    def from_record(cls, data: object, layout: Layout | None, parent: str) -> Group | None:
        """The cgroup a status record names, only where it is one of `parent`'s under `layout`
        (a record names nothing else this server kills); None otherwise."""
        if layout is None or not isinstance(data, dict) or data.get("version") != layout.version:
            return None
        dirs = data.get("dirs")
        if not isinstance(dirs, dict) or not dirs:
            return None
        bases = dict(layout.bases)
        for controller, path in dirs.items():
            base = bases.get(controller)
            if base is None or not isinstance(path, str):
                return None
            under = os.path.join(base, parent) + "/"
            name = path[len(under) :]
            if not path.startswith(under) or not _NAME.fullmatch(name):
                return None
        return cls(layout.version, tuple(sorted(dirs.items())))

    def _dir(self, controller: str) -> str | None:
        for c, d in self.dirs:
            if c == controller or self.version == 2:
                return d
        return None

    @property
    def main(self) -> str:
        """The directory whose `cgroup.procs` lists the replica's processes."""
        for controller in ("freezer", "pids", "memory", "devices", ""):
            found = self._dir(controller)
            if found is not None:
                return found
        return self.dirs[0][1]


# -- finding the hierarchy ------------------------------------------------------------------------


def parse_mounts(text: str) -> tuple[dict[str, str], str | None]:
    """From /proc/self/mounts: the mount point of each v1 controller warden uses, and of the
    unified (v2) hierarchy (None if not mounted)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, kind, options = fields[1].replace("\\040", " "), fields[2], fields[3].split(",")
        if kind == "cgroup2" and v2 is None:
            v2 = point
        elif kind == "cgroup":
            for controller in V1_CONTROLLERS:
                if controller in options:
                    v1.setdefault(controller, point)
    return v1, v2


def parse_own(text: str) -> tuple[dict[str, str], str | None]:
    """From /proc/self/cgroup: this process's cgroup in each v1 controller's hierarchy, and in
    the unified one (None if none)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        for controller in controllers.split(","):
            if controller in V1_CONTROLLERS:
                v1[controller] = path
    return v1, v2


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def find_layout(parent: str) -> Layout | str:
    """The layout where `parent` (e.g. `warden/3f2a…`) can be made and written now, made if
    missing; else why there is none, in words. cgroup v1 wherever any of its controllers warden
    uses is mounted (a "hybrid" machine included), else v2."""
    try:
        v1_mounts, v2_mount = parse_mounts(_read("/proc/self/mounts"))
        v1_own, v2_own = parse_own(_read("/proc/self/cgroup"))
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror or exc})"
    if v1_mounts:
        bases = []
        problems = []
        for controller in V1_CONTROLLERS:
            if controller not in v1_mounts:
                continue
            base = os.path.normpath(os.path.join(v1_mounts[controller], v1_own.get(controller, "/").lstrip("/")))
            try:
                os.makedirs(os.path.join(base, parent), exist_ok=True)
                if not os.access(os.path.join(base, parent, "cgroup.procs"), os.W_OK):
                    raise PermissionError(errno.EACCES, "not writable")
            except OSError as exc:
                problems.append(f"{controller}: {os.path.join(base, parent)}: {exc.strerror or exc}")
                continue
            bases.append((controller, base))
        if not bases:
            return "no cgroup v1 hierarchy is writable (" + "; ".join(problems) + ")"
        return Layout(1, tuple(bases))
    if v2_mount is None or v2_own is None:
        return "no cgroup hierarchy is mounted"
    own = os.path.normpath(os.path.join(v2_mount, v2_own.lstrip("/")))
    why = ""
    # The server's own cgroup holds processes (the server), so only a cgroup with none may
    # hand controllers down: the own one at the root, else its parent where systemd marked it
    # delegated to this server (Delegate=yes with DelegateSubgroup=), never a cgroup of others.
    for base in (own, os.path.dirname(own)):
        if base != own and not _delegated(base):
            why = why or f"{base}: not delegated (systemd: Delegate=yes, DelegateSubgroup=)"
            continue
        try:
            _enable(base, parent)
        except OSError as exc:
            why = why or f"{base}: {exc.strerror or exc}"
            continue
        return Layout(2, (("", base),))
    return f"the cgroup v2 hierarchy is not delegated to this server ({why})"


def _delegated(path: str) -> bool:
    """Whether systemd marked the cgroup `path` as delegated (its `trusted.delegate` or
    `user.delegate` extended attribute is "1")."""
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name) == b"1":
                return True
        except OSError:
            continue
    return False


def _enable(base: str, parent: str) -> None:
    """Make `base/parent` and enable the v2 controllers warden uses in every cgroup from
    `base` down to it (each must hand them to its children)."""
    available = _read(os.path.join(base, "cgroup.controllers")).split()
    wanted = [c for c in V2_CONTROLLERS if c in available]
    here = base
    for part in ["", *parent.split("/")]:
        here = os.path.join(here, part) if part else here
        os.makedirs(here, exist_ok=True)
        if wanted:
            _write(os.path.join(here, "cgroup.subtree_control"), " ".join(f"+{c}" for c in wanted))


# -- one replica's cgroup -------------------------------------------------------------------------


def create(
    layout: Layout,
    parent: str,
    name: str,
    *,
    max_processes: int = 0,
    memory_bytes: int = 0,
    deny_devices: tuple[tuple[str, int, int], ...] = (),
) -> Group:
    """Make the cgroup `parent/name` and bound it: at most `max_processes` processes and
    threads, `memory_bytes` of memory (0: no bound of its own), no access to the device nodes
    `deny_devices` (type "c" or "b", major, minor). Raises CgroupError naming what failed."""
    if not _NAME.fullmatch(name):
        raise CgroupError(errno.EINVAL, f"cgroup name {name!r} is not one warden makes")
    dirs = []
    for controller, base in layout.bases:
        path = os.path.join(base, parent, name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise CgroupError(exc.errno, f"cannot make the cgroup {path}: {exc.strerror or exc}") from exc
        dirs.append((controller, path))
    group = Group(layout.version, tuple(dirs))
    settings: list[tuple[str | None, str, str]] = []
    if max_processes > 0:
        settings.append((group._dir("pids"), "pids.max", str(max_processes)))
    if memory_bytes > 0:
        if layout.version == 1:
            settings.append((group._dir("memory"), "memory.limit_in_bytes", str(memory_bytes)))
        else:
            settings += [
                (group._dir("memory"), "memory.max", str(memory_bytes)),
                (group._dir(""), "memory.swap.max", "0"),
            ]
    if layout.version == 1:
        settings += [
            (group._dir("devices"), "devices.deny", f"{kind} {major}:{minor} rwm")
            for kind, major, minor in deny_devices
        ]
    for directory, file, value in settings:
        if directory is None or (file == "memory.swap.max" and not os.path.exists(os.path.join(directory, file))):
            continue
        try:
            _write(os.path.join(directory, file), value)
        except OSError as exc:
            remove(group, wait_s=0)
            raise CgroupError(exc.errno, f"cannot set {file} to {value} in {directory}: {exc.strerror or exc}") from exc
    if layout.version == 2 and deny_devices:
        try:
            attach_device_filter(group.main, deny_devices)
        except CgroupError:
            remove(group, wait_s=0)
            raise
    if layout.version == 1 and memory_bytes > 0:  # swap too, where the kernel accounts it
        memsw = group._dir("memory")
        if memsw is not None and os.path.exists(os.path.join(memsw, "memory.memsw.limit_in_bytes")):
            try:
                _write(os.path.join(memsw, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            except OSError:
                pass
    return group


def join(group: Group) -> None:
    """Move the calling process into `group` (every hierarchy): in the job's process between
    fork and exec, while it is still privileged, so that it never runs a moment outside."""
    pid = str(os.getpid())
    for _, path in group.dirs:
        _write(os.path.join(path, "cgroup.procs"), pid)


def _state(pid: int) -> str | None:
    try:
        text = _read(f"/proc/{pid}/stat")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :]
    return rest[:1] or None


def procs(group: Group) -> list[int]:
    """The live processes in the cgroup (zombies left out: they hold nothing but a pid, and
    their parent or the shim reaps them)."""
    try:
        text = _read(os.path.join(group.main, "cgroup.procs"))
    except FileNotFoundError:
        return []
    return [pid for pid in (int(w) for w in text.split()) if _state(pid) not in (None, "Z", "X")]


def stopped(group: Group) -> list[int]:
    """The processes of the cgroup that are stopped (state T: SIGSTOP, SIGTSTP and the like)."""
    return [pid for pid in procs(group) if _state(pid) == "T"]


def oom_kills(group: Group) -> int:
    """How many processes of the cgroup the kernel's OOM killer killed for its memory bound."""
    directory = group._dir("memory")
    if directory is None:
        return 0
    name = "memory.oom_control" if group.version == 1 else "memory.events"
    try:
        text = _read(os.path.join(directory, name))
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _freeze(group: Group, frozen: bool) -> bool:
    """Freeze (or thaw) the cgroup; False where it has no freezer."""
    if group.version == 1:
        directory = group._dir("freezer")
        if directory is None:
            return False
        _write(os.path.join(directory, "freezer.state"), "FROZEN" if frozen else "THAWED")
        if frozen:
            deadline = time.monotonic() + _FREEZE_WAIT_S
            while _read(os.path.join(directory, "freezer.state")).strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.001)
        return True
    path = os.path.join(group.main, "cgroup.freeze")
    if not os.path.exists(path):
        return False
    _write(path, "1" if frozen else "0")
    return True


def kill(group: Group) -> int:
    """SIGKILL every process of the cgroup, all at once: `cgroup.kill` (v2), else frozen first,
    so none can fork while the others are killed, then thawed so they die. Returns how many
    processes were in it. Waiting for them to be gone is the caller's (their parent reaps them)."""
    found = procs(group)
    if not found:
        return 0
    kill_file = os.path.join(group.main, "cgroup.kill")
    if group.version == 2 and os.path.exists(kill_file):
        _write(kill_file, "1")
        return len(found)
    frozen = False
    try:
        frozen = _freeze(group, True)
    except OSError:
        pass
    try:
        for _ in range(100):  # without a freezer, a fork may land between reading and killing
            pids = (
                procs(group)
                if not frozen
                else [int(w) for w in _read(os.path.join(group.main, "cgroup.procs")).split()]
            )
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if frozen:
                break
    finally:
        if frozen:
            _freeze(group, False)
    return len(found)


def remove(group: Group, wait_s: float = 1.0) -> bool:
    """Remove the (empty) cgroup from every hierarchy; False when one is left (busy still)."""
    deadline = time.monotonic() + wait_s
    left = list(group.dirs)
    while left:
        for item in list(left):
            try:
                os.rmdir(item[1])
                left.remove(item)
            except FileNotFoundError:
                left.remove(item)
            except OSError:
                pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return not left


def remove_parent(layout: Layout, parent: str) -> None:
    """Remove `parent` (e.g. `warden/3f2a…`) where it holds no cgroup any more; leave it where
    it does (a cgroup that is not empty cannot be removed) or cannot be removed."""
    for _, base in layout.bases:
        try:
            os.rmdir(os.path.join(base, parent))
        except OSError:
            continue


def gpu_device_nodes(directory: str = "/dev") -> dict[int, tuple[str, int, int]]:
    """The NVIDIA GPU device nodes present (`/dev/nvidiaN`), by index: (type, major, minor).
    `/dev/nvidiactl`, `/dev/nvidia-uvm` and the like are not among them: every job needs those."""
    found: dict[int, tuple[str, int, int]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        match = re.fullmatch(r"nvidia(\d+)", name)
        if match is None:
            continue
        node = device_node(os.path.join(directory, name))
        if node is not None:
            found[int(match.group(1))] = node
    return found


def device_node(path: str | Path) -> tuple[str, int, int] | None:
    """(type, major, minor) of a device node, None for anything else."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return ("c", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISBLK(st.st_mode):
        return ("b", os.major(st.st_rdev), os.minor(st.st_rdev))
    return None


# -- device nodes on cgroup v2: an eBPF program -------------------------------------------------

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_BPF_PROG_LOAD, _BPF_PROG_ATTACH = 5, 8
_BPF_PROG_TYPE_CGROUP_DEVICE, _BPF_CGROUP_DEVICE = 15, 6
_DEV_TYPE = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_filter(deny: tuple[tuple[str, int, int], ...]) -> bytes:
    """A BPF_PROG_TYPE_CGROUP_DEVICE program (its instructions) that refuses the device nodes
    `deny` and allows every other: r2 = type, r3 = major, r4 = minor from the context; for each
    denied node, three comparisons that skip to the next one, else return 0; at the end return 1."""
    program = [
        _insn(0x61, dst=2, src=1, off=0),  # r2 = ctx->access_type (u32)
        _insn(0x57, dst=2, imm=0xFFFF),  # r2 &= 0xffff: the device type
        _insn(0x61, dst=3, src=1, off=4),  # r3 = ctx->major
        _insn(0x61, dst=4, src=1, off=8),  # r4 = ctx->minor
    ]
    for kind, major, minor in deny:
        program += [
            _insn(0x55, dst=2, off=4, imm=_DEV_TYPE[kind]),  # if r2 != type: next
            _insn(0x55, dst=3, off=3, imm=major),  # if r3 != major: next
            _insn(0x55, dst=4, off=2, imm=minor),  # if r4 != minor: next
            _insn(0xB7, dst=0, imm=0),  # r0 = 0: refused
            _insn(0x95),  # exit
        ]
    program += [_insn(0xB7, dst=0, imm=1), _insn(0x95)]  # r0 = 1: allowed
    return b"".join(program)


def attach_device_filter(directory: str, deny: tuple[tuple[str, int, int], ...]) -> None:
    """Refuse the device nodes `deny` to every process of the cgroup v2 `directory`: load
    `device_filter` and attach it to the cgroup (it stays attached while the cgroup exists).
    Raises CgroupError where the kernel refuses or this machine's bpf() is unknown here."""
    machine = os.uname().machine
    number = _BPF_SYSCALL.get(machine)
    if number is None:
        raise CgroupError(errno.ENOSYS, f"cannot deny device nodes: no bpf() number known for {machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(device_filter(deny))
    license = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    struct.pack_into(
        "<IIQQ",
        attr,
        0,
        _BPF_PROG_TYPE_CGROUP_DEVICE,
        len(code.raw) // 8,
        ctypes.addressof(code),
        ctypes.addressof(license),
    )
    prog = libc.syscall(number, _BPF_PROG_LOAD, attr, ctypes.sizeof(attr))
    if prog < 0:
        err = ctypes.get_errno()
        raise CgroupError(err, f"cannot load the device filter of {directory}: {os.strerror(err)}")
    try:
        target = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attr = ctypes.create_string_buffer(128)
            struct.pack_into("<IIII", attr, 0, target, prog, _BPF_CGROUP_DEVICE, 0)
            if libc.syscall(number, _BPF_PROG_ATTACH, attr, ctypes.sizeof(attr)) < 0:
                err = ctypes.get_errno()
                raise CgroupError(err, f"cannot attach the device filter to {directory}: {os.strerror(err)}")
        finally:
            os.close(target)
    finally:
        os.close(prog)
