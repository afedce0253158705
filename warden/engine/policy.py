"""The policy file (DESIGN §3): tiers, limits, fair share, thrash guard and the queue tree.

A policy is parsed once and read on every scheduling pass, so validation is strict and complete
up front (every problem is reported with its path and value, all at once where possible), and
the lookups the engine needs per job are precomputed. Durations are float seconds in memory and
canonical strings ("45m") when dumped for people.

`load_policy` is the one function here that touches the file system; shells call it, the
scheduling pass only ever sees a parsed `Policy`.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, Self

import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML ships without type hints
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from warden.engine.durations import (
    DURATION_PATTERN,
    MISSING,
    PolicyError,
    PolicyIssue,
    format_duration,
    parse_duration,
)
from warden.engine.durations import refuse as _refuse
from warden.engine.safeyaml import REFUSALS, SafeLoader, describe

__all__ = [
    "Aging",
    "Duration",
    "FairShare",
    "Limits",
    "MaxPreemptions",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "PreemptionSpec",
    "QueueSpec",
    "SchedulingSpec",
    "Thrash",
    "TierSpec",
    "default_policy",
    "format_duration",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "parse_policy_source",
    "policy_json_schema",
]


# --------------------------------------------------------------------------------------- errors


def _join(prefix: str, path: str) -> str:
    if not prefix or not path:
        return prefix or path
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _format_loc(loc: tuple[int | str, ...]) -> str:
    """Pydantic's loc as a path: list items as `[i]`, dict keys and fields dotted."""
    path = ""
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        if isinstance(part, int) and i > 0 and loc[i - 1] == "children":
            path += f"[{part}]"
        else:
            path = _join(path, str(part))
    return path


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, directly or inside a dict / tuple / Optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if (found := _nested_model(arg)) is not None:
            return found
    return None


def _fields_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str | None:
    """The field names valid where an unknown field `loc` was found (for the error's hint)."""
    for part in loc[:-1]:
        if model is not None and isinstance(part, str) and part in model.model_fields:
            model = _nested_model(model.model_fields[part].annotation)
    return ", ".join(model.model_fields) if model is not None else None


def _issues_from(err: ValidationError, model: type[BaseModel]) -> list[PolicyIssue]:
    """Translate pydantic's errors; our own validators' PolicyErrors keep their issues."""
    issues: list[PolicyIssue] = []
    for e in err.errors():
        where = _format_loc(e["loc"])
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, PolicyError):
            issues += [replace(i, path=_join(where, i.path)) for i in cause.issues]
        elif e["type"] == "missing":
            issues.append(PolicyIssue(where, MISSING, "required field is missing"))
        elif e["type"] == "extra_forbidden":
            issues.append(PolicyIssue(where, e["input"], "unknown field", _fields_at(model, e["loc"])))
        elif e["type"] == "literal_error":
            issues.append(PolicyIssue(where, e["input"], "not an allowed value", e["ctx"]["expected"]))
        else:
            issues.append(PolicyIssue(where, e["input"], e["msg"]))
    return issues


# ------------------------------------------------------------------------------------ durations

Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": DURATION_PATTERN},
                {"type": "number", "minimum": 0},
            ],
            "description": "Seconds, or a string like 90s, 45m, 8h, 7d, 1h30m.",
        }
    ),
]


def _positive_duration(seconds: float) -> float:
    if seconds <= 0:
        raise _refuse(format_duration(seconds), "must be longer than 0s")
    return seconds


# ------------------------------------------------------------------------------------ resources

_RESOURCE_PATTERN = r"^(gpu|cpu|memory|gpu:[A-Za-z0-9_.-]+)$"
_RESOURCE_RE = re.compile(_RESOURCE_PATTERN)
_RESOURCE_ALLOWED = "gpu, cpu (millicores), memory (MiB), gpu:<flavor>"


def _check_resource(name: str) -> str:
    if not _RESOURCE_RE.fullmatch(name):
        raise _refuse(name, "unknown resource", _RESOURCE_ALLOWED)
    return name


ResourceName = Annotated[str, AfterValidator(_check_resource)]
Quota = Annotated[
    dict[ResourceName, Annotated[int, Field(ge=0, strict=True)]],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": _RESOURCE_PATTERN},
            "additionalProperties": {"type": "integer", "minimum": 0},
        }
    ),
]


# ------------------------------------------------------------------------------------- sections


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


PositiveDuration = Annotated[Duration, AfterValidator(_positive_duration)]


