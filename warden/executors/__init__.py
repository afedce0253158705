"""Executors make the engine's plan real: start a gang, signal it, kill it, report its exit.

`local` (the embedded default) runs process groups on this machine under detached shims; see
docs/executors.md. The contract every executor implements is in `base`.

Names are imported lazily: the shim runs as `python -m warden.executors.shim` and must not pay
for (or be broken by) the rest of the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warden.executors.base import (
        Executor,
        Exit,
        Handle,
        LaunchError,
        LaunchSpec,
        ReplicaHandle,
        ReplicaLaunch,
        UnknownAttempt,
    )
    from warden.executors.gpus import GpuInfo, discover_gpus
    from warden.executors.local import LocalExecutor, job_environment, log_paths

_WHERE = {
    "Executor": "base",
    "Exit": "base",
    "Handle": "base",
    "LaunchSpec": "base",
    "ReplicaHandle": "base",
    "ReplicaLaunch": "base",
    "UnknownAttempt": "base",
    "GpuInfo": "gpus",
    "discover_gpus": "gpus",
    "LaunchError": "base",
    "LocalExecutor": "local",
    "job_environment": "local",
    "log_paths": "local",
}
__all__ = [
    "Executor",
    "Exit",
    "GpuInfo",
    "Handle",
    "LaunchError",
    "LaunchSpec",
    "LocalExecutor",
    "ReplicaHandle",
    "ReplicaLaunch",
    "UnknownAttempt",
    "discover_gpus",
    "job_environment",
    "log_paths",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
