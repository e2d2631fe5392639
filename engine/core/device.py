"""The device the engine runs on: which one `auto` means, its dtype, and the memory it offers.

Decided here once; the planner, the engine and the app (through engine.api) all ask this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.core.params import DEVICES

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
GIB = 1 << 30


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the planner sees it."""
    kind: str               # cuda | cpu
    name: str
    total_bytes: int
    free_bytes: int         # what it offers now: free GPU memory, or on the CPU the RAM the kernel says is available
    #                         (free + reclaimable cache: /proc/meminfo's MemAvailable); the planner keeps the
    #                         system's share of it (memory.budget_for)

    @property
    def on_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        return f"{self.name} · {self.total_bytes / GIB:.0f} GB"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but no CUDA GPU is available")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {name!r}")
    return torch.device(name)


def resolve_dtype(name: str, kind: str) -> torch.dtype:
    """The activation dtype: `auto` is bf16 on a GPU and fp32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if kind == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, not {name!r}")
    return DTYPES[name]


def host_ram_bytes() -> int:
    """Physical RAM of this machine (16 GiB when it cannot be told)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 * GIB


def available_host_bytes() -> int:
    """RAM that programs can take now without swapping: MemAvailable on Linux (free pages plus the page cache
    and other memory the kernel reclaims), else the free pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return host_ram_bytes() // 2


def probe(name: str = "auto") -> DeviceInfo:
    """The device `name` resolves to, with its memory now."""
    device = resolve_device(name)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return DeviceInfo("cuda", torch.cuda.get_device_name(device), total, free)
    return DeviceInfo("cpu", "CPU", host_ram_bytes(), available_host_bytes())


def on_gpu(device: torch.device) -> bool:
    """The engine's device is a CUDA GPU (DeviceInfo.on_gpu says the same of a probe)."""
    return device.type == "cuda"


def copy_behind(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], torch.cuda.Event | None]:
    """Copies of device tensors arriving in page-locked host memory, queued behind the work launched so far, and an
    event recorded after them: waiting for it waits for that work only, where .tolist() on a device tensor would wait
    for everything queued since (the next step or round included). Off a GPU: copies made now, and None (a
    captured round's outputs are buffers that its next replay overwrites)."""
    if not tensors[0].is_cuda:
        return [t.clone() for t in tensors], None
    hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in tensors]
    ready = torch.cuda.Event()
    ready.record()
    return hosts, ready


def pinned(t: torch.Tensor) -> torch.Tensor:
    """t in page-locked memory where CUDA is up, for an upload: a copy from pageable memory to the GPU first waits for
    all the work queued on the stream, which would make the host wait for a decode step it has just launched."""
    return t.pin_memory() if torch.cuda.is_available() else t


def empty_host_cache() -> None:
    """Give the OS back the page-locked memory torch keeps cached once its tensors are freed (the host tier's slabs,
    the whole budget: engine/cache/host.py), where this torch can (torch.accelerator.memory.empty_host_cache: the
    product's torch has it; older ones keep the memory until the process ends)."""
    empty = getattr(getattr(torch.accelerator, "memory", None), "empty_host_cache", None)
    if empty is not None:
        empty()


def graphs_on(device: torch.device) -> bool:
    """Whether this device replays CUDA graphs (a GPU)."""
    return on_gpu(device)


def capture_graph(graph: torch.cuda.CUDAGraph, pool=None):
    """torch.cuda.graph, capturing in thread-local mode. In CUDA's default (global) mode a synchronizing call
    from any thread fails the capture, and the disk tier's writer and readers make such calls on their own
    threads while the engine captures a round on first use; thread-local forbids them only on the engine's."""
    return torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local")

