"""Golden plans: what the engine answers for seeded synthetic clusters, pinned by digest.

Why: the engine is tuned for speed (one pass over a deep queue must stay cheap), and every such
change must leave every plan exactly as it was — admissions, preemptions, reservations and each
explanation with its reason, sort key and position. The digests below were taken from the
engine before its performance work; the property tests check invariants, these check identity.

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
    (40, 8, 120, 60, 0, 'default'): '11ab6eeba64277f78967fc9ecb4cb34b7ec4af3b6acfe9486c39e38213f16510',
    (40, 8, 120, 60, 1, 'default'): '673421ac851794310765022582d0bdacdd72a3891c01535045a4d04c1ca0b036',
    (40, 8, 120, 60, 2, 'default'): '3039982672e70eb1804e63f2a3b3dd44c7f0b9600d13f7ae8c40f2d27f345b81',
    (40, 8, 120, 60, 3, 'default'): '8b9f757a9cd6b93e6d321f05d9257f47a36379f116c203498b1c4f74add031a7',
    (40, 8, 120, 60, 4, 'default'): '0630cb0ff165e0ece3488e22b23edb28b5c73b9caa98258e7851da535c966334',
    (40, 8, 120, 60, 5, 'default'): '5a63eb5ba1ced3d20b3191a0cd82d1c93ef0dc06713147308900ba7ec6ce0739',
    (40, 8, 120, 60, 6, 'default'): '6dca0d6a23957bbc6ce50be0889c6eab3b912d8c8a6fbdf1d7c9ceec33b42450',
    (40, 8, 120, 60, 7, 'default'): '921e544ef3cd3003f03edfe5f42f40d61a8603bb4831542ec97003784151a22e',
    (40, 8, 120, 60, 8, 'default'): '61fc9742dd85d70192e1594d3a5d8f08d22f30029532030070472ea973bc060d',
    (40, 8, 120, 60, 9, 'default'): 'cca49791ae4ba917eca78db505a7577d17b00869ff4a67149b9a2feb3d6e7aeb',
    (40, 8, 120, 60, 10, 'default'): 'a6f29d42093f0b3a869802419ea706f90c3574b521a813db8ecc6bb866ec4215',
    (40, 8, 120, 60, 11, 'default'): '1946e40b0e443ef460fe35dac2bb338a2d7f5ed226bd93e3122a0ddf5237b591',
    (40, 8, 120, 60, 12, 'default'): 'a3f87a2da763d62ecd5b0262ee35621a199760ed85fc00f875e27d2163361f6c',
    (40, 8, 120, 60, 13, 'default'): '22001d8ff61edcdc687313894331d952171ae8f64036a0fb6b077027d295c76d',
    (40, 8, 120, 60, 14, 'default'): '7e2019dc2a179cb46f9308f9658a33e56f01f8e00b6e7036980a10a712234797',
    (40, 8, 120, 60, 15, 'default'): '2e5845d8b18a14f0379eae482d4b5b82a01e57d6d3b4d01d8b873bc14e349db8',
    (40, 8, 120, 60, 16, 'default'): 'aa7325c2b838dd9dc0020d21064a4b9a6f110c1b020430f8ffe2ffa6d9ea025c',
    (40, 8, 120, 60, 17, 'default'): '8af71913dd05fd445fb8533a3c0754762ca4fbe48f26270d6074bffd0ce25fe7',
    (40, 8, 120, 60, 18, 'default'): 'c690caf76f8868dbef7b34820eb4d30fd19106d78e3d4d14d99397939ea87297',
    (40, 8, 120, 60, 19, 'default'): '2f149e2355f6ad9aa19034ec31012f786c847f0caa46b93bf92b595db6497e03',
    (40, 8, 120, 60, 20, 'default'): '235592c83fb493dc3e9bdbdc1c986f64223f376b6d76954914635dbf2ca81854',
    (40, 8, 120, 60, 0, 'newest'): '11ab6eeba64277f78967fc9ecb4cb34b7ec4af3b6acfe9486c39e38213f16510',
    (40, 8, 120, 60, 0, 'smallest'): '3360b32c0831ad945dfa52289faa8f23f6953c52b2f0f3e4ec3d8969bd7b2534',
    (40, 8, 120, 60, 0, 'reservations'): '8227f78a2cbeafbbd5cdc75925bb3c4db05e90c9e578b8258b005862ce312b48',
    (40, 8, 120, 60, 0, 'strict'): 'd8c9b4aea83f9e111d8998bf0dfdcdc36ee2c911f12ce2d41f937bb4e984dd6a',
    (40, 8, 120, 60, 0, 'fifo'): '833081af18a98d0152c300234e540a69d6800ef1ae825b05c402b6234c3059ab',
    (40, 8, 120, 60, 1, 'newest'): '673421ac851794310765022582d0bdacdd72a3891c01535045a4d04c1ca0b036',
    (40, 8, 120, 60, 1, 'smallest'): 'ff8cb7c9037e4475e9b8a28152cac0ba16ff4a762536838a49dd497479f4ea99',
    (40, 8, 120, 60, 1, 'reservations'): '52d021786039ea02db9711f5266d5bb511f338a677206c91260a433fd7183d00',
    (40, 8, 120, 60, 1, 'strict'): 'f19a9aca6a2701ca6b7f5dde0edc7d111c8a27538ed5786e776c175c2d0f0bb8',
    (40, 8, 120, 60, 1, 'fifo'): 'ee41e2123388d963b1f5d9af82f8e3531641b1ee16d19e2d06bd1a77293d5450',
    (40, 8, 120, 60, 2, 'newest'): '606c06a3dfd39f83171eff13ab2b550bc2a69b5046dce778cc370c91d33c6431',
    (40, 8, 120, 60, 2, 'smallest'): '1a0afdaf56cc771f9ea66d0c00f0ad1000a11727900179b5026ad0a87540529f',
    (40, 8, 120, 60, 2, 'reservations'): '844b8720b05cef8c80e705c1d59ee5bf2bf4577d6c4c12fccc225cc168aa9045',
    (40, 8, 120, 60, 2, 'strict'): '990fec9bd4fc7d47afe03142e914567f0a1ad58c6fd917eea57a7764a864ec79',
    (40, 8, 120, 60, 2, 'fifo'): 'dd3abfc2300757c112f11f96532a61e5124422f4a6974e9cc3582a62768364a9',
    (250, 8, 1500, 1200, 1, 'default'): '88ebec31430b51327a1efa7648adf0e2d42954203e474ea30d4f5e9b90156e71',
    (250, 8, 1500, 1200, 2, 'reservations'): 'b3204f76c43bbf582bf769affe3a9d8903943426056a3810744ddda920cfdf0d',
    (300, 4, 900, 1500, 0, 'smallest'): 'd291132b79c5437538b5187ce6846a83b151af8322f7e650dd0920ccb2a7e758',
    (250, 8, 1500, 1200, 3, 'newest'): 'e72337d0ecc3e74eb78ba13a786d371a5c3b03b5d954a84618b25cf46a01dc72',
}


def snapshot(nodes: int, gpus: int, pending: int, running: int, seed: int, variant: str
             ) -> tuple[Snapshot, float]:
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
        "admissions": [[a.job_id, [[p.node, list(p.gpus)] for p in a.placement], a.flavor, a.borrowing]
                       for a in plan.admissions],
        "preemptions": [[p.job_id, p.for_job, p.kind, p.grace, p.cost, p.lost_work] for p in plan.preemptions],
        "reservations": [[r.job_id, r.due, list(r.nodes), list(r.waits_for)] for r in plan.reservations],
        "explanations": [[job_id, e.job_id, e.reason.code, e.reason.details(), e.sort_key.to_dict(), e.position]
                         for job_id, e in plan.explanations.items()],
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
    cases += [(250, 8, 1500, 1200, 1, "default"), (250, 8, 1500, 1200, 2, "reservations"),
              (300, 4, 900, 1500, 0, "smallest"), (250, 8, 1500, 1200, 3, "newest")]
    return cases


if __name__ == "__main__":
    for case in _cases():
        snap, now = snapshot(*case)
        print(f"    {case!r}: {digest(schedule(snap, now))!r},")
