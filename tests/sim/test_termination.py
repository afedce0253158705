"""Every simulation ends: on small flavored, blocked clusters under every preset, the event loop
finishes within a bounded number of passes and its loop guards never fire.

A pass runs only when something happened (an arrival, a completion, an exit, a wake the plan
asked for), so a run that keeps passing without end is a scheduler that evicts jobs as fast as
it admits them: the victim of a preemption taken back into the capacity its preemptor freed,
the preemptor never admitted, the cycle repeating. `Simulation` raises `SimulationLoopError`
(naming the jobs) past `max_passes_per_instant` passes at one moment or past `max_passes` in
all; these tests give the run a bound proportional to its jobs and require that neither fires.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import engine_runs

from warden.engine.model import Node
from warden.sim.cluster import parse_cluster
from warden.sim.presets import PRESETS, build_preset, entitlements
from warden.sim.records import SimRun, Trace, TraceJob
from warden.sim.simulator import Simulation, SimulationLoopError

FLAVORS = ("a100", "h100")


def pass_bound(jobs: int) -> int:
    """Passes a run of `jobs` jobs may take. Each job brings at most an arrival and a completion
    pass, each preemption an exit pass and a back-off wake, and a Kueue cycle one pass per held
    admission; twenty per job leaves room for several preemptions of every job."""
    return 20 * jobs + 100


def cluster(groups: int, count: int, gpus: int, block: int | None, flavors: int) -> tuple[Node, ...]:
    """`groups` node groups of `count` nodes, flavors alternating, `block` nodes per topology block."""
    return parse_cluster(
        {
            "nodes": [
                {
                    "name": f"g{i}",
                    "count": count,
                    "gpus": gpus,
                    "flavor": FLAVORS[i % flavors],
                    "nodes_per_block": block,
                }
                for i in range(groups)
            ]
        }
    )


def trace_of(rows: list[dict[str, Any]]) -> Trace:
    jobs = [TraceJob(str(i), **row, seq=i) for i, row in enumerate(rows)]
    jobs.sort(key=lambda j: (j.submit, j.seq))
    return Trace(tuple(replace(j, seq=k) for k, j in enumerate(jobs)), "generated", "native")


def simulate(nodes: tuple[Node, ...], trace: Trace, preset: str, quotas: dict[str, float]) -> SimRun:
    gpus = sum(n.gpus for n in nodes)
    names = sorted({j.queue for j in trace.jobs})
    sp = build_preset(preset, entitlements(quotas, names, gpus), gpus)
    return Simulation(trace, nodes, sp, max_passes=pass_bound(len(trace.jobs))).run()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[tuple[Node, ...], Trace, dict[str, float]]:
    """A cluster of 1–4 groups × 1–4 nodes of 4 or 8 GPUs (one or two flavors, blocks of 1, 2
    or 4 nodes, or none) and a few dozen jobs of every tier, some pinned to a flavor, some
    gangs of whole nodes, with or without checkpoints, arriving in bursts."""
    gpus = draw(st.sampled_from([4, 8]))
    nodes = cluster(
        draw(st.integers(1, 4)),
        draw(st.integers(1, 4)),
        gpus,
        draw(st.sampled_from([None, 1, 2, 4])),
        draw(st.sampled_from([1, 2])),
    )
    flavors = sorted({n.flavor for n in nodes})
    rows = []
    for _ in range(draw(st.integers(10, 40))):
        size = draw(st.sampled_from([1, 2, 4, 8, 16]))
        replicas = size // gpus if size > gpus else 1
        rows.append(
            {
                "submit": 50.0 * draw(st.integers(0, 60)),
                "num_gpus": size,
                "duration": float(draw(st.integers(30, 5000))),
                "queue": draw(st.sampled_from("abc")),
                "tier": draw(st.integers(1, 4)),
                "replicas": replicas,
                "gpus_per_replica": size // replicas,
                "flavor": draw(st.sampled_from([None, None, *flavors])),
                "resumable": draw(st.booleans()),
                "checkpoint_interval": draw(st.sampled_from([None, 300.0, 900.0])),
                "checkpoint_seconds": draw(st.sampled_from([0.0, 20.0, 200.0])),
                "startup_seconds": draw(st.sampled_from([0.0, 15.0, 60.0])),
                "lease": draw(st.sampled_from([0.0, None])),
            }
        )
    quotas = draw(st.one_of(st.just({}), st.fixed_dictionaries({q: st.integers(0, 32).map(float) for q in "abc"})))
    return nodes, trace_of(rows), quotas


def _terminates(scenario: tuple[tuple[Node, ...], Trace, dict[str, float]], preset: str) -> None:
    nodes, trace, quotas = scenario
    run = simulate(nodes, trace, preset, quotas)  # SimulationLoopError fails the test
    assert run.passes <= pass_bound(len(trace.jobs))
    if preset != "k8s":
        # Pod by pod, two gangs of one tier can each hold part of the cluster and wait for the
        # rest forever (Kubernetes without gang scheduling); every other preset finishes all.
        assert all(j.finished_at is not None for j in run.jobs)


def _job(
    submit: float, gpus: int, duration: float, queue: str, tier: int, flavor: str | None = None, resumable: bool = False
) -> dict[str, Any]:
    replicas = gpus // 8 if gpus > 8 else 1
    return {
        "submit": submit,
        "num_gpus": gpus,
        "duration": duration,
        "queue": queue,
        "tier": tier,
        "replicas": replicas,
        "gpus_per_replica": gpus // replicas,
        "flavor": flavor,
        "resumable": resumable,
        "lease": 0.0,
    }


RECLAIM_CYCLE = [
    _job(600, 32, 7645, "b", 2),
    _job(950, 4, 1407, "b", 1),
    _job(1000, 8, 1833, "b", 4),
    _job(1300, 1, 765, "b", 3),
    _job(1400, 4, 6609, "b", 4),
    _job(1550, 8, 2140, "b", 3),
    _job(1550, 4, 5296, "b", 1),
    _job(1700, 8, 2347, "b", 1),
    _job(1700, 2, 2495, "b", 3, "h100"),
    _job(1850, 16, 6569, "b", 2),
    _job(1850, 4, 5132, "b", 4),
    _job(1950, 4, 5327, "b", 3),
    _job(2100, 16, 520, "b", 3, resumable=True),
    _job(2350, 8, 7410, "b", 3),
    _job(2400, 1, 7005, "b", 4),
    _job(2450, 8, 5659, "a", 3, "h100"),
]
"""Queue b borrows most of the cluster when a's 8-GPU h100 job arrives at 2450 s and reclaims.
Before the shell kept the claims of `Plan.claims`, each victim (jobs of b that do not save on
SIGTERM, so they exit at once) was admitted again into the GPUs it had just freed, a's job was
never admitted, and the pass repeated at t=2450 s until the guard stopped it."""


def test_the_reclaim_cycle_on_a_flavored_cluster_ends() -> None:
    # 4 groups of 4 × 8-GPU nodes, a100 and h100 alternating, topology blocks of 4 nodes.
    nodes = cluster(4, 4, 8, 4, 2)
    run = simulate(nodes, trace_of(RECLAIM_CYCLE), "kueue", {})
    assert all(j.finished_at is not None for j in run.jobs)
    reclaimer = next(j for j in run.jobs if j.queue == "a")
    assert reclaimer.attempts[0].admitted_at < 2450 + 60  # its victims' capacity went to it
    assert max(j.preemptions for j in run.jobs) <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), preset=st.sampled_from([p for p in PRESETS if engine_runs(p)]))
def test_every_simulation_ends_without_tripping_the_loop_guard(scenario: Any, preset: str) -> None:
    _terminates(scenario, preset)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), preset=st.sampled_from(["kueue", "slurm", "governed", "k8s"]))
def test_every_simulation_ends_without_tripping_the_loop_guard_long(scenario: Any, preset: str) -> None:
    _terminates(scenario, preset)


def test_the_guards_name_the_jobs_they_stop_on() -> None:
    nodes = cluster(1, 1, 8, None, 1)
    rows = [_job(100.0 * k, 8, 50, "a", 3) for k in range(3)]
    sp = build_preset("kueue", entitlements({}, ["a"], 8), 8)
    # A bound on all passes: the third arrival needs a third pass.
    with pytest.raises(SimulationLoopError, match=r"more than max_passes=2 scheduling passes by t=200s"):
        Simulation(trace_of(rows), nodes, sp, max_passes=2).run()
    # A pass that changed nothing may not ask for another one at the same moment.
    sim = Simulation(trace_of(rows), nodes, sp)
    sim.run()
    with pytest.raises(SimulationLoopError, match=r"t=5s changed nothing .* for 1, 2"):
        sim._wake_for(5.0, 5.0, False, ["1", "2"])
    sim._wake_for(5.0, 5.0, True, ["1"])  # after a change it is one more pass at that moment
