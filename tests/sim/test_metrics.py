"""The simulator's metrics (warden.sim.metrics, DESIGN §7), checked against hand-computed values.

Runs are built by hand: a few jobs with known attempts, so every expected number below is
arithmetic in the test. A property test checks the bounds that must hold for any valid run
(utilization ≤ 1, owed GPU-hours within capacity and within each queue's demand) and compares
owed GPU-hours with a slow, obviously-correct water-filling written here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from warden.sim.metrics import (
    cycle_counts,
    format_cycles,
    format_gpu_hours,
    format_percent,
    format_preemption_spread,
    format_span,
    format_table,
    preemption_spread,
    summarize,
    timeseries,
    wait_cdf,
    waterfill,
)
from warden.sim.records import PreemptionCause, SimAttempt, SimJob, SimRun

H = 3600.0


def attempt(
    number: int,
    admitted: float,
    ended: float,
    gpus: int,
    *,
    startup: float = 0.0,
    checkpoint: float = 0.0,
    lost: float = 0.0,
    idle: float = 0.0,
    preempted: bool = False,
    cause: PreemptionCause | None = None,
) -> SimAttempt:
    """An attempt whose useful time is whatever the other parts leave (GPU time is conserved)."""
    useful = ended - admitted - startup - checkpoint - lost - idle
    assert useful >= 0
    return SimAttempt(
        number,
        admitted,
        ended,
        gpus,
        startup,
        checkpoint,
        useful,
        lost,
        idle,
        preempted,
        sigterm_at=ended if preempted else None,
        cause=cause,
    )


def job(
    job_id: str,
    submit: float,
    gpus: int,
    attempts: tuple[SimAttempt, ...],
    *,
    finished: float | None,
    wait: float,
    queue: str = "default",
    tier: int = 3,
) -> SimJob:
    return SimJob(job_id, queue, tier, "", submit, gpus, sum(a.useful_s for a in attempts), finished, wait, attempts)


def simrun(jobs: list[SimJob], gpus: int, ended: float, *, started: float = 0.0, **kw: Any) -> SimRun:
    return SimRun(
        policy=kw.pop("policy", "governed"),
        trace="hand.csv",
        seed=7,
        gpus=gpus,
        jobs=tuple(jobs),
        started_at=started,
        ended_at=ended,
        **kw,
    )


def preempted_run(**kw: Any) -> SimRun:
    """Two jobs on 4 GPUs; j1 (2 GPUs) is preempted at 300 s losing 100 s, requeued for 100 s."""
    j1 = job(
        "j1",
        0,
        2,
        (
            attempt(
                1,
                0,
                300,
                2,
                startup=20,
                checkpoint=10,
                lost=100,
                preempted=True,
                cause=PreemptionCause("j2", 1, "downward", False),
            ),  # useful 170
            attempt(2, 400, 700, 2, startup=20),  # useful 280
        ),
        finished=700,
        wait=100,
    )
    j2 = job("j2", 0, 2, (attempt(1, 0, 600, 2),), finished=600, wait=0, tier=1)
    return simrun([j1, j2], gpus=4, ended=700, wall_s=0.5, passes=9, engine_s=0.25, **kw)


def assert_plain_json(value: Any) -> None:
    """Only JSON's own types all the way down (no numpy scalars, no NaN)."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str
            assert_plain_json(v)
    elif isinstance(value, list):
        for v in value:
            assert_plain_json(v)
    else:
        assert value is None or type(value) in (str, int, float, bool), (value, type(value))
        if type(value) is float:
            assert math.isfinite(value)


# ---------------------------------------------------------------------------- the summary


