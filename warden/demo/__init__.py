"""A bundled scenario that shows the engine's decisions on a small, busy cluster."""

from __future__ import annotations

from importlib.resources import files

from warden.engine.model import Attempt, Job, JobState, Node, ReplicaPlacement, Snapshot, UsageLedger
from warden.engine.policy import Policy, parse_policy

NOW = 100_000.0
"""The demo's clock: seconds since its cluster started."""


def demo_policy() -> Policy:
    return parse_policy(files("warden.demo").joinpath("policy.yaml").read_text(), "demo/policy.yaml")


def demo_nodes() -> tuple[Node, ...]:
    """Twelve 8-GPU nodes in three racks: 96 GPUs, the sum of the demo policy's quotas."""
    return tuple(Node(f"node{i:02d}", gpus=8, cpu=64_000, memory=512_000, block=f"rack{i // 4}") for i in range(12))


def _running(
    job_id: str, queue: str, tier: int, node: str, gpus: int, first_gpu: int, started: float, **facts: float | None
) -> Job:
    attempt = Attempt(
        number=1,
        started_at=started,
        assignment=(ReplicaPlacement(node, tuple(range(first_gpu, first_gpu + gpus))),),
        startup_s=facts.get("startup_s", 60.0),
        checkpoint_s=facts.get("checkpoint_s") or 0.0,
        last_checkpoint_at=facts.get("last_checkpoint_at"),
        sigterm_save_s=facts.get("sigterm_save_s"),
    )
    return Job(
        job_id,
        queue,
        tier,
        submit=started - 30,
        state=JobState.RUNNING,
        gpus=gpus,
        attempt=attempt,
        user=queue + "-user",
    )


def demo_snapshot() -> Snapshot:
    """A full cluster, a tier-1 service arriving, and jobs that wait for different reasons."""
    h = 3600.0
    running = [
        # vision: two long fine-tunes; one checkpoints on SIGTERM (cheap victim), one never has.
        _running(
            "vis-finetune-a",
            "vision",
            3,
            "node00",
            8,
            0,
            NOW - 5 * h,
            sigterm_save_s=40.0,
            last_checkpoint_at=NOW - 600,
        ),
        _running("vis-finetune-b", "vision", 3, "node01", 8, 0, NOW - 2 * h, last_checkpoint_at=NOW - 1.5 * h),
        _running("vis-sweep-1", "vision", 3, "node02", 8, 0, NOW - 3 * h, last_checkpoint_at=NOW - 300),
        _running("vis-sweep-2", "vision", 3, "node03", 8, 0, NOW - 20 * 60),  # inside its 45m lease
        # language: pre-training spread over rack 1, in quota.
        *[
            _running(
                f"lang-pretrain-{i}", "language", 2, f"node0{4 + i}", 8, 0, NOW - 10 * h, last_checkpoint_at=NOW - 900
            )
            for i in range(4)
        ],
        # platform: serving plus an opportunistic batch job on idle capacity.
        _running("plat-serve", "platform", 1, "node08", 8, 0, NOW - 48 * h),
        _running("plat-batch", "platform", 4, "node09", 8, 0, NOW - h),
        _running("vis-scavenge", "vision", 4, "node10", 8, 0, NOW - 6 * h, last_checkpoint_at=NOW - 5 * h),
        _running(
            "lang-eval", "language", 3, "node11", 8, 0, NOW - 4 * h, sigterm_save_s=30.0, last_checkpoint_at=NOW - 60
        ),
    ]
    pending = [
        Job("plat-serve-2", "platform", 1, submit=NOW - 60, gpus=8, user="platform-user"),
        Job(
            "lang-pretrain-big",
            "language",
            2,
            submit=NOW - 1800,
            state=JobState.AWAITING_APPROVAL,
            replicas=4,
            gpus=8,
            placement="block",
            user="language-user",
        ),
        Job("vis-hparam", "vision", 3, submit=NOW - 900, gpus=4, user="vision-user"),
        Job("plat-gang", "platform", 3, submit=NOW - 7200, replicas=2, gpus=8, placement="block", user="platform-user"),
    ]
    ledger = UsageLedger(at=NOW, usage={"vision": 30_000.0, "language": 52_000.0, "platform": 12_000.0})
    return Snapshot(nodes=demo_nodes(), jobs=tuple(running + pending), policy=demo_policy(), ledger=ledger)
