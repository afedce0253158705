"""The leader's lease (`warden.store.leadership`) and the fencing of a leader's writes
(`Store.fenced`), on SQLite and on a real PostgreSQL, each contender with its own engine (its
own connections, as two servers have); and what the servers of one database share: the
`servers` table (`warden.store.servers`) and the report secret (`Store.shared_secret`).

Timing is by the database's clock and waited for with deadlines, never a fixed sleep, except
where a test shows that something does *not* happen for a while (a contender kept waiting).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import DBAPIError

from warden.engine.lifecycle import Event
from warden.engine.model import JobState
from warden.store import Store, connect, migrate
from warden.store.leadership import FENCED_IDLE_MS, LEASE, Holder, Lease, NotLeader
from warden.store.schema import AuditRow
from warden.store.servers import FORGET_S, SEEN_S, SERVERS, Roster

T0 = 1_700_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warden.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def engines(db_url: str) -> Iterator[Callable[[], Engine]]:
    """A new engine per call (one per contender), on one migrated database."""
    made: list[Engine] = []

    def new() -> Engine:
        engine = connect(db_url)
        made.append(engine)
        return engine

    migrate(new())
    try:
        yield new
    finally:
        for engine in made:
            engine.dispose()


def contender(engines: Callable[[], Engine], name: str, **kw: Any) -> Lease:
    return Lease(engines(), Holder(f"{name}:{time.monotonic_ns()}", "host-" + name, 100, None, f"http://{name}"), **kw)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_of_two_contenders_one_takes_the_lease(engines: Callable[[], Engine]) -> None:
    a, b = contender(engines, "a"), contender(engines, "b")
    assert a.acquire() == 1
    assert b.acquire() is None
    assert a.leading and a.may_act() and a.epoch == 1
    assert not b.leading and not b.may_act()
    assert b.last_seen is not None and b.last_seen.holder == a.holder.id and b.last_seen.live
    assert "pid 100 on host-a, http://a holds the lease (epoch 1" in b.last_seen.describe()
    with pytest.raises(NotLeader, match="does not lead"):
        b.check("SIGTERM job 1")


def test_contenders_starting_together_elect_one(engines: Callable[[], Engine]) -> None:
    """Eight contenders released at the same instant, each on its own connections, many
    times over: exactly one takes each round's lease."""
    leases = [contender(engines, f"c{i}") for i in range(8)]
    for round_ in range(5):
        gate = threading.Barrier(len(leases))
        won: list[int | None] = [None] * len(leases)

        def race(i: int, gate: threading.Barrier, won: list[int | None]) -> None:
            gate.wait()
            won[i] = leases[i].acquire()

        threads = [threading.Thread(target=race, args=(i, gate, won)) for i in range(len(leases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [i for i, epoch in enumerate(won) if epoch is not None]
        assert len(winners) == 1, (round_, won)
        assert won[winners[0]] == round_ + 1
        leases[winners[0]].release()


PROCESSES = 5
ROUNDS = 120


def _contend(url: str, name: str, gate: Any, told: Any) -> None:
    """One contender in a process of its own, with its own engine, for `ROUNDS` rounds, each
    step at the same instant as the others' (`gate`): try to take the lease; then, if it took
    it, renew it while the others try to take it; then give it back, or (every tenth round)
    stop leading without a word, as a killed server does."""
    engine = connect(url)
    lease = Lease(engine, Holder(f"{name}:{os.getpid()}", "host-" + name, os.getpid(), None, f"http://{name}"))
    try:
        for round_ in range(ROUNDS):
            gate.wait()
            told.put((name, lease.acquire()))
            gate.wait()
            held = lease.leading
            told.put((name, held, lease.renew() if held else lease.acquire()))
            gate.wait()
            if lease.leading:
                if round_ % 10 == 9:
                    lease.step_down()
                else:
                    lease.release()
            gate.wait()
    finally:
        engine.dispose()


def test_contenders_in_processes_of_their_own_elect_one_a_round_with_the_next_epoch(fresh_postgres_url: str) -> None:
    """Five processes contend for the lease at the same instant, 120 times over on PostgreSQL:
    each round exactly one takes it, with the next epoch (each epoch has one holder), the row
    names it, and it renews while the others, trying at that instant, are refused. Between
    rounds it gives the lease back, or every tenth round is gone without a word and its lease
    runs out (set in the past here rather than waited for)."""
    migrate(connect(fresh_postgres_url))
    fork = multiprocessing.get_context("fork")
    gate = fork.Barrier(PROCESSES + 1, timeout=60)
    told: Any = fork.Queue()
    procs = [fork.Process(target=_contend, args=(fresh_postgres_url, f"c{i}", gate, told)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    engine = connect(fresh_postgres_url)
    holders: dict[int, str] = {}
    try:
        for round_ in range(ROUNDS):
            gate.wait()
            took = [told.get(timeout=60) for _ in procs]
            [(name, epoch)] = [(name, epoch) for name, epoch in took if epoch is not None] or [(None, None)]
            assert name is not None and epoch == round_ + 1, (round_, took)
            assert holders.setdefault(epoch, name) == name
            with engine.connect() as conn:
                row = conn.execute(select(LEASE.c.holder, LEASE.c.epoch)).one()
            assert row.holder.startswith(f"{name}:") and row.epoch == epoch, (round_, row)
            gate.wait()
            kept = sorted(told.get(timeout=60) for _ in procs)
            assert [(who, result) for who, held, result in kept if held] == [(name, True)], (round_, kept)
            assert all(result is None for _, held, result in kept if not held), (round_, kept)
            gate.wait()
            gate.wait()
            if round_ % 10 == 9:  # its holder is gone: the lease runs out
                with engine.begin() as conn:
                    conn.execute(update(LEASE).where(LEASE.c.epoch == epoch).values(expires_at=0.0))
        assert sorted(holders) == list(range(1, ROUNDS + 1))
    except BaseException:
        gate.abort()  # the contenders stop (never after the last round: one still waking would see it broken)
        raise
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        engine.dispose()
    assert [p.exitcode for p in procs] == [0] * PROCESSES


def test_an_expired_lease_is_taken_with_the_next_epoch_and_the_old_holders_renew_fails(
    engines: Callable[[], Engine],
) -> None:
    # a's clock stands still: it cannot tell by itself that its lease ran out (a clock slower
    # than the database's), so only the database tells it.
    a = contender(engines, "a", lease_s=0.4, margin_s=0.1, clock=lambda: 0.0)
    b = contender(engines, "b")
    assert a.acquire() == 1
    assert b.acquire() is None
    assert wait_for(b.acquire, 10, "the lease to run out and b to take it") == 2
    assert b.read().holder == b.holder.id and b.read().epoch == 2
    assert a.leading  # it does not know yet ...
    assert not a.renew()  # ... until it tries to renew
    assert not a.leading and not a.may_act()
    assert b.renew() and b.read().holder == b.holder.id


def test_a_term_ends_by_itself_when_its_lease_runs_out_by_the_holders_clock(engines: Callable[[], Engine]) -> None:
    """Nobody renews: the lease's steward ends the term at the end of its local validity,
    before any contender may take it, and says why; the next renewal then fails."""
    a, b = contender(engines, "a", lease_s=0.6, margin_s=0.2), contender(engines, "b")
    assert a.acquire() == 1
    taken = time.monotonic()
    wait_for(lambda: not a.leading, 5, "a's term to lapse")
    lapsed_after = time.monotonic() - taken
    assert 0.3 <= lapsed_after < 0.6, lapsed_after  # its validity is lease_s - margin_s = 0.4 s
    assert a.lapsed is not None and "epoch 1 ran out" in a.lapsed
    assert not a.may_act() and not a.may_act_in(1)
    assert not a.renew()
    assert wait_for(b.acquire, 10, "b to take the lease") == 2


def test_a_renewed_lease_is_kept_past_its_first_term(engines: Callable[[], Engine]) -> None:
    a, b = contender(engines, "a", lease_s=2.0, margin_s=0.1), contender(engines, "b")
    assert a.acquire() == 1
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        assert a.renew()
        assert b.acquire() is None
        time.sleep(0.1)
    assert a.may_act() and a.read().epoch == 1


def test_every_change_of_holder_raises_the_epoch(engines: Callable[[], Engine]) -> None:
    a, b = contender(engines, "a"), contender(engines, "b")
    epochs = []
    for lease in (a, b, a, a, b):
        epoch = lease.acquire()
        assert epoch is not None
        epochs.append(epoch)
        lease.release()
        assert not lease.leading
    assert epochs == [1, 2, 3, 4, 5]


def test_release_hands_the_lease_over_at_once(engines: Callable[[], Engine]) -> None:
    a, b = contender(engines, "a", lease_s=3600.0), contender(engines, "b")
    assert a.acquire() == 1
    assert b.acquire() is None
    a.release()
    assert b.acquire() == 2
    a.release()  # not its epoch any more: changes nothing
    assert b.read().live and b.read().holder == b.holder.id


def test_a_holder_known_dead_is_taken_over_before_its_lease_runs_out(engines: Callable[[], Engine]) -> None:
    a, b, c = contender(engines, "a", lease_s=3600.0), contender(engines, "b"), contender(engines, "c")
    assert a.acquire() == 1
    assert b.acquire(take_from="someone else") is None
    assert b.acquire(take_from=a.holder.id) == 2
    assert c.acquire(take_from=a.holder.id) is None  # b holds it now, not a


def test_acting_stops_by_the_holders_own_clock_and_expiry_is_the_databases(engines: Callable[[], Engine]) -> None:
    """The holder stops acting outside the database `lease_s − margin_s` after it sent its last
    renewal, by its own clock; whether the lease ran out is the database's call alone, whatever
    a contender's clock says."""
    clock = FakeClock()
    a = contender(engines, "a", lease_s=30.0, margin_s=5.0, clock=clock)
    far_ahead = FakeClock()
    far_ahead.now = 1e12
    b = contender(engines, "b", clock=far_ahead)
    assert a.acquire() == 1
    clock.now += 24.9
    assert a.may_act()
    assert a.renew() and a.may_act()  # 25 s more from this renewal
    clock.now += 24.9
    assert a.may_act()
    clock.now += 0.1
    assert not a.may_act()
    with pytest.raises(NotLeader, match=r"ran out 5s ago|does not lead"):
        a.check("SIGKILL job 3")
    wait_for(lambda: not a.leading, 5, "the lease's steward to end the term")  # by a's clock alone
    assert a.lapsed is not None and "by this server's clock" in a.lapsed
    assert b.acquire() is None  # the database says a's lease lasts: b's clock does not count
    assert not a.renew()  # the term ended; a contends again once its lease is given back
    a.give_back(1)
    assert a.acquire() == 2 and a.may_act()


# -- fencing: a leader's writes -----------------------------------------------------------------


def submitted(store: Store) -> int:
    return store.submit(name="x", user="ana", queue="q", tier=3, command=["true"], actor="ana", now=T0)


def test_a_leaders_writes_go_through_while_it_leads(engines: Callable[[], Engine]) -> None:
    a = contender(engines, "a")
    users, leader = Store(engines()), None
    assert a.acquire() == 1
    leader = users.fenced(a)
    job = submitted(users)
    assert leader.transition(
        job, JobState.CANCELLED, event=Event.CANCELLED, reason="x", actor="warden", now=T0, expect_state="PENDING"
    )
    assert leader.get(job) is not None and leader.get(job).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_a_replaced_leader_commits_no_write(engines: Callable[[], Engine]) -> None:
    """Once another server took the lease, every write of the old leader's store raises
    `NotLeader` and changes nothing, while users' writes (the unfenced store) go on."""
    # a's clock stands still (slower than the database's): it cannot notice by itself.
    a = contender(engines, "a", lease_s=0.4, margin_s=0.1, clock=lambda: 0.0)
    b = contender(engines, "b")
    users = Store(engines())
    assert a.acquire() == 1
    leader = Store(engines()).fenced(a)
    job = submitted(users)
    wait_for(b.acquire, 10, "b to take the lease")
    assert a.leading  # a has not noticed: only the database can tell it
    writes: list[Callable[[], object]] = [
        lambda: leader.transition(job, JobState.ADMITTED, event=Event.ADMITTED, reason="x", actor="warden", now=T0),
        lambda: leader.update(job, claim=True),
        lambda: leader.set_explanations({job: {"reason": {"code": "X"}}}),
        lambda: leader.audit("warden", "x", "job/1", {}, T0),
        lambda: leader.save_ledger(T0, {"q": 1.0}),
    ]
    for write in writes:
        with pytest.raises(NotLeader, match="epoch 2"):
            write()
    stored = users.get(job)
    assert stored is not None and stored.state is JobState.PENDING and not stored.claim and stored.version == 1
    assert users.audit_log() == () and users.load_ledger().usage == {}
    assert users.update(job, claim=True)  # a user's write is not fenced
    b_store = Store(engines()).fenced(b)
    assert b_store.update(job, claim=False)


def test_a_store_that_never_led_writes_nothing(engines: Callable[[], Engine]) -> None:
    a = contender(engines, "a")
    with pytest.raises(NotLeader, match="does not lead"):
        Store(engines()).fenced(a).audit("warden", "x", "job/1", {}, T0)


def test_a_takeover_waits_for_the_old_leaders_write_in_flight(engines: Callable[[], Engine]) -> None:
    """A write transaction the leader opened before its lease ran out holds the lease row:
    the contender's takeover waits until it commits, and the write lands *before* the new
    epoch, never after it."""
    a, b = contender(engines, "a", lease_s=0.4, margin_s=0.1), contender(engines, "b")
    leader = Store(engines()).fenced(a)  # made before the lease is taken: its term is short
    users = Store(engines())
    assert a.acquire() == 1
    took: list[int | None] = []
    with leader._write() as conn:
        wait_for(lambda: not b.read().live, 10, "a's lease to run out")
        contending = threading.Thread(target=lambda: took.append(wait_for(b.acquire, 30, "b to take over")))
        contending.start()
        contending.join(1.0)
        assert contending.is_alive(), "the takeover did not wait for the leader's write in flight"
        conn.execute(AuditRow.__table__.insert().values(at=T0, actor="warden", action="x", target="t", details={}))
    contending.join(30)
    assert took == [2]
    assert [e.action for e in users.audit_log()] == ["x"]
    with pytest.raises(NotLeader):
        leader.audit("warden", "y", "t", {}, T0)


def test_a_leader_stopped_inside_a_write_does_not_block_the_takeover(
    db_url: str, engines: Callable[[], Engine]
) -> None:
    """PostgreSQL ends a fenced transaction left idle (its process stopped, SIGSTOP) after
    `FENCED_IDLE_MS`, so the contender takes over; what that transaction wrote is lost."""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite is one server's: no contender on another connection to keep waiting")
    a, b = contender(engines, "a", lease_s=0.4, margin_s=0.1), contender(engines, "b")
    leader = Store(engines()).fenced(a)  # made before the lease is taken: its term is short
    users = Store(engines())
    assert a.acquire() == 1
    started = time.monotonic()
    with pytest.raises(DBAPIError), leader._write() as conn:
        conn.execute(AuditRow.__table__.insert().values(at=T0, actor="warden", action="x", target="t", details={}))
        # stays idle in its transaction, as a stopped process would
        assert wait_for(b.acquire, 30, "b to take over from an idle transaction") == 2
    assert time.monotonic() - started >= FENCED_IDLE_MS / 1000 - 0.1
    assert users.audit_log() == ()
    with users.engine.connect() as conn:
        assert conn.execute(select(LEASE.c.holder)).scalar_one() == b.holder.id


# -- what the servers of one database share: the servers table and the report secret ------------


def roster(engines: Callable[[], Engine], name: str, url: str | None = None, **kw: Any) -> Roster:
    return Roster(
        engines(), Holder(f"{name}:{time.monotonic_ns()}", "host-" + name, 100, None, url or f"http://{name}"), **kw
    )


def age(engine: Engine, url: str, seconds: float) -> None:
    """Make `url`'s row look refreshed `seconds` earlier than it was."""
    with engine.begin() as conn:
        conn.execute(update(SERVERS).where(SERVERS.c.url == url).values(seen_at=SERVERS.c.seen_at - seconds))


def test_each_server_keeps_a_row_and_reads_the_servers_seen_lately(engines: Callable[[], Engine]) -> None:
    a, b = roster(engines, "a"), roster(engines, "b")
    assert a.beat() == ("http://a",)
    assert b.beat() == ("http://a", "http://b")
    assert a.beat() == ("http://a", "http://b")
    engine = engines()
    age(engine, "http://b", SEEN_S + 1)  # b stopped refreshing its row (killed, stalled)
    assert a.beat() == ("http://a",)
    assert b.beat() == ("http://a", "http://b")  # back
    b.leave()
    assert a.beat() == ("http://a",)
    with engine.connect() as conn:
        assert conn.execute(select(SERVERS.c.url)).scalars().all() == ["http://a"]


def test_a_server_restarted_at_its_url_takes_its_row_over(engines: Callable[[], Engine]) -> None:
    old = roster(engines, "old", "http://head:8765")
    assert old.beat() == ("http://head:8765",)
    new = roster(engines, "new", "http://head:8765")
    assert new.beat() == ("http://head:8765",)
    old.leave()  # the old run's leaving does not remove the new run's row
    engine = engines()
    with engine.connect() as conn:
        assert conn.execute(select(SERVERS.c.holder)).scalars().all() == [new.holder.id]


def test_rows_not_seen_for_a_day_are_forgotten(engines: Callable[[], Engine]) -> None:
    gone = roster(engines, "gone")
    gone.beat()
    engine = engines()
    age(engine, "http://gone", FORGET_S + 60)
    assert roster(engines, "late").beat() == ("http://late",)
    with engine.connect() as conn:
        assert conn.execute(select(SERVERS.c.url)).scalars().all() == ["http://late"]


def test_the_first_servers_report_secret_is_every_servers(engines: Callable[[], Engine]) -> None:
    """The report key is in the database: the first server stores its candidate (an older
    server's key from its state directory, else a random one), every other reads it."""
    first, second = Store(engines()), Store(engines())
    assert first.shared_secret("report_secret", b"\x01" * 32) == b"\x01" * 32
    assert second.shared_secret("report_secret", b"\x02" * 32) == b"\x01" * 32
    assert first.shared_secret("other", b"\x03" * 32) == b"\x03" * 32


def test_servers_starting_at_once_store_one_report_secret(engines: Callable[[], Engine]) -> None:
    stores = [Store(engines()) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    got: list[bytes] = []

    def start(store: Store, n: int) -> None:
        barrier.wait()
        got.append(store.shared_secret("report_secret", bytes([n]) * 32))

    threads = [threading.Thread(target=start, args=(s, n)) for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 4 and len(set(got)) == 1


class RecordingWatch:
    """What a lease told its watch, in order (the watchdog process itself: tests/server/test_watchdog.py)."""

    def __init__(self) -> None:
        self.said: list[tuple[str, float | None]] = []

    def arm(self, until: float) -> None:
        self.said.append(("arm", until))

    def disarm(self) -> None:
        self.said.append(("disarm", None))

    def close(self) -> None:
        self.said.append(("close", None))


def test_the_watch_is_armed_with_each_terms_validity_and_disarmed_when_it_ends(engines: Callable[[], Engine]) -> None:
    """A taken lease arms the watch with its local validity before `acquire` returns (before
    anything of the term can act), each renewal moves it later, a step-down or a lapse disarms
    it, and a try that takes nothing tells it nothing."""
    watch = RecordingWatch()
    a = contender(engines, "a", lease_s=0.8, margin_s=0.2, watch=watch)
    b = contender(engines, "b", watch=(other := RecordingWatch()))
    assert a.acquire() == 1
    assert b.acquire() is None and other.said == []
    assert [w for w, _ in watch.said] == ["arm"]
    first = watch.said[0][1]
    assert first is not None and first > a.clock()
    time.sleep(0.05)
    assert a.renew()
    assert watch.said[-1][0] == "arm" and (watch.said[-1][1] or 0) > first
    assert a.step_down() == 1
    assert watch.said[-1] == ("disarm", None)
    a.give_back(1)
    assert a.acquire() == 2
    wait_for(lambda: not a.leading, 5, "the term of epoch 2 to lapse")
    assert watch.said[-2][0] == "arm" and watch.said[-1] == ("disarm", None)
    assert a.lapsed is not None and "epoch 2" in a.lapsed
