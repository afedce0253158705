"""Slow, greedy and hostile clients against a real server process, over real sockets.

- A request head sent in part, on a new connection or after an answer on a kept-alive one,
  is answered 408 and closed once `HEAD_TIMEOUT_S` has passed; a body trickled slower than
  `MIN_BODY_BYTES_PER_S` is too, once `BODY_TIMEOUT_S` has passed. Neither before.
- With a low descriptor limit, a flood of half-sent connections is refused politely (503 and
  `Retry-After`, or the connection closed) beyond the connection cap; the log says so in a
  line or two, never a line or a traceback per connection; once the flood is over, the
  server answers again.
- The server's budget of expensive work: while one user's diff of a 20,000-queue policy is
  worked on, another user's diff is refused 503 with `Retry-After`, and `/v1/health` keeps
  answering at once. The diff is worked on in a worker process that does not hold the API's
  socket; a worker killed midway costs its request a 503, and the next diff is answered."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import ssl
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from serverproc import ADMIN, PROBE, Server, started, wait_for

from warden.server.connections import BODY_TIMEOUT_S, HEAD_TIMEOUT_S, connection_cap

POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"
HALF_HEAD = b"GET /v1/jobs HTTP/1.1\r\nHost: warden\r\nAuthorization: Bearer "
NOFILE = 128
"""The descriptor limit of the flooded server: its connection cap is far below the flood."""
FLOOD = 300


def connect(server: Server) -> socket.socket:
    """A connection to the server's API as the harness names it (TLS where it serves TLS: these
    tests are of timeouts, not of trust, so the certificate is not checked)."""
    url = urlsplit(server.url)
    assert url.hostname is not None and url.port is not None
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    if url.scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        sock = context.wrap_socket(sock, server_hostname=url.hostname)
    return sock


def answer_of(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (at most `timeout` s)."""
    sock.settimeout(timeout)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    raise AssertionError(f"the connection is still open after {timeout} s; it sent {b''.join(chunks)[:200]!r}")


