"""The user's verbs, as Slurm and kubectl users know them: `submit`, `queue`, `describe`,
`cancel`, `approve`, `release`, `logs`, `nodes`, `queues`, `token create|list|revoke`, `audit`.

Each talks to a warden server (`WARDEN_URL`, `WARDEN_TOKEN`; `--url`/`--token` override;
several servers' URLs separated by commas are tried in turn, `warden.client`).
Every listing has `--json`; rich tables otherwise. A refusal prints one line naming the field
and the value and exits 2; an unreachable server exits 1. A number or duration outside what
the API takes is refused the same way (exit 2) before anything is sent.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from warden.cli import tables
from warden.cli.app import AfterDashes, App, duration, fail
from warden.cli.tables import Col
from warden.engine.durations import relative, span

if TYPE_CHECKING:  # rich loads with the verbs that print a table
    from rich.console import Console
    from rich.table import Table

    from warden.client import Client

EXIT_REFUSED = 2
SUBMIT_RETRIES = 2
"""How often `submit` sends a submission again (with its Idempotency-Key) when no answer came."""
EXIT_UNREACHABLE = 1
INT32_MAX = 2**31 - 1
"""The largest count the API takes (`warden.server.requests.INT32_MAX`)."""
AUDIT_MAX = 10_000
"""The most audit entries one request may ask for (`GET /v1/audit?limit=`)."""


def _within(low: int, high: int) -> Callable[[str | int], int]:
    """A whole-number option checked against the API's bounds: anything else is refused (exit
    2, the option and the value named) before anything is sent."""

    def parse(text: str | int) -> int:
        if isinstance(text, int):  # a default
            return text
        try:
            value = int(text.strip())
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a whole number") from None
        if value < low:
            raise typer.BadParameter(f"{value} is below the least allowed, {low}")
        if value > high:
            raise typer.BadParameter(f"{value} is above the most allowed, {high}")
        return value

    return parse


def _duration(param: typer.CallbackParam, value: str | None) -> str | None:
    """A duration option (--lease, --grace, --time-limit) checked as the server checks it, and
    never a bare number: a bad one is refused (exit 2) before anything is sent; the server gets
    it as written."""
    if value is not None:
        duration(param.opts[0], value)
    return value


def _lifetime(value: str | None) -> str | None:
    """--expires: a duration (30d, 12h), from 1 second to 10 years; refused (exit 2)
    before anything is sent."""
    if value is None:
        return None
    from warden.server.auth import TOKEN_LIFETIME_MAX_S

    if not 1 <= duration("--expires", value) <= TOKEN_LIFETIME_MAX_S:
        fail(f"--expires: {value!r} is not between 1s and 3650d (10 years)")
    return value


UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Server URL, or several separated by commas, tried in turn (default $WARDEN_URL or "
        "https://127.0.0.1:8765).",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", help="Bearer token (default $WARDEN_TOKEN).", show_default=False)
]
CaOpt = Annotated[
    str | None,
    typer.Option(
        "--ca",
        help="PEM file of the certificates an https:// server is checked against (default $WARDEN_CA, else the "
        "system's store and the ca.crt of this machine's server).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
WideOpt = Annotated[bool, typer.Option("--wide", "-w", help="Show every column, however wide.")]

QUEUE_COLUMNS = (
    Col("ID"),
    Col("NAME", gives=1),
    Col("USER", wide=True),
    Col("QUEUE"),
    Col("TIER", "right"),
    Col("STATE"),
    Col("GPUS", "right"),
    Col("WAIT", "right", wide=True),
    Col("POS", "right", wide=True),
    Col("START"),
    Col("ELAPSED", "right", wide=True),
    Col("LEASE-END", wide=True),
    Col("NODES", wide=True, gives=3),
    Col("REASON", gives=2),
)
"""`warden queue`'s columns: the default ones fit 80 columns with a 20-letter reason code; a
long name gives way (wraps) before the reason does. `--wide` adds, of a job that holds
resources, how long it has run, when its lease ends (it may be preempted from then) and its
nodes."""
NODE_COLUMNS = (
    Col("NODE"),
    Col("FLAVOR"),
    Col("BLOCK", wide=True),
    Col("CPU", "right", wide=True),
    Col("MEMORY", "right", wide=True),
    Col("GPUS", "right"),
    Col("USED", "right"),
    Col("FREE", "right"),
    Col("JOBS", gives=1),
    Col("STATE", gives=2),
)
QUEUES_COLUMNS = (
    Col("QUEUE"),
    Col("PARENT"),
    Col("WEIGHT", "right", wide=True),
    Col("NOMINAL", gives=1),
    Col("BORROW LIMIT", wide=True, gives=2),
    Col("LEND LIMIT", wide=True, gives=3),
    Col("IN USE", "right"),
    Col("BORROWED", "right"),
    Col("PENDING", "right"),
    Col("FAIR-SHARE USE", "right", wide=True),
    Col("OWED GPU-h", "right"),
    Col("DELIVERED GPU-h", "right"),
)
"""`warden queues`' columns: quota, what its jobs hold and of it borrow beyond its nominal, and
owed vs delivered GPU-hours fit 80 columns; `--wide` adds the policy's weight and limits (what a
queue may borrow beyond its nominal, "any": no limit; and lend of it, "all": no limit) and
fair-share usage."""
TOKEN_COLUMNS = (
    Col("ID"),
    Col("USER"),
    Col("ROLE"),
    Col("QUEUES", gives=1),
    Col("CREATED"),
    Col("EXPIRES"),
    Col("REVOKED"),
)
AUDIT_COLUMNS = (Col("TIME"), Col("ACTOR"), Col("ACTION"), Col("TARGET", gives=1), Col("DETAILS", gives=2))
ATTEMPT_COLUMNS = (
    Col("ATTEMPT", "right"),
    Col("STATE"),
    Col("STARTED", gives=2),
    Col("ENDED", gives=2),
    Col("PLACEMENT", gives=3),
    Col("EXIT", "right"),
    Col("REASON", gives=1),
)
PREEMPTION_COLUMNS = (
    Col("#", "right"),
    Col("WHEN", gives=2),
    Col("BY", gives=1),
    Col("KIND"),
    Col("LOST GPU-H", "right"),
    Col("η", "right"),
)
EVENT_COLUMNS = (Col("TIME", gives=2), Col("FROM"), Col("TO"), Col("ACTOR"), Col("REASON", gives=1))
VICTIM_COLUMNS = (
    Col("VICTIM"),
    Col("QUEUE"),
    Col("TIER", "right"),
    Col("GPUS", "right"),
    Col("SIGTERM"),
    Col("GONE BY"),
    Col("LOST GPU-H", "right"),
)


@contextmanager
def client(url: str | None, token: str | None, ca: str | None = None) -> Iterator[Client]:
    """A client of the server(s); a refusal ends the command with its message (exit 2), as
    does a bad URL, and a server that cannot be reached with exit 1."""
    from warden.client import ApiRefused, BadServerUrl, Client, Unreachable

    try:
        c = Client(url, token, ca=ca)
    except BadServerUrl as err:
        fail(str(err))
    try:
        yield c
    except ApiRefused as err:
        hint = (_token_hint(c.token_source) if c.withheld is None else f"; {c.withheld}") if err.status == 401 else ""
        fail(err.describe() + hint)
    except Unreachable as err:
        fail(str(err), EXIT_UNREACHABLE)
    finally:
        c.close()


def _token_hint(source: str | None) -> str:
    """What a refused or missing token's message adds: where the CLI looked for one, and how to
    point it at the server's (whose state directory may not be the one looked in)."""
    from warden.client import local_token_path

    path = local_token_path()
    point = (
        f"a server started with --state-dir DIR wrote its admin token into DIR/admin-token: set "
        f"WARDEN_STATE_DIR=DIR (now {os.environ.get('WARDEN_STATE_DIR') or 'unset'}), or WARDEN_TOKEN to a token"
    )
    if source is None:
        return f"; no token was given (--token, $WARDEN_TOKEN) and none could be read from {path}; {point}"
    if source.startswith(("-", "$")):
        return f"; the token is {source}'s"
    return f"; the token was read from {source}; {point}"