class TierSpec(_Spec):
    """How jobs of one tier are treated (DESIGN §2, §4.3)."""

    name: str = Field(min_length=1)
    preemptible: bool = True
    lease: Duration = 0.0
    grace: Duration = 120.0
    requires_approval: bool = False
    scope: Literal["quota", "cluster", "queue"] = "quota"
    charged: bool = True
    time_limit: PositiveDuration | None = Field(
        default=None,
        description="The time limit of a job submitted without one (Slurm's DefaultTime); unset: the "
        "tier's max_time_limit, else none.",
    )
    max_time_limit: PositiveDuration | None = Field(
        default=None,
        description="The longest time limit a job of this tier may ask for (Slurm's MaxTime); a longer "
        "one is refused. Unset: limits.max_time_limit bounds it.",
    )

    @model_validator(mode="after")
    def _default_within_maximum(self) -> Self:
        if self.time_limit is not None and self.max_time_limit is not None and self.time_limit > self.max_time_limit:
            shown = format_duration(self.time_limit)
            raise PolicyError(
                [
                    PolicyIssue(
                        "time_limit",
                        shown,
                        f"time_limit {shown} is above max_time_limit {format_duration(self.max_time_limit)}",
                    )
                ]
            )
        return self

    @property
    def default_time_limit(self) -> float | None:
        """The time limit a job submitted without one gets: `time_limit`, else `max_time_limit`
        (as Slurm's DefaultTime falls back to MaxTime); None: none."""
        return self.time_limit if self.time_limit is not None else self.max_time_limit


_DEFAULT_TIERS: dict[int, TierSpec] = {
    1: TierSpec(name="production-inference", preemptible=False, grace=300.0, requires_approval=True, scope="cluster"),
    2: TierSpec(name="pretraining", lease=4 * 3600.0, grace=300.0, requires_approval=True),
    3: TierSpec(name="experimentation", lease=45 * 60.0, grace=120.0),
    4: TierSpec(name="opportunistic", lease=0.0, grace=120.0, charged=False),
}


_QUEUE_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
_QUEUE_NAME_RE = re.compile(_QUEUE_NAME_PATTERN)


QUEUE_NAME_CHARS = 255
"""A queue name is stored with every job (a String(255) column)."""


def check_queue_name(name: str) -> str:
    """`name` if it may name a queue; else a PolicyError saying why (its path left empty)."""
    if not _QUEUE_NAME_RE.fullmatch(name):
        raise _refuse(name, "not a valid queue name", "letters, digits, '_', '.', '-'")
    if len(name) > QUEUE_NAME_CHARS:
        raise _refuse(name[:40] + "…", "is too long for a queue name", f"at most {QUEUE_NAME_CHARS} characters")
    return name


QueueName = Annotated[
    str, AfterValidator(check_queue_name), WithJsonSchema({"type": "string", "pattern": _QUEUE_NAME_PATTERN})
]


class QueueSpec(_Spec):
    """A node of the queue tree. After validation an inner queue's `nominal` names every
    resource its children name (their sum, where the file gave none), so quota checks along a
    path never need to look below a queue."""

    name: QueueName
    weight: float = Field(default=1.0, gt=0)
    nominal: Quota = Field(default_factory=dict)
    borrowing_limit: Quota | None = None
    lending_limit: Quota | None = None
    children: tuple[QueueSpec, ...] = ()
    parent: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _resolve(self) -> Self:
        if self.parent is not None:
            raise PolicyError(
                [PolicyIssue("parent", self.parent, "parent is only used in the flat list form of queues")]
            )
        sums: dict[str, int] = defaultdict(int)
        for child in self.children:
            for resource, amount in child.nominal.items():
                sums[resource] += amount
        missing = {r: total for r, total in sorted(sums.items()) if r not in self.nominal}
        if missing:
            # Frozen for everyone else; the resolved quota is part of building the instance.
            object.__setattr__(self, "nominal", {**self.nominal, **missing})
        return self


def _walk(queue: QueueSpec, path: str = "") -> Iterator[tuple[str, QueueSpec]]:
    """Every queue of a tree, root first (pre-order), with its path relative to the root."""
    yield path, queue
    for i, child in enumerate(queue.children):
        yield from _walk(child, f"{path}.children[{i}]" if path else f"children[{i}]")


