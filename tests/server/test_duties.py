"""Each duty of the server built alone, on a real store, with no server process and no HTTP: the
service's collaborators (submissions, job actions, SDK reports, governance) on a
`ServiceContext`, and duties of the reconcile loop (time limits, cancels, snapshots) on a
`ReconcileContext`.

Every store is a real SQLite database at the schema's head (`serverproc.seed_database`: the
template migrated once per session, as a server migrates at its first start), and every clock is
one the test sets. The only executor is the real local one, which tracks no attempt here: a duty
that would signal one finds it untracked, as a server does before it adopts its attempts. Each
test asserts on what is stored and on the refusal's field, value and message.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from serverproc import seed_database
from support import move

from warden.engine.lifecycle import Event
from warden.engine.model import JobState, Node, ReplicaPlacement
from warden.engine.policy import Policy, parse_policy
from warden.executors.base import Handle
from warden.executors.local import LocalExecutor
from warden.server.actions import JobActions
from warden.server.auth import Principal
from warden.server.authenticator import Authenticator
from warden.server.cancels import Cancels
from warden.server.charging import Charging
from warden.server.context import ReconcileContext
from warden.server.engineguard import EngineGuard
from warden.server.errors import ApiError
from warden.server.forecasts import Forecasts
from warden.server.governance import Governance
from warden.server.metrics import ServerMetrics
from warden.server.peers import Peers
from warden.server.reconcile import Reconciler
from warden.server.reports import Reports
from warden.server.requests import ReportRequest, SubmitRequest, TokenRequest
from warden.server.serving import ServiceContext
from warden.server.snapshots import Snapshots
from warden.server.submissions import Submissions
from warden.server.timelimits import TimeLimits
from warden.store.jobs import StoredAttempt, StoredJob
from warden.store.repo import Store

T0 = 1_700_000_000.0
POLICY = {
    "queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "other"}]},
    "tiers": {3: {"name": "experimentation", "lease": "0s"}},
}
NODES = (Node("node-0", 4, 16_000, 64_000),)
ANA = Principal("ana", "user", ("team",))
BO = Principal("bo", "user", ("team",))
ROOT = Principal("root", "admin", ("*",))


class Clock:
    """The time every duty reads: it moves only when a test moves it."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class World:
    """What every duty is built on: a migrated store, a set clock, a state directory, the
    policy and nodes, and the local executor (tracking nothing)."""

    store: Store
    clock: Clock
    state_dir: Path
    policy: Policy
    executor: LocalExecutor

    def service(self) -> ServiceContext:
        """A `ServiceContext` leading alone (no lease), its reconciler built but never run."""
        lock = threading.RLock()
        server = _Server(self)
        metrics = ServerMetrics(server)
        server.reconciler = Reconciler(
            self.store, self.executor, NODES, self.policy, self.state_dir, self.clock, lock=lock, metrics=metrics
        )
        return ServiceContext(self.store, self.clock, self.state_dir, "", None, lock, metrics, server.reconciler)

    def loop(self) -> ReconcileContext:
        """The context the reconcile loop's duties share, without the loop."""
        return ReconcileContext(self.store, self.executor, self.policy, NODES, self.state_dir, self.clock)

    def submit(self, user: str = "ana", queue: str = "team", **fields: Any) -> int:
        """A job stored as a submission that passed its checks would be."""
        return self.store.submit(
            name="train",
            user=user,
            queue=queue,
            tier=3,
            command=["true"],
            workdir=str(self.state_dir),
            actor=user,
            now=self.clock.t,
            **fields,
        )

    def run(self, job_id: int, started_at: float) -> StoredAttempt:
        """Attempt 1 of `job_id` RUNNING since `started_at` on GPU 0, with the handle a launch
        records: the loop's duties take it for a running attempt."""
        self.store.start_attempt(job_id, 1, started_at, [ReplicaPlacement("node-0", (0,))])
        move(self.store, job_id, JobState.RUNNING, reason="started", actor="warden", now=started_at, attempt=1)
        self.store.update_attempt(job_id, 1, handle=Handle(str(job_id), 1, ()).to_dict())
        attempt = self.store.attempt(job_id, 1)
        assert attempt is not None and attempt.handle is not None
        return attempt

    def job(self, job_id: int) -> StoredJob:
        job = self.store.get(job_id)
        assert job is not None
        return job


