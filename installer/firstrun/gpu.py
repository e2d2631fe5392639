"""The NVIDIA GPUs and driver of this machine, as nvidia-smi reports them (it comes with every NVIDIA driver,
on Windows and on Linux); no torch needed, so this runs before any PyTorch is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass

FIELDS = "name,driver_version,memory.total"
# compute_cap: drivers from 510 on; an older nvidia-smi refuses the whole query with it, then it is asked without
QUERIES = ([f"--query-gpu={FIELDS},compute_cap", "--format=csv,noheader,nounits"],
           [f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"])


@dataclass(frozen=True)
class NvidiaGpu:
    name: str
    driver_text: str                             # as the driver reports it: '580.95.05'
    memory_mib: int
    compute_cap: tuple[int, int] | None = None   # (8, 6) for sm_86; None where nvidia-smi cannot say

    @property
    def driver(self) -> tuple[int, ...]:
        return parse_driver(self.driver_text)


def parse_driver(text: str) -> tuple[int, ...]:
    """'575.57.08' -> (575, 57, 8); ValueError when it is not a dotted version."""
    parts = tuple(int(part) for part in text.strip().split("."))
    if len(parts) < 2:
        raise ValueError(f"not a driver version: {text!r}")
    return parts


def parse_compute_cap(text: str) -> tuple[int, int] | None:
    major, _, minor = text.strip().partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def parse_nvidia_smi(output: str) -> list[NvidiaGpu]:
    """One GPU per line: 'NVIDIA GeForce RTX 4090, 575.57.08, 24564[, 8.9]' (a name may hold commas). Lines that
    do not parse are skipped."""
    gpus = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        for fields in (4, 3):                 # with compute_cap first, else without
            if len(parts) < fields:
                continue
            name, driver, memory = ", ".join(parts[:len(parts) - fields + 1]), *parts[len(parts) - fields + 1:][:2]
            try:
                parse_driver(driver)
                gpus.append(NvidiaGpu(name, driver, int(float(memory)),
                                      parse_compute_cap(parts[-1]) if fields == 4 else None))
                break
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
    for query in QUERIES:
        try:
            done = subprocess.run([smi, *query], capture_output=True, text=True, timeout=timeout,
                                  creationflags=flags)
        except (OSError, subprocess.TimeoutExpired):
            return []
        if done.returncode == 0:
            return parse_nvidia_smi(done.stdout)
    return []
