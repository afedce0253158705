"""deploy/warden.service and docs/service.md against the code: the options on the unit's
`ExecStart=` line are options of `warden server` (with their values), every variable the unit
and the documented environment file set is one the server reads, the state directory is the
one the docs name, the documented config files and policy are accepted by the server, and
`systemd-analyze verify` finds nothing wrong where systemd is installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer.main
import yaml

from warden import paths
from warden.cli.server import CONFIG_KEYS, _load_config
from warden.engine.policy import parse_policy

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "deploy" / "warden.service"
SOCKET = ROOT / "deploy" / "warden.socket"
DOC = ROOT / "docs" / "service.md"
CONFIG = "/etc/warden/server.yaml"
ENV_FILE = "/etc/warden/warden.env"
POLICY = "/etc/warden/policy.yaml"
PATH_OPTIONS = ("--policy", "--bootstrap-token-file", "--config", "--state-dir")
# The code the server process runs whose environment reads count: its command, the control
# plane and the store (the executors' launch helpers run on the nodes, the SDK in jobs).
SERVER_CODE = ("warden/cli/server.py", "warden/server", "warden/store")
ENV_READ = re.compile(
    r"""os\.environ(?:\.get|\.pop)?\(\s*["']([A-Z][A-Z0-9_]*)["']|os\.environ\[["']([A-Z][A-Z0-9_]*)["']\]"""
)


# -- reading the unit and the docs ------------------------------------------------------------


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file, each key with every value it is given (systemd allows a key
    more than once); comments dropped, backslash continuations joined."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{line!r} is outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{line!r} is no KEY=VALUE line"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key, [])
    assert len(values) == 1, f"{key}= is given {len(values)} times in {UNIT.name}, expected once"
    return values[0]


def exec_start(sections: dict[str, dict[str, list[str]]]) -> list[str]:
    argv = shlex.split(one(sections["Service"], "ExecStart"))
    argv[0] = argv[0].lstrip("-@:+!")  # systemd's prefixes
    return argv


