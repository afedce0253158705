"""The job-side SDK (DESIGN §6): what a training script imports to be a good warden citizen.

    from warden.workload import CheckpointStore, default_reporter, install

    guard = install()                      # SIGTERM raises a flag instead of killing
    store = CheckpointStore()              # $WARDEN_CHECKPOINT_DIR, atomic, newest 3
    reporter = default_reporter()          # no-op outside warden
    step, state = store.load_latest() or (0, {"value": 0.0})
    reporter.startup_finished()
    while step < steps:
        state = train(state); step += 1
        reporter.progress(step)
        if guard.should_stop():            # SIGTERM: finish the step, save, exit 0
            store.save(step, state)
            guard.exit()

Standard library only; PyTorch is imported only by ``save_torch``/loading a ``.pt`` and by
``PreemptionGuard.should_stop_all`` when a process group exists. See docs/workload.md.
"""

from warden.workload.checkpoint import CheckpointInfo, CheckpointStore, CorruptCheckpoint
from warden.workload.guard import PreemptionGuard, active_guard, install
from warden.workload.report import PROCESS_STARTED_AT, Reporter, default_reporter

__all__ = [
    "PROCESS_STARTED_AT",
    "CheckpointInfo",
    "CheckpointStore",
    "CorruptCheckpoint",
    "PreemptionGuard",
    "Reporter",
    "active_guard",
    "default_reporter",
    "install",
]
