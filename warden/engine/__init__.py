"""The pure scheduling core: snapshot in, plan out (DESIGN §1, §4).

Nothing here reads a clock or draws random numbers, the only I/O is `policy.load_policy`
reading the policy file, and nothing imports the simulator, the server or the executors.
Shells call `schedule(snapshot, now)`.

The names below are loaded when first read: importing one small module of the engine (the
CLI's `warden.engine.durations`) does not load the scheduler.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warden.engine.model import Attempt, Job, JobState, Node, ReplicaPlacement, Snapshot, UsageLedger
    from warden.engine.plan import Admission, Explanation, Plan, Preemption, Reservation, SortKey
    from warden.engine.scheduler import schedule

_WHERE = {
    **dict.fromkeys(
        ("Attempt", "Job", "JobState", "Node", "ReplicaPlacement", "Snapshot", "UsageLedger"), "warden.engine.model"
    ),
    **dict.fromkeys(("Admission", "Explanation", "Plan", "Preemption", "Reservation", "SortKey"), "warden.engine.plan"),
    "schedule": "warden.engine.scheduler",
}
"""Where each name of `__all__` is defined."""

__all__ = [
    "Admission",
    "Attempt",
    "Explanation",
    "Job",
    "JobState",
    "Node",
    "Plan",
    "Preemption",
    "ReplicaPlacement",
    "Reservation",
    "Snapshot",
    "SortKey",
    "UsageLedger",
    "schedule",
]


def __getattr__(name: str) -> Any:
    """`warden.engine.Job`, `from warden.engine import schedule`: loaded on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'warden.engine' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
