"""The SIGTERM guard: turn warden's preemption signal into "finish this step, save, exit 0".

warden preempts a job by sending SIGTERM to its process group and SIGKILL once the grace period
(``WARDEN_GRACE_SECONDS``) has passed (DESIGN §6, docs/executors.md). Python's default SIGTERM
action kills the process on the spot, in the middle of a step or of a checkpoint write, and
everything since the last checkpoint is lost. The guard replaces that action with a handler that
only raises a flag; the training loop polls the flag once per step (``should_stop()`` is one
attribute read, tens of nanoseconds), and when it is up, saves and calls ``exit()``. A job that
exits 0 after SIGTERM is requeued by warden, not marked done.

    guard = install()
    for step in range(start, steps):
        train_step(step)
        if guard.should_stop():
            store.save(step + 1, state)
            guard.exit()

The handler does nothing that could block (no lock, no I/O): Python runs it between two
bytecodes of the main thread, which may itself hold any lock at that moment.

A SIGTERM warden did not send (another job of the same account, an admin's ``kill``,
``scancel --signal=TERM``) must not read as "saved, done": under warden (``WARDEN_STOP_RECORDS``
set) ``exit(0)`` looks whether warden marked a stop of its own, which it does before it sends
SIGTERM, and where it did not, ends the process by the signal it got, after the job saved; its
executor then evicts and requeues the attempt with what happened (docs/security.md, "Outside
signals"). Outside warden ``exit()`` exits as asked.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import FrameType, TracebackType
from typing import Any, NoReturn, Self

from warden.executors.records import STOP_RECORDS_ENV, stop_asked
from warden.workload.report import Reporter, default_reporter

__all__ = ["PreemptionGuard", "active_guard", "install"]

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_active: PreemptionGuard | None = None


def active_guard() -> PreemptionGuard | None:
    """The guard installed last in this process (None if none is): lets a ``CheckpointStore``
    tell, without being told, whether a save happens because of SIGTERM."""
    return _active


class PreemptionGuard:
    """A flag raised by SIGTERM, with the time it came and the deadline that follows.

    Create and install it in the main thread (Python runs signal handlers there only); any
    thread may then poll ``should_stop()`` or block in ``wait()``.
    """

    def __init__(
        self,
        *,
        grace_s: float | None = None,
        signals: Iterable[int] = (signal.SIGTERM,),
        chain: bool = True,
        reporter: Reporter | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``grace_s`` defaults to ``WARDEN_GRACE_SECONDS`` (None outside warden: no deadline).
        ``chain`` also calls the handler installed before (say, a framework's), after the flag
        is up. ``reporter`` is flushed by ``exit()`` (default: the process-wide one)."""
        env = os.environ if env is None else env
        self.grace_s: float | None = grace_s if grace_s is not None else _float(env.get("WARDEN_GRACE_SECONDS"))
        self.rank: int = _int(env.get("RANK"), 0)
        self.world_size: int = _int(env.get("WORLD_SIZE"), 1)
        self.local_rank: int = _int(env.get("LOCAL_RANK"), 0)
        self.signals: tuple[int, ...] = tuple(signals)
        self.chain = chain
        self._stop_records = env.get(STOP_RECORDS_ENV, "")
        self.signalled_at: float | None = None
        """``time.time()`` when the first signal was handled (None: not signalled)."""
        self.signum: int | None = None
        self._stop = False
        self._reporter = reporter
        self._previous: dict[int, _Handler] = {}
        # Held until the stop: waiters block on it. Releasing a lock never blocks, so unlike
        # Event.set() it is safe inside a signal handler.
        self._gate = threading.Lock()
        self._gate.acquire()

    # -- installing ----------------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        """True on the one rank that writes shared state (checkpoints, reports): rank 0."""
        return self.rank == 0

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> Self:
        """Installs the handler. Raises RuntimeError outside the main thread."""
        global _active
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionGuard.install() must run in the main thread: Python delivers signals "
                "to handlers in the main thread only. Install the guard there and hand it to "
                "other threads, which may poll guard.should_stop() or block in guard.wait()."
            )
        if self.installed:
            return self
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        _active = self
        return self

    def uninstall(self) -> None:
        """Restores the handlers found at ``install()`` (where ours is still in place)."""
        global _active
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if _active is self:
            _active = None

    def __enter__(self) -> Self:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: record, raise the flag, chain. Nothing here may block."""
        if not self._stop:
            self.signalled_at = time.time()  # before the flag: a poller that sees it sees this
            self.signum = signum
            self._raise_flag()
        previous = self._previous.get(signum)
        if self.chain and callable(previous):
            previous(signum, frame)

    def _raise_flag(self) -> None:
        if self._stop:
            return
        self._stop = True
        try:
            self._gate.release()
        except RuntimeError:  # released already by a racing request_stop()
            pass

    # -- polling ---------------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """True once SIGTERM came (or ``request_stop()`` was called). One attribute read:
        cheap enough to call every step, from any thread."""
        return self._stop

    def request_stop(self) -> None:
        """Raises the flag without a signal (a time limit, a stop agreed with other ranks).
        ``signalled_at`` and ``deadline`` stay unset."""
        self._raise_flag()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the flag is up or ``timeout`` passed; returns ``should_stop()``.
        For helper threads (a data loader, an uploader) that should wind down too."""
        if self._stop:
            return True
        if self._gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._gate.release()  # let the next waiter through
        return self._stop

    @property
    def deadline(self) -> float | None:
        """``time.time()`` by which the job must be gone (SIGTERM time + grace); after it warden
        sends SIGKILL. None before SIGTERM or without a known grace.

        The time is taken when the Python handler runs: a long C call (one big tensor op) that
        was under way when the signal came delays it by that call's duration."""
        if self.signalled_at is None or self.grace_s is None:
            return None
        return self.signalled_at + self.grace_s

    def remaining(self) -> float:
        """Seconds left before SIGKILL (0 once past); ``math.inf`` without a deadline."""
        deadline = self.deadline
        return math.inf if deadline is None else max(0.0, deadline - time.time())

    def should_stop_all(self, group: Any = None) -> bool:
        """``should_stop()`` agreed across the ranks of a ``torch.distributed`` group: True on
        every rank as soon as one rank got SIGTERM, so all stop after the same step and rank 0's
        checkpoint is consistent with everyone's state. A collective (an all_reduce of one
        integer): every rank must call it at the same step; call it every N steps if a
        collective per step is too dear. Without an initialized process group it is
        ``should_stop()`` (torch is never imported here)."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return self._stop
        if dist.get_world_size(group) <= 1:
            return self._stop
        import torch

        nccl = str(dist.get_backend(group)) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        flag = torch.tensor([1 if self._stop else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        # The agreed value, not ``self._stop``: a SIGTERM landing after the all_reduce would make
        # this rank stop a step before the others, which then wait for it in their next collective.
        agreed = bool(int(flag.item()))
        if agreed:
            self.request_stop()
        return agreed

    # -- leaving -------------------------------------------------------------------------------

    def exit(self, code: int = 0, flush_timeout: float | None = None) -> NoReturn:
        """Flushes pending reports and the standard streams, then ``sys.exit(code)``.

        Exit 0 after SIGTERM tells warden "saved, requeue me"; the job is not marked done.
        After a signal warden did not send (``outside_signal``), the process ends by that
        signal instead of exit 0, so that warden evicts and requeues the attempt rather than
        record it done. ``flush_timeout`` defaults to 5 s, less if the grace period is nearly
        over."""
        if flush_timeout is None:
            flush_timeout = max(0.0, min(5.0, self.remaining() - 0.5))
        reporter = self._reporter if self._reporter is not None else default_reporter()
        reporter.flush(flush_timeout)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code == 0 and self.signum is not None and self.outside_signal():
            _die_of(self.signum)
        sys.exit(code)

    def outside_signal(self) -> bool:
        """True when the signal that raised the flag is not warden's: under warden (its
        ``WARDEN_STOP_RECORDS``), no file it names marks a stop warden asked for, which warden
        records before it sends SIGTERM. False outside warden, and without a signal."""
        if self.signum is None or not self._stop_records:
            return False
        return not stop_asked(self._stop_records)


def install(**kwargs: Any) -> PreemptionGuard:
    """Creates and installs a ``PreemptionGuard`` (same arguments); returns it."""
    return PreemptionGuard(**kwargs).install()


def _die_of(signum: int) -> NoReturn:
    """End this process by `signum`, as if it had not been caught: its exit status then says
    which signal ended it."""
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)  # unblocked in this thread: delivered before kill returns
    sys.exit(128 + signum)  # a signal whose default is not to end the process


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default
