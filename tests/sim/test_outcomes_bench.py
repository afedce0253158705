"""bench/outcomes.py: its settings, its goals, and one small run end to end on the shared
Philly trace (skipped when the shared traces are absent). No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warden.sim.records import SimAttempt, SimJob, SimRun

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"
spec = importlib.util.spec_from_file_location("outcomes", ROOT / "bench" / "outcomes.py")
assert spec is not None and spec.loader is not None
outcomes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(outcomes)


def test_a_setting_is_a_trace_and_a_positive_number_of_gpus() -> None:
    assert outcomes.parse_setting("philly/pollux_philly.csv@680") == ("philly/pollux_philly.csv", 680)
    for bad in ("philly.csv", "philly.csv@", "@16", "philly.csv@0", "philly.csv@ten"):
        with pytest.raises(ValueError, match="TRACE@GPUS"):
            outcomes.parse_setting(bad)


def row(**kw: Any) -> dict[str, Any]:
    base = {
        "breaches": 5,
        "breaches_over_twice_max_wait": 0,
        "forced_breaches": 0,
        "forced_breaches_over_twice_max_wait": 0,
        "least_delivered_over_owed": 0.99,
        "utilization": 0.9,
        "lost_share_of_delivered": 0.001,
        "preemptions": 10,
        "per_tier": {"2": {"p95_wait_s": 100.0}},
    }
    return {**base, **kw}


def test_goals_compare_with_the_baseline_and_every_peer_that_ran() -> None:
    rows = {"fifo_backfill": row(preemptions=0), "slurm": row(preemptions=20), "k8s": row(preemptions=11)}
    rows["governed"] = row()
    assert all(outcomes.goals(rows, "governed").values())
    rows["governed"] = row(
        breaches=6,
        breaches_over_twice_max_wait=1,
        least_delivered_over_owed=0.97,
        utilization=0.87,
        lost_share_of_delivered=0.006,
        preemptions=11,
        per_tier={"2": {"p95_wait_s": 101.0}},
    )
    assert not any(outcomes.goals(rows, "governed").values())
    # Breaches the tier contract forced are not held against a policy
    rows["governed"] = row(
        breaches=9, breaches_over_twice_max_wait=2, forced_breaches=4, forced_breaches_over_twice_max_wait=2
    )
    met = outcomes.goals(rows, "governed")
    assert met["breaches_at_most_baseline"] and met["no_breach_past_twice_max_wait"]
    rows["governed"] = row(
        breaches=9, breaches_over_twice_max_wait=2, forced_breaches=3, forced_breaches_over_twice_max_wait=1
    )
    met = outcomes.goals(rows, "governed")
    assert not met["breaches_at_most_baseline"] and not met["no_breach_past_twice_max_wait"]
    # Without a baseline the goals that compare with it are unknown, not met
    del rows["fifo_backfill"]
    met = outcomes.goals(rows, "governed")
    assert met["breaches_at_most_baseline"] is None and met["tier2_p95_at_most_baseline"] is None


def test_runs_apart_merge_into_one_table_with_the_goals_checked_anew(tmp_path: Path) -> None:
    a = {"limit": None, "settings": {"t@8": {"policies": {"governed": row(preemptions=30)}, "goals": {}}}}
    b = {"limit": None, "settings": {"t@8": {"policies": {"k8s": row(preemptions=20), "fifo_backfill": row()}}}}
    files = []
    for name, result in (("a.json", a), ("b.json", b)):
        files.append(tmp_path / name)
        files[-1].write_text(json.dumps(result))
    merged = outcomes.main(["--merge", *map(str, files)])
    block = merged["settings"]["t@8"]
    assert list(block["policies"]) == ["governed", "fifo_backfill", "k8s"]  # in the tables' order
    assert block["goals"]["governed"]["fewer_preemptions_than_every_peer"] == "FAIL"  # k8s, from the other run
    assert block["goals"]["governed"]["breaches_at_most_baseline"] == "PASS"
    assert set(block["goals"]) == {"governed", "k8s"}
    other = tmp_path / "c.json"
    other.write_text(json.dumps({**b, "limit": 400}))
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "outcomes.py"), "--merge", str(files[0]), str(other)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "--merge: the results were run with different --limit values" in out.stderr


@pytest.mark.skipif(not (TRACES / "philly").is_dir(), reason="the shared Philly trace (../shared/traces) is absent")
def test_a_small_run_prints_every_policy_with_its_causes_and_goals() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "outcomes.py"),
            "--setting",
            "philly/pollux_philly.csv@200",
            "--limit",
            "400",
            "--policies",
            "fifo_backfill,slurm,governed",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout)
    block = result["settings"]["philly/pollux_philly.csv@200"]
    assert list(block["policies"]) == ["fifo_backfill", "slurm", "governed"]
    assert set(block["goals"]) == {"slurm", "governed"}
    assert {v for met in block["goals"].values() for v in met.values()} <= {"PASS", "FAIL", None}
    for r in block["policies"].values():
        assert r["preemptions"] == sum(c["preemptions"] for c in r["preemptions_by_cause"])
        assert 0 <= r["forced_breaches"] <= r["breaches"]
        assert 0 <= r["forced_breaches_over_twice_max_wait"] <= r["breaches_over_twice_max_wait"]
    assert block["policies"]["fifo_backfill"]["preemptions"] == 0
    assert block["policies"]["governed"]["preemptions"] > 0  # contended: the causes table is not empty


def test_a_bad_setting_is_refused_with_the_field_and_value() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "outcomes.py"), "--setting", "nowhere.csv@8", "--traces", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "--setting: 'nowhere.csv'" in out.stderr


def attempt(start: float, end: float, gpus: int, number: int = 1, preempted: bool = False) -> SimAttempt:
    return SimAttempt(number, start, end, gpus, 0.0, 0.0, end - start, 0.0, preempted=preempted)


def job(
    name: str, tier: int, gpus: int, submit: float, attempts: list[SimAttempt], wait: float, queue: str = "q"
) -> SimJob:
    finished = None if not attempts or attempts[-1].preempted else attempts[-1].ended_at
    return SimJob(name, queue, tier, "", submit, gpus, 0.0, finished, wait, tuple(attempts))


def test_waiting_intervals_follow_requeues_and_a_gangs_evicted_pod() -> None:
    requeued = job("r", 3, 2, 10.0, [attempt(20, 50, 2, preempted=True), attempt(80, 100, 2, 2)], 40.0)
    assert outcomes.waiting_intervals(requeued, 500.0) == [(10.0, 20.0), (50.0, 80.0)]
    # Two pods of one GPU: the gang waits until both run, and again while one is evicted
    pods = job("p", 3, 2, 0.0, [attempt(5, 100, 1), attempt(10, 30, 1, preempted=True), attempt(40, 100, 1, 2)], 0.0)
    assert outcomes.waiting_intervals(pods, 500.0) == [(0.0, 10.0), (30.0, 40.0)]
    # Never started again: it waits until the run ends
    stuck = job("s", 3, 1, 0.0, [attempt(0, 5, 1, preempted=True)], 0.0)
    assert outcomes.waiting_intervals(stuck, 60.0) == [(5.0, 60.0)]


def test_a_breach_is_forced_only_if_higher_tiers_filled_the_cluster_all_the_while() -> None:
    """4 GPUs, maximum wait 100 s. A tier-1 job demands all 4 GPUs from 0 to 300 s and a tier-2
    job 2 of them from 300 to 600 s."""
    high = job("high", 1, 4, 0.0, [attempt(0, 300, 4)], 0.0)
    mid = job("mid", 2, 2, 300.0, [attempt(300, 600, 2)], 0.0)
    jobs = [
        high,
        mid,
        # waited 0–300 s while tier 1 held everything: forced
        job("forced", 3, 1, 0.0, [attempt(300, 400, 1)], 300.0),
        # waited on to 350 s, when 2 GPUs were free of higher tiers' demand: not forced
        job("late", 3, 1, 0.0, [attempt(350, 400, 1)], 350.0),
        # needs 3 GPUs: 4 − 2 < 3 from 300 s to 600 s too, so waiting to 600 s is forced, and ≥ 2×
        job("wide", 3, 3, 0.0, [attempt(600, 700, 3)], 600.0),
        # waited less than the maximum: no breach at all
        job("short", 3, 1, 0.0, [attempt(50, 60, 1)], 50.0),
    ]
    run = SimRun("p", "t", 0, 4, tuple(jobs), 0.0, 700.0, max_wait={"q": 100.0})
    counts = outcomes.breach_kinds(run)
    assert counts == {"forced_breaches": 2, "forced_breaches_over_twice_max_wait": 2}
    demand = outcomes.higher_tier_demand(run, 3)
    assert outcomes.forced(jobs[2], 4, 700.0, demand) and not outcomes.forced(jobs[3], 4, 700.0, demand)
    # waiting on to 650 s, past the moment tiers 1 and 2 had left, it is not forced
    wider = job("wide", 3, 3, 0.0, [attempt(650, 700, 3)], 650.0)
    assert outcomes.forced(jobs[4], 4, 700.0, demand) and not outcomes.forced(wider, 4, 700.0, demand)
    # tier 2 is above tier 3, not above itself: a tier-2 job is not forced by its own tier
    peer = job("peer", 2, 2, 0.0, [attempt(320, 400, 2)], 320.0)
    alone = SimRun("p", "t", 0, 4, (high, mid, peer), 0.0, 700.0, max_wait={"q": 100.0})
    assert not outcomes.forced(peer, 4, 700.0, outcomes.higher_tier_demand(alone, 2))
    # a bigger cluster leaves room: nothing is forced
    assert outcomes.breach_kinds(SimRun("p", "t", 0, 8, tuple(jobs), 0.0, 700.0, max_wait={"q": 100.0})) == {
        "forced_breaches": 0,
        "forced_breaches_over_twice_max_wait": 0,
    }
