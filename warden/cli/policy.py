"""`warden policy check|show|schema`: validate a policy file before it governs anything.

A refused file prints every issue on its own line, prefixed with the file name (the way
compilers and linters report), and exits 2; nothing here ever shows a traceback for bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from warden.cli import tables
from warden.cli.app import App
from warden.engine.model import Node
from warden.engine.overcommit import quota_warnings
from warden.engine.policy import (
    Policy,
    PolicyError,
    QueueSpec,
    format_duration,
    load_policy,
    policy_json_schema,
)

app = App(no_args_is_help=True)

EXIT_INVALID = 2

PolicyFile = Annotated[Path, typer.Argument(help="The policy YAML file.", show_default=False)]


def _load(file: Path) -> Policy:
    """The policy in `file`, or exit 2 after listing every problem on stderr."""
    try:
        return load_policy(file)
    except PolicyError as err:
        for issue in err.issues:
            typer.echo(f"{file}: {issue}", err=True)
        raise typer.Exit(EXIT_INVALID) from None


def _quota(quota: dict[str, int] | None, unset: str) -> str:
    if quota is None:
        return unset
    return ", ".join(f"{resource} {amount}" for resource, amount in quota.items()) or "-"


def _queue_label(queue: QueueSpec) -> Text:
    label = Text(queue.name, style="bold")
    label.append(
        f"  weight {queue.weight:g} · nominal {_quota(queue.nominal, '-')}"
        f" · borrowing {_quota(queue.borrowing_limit, 'unlimited')}"
        f" · lending {_quota(queue.lending_limit, 'all')}"
    )
    return label


def _queue_tree(queue: QueueSpec, tree: Tree | None = None) -> Tree:
    node = Tree(_queue_label(queue)) if tree is None else tree.add(_queue_label(queue))
    for child in queue.children:
        _queue_tree(child, node)
    return node


def _summary(file: Path, policy: Policy) -> Group:
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    # Borderless so that all eight columns fit an 80-column terminal without truncation.
    tiers = Table(title="tiers", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=0)
    for column in ("tier", "name", "preemptible", "lease", "grace", "approval", "scope", "charged"):
        tiers.add_column(column, no_wrap=True)
    for number, tier in policy.tiers.items():
        tiers.add_row(
            str(number),
            tier.name,
            yes(tier.preemptible),
            format_duration(tier.lease),
            format_duration(tier.grace),
            yes(tier.requires_approval),
            tier.scope,
            yes(tier.charged),
        )

    thrash = policy.thrash
    settings = Table.grid(padding=(0, 2))
    settings.add_column(style="bold")
    settings.add_column()
    for key, value in (
        ("min_grace", format_duration(policy.min_grace)),
        ("max_lease", format_duration(policy.max_lease)),
        ("half_life", format_duration(policy.fair_share.half_life)),
        ("max_wait", format_duration(policy.fair_share.aging.max_wait["default"])),
        ("min_efficiency", f"{thrash.min_efficiency:g}"),
        ("max_preemptions", f"{thrash.max_preemptions.count} per {format_duration(thrash.max_preemptions.per)}"),
    ):
        settings.add_row(key, value)

    return Group(
        Text(f"{file}: valid policy", style="green"),
        tiers,
        Text("queues", style="italic"),
        _queue_tree(policy.queues),
        settings,
    )


@app.command()
def check(
    file: PolicyFile,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", help="Check it against a pool of N GPUs.", show_default=False),
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option("--cluster", help="Check it against this cluster file (nodes).", show_default=False),
    ] = None,
) -> None:
    """Validate FILE; print a summary (exit 0) or every problem found (exit 2). With a cluster
    (`--gpus N` or `--cluster FILE`), also warn where its nominal quotas exceed the cluster or
    cover less of it."""
    policy = _load(file)
    nodes = _cluster(gpus, cluster)
    tables.show(tables.console(highlight=False), _summary(file, policy))
    if nodes is not None:
        warnings = quota_warnings(policy, nodes)
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        for w in warnings:
            err.print(f"[bold yellow]warning:[/] {file}: {w.message}")
        if not warnings:
            Console(highlight=False).print(Text("nominal quotas fit the cluster", style="green"))


def _cluster(gpus: int | None, cluster: Path | None) -> tuple[Node, ...] | None:
    """The cluster to check against, or None; exit 2 naming the option on bad input."""
    from warden.sim.cluster import ClusterError, load_cluster, pool

    if gpus is not None and cluster is not None:
        typer.echo("--gpus and --cluster: give one of them, not both", err=True)
        raise typer.Exit(EXIT_INVALID)
    try:
        if gpus is not None:
            return pool(gpus)
        if cluster is not None:
            return load_cluster(cluster)
    except ClusterError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(EXIT_INVALID) from None
    return None


@app.command()
def show(
    file: PolicyFile,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of YAML.")] = False,
) -> None:
    """Print FILE fully resolved: every default filled in, inner quotas summed."""
    resolved = _load(file).to_dict()
    if as_json:
        typer.echo(json.dumps(resolved, indent=2))
    else:
        typer.echo(yaml.safe_dump(resolved, sort_keys=False), nl=False)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the policy file format."""
    typer.echo(json.dumps(policy_json_schema(), indent=2))


@app.command()
def apply(
    file: PolicyFile,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Server URL(s), comma-separated (default $WARDEN_URL).", show_default=False),
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="Admin token (default $WARDEN_TOKEN).", show_default=False)
    ] = None,
    ca: Annotated[
        str | None,
        typer.Option("--ca", help="PEM file of the server's CA (default $WARDEN_CA).", show_default=False),
    ] = None,
) -> None:
    """Validate FILE here, then make it the server's policy (admins only; versioned; jobs keep
    their tier and lease)."""
    from warden.cli.jobs import client

    _load(file)
    with client(url, token, ca) as c:
        out = c.apply_policy(file.read_text())
    if out.get("changed", True):
        typer.echo(f"policy version {out['version']} applied")
    else:
        typer.echo(f"policy version {out['version']} unchanged: the server already has this policy")
    for w in out.get("warnings") or ():
        typer.echo(f"warning: {file}: {w['message']}", err=True)


@app.command()
def diff(
    file: PolicyFile,
    replay: Annotated[
        str | None,
        typer.Option(
            "--replay",
            help="Also replay the jobs of this window (e.g. 30d) in the simulator under both policies.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of tables.")] = False,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Server URL(s), comma-separated (default $WARDEN_URL).", show_default=False),
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="Token (default $WARDEN_TOKEN).", show_default=False)
    ] = None,
    ca: Annotated[
        str | None,
        typer.Option("--ca", help="PEM file of the server's CA (default $WARDEN_CA).", show_default=False),
    ] = None,
) -> None:
    """What FILE would change for the jobs on the server now, were it applied: running jobs
    preemptible earlier or later, waiting jobs that move or wait for another reason, settings
    that differ. With --replay, the exported history simulated under the policy in force and
    under FILE, side by side. Changes nothing."""
    from warden.cli.history import window
    from warden.cli.jobs import client
    from warden.cli.policydiff import print_diff, replay_history

    _load(file)
    seconds = window("--replay", replay) if replay is not None else None
    source = file.read_text()
    with client(url, token, ca) as c:
        out = c.diff_policy(source)
        if seconds is not None:
            out["replay"] = replay_history(c, source, seconds)
    if as_json:
        typer.echo(json.dumps(out, indent=2, allow_nan=False))
        return
    print_diff(file, out)