class _Server:
    """What the metrics read of a server at scrape time (`warden.server.metrics.Scraped`): the
    world's store, policy, nodes and clock, and the reconciler built for it."""

    reconciler: Reconciler

    def __init__(self, world: World) -> None:
        self.store = world.store
        self.policy = world.policy
        self.nodes = NODES
        self.leading = True
        self.epoch: int | None = None
        self._clock = world.clock

    def now(self) -> float:
        return self._clock()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    db = tmp_path / "warden.db"
    seed_database(db)
    store = Store.open(f"sqlite:///{db}", upgrade=False)
    state = tmp_path / "state"
    state.mkdir()
    executor = LocalExecutor()
    yield World(store, Clock(T0), state, parse_policy(POLICY), executor)
    executor.close()
    store.close()


def _reasons(store: Store, job_id: int) -> list[str]:
    return [e.reason for e in store.events(job_id)]


# -- submissions -------------------------------------------------------------------------------


def _request(world: World, **fields: object) -> SubmitRequest:
    base: dict[str, object] = dict(queue="team", tier=3, command=["python", "train.py"], workdir=str(world.state_dir))
    base.update(fields)
    return SubmitRequest.model_validate(base)


def test_a_valid_submission_is_stored_pending_as_it_was_asked(world: World) -> None:
    ctx = world.service()
    submissions = Submissions(ctx, Forecasts(lambda: None))
    done = submissions.submit(_request(world, gpus=2, name="resnet"), ANA)
    assert done.state is JobState.PENDING and not done.replayed
    job = world.job(done.id)
    assert (job.user, job.queue, job.tier, job.gpus, job.name) == ("ana", "team", 3, 2, "resnet")
    assert tuple(job.command) == ("python", "train.py") and job.state is JobState.PENDING
    assert _reasons(world.store, done.id) == ["submitted to team at tier 3 (experimentation)"]


@pytest.mark.parametrize(
    ("fields", "field", "value", "says"),
    [
        ({"queue": "cluster"}, "queue", "cluster", "is not a leaf queue; allowed: team, other"),
        ({"gpus": 5}, "gpus", 5, "more GPUs than the cluster has (4)"),
    ],
)
def test_a_bad_field_is_refused_naming_it_and_nothing_is_stored(
    world: World, fields: dict[str, object], field: str, value: object, says: str
) -> None:
    submissions = Submissions(world.service(), Forecasts(lambda: None))
    with pytest.raises(ApiError) as refused:
        submissions.submit(_request(world, **fields), ANA)
    err = refused.value
    assert (err.status, err.field, err.value) == (422, field, value)
    assert says in err.message
    assert str(err).startswith(f"{field}: ") and repr(value) in str(err)
    assert world.store.list() == ()


def test_a_retry_with_the_same_idempotency_key_returns_the_first_job(world: World) -> None:
    submissions = Submissions(world.service(), Forecasts(lambda: None))
    first = submissions.submit(_request(world), ANA, idempotency_key="try-1")
    again = submissions.submit(_request(world), ANA, idempotency_key="try-1")
    assert again == (first.id, JobState.PENDING, True)
    assert [j.id for j in world.store.list()] == [first.id]
    with pytest.raises(ApiError) as refused:
        submissions.submit(_request(world, gpus=2), ANA, idempotency_key="try-1")
    assert (refused.value.status, refused.value.field, refused.value.value) == (409, "Idempotency-Key", "try-1")
    assert f"(job {first.id})" in refused.value.message
    assert [j.id for j in world.store.list()] == [first.id]


# -- job actions -------------------------------------------------------------------------------


