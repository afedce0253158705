"""bench/takeover.py end to end at tiny sizes: each section runs and prints the figures
BENCHMARKS.md records. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pg import find_bin_dir

BENCH = Path(__file__).resolve().parents[2] / "bench" / "takeover.py"


@pytest.mark.slow  # ~40 s: a PostgreSQL and eight server starts, even at these sizes
def test_a_tiny_run_reports_takeovers_lateness_throughput_and_what_a_standby_costs() -> None:
    if find_bin_dir() is None:
        pytest.skip("the bench starts a PostgreSQL of its own: apt-get install postgresql")
    argv = ["--kills", "1", "--submissions", "8", "--clients", "2", "--rounds", "1", "--idle-seconds", "1"]
    done = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert not [name for name, section in result.items() if isinstance(section, dict) and "error" in section], result

    takeover = result["takeover"]
    assert takeover["takeover_s"]["count"] == 1 and takeover["takeover_s"]["max"] > 0
    lateness = takeover["sigkill_lateness_s"]
    assert lateness["all"]["count"] == 5  # five deadlines around each kill
    assert sum(lateness[where]["count"] for where in ("before", "inside", "after")) == 5

    submissions = result["submissions"]
    assert submissions["leader_per_s"] > 0 and submissions["standby_per_s"] > 0

    cost = result["standby_cost"]
    assert cost["standby"]["statements_per_s"] > 0 and cost["standby"]["transactions_per_s"] > 0
    assert cost["leader_alone"]["statements_per_s"] > 0
    assert set(cost["database_xacts_per_s"]) == {"leader_alone", "leader_and_standby", "standby"}