def _tree_issues(root: QueueSpec, locate: Callable[[str, QueueSpec], str]) -> list[PolicyIssue]:
    """The checks that span queues, all collected. `locate` gives a queue's path relative to
    `queues` as the input wrote it (nested or flat)."""
    issues: list[PolicyIssue] = []
    first_seen: dict[str, str] = {}
    for path, queue in _walk(root):
        where = locate(path, queue)
        if queue.name in first_seen:
            issues.append(
                PolicyIssue(
                    _join(where, "name"),
                    queue.name,
                    f"duplicate queue name (also at {_join('queues', first_seen[queue.name])})",
                )
            )
            continue
        first_seen[queue.name] = where
        for resource in sorted({r for child in queue.children for r in child.nominal}):
            total = sum(child.nominal.get(resource, 0) for child in queue.children)
            if total > queue.nominal[resource]:
                names = ", ".join(c.name for c in queue.children if resource in c.nominal)
                issues.append(
                    PolicyIssue(
                        _join(where, f"nominal.{resource}"),
                        queue.nominal[resource],
                        f"the children's nominal {resource} ({names}) sums to {total}, "
                        f"above {queue.name}'s own {queue.nominal[resource]}",
                    )
                )
        for resource, lend in sorted((queue.lending_limit or {}).items()):
            nominal = queue.nominal.get(resource, 0)
            if lend > nominal:
                issues.append(
                    PolicyIssue(
                        _join(where, f"lending_limit.{resource}"),
                        lend,
                        f"lending_limit is above the nominal {resource} {nominal}",
                    )
                )
    return issues


def _default_queues() -> QueueSpec:
    return QueueSpec(name="cluster", children=(QueueSpec(name="default"),))


def _with_default_wait(max_wait: dict[str, float]) -> dict[str, float]:
    return max_wait if "default" in max_wait else {"default": 24 * 3600.0, **max_wait}


class Aging(_Spec):
    """How long a job may wait before it counts as starving (DESIGN §4.1, step 2)."""

    max_wait: Annotated[dict[str, Duration], AfterValidator(_with_default_wait)] = Field(
        default_factory=lambda: {"default": 24 * 3600.0},
        description="`default`, plus optional per-queue overrides keyed by queue name.",
    )
    escalate_at: float = Field(
        default=0.75,
        gt=0,
        le=1,
        description="Share of its maximum wait after which a job is starving and goes first in its "
        "tier (1: only once past the maximum wait).",
    )


class FairShare(_Spec):
    half_life: Annotated[Duration, AfterValidator(_positive_duration)] = 7 * 86400.0
    aging: Aging = Aging()


class MaxPreemptions(_Spec):
    per: Duration = 24 * 3600.0
    count: int = Field(default=3, ge=1)


class Thrash(_Spec):
    min_efficiency: float = Field(default=0.9, ge=0, lt=1)
    max_preemptions: MaxPreemptions = MaxPreemptions()
    requeue_backoff: Duration = 0.0


class ReclaimSpec(_Spec):
    """Taking back borrowed capacity (DESIGN §4.3): which reclaims a pass may make."""

    nominal: Literal["any", "not_higher", "never"] = Field(
        default="any",
        description="Nominal reclaim: a job within its queue's nominal takes back capacity another queue "
        "borrows from it. `any`: whatever the victim's tier (preemptible tiers only); `not_higher`: only "
        "victims of its own or a lower tier; `never`: no nominal reclaim.",
    )
    fair_share: Literal["final", "above_share", "final_then_initial", "never"] = Field(
        default="final",
        description="Fair-share reclaim between borrowers: a queue below its owed share takes capacity back "
        "from a queue above its share. `final`: only while, after the eviction, the claimant's share is at "
        "most 1 and at most the victim queue's (Kueue's LessThanOrEqualToFinalShare); `above_share`: as "
        "`final`, and the victim queue keeps at least its owed share (only what it holds above it is taken); "
        "`final_then_initial`: also where the claimant's share after is below the victim queue's before "
        "(Kueue's LessThanInitialShare fallback); `never`: none.",
    )
    fair_share_margin: float = Field(
        default=1.5,
        ge=1.0,
        le=100.0,
        description="Fair-share reclaim swaps only where the victim queue's share after the eviction is at "
        "least this many times the claimant's (KAI's reclaimerUtilizationMultiplier): 1 is the rule as "
        "written; more asks for a larger imbalance before a job is preempted for it, so that arrivals "
        "moving the owed shares do not undo each swap soon after (docs/outcomes.md).",
    )
    starvation_shield: Literal["max_lease", "always", "off"] = Field(
        default="max_lease",
        description="A starving job (it has waited escalate_at × max_wait in all) is no reclaim's victim. "
        "`max_lease`: for the first max_lease of each of its attempts; `always`: for its whole attempt; "
        "`off`: never shielded.",
    )


