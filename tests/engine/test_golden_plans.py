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
    (40, 8, 120, 60, 0, "default"): "b4a491c586e34153ba3c8b8a542b142310cd8fe7eba23b5df0159a35d6d4bbf3",
    (40, 8, 120, 60, 1, "default"): "686935eca5d56aa9a869c02157742eb0ff4379f9c291465266f99431379e634d",
    (40, 8, 120, 60, 2, "default"): "c95d64958b55486782b9ebafd4c6783b487c8b2110efcb31f5b3f48de1218fec",
    (40, 8, 120, 60, 3, "default"): "bc246b9cd1e2519f2c4452677736f219234462c503b6113e1361846d53abe370",
    (40, 8, 120, 60, 4, "default"): "868d27be284263769dab179a6a6459772cbb9efb7ae51298500e10d30f3b8d42",
    (40, 8, 120, 60, 5, "default"): "5298079dfb6b03f52e356b76ff60396283f2e6b5efe2457ef43993fb5442890d",
    (40, 8, 120, 60, 6, "default"): "4f755d2ee8b14fd54d8c5ff8d69f460b1b084abce7a023d0a4edc566dde560aa",
    (40, 8, 120, 60, 7, "default"): "b5062192672424d59f37e741fd56dcac3c74e1e0452ce388242ac6437f5b85b3",
    (40, 8, 120, 60, 8, "default"): "69622bc580e2526ca1c7a39332d19f8575819c4b12ff4ae1b9e3bf1e70c1cb4f",
    (40, 8, 120, 60, 9, "default"): "bfee3247ebc3d14c35f11149e62124640763e1bb796110af6ad076a0046f460c",
    (40, 8, 120, 60, 10, "default"): "b33bacad48575e25c26e4c98d69058c0d41731b5f59ff461da79682c0abe4d45",
    (40, 8, 120, 60, 11, "default"): "3d8578d16d888918834e8e8564d972801a8c57ccb6a98f68427adae6c214c1b8",
    (40, 8, 120, 60, 12, "default"): "5ebb9235a0551f789f798fc246e49a3d5fb7978f3514fbcd1259c380c87752e2",
    (40, 8, 120, 60, 13, "default"): "f32b707154d92245369e1dd82e407956db78f5417893fe80273a57d56b332551",
    (40, 8, 120, 60, 14, "default"): "5e5457eec4fcd4752b00e7a154b6421a7a977641e69a3cd592a7f3ca3b90488d",
    (40, 8, 120, 60, 15, "default"): "b94faeec6b7a4c4fdecd3fa093bf1adc0d6c307c52e459854e41aef7f73300fa",
    (40, 8, 120, 60, 16, "default"): "4f37b09da2a9fa41f0f59d553100bfafc633622e230e1a6e89cc9217cca6a632",
    (40, 8, 120, 60, 17, "default"): "83223952cd2cd71f2028350f87a519f11d6a708026711e7802b7c74701bd95ef",
    (40, 8, 120, 60, 18, "default"): "0020e61cdc2570640487585e10d4a64960a10116151ca62ee864c780cfbcaf5d",
    (40, 8, 120, 60, 19, "default"): "e4e44d2f413407f8567541718e337042bef30d4b0dc215fcc64a31b6cd33089f",
    (40, 8, 120, 60, 20, "default"): "94845afd022f0743b18bbb94d32c77b26a497c09ac65300adc446fec14439cc9",
    (40, 8, 120, 60, 0, "newest"): "b4a491c586e34153ba3c8b8a542b142310cd8fe7eba23b5df0159a35d6d4bbf3",
    (40, 8, 120, 60, 0, "smallest"): "d82e6abec78a917e49cd4211451d8e1d92277ca11924fa15832c9c5adc7ea28f",
    (40, 8, 120, 60, 0, "reservations"): "ee8f53345c540682a51e1a5da9bf0fe87a70de27be9ff929a1580d5c2411e264",
    (40, 8, 120, 60, 0, "strict"): "fa99fa0c9c60e0e5956cd6bd627bf9565febac304ff365296840c20ae8ccee65",
    (40, 8, 120, 60, 0, "fifo"): "f507c7b5d0908ffc10b57d071eb9f4b06a76d293af579d3cf04f68d9069b2680",
    (40, 8, 120, 60, 1, "newest"): "625e502878b294e6163a0da654eecd1892e1f23ad6d3bffb9135360922703621",
    (40, 8, 120, 60, 1, "smallest"): "94b9782715f168da75688d72108ddfae3ec6a735a20e2b93c407182562689bb1",
    (40, 8, 120, 60, 1, "reservations"): "fdd572e247cb38258323d8e164a4577f4a98acd19c0a176c0553bb2eda055910",
    (40, 8, 120, 60, 1, "strict"): "da53f81ec38b48538b508d7d0cb108ce240809532b09e6d0443afa19c4059cb4",
    (40, 8, 120, 60, 1, "fifo"): "18e2539db12bc395f86ece8bc64038d51cdcca58c3f035de4645e09b64b5fade",
    (40, 8, 120, 60, 2, "newest"): "e53df192bb711e3ae065c147bec9be886093b19569719e2d810a00de6587eb73",
    (40, 8, 120, 60, 2, "smallest"): "4fa0789e2ab5bd3120e1c67ef17bb80354491480fe491e8d06356c59c3232158",
    (40, 8, 120, 60, 2, "reservations"): "ccc6717ecec69413264c26bdcdc2cadd2e5ad96437a5ab9e7eba4091ab15be53",
    (40, 8, 120, 60, 2, "strict"): "94a1111cbade8f337407881fab6376f1a6aa39eeaed905537d4e1ed3bc1d3a50",
    (40, 8, 120, 60, 2, "fifo"): "955f042607ef436898a9ebccfae94921f23592149120ac288d1220c6c6b02463",
    (250, 8, 1500, 1200, 1, "default"): "c3a8e40854fefdf6cdb0feb03a27578fd82368e8773aae58027fe123bcc91c27",
    (250, 8, 1500, 1200, 2, "reservations"): "185afdbaefbbc60381181a5b6b01e25c467b0e1a384afed4c5e961ba8289c99b",
    (300, 4, 900, 1500, 0, "smallest"): "afda17472cdf1e4a79c3f02a1c11a256c7ac6674d41022d70fa5339774d67426",
    (250, 8, 1500, 1200, 3, "newest"): "758fc59c818724506769795dd5f29b4d2f2727ca1f5cf73a21d9a761a30ca45f",
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