def test_a_cancel_of_a_pending_job_ends_it_cancelled_and_is_audited(world: World) -> None:
    job_id = world.submit()
    world.clock.t = T0 + 5
    answered = JobActions(world.service()).cancel(str(job_id), ANA)
    job = world.job(job_id)
    assert answered.state is job.state is JobState.CANCELLED
    assert job.finished_at == T0 + 5
    last = world.store.events(job_id)[-1]
    assert (last.from_state, last.to_state, last.actor, last.at) == ("PENDING", "CANCELLED", "ana", T0 + 5)
    audit = world.store.audit_log(limit=1)[0]
    assert (audit.actor, audit.action, audit.target, audit.details["done"]) == (
        "ana",
        "cancel",
        f"job/{job_id}",
        "cancelled while PENDING, before it started",
    )


def test_a_cancel_by_another_user_is_forbidden_and_changes_nothing(world: World) -> None:
    job_id = world.submit()
    with pytest.raises(ApiError) as refused:
        JobActions(world.service()).cancel(str(job_id), BO)
    assert refused.value.status == 403 and f"cancel job {job_id} of user 'ana'" in refused.value.message
    assert world.job(job_id).state is JobState.PENDING and world.store.audit_log() == ()


def test_an_admin_approves_a_job_awaiting_approval(world: World) -> None:
    ctx = world.service()
    submitted = Submissions(ctx, Forecasts(lambda: None)).submit(_request(world, tier=2), ANA)
    assert submitted.state is JobState.AWAITING_APPROVAL
    actions = JobActions(ctx)
    with pytest.raises(ApiError) as refused:
        actions.approve(str(submitted.id), ANA)
    assert refused.value.status == 403 and world.job(submitted.id).state is JobState.AWAITING_APPROVAL
    world.clock.t = T0 + 60
    actions.approve(str(submitted.id), ROOT)
    job = world.job(submitted.id)
    assert (job.state, job.approved_by, job.approved_at) == (JobState.PENDING, "root", T0 + 60)
    with pytest.raises(ApiError) as again:
        actions.approve(str(submitted.id), ROOT)
    assert (again.value.status, again.value.message) == (409, "the job does not await approval (PENDING)")


def test_an_admin_releases_a_held_job_and_only_a_held_one(world: World) -> None:
    job_id = world.submit()
    assert world.store.flag(job_id, JobState.PENDING, Event.HELD, reason="held", now=T0, given="the engine fails on it")
    actions = JobActions(world.service())
    actions.release(str(job_id), ROOT)
    job = world.job(job_id)
    assert not job.held and job.held_reason is None and job.state is JobState.PENDING
    assert _reasons(world.store, job_id)[-1] == "released by root"
    with pytest.raises(ApiError) as refused:
        actions.release(str(job_id), ROOT)
    assert (refused.value.status, refused.value.message) == (409, "the job is not held (PENDING)")


# -- SDK reports -------------------------------------------------------------------------------


def _reports(world: World) -> Reports:
    ctx = world.service()
    return Reports(ctx, Authenticator(ctx), Peers(ctx, None))


def test_a_progress_report_with_the_attempts_token_is_stored_on_its_attempt(world: World) -> None:
    job_id = world.submit()
    world.run(job_id, T0)
    reports = _reports(world)
    world.clock.t = T0 + 30
    token = f"Bearer {reports.token(str(job_id), 1)}"
    taken = reports.take(str(job_id), token, ReportRequest(attempt=1, kind="progress", step=100, samples=6400))
    assert taken == {"id": str(job_id), "attempt": 1, "kind": "progress"}
    attempt = world.store.attempt(job_id, 1)
    assert attempt is not None
    assert (attempt.progress_step, attempt.progress_samples, attempt.progress_at) == (100, 6400, T0 + 30)


def test_a_startup_longer_than_the_attempt_ran_is_cut_and_noted(world: World) -> None:
    job_id = world.submit()
    world.run(job_id, T0)
    reports = _reports(world)
    world.clock.t = T0 + 30
    reports.take(
        str(job_id), f"Bearer {reports.token(str(job_id), 1)}", ReportRequest(attempt=1, kind="startup", startup_s=3600)
    )
    attempt = world.store.attempt(job_id, 1)
    assert attempt is not None and attempt.startup_s == 30.0
    assert _reasons(world.store, job_id)[-1] == "startup report of 1h clamped to 30s, the time the attempt has run"