def test_preempted_run_every_metric_by_hand() -> None:
    s = summarize(preempted_run())
    assert (s["policy"], s["trace"], s["seed"], s["gpus"]) == ("governed", "hand.csv", 7, 4)
    assert (s["jobs"], s["finished"], s["unfinished"]) == (2, 2, 0)
    assert s["avg_jct_s"] == pytest.approx((700 + 600) / 2)
    assert s["avg_wait_s"] == pytest.approx(50)
    assert s["p50_wait_s"] == pytest.approx(50)
    assert s["p95_wait_s"] == pytest.approx(95)
    assert s["makespan_s"] == pytest.approx(700)
    # admitted: j1 2×300 + 2×300, j2 2×600 = 2400 GPU-s of 4×700 available
    assert s["utilization"] == pytest.approx(2400 / 2800, abs=1e-6)
    # useful: j1 2×(170+280) = 900, j2 1200
    assert s["goodput"] == pytest.approx(2100 / 2400, abs=1e-6)
    assert s["preemptions"] == 1
    assert s["preemptions_per_hour"] == pytest.approx(1 / (700 / H), abs=1e-4)
    assert s["lost_gpu_hours"] == pytest.approx(2 * 100 / H, abs=1e-6)
    assert s["lost_work_per_preemption_s"] == pytest.approx(200)
    assert s["startup_gpu_hours"] == pytest.approx((2 * 20 + 2 * 20) / H, abs=1e-6)
    assert s["checkpoint_gpu_hours"] == pytest.approx(2 * 10 / H, abs=1e-6)
    assert s["max_wait_least_served_queue_s"] == pytest.approx(100)
    assert s["least_served_queue"] == "default"
    assert s["starvation_breaches"] == 0  # no max_wait configured
    # η: j1 900/1200 = 0.75, j2 1.0 → p5 = 0.75 + 0.05×0.25, p50 = 0.875
    assert s["eta_p5"] == pytest.approx(0.7625)
    assert s["eta_p50"] == pytest.approx(0.875)
    assert s["per_tier"] == {
        "1": {"jobs": 1, "p50_wait_s": 0.0, "p95_wait_s": 0.0, "max_wait_s": 0.0, "breaches": 0},
        "3": {"jobs": 1, "p50_wait_s": 100.0, "p95_wait_s": 100.0, "max_wait_s": 100.0, "breaches": 0},
    }
    # j1's second attempt started up for 20 s on 2 GPUs: what the preemption cost beyond lost work
    assert s["restart_startup_gpu_hours"] == pytest.approx(2 * 20 / H, abs=1e-6)
    assert s["preemptions_by_cause"] == [
        {
            "preemptor_tier": 1,
            "victim_tier": 3,
            "kind": "downward",
            "after_reservation": False,
            "preemptions": 1,
            "lost_gpu_hours": pytest.approx(2 * 100 / H, abs=1e-6),
            "restart_startup_gpu_hours": pytest.approx(2 * 20 / H, abs=1e-6),
        }
    ]
    assert (s["wall_s"], s["passes"], s["engine_s"], s["jobs_per_wall_s"]) == (0.5, 9, 0.25, 4.0)


def test_summary_is_plain_json_without_nan() -> None:
    s = summarize(preempted_run())
    assert json.loads(json.dumps(s, allow_nan=False)) == s
    assert_plain_json(s)


def test_utilization_of_a_full_cluster_is_one_and_never_more() -> None:
    s = summarize(owed_run())
    assert s["utilization"] == pytest.approx(1.0)
    assert s["utilization"] <= 1.0


def test_starvation_breaches_count_waits_at_or_over_the_queue_limit() -> None:
    jobs = [
        job("a", 0, 1, (attempt(1, 100, 200, 1),), finished=200, wait=100, queue="a"),
        job("b", 0, 1, (attempt(1, 99, 200, 1),), finished=200, wait=99, queue="a"),
        job("c", 0, 1, (attempt(1, 500, 600, 1),), finished=600, wait=500, queue="free"),
    ]
    s = summarize(simrun(jobs, gpus=4, ended=600, max_wait={"a": 100.0}))
    assert s["starvation_breaches"] == 1  # "a" exactly at its limit; "free" has no limit
    assert s["max_wait_least_served_queue_s"] == 500
    assert s["least_served_queue"] == "free"
    assert s["per_queue"]["a"]["max_wait_s"] == 100
    assert s["per_queue"]["free"]["max_wait_s"] == 500
    assert (s["per_queue"]["a"]["breaches"], s["per_queue"]["free"]["breaches"]) == (1, 0)
    assert s["per_tier"]["3"]["breaches"] == 1
    # "a" waited exactly its maximum: once it, never twice
    assert (s["breach_wait_over_max_p50"], s["breach_wait_over_max_max"]) == (1.0, 1.0)
    assert s["breaches_over_twice_max_wait"] == 0


