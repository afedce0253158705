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

from warden.engine.model import Snapshot
from warden.engine.plan import Plan
from warden.engine.policy import parse_policy
from warden.engine.scheduler import Engine, schedule
from warden.engine.synthetic import synthetic_policy, synthetic_snapshot

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
    (40, 8, 120, 60, 0, "default"): "c80162f3daab9cd7f4eef9fb9fe70249429a90fe98b36e47896bbdbc71ee6fc1",
    (40, 8, 120, 60, 1, "default"): "b595ce620060ff789971195ccf3ce40e2b2ef38a081dc33420520901fdbaf865",
    (40, 8, 120, 60, 2, "default"): "658526fca33fb4e26023ad42464cf7b9d6955c0e463377f53e342ccaf79cd11b",
    (40, 8, 120, 60, 3, "default"): "f81b5718ddfedc4b0e02e00092482335df167d250814ce5ad822188b61f0fd6d",
    (40, 8, 120, 60, 4, "default"): "abc587f6ae55cb865e7e3456baa5798252e6e1d8ce8106233157e27e6543a537",
    (40, 8, 120, 60, 5, "default"): "540e5a0d5797f2cc17976b729c39793bd7c8ec2039ce5d126854a415d2d5de16",
    (40, 8, 120, 60, 6, "default"): "9439cc6d8f4be72fcf4839dade16b8f1440bc5ec57ab0171e18d49978bf0f023",
    (40, 8, 120, 60, 7, "default"): "ad7cdd9f0a4b83ea5c62b8616eaa7e98fdd4e1d719746a8ce51839bbae0185d0",
    (40, 8, 120, 60, 8, "default"): "fd397423c733a71639f3044281896254851d6b182a294c139f0c010acd190ba6",
    (40, 8, 120, 60, 9, "default"): "da0ed2ad234f5eb8fd9deca9f935b0bdca8ee1b6a3e0aec109253bc3b21e73ff",
    (40, 8, 120, 60, 10, "default"): "cbbdbe4ed1b6ec71948a070b162cb94a558c52f92acbf22a16ce0ab5c80a60b3",
    (40, 8, 120, 60, 11, "default"): "ee65b8ac535498a47cf9d2523d237199db3215603cb3a0f350f1a8a505e0fb7a",
    (40, 8, 120, 60, 12, "default"): "b40edad8e599275bba1e5413fede414849ba4505cb192f30e24393cf9e5e8fb8",
    (40, 8, 120, 60, 13, "default"): "b55f0e5f4d7c3d617ab37b9b18e9c3c25a937cf399f4881512cb40cb9b53854c",
    (40, 8, 120, 60, 14, "default"): "134a0651b6feee442cce5cdfa15e6c34971fddca78f6f893631fcb8ea8cea399",
    (40, 8, 120, 60, 15, "default"): "75824b698451b49de7bf0f1557885914285b5962c2cedec67910e0ec05af1a13",
    (40, 8, 120, 60, 16, "default"): "bc59c5178d1d0629c33d289672d4239fe63ab183520e415513c056e1f399a449",
    (40, 8, 120, 60, 17, "default"): "27c54150e3d8e8467ab358adbfef01e31241378340909266de65f79217952480",
    (40, 8, 120, 60, 18, "default"): "2087341f5b12afa6816ae781e2adbb0b65e4794d2aad23b3f2e5f96edf3499de",
    (40, 8, 120, 60, 19, "default"): "3a9e650d597712c9052fe4a6ae16b617380ef340caee75400b09b045e772b8de",
    (40, 8, 120, 60, 20, "default"): "7ece9fa3ce65503f498ca86d757c8bef01adbf7540524c954f0e1ba4103ac40f",
    (40, 8, 120, 60, 0, "newest"): "c80162f3daab9cd7f4eef9fb9fe70249429a90fe98b36e47896bbdbc71ee6fc1",
    (40, 8, 120, 60, 0, "smallest"): "97b299a84e325da458515d68e6a5d503aca616e829ebec2ba8a4715dc1653965",
    (40, 8, 120, 60, 0, "reservations"): "3698790de841f57c9930b88663dbb164357263215492065dff4383583543f613",
    (40, 8, 120, 60, 0, "strict"): "92cdf7c7a6b79b4b5580e2347a12ffe90579e046032c333fb78071f591d648bd",
    (40, 8, 120, 60, 0, "fifo"): "8d2ac6ae59ea65f1d2ef3bd376aaf1dbfcc884fbe62fcdc2842375e49f10636f",
    (40, 8, 120, 60, 1, "newest"): "2ccb5fb1dbf558992998d6f3e5523c19da53905e41a0248d793af24aaffa57d6",
    (40, 8, 120, 60, 1, "smallest"): "69cf5c74c39cf376a1e05eee49e4c8f7bcf5811feb498a7b915a156eca7accff",
    (40, 8, 120, 60, 1, "reservations"): "e2cba69464d8b0c03695d10a774d78606dca7cac53e18a97aacb1505f88253c9",
    (40, 8, 120, 60, 1, "strict"): "e92d74d3e8d8c30fdfe72a825f005ead55f5c50054dd8cd0017eb0c4b20f24c8",
    (40, 8, 120, 60, 1, "fifo"): "19c2f078867dfcd3ebbf1164192d81c3f00d5d533c6c18106b47d0127365d734",
    (40, 8, 120, 60, 2, "newest"): "658526fca33fb4e26023ad42464cf7b9d6955c0e463377f53e342ccaf79cd11b",
    (40, 8, 120, 60, 2, "smallest"): "0680f0abe2032516091df3240087525488c1a71a73ec3a632ae0fddc50f5d5e3",
    (40, 8, 120, 60, 2, "reservations"): "7f531d33ce1cdd8c8d6ae41dbf374bffa590c908c88d309e1380194758dbf037",
    (40, 8, 120, 60, 2, "strict"): "e0d2398b70d3fdbab9935ae449e79680bc4571be636efecad968a183e5789049",
    (40, 8, 120, 60, 2, "fifo"): "29f7494cba0e6fb67f9cc96a2f0457c08221de32ebd1f7b04eef3fb137903f8b",
    (250, 8, 1500, 1200, 1, "default"): "cfa81d4e66608fd9be8a1d737a286fe5302e96728f9d6eafeb9c8ec12660b818",
    (250, 8, 1500, 1200, 2, "reservations"): "331d838e71318c691fa2ecd173095c4c9535b05ffdcec35ce357ee0a859f2b86",
    (300, 4, 900, 1500, 0, "smallest"): "50ee2e0fbb9646fa90357329e8abe39695eb8fed1d86f9bf6ecb7e2260042790",
    (250, 8, 1500, 1200, 3, "newest"): "c7bbcd87fec8691e979d1047f50653574e388bff66a2ef85b9012bd90f4f82e4",
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
    engine = Engine()
    plan = engine.plan(snap, now)  # a fresh engine's first pass: what `schedule` computes
    assert digest(plan) == GOLDEN[case]
    # The same engine, asked again with an empty change set, answers the same.
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
