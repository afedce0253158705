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
    (40, 8, 120, 60, 1, "default"): "218ccc53dcc9ba7ee85e76416b74aa9199f14cef9db670624e6c2f3078f2a2ca",
    (40, 8, 120, 60, 2, "default"): "f407699c5ad216c02355f2e5e73de513d9b142561ecc9ae66105705c5429fcbe",
    (40, 8, 120, 60, 3, "default"): "e504a2ec85fc2b1ad4fac8240d4c1f07692ddd0b96e443dfa472ce0bedd8f527",
    (40, 8, 120, 60, 4, "default"): "ee8a836af0a606baefe26e0f939ef50d6147d41a9f305adab776265d3298561f",
    (40, 8, 120, 60, 5, "default"): "ae6354e19f769ebe20e3b66bec749114b516dc22c3cd00eaf6cdcb57b94291c7",
    (40, 8, 120, 60, 6, "default"): "4dfdb35a1425bcdb52be8307712de9ae70c430f39fb9d147f6179dc4a2f3ad35",
    (40, 8, 120, 60, 7, "default"): "6e5680d15dec4dca935dd5e1e3f02907a9da7046bc2cb4853891e59f5c2be420",
    (40, 8, 120, 60, 8, "default"): "4eb3d0ada2710798af1fe5fe50c8776fa84893a71fceba6fa2f199dce557afef",
    (40, 8, 120, 60, 9, "default"): "785db03ef523947b7bcec2da37e584e430dc2a697e95da92410afa78ffd5b30f",
    (40, 8, 120, 60, 10, "default"): "24697dc7cfa83f3d98bcab74ae7be0a77f341b0e9d6b4a5a3f82e27f05bd6cb7",
    (40, 8, 120, 60, 11, "default"): "170780d95f4280482e294e59ca4703f6cde76960b2f83a89e7b9f38d2cbf231d",
    (40, 8, 120, 60, 12, "default"): "e7e9b40a35d12707847243286694e38c131263559130c27720559e1338dc8865",
    (40, 8, 120, 60, 13, "default"): "c9bfb7ea6362b80f9485308cb7d97280411a65b6543ba1b8f21c7040564e37b6",
    (40, 8, 120, 60, 14, "default"): "b4f7367bf7b32e146459986cf68940e8ae6ac838291372e6d23dd6c11ad86fa4",
    (40, 8, 120, 60, 15, "default"): "6c1d0ce0a5567c094ee8889b4dd58ab112aa565731ca55fded7699a945f087f7",
    (40, 8, 120, 60, 16, "default"): "8328ebe0bf41cd864f7e450d63f3e1b9c2e1dcab8a6ca738429f69548db6e70b",
    (40, 8, 120, 60, 17, "default"): "6c12fa7e4c76c33031ec3c52e734bc7031c985331fe233143c37c05e8f6ffb39",
    (40, 8, 120, 60, 18, "default"): "6efa793bbd15eda80a6c0a315d6c4623268fb4a9de3923d1390486dc8e8ac117",
    (40, 8, 120, 60, 19, "default"): "ddfca8b89cc937cfe395028abd300f2cf410eecd341c46f0a6341a9513182193",
    (40, 8, 120, 60, 20, "default"): "97d33cc6dd21c30b2bf3cf43bab0ca57a07982a3794a0c4217e4cc22c365b138",
    (40, 8, 120, 60, 0, "newest"): "154fb150e5c4d2332cf38f39184753a1ee1b164f6c3016ed7539dbe7756305ed",
    (40, 8, 120, 60, 0, "smallest"): "eff8f90fc45a9d7a6f21f9af16e157e8c01a9a55f367ff5f6c243b750871441f",
    (40, 8, 120, 60, 0, "reservations"): "57e49962c185c6ec2f71a53a59c3fabc4efefa4473649acc69c1cb4a04a3bdbf",
    (40, 8, 120, 60, 0, "strict"): "0249b78f3a33eed707aa37e75f879cbdbff87e23b26627d4e7ee6a738bbdc1b0",
    (40, 8, 120, 60, 0, "fifo"): "945c2b472c44515e4ead76fc20066a05323b3c6cfd57e6b156f69d8faad4745f",
    (40, 8, 120, 60, 1, "newest"): "218ccc53dcc9ba7ee85e76416b74aa9199f14cef9db670624e6c2f3078f2a2ca",
    (40, 8, 120, 60, 1, "smallest"): "c9f7ebf1bac2c63b9c4c59e00796fa019aef39aca2c0b651c694e05eec961419",
    (40, 8, 120, 60, 1, "reservations"): "9733ef8ab1a5f9f81ec6670c64940f3202774220f8cd1b608b05d6b0a87ef017",
    (40, 8, 120, 60, 1, "strict"): "e60fb486a42b87147a2aaefc6c56e343a7d4dcfde55415c27d29b34394c6d45d",
    (40, 8, 120, 60, 1, "fifo"): "e3c78d13030ac142224ee74b3bf0d602928bc95d6e5fd94286517e2b3cfa5b92",
    (40, 8, 120, 60, 2, "newest"): "f407699c5ad216c02355f2e5e73de513d9b142561ecc9ae66105705c5429fcbe",
    (40, 8, 120, 60, 2, "smallest"): "de83e486b9d81ca0c6ff89da2e4bf34fa9595a6e3576a511faba91730aa2a921",
    (40, 8, 120, 60, 2, "reservations"): "13ab22e169dfa4a4d908ffe253a68e375dbba34872fd439b5934db86ece0d62b",
    (40, 8, 120, 60, 2, "strict"): "40d3b0a4dcfca72d48c7c5c2ec1c6d667b2b0ed60851d825200cf42d55ab4ca9",
    (40, 8, 120, 60, 2, "fifo"): "93d328736a260674961050e31f95402393d871a5cf01ac6482ea2c2a12376dd9",
    (250, 8, 1500, 1200, 1, "default"): "04dc01753459bfbb466bc8e44636db0ba3f8fba5a5e84db47a3213307fe9ffe4",
    (250, 8, 1500, 1200, 2, "reservations"): "d00b2df42d9efc5909715b6b5990719982dad449b1cf0a3f8f9ac2c4ae6674c7",
    (300, 4, 900, 1500, 0, "smallest"): "379184d042b146964d535d25f47e4e074c59fe51d095036daa22158a1ef368bf",
    (250, 8, 1500, 1200, 3, "newest"): "d584c269356e40be7aa14a0ae99accc15a92c2318cc74d974d5bdc353d5d4c9c",
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
