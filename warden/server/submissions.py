"""Submissions: every check a job passes before it is stored (the policy's queues, limits and
durations, the caller's grants, the cluster's shape), each user's submission rate, the
Idempotency-Key of a retried request, and the dry run that plans a submission without storing it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from warden.engine.durations import span
from warden.engine.model import Job, JobState
from warden.engine.policy import Limits, Policy, format_duration
from warden.engine.whatif import Verdict, what_if
from warden.server.auth import Principal, forbidden
from warden.server.errors import ApiError
from warden.server.forecasts import Forecasts
from warden.server.requests import SubmitRequest
from warden.server.serving import ServiceContext
from warden.server.submission_rate_limits import SubmissionRate
from warden.store.jobs import DuplicateSubmission, EarlierSubmission, TooManyWaiting, TooMuchStored, WaitingLimits


@dataclass(frozen=True, slots=True)
class Checked:
    """A submission that passed every check, as it would be stored."""

    state: JobState
    lease_s: float
    time_limit_s: float | None
    """Its own, else its tier's default (`TierSpec.default_time_limit`); None: none."""
    workdir: str


class Submitted(NamedTuple):
    id: int
    state: JobState
    replayed: bool = False
    """The job was submitted earlier with the same Idempotency-Key: this is its first answer."""


