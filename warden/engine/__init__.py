"""The pure scheduling core: snapshot in, plan out (DESIGN §1, §4).

Nothing here reads a clock or draws random numbers, the only I/O is `policy.load_policy`
reading the policy file, and nothing imports the simulator, the server or the executors.
Shells call `schedule(snapshot, now)`.
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
from warden.engine.scheduler import schedule

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
