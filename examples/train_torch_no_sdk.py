"""A PyTorch training loop that keeps warden's contract without importing warden.

    python examples/train_torch_no_sdk.py --steps 300 --step-seconds 0.02

What any codebase needs, in about twenty lines of its own:

- a SIGTERM handler that only raises a flag (installed before the slow ``import torch``), checked
  once per step: the step in flight finishes, then the state is saved and the process exits 0;
- the save is atomic: ``torch.save`` into a temporary file in the same directory, ``fsync``,
  then ``os.replace`` onto the final name, so a SIGKILL mid-save leaves the previous checkpoint
  whole and never a torn one under the final name;
- on start, load that file if it exists (``$WARDEN_CHECKPOINT_DIR``, else ``./checkpoints``).

``warden check-workload -- python examples/train_torch_no_sdk.py`` checks all of it from
outside (docs/workload.md). Without the SDK warden learns nothing of its startup or save times,
so it prices a preemption of this job with the policy's assumed restart overhead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

stop = False


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_sigterm)  # before `import torch`: a SIGTERM during startup counts

import torch  # noqa: E402


def save(state: dict[str, object], path: Path) -> None:
    """Write to a temporary name, make it durable, then rename: the rename is the commit."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the new name itself survives a power loss
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (simulated work)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    directory = Path(os.environ.get("WARDEN_CHECKPOINT_DIR") or "checkpoints")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "last.pt"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    if path.exists():
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
        print(f"resumed from step {step}", flush=True)

    while step < args.steps:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True) / 16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if args.step_seconds:
            time.sleep(args.step_seconds)
        print(f"step {step} loss {loss.item():.5f}", flush=True)
        if stop:
            save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
            print(f"SIGTERM: saved step {step} to {path.name}; exiting", flush=True)
            return 0  # exit 0 after SIGTERM: warden requeues the job
    save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
    print(f"finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
