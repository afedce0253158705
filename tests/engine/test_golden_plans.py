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
    (40, 8, 120, 60, 0, "default"): "ddb6d881df90b2ddab58ffee81d502c454680b9a20cece327cea6ffc12eec9c4",
    (40, 8, 120, 60, 1, "default"): "8fa0b63511dbf0c34b27c8dc4e1398deaf37feeaf9a5baa4b4533b6ba9633066",
    (40, 8, 120, 60, 2, "default"): "b1c20fff50794ffb69f09bfe8d9718f6215eff9d5c018c9ca63d9b70270da832",
    (40, 8, 120, 60, 3, "default"): "68376a017bddf646a3bbd7d7a51d146a31bbc303fa239573dd698e6041dc6b65",
    (40, 8, 120, 60, 4, "default"): "abc587f6ae55cb865e7e3456baa5798252e6e1d8ce8106233157e27e6543a537",
    (40, 8, 120, 60, 5, "default"): "18fdb4e8ee78d8c18c9a094b7a888c9c8c094ab6aeee3f5e2c29720970c9f07e",
    (40, 8, 120, 60, 6, "default"): "9644a5d33556ca9d26dda1d1103412074aa906f4e0b5e02792eb46242ba06c2d",
    (40, 8, 120, 60, 7, "default"): "f0acd83b01617c913ca87296c32679b27cce52ff666f8b229edd990ec5a07c75",
    (40, 8, 120, 60, 8, "default"): "9bb95c16e72f4552f7d1b0e40faae673f5520d73c3cef7bc21ccda35ef952748",
    (40, 8, 120, 60, 9, "default"): "160056ce1e1290a0706357957d3d21f483ce59d85aaa009603cfa53ca40dfc81",
    (40, 8, 120, 60, 10, "default"): "3da45febf6f31dcb78ceb9cb58a85f05086aa804732fbc4d774fa8eedbc1b35a",
    (40, 8, 120, 60, 11, "default"): "ee65b8ac535498a47cf9d2523d237199db3215603cb3a0f350f1a8a505e0fb7a",
    (40, 8, 120, 60, 12, "default"): "004fbf2972bb0eb24ebb2288f6f388e121dfe6c3a9c7c2f73e585745ca213489",
    (40, 8, 120, 60, 13, "default"): "0564e14a798ed4e57e73589f1d6d7d5f0e91bd8863eebc1a4c3f08fe83db2041",
    (40, 8, 120, 60, 14, "default"): "9b4abe91eb26914ba472dfbd2db7fb891dbb0ac38b3dc8716988eae2ea60b478",
    (40, 8, 120, 60, 15, "default"): "75824b698451b49de7bf0f1557885914285b5962c2cedec67910e0ec05af1a13",
    (40, 8, 120, 60, 16, "default"): "bc59c5178d1d0629c33d289672d4239fe63ab183520e415513c056e1f399a449",
    (40, 8, 120, 60, 17, "default"): "27c54150e3d8e8467ab358adbfef01e31241378340909266de65f79217952480",
    (40, 8, 120, 60, 18, "default"): "2d652bc02a660d347109139ec71c68f0a4a836f091cb2701afb2b55e04117d8f",
    (40, 8, 120, 60, 19, "default"): "3c824e132e37f64ac52b038c6e54c2a06b55ef10c03c4f9e3b4d48be9f477698",
    (40, 8, 120, 60, 20, "default"): "7ece9fa3ce65503f498ca86d757c8bef01adbf7540524c954f0e1ba4103ac40f",
    (40, 8, 120, 60, 0, "newest"): "ddb6d881df90b2ddab58ffee81d502c454680b9a20cece327cea6ffc12eec9c4",
    (40, 8, 120, 60, 0, "smallest"): "1de62eae071b8d0e98f2a79a74d9fd95dba8a3e7207c6802450af75510a3737a",
    (40, 8, 120, 60, 0, "reservations"): "108be797921be7dd09cd26406b46395566a752617f487cfbbac1fae664c33e15",
    (40, 8, 120, 60, 0, "strict"): "92cdf7c7a6b79b4b5580e2347a12ffe90579e046032c333fb78071f591d648bd",
    (40, 8, 120, 60, 0, "fifo"): "fbe7094b7f5ae96d79d229b181b70954b3ac0984f4c4df8cffcf7d582df481b4",
    (40, 8, 120, 60, 1, "newest"): "f2252a7553d199f87233417d30fcce34ca4c357829670f29e86d2f7a34bd30d8",
    (40, 8, 120, 60, 1, "smallest"): "0db04609454200aa62d6e85c06123b8304d81275cdbbe1f8bca5a08898b5461a",
    (40, 8, 120, 60, 1, "reservations"): "75f332b6d16c046e8ba4f1eccc8d7ab0ce042e36b45c44b7b6223c97b524acd6",
    (40, 8, 120, 60, 1, "strict"): "e92d74d3e8d8c30fdfe72a825f005ead55f5c50054dd8cd0017eb0c4b20f24c8",
    (40, 8, 120, 60, 1, "fifo"): "19c2f078867dfcd3ebbf1164192d81c3f00d5d533c6c18106b47d0127365d734",
    (40, 8, 120, 60, 2, "newest"): "b1c20fff50794ffb69f09bfe8d9718f6215eff9d5c018c9ca63d9b70270da832",
    (40, 8, 120, 60, 2, "smallest"): "7045c41fcbe30d9c729f14eedde93f2b6ef5acb69ae97b759cfa938a4f0aac34",
    (40, 8, 120, 60, 2, "reservations"): "0ea7dea3f88b441101d89837d8556333c11b7b75fbe00dd0a210576b54dada77",
    (40, 8, 120, 60, 2, "strict"): "e0d2398b70d3fdbab9935ae449e79680bc4571be636efecad968a183e5789049",
    (40, 8, 120, 60, 2, "fifo"): "29f7494cba0e6fb67f9cc96a2f0457c08221de32ebd1f7b04eef3fb137903f8b",
    (250, 8, 1500, 1200, 1, "default"): "c8517720d8af816864549f96ec66b075d4d8b1186db1d4cefca5d19b8819fe14",
    (250, 8, 1500, 1200, 2, "reservations"): "e07163cfb5c7f30c2ba3b27fe4d4a5022032a629f43cb993c3ef59f73a8c0cbc",
    (300, 4, 900, 1500, 0, "smallest"): "97877d974cf985624086f2cb689ede444d60d70199fc77fa5964313fa73dff6b",
    (250, 8, 1500, 1200, 3, "newest"): "83ec81ecd2b52c2977d22914cd4d8977b97b378d294faf809135762f1136ef1d",
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
