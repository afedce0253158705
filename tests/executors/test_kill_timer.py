"""The SIGKILL timer survives any deadline and any failed firing: a grace beyond
`threading.TIMEOUT_MAX`, a damaged deadline read back at adoption, a callback that raises.
Real processes and signals (the harness of test_local.py); waits are on conditions."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from executors.test_local import Harness, wait_until

from warden.executors.deadlines import KillTimer
from warden.executors.records import write_json_atomic

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local executor needs Linux")

HUGE = threading.TIMEOUT_MAX * 100


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def test_a_deadline_beyond_timeout_max_and_a_failing_firing_leave_the_timer_working() -> None:
    fired: list[tuple[str, int]] = []

    def fire(keys: list[tuple[str, int]]) -> None:
        if ("bad", 1) in keys:
            raise OSError("signal failed")
        fired.extend(keys)

    timer = KillTimer(fire)
    try:
        timer.arm(time.monotonic() + HUGE, ("far", 1))
        timer.arm(time.monotonic() + 0.05, ("bad", 1))
        timer.arm(time.monotonic() + 0.1, ("near", 1))
        timer.arm(math.nan, ("nan", 1))  # no time at all: due now
        wait_until(lambda: ("near", 1) in fired and ("nan", 1) in fired, what="the near deadlines")
        assert timer.alive() and ("far", 1) not in fired
        timer.arm(time.monotonic(), ("later", 1))
        wait_until(lambda: ("later", 1) in fired, what="a deadline armed after the failure")
    finally:
        timer.close()


def test_a_huge_grace_does_not_stop_sigkill_of_others_and_the_max_grace_is_kept(h: Harness) -> None:
    h.start(h.spec("forever", "ignore"))
    h.start(h.spec("deaf", "ignore"))
    h.wait_ready("forever")
    h.wait_ready("deaf")
    h.executor.terminate("forever", 1, 1e12)  # beyond threading.TIMEOUT_MAX
    deadline = h.executor.terminate("deaf", 1, 1.0)
    exit_ = h.wait_exit("deaf")
    assert exit_.exit_codes == (-9,) and exit_.killed and exit_.killed_at is not None
    assert deadline <= exit_.killed_at < deadline + 1.0
    assert not h.seen and ("forever", 1) in h.executor.running()
    h.executor.kill("forever", 1)
    assert h.wait_exit("forever").killed


@pytest.mark.parametrize("beyond", [1e300, HUGE], ids=["1e300", "now+TIMEOUT_MAX-scale"])
def test_adoption_with_a_huge_deadline_keeps_the_timer_working(h: Harness, beyond: float) -> None:
    kill_at = beyond if beyond == 1e300 else time.time() + beyond
    h.start(h.spec("far", "ignore"))
    h.start(h.spec("soon", "ignore"))
    h.wait_ready("far")
    h.wait_ready("soon")
    far, soon = h.executor.handle("far", 1), h.executor.handle("soon", 1)
    h.executor.terminate("far", 1, 3600.0)
    soon_deadline = h.executor.terminate("soon", 1, 1.0)
    h.executor.close()

    second = h.new_executor()
    second.adopt(far, kill_at=kill_at)
    second.adopt(soon, kill_at=soon_deadline)
    exit_ = h.wait_exit("soon", executor=second)
    assert exit_.killed and exit_.killed_at is not None and soon_deadline <= exit_.killed_at < soon_deadline + 1.0
    assert ("far", 1) in second.running()
    second.kill("far", 1)
    assert h.wait_exit("far", executor=second).killed


@pytest.mark.parametrize("recorded", ["soon", float("nan"), float("inf"), True])
def test_a_damaged_recorded_deadline_means_sigkill_now(h: Harness, recorded: object) -> None:
    handle = h.start(h.spec("damaged", "ignore"))
    h.wait_ready("damaged")
    h.executor.close()
    assert handle.control_path is not None
    write_json_atomic(handle.control_path, {"signalled_at": time.time(), "kill_at": recorded, "killed_at": None})

    second = h.new_executor()
    before = time.time()
    second.adopt(handle)
    exit_ = h.wait_exit("damaged", executor=second)
    assert exit_.killed and exit_.killed_at is not None and exit_.killed_at - before < 1.0


def test_sigkill_waits_for_the_wall_clock_deadline_terminate_reported(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause between the wall and the monotonic clock reads (a starved CPU) or NTP slewing
    leaves the reported deadline ahead of the monotonic one: SIGKILL still never comes before
    the deadline terminate returned."""
    import warden.executors.local as local

    real = local.deadline_pair
    monkeypatch.setattr(local, "deadline_pair", lambda grace_s: (real(grace_s)[0] + 0.3, real(grace_s)[1]))
    h.start(h.spec("slewed", "ignore"))
    h.wait_ready("slewed")
    deadline = h.executor.terminate("slewed", 1, 0.2)
    exit_ = h.wait_exit("slewed")
    assert exit_.killed and exit_.killed_at is not None
    assert deadline <= exit_.killed_at < deadline + 0.5
