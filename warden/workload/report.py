"""Reports from inside a job to the warden control plane (DESIGN §6, §7).

The engine prices a preemption by what the job would lose: its startup time, the time its
checkpoints take and whether a save on SIGTERM fits its grace period. Only the job knows those
numbers, so it reports them here:

    POST {WARDEN_URL}/v1/jobs/{WARDEN_JOB_ID}/reports
    Authorization: Bearer {WARDEN_REPORT_TOKEN}
    {"attempt": 2, "kind": "checkpoint_finished", "at": 1767225600.0,
     "duration_s": 4.2, "size_bytes": 1048576, "on_sigterm": true}

Rules that keep reporting from ever hurting training:

- standard library only (``urllib``): nothing to install inside the job's environment;
- outside warden (no ``WARDEN_JOB_ID`` or ``WARDEN_URL``) every method returns at once;
- ``WARDEN_URL`` may name several servers of one database, separated by commas (warden gives
  a job every server that was up when its attempt started): a report goes to the server that
  answered the last one and, when that one cannot be reached, to the next (``warden.urls``),
  so reports go on reaching the database after the server that started the job died. A report
  is sent to another server only when it cannot count twice: always when no connection could
  be made; after a connection lost once the report was sent, unless it is a
  ``checkpoint_finished`` (which adds to the attempt's checkpoint count and time). An HTTP
  answer, whatever its status, is never sent elsewhere;
- ``progress`` is rate-limited (one HTTP call per ``min_interval``) and sent from a background
  thread, so the training loop never waits on the network;
- checkpoint reports are sent synchronously with a short timeout, because a job that saved on
  SIGTERM exits right after and a background thread would die with it;
- a failure (server down, 4xx, 5xx, timeout) is written to stderr once and never raised.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from warden.urls import BadServerUrl, ServerList, parse_urls, tls_context, unreachable

if TYPE_CHECKING:
    import urllib.request

__all__ = ["PROCESS_STARTED_AT", "Reporter", "default_reporter", "process_started_at"]


def process_started_at() -> float:
    """Wall-clock time (``time.time()`` scale) at which this job's processes started.

    warden starts every replica as a process group of its own, led by the job command; the
    group leader's start time therefore counts everything the attempt did before it could make
    progress: a wrapper script, ``torchrun`` spawning this worker, ``import torch`` (seconds
    alone). It is read from ``/proc`` on Linux (the leader's, when it is older than this
    process, else this process's own); elsewhere, or if ``/proc`` is unreadable, it is the time
    this module was imported. Resolution: one clock tick (10 ms).
    """
    now = time.time()
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        started = now - (uptime - _started_after_boot("self"))
    except (OSError, ValueError, IndexError):
        return now
    try:
        leader = os.getpgid(0)
        if leader != os.getpid():
            started = min(started, now - (uptime - _started_after_boot(str(leader))))
    except (OSError, ValueError, IndexError):
        pass  # the leader is gone or not visible: this process's own start
    # Guard against clock oddities: never in the future, never more than a day back.
    return min(now, max(started, now - 86_400.0))


def _started_after_boot(pid: str) -> float:
    """Seconds after boot at which process ``pid`` started (field 22 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read().decode("ascii", "replace")
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


PROCESS_STARTED_AT: float = process_started_at()
"""Taken once, at import: the reference for ``Reporter.startup_finished``."""

_KINDS = frozenset({"startup", "progress", "checkpoint_started", "checkpoint_finished"})
_COUNTED = frozenset({"checkpoint_finished"})
"""Reports the server adds up: one whose answer was lost is not sent to another server."""


class Reporter:
    """Sends the job's reports to warden; every method is a no-op when ``enabled`` is False.

    Thread-safe: the training loop, a data-loader thread and the SIGTERM path may all report.
    """

    def __init__(
        self,
        url: str | None,
        job_id: str | None,
        token: str | None = None,
        attempt: int = 1,
        *,
        min_interval: float = 10.0,
        timeout: float = 2.0,
        started_at: float | None = None,
        ca: str | None = None,
    ) -> None:
        """``url``/``job_id`` None or empty disable the reporter; ``url`` may name several
        servers separated by commas (one that is not a URL makes every report fail, saying
        so). ``min_interval`` bounds the rate of progress calls; ``timeout`` bounds every HTTP
        call (a synchronous checkpoint report can delay a SIGTERM save by at most that, once
        per server that does not answer). ``started_at`` is the reference for
        ``startup_finished`` (default: this process's start). ``ca``: the certificates an
        https:// server is checked against (``WARDEN_CA``, the servers' own CA as warden gives
        it: PEM text or a file; default the system's store)."""
        self.enabled: bool = bool(url) and bool(job_id)
        self.attempt = attempt
        self.min_interval = min_interval
        self.timeout = timeout
        self.started_at = PROCESS_STARTED_AT if started_at is None else started_at
        self._path = ""
        self._servers: ServerList | None = None
        self._bad_url: str | None = None
        self._headers: dict[str, str] = {"Content-Type": "application/json"}
        self._opener: urllib.request.OpenerDirector | None = None
        if self.enabled:
            assert url is not None and job_id is not None
            self._path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/reports"
            try:
                self._servers = ServerList(parse_urls(url))
            except BadServerUrl as err:
                self._bad_url = str(err)
            if token:
                self._headers["Authorization"] = f"Bearer {token}"
            # 15 ms of imports, only paid when there is somewhere to report to.
            from urllib.request import HTTPSHandler, ProxyHandler, build_opener

            # The server is on the cluster's network: a job's HTTP(S)_PROXY (meant for
            # downloads) must not route reports through a proxy that cannot reach it.
            handlers: list[urllib.request.BaseHandler] = [ProxyHandler({})]
            if self._servers is not None and any(u.startswith("https:") for u in self._servers.urls):
                try:
                    handlers.append(HTTPSHandler(context=tls_context(ca, "WARDEN_CA")))
                except BadServerUrl as err:
                    self._bad_url = str(err)
            self._opener = build_opener(*handlers) if self._bad_url is None else None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._next_progress_at = float("-inf")  # monotonic; the first progress goes out at once
        self._pending: dict[str, Any] | None = None  # latest progress waiting for the thread
        self._in_flight = False
        self._thread: threading.Thread | None = None
        self._failed_logged = False
        self.sent = 0
        """Reports accepted (2xx) so far."""
        self.failed = 0
        """Reports that failed (no answer, timeout, non-2xx)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> Reporter:
        """A reporter configured by the executor's environment (DESIGN §6).

        Enabled only with both ``WARDEN_JOB_ID`` and ``WARDEN_URL``, and only on the rank that
        writes shared state (``RANK`` unset or 0): a gang reports once, not once per replica.
        ``WARDEN_PROGRESS_INTERVAL`` (seconds) overrides ``min_interval``: `warden
        check-workload` sets it to 0 to see progress at once.
        """
        env = os.environ if env is None else env
        rank = _int(env.get("RANK"), 0)
        url = env.get("WARDEN_URL") if rank == 0 else None
        interval = env.get("WARDEN_PROGRESS_INTERVAL")
        if interval and "min_interval" not in kwargs:
            try:
                kwargs["min_interval"] = max(0.0, float(interval))
            except ValueError:
                pass
        return cls(
            url,
            env.get("WARDEN_JOB_ID"),
            env.get("WARDEN_REPORT_TOKEN"),
            _int(env.get("WARDEN_ATTEMPT"), 1),
            ca=env.get("WARDEN_CA") or None,
            **kwargs,
        )

    # -- the reports ---------------------------------------------------------------------------

    def startup_finished(self, now: float | None = None) -> float | None:
        """Reports (synchronously) the seconds from process start to now: the job is about to
        make progress. Returns that figure, or None when disabled. Call it once per attempt,
        after loading the checkpoint and before the first step."""
        if not self.enabled:
            return None
        now = time.time() if now is None else now
        startup_s = max(0.0, now - self.started_at)
        self._send({"kind": "startup", "at": now, "startup_s": startup_s})
        return startup_s

    def progress(self, step: int, samples: int | None = None) -> None:
        """Records progress; at most one HTTP call per ``min_interval``, from a background
        thread. Calls in between are dropped (the next one sent carries the newer step)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next_progress_at:
            return
        body: dict[str, Any] = {"kind": "progress", "at": time.time(), "step": int(step)}
        if samples is not None:
            body["samples"] = int(samples)
        with self._lock:
            if now < self._next_progress_at:  # another thread won the slot
                return
            self._next_progress_at = now + self.min_interval
            self._pending = body
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="warden-reporter", daemon=True)
                self._thread.start()
            self._wake.notify_all()  # flush() may wait on the same condition

    def checkpoint_started(self, step: int | None = None) -> None:
        """Reports (synchronously) that a checkpoint write begins (of ``step``, if given)."""
        if self.enabled:
            self._send(_with_step({"kind": "checkpoint_started", "at": time.time()}, step))

    def checkpoint_finished(
        self, duration_s: float, size_bytes: int, on_sigterm: bool, step: int | None = None
    ) -> None:
        """Reports (synchronously) a completed checkpoint: how long the save took, its size,
        whether it was the save on SIGTERM (the engine compares that duration with the grace
        period: a job whose SIGTERM save fits loses nothing when preempted), and the step it
        holds, if given (what the next attempt will resume from)."""
        if self.enabled:
            self._send(
                _with_step(
                    {
                        "kind": "checkpoint_finished",
                        "at": time.time(),
                        "duration_s": float(duration_s),
                        "size_bytes": int(size_bytes),
                        "on_sigterm": bool(on_sigterm),
                    },
                    step,
                )
            )

    def flush(self, timeout: float = 5.0) -> bool:
        """Waits until the background thread has sent what it holds (or ``timeout`` passed).
        Returns True when nothing is left to send. Call it before exiting."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            while self._pending is not None or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    # -- transport ------------------------------------------------------------------------------

    def _run(self) -> None:
        """Background sender: takes the latest pending progress report, sends it, repeats."""
        while True:
            with self._lock:
                while self._pending is None:
                    self._wake.wait()
                body, self._pending = self._pending, None
                self._in_flight = True
            try:
                self._send(body)
            finally:
                with self._lock:
                    self._in_flight = False
                    self._wake.notify_all()

    @property
    def url(self) -> str | None:
        """The server reports go to first: the one that answered the last report."""
        return None if self._servers is None else self._servers.current

    def _send(self, body: dict[str, Any]) -> bool:
        """One report, to the servers in turn until one answers; True on a 2xx. Never raises:
        a report must not break training."""
        assert body["kind"] in _KINDS
        payload = json.dumps({"attempt": self.attempt, **body}).encode()
        ok, error = self._post(payload, repeatable=body["kind"] not in _COUNTED)
        with self._lock:
            if ok:
                self.sent += 1
            else:
                self.failed += 1
        if not ok:
            self._log_failure(body["kind"], error)
        return ok

    def _post(self, payload: bytes, repeatable: bool) -> tuple[bool, str]:
        """POST `payload` to the first server that answers: whether it took it (2xx), and
        otherwise why not."""
        from urllib.error import HTTPError, URLError
        from urllib.request import Request

        opener = self._opener
        if self._servers is None or opener is None:
            return False, self._bad_url or "no server"
        failures: list[tuple[str, str]] = []
        for url in self._servers.in_turn():
            try:
                request = Request(url + self._path, data=payload, headers=self._headers, method="POST")
                with opener.open(request, timeout=self.timeout) as response:
                    response.read()
                    status = int(response.status)
            except HTTPError as e:  # non-2xx answers (after redirects): an answer all the same
                self._servers.answered(url)
                return False, f"{url}: HTTP {e.code} {e.reason}"
            except URLError as e:  # no connection: the report was not sent
                failures.append((url, f"{type(e.reason).__name__}: {e.reason}"))
                continue
            except Exception as e:  # sent, and no answer came
                failures.append((url, f"{type(e).__name__}: {e}"))
                if repeatable:
                    continue
                return False, unreachable("WARDEN_URL", failures) + " (not sent elsewhere: it may have been counted)"
            self._servers.answered(url)
            return 200 <= status < 300, f"{url}: HTTP {status}"
        return False, unreachable("WARDEN_URL", failures)

    def _log_failure(self, kind: str, error: str) -> None:
        """Writes the first failure to stderr (never the token); later ones are only counted."""
        with self._lock:
            if self._failed_logged:
                return
            self._failed_logged = True
        try:
            print(
                f"warden.workload: could not send the {kind} report ({self._path}): {error}; training "
                "continues, further report failures are not logged",
                file=sys.stderr,
                flush=True,
            )
        except Exception:
            pass


def _with_step(body: dict[str, Any], step: int | None) -> dict[str, Any]:
    if step is not None:
        body["step"] = int(step)
    return body


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


_default: Reporter | None = None
_default_lock = threading.Lock()


def default_reporter() -> Reporter:
    """The process-wide reporter from the environment, shared by the guard and the checkpoint
    store so that rate limiting and the log-once rule hold for the whole process."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Reporter.from_env()
    return _default
