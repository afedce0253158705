"""The servers of one database (`servers` table): where the jobs this server starts report, and
which CAs they trust to reach them."""

from __future__ import annotations

from warden.server.serving import ServiceContext, log
from warden.store.servers import BEAT_S, Roster


class Peers:
    """This server's row of the `servers` table (with a lease) and the URLs of the others seen
    up; without a lease, or without a URL, it knows only itself."""

    def __init__(self, ctx: ServiceContext, ca_pem: str | None) -> None:
        self.ctx = ctx
        self.ca_pem = ca_pem
        """The CA that signed this server's own TLS certificate, which its jobs trust."""
        lease = ctx.lease
        self.roster = (
            Roster(ctx.store.engine, lease.holder, ca=ca_pem) if lease is not None and lease.holder.url else None
        )
        self._servers: tuple[str, ...] = ()
        """The servers' URLs the roster read last."""

    def servers(self) -> list[str]:
        """The URLs of the servers a job this server starts reports to (`WARDEN_URL`): this
        one first, then every other of its database seen up within `SEEN_S` (the `servers`
        table, read every `BEAT_S`)."""
        url = self.ctx.url
        if not url:
            return []
        return [url, *(u for u in self._servers if u != url)]

    def trusted_cas(self) -> tuple[str, ...]:
        """The CAs of this server's own certificate and of the other servers seen up: what a
        job given their URLs trusts (`WARDEN_CA`, PEM text). None of them for servers with an
        admin's certificate, which jobs check against the system's store."""
        seen = self.roster.cas if self.roster is not None else ()
        return tuple(dict.fromkeys(ca for ca in (self.ca_pem, *seen) if ca))

    def keep(self) -> None:
        """Until the server stops: refresh this server's row of `servers` every `BEAT_S` and
        keep the URLs of the servers seen up; then delete the row."""
        assert self.roster is not None
        while True:
            try:
                self._servers = self.roster.beat() or self._servers
            except Exception as err:  # the database away: the last list stands
                log.warning("could not refresh this server's row of the servers table: %s", err)
            if self.ctx.stopping.wait(BEAT_S):
                break
        try:
            self.roster.leave()
        except Exception as err:  # it is forgotten once not seen for SEEN_S
            log.warning("could not delete this server's row of the servers table: %s", err)
