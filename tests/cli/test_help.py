"""`--help` reads at 80 columns: plain text wrapped to the terminal, each value named by what it
is (`--lease LEASE`, `COMMAND...`), never by its type (`TEXT`, `<int>`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from warden.cli.main import GROUPS, app

TYPE_TAG = re.compile(r"\b(TEXT|INTEGER|FLOAT|BOOLEAN|PATH)\b|<(str|int|float|bool|path|list\[[^]]*\])>")


def help_of(*args: str) -> str:
    """`warden ARGS --help` as a person runs it: its own process, an 80-column terminal."""
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args, "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("args", [(), ("submit",), ("server",)], ids=["warden", "submit", "server"])
def test_help_fits_80_columns_without_type_tags(args: tuple[str, ...]) -> None:
    text = help_of(*args)
    assert text.startswith("Usage: warden"), text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert not TYPE_TAG.search(text), TYPE_TAG.search(text)


def test_values_are_named_by_what_they_are() -> None:
    text = help_of("submit")
    assert "Usage: warden submit [OPTIONS] -- COMMAND..." in text
    assert "--lease LEASE" in text and "-q, --queue QUEUE" in text and "--json  " in text


def test_the_listing_names_every_sub_app_without_loading_it() -> None:
    """`warden --help` lists the sub-apps by their help alone: none of their modules is loaded
    (the simulator, the demo: numpy, matplotlib and the engine stay unloaded)."""
    probe = (
        "import sys\n"
        "from warden.cli.main import build\n"
        "try:\n"
        "    build(['--help'])(['--help'], prog_name='warden')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('warden.sim', 'warden.demo', 'warden.engine.scheduler', 'numpy', 'matplotlib', 'httpx', 'rich', 'yaml')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listing, loaded = done.stdout.rsplit("\n", 2)[0], done.stdout.splitlines()[-1]
    assert loaded == "[]", loaded
    for name, text in GROUPS.items():
        assert re.search(rf"^  {name} +{re.escape(text[:20])}", listing, re.M), listing


def every_command(group: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    import typer.main

    command = typer.main.get_command(group) if path == () else group  # type: ignore[arg-type]
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        found += every_command(sub, (*path, name))
    return found


@pytest.mark.parametrize("path", every_command(app), ids=lambda p: " ".join(p) or "warden")
def test_every_help_fits_80_columns_without_type_tags(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="warden")
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output
    assert not TYPE_TAG.search(result.output), result.output


VERBS = [
    p[0] for p in every_command(app) if len(p) == 1 and not any(q[:1] == p and len(q) > 1 for q in every_command(app))
]
"""The top-level commands that are no group (`queue`, not `token` or `sim`)."""


@pytest.mark.parametrize("verb", VERBS, ids=str)
def test_a_verb_named_on_the_command_line_is_built_alone_and_reads_as_in_the_whole_app(
    verb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`warden queue …` builds only `queue` of the verbs (start-up), and it is the same command:
    its help is the whole app's, word for word."""
    import typer.main

    from warden.cli.main import build

    monkeypatch.setenv("COLUMNS", "80")
    alone = build([verb, "--help"])
    built = typer.main.get_command(alone)
    commands = built.commands  # type: ignore[attr-defined]
    others = [n for n, c in commands.items() if n != verb and n not in GROUPS and not hasattr(c, "commands")]
    assert verb in commands and others == [], others
    whole = CliRunner().invoke(app, [verb, "--help"], prog_name="warden")
    assert CliRunner().invoke(alone, [verb, "--help"], prog_name="warden").output == whole.output


def test_warden_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    out = subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"warden {version('gpu-warden')}\n"
