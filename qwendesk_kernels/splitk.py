"""Deterministic split-K for the GEMVs: each K split of an output tile writes an fp32 partial; the last split to
arrive at the tile's counter sums the partials in split order, writes y and resets the counter, all in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLITK_FLOATS = 1 << 23         # fp32 split-K partials, one buffer per device (32 MiB: a 32-row gate_up in 4 parts on
#                                 a 170-SM 5090; inside the memory plan's margin)
SPLITK_COUNTERS = 1 << 14       # split-K arrival counters, one per output tile

_splitk: dict = {}


@triton.jit
def _write_and_arrive(y, offs, mask, part_ptr, count_ptr, M, N, tile, part):
    """Write partial number `part` of the tile, then arrive at its counter -> how many arrived before."""
    tl.store(part_ptr + part * M * N + offs, y, mask=mask)
    tl.debug_barrier()                      # every thread's partial is written before the release below
    return tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _sum_partials(y, offs, mask, part_ptr, M, N, parts):
    """The tile's partials summed in order."""
    total = tl.zeros_like(y)
    for s in range(parts):
        total += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def store_tile(y, rows, cols, y_ptr, part_ptr, count_ptr, M, N, stride_ym, tile, part, parts):
    """Store the fp32 tile y (any shape; rows / cols broadcast to it: its weight rows and x rows), partial sum
    number `part` of `parts` (K splits) of row tile `tile`, into y [M, N].

    With parts > 1 each writes its partial to part_ptr [parts, M, N]; the last to arrive at the tile's counter sums
    the partials in order (deterministic), writes y and resets the counter for the next launch."""
    mask = (rows < N) & (cols < M)
    y_offs = cols * stride_ym + rows
    if parts == 1:
        tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        offs = cols * N + rows
        if _write_and_arrive(y, offs, mask, part_ptr, count_ptr, M, N, tile, part) == parts - 1:
            total = _sum_partials(y, offs, mask, part_ptr, M, N, parts)
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0)


@triton.jit
def arrive(y, rows, cols, part_ptr, count_ptr, M, N, tile, part, parts):
    """store_tile for an epilogue of its own (parts > 1): -> (the tile's sum, True) for the last of the K splits to
    arrive, which resets the counter; (y, False) for the others. (store_tile is not written with it: that form let
    the compiler move the store's address math out of the GEMV's loop, 7% slower at M = 1: docs/performance.md.)"""
    mask = (rows < N) & (cols < M)
    offs = cols * N + rows
    last = _write_and_arrive(y, offs, mask, part_ptr, count_ptr, M, N, tile, part) == parts - 1
    total = y
    if last:
        total = _sum_partials(y, offs, mask, part_ptr, M, N, parts)
        tl.atomic_xchg(count_ptr + tile, 0)
    return total, last


def splitk_scratch(device: torch.device):
    """(fp32 partials, zeroed int32 counters) shared by all GEMV launches on the device. Allocated on the first
    call: warm up before capturing a CUDA graph (the autotuner needs that too)."""
    if device not in _splitk:
        _splitk[device] = (torch.empty(SPLITK_FLOATS, dtype=torch.float32, device=device),
                           torch.zeros(SPLITK_COUNTERS, dtype=torch.int32, device=device))
    return _splitk[device]

