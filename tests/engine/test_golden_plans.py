"""Golden plans: what the engine answers for seeded synthetic clusters, pinned by digest.

Why: the engine is tuned for speed (one pass over a deep queue must stay cheap), and every such
change must leave every plan exactly as it was — admissions, preemptions, reservations and each
explanation with its reason, sort key and position. The property tests check invariants (and
that a warm engine answers as a fresh pass does); these check identity.

A change that alters plans on purpose regenerates them and says why in its commit:

    python tests/engine/test_golden_plans.py
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from random import Random
from typing import Any

import pytest

from warden.bench.engine import synthetic_policy, synthetic_snapshot
from warden.engine.model import Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import parse_policy
from warden.engine.scheduler import Engine, schedule

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "newest": {"preemption": {"victim_order": "newest"}},
    "smallest": {"preemption": {"victim_order": "smallest", "max_attempts_per_pass": 40}},
    "reservations": {"scheduling": {"reservations": 3}, "preemption": {"max_attempts_per_pass": 64}},
    "strict": {"scheduling": {"head_of_line_blocking": True}},
    "fifo": {"scheduling": {"order": "fifo"}},
}

# (nodes, gpus per node, pending, running, seed, policy variant) → digest of the plan.
GOLDEN: dict[tuple[int, int, int, int, int, str], str] = {
    (40, 8, 120, 60, 0, "default"): "154fb150e5c4d2332cf38f39184753a1ee1b164f6c3016ed7539dbe7756305ed",
    (40, 8, 120, 60, 1, "default"): "789b3cba46dd3947de009cda1f9ef64d0df473e0d2d99889de140c3ce143d691",
    (40, 8, 120, 60, 2, "default"): "f407699c5ad216c02355f2e5e73de513d9b142561ecc9ae66105705c5429fcbe",
    (40, 8, 120, 60, 3, "default"): "0adac66af20a5728d32a4bd9dcad1eb5823230e7d7525e955faef864401d3db0",
    (40, 8, 120, 60, 4, "default"): "ee8a836af0a606baefe26e0f939ef50d6147d41a9f305adab776265d3298561f",
    (40, 8, 120, 60, 5, "default"): "2cb848762e8b9b03226b8fd1e1ff0ce076095dee944f8abf2e6ca5271161ef98",
    (40, 8, 120, 60, 6, "default"): "4dfdb35a1425bcdb52be8307712de9ae70c430f39fb9d147f6179dc4a2f3ad35",
    (40, 8, 120, 60, 7, "default"): "6e5680d15dec4dca935dd5e1e3f02907a9da7046bc2cb4853891e59f5c2be420",
    (40, 8, 120, 60, 8, "default"): "62b2a48b7091f96e55e902a3ed088b7df93cca4d5d816c32a7a26a195237e816",
    (40, 8, 120, 60, 9, "default"): "785db03ef523947b7bcec2da37e584e430dc2a697e95da92410afa78ffd5b30f",
    (40, 8, 120, 60, 10, "default"): "24697dc7cfa83f3d98bcab74ae7be0a77f341b0e9d6b4a5a3f82e27f05bd6cb7",
    (40, 8, 120, 60, 11, "default"): "170780d95f4280482e294e59ca4703f6cde76960b2f83a89e7b9f38d2cbf231d",
    (40, 8, 120, 60, 12, "default"): "217589f7a0341800a1bbd89205f313dd8fdbeeae3d3829e82db32ce0817613e1",
    (40, 8, 120, 60, 13, "default"): "2562bd282b404b98f2393f4f044635b90d7d7433a864f0fcc8b4cb5909286e93",
    (40, 8, 120, 60, 14, "default"): "b4f7367bf7b32e146459986cf68940e8ae6ac838291372e6d23dd6c11ad86fa4",
    (40, 8, 120, 60, 15, "default"): "6c1d0ce0a5567c094ee8889b4dd58ab112aa565731ca55fded7699a945f087f7",
    (40, 8, 120, 60, 16, "default"): "8328ebe0bf41cd864f7e450d63f3e1b9c2e1dcab8a6ca738429f69548db6e70b",
    (40, 8, 120, 60, 17, "default"): "6c12fa7e4c76c33031ec3c52e734bc7031c985331fe233143c37c05e8f6ffb39",
    (40, 8, 120, 60, 18, "default"): "7d2b1235a131f8fca7a51ace0d12bd4881fd0fd301f422a404f33c861dae49c1",
    (40, 8, 120, 60, 19, "default"): "36e8caf7e7c88723b693537a49396b561684bdbf2a9a574ec71c5ca0b68c58de",
    (40, 8, 120, 60, 20, "default"): "97d33cc6dd21c30b2bf3cf43bab0ca57a07982a3794a0c4217e4cc22c365b138",
    (40, 8, 120, 60, 0, "newest"): "154fb150e5c4d2332cf38f39184753a1ee1b164f6c3016ed7539dbe7756305ed",
    (40, 8, 120, 60, 0, "smallest"): "eff8f90fc45a9d7a6f21f9af16e157e8c01a9a55f367ff5f6c243b750871441f",
    (40, 8, 120, 60, 0, "reservations"): "57e49962c185c6ec2f71a53a59c3fabc4efefa4473649acc69c1cb4a04a3bdbf",
    (40, 8, 120, 60, 0, "strict"): "0249b78f3a33eed707aa37e75f879cbdbff87e23b26627d4e7ee6a738bbdc1b0",
    (40, 8, 120, 60, 0, "fifo"): "1a8e91ed61bbd0540fa67dc59491f9e8ad4b8075d309dde0b4fb27025044bfa4",
    (40, 8, 120, 60, 1, "newest"): "789b3cba46dd3947de009cda1f9ef64d0df473e0d2d99889de140c3ce143d691",
    (40, 8, 120, 60, 1, "smallest"): "31c4e118ef024bb6c3a3578a0016bd92bbe302eb021b6bc5cd160eb7e5b7f753",
    (40, 8, 120, 60, 1, "reservations"): "e299b3efe1dab179b28782cb69ba054dd59b959ea5e8da5812d7135c069df3e1",
    (40, 8, 120, 60, 1, "strict"): "51908ac3681dbd1d2ce764cb854665fa6df25d753bc3e577d663c6d888e98a6f",
    (40, 8, 120, 60, 1, "fifo"): "0651cbb1d78d7a262b09b16bcb5f858c85b55fa9238f9b8749b80de8572fc67a",
    (40, 8, 120, 60, 2, "newest"): "f407699c5ad216c02355f2e5e73de513d9b142561ecc9ae66105705c5429fcbe",
    (40, 8, 120, 60, 2, "smallest"): "de83e486b9d81ca0c6ff89da2e4bf34fa9595a6e3576a511faba91730aa2a921",
    (40, 8, 120, 60, 2, "reservations"): "95487a4b5e400a793370721ad14c51d9dac376e6d4820c2d3ba590624a6b1fbb",
    (40, 8, 120, 60, 2, "strict"): "40d3b0a4dcfca72d48c7c5c2ec1c6d667b2b0ed60851d825200cf42d55ab4ca9",
    (40, 8, 120, 60, 2, "fifo"): "93d328736a260674961050e31f95402393d871a5cf01ac6482ea2c2a12376dd9",
    (250, 8, 1500, 1200, 1, "default"): "f706c0f293760121e076145c4a793baa2ab14ff0c84c9b00f5ca06240283635d",
    (250, 8, 1500, 1200, 2, "reservations"): "d0b4bd9bd67717498cdb53440edd79d5ab68d9b423c2f3fdaaeaf7ce354a8ed7",
    (300, 4, 900, 1500, 0, "smallest"): "b809663f933992a4fa641f0d7f83da28a6a364be9b578ccac0b816e5ef68235b",
    (250, 8, 1500, 1200, 3, "newest"): "847431f5b60a1ed1a11e5cd4276afd860de1c430a4f73ee380fbfbc143909a4b",
}


def snapshot(nodes: int, gpus: int, pending: int, running: int, seed: int, variant: str) -> tuple[Snapshot, float]:
    """The benchmark's synthetic cluster, with one of `VARIANTS` merged into its policy."""
    snap, now = synthetic_snapshot(nodes, gpus, pending, running, seed)
    if variant != "default":
        # `synthetic_snapshot` draws the policy first from Random(seed): the same policy again.
        data, _ = synthetic_policy(nodes * gpus, Random(seed))
        data.update(VARIANTS[variant])
        snap = dataclasses.replace(snap, policy=parse_policy(data))
    return snap, now


