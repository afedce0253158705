"""`warden check-workload`: does a training command keep its side of the preemption contract?

The command runs here, twice, with the environment warden gives a job (DESIGN §6). Most
training codebases never import warden's SDK, so the check watches what anyone can see from
outside, and uses the SDK's reports when there are some:

- progress: a progress report (SDK), a file written where it saves, output that keeps coming,
  or a fixed `--warmup`; then SIGTERM to its process group;
- the exit: its status and the time it took against the grace (exit 0 is requeued);
- the save: which files under the checkpoint directory (or `--checkpoint PATH/GLOB`) were
  written after SIGTERM, seen with inotify, and whether each appeared whole by a rename or was
  written in place under its final name (a SIGKILL mid-save would leave that one torn);
- the resume: the second run opens the file saved on SIGTERM and makes progress after it (with
  the SDK: its first reported step is not before the saved one).

Every wait has a deadline, and a run that exits, or shows nothing observable, ends the check at
once with the reason. This is the checklist item "verify that every training codebase handles
SIGTERM and flushes state before exiting", made a command.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warden.engine.durations import format_duration, span
from warden.workload.inotify import CREATE, MODIFY, MOVED_TO, OPEN, DirWatch, Event, WatchUnavailable
from warden.workload.observe import Reports, Run, status
from warden.workload.saves import Target, arrival, files

OUTPUT_MOMENTS = 3
"""Output counts as progress once it arrived at this many moments (0.1 s apart or more)..."""
OUTPUT_SPAN_S = 1.0
"""...spread over at least this long: a banner printed at start is not training."""
_POLL_S = 0.05

PROGRESS = "makes progress"
EXITS = "exits within the grace"
SAVES = "saves a checkpoint on SIGTERM"
ATOMIC = "saves atomically"
RESUMES = "resumes from the checkpoint"
CHECKS = (PROGRESS, EXITS, SAVES, ATOMIC, RESUMES)
INOTIFY = "inotify"
"""How a file check was observed (the OBSERVED BY column)."""


@dataclass(frozen=True)
class Check:
    """One line of the verdict: `ok` None when an earlier failure ended the check first;
    `how` says how it was observed."""

    name: str
    ok: bool | None
    how: str
    detail: str


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)
    save_s: float | None = None
    exit_after_sigterm_s: float | None = None
    saved_step: int | None = None
    resumed_step: int | None = None
    saved_files: list[str] = field(default_factory=list)
    checkpoint: str = ""
    grace: float = 0.0
    """The grace the check gave the command after SIGTERM."""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def declare(self) -> str | None:
        """What a command that passed may declare when it is submitted, so that warden counts
        its clean exit after SIGTERM as the save it is (None: it did not pass)."""
        if not self.ok:
            return None
        return (
            f"it may be submitted with --saves-on-sigterm, with a grace of at least {self.grace:g} s: an exit 0 "
            "within its grace after SIGTERM then counts as a save, and its preemption loses no work"
        )

    @property
    def failed(self) -> bool:
        return any(c.ok is False for c in self.checks)

    def add(self, name: str, ok: bool, how: str, detail: str) -> None:
        self.checks.append(Check(name, ok, how, detail))

    def finish(self) -> Verdict:
        """Name the checks an early failure left unrun."""
        done = {c.name for c in self.checks}
        for name in CHECKS:
            if name not in done:
                self.checks.append(Check(name, None, "not run", "an earlier check failed"))
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [c.__dict__ for c in self.checks],
            "save_s": self.save_s,
            "exit_after_sigterm_s": self.exit_after_sigterm_s,
            "saved_step": self.saved_step,
            "resumed_step": self.resumed_step,
            "saved_files": self.saved_files,
            "checkpoint": self.checkpoint,
            "saves_on_sigterm": self.ok,
        }


# -- the check -------------------------------------------------------------------------------


@dataclass
class _Context:
    command: Sequence[str]
    grace: float
    timeout: float
    warmup: float | None
    target: Target
    workdir: Path | None
    reports: Reports
    token: str
    watch: DirWatch | None
    watch_error: str | None
    say: Callable[[str], None]

    def start(self, attempt: int) -> Run:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
        env.update(
            {
                "WARDEN_JOB_ID": "check",
                "WARDEN_ATTEMPT": str(attempt),
                "WARDEN_GRACE_SECONDS": f"{self.grace:g}",
                "WARDEN_CHECKPOINT_DIR": str(self.target.root),
                "WARDEN_URL": self.reports.url,
                "WARDEN_REPORT_TOKEN": self.token,
                "WARDEN_PROGRESS_INTERVAL": "0",
            }
        )
        return Run(self.command, env, self.workdir)

    def events(self, mark: int) -> list[Event]:
        return self.watch.since(mark) if self.watch is not None else []

    def mark(self) -> int:
        return self.watch.mark() if self.watch is not None else 0


def check_workload(
    command: Sequence[str],
    grace: float = 120.0,
    timeout: float = 60.0,
    checkpoint: str | None = None,
    warmup: float | None = None,
    workdir: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Verdict:
    """Run the two-run check; every process it starts is gone when it returns. `checkpoint`
    names where the job saves (default: a fresh `WARDEN_CHECKPOINT_DIR`, removed after)."""
    own_dir = None
    if checkpoint is None:
        own_dir = Path(tempfile.mkdtemp(prefix="warden-check-"))
        target = Target(own_dir)
    else:
        target = Target.parse(checkpoint, workdir or Path.cwd())
        target.root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    reports = Reports(token)
    try:
        with _watching(target.root) as (watch, error):
            ctx = _Context(command, grace, timeout, warmup, target, workdir, reports, token, watch, error, say)
            return _check(ctx).finish()
    finally:
        reports.close()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


@contextmanager
def _watching(root: Path) -> Iterator[tuple[DirWatch | None, str | None]]:
    try:
        watch = DirWatch(root)
    except WatchUnavailable as err:
        yield None, str(err)
        return
    try:
        yield watch, None
    finally:
        watch.close()


def _check(ctx: _Context) -> Verdict:
    verdict = Verdict(checkpoint=ctx.target.describe(), grace=ctx.grace)
    mark = ctx.mark()
    first = ctx.start(1)
    try:
        ctx.say("run 1: waiting for progress")
        if not _await_progress(ctx, first, mark, verdict):
            return verdict
        ctx.say("run 1: sending SIGTERM")
        mark = ctx.mark()
        sigterm_at = time.time()
        first.signal(signal.SIGTERM)
        code = first.wait(ctx.grace)
        exited = time.time()
        if code is None:
            first.signal(signal.SIGKILL)
            first.proc.wait()
            verdict.add(
                EXITS,
                False,
                "process status",
                f"still running {format_duration(ctx.grace)} after SIGTERM: SIGKILL would lose its work",
            )
        else:
            verdict.exit_after_sigterm_s = round(exited - sigterm_at, 3)
            verdict.add(
                EXITS,
                code == 0,
                "process status",
                f"exit {status(code).removeprefix('with status ')} after {span(exited - sigterm_at)} "
                f"(grace {format_duration(ctx.grace)})" + ("" if code == 0 else "; it must exit 0 to be requeued"),
            )
    finally:
        first.reap()
    saved = _check_save(ctx, verdict, mark, sigterm_at)
    if verdict.failed:
        return verdict
    _check_resume(ctx, verdict, saved)
    return verdict


def _await_progress(ctx: _Context, run: Run, mark: int, verdict: Verdict) -> bool:
    """Wait for run 1 to show progress (or the warm-up); False, with the failed check, when it
    exits first or nothing observable happens before the timeout."""
    start = run.started
    limit = ctx.warmup if ctx.warmup is not None else ctx.timeout
    deadline = time.monotonic() + limit
    while True:
        if run.poll() is not None:
            verdict.add(PROGRESS, False, "process status", f"{run.ended()} before the check saw it make progress")
            return False
        if ctx.warmup is None:
            seen = _progress(ctx, run, mark, 1, start)
            if seen is not None:
                verdict.add(PROGRESS, True, *seen)
                return True
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    if ctx.warmup is not None:
        verdict.add(PROGRESS, True, "--warmup", f"still running after {format_duration(ctx.warmup)}")
        return True
    moments = run.output_since(start)
    output = f"output at {len(moments)} moment(s)" if moments else "no output"
    files = "no file written" if ctx.watch is not None else f"files not watched ({ctx.watch_error})"
    verdict.add(
        PROGRESS,
        False,
        "output, files, reports",
        f"nothing observable in {format_duration(ctx.timeout)}: {output}, {files} in {ctx.target.describe()}, no progress "
        "report; pass --warmup to SIGTERM it after a fixed time, or --checkpoint where it saves",
    )
    return False


def _progress(ctx: _Context, run: Run, mark: int, attempt: int, since: float) -> tuple[str, str] | None:
    """The first sign of progress after `since`: (how observed, what), else None."""
    reported = ctx.reports.of(attempt, "progress", since)
    if reported:
        return "SDK progress report", f"step {reported[0].get('step')}"
    for event in ctx.events(mark):
        new = event.at >= since and event.has(CREATE | MODIFY | MOVED_TO) and not event.is_dir
        if new and ctx.target.matches(event.path):
            return INOTIFY, f"{event.path} written"
    moments = run.output_since(since)
    if len(moments) >= OUTPUT_MOMENTS and moments[-1] - moments[0] >= OUTPUT_SPAN_S:
        return "output", f"output kept coming for {span(moments[-1] - moments[0])}"
    return None


def _check_save(ctx: _Context, verdict: Verdict, mark: int, sigterm_at: float) -> list[str]:
    """The save and atomic checks; returns the files saved after SIGTERM."""
    finished = ctx.reports.of(1, "checkpoint_finished", sigterm_at)
    if finished:
        verdict.save_s = finished[-1].get("duration_s")
        verdict.saved_step = finished[-1].get("step")
    events = ctx.events(mark)
    ways = {rel: way for rel in files(ctx.target) if (way := arrival(events, rel)) is not None}
    verdict.saved_files = sorted(ways)
    if finished:
        how = "SDK checkpoint report" + (f", {INOTIFY}" if ctx.watch is not None else "")
        took = f"step {verdict.saved_step}" + (f", save took {span(verdict.save_s)}" if verdict.save_s else "")
        verdict.add(SAVES, True, how, took + (f"; wrote {_names(ways)}" if ways else ""))
    elif ctx.watch is None:
        verdict.add(SAVES, False, "no SDK report", f"files could not be watched ({ctx.watch_error}) and no report")
        return []
    elif ways:
        verdict.add(SAVES, True, INOTIFY, f"wrote {_names(ways)} after SIGTERM")
    else:
        verdict.add(
            SAVES,
            False,
            INOTIFY,
            f"no file written in {ctx.target.describe()} after SIGTERM"
            + ("" if ctx.target.pattern else "; pass --checkpoint PATH/GLOB if it saves elsewhere"),
        )
        return []
    if ctx.watch is None:
        verdict.add(ATOMIC, True, "SDK checkpoint report", "the SDK writes a temporary file and renames it")
    elif ctx.watch.overflowed:
        verdict.add(ATOMIC, False, INOTIFY, "too many file events to follow (inotify queue overflow)")
    else:
        torn = [how for ok, how in ways.values() if not ok]
        if torn:
            verdict.add(ATOMIC, False, INOTIFY, f"{torn[0]}: SIGKILL during that save would leave it half-written")
        else:
            hows = [how for _, how in ways.values()]
            verdict.add(
                ATOMIC, True, INOTIFY, "; ".join(hows[:2]) + (f"; {len(hows) - 2} more" if len(hows) > 2 else "")
            )
    return sorted(ways)


def _names(ways: dict[str, Any]) -> str:
    names = sorted(ways)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_resume(ctx: _Context, verdict: Verdict, saved: list[str]) -> None:
    """Run 2 opens the saved checkpoint and makes progress after it (with the SDK: its first
    reported step is not before the saved one)."""
    floor = verdict.saved_step
    if floor is None:
        steps = [r.get("step") or 0 for r in ctx.reports.of(1, "progress")]
        floor = max(steps, default=0) if steps else None
    if ctx.watch is not None:
        ctx.watch.rescan()  # a directory renamed into place is watched under its new name
    mark = ctx.mark()
    second = ctx.start(2)
    try:
        ctx.say("run 2: waiting for it to open the checkpoint and make progress")
        deadline = time.monotonic() + ctx.timeout
        opened: Event | None = None
        while True:
            reported = ctx.reports.of(2, "progress")
            if reported and floor is not None:
                step = int(reported[0].get("step") or 0)
                verdict.resumed_step = step
                read = f"; opened {opened.path}" if opened is not None else ""
                verdict.add(
                    RESUMES,
                    step >= max(floor, 1),
                    "SDK progress report",
                    f"first step {step}, saved at step {floor}{read}",
                )
                return
            if opened is None:
                opened = next((e for e in ctx.events(mark) if e.has(OPEN) and e.path in saved), None)
            code = second.poll()
            if opened is not None:
                seen = _progress(ctx, second, mark, 2, opened.at)
                if seen is None and code == 0:
                    seen = ("process status", "exit 0: nothing left to train")
                if seen is None and ctx.warmup is not None and time.time() - opened.at >= ctx.warmup:
                    seen = ("--warmup", f"still running after {format_duration(ctx.warmup)}")
                if seen is not None:
                    verdict.add(RESUMES, True, f"{INOTIFY}, {seen[0]}", f"opened {opened.path}; then {seen[1]}")
                    return
            if code is not None:
                what = f"after opening {opened.path}" if opened else "without opening the checkpoint saved on SIGTERM"
                verdict.add(RESUMES, False, INOTIFY, f"run 2 {second.ended()} {what}")
                return
            if time.monotonic() >= deadline:
                if opened is None:
                    detail = f"run 2 did not open {_names(dict.fromkeys(saved))} in {format_duration(ctx.timeout)}: it would start over"
                else:
                    detail = f"run 2 opened {opened.path} but showed no progress in {format_duration(ctx.timeout)}"
                verdict.add(RESUMES, False, INOTIFY, detail)
                return
            time.sleep(_POLL_S)
    finally:
        second.reap()
