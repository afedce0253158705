"""The simulated cluster: one pool of GPUs (`--gpus N`) or nodes from a YAML file.

`--gpus N` is a pure GPU counter: a single node of N GPUs with no CPU or memory limits and no
topology, so any job asking at most N GPUs fits as soon as that many are free.

A cluster file lists node groups; each group makes `count` identical nodes named
`<name>-<i>`, grouped `nodes_per_block` at a time into topology blocks `<name>-b<k>`:

    nodes:
      - {name: a100, count: 64, gpus: 8, flavor: a100, nodes_per_block: 8}
      - {name: h100, count: 16, gpus: 8, cpu: 192000, memory: 1048576, flavor: h100}

`cpu` is in millicores and `memory` in MiB (0: not limited). Without `nodes_per_block`
every node is its own block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warden.engine.model import DEFAULT_FLAVOR, Node
from warden.engine.safeyaml import describe, load_yaml


class ClusterError(ValueError):
    """A cluster file or size that cannot be used; the message names the field and value."""


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    count: int = Field(default=1, ge=1)
    gpus: int = Field(ge=0)
    cpu: int = Field(default=0, ge=0)
    memory: int = Field(default=0, ge=0)
    flavor: str = DEFAULT_FLAVOR
    nodes_per_block: int | None = Field(default=None, ge=1)


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: tuple[_Group, ...] = Field(min_length=1)


def pool(gpus: int) -> tuple[Node, ...]:
    """`--gpus N`: one pool of N GPUs."""
    if gpus < 1:
        raise ClusterError(f"--gpus: {gpus!r} must be at least 1")
    return (Node("pool", gpus),)


def parse_cluster(data: Any, source: str = "<cluster>") -> tuple[Node, ...]:
    """Nodes from the parsed YAML of a cluster file."""
    try:
        spec = _ClusterFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ClusterError(f"{source}: {where}: {first['msg']} (got {first.get('input')!r})") from None
    nodes: list[Node] = []
    seen: set[str] = set()
    for g in spec.nodes:
        if g.name in seen:
            raise ClusterError(f"{source}: nodes: duplicate group name {g.name!r}")
        seen.add(g.name)
        width = len(str(g.count - 1))
        for i in range(g.count):
            block = None if g.nodes_per_block is None else f"{g.name}-b{i // g.nodes_per_block}"
            nodes.append(Node(f"{g.name}-{i:0{width}d}", g.gpus, g.cpu, g.memory, g.flavor, block))
    if sum(n.gpus for n in nodes) < 1:
        raise ClusterError(f"{source}: nodes: the cluster has no GPUs")
    return tuple(nodes)


def load_cluster(path: str | Path) -> tuple[Node, ...]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ClusterError(f"--cluster: cannot read {str(p)!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ClusterError(
            f"--cluster: cannot read {str(p)!r}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        raise ClusterError(f"--cluster {p}: {describe(err)}") from None
    return parse_cluster(data, str(p))


def total_gpus(nodes: tuple[Node, ...]) -> int:
    return sum(n.gpus for n in nodes)
