"""The API's connections: how long a client may take to send a request, how many connections
the server holds, and what it does at the file-descriptor limit.

uvicorn's h11 protocol times out only an idle keep-alive connection; a client that sends half
a request head, or trickles its body, would hold its connection (a file descriptor, a little
memory) for ever, and enough of them use up the process's descriptors. Here:

- a request head must arrive within `HEAD_TIMEOUT_S` of the connection being made (or of the
  previous answer on it), and its body at `MIN_BODY_BYTES_PER_S` on average after a first
  `BODY_TIMEOUT_S`; else the server answers 408 and closes the connection
  (`TimedH11Protocol`). Time the server itself takes to answer never counts;
- a TLS handshake must finish within `HANDSHAKE_TIMEOUT_S` (asyncio's default is 60 s;
  `ServerLoop`);
- the soft RLIMIT_NOFILE is raised to the hard limit at start and the connections open are
  capped below it (`MAX_CONNECTIONS`, less `FD_RESERVE` descriptors kept for the database, job
  logs and executors; half the limit where it is lower). A connection above the cap is refused
  as it is accepted: answered 503 with `Retry-After` (over plain HTTP; over TLS it is closed
  without a word) and closed at once, before asyncio makes it a transport, so a flood never
  holds more descriptors than the cap (`ListeningSocket`);
- when accept() fails for want of descriptors anyway (EMFILE, ENFILE: the process or the system
  is out of them), the connection waiting is accepted on a spare descriptor and refused the
  same way (asyncio's own accept loop would log a traceback for each try, up to the backlog,
  2048, per wake-up).

Refusals of these kinds are logged at most once per `LOG_EVERY_S`, with a count of the others.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import socket
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from warden.server.errors import error_body

__all__ = [
    "BODY_TIMEOUT_S",
    "CLOSE_TIMEOUT_S",
    "HANDSHAKE_TIMEOUT_S",
    "HEAD_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MIN_BODY_BYTES_PER_S",
    "ListeningSocket",
    "ServerLoop",
    "TimedH11Protocol",
    "connection_cap",
    "connection_settings",
    "listening",
]

log = logging.getLogger("warden.server")

HEAD_TIMEOUT_S = 10.0
"""Time a client has to send a whole request head, from connecting or from the previous answer."""
BODY_TIMEOUT_S = 10.0
"""Time a request body may take before `MIN_BODY_BYTES_PER_S` applies to what has come."""
MIN_BODY_BYTES_PER_S = 64 * 1024
"""The slowest average a request body may arrive at after its first `BODY_TIMEOUT_S`: the
default 1 MiB body limit then allows 26 s."""
HANDSHAKE_TIMEOUT_S = 10.0
"""Time a TLS client has to finish its handshake."""
CLOSE_TIMEOUT_S = 2.0
"""Time a TLS client has to answer the server's close_notify before its connection is dropped."""
MAX_CONNECTIONS = 4096
"""Connections served at once, at most (fewer where the descriptor limit is lower)."""
FD_RESERVE = 256
"""Descriptors kept out of the connections' reach: the database, logs, jobs' pipes."""
LOG_EVERY_S = 60.0
"""A refusal of the kinds above is logged at most this often."""


