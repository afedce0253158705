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
    (40, 8, 120, 60, 0, "default"): "1f313aeb199b4658b76fad35948d09ad89e7fba5c9d016780881cfec166b9222",
    (40, 8, 120, 60, 1, "default"): "3a1f9e584405a90deb4b0b5af7b512012fd5e62643e6fe0ab15019a44e7b2784",
    (40, 8, 120, 60, 2, "default"): "c71c595fd94e0e45b5773fe7e2c05fb70f8239602937bef5d1852017b7661524",
    (40, 8, 120, 60, 3, "default"): "dec67ceeb2a2c5a37346d609d5384c353ebbe4f7ead1f38373d8bc38d0e8660b",
    (40, 8, 120, 60, 4, "default"): "65b8ff19ee9755ae1858a8ed60f2c858062d703458c2ab3f7db12ebf330a163e",
    (40, 8, 120, 60, 5, "default"): "649bea68155157c1c2312f098b090ea5a7d5185342d1e083b87c709ce5d892bb",
    (40, 8, 120, 60, 6, "default"): "1832884bc5dfe930d3c1c896d8a7f160a36ab53d5f8efe8392c84f66995abd9e",
    (40, 8, 120, 60, 7, "default"): "1b451e8a8377d522fd56fd6edf4a947fc8b023fd3815169ea9ce58019ae37c8b",
    (40, 8, 120, 60, 8, "default"): "ab01f289e152c16a9b7d326fa828abde907bec7f3bf7a45374936f31f4daff03",
    (40, 8, 120, 60, 9, "default"): "9ea516427c25feb94e80eee449396893b178bfbafcb2c236c60c8b4be6ed804c",
    (40, 8, 120, 60, 10, "default"): "c563520c8ae7584be02afdca719a8eee67e89cfc83e456d941d7f75e4fc8bdaf",
    (40, 8, 120, 60, 11, "default"): "815284ab6ece1d7b8889456e4d5e1e0e4fbfa0243b54f65794151cfd7cd84a24",
    (40, 8, 120, 60, 12, "default"): "86dfd2fe5108274af66a4f3c0e60873b21846791ca1f28db8d1fab4e40a3ebd9",
    (40, 8, 120, 60, 13, "default"): "9267f02cb3ba65437130d67a680c2e9a18a890ebdd85430d4268003ae41bc7bc",
    (40, 8, 120, 60, 14, "default"): "40cf65311ce4d4ec7bee12620e70a9005f474bd66932f301472e14d50eed1389",
    (40, 8, 120, 60, 15, "default"): "1b72c6f7c21d5a014ecd6df0b5c018d5b641411c73547d9999ffb8fd71cb6407",
    (40, 8, 120, 60, 16, "default"): "616318c89fd93c0aba07d204d3cf20350c2624a351d5c731c82e1bd62ad26774",
    (40, 8, 120, 60, 17, "default"): "3fbf0d9864c8139553222eb65b135a02bbdf5d5a6c45dab57772b175b08357fb",
    (40, 8, 120, 60, 18, "default"): "c3e0d75e80a0c1ee13fad07dd9f669f591ef5881465fa84b9a109d48d3bbd9dd",
    (40, 8, 120, 60, 19, "default"): "a0b28bbe00c9351186586fbe8a54fc1d37abbf7acd4af589f26465ae9fb426e8",
    (40, 8, 120, 60, 20, "default"): "f339f5409c9259b3485ee69bbccb6cdd8a6bbf90b9d3bcccd68bfd85d19b0d3b",
    (40, 8, 120, 60, 0, "newest"): "1f313aeb199b4658b76fad35948d09ad89e7fba5c9d016780881cfec166b9222",
    (40, 8, 120, 60, 0, "smallest"): "0f5755cbb53c84ba59bd3b9f383715fa4a604b0748fda9cc6e990785e05d4f74",
    (40, 8, 120, 60, 0, "reservations"): "70b8645208a5876a3da96a6ef2983c99fd3005520ddfaa76ae0ecd32ded3eb7b",
    (40, 8, 120, 60, 0, "strict"): "92cdf7c7a6b79b4b5580e2347a12ffe90579e046032c333fb78071f591d648bd",
    (40, 8, 120, 60, 0, "fifo"): "0162f478e55ab80a8438589af44f3adba138b1d84bc97622dc4a7e31f86415bc",
    (40, 8, 120, 60, 1, "newest"): "c363f28a691fafdc5dc744ea39b37972773f54e9363b938f98c9a40bf37c3a99",
    (40, 8, 120, 60, 1, "smallest"): "465b1887db89794f25ab9e717df4307fec3f2c53a53068e6ba5fb2bda9a99230",
    (40, 8, 120, 60, 1, "reservations"): "c6a7b1bb703fadb60fd890627e739b79845f969517cd885641611c3813f74deb",
    (40, 8, 120, 60, 1, "strict"): "e92d74d3e8d8c30fdfe72a825f005ead55f5c50054dd8cd0017eb0c4b20f24c8",
    (40, 8, 120, 60, 1, "fifo"): "245279f048e25ba039c06f5423c41eea32833c2a61b2455d90662ef01347ce03",
    (40, 8, 120, 60, 2, "newest"): "c71c595fd94e0e45b5773fe7e2c05fb70f8239602937bef5d1852017b7661524",
    (40, 8, 120, 60, 2, "smallest"): "16222ecf3866576680ccd02155cc3ae65bda21cf99116cdd2ff0073074b7a306",
    (40, 8, 120, 60, 2, "reservations"): "ba17ce7edecaf1ace7ad7f797391800075a5fe6e8668d2530cdbee2cae028564",
    (40, 8, 120, 60, 2, "strict"): "e0d2398b70d3fdbab9935ae449e79680bc4571be636efecad968a183e5789049",
    (40, 8, 120, 60, 2, "fifo"): "50c2bd6d9e8231fbf6a9e3f30a204f45c293e374c8858334bb73905309e89039",
    (250, 8, 1500, 1200, 1, "default"): "b4a1075373f85443b708dc4552479b9d6afdfbb4c77a3b41bc7e7dbe9bb4455c",
    (250, 8, 1500, 1200, 2, "reservations"): "1059dd7180ac02745995d3186858dece74e0f76a29a1bd2e494b571e32ae9665",
    (300, 4, 900, 1500, 0, "smallest"): "74596f189feb2871862b8fb175a42204b39dc537cd610f58e7107c47b5497e40",
    (250, 8, 1500, 1200, 3, "newest"): "a08fbceae0892ae54a00f708013ffc3a39e18f35054fedc048ff8932b0abf9cd",
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
