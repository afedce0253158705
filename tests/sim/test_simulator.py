"""The simulator's event loop: FIFO exactly as the textbook defines it, GPU time conserved, the
engine's invariants at every pass, and each preset's behaviour on small scenarios."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from invariants import check_pass
from support import preset_params

from warden.engine.model import Node
from warden.sim.cluster import pool
from warden.sim.presets import PRESETS, Behaviour, SimPolicy, build_preset, entitlements
from warden.sim.records import PreemptionCause, SimRun, Trace, TraceJob
from warden.sim.simulator import simulate

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def tj(i: int, submit: float, gpus: int, duration: float, **kw: Any) -> TraceJob:
    replicas = kw.pop("replicas", 1)
    return TraceJob(str(i), submit, gpus, duration, replicas=replicas, gpus_per_replica=gpus // replicas, seq=i, **kw)


def trace(jobs: list[TraceJob]) -> Trace:
    jobs = sorted(jobs, key=lambda j: (j.submit, j.seq))
    return Trace(tuple(replace(j, seq=k) for k, j in enumerate(jobs)), "test", "native")


def run(
    jobs: list[TraceJob], preset: str, gpus: int, nodes: tuple[Node, ...] | None = None, check: bool = False
) -> SimRun:
    t = trace(jobs)
    queues = sorted({j.queue for j in t.jobs})
    sp = build_preset(preset, entitlements({}, queues, gpus), gpus)
    rng = random.Random(0)
    on_pass = (lambda snap, plan, now: check_pass(snap, plan, now, rng)) if check else None
    from warden.sim.simulator import Simulation

    sim = Simulation(t, nodes or pool(gpus), sp, on_pass=on_pass)
    return sim.run()


# ------------------------------------------------------------------------ the textbook FIFO


def reference_fifo(jobs: list[TraceJob], gpus: int, strict: bool) -> dict[str, float]:
    """Finish time of every job under FIFO on a pure GPU counter, written from the definition:
    at each moment completions first, then arrivals, then walk the queue in (submit, trace
    order) and start every job that fits — stopping at the first that does not (strict) or
    skipping it (backfill)."""
    order = sorted(jobs, key=lambda j: (j.submit, j.seq))
    free, i, queue, running, done = gpus, 0, [], [], {}
    while i < len(order) or running:
        now = min(order[i].submit if i < len(order) else float("inf"), running[0][0] if running else float("inf"))
        while running and running[0][0] == now:
            _, g = heapq.heappop(running)
            free += g
        while i < len(order) and order[i].submit == now:
            queue.append(order[i])
            i += 1
        keep = []
        blocked = False
        for j in queue:
            if not blocked and j.num_gpus <= free:
                free -= j.num_gpus
                heapq.heappush(running, (now + j.duration, j.num_gpus))
                done[j.job_id] = now + j.duration
            else:
                keep.append(j)
                blocked = strict
        queue = keep
    return done


def avg_jct(r: SimRun) -> float:
    jcts = [j.jct_s for j in r.jobs]
    assert all(x is not None for x in jcts)
    return sum(jcts) / len(jcts)  # type: ignore[arg-type]


fifo_jobs = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 8), st.integers(1, 300)), min_size=1, max_size=60)


@pytest.mark.parametrize("preset", ["fifo_strict", "fifo_backfill"])
@settings(max_examples=60, deadline=None)
@given(rows=fifo_jobs, gpus=st.integers(8, 16))
def test_fifo_presets_finish_every_job_when_the_textbook_does(preset: str, rows: list, gpus: int) -> None:
    # Coarse submit times make equal times (and FIFO's tie-break by trace order) common.
    jobs = [tj(i, float(s - s % 20), g, float(d)) for i, (s, g, d) in enumerate(rows)]
    r = run(jobs, preset, gpus)
    expected = reference_fifo(jobs, gpus, strict=preset == "fifo_strict")
    assert {j.job_id: j.finished_at for j in r.jobs} == expected


def test_fifo_strict_blocks_and_backfill_skips() -> None:
    jobs = [tj(0, 0.0, 6, 100.0), tj(1, 1.0, 4, 100.0), tj(2, 2.0, 2, 10.0)]
    strict = {j.job_id: j.finished_at for j in run(jobs, "fifo_strict", 8).jobs}
    backfill = {j.job_id: j.finished_at for j in run(jobs, "fifo_backfill", 8).jobs}
    assert strict == {"0": 100.0, "1": 200.0, "2": 110.0}  # 2 waits behind the blocked head
    assert backfill == {"0": 100.0, "1": 200.0, "2": 12.0}


@pytest.mark.parametrize("preset", ["fifo_strict", "fifo_backfill"])
def test_fifo_average_jct_on_a_philly_slice_matches_the_textbook(preset: str) -> None:
    path = TRACES / "philly" / "rfold_philly_trace.csv"
    if not path.exists():
        pytest.skip(f"the Philly traces are not at {TRACES} (../shared/traces)")
    from warden.sim.loaders import load_trace

    jobs = [
        replace(j, num_gpus=min(j.num_gpus, 64), gpus_per_replica=min(j.num_gpus, 64))
        for j in load_trace(path, limit=3000, enrich=False).jobs
    ]
    assert all(j.startup_seconds == 0.0 and j.checkpoint_interval is None for j in jobs)
    r = run(jobs, preset, 64)
    expected = reference_fifo(jobs, 64, strict=preset == "fifo_strict")
    ref = sum(expected[j.job_id] - j.submit for j in jobs) / len(jobs)
    assert max(j.wait_s for j in r.jobs) > 3600  # the slice queues: FIFO's order matters
    assert abs(avg_jct(r) - ref) < 0.1


# -------------------------------------------------------------------------- conservation


def conserved(r: SimRun, gpus: int) -> None:
    """GPU time conserved per attempt; every job finished exactly once; never more GPUs held
    than the cluster has."""
    spans = []
    for job in r.jobs:
        assert job.finished_at is not None, f"{job.job_id} never finished"
        useful = 0.0
        for a in job.attempts:
            parts = a.startup_s + a.checkpoint_s + a.useful_s + a.lost_s + a.idle_s
            assert abs((a.ended_at - a.admitted_at) - parts) < 1e-6, a
            assert min(a.startup_s, a.checkpoint_s, a.useful_s, a.lost_s, a.idle_s) >= -1e-9, a
            spans.append((a.admitted_at, a.gpus))
            spans.append((a.ended_at, -a.gpus))
            useful += a.useful_s * a.gpus
        # The useful work of all attempts is exactly the job's work, on all its GPUs.
        assert abs(useful - job.duration * job.num_gpus) < 1e-6 * max(1.0, job.duration), job
        assert job.finished_at == max(a.ended_at for a in job.attempts)
    held = 0
    for _, g in sorted(spans):
        held += g
        assert held <= gpus


tiered_jobs = st.lists(
    st.tuples(
        st.integers(0, 2000),
        st.sampled_from([1, 2, 4, 8]),
        st.integers(30, 4000),
        st.integers(1, 4),
        st.booleans(),
        st.sampled_from([None, 300.0, 900.0]),
        st.sampled_from([0.0, 20.0, 200.0]),
        st.sampled_from(["a", "b"]),
    ),
    min_size=1,
    max_size=30,
)


def _tiered(rows: list) -> list[TraceJob]:
    out = []
    for i, (s, g, d, tier, resumable, interval, save, queue) in enumerate(rows):
        replicas = 2 if g == 8 and i % 2 else 1
        out.append(
            tj(
                i,
                float(s),
                g,
                float(d),
                tier=tier,
                queue=queue,
                resumable=resumable,
                checkpoint_interval=interval,
                checkpoint_seconds=save,
                startup_seconds=15.0,
                replicas=replicas,
                lease=0.0,
            )
        )
    return out


@pytest.mark.parametrize("preset", preset_params(PRESETS))
@settings(max_examples=25, deadline=None)
@given(rows=tiered_jobs)
def test_every_preset_conserves_gpu_time_and_keeps_the_engines_invariants(preset: str, rows: list) -> None:
    jobs = _tiered(rows)
    r = run(jobs, preset, 8, check=True)
    conserved(r, 8)


# ----------------------------------------------------------------------------- scenarios


def _preempted(jobs: list[TraceJob], preset: str = "slurm", gpus: int = 8) -> dict[str, Any]:
    r = run(jobs, preset, gpus)
    conserved(r, gpus)
    return {j.job_id: j for j in r.jobs}


def test_a_save_that_fits_the_grace_loses_nothing() -> None:
    # Tier 3 runs alone from 0; a tier-1 job takes the whole pool at 1000.
    low = tj(0, 0.0, 8, 5000.0, tier=3, checkpoint_interval=3600.0, checkpoint_seconds=60.0)
    high = tj(1, 1000.0, 8, 100.0, tier=1)
    jobs = _preempted([low, high])
    first = jobs["0"].attempts[0]
    assert first.preempted and first.lost_s == 0.0 and first.useful_s == 1000.0
    assert first.ended_at == 1060.0 and first.checkpoint_s == 60.0  # SIGTERM save, then exit
    assert jobs["1"].attempts[0].admitted_at == 1060.0


def test_a_preempted_attempt_names_its_preemptor_and_the_rule() -> None:
    low = tj(0, 0.0, 8, 5000.0, tier=3)
    high = tj(1, 1000.0, 8, 100.0, tier=1)
    jobs = _preempted([low, high])
    assert jobs["0"].attempts[0].cause == PreemptionCause("1", 1, "downward", False)
    assert jobs["0"].attempts[1].cause is None and jobs["1"].attempts[0].cause is None


def test_a_preemption_at_the_end_of_a_lease_is_a_reservation_come_due() -> None:
    # The tier-3 job's 600 s lease protects it when the tier-1 job arrives at 100: that job
    # reserves the GPUs and preempts at 600.
    low = tj(0, 0.0, 8, 5000.0, tier=3, lease=600.0)
    high = tj(1, 100.0, 8, 100.0, tier=1)
    jobs = _preempted([low, high], "governed")
    first = jobs["0"].attempts[0]
    assert first.sigterm_at == 600.0
    assert first.cause == PreemptionCause("1", 1, "downward", True)


def test_a_save_longer_than_the_grace_loses_the_work_since_the_last_checkpoint() -> None:
    low = tj(0, 0.0, 8, 9000.0, tier=3, checkpoint_interval=600.0, checkpoint_seconds=150.0)
    high = tj(1, 1000.0, 8, 100.0, tier=1)
    jobs = _preempted([low, high])
    first = jobs["0"].attempts[0]
    # One save ended at 600 + 150 = 750; work resumed until SIGTERM at 1000; the grace ends at
    # 1120, Slurm's next 30 s poll kills at 1140 and cuts the 150 s save short.
    assert first.useful_s == 600.0 and first.lost_s == 250.0
    assert first.ended_at == 1140.0 and first.checkpoint_s == 150.0 + 140.0
    assert jobs["0"].finished_at is not None


def test_a_job_that_ignores_sigterm_loses_everything_and_exits_at_once() -> None:
    low = tj(0, 0.0, 8, 5000.0, tier=3, resumable=False)
    high = tj(1, 1000.0, 8, 100.0, tier=1)
    jobs = _preempted([low, high])
    first = jobs["0"].attempts[0]
    assert first.lost_s == 1000.0 and first.useful_s == 0.0 and first.ended_at == 1000.0
    assert jobs["0"].attempts[-1].useful_s == 5000.0  # started again from zero


def test_slurm_kills_on_its_30_second_poll() -> None:
    # SIGTERM at 1005; the grace ends at 1125; Slurm's poll sends SIGKILL at 1140.
    low = tj(0, 0.0, 8, 9000.0, tier=3, checkpoint_interval=600.0, checkpoint_seconds=130.0)
    high = tj(1, 1005.0, 8, 100.0, tier=1)
    first = _preempted([low, high])["0"].attempts[0]
    assert first.ended_at == 1135.0 and first.lost_s == 0.0  # the 130 s save made it before 1140


def test_slurm_picks_the_smallest_victim_and_governed_the_cheapest() -> None:
    # Two tier-3 jobs; a tier-1 job needs 4 GPUs. The small one has lost little since its last
    # save; the big one would lose an hour.
    small = tj(0, 0.0, 4, 90000.0, tier=3, checkpoint_interval=3000.0, checkpoint_seconds=10.0)
    big = tj(1, 500.0, 4, 90000.0, tier=3, resumable=False)
    high = tj(2, 4000.0, 4, 100.0, tier=1)
    slurm = _preempted([small, big, high], "slurm")
    assert slurm["0"].preemptions + slurm["1"].preemptions == 1
    governed = _preempted([replace(small, lease=0.0), replace(big, lease=0.0), high], "governed")
    assert governed["0"].preemptions == 1 and governed["1"].preemptions == 0
    assert sum(a.lost_s for a in governed["0"].attempts) == 0.0


def test_kueue_admits_one_workload_per_queue_per_cycle() -> None:
    jobs = [tj(i, 0.0, 1, 100.0, queue="a") for i in range(3)] + [tj(3, 0.0, 1, 100.0, queue="b")]
    starts = {j.job_id: j.attempts[0].admitted_at for j in run(jobs, "kueue", 8).jobs}
    assert starts == {"0": 0.0, "1": 1.0, "2": 2.0, "3": 0.0}
    assert {j.job_id: j.attempts[0].admitted_at for j in run(jobs, "fifo_backfill", 8).jobs} == {
        "0": 0.0,
        "1": 0.0,
        "2": 0.0,
        "3": 0.0,
    }


def test_k8s_evicts_one_pod_and_strands_the_rest_of_the_gang() -> None:
    # A 2-pod gang (2 × 4 GPUs) of tier 3; a tier-1 job needs 4 GPUs: Kubernetes evicts one pod.
    gang = tj(0, 0.0, 8, 5000.0, tier=3, replicas=2, checkpoint_interval=600.0, checkpoint_seconds=10.0)
    high = tj(1, 1000.0, 4, 500.0, tier=1)
    jobs = _preempted([gang, high], "k8s")
    pods = jobs["0"].attempts
    evicted = [a for a in pods if a.preempted]
    assert len(evicted) == 1 and evicted[0].ended_at == 1010.0  # its 10 s save fits the 30 s grace
    stranded = next(a for a in pods if not a.preempted and a.admitted_at == 0.0)
    # The other pod held its 4 GPUs idle from the save's end until the evicted pod ran again.
    assert stranded.idle_s == pytest.approx(1510.0 - 1010.0)
    # warden's governed policy evicts the whole gang (lease aside), nothing idles.
    governed = _preempted([replace(gang, lease=0.0), high], "governed")
    assert all(a.idle_s == 0.0 for a in governed["0"].attempts)
    assert len([a for a in governed["0"].attempts if a.preempted]) == 1


def test_a_job_larger_than_the_cluster_is_skipped_and_counted() -> None:
    t = trace([tj(0, 0.0, 16, 10.0), tj(1, 0.0, 4, 10.0)])
    sp = build_preset("fifo_strict", entitlements({}, ["default"], 8), 8)
    r, skipped = simulate(t, pool(8), sp)
    assert skipped == {"larger_than_cluster": 1} and [j.job_id for j in r.jobs] == ["1"]


def test_gangs_on_a_cluster_file_take_whole_nodes() -> None:
    from warden.sim.cluster import parse_cluster

    nodes = parse_cluster({"nodes": [{"name": "n", "count": 4, "gpus": 8, "nodes_per_block": 2}]})
    jobs = [tj(i, float(i), 16, 100.0, replicas=2) for i in range(3)]
    r = run(jobs, "fifo_backfill", 32, nodes=nodes, check=True)
    assert sorted(j.attempts[0].admitted_at for j in r.jobs) == [0.0, 1.0, 100.0]


def test_same_trace_same_seed_same_run() -> None:
    jobs = _tiered(
        [
            (
                s * 37 % 900,
                [1, 2, 4, 8][s % 4],
                100 + s * 13 % 3000,
                s % 4 + 1,
                s % 3 > 0,
                [None, 300.0][s % 2],
                [0.0, 200.0][s % 2],
                "ab"[s % 2],
            )
            for s in range(40)
        ]
    )
    a, b = run(jobs, "governed", 8), run(jobs, "governed", 8)
    assert a.jobs == b.jobs and a.passes == b.passes
    for r in (a, b):  # the engine's share of the wall is timed, and is part of it
        assert r.passes > 0 and 0 < r.engine_s < r.wall_s


def test_presets_are_policies_with_their_documented_settings() -> None:
    gov = build_preset("governed", {"a": 4, "b": 4}, 8).policy
    assert gov.scheduling.order == "governed" and gov.find_queue("a").nominal == {"gpu": 4.0}
    slurm: SimPolicy = build_preset("slurm", {"a": 4}, 8)
    assert slurm.policy.preemption.victim_order == "smallest" and slurm.behaviour.grace_poll == 30.0
    assert slurm.policy.thrash.requeue_backoff == 121.0 and not slurm.policy.governed_resources()
    assert slurm.behaviour.requeue_restarts_age
    kueue = build_preset("kueue", {"a": 4}, 8)
    assert kueue.policy.preemption.victim_order == "newest" and kueue.behaviour.admissions_per_queue == 1
    assert all(t.lease == 0.0 for t in kueue.policy.tiers.values())
    assert build_preset("k8s", {"a": 4}, 8).behaviour.pods
    strict = build_preset("fifo_strict", {"a": 4}, 8).policy
    assert strict.scheduling.head_of_line_blocking and not any(t.preemptible for t in strict.tiers.values())
    for name in ("slurm", "kueue", "k8s"):  # no peer shields a starving job, none rebalances shares by preemption
        reclaim = build_preset(name, {"a": 4}, 8).policy.preemption.reclaim
        assert reclaim.fair_share == "never" and reclaim.starvation_shield == "off"
    assert kueue.policy.preemption.reclaim.nominal == "not_higher"


def test_the_fair_sharing_presets_have_their_documented_settings() -> None:
    fair = build_preset("kueue_fair", {"a": 4, "b": 4}, 8)
    reclaim = fair.policy.preemption.reclaim
    assert (reclaim.nominal, reclaim.fair_share, reclaim.starvation_shield) == ("any", "final_then_initial", "off")
    assert fair.policy.preemption.victim_order == "share" and fair.behaviour.admissions_per_queue == 1
    assert {(t.scope, t.lease, t.grace) for n, t in fair.policy.tiers.items() if n > 1} == {("cluster", 0.0, 30.0)}
    assert fair.policy.scheduling.order == "priority" and fair.policy.scheduling.nominal_first
    assert fair.policy.find_queue("a").nominal == {"gpu": 4.0}
    kai = build_preset("kai", {"a": 4, "b": 4}, 8)
    reclaim = kai.policy.preemption.reclaim
    assert (reclaim.nominal, reclaim.fair_share, reclaim.starvation_shield) == ("any", "final", "off")
    assert kai.policy.preemption.victim_order == "share" and kai.behaviour == Behaviour()
    assert {(t.scope, t.lease, t.grace) for n, t in kai.policy.tiers.items() if n > 1} == {("queue", 600.0, 30.0)}
    assert kai.policy.scheduling.order == "governed" and kai.policy.scheduling.reservations == 0
    for sp in (fair, kai):
        assert not sp.policy.tiers[1].preemptible and sp.policy.thrash.max_preemptions.count >= 1_000_000


@pytest.mark.parametrize("preset", preset_params(("kueue_fair", "kai")))
def test_a_lender_takes_its_quota_back_from_a_borrower_end_to_end(preset: str) -> None:
    """Queue a borrows the whole pool for 10 h; b's job, in quota, arrives an hour later and gets
    its nominal back by reclaim (after KAI's 10 min minimum runtime, well before the borrower ends)."""
    jobs = [tj(i, 0.0, 4, 36_000.0, queue="a", tier=3) for i in range(2)] + [tj(2, 3600.0, 4, 600.0, queue="b", tier=3)]
    r = run(jobs, preset, 8, check=True)
    conserved(r, 8)
    by_id = {j.job_id: j for j in r.jobs}
    assert all(j.finished_at is not None for j in r.jobs)
    assert by_id["2"].attempts[0].admitted_at < 3600.0 + 120.0
    assert sum(by_id[i].preemptions for i in "01") == 1


def test_a_preempted_job_keeps_its_place_in_kueue() -> None:
    # 0 runs from 0; 1 waits from 500; tier-1 job 2 preempts 0 at 1000 and runs 100 s. Kueue
    # orders the requeued 0 by its creation (0 s, before 1); ordered by its requeue time, it
    # would go after 1.
    jobs = [
        tj(0, 0.0, 8, 5000.0, tier=3, resumable=False),
        tj(1, 500.0, 8, 300.0, tier=3),
        tj(2, 1000.0, 8, 100.0, tier=1),
    ]
    kueue = build_preset("kueue", entitlements({}, ["default"], 8), 8)
    assert kueue.policy.scheduling.requeue_timestamp == "submit"
    scheduling = kueue.policy.scheduling.model_copy(update={"requeue_timestamp": "eviction"})
    by_eviction = SimPolicy("kueue", kueue.policy.model_copy(update={"scheduling": scheduling}), kueue.behaviour)
    from warden.sim.simulator import Simulation

    for sp, first in ((kueue, "0"), (by_eviction, "1")):
        r = {j.job_id: j for j in Simulation(trace(jobs), pool(8), sp).run().jobs}
        assert r["0"].preemptions == 1
        after = {jid: j.attempts[-1].admitted_at for jid, j in r.items() if jid != "2"}
        assert min(after, key=after.__getitem__) == first, (sp.policy.scheduling, after)


def test_kueue_gives_freed_capacity_to_waiting_in_quota_jobs_before_a_borrower() -> None:
    # Queues a and b, 4 GPUs of nominal each on 8. b's jobs 0 and 1 take the pool (1 borrows);
    # a's job 2 reclaims 1 at 100. When 2 ends, a's job 3 (waiting since 200, in-quota) and the
    # requeued 1 (older, would borrow) want its GPUs: Kueue admits the in-quota head first, so
    # b loses one job once. Ranked by priority and creation time alone, 1 borrows them and 3
    # reclaims from b at once (0, the newest of b's running jobs as the pass starts).
    jobs = [
        tj(0, 0.0, 4, 5000.0, queue="b"),
        tj(1, 1.0, 4, 5000.0, queue="b"),
        tj(2, 100.0, 4, 200.0, queue="a"),
        tj(3, 200.0, 4, 1000.0, queue="a"),
    ]
    kueue = build_preset("kueue", entitlements({}, ["a", "b"], 8), 8)
    assert kueue.policy.scheduling.nominal_first
    scheduling = kueue.policy.scheduling.model_copy(update={"nominal_first": False})
    plain = SimPolicy("kueue", kueue.policy.model_copy(update={"scheduling": scheduling}), kueue.behaviour)
    from warden.sim.simulator import Simulation

    counts = {}
    for sp in (kueue, plain):
        r = {j.job_id: j for j in Simulation(trace(jobs), pool(8), sp).run().jobs}
        assert all(j.finished_at is not None for j in r.values())
        counts[sp.policy.scheduling.nominal_first] = r["0"].preemptions + r["1"].preemptions
        if sp is kueue:
            assert r["3"].attempts[0].admitted_at == r["2"].finished_at  # straight into 2's GPUs
    assert counts == {True: 1, False: 2}


def test_slurm_holds_a_requeued_job_and_restarts_its_age() -> None:
    # 0 holds the pool until 500 while 1 waits; 1 runs from 500 and is preempted at 1000 by a
    # tier-1 job; it exits at once (no SIGTERM handling). Slurm resets a requeued job's submit
    # time (its age starts again) and holds it 121 s; governed keeps the 500 s it waited.
    jobs = [
        tj(0, 0.0, 8, 500.0, tier=3),
        tj(1, 0.0, 8, 5000.0, tier=3, resumable=False),
        tj(2, 1000.0, 8, 10.0, tier=1),
    ]
    seen: dict[str, float] = {}
    for preset in ("slurm", "governed"):
        t = trace([replace(j, lease=0.0) for j in jobs])
        sp = build_preset(preset, entitlements({}, ["default"], 8), 8)

        def note(snap: Any, plan: Any, now: float, preset: str = preset) -> None:
            for j in snap.jobs:
                if j.id == "1" and j.state.waiting and j.preempted_at:
                    seen[preset] = j.waited

        from warden.sim.simulator import Simulation

        r = {j.job_id: j for j in Simulation(t, pool(8), sp, on_pass=note).run().jobs}
        if preset == "slurm":
            assert r["1"].attempts[1].admitted_at == 1000.0 + 121.0  # the 10 s job ended long before
    assert seen == {"slurm": 0.0, "governed": 500.0}


def test_the_written_out_checkpoint_is_replace() -> None:
    """The simulator builds a checkpointed pod's job field by field: it must equal what
    `dataclasses.replace` gives (tests/engine/test_lifecycle.py checks that the constructor it
    goes through names every field of `Job`)."""
    from warden.engine.model import Attempt, Job, JobState, ReplicaPlacement
    from warden.sim.simulator import _checkpointed

    a = Attempt(2, 10.0, (ReplicaPlacement("n0", (0, 1)),), True, 30.0, 4.0, 50.0, 6.0, 70.0, 80.0)
    job = Job(
        "7", "q", 2, 1.0, JobState.RUNNING, 2, 2, 500, 1024, "a100", "pack", "ana",
        600.0, 90.0, 3600.0, 12.0, 5.0, 9.0, (3.0,), True, a,
    )  # fmt: skip
    assert _checkpointed(job, a, 8.0, 60.0) == replace(
        job, attempt=replace(a, checkpoint_s=8.0, last_checkpoint_at=60.0)
    )


# ------------------------------------------------------------------------ the maximum wait


def _starved_queue_run(max_wait: str) -> tuple[SimRun, float]:
    """Queue `b` used the whole 8-GPU pool for 20 h; then queue `a` floods it with 20-minute
    1-GPU tier-3 jobs (8 at once, then one every 2 minutes for 10 h, faster than they finish) and `b` asks for
    4 GPUs at tier 3. Fair share ranks `a` first for all the flood (its decayed usage stays
    below `b`'s), no quota or lower tier can be taken, and `a`'s jobs end too late to use a
    reservation: only the maximum wait can bring `b`'s job forward. Returns the run and `b`'s
    job's wait."""
    from warden.engine.policy import parse_policy
    from warden.sim.simulator import Simulation

    flood_at = 20 * 3600.0
    jobs = [tj(0, 0.0, 8, flood_at, queue="b")]
    jobs += [tj(1 + k, flood_at + 120.0 * max(0, k - 7), 1, 1200.0, queue="a") for k in range(300)]
    jobs.append(tj(1000, flood_at + 60.0, 4, 600.0, queue="b"))
    data = {
        "queues": {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]},
        "fair_share": {"aging": {"max_wait": {"default": max_wait}}},
    }
    sp = SimPolicy("starve", parse_policy(data, "<test>"))
    rng = random.Random(0)
    sim = Simulation(trace(jobs), pool(8), sp, on_pass=lambda snap, plan, now: check_pass(snap, plan, now, rng))
    r = sim.run()
    (late,) = [j for j in r.jobs if j.job_id == "1000"]
    assert late.wait_s is not None
    return r, late.wait_s


