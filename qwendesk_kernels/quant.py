"""Weight-only int4 / int8 linear layers and the int8 embedding gather: which kernel runs where.

- M <= 32 rows (decode, speculative verify): a GEMV, qwendesk_kernels/gemv_mma.py (the mma GEMV: int4 with 16-bit x, the
  default there; a row's bits do not depend on M) or qwendesk_kernels/gemv_dot.py (the dot GEMV: int4 and int8).
- int4, 32 < M <= FUSED_MAX_M (a short prompt, a chat turn): the dot GEMV tiled over M, a fused GEMM that reads the
  packed words once per weight tile. Dequantising the weight into a scratch for cuBLAS takes two launches per
  scratch chunk and writes and reads 16-bit weights, four times the packed bytes.
- Larger M (prefill): the weight is dequantised in row chunks into a reusable scratch and multiplied by torch.
- int4_swiglu: the MLP's gate|up projection and SwiGLU, at decode in the mma GEMV's epilogue.
- matmul: x W^T for a weight of any kind (16-bit, int4, int8), as Linear holds it.
- Elsewhere than CUDA: the torch references of qwendesk_kernels/quant_format.py, which also holds the formats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwendesk_kernels import gemv_dot, gemv_mma, pdl
from qwendesk_kernels.activation import silu_mul
from qwendesk_kernels.quant_format import (Int4Weight, Int8Weight, group_param_offs, int4_linear_ref, int4_row_words,
                                  int8_embedding_ref, int8_linear_ref, pair_as_float)

GEMV_MAX_M = 32                 # above: int4 the fused GEMM, int8 dequantise + torch matmul
FUSED_MAX_M = 128               # int4, above: dequantise + torch matmul (measured: docs/performance.md)
# row counts that reach each build and autotuning bucket of int4_linear / int8_linear up to FUSED_MAX_M (the engine
# runs every weight shape at these before serving, else a first use compiles or tunes, for seconds)
# (2, 16, 32: also the mma GEMV's builds of 1, 2 and 4 column tiles)
WARM_UP_ROWS = (2,) + tuple(b for b in gemv_dot.M_BUCKETS if 8 < b <= FUSED_MAX_M)
DEQUANT_SCRATCH = 1 << 25       # elements of the dequantised-weight scratch of the large-M path (64 MiB bf16)

_dequant: dict = {}


@triton.jit
def _int4_dequant_kernel(w_ptr, s_ptr, z_ptr, out_ptr, N, K, n0, G: tl.constexpr, BN: tl.constexpr):
    """out [rows, K] = W[n0 : n0 + rows] in out's dtype; program (row tile, 128-k block)."""
    blk = tl.program_id(1)
    r = tl.program_id(0) * BN + tl.arange(0, BN)
    rn = n0 + r
    row_ok = rn < N
    groups = K // G
    w = tl.load(int4_row_words(w_ptr, rn, tl.cdiv(K, 128))[:, None] + blk * 256 + tl.arange(0, 16)[None, :],
                mask=row_ok[:, None], other=0)
    for p in tl.static_range(4):
        sz = group_param_offs(rn, tl.minimum((blk * 128 + p * 32) // G, groups - 1), groups)
        s = tl.load(s_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
        v = (16.0 * s)[:, None] * pair_as_float(w, p, False, tl.float32, False) - ((16.0 + z) * s)[:, None]
        k = blk * 128 + p * 32 + tl.arange(0, 32)
        tl.store(out_ptr + r.to(tl.int64)[:, None] * K + k[None, :], v.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (k[None, :] < K))


@triton.jit
def _int8_dequant_kernel(q_ptr, s_ptr, out_ptr, N, K, n0, G: tl.constexpr, BN: tl.constexpr):
    """out [rows, K] = W[n0 : n0 + rows] in out's dtype; program (row tile, 64-k block)."""
    blk = tl.program_id(1)
    r = tl.program_id(0) * BN + tl.arange(0, BN)
    rn = n0 + r
    row_ok = rn < N
    k = blk * 64 + tl.arange(0, 64)
    q = tl.load(q_ptr + rn.to(tl.int64)[:, None] * K + k[None, :], mask=row_ok[:, None], other=0)
    s = tl.load(s_ptr + rn * (K // G) + blk * 64 // G, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * K + k[None, :], (q.to(tl.float32) * s[:, None]).to(
        out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _int8_embedding_kernel(ids_ptr, q_ptr, s_ptr, out_ptr, K, G: tl.constexpr, BLOCK: tl.constexpr,
                           PDL: tl.constexpr):
    """out[t, kb block] = row ids[t] of W, dequantised; program (token, k block)."""
    pdl.enter(PDL)
    t = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = k < K
    row = tl.load(ids_ptr + t).to(tl.int64)
    q = tl.load(q_ptr + row * K + k, mask=ok, other=0).to(tl.float32)
    s = tl.load(s_ptr + row * (K // G) + k // G, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * K + k, (q * s).to(out_ptr.dtype.element_ty), mask=ok)


def _dequant_scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The reusable buffer the large-M path dequantises weight row chunks into."""
    key = (device, dtype)
    if key not in _dequant or _dequant[key].numel() < numel:
        _dequant[key] = torch.empty(numel, dtype=dtype, device=device)
    return _dequant[key]


def _dequant_matmul(x2: torch.Tensor, y: torch.Tensor, dequantize_rows):
    """y [M, N] = x2 @ W^T: dequantize_rows(out, n0) writes W[n0 : n0 + len(out)] into a row chunk of the scratch,
    and torch multiplies it into the matching column slice of y (cuBLAS writes the strided slice in place)."""
    K, N = x2.shape[1], y.shape[1]
    rows = min(N, max(64, DEQUANT_SCRATCH // K // 64 * 64))
    buf = _dequant_scratch(x2.device, x2.dtype, rows * K)
    for n0 in range(0, N, rows):
        n = min(rows, N - n0)
        chunk = buf[:n * K].view(n, K)
        dequantize_rows(chunk, n0)
        torch.mm(x2, chunk.t(), out=y[:, n0:n0 + n])


# ---------------------------------------------------------------------------------------------------------------
# launchers and dispatch

def _rows(x: torch.Tensor, K: int) -> torch.Tensor:
    """x [..., K] as [M, K] with a contiguous last dim."""
    x2 = x.reshape(-1, K)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def int4_linear_triton(x: torch.Tensor, w: Int4Weight, config: dict | None = None,
                       variant: str | None = None) -> torch.Tensor:
    """x [..., K / x_repeats] -> [..., N] in x's dtype: GEMV for M <= 32 rows, the fused GEMM (the dot GEMV tiled
    over M) up to FUSED_MAX_M, else dequantise + matmul. The GEMV is the mma GEMV where the default takes it
    (gemv_mma.gemv_mma_supports: up to 32 rows of 16-bit x), else A; variant="A" / "C" forces one; config
    forces one config of the variant that runs (see gemv_dot.gemv, gemv_mma.gemv). The mma GEMV reads x twice itself
    where x_repeats = 2 (an int8 weight as int4 planes); the other paths take x repeated."""
    N, K = w.shape
    x2 = _rows(x, K // w.x_repeats)
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if variant is None:
        variant = "C" if gemv_mma.gemv_mma_supports(x2, w) else "A"
    if 0 < M <= gemv_mma.MMA_ROWS and variant == "C":
        gemv_mma.gemv(x2, w, y, config)
    elif 0 < M <= FUSED_MAX_M:
        gemv_dot.gemv(_repeated(x2, w), w.qweight, w.scales, w.zeros, y, 4, w.group_size, config)
    elif M > FUSED_MAX_M:
        def dequantize_rows(out, n0):
            _int4_dequant_kernel[(triton.cdiv(out.shape[0], 32), triton.cdiv(K, 128))](
                w.qweight, w.scales, w.zeros, out, N, K, n0, G=w.group_size, BN=32, num_warps=4)
        _dequant_matmul(_repeated(x2, w), y, dequantize_rows)
    return y.view(*x.shape[:-1], N)


def _repeated(x2: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x2 [M, K / x_repeats] laid out x_repeats times along K, for the kernels that read x once."""
    return x2.repeat(1, w.x_repeats) if w.x_repeats > 1 else x2


def int8_linear_triton(x: torch.Tensor, w: Int8Weight, config: dict | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: GEMV for M <= 32 rows (config: see gemv_dot.gemv), else dequantise +
    matmul."""
    N, K = w.shape
    x2 = _rows(x, K)
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if 0 < M <= GEMV_MAX_M:
        gemv_dot.gemv(x2, w.qweight.view(torch.int32), w.scales, w.scales, y, 8, w.group_size, config)
    elif M > GEMV_MAX_M:
        def dequantize_rows(out, n0):
            _int8_dequant_kernel[(triton.cdiv(out.shape[0], 32), K // 64)](
                w.qweight, w.scales, out, N, K, n0, G=w.group_size, BN=32, num_warps=4)
        _dequant_matmul(x2, y, dequantize_rows)
    return y.view(*x.shape[:-1], N)


def int8_embedding_triton(ids: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    N, K = w.shape
    flat = ids.reshape(-1).contiguous()
    out = torch.empty(flat.shape[0], K, dtype=w.scales.dtype, device=ids.device)
    if flat.shape[0]:
        BLOCK = min(1024, triton.next_power_of_2(K))
        _int8_embedding_kernel[(flat.shape[0], triton.cdiv(K, BLOCK))](
            flat, w.qweight, w.scales, out, K, G=w.group_size, BLOCK=BLOCK, num_warps=4,
            **pdl.launch_args(ids.device))
    return out.view(*ids.shape, K)


def int4_swiglu(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for W = gate | up stacked by rows (the MLP's fused gate_up), [..., N / 2]. On
    CUDA where the mma GEMV runs (decode and verify, M <= 32) in the GEMV's epilogue: one launch, and N / 2 outputs
    written instead of N; elsewhere the linear, then silu_mul (the same roundings either way)."""
    N, K = w.shape
    x2 = _rows(x, K)
    if x.is_cuda and x2.shape[0] > 0 and gemv_mma.gemv_mma_supports(x2, w) and N % 32 == 0:     # (supports: M <= 32)
        y = torch.empty(x2.shape[0], N // 2, dtype=x.dtype, device=x.device)
        gemv_mma.gemv(x2, w, y, None, swiglu=True)
        return y.view(*x.shape[:-1], N // 2)
    return silu_mul(int4_linear(x, w))


def int4_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """y = x @ W^T. CUDA: Triton (graph-capturable for M <= 32 once warmed up); elsewhere the torch reference."""
    return int4_linear_triton(x, w) if x.is_cuda else int4_linear_ref(x, w)


def int8_linear(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """y = x @ W^T (e.g. the 8-bit LM head). CUDA: Triton; elsewhere the torch reference."""
    return int8_linear_triton(x, w) if x.is_cuda else int8_linear_ref(x, w)


def matmul(x: torch.Tensor, w: torch.Tensor | Int4Weight | Int8Weight) -> torch.Tensor:
    """x W^T for a weight of any kind: 16-bit (torch), int4 or int8."""
    if isinstance(w, Int4Weight):
        return int4_linear(x, w)
    if isinstance(w, Int8Weight):
        return int8_linear(x, w)
    return F.linear(x, w)


def int8_embedding(ids: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """ids [T] -> [T, K] rows of the 8-bit table, dequantised to the scales' dtype."""
    return int8_embedding_triton(ids, w) if ids.is_cuda else int8_embedding_ref(ids, w)

