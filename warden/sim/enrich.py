"""Seeded, documented rules that fill in what a public trace does not record.

No public GPU trace records tiers, checkpoint behaviour or startup times, yet every one of
warden's decisions depends on them. Rather than leave them at one default (which would make
every job look alike to the scheduler), these few rules derive them from what the trace does
record (GPUs, duration), with one seeded random stream for the two choices that have no
deterministic answer. Every rule is one sentence in `Trace.rules` and in docs/traces.md, so a
figure produced from a trace can be reproduced from the trace file, the seed and this module.

A rule applies only to a field the trace did not give: a native trace's columns, a PAI pod's
`qos`, a Philly job's virtual cluster are never overwritten.

Reproducibility: the stream is `random.Random(seed)` and every job, in `seq` order, takes
exactly two uniform draws (one for the tier, one choosing the checkpoint interval) whether or
not a rule uses them. A job's draws therefore depend only on the seed and its position, so a `limit`
slice of a trace gets the same values as the same jobs in the whole trace.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import fields
from operator import attrgetter
from typing import Any

from warden.engine.durations import format_duration
from warden.sim.records import TraceJob

# --- tier -------------------------------------------------------------------------------------
PRETRAIN_TIER = 2
PRETRAIN_MIN_GPUS = 8
PRETRAIN_MIN_SECONDS = 4 * 3600.0
"""A job this large and this long is treated as pre-training (tier 2)."""
SHORT_GPU_SECONDS = 3600.0
"""Jobs under one GPU-hour are the candidates for the opportunistic tier."""
OPPORTUNISTIC_TIER = 4
OPPORTUNISTIC_SHARE = 0.2
"""Share of the short jobs (seeded draw) that become opportunistic."""
DEFAULT_TIER = 3

# --- startup ----------------------------------------------------------------------------------
STARTUP_BASE_SECONDS = 30.0
STARTUP_PER_DOUBLING_SECONDS = 15.0
"""Added per doubling of the GPU count: larger jobs take longer to rendezvous and load."""
STARTUP_CAP_SECONDS = 300.0

# --- checkpoints ------------------------------------------------------------------------------
RESUMABLE_MIN_SECONDS = 1800.0
"""Jobs shorter than this are not worth checkpointing: they restart from zero."""
CHECKPOINT_INTERVALS = (1800.0, 3600.0, 7200.0)
CHECKPOINT_BASE_SECONDS = 10.0
CHECKPOINT_PER_GPU_SECONDS = 5.0
CHECKPOINT_CAP_SECONDS = 120.0

# --- gangs ------------------------------------------------------------------------------------
REPLICA_GPUS = 8
"""GPUs per node: a job larger than one node and a multiple of it runs as a gang of nodes."""

# --- queue ------------------------------------------------------------------------------------
DEFAULT_QUEUE = "default"

CHECKPOINT_FIELDS = ("resumable", "checkpoint_interval", "checkpoint_seconds")
REPLICA_FIELDS = ("replicas", "gpus_per_replica")

_CORE = frozenset({"job_id", "submit", "num_gpus", "duration"})
FORMAT_GIVES: dict[str, frozenset[str]] = {
    "native": _CORE | set(REPLICA_FIELDS),
    "philly": _CORE | {"queue"},
    "philly-rfold": _CORE,
    "pai2023": _CORE | {"tier", "cpu", "memory", "flavor", *REPLICA_FIELDS},
}
"""Fields each format records for every job when the caller does not say (`given=None`).
A native trace has no replica rule (its default is one replica of all its GPUs); a PAI pod is
one replica by definition."""

RULE_TIER = (
    f"tier: jobs with >= {PRETRAIN_MIN_GPUS} GPUs that run >= {PRETRAIN_MIN_SECONDS / 3600:g} h "
    f"are tier {PRETRAIN_TIER} (pre-training); jobs under {SHORT_GPU_SECONDS / 3600:g} GPU-hour are "
    f"tier {OPPORTUNISTIC_TIER} (opportunistic) with probability {OPPORTUNISTIC_SHARE:g} "
    f"(seeded draw), else tier {DEFAULT_TIER}; every other job is tier {DEFAULT_TIER}."
)
RULE_STARTUP = (
    f"startup_seconds: {format_duration(STARTUP_BASE_SECONDS)} + {format_duration(STARTUP_PER_DOUBLING_SECONDS)} "
    f"x log2(num_gpus), capped at {format_duration(STARTUP_CAP_SECONDS)}."
)
RULE_CHECKPOINT = (
    f"checkpoints: jobs shorter than {format_duration(RESUMABLE_MIN_SECONDS)} are not resumable and "
    f"write no checkpoints; the others are resumable, checkpoint every "
    f"{'/'.join(format_duration(s) for s in CHECKPOINT_INTERVALS)} (seeded uniform draw) and take "
    f"{format_duration(CHECKPOINT_BASE_SECONDS)} + {format_duration(CHECKPOINT_PER_GPU_SECONDS)} per GPU, capped "
    f"at {format_duration(CHECKPOINT_CAP_SECONDS)}, per checkpoint."
)
RULE_REPLICAS = (
    f"replicas: a job with more than {REPLICA_GPUS} GPUs whose GPU count is a multiple of "
    f"{REPLICA_GPUS} is a gang of num_gpus/{REPLICA_GPUS} replicas of {REPLICA_GPUS} GPUs; "
    f"every other job is one replica of all its GPUs."
)
RULE_QUEUE = f"queue: the trace has no team column, so every job is in queue '{DEFAULT_QUEUE}'."


def tier_for(num_gpus: int, duration: float, draw: float) -> int:
    """The tier rule for one job; `draw` is its uniform [0, 1) tier draw."""
    if num_gpus >= PRETRAIN_MIN_GPUS and duration >= PRETRAIN_MIN_SECONDS:
        return PRETRAIN_TIER
    if num_gpus * duration < SHORT_GPU_SECONDS and draw < OPPORTUNISTIC_SHARE:
        return OPPORTUNISTIC_TIER
    return DEFAULT_TIER


def startup_for(num_gpus: int) -> float:
    """Startup grows with the log of the job's size: rendezvous and loading fan out as a tree."""
    return min(STARTUP_BASE_SECONDS + STARTUP_PER_DOUBLING_SECONDS * math.log2(num_gpus), STARTUP_CAP_SECONDS)


