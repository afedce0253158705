"""A cancel answered 202 ends its job CANCELLED, however it races the reconcile loop.

The store (SQLite and a real PostgreSQL), the reconciler, the service and the local executor
with its job processes are real. The deterministic races use the reconciler's `phase_hook`
to put a cancel between a pass's reads and its writes, in two ways:

- *inside*: the cancel runs on the pass's own thread (the lock is re-entrant), so its writes
  land between what the pass read and what it writes: the pass's compare-and-sets must lose;
- *concurrent*: the cancel runs on another thread, started at the hook and given time to read
  the job before the pass goes on: its read must wait for the pass (the lock), not act on
  the state the pass is about to change.

The randomized stress runs the real loop thread, submitters and cancellers at once.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from serverproc import end_everything, wait_for

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.executors.local import LocalExecutor
from warden.server.auth import Principal
from warden.server.errors import ApiError
from warden.server.service import Service
from warden.store.repo import Store

POLICY = """\
min_grace: 1s
thrash: {min_efficiency: 0}
preemption: {restart_overhead: 0s, checkpoint_overhead: 0s}
tiers:
  3: {name: experimentation, lease: 0s, grace: 1s}
  4: {name: opportunistic, lease: 0s, grace: 1s, charged: false}
queues:
  name: cluster
  children:
    - {name: team}
