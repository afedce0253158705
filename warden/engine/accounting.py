"""What a job's time and GPUs count for: one function per meaning, shared by every shell.

The engine prices victims with these functions, the simulator books its attempts with them and
the server shows and exports them, so a number means the same thing in a plan, in a simulation
report and on `/metrics` (DESIGN §1: a policy behaves the same way in simulation and in
production). Every function takes plain values (seconds on the caller's clock, whole GPUs), so
each shell passes the fields of its own records without converting them to engine types.

Lost work (DESIGN §2, §4.4) has two meanings, kept apart because they are known at different
times:

- *predicted* (`predicted_lost_work`): what a preemption now would throw away, priced ahead of
  time from what the job reported. Zero when the job reported a save on SIGTERM whose measured
  duration fits its grace (the save will survive), else the GPU-seconds since the progress no
  checkpoint covers began (`unsaved_since`);
- *measured* (`measured_loss`): what a preemption did throw away, known once the job has
  exited, and what that figure rests on (`LossBasis`). Zero when a checkpoint completed after
  the job stopped working and no later than its exit (that save survived, whatever the
  prediction said), or when the job declared that it saves on SIGTERM and exited 0 within its
  grace; else the GPU-seconds between `unsaved_since` and the moment the job stopped working.

Both count from the same point, so a job that reports nothing new after SIGTERM is measured
to lose exactly what was predicted at SIGTERM.

It imports nothing of warden but the policy's type (for annotations), and numpy only inside the
owed computation, so the engine may use it without growing its imports; the job model imports it
(`Job.wait_s` is `wait_time`), so what it reads of a job is a protocol (`RunningJob`), never the
model's `Job`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray

    from warden.engine.policy import Policy

_Amount = TypeVar("_Amount", float, "NDArray[np.float64]")
"""A number, or numpy array of numbers: the arithmetic below is the same for both."""

_ROW_CHUNK_CELLS = 2_000_000
"""Bound on intervals × queues handled at once by the owed computation (memory, not speed)."""


# -- the policy's numbers for one job ---------------------------------------------------------


def effective_grace(policy: Policy, tier: int, requested: float | None) -> float:
    """Seconds between SIGTERM and SIGKILL: the job's request, else its tier's, never below
    `min_grace` (a policy may raise it after the job was submitted)."""
    grace = policy.tier(tier).grace if requested is None else requested
    return max(grace, policy.min_grace)


def effective_lease(policy: Policy, tier: int, requested: float | None) -> float:
    """The minimum runtime: the job's request, else its tier's, never above `max_lease`."""
    lease = policy.tier(tier).lease if requested is None else requested
    return min(lease, policy.max_lease)


def assumed_startup(policy: Policy, reported: float | None) -> float:
    """An attempt's startup time: as the job reported it, else the policy's restart overhead
    (what a restart is assumed to cost until the job says otherwise)."""
    return policy.preemption.restart_overhead if reported is None else reported


def within_attempt(seconds: float, started_at: float, now: float) -> float:
    """A self-reported span of an attempt (its startup, its checkpoint time) bounded by the
    attempt's age at `now`: no part of a run lasts longer than the run."""
    return min(seconds, max(0.0, now - started_at))


def checkpoint_basis(checkpoint_s: float, save_s: float | None) -> Literal["measured", "save", "assumed"]:
    """What `assumed_checkpoint` counts for an attempt: its last measured save ("measured",
    once it has saved and the save's duration is known), else the save on SIGTERM it reported
    or its trace gives ("save"), else the policy's checkpoint overhead ("assumed")."""
    if save_s is None:
        return "assumed"
    return "measured" if checkpoint_s > 0 else "save"


def assumed_checkpoint(policy: Policy, checkpoint_s: float, save_s: float | None) -> float:
    """The one save the efficiency floor counts for an attempt (DESIGN §4.3): what a
    preemption costs it once, the save it forces on SIGTERM. Its known duration (`save_s`: the
    last save the job measured, the save on SIGTERM it reported, or what its trace gives), else
    the policy's checkpoint overhead. Never the attempt's total time saving (`checkpoint_s`):
    a sum of reports would let a job that reports often move its own floor without bound."""
    return policy.preemption.checkpoint_overhead if save_s is None else save_s


def eta(run_s: float, startup_s: float, checkpoint_s: float) -> float:
    """An attempt's forward-progress efficiency η = (T_run − (T_startup + T_checkpoint)) / T_run
    (DESIGN §4.3) after `run_s` seconds of running; 0 for a run of no length, and 0 while the
    overheads counted exceed the run (a startup under way, or a save assumed ahead of the first):
    no progress is the least an attempt can make."""
    if run_s <= 0:
        return 0.0
    return max(0.0, (run_s - (startup_s + checkpoint_s)) / run_s)


