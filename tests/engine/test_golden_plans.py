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
    (40, 8, 120, 60, 0, "default"): "625a350afe161579a1689222fe92fadd15225a4e4b2127690ec953cd117ab8ff",
    (40, 8, 120, 60, 1, "default"): "3a1f9e584405a90deb4b0b5af7b512012fd5e62643e6fe0ab15019a44e7b2784",
    (40, 8, 120, 60, 2, "default"): "e858eaff90e4197029db66c0353a3279c251755e9074a6b57e49519b68633b79",
    (40, 8, 120, 60, 3, "default"): "091af5485d5d66384f75f3a7e3ced57f8d5997f6e422577cc641781b344d16b9",
    (40, 8, 120, 60, 4, "default"): "df4ed18de3fcf96acd96d0a59b48878fb3f69dbb6e58be0baafc557a58a2c7e4",
    (40, 8, 120, 60, 5, "default"): "8692b1d52975d758548dfd660d03e82e963fbbaf3db0e1b65e5f9b9bf3a54514",
    (40, 8, 120, 60, 6, "default"): "6ec766066875d4da175429341f44c59a33c7c288925008ec405e78665b186851",
    (40, 8, 120, 60, 7, "default"): "0d6e0f9f0ac94d72a6c2e68129867c30f681d18350d6efb20e734cdcc83227cf",
    (40, 8, 120, 60, 8, "default"): "cd102c869cd41bbaabb87715a1a6486c308e233017515393eb6436436b732f3a",
    (40, 8, 120, 60, 9, "default"): "afb1c2ce02d6da80e8d2f5441c73d277dadd4f20a9bbef3a29dbc2e9c9b503d0",
    (40, 8, 120, 60, 10, "default"): "264a0d44dc8af04e669875720641b646f4fff7f435354ad373ceaf1a091743e9",
    (40, 8, 120, 60, 11, "default"): "04377a214b1245d69dd33fb9e660b7b9f45c4b6311795431364e7c485445d88d",
    (40, 8, 120, 60, 12, "default"): "b6c830cf2376b8c8509957e795306dcc9d806981aedbe3109906fb43a4ade84d",
    (40, 8, 120, 60, 13, "default"): "6717d25ff20b15c57c9b78a9c3bbe0a2b573db0ce0a4370bbce94828678a1041",
    (40, 8, 120, 60, 14, "default"): "7a86fd0857b116d0c09620a2488196cb425d51dad25592737303bfdeed555711",
    (40, 8, 120, 60, 15, "default"): "2c28896c013aecf4087f6390e13f4e7fbb8066069dc5f0fd1281bd9b9f696277",
    (40, 8, 120, 60, 16, "default"): "2e6cde6866e3e01002a4e93b979d48062eb9ec940295cc3c524922d883eee22c",
    (40, 8, 120, 60, 17, "default"): "657c075ded1f59f7f9857c3b5bd4c0926c97b90d9b2b09e86ef23c6932504c00",
    (40, 8, 120, 60, 18, "default"): "27bcab4648b409d0b1432df81425a7595afaaa396c2116a38115871cdbb00f00",
    (40, 8, 120, 60, 19, "default"): "e55b888288b0883e8cc2c58661492b54c8739ca2d898b01a327bc95d894a9199",
    (40, 8, 120, 60, 20, "default"): "f339f5409c9259b3485ee69bbccb6cdd8a6bbf90b9d3bcccd68bfd85d19b0d3b",
    (40, 8, 120, 60, 0, "newest"): "625a350afe161579a1689222fe92fadd15225a4e4b2127690ec953cd117ab8ff",
    (40, 8, 120, 60, 0, "smallest"): "cc4925cef74220a89c6347efc4fd301e77fe143da33317f83fe0edee1c0a1407",
    (40, 8, 120, 60, 0, "reservations"): "5e181e4d5077b08d942e11bc3194fb4e933dad64afa966ff573acd9b8a1659fe",
    (40, 8, 120, 60, 0, "strict"): "92cdf7c7a6b79b4b5580e2347a12ffe90579e046032c333fb78071f591d648bd",
    (40, 8, 120, 60, 0, "fifo"): "27cc3a9603e9568b37e29893fc0d5ce9d67bd5c3749c88bc5967d7ea58c299e1",
    (40, 8, 120, 60, 1, "newest"): "c363f28a691fafdc5dc744ea39b37972773f54e9363b938f98c9a40bf37c3a99",
    (40, 8, 120, 60, 1, "smallest"): "6afdb4ec161a3967045044933fa78559f6ce46976ebc088dfb8dadd4f3589503",
    (40, 8, 120, 60, 1, "reservations"): "86ce53953df6e7cf4bc9acb9926b3fbb77cb2a7be8c9feee1050c963d439d9c3",
    (40, 8, 120, 60, 1, "strict"): "e92d74d3e8d8c30fdfe72a825f005ead55f5c50054dd8cd0017eb0c4b20f24c8",
    (40, 8, 120, 60, 1, "fifo"): "592727c793860f567752edb40cf7e7d6f866da33896b8b63d972f0d36e2d41e3",
    (40, 8, 120, 60, 2, "newest"): "e858eaff90e4197029db66c0353a3279c251755e9074a6b57e49519b68633b79",
    (40, 8, 120, 60, 2, "smallest"): "60dcfa264e2ce017ad25c041b8eb46b5b2bea458d3f4e541de0d1fe5f2dcc3f7",
    (40, 8, 120, 60, 2, "reservations"): "065fc07f9b42e214db7cf8776baf0e459bc677d6f2bb3bb72b3ce746be0409d1",
    (40, 8, 120, 60, 2, "strict"): "e0d2398b70d3fdbab9935ae449e79680bc4571be636efecad968a183e5789049",
    (40, 8, 120, 60, 2, "fifo"): "334d7156ac22ba8ff54bdc5052e905c01fa4d6a571788c127ff9f12c6d25d2d0",
    (250, 8, 1500, 1200, 1, "default"): "191fbb71ba32ae3d250067ee05cec84842bcfe47eab8a1a7c2d3bfb7ffe44617",
    (250, 8, 1500, 1200, 2, "reservations"): "e07163cfb5c7f30c2ba3b27fe4d4a5022032a629f43cb993c3ef59f73a8c0cbc",
    (300, 4, 900, 1500, 0, "smallest"): "4ba0c4edfeb87b5aa7ee7710e97794f12945224e9e9ab3072bd73aed048dd86d",
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
