"""The API's listening sockets, bound before anything else starts.

- A loopback `--host` (127.0.0.1, ::1, localhost) is served on every loopback address of its
  port, IPv4 and IPv6, so no other process (a job) can listen on `[::1]:PORT` beside a server on
  `127.0.0.1:PORT` and answer clients for which `localhost` is `::1`. Another host is served on
  every address it resolves to.
- Sockets passed by systemd (socket activation, `LISTEN_FDS`/`LISTEN_PID`; deploy/warden.socket)
  are used as they are: systemd holds the address while the server restarts, so no job can take
  it in between.
- A port already taken is refused with who holds it (pid, user, command), read from /proc.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CannotListen", "holder_of", "inherited_sockets", "listen_sockets"]

LOOPBACK = ("127.0.0.1", "::1")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost", "ip6-loopback"})
FIRST_INHERITED_FD = 3  # SD_LISTEN_FDS_START


class CannotListen(Exception):
    """The API cannot listen where it was told (the port is taken, or the host does not
    resolve): refused at start, before the server touches its database or says it serves."""


def inherited_sockets() -> list[socket.socket]:
    """The listening sockets systemd passed to this process (socket activation), else none.
    The variables are removed so that no job inherits them."""
    pid, count = os.environ.pop("LISTEN_PID", None), os.environ.pop("LISTEN_FDS", None)
    os.environ.pop("LISTEN_FDNAMES", None)
    if pid is None or count is None:
        return []
    try:
        if int(pid) != os.getpid():
            return []
        number = int(count)
    except ValueError:
        raise CannotListen(f"$LISTEN_FDS {count!r} / $LISTEN_PID {pid!r}: not numbers") from None
    sockets = []
    for fd in range(FIRST_INHERITED_FD, FIRST_INHERITED_FD + number):
        sock = socket.socket(fileno=fd)
        if sock.type != socket.SOCK_STREAM:
            raise CannotListen(f"$LISTEN_FDS: file descriptor {fd} is not a stream socket (ListenStream=)")
        os.set_inheritable(fd, False)  # never a job's
        sockets.append(sock)
    return sockets


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound sockets for `host:port` (every address, as the module says); `CannotListen` when
    one cannot be bound, naming who holds it."""
    addresses = _addresses(host, port)
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses:
            sock = _bind(family, address, host, port)
            if sock is not None:
                sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _addresses(host: str, port: int) -> list[tuple[int, tuple[object, ...]]]:
    if host.lower() in LOOPBACK_NAMES:
        found: list[tuple[int, tuple[object, ...]]] = []
        for address in LOOPBACK:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            if family == socket.AF_INET6 and not socket.has_ipv6:
                continue
            found.append((family, (address, port, 0, 0) if family == socket.AF_INET6 else (address, port)))
        return found
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise CannotListen(f"--host {host}: cannot resolve it ({err.strerror})") from None
    if host in ("0.0.0.0", "::", ""):
        infos = infos[:1]
    seen: dict[tuple[object, ...], int] = {}
    for info in infos:
        seen.setdefault(tuple(info[4]), info[0])
    return [(family, address) for address, family in seen.items()]


def _bind(family: int, address: tuple[object, ...], host: str, port: int) -> socket.socket | None:
    """The socket bound to `address`; None for `::1` on a machine without an IPv6 loopback,
    where no other process can listen there either."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # [::] beside 0.0.0.0
    shown = f"[{address[0]}]:{port}" if family == socket.AF_INET6 else f"{address[0]}:{port}"
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise CannotListen(
                f"--port {port}: {shown} is in use ({holder_of(port)}): stop it, or give this server another --port"
            ) from None
        if err.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6 and host.lower() in LOOPBACK_NAMES:
            return None
        raise CannotListen(f"--port {port}: cannot listen on {shown}: {err.strerror or err}") from None
    sock.set_inheritable(False)
    return sock


def holder_of(port: int) -> str:
    """Who listens on TCP `port`, in words: each process holding such a socket (pid, user,
    command), as far as /proc shows it to this process."""
    inodes = set(_listening_inodes(port))
    if not inodes:
        return "held by a process this user cannot see"
    holders = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            links = [os.readlink(fd) for fd in (pid_dir / "fd").iterdir()]
        except OSError:
            continue
        if not any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            continue
        holders.append(_describe(pid_dir))
    if not holders:
        return "held by a process this user cannot see"
    return "held by " + "; ".join(holders)


def _listening_inodes(port: int) -> Iterable[str]:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # TCP_LISTEN
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                yield fields[9]


def _describe(pid_dir: Path) -> str:
    try:
        uid = pid_dir.stat().st_uid
        user = pwd.getpwuid(uid).pw_name
    except (OSError, KeyError):
        user = "?"
    try:
        command = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    return f"pid {pid_dir.name}, user {user}: {command[:120] or '?'}"
