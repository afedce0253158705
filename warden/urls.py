"""Lists of warden servers' URLs, tried in turn (docs/control-plane.md, "Several servers").

`WARDEN_URL` (and the CLI's `--url`) may name several servers of one database separated by
commas: `http://head-a:8765,http://head-b:8765`. A client tries them in turn, from the one
that answered last: a server that cannot be reached (refused, no connection in time, the
connection lost before an answer) passes the request on to the next; an HTTP answer, whatever
its status, is the answer. The CLI (`warden.client`) and the workload SDK's reporter
(`warden.workload.report`) share these rules.

Standard library only: the SDK imports it inside jobs.
"""

from __future__ import annotations

import ipaddress
import re
import ssl
import threading
import urllib.parse
from collections.abc import Sequence

SCHEMES = ("http", "https")


class BadServerUrl(ValueError):
    """A list of server URLs with an entry that is not one; the message names the entry, and
    the whole value when it has several."""


def parse_urls(value: str, source: str = "WARDEN_URL") -> tuple[str, ...]:
    """The servers `value` names (one URL, or several separated by commas), in its order,
    each without a trailing slash and named once. An entry that is empty, not an http:// or
    https:// URL, or not a URL at all is refused (`BadServerUrl`, naming `source` and the
    value)."""
    entries = value.split(",")
    urls: list[str] = []
    for number, raw in enumerate(entries, 1):
        entry = raw.strip()
        problem = _problem(entry)
        if problem is not None:
            shown = _without_password(entry)
            if len(entries) == 1:
                where = repr(shown)
            elif entry:
                where = f"{shown!r} (entry {number} of {_without_password(value)!r})"
            else:
                where = f"entry {number} of {_without_password(value)!r}"
            raise BadServerUrl(f"{source}: {where} {problem}")
        url = entry.rstrip("/")
        if url not in urls:
            urls.append(url)
    return tuple(urls)


def _problem(entry: str) -> str | None:
    """What is wrong with one entry, in words; None when it is a server's URL."""
    if not entry:
        return "is empty"
    if any(c.isspace() or not c.isprintable() for c in entry):
        return "holds a space or a control character"
    try:
        parts = urllib.parse.urlsplit(entry)
        port = parts.port
    except ValueError as err:
        return f"is not a URL ({err})"
    if parts.scheme.lower() not in SCHEMES:
        return "is not an http:// or https:// URL (e.g. http://head:8765)"
    if not parts.hostname:
        return "names no host"
    if "@" in parts.netloc:
        return "holds a user name or password: give the token in WARDEN_TOKEN or --token"
    if parts.query or parts.fragment or entry.endswith(("?", "#")):
        return "has a query or a fragment: a server's URL is its scheme, host, port and path"
    if port == 0:
        return "has port 0"
    return None


def _without_password(text: str) -> str:
    """`text` with whatever stands between `://` and `@` (a user name and password) hidden,
    for messages."""
    return re.sub(r"://[^/@,]*@", "://…@", text)


PEM_BEGIN = "-----BEGIN CERTIFICATE-----"


def tls_context(ca: str | None, source: str = "WARDEN_CA", extra: Sequence[str] = ()) -> ssl.SSLContext:
    """The TLS context a client checks https:// servers with: the certificates `ca` holds
    (PEM text, as warden gives jobs, or the path of a PEM file, as an admin gives the CLI),
    else the system's store and the readable files of `extra`. The host name is always
    checked. A `ca` that holds no certificate is refused (`BadServerUrl`, naming `source`)."""
    if ca is None:
        ctx = ssl.create_default_context()
        for path in extra:
            try:
                ctx.load_verify_locations(cafile=path)
            except (OSError, ssl.SSLError):
                continue  # another server's state directory, or none on this machine
        return ctx
    try:
        if ca.lstrip().startswith(PEM_BEGIN):
            return ssl.create_default_context(cadata=ca)
        return ssl.create_default_context(cafile=ca)
    except FileNotFoundError:
        raise BadServerUrl(f"{source}: {ca!r} does not exist (a PEM file of certificates, or the PEM text)") from None
    except OSError as err:
        raise BadServerUrl(f"{source}: cannot read {ca!r}: {err.strerror or err}") from None
    except (ssl.SSLError, ValueError) as err:
        shown = "the PEM text given" if ca.lstrip().startswith(PEM_BEGIN) else repr(ca)
        raise BadServerUrl(f"{source}: {shown} holds no PEM certificate ({err})") from None


def is_loopback(url: str) -> bool:
    """Whether `url`'s host is this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerList:
    """Servers tried in turn, from the one that answered last (the first at the start).
    Thread-safe."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("a server list needs at least one URL")
        self.urls = tuple(urls)
        self._first = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        """The server tried first: the one that answered last."""
        return self.urls[self._first]

    def in_turn(self) -> list[str]:
        """Every server once, the current one first, then the others in the list's order."""
        first = self._first
        return [*self.urls[first:], *self.urls[:first]]

    def answered(self, url: str) -> None:
        """`url` answered: it is tried first from now on."""
        with self._lock:
            self._first = self.urls.index(url)


def unreachable(source: str, failures: Sequence[tuple[str, str]]) -> str:
    """The message when no server answered: every URL tried, and why it did not answer."""
    if len(failures) == 1:
        url, why = failures[0]
        return f"cannot reach the warden server at {url}: {why}"
    tried = "; ".join(f"{url}: {why}" for url, why in failures)
    return f"cannot reach any of the {len(failures)} warden servers of {source}: {tried}"