def test_breach_lengths_are_multiples_of_the_queues_maximum_wait() -> None:
    jobs = [
        job(name, 0, 1, (attempt(1, w, w + 10, 1),), finished=w + 10, wait=w, queue=q)
        for name, w, q in (("a", 150, "a"), ("b", 300, "a"), ("c", 50, "a"), ("d", 400, "b"))
    ]
    s = summarize(simrun(jobs, gpus=4, ended=500, max_wait={"a": 100.0, "b": 400.0}))
    assert s["starvation_breaches"] == 3
    # a: 1.5, b: 3.0, d: 1.0 → median 1.5, worst 3.0, one at twice or more
    assert (s["breach_wait_over_max_p50"], s["breach_wait_over_max_max"]) == (1.5, 3.0)
    assert s["breaches_over_twice_max_wait"] == 1
    assert (s["per_queue"]["a"]["breaches"], s["per_queue"]["b"]["breaches"]) == (2, 1)


def test_percentiles_interpolate_linearly() -> None:
    waits = [0, 10, 20, 30, 40]
    jobs = [job(f"j{w}", 0, 1, (attempt(1, w, w + 10, 1),), finished=w + 10, wait=w) for w in waits]
    s = summarize(simrun(jobs, gpus=8, ended=50))
    assert s["p50_wait_s"] == 20
    assert s["p95_wait_s"] == pytest.approx(38)
    assert s["per_queue"]["default"]["p95_wait_s"] == pytest.approx(38)
    assert s["avg_wait_s"] == 20


def test_nothing_finished_and_nothing_admitted_gives_none_not_nan() -> None:
    jobs = [job("stuck", 0, 16, (), finished=None, wait=1000)]
    s = summarize(simrun(jobs, gpus=8, ended=1000))
    assert (s["finished"], s["unfinished"]) == (0, 1)
    for key in ("avg_jct_s", "goodput", "lost_work_per_preemption_s", "eta_p5", "eta_p50"):
        assert s[key] is None, key
    assert s["utilization"] == 0.0
    assert s["preemptions"] == 0 and s["preemptions_per_hour"] == 0.0
    assert s["jobs_per_wall_s"] is None  # wall_s 0
    assert s["per_queue"]["default"]["owed_gpu_hours"] == pytest.approx(8 * 1000 / H, abs=1e-6)
    assert s["per_queue"]["default"]["delivered_over_owed"] == 0.0
    json.dumps(s, allow_nan=False)
    assert_plain_json(s)


def test_no_preemptions_means_no_lost_work_per_preemption() -> None:
    jobs = [job("j", 0, 2, (attempt(1, 0, 100, 2, idle=10),), finished=100, wait=0)]
    s = summarize(simrun(jobs, gpus=2, ended=100))
    assert s["preemptions"] == 0
    assert s["lost_work_per_preemption_s"] is None
    assert s["lost_gpu_hours"] == pytest.approx(2 * 10 / H, abs=1e-6)  # idle counts as lost


def test_empty_and_zero_length_runs() -> None:
    s = summarize(simrun([], gpus=8, ended=0))
    assert s["jobs"] == 0 and s["per_queue"] == {} and s["per_tier"] == {}
    for key in ("utilization", "preemptions_per_hour", "avg_wait_s", "max_wait_least_served_queue_s"):
        assert s[key] is None, key
    assert_plain_json(s)


# ---------------------------------------------------------------------------- owed vs delivered


def owed_run(**kw: Any) -> SimRun:
    """8 GPUs, queues a:b weighted 3:1, three hours.

    hour 1: a wants 8, b wants 8  → owed a 6, b 2      (a1 runs, b1 waits)
    hour 2: only b wants 8        → owed b 8           (b1 runs)
    hour 3: a wants 7, b wants 1  → b's share 2 > 1: b owed 1, the spare GPU goes to a: 7
    """
    jobs = [
        job("a1", 0, 8, (attempt(1, 0, H, 8),), finished=H, wait=0, queue="a"),
        job("b1", 0, 8, (attempt(1, H, 2 * H, 8),), finished=2 * H, wait=H, queue="b"),
        job("a2", 2 * H, 7, (attempt(1, 2 * H, 3 * H, 7),), finished=3 * H, wait=0, queue="a"),
        job("b2", 2 * H, 1, (attempt(1, 2 * H, 3 * H, 1),), finished=3 * H, wait=0, queue="b"),
    ]
    kw.setdefault("entitlement", {"a": 0.75, "b": 0.25})
    return simrun(jobs, gpus=8, ended=3 * H, **kw)