"""
ANA = Principal("ana", "user", ("team",))
READ_WINDOW_S = 0.02
"""How long a concurrent cancel is given to read the job before the pass goes on."""


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warden.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


def make_service(db_url: str, state_dir: Path, gpus: int) -> Service:
    state_dir.mkdir(parents=True, exist_ok=True)
    store = Store.open(db_url)
    nodes = (Node("node-0", gpus, 16_000, 64_000),)
    return Service(store, LocalExecutor(), nodes, parse_policy(POLICY), state_dir)


@pytest.fixture
def service(db_url: str, tmp_path: Path) -> Iterator[Service]:
    svc = make_service(db_url, tmp_path / "state", gpus=1)
    yield svc
    end_everything(svc)
    svc.stop()
    svc.store.close()


def submit(svc: Service, tier: int = 3, command: tuple[str, ...] = ("sleep", "30"), user: str = "ana") -> int:
    return svc.store.submit(
        name="race",
        user=user,
        queue="team",
        tier=tier,
        command=list(command),
        workdir="/",
        actor=user,
        now=svc.now(),
    )


def state(svc: Service, job_id: int) -> JobState:
    job = svc.store.get(job_id)
    assert job is not None
    return job.state


def once_at(svc: Service, phase: str, action: Callable[[], None]) -> None:
    """Run `action` at the first `phase` of the coming passes (then the hook is removed)."""

    def hook(name: str) -> None:
        if name == phase:
            svc.reconciler.ctx.phase_hook = None
            action()

    svc.reconciler.ctx.phase_hook = hook


@dataclass
class Cancel:
    """One cancel through the service; `answered` says it was accepted (the API's 202)."""

    svc: Service
    job_id: int
    answered: bool = False
    refused: str | None = None
    thread: threading.Thread | None = None

    def __call__(self) -> None:
        try:
            self.svc.actions.cancel(str(self.job_id), ANA)
            self.answered = True
        except ApiError as err:
            self.refused = f"{err.status}: {err}"

    def concurrently(self) -> None:
        """On another thread, given `READ_WINDOW_S` to get as far as it can."""
        self.thread = threading.Thread(target=self)
        self.thread.start()
        self.thread.join(READ_WINDOW_S)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(10)


def passes_until(svc: Service, job_id: int, done: Callable[[JobState], bool], timeout: float = 15) -> JobState:
    """Run passes (as the loop would) until the job's state satisfies `done`."""
    deadline = time.monotonic() + timeout
    while not done(s := state(svc, job_id)):
        assert time.monotonic() < deadline, f"job {job_id} stuck in {s}"
        svc.reconciler.reconcile()
        time.sleep(0.005)
    return s


def assert_cancelled_without_rerun(svc: Service, job_id: int, attempts: int) -> None:
    """CANCELLED, with exactly `attempts` attempts, and nothing admitted after the cancel."""
    job = svc.store.get(job_id)
    assert job is not None and job.state is JobState.CANCELLED, job
    assert job.attempt == attempts, f"job {job_id} ran {job.attempt} times"
    events = svc.store.events(job_id)
    cancel_at = next(i for i, e in enumerate(events) if e.actor == "ana" and e.reason.startswith("cancel"))
    later = [e.to_state for e in events[cancel_at + 1 :]]
    assert not {"ADMITTED", "STARTING", "PENDING", "REQUEUED"} & set(later), [e.reason for e in events]
    audit = [a for a in svc.store.audit_log() if a.target == f"job/{job_id}" and a.actor == "ana"]
    assert audit and all(a.action == "cancel" and a.details["done"] for a in audit), audit


# -- deterministic races -------------------------------------------------------------------


def race_admission(svc: Service, mode: str) -> None:
    """A cancel between the pass's snapshot (the job PENDING, the plan admitting it) and the
    admission's write."""
    job = submit(svc)
    cancel = Cancel(svc, job)
    once_at(svc, "planned", cancel if mode == "inside" else cancel.concurrently)
    svc.reconciler.reconcile()
    cancel.join()
    assert cancel.answered, cancel.refused
    passes_until(svc, job, lambda s: s.terminal)
    # inside: the admission's compare-and-set lost, nothing started; concurrent: the cancel
    # found the job running and stopped it.
    assert_cancelled_without_rerun(svc, job, attempts=0 if mode == "inside" else 1)


def running_victim(svc: Service) -> tuple[int, int]:
    """A tier-4 job running on the only GPU, and a tier-3 job submitted to preempt it."""
    victim = submit(svc, tier=4)
    passes_until(svc, victim, lambda s: s is JobState.RUNNING)
    return victim, submit(svc, tier=3, command=("true",))


def race_preemption(svc: Service, mode: str) -> None:
    """A cancel between the snapshot (the plan chose the victim) and the victim's SIGTERM."""
    victim, preemptor = running_victim(svc)
    cancel = Cancel(svc, victim)
    once_at(svc, "planned", cancel if mode == "inside" else cancel.concurrently)
    svc.reconciler.reconcile()
    cancel.join()
    assert cancel.answered, cancel.refused
    passes_until(svc, victim, lambda s: s.terminal)
    assert_cancelled_without_rerun(svc, victim, attempts=1)
    passes_until(svc, preemptor, lambda s: s.terminal)


def race_requeue(svc: Service, mode: str) -> None:
    """A cancel of a preempted job whose processes exited, between the pass reading its exit
    (PREEMPTING, not cancelled) and requeueing it."""
    victim, preemptor = running_victim(svc)
    passes_until(svc, victim, lambda s: s is JobState.PREEMPTING)
    cancel = Cancel(svc, victim)
    once_at(svc, "exit", cancel if mode == "inside" else cancel.concurrently)
    passes_until(svc, victim, lambda s: s is not JobState.PREEMPTING)
    cancel.join()
    assert cancel.answered, cancel.refused
    passes_until(svc, victim, lambda s: s.terminal)
    assert_cancelled_without_rerun(svc, victim, attempts=1)
    passes_until(svc, preemptor, lambda s: s.terminal)


RACES = {"admission": race_admission, "preemption": race_preemption, "requeue": race_requeue}


@pytest.mark.parametrize("mode", ["inside", "concurrent"])
@pytest.mark.parametrize("race", sorted(RACES))
def test_cancel_wins_a_race(service: Service, race: str, mode: str) -> None:
    # Races that start no process are cheap: many of them; the others start one or two each.
    runs = 300 if (race, mode) == ("admission", "inside") else 10
    for _ in range(runs):
        RACES[race](service, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inside", "concurrent"])
def test_cancel_wins_the_admission_race_many_times(service: Service, mode: str) -> None:
    """More of `test_cancel_wins_a_race`'s admission races, which start no process: the whole
    suite runs 750 of them inside a pass and 20 concurrent ones (and 10 of each other kind)."""
    runs = 450 if mode == "inside" else 10
    for _ in range(runs):
        RACES["admission"](service, mode)


def test_a_job_marked_cancelled_while_waiting_is_never_admitted(service: Service) -> None:
    """A waiting job that carries a cancel mark (an older server requeued it) ends CANCELLED
    at the next pass instead of running."""
    job = submit(service)
    assert service.store.update(job, cancel_requested=True)
    service.reconciler.reconcile()
    assert state(service, job) is JobState.CANCELLED
    assert service.store.get(job).attempt == 0  # type: ignore[union-attr]


def awaiting(svc: Service) -> int:
    return svc.store.submit(
        name="x", user="ana", queue="team", tier=3, command=["true"], workdir="/", actor="ana",
        now=svc.now(), state=JobState.AWAITING_APPROVAL,
    )  # fmt: skip


ROOT = Principal("root", "admin", ("*",))


@pytest.mark.parametrize("action", ["approve", "release"])
@pytest.mark.parametrize("first", ["cancel", "other"])
def test_an_approval_or_release_racing_a_cancel_never_revives_the_job(
    service: Service, action: str, first: str
) -> None:
    """One action runs inside a pass, the other on another thread meanwhile: whichever comes
    second sees what the first did, and the job ends CANCELLED without running."""
    for _ in range(10):
        race_action(service, action, first)


def race_action(service: Service, action: str, first: str) -> None:
    job = awaiting(service) if action == "approve" else submit(service)
    if action == "release":
        service.store.update(job, held_reason="quarantined for the test")
    cancel = Cancel(service, job)
    other: list[str] = []

    def act() -> None:
        try:
            getattr(service.actions, action)(str(job), ROOT)
            other.append("done")
        except ApiError as err:
            other.append(str(err.status))

    def both() -> None:
        second = threading.Thread(target=act if first == "cancel" else cancel)
        second.start()
        second.join(READ_WINDOW_S)
        (cancel if first == "cancel" else act)()

    once_at(service, "planned", both)
    service.reconciler.reconcile()
    wait_for(lambda: cancel.answered or cancel.refused, 5)
    wait_for(lambda: other, 5)
    assert cancel.answered, cancel.refused
    assert other == (["409"] if first == "cancel" else ["done"])
    passes_until(service, job, lambda s: s.terminal)
    assert_cancelled_without_rerun(service, job, attempts=0)


# -- randomized stress ---------------------------------------------------------------------


@dataclass
class Stress:
    """Submitters, cancellers and a watcher at once against the running loop. Cancellers pick
    a state among those unfinished jobs are in now, then a job in it, so that cancels hit
    every state, not only the long pending queue."""

    svc: Service
    rng: random.Random
    jobs: list[int] = field(default_factory=list)
    by_state: dict[JobState, list[int]] = field(default_factory=dict)
    answered: dict[int, float] = field(default_factory=dict)
    attempts: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    COMMANDS = (("true",), ("sleep", "0.05"), ("sleep", "30"), ("sh", "-c", "trap '' TERM; sleep 0.5"))
    """Done at once, soon, not before SIGTERM, and in its own time after SIGTERM (its
    preemption lasts, and so it may be cancelled while PREEMPTING)."""

    def submitter(self, count: int) -> None:
        for i in range(count):
            # Bursts of each tier: tier-4 jobs run, then tier-3 ones preempt them.
            job = submit(self.svc, tier=4 - (i // 40) % 2, command=self.rng.choice(self.COMMANDS))
            with self.lock:
                self.jobs.append(job)
            time.sleep(self.rng.random() * 0.006)
        # The cancellers keep going until they have tried one cancel per two submissions (a
        # busy machine slows them more than the submitter), within a deadline.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with self.lock:
                if self.attempts >= count // 2:
                    break
            time.sleep(0.01)
        self.stop.set()

    def watcher(self) -> None:
        while not self.stop.is_set():
            by_state: dict[JobState, list[int]] = {}
            for a in self.svc.store.active():
                by_state.setdefault(a.job.state, []).append(a.job.id)
            with self.lock:
                self.by_state = by_state
            time.sleep(0.01)

    def canceller(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                states = sorted(self.by_state, key=lambda s: s.value)
                chosen = self.rng.choice(states) if states else None
                # Running jobs are spared most of the time, so that some live to be preempted.
                if chosen is JobState.RUNNING and self.rng.random() < 0.8:
                    chosen = None
                job = self.rng.choice(self.by_state[chosen]) if chosen is not None else None
            if job is None:
                time.sleep(0.001)
                continue
            try:
                with self.lock:
                    self.attempts += 1
                self.svc.actions.cancel(str(job), ANA)
                with self.lock:
                    self.answered.setdefault(job, time.time())
            except ApiError as err:
                assert err.status == 409, err
                with self.lock:
                    self.refused += 1
            time.sleep(self.rng.random() * 0.002)


def run_stress(svc: Service, submissions: int, seed: int) -> dict[str, Any]:
    stress = Stress(svc, random.Random(seed))
    svc.start()
    threads = [threading.Thread(target=stress.submitter, args=(submissions,))]
    threads += [threading.Thread(target=stress.watcher)]
    threads += [threading.Thread(target=stress.canceller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for job in stress.jobs:  # whatever was never cancelled may still run: end it
        if not state(svc, job).terminal:
            try:
                svc.actions.cancel(str(job), ROOT)
            except ApiError:
                pass
    wait_for(lambda: all(state(svc, j).terminal for j in stress.jobs), 60, "every job to end", 0.1)
    lost = [j for j in stress.answered if state(svc, j) is not JobState.CANCELLED]
    for job in stress.answered:
        assert_cancelled_without_rerun(svc, job, attempts=svc.store.get(job).attempt)  # type: ignore[union-attr]
    by_state: dict[str, int] = {}
    for a in svc.store.audit_log():
        if a.action == "cancel" and a.actor == "ana":
            by_state[a.details["state"]] = by_state.get(a.details["state"], 0) + 1
    return {
        "attempts": stress.attempts,
        "jobs_cancelled": len(stress.answered),
        "refused": stress.refused,
        "lost": lost,
        "by_state": by_state,
        "preemptions": svc.reconciler.stats.preempted,
    }


def test_randomized_cancels_are_never_lost(db_url: str, tmp_path: Path) -> None:
    submissions = 400
    svc = make_service(db_url, tmp_path / "state", gpus=4)
    try:
        result = run_stress(svc, submissions, seed=submissions)
    finally:
        end_everything(svc)
        svc.stop()
        svc.store.close()
    print(result)
    assert result["lost"] == []
    assert result["attempts"] >= submissions // 2
    assert {"PENDING", "RUNNING"} <= set(result["by_state"]), result
