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
    (40, 8, 120, 60, 0, "default"): "fd5cd4892de9d9162761656e43b59fd131ec3efff75c1346222ccbfce0ff6b45",
    (40, 8, 120, 60, 1, "default"): "2c8b8451ecad832de4e607281eb04821a582c774ad29c07c7b347b6b515879cc",
    (40, 8, 120, 60, 2, "default"): "b1c20fff50794ffb69f09bfe8d9718f6215eff9d5c018c9ca63d9b70270da832",
    (40, 8, 120, 60, 3, "default"): "68376a017bddf646a3bbd7d7a51d146a31bbc303fa239573dd698e6041dc6b65",
    (40, 8, 120, 60, 4, "default"): "abc587f6ae55cb865e7e3456baa5798252e6e1d8ce8106233157e27e6543a537",
    (40, 8, 120, 60, 5, "default"): "816bbbe01a8f283eda0e1a329decc0af7c4c6f452e821b6b3995525c05228442",
    (40, 8, 120, 60, 6, "default"): "9439cc6d8f4be72fcf4839dade16b8f1440bc5ec57ab0171e18d49978bf0f023",
    (40, 8, 120, 60, 7, "default"): "ad7cdd9f0a4b83ea5c62b8616eaa7e98fdd4e1d719746a8ce51839bbae0185d0",
    (40, 8, 120, 60, 8, "default"): "fd397423c733a71639f3044281896254851d6b182a294c139f0c010acd190ba6",
    (40, 8, 120, 60, 9, "default"): "da0ed2ad234f5eb8fd9deca9f935b0bdca8ee1b6a3e0aec109253bc3b21e73ff",
    (40, 8, 120, 60, 10, "default"): "cbbdbe4ed1b6ec71948a070b162cb94a558c52f92acbf22a16ce0ab5c80a60b3",
    (40, 8, 120, 60, 11, "default"): "ee65b8ac535498a47cf9d2523d237199db3215603cb3a0f350f1a8a505e0fb7a",
    (40, 8, 120, 60, 12, "default"): "8fe91e9270704b914ed73e4db96825d7cfcb46ba5b0f478d128de9198c9e01d2",
    (40, 8, 120, 60, 13, "default"): "b55f0e5f4d7c3d617ab37b9b18e9c3c25a937cf399f4881512cb40cb9b53854c",
    (40, 8, 120, 60, 14, "default"): "134a0651b6feee442cce5cdfa15e6c34971fddca78f6f893631fcb8ea8cea399",
    (40, 8, 120, 60, 15, "default"): "75824b698451b49de7bf0f1557885914285b5962c2cedec67910e0ec05af1a13",
    (40, 8, 120, 60, 16, "default"): "bc59c5178d1d0629c33d289672d4239fe63ab183520e415513c056e1f399a449",
    (40, 8, 120, 60, 17, "default"): "27c54150e3d8e8467ab358adbfef01e31241378340909266de65f79217952480",
    (40, 8, 120, 60, 18, "default"): "2087341f5b12afa6816ae781e2adbb0b65e4794d2aad23b3f2e5f96edf3499de",
    (40, 8, 120, 60, 19, "default"): "3a9e650d597712c9052fe4a6ae16b617380ef340caee75400b09b045e772b8de",
    (40, 8, 120, 60, 20, "default"): "7ece9fa3ce65503f498ca86d757c8bef01adbf7540524c954f0e1ba4103ac40f",
    (40, 8, 120, 60, 0, "newest"): "fd5cd4892de9d9162761656e43b59fd131ec3efff75c1346222ccbfce0ff6b45",
    (40, 8, 120, 60, 0, "smallest"): "1de62eae071b8d0e98f2a79a74d9fd95dba8a3e7207c6802450af75510a3737a",
    (40, 8, 120, 60, 0, "reservations"): "723be7a9a08bc1fba76d4cec08d4a243e4c8ff21a72c2530728546baf64c3240",
    (40, 8, 120, 60, 0, "strict"): "92cdf7c7a6b79b4b5580e2347a12ffe90579e046032c333fb78071f591d648bd",
    (40, 8, 120, 60, 0, "fifo"): "8d2ac6ae59ea65f1d2ef3bd376aaf1dbfcc884fbe62fcdc2842375e49f10636f",
    (40, 8, 120, 60, 1, "newest"): "60b96d024df2ee1925836b123a00c85129e9a0d8371c15c0f0b3e10ba0dfbc2a",
    (40, 8, 120, 60, 1, "smallest"): "942567682ff4b98d1520e04041a257684bde3b266ed83d8ce5d771f6157561d6",
    (40, 8, 120, 60, 1, "reservations"): "8cc2b24a482e0827d301ef6acdf3e345170aa300f42cd3fa390e8ee997cfaa86",
    (40, 8, 120, 60, 1, "strict"): "e92d74d3e8d8c30fdfe72a825f005ead55f5c50054dd8cd0017eb0c4b20f24c8",
    (40, 8, 120, 60, 1, "fifo"): "19c2f078867dfcd3ebbf1164192d81c3f00d5d533c6c18106b47d0127365d734",
    (40, 8, 120, 60, 2, "newest"): "b1c20fff50794ffb69f09bfe8d9718f6215eff9d5c018c9ca63d9b70270da832",
    (40, 8, 120, 60, 2, "smallest"): "7045c41fcbe30d9c729f14eedde93f2b6ef5acb69ae97b759cfa938a4f0aac34",
    (40, 8, 120, 60, 2, "reservations"): "0ea7dea3f88b441101d89837d8556333c11b7b75fbe00dd0a210576b54dada77",
    (40, 8, 120, 60, 2, "strict"): "e0d2398b70d3fdbab9935ae449e79680bc4571be636efecad968a183e5789049",
    (40, 8, 120, 60, 2, "fifo"): "29f7494cba0e6fb67f9cc96a2f0457c08221de32ebd1f7b04eef3fb137903f8b",
    (250, 8, 1500, 1200, 1, "default"): "cfa81d4e66608fd9be8a1d737a286fe5302e96728f9d6eafeb9c8ec12660b818",
    (250, 8, 1500, 1200, 2, "reservations"): "82696d5ec2c246107d1ea1972ba5a731a45ed976f67ee5f32999e5f573459d13",
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
