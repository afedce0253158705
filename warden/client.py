"""A small client of warden's HTTP API, used by the CLI.

The server's address comes from `WARDEN_URL` (default `https://127.0.0.1:8765`) and the token
from `WARDEN_TOKEN`; without one, the admin token a local server wrote into its state
directory is used, so the CLI works out of the box on the server's own machine. Flags
override both.

Trust: an https:// server is checked against `WARDEN_CA` (or `--ca`: a PEM file), else the
system's store and the `ca.crt` of this machine's servers' state directories. A token is never
sent in clear to another machine (http:// to a non-loopback host is refused). The state
directory's admin token goes only to the server that holds that state directory: over https,
to a server presenting exactly the certificate it published there (`server.crt`), checked on
the connection that would carry it; requests to any other server, or over http, go without it
(`withheld` says why).

`WARDEN_URL` (or `--url`) may name several servers of one database, separated by commas
(`warden.urls`): each request goes to the server that answered last in this process, and to
the next when that one cannot be reached. A request is sent again elsewhere only when it
cannot have been carried out twice: every request when the connection could not even be made,
and a read, or a submission with its Idempotency-Key, when the connection was lost after it was
sent. An HTTP answer, whatever its status, is the answer.

The transport is the standard library's `http.client`, one connection a request, no proxy (as
the workload SDK's reporter: the servers are on the cluster's network): it loads in a few
milliseconds where an HTTP library's imports would be most of a quick verb's start-up.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

from warden.paths import ROOT_STATE_DIR, default_state_dir
from warden.urls import BadServerUrl, ServerList, is_loopback, parse_urls, tls_context, unreachable

__all__ = [
    "DEFAULT_URL",
    "ApiRefused",
    "BadServerUrl",
    "Client",
    "Export",
    "Probe",
    "Unreachable",
    "local_token",
    "local_token_path",
]

DEFAULT_URL = "https://127.0.0.1:8765"
SUBMIT_BACKOFF_S = 0.5
"""The first pause before a submission is sent again; it doubles on each retry."""
CONNECT_TIMEOUT_S = 5.0
"""How long a connection to one server may take before the next server is tried."""
HEALTH_TIMEOUT_S = 5.0
"""How long `warden status` waits for each server's health."""

_lists: dict[tuple[str, ...], ServerList] = {}
_lists_lock = threading.Lock()


def server_list(urls: tuple[str, ...]) -> ServerList:
    """The process's one `ServerList` of these URLs: a server that answered one client is
    tried first by the next one of this process too."""
    with _lists_lock:
        return _lists.setdefault(urls, ServerList(urls))


class ApiRefused(Exception):
    """The server refused a request (4xx/5xx); `field`, `value` and `message` say why."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            self.field, self.value, self.message = error.get("field"), error.get("value"), error.get("message", "")
        else:
            self.field, self.value, self.message = None, None, str(body)
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.field is None:
            return f"the server answered {self.status}: {self.message}"
        got = "" if self.value is None else f" (got {self.value!r})"
        return f"{self.field}: {self.message}{got}"


class Unreachable(Exception):
    pass


def local_token_path() -> Path:
    """Where a server on this machine with the default state directory (`$WARDEN_STATE_DIR`
    when set) wrote its admin token at its first start."""
    return default_state_dir() / "admin-token"


class Export(NamedTuple):
    """An exported trace and the server's warning about it (None: none)."""

    body: bytes
    warning: str | None


def warning_text(header: str | None) -> str | None:
    """The text of a `Warning: 299 - "text"` header (RFC 7234), else the header as it is."""
    if not header:
        return None
    code, _, rest = header.partition(" - ")
    return rest[1:-1] if code.strip().isdigit() and rest.startswith('"') and rest.endswith('"') else header


def local_token() -> str | None:
    """The admin token a server on this machine wrote at its first start, if readable."""
    try:
        return local_token_path().read_text().strip() or None
    except OSError:
        return None


def local_ca_files() -> tuple[str, ...]:
    """The CAs of this machine's servers: the default state directory's `ca.crt` and root's
    (/var/lib/warden/ca.crt, readable by every user), trusted beside the system's store."""
    return tuple(dict.fromkeys(str(d / "ca.crt") for d in (default_state_dir(), ROOT_STATE_DIR)))


