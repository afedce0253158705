"""Where a token goes: the server serves HTTPS with its own CA by default, and the CLI and the
SDK send a token only to a server that proves itself. A job that takes the server's port while
it restarts hears no token; the state directory's admin token goes only to the server holding
that directory; the port of a server started as systemd does stays held between its runs."""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from serverproc import Server, cli, kill_jobs_of, self_signed, started, submit, until_state, wait_for

from warden.server import tls
from warden.workload.report import Reporter

POLICY = """\
min_grace: 2s
tiers:
  3: {name: experimentation, lease: 0s, grace: 2s}
  4: {name: opportunistic, lease: 0s, grace: 2s, charged: false}
  1: {name: production-inference, preemptible: false, grace: 2s, requires_approval: true, scope: cluster}
  2: {name: pretraining, lease: 1h, grace: 2s, requires_approval: true}
queues:
  name: cluster
  children:
    - {name: vision, nominal: {gpu: 4}}
"""

SQUATTER = r"""
import os, socket, ssl, sys, time
port, here = int(sys.argv[1]), sys.argv[2]
deadline = time.time() + 120
while True:  # the server holds the port until it stops
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        break
    except OSError:
        s.close()
        if time.time() > deadline:
            sys.exit(3)
        time.sleep(0.01)
s.listen(64)
open(os.path.join(here, "bound"), "w").write(str(os.getpid()))
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(os.path.join(here, "cert.pem"), os.path.join(here, "key.pem"))
while True:
    conn, _ = s.accept()
    conn.settimeout(5)
    heard = b""
    try:
        if conn.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS handshake: answer it with our own certificate
            conn = ctx.wrap_socket(conn, server_side=True)
        heard = conn.recv(65536)
        conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
    except Exception as err:
        heard = repr(err).encode()
    with open(os.path.join(here, "heard"), "ab") as out:
        out.write(heard + b"\n--\n")
    conn.close()
"""


def as_root_of(state: Path, url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`warden ARGS` as an admin on the machine would run it: no token given, the state
    directory's admin token read from `state`, and no CA given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    base.update({"WARDEN_STATE_DIR": str(state), "WARDEN_URL": url, "COLUMNS": "200", **env})
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args], capture_output=True, text=True, env=base, timeout=60
    )


def test_the_server_makes_its_own_ca_and_the_keys_are_root_only(tmp_path: Path) -> None:
    server = started(tmp_path, POLICY, bootstrap=False)
    try:
        state = server.state_dir
        assert {p.name: p.stat().st_mode & 0o777 for p in state.glob("*.key")} == {"ca.key": 0o600, "server.key": 0o600}
        assert (state / "ca.crt").stat().st_mode & 0o777 == 0o644
        with httpx.Client(verify=ssl.create_default_context(cafile=server.ca)) as c:
            for host in ("127.0.0.1", "[::1]", "localhost"):
                assert c.get(f"https://{host}:{server.port}/v1/health").status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{server.url}/v1/health")  # the system's store alone does not know it
        log = server.log.read_text() if server.log else ""
        assert f"warden serving on https://127.0.0.1:{server.port}" in log, log
        assert tls.fingerprint((state / "ca.crt").read_text()) in log, log
        assert as_root_of(state, server.url, "whoami").stdout.startswith("admin (admin)")
    finally:
        server.stop()