def _dump(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _age(seconds: float | None) -> str:
    return "" if seconds is None else span(seconds)


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            fail(f"--env: {p!r} is not KEY=VALUE")
        env[key] = value
    return env


def register(app: typer.Typer) -> None:
    """Attach the verbs to the top-level `warden` app."""

    @app.command("submit", cls=AfterDashes)
    def submit(
        command: Annotated[
            list[str], typer.Argument(help="The command and its arguments (after --).", show_default=False)
        ],
        queue: Annotated[str, typer.Option("--queue", "-q", help="Leaf queue (team).", show_default=False)],
        tier: Annotated[
            int,
            typer.Option(
                "--tier",
                "-t",
                help="1 production inference, 2 pre-training, 3 experimentation, 4 opportunistic.",
                show_default=False,
                parser=_within(1, 4),
            ),
        ],
        gpus: Annotated[int, typer.Option("--gpus", help="GPUs per replica.", parser=_within(0, INT32_MAX))] = 1,
        replicas: Annotated[
            int, typer.Option("--replicas", help="Replicas of the gang.", parser=_within(1, INT32_MAX))
        ] = 1,
        placement: Annotated[str, typer.Option("--placement", help="pack, block or any.")] = "any",
        lease: Annotated[
            str | None,
            typer.Option("--lease", help="Minimum runtime, e.g. 30m.", show_default=False, callback=_duration),
        ] = None,
        grace: Annotated[
            str | None,
            typer.Option("--grace", help="Grace after SIGTERM, e.g. 300s.", show_default=False, callback=_duration),
        ] = None,
        time_limit: Annotated[
            str | None,
            typer.Option(
                "--time-limit",
                help="Longest run of each attempt, e.g. 2h: then SIGTERM, grace, SIGKILL; the job ends TIMEOUT.",
                show_default=False,
                callback=_duration,
            ),
        ] = None,
        name: Annotated[
            str, typer.Option("--name", help="A name to show (default: the program's).", show_default=False)
        ] = "",
        cpu: Annotated[int, typer.Option("--cpu", help="Millicores per replica.", parser=_within(0, INT32_MAX))] = 0,
        memory: Annotated[int, typer.Option("--memory", help="MiB per replica.", parser=_within(0, INT32_MAX))] = 0,
        flavor: Annotated[str | None, typer.Option("--flavor", help="GPU flavor.", show_default=False)] = None,
        env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE for the job (repeatable).")] = [],
        saves_on_sigterm: Annotated[
            bool,
            typer.Option(
                "--saves-on-sigterm",
                help="The job saves its state on SIGTERM (as check-workload checks): an exit 0 within its grace "
                "after one counts as a save, and its preemption loses nothing.",
            ),
        ] = False,
        dry_run: Annotated[
            bool,
            typer.Option("--dry-run", help="Say what the scheduler would decide for the job now; submit nothing."),
        ] = False,
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Submit a job; prints its id as the last word. With --dry-run: would it start now (where),
        preempt (whom), or wait (why, and until when)?"""
        body: dict[str, Any] = {
            "queue": queue,
            "tier": tier,
            "command": list(command),
            "gpus": gpus,
            "replicas": replicas,
            "placement": placement,
            "name": name,
            "cpu": cpu,
            "memory": memory,
            "workdir": os.getcwd(),
            "env": _parse_env(env),
        }
        for key, value in (("lease", lease), ("grace", grace), ("time_limit", time_limit), ("flavor", flavor)):
            if value is not None:
                body[key] = value
        if saves_on_sigterm:
            body["saves_on_sigterm"] = True
        if dry_run:
            with client(url, token, ca) as c:
                verdict = c.dry_run(**body)
            _dump(verdict) if json_out else _print_verdict(verdict)
            return
        with client(url, token, ca) as c:
            # One key for this submission: should an answer be lost, the retry returns the same job.
            out = c.submit(idempotency_key=uuid.uuid4().hex, retries=SUBMIT_RETRIES, **body)
        if json_out:
            _dump(out)
        else:
            typer.echo(f"Submitted job ({out['state']}) {out['id']}")

    @app.command("queue")
    def queue_cmd(
        queue: Annotated[str | None, typer.Option("--queue", "-q", show_default=False)] = None,
        state: Annotated[
            str | None, typer.Option("--state", help="Comma-separated states.", show_default=False)
        ] = None,
        user: Annotated[str | None, typer.Option("--user", "-u", show_default=False)] = None,
        all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
        wide: WideOpt = False,
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """List jobs like squeue: id, name, queue, tier, state, GPUs, expected start, reason;
        --wide adds user, wait, position, time running, lease end and nodes."""
        with client(url, token, ca) as c:
            rows = c.jobs(queue=queue, state=state, user=user, all=all_jobs)
        if json_out:
            _dump(rows)
            return
        tables.show(tables.console(), queue_table(rows, time.time(), wide))

    @app.command("describe")
    def describe(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Why a job waits (one sentence), its sort key, attempts, preemptions and events; a
        warning when it is in a preemption cycle."""
        with client(url, token, ca) as c:
            j = c.job(job_id)
        if json_out:
            _dump(j)
            return
        _print_job(j)

    @app.command("cancel")
    def cancel(
        job_ids: Annotated[
            list[str] | None, typer.Argument(help="Ids of the jobs to cancel.", metavar="JOB_ID", show_default=False)
        ] = None,
        user: Annotated[
            str | None, typer.Option("--user", "-u", help="Cancel this user's jobs.", show_default=False)
        ] = None,
        queue: Annotated[
            str | None, typer.Option("--queue", "-q", help="Cancel the jobs of this queue.", show_default=False)
        ] = None,
        state: Annotated[
            str | None,
            typer.Option("--state", help="Cancel the jobs in these states (comma-separated).", show_default=False),
        ] = None,
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Cancel jobs, as scancel does: those named, or those the selection (--user, --queue,
        --state) matches, each a user may cancel (their own; an admin's, any); with both, the
        named ones the selection matches. A running job gets SIGTERM, its grace, then SIGKILL.
        Every named job is checked before any is cancelled."""
        ids = list(job_ids or [])
        selected = user is not None or queue is not None or state is not None
        if not ids and not selected:
            fail("give the ids of the jobs to cancel, or a selection: --user, --queue or --state")
        for job_id in ids:
            if not job_id.isdigit():
                fail(f"JOB_ID: {job_id!r} is not a job id (ASCII digits); nothing was cancelled")
        states = _cancellable_states(state)
        with client(url, token, ca) as c:
            me = c.whoami()
            if user is not None and user != me["user"] and me["role"] != "admin":
                fail(f"--user: {user!r} is not you ({me['user']!r}); only an admin cancels another user's jobs")
            mine = user if user is not None or me["role"] == "admin" else me["user"]
            if ids:
                jobs = [_cancellable(c, job_id, me) for job_id in dict.fromkeys(ids)]
                if selected:
                    jobs = [j for j in jobs if _matches(j, mine, queue, states)]
            else:
                jobs = c.jobs(queue=queue, state=",".join(states) if states else None, user=mine)
            done = [_cancel_one(c, j["id"]) for j in jobs]
        outcomes = [d for d in done if d is not None]
        if json_out:
            _dump(outcomes)
            return
        for out in outcomes:
            typer.echo(f"job {out['id']}: {shown_state(out)} (cancel requested)")
        typer.echo(_cancelled_count(len(outcomes), ids, selected))

    @app.command("approve")
    def approve(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Approve a tier-1/2 job that awaits an admin (admins only)."""
        with client(url, token, ca) as c:
            out = c.approve(job_id)
        _dump(out) if json_out else typer.echo(f"job {out['id']}: {shown_state(out)}")

    @app.command("release")
    def release(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Let a held job be scheduled again, like Slurm's `scontrol release` (admins only)."""
        with client(url, token, ca) as c:
            out = c.release(job_id)
        _dump(out) if json_out else typer.echo(f"job {out['id']}: {shown_state(out)} (released)")

    @app.command("logs")
    def logs(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        attempt: Annotated[
            int | None, typer.Option("--attempt", show_default=False, parser=_within(1, INT32_MAX))
        ] = None,
        rank: Annotated[int, typer.Option("--rank", parser=_within(0, INT32_MAX))] = 0,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")] = False,
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
    ) -> None:
        """Print a job's output (stdout and stderr of one replica of one attempt)."""
        offset = 0
        with client(url, token, ca) as c:
            while True:
                out = c.logs(job_id, attempt, rank, offset)
                sys.stdout.write(out["text"])
                sys.stdout.flush()
                offset = out["offset"]
                attempt = out["attempt"] or attempt
                if not follow or out["eof"]:
                    return
                if not out["text"]:
                    time.sleep(0.25)

    @app.command("nodes")
    def nodes(
        wide: WideOpt = False, url: UrlOpt = None, token: TokenOpt = None, ca: CaOpt = None, json_out: JsonOpt = False
    ) -> None:
        """The nodes, their GPUs and what runs on them."""
        with client(url, token, ca) as c:
            rows = c.nodes()
        if json_out:
            _dump(rows)
            return
        cells = [
            [
                n["name"],
                n["flavor"],
                n.get("block") or "",
                str(n.get("cpu") or 0),
                str(n.get("memory") or 0),
                str(n["gpus"]),
                str(n["gpus_used"]),
                str(n["gpus_free"]),
                ", ".join(n["jobs"]),
                _node_state(n),
            ]
            for n in rows
        ]
        tables.show(tables.console(), tables.listing(NODE_COLUMNS, cells, wide))

    @app.command("queues")
    def queues(
        wide: WideOpt = False, url: UrlOpt = None, token: TokenOpt = None, ca: CaOpt = None, json_out: JsonOpt = False
    ) -> None:
        """Queues: quota, GPUs in use and borrowed, owed vs delivered GPU-hours; --wide adds
        weight, borrowing and lending limits and fair-share usage."""
        with client(url, token, ca) as c:
            rows = c.queues()
        if json_out:
            _dump(rows)
            return
        cells = [
            [
                q["name"],
                q["parent"] or "",
                tables.number(q["weight"]),
                _quota(q["nominal"], "none"),
                "" if q["parent"] is None else _quota(q.get("borrowing_limit"), "any"),
                "" if q["parent"] is None else _quota(q.get("lending_limit"), "all"),
                str(q["gpus_in_use"]),
                "" if q.get("gpus_borrowed") is None else str(q["gpus_borrowed"]),
                str(q["pending_jobs"]),
                tables.number(q["fair_share_usage"]),
                f"{q['owed_gpu_hours']:.2f}",
                f"{q['delivered_gpu_hours']:.2f}",
            ]
            for q in rows
        ]
        tables.show(tables.console(), tables.listing(QUEUES_COLUMNS, cells, wide))

    token_app = App(help="Bearer tokens (admins only).", no_args_is_help=True)
    app.add_typer(token_app, name="token")

    @token_app.command("create")
    def token_create(
        user: Annotated[str, typer.Option("--user", help="Who the token stands for.", show_default=False)],
        role: Annotated[str, typer.Option("--role", help="user or admin.")] = "user",
        queues: Annotated[str, typer.Option("--queues", help="Comma-separated leaf queues, or *.")] = "*",
        expires: Annotated[
            str | None,
            typer.Option(
                "--expires",
                help="Lifetime, e.g. 30d (at most 3650d); default: the server's --token-lifetime.",
                show_default=False,
                callback=_lifetime,
            ),
        ] = None,
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Create a token; prints it (it is shown only once)."""
        lifetime = None if expires is None else duration("--expires", expires)
        with client(url, token, ca) as c:
            out = c.create_token(user, role, [q.strip() for q in queues.split(",") if q.strip()], lifetime)
        _dump(out) if json_out else typer.echo(out["token"])

    @token_app.command("list")
    def token_list(
        wide: WideOpt = False, url: UrlOpt = None, token: TokenOpt = None, ca: CaOpt = None, json_out: JsonOpt = False
    ) -> None:
        """Every token: id, user, role, queues, when created, expires and was revoked; never a secret."""
        with client(url, token, ca) as c:
            rows = c.tokens()
        if json_out:
            _dump(rows)
            return
        now = time.time()
        cells = [
            [
                str(t["id"]),
                t["user"],
                t["role"],
                ",".join(t["queues"]),
                _clock(t["created_at"], now),
                "never" if t["expires_at"] is None else _clock(t["expires_at"], now),
                _clock(t["revoked_at"], now),
            ]
            for t in rows
        ]
        tables.show(tables.console(), tables.listing(TOKEN_COLUMNS, cells, wide))

    @token_app.command("revoke")
    def token_revoke(
        token_id: Annotated[int, typer.Argument(help="The token's id, as 'warden token list' shows it.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Revoke a token: the server refuses it from the next request on."""
        with client(url, token, ca) as c:
            out = c.revoke_token(token_id)
        _dump(out) if json_out else typer.echo(f"token {out['id']} of {out['user']} revoked")

    @app.command("whoami")
    def whoami(url: UrlOpt = None, token: TokenOpt = None, ca: CaOpt = None, json_out: JsonOpt = False) -> None:
        """Who the token stands for: the user, the role and the queues it may submit to."""
        with client(url, token, ca) as c:
            me = c.whoami()
        if json_out:
            _dump(me)
            return
        queues = ", ".join(me["queues"]) or "none"
        typer.echo(f"{me['user']} ({me['role']}); queues: {'every queue' if queues == '*' else queues}")

    @app.command("audit")
    def audit(
        limit: Annotated[int, typer.Option("--limit", parser=_within(1, AUDIT_MAX))] = 100,
        url: UrlOpt = None,
        token: TokenOpt = None,
        ca: CaOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """The append-only log of privileged actions (admins only)."""
        with client(url, token, ca) as c:
            rows = c.audit(limit)
        if json_out:
            _dump(rows)
            return
        now = time.time()
        cells = [
            [_clock(a["at"], now), a["actor"], a["action"], a["target"], _details(a["details"], now)] for a in rows
        ]
        tables.show(tables.console(), tables.listing(AUDIT_COLUMNS, cells))


def queue_table(rows: list[dict[str, Any]], now: float, wide: bool = False) -> Table:
    """`warden queue`'s table of `GET /v1/jobs` rows. A job in its grace after a cancel or a
    preemption shows its terminating state and, where its reason would be, its SIGKILL
    countdown."""
    cells = [
        [
            r["id"],
            r["name"],
            r["user"],
            r["queue"],
            str(r["tier"]),
            shown_state(r),
            str(r["gpus"]),
            _age(r["wait_s"]),
            str(r["position"] or ""),
            _expected_cell(r.get("expected_start"), now),
            "" if r.get("started_at") is None else span(now - r["started_at"]),
            _lease_end_cell(r, now),
            ",".join(r.get("nodes") or ()),
            _reason_cell(r, now),
        ]
        for r in rows
    ]
    return tables.listing(QUEUE_COLUMNS, cells, wide)


def _lease_end_cell(job: dict[str, Any], now: float) -> str:
    """When a running job's lease ends ("in 12m", "3m ago": preemptible since), "never" for a
    tier that is never preempted; empty for a job that holds nothing or is being stopped."""
    if not _holds(job["state"]) or job.get("started_at") is None or job.get("kill_at") is not None:
        return ""
    at = job.get("lease_end_at")
    return "never" if at is None else relative(at, now)


def _holds(state: str) -> bool:
    """Whether a job in `state` holds resources (`JobState.holds_resources`)."""
    from warden.engine.model import JobState

    try:
        return JobState(state).holds_resources
    except ValueError:
        return False


def shown_state(job: dict[str, Any]) -> str:
    """The state a person reads, as the API gives it (`shown_state`, `lifecycle.shown`): the
    stored state, or CANCELLING or STOPPING for a job being stopped, as Slurm shows CG."""
    return str(job["shown_state"])


def _reason_cell(job: dict[str, Any], now: float) -> str:
    """`warden queue`'s REASON: a waiting job's reason code; for a job in its grace, when it
    gets SIGKILL ("SIGKILL in 42s")."""
    if job.get("kill_at") is not None and _holds(job["state"]):
        return f"SIGKILL {relative(job['kill_at'], now)}"
    return str((job.get("reason") or {}).get("code", ""))


def _running_line(j: dict[str, Any], now: float) -> str | None:
    """`warden describe`'s sentence for a job that runs: since when, where, when its lease
    ends (it may be preempted from then) and its attempt's η."""
    if not _holds(j["state"]) or j.get("started_at") is None:
        return None
    nodes = j.get("nodes") or []
    parts = [f"since {_clock(j['started_at'], now)}" + (f" on {', '.join(nodes)}" if nodes else "")]
    if j.get("kill_at") is None:
        at = j.get("lease_end_at")
        if at is None:
            parts.append("never preempted (its tier is not preemptible)")
        elif at > now:
            # `lease_end_at` is the protection from tiers 2–4 (thrash guard included); tier 1
            # is held by the lease alone (DESIGN §4.3).
            parts.append(
                f"its lease ends at {_clock(at, now)}: preemptible from then (by tier 1 once its lease alone is over)"
            )
        else:
            parts.append(f"its lease ended at {_clock(at, now)}: preemptible")
    if j.get("efficiency") is not None:
        parts.append(f"η {j['efficiency']:.2f} (the share of its GPU time that was progress)")
    return "; ".join(parts)


def _stopping_line(j: dict[str, Any], now: float) -> str | None:
    """`warden describe`'s sentence for a job being stopped: why, and when SIGKILL comes."""
    if not _holds(j["state"]):
        return None
    kill_at = j.get("kill_at")
    if j.get("cancel_requested"):
        why = "a cancel was requested"
    elif j["state"] == "PREEMPTING":
        why = "it was preempted (see its events)"
    elif kill_at is not None:
        why = "it got SIGTERM (see its events)"
    else:
        return None
    if kill_at is None:
        return f"{why}; the leading server sends SIGTERM at its next pass that tracks its processes"
    return f"{why}; it has until SIGKILL at {_clock(kill_at, now)} to save and exit"


def _print_job(j: dict[str, Any]) -> None:
    """`warden describe`: the job in sentences, then its attempts, preemptions and events."""
    con = tables.console()
    now = time.time()
    _print_request(con, j, now)
    _print_standing(con, j, now)
    _print_warnings(con, j)
    if j["attempts"]:
        _print_attempts(con, j["attempts"], now)
    if j.get("preemptions"):
        _print_preemptions(con, j["preemptions"], now)
    cells = [[_clock(e["at"], now), e["from"] or "", e["to"], e["actor"], e["reason"]] for e in j["events"]]
    tables.titled(con, "events", tables.listing(EVENT_COLUMNS, cells))


def _print_request(con: Console, j: dict[str, Any], now: float) -> None:
    """Who submitted the job where, its state, and what it asked for."""
    from rich.markup import escape

    command = shlex.join(j["command"]) if "command" in j else "hidden (another user's job)"
    if j.get("command_expired_at") is not None:  # dropped to make room under limits.max_stored_bytes_per_user
        command = f"dropped at {_clock(j['command_expired_at'], now)} to make room (limits.max_stored_bytes_per_user)"
    state = shown_state(j)
    con.print(
        f"[bold]job {j['id']}[/bold] {j['name']}  user {j['user']}  queue {j['queue']}  tier {j['tier']}  "
        f"[bold]{state}[/bold]" + (f" ({j['state']})" if state != j["state"] else "")
    )
    saves = "; saves on SIGTERM (declared)" if j.get("saves_on_sigterm") else ""
    con.print(
        f"  {j['gpus']} GPU(s) as {j['replicas']} × {j['gpus_per_replica']}, placement {j['placement']}; "
        f"lease {_age(j['lease_s'])}, grace {_age(j['grace_s'])}{saves}; command: {escape(command)}"
    )


def _print_standing(con: Console, j: dict[str, Any], now: float) -> None:
    """How the job runs or stops, or why it waits and when it is expected to start."""
    running = _running_line(j, now)
    if running:
        con.print(f"  [bold]running:[/bold] {running}")
    stopping = _stopping_line(j, now)
    if stopping:
        con.print(f"  [bold]stopping:[/bold] {stopping}")
    reason = j.get("reason")
    if reason:
        where = f", position {j['position']}" if j.get("position") is not None else ""
        con.print(f"  [bold]why pending:[/bold] {reason['message']} ({reason['code']}{where})")
    expected = j.get("expected_start")
    if expected:
        con.print(f"  [bold]expected start:[/bold] {_expected_line(expected, now)}")
    if j.get("sort_key"):
        con.print(f"  sort key: {json.dumps(j['sort_key'])}")


def _print_warnings(con: Console, j: dict[str, Any]) -> None:
    """The submission's warnings and the preemption cycle the job is in, if any."""
    for w in j.get("warnings") or []:
        con.print(f"  [yellow]warning:[/yellow] {w}")
    cycle = j.get("preemption_cycle")
    if cycle:
        con.print(f"  [bold yellow]warning: preemption cycle ({cycle['kind']}):[/bold yellow] {cycle['message']}")


def _print_attempts(con: Console, attempts: list[dict[str, Any]], now: float) -> None:
    """The attempts table: each run of the job, where it ran and how it ended."""
    cells = [
        [
            str(a["number"]),
            a["state"],
            _clock(a["started_at"], now),
            _clock(a["ended_at"], now),
            "; ".join(f"{p['node']}:{','.join(map(str, p['gpus']))}" for p in a["placement"]),
            ",".join(map(str, a["exit_codes"] or [])),
            a["reason"] or "",
        ]
        for a in attempts
    ]
    tables.titled(con, "attempts", tables.listing(ATTEMPT_COLUMNS, cells))


def _print_preemptions(con: Console, preemptions: list[dict[str, Any]], now: float) -> None:
    """The preemptions table, then what each one's lost work rests on."""
    cells = []
    for p in preemptions:
        by = p["by"] or "—"
        if p["by_queue"] is not None:
            by += f" ({p['by_queue']} t{p['by_tier']})"
        lost = p["lost_work_gpu_hours"]
        cells.append(
            [
                str(p["attempt"]),
                _clock(p["at"], now),
                by,
                p["kind"],
                "" if lost is None else f"{lost:.3f}",
                "" if p["efficiency"] is None else f"{p['efficiency']:.2f}",
            ]
        )
    tables.titled(con, "preemptions", tables.listing(PREEMPTION_COLUMNS, cells))
    for p in preemptions:
        if p.get("lost_work_why"):
            con.print(f"  lost work of #{p['attempt']}: {p['lost_work_why']}", markup=False, highlight=False)


def _cancellable_states(text: str | None) -> list[str]:
    """--state: the states to cancel, each a state a job can be cancelled in (not finished);
    anything else is refused (exit 2) before anything is asked or cancelled."""
    if text is None:
        return []
    from warden.engine.model import JobState

    names = [s.strip().upper() for s in text.split(",") if s.strip()]
    open_states = [s.value for s in JobState if not s.terminal]
    for name in names or [text]:
        if name not in open_states:
            fail(f"--state: {name!r} is not a state a job can be cancelled in; allowed: {', '.join(open_states)}")
    return names


def _cancellable(c: Client, job_id: str, me: dict[str, Any]) -> dict[str, Any]:
    """The job `job_id`, checked before anything is cancelled: it exists, has not ended, and
    is the caller's (or the caller is an admin); else the command ends, nothing cancelled."""
    from warden.client import ApiRefused

    try:
        job = c.job(job_id)
    except ApiRefused as err:
        fail(f"{err.describe()}; nothing was cancelled")
    if job["user"] != me["user"] and me["role"] != "admin":
        fail(f"job {job_id} is {job['user']!r}'s, not yours ({me['user']!r}); nothing was cancelled")
    from warden.engine.model import JobState

    if JobState(job["state"]).terminal:
        fail(f"job {job_id} already ended ({job['state']}); nothing was cancelled")
    return job


def _matches(job: dict[str, Any], user: str | None, queue: str | None, states: list[str]) -> bool:
    """Whether a named job is in the selection too (scancel's ids with filters)."""
    return (
        (user is None or job["user"] == user)
        and (queue is None or job["queue"] == queue)
        and (not states or job["state"] in states)
    )


def _cancel_one(c: Client, job_id: str) -> dict[str, Any] | None:
    """Cancel one job; None (said on stderr) when it ended since it was read."""
    from warden.client import ApiRefused

    try:
        return c.cancel(job_id)
    except ApiRefused as err:
        if err.status != 409:
            raise
        typer.echo(f"job {job_id}: not cancelled: {err.message}", err=True)
        return None


def _cancelled_count(count: int, ids: list[str], selected: bool) -> str:
    """The last line of `warden cancel`: how many jobs it cancelled."""
    if count == 0:
        what = "none of the jobs named matches the selection" if ids else "no unfinished job matches the selection"
        return f"{what}: nothing cancelled"
    return f"{count} job{'s' if count != 1 else ''} cancelled (a running one once its processes exit)"


def _details(details: dict[str, Any], now: float) -> str:
    """An audit entry's details as a person reads them: `key: value` pairs, a time (`…_at`) as
    a clock with how far it is from now, a duration (`…_s`) in its short form."""
    parts = []
    for key, value in details.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and key.endswith("_at"):
            text = _clock(value, now)
        elif isinstance(value, int | float) and not isinstance(value, bool) and key.endswith("_s"):
            key, text = key.removesuffix("_s"), span(value)
        elif isinstance(value, list | tuple):
            text = ", ".join(map(str, value))
        elif value is None:
            text = "none"
        else:
            text = str(value)
        parts.append(f"{key}: {text}")
    return "; ".join(parts)


def _quota(quota: dict[str, float] | None, unset: str) -> str:
    """A quota or limit in a cell: `gpu 4, cpu 64000`; `unset` where there is none."""
    if quota is None:
        return unset
    return ", ".join(f"{k} {tables.number(v)}" for k, v in quota.items()) or unset


def _node_state(n: dict[str, Any]) -> str:
    """`warden nodes`' STATE: up or down with why, and the GPUs held outside warden."""
    state = "up" if n.get("down") is None else f"down: {n['down']}"
    foreign = n.get("gpus_foreign") or 0
    which = n.get("gpu_indices_foreign") or []
    where = f" ({', '.join(map(str, which))})" if which and len(which) == foreign else ""
    return f"{state}; {foreign} GPU(s){where} held outside warden" if foreign else state


def _clock(t: float | None, now: float) -> str:
    """A time in a table: local, to the second, and how long ago ("14:05:07 (3 min ago)")."""
    if t is None:
        return ""
    from warden.server.explanations import wall_times  # the engine: only where a time is shown

    return wall_times(now, seconds=True)(t)


def _expected_cell(expected: dict[str, Any] | None, now: float) -> str:
    """A waiting job's expected start in a table cell: `in 14 min`, `now`, or `N/A` when none is
    known (as squeue shows an unknown start; `describe` says why)."""
    if not expected:
        return ""
    if expected.get("at") is None:
        return "N/A"
    return relative(expected["at"], now)


def _expected_line(expected: dict[str, Any], now: float) -> str:
    if expected.get("at") is None:
        return f"unknown: {expected.get('why') or 'nothing bounds it'}"
    from warden.server.explanations import wall_times  # the engine: only where a time is shown

    return f"{wall_times(now)(expected['at'])}, an estimate\n    (it assumes {expected['assumes']})"


def _print_verdict(v: dict[str, Any]) -> None:
    """A dry run's answer as sentences: the decision, then what it rests on."""
    con = tables.console()
    now = time.time()
    state = f" ({v['state']})" if v["state"] != "PENDING" else ""
    if v["decision"] == "start":
        where = "; ".join(f"{p['node']} GPUs {','.join(map(str, p['gpus'])) or '-'}" for p in v["placement"])
        con.print(f"[bold]would start now[/bold]{state} on {where}" + (" (borrowing)" if v["borrowing"] else ""))
    elif v["decision"] == "preempt":
        con.print(f"[bold]would preempt {len(v['victims'])} job(s)[/bold]{state} and start when they are gone")
    else:
        con.print(f"[bold]would wait[/bold]{state}" + (f", position {v['position']}" if v.get("position") else ""))
    reason = v.get("reason")
    if reason:
        con.print(f"  why: {reason['message']} ({reason['code']})")
    if v["victims"]:
        cells = [
            [
                x["id"],
                x["queue"],
                str(x["tier"]),
                str(x["gpus"]),
                relative(x["signal_at"], now),
                relative(x["gone_by"], now),
                f"{x['lost_work_gpu_hours']:.2f}",
            ]
            for x in v["victims"]
        ]
        tables.show(con, tables.listing(VICTIM_COLUMNS, cells))
    if v["decision"] != "start" and v.get("expected_start"):
        con.print(f"  expected start: {_expected_line(v['expected_start'], now)}")