def one_answer(sock: socket.socket) -> bytes:
    """One whole answer (its head and its Content-Length of body) on a kept-alive connection."""
    sock.settimeout(10)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a whole answer: {raw!r}"
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a whole answer: {raw + body!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else 0


@pytest.fixture
def server(tmp_path: Path) -> Server:
    s = started(tmp_path, POLICY)
    yield s
    s.stop()


def test_a_half_sent_head_and_a_trickled_body_are_answered_408_after_their_time(server: Server) -> None:
    head = connect(server)
    head.sendall(HALF_HEAD)
    kept = connect(server)
    kept.sendall(b"GET /v1/health HTTP/1.1\r\nHost: warden\r\n\r\n")
    first = one_answer(kept)
    assert status_of(first) == 200, first
    kept.sendall(HALF_HEAD)  # the next request on a kept-alive connection, never finished
    body = connect(server)
    body.sendall(
        b"POST /v1/jobs HTTP/1.1\r\nHost: warden\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + ADMIN.encode() + b"\r\nContent-Length: 100000\r\n\r\n{"
    )
    t0 = time.monotonic()
    trickled = threading.Event()

    def trickle() -> None:
        try:
            while not trickled.is_set():
                body.sendall(b" ")
                trickled.wait(0.2)
        except OSError:
            pass  # closed by the server: what the test waits for

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        # Meanwhile the server answers everyone else.
        for _ in range(5):
            assert PROBE.get(f"{server.url}/v1/health").status_code == 200
        answers = {
            name: answer_of(sock, HEAD_TIMEOUT_S + BODY_TIMEOUT_S + 20)
            for name, sock in (("head", head), ("kept", kept), ("body", body))
        }
        elapsed = time.monotonic() - t0
    finally:
        trickled.set()
        sender.join(10)
        for sock in (head, kept, body):
            sock.close()
    for name in ("head", "kept"):
        assert status_of(answers[name]) == 408, answers[name]
        assert f"no whole request head within {HEAD_TIMEOUT_S:g} s".encode() in answers[name]
    assert status_of(answers["body"]) == 408, answers["body"]
    assert b"the request body came slower than" in answers["body"]
    assert elapsed >= min(HEAD_TIMEOUT_S, BODY_TIMEOUT_S) - 1  # not before their time
    with server.client() as c:  # the trickled submission stored nothing
        assert c.get("/v1/jobs", params={"all": "true"}).json() == []
    log = server.log.read_text() if server.log else ""
    assert "Traceback" not in log, log


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_flood_at_the_descriptor_limit_is_refused_politely_and_logged_once(tmp_path: Path, scheme: str) -> None:
    """Over plain HTTP a connection above the cap is answered 503 with Retry-After; over TLS
    (the default), where nothing can be written before a handshake, it is closed at once."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ("--plain-http",) if scheme == "http" else ()
    server = Server(tmp_path / "state", policy=policy, nofile=NOFILE, args=args).start()
    socks: list[socket.socket] = []
    connected_at: dict[socket.socket, float] = {}
    closed_at_once = 0
    try:
        sent_at = time.monotonic()
        for _ in range(FLOOD):
            try:
                sock = connect(server)
                sock.sendall(HALF_HEAD)
            except (ConnectionError, ssl.SSLError):
                closed_at_once += 1  # refused before a word could be sent: a closed connection is an answer too
                continue
            connected_at[sock] = time.monotonic()
            socks.append(sock)
        answers = _answers(socks, HEAD_TIMEOUT_S + 20)
        statuses = [status_of(raw) for _, raw, _ in answers]
        refused = [raw for _, raw, _ in answers if status_of(raw) == 503]
        held = [(connected_at[sock], at) for sock, raw, at in answers if status_of(raw) == 408]
        if scheme == "http":
            assert refused, f"no connection was refused; statuses {sorted(set(statuses))}"
            assert all(b"retry-after: 1" in raw.lower() for raw in refused)
        else:
            closed_at_once += statuses.count(0)
            assert closed_at_once and not refused, (closed_at_once, sorted(set(statuses)))
        # No slot is freed by a timeout before the first connection's head deadline: of the
        # connections made before then (a slow flood makes some after), at most the cap is held.
        first_freed = sent_at + HEAD_TIMEOUT_S
        early = [at for since, at in held if since < first_freed]
        assert len(early) <= connection_cap(NOFILE), (len(early), len(held), time.monotonic() - sent_at)
        assert held and all(at - since >= HEAD_TIMEOUT_S - 1 for since, at in held)  # timed out, not before
        assert set(statuses) <= {503, 408, 0}, sorted(set(statuses))
        for sock in socks:  # the flood is over
            sock.close()
        # The server answers again, on new connections.
        wait_for(lambda: PROBE.get(f"{server.url}/v1/health").status_code == 200, 20, "health after the flood")
        with server.client() as c:
            assert c.get("/v1/jobs").status_code == 200
    finally:
        for sock in socks:
            sock.close()
        server.stop()
    log = server.log.read_text() if server.log else ""
    lines = [line for line in log.splitlines() if "connections refused" in line]
    assert 1 <= len(lines) <= 2, log  # one per kind of refusal: over the cap, out of descriptors
    assert "Traceback" not in log, log


def _answers(socks: list[socket.socket], timeout: float) -> list[tuple[socket.socket, bytes, float]]:
    """Each connection, what it was sent until the server closed it, and when it closed."""
    pending = dict.fromkeys(socks, b"")
    out: list[tuple[socket.socket, bytes, float]] = []
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                except (ConnectionResetError, ssl.SSLError):
                    chunk = b""
                if chunk:
                    pending[sock] += chunk
                    continue
                sel.unregister(sock)
                out.append((sock, pending.pop(sock), time.monotonic()))
    assert not pending, f"{len(pending)} connections still open after {timeout} s"
    return out


def flat_policy(queues: int) -> str:
    return "queues:\n  name: cluster\n  children:\n" + "".join(f"    - {{name: q{i}}}\n" for i in range(queues))


def test_one_huge_diff_at_a_time_and_health_answers_meanwhile(server: Server) -> None:
    huge = flat_policy(20_000)
    with server.client() as admin:
        tokens = [admin.post("/v1/tokens", json={"user": u, "role": "user"}).json()["token"] for u in ("ana", "bob")]
    ana, bob = server.client(tokens[0]), server.client(tokens[1])
    assert bob.post("/v1/policy/diff", json={"source": POLICY}).status_code == 200  # the worker is up
    answers: list[httpx.Response] = []

    def huge_diff() -> None:
        """Ana's diff, sent again after a refusal by the budget (bob's small one held it)."""
        deadline = time.monotonic() + 120
        while True:
            r = ana.post("/v1/policy/diff", json={"source": huge}, timeout=300)
            if r.status_code != 503 or time.monotonic() > deadline:
                answers.append(r)
                return
            time.sleep(float(r.headers.get("retry-after", "1")) / 10)

    worker = threading.Thread(target=huge_diff)
    health: list[float] = []
    worker.start()
    try:

        def refused() -> httpx.Response | None:
            t = time.monotonic()
            assert PROBE.get(f"{server.url}/v1/health").status_code == 200
            health.append(time.monotonic() - t)
            r = bob.post("/v1/policy/diff", json={"source": POLICY})
            if r.status_code == 503:
                return r
            assert r.status_code == 200, r.text
            assert worker.is_alive(), "ana's diff ended before bob's was ever refused"
            return None

        busy = wait_for(refused, 120, "bob's diff refused while ana's is worked on", interval=0.05)
        while worker.is_alive():
            t = time.monotonic()
            assert PROBE.get(f"{server.url}/v1/health").status_code == 200
            health.append(time.monotonic() - t)
            worker.join(0.05)
    finally:
        worker.join(300)
    assert busy.json()["error"]["field"] == "server"
    assert "1 policy diffs" in busy.json()["error"]["message"]
    assert busy.headers["retry-after"] == "2"
    assert [a.status_code for a in answers] == [200], [a.text[:300] for a in answers]
    assert bob.post("/v1/policy/diff", json={"source": POLICY}).status_code == 200  # free again
    assert max(health) < 2.0, f"/v1/health took {max(health):.2f} s during the diff"
    ana.close()
    bob.close()


def children_of(server: Server) -> list[int]:
    """The server's child processes (no job runs in these tests)."""
    assert server.proc is not None
    out: list[int] = []
    for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def workers_of(server: Server) -> list[int]:
    """The server's worker processes (multiprocessing's, not its resource tracker)."""
    out = []
    for pid in children_of(server):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def listening_inode(port: int) -> str:
    """The socket inode that listens on `port` (IPv4 or IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].rsplit(":", 1)[1] == f"{port:04X}" and fields[3] == "0A":
                return fields[9]
    raise AssertionError(f"nothing listens on port {port}")


def test_the_diff_runs_in_a_worker_without_the_api_socket_and_a_dead_worker_is_replaced(server: Server) -> None:
    huge = flat_policy(20_000)
    port = urlsplit(server.url).port
    assert port is not None
    answers: list[httpx.Response] = []
    with server.client() as admin:
        worker = threading.Thread(
            target=lambda: answers.append(admin.post("/v1/policy/diff", json={"source": huge}, timeout=300))
        )
        worker.start()
        try:
            pids = wait_for(lambda: workers_of(server), 60, "a worker process of the server")
            inode = listening_inode(port)
            for pid in children_of(server):  # the workers and whatever helps them
                held = set()
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
                    except OSError:
                        pass  # closed meanwhile
                assert f"socket:[{inode}]" not in held, f"worker {pid} holds the API's socket"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        finally:
            worker.join(300)
        assert [a.status_code for a in answers] == [503], [a.text[:300] for a in answers]
        assert "worker process" in answers[0].json()["error"]["message"]
        again = admin.post("/v1/policy/diff", json={"source": POLICY}, timeout=300)
        assert again.status_code == 200, again.text
