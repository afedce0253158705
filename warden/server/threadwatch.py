"""The server's helper threads watched: one that dies of an exception stops scheduling, loudly.
Preempting without a working SIGKILL, or running without passes, must not go on unnoticed."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import Counter

from warden.server.serving import ServiceContext, log

THREAD_PREFIX = "warden-"
"""The name prefix of the server's helper threads, the ones watched."""


class ThreadWatch:
    """Records each helper thread that died (`dead`), counts it, and stops the server."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.main: threading.Thread | None = None
        """The server's main thread (the reconcile loop, or the lease's): dead if it ended by
        itself."""
        self._dead: dict[str, str] = {}
        """Helper threads that died, and of what: scheduling stopped then."""
        self._unwatch: Callable[[], None] = lambda: None
        self._deaths = Counter(
            "warden_server_thread_deaths",
            "Server helper threads (reconcile loop, kill timer) that died; scheduling stops.",
            registry=ctx.metrics.registry,
        )

    def watch(self) -> None:
        """From now on, a server thread (`warden-*`: the reconcile loop, the kill timer) that
        dies of an exception stops scheduling (`unwatch` ends it)."""
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if args.thread is not None and args.thread.name.startswith(THREAD_PREFIX):
                self._died(args.thread.name, args.exc_value)
            previous(args)

        threading.excepthook = hook
        self._unwatch = lambda: setattr(threading, "excepthook", previous) if threading.excepthook is hook else None

    def unwatch(self) -> None:
        self._unwatch()

    def _died(self, name: str, err: BaseException | None) -> None:
        self._dead[name] = f"{type(err).__name__}: {err}" if err is not None else "exited"
        self._deaths.inc()
        log.critical("server thread %s died (%s): scheduling is stopped; restart the server", name, self._dead[name])
        self.ctx.stopping.set()
        self.ctx.reconciler.poke()

    def dead(self) -> list[str]:
        """Each helper thread that died, with its cause; empty while the server is healthy."""
        dead = dict(self._dead)
        main = self.main
        if main is not None and not main.is_alive() and not self.ctx.stopping.is_set():
            dead.setdefault(main.name, "exited")
        return [f"{name}: {cause}" for name, cause in sorted(dead.items())]