class PreemptionSpec(_Spec):
    restart_overhead: Duration = Field(
        default=60.0, description="Startup time assumed for a job that has not reported one."
    )
    checkpoint_overhead: Duration = Field(
        default=30.0,
        description="The time one checkpoint save is assumed to take for a job that has reported none: the "
        "one save the efficiency floor counts while no save's duration is known.",
    )
    max_attempts_per_pass: int = Field(default=16, ge=0)
    victim_order: Literal["cost", "newest", "smallest", "share"] = "cost"
    only_if_it_pays: bool = Field(
        default=True,
        description=(
            "Preempt only when waiting for capacity that frees by itself (jobs ending, jobs "
            "already leaving) would cost the preemptor more GPU-seconds, counted from when its "
            "victims would be gone, than the victims lose in work and restart. Never for a tier-1 "
            "job, which waits for its victims' leases and grace alone."
        ),
    )
    protect_before_time_limit: Duration = Field(
        default=0.0,
        description="No preemption in the last this much of a job's time limit: a job that ends by its "
        "limit soon anyway keeps its work (0: off). Its reach is the thrash guard's: tiers 2–4 and "
        "reclaims wait for such a job to end, a tier-1 job does not.",
    )
    reclaim: ReclaimSpec = ReclaimSpec()


class SchedulingSpec(_Spec):
    """`order: fifo` ranks by submit time alone, `priority` by tier and then submit time (what
    Kueue and Kubernetes do without fair sharing); `head_of_line_blocking` makes the first job that
    does not fit stop everything behind it; `reservations` is how many top blocked jobs hold the
    capacity that frees first (0: none). `requeue_timestamp` is the time a requeued (preempted)
    job is ordered by in the `priority` and `fifo` orders: `submit` keeps its submit time,
    `eviction` uses the time it was last requeued, so it goes behind jobs submitted before that
    (as Kueue's `requeuingStrategy.timestamp: Eviction` orders workloads its PodsReady timeout
    evicted; a preempted workload keeps its creation time there, which is `submit`).
    `nominal_first` (`priority` and `fifo` only) ranks the jobs whose admission would stay
    within their queue's nominal quota, as the pass starts, before those of their tier that
    would borrow (under `fifo`, before all that would borrow), as Kueue takes a scheduling
    cycle's heads, each its queue's highest priority, "request under nominal quota before
    borrowing"."""

    order: Literal["governed", "priority", "fifo"] = "governed"
    head_of_line_blocking: bool = False
    reservations: int = Field(default=1, ge=0)
    requeue_timestamp: Literal["submit", "eviction"] = "submit"
    nominal_first: bool = False

    @model_validator(mode="after")
    def _nominal_first_needs_a_plain_order(self) -> Self:
        if self.nominal_first and self.order == "governed":
            raise PolicyError(
                [
                    PolicyIssue(
                        "nominal_first",
                        True,
                        "needs order priority or fifo: the governed order ranks queues by fair share",
                        "false, or order: priority / fifo",
                    )
                ]
            )
        return self


_INT32_MAX = 2**31 - 1
"""The largest count a database Integer column holds on every backend."""
_INT64_MAX = 2**63 - 1
"""The largest count a database BigInteger column holds."""


class Limits(_Spec):
    """What one API request may ask for (docs/control-plane.md, "Limits"): refusing a huge
    request up front keeps every scheduling pass and listing fast, and every number the
    database and the kill timer can hold."""

    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20, description="Bytes of one request body.")
    max_name_chars: int = Field(default=255, ge=1, le=255, description="Characters of a job's name.")
    max_command_args: int = Field(default=4096, ge=1, le=1 << 20, description="Words of a job's command.")
    max_command_bytes: int = Field(
        default=256 << 10, ge=1, le=64 << 20, description="UTF-8 bytes of a job's command, all words together."
    )
    max_env_vars: int = Field(default=1024, ge=0, le=1 << 20, description="Variables of a job's env.")
    max_env_bytes: int = Field(
        default=256 << 10, ge=0, le=64 << 20, description="UTF-8 bytes of a job's env, names and values together."
    )
    max_path_chars: int = Field(default=4096, ge=1, le=1 << 16, description="Characters of a job's workdir.")
    max_replicas: int = Field(default=1024, ge=1, le=_INT32_MAX, description="Replicas of one job.")
    max_time_limit: Duration = Field(
        default=365 * 86400.0, description="The longest time limit of a job, and of every tier's settings."
    )
    max_pending_per_user: int = Field(
        default=1000,
        ge=1,
        le=_INT32_MAX,
        description="Jobs one user may have waiting (pending or awaiting approval; admins are exempt).",
    )
    max_pending_per_queue: int = Field(
        default=5000,
        ge=1,
        le=_INT32_MAX,
        description="Jobs that may wait in one queue, every user (admins too) together.",
    )
    submissions_per_second_per_user: float = Field(
        default=20.0,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="Sustained submissions per second of one user, dry runs counted (a token bucket; admins are "
        "exempt).",
    )
    submission_burst_per_user: int = Field(
        default=100,
        ge=1,
        le=_INT32_MAX,
        description="Submissions (dry runs counted) one user may make at once before the per-second rate applies.",
    )
    max_stored_bytes_per_user: int = Field(
        default=1 << 30,
        ge=1,
        le=_INT64_MAX,
        description=(
            "UTF-8 bytes of command, env and workdir that one user's jobs keep, finished ones "
            "included (admins are exempt)."
        ),
    )
    expensive_requests_at_once: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Policy diffs, history exports and dry runs the server works on at once, every user together.",
    )


