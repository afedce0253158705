"""Which GPUs this machine has, for the local executor's single node.

`nvidia-smi` is asked rather than NVML bound directly: it is present wherever the NVIDIA driver
is, needs no Python dependency, and its CSV query output is a stable interface. Machines
without GPUs (laptops, CI) get fake ones on request, so the whole scheduler runs anywhere.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

FAKE_MEMORY_MIB = 81920  # what a fake GPU claims to have: an 80 GiB card
QUERY = ("--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits")


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int  # what CUDA_VISIBLE_DEVICES names
    name: str
    memory_mib: int  # 0 when the driver does not say
    uuid: str


def discover_gpus(fake: int | None = None, *, timeout_s: float = 10.0) -> list[GpuInfo]:
    """`fake` GPUs named "fake" when `fake` is given (0 included); else the GPUs nvidia-smi
    lists. No nvidia-smi on PATH, or one that fails (no driver, no device), means no GPUs."""
    if fake is not None:
        if fake < 0:
            raise ValueError(f"fake GPU count must be >= 0, got {fake}")
        return [GpuInfo(i, "fake", FAKE_MEMORY_MIB, f"GPU-fake-{i:04d}") for i in range(fake)]
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return []
    try:
        result = subprocess.run([binary, *QUERY], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(result.stdout) if result.returncode == 0 else []


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Parse `index, name, memory.total, uuid` lines; lines that do not fit are skipped
    (nvidia-smi prints warnings on stdout on some drivers)."""
    gpus = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 4 or not parts[0].strip().isdigit():
            continue
        index, memory, uuid = parts[0].strip(), parts[-2].strip(), parts[-1].strip()
        name = ",".join(parts[1:-2]).strip()  # a name with a comma in it stays whole
        gpus.append(GpuInfo(int(index), name, int(memory) if memory.isdigit() else 0, uuid))
    return sorted(gpus, key=lambda gpu: gpu.index)
