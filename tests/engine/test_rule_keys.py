"""The keys the pass's fast paths group by are the rules' own declarations: preemptors alike in
what the pair rules declare they read of P get the same answers (`rules.preemptor_key`, which
keys `Memo.eligible`), and the pass's victim rows sort as `preemption.victim_key` does."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest
from test_rules import _cases, _random_preemptor, _random_victim
from test_victims import _policy, _victims

from warden.engine.allocation import Allocation
from warden.engine.demand import Demand
from warden.engine.fairshare import cluster_capacity
from warden.engine.model import Snapshot
from warden.engine.phases.state import PassState
from warden.engine.phases.victims import Victims
from warden.engine.preemption import VICTIM_ORDERS, Candidate, victim_key
from warden.engine.rules import (
    PAIR_READS,
    PAIR_RULES,
    PREEMPTOR_READS,
    RECLAIM,
    allowed,
    pair_key,
    preemptor_key,
    share,
    victim_cost,
)


def _with(p: object, path: str, value: object) -> object:
    """`p` with the attribute at `path` (dotted) replaced by `value`."""
    head, _, rest = path.partition(".")
    return replace(p, **{head: _with(getattr(p, head), rest, value) if rest else value})  # type: ignore[type-var]


@pytest.mark.parametrize("seed", range(3))
def test_pair_rules_read_only_the_fields_of_the_preemptor_they_declare(seed: int) -> None:
    rng = Random(seed + 200)
    for c, p, v in _cases(seed):
        other = _random_preemptor(rng, c)
        for rule in PAIR_RULES:
            alike = other
            for path in rule.of_preemptor:
                alike = _with(alike, path, _get(p, path))  # type: ignore[assignment]
            assert rule.check(c, alike, v) == rule.check(c, p, v), (rule.name, p, alike)
        same = other
        for path in PREEMPTOR_READS:
            same = _with(same, path, _get(p, path))  # type: ignore[assignment]
        assert preemptor_key(same) == preemptor_key(p)
        w = _random_victim(rng, "w")
        assert allowed(c, same, w) == allowed(c, p, w)
        assert pair_key(w) == (w.tier, w.queue)


@pytest.mark.parametrize("seed", range(3))
def test_reclaim_reads_only_the_fields_it_declares(seed: int) -> None:
    """Reclaim's queue-level answer (`RECLAIM.kind`) and whether P could reclaim at all
    (`RECLAIM.may`) read only the declared fields of V and of P, which the pass's keys contain."""
    rng = Random(seed + 300)
    assert set(RECLAIM.reads) <= set(PAIR_READS) and set(RECLAIM.of_preemptor) <= set(PREEMPTOR_READS)
    kinds = 0
    for c, p, v in _cases(seed):
        w = replace(_random_victim(rng, "w"), **{f: getattr(v, f) for f in RECLAIM.reads})
        assert RECLAIM.kind(c, p, w) == RECLAIM.kind(c, p, v), (p, v, w)
        alike = _random_preemptor(rng, c)
        for path in RECLAIM.of_preemptor:
            alike = _with(alike, path, _get(p, path))  # type: ignore[assignment]
        assert RECLAIM.may(c, alike) == RECLAIM.may(c, p)
        assert RECLAIM.kind(c, alike, v) == RECLAIM.kind(c, p, v)
        kinds += RECLAIM.kind(c, p, v) is not None
    assert kinds  # the cases reach reclaims


def _get(obj: object, path: str) -> object:
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@pytest.mark.parametrize("order", sorted(VICTIM_ORDERS))
@pytest.mark.parametrize("seed", range(2))
def test_the_pass_takes_victims_in_victim_key_order(order: str, seed: int) -> None:
    rng = Random(seed)
    pol = _policy(order)
    cluster, jobs = _victims(rng, 300)
    snap = Snapshot(cluster, tuple(jobs), pol)
    alloc = Allocation(cluster, pol)
    alloc.sync(jobs)
    now = 60_000.0
    demand = Demand()
    demand.sync(pol, jobs)
    owed = demand.owed(pol, alloc.quota, cluster_capacity(cluster)[0]) if alloc.quota.gpu >= 0 else None
    state = PassState(snap, now, alloc, {}, {}, owed)
    pool = Victims(state).pool().free_now
    assert pool
    q = state.quota

    def key(c: Candidate) -> tuple[float | int | str, ...]:
        return victim_key(order, c.job, victim_cost(pol, c.job, now)[0], share(state.ctx, q.index[c.job.queue]))

    expected = sorted(pool, key=key)
    assert [c.job.id for c in pool] == [c.job.id for c in expected]
    assert [c.rank for c in pool] == list(range(len(pool)))
