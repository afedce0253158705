"""The SDK's reporter against a real recording HTTP endpoint: no-ops outside warden, rank 0
only, synchronous checkpoint reports, rate-limited background progress, never raising."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from reportsink import TOKEN, ReportSink, env_for, free_port, sink  # noqa: F401 (sink: a fixture)

from warden.workload.report import PROCESS_STARTED_AT, Reporter, process_started_at


@pytest.mark.parametrize("env", [{}, {"WARDEN_JOB_ID": "j1"}, {"WARDEN_URL": "http://x"}])
def test_outside_warden_every_method_is_a_noop(env: dict[str, str]) -> None:
    r = Reporter.from_env(env)
    assert not r.enabled
    assert r.startup_finished() is None
    r.progress(1, samples=10)
    r.checkpoint_started()
    r.checkpoint_finished(1.0, 10, True)
    assert r.flush(0) is True
    assert (r.sent, r.failed) == (0, 0)


def test_disabled_progress_costs_nothing_measurable() -> None:
    r = Reporter.from_env({})
    n = 200_000
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for i in range(n):
            r.progress(i)
        runs.append((time.perf_counter() - t) / n)
    assert statistics.median(runs) < 1e-6, runs  # ~0.1 µs: one call and one attribute test


def test_only_rank_zero_reports(sink: ReportSink) -> None:
    assert not Reporter.from_env({**env_for(sink), "RANK": "1"}).enabled
    assert Reporter.from_env({**env_for(sink), "RANK": "0"}).enabled


# -- the protocol --------------------------------------------------------------------------------


def test_startup_is_posted_with_token_attempt_and_time(sink: ReportSink) -> None:
    r = Reporter.from_env(env_for(sink, job="team/j 42"), started_at=time.time() - 2.0)
    before = time.time()
    startup = r.startup_finished()
    # Synchronous: recorded by the time the call returns.
    (got,) = sink.reports
    assert got.path == "/v1/jobs/team%2Fj%2042/reports"
    assert got.authorization == f"Bearer {TOKEN}"
    assert got.body["kind"] == "startup" and got.body["attempt"] == 3
    assert before <= got.body["at"] <= time.time()
    assert got.body["startup_s"] == pytest.approx(startup)
    assert 2.0 <= got.body["startup_s"] < 3.0
    assert r.sent == 1


def test_default_startup_reference_is_the_process_start() -> None:
    # Taken at import from /proc: not after "now", and not after this module's import.
    assert PROCESS_STARTED_AT <= process_started_at() + 0.02 <= time.time() + 0.02


def test_checkpoint_reports_are_synchronous_and_complete(sink: ReportSink) -> None:
    r = Reporter.from_env(env_for(sink))
    r.checkpoint_started()
    assert sink.kinds() == ["checkpoint_started"]
    r.checkpoint_finished(1.5, 1234, on_sigterm=True)
    body = sink.of("checkpoint_finished")[0]
    assert body == {
        "attempt": 3,
        "kind": "checkpoint_finished",
        "at": body["at"],
        "duration_s": 1.5,
        "size_bytes": 1234,
        "on_sigterm": True,
    }
    assert isinstance(body["at"], float)
    # The step the checkpoint holds, when the caller knows it (CheckpointStore always does).
    r.checkpoint_started(step=40)
    r.checkpoint_finished(0.5, 10, on_sigterm=False, step=40)
    assert [b.get("step") for b in sink.of("checkpoint_started")] == [None, 40]
    assert sink.of("checkpoint_finished")[1]["step"] == 40


def test_progress_is_rate_limited_and_sent_in_the_background(sink: ReportSink) -> None:
    r = Reporter.from_env(env_for(sink), min_interval=0.5)
    for step in range(1, 1001):
        r.progress(step, samples=step * 32)
    assert r.flush(5)
    assert sink.of("progress") == [
        {"attempt": 3, "kind": "progress", "at": pytest.approx(time.time(), abs=5), "step": 1, "samples": 32}
    ]
    time.sleep(0.6)  # the interval passes: the next call goes out again
    r.progress(2000)
    assert r.flush(5)
    assert [b["step"] for b in sink.of("progress")] == [1, 2000]
    assert "samples" not in sink.of("progress")[1]


def test_progress_never_waits_on_a_slow_server(sink: ReportSink) -> None:
    sink.delay = 1.0
    r = Reporter.from_env(env_for(sink), min_interval=0.0)
    t = time.perf_counter()
    for step in range(100):
        r.progress(step)
    elapsed = time.perf_counter() - t
    assert elapsed < 0.1, elapsed  # 100 calls while one request takes a second
    assert r.flush(10)
    # The thread sends the newest pending report, not a backlog of 100.
    steps = [b["step"] for b in sink.of("progress")]
    assert len(steps) <= 3 and steps[-1] == 99, steps


def test_flush_gives_up_after_its_timeout(sink: ReportSink) -> None:
    sink.delay = 1.5
    r = Reporter.from_env(env_for(sink))
    r.progress(1)
    t = time.monotonic()
    assert r.flush(0.2) is False
    assert time.monotonic() - t < 1.0


# -- failures ------------------------------------------------------------------------------------


def test_unreachable_server_is_logged_once_and_never_raises(capfd: pytest.CaptureFixture[str]) -> None:
    r = Reporter.from_env(
        {"WARDEN_URL": f"http://127.0.0.1:{free_port()}", "WARDEN_JOB_ID": "j1", "WARDEN_REPORT_TOKEN": TOKEN}
    )
    r.startup_finished()
    r.checkpoint_started()
    r.checkpoint_finished(1.0, 1, False)
    r.progress(1)
    assert r.flush(5)
    err = capfd.readouterr().err
    assert err.count("warden.workload: could not send") == 1, err
    assert "startup" in err and TOKEN not in err
    assert (r.sent, r.failed) == (0, 4)


@pytest.mark.parametrize("status", [401, 404, 500, 503])
def test_error_status_is_a_failure_not_an_exception(
    sink: ReportSink, status: int, capfd: pytest.CaptureFixture[str]
) -> None:
    sink.status = status
    r = Reporter.from_env(env_for(sink))
    r.checkpoint_finished(1.0, 1, True)
    r.checkpoint_finished(1.0, 1, True)
    assert (r.sent, r.failed) == (0, 2)
    assert capfd.readouterr().err.count(f"HTTP {status}") == 1


def test_a_hanging_server_costs_at_most_the_timeout(sink: ReportSink) -> None:
    sink.delay = 3.0
    r = Reporter.from_env(env_for(sink), timeout=0.3)
    t = time.monotonic()
    r.checkpoint_finished(1.0, 1, True)
    assert time.monotonic() - t < 1.5
    assert r.failed == 1


def test_a_bad_url_never_raises() -> None:
    r = Reporter.from_env({"WARDEN_URL": "not a url", "WARDEN_JOB_ID": "j1"})
    r.checkpoint_started()
    assert r.failed == 1


def test_reports_ignore_http_proxy_settings(sink: ReportSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    r = Reporter.from_env(env_for(sink))
    r.checkpoint_started()
    assert r.sent == 1


def test_reporting_from_many_threads(sink: ReportSink) -> None:
    r = Reporter.from_env(env_for(sink), min_interval=3600)

    def hammer() -> None:
        for i in range(1000):
            r.progress(i)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.flush(5)
    assert len(sink.of("progress")) == 1  # one slot per interval, whoever wins it


# -- several servers -----------------------------------------------------------------------------


def several(*urls: str) -> dict[str, str]:
    return {"WARDEN_URL": ",".join(urls), "WARDEN_JOB_ID": "j7", "WARDEN_ATTEMPT": "2", "WARDEN_REPORT_TOKEN": TOKEN}


def test_a_server_that_cannot_be_reached_is_passed_over_and_the_next_kept(sink: ReportSink) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    r = Reporter.from_env(several(dead, sink.url), min_interval=0)
    assert r.url == dead
    r.startup_finished()
    r.checkpoint_finished(1.0, 1, on_sigterm=False)
    r.progress(3)
    assert r.flush(5)
    assert sink.kinds() == ["startup", "checkpoint_finished", "progress"]
    assert (r.sent, r.failed) == (3, 0) and r.url == sink.url
    assert all(x.authorization == f"Bearer {TOKEN}" and x.path == "/v1/jobs/j7/reports" for x in sink.reports)


def test_an_http_answer_of_any_status_is_not_sent_to_the_next_server(capfd: pytest.CaptureFixture[str]) -> None:
    first, second = ReportSink(), ReportSink()
    try:
        first.status = 503
        r = Reporter.from_env(several(first.url, second.url))
        r.checkpoint_started()
        r.checkpoint_finished(1.0, 1, on_sigterm=True)
        assert (r.sent, r.failed) == (0, 2) and first.kinds() == ["checkpoint_started", "checkpoint_finished"]
        assert second.reports == [] and r.url == first.url
        assert f"{first.url}: HTTP 503" in capfd.readouterr().err
    finally:
        first.close()
        second.close()


def test_a_checkpoint_whose_answer_was_lost_is_not_sent_again_elsewhere() -> None:
    """The server may have counted it: a second server would count it twice. A progress report,
    which sets rather than adds, goes on to the next server."""
    hanging, second = ReportSink(), ReportSink()
    try:
        hanging.delay = 2.0
        r = Reporter.from_env(several(hanging.url, second.url), timeout=0.3, min_interval=0)
        r.checkpoint_finished(1.0, 1, on_sigterm=True)
        assert r.failed == 1 and second.reports == []
        r.progress(9)
        assert r.flush(5)
        assert [b["step"] for b in second.of("progress")] == [9] and r.sent == 1 and r.url == second.url
        assert second.of("checkpoint_finished") == []
    finally:
        hanging.close()
        second.close()


def test_when_no_server_answers_the_message_names_each(capfd: pytest.CaptureFixture[str]) -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    r = Reporter.from_env(several(*urls))
    r.checkpoint_started()
    err = capfd.readouterr().err
    assert "cannot reach any of the 2 warden servers of WARDEN_URL" in err and all(f"{u}: " in err for u in urls)
    assert r.failed == 1 and TOKEN not in err


def test_a_bad_list_fails_every_report_naming_the_entry(capfd: pytest.CaptureFixture[str]) -> None:
    r = Reporter.from_env(several("http://a:1", ""))
    assert r.enabled
    r.checkpoint_started()
    r.progress(1)
    assert r.flush(5) and (r.sent, r.failed) == (0, 2)
    err = capfd.readouterr().err
    assert err.count("could not send") == 1 and "WARDEN_URL: entry 2 of 'http://a:1,' is empty" in err
