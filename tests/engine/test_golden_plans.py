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
    (40, 8, 120, 60, 0, "default"): "11ab6eeba64277f78967fc9ecb4cb34b7ec4af3b6acfe9486c39e38213f16510",
    (40, 8, 120, 60, 1, "default"): "8427e85bb786fa51cf6767f0ba3f70735542a6bb4a5aaa6e8d5b0909b924a779",
    (40, 8, 120, 60, 2, "default"): "3039982672e70eb1804e63f2a3b3dd44c7f0b9600d13f7ae8c40f2d27f345b81",
    (40, 8, 120, 60, 3, "default"): "6cd77bd9146bf42d6ea2157c88ec107af0374afbaac91c5b6ca881dea1e6e743",
    (40, 8, 120, 60, 4, "default"): "0630cb0ff165e0ece3488e22b23edb28b5c73b9caa98258e7851da535c966334",
    (40, 8, 120, 60, 5, "default"): "5a63eb5ba1ced3d20b3191a0cd82d1c93ef0dc06713147308900ba7ec6ce0739",
    (40, 8, 120, 60, 6, "default"): "6dca0d6a23957bbc6ce50be0889c6eab3b912d8c8a6fbdf1d7c9ceec33b42450",
    (40, 8, 120, 60, 7, "default"): "6454c167100041c9d193b4129bb90bf3b861cb7a6ac6d4b7d09a6e2133b0af50",
    (40, 8, 120, 60, 8, "default"): "639b17736453b4748d46db64d32170658904513c52a9bab2c60258da48260f46",
    (40, 8, 120, 60, 9, "default"): "cca49791ae4ba917eca78db505a7577d17b00869ff4a67149b9a2feb3d6e7aeb",
    (40, 8, 120, 60, 10, "default"): "a6f29d42093f0b3a869802419ea706f90c3574b521a813db8ecc6bb866ec4215",
    (40, 8, 120, 60, 11, "default"): "1946e40b0e443ef460fe35dac2bb338a2d7f5ed226bd93e3122a0ddf5237b591",
    (40, 8, 120, 60, 12, "default"): "a3f87a2da763d62ecd5b0262ee35621a199760ed85fc00f875e27d2163361f6c",
    (40, 8, 120, 60, 13, "default"): "22001d8ff61edcdc687313894331d952171ae8f64036a0fb6b077027d295c76d",
    (40, 8, 120, 60, 14, "default"): "c5f84b2bf6c48ea46f42b754cea4065abb4fcaf25a439bde1d118a240ded851b",
    (40, 8, 120, 60, 15, "default"): "7ab7ce717eb2a5b1c0badf2cbc6ac911524b4ffd39eb3dc30528e14df2437d9d",
    (40, 8, 120, 60, 16, "default"): "aa7325c2b838dd9dc0020d21064a4b9a6f110c1b020430f8ffe2ffa6d9ea025c",
    (40, 8, 120, 60, 17, "default"): "8af71913dd05fd445fb8533a3c0754762ca4fbe48f26270d6074bffd0ce25fe7",
    (40, 8, 120, 60, 18, "default"): "c690caf76f8868dbef7b34820eb4d30fd19106d78e3d4d14d99397939ea87297",
    (40, 8, 120, 60, 19, "default"): "e1e039ee74fbdc13451d5d6278c8f757909f86e7f683e76397bec3b617b36b7c",
    (40, 8, 120, 60, 20, "default"): "235592c83fb493dc3e9bdbdc1c986f64223f376b6d76954914635dbf2ca81854",
    (40, 8, 120, 60, 0, "newest"): "11ab6eeba64277f78967fc9ecb4cb34b7ec4af3b6acfe9486c39e38213f16510",
    (40, 8, 120, 60, 0, "smallest"): "3360b32c0831ad945dfa52289faa8f23f6953c52b2f0f3e4ec3d8969bd7b2534",
    (40, 8, 120, 60, 0, "reservations"): "8227f78a2cbeafbbd5cdc75925bb3c4db05e90c9e578b8258b005862ce312b48",
    (40, 8, 120, 60, 0, "strict"): "d8c9b4aea83f9e111d8998bf0dfdcdc36ee2c911f12ce2d41f937bb4e984dd6a",
    (40, 8, 120, 60, 0, "fifo"): "833081af18a98d0152c300234e540a69d6800ef1ae825b05c402b6234c3059ab",
    (40, 8, 120, 60, 1, "newest"): "4276f592276ee98945ebc32c1d4664f7fe778b9fcc0cbdc3972a01d9941526d6",
    (40, 8, 120, 60, 1, "smallest"): "57a8af4f12c978b19477507111dc9d53fe9033f1b959e04ebc602a7e01d67217",
    (40, 8, 120, 60, 1, "reservations"): "994acfe301341a264be39f6618cf910bcca0c3ad23a768b99626af53b4e2c8eb",
    (40, 8, 120, 60, 1, "strict"): "f19a9aca6a2701ca6b7f5dde0edc7d111c8a27538ed5786e776c175c2d0f0bb8",
    (40, 8, 120, 60, 1, "fifo"): "ee41e2123388d963b1f5d9af82f8e3531641b1ee16d19e2d06bd1a77293d5450",
    (40, 8, 120, 60, 2, "newest"): "606c06a3dfd39f83171eff13ab2b550bc2a69b5046dce778cc370c91d33c6431",
    (40, 8, 120, 60, 2, "smallest"): "1a0afdaf56cc771f9ea66d0c00f0ad1000a11727900179b5026ad0a87540529f",
    (40, 8, 120, 60, 2, "reservations"): "844b8720b05cef8c80e705c1d59ee5bf2bf4577d6c4c12fccc225cc168aa9045",
    (40, 8, 120, 60, 2, "strict"): "990fec9bd4fc7d47afe03142e914567f0a1ad58c6fd917eea57a7764a864ec79",
    (40, 8, 120, 60, 2, "fifo"): "dd3abfc2300757c112f11f96532a61e5124422f4a6974e9cc3582a62768364a9",
    (250, 8, 1500, 1200, 1, "default"): "88ebec31430b51327a1efa7648adf0e2d42954203e474ea30d4f5e9b90156e71",
    (250, 8, 1500, 1200, 2, "reservations"): "51ee89a4eb57fc489825ca6af6cb940e8c0a0a0c83ee8c19cd681a34090e71f0",
    (300, 4, 900, 1500, 0, "smallest"): "d291132b79c5437538b5187ce6846a83b151af8322f7e650dd0920ccb2a7e758",
    (250, 8, 1500, 1200, 3, "newest"): "e72337d0ecc3e74eb78ba13a786d371a5c3b03b5d954a84618b25cf46a01dc72",
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
