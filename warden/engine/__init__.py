"""The pure scheduling core: snapshot in, plan out (DESIGN §1, §4).

Nothing in this package performs I/O, reads a clock or draws random numbers, and nothing here
imports the simulator, the server or the executors.
"""

from warden.engine.model import (
    Attempt,
    Job,
    JobState,
    Node,
    ReplicaPlacement,
    Snapshot,
    UsageLedger,
)
from warden.engine.plan import Admission, Explanation, Plan, Preemption, Reservation, SortKey

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
]