def _served_certificate(state: Path) -> bytes | None:
    """The DER form of the certificate the server of `state` serves (`server.crt`, its first
    certificate); None when there is none (plain HTTP, or no server started there)."""
    try:
        pem = (state / "server.crt").read_text()
    except OSError:
        return None
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        return None
    try:
        return ssl.PEM_cert_to_DER_cert(pem[start : stop + len(end)] + "\n")
    except ValueError:
        return None


class Pin(NamedTuple):
    """The one server the state directory's admin token may go to: the certificate it serves."""

    der: bytes
    state: Path


def _token(given: str | None) -> tuple[str | None, str | None]:
    """The token to send, and where it came from (`--token`, `$WARDEN_TOKEN`, or the file of a
    local server it was read from; None: there is none)."""
    if given:
        return given, "--token"
    if os.environ.get("WARDEN_TOKEN"):
        return os.environ["WARDEN_TOKEN"], "$WARDEN_TOKEN"
    local = local_token()
    return local, None if local is None else str(local_token_path())


class Response(NamedTuple):
    """A server's answer: its HTTP status, body and headers (names case-insensitive)."""

    status: int
    content: bytes
    headers: http.client.HTTPMessage

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is none."""
        return json.loads(self.content)


class NotSent(OSError):
    """No connection could be made: the request cannot have reached the server."""


def _peer(sock: socket.socket) -> bytes | None:
    getpeercert = getattr(sock, "getpeercert", None)
    return None if getpeercert is None else getpeercert(binary_form=True)


def _trust_also(context: ssl.SSLContext, ca: Path) -> None:
    """Add the CA of `ca` (a state directory's) to `context`, when there is one to read."""
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError):
        pass