def attempt_eta(
    started_at: float, sigterm_at: float | None, ended_at: float | None, startup_s: float, checkpoint_s: float
) -> float | None:
    """η of an attempt that stopped running: up to its SIGTERM (a preemption's or a cancel's:
    what follows is its grace), else its exit. None while it runs, or for one that ran for
    no time (nothing to measure).

    What happened, not what was assumed: `checkpoint_s` is the checkpoint time the attempt
    has measured (a save on SIGTERM included once reported), never `assumed_checkpoint`, which is the floor's
    guess ahead of a preemption."""
    stopped = sigterm_at if sigterm_at is not None else ended_at
    if stopped is None or stopped <= started_at:
        return None
    return eta(stopped - started_at, startup_s, checkpoint_s)


# -- waiting ----------------------------------------------------------------------------------


class StartedAttempt(Protocol):
    """What `expected_end` reads of a job's attempt (`warden.engine.model.Attempt`)."""

    @property
    def started_at(self) -> float: ...


class RunningJob(Protocol):
    """What `expected_end` reads of a job (`warden.engine.model.Job`)."""

    @property
    def attempt(self) -> StartedAttempt | None: ...

    @property
    def time_limit(self) -> float | None: ...


def expected_end(job: RunningJob) -> float:
    """When a running job is expected to end (`run_end` of its attempt); inf when nothing says."""
    return run_end(job.attempt.started_at if job.attempt is not None else 0.0, job.time_limit)


def run_end(started_at: float, time_limit: float | None) -> float:
    """When an attempt that started at `started_at` ends by its bound: its start plus its time
    limit (`Job.time_limit`), the moment the server stops it; inf without one."""
    return math.inf if time_limit is None else started_at + time_limit


def wait_time(waited: float, pending_since: float | None, submit: float, now: float, waiting: bool = True) -> float:
    """Seconds a job has spent waiting over all its attempts, up to `now`.

    `waited` is what earlier attempts waited (aging carries over a requeue); a job that waits
    now adds the time since it last entered PENDING (`pending_since`; None: since `submit`).
    """
    if not waiting:
        return waited
    since = submit if pending_since is None else pending_since
    return waited + max(0.0, now - since)


# -- lost work --------------------------------------------------------------------------------


def unsaved_since(started_at: float, startup_s: float, last_checkpoint_at: float | None) -> float:
    """Start of the progress no checkpoint covers: the later of the end of startup and the end
    of the newest checkpoint (one written by an earlier attempt is covered by the startup)."""
    since = started_at + startup_s
    return since if last_checkpoint_at is None else max(since, last_checkpoint_at)


def save_fits_grace(sigterm_save_s: float | None, grace: float) -> bool:
    """Will a save on SIGTERM survive? Only if the job reported one and it takes no longer than
    the grace (a longer one is cut short by SIGKILL)."""
    return sigterm_save_s is not None and sigterm_save_s <= grace


def predicted_lost_work(
    gpus: int,
    now: float,
    started_at: float,
    startup_s: float,
    last_checkpoint_at: float | None,
    sigterm_save_s: float | None,
    grace: float,
) -> float:
    """GPU-seconds a preemption at `now` would throw away (DESIGN §4.4)."""
    if save_fits_grace(sigterm_save_s, grace):
        return 0.0
    return gpus * max(0.0, now - unsaved_since(started_at, startup_s, last_checkpoint_at))


LossBasis = Literal["reported", "declared", "assumed", "cancelled"]
"""What a measured loss rests on: a checkpoint the job reported (`reported`), its declaration
that it saves on SIGTERM, kept by a clean exit in its grace (`declared`: nothing lost), or
neither (`assumed`: everything since its last start, as if nothing had been saved). The
server adds `cancelled`: a job a cancel ends runs no more, so its preemption is charged
nothing (a cancel is no cost of the priority scheme)."""


class MeasuredLoss(NamedTuple):
    """What a preemption threw away (GPU-seconds) and what that figure rests on."""

    gpu_s: float
    basis: LossBasis


def clean_exit_in_grace(
    sigterm_at: float | None, kill_at: float | None, ended_at: float, killed: bool, exit_codes: Sequence[int | None]
) -> bool:
    """Did every process exit 0 after SIGTERM, before SIGKILL? What a job that declared it
    saves on SIGTERM must do for its save to count (an exit status nobody read does not)."""
    if sigterm_at is None or killed or not exit_codes or any(c != 0 for c in exit_codes):
        return False
    return kill_at is None or ended_at <= kill_at


