"""A two-rank gang doing DDP on CPU (gloo), preempted and resumed as one.

    # under warden (2 replicas; warden sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE):
    warden submit --queue default --tier 3 --gpus 0 --replicas 2 -- python examples/gang_torchrun.py
    # alone, with torchrun (which sets the same variables):
    torchrun --nproc-per-node 2 examples/gang_torchrun.py --steps 300

On SIGTERM warden signals every replica at the same instant, but the ranks notice it at
different moments (each is somewhere in its step). Stopping where each one noticed would leave
rank 0's checkpoint at a step the others never reached, or one rank blocked forever in a
collective the others left. So every step the ranks agree: an all_reduce (MAX) of their stop
flags (``guard.should_stop_all()``). All stop after the same step; rank 0, the only writer,
saves model, optimizer and step; every rank exits 0. On restart rank 0 picks the newest complete
checkpoint, broadcasts its step, and every rank loads that same one.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warden.workload import CheckpointStore, default_reporter, install

guard = install()  # before the slow imports: a SIGTERM during startup is kept, not fatal

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

FEATURES, HIDDEN, BATCH = 16, 32, 32


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of step `step`'s synthetic batch, reproducible from (step, rank)."""
    g = torch.Generator().manual_seed(step * world + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    true_w = torch.arange(FEATURES, dtype=torch.float32).unsqueeze(1) / FEATURES
    return x, x @ true_w + 0.1 * torch.randn(BATCH, 1, generator=g)


def resume(store: CheckpointStore, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Rank 0 chooses the checkpoint (newest that verifies); all ranks load that one."""
    chosen = store.load_latest() if guard.is_writer else None
    step_box: list[Any] = [chosen[0] if chosen is not None else None]
    dist.broadcast_object_list(step_box, src=0)
    step = step_box[0]
    if step is None:
        return 0
    if chosen is None:
        info = next((i for i in store.checkpoints() if i.step == step), None)
        if info is None:
            raise SystemExit(
                f"rank {guard.rank}: checkpoint {step} chosen by rank 0 is not in "
                f"{store.directory} (is the directory shared by all ranks?)"
            )
        saved = store.load(info)
    else:
        saved = chosen[1]
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    return int(step)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (warden's or torchrun's).
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = CheckpointStore()
    reporter = default_reporter()  # reports from rank 0 only
    model, opt = make_model()
    step = resume(store, model, opt)
    if step:
        print(f"rank {rank} resumed from step {step}", flush=True)
    ddp = DistributedDataParallel(model)
    reporter.startup_finished()

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}

    while step < args.steps:
        x, y = batch(step, rank, world)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP averages the gradients across ranks here
        opt.step()
        if args.step_seconds:
            time.sleep(args.step_seconds)
        step += 1
        reporter.progress(step, samples=step * BATCH * world)
        print(f"rank {rank} step {step} loss {loss.item():.5f}", flush=True)
        if guard.should_stop_all():  # the same answer on every rank, after the same step
            if guard.is_writer:
                path = store.save_torch(step, state())
                print(f"rank {rank}: SIGTERM: saved step {step} to {path.name}", flush=True)
            print(f"rank {rank}: stopping after step {step}", flush=True)
            leave(reporter, 0)
        if guard.is_writer and args.checkpoint_every and step % args.checkpoint_every == 0:
            store.save_torch(step, state())

    if guard.is_writer and store.latest_step() != step:
        store.save_torch(step, state())
    print(f"rank {rank} finished at step {step} digest {digest(model)}", flush=True)
    leave(reporter, 0)


def leave(reporter: Any, code: int) -> NoReturn:
    """Every rank leaves together, once everything is saved: a barrier, the reports and the
    streams flushed, then `os._exit`. The process group is not torn down: gloo's background
    threads abort a process ("terminate called without an active exception") when they are
    destroyed after a peer has already gone, and nothing is left to clean up."""
    dist.barrier()
    reporter.flush(5.0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
