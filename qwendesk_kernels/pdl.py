"""Programmatic dependent launch (PDL, sm_90+) for the kernels of the decode step.

A kernel launched with PDL may start while the kernel before it in the stream is still running, once every program
of that one has let it (gdc_launch_dependents, or exited); it must wait (gdc_wait) before it reads what the kernel
before wrote, or writes what it reads. Our kernels let the next one start first thing and then wait, so each
kernel's launch and start-up overlap the one before it; the int4 GEMV loads its first weights before it waits
(they do not depend on the kernel before). Order stays transitive: a kernel completes only after its own wait,
so after every kernel before it. A kernel launched without PDL (torch's) waits for the whole kernel before, as
always, and the early trigger does nothing for it. A decode step is hundreds of short kernels (256 GEMVs of 5-35
µs for the 27B in int4), so their start-up is a large part of the step on a fast GPU (docs/performance.md).

ENABLED switches it off for comparisons; the GPU and Triton (3.4 on) must support it.
"""

import functools

import torch
import triton
import triton.language as tl

from qwendesk_kernels.runtime import INTERPRET

ENABLED = True


@functools.cache
def supported(device: torch.device) -> bool:
    """A CUDA device that can (`capable`); never under the interpreter."""
    if device.type != "cuda" or INTERPRET:
        return False
    return capable(torch.cuda.get_device_capability(device))


def capable(capability: tuple[int, int]) -> bool:
    """sm_90+ and a Triton that launches with PDL."""
    from triton.backends.nvidia.compiler import CUDAOptions   # (here: the CUDA backend only for a CUDA device)
    return (capability >= (9, 0) and hasattr(tl.extra.cuda, "gdc_wait")
            and "launch_pdl" in CUDAOptions.__dataclass_fields__)


def launch_args(device: torch.device) -> dict:
    """Keyword arguments of a launch of a kernel that takes the PDL constexpr: PDL on where it can be."""
    if ENABLED and supported(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def enter(PDL: tl.constexpr):
    """First thing in a kernel: let the next kernel start, then wait for the one before."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
