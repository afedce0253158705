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
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from warden.cli import tables
from warden.cli.tables import Col
from warden.client import ApiRefused, BadServerUrl, Client, Unreachable

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


def _duration(value: str | None) -> str | None:
    """A duration option (--lease, --grace, --time-limit) checked as the server checks it: a
    bad one is refused (exit 2) before anything is sent; the server gets it as written."""
    if value is None:
        return None
    from warden.engine.policy import PolicyError, parse_duration  # pydantic: only where one is given

    try:
        parse_duration(value)
    except PolicyError as err:
        raise typer.BadParameter(f"{value!r}: {err.issues[0].message}") from None
    return value


def _lifetime(value: str | None) -> str | None:
    """--expires: a duration (30d, 12h), from 1 second to 10 years; refused (exit 2)
    before anything is sent."""
    if value is None:
        return None
    from warden.engine.policy import PolicyError, parse_duration
    from warden.server.auth import TOKEN_LIFETIME_MAX_S

    try:
        seconds = parse_duration(value)
    except PolicyError as err:
        raise typer.BadParameter(f"{value!r}: {err.issues[0].message}") from None
    if not 1 <= seconds <= TOKEN_LIFETIME_MAX_S:
        raise typer.BadParameter(f"{value!r} is not between 1s and 3650d (10 years)")
    return value


UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Server URL, or several separated by commas, tried in turn (default $WARDEN_URL or "
        "http://127.0.0.1:8765).",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", help="Bearer token (default $WARDEN_TOKEN).", show_default=False)
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
    Col("REASON", gives=2),
)
"""`warden queue`'s columns: the default ones fit 80 columns with a 20-letter reason code; a
long name gives way (wraps) before the reason does."""
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
    Col("IN USE", "right"),
    Col("PENDING", "right"),
    Col("FAIR-SHARE USE", "right", wide=True),
    Col("OWED GPU-h", "right"),
    Col("DELIVERED GPU-h", "right"),
)
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

_err = Console(stderr=True)