def test_owed_follows_weights_and_redistributes_what_a_queue_does_not_want() -> None:
    q = summarize(owed_run())["per_queue"]
    assert q["a"]["owed_gpu_hours"] == pytest.approx(6 + 0 + 7)
    assert q["b"]["owed_gpu_hours"] == pytest.approx(2 + 8 + 1)
    assert q["a"]["delivered_gpu_hours"] == pytest.approx(8 + 7)
    assert q["b"]["delivered_gpu_hours"] == pytest.approx(8 + 1)
    assert q["a"]["delivered_over_owed"] == pytest.approx(15 / 13, abs=1e-4)
    assert q["b"]["delivered_over_owed"] == pytest.approx(9 / 11, abs=1e-4)
    assert q["b"]["jobs"] == 2 and q["b"]["max_wait_s"] == H


def test_queue_without_entitlement_is_owed_nothing() -> None:
    q = summarize(owed_run(entitlement={"a": 1.0}))["per_queue"]
    assert q["a"]["owed_gpu_hours"] == pytest.approx(8 + 0 + 7)
    assert q["b"]["owed_gpu_hours"] == 0
    assert q["b"]["delivered_over_owed"] is None


def test_an_uncharged_tier_is_owed_nothing_and_delivered_nothing() -> None:
    """b's jobs are tier 4 (`charged: false`): they run on idle capacity, so b's demand takes no
    share from a, and what they ran is not counted as delivered to b."""
    jobs = [
        job("a1", 0, 8, (attempt(1, H, 2 * H, 8),), finished=2 * H, wait=H, queue="a"),
        job("b1", 0, 8, (attempt(1, 0, H, 8),), finished=H, wait=0, queue="b", tier=4),
    ]
    charged = simrun(jobs, gpus=8, ended=2 * H, entitlement={"a": 0.5, "b": 0.5}, charged_tiers=frozenset({1, 2, 3}))
    q = summarize(charged)["per_queue"]
    assert q["a"]["owed_gpu_hours"] == pytest.approx(8 + 8)  # the whole pool while a waits and runs
    assert (q["a"]["delivered_gpu_hours"], q["a"]["delivered_over_owed"]) == (pytest.approx(8), 0.5)
    assert (q["b"]["owed_gpu_hours"], q["b"]["delivered_gpu_hours"], q["b"]["delivered_over_owed"]) == (0, 0, None)
    every = summarize(simrun(jobs, gpus=8, ended=2 * H, entitlement={"a": 0.5, "b": 0.5}))["per_queue"]
    assert every["a"]["owed_gpu_hours"] == pytest.approx(4 + 8)  # tier 4 charged: b took half of hour 1


def test_no_entitlement_at_all_means_equal_weights() -> None:
    q = summarize(owed_run(entitlement={}))["per_queue"]
    # hour 1: 4/4; hour 2: b 8; hour 3: b wants 1 of its 4, a takes 7
    assert q["a"]["owed_gpu_hours"] == pytest.approx(4 + 0 + 7)
    assert q["b"]["owed_gpu_hours"] == pytest.approx(4 + 8 + 1)


def test_unfinished_job_demands_until_the_run_ends() -> None:
    jobs = [
        job("a", 0, 4, (attempt(1, 0, 100, 4),), finished=100, wait=0, queue="a"),
        job("b", 50, 4, (), finished=None, wait=150, queue="b"),
    ]
    q = summarize(simrun(jobs, gpus=4, ended=200, entitlement={"a": 0.5, "b": 0.5}))["per_queue"]
    # [0,50): a 4; [50,100): 2/2; [100,200): b 4
    assert q["a"]["owed_gpu_hours"] == pytest.approx((4 * 50 + 2 * 50) / H, abs=1e-6)
    assert q["b"]["owed_gpu_hours"] == pytest.approx((2 * 50 + 4 * 100) / H, abs=1e-6)


def test_waterfill_caps_at_demand_and_shares_the_rest_by_weight() -> None:
    demand = np.array([[10.0, 1.0, 10.0], [1.0, 1.0, 1.0], [0.0, 20.0, 20.0]])
    alloc = waterfill(demand, np.array([1.0, 1.0, 2.0]), 9.0)
    assert alloc[0] == pytest.approx([8 / 3, 1, 16 / 3])
    assert alloc[1] == pytest.approx([1, 1, 1])  # fits: everyone gets their demand
    assert alloc[2] == pytest.approx([0, 3, 6])


