"""bench/takeover.py end to end at tiny sizes: each section runs and reports the figures
BENCHMARKS.md records, and the JSON it prints is what it returns. No timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from pg import find_bin_dir

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("takeover_bench", ROOT / "bench" / "takeover.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules["takeover_bench"] = bench
spec.loader.exec_module(bench)


@pytest.mark.slow  # ~40 s: a PostgreSQL and eight server starts, even at these sizes
def test_a_tiny_run_reports_takeovers_lateness_throughput_and_what_a_standby_costs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if find_bin_dir() is None:
        pytest.skip("the bench starts a PostgreSQL of its own: apt-get install postgresql")
    argv = ["--kills", "1", "--submissions", "8", "--clients", "2", "--rounds", "1", "--idle-seconds", "1"]
    result = bench.main(argv)
    assert json.loads(capsys.readouterr().out) == result
    assert not [name for name, section in result.items() if isinstance(section, dict) and "error" in section], result

    takeover = result["takeover"]
    assert takeover["takeover_s"]["count"] == 1 and takeover["takeover_s"]["max"] > 0
    lateness = takeover["sigkill_lateness_s"]
    assert lateness["all"]["count"] == len(bench.DEADLINES)
    assert sum(lateness[where]["count"] for where in ("before", "inside", "after")) == len(bench.DEADLINES)

    submissions = result["submissions"]
    assert submissions["leader_per_s"] > 0 and submissions["standby_per_s"] > 0

    cost = result["standby_cost"]
    assert cost["standby"]["statements_per_s"] > 0 and cost["standby"]["transactions_per_s"] > 0
    assert cost["leader_alone"]["statements_per_s"] > 0
    assert set(cost["database_xacts_per_s"]) == {"leader_alone", "leader_and_standby", "standby"}
