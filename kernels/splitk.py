"""Deterministic split-K for the GEMVs: each K split of an output tile writes an fp32 partial; the last split to
arrive at the tile's counter sums the partials in split order, writes y and resets the counter, all in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLITK_FLOATS = 1 << 21         # fp32 split-K partials, one buffer per device (8 MiB)
SPLITK_COUNTERS = 1 << 14       # split-K arrival counters, one per output tile

_splitk: dict = {}


@triton.jit
def reduce_tile(y, rows, cols, part_ptr, count_ptr, M, N, tile, part, parts):
    """The fp32 tile y (any shape; rows / cols broadcast to it: its weight rows and x rows) as partial sum number
    `part` of `parts` (K splits) of row tile `tile` of y [M, N] -> (the tile's whole sum, whether this program
    holds it): with parts > 1 each writes its partial to part_ptr [parts, M, N]; the last to arrive at the tile's
    counter sums the partials in order (deterministic) and resets the counter for the next launch."""
    total = y
    done = parts == 1
    if parts > 1:
        mask = (rows < N) & (cols < M)
        offs = cols * N + rows
        tl.store(part_ptr + part * M * N + offs, y, mask=mask)
        tl.debug_barrier()                      # every thread's partial is written before the release below
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == parts - 1
        if done:
            total = tl.zeros_like(y)
            for s in range(parts):
                total += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)
    return total, done


@triton.jit
def store_tile(y, rows, cols, y_ptr, part_ptr, count_ptr, M, N, stride_ym, tile, part, parts):
    """Store the tile y (reduce_tile's arguments) into y [M, N], by the program that holds its whole sum."""
    total, done = reduce_tile(y, rows, cols, part_ptr, count_ptr, M, N, tile, part, parts)
    if done:
        tl.store(y_ptr + cols * stride_ym + rows, total.to(y_ptr.dtype.element_ty), mask=(rows < N) & (cols < M))

def splitk_scratch(device: torch.device):
    """(fp32 partials, zeroed int32 counters) shared by all GEMV launches on the device. Allocated on the first
    call: warm up before capturing a CUDA graph (the autotuner needs that too)."""
    if device not in _splitk:
        _splitk[device] = (torch.empty(SPLITK_FLOATS, dtype=torch.float32, device=device),
                           torch.zeros(SPLITK_COUNTERS, dtype=torch.int32, device=device))
    return _splitk[device]