class ContainmentSpec(_Spec):
    """What each replica of a job may use where its executor bounds it (the local executor:
    its cgroup and its resource limits; docs/executors.md, "Containment"), and how long it may
    stay stopped."""

    max_processes: int = Field(
        default=4096,
        ge=1,
        le=_INT32_MAX,
        description="Processes and threads one replica may have at once (its cgroup's pids.max): a fork "
        "bomb stays inside its job.",
    )
    default_memory: int = Field(
        default=0,
        ge=0,
        le=_INT64_MAX >> 20,
        description="MiB of memory a replica of a job that asked for none may use (its cgroup's memory bound; "
        "a job that asked for memory gets what it asked for); 0: no bound.",
    )
    open_files: int = Field(
        default=4096,
        ge=64,
        le=1 << 20,
        description="A job's soft limit of open files (RLIMIT_NOFILE; its hard limit is 1048576), not the server's.",
    )
    stopped_limit: PositiveDuration = Field(
        default=60.0,
        description="How long a job's processes may stay stopped (a SIGSTOP from outside warden): then it is "
        "evicted (its grace, SIGKILL) and requeued.",
    )


# ------------------------------------------------------------------------- flat form of queues


def _tree_from_flat(entries: list[Any] | tuple[Any, ...]) -> QueueSpec:
    """Link a flat list of queues by `parent` into the nested tree. Each entry is validated on
    its own first, so its problems are reported at `[i]` even when the links are broken too."""
    issues: list[PolicyIssue] = []
    index: dict[str, int] = {}
    own: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            issues.append(PolicyIssue(f"[{i}]", entry, "expected a queue mapping"))
            continue
        if "children" in entry:
            issues.append(
                PolicyIssue(f"[{i}].children", entry["children"], "the flat form links queues by parent, not children")
            )
        fields = {k: v for k, v in entry.items() if k not in ("parent", "children")}
        try:
            QueueSpec.model_validate(fields)
        except ValidationError as err:
            issues += [replace(x, path=_join(f"[{i}]", x.path)) for x in _issues_from(err, QueueSpec)]
            continue
        name = fields["name"]
        if name in index:
            issues.append(PolicyIssue(f"[{i}].name", name, f"duplicate queue name (also at queues[{index[name]}])"))
            continue
        index[name], own[name] = i, fields

    parent_of: dict[str, str] = {}
    roots: list[str] = []
    for name, i in index.items():
        parent = entries[i].get("parent")
        if parent is None:
            roots.append(name)
        elif isinstance(parent, str) and parent in index:
            parent_of[name] = parent
        else:
            issues.append(PolicyIssue(f"[{i}].parent", parent, "unknown parent queue"))
    issues += _cycles(parent_of, index)
    if not roots and not issues:
        issues.append(PolicyIssue("", MISSING, "no root queue: exactly one queue has no parent"))
    if len(roots) > 1:
        issues.append(PolicyIssue("", roots, "several root queues: exactly one queue may have no parent"))
    if issues:
        raise PolicyError(issues)

    kids: dict[str, list[str]] = defaultdict(list)
    for name in index:  # file order
        if name in parent_of:
            kids[parent_of[name]].append(name)

    def build(name: str) -> QueueSpec:
        return QueueSpec.model_validate({**own[name], "children": [build(c) for c in kids[name]]})

    root = build(roots[0])
    if issues := _tree_issues(root, lambda _, queue: f"[{index[queue.name]}]"):
        raise PolicyError(issues)
    return root