def _pin(state: Path, urls: tuple[str, ...]) -> tuple[Pin | None, str | None]:
    """Where the admin token read from `state` may go: to the server presenting the certificate
    `state` published, over https. (None, why) when it may go nowhere `urls` name."""
    plain = [u for u in urls if not u.startswith("https:")]
    if plain:
        return None, (
            f"the admin token of {state} is sent only over https, to the server holding that state directory; "
            f"{plain[0]} is plain HTTP: give a token in WARDEN_TOKEN or --token"
        )
    der = _served_certificate(state)
    if der is None:
        return None, (
            f"the admin token of {state} is sent only to the server holding that state directory, and none "
            f"published its certificate there ({state / 'server.crt'}): give a token in WARDEN_TOKEN or --token"
        )
    return Pin(der, state), None


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30.0, ca: str | None = None
    ) -> None:
        """`url`: one server's URL or several separated by commas (default `$WARDEN_URL`, else
        `DEFAULT_URL`); `ca`: a PEM file of the CAs to check https:// servers with (default
        `$WARDEN_CA`). A bad entry or file raises `BadServerUrl`, naming it, as does a token
        that would go in clear to another machine."""
        self.source = "--url" if url else "WARDEN_URL" if os.environ.get("WARDEN_URL") else "the default URL"
        urls = parse_urls(url or os.environ.get("WARDEN_URL") or DEFAULT_URL, self.source)
        self.servers = server_list(urls)
        ca_source = "--ca" if ca else "WARDEN_CA"
        ca = ca or os.environ.get("WARDEN_CA") or None
        self._tls = tls_context(ca, ca_source, extra=() if ca else local_ca_files())
        self.token, self.token_source = _token(token)
        """The token sent, and where it came from (`_token`)."""
        self.withheld: str | None = None
        """Why the state directory's admin token was not sent (None: it was, or there is none)."""
        self._pin: Pin | None = None
        if self.token and self.token_source is not None and not self.token_source.startswith(("-", "$")):
            self._pin, self.withheld = _pin(default_state_dir(), urls)
            if self._pin is None:
                self.token, self.token_source = None, None
            elif ca:
                _trust_also(self._tls, self._pin.state / "ca.crt")
        elif self.token:
            clear = [u for u in urls if u.startswith("http:") and not is_loopback(u)]
            if clear:
                raise BadServerUrl(
                    f"{self.source}: {clear[0]!r} is plain HTTP to another machine: a token is never sent there in "
                    "clear; use the server's https:// URL"
                )
        self.timeout = timeout
        self._headers = {"Accept": "application/json"}
        if self.token:
            self._headers["Authorization"] = f"Bearer {self.token}"

    @property
    def url(self) -> str:
        """The server requests go to first: the one that answered last."""
        return self.servers.current

    def close(self) -> None:
        """Nothing to release: each request opens and closes its own connection."""

    def _request(
        self,
        url: str,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """One request to the server at `url`: `NotSent` when no connection could be made
        (within the connect timeout), another OSError or `http.client.HTTPException` when the
        connection was lost after the request was sent."""
        parts = urlsplit(url)
        timeout = self.timeout if timeout is None else timeout
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        options: dict[str, Any] = {}
        if parts.scheme == "https":
            options["context"] = self._tls
        conn = kind(parts.hostname or "", parts.port, timeout=min(timeout, CONNECT_TIMEOUT_S), **options)
        try:
            try:
                conn.connect()
            except OSError as err:
                raise NotSent(err) from err
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            target = parts.path.rstrip("/") + path + (f"?{urlencode(params, doseq=True)}" if params else "")
            body = None if json is None else _json_dumps(json)
            sent = {**self._headers, **(headers or {})}
            if self._pin is not None and _peer(conn.sock) != self._pin.der:
                del sent["Authorization"]  # checked on the connection that would carry it
                self.withheld = (
                    f"the admin token of {self._pin.state} is sent only to the server holding that state directory, "
                    f"and {url} presented another certificate than {self._pin.state / 'server.crt'}: give a token "
                    "in WARDEN_TOKEN or --token"
                )
            if body is not None:
                sent["Content-Type"] = "application/json"
            conn.request(method, target, body=body, headers=sent)
            answer = conn.getresponse()
            return Response(answer.status, answer.read(), answer.headers)
        finally:
            conn.close()

    def _exchange(self, method: str, path: str, repeatable: bool | None = None, **kw: Any) -> Response:
        """One request, to the servers in turn until one answers (whatever the status).
        `repeatable`: whether the request may be sent to another server after a connection
        lost once it was sent (default: only reads)."""
        if repeatable is None:
            repeatable = method in ("GET", "HEAD")
        failures: list[tuple[str, str]] = []
        for url in self.servers.in_turn():
            try:
                response = self._request(url, method, path, **kw)
            except (OSError, http.client.HTTPException) as err:
                failures.append((url, _why(err)))
                if repeatable or isinstance(err, NotSent):
                    continue
                raise Unreachable(
                    f"the warden server at {url} did not answer ({_why(err)}) after the request was sent: it may "
                    f"or may not have been carried out, so it was not sent to another server; check, then retry"
                ) from None
            self.servers.answered(url)
            return response
        raise Unreachable(unreachable(self.source, failures))

    def _send(self, method: str, path: str, repeatable: bool | None = None, **kw: Any) -> Response:
        r = self._exchange(method, path, repeatable, **kw)
        if r.status >= 400:
            try:
                raise ApiRefused(r.status, r.json())
            except ValueError:
                raise ApiRefused(r.status, r.text) from None
        return r

    def _call(self, method: str, path: str, repeatable: bool | None = None, **kw: Any) -> Any:
        r = self._send(method, path, repeatable, **kw)
        try:
            return r.json()
        except ValueError:
            return r.text

    def submit(self, *, idempotency_key: str | None = None, retries: int = 0, **job: Any) -> dict[str, Any]:
        """Submit a job. With an `idempotency_key`, a submission whose answer was lost (the
        server unreachable, a timeout) is sent to the next server at once and, when none
        answered, to all again up to `retries` times, always with the same key: the servers
        share the keys in their database, so any of them answers with the job the first one
        created, never a second job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        for attempt in range(retries + 1):
            try:
                return self._call("POST", "/v1/jobs", bool(idempotency_key), json=job, headers=headers)
            except Unreachable:
                if not idempotency_key or attempt == retries:
                    raise
                time.sleep(SUBMIT_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def dry_run(self, **job: Any) -> dict[str, Any]:
        """What the scheduler would decide for this job now; nothing is submitted."""
        return self._call("POST", "/v1/jobs", True, json=job, params={"dry_run": "true"})

    def whoami(self) -> dict[str, Any]:
        """Who the token belongs to: `user`, `role`, `queues`."""
        return self._call("GET", "/v1/whoami")

    def jobs(
        self, queue: str | None = None, state: str | None = None, user: str | None = None, all: bool = False
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {k: v for k, v in {"queue": queue, "state": state, "user": user}.items() if v}
        if all:
            params["all"] = "true"
        return self._call("GET", "/v1/jobs", params=params)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def approve(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/approve")

    def release(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/release")

    def logs(self, job_id: str, attempt: int | None = None, rank: int = 0, offset: int = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/nodes")

    def queues(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/queues")

    def policy(self) -> dict[str, Any]:
        return self._call("GET", "/v1/policy")

    def apply_policy(self, source: str) -> dict[str, Any]:
        return self._call("PUT", "/v1/policy", True, json={"source": source})  # the same twice: "unchanged"

    def diff_policy(self, source: str) -> dict[str, Any]:
        return self._call("POST", "/v1/policy/diff", True, json={"source": source})

    def export_history(self, since: float | None = None, format: str = "native") -> Export:
        """The trace `GET /v1/history/export` answers (CSV text, or Parquet, as bytes) and its
        warning, if any."""
        params: dict[str, Any] = {"format": format}
        if since is not None:
            params["since"] = since
        response = self._send("GET", "/v1/history/export", params=params)
        return Export(response.content, warning_text(response.headers.get("Warning")))

    def create_token(
        self, user: str, role: str, queues: list[str], expires_in_s: float | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"user": user, "role": role, "queues": queues}
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        return self._call("POST", "/v1/tokens", json=body)

    def tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens")

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tokens/{token_id}")

    def audit(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/audit", params={"limit": limit})

    def metrics(self) -> str:
        return self._exchange("GET", "/metrics").text

    def health_of_each(self, timeout: float = HEALTH_TIMEOUT_S) -> list[Probe]:
        """`GET /v1/health` of every server of the list, all at once rather than in turn:
        each one's answer, or why none came (`warden status`)."""
        from concurrent.futures import ThreadPoolExecutor

        def probe(url: str) -> Probe:
            try:
                r = self._request(url, "GET", "/v1/health", timeout=timeout)
            except (OSError, http.client.HTTPException) as err:
                return Probe(url, None, None, _why(err))
            try:
                body = r.json()
            except ValueError:
                body = None
            if not isinstance(body, dict) or "role" not in body:
                return Probe(url, r.status, None, f"HTTP {r.status}, not a warden server's health")
            return Probe(url, r.status, body, None)

        with ThreadPoolExecutor(max_workers=len(self.servers.urls)) as pool:
            return list(pool.map(probe, self.servers.urls))


class Probe(NamedTuple):
    """One server's `GET /v1/health`: its HTTP status and body, or why there was none."""

    url: str
    status: int | None
    """None: no answer."""
    health: dict[str, Any] | None
    """The answer, when it is a warden server's health (200, or 503 when its threads died)."""
    error: str | None


def _json_dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def _why(err: BaseException) -> str:
    """Why a server did not answer, in words."""
    if isinstance(err, NotSent):
        cause = err.__cause__ or err
        if isinstance(cause, TimeoutError | socket.timeout):
            return "no connection within the connect timeout"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (
                f"its certificate is not trusted ({cause.verify_message or cause}): give its CA's certificate in "
                "WARDEN_CA or --ca (a server's own CA is ca.crt in its state directory)"
            )
        return str(cause) or type(cause).__name__
    if isinstance(err, TimeoutError | socket.timeout):
        return f"no answer in time ({type(err).__name__})"
    return f"the connection was lost before an answer ({err or type(err).__name__})"
