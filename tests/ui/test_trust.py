"""The browser talks to the dashboard only over a certificate it trusts: a listener on the
server's address with a key of its own (a job that took the port while the server was down)
gets no request from it, so no sign-in and no token; the same listener with the server's
certificate does, which shows the listener hears what a browser sends."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Any

from serverproc import self_signed, wait_for


class Listener:
    """HTTPS on 127.0.0.1 with `context`; what each connection sent (or how it failed)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.heard: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            raw.settimeout(5)
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    self.heard.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 2\r\n\r\nhi")
            except (OSError, ssl.SSLError) as err:
                self.heard.append(f"no request: {err!r}".encode())

    def close(self) -> None:
        self.sock.close()


def _own_key(directory: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(self_signed(directory), directory / "key.pem")
    return context


def test_the_browser_sends_nothing_to_a_listener_without_the_servers_certificate(
    driver: Any, tmp_path: Path, tls_args: tuple[str, ...]
) -> None:
    squatter = Listener(_own_key(tmp_path))
    try:
        driver.get(f"https://127.0.0.1:{squatter.port}/ui/")
        wait_for(lambda: squatter.heard, 20, "the browser's connection")
        assert all(h.startswith(b"no request") for h in squatter.heard), squatter.heard
    finally:
        squatter.close()

    trusted = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    trusted.load_cert_chain(tls_args[1], tls_args[3])
    server = Listener(trusted)
    try:
        driver.get(f"https://127.0.0.1:{server.port}/ui/")
        wait_for(lambda: any(h.startswith(b"GET /ui/") for h in server.heard), 20, "the browser's request")
    finally:
        server.close()
        driver.get("about:blank")