def _cycles(parent_of: dict[str, str], index: dict[str, int]) -> list[PolicyIssue]:
    """One issue per cycle of parent links, reported at its member that comes first in the file."""
    issues: list[PolicyIssue] = []
    done: set[str] = set()
    for start in parent_of:
        chain: list[str] = []
        node: str | None = start
        while node is not None and node not in done and node not in chain:
            chain.append(node)
            node = parent_of.get(node)
        if node is not None and node in chain:
            cycle = chain[chain.index(node) :]
            first = min(cycle, key=index.__getitem__)
            loop = cycle[cycle.index(first) :] + cycle[: cycle.index(first)] + [first]
            issues.append(
                PolicyIssue(f"[{index[first]}].parent", parent_of[first], "cycle in parent links: " + " -> ".join(loop))
            )
        done.update(chain)
    return issues


# ---------------------------------------------------------------------------------------- policy


def _as_written(raw: Mapping[str, Any], key: str, seconds: float) -> str:
    """A duration for a message: the file's own text for it if it had one, else canonical."""
    text = raw.get(key) if isinstance(raw, Mapping) else None
    return text.strip() if isinstance(text, str) else format_duration(seconds)


def _tier_number(key: Any) -> int | None:
    if isinstance(key, bool):
        return None
    if isinstance(key, str) and key.strip().isdigit():
        key = int(key)
    return key if isinstance(key, int) and key in _DEFAULT_TIERS else None


