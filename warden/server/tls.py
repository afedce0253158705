"""The server's TLS certificate: one an admin gives (`--tls-cert`/`--tls-key`), else its own.

A server with no certificate given makes its own at first start, as Kubernetes' control plane
does: a certificate authority of its own in the state directory (`ca.crt`, public, and
`ca.key`, root's alone) and a serving certificate it signs (`server.crt`, public, and
`server.key`) for the names clients reach the server at (`localhost`, 127.0.0.1, ::1, this machine's name,
the `--host` and the `--advertise-url` host). The CLI and the workload SDK trust that CA: the
CLI reads `ca.crt` from the state directory, jobs get it in `WARDEN_CA`. So a process that
takes the server's port while the server restarts cannot answer as the server (it has no key
that the CA signed), and no client sends it a token.

The serving certificate is made again at start when a name it must hold is missing or it
expires within `RENEW_BEFORE_S`; the CA lives `CA_LIFETIME_S`.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_FILE",
    "ServerTls",
    "TlsError",
    "admin_certificate",
    "no_certificate",
    "own_certificate",
    "serving_names",
]

CA_FILE = "ca.crt"
"""In the state directory: the certificate of the server's own CA, readable by every user (it
is public; clients need it to know the server)."""
CA_KEY_FILE = "ca.key"
SERVED_FILE = "server.crt"
"""In the state directory, public: the certificate the server serves (its own, or a copy of
the admin's), which the CLI pins the state directory's admin token to (`warden.client`)."""
KEY_FILE = "server.key"

CA_LIFETIME_S = 10 * 365 * 86_400
SERVING_LIFETIME_S = 398 * 86_400
RENEW_BEFORE_S = 30 * 86_400


class TlsError(Exception):
    """The certificate or key cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class ServerTls:
    """What the server serves HTTPS with, and what its clients trust."""

    cert_file: Path
    key_file: Path
    ca_pem: str | None
    """The CA that signed the serving certificate, when it is the server's own (jobs get it in
    `WARDEN_CA`); None for an admin's certificate, which clients check against the system's
    store (or their own `WARDEN_CA`)."""
    ca_file: Path | None

    def context(self) -> ssl.SSLContext:
        """The server side's TLS context: TLS 1.2 and later."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def serving_names(host: str, advertise_host: str | None) -> tuple[str, ...]:
    """The names and addresses the serving certificate holds: the loopback ones, this machine's
    name, the host the server listens on (unless it is every address) and the one it
    advertises."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    try:
        names.append(socket.getfqdn())
    except OSError:
        pass
    for extra in (host, advertise_host):
        if extra and extra not in ("0.0.0.0", "::"):
            names.append(extra.strip("[]"))
    return tuple(dict.fromkeys(n.lower() for n in names if n))


def own_certificate(state: Path, names: Iterable[str]) -> ServerTls:
    """The server's own CA and serving certificate in `state`, made or renewed as needed."""
    wanted = tuple(names)
    ca_cert_path, ca_key_path = state / CA_FILE, state / CA_KEY_FILE
    ca_key, ca_cert = _load_or_make_ca(ca_cert_path, ca_key_path)
    cert_path, key_path = state / SERVED_FILE, state / KEY_FILE
    if not _serving_fits(cert_path, key_path, ca_cert, wanted):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _serving_certificate(key, ca_key, ca_cert, wanted)
        _write(key_path, _key_pem(key), 0o600)
        _write(
            cert_path,
            cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM),
            0o644,
        )
    os.chmod(ca_cert_path, 0o644)
    os.chmod(ca_key_path, 0o600)
    return ServerTls(cert_path, key_path, ca_cert.public_bytes(serialization.Encoding.PEM).decode(), ca_cert_path)


def admin_certificate(state: Path, cert: Path, key: Path) -> ServerTls:
    """An admin's certificate and key (`--tls-cert`, `--tls-key`), checked before the server
    starts (both readable, the key the certificate's) and published in `state` (`SERVED_FILE`)."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            path.read_bytes()
        except FileNotFoundError:
            raise TlsError(f"{flag}: {str(path)!r} does not exist") from None
        except OSError as err:
            raise TlsError(f"{flag}: cannot read {str(path)!r}: {err.strerror or err}") from None
    tls = ServerTls(cert, key, None, None)
    try:
        tls.context()
    except (OSError, ssl.SSLError) as err:
        reason = getattr(err, "reason", None) or err
        raise TlsError(
            f"--tls-cert {str(cert)!r} / --tls-key {str(key)!r}: not a PEM certificate and its key ({reason})"
        ) from None
    _write(state / SERVED_FILE, cert.read_bytes(), 0o644)
    return tls


def no_certificate(state: Path) -> None:
    """Plain HTTP: no certificate is published, so the CLI sends the state directory's admin
    token to no server (`warden.client`)."""
    (state / SERVED_FILE).unlink(missing_ok=True)


def fingerprint(pem: str) -> str:
    """SHA-256 of a PEM certificate's DER form, as `ab:cd:…` (what `openssl x509 -fingerprint
    -sha256` prints), for the start line and the docs."""
    der = x509.load_pem_x509_certificate(pem.encode()).public_bytes(serialization.Encoding.DER)
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


# -- making them ---------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _load_or_make_ca(cert_path: Path, key_path: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    if cert_path.exists() and key_path.exists():
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError) as err:
            raise TlsError(
                f"{cert_path} / {key_path}: the server's own CA cannot be read ({err}); remove both to make a new one "
                "(clients that trusted the old one must be given the new ca.crt)"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TlsError(f"{key_path}: not an EC key; remove {cert_path} and {key_path} to make a new CA")
        if cert.not_valid_after_utc - _now() > datetime.timedelta(seconds=RENEW_BEFORE_S):
            return key, cert
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "warden"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"warden CA {socket.gethostname()}"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(seconds=CA_LIFETIME_S))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return key, cert


def _serving_fits(cert_path: Path, key_path: Path, ca: x509.Certificate, names: tuple[str, ...]) -> bool:
    """Whether the serving certificate on disk is the CA's, holds every name and lives on."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key_path.stat()
    except (OSError, ValueError):
        return False
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    if cert.not_valid_after_utc - _now() < datetime.timedelta(seconds=RENEW_BEFORE_S):
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    held = {d.lower() for d in san.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }
    return all(_canonical(n) in held for n in names)


def _canonical(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def _serving_certificate(
    key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, names: tuple[str, ...]
) -> x509.Certificate:
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "warden")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(seconds=SERVING_LIFETIME_S), ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write `path` whole, with `mode` from its creation (a key is never readable by others,
    not even for a moment), replacing what was there."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(partial, mode)
    os.replace(partial, path)
