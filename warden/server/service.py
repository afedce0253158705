"""The state behind the API: the composition root of the collaborators that validate, govern and
audit in front of the store and the reconcile loop, one per duty, all handed one
`ServiceContext` (`warden.server.serving`): the leadership terms (`Terms`), the servers of the
database (`Peers`), who calls (`Authenticator`), submissions (`Submissions`), job actions
(`JobActions`), the SDK's reports (`Reports`), governance (`Governance`), logs (`Logs`) and the
thread watch (`ThreadWatch`). The API calls the collaborator that owns its route. Every
collaborator's method either changes nothing and raises `ApiError`, or makes its change durable
before it returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from warden.engine.model import Node
from warden.engine.policy import Policy
from warden.executors.base import Executor, Inventory
from warden.server.actions import JobActions
from warden.server.auth import DEFAULT_TOKEN_LIFETIME_S
from warden.server.authenticator import Authenticator
from warden.server.forecasts import INTERVAL_S as FORECAST_INTERVAL_S
from warden.server.forecasts import Forecasts
from warden.server.governance import Governance
from warden.server.history import INTERVAL_S as HISTORY_INTERVAL_S
from warden.server.leader import StandbyExecutor
from warden.server.logs import Logs, PrivateData
from warden.server.metrics import ServerMetrics
from warden.server.peers import Peers
from warden.server.reconcile import Reconciler
from warden.server.reports import Reports
from warden.server.serving import ServiceContext
from warden.server.submissions import Submissions
from warden.server.terms import Terms
from warden.server.threadwatch import ThreadWatch
from warden.store.leadership import Lease
from warden.store.repo import Store


class Service:
    """Builds the collaborators, starts and stops the server's threads, and reads what the
    metrics and the API read of the server as a whole (`warden.server.metrics.Scraped`)."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        nodes: tuple[Node, ...],
        policy: Policy,
        state_dir: Path,
        clock: Callable[[], float] = time.time,
        url: str = "",
        inventory: Callable[[], Inventory] | None = None,
        history_interval_s: float = HISTORY_INTERVAL_S,
        forecast_interval_s: float = FORECAST_INTERVAL_S,
        token_lifetime_s: float | None = DEFAULT_TOKEN_LIFETIME_S,
        private_data: PrivateData = "jobs",
        lease: Lease | None = None,
        make_executor: Callable[[], Executor] | None = None,
        ca_pem: str | None = None,
    ) -> None:
        """`ca_pem`: the CA that signed this server's own TLS certificate, which the jobs it
        starts are given to trust (`WARDEN_CA`). With a `lease` the server shares its database
        with others and leads only while it holds the lease (`warden.server.leader`):
        `executor` serves its first term, `make_executor` each later one. Without one it leads
        from `start` to `stop` (one server, and the in-process tests)."""
        self.store = store
        self.executor = executor
        self.state_dir = state_dir
        self.clock = clock
        self.url = url
        self.lease = lease
        self.metrics = ServerMetrics(self)
        lock = threading.RLock()

        def make_reconciler(store: Store, executor: Executor, policy: Policy) -> Reconciler:
            rec = Reconciler(
                store,
                executor,
                nodes,
                policy,
                state_dir,
                clock,
                lambda job_id, attempt: self.reports.env(job_id, attempt),
                inventory,
                history_interval_s,
                lock=lock,
                metrics=self.metrics,
            )
            return rec

        first = make_reconciler(store, executor if lease is None else StandbyExecutor(), policy)
        ctx = ServiceContext(store, clock, state_dir, url, lease, lock, self.metrics, first)
        ctx.standby = first if lease is not None else None
        self.ctx = ctx
        self.terms = Terms(ctx, executor, make_executor, make_reconciler)
        self.peers = Peers(ctx, ca_pem)
        self.auth = Authenticator(ctx)
        self.forecasts = Forecasts(lambda: ctx.reconciler.last_planned, forecast_interval_s)
        """Each waiting job's expected start, from the last pass (a thread of its own)."""
        self.submissions = Submissions(ctx, self.forecasts)
        self.actions = JobActions(ctx)
        self.reports = Reports(ctx, self.auth, self.peers)
        self.governance = Governance(ctx, self.auth, token_lifetime_s)
        self.logs = Logs(ctx, private_data)
        self.threads = ThreadWatch(ctx)
        self._helpers: list[threading.Thread] = []

    @property
    def reconciler(self) -> Reconciler:
        """The reconciler of the term this server leads, else the standby's."""
        return self.ctx.reconciler

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node of the cluster, down ones included (a job that fits only there waits)."""
        return self.ctx.nodes

    @property
    def leading(self) -> bool:
        return self.ctx.leading

    @property
    def epoch(self) -> int | None:
        return self.terms.epoch

    def now(self) -> float:
        return self.clock()

    def start(self) -> None:
        """Recover what a stopped server left (re-adopting running jobs), then run the
        reconcile loop in a thread. With a lease, contend for it in a thread instead: each
        term that this server leads does the same (`Terms.begin`)."""
        stopping = self.ctx.stopping
        if self.lease is None:
            self.reconciler.recover()
            self.reconciler.executor.watch(self.reconciler.poke)
            self.threads.watch()
            main = threading.Thread(target=self.reconciler.run, args=(stopping,), name="warden-reconcile", daemon=True)
        else:
            self.threads.watch()
            main = threading.Thread(
                target=self.terms.leading().run, args=(stopping,), name="warden-leader", daemon=True
            )
        self.threads.main = main
        self._helpers = [
            main,
            threading.Thread(target=self.forecasts.run, args=(stopping,), name="warden-forecast", daemon=True),
        ]
        if self.peers.roster is not None:
            self._helpers.append(threading.Thread(target=self.peers.keep, name="warden-roster", daemon=True))
        for thread in self._helpers:
            thread.start()

    def stop(self) -> None:
        self.threads.unwatch()
        self.ctx.stopping.set()
        self.reconciler.poke()
        for thread in self._helpers:
            thread.join(timeout=40)
        if self.lease is None:
            self.executor.close()
        else:
            self.terms.close()
        if self.lease is not None and self.lease.watch is not None and self.ctx.term is None:
            self.lease.watch.close()  # the lease was given back: nothing left to watch