class Policy(_Spec):
    """A validated policy. Missing tiers and settings take DESIGN §3's defaults."""

    # min_grace and max_lease come first so that the tiers validator can check against them
    # even when other sections fail; `to_dict` puts tiers first again, as files write them.
    min_grace: Duration = 120.0
    max_lease: Duration = 8 * 3600.0
    max_grace: Duration = Field(
        default=3600.0, description="The longest grace a tier or job may have: SIGKILL always comes, and soon."
    )
    tiers: dict[int, TierSpec] = Field(default_factory=lambda: dict(_DEFAULT_TIERS), validate_default=True)
    fair_share: FairShare = FairShare()
    thrash: Thrash = Thrash()
    preemption: PreemptionSpec = PreemptionSpec()
    scheduling: SchedulingSpec = SchedulingSpec()
    limits: Limits = Limits()
    containment: ContainmentSpec = ContainmentSpec()
    queues: QueueSpec = Field(default_factory=_default_queues)

    _queues_by_name: dict[str, QueueSpec] = PrivateAttr(default_factory=dict)
    _parents: dict[str, str | None] = PrivateAttr(default_factory=dict)
    _paths: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)
    _leaves: tuple[QueueSpec, ...] = PrivateAttr(default=())
    _max_wait: dict[str, float] = PrivateAttr(default_factory=dict)
    _resources: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("tiers", mode="before")
    @classmethod
    def _merge_tiers(cls, value: Any, info: ValidationInfo) -> Any:
        """Each tier given is merged over its default; each tier missing is the default. Every
        tier, given or not, must respect min_grace and max_lease."""
        if not isinstance(value, Mapping):
            return value
        issues: list[PolicyIssue] = []
        merged = dict(_DEFAULT_TIERS)
        given: set[int] = set()
        failed: set[int] = set()
        for key, spec in value.items():
            tier = _tier_number(key)
            if tier is None:
                issues.append(PolicyIssue(str(key), key, "unknown tier", "1, 2, 3, 4"))
                continue
            if tier in given:
                issues.append(PolicyIssue(str(key), key, "tier given twice"))
                continue
            given.add(tier)
            if isinstance(spec, Mapping):
                spec = {**_DEFAULT_TIERS[tier].model_dump(), **spec}
            try:
                merged[tier] = TierSpec.model_validate(spec)
            except ValidationError as err:
                failed.add(tier)
                issues += [replace(i, path=_join(str(tier), i.path)) for i in _issues_from(err, TierSpec)]
        # Durations are quoted as the file wrote them ("60s", not "1m") where it wrote them.
        raw = (info.context or {}).get("raw", {})
        raw_tiers = {_tier_number(k): v for k, v in value.items() if isinstance(v, Mapping)}
        for number, tier_spec in merged.items():
            if number in failed:
                continue
            written = raw_tiers.get(number, {})
            for field, limit, exceeds, relation in (
                ("grace", "min_grace", tier_spec.grace < info.data.get("min_grace", 0.0), "below"),
                ("lease", "max_lease", tier_spec.lease > info.data.get("max_lease", math.inf), "above"),
                ("grace", "max_grace", tier_spec.grace > info.data.get("max_grace", math.inf), "above"),
            ):
                if exceeds:
                    shown = _as_written(written, field, getattr(tier_spec, field))
                    issues.append(
                        PolicyIssue(
                            f"{number}.{field}",
                            shown,
                            f"{field} {shown} is {relation} {limit} {_as_written(raw, limit, info.data[limit])}",
                        )
                    )
        if issues:
            raise PolicyError(issues)
        return merged

    @field_validator("queues", mode="before")
    @classmethod
    def _nest_flat_queues(cls, value: Any) -> Any:
        return _tree_from_flat(value) if isinstance(value, list | tuple) else value

    @field_validator("queues")
    @classmethod
    def _check_queue_tree(cls, root: QueueSpec) -> QueueSpec:
        if issues := _tree_issues(root, lambda path, _: path):
            raise PolicyError(issues)
        return root

    @field_validator("max_grace")
    @classmethod
    def _grace_range(cls, max_grace: float, info: ValidationInfo) -> float:
        min_grace = info.data.get("min_grace")
        if min_grace is not None and max_grace < min_grace:
            raise _refuse(format_duration(max_grace), f"max_grace is below min_grace {format_duration(min_grace)}")
        return max_grace

    @model_validator(mode="after")
    def _tier_time_limits_within_limits(self) -> Self:
        """No tier's time limit, default or maximum, is above `limits.max_time_limit`, the bound
        on every job's."""
        bound = self.limits.max_time_limit
        issues = [
            PolicyIssue(
                f"tiers.{number}.{field}",
                format_duration(seconds),
                f"{field} {format_duration(seconds)} is above limits.max_time_limit {format_duration(bound)}",
            )
            for number, tier in sorted(self.tiers.items())
            for field in ("time_limit", "max_time_limit")
            if (seconds := getattr(tier, field)) is not None and seconds > bound
        ]
        if issues:
            raise PolicyError(issues)
        return self

    @model_validator(mode="after")
    def _check_and_index(self) -> Self:
        parents: dict[str, str | None] = {self.queues.name: None}
        for _, queue in _walk(self.queues):
            parents.update({child.name: queue.name for child in queue.children})
        max_wait = self.fair_share.aging.max_wait
        if issues := [
            PolicyIssue(f"fair_share.aging.max_wait.{key}", key, "unknown queue", "default or a queue name")
            for key in max_wait
            if key != "default" and key not in parents
        ]:
            raise PolicyError(issues)

        by_name = {q.name: q for _, q in _walk(self.queues)}
        paths: dict[str, tuple[str, ...]] = {}
        for name in by_name:  # pre-order: a parent's path is known before its children's
            parent = parents[name]
            paths[name] = (*paths[parent], name) if parent is not None else (name,)
        self._queues_by_name = by_name
        self._parents = parents
        self._paths = paths
        self._leaves = tuple(q for q in by_name.values() if not q.children)
        # A queue without its own max_wait takes its nearest ancestor's, else the default.
        self._max_wait = {
            name: next((max_wait[a] for a in reversed(path) if a in max_wait), max_wait["default"])
            for name, path in paths.items()
        }
        self._resources = tuple(
            sorted(
                {
                    resource
                    for q in by_name.values()
                    for quota in (q.nominal, q.borrowing_limit or {}, q.lending_limit or {})
                    for resource in quota
                }
            )
        )
        return self

    def tier(self, tier: int) -> TierSpec:
        return self.tiers[tier]

    def needs_approval(self, tier: int, is_admin: bool) -> bool:
        """Tiers that require approval hold a non-admin's job in AWAITING_APPROVAL."""
        return self.tiers[tier].requires_approval and not is_admin

    def max_wait_for(self, queue_name: str) -> float:
        """Seconds a job in this queue may wait before it is starving."""
        return self._max_wait.get(queue_name, self.fair_share.aging.max_wait["default"])

    def max_waits(self) -> Mapping[str, float]:
        """`max_wait_for` of every queue of the tree, as one read-only table (a pass reads it
        once rather than asking queue by queue)."""
        return MappingProxyType(self._max_wait)

    def queue_names(self) -> list[str]:
        """All queue names, root first, depth first in file order."""
        return list(self._queues_by_name)

    def leaves(self) -> list[QueueSpec]:
        return list(self._leaves)

    def find_queue(self, name: str) -> QueueSpec | None:
        return self._queues_by_name.get(name)

    def parent_of(self, name: str) -> str | None:
        return self._parents[name]

    def path_to(self, leaf_name: str) -> tuple[str, ...]:
        """The queue names from the root down to `leaf_name` (KeyError if unknown)."""
        return self._paths[leaf_name]

    def governed_resources(self) -> tuple[str, ...]:
        """Resources some queue limits; others are bounded only by node capacity."""
        return self._resources

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved policy, JSON/YAML-ready; `parse_policy` reads it back equal."""
        out = self.model_dump(mode="json")
        return {"tiers": {int(k): v for k, v in out.pop("tiers").items()}, **out}


# ------------------------------------------------------------------------------------- loading


def _load_yaml(text: str, source: str) -> tuple[Any, list[PolicyIssue]]:
    """The document and its duplicate keys (`warden.engine.safeyaml`: a policy file must not
    lose a setting given twice, and each one is reported with the file's other problems); a
    YAML error (after which nothing more can be read) is a PolicyError of its own."""
    loader = None
    try:
        loader = SafeLoader(text)  # its reader refuses a character YAML does not allow
        data = loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or describe(err).removeprefix("YAML syntax error: ")
        if isinstance(err, REFUSALS):
            message = f"{problem} ({where})" if where else problem
        else:
            message = f"YAML syntax error at {where}: {problem}" if where else f"YAML syntax error: {problem}"
        issue = PolicyIssue("<file>", MISSING, message)
        raise PolicyError([issue], source) from None
    finally:
        if loader is not None:
            loader.dispose()
    duplicates = [
        PolicyIssue("<file>", MISSING, f"duplicate key {d.key!r} at {d.where}: given twice") for d in loader.duplicates
    ]
    return data, duplicates


def parse_policy(data: Mapping[str, Any] | str | None, source: str = "<policy>") -> Policy:
    """A Policy from a mapping or YAML text; None or an empty document gives the defaults.
    Every problem is reported at once (duplicate keys with the rest), but a YAML syntax error,
    after which nothing can be read."""
    duplicates: list[PolicyIssue] = []
    if isinstance(data, str):
        data, duplicates = _load_yaml(data, source)
    return _validated({} if data is None else data, duplicates, source)


def parse_policy_source(text: str, source: str = "<policy>") -> Policy:
    """A policy from the whole text of a policy file, as an operator gives one (`load_policy`,
    `PUT /v1/policy`): as `parse_policy`, but a text without settings (empty, or only
    comments) is refused, for put in force it would reset every setting to its default."""
    data, duplicates = _load_yaml(text, source)
    if data is None:
        raise PolicyError([PolicyIssue("", MISSING, NO_SETTINGS)], source)
    return _validated(data, duplicates, source)


NO_SETTINGS = (
    "holds no settings (it is empty, or only comments): in force, it would reset every setting to its "
    "default; write the settings it sets (`warden policy show` prints the defaults)"
)


def _validated(data: Any, duplicates: list[PolicyIssue], source: str) -> Policy:
    """The policy `data` sets, or a PolicyError with every problem: the `duplicates` found in
    its YAML, then what validation finds."""
    if not isinstance(data, Mapping):
        raise PolicyError(
            [PolicyIssue("<file>", MISSING, f"a policy is a mapping of settings, not a {type(data).__name__}")], source
        )
    try:
        policy = Policy.model_validate(data, context={"raw": data})
    except ValidationError as err:
        raise PolicyError(duplicates + _issues_from(err, Policy), source) from None
    if duplicates:
        raise PolicyError(duplicates, source)
    return policy


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and parse a policy file; an unreadable file is a PolicyError naming the path."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError([PolicyIssue("<file>", source, "no such file")], source) from None
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise PolicyError([PolicyIssue("<file>", source, f"cannot read: {reason}")], source) from None
    return parse_policy_source(text, source)


def default_policy() -> Policy:
    return Policy()


def policy_json_schema() -> dict[str, Any]:
    """JSON Schema of the file format: pydantic's, widened where the file is looser than the
    resolved model (tiers are partial and keyed "1".."4"; queues may be a flat list)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Policy.model_json_schema()}
    schema["$defs"]["TierSpec"].pop("required", None)
    schema["properties"]["tiers"] = {
        "type": "object",
        "description": "Tier number -> settings, merged over that tier's defaults.",
        "propertyNames": {"enum": [str(t) for t in _DEFAULT_TIERS]},
        "additionalProperties": {"$ref": "#/$defs/TierSpec"},
    }
    queue = {"$ref": "#/$defs/QueueSpec"}
    schema["properties"]["queues"] = {
        "description": "The queue tree: the root queue with nested children, or a flat list "
        "of queues linked by `parent` (exactly one without a parent).",
        "anyOf": [queue, {"type": "array", "minItems": 1, "items": queue}],
    }
    return schema
