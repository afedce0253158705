"""A small real PyTorch training script (CPU, synthetic data) that honours warden's contract.

    python examples/train_torch.py --steps 300 --step-seconds 0.02

A two-layer MLP learns a noisy linear map with SGD (momentum). It

- resumes from the newest complete checkpoint in ``$WARDEN_CHECKPOINT_DIR`` (else
  ``./checkpoints``): model and optimizer state dicts and the step, saved with ``torch.save``
  and loaded with ``torch.load(weights_only=True)``;
- reports startup, progress and checkpoints to warden (no-ops outside it);
- on SIGTERM finishes the current step, saves, reports, and exits 0 (warden requeues it);
- also saves every ``--checkpoint-every`` steps and at the end.

The batch of step N is drawn from a generator seeded with N, so a run that was preempted and
resumed any number of times ends with bit-identical weights to one that never was: the final
line prints a digest of the weights to check that.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.workload import CheckpointStore, default_reporter, install

# Install the guard before the slow `import torch` (a second or more): a SIGTERM that arrives
# during startup is then remembered, not fatal.
guard = install()

import torch  # noqa: E402

FEATURES, HIDDEN, BATCH = 16, 32, 64


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data for one step, reproducible from the step alone."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    true_w = torch.arange(FEATURES, dtype=torch.float32).unsqueeze(1) / FEATURES
    return x, x @ true_w + 0.1 * torch.randn(BATCH, 1, generator=g)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    x, y = batch(step)
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="extra time per step, to stretch the run (simulated work)"
    )
    parser.add_argument("--checkpoint-every", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: one thread is fastest and deterministic

    store = CheckpointStore()
    reporter = default_reporter()
    model, opt = make_model()
    step = 0
    latest = store.load_latest(map_location="cpu")
    if latest is not None:
        step, saved = latest
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        assert saved["step"] == step
        print(f"resumed from step {step}", flush=True)
    reporter.startup_finished()

    while step < args.steps:
        loss = train_step(model, opt, step)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        step += 1
        reporter.progress(step, samples=step * BATCH)
        print(f"step {step} loss {loss:.5f}", flush=True)
        if guard.should_stop():
            path = store.save_torch(step, state(model, opt, step))
            print(
                f"SIGTERM: saved step {step} to {path.name} ({guard.remaining():.1f}s of grace left); exiting",
                flush=True,
            )
            guard.exit()
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            store.save_torch(step, state(model, opt, step))

    if latest is None or latest[0] != step:
        store.save_torch(step, state(model, opt, step))
    print(f"finished at step {step} digest {digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