@contextmanager
def client(url: str | None, token: str | None) -> Iterator[Client]:
    try:
        c = Client(url, token)
    except BadServerUrl as err:
        _err.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_REFUSED) from None
    try:
        yield c
    except ApiRefused as err:
        _err.print(f"[bold red]error:[/] {err.describe()}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_REFUSED) from None
    except Unreachable as err:
        _err.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    finally:
        c.close()


def _dump(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def _age(seconds: float | None) -> str:
    from warden.engine.policy import format_duration  # pydantic and yaml: only where a duration is shown

    return "" if seconds is None else format_duration(round(seconds))


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            _err.print(f"[bold red]error:[/] --env: {p!r} is not KEY=VALUE", highlight=False)
            raise typer.Exit(EXIT_REFUSED)
        env[key] = value
    return env


def register(app: typer.Typer) -> None:
    """Attach the verbs to the top-level `warden` app."""

    @app.command("submit", context_settings={"allow_interspersed_args": False})
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
            typer.Option("--time-limit", help="Runtime estimate, e.g. 2h.", show_default=False, callback=_duration),
        ] = None,
        name: Annotated[str, typer.Option("--name", help="A name to show.")] = "",
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
        json_out: JsonOpt = False,
    ) -> None:
        """Submit a job; prints its id as the last word. With --dry-run: would it start now (where),
        preempt (whom), or wait (why, and until when)?"""
        import os

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
            with client(url, token) as c:
                verdict = c.dry_run(**body)
            _dump(verdict) if json_out else _print_verdict(verdict)
            return
        with client(url, token) as c:
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
        json_out: JsonOpt = False,
    ) -> None:
        """List jobs like squeue: id, name, queue, tier, state, GPUs, expected start, reason;
        --wide adds user, wait and position."""
        with client(url, token) as c:
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
        json_out: JsonOpt = False,
    ) -> None:
        """Why a job waits (one sentence), its sort key, attempts, preemptions and events; a
        warning when it is in a preemption cycle."""
        with client(url, token) as c:
            j = c.job(job_id)
        if json_out:
            _dump(j)
            return
        _print_job(j)

    @app.command("cancel")
    def cancel(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Cancel a job: a running one gets SIGTERM, its grace, then SIGKILL."""
        with client(url, token) as c:
            out = c.cancel(job_id)
        _dump(out) if json_out else typer.echo(f"job {out['id']}: {out['state']} (cancel requested)")

    @app.command("approve")
    def approve(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Approve a tier-1/2 job that awaits an admin (admins only)."""
        with client(url, token) as c:
            out = c.approve(job_id)
        _dump(out) if json_out else typer.echo(f"job {out['id']}: {out['state']}")

    @app.command("release")
    def release(
        job_id: Annotated[str, typer.Argument(help="Job id.")],
        url: UrlOpt = None,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Let a held job be scheduled again, like Slurm's `scontrol release` (admins only)."""
        with client(url, token) as c:
            out = c.release(job_id)
        _dump(out) if json_out else typer.echo(f"job {out['id']}: {out['state']} (released)")

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
    ) -> None:
        """Print a job's output (stdout and stderr of one replica of one attempt)."""
        offset = 0
        with client(url, token) as c:
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
    def nodes(wide: WideOpt = False, url: UrlOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
        """The nodes, their GPUs and what runs on them."""
        with client(url, token) as c:
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
    def queues(wide: WideOpt = False, url: UrlOpt = None, token: TokenOpt = None, json_out: JsonOpt = False) -> None:
        """Queues: quota, usage, fair share, owed vs delivered GPU-hours."""
        with client(url, token) as c:
            rows = c.queues()
        if json_out:
            _dump(rows)
            return
        cells = [
            [
                q["name"],
                q["parent"] or "",
                f"{q['weight']:g}",
                ", ".join(f"{k} {v:g}" for k, v in q["nominal"].items()),
                str(q["gpus_in_use"]),
                str(q["pending_jobs"]),
                f"{q['fair_share_usage']:.3g}",
                f"{q['owed_gpu_hours']:.2f}",
                f"{q['delivered_gpu_hours']:.2f}",
            ]
            for q in rows
        ]
        tables.show(tables.console(), tables.listing(QUEUES_COLUMNS, cells, wide))

    token_app = typer.Typer(help="Bearer tokens (admins only).", no_args_is_help=True)
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
        json_out: JsonOpt = False,
    ) -> None:
        """Create a token; prints it (it is shown only once)."""
        from warden.engine.policy import parse_duration

        lifetime = None if expires is None else parse_duration(expires)
        with client(url, token) as c:
            out = c.create_token(user, role, [q.strip() for q in queues.split(",") if q.strip()], lifetime)
        _dump(out) if json_out else typer.echo(out["token"])

    @token_app.command("list")
    def token_list(
        wide: WideOpt = False, url: UrlOpt = None, token: TokenOpt = None, json_out: JsonOpt = False
    ) -> None:
        """Every token: id, user, role, queues, when created, expires and was revoked; never a secret."""
        with client(url, token) as c:
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
        json_out: JsonOpt = False,
    ) -> None:
        """Revoke a token: the server refuses it from the next request on."""
        with client(url, token) as c:
            out = c.revoke_token(token_id)
        _dump(out) if json_out else typer.echo(f"token {out['id']} of {out['user']} revoked")

    @app.command("audit")
    def audit(
        limit: Annotated[int, typer.Option("--limit", parser=_within(1, AUDIT_MAX))] = 100,
        url: UrlOpt = None,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """The append-only log of privileged actions (admins only)."""
        with client(url, token) as c:
            rows = c.audit(limit)
        if json_out:
            _dump(rows)
            return
        now = time.time()
        cells = [[_clock(a["at"], now), a["actor"], a["action"], a["target"], json.dumps(a["details"])] for a in rows]
        tables.show(tables.console(), tables.listing(AUDIT_COLUMNS, cells))


def queue_table(rows: list[dict[str, Any]], now: float, wide: bool = False) -> Table:
    """`warden queue`'s table of `GET /v1/jobs` rows."""
    cells = [
        [
            r["id"],
            r["name"],
            r["user"],
            r["queue"],
            str(r["tier"]),
            r["state"],
            str(r["gpus"]),
            _age(r["wait_s"]),
            str(r["position"] or ""),
            _expected_cell(r.get("expected_start"), now),
            (r.get("reason") or {}).get("code", ""),
        ]
        for r in rows
    ]
    return tables.listing(QUEUE_COLUMNS, cells, wide)


def _print_job(j: dict[str, Any]) -> None:
    """`warden describe`: the job in sentences, then its attempts, preemptions and events."""
    con = tables.console()
    now = time.time()
    command = " ".join(j["command"]) if "command" in j else "hidden (another user's job)"
    con.print(
        f"[bold]job {j['id']}[/bold] {j['name']}  user {j['user']}  queue {j['queue']}  tier {j['tier']}  "
        f"[bold]{j['state']}[/bold]"
    )
    saves = "; saves on SIGTERM (declared)" if j.get("saves_on_sigterm") else ""
    con.print(
        f"  {j['gpus']} GPU(s) as {j['replicas']} × {j['gpus_per_replica']}, placement {j['placement']}; "
        f"lease {_age(j['lease_s'])}, grace {_age(j['grace_s'])}{saves}; command: {command}"
    )
    reason = j.get("reason")
    if reason:
        where = f", position {j['position']}" if j.get("position") is not None else ""
        con.print(f"  [bold]why pending:[/bold] {reason['message']} ({reason['code']}{where})")
    expected = j.get("expected_start")
    if expected:
        con.print(f"  [bold]expected start:[/bold] {_expected_line(expected, now)}")
    if j.get("sort_key"):
        con.print(f"  sort key: {json.dumps(j['sort_key'])}")
    for w in j.get("warnings") or []:
        con.print(f"  [yellow]warning:[/yellow] {w}")
    cycle = j.get("preemption_cycle")
    if cycle:
        con.print(f"  [bold yellow]warning: preemption cycle ({cycle['kind']}):[/bold yellow] {cycle['message']}")
    if j["attempts"]:
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
            for a in j["attempts"]
        ]
        tables.titled(con, "attempts", tables.listing(ATTEMPT_COLUMNS, cells))
    if j.get("preemptions"):
        cells = []
        for p in j["preemptions"]:
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
        for p in j["preemptions"]:
            if p.get("lost_work_why"):
                con.print(f"  lost work of #{p['attempt']}: {p['lost_work_why']}", markup=False, highlight=False)
    cells = [[_clock(e["at"], now), e["from"] or "", e["to"], e["actor"], e["reason"]] for e in j["events"]]
    tables.titled(con, "events", tables.listing(EVENT_COLUMNS, cells))


