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
    (40, 8, 120, 60, 0, "default"): "4b21915b951a7ba7bd22aeb191dafaf191157ad7525cd416d8f39bcb4ab11fcc",
    (40, 8, 120, 60, 1, "default"): "e21db668242618a4ce27ff50b16e298a4ad53b748c39c77429f1330ed7d980bd",
    (40, 8, 120, 60, 2, "default"): "9e500b4af2163db964f05a3bd4df37da93d769b757056c0e200b0b0072cfe371",
    (40, 8, 120, 60, 3, "default"): "5a415e09e5900b1ca5df51dc11d3acfe6611645160efd350f325474e535ecd1b",
    (40, 8, 120, 60, 4, "default"): "3d4f3cc6b148245ec059cd16182346f49ecc81253e9938262f4c406570bb90b4",
    (40, 8, 120, 60, 5, "default"): "667f352f0269103b876caa57b7c2bfb31dbd542dab5c220a60263e33dd345056",
    (40, 8, 120, 60, 6, "default"): "faac14958aa72867e1155e06ea9dc2d94cd3a85fd7e29d3b0052a82028f0bc15",
    (40, 8, 120, 60, 7, "default"): "9323a081ba74d612ff63ac3bc9d378105fa492a936825d8443652ab4db2ef828",
    (40, 8, 120, 60, 8, "default"): "67db674f610a3f429fde570ff19c4bf197fb6b0bb31363b724c7145843134f71",
    (40, 8, 120, 60, 9, "default"): "939503ae29f1a84a429eff584d8ad9fe905b9f85d9239229a8e3ea0cb37fda40",
    (40, 8, 120, 60, 10, "default"): "37913e8e0d98f9249272b37e9cfb3fa3e1f51fbf7df783a37d462715e6be6bc7",
    (40, 8, 120, 60, 11, "default"): "edd07c43822706a64b1effc7ee50b0767c5cd8c8c6e6c0483417ac55d45209e9",
    (40, 8, 120, 60, 12, "default"): "400a59253e6f0b5ae4ab384a97b6633a300365f4459fd5984657ba3560e98c0f",
    (40, 8, 120, 60, 13, "default"): "c96b70a2d942445a70119eff5d3035453c5e2341ef036b9522d65ed47c2b1d72",
    (40, 8, 120, 60, 14, "default"): "d2bcd7f746e3b5929117605dd7a41f3489b9d62d33b5095ee6bc624f90fb44e2",
    (40, 8, 120, 60, 15, "default"): "4efc895f49efe9cdbf6daa128334a92369fed828844f73b9d94e373e8bd9ce5c",
    (40, 8, 120, 60, 16, "default"): "8da0f3a0325d9a03e5b83d9f6fb32e384b31f880b9ddecd7e3c506ac2abd7c3b",
    (40, 8, 120, 60, 17, "default"): "9fc49c319e3c3e298e2f548ea8e2ccf5f889e2149123640907cee35a14a5098a",
    (40, 8, 120, 60, 18, "default"): "76d6470a0f55fb61070b27a700604a404d8ea4f365a375f8dfa50bbfedc68d54",
    (40, 8, 120, 60, 19, "default"): "79da92e8a33edac4489afeac07a1f01a7499e260c31bf121a468b037403de819",
    (40, 8, 120, 60, 20, "default"): "d5ac85461d987edd66f93fdc81e83b94abb7fa28a127e0a6e5188cef1513bccd",
    (40, 8, 120, 60, 0, "newest"): "4b21915b951a7ba7bd22aeb191dafaf191157ad7525cd416d8f39bcb4ab11fcc",
    (40, 8, 120, 60, 0, "smallest"): "26d6b7e0113f4b2567c2a1710ab53faf72eb5965848f3b7853ff19d0754e6257",
    (40, 8, 120, 60, 0, "reservations"): "c4a8f1ee703728740edd650c5a00d5bc30f35adfafa2342edf21ccb9cd14438a",
    (40, 8, 120, 60, 0, "strict"): "0249b78f3a33eed707aa37e75f879cbdbff87e23b26627d4e7ee6a738bbdc1b0",
    (40, 8, 120, 60, 0, "fifo"): "260a6ab3099e2c6dff885ddc8bdcbda59df2a5bfd274c047f3304e6dfa1f09e6",
    (40, 8, 120, 60, 1, "newest"): "e21db668242618a4ce27ff50b16e298a4ad53b748c39c77429f1330ed7d980bd",
    (40, 8, 120, 60, 1, "smallest"): "dff8b9d74484596e7d4c1b49abad65c2d5925536c77bf2b31f13b76f18601b3f",
    (40, 8, 120, 60, 1, "reservations"): "b96308043ab075b4ad3a0e402dc31d4ece731652996a071d7a2323a3b9a7772f",
    (40, 8, 120, 60, 1, "strict"): "8336d2c43fe4298a1d0a7daf2da1d467d891e5155f83c198673ec6c95a33d17b",
    (40, 8, 120, 60, 1, "fifo"): "8160b7f55ef1f2f3067685266b66927d65c1b578bece515abd6a14c078af745c",
    (40, 8, 120, 60, 2, "newest"): "9e500b4af2163db964f05a3bd4df37da93d769b757056c0e200b0b0072cfe371",
    (40, 8, 120, 60, 2, "smallest"): "d16a7aab1c41bb7a6375c64d753ab37efcdc825be87a78684ae998e2a4a9276d",
    (40, 8, 120, 60, 2, "reservations"): "102db4f505ce0f3ac5597b4e7419efa60cebed5d2ffe8decc281a86fe6803264",
    (40, 8, 120, 60, 2, "strict"): "0823b4c33438a47c52971c7b83240a3c8abaf794219c13f8a284030d8fe6c1d7",
    (40, 8, 120, 60, 2, "fifo"): "87f1b693098ed04883ccc4b31441def4d145ac0a4c80c07dd39203b290a26632",
    (250, 8, 1500, 1200, 1, "default"): "a174f70a92bd6c76e01382a590effbee51163497dfa8fe5892f52b80f8c92f38",
    (250, 8, 1500, 1200, 2, "reservations"): "12293b4c6fb8407311c1ad7f82a28aeb073cb7859e4659f397f7dcdc66b558f9",
    (300, 4, 900, 1500, 0, "smallest"): "6765adf512d167d5a2ab51412797944571708e0a88b6a041a17b4d9a7425d9c3",
    (250, 8, 1500, 1200, 3, "newest"): "a7f2de2cbeea7d58091708747f2b62dec27d918949956642c5d9635ee1298ecb",
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
