"""`warden sim run|compare|sensitivity`: replay a trace through the engine under one or more
policies (DESIGN §8) and report the metrics of §7.

Bad input — a malformed trace row, an unknown policy, a cluster file that does not validate —
prints one message naming the field and the value and exits 2. A run the simulator's loop
guard stops (a policy that preempts and readmits without end) prints its message, naming the
jobs, and exits 3. Progress bars and warnings go to stderr, so `--json` output on stdout stays
one JSON document.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from warden.cli import tables
from warden.cli.app import App
from warden.engine.policy import PolicyError
from warden.sim.cluster import ClusterError
from warden.sim.experiment import Outcome, Setup, policy_for, prepare, run_policy, sensitivity
from warden.sim.loaders import FORMATS, TraceError
from warden.sim.metrics import DEFAULT_MAX_PREEMPTIONS_PER_JOB, TABLE_COLUMNS, TABLE_NAMES, format_table
from warden.sim.presets import PRESETS
from warden.sim.progress import SimProgress, describe_left, time_left
from warden.sim.report import write_report
from warden.sim.simulator import SimulationLoopError

app = App(no_args_is_help=True)

EXIT_INVALID = 2
EXIT_LOOP = 3

TraceOpt = Annotated[Path, typer.Option("--trace", help="Trace file (CSV or Parquet).", show_default=False)]
FormatOpt = Annotated[str, typer.Option("--format", help=f"auto, {', '.join(FORMATS)}.")]
GpusOpt = Annotated[int | None, typer.Option("--gpus", help="One pool of N GPUs (no topology).", show_default=False)]
ClusterOpt = Annotated[
    Path | None, typer.Option("--cluster", help="Cluster YAML (node groups, flavors, blocks).", show_default=False)
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the rules that fill what the trace lacks.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ReportOpt = Annotated[
    Path | None, typer.Option("--report", help="Write an HTML report (and its JSON) into DIR.", show_default=False)
]
SkipOpt = Annotated[
    bool,
    typer.Option("--skip-invalid", help="Skip malformed trace rows and count them, instead of stopping at the first."),
]
LimitOpt = Annotated[
    int | None, typer.Option("--limit", help="Only the first N jobs by submit time.", show_default=False)
]
MaxPreemptOpt = Annotated[
    int,
    typer.Option("--max-preemptions-per-job", min=1, help="Warn when any one job is preempted more often than this."),
]
QueueMapOpt = Annotated[
    Path | None,
    typer.Option(
        "--queue-map",
        help="YAML `trace_queue: leaf` lines (`\"*\": leaf` for the rest): run the trace's jobs in a policy file's own leaf queues.",
        show_default=False,
    ),
]
EnrichOpt = Annotated[
    bool,
    typer.Option(
        "--enrich/--no-enrich",
        help="Fill what the trace lacks (tiers, startup, checkpoints, gangs) by the documented seeded rules; --no-enrich replays the bare jobs, as textbook simulators do.",
    ),
]

_err = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(EXIT_INVALID)


@contextmanager
def _refusals() -> Iterator[None]:
    """Every input error ends as one message and exit code 2, never a traceback."""
    try:
        yield
    except (TraceError, ClusterError) as err:
        raise _fail(str(err)) from None
    except PolicyError as err:
        raise _fail("; ".join(str(i) for i in err.issues)) from None
    except ValueError as err:
        raise _fail(str(err)) from None


def _setup(
    trace: Path,
    format: str,
    gpus: int | None,
    cluster: Path | None,
    seed: int,
    skip_invalid: bool,
    limit: int | None,
    enrich: bool,
    queue_map: Path | None,
) -> Setup:
    if format != "auto" and format not in FORMATS:
        raise _fail(f"--format: {format!r} is not a trace format; allowed: auto, {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise _fail(f"--limit: {limit!r} must be at least 1")
    with _refusals():
        return prepare(
            trace,
            format=format,
            gpus=gpus,
            cluster=cluster,
            seed=seed,
            skip_invalid=skip_invalid,
            limit=limit,
            enrich=enrich,
            queue_map=queue_map,
        )


@contextmanager
def _progress(labels: list[str], quiet: bool) -> Iterator[Callable[[SimProgress], None] | None]:
    """One display on stderr for the runs of a command, made one after the other: the current
    run's bar and the time left for all of them (`progress.time_left`). None when quiet."""
    if quiet:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[jobs]}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[left]}"),
        console=_err,
        transient=True,
        refresh_per_second=4,  # each render (about 1 ms) holds the GIL the simulation runs on
    ) as bar:
        runs = _Runs(bar, labels)
        yield runs.update


