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
    (40, 8, 120, 60, 0, "default"): "3d4864ce6a74eaef0295d2ed7f513d9d4b47374e4af6a145b96ef1b4c6395150",
    (40, 8, 120, 60, 1, "default"): "bc4c033600e8cd44d760c561e1e0010c713f6d718bc24f8bea49961f3cb37892",
    (40, 8, 120, 60, 2, "default"): "d2417b0ea9843650168197b4a98e65bfaebbc7c430b4569d6c33f5f59192fb54",
    (40, 8, 120, 60, 3, "default"): "9e9fe8e5332481080d7e58f2ce757a739474440a30dab2d90da75367bc4ab468",
    (40, 8, 120, 60, 4, "default"): "014fe7e8f97d9b05d9c76fe299ea245a5e8a51d45e2e2e6b4e16c7673106bfa0",
    (40, 8, 120, 60, 5, "default"): "64442d9e651ccf3ba2e8813307fed0163780646555290d7a41cb690079879f26",
    (40, 8, 120, 60, 6, "default"): "685cbe81c1fc483941d3f4fea6776c22d85966609ae2e5b369432cbac853caa6",
    (40, 8, 120, 60, 7, "default"): "00d453db85311837f4ff968a37c1b672d86cb9f5ec62b8a2976fd3ecc672acd4",
    (40, 8, 120, 60, 8, "default"): "38a6d7936262b343b9f35b2bc7ddf7e8f084ff0d7fbbb2d28f9eaadf4670eecb",
    (40, 8, 120, 60, 9, "default"): "3bf299899a1af447fcec1fe22e5eb34e67bf9866213aa03dd7a63515af711c2b",
    (40, 8, 120, 60, 10, "default"): "244c786721fa77a7d431d32f7932e121190ac5899880a532acb25f8e02ee05a4",
    (40, 8, 120, 60, 11, "default"): "1961d1748803310f57f3828a7a3bfb28cdcfd32a5d8a21e1c19a2605fcabb62e",
    (40, 8, 120, 60, 12, "default"): "8621d63096f98b861ff306a1f7f5e78ad9cf6b2be173e103ef6f17fa1f6ef89f",
    (40, 8, 120, 60, 13, "default"): "a2795a7915c86242de7393833178f9c3040d290623cf16c5682a19f729cbcb94",
    (40, 8, 120, 60, 14, "default"): "933e90f258f69cc50e41b1e0422df75d0b9ba6fae7684dad6aedd2ad8b57d496",
    (40, 8, 120, 60, 15, "default"): "2312c62a462dda733792bd0885e3c6f02555da9bd621017abc05086080e93d61",
    (40, 8, 120, 60, 16, "default"): "21eaa32d0cc15ff0cb5e025bd06aef33a2f978acd160cf658aae91aee5a75207",
    (40, 8, 120, 60, 17, "default"): "29b4d0beba065f25aa7dfc21014d249905b014167717ddc8938fb8f8aac2d7a6",
    (40, 8, 120, 60, 18, "default"): "3b46405e8a194aeb6cb398f7f8d9dbf0273ef5140eef639e822734f2642fe6c1",
    (40, 8, 120, 60, 19, "default"): "7c2f0a9b0c6c95df27699694c304fd9d86bb594a4a1f1a13b4b1b5fb868173dd",
    (40, 8, 120, 60, 20, "default"): "8654b6b5f5831b805d0c8a69afcf8b14c1dd7a3d1e2604e000e46a36a942fe54",
    (40, 8, 120, 60, 0, "newest"): "3d4864ce6a74eaef0295d2ed7f513d9d4b47374e4af6a145b96ef1b4c6395150",
    (40, 8, 120, 60, 0, "smallest"): "060dd501a6c737b8d6554aaf78054f58105470e373ea500425b95fc1360b4546",
    (40, 8, 120, 60, 0, "reservations"): "624ffbcc54a15cb71a150862ef2b2ede5bafb49e5957b19647b82d7f381ccf1b",
    (40, 8, 120, 60, 0, "strict"): "0249b78f3a33eed707aa37e75f879cbdbff87e23b26627d4e7ee6a738bbdc1b0",
    (40, 8, 120, 60, 0, "fifo"): "5f63407e6a682ea57dacd824eebfc19bd1f6f4fc45d921bd4502c982c6d4eb9c",
    (40, 8, 120, 60, 1, "newest"): "bc4c033600e8cd44d760c561e1e0010c713f6d718bc24f8bea49961f3cb37892",
    (40, 8, 120, 60, 1, "smallest"): "2201539ad5f80579992f5a43eb402b752beb77c91d2a323dd79466fd274b066c",
    (40, 8, 120, 60, 1, "reservations"): "4c9baf1f193170e7baec6aa03244fe3e8c7385e2760b4d81f7ba995af89b66a0",
    (40, 8, 120, 60, 1, "strict"): "e60fb486a42b87147a2aaefc6c56e343a7d4dcfde55415c27d29b34394c6d45d",
    (40, 8, 120, 60, 1, "fifo"): "2d2a6e63860d6cb0742080631c54858d5b0f3f1605fd4e17ef31de40b692bdce",
    (40, 8, 120, 60, 2, "newest"): "d2417b0ea9843650168197b4a98e65bfaebbc7c430b4569d6c33f5f59192fb54",
    (40, 8, 120, 60, 2, "smallest"): "e756edea0621c720dc9bab431f976aae632b39b2e400f6ff21dfe079ca77bab9",
    (40, 8, 120, 60, 2, "reservations"): "849ed73780b6b95dfe722569c69c7f8baf4f31688b4d7098af6ced02d044d219",
    (40, 8, 120, 60, 2, "strict"): "40d3b0a4dcfca72d48c7c5c2ec1c6d667b2b0ed60851d825200cf42d55ab4ca9",
    (40, 8, 120, 60, 2, "fifo"): "157e944d626281921650d16d038dafe972bdafed52dfd312970ec1871c312e8d",
    (250, 8, 1500, 1200, 1, "default"): "c325eb0a6e29c0fdc72b72b6469ae6a8a63a5b7458160f2438df5713aaaea4c3",
    (250, 8, 1500, 1200, 2, "reservations"): "4f6d71fd1bbaba7a753377acb294f05b8cdf18e5f7a137eccfa359d91a8bb72d",
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