def test_a_job_holding_the_port_during_a_restart_hears_no_token(tmp_path: Path) -> None:
    """The job's squatter binds 127.0.0.1:PORT once the server stops, answering TLS with a
    certificate of its own; the restarted server refuses, naming it; the admin's CLI (the state
    directory's token) and a job's SDK reporter (its report token) send it nothing."""
    server = started(tmp_path, POLICY, bootstrap=False)
    den = tmp_path / "den"
    den.mkdir(mode=0o777)
    den.chmod(0o777)
    self_signed(den)
    (den / "squat.py").write_text(SQUATTER)
    admin = (server.state_dir / "admin-token").read_text().strip()
    try:
        with server.client(admin) as c:
            squatter = submit(
                c,
                queue="vision",
                tier=3,
                gpus=0,
                command=[sys.executable, str(den / "squat.py"), str(server.port), str(den)],
                workdir=str(den),
            )
            victim = submit(c, queue="vision", tier=3, gpus=1, command=["sleep", "600"], workdir=str(den))
            until_state(c, squatter, "RUNNING")
            until_state(c, victim, "RUNNING")
        job_env = dict(
            line.split("=", 1)
            for line in Path(f"/proc/{_pid_of(server.state_dir, victim)}/environ").read_bytes().decode().split("\0")
            if "=" in line
        )
        assert job_env["WARDEN_CA"].startswith("-----BEGIN CERTIFICATE-----"), sorted(job_env)
        server.stop()  # the jobs run on; the squatter takes the port
        holder = wait_for(lambda: (den / "bound").exists() and (den / "bound").read_text(), 20, "the squatter")

        restarted = Server(server.state_dir, policy=server.policy, port=server.port, bootstrap=False)
        with pytest.raises(AssertionError) as refused:
            restarted.start(timeout=30)
        said = str(refused.value)
        assert f"127.0.0.1:{server.port} is in use (held by pid {holder}, user nobody" in said, said

        done = as_root_of(server.state_dir, server.url, "queue")
        assert done.returncode != 0 and "certificate is not trusted" in done.stderr, done.stderr
        reporter = Reporter(
            job_env["WARDEN_URL"], victim, job_env["WARDEN_REPORT_TOKEN"], 1, ca=job_env["WARDEN_CA"], timeout=5
        )
        reporter.startup_finished()
        heard = wait_for(lambda: (den / "heard").exists() and (den / "heard").read_bytes().count(b"\n--\n") >= 2, 10)
        heard = (den / "heard").read_bytes()
        for secret in (admin, job_env["WARDEN_REPORT_TOKEN"]):
            assert secret.encode() not in heard, heard
        assert b"Authorization" not in heard and b"authorization" not in heard, heard

        # the squatter does hear what a client that trusts its certificate sends: the check above can fail
        trusting = as_root_of(
            server.state_dir, server.url, "queue", WARDEN_TOKEN="leaked", WARDEN_CA=str(den / "cert.pem")
        )
        assert b"Bearer leaked" in (den / "heard").read_bytes(), trusting.stderr
    finally:
        server.stop()
        kill_jobs_of(server.state_dir)


def _pid_of(state: Path, job_id: str) -> int:
    """The pid of a running job's command (its attempt's process group leader)."""
    for status in state.glob(f"jobs/{job_id}/attempt-*/**/*status*.json"):
        pgid = json.loads(status.read_text()).get("pgid")
        if pgid:
            return int(pgid)
    raise AssertionError(f"no status file of job {job_id} under {state}")