def unit_environment(sections: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in sections["Service"].get("Environment", []):
        for assignment in shlex.split(value):
            name, sep, setting = assignment.partition("=")
            assert sep, f"Environment={value}: {assignment!r} is no NAME=VALUE"
            env[name] = setting
    return env


def doc_blocks(info: str) -> Iterator[tuple[str, str]]:
    """The fenced blocks of docs/service.md tagged `info` that start with a `# PATH` comment
    naming the file they show: (PATH, text)."""
    for tag, body in re.findall(r"^```(\w*)\n(.*?)^```", DOC.read_text(), flags=re.S | re.M):
        first = body.splitlines()[0] if body else ""
        if tag == info and first.startswith("# /"):
            yield first[2:].split()[0], body


def server_command() -> Any:
    from warden.cli.main import app

    return typer.main.get_command(app).commands["server"]  # type: ignore[attr-defined]


def server_options() -> dict[str, Any]:
    """Every visible option of `warden server` by its spelling, with its parameter."""
    return {opt: p for p in server_command().params if not p.hidden for opt in p.opts}


def server_variables() -> set[str]:
    """The environment variables the server reads: its options' variables, and every name the
    server's own code reads from os.environ."""
    names = {p.envvar for p in server_command().params if isinstance(p.envvar, str)}
    for place in SERVER_CODE:
        path = ROOT / place
        for source in [path] if path.is_file() else sorted(path.rglob("*.py")):
            names.update(a or b for a, b in ENV_READ.findall(source.read_text()))
    return names


# -- checks ------------------------------------------------------------------------------------


def exec_start_problems(argv: list[str]) -> list[str]:
    """What is wrong with a `warden server …` command line: anything but the options of
    `warden server`, an option without its value, a relative path, a secret on it."""
    if len(argv) < 2 or Path(argv[0]).name != "warden" or argv[1] != "server":
        return [f"ExecStart= runs {shlex.join(argv[:2])!r}, not the warden entry point's 'server'"]
    problems = []
    if not Path(argv[0]).is_absolute():
        problems.append(f"ExecStart= names {argv[0]!r}: systemd needs an absolute path")
    options = server_options()
    args = iter(argv[2:])
    for arg in args:
        name, eq, value = arg.partition("=")
        param = options.get(name)
        if not name.startswith("--") or param is None:
            problems.append(f"{arg!r} is no option of warden server (it has {', '.join(sorted(options))})")
            continue
        if param.is_flag:
            if eq:
                problems.append(f"{name} is a flag and takes no value, got {value!r}")
            continue
        if not eq:
            value = next(args, "")
        if not value or value.startswith("--"):
            problems.append(f"{name} takes a value, none given")
        elif name in PATH_OPTIONS and not Path(value).is_absolute():
            problems.append(f"{name} {value}: a service needs an absolute path")
        if name == "--db" and "@" in value:
            problems.append("--db with credentials: every user can read /proc/PID/cmdline; use WARDEN_DB")
    return problems


def test_exec_start_runs_warden_server_with_its_own_options() -> None:
    argv = exec_start(unit())
    assert exec_start_problems(argv) == []
    assert "--config" in argv and argv[argv.index("--config") + 1] == CONFIG


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("--config", "--confg"), "'--confg' is no option of warden server"),
        (("--config /etc/warden/server.yaml", "--config"), "--config takes a value"),
        (("/etc/warden/server.yaml", "server.yaml"), "a service needs an absolute path"),
        (("--config", "--bootstrap-token s3cret --config"), "'--bootstrap-token' is no option"),
        (("warden server", "warden sever"), "not the warden entry point's 'server'"),
    ],
)
def test_exec_start_check_finds_what_is_wrong(change: tuple[str, str], problem: str) -> None:
    line = one(unit()["Service"], "ExecStart").replace(*change)
    argv = shlex.split(line)
    assert any(problem in p for p in exec_start_problems(argv)), exec_start_problems(argv)


def test_the_unit_and_the_documented_config_start_the_documented_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real command parses the unit's command line, with each config file of the docs in
    place of /etc/warden/server.yaml, into the settings the docs give (nothing is started)."""
    for param in server_command().params:
        if isinstance(param.envvar, str):
            monkeypatch.delenv(param.envvar, raising=False)
    argv = exec_start(unit())
    configs = [text for path, text in doc_blocks("yaml") if path == CONFIG]
    assert configs, f"docs/service.md shows no {CONFIG}"
    for n, text in enumerate(configs):
        config = tmp_path / f"server-{n}.yaml"
        config.write_text(text)
        args = [str(config) if a == CONFIG else a for a in argv[2:]]
        ctx = server_command().make_context("server", args)
        data = yaml.safe_load(text)
        for key, value in data.items():
            assert key in CONFIG_KEYS
            got = ctx.params[key]
            assert got == (Path(value) if isinstance(got, Path) else tuple(value) if isinstance(got, tuple) else value)
            if isinstance(got, Path):
                assert got.is_absolute(), f"{key}: {value} in {CONFIG}: a service needs an absolute path"
        assert ctx.params["policy"] == Path(POLICY)
        assert ctx.params["executor"] in ("local", "slurm", "ray")


def test_a_config_key_the_server_does_not_know_is_refused(tmp_path: Path) -> None:
    """The config check of the test above is the server's own, which refuses what it does not know."""
    config = tmp_path / "server.yaml"
    config.write_text("policy: /etc/warden/policy.yaml\nbootstrap_token: s3cret\n")
    with pytest.raises(typer.Exit):
        _load_config(SimpleNamespace(default_map=None), None, config)  # type: ignore[arg-type]


def test_the_documented_policy_is_valid() -> None:
    policies = [text for path, text in doc_blocks("yaml") if path == POLICY]
    assert policies, f"docs/service.md shows no {POLICY}"
    for text in policies:
        parse_policy(text, POLICY)


