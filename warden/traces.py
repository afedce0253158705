"""The columns of warden's native trace (docs/traces.md): the one schema the server's
`warden history export` writes and the simulator's loader reads, kept outside both shells so
that neither imports the other."""

from __future__ import annotations

import math

NATIVE_REQUIRED = ("job_id", "submit", "num_gpus", "duration")
NATIVE_OPTIONAL = (
    "queue",
    "tier",
    "user",
    "replicas",
    "gpus_per_replica",
    "lease",
    "checkpoint_interval",
    "checkpoint_seconds",
    "startup_seconds",
    "resumable",
    "cpu",
    "memory",
    "flavor",
    "duration_basis",
)
NATIVE_COLUMNS = NATIVE_REQUIRED + NATIVE_OPTIONAL
DURATION_BASES = ("observed", "at_least", "assumed")
"""What a `duration` rests on (docs/traces.md): what the job was seen to need (`observed`, the
default), at least what it ran (`at_least`: it never finished), or a loss assumed at a
preemption (`assumed`: the progress it kept is unknown, so it may need more)."""


def native_cell(value: object) -> str:
    """A value as a native CSV cell holds it: empty for none (or NaN), `true`/`false`, floats
    written exactly (repr). The export writes cells so, and the loader reads a Parquet column
    into the same text, so both files load alike."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value).strip()
