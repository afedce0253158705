"""This process's writers to one SQLite database take turns, and the lease's go first: a
renewal waits for the write in progress, never for the writers queued behind it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from warden.store import Store
from warden.store.db import write_turn
from warden.store.leadership import Holder, Lease


def wait_until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_an_urgent_writer_goes_before_every_queued_one() -> None:
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    turn = write_turn(engine)
    order: list[str] = []
    release = threading.Event()

    def writer(name: str, urgent: bool) -> None:
        with turn.hold(urgent=urgent):
            order.append(name)
            if name == "first":
                release.wait(10)

    first = threading.Thread(target=writer, args=("first", False))
    first.start()
    wait_until(lambda: order == ["first"])
    queued = [threading.Thread(target=writer, args=(f"queued-{i}", False)) for i in range(3)]
    for i, t in enumerate(queued):
        t.start()
        wait_until(lambda i=i: turn.waiting == i + 1)
    lease = threading.Thread(target=writer, args=("lease", True))
    lease.start()
    wait_until(lambda: turn.waiting == 4)
    release.set()
    for t in (first, lease, *queued):
        t.join(10)
    assert order[:2] == ["first", "lease"], order
    assert sorted(order[2:]) == ["queued-0", "queued-1", "queued-2"]


def test_the_store_and_the_lease_of_one_database_share_its_turns(tmp_path: Path) -> None:
    """A renewal waits for the store's write in progress (one writer at a time), then goes
    before the store's writers queued behind it."""
    store = Store.open(f"sqlite:///{tmp_path / 'warden.db'}")
    lease = Lease(store.engine, Holder.this_process("http://a"))
    try:
        assert lease.acquire() is not None
        turn = write_turn(store.engine)
        assert write_turn(lease.engine) is turn
        order: list[str] = []
        inside = threading.Event()
        release = threading.Event()

        def long_write() -> None:
            with store._write() as conn:  # a write in progress
                conn.exec_driver_sql("SELECT 1")
                inside.set()
                release.wait(10)
                order.append("long")

        def submission(i: int) -> None:
            store.audit("u", "note", f"x/{i}", {}, now=1.0)
            order.append(f"write-{i}")

        def renewal() -> None:
            assert lease.renew()
            order.append("renewal")

        threads = [threading.Thread(target=long_write)]
        threads[0].start()
        assert inside.wait(10)
        for i in range(3):
            threads.append(threading.Thread(target=submission, args=(i,)))
            threads[-1].start()
            wait_until(lambda i=i: turn.waiting == i + 1)
        threads.append(threading.Thread(target=renewal))
        threads[-1].start()
        wait_until(lambda: turn.waiting == 4)
        release.set()
        for t in threads:
            t.join(10)
        assert order[:2] == ["long", "renewal"], order
        assert len(order) == 5
    finally:
        lease.release()
        store.close()