def checkpoint_seconds_for(num_gpus: int) -> float:
    """A checkpoint's cost grows with the state to save (proportional to GPUs), up to a cap."""
    return min(CHECKPOINT_BASE_SECONDS + CHECKPOINT_PER_GPU_SECONDS * num_gpus, CHECKPOINT_CAP_SECONDS)


def replicas_for(num_gpus: int) -> tuple[int, int]:
    """(replicas, gpus_per_replica): whole 8-GPU nodes where the size allows, else one replica."""
    if num_gpus > REPLICA_GPUS and num_gpus % REPLICA_GPUS == 0:
        return num_gpus // REPLICA_GPUS, REPLICA_GPUS
    return 1, num_gpus


def active_rules(format: str, given: Collection[str]) -> list[str]:
    """The rules that apply to a trace of `format` that records the fields in `given`."""
    rules = []
    if "queue" not in given:
        rules.append(RULE_QUEUE)
    if "tier" not in given:
        rules.append(RULE_TIER)
    if "startup_seconds" not in given:
        rules.append(RULE_STARTUP)
    if not all(f in given for f in CHECKPOINT_FIELDS):
        rules.append(RULE_CHECKPOINT)
    if format != "native" and not any(f in given for f in REPLICA_FIELDS):
        rules.append(RULE_REPLICAS)
    return rules


def enrich(
    jobs: list[TraceJob], *, seed: int, format: str, given: Collection[str] | None = None
) -> tuple[list[TraceJob], list[str]]:
    """Fill every field the trace did not give, by the module's rules; return the jobs and rules.

    `jobs` must be in `seq` order (as a loader returns them). `given` names the TraceJob fields
    the trace recorded (for a native trace: its columns); None takes `FORMAT_GIVES[format]`.
    Fields in `given` are returned unchanged.
    """
    rows = [list(_values(job)) for job in jobs]
    rules = fill_fields(rows, seed=seed, format=format, given=given)
    return [TraceJob(*row) for row in rows], rules


def fill_fields(rows: list[list[Any]], *, seed: int, format: str, given: Collection[str] | None = None) -> list[str]:
    """`enrich` on jobs held as lists of field values in `FIELDS` order, changed in place.

    Loaders call this before they build their TraceJobs, so that each job of a 100k-job trace
    is constructed once (a frozen dataclass costs microseconds to build), not twice.
    """
    if format not in FORMAT_GIVES:
        raise ValueError(f"unknown trace format {format!r}; expected one of {', '.join(FORMAT_GIVES)}")
    have = FORMAT_GIVES[format] if given is None else frozenset(given)
    rules = active_rules(format, have)
    rng = random.Random(seed)
    draw = rng.random
    fill_queue = "queue" not in have
    fill_tier = "tier" not in have
    fill_startup = "startup_seconds" not in have
    fill_resumable = "resumable" not in have
    fill_interval = "checkpoint_interval" not in have
    fill_ckpt_seconds = "checkpoint_seconds" not in have
    fill_replicas = format != "native" and not any(f in have for f in REPLICA_FIELDS)
    i_gpus, i_duration, i_queue, i_tier, i_startup, i_resumable, i_interval, i_ckpt, i_replicas, i_per = (
        FIELD_INDEX[n]
        for n in (
            "num_gpus",
            "duration",
            "queue",
            "tier",
            "startup_seconds",
            "resumable",
            "checkpoint_interval",
            "checkpoint_seconds",
            "replicas",
            "gpus_per_replica",
        )
    )
    intervals = CHECKPOINT_INTERVALS
    startup: dict[int, float] = {}
    for row in rows:
        tier_draw = draw()
        interval = intervals[int(draw() * len(intervals))]
        num_gpus: int = row[i_gpus]
        duration: float = row[i_duration]
        if fill_queue:
            row[i_queue] = DEFAULT_QUEUE
        if fill_tier:
            row[i_tier] = tier_for(num_gpus, duration, tier_draw)
        if fill_startup:
            seconds = startup.get(num_gpus)
            if seconds is None:
                seconds = startup[num_gpus] = startup_for(num_gpus)
            row[i_startup] = seconds
        resumable = row[i_resumable]
        if fill_resumable:
            resumable = row[i_resumable] = duration >= RESUMABLE_MIN_SECONDS
        if fill_interval:
            long_enough = duration >= RESUMABLE_MIN_SECONDS
            row[i_interval] = interval if resumable and long_enough else None
        if fill_ckpt_seconds:
            row[i_ckpt] = checkpoint_seconds_for(num_gpus) if resumable else 0.0
        if fill_replicas:
            row[i_replicas], row[i_per] = replicas_for(num_gpus)
    return rules


FIELDS = tuple(f.name for f in fields(TraceJob))
"""TraceJob's fields in constructor order."""
FIELD_INDEX = {name: i for i, name in enumerate(FIELDS)}
_values = attrgetter(*FIELDS)