class Submissions:
    """Validates and stores jobs, and plans them without storing them (`dry_run`)."""

    def __init__(self, ctx: ServiceContext, forecasts: Forecasts) -> None:
        self.ctx = ctx
        self.forecasts = forecasts
        """Whose pass count a dry run's forecast uses, as the expected starts do."""
        self.rate = SubmissionRate()
        self._dry_runs = threading.Lock()

    def submit(self, req: SubmitRequest, who: Principal, idempotency_key: str | None = None) -> Submitted:
        """Validate and store a job. With an `idempotency_key`, a retry of the same request by
        the same user returns the job the first one created (`replayed`), and another request
        with that key is refused (409)."""
        digest = _request_digest(req) if idempotency_key is not None else None
        if idempotency_key is not None:
            earlier = self.ctx.store.find_submission(who.user, idempotency_key)
            if earlier is not None:
                return self._replay(idempotency_key, earlier, digest)
        limits = self.ctx.policy.limits
        self._check_rate(who, limits)
        try:
            return self._store_submission(req, who, idempotency_key, digest, limits)
        except BaseException:
            self.rate.give_back(who.user, limits.submission_burst_per_user)
            raise

    def _check_rate(self, who: Principal, limits: Limits, dry_run: bool = False) -> None:
        """Each user's submissions and dry runs together are limited to a rate with a burst
        (`limits.submissions_per_second_per_user`, `limits.submission_burst_per_user`); admins'
        are not."""
        if who.is_admin:
            return
        rate, burst = limits.submissions_per_second_per_user, limits.submission_burst_per_user
        wait = self.rate.take(who.user, rate, burst)
        if wait is not None:
            what = "dry-runs and submits" if dry_run else "submits"
            raise ApiError(
                429,
                "user",
                who.user,
                f"{what} faster than the limit of {rate:g} jobs per second after a burst of {burst}, dry "
                "runs counted (the policy's limits.submissions_per_second_per_user and "
                f"limits.submission_burst_per_user); retry in {span(wait)}",
                {"Retry-After": str(max(1, math.ceil(wait)))},
            )

    def _store_submission(
        self, req: SubmitRequest, who: Principal, idempotency_key: str | None, digest: str | None, limits: Limits
    ) -> Submitted:
        checked = self._check_submission(req, who)
        state, tier, workdir = checked.state, self.ctx.policy.tier(req.tier), checked.workdir
        try:
            job_id = self.ctx.store.submit(
                name=req.name or default_name(req.command, limits.max_name_chars),
                user=who.user,
                queue=req.queue,
                tier=req.tier,
                state=state,
                replicas=req.replicas,
                gpus=req.gpus,
                cpu=req.cpu,
                memory=req.memory,
                flavor=req.flavor,
                placement=req.placement,
                # The lease and the time limit are fixed at submission: a later policy keeps this
                # job's (and its tier).
                lease_s=checked.lease_s,
                grace_s=req.grace,
                time_limit_s=checked.time_limit_s,
                command=list(req.command),
                workdir=workdir,
                env=dict(req.env),
                actor=who.user,
                now=self.ctx.now(),
                reason=f"submitted to {req.queue} at tier {req.tier} ({tier.name})"
                + ("; waits for an admin's approval" if state is JobState.AWAITING_APPROVAL else ""),
                idempotency_key=idempotency_key,
                request_digest=digest,
                saves_on_sigterm=req.saves_on_sigterm,
                waiting_limits=WaitingLimits(
                    None if who.is_admin else limits.max_pending_per_user, limits.max_pending_per_queue
                ),
                stored_bytes_limit=None if who.is_admin else limits.max_stored_bytes_per_user,
            )
        except TooManyWaiting as err:
            raise _too_many_waiting(err) from None
        except TooMuchStored as err:
            raise _too_much_stored(err) from None
        except DuplicateSubmission as dup:  # a concurrent retry with the same key got there first
            assert idempotency_key is not None
            replayed = self._replay(idempotency_key, dup.earlier, digest)
            self.rate.give_back(who.user, limits.submission_burst_per_user)  # one job: one token
            return replayed
        self.ctx.changed()
        return Submitted(job_id, state)

    def _check_submission(self, req: SubmitRequest, who: Principal, dry_run: bool = False) -> Checked:
        """Refuse a submission the policy, the caller's grants or the cluster do not allow;
        else what storing it would record. A user's dry run does not check that the workdir
        exists; an admin's does."""
        policy = self.ctx.policy
        leaves = [q.name for q in policy.leaves()]
        if req.queue not in leaves:
            raise ApiError(422, "queue", req.queue, f"is not a leaf queue; allowed: {', '.join(leaves)}")
        if not who.may_submit_to(req.queue):
            raise forbidden(who, f"submit to queue {req.queue!r}")
        _check_limits(req, policy.limits)
        self._check_shape(req)
        tier = policy.tier(req.tier)
        _check_durations(req, policy)
        workdir = req.workdir or os.getcwd()
        if (who.is_admin or not dry_run) and not _is_dir(workdir):
            # A user's dry run does not look: as the server (root) it would tell them whether
            # any path on the machine exists, without leaving a trace.
            raise ApiError(422, "workdir", workdir, "is not a directory on the server's machine")
        state = JobState.AWAITING_APPROVAL if policy.needs_approval(req.tier, who.is_admin) else JobState.PENDING
        # The lease and the time limit are fixed at submission: a later policy keeps this job's.
        lease = req.lease if req.lease is not None else tier.lease
        time_limit = req.time_limit if req.time_limit is not None else tier.default_time_limit
        return Checked(state, lease, time_limit, workdir)

    def dry_run(self, req: SubmitRequest, who: Principal) -> tuple[Verdict, JobState, float]:
        """What the engine would decide for this submission now, on the live snapshot: it is
        checked as `submit` checks it, planned as the next pass would plan it, and nothing is
        stored, signalled or started. The job gets the id the store would give it next. A
        dry run that passes the checks takes one of the user's submission tokens (`_check_rate`):
        planning costs what a submission's pass does, so a user's dry runs and submissions share
        one rate."""
        checked = self._check_submission(req, who, dry_run=True)
        self._check_rate(who, self.ctx.policy.limits, dry_run=True)
        # One dry run at a time, planned outside the loop's lock: a storm of them costs the
        # API's callers, not the reconcile loop.
        with self._dry_runs:
            with self.ctx.reconciler.lock:
                now = self.ctx.now()
                job_id, submit_at = self.ctx.store.next_submission(now)
                snapshot = self.ctx.reconciler.snapshots.live(now)
            job = Job(
                id=str(job_id),
                queue=req.queue,
                tier=req.tier,
                submit=submit_at,
                state=checked.state,
                replicas=req.replicas,
                gpus=req.gpus,
                cpu=req.cpu,
                memory=req.memory,
                flavor=req.flavor,
                placement=req.placement,
                user=who.user,
                lease=checked.lease_s,
                grace=req.grace,
                time_limit=checked.time_limit_s,
            )
            return what_if(snapshot, job, now, self.forecasts.passes), checked.state, now

    def _replay(self, key: str, earlier: EarlierSubmission, digest: str | None) -> Submitted:
        if earlier.request_digest != digest:
            raise ApiError(
                409,
                "Idempotency-Key",
                key,
                f"was used for a different request (job {earlier.job_id}); use a new key for a new job",
            )
        return Submitted(earlier.job_id, JobState(earlier.first_state), replayed=True)

    def _check_shape(self, req: SubmitRequest) -> None:
        """A job the cluster could never hold is refused now, not left pending forever."""
        nodes = [n for n in self.ctx.nodes if req.flavor is None or n.flavor == req.flavor]
        if req.flavor is not None and not nodes:
            flavors = sorted({n.flavor for n in self.ctx.nodes})
            raise ApiError(422, "flavor", req.flavor, f"no node has this GPU flavor; allowed: {', '.join(flavors)}")
        total = sum(n.gpus for n in nodes)
        if req.gpus * req.replicas > total:
            raise ApiError(
                422, "gpus", req.gpus * req.replicas, f"replicas × gpus is more GPUs than the cluster has ({total})"
            )
        largest = max((n.gpus for n in nodes), default=0)
        if req.gpus > largest:
            raise ApiError(
                422, "gpus", req.gpus, f"more GPUs per replica than any node has (the largest has {largest})"
            )
        for field, asked, unit in (("cpu", req.cpu, "millicores"), ("memory", req.memory, "MiB")):
            sizes = [getattr(n, field) for n in nodes]
            if asked and sizes and all(sizes) and asked > max(sizes):
                raise ApiError(
                    422, field, asked, f"more {unit} per replica than any node has (the largest has {max(sizes)})"
                )