class _Episodes:
    """One log line for the first of a run of like events, then one a `LOG_EVERY_S` at most,
    counting the ones not logged."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._logged_at = -float("inf")
        self._unlogged = 0

    def happened(self, detail: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last such line)" if self._unlogged else ""
        log.warning("%s: %s%s; logged at most once a %.0f s", self.what, detail, more, LOG_EVERY_S)
        self._logged_at, self._unlogged = now, 0


class _Limits:
    """The cap `listening` set at start, the connections open, and the refusals logged."""

    max_connections = MAX_CONNECTIONS
    open = 0  # connections accepted and not closed yet (the event loop's thread alone counts them)
    over_limit = _Episodes("connections refused (503)")
    out_of_descriptors = _Episodes("connections refused: out of file descriptors")


LIMITS = _Limits()


def _raw_answer(status: int, reason: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, in the API's error shape, for a
    connection no request of which reached the app."""
    body = json.dumps(error_body([{"field": "request", "value": None, "message": message}])).encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{k}: {v}" for k, v in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on what the client sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the head, or the body, began to be awaited
        self._body_bytes = 0
        self._in_body = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """At the server's stop, a connection with no request in progress and nothing left to
        send is dropped at once: over TLS a polite close waits for the client's close_notify,
        which an idle client (a pooled keep-alive connection) does not send, and the stop would
        wait `CLOSE_TIMEOUT_S` for it."""
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self.transport.get_write_buffer_size() == 0:
            self.transport.abort()
        else:
            super().shutdown()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        their, ours = self.conn.their_state, self.conn.our_state
        if their is h11.SEND_BODY and ours is h11.SEND_RESPONSE and not (self.cycle and self.cycle.response_started):
            if not self._in_body:
                self._in_body, self._since, self._body_bytes = True, self.loop.time(), 0
                self._arm(BODY_TIMEOUT_S)
            self._body_bytes += len(data)
        elif their is not h11.IDLE:  # the whole request is in: the time from here is the server's
            self._stop_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()

    def _await_head(self) -> None:
        self._in_body, self._since = False, self.loop.time()
        self._arm(HEAD_TIMEOUT_S)

    def _arm(self, delay: float) -> None:
        self._stop_timer()
        self._timer = self.loop.call_later(max(delay, 0.0), self._expired)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if not self._in_body:
            if self.cycle is None or self.cycle.response_complete:  # no request in the app's hands
                self._refuse(408, "Request Timeout", f"no whole request head within {HEAD_TIMEOUT_S:g} s")
            return
        if self.flow.read_paused:  # the server has not read what came: not the client's delay
            self._since = now - BODY_TIMEOUT_S - self._body_bytes / MIN_BODY_BYTES_PER_S
            self._arm(BODY_TIMEOUT_S)
            return
        allowed = self._since + BODY_TIMEOUT_S + self._body_bytes / MIN_BODY_BYTES_PER_S
        if now < allowed:
            self._arm(allowed - now)
            return
        self._refuse(
            408,
            "Request Timeout",
            f"the request body came slower than {MIN_BODY_BYTES_PER_S // 1024} KiB/s "
            f"({self._body_bytes} bytes in {now - self._since:.0f} s)",
        )

    def _refuse(self, status: int, reason: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Answer `status` and close; a request the app is reading sees a disconnect."""
        self._stop_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(_raw_answer(status, reason, message, headers))
        self.transport.close()


class ServerLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, with TLS handshakes bounded by `HANDSHAKE_TIMEOUT_S` and closing ones
    (asyncio waits 30 s for a client's close_notify, holding the connection) by
    `CLOSE_TIMEOUT_S`, and accept()'s
    running out of descriptors left to `ListeningSocket` to log."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            if kwargs.get("ssl_handshake_timeout") is None:
                kwargs["ssl_handshake_timeout"] = HANDSHAKE_TIMEOUT_S
            if kwargs.get("ssl_shutdown_timeout") is None:
                kwargs["ssl_shutdown_timeout"] = CLOSE_TIMEOUT_S
        return await super().create_server(*args, **kwargs)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        err = context.get("exception")
        if isinstance(err, OSError) and err.errno in _OUT_OF_DESCRIPTORS and "accept" in str(context.get("message")):
            return  # counted where it happened, logged once an episode
        super().call_exception_handler(context)


_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class _CountedSocket(socket.socket):
    """An accepted connection, counted in `LIMITS.open` until its descriptor is closed."""

    _counted = True

    def close(self) -> None:
        if self._counted:
            self._counted = False
            LIMITS.open -= 1
        super().close()


class ListeningSocket(socket.socket):
    """The listening socket, as asyncio accepts on it.

    Over the connection cap, the connection is refused here (`_refuse`) and asyncio is told
    there is nothing to accept now: it asks again when the event loop next polls, so a flood
    is refused at the pace of the loop, never holding more than one descriptor at a time.
    Out of descriptors, the connection waiting is accepted on a spare one and refused the same
    way; without a spare, asyncio stops accepting for a second, once (its own accept loop would
    try again up to its backlog, 2048, times, each try logging a traceback)."""

    refusal: bytes | None = None
    """What a refused connection is told before it is closed (None: nothing, as over TLS)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spare: int | None = _spare_fd()
        self._paused_until = 0.0

    def accept(self) -> tuple[socket.socket, Any]:
        if time.monotonic() < self._paused_until:
            raise BlockingIOError(errno.EAGAIN, "accepting paused: out of descriptors")
        try:
            fd, address = self._accept()  # type: ignore[attr-defined]
        except OSError as err:
            if err.errno not in _OUT_OF_DESCRIPTORS:
                raise
            LIMITS.out_of_descriptors.happened(f"accept(): {os.strerror(err.errno)}")
            if self._spare is not None:
                os.close(self._spare)
                self._spare = None
                try:
                    self._refuse(*self._accept())  # type: ignore[attr-defined]
                except OSError:
                    pass
                self._spare = _spare_fd()
                if self._spare is not None:
                    raise BlockingIOError(
                        errno.EAGAIN, "out of descriptors: the waiting connection was refused"
                    ) from None
            self._paused_until = time.monotonic() + 1.0
            raise
        if LIMITS.open >= LIMITS.max_connections:
            LIMITS.over_limit.happened(f"{LIMITS.open} connections open, at most {LIMITS.max_connections}")
            self._refuse(fd, address)
            raise BlockingIOError(errno.EAGAIN, "over the connection cap: the connection was refused")
        conn = _CountedSocket(self.family, self.type, self.proto, fileno=fd)
        LIMITS.open += 1
        return conn, address

    def _refuse(self, fd: int, _address: Any) -> None:
        """Tell the connection on `fd` why (`refusal`) and close it now. What the client sent
        is read first, where it has come, so that the close does not reset the connection
        and lose the answer."""
        with socket.socket(self.family, self.type, self.proto, fileno=fd) as conn:
            if self.refusal is not None:
                conn.setblocking(False)
                try:
                    conn.send(self.refusal)  # a fresh socket's buffer takes it whole
                    conn.recv(1 << 16)
                except OSError:
                    pass

    def close(self) -> None:
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        super().close()


def _spare_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def raise_fd_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard limit; the limit now (unlimited: a large number)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 2**20


def connection_cap(fd_limit: int) -> int:
    """Connections served at once under a descriptor limit of `fd_limit`."""
    return max(1, min(MAX_CONNECTIONS, max(fd_limit - FD_RESERVE, fd_limit // 2)))


def listening(sock: socket.socket, tls: bool = False) -> ListeningSocket:
    """`sock` as the server should accept on it (`ListeningSocket`), the descriptor limit
    raised and the connection cap set below it; `sock` itself is left to its owner to close.
    `tls`: the server speaks TLS on it (a refusal cannot be written in clear then)."""
    limit = raise_fd_limit()
    LIMITS.max_connections = connection_cap(limit)
    guarded = ListeningSocket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
    guarded.set_inheritable(False)
    if not tls:
        guarded.refusal = _raw_answer(
            503,
            "Service Unavailable",
            "the server holds as many connections as it may, or is out of file descriptors; retry shortly",
            (("retry-after", "1"),),
        )
    return guarded


def connection_settings() -> dict[str, Any]:
    """The `uvicorn.Config` arguments that put these bounds in place (TLS or not)."""
    return {"http": TimedH11Protocol, "loop": f"{__name__}:ServerLoop"}
