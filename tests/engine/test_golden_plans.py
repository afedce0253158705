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
    (40, 8, 120, 60, 0, "default"): "dda3f171be2bf82baae391b313d657e345ff4569cfc6ec935d86d0c2d0aa16c0",
    (40, 8, 120, 60, 1, "default"): "7ac181f5ef44af9dfeffdd1a004292d04764c79ad68fb13141b93b785037e5e2",
    (40, 8, 120, 60, 2, "default"): "fba238965315cc581b2958cfa50d517d3c7a29aef204244aaf7000609b099d43",
    (40, 8, 120, 60, 3, "default"): "fda82e834330b109b8b3d460e129f7a8a74beb08550adec6a55c40c17def4077",
    (40, 8, 120, 60, 4, "default"): "6200de724714ef386564e48e314687cbec35ed36da0b35ea1479ed1a127e689d",
    (40, 8, 120, 60, 5, "default"): "9b3f2efa1c21fa753b23a5ea7c20cae967e396f90eed3f640d25244bac722df6",
    (40, 8, 120, 60, 6, "default"): "e4f386ca40438c8bc6526492cbda242437ee18eab334037b6eea60f6c7da8673",
    (40, 8, 120, 60, 7, "default"): "08c31c3ca855b30bf9d9f6eb005b0caaa353ca134c20a8fcc14f4d892e3e6900",
    (40, 8, 120, 60, 8, "default"): "8c9de9db4b255688984f139f011309a7fda926a64448f39e6a61b9b087b12f06",
    (40, 8, 120, 60, 9, "default"): "fce1bec218ae11329de8c8e4ed7063d30ea2199fc62d1a726751f6ffd0671f44",
    (40, 8, 120, 60, 10, "default"): "de5e9b59d857befe63a0fc1442f927c0608b0aea28d53ebee8e0ab737a276486",
    (40, 8, 120, 60, 11, "default"): "b31e0d6a7e3efff694cd537466fe8e467cba5c10a90491c226f9aff1f72e6a18",
    (40, 8, 120, 60, 12, "default"): "fb49a4fbf768a694d3c63b3a955471cbd6d88756209c2b7d37c5b68e989cbc74",
    (40, 8, 120, 60, 13, "default"): "97f369fe09e540c9afb2cdc2434e004a54c42ed3dca1e0b01b7119db489ddc48",
    (40, 8, 120, 60, 14, "default"): "7ef3a50bad583eef1476102cfc5ec1792bf63d75c399619cf4860ccaf6c49e89",
    (40, 8, 120, 60, 15, "default"): "bf32c447e30190b844420592fea3b0358e271a3d40860905b40f6755df16ead3",
    (40, 8, 120, 60, 16, "default"): "a987bbe0451f00263d685d622f460bac1a626af8cad7b4a0699ef0e05ef15f92",
    (40, 8, 120, 60, 17, "default"): "48c55755fccfc8008e3902f44900081d1604a98c97313448ebf71f771ed67735",
    (40, 8, 120, 60, 18, "default"): "26e23c1c9e6fc24d2a71ca334f227fa6fcb2f1ff290c63518947f53f3cfc6ebd",
    (40, 8, 120, 60, 19, "default"): "4108deb1c68165856669a2f1a3ee11efc91f75ae67b3561300d1f3a79b96227c",
    (40, 8, 120, 60, 20, "default"): "7d0325f5de75abf76cc8529133b0dcc8bb27e8cced907b6207ce2f95a7faa1aa",
    (40, 8, 120, 60, 0, "newest"): "dda3f171be2bf82baae391b313d657e345ff4569cfc6ec935d86d0c2d0aa16c0",
    (40, 8, 120, 60, 0, "smallest"): "0c49297d3d6dbe6265bf5e5b957d9c8fd8e54a7cc798963fcf8270982fcdbee4",
    (40, 8, 120, 60, 0, "reservations"): "c99a063c83b812fbc50cbcdb491956cb499912138d49139f62693a53e32e763c",
    (40, 8, 120, 60, 0, "strict"): "0249b78f3a33eed707aa37e75f879cbdbff87e23b26627d4e7ee6a738bbdc1b0",
    (40, 8, 120, 60, 0, "fifo"): "0a0830188b3055f8ec18c8c44bb1814def5c69e950b1c16b39d91b2fd26ee016",
    (40, 8, 120, 60, 1, "newest"): "7ac181f5ef44af9dfeffdd1a004292d04764c79ad68fb13141b93b785037e5e2",
    (40, 8, 120, 60, 1, "smallest"): "bc07725abba4b4a199533b9cfec767c26a7ef021230bb320efd303f6dba00778",
    (40, 8, 120, 60, 1, "reservations"): "65e26a9c20a7e7ead1d40126787df6519265fbe851f9dbde9cc1a328a839409a",
    (40, 8, 120, 60, 1, "strict"): "51908ac3681dbd1d2ce764cb854665fa6df25d753bc3e577d663c6d888e98a6f",
    (40, 8, 120, 60, 1, "fifo"): "d17c38cabb9d501a8c7d07fda5bd85dc6ca344625084f8e681b3878eca3f5b69",
    (40, 8, 120, 60, 2, "newest"): "fba238965315cc581b2958cfa50d517d3c7a29aef204244aaf7000609b099d43",
    (40, 8, 120, 60, 2, "smallest"): "240fff03a6ac4f6c93cc689ee9580cf389a08e2c354ae4d939dc9633cd6ef07d",
    (40, 8, 120, 60, 2, "reservations"): "8301e52374f2d25231f65bf6da49f0bc3137db36117d225d525e0848a67b055a",
    (40, 8, 120, 60, 2, "strict"): "c99e9b2ad86513b1d2f7f886c4b4001852f8860a83e4b18a37c68780a14ac6e1",
    (40, 8, 120, 60, 2, "fifo"): "634753f59e4d61cf04c6ea4266d4c11a3e3bd125b45befa5ef33c038f823516d",
    (250, 8, 1500, 1200, 1, "default"): "fd4c91da1a1299ceb3ad142f787b1e1cf13a335d6ada28d9cfbdd24ee7a1970e",
    (250, 8, 1500, 1200, 2, "reservations"): "d0b4bd9bd67717498cdb53440edd79d5ab68d9b423c2f3fdaaeaf7ce354a8ed7",
    (300, 4, 900, 1500, 0, "smallest"): "6b09c48c59eb83abd8bd769fd301f38d9bf1178fa13b37d211feb3ccd936bb1e",
    (250, 8, 1500, 1200, 3, "newest"): "f7755c33c2bbc223a298f45157a75c4f40f36a5d4dc7807bdc9e9ec57766b8f8",
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
