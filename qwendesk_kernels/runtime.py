"""Where the kernels run: under Triton's CPU interpreter or on a GPU, its compute capability, how many SMs it has
and how much shared memory a block may take there (and an SM holds)."""

import functools
import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@functools.cache
def smem_per_block(device) -> int:
    """Bytes of shared memory one block may use on `device` (the opt-in maximum: 227 KB on an H100, 99 KB on
    an RTX 3090 / 4090 / 5090), as Triton's launcher sees it."""
    from triton.runtime import driver
    index = device.index if isinstance(device, torch.device) and device.index is not None \
        else torch.cuda.current_device()
    return driver.active.utils.get_device_properties(index)["max_shared_mem"]


@functools.cache
def smem_per_sm(device) -> int:
    """Bytes of shared memory one SM holds for all its resident blocks (228 KB on an H100, 100 KB on an RTX 3090 /
    4090, 128 KB on a 5090): with smem_per_block it says how many blocks of a kernel can share an SM."""
    return torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
