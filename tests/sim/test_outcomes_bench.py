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
    # Without a baseline the goals that compare with it are unknown, not met
    del rows["fifo_backfill"]
    met = outcomes.goals(rows, "governed")
    assert met["breaches_at_most_baseline"] is None and met["tier2_p95_at_most_baseline"] is None


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
    for r in block["policies"].values():
        assert r["preemptions"] == sum(c["preemptions"] for c in r["preemptions_by_cause"])
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