def test_the_state_directorys_admin_token_goes_only_to_its_own_server(tmp_path: Path) -> None:
    """With WARDEN_URL naming another server (trusted through WARDEN_CA), the CLI keeps this
    machine's admin token to itself and says why; an explicit token is the admin's choice."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = started(tmp_path / "a", POLICY, bootstrap=False)
    b = Server(tmp_path / "b" / "state", policy=a.policy, bootstrap=False)
    try:
        b.start()
        to_b = as_root_of(a.state_dir, b.url, "queue", WARDEN_CA=str(b.ca))
        text = " ".join(to_b.stderr.split())
        assert to_b.returncode == 2 and "a bearer token is required" in text, text  # b heard no token
        assert f"the admin token of {a.state_dir} is sent only to the server holding that state directory" in text
        assert as_root_of(a.state_dir, a.url, "queue").returncode == 0
        b_admin = (b.state_dir / "admin-token").read_text().strip()
        assert as_root_of(a.state_dir, b.url, "queue", WARDEN_CA=str(b.ca), WARDEN_TOKEN=b_admin).returncode == 0
    finally:
        a.stop()
        b.stop()


def test_every_loopback_address_is_the_servers_and_a_taken_port_names_its_holder(tmp_path: Path) -> None:
    server = started(tmp_path, POLICY)
    try:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as s, pytest.raises(OSError) as taken:
                s.bind((host, server.port))
            assert taken.value.errno == errno.EADDRINUSE, (host, taken.value)
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
        argv = [sys.executable, "-m", "warden.cli.main", "server", "--port", str(server.port), "--fake-gpus", "1"]
        done = subprocess.run(
            [*argv, "--state-dir", str(tmp_path / "other")], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert f"is in use (held by pid {server.proc.pid if server.proc else '?'}, user root" in done.stderr
    finally:
        server.stop()


def test_sockets_handed_over_as_systemd_does_stay_held_between_runs(tmp_path: Path) -> None:
    """The unit's socket (deploy/warden.socket) holds the port while the server restarts: a
    job cannot take it, and the next server serves on the same socket, with the same CA."""
    port = socket.socket().getsockname()[1]
    held = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((host, port))
        if port == 0:
            port = s.getsockname()[1]
        s.listen(128)
        held.append(s)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = Server(tmp_path / "state", policy=policy, port=port, sockets=tuple(held), bootstrap=False).start()
    try:
        fingerprint = tls.fingerprint(server.ca.read_text())
        server.kill9()
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family) as s, pytest.raises(OSError) as taken:
                s.bind((host, port))
            assert taken.value.errno == errno.EADDRINUSE
        server.start()
        assert tls.fingerprint(server.ca.read_text()) == fingerprint
        with server.client((server.state_dir / "admin-token").read_text().strip()) as c:
            assert c.get("/v1/health").status_code == 200
        log = server.log.read_text() if server.log else ""
        assert "sockets from systemd" in log, log
    finally:
        server.stop()
        for s in held:
            s.close()


def test_plain_http_is_served_only_when_asked_and_says_so(tmp_path: Path) -> None:
    server = started(tmp_path, POLICY, bootstrap=False, args=("--plain-http",))
    try:
        assert server.url.startswith("http://")
        log = server.log.read_text() if server.log else ""
        assert "--plain-http" in log and "in clear" in log, log
        assert not (server.state_dir / "server.crt").exists()
        withheld = as_root_of(server.state_dir, server.url, "queue")
        text = " ".join(withheld.stderr.split())
        assert withheld.returncode == 2 and "is plain HTTP: give a token in WARDEN_TOKEN or --token" in text, text
        admin = (server.state_dir / "admin-token").read_text().strip()
        assert cli(server.url, "queue", token=admin).returncode == 0
    finally:
        server.stop()


def test_an_admins_certificate_is_served_and_published(tmp_path: Path) -> None:
    """`--tls-cert/--tls-key`: the server serves the admin's certificate (here one of another
    CA); a client trusting that CA reaches it, and the state directory's admin token goes to it."""
    issued = tmp_path / "issued"
    issued.mkdir()
    theirs = tls.own_certificate(issued, tls.serving_names("127.0.0.1", None))
    args = ("--tls-cert", str(theirs.cert_file), "--tls-key", str(theirs.key_file))
    server = started(tmp_path, POLICY, bootstrap=False, args=args)
    try:
        assert not (server.state_dir / "ca.crt").exists()  # no CA of its own was needed
        assert (server.state_dir / "server.crt").read_bytes() == theirs.cert_file.read_bytes()
        done = as_root_of(server.state_dir, server.url, "whoami", WARDEN_CA=str(issued / "ca.crt"))
        assert done.returncode == 0 and done.stdout.startswith("admin (admin)"), done.stderr
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--tls-cert", "/nonexistent.pem"), "--tls-key: --tls-cert was given without it"),
        (
            ("--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"),
            "--tls-cert: '/nonexistent.pem' does not exist",
        ),
        (("--plain-http", "--tls-cert", "/a", "--tls-key", "/b"), "--plain-http"),
        (("--advertise-url", "http://head:8765"), "http://head:8765"),
    ],
)
def test_bad_tls_options_are_refused_before_anything_starts(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    argv = [sys.executable, "-m", "warden.cli.main", "server", "--port", "1", "--fake-gpus", "1"]
    done = subprocess.run(
        [*argv, "--state-dir", str(tmp_path / "s"), *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not (tmp_path / "s" / "warden.db").exists()


def test_the_serving_certificate_is_kept_renewed_and_names_every_address(tmp_path: Path) -> None:
    first = tls.own_certificate(tmp_path, tls.serving_names("127.0.0.1", None))
    cert = first.cert_file.read_bytes()
    again = tls.own_certificate(tmp_path, tls.serving_names("127.0.0.1", None))
    assert again.cert_file.read_bytes() == cert and again.ca_pem == first.ca_pem  # kept
    wider = tls.own_certificate(tmp_path, tls.serving_names("0.0.0.0", "head.example.org"))
    assert wider.cert_file.read_bytes() != cert and wider.ca_pem == first.ca_pem  # a new name: reissued, same CA
    served = x509.load_pem_x509_certificate(wider.cert_file.read_bytes())
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "head.example.org"} <= set(names.get_values_for_type(x509.DNSName))
    assert {"127.0.0.1", "::1"} <= {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    served.verify_directly_issued_by(x509.load_pem_x509_certificate(wider.ca_pem.encode() if wider.ca_pem else b""))
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ending = (
        x509.CertificateBuilder()
        .subject_name(served.subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3))
        .add_extension(served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    wider.cert_file.write_bytes(ending.public_bytes(serialization.Encoding.PEM))
    renewed = tls.own_certificate(tmp_path, tls.serving_names("0.0.0.0", "head.example.org"))
    after = x509.load_pem_x509_certificate(renewed.cert_file.read_bytes())
    assert after.not_valid_after_utc - now > datetime.timedelta(days=300)


def test_an_unreadable_key_or_a_mismatched_pair_is_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    a = tls.own_certificate(one, ("127.0.0.1",))
    b = tls.own_certificate(two, ("127.0.0.1",))
    with pytest.raises(tls.TlsError, match="not a PEM certificate and its key"):
        tls.admin_certificate(tmp_path, a.cert_file, b.key_file)
