"""The NVIDIA GPUs and driver of this machine, as nvidia-smi reports them (it comes with every NVIDIA driver,
on Windows and on Linux); no torch needed, so this runs before any PyTorch is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass

QUERY = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class NvidiaGpu:
    name: str
    driver: tuple[int, ...]      # 575.57.8 -> (575, 57, 8)
    memory_mib: int

    @property
    def driver_text(self) -> str:
        return ".".join(str(part) for part in self.driver)


def parse_driver(text: str) -> tuple[int, ...]:
    """'575.57.08' -> (575, 57, 8); ValueError when it is not a dotted version."""
    return tuple(int(part) for part in text.strip().split("."))


def parse_nvidia_smi(output: str) -> list[NvidiaGpu]:
    """One GPU per line: 'NVIDIA GeForce RTX 4090, 575.57.08, 24564'. Lines that do not parse are skipped."""
    gpus = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.rsplit(",", 2)]
        if len(parts) != 3:
            continue
        try:
            gpus.append(NvidiaGpu(parts[0], parse_driver(parts[1]), int(float(parts[2]))))
        except ValueError:
            continue
    return gpus


def detect_gpus(timeout: float = 15.0) -> list[NvidiaGpu]:
    """The NVIDIA GPUs nvidia-smi lists; [] without nvidia-smi, without a driver, or when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    # no console window flashes up on Windows (the app is started without a terminal)
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if sys.platform == "win32" else 0
    try:
        done = subprocess.run([smi, *QUERY], capture_output=True, text=True, timeout=timeout, creationflags=flags)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []
