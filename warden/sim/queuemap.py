"""A trace's queues onto one's own leaf queues (`warden sim … --queue-map FILE`), so that a
policy written for one's own teams runs on a public trace (Philly's 15 virtual clusters, say)
without naming every queue of the trace.

The file is a YAML mapping `trace_queue: leaf`; the entry `"*": leaf` takes every trace queue
the map does not name. Names are read as written: `0e4a51` and `103959` stay text, as the
trace has them. The jobs keep everything else, their tiers included; the trace's quotas are
summed per leaf (what the presets use as nominal quotas).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from warden.engine.policy import PolicyError, check_queue_name
from warden.engine.safeyaml import describe, load_yaml
from warden.sim.records import Trace

REST = "*"
"""The key of the entry that takes every trace queue the map does not name."""

SHOWN = 5
"""How many names a refusal lists before it counts the rest."""


@dataclass(frozen=True)
class QueueMap:
    """Which leaf queue each trace queue's jobs go to."""

    source: str
    """The file, as the option gave it."""
    named: Mapping[str, str]
    """Trace queue → leaf, as the file names them."""
    rest: str | None
    """The leaf of every trace queue not named (the `"*"` entry), or None."""

    def leaf(self, queue: str) -> str | None:
        return self.named.get(queue, self.rest)

    def refused(self, message: str) -> ValueError:
        return ValueError(f"--queue-map {self.source}: {message}")


def _listing(names: list[str]) -> str:
    """The first few names, quoted, and how many more."""
    shown = ", ".join(repr(n) for n in names[:SHOWN])
    return shown if len(names) <= SHOWN else f"{shown} and {len(names) - SHOWN} more"


def load_queue_map(path: str | Path) -> QueueMap:
    """Read a queue map; a file that is not one is refused with one message naming it."""
    source = str(path)
    empty = QueueMap(source, {}, None)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise empty.refused(err.strerror or "cannot be read") from None
    except UnicodeDecodeError as err:
        raise empty.refused(f"is not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        data = load_yaml(text, text_only=True)  # every scalar as text: names as written
    except yaml.YAMLError as err:
        raise empty.refused(describe(err)) from None
    if not isinstance(data, dict) or not data:
        raise empty.refused(
            f"must map trace queues to leaf queues, one `trace_queue: leaf` a line (and `{REST!r}: leaf` for "
            f"the rest); got {type(data).__name__ if data else 'nothing'}"
        )
    named: dict[str, str] = {}
    for key, leaf in data.items():
        if not isinstance(key, str) or not key:
            raise empty.refused(f"{key!r} is not a trace queue's name")
        if not isinstance(leaf, str):
            raise empty.refused(f"the entry for {key!r} must be one leaf queue's name (got {leaf!r})")
        try:
            check_queue_name(leaf)
        except PolicyError as err:
            raise empty.refused(f"the entry for {key!r}: {err}") from None
        named[key] = leaf
    rest = named.pop(REST, None)
    return QueueMap(source, named, rest)


def apply_queue_map(trace: Trace, qmap: QueueMap) -> Trace:
    """The trace with each job in its queue's leaf and the quotas summed per leaf; a trace
    queue the map leaves without a leaf is refused (how many, and the first few)."""
    queues = sorted({j.queue for j in trace.jobs} | trace.queues.keys())
    unmapped = [q for q in queues if qmap.leaf(q) is None]
    if unmapped:
        raise qmap.refused(
            f"{len(unmapped)} of the trace's {len(queues)} queues {'is' if len(unmapped) == 1 else 'are'} not in "
            f"the map, which has no {REST!r} entry for the rest: {_listing(unmapped)}"
        )
    leaf = {q: qmap.leaf(q) or "" for q in queues}
    jobs = tuple(dataclasses.replace(j, queue=leaf[j.queue]) for j in trace.jobs)
    quotas: dict[str, float] = {}
    for q, gpus in trace.queues.items():
        quotas[leaf[q]] = quotas.get(leaf[q], 0.0) + gpus
    by_rest = sum(q not in qmap.named for q in queues)
    rule = (
        f"queues: the trace's {len(queues)} queues onto {len(set(leaf.values()))} leaf queues by {qmap.source}"
        + (f", {by_rest} of them by its {REST!r} entry" if by_rest else "")
        + (", their quotas summed per leaf." if quotas else ".")
    )
    return dataclasses.replace(trace, jobs=jobs, queues=quotas, rules=(*trace.rules, rule))


def check_leaves(qmap: QueueMap, leaves: Iterable[str], policy: str) -> None:
    """Refuse a map that sends trace queues to a queue that is no leaf of the `policy` file."""
    known = set(leaves)
    wanted = [*qmap.named.values(), *([qmap.rest] if qmap.rest is not None else [])]
    unknown = sorted({leaf for leaf in wanted if leaf not in known})
    if unknown:
        raise qmap.refused(
            f"{_listing(unknown)} {'is not a leaf queue' if len(unknown) == 1 else 'are not leaf queues'} of "
            f"{policy}; its leaf queues: {', '.join(sorted(known))}"
        )
