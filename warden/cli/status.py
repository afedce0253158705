"""`warden status`: each server of `WARDEN_URL` (or `--url`), whether it answers, its role and
epoch and whom it takes for the leader, as Slurm's `scontrol ping` does for its controllers
(docs/control-plane.md, "Several servers"). It exits 0 when a server leads and schedules, 1
when none answers, none leads or the leader's scheduling stopped, saying which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from warden.cli import tables
from warden.cli.app import fail
from warden.cli.jobs import EXIT_UNREACHABLE, CaOpt, JsonOpt, UrlOpt, _dump, client
from warden.cli.tables import Col

if TYPE_CHECKING:
    from warden.client import Probe

STATUS_COLUMNS = (
    Col("SERVER", gives=2),
    Col("STATUS"),
    Col("ROLE"),
    Col("EPOCH", "right"),
    Col("LEADER", gives=1),
)
"""`warden status`'s columns: two servers' URLs side by side fit 80 columns; a longer URL wraps,
the leader's first."""


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        url: UrlOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each server.", min=0.1)] = 5.0,
    ) -> None:
        """Each server of the list: does it answer, does it lead or stand by, its epoch and the
        leader it knows (like scontrol ping). Exits 0 when a server leads, 1 otherwise."""
        with client(url, None, ca) as c:
            probes = c.health_of_each(timeout)
        rows = [_row(p) for p in probes]
        verdict = _verdict(rows)
        if json_out:
            _dump({"servers": rows, **verdict})
        else:
            con = tables.console(highlight=False)
            cells = [
                [
                    r["url"],
                    r["status"],
                    r["role"] or "",
                    "" if r["epoch"] is None else str(r["epoch"]),
                    r["leader"] or "",
                ]
                for r in rows
            ]
            tables.show(con, tables.listing(STATUS_COLUMNS, cells))
            notes = [f"{r['url']}: {r['error']}" for r in rows if r["error"]]
            if notes:
                con.print()
                for note in notes:
                    con.print(note)
            if verdict["ok"]:
                con.print(verdict["message"])
        if not verdict["ok"]:
            fail(verdict["message"], EXIT_UNREACHABLE)


def _row(p: Probe) -> dict[str, Any]:
    """One server as `warden status --json` lists it."""
    h = p.health or {}
    if p.status is None:
        state = "down"
    elif p.health is None:
        state = "error"
    else:
        state = "up" if h.get("ok", p.status == 200) else "stopped"
    error = p.error
    if state == "stopped":
        error = f"scheduling stopped: helper threads died ({', '.join(h.get('dead_threads') or ()) or '?'})"
    return {
        "url": p.url,
        "status": state,
        "http_status": p.status,
        "role": h.get("role"),
        "epoch": h.get("epoch"),
        "leader": h.get("leader"),
        "error": error,
    }


def _verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Who leads, as the servers' answers say: `ok` (a server leads and schedules), the
    leader's URL and epoch, and the sentence to print."""
    answered = [r for r in rows if r["role"] is not None]
    leaders = sorted((r for r in answered if r["role"] == "leader"), key=lambda r: r["epoch"] or 0, reverse=True)
    if leaders:
        top = leaders[0]
        others = "" if len(leaders) == 1 else f" ({', '.join(r['url'] for r in leaders[1:])} also said so)"
        if top["status"] != "up":
            message = f"the leader {top['url']} (epoch {top['epoch']}) does not schedule: {top['error']}"
            return {"ok": False, "leader": top["url"], "epoch": top["epoch"], "message": message}
        message = f"leader: {top['url']}, epoch {top['epoch']}{others}"
        return {"ok": True, "leader": top["url"], "epoch": top["epoch"], "message": message}
    # A standby may name a leader the list does not hold (or holds under another name); one
    # that the list holds and that did not say it leads, does not (it died a moment ago).
    listed = {r["url"] for r in rows}
    named = sorted({r["leader"] for r in answered if r["leader"] and r["leader"] not in listed})
    if named:
        message = f"leader: {', '.join(named)}, not in the list (the standbys name it)"
        return {"ok": True, "leader": named[0], "epoch": None, "message": message}
    if not answered:
        message = f"no server leads: none of the {len(rows)} servers answered"
        if len(rows) == 1:
            message = "no server leads: the server did not answer"
    else:
        message = (
            f"no server leads: {len(answered)} of {len(rows)} answered and stand by (a standby takes over within "
            "about 3 s of the leader's death)"
        )
    return {"ok": False, "leader": None, "epoch": None, "message": message}