_RUNNERS = re.compile(
    r"(python|pypy)[0-9.]*|bash|sh|dash|zsh|perl|ruby|node|Rscript|julia|torchrun|deepspeed|accelerate|srun|mpirun"
)
"""Programs that run another one named after them (an interpreter, a launcher): a job is named
after what they run."""


def default_name(command: list[str], most: int) -> str:
    """The name of a job submitted without one, as Slurm names a job after its script: the
    program, the last part of the command's first word; where that program runs another (an
    interpreter or a launcher, `_RUNNERS`, also behind `env`), the script it runs (`train.py`
    for `/usr/bin/python3 -u train.py`) or the module (`pkg.train` for `python3 -m pkg.train`).
    Cut to `most` characters (the policy's `limits.max_name_chars`)."""
    name, rest = _program(command[0]), command[1:]
    if name == "env":  # env [-i] [NAME=VALUE]... PROGRAM [ARG]...
        skip = 0
        while skip < len(rest) and (rest[skip].startswith("-") or "=" in rest[skip]):
            skip += 1
        if skip < len(rest):
            name, rest = _program(rest[skip]), rest[skip + 1 :]
    if _RUNNERS.fullmatch(name):
        name = _run_by(rest) or name
    return name[:most]


def _program(word: str) -> str:
    """The last part of a path (`python3` for `/usr/bin/python3`); the word itself for `/`."""
    return word.rstrip("/").rsplit("/", 1)[-1] or word


def _run_by(args: list[str]) -> str | None:
    """What an interpreter or launcher given `args` runs: the module after `-m`, else the first
    argument that is a path to a file (a dot or a slash in it, not an option: option values
    such as `--nproc_per_node 8` are passed over); None for inline code (`-c`, `-e`) or none."""
    for i, word in enumerate(args):
        if word in ("-c", "-e"):
            return None
        if word == "-m":
            return args[i + 1] if i + 1 < len(args) else None
        if not word.startswith("-") and ("." in word or "/" in word):
            return _program(word)
    return None


