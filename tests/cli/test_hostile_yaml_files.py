"""Hostile YAML given to the CLI: every file it reads as YAML (a policy, the server's
`--config`, the simulator's `--cluster` and `--queue-map`) refuses nesting thousands deep,
aliases, duplicate keys and values Python cannot hold with one line naming the file and the
problem, and exit 2: never a traceback, never a start. Real `warden` processes, as a user runs
them (a RecursionError, caught or not, shows only there as it would)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from warden.engine.safeyaml import MAX_DEPTH

DEEP = 10_000
TRACE = "job_id,submit,num_gpus,duration,queue,tier\nj0,0,1,600,team,3\n"
# Each: the file's text, and what the one line must say of it.
HOSTILE: dict[str, tuple[str, str]] = {
    "deep-list": ("[" * DEEP + "]" * DEEP + "\n", f"nested more than {MAX_DEPTH} deep are not accepted (line 1"),
    "deep-mapping": ("{a: " * DEEP + "1" + "}" * DEEP + "\n", f"nested more than {MAX_DEPTH} deep are not accepted"),
    "deep-block": ("".join("  " * i + "a:\n" for i in range(300)), f"nested more than {MAX_DEPTH} deep"),
    "alias-bomb": (
        'a: &a ["x", "x", "x", "x"]\nb: &b [*a, *a, *a, *a]\nc: [*b, *b, *b, *b]\n',
        "YAML aliases (*a) are not accepted (line 2, column 8)",
    ),
    "huge-int": ("port: 0x" + "f" * 5000 + "\n", "is not a value Python can hold: an integer of more than"),
    "bad-date": ("a: 2024-13-45\n", "'2024-13-45' is not a value Python can hold: month must be in 1..12"),
    "not-utf8": ("\udcff\udcfe: 1\n", "utf-8"),
}


def warden(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`warden ARGS` as its own process, none of this process's WARDEN_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return path


def readers(tmp_path: Path, hostile: Path) -> dict[str, list[str]]:
    """Each command that reads `hostile` as YAML, with good files for the rest."""
    trace = write(tmp_path / "trace.csv", TRACE)
    policy = write(tmp_path / "policy.yaml", "queues:\n  name: cluster\n  children:\n    - {name: team}\n")
    sim = ["sim", "run", "--trace", str(trace)]
    state = str(tmp_path / "state")
    return {
        "policy check": ["policy", "check", str(hostile)],
        "server --policy": [
            "server",
            "--policy",
            str(hostile),
            "--fake-gpus",
            "1",
            "--state-dir",
            state,
            "--port",
            "0",
        ],
        "server --config": ["server", "--config", str(hostile), "--state-dir", state],
        "sim --cluster": [*sim, "--cluster", str(hostile), "--policy", str(policy)],
        "sim --queue-map": [*sim, "--gpus", "4", "--policy", str(policy), "--queue-map", str(hostile)],
    }


READERS = ["policy check", "server --policy", "server --config", "sim --cluster", "sim --queue-map"]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("reader", READERS)
def test_a_hostile_yaml_file_is_one_line_naming_it_and_exit_2(tmp_path: Path, reader: str, kind: str) -> None:
    text, words = HOSTILE[kind]
    if reader == "sim --queue-map" and kind in ("huge-int", "bad-date"):
        pytest.skip("a queue map reads every scalar as text: these are names to it")
    hostile = write(tmp_path / f"{kind}.yaml", text)
    done = warden(*readers(tmp_path, hostile)[reader], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    flat = " ".join(done.stderr.split())
    assert len(lines) == 1 or reader.startswith("sim"), lines  # rich may wrap sim's one message
    assert str(hostile) in flat and words.lower() in flat.lower(), flat
    assert done.stdout == ""
    assert not (tmp_path / "state" / "warden.db").exists(), "the server started on a refused file"


def test_a_config_giving_an_option_twice_is_refused_naming_the_key_and_the_file(tmp_path: Path) -> None:
    config = write(tmp_path / "server.yaml", "fake_gpus: 1\nport: 1\nport: 2\n")
    done = warden("server", "--config", str(config), "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: --config {str(config)!r}: duplicate key 'port': given twice (line 3, column 1)\n"
    assert not (tmp_path / "state").exists()


def test_a_policy_giving_a_setting_twice_is_still_refused_with_its_other_problems(tmp_path: Path) -> None:
    policy = write(tmp_path / "policy.yaml", "max_lease: 2h\nmax_lease: 3h\nmin_grace: nope\n")
    done = warden("policy", "check", str(policy), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"{policy}: <file>: duplicate key 'max_lease' at line 2, column 1: given twice", lines
    assert any("min_grace" in line for line in lines[1:]), lines


def test_nesting_at_the_limit_is_read(tmp_path: Path) -> None:
    """The limit refuses only what is deeper: a queue map of `MAX_DEPTH` nested collections is
    read, and refused for what it means (a name must be text), not for its depth."""
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    qmap = write(tmp_path / "map.yaml", f"team: {deep}\n")
    args = readers(tmp_path, qmap)["sim --queue-map"]
    done = warden(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert "the entry for 'team' must be one leaf queue's name" in " ".join(done.stderr.split()), done.stderr
