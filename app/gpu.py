"""The GPU this machine offers (None on a CPU-only machine)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int

    @property
    def label(self) -> str:
        return f"{self.name} · {self.total_bytes / (1 << 30):.0f} GB"


def detect_gpu() -> GpuInfo | None:
    import torch  # the engine's dependency; imported late to keep the window quick to open

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return GpuInfo(props.name, props.total_memory)