# ---------------------------------------------------------------------------- time series


def test_timeseries_bins_are_exact_time_weighted_means() -> None:
    ts = timeseries(preempted_run(), points=7)
    assert ts["edges_s"] == [0, 100, 200, 300, 400, 500, 600, 700]
    assert ts["bin_s"] == 100
    # busy: [0,300) 4, [300,400) 2, [400,600) 4, [600,700) 2
    assert ts["utilization"] == pytest.approx([1, 1, 1, 0.5, 1, 1, 0.5])
    assert ts["preemptions"] == [0, 0, 0, 1, 0, 0, 0]  # j1's first attempt ended at 300
    assert ts["lost_gpu_hours"] == pytest.approx([0, 0, 0, 200 / H, 0, 0, 0], abs=1e-6)
    assert set(ts["wait_cdf"]) == {"1", "3"}
    json.dumps(ts, allow_nan=False)


def test_timeseries_of_a_zero_length_run_is_empty() -> None:
    ts = timeseries(simrun([], gpus=4, ended=0))
    assert ts["utilization"] == [] and ts["edges_s"] == [] and ts["bin_s"] is None


def test_wait_cdf_per_tier_and_downsampled() -> None:
    jobs = [job(f"j{i}", 0, 1, (), finished=None, wait=float(i), tier=1 + i % 2) for i in range(1000)]
    cdf = wait_cdf(simrun(jobs, gpus=1, ended=1000), points=50)
    assert set(cdf) == {"1", "2"}
    tier1 = cdf["1"]
    assert len(tier1["wait_s"]) == len(tier1["fraction"]) == 50
    assert tier1["wait_s"][0] == 0 and tier1["wait_s"][-1] == 998
    assert tier1["fraction"][0] == 0 and tier1["fraction"][-1] == 1
    assert tier1["wait_s"] == sorted(tier1["wait_s"])
    small = wait_cdf(preempted_run())
    assert small["3"] == {"wait_s": [100.0], "fraction": [1.0]}


# ---------------------------------------------------------------------------- human table


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (0, "0s"),
        (4.25, "4.2s"),
        (42, "42s"),
        (425, "7m5s"),
        (3 * H + 12 * 60, "3h12m"),
        (2 * 86400 + 4 * H + 59, "2d4h"),
    ],
)
def test_format_span(seconds: float | None, text: str) -> None:
    assert format_span(seconds) == text


def test_format_percent() -> None:
    assert (format_percent(0.8571), format_percent(None), format_percent(1)) == ("85.7%", "—", "100.0%")


def test_format_gpu_hours_keeps_small_values_visible() -> None:
    assert (format_gpu_hours(0.0556), format_gpu_hours(12345.67), format_gpu_hours(None)) == ("0.06", "12,345.7", "—")


def test_format_table_has_one_row_per_summary_in_human_units() -> None:
    rows = [summarize(preempted_run()), summarize(preempted_run(policy="fifo_strict"))]
    table = format_table(rows)
    assert table.row_count == 2
    headers = [str(c.header) for c in table.columns]
    assert headers[:3] == ["policy", "jobs", "avg JCT"] and "η p5" in headers
    console = Console(record=True, width=250)
    console.print(table)
    text = console.export_text()
    assert "governed" in text and "fifo_strict" in text
    assert "10m50s" in text  # avg JCT 650 s
    assert "85.7%" in text and "87.5%" in text and "76.2%" in text  # util, goodput, η p5


# ---------------------------------------------------------------------------- preemption spread


def churned_run(times: int) -> SimRun:
    """j1 preempted `times` times, j2 once, j3 never; j4 was never admitted (it does not count)."""
    j1 = job(
        "j1",
        0,
        1,
        tuple(attempt(k + 1, 10 * k, 10 * k + 5, 1, preempted=k < times) for k in range(times + 1)),
        finished=10 * times + 5,
        wait=0,
    )
    j2 = job("j2", 0, 1, (attempt(1, 0, 5, 1, preempted=True), attempt(2, 5, 9, 1)), finished=9, wait=0)
    j3 = job("j3", 0, 1, (attempt(1, 0, 4, 1),), finished=4, wait=0)
    j4 = job("j4", 0, 1, (), finished=None, wait=100)
    return simrun([j1, j2, j3, j4], gpus=4, ended=10 * times + 5)


