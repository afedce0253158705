"""GPU discovery: fake GPUs, and nvidia-smi faked by a script on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from warden.executors.gpus import FAKE_MEMORY_MIB, GpuInfo, discover_gpus, parse_nvidia_smi


def fake_nvidia_smi(directory: Path, body: str) -> Path:
    directory.mkdir(exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return directory


def test_fake_gpus() -> None:
    gpus = discover_gpus(fake=3)
    assert [gpu.index for gpu in gpus] == [0, 1, 2]
    assert {gpu.name for gpu in gpus} == {"fake"} and {gpu.memory_mib for gpu in gpus} == {FAKE_MEMORY_MIB}
    assert len({gpu.uuid for gpu in gpus}) == 3
    assert discover_gpus(fake=0) == []
    with pytest.raises(ValueError):
        discover_gpus(fake=-1)


def test_nvidia_smi_output_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = (
        "1, NVIDIA H100 80GB HBM3, 81559, GPU-bbbb\n"
        "0, NVIDIA H100 80GB HBM3, 81559, GPU-aaaa\n"
        "2, Odd, Name, [N/A], GPU-cccc\n"
    )
    bin_dir = fake_nvidia_smi(
        tmp_path / "bin",
        f"""
case "$*" in
  *--query-gpu=index,name,memory.total,uuid*--format=csv,noheader,nounits*) printf '{output}' ;;
  *) exit 2 ;;
esac
""",
    )
    monkeypatch.setenv("PATH", str(bin_dir))
    assert discover_gpus() == [
        GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, "GPU-aaaa"),
        GpuInfo(1, "NVIDIA H100 80GB HBM3", 81559, "GPU-bbbb"),
        GpuInfo(2, "Odd, Name", 0, "GPU-cccc"),
    ]
    assert discover_gpus(fake=1)[0].name == "fake"  # fake wins over a real nvidia-smi


def test_no_gpus_when_nvidia_smi_is_missing_or_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert discover_gpus() == []
    failing = fake_nvidia_smi(
        tmp_path / "failing",
        "echo 'NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.'\nexit 9\n",
    )
    monkeypatch.setenv("PATH", str(failing))
    assert discover_gpus() == []


def test_parser_skips_lines_that_are_not_gpus() -> None:
    assert parse_nvidia_smi("No devices were found\n\n") == []
    assert parse_nvidia_smi("WARNING: something, a, b, c\n3, A100, 40960, GPU-x\n") == [
        GpuInfo(3, "A100", 40960, "GPU-x")
    ]