def _check_limits(req: SubmitRequest, limits: Limits) -> None:
    """The policy's `limits` on the sizes of a submission, each refusal naming its limit."""
    if len(req.name) > limits.max_name_chars:
        _too_big("name", req.name, f"{limits.max_name_chars} characters", "max_name_chars")
    if len(req.command) > limits.max_command_args:
        _too_big("command", len(req.command), f"{limits.max_command_args} words", "max_command_args")
    command_bytes = sum(len(w.encode()) for w in req.command)
    if command_bytes > limits.max_command_bytes:
        _too_big("command", command_bytes, f"{limits.max_command_bytes} bytes", "max_command_bytes")
    if len(req.env) > limits.max_env_vars:
        _too_big("env", len(req.env), f"{limits.max_env_vars} variables", "max_env_vars")
    env_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in req.env.items())
    if env_bytes > limits.max_env_bytes:
        _too_big("env", env_bytes, f"{limits.max_env_bytes} bytes", "max_env_bytes")
    if req.workdir is not None and len(req.workdir) > limits.max_path_chars:
        _too_big("workdir", req.workdir, f"{limits.max_path_chars} characters", "max_path_chars")
    if req.replicas > limits.max_replicas:
        _too_big("replicas", req.replicas, f"{limits.max_replicas} replicas", "max_replicas")


def _too_big(field: str, value: Any, limit: str, setting: str) -> None:
    raise ApiError(422, field, value, f"is above the limit of {limit} (the policy's limits.{setting})")


def _check_durations(req: SubmitRequest, policy: Policy) -> None:
    """Grace, lease and time limit within the policy's bounds (the time limit within its tier's
    maximum too): every timer stays finite."""
    if req.grace is not None and req.grace < policy.min_grace:
        _out_of_bounds(
            "grace", req.grace, f"is below the policy's minimum grace of {format_duration(policy.min_grace)}"
        )
    if req.grace is not None and req.grace > policy.max_grace:
        _out_of_bounds(
            "grace",
            req.grace,
            f"is above the policy's maximum grace of {format_duration(policy.max_grace)} (max_grace)",
        )
    if req.lease is not None and req.lease > policy.max_lease:
        _out_of_bounds(
            "lease", req.lease, f"is above the policy's maximum lease of {format_duration(policy.max_lease)}"
        )
    if req.time_limit is not None and req.time_limit <= 0:
        raise ApiError(422, "time_limit", req.time_limit, "is no time limit: give one above 0s, or leave it out")
    tier_max = policy.tier(req.tier).max_time_limit
    if req.time_limit is not None and tier_max is not None and req.time_limit > tier_max:
        _out_of_bounds(
            "time_limit",
            req.time_limit,
            f"is above tier {req.tier}'s maximum of {format_duration(tier_max)} (the policy's tiers.{req.tier}.max_time_limit)",
        )
    limit = policy.limits.max_time_limit
    if req.time_limit is not None and req.time_limit > limit:
        _out_of_bounds(
            "time_limit",
            req.time_limit,
            f"is above the limit of {format_duration(limit)} (the policy's limits.max_time_limit)",
        )


def _out_of_bounds(field: str, seconds: float, message: str) -> None:
    """A duration the policy does not allow, shown as the policy writes durations (422)."""
    raise ApiError(422, field, format_duration(seconds), message)


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):  # a name too long for the file system is no directory either
        return False


def _request_digest(req: SubmitRequest) -> str:
    """What makes two submissions the same request, for Idempotency-Key."""
    canonical = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _too_many_waiting(err: TooManyWaiting) -> ApiError:
    """At most `limits.max_pending_per_user` waiting jobs per user (admins are exempt) and
    `limits.max_pending_per_queue` per queue (admins' jobs too), counted by the database in
    the transaction that would store the job (`WaitingLimits`), whichever server takes it."""
    setting = "max_pending_per_user" if err.field == "user" else "max_pending_per_queue"
    return ApiError(
        429,
        err.field,
        err.value,
        f"has {err.waiting} jobs waiting, the limit of {err.limit} (the policy's limits.{setting}); "
        "submit more once some have started or been cancelled",
    )


def _too_much_stored(err: TooMuchStored) -> ApiError:
    """At most `limits.max_stored_bytes_per_user` bytes of command, env and workdir kept
    per user (admins are exempt): warden keeps every job, so what one user writes is what
    it must bound. A finished job's are dropped, oldest first, to make room; the refusal
    comes only where the unfinished jobs keep too much. Counted in the transaction that
    would store the job, under the submission lock, as the waiting limits are."""
    return ApiError(
        422,
        "user",
        err.user,
        f"keeps {err.kept} bytes of commands, envs and workdirs in unfinished jobs; this job's "
        f"{err.adding} more would pass the limit of {err.limit} bytes (the policy's "
        "limits.max_stored_bytes_per_user); submit it once some have finished",
    )