def test_preemptions_per_admitted_job_by_hand() -> None:
    out = preemption_spread(churned_run(3), limit=10)
    # Admitted jobs j1, j2, j3 with 3, 1, 0 preemptions: mean 4/3, p95 between 1 and 3 (2.8).
    assert out["preemptions_per_job"] == {
        "mean": 1.3333,
        "p95": 2.8,
        "max": 3,
        "worst_job": "j1",
        "admitted_jobs": 3,
        "limit": 10,
        "over_limit": 0,
    }
    assert out["preemption_warning"] is None
    assert format_preemption_spread(out["preemptions_per_job"]) == "1.33 / 2.8 / 3"


def test_a_job_preempted_more_than_the_limit_is_flagged_by_name() -> None:
    out = preemption_spread(churned_run(12), limit=10)
    assert out["preemptions_per_job"]["max"] == 12 and out["preemptions_per_job"]["over_limit"] == 1
    assert out["preemption_warning"].startswith("job j1 was preempted 12 times, more than the limit of 10")
    assert format_preemption_spread(out["preemptions_per_job"]).endswith("12!")
    # The limit is the caller's: exactly at it is not over it.
    assert preemption_spread(churned_run(12), limit=12)["preemption_warning"] is None
    two = preemption_spread(churned_run(12), limit=0)
    assert two["preemptions_per_job"]["over_limit"] == 2 and "1 other job(s)" in two["preemption_warning"]


def test_no_admitted_job_gives_no_spread_and_no_warning() -> None:
    out = preemption_spread(simrun([job("j", 0, 1, (), finished=None, wait=5)], gpus=1, ended=5))
    assert out["preemptions_per_job"]["max"] is None and out["preemptions_per_job"]["mean"] is None
    assert out["preemption_warning"] is None and format_preemption_spread(out["preemptions_per_job"]) == "—"
    assert_plain_json(out)


def test_the_table_shows_preemptions_per_job() -> None:
    rows = [{**summarize(churned_run(12)), **preemption_spread(churned_run(12))}]
    console = Console(record=True, width=300)
    console.print(format_table(rows))
    text = console.export_text()
    assert "preempt/job" in text and "4.33 / 10.9 / 12!" in text


# ---------------------------------------------------------------------------- properties


@st.composite
def valid_runs(draw: st.DrawFn) -> SimRun:
    """Random runs an engine could produce: GPUs are lanes, an attempt takes the lanes free soonest.

    Each job runs 1-3 attempts in order, all but possibly the last preempted; a job whose last
    attempt is preempted, or which is told to stop early, is unfinished.
    """
    gpus = draw(st.integers(1, 8))
    queues = ["a", "b", "c"]
    lanes = [0.0] * gpus
    jobs: list[SimJob] = []
    specs = draw(
        st.lists(
            st.tuples(
                st.integers(0, 2000),
                st.sampled_from(queues),
                st.integers(1, 4),
                st.integers(1, gpus),
                st.lists(st.tuples(st.integers(1, 500), st.integers(0, 200), st.booleans()), min_size=0, max_size=3),
                st.booleans(),
            ),
            min_size=1,
            max_size=12,
        )
    )
    specs.sort(key=lambda s: s[0])
    for i, (submit, queue, tier, g, runs, stop_early) in enumerate(specs):
        attempts = []
        ready = float(submit)
        wait = 0.0
        for n, (useful, lost, preempt) in enumerate(runs):
            preempted = preempt or n < len(runs) - 1
            order = sorted(range(gpus), key=lambda k: lanes[k])[:g]
            start = max(ready, max(lanes[k] for k in order))
            end = start + useful + (lost if preempted else 0)
            for k in order:
                lanes[k] = end
            wait += start - ready
            attempts.append(attempt(n + 1, start, end, g, lost=lost if preempted else 0, preempted=preempted))
            ready = end
        finished = None if (not attempts or attempts[-1].preempted or stop_early) else attempts[-1].ended_at
        jobs.append(job(f"j{i}", submit, g, tuple(attempts), finished=finished, wait=wait, queue=queue, tier=tier))
    end = max([max(lanes)] + [float(s[0]) for s in specs]) + draw(st.integers(0, 100))
    ent_queues = draw(st.lists(st.sampled_from(queues), unique=True))
    weights = {q: float(draw(st.integers(1, 5))) for q in ent_queues}
    total = sum(weights.values())
    entitlement = {q: w / total for q, w in weights.items()}
    return simrun(jobs, gpus=gpus, ended=end, started=float(specs[0][0]), entitlement=entitlement)


