"""`warden status` against stand-ins for servers (tests/server/test_failover.py runs it on real
ones): each server's row, a verdict line, exit 0 only when a server leads and schedules, every
line within 80 columns, and `--json`."""

from __future__ import annotations

import json
from typing import Any

from fakeapi import fake_apis
from pg import free_port
from typer.testing import CliRunner

from warden.cli.main import app

runner = CliRunner()
LONG = "http://scheduler-head-a.gpu-cluster.research.example.internal:8765"


def health(role: str, epoch: int | None = None, leader: str | None = None, ok: bool = True) -> dict[str, Any]:
    return {
        "ok": ok,
        "passes": 0,
        "scheduling": "stopped" if not ok else "running" if role == "leader" else "standby",
        "dead_threads": [] if ok else ["warden-reconcile"],
        "role": role,
        "epoch": epoch,
        "leader": leader,
        "servers": [],
    }


def status(urls: list[str], *more: str) -> Any:
    return runner.invoke(app, ["status", "--url", ",".join(urls), *more], env={"COLUMNS": "80"})


def rows(output: str, count: int) -> list[list[str]]:
    """The table's first `count` rows, split into words."""
    return [line.split() for line in output.splitlines()[1 : 1 + count]]


def test_a_leader_and_a_standby() -> None:
    with fake_apis((200, {}), (200, {})) as (a, b):
        a.body, b.body = health("leader", 4, a.url), health("standby", None, a.url)
        done = status([a.url, b.url])
        assert done.exit_code == 0, done.output
        lines = done.output.splitlines()
        assert lines[0].split() == ["SERVER", "STATUS", "ROLE", "EPOCH", "LEADER"]
        assert lines[1].split() == [a.url, "up", "leader", "4", a.url]
        assert lines[2].split() == [b.url, "up", "standby", a.url]
        assert lines[-1] == f"leader: {a.url}, epoch 4"
        assert a.requests == b.requests == [("GET", "/v1/health")]


def test_standbys_only_none_leads() -> None:
    with fake_apis((200, health("standby")), (200, health("standby"))) as (a, b):
        done = status([a.url, b.url])
        assert done.exit_code == 1
        assert "no server leads: 2 of 2 answered and stand by" in done.output


def test_a_leader_whose_scheduling_stopped_exits_1() -> None:
    with fake_apis((503, {})) as (a,):
        a.body = health("leader", 2, a.url, ok=False)
        done = status([a.url])
        assert done.exit_code == 1
        assert rows(done.output, 1) == [[a.url, "stopped", "leader", "2", a.url]]
        flat = " ".join(done.output.split())  # lines wrapped at 80 columns
        assert f"{a.url}: scheduling stopped: helper threads died (warden-reconcile)" in flat
        assert f"the leader {a.url} (epoch 2) does not schedule" in flat


def test_a_leader_outside_the_list_named_by_a_standby() -> None:
    """The standby names a leader the list does not hold: some server leads. One the list
    holds and that does not answer does not."""
    dead = f"http://127.0.0.1:{free_port()}"
    with fake_apis((200, {})) as (b,):
        b.body = health("standby", None, LONG)
        done = status([b.url])
        assert done.exit_code == 0, done.output
        assert f"leader: {LONG}, not in the list (the standbys name it)" in " ".join(done.output.split())
        assert all(len(line) <= 80 for line in done.output.splitlines()) and "…" not in done.output, done.output
        assert LONG in done.output.replace("\n", "").replace(" ", "")  # wrapped, never cut
        b.body = health("standby", None, dead)
        done = status([dead, b.url])
        assert done.exit_code == 1 and "no server leads: 1 of 2 answered and stand by" in done.output
        assert rows(done.output, 1) == [[dead, "down"]]


def test_an_answer_that_is_no_warden_servers_and_json() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with fake_apis((404, {"detail": "Not Found"}), (200, {})) as (other, a):
        a.body = health("leader", 1, a.url)
        done = status([other.url, a.url, dead], "--json")
        assert done.exit_code == 0, done.output
        out = json.loads(done.output)
        assert (out["ok"], out["leader"], out["epoch"]) == (True, a.url, 1)
        assert [(s["url"], s["status"], s["http_status"], s["role"]) for s in out["servers"]] == [
            (other.url, "error", 404, None),
            (a.url, "up", 200, "leader"),
            (dead, "down", None, None),
        ]
        assert out["servers"][0]["error"] == "HTTP 404, not a warden server's health"
        assert "refused" in out["servers"][2]["error"].lower()


def test_nothing_answers_and_a_bad_list() -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    done = status(dead)
    assert done.exit_code == 1 and "no server leads: none of the 2 servers answered" in done.output
    assert all(f"{u}: " in done.output for u in dead)
    bad = runner.invoke(app, ["status", "--url", f"{dead[0]},,{dead[1]}"])
    assert bad.exit_code == 2 and f"--url: entry 2 of '{dead[0]},,{dead[1]}' is empty" in bad.output