class _Runs:
    """Which run of the command is going and since when; a run is over at its `ended` report."""

    def __init__(self, bar: Progress, labels: list[str]) -> None:
        self.bar = bar
        self.labels = labels
        self.done = 0
        self.started = self.run_started = time.monotonic()
        self.task = bar.add_task(self._label(), total=1.0, jobs="", left=describe_left(None))

    def _label(self) -> str:
        k = min(self.done, len(self.labels) - 1)
        return self.labels[k] if len(self.labels) == 1 else f"{self.labels[k]} ({k + 1}/{len(self.labels)})"

    def update(self, p: SimProgress) -> None:
        now = time.monotonic()
        fraction, jobs = p.fraction, f"{p.finished:,}/{p.jobs:,} jobs done"
        if p.ended:
            self.done += 1
            self.run_started = now
            if self.done < len(self.labels):  # the next run starts; the estimate leans on the runs done
                fraction, jobs = 0.0, ""
        left = time_left(now - self.started, now - self.run_started, fraction, self.done, len(self.labels))
        self.bar.update(
            self.task,
            description=self._label(),
            completed=fraction,
            jobs=jobs,
            left=describe_left(left),
            refresh=p.ended,
        )


def _stopped(name: str, err: SimulationLoopError) -> typer.Exit:
    """Say that a loop guard stopped policy `name`'s run; the exit to raise."""
    _err.print(
        f"[bold red]error:[/] {name}: the simulation stopped: {err}", highlight=False, markup=True, soft_wrap=True
    )
    return typer.Exit(EXIT_LOOP)


def _run_all(
    setup: Setup, policies: list[str], quiet: bool, max_preemptions: int = DEFAULT_MAX_PREEMPTIONS_PER_JOB
) -> list[Outcome]:
    with _refusals():  # every policy is checked before the first run
        resolved = [policy_for(setup, name) for name in policies]
    outcomes = []
    with _progress(policies, quiet) as update:
        for name, sp in zip(policies, resolved, strict=True):
            with _refusals():
                try:
                    outcomes.append(run_policy(setup, sp, update, max_preemptions))
                except SimulationLoopError as err:
                    raise _stopped(name, err) from None
    return outcomes


