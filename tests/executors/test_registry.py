"""The executor registry (`warden.executors.registry`): its names are the kinds `warden server`
accepts, the options each kind owns are refused with another in one line naming both, its
table agrees with the command's options, and the local factory builds the executor and nodes
the settings ask for without a server."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from warden.cli.main import app
from warden.cli.server import CONFIG_KEYS
from warden.executors import registry
from warden.executors.identity import Identities
from warden.executors.local import LocalExecutor
from warden.server.app import Settings


def warden_server(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`warden server ARGS` in its own process, as an operator runs it, with no option taken
    from this environment. A `--run-as` no server takes, checked after the executor's options,
    stops a command those let through before it serves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARDEN_")}
    state = str(tmp_path / "state")
    return subprocess.run(
        [sys.executable, "-m", "warden.cli.main", "server", "--state-dir", state, "--run-as", "neither", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_names_are_the_kinds_the_server_accepts_and_its_help_lists() -> None:
    assert registry.names() == ("local", "slurm", "ray")
    assert registry.DEFAULT == "local" == Settings().executor
    for name in registry.names():
        assert Settings(executor=name).executor == name
        required = {o.field: "x" for k in registry.KINDS for o in k.options if k.name == name and o.required}
        assert registry.option_refusal(name, required) is None, name
    with pytest.raises(ValueError, match=r"^expected 'local', 'slurm' or 'ray', got 'x'$"):
        Settings(executor="x")
    server = typer.main.get_command(app).commands["server"]  # type: ignore[attr-defined]
    [option] = [p for p in server.params if "--executor" in p.opts]
    assert option.default == "local"
    assert option.help == (
        "What runs the jobs: 'local' (this machine), 'slurm' (a Slurm cluster; see docs/slurm.md) or "
        "'ray' (a Ray cluster; see docs/ray.md)."
    )


def test_every_option_a_kind_owns_is_an_option_of_the_server_a_config_key_and_a_setting() -> None:
    """A kind's option the command lacks, or one no setting receives, would be read by nobody."""
    server = typer.main.get_command(app).commands["server"]  # type: ignore[attr-defined]
    flags = {opt: p.name for p in server.params for opt in p.opts}
    fields = {f.name: f.default for f in dataclasses.fields(Settings)}
    owned = [o for k in registry.KINDS for o in k.options]
    assert [o.flag for o in owned] == [
        "--fake-gpus",
        "--slurm-partition",
        "--ray-address",
        "--ray-trust-unauthenticated",
    ]
    for option in owned:
        assert flags.get(option.flag) == option.field, option.flag
        assert option.field in CONFIG_KEYS, option.field
        assert fields.get(option.field, "missing") == option.default, option.field
    assert "executor" in CONFIG_KEYS and fields["executor"] == registry.DEFAULT


def test_the_options_are_refused_only_by_what_follows_them(tmp_path: Path) -> None:
    """Else the refusals below could come from the `--run-as` the helper gives."""
    done = warden_server(tmp_path, "--executor", "ray", "--ray-address", "head:6379", "--ray-trust-unauthenticated")
    assert done.returncode == 2 and done.stderr == "error: --run-as: expected 'dynamic' or 'user', got 'neither'\n"


def test_an_unknown_executor_is_refused_in_one_line_before_anything_is_made(tmp_path: Path) -> None:
    done = warden_server(tmp_path, "--executor", "x")
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: --executor: expected 'local', 'slurm' or 'ray', got 'x'\n"
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--executor", "slurm", "--fake-gpus", "2"),
            "--fake-gpus: the slurm executor takes its nodes and GPUs from the cluster",
        ),
        (
            ("--ray-address", "head:6379"),
            "--ray-address: given 'head:6379', but the executor is 'local' (add --executor ray)",
        ),
        (
            ("--executor", "slurm", "--ray-trust-unauthenticated"),
            "--ray-trust-unauthenticated: the executor is 'slurm' (add --executor ray)",
        ),
        (
            ("--executor", "ray"),
            "--ray-address: the ray executor needs the cluster's address (HOST:PORT, or $WARDEN_RAY_ADDRESS)",
        ),
    ],
    ids=["fake-gpus-with-slurm", "ray-address-with-local", "ray-trust-with-slurm", "ray-without-address"],
)
def test_an_option_of_another_executor_is_refused_naming_both(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    done = warden_server(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: {message}\n"
    assert not (tmp_path / "state").exists()


def test_the_first_refusal_in_the_tables_order_is_the_one_said() -> None:
    both = {"fake_gpus": 2, "ray_trust_unauthenticated": True}
    assert registry.option_refusal("ray", both) == (
        "--fake-gpus: the ray executor takes its nodes and GPUs from the cluster"
    )
    assert registry.option_refusal("x", both) == "--executor: expected 'local', 'slurm' or 'ray', got 'x'"
    assert registry.option_refusal("local", {"slurm_partition": "gpu"}) is None  # the other kinds ignore it


@pytest.mark.parametrize("gpus", [0, 3])
def test_the_local_factory_builds_a_local_executor_on_the_fake_gpus_asked(tmp_path: Path, gpus: int) -> None:
    said: list[str] = []
    built = registry.kind("local").build(Settings(fake_gpus=gpus), Identities.fixed(), tmp_path, said.append)
    later = built.make_executor()
    try:
        assert isinstance(built.executor, LocalExecutor) and isinstance(later, LocalExecutor)
        assert later is not built.executor
        assert built.executor.cgroup_parent == later.cgroup_parent == registry.cgroup_parent(tmp_path)
        assert [n.gpus for n in built.nodes] == [gpus]
        assert built.inventory is None
        assert said == []  # GPUs were asked for: nothing to say
        assert built.containment == registry.Containment(built.executor.containment(), built.executor.layout is None)
    finally:
        later.close()
        built.executor.close()


def test_the_ray_factory_refuses_no_address_with_an_error_the_cli_reports(tmp_path: Path) -> None:
    ray = registry.kind("ray")
    with pytest.raises(ray.errors(), match=r"^no cluster address given \(--ray-address\)$"):
        ray.build(Settings(executor="ray"), Identities.fixed(), tmp_path, print)
    assert registry.kind("local").errors() == ()
    assert [e.__name__ for e in registry.kind("slurm").errors()] == ["SlurmError"]


def test_importing_the_registry_loads_no_executor() -> None:
    probe = (
        "import sys\n"
        "import warden.cli.server\n"
        "from warden.executors import registry\n"
        "registry.option_refusal('ray', {'ray_address': 'h:1'})\n"
        "print(sorted(m for m in sys.modules if m.startswith('warden.executors.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['warden.executors.identity', 'warden.executors.registry']"