def test_a_starving_job_reserves_and_starts_before_its_maximum_wait() -> None:
    max_wait = 2 * 3600.0
    r, wait = _starved_queue_run("2h")
    # It starves at 0.75 of its maximum wait (`escalate_at`), goes first in tier 3, reserves the
    # GPUs that free first, and `a`'s later jobs may not take them (they end after it is due):
    # it starts once four 20-minute jobs have ended, inside its maximum wait.
    assert 0.75 * max_wait <= wait < 0.75 * max_wait + 1200.0 + 120.0
    assert r.max_wait == {"a": max_wait, "b": max_wait}


def test_without_a_reachable_maximum_wait_the_same_job_waits_out_the_flood() -> None:
    _, wait = _starved_queue_run("48h")
    assert wait > 9 * 3600.0  # behind every one of `a`'s jobs: what the bound above prevents


def test_usage_is_charged_up_to_a_release_even_when_no_pass_runs_between() -> None:
    """A job that ends between two passes is charged for its whole run: the ledger is brought
    up to each change of a queue's rate, not only to the passes."""
    import math

    from warden.engine.policy import parse_policy
    from warden.sim.simulator import Simulation

    data = {"queues": {"name": "cluster", "children": [{"name": "a"}, {"name": "b"}]}}
    sp = SimPolicy("usage", parse_policy(data, "<test>"))
    jobs = [tj(0, 0.0, 8, 20 * 3600.0, queue="b"), tj(1, 30 * 3600.0, 2, 60.0, queue="a")]
    seen: dict[float, dict[str, float]] = {}
    Simulation(
        trace(jobs), pool(8), sp, on_pass=lambda snap, plan, now: seen.update({now: dict(snap.ledger.usage)})
    ).run()
    h = sp.policy.fair_share.half_life
    # b held the whole pool (dominant share 1) for 20 h, then nothing for 10 h, decaying since
    expected = h / math.log(2) * (1 - 0.5 ** (20 * 3600.0 / h)) * 0.5 ** (10 * 3600.0 / h)
    assert seen[30 * 3600.0]["b"] == pytest.approx(expected, rel=1e-9)
