"""The bootstrap token given in $WARDEN_BOOTSTRAP_TOKEN is nowhere in the server process's
environment once it runs, not even in the block the kernel keeps from its start
(/proc/PID/environ), and still makes an admin token. A real server process."""

from __future__ import annotations

from pathlib import Path

from serverproc import ADMIN, Server


def environ_of(pid: int) -> dict[str, str]:
    block = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode().partition("=")[::2] for entry in block.split(b"\0") if entry)


def test_the_token_is_gone_from_the_process_environment_and_still_works(tmp_path: Path) -> None:
    server = Server(tmp_path / "state").start()  # $WARDEN_BOOTSTRAP_TOKEN=ADMIN, as an operator sets it
    try:
        assert server.proc is not None
        environ = environ_of(server.proc.pid)  # the pid Popen started: exec keeps it
        assert "WARDEN_BOOTSTRAP_TOKEN" not in environ
        assert ADMIN not in Path(f"/proc/{server.proc.pid}/environ").read_bytes().decode(errors="replace")
        assert "WARDEN_BOOTSTRAP_FD" in environ  # the token came through the pipe, once
        with server.client() as c:
            who = c.get("/v1/whoami")
            assert who.status_code == 200 and who.json()["role"] == "admin", who.text
        with server.client("not-the-token") as c:
            assert c.get("/v1/whoami").status_code == 401
    finally:
        server.stop()


def test_a_token_file_still_wins_and_the_variable_is_gone_too(tmp_path: Path) -> None:
    token = "bootstrap-from-a-file-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    server = Server(tmp_path / "state", args=("--bootstrap-token-file", str(token_file))).start()
    try:
        assert server.proc is not None
        block = Path(f"/proc/{server.proc.pid}/environ").read_bytes()
        assert ADMIN.encode() not in block and token.encode() not in block
        with server.client(token) as c:
            assert c.get("/v1/whoami").json()["role"] == "admin"
    finally:
        server.stop()