def _emit(outcomes: list[Outcome], as_json: bool, report: Path | None, many: bool) -> None:
    summaries = [o.summary for o in outcomes]
    for s in summaries:
        for warning in s.get("policy_warnings") or ():
            _err.print(
                f"[bold yellow]warning:[/] {s['policy']}: {warning}", highlight=False, markup=True, soft_wrap=True
            )
        if s.get("preemption_warning"):
            _err.print(
                f"[bold yellow]warning:[/] {s['policy']}: {s['preemption_warning']}",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
    if report is not None:
        path = write_report(report, [o.run for o in outcomes], summaries)
        _err.print(f"report written to {path}")
    if as_json:
        typer.echo(json.dumps(summaries if many else summaries[0], indent=2, allow_nan=False))
        return
    console = tables.console()
    names = {header: TABLE_NAMES[key] for header, key, _ in TABLE_COLUMNS if key in TABLE_NAMES}
    tables.show(console, *tables.records(format_table(summaries), names, label="metric"))
    skipped = outcomes[0].summary.get("skipped") or {}
    if skipped:
        console.print("skipped trace jobs: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))


@app.command("run")
def run_cmd(
    trace: TraceOpt,
    policy: Annotated[
        str, typer.Option("--policy", help=f"A preset ({', '.join(PRESETS)}) or a policy YAML.")
    ] = "governed",
    format: FormatOpt = "auto",
    gpus: GpusOpt = None,
    cluster: ClusterOpt = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    report: ReportOpt = None,
    skip_invalid: SkipOpt = False,
    limit: LimitOpt = None,
    enrich: EnrichOpt = True,
    max_preemptions: MaxPreemptOpt = DEFAULT_MAX_PREEMPTIONS_PER_JOB,
    queue_map: QueueMapOpt = None,
) -> None:
    """Simulate one policy on a trace and print its metrics."""
    setup = _setup(trace, format, gpus, cluster, seed, skip_invalid, limit, enrich, queue_map)
    _emit(_run_all(setup, [policy], json_out, max_preemptions), json_out, report, many=False)


@app.command("compare")
def compare_cmd(
    trace: TraceOpt,
    policies: Annotated[
        str, typer.Option("--policies", help=f"Comma-separated presets ({', '.join(PRESETS)}) or policy files.")
    ] = "governed,fifo_backfill,slurm,kueue",
    format: FormatOpt = "auto",
    gpus: GpusOpt = None,
    cluster: ClusterOpt = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    report: ReportOpt = None,
    skip_invalid: SkipOpt = False,
    limit: LimitOpt = None,
    enrich: EnrichOpt = True,
    max_preemptions: MaxPreemptOpt = DEFAULT_MAX_PREEMPTIONS_PER_JOB,
    queue_map: QueueMapOpt = None,
) -> None:
    """Simulate several policies on the same trace and seed: one row a policy."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise _fail(f"--policies: {policies!r} names no policy")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _fail(f"--policies: {', '.join(dupes)} named twice")
    setup = _setup(trace, format, gpus, cluster, seed, skip_invalid, limit, enrich, queue_map)
    _emit(_run_all(setup, names, json_out, max_preemptions), json_out, report, many=True)


@app.command("sensitivity")
def sensitivity_cmd(
    trace: TraceOpt,
    param: Annotated[
        str,
        typer.Option(
            "--param",
            help="Dotted path of a numeric policy setting, e.g. fair_share.half_life or tiers.3.lease.",
            show_default=False,
        ),
    ],
    delta: Annotated[
        str,
        typer.Option(
            "--delta", help="How far to move it: an amount (seconds or 5m) or a percentage (10%).", show_default=False
        ),
    ],
    policy: Annotated[str, typer.Option("--policy", help="A preset or a policy YAML.")] = "governed",
    format: FormatOpt = "auto",
    gpus: GpusOpt = None,
    cluster: ClusterOpt = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    skip_invalid: SkipOpt = False,
    limit: LimitOpt = None,
    enrich: EnrichOpt = True,
    queue_map: QueueMapOpt = None,
) -> None:
    """How much the admission order (Kendall tau distance) and the metrics change when one
    policy parameter moves a little."""
    setup = _setup(trace, format, gpus, cluster, seed, skip_invalid, limit, enrich, queue_map)
    labels = [f"{policy} as written", f"{policy} with {param} {delta}"]
    with _refusals(), _progress(labels, json_out) as update:
        try:
            result = sensitivity(setup, policy, param, delta, update)
        except SimulationLoopError as err:
            raise _stopped(policy, err) from None
    if json_out:
        typer.echo(json.dumps(result, indent=2, allow_nan=False))
        return
    _print_sensitivity(result)


def _print_sensitivity(result: dict[str, Any]) -> None:
    """The sensitivity as the `sim run` table writes its figures: durations in the short form
    (`durations.span`), fractions as percentages, never in scientific notation."""
    from rich.table import Table

    from warden.engine.durations import format_duration

    formats = {key: fmt for _, key, fmt in TABLE_COLUMNS}

    def setting(value: Any) -> str:
        return format_duration(value) if result.get("duration") else tables.number(value)

    console = tables.console()
    console.print(
        f"{result['policy']}: {result['param']} {setting(result['value'])} → {setting(result['moved_value'])} "
        f"({result['jobs']} jobs)"
    )
    console.print(
        f"admission order moved: Kendall tau distance {result['kendall_tau_distance']:.4f} "
        "(0 = same order, 1 = reversed)"
    )
    table = Table("metric", tables.fixed("as written", justify="right"), tables.fixed("moved", justify="right"))
    for key, value in result["base"].items():
        fmt = formats.get(key, tables.number)
        table.add_row(TABLE_NAMES.get(key, key), fmt(value), fmt(result["moved"][key]))
    tables.show(console, table)
