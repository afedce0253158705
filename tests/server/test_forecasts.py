"""The server's forecaster: a forecast per new pass, sized from what a pass cost last time."""

from __future__ import annotations

from dataclasses import replace

from support import nodes, pending, policy, running

from warden.engine.model import Snapshot
from warden.server.forecasts import MAX_PASSES, MIN_PASSES, Forecasts


def test_one_forecast_per_pass_its_estimates_and_its_reach_set_from_the_cost_of_a_pass() -> None:
    ends = tuple(replace(running(f"r{i}", "a", 3, (f"n{i}", 8), 0.0), time_limit=60.0 * (i + 1)) for i in range(3))
    waiting = tuple(pending(f"p{i}", "a", 3, gpus=8, submit=float(i), time_limit=600.0) for i in range(3))
    one_queue = policy(queues={"name": "cluster", "children": [{"name": "a", "nominal": {"gpu": 24}}]})
    last: list[tuple[Snapshot, float] | None] = [None]
    f = Forecasts(lambda: last[0], budget_s=0.5)
    assert f.passes == MIN_PASSES  # the first forecast's cost is unknown: it looks a short way
    assert not f.refresh() and f.as_of is None  # no pass yet

    last[0] = (Snapshot(nodes(3), ends + waiting, one_queue), 10.0)
    assert f.refresh()
    assert f.as_of == 10.0
    assert {i: e.at for i, e in f.estimates.items()} == {"p0": 60.0, "p1": 120.0, "p2": 180.0}
    assert MIN_PASSES <= f.passes <= MAX_PASSES
    assert not f.refresh()  # the same pass is not forecast twice