def measured_loss(
    gpus: int,
    stopped_at: float,
    started_at: float,
    startup_s: float,
    last_checkpoint_at: float | None,
    ended_at: float | None = None,
    declared_save: bool = False,
) -> MeasuredLoss:
    """What a preemption threw away, once the job has exited at `ended_at`.

    `stopped_at` is when the job stopped making progress: its SIGTERM, or the start of a save
    that was already under way then (only a simulator knows that). A checkpoint that ended
    after that and no later than the exit covers all the progress; one that ended after the
    exit did not survive it, and as only the newest checkpoint is known, nothing counts as
    saved then. `declared_save`: the job declared that it saves on SIGTERM and kept to it
    (`clean_exit_in_grace`), which covers the progress as a reported save would.
    """
    last = last_checkpoint_at
    if last is not None and ended_at is not None and last > ended_at:
        last = None
    if last is not None and last >= stopped_at:
        return MeasuredLoss(0.0, "reported")
    if declared_save:
        return MeasuredLoss(0.0, "declared")
    lost = gpus * max(0.0, stopped_at - unsaved_since(started_at, startup_s, last))
    return MeasuredLoss(lost, "assumed" if last is None else "reported")


# -- owed versus delivered GPU-hours (DESIGN §7) ----------------------------------------------


def held_gpu_seconds(gpus: _Amount, admitted_at: _Amount, ended_at: _Amount) -> _Amount:
    """What an attempt was delivered: its GPUs for as long as it held them (its grace included);
    element-wise on arrays of attempts."""
    return gpus * (ended_at - admitted_at)


def policy_entitlement(policy: Policy) -> dict[str, float]:
    """Each leaf queue's share of the cluster it is owed: its nominal GPUs, or its weight when
    no leaf has a GPU quota (normalised to sum 1)."""
    leaves = policy.leaves()
    raw = {q.name: float(q.nominal.get("gpu", 0.0)) for q in leaves}
    if not any(raw.values()):
        raw = {q.name: q.weight for q in leaves}
    total = sum(raw.values())
    return {q: v / total for q, v in raw.items()} if total > 0 else {}


def queue_weights(entitlement: Mapping[str, float], queues: Sequence[str]) -> NDArray[np.float64]:
    """The water-filling weight of each queue: its entitlement, or all equal if none has one."""
    import numpy as np  # numpy only where owed hours are asked for: the engine's passes never are

    w = np.array([max(float(entitlement.get(q, 0.0)), 0.0) for q in queues], dtype=np.float64)
    if w.size and not (w > 0).any():
        w[:] = 1.0
    return w


def waterfill(demand: NDArray[np.float64], weights: NDArray[np.float64], capacity: float) -> NDArray[np.float64]:
    """Weighted max-min fair allocation of `capacity` for each row of `demand` (rows × queues).

    Every weight must be positive. Rows whose total demand fits get their demand. Otherwise the
    level λ solves Σ min(d_q, λ w_q) = capacity: sorting queues by d_q / w_q, the sum at the
    k-th ratio is (demand of the queues before k) + ratio_k × (weight of queues from k on); the
    first k where that reaches capacity brackets λ, which is then solved for exactly.
    """
    import numpy as np

    alloc = demand.copy()
    over = demand.sum(axis=1) > capacity
    if not over.any():
        return alloc
    d = demand[over]
    ratio = d / weights
    order = np.argsort(ratio, axis=1, kind="stable")
    r = np.take_along_axis(ratio, order, axis=1)
    ds = np.take_along_axis(d, order, axis=1)
    ws = weights[order]
    before = np.cumsum(ds, axis=1) - ds
    from_here = np.cumsum(ws[:, ::-1], axis=1)[:, ::-1]
    reached = before + r * from_here >= capacity
    k = np.argmax(reached, axis=1)
    rows = np.arange(d.shape[0])
    level = (capacity - before[rows, k]) / from_here[rows, k]
    alloc[over] = np.minimum(d, level[:, None] * weights)
    return alloc


