"""Every command of examples/README.md, as written there, does what the README says: each
`warden submit` line is accepted by a server with the default policy and its job runs and
prints its steps; the commands run alone, as one shell script (in a directory of its own that
holds the examples, so that their checkpoints stay out of the repository), save on SIGTERM, exit
0 and resume; each `warden sim` command runs on the shared traces. `warden` and
`python3` are this interpreter's. A command whose example needs what is not installed (the
README's table says what each needs), or whose trace is absent, is skipped saying so."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from serverproc import ADMIN, Server, kill_leftovers, until_state, wait_for

REPO = Path(__file__).resolve().parents[2]
README = REPO / "examples" / "README.md"
TRACE = re.compile(r"\.\./shared/traces/\S+")
WARDEN = [sys.executable, "-m", "warden.cli.main"]


def blocks() -> list[list[str]]:
    """The commands of each ```sh block: continued lines joined, comments and blank lines left out."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.M | re.S):
        text = re.sub(r"\\\n\s*", "", block)
        out.append([line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")])
    return out


def commands(kind: str) -> list[str]:
    """The README's `warden <kind>` commands (each block holds one kind, or none: run alone)."""
    return [c for block in blocks() for c in block if c.startswith(f"warden {kind} ")]


def alone() -> list[str]:
    """The commands of the blocks that run without a server, in order."""
    return [c for block in blocks() if not block[0].startswith("warden ") for c in block]


def needs(script: str) -> str:
    """What the README's table says `script` needs: "nothing", or a module to import."""
    rows = dict(re.findall(r"^\| `([\w.]+\.py)` \|.*\| ([^|]+?) \|$", README.read_text(), re.M))
    assert script in rows, f"examples/README.md's table does not list {script}"
    return rows[script]


def unmet(script: str) -> str | None:
    """Why the example cannot run here, or None."""
    need = needs(script)
    if need == "nothing" or importlib.util.find_spec(need) is not None:
        return None
    return f"examples/{script} needs {need}, which is not installed"


def test_every_command_of_the_readme_is_run_here() -> None:
    """A block is `warden submit` lines, `warden sim` lines, or commands run alone: a command of
    another kind would go untested."""
    runners = {"submit", "sim"}
    for block in blocks():
        kinds = {c.split()[1] if c.startswith("warden ") else "alone" for c in block}
        assert len(kinds) == 1, f"a block of examples/README.md mixes {sorted(kinds)}: {block}"
        assert kinds <= runners | {"alone"}, f"no test here runs `warden {kinds.pop()}` of examples/README.md"
    assert commands("submit") and commands("sim") and alone()


def script_of(argv: list[str]) -> str:
    return next(Path(a).name for a in argv if a.endswith(".py"))


def job_command(argv: list[str]) -> list[str]:
    """`warden ARGS`, with this interpreter for `warden` and for `python3` in the job's command."""
    assert argv[0] == "warden", argv
    return [*WARDEN, *(sys.executable if a == "python3" else a for a in argv[1:])]


@pytest.mark.parametrize("command", commands("submit"), ids=lambda c: script_of(shlex.split(c)))
def test_a_submit_command_runs_under_the_default_policy(command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    script = script_of(argv)
    server = Server(tmp_path / "state", gpus=8).start()  # no --policy: the default
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
        env.update(WARDEN_URL=server.url, WARDEN_STATE_DIR=str(server.state_dir), WARDEN_TOKEN=ADMIN)  # its CA
        done = subprocess.run(job_command(argv), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        job = done.stdout.split()[-1]
        why = unmet(script)
        if why:
            pytest.skip(f"submitted; not run: {why}")
        with server.client() as c:
            until_state(c, job, "RUNNING", timeout=60)

            def stepping() -> bool:
                log = c.get(f"/v1/jobs/{job}/logs", params={"attempt": 1}).json()["text"]
                return bool(re.search(r"^(rank 0 )?step \d+", log, re.M))

            wait_for(stepping, timeout=120, what=f"examples/{script} to print its steps")
    finally:
        server.stop()
        kill_leftovers(tmp_path)


@pytest.mark.slow
def test_the_commands_run_alone_save_on_sigterm_and_resume(tmp_path: Path) -> None:
    scripts = sorted({Path(w).name for c in alone() for w in shlex.split(c) if w.endswith(".py")})
    for script in scripts:
        if why := unmet(script):
            pytest.skip(why)
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "torchrun").exists() and any(c.startswith("torchrun") for c in alone()):
        pytest.skip(f"torchrun is not installed next to {sys.executable}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARDEN_", "MASTER_", "RANK", "WORLD_SIZE"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # python3 and torchrun: this interpreter's
    # A directory of its own with the repository's examples in it: the checkpoints the commands
    # write into ./ stay out of the repository.
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = "set -euo pipefail\n" + "\n".join(alone()) + "\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    saved = re.search(r"SIGTERM: saved step (\d+)", out)
    assert saved and "exit 0" in out, out
    assert f"resumed from step {saved[1]}" in out and "finished at step 2000" in out, out
    for rank in (0, 1):
        assert f"rank {rank} finished at step 300" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("command", commands("sim"))
def test_a_simulator_command_runs_on_the_shared_trace(command: str) -> None:
    for path in TRACE.findall(command):
        if not (REPO / path).is_file():
            pytest.skip(f"the trace {path} is absent (the shared traces next to the repository)")
    done = subprocess.run(
        [*WARDEN, *shlex.split(command)[1:]], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    assert "error" not in done.stderr, done.stderr