def test_a_report_out_of_bounds_is_refused_and_stores_nothing(world: World) -> None:
    job_id = world.submit()
    world.run(job_id, T0)
    reports = _reports(world)
    with pytest.raises(ValidationError) as invalid:
        ReportRequest(attempt=1, kind="startup", startup_s=2e9)
    assert invalid.value.errors()[0]["loc"] == ("startup_s",)
    with pytest.raises(ApiError) as refused:  # attempt 2 does not run
        reports.take(str(job_id), f"Bearer {reports.token(str(job_id), 2)}", ReportRequest(attempt=2, kind="startup"))
    assert (refused.value.status, refused.value.field, refused.value.value) == (409, "attempt", 2)
    assert refused.value.message == f"is not a running attempt of job {job_id}"
    with pytest.raises(ApiError) as stranger:  # attempt 1's report with attempt 2's token
        reports.take(str(job_id), f"Bearer {reports.token(str(job_id), 2)}", ReportRequest(attempt=1, kind="startup"))
    assert stranger.value.status == 401
    attempt = world.store.attempt(job_id, 1)
    assert attempt is not None and attempt.startup_s is None
    assert world.store.attempt(job_id, 2) is None


# -- governance --------------------------------------------------------------------------------


def _governance(world: World) -> tuple[ServiceContext, Governance, Authenticator]:
    ctx = world.service()
    auth = Authenticator(ctx)
    return ctx, Governance(ctx, auth, token_lifetime_s=None), auth


def test_a_policy_applied_is_versioned_audited_and_in_force(world: World) -> None:
    ctx, governance, _ = _governance(world)
    wider = {
        **POLICY,
        "queues": {"name": "cluster", "children": [{"name": "team"}, {"name": "other"}, {"name": "new"}]},
    }
    source = json.dumps(wider)
    version, new = governance.apply_policy(source, ROOT)
    assert new
    current = world.store.current_policy()
    assert current is not None and (current.version, current.source) == (version, source)
    assert [q.name for q in ctx.policy.leaves()] == ["team", "other", "new"]
    assert ctx.policy_version == version
    assert world.store.audit_log(limit=1)[0].action == "policy.apply"
    assert governance.apply_policy(source, ROOT) == (version, False)


def test_a_policy_that_drops_a_queue_still_in_use_is_refused(world: World) -> None:
    ctx, governance, _ = _governance(world)
    world.submit(queue="other")
    narrower = {**POLICY, "queues": {"name": "cluster", "children": [{"name": "team"}]}}
    with pytest.raises(ApiError) as refused:
        governance.apply_policy(json.dumps(narrower), ROOT)
    assert (refused.value.status, refused.value.field, refused.value.value) == (422, "queues", "other")
    assert "unfinished jobs use this queue" in refused.value.message
    assert world.store.current_policy() is None
    assert [q.name for q in ctx.policy.leaves()] == ["team", "other"]
    with pytest.raises(ApiError) as user:
        governance.apply_policy(json.dumps(POLICY), ANA)
    assert user.value.status == 403 and world.store.current_policy() is None


def test_a_token_created_authenticates_until_it_is_revoked(world: World) -> None:
    _, governance, auth = _governance(world)
    with pytest.raises(ApiError) as user:
        governance.create_token(TokenRequest(user="bo"), ANA)
    assert user.value.status == 403 and world.store.list_tokens() == ()
    token, expires_at = governance.create_token(TokenRequest(user="bo", queues=["team"]), ROOT)
    assert expires_at is None
    assert auth.authenticate(f"Bearer {token}") == Principal("bo", "user", ("team",))
    (info,) = world.store.list_tokens()
    world.clock.t = T0 + 10
    revoked = governance.revoke_token(str(info.id), ROOT)
    assert (revoked.user, revoked.revoked_at) == ("bo", T0 + 10)
    with pytest.raises(ApiError) as refused:
        auth.authenticate(f"Bearer {token}")
    assert refused.value.status == 401
    with pytest.raises(ApiError) as again:
        governance.revoke_token(str(info.id), ROOT)
    assert (again.value.status, again.value.message) == (409, "the token is revoked already")
    assert [a.action for a in world.store.audit_log()] == ["token.revoke", "token.create"]