def _node_state(n: dict[str, Any]) -> str:
    """`warden nodes`' STATE: up or down with why, and the GPUs held outside warden."""
    state = "up" if n.get("down") is None else f"down: {n['down']}"
    foreign = n.get("gpus_foreign") or 0
    return f"{state}; {foreign} GPU(s) held outside warden" if foreign else state


def _clock(t: float | None, now: float) -> str:
    """A time in a table: local, to the second, and how long ago ("14:05:07 (3 min ago)")."""
    if t is None:
        return ""
    from warden.server.explanations import wall_times  # the engine: only where a time is shown

    return wall_times(now, seconds=True)(t)


def _expected_cell(expected: dict[str, Any] | None, now: float) -> str:
    """A waiting job's expected start in a table cell: `in 14 min`, `now`, or `?` when none is known."""
    if not expected:
        return ""
    if expected.get("at") is None:
        return "?"
    from warden.engine.reasons import relative  # the engine: only where a time is shown

    return relative(expected["at"], now)


def _expected_line(expected: dict[str, Any], now: float) -> str:
    if expected.get("at") is None:
        return f"unknown: {expected.get('why') or 'nothing bounds it'}"
    from warden.server.explanations import wall_times  # the engine: only where a time is shown

    return f"{wall_times(now)(expected['at'])}, an estimate\n    (it assumes {expected['assumes']})"


def _print_verdict(v: dict[str, Any]) -> None:
    """A dry run's answer as sentences: the decision, then what it rests on."""
    from warden.engine.reasons import relative

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
