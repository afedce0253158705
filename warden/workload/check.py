"""`warden check-workload`: does a training command keep its side of the preemption contract?

The command runs here, twice, with the environment warden gives a job (DESIGN §6) and a
report endpoint of its own. The first run is left to make progress (its first progress
report), then gets SIGTERM; it must save a checkpoint and exit 0 within the grace. The second
run must resume from that checkpoint (its first reported step is not before the saved one).
This is the checklist item "verify that every training codebase handles SIGTERM and flushes
state before exiting", made a command.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)
    save_s: float | None = None
    exit_after_sigterm_s: float | None = None
    saved_step: int | None = None
    resumed_step: int | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [c.__dict__ for c in self.checks],
            "save_s": self.save_s,
            "exit_after_sigterm_s": self.exit_after_sigterm_s,
            "saved_step": self.saved_step,
            "resumed_step": self.resumed_step,
        }


class _Reports:
    """A tiny HTTP endpoint that records what the workload reports, as warden's server would."""

    def __init__(self, token: str) -> None:
        self.items: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        reports = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if self.headers.get("Authorization") != f"Bearer {token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                try:
                    item = json.loads(body)
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                item["_received"] = time.time()
                with reports.cond:
                    reports.items.append(item)
                    reports.cond.notify_all()
                self.send_response(202)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait(
        self, match: Callable[[dict[str, Any]], bool], timeout: float, alive: Callable[[], bool]
    ) -> dict[str, Any] | None:
        """The first report that matches, waiting up to `timeout` while the process lives."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for item in self.items:
                    if match(item):
                        return item
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return None
                self.cond.wait(min(left, 0.1))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def check_workload(
    command: Sequence[str],
    grace: float = 120.0,
    timeout: float = 300.0,
    checkpoint_dir: Path | None = None,
    workdir: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Verdict:
    """Run the two-run check; every process it starts is gone when it returns."""
    verdict = Verdict()
    token = secrets.token_hex(16)
    reports = _Reports(token)
    own_dir = checkpoint_dir is None
    ckpt = Path(tempfile.mkdtemp(prefix="warden-check-")) if checkpoint_dir is None else checkpoint_dir
    try:
        first = _run(command, 1, grace, ckpt, workdir, reports, token)
        try:
            say("run 1: waiting for its first progress report")
            progress = reports.wait(
                lambda r: r.get("attempt") == 1 and r.get("kind") == "progress", timeout, lambda: first.poll() is None
            )
            if progress is None:
                verdict.checks.append(Check("reports progress", False, _no_report(first, timeout)))
                return verdict
            verdict.checks.append(Check("reports progress", True, f"step {progress.get('step')}"))
            say("run 1: sending SIGTERM")
            sigterm_at = time.time()
            os.killpg(first.pid, signal.SIGTERM)
            code = _wait(first, grace)
            exited = time.time()
            if code is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
                verdict.checks.append(
                    Check(
                        "exits within the grace",
                        False,
                        f"still running {grace:g} s after SIGTERM: SIGKILL would lose its work",
                    )
                )
            else:
                verdict.exit_after_sigterm_s = round(exited - sigterm_at, 3)
                verdict.checks.append(
                    Check(
                        "exits within the grace",
                        code == 0,
                        f"exit {code} after {exited - sigterm_at:.2f} s (grace {grace:g} s)"
                        + ("" if code == 0 else "; must exit 0 to be requeued"),
                    )
                )
            saved = [
                r
                for r in reports.items
                if r.get("attempt") == 1
                and r.get("kind") == "checkpoint_finished"
                and r.get("_received", 0) >= sigterm_at
            ]
            if saved:
                verdict.save_s = saved[-1].get("duration_s")
                verdict.saved_step = saved[-1].get("step")
                verdict.checks.append(
                    Check(
                        "saves a checkpoint on SIGTERM",
                        True,
                        f"save took {verdict.save_s:.3f} s" if verdict.save_s is not None else "saved",
                    )
                )
            else:
                files = [p for p in ckpt.iterdir() if p.is_file() and p.stat().st_mtime >= sigterm_at - 1]
                verdict.checks.append(
                    Check(
                        "saves a checkpoint on SIGTERM",
                        bool(files),
                        f"new file {files[-1].name} (not reported)" if files else "no checkpoint after SIGTERM",
                    )
                )
        finally:
            _reap(first)
        if not verdict.ok:
            return verdict
        before = max(
            (r.get("step") or 0 for r in reports.items if r.get("attempt") == 1 and r.get("kind") == "progress"),
            default=0,
        )
        floor = verdict.saved_step if verdict.saved_step is not None else before
        second = _run(command, 2, grace, ckpt, workdir, reports, token)
        try:
            say("run 2: waiting for it to resume")
            resumed = reports.wait(
                lambda r: r.get("attempt") == 2 and r.get("kind") == "progress", timeout, lambda: second.poll() is None
            )
            if resumed is None:
                verdict.checks.append(Check("resumes from the checkpoint", False, _no_report(second, timeout)))
            else:
                step = int(resumed.get("step") or 0)
                verdict.resumed_step = step
                verdict.checks.append(
                    Check(
                        "resumes from the checkpoint",
                        step >= max(floor, 1),
                        f"first step {step}, saved at step {floor}",
                    )
                )
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
            _reap(second)
        return verdict
    finally:
        reports.close()
        if own_dir:
            import shutil

            shutil.rmtree(ckpt, ignore_errors=True)


def _run(
    command: Sequence[str], attempt: int, grace: float, ckpt: Path, workdir: Path | None, reports: _Reports, token: str
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    env.update(
        {
            "WARDEN_JOB_ID": "check",
            "WARDEN_ATTEMPT": str(attempt),
            "WARDEN_GRACE_SECONDS": f"{grace:g}",
            "WARDEN_CHECKPOINT_DIR": str(ckpt),
            "WARDEN_URL": reports.url,
            "WARDEN_REPORT_TOKEN": token,
            "WARDEN_PROGRESS_INTERVAL": "0",
        }
    )
    # The workload's own output goes to stderr: stdout stays the verdict (a table or JSON).
    return subprocess.Popen(list(command), env=env, cwd=workdir, start_new_session=True, stdout=sys.stderr)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _no_report(proc: subprocess.Popen[bytes], timeout: float) -> str:
    code = proc.poll()
    if code is not None:
        return f"exited {code} before reporting any progress (does it use warden.workload's Reporter?)"
    return f"no progress report within {timeout:g} s (does it use warden.workload's Reporter?)"