# -- the reconcile loop's duties ---------------------------------------------------------------


def test_an_attempt_past_its_time_limit_is_marked_and_one_within_it_is_not(world: World) -> None:
    """The local executor does not track these attempts (as before a restarted server adopts
    them): the mark is stored, and the SIGTERM is left to a pass whose executor tracks it."""
    over, within = world.submit(time_limit_s=10.0), world.submit(time_limit_s=60.0)
    world.run(over, T0)
    world.run(within, T0)
    limits = TimeLimits(world.loop(), Cancels(world.loop()))
    active = world.store.active()
    assert limits.enforce(active, T0 + 5) is active  # nothing ran out: the same jobs, not read again
    after = {a.job.id: a.attempt for a in limits.enforce(world.store.active(), T0 + 11)}
    marked, untouched = after[over], after[within]
    assert marked is not None and marked.timed_out and marked.sigterm_at is None
    assert untouched is not None and not untouched.timed_out
    stored = world.store.attempt(over, 1)
    assert stored is not None and stored.timed_out and stored.state != "terminating"


def test_an_attempt_already_terminating_is_marked_with_its_sigkill_deadline_unchanged(world: World) -> None:
    job_id = world.submit(time_limit_s=10.0)
    world.run(job_id, T0)
    world.store.update_attempt(job_id, 1, state="terminating", sigterm_at=T0 + 8, kill_at=T0 + 38)
    limits = TimeLimits(world.loop(), Cancels(world.loop()))
    limits.enforce(world.store.active(), T0 + 11)
    attempt = world.store.attempt(job_id, 1)
    assert attempt is not None and attempt.timed_out and (attempt.sigterm_at, attempt.kill_at) == (T0 + 8, T0 + 38)
    note = world.store.events(job_id)[-1]
    assert note.reason == (
        "ran out its time limit of 10s while already terminating: it ends TIMEOUT, its SIGKILL deadline unchanged"
    )
    assert note.details["time_limit_s"] == 10.0


def test_a_waiting_job_a_cancel_marked_ends_cancelled_and_leaves_the_pass(world: World) -> None:
    marked, other = world.submit(), world.submit()
    assert world.store.update(marked, cancel_requested=True)  # as an older server could leave a requeued job
    left = Cancels(world.loop()).cancel_marked(world.store.active(), T0 + 1)
    assert [a.job.id for a in left] == [other]
    job = world.job(marked)
    assert job.state is JobState.CANCELLED and job.finished_at == T0 + 1
    assert world.job(other).state is JobState.PENDING


def test_the_live_snapshot_leaves_out_held_and_cancelled_waiting_jobs_and_changes_nothing(world: World) -> None:
    plain, held, marked = world.submit(), world.submit(), world.submit()
    world.store.flag(held, JobState.PENDING, Event.HELD, reason="held", now=T0, given="the engine fails on it")
    world.store.update(marked, cancel_requested=True)  # as an older server could leave a requeued job
    ctx = world.loop()
    guard = EngineGuard(ctx)
    snapshots = Snapshots(ctx, guard, Charging(ctx))
    snapshot = snapshots.live(T0 + 1)
    assert [j.id for j in snapshot.jobs] == [str(plain)]
    assert snapshot.nodes == NODES and snapshot.policy is ctx.policy
    assert guard.engine_jobs.jobs == {}  # a reader's snapshot converts nothing the pass keeps
    taken = snapshots.take(world.store.active(), T0 + 1)  # a pass's: the cancel-marked job is the pass's to end
    assert [j.id for j in taken.jobs] == [str(plain), str(marked)]
    assert set(guard.engine_jobs.jobs) == {plain, marked}