def test_every_variable_set_for_the_server_is_one_it_reads() -> None:
    known = server_variables()
    assert {"WARDEN_DB", "WARDEN_STATE_DIR", "WARDEN_BOOTSTRAP_TOKEN"} <= known, (
        "the grep for variables found too little"
    )
    sections = unit()
    assert sections["Service"]["EnvironmentFile"] == [f"-{ENV_FILE}"]
    env_files = [text for path, text in doc_blocks("sh") if path == ENV_FILE]
    assert env_files, f"docs/service.md shows no {ENV_FILE}"
    documented = {m for text in env_files for m in re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, flags=re.M)}
    assert "WARDEN_DB" in documented
    for name in set(unit_environment(sections)) | documented:
        assert name in known, f"{name} is set for the server, which never reads it (it reads {sorted(known)})"


def test_every_warden_variable_the_page_names_exists() -> None:
    code = "\n".join(p.read_text() for p in sorted((ROOT / "warden").rglob("*.py")))
    for name in sorted(set(re.findall(r"\bWARDEN_[A-Z_]+\b", DOC.read_text()))):
        assert f'"{name}"' in code or f"'{name}'" in code, f"docs/service.md names {name}, which no code reads"


def test_the_state_directory_is_the_documented_one() -> None:
    service = unit()["Service"]
    assert one(service, "StateDirectory") == "warden"
    assert one(service, "StateDirectoryMode") == "0711"  # the mode the server wants when jobs run as other uids
    state = Path("/var/lib") / one(service, "StateDirectory")  # StateDirectory= is relative to /var/lib
    # The server's own default as root, so the unit needs no option or variable for it.
    assert state == paths.ROOT_STATE_DIR
    assert unit_environment(unit()).get("WARDEN_STATE_DIR", str(state)) == str(state)
    doc = DOC.read_text()
    assert f"In `{state}`: `StateDirectory=warden`" in doc
    assert f"{state}/admin-token" in doc


def test_the_unit_runs_as_root_and_stops_the_server_alone() -> None:
    service = unit()["Service"]
    assert service.get("User", ["root"]) == ["root"], "jobs run as other uids only under a root server"
    # The jobs are in the unit's cgroup: any other KillMode ends them at each stop or restart.
    assert one(service, "KillMode") == "process"
    assert one(service, "Restart") == "on-failure"
    assert one(service, "Type") in ("simple", "exec")
    assert "NoNewPrivileges" not in service  # jobs would inherit it (docs/service.md)


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit is checked by the tests above only")
    # The unit names /opt/warden/bin/warden; verify it with a warden that exists here.
    installed = shutil.which("warden") or str(Path(sys.executable).with_name("warden"))
    if not Path(installed).exists():
        installed = "/bin/true"
    text = UNIT.read_text().replace(exec_start(unit())[0], installed, 1)
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    (tmp_path / SOCKET.name).write_text(SOCKET.read_text())
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(copy), str(tmp_path / SOCKET.name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if UNIT.name in line or SOCKET.name in line]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


def test_the_socket_holds_the_documented_address_for_the_service() -> None:
    """warden.socket listens where the documented server.yaml says the server serves (every
    address its `host` stands for), and the service requires it, so the port is never free
    while the server restarts."""
    sockets = parse_unit(SOCKET.read_text())
    config = yaml.safe_load(next(body for path, body in doc_blocks("yaml") if path == CONFIG))  # the first: local
    assert config["host"] == "127.0.0.1"
    assert sorted(sockets["Socket"]["ListenStream"]) == sorted(
        [f"127.0.0.1:{config['port']}", f"[::1]:{config['port']}"]
    )
    assert one(sockets["Socket"], "Service") == UNIT.name and one(sockets["Socket"], "Accept") == "no"
    assert one(unit()["Unit"], "Requires") == SOCKET.name
    assert SOCKET.name in unit()["Unit"]["After"]