def slow_owed(run: SimRun) -> dict[str, float]:
    """Owed GPU-hours by the textbook: at each interval, iterate water-filling until it settles."""
    queues = sorted({j.queue for j in run.jobs})
    w = {q: run.entitlement.get(q, 0.0) for q in queues}
    if not any(v > 0 for v in w.values()):
        w = dict.fromkeys(queues, 1.0)
    end_of = {j.job_id: run.ended_at if j.finished_at is None else j.finished_at for j in run.jobs}
    times = sorted({run.started_at, run.ended_at} | {j.submit for j in run.jobs} | set(end_of.values()))
    owed = dict.fromkeys(queues, 0.0)
    for t0, t1 in zip(times, times[1:]):
        demand = {
            q: float(sum(j.num_gpus for j in run.jobs if j.queue == q and j.submit <= t0 < end_of[j.job_id]))
            for q in queues
        }
        alloc = dict.fromkeys(queues, 0.0)
        left = float(run.gpus)
        active = {q for q in queues if demand[q] > 0 and w[q] > 0}
        while active and left > 1e-12:
            wsum = sum(w[q] for q in active)
            give = {q: min(left * w[q] / wsum, demand[q] - alloc[q]) for q in active}
            for q, x in give.items():
                alloc[q] += x
            left -= sum(give.values())
            active = {q for q in active if demand[q] - alloc[q] > 1e-12}
        for q in queues:
            owed[q] += alloc[q] * (t1 - t0) / H
    return owed


@settings(max_examples=150, deadline=None)
@given(valid_runs())
def test_bounds_hold_for_any_valid_run(run: SimRun) -> None:
    s = summarize(run)
    if s["utilization"] is not None:
        assert 0 <= s["utilization"] <= 1
    capacity_h = run.gpus * (run.ended_at - run.started_at) / H
    owed = {q: v["owed_gpu_hours"] for q, v in s["per_queue"].items()}
    assert sum(owed.values()) <= capacity_h + 1e-5
    for q, value in owed.items():
        demand_h = (
            sum(
                j.num_gpus * ((run.ended_at if j.finished_at is None else j.finished_at) - j.submit)
                for j in run.jobs
                if j.queue == q
            )
            / H
        )
        assert 0 <= value <= demand_h + 1e-5
    reference = slow_owed(run)
    assert owed == pytest.approx(reference, abs=1e-5)
    delivered = sum(v["delivered_gpu_hours"] for v in s["per_queue"].values())
    assert delivered == pytest.approx(s["admitted_gpu_hours"], abs=1e-5)
    assert_plain_json(s)
    json.dumps(s, allow_nan=False)


def test_two_jobs_that_reclaimed_from_each_other_back_and_forth_are_both_counted_alternating() -> None:
    def by(other: str) -> PreemptionCause:
        return PreemptionCause(other, 3, "reclaim", False)

    a = job(
        "a",
        0,
        1,
        (attempt(1, 0, 10, 1, preempted=True, cause=by("b")), attempt(2, 30, 40, 1, preempted=True, cause=by("b"))),
        finished=None,
        wait=0,
    )
    b = job(
        "b", 0, 1, (attempt(1, 10, 20, 1, preempted=True, cause=by("a")), attempt(2, 40, 50, 1)), finished=50, wait=0
    )
    out = cycle_counts(simrun([a, b], gpus=1, ended=50))
    assert out == {"alternating": 2, "over_budget": 0, "jobs": 2, "budget": {"count": 3, "per_s": 86400.0}}
    assert format_cycles(out) == "0 / 2"
    one_way = job(
        "a", 0, 1, (attempt(1, 0, 10, 1, preempted=True, cause=by("b")), attempt(2, 30, 40, 1)), finished=40, wait=0
    )
    assert cycle_counts(simrun([one_way, b], gpus=1, ended=50))["jobs"] == 0  # a for b, b for a: no way back