def canonical(plan: Plan) -> dict[str, Any]:
    """Everything a plan says, as plain JSON (floats written exactly, explanations in order)."""
    return {
        "now": plan.now,
        "admissions": [
            [a.job_id, [[p.node, list(p.gpus)] for p in a.placement], a.flavor, a.borrowing] for a in plan.admissions
        ],
        "preemptions": [[p.job_id, p.for_job, p.kind, p.grace, p.cost, p.lost_work] for p in plan.preemptions],
        "reservations": [[r.job_id, r.due, list(r.nodes), list(r.waits_for)] for r in plan.reservations],
        "explanations": [
            [job_id, e.job_id, e.reason.code, e.reason.details(), e.sort_key.to_dict(), e.position]
            for job_id, e in plan.explanations.items()
        ],
    }


def digest(plan: Plan) -> str:
    text = json.dumps(canonical(plan), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("case", sorted(GOLDEN), ids=lambda c: "-".join(map(str, c)))
def test_plan_is_the_golden_one(case: tuple[int, int, int, int, int, str]) -> None:
    snap, now = snapshot(*case)
    plan = schedule(snap, now)
    assert digest(plan) == GOLDEN[case]
    # A warm engine, asked again (with and without an empty change set), answers the same.
    engine = Engine()
    assert engine.plan(snap, now) == plan
    assert engine.plan(snap, now) == plan
    assert engine.plan(snap, now, ()) == plan


def _cases() -> list[tuple[int, int, int, int, int, str]]:
    cases = [(40, 8, 120, 60, seed, "default") for seed in range(21)]
    cases += [(40, 8, 120, 60, seed, v) for seed in range(3) for v in VARIANTS if v != "default"]
    cases += [
        (250, 8, 1500, 1200, 1, "default"),
        (250, 8, 1500, 1200, 2, "reservations"),
        (300, 4, 900, 1500, 0, "smallest"),
        (250, 8, 1500, 1200, 3, "newest"),
    ]
    return cases


if __name__ == "__main__":
    for case in _cases():
        snap, now = snapshot(*case)
        print(f"    {case!r}: {digest(schedule(snap, now))!r},")