def owed_now(demand: Mapping[str, float], entitlement: Mapping[str, float], capacity: float) -> dict[str, float]:
    """GPUs each queue is owed at one instant: the cluster's `capacity` water-filled over the
    queues' charged demand now (`waterfill`, weights `queue_weights`), the integrand of
    `owed_gpu_seconds`. The engine's fair-share reclaim enforces it, the simulator integrates it,
    `GET /v1/queues` shows it: one definition of what a queue is owed.

    `demand` names every queue to share among (a queue missing from `entitlement` has weight 0
    unless none has one, and is then owed nothing, as in `owed_gpu_seconds`)."""
    import numpy as np

    queues = list(demand)
    if not queues or capacity <= 0:
        return dict.fromkeys(queues, 0.0)
    weights = queue_weights(entitlement, queues)
    keep = np.flatnonzero(weights > 0)
    owed = dict.fromkeys(queues, 0.0)
    if keep.size:
        d = np.array([[max(0.0, float(demand[queues[int(i)]])) for i in keep]], dtype=np.float64)
        for i, x in zip(keep, waterfill(d, weights[keep], float(capacity))[0]):
            owed[queues[int(i)]] = float(x)
    return owed


def owed_gpu_seconds(
    queues: Sequence[str],
    job_queue: ArrayLike,
    num_gpus: ArrayLike,
    submit: ArrayLike,
    finished: ArrayLike,
    entitlement: Mapping[str, float],
    gpus: float,
    start: float,
    end: float,
) -> dict[str, float]:
    """∫ owed_q(t) dt over [start, end] per queue, in GPU-seconds.

    Jobs come as columns: `job_queue[i]` indexes `queues`, `finished[i]` is NaN for a job that
    had not finished by `end`. At each instant the cluster's `gpus` are divided among queues by
    weighted water-filling (`waterfill`): a queue that wants less than its share gets its
    demand and the rest goes to the queues still below theirs, in proportion to their weights
    (`queue_weights`; a queue with weight 0 is owed nothing). A queue's demand at `t` is the
    GPUs of its jobs with `submit <= t < finished`. The demand is piecewise constant between
    submits and finishes, so the integral is exact.
    """
    import numpy as np

    owed = dict.fromkeys(queues, 0.0)
    if not queues or gpus <= 0 or end <= start:
        return owed
    jq = np.asarray(job_queue, dtype=np.intp)
    ng = np.asarray(num_gpus, dtype=np.float64)
    sub = np.asarray(submit, dtype=np.float64)
    fin = np.asarray(finished, dtype=np.float64)
    weights = queue_weights(entitlement, queues)
    cols = np.flatnonzero(weights > 0)  # weight-0 queues are owed nothing: leave them out
    col_of = np.full(len(queues), -1, dtype=np.intp)
    col_of[cols] = np.arange(cols.size)
    keep = col_of[jq] >= 0
    on = np.clip(sub[keep], start, end)
    off = np.clip(np.where(np.isnan(fin[keep]), end, fin[keep]), start, end)
    edges = np.unique(np.concatenate(([start, end], on, off)))
    dt = np.diff(edges)
    # +gpus on the interval that starts at submit, -gpus on the one that starts at finish
    rows = np.concatenate((np.searchsorted(edges, on), np.searchsorted(edges, off)))
    q = np.concatenate((col_of[jq[keep]],) * 2)
    g = np.concatenate((ng[keep], -ng[keep]))
    totals = _integrate_waterfill(rows, q, g, dt, weights[cols], float(gpus))
    for c, total in zip(cols, totals):
        owed[queues[int(c)]] = float(total)
    return owed


def _integrate_waterfill(
    rows: NDArray[np.intp],
    q: NDArray[np.intp],
    g: NDArray[np.float64],
    dt: NDArray[np.float64],
    weights: NDArray[np.float64],
    capacity: float,
) -> NDArray[np.float64]:
    """Σ over intervals of waterfill(demand) × length, with demand built from per-row deltas.

    Intervals are processed in chunks (carrying the demand across) so memory stays bounded by
    `_ROW_CHUNK_CELLS` whatever the number of queues.
    """
    import numpy as np

    nq = weights.size
    n_rows = dt.size
    order = np.argsort(rows, kind="stable")
    rows, q, g = rows[order], q[order], g[order]
    chunk = max(1, _ROW_CHUNK_CELLS // max(nq, 1))
    carry = np.zeros(nq)
    total = np.zeros(nq)
    for a in range(0, n_rows, chunk):
        b = min(a + chunk, n_rows)
        lo, hi = np.searchsorted(rows, [a, b])
        cells = (rows[lo:hi] - a) * nq + q[lo:hi]
        delta = np.bincount(cells, weights=g[lo:hi], minlength=(b - a) * nq).astype(np.float64).reshape(b - a, nq)
        delta[0] += carry
        demand = np.cumsum(delta, axis=0, dtype=np.float64)
        carry = demand[-1].copy()
        np.maximum(demand, 0.0, out=demand)
        total += (waterfill(demand, weights, capacity) * dt[a:b, None]).sum(axis=0)
    return total
