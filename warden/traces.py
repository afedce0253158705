"""The columns of warden's native trace (docs/traces.md): the one schema the server's
`warden history export` writes and the simulator's loader reads, kept outside both shells so
that neither imports the other."""

from __future__ import annotations

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
)
NATIVE_COLUMNS = NATIVE_REQUIRED + NATIVE_OPTIONAL
