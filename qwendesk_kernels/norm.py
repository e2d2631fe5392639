"""RMSNorm family: zero-centred (1 + w) norm, fused residual add + norm, the GDN gated output norm.

All compute in fp32 and cast back to the input dtype, the way transformers' Qwen3.5 does. The Triton
kernels repeat the references' casts (where a result is rounded to the activation dtype) so that they
agree with them up to fp32 rounding.

Rows may be strided: an input of shape [..., H, N] only needs its last dim contiguous, so the q/k head
views cut out of the fused qkv projection ([T, H, 256] with a token stride wider than H * 256) and the
GDN gate view are read in place. Outputs are new contiguous tensors.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwendesk_kernels import pdl


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / rms(x) * (1 + w): the zero-centred norm of every Qwen3.5 RMSNorm (also q/k head norm)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """residual += x; return (rms_norm(residual), residual). Sum kept in the activation dtype."""
    residual = x + residual
    return rms_norm_ref(residual, weight, eps), residual


def gated_rms_norm_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: (x / rms(x) * w) * silu(gate). Plain weight (not zero-centred), over the last dim."""
    dtype = x.dtype
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    y = weight * y
    return (y * F.silu(gate.float())).to(dtype)


# ---------------------------------------------------------------------------------------------------
# Triton

def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as a [T, H, N] view whose last dim is contiguous (copies only when no such view exists)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.reshape(-1, *x.shape[-2:])


def _config(n: int):
    """(block over the row, rows per program, warps): ~2K-8K elements per program."""
    block = triton.next_power_of_2(n)
    rows = max(1, 2048 // block)
    warps = 4 if block * rows <= 2048 else 8
    return block, rows, warps


@triton.jit
def _row_tile(rows, cols, R, H, stride_t, stride_h, N: tl.constexpr):
    """Offsets and mask of a [ROWS, BLOCK] tile of rows of a [T, H, N] view (row r = token r // H, head r % H)."""
    r = rows.to(tl.int64)
    offs = ((r // H) * stride_t + (r % H) * stride_h)[:, None] + cols[None, :]
    return offs, (rows < R)[:, None] & (cols < N)[None, :]


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, R, H, sx_t, sx_h, eps,
                     N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    offs, mask = _row_tile(rows, cols, R, H, sx_t, sx_h, N)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * r[:, None] * (1.0 + w)[None, :]
    out = rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptr + out, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, R, H, sx_t, sx_h, sr_t, sr_h, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    x_offs, mask = _row_tile(rows, cols, R, H, sx_t, sx_h, N)
    r_offs, _ = _row_tile(rows, cols, R, H, sr_t, sr_h, N)
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    res = tl.load(res_ptr + r_offs, mask=mask, other=0.0).to(tl.float32)
    s = (x + res).to(dtype)                                  # the sum is rounded to the activation dtype
    out = rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(new_res_ptr + out, s, mask=mask)
    s = s.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(s * s, axis=1) / N + eps)
    y = s * r[:, None] * (1.0 + w)[None, :]
    tl.store(out_ptr + out, y.to(dtype), mask=mask)


@triton.jit
def gated_norm_tile(x, g, w, eps, N: tl.constexpr, ROUND_WY: tl.constexpr, dtype: tl.constexpr):
    """gated_rms_norm_ref over the rows of fp32 tiles x, g [ROWS, BLOCK] (w [BLOCK]; zeros past N), with its
    roundings to dtype; -> fp32. Shared with the fused GDN decode step (qwendesk_kernels/gdn.py)."""
    r = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    y = (x * r[:, None]).to(dtype).to(tl.float32)
    y = w[None, :] * y
    if ROUND_WY:                                             # weight * y is rounded when both share a dtype
        y = y.to(dtype).to(tl.float32)
    return y * (g / (1.0 + tl.exp(-g)))


@triton.jit
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, R, H, sx_t, sx_h, sg_t, sg_h, eps,
                           N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                           ROUND_WY: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    x_offs, mask = _row_tile(rows, cols, R, H, sx_t, sx_h, N)
    g_offs, _ = _row_tile(rows, cols, R, H, sg_t, sg_h, N)
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + g_offs, mask=mask, other=0.0).to(tl.float32)
    y = gated_norm_tile(x, g, w, eps, N, ROUND_WY, dtype)
    out = rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptr + out, y.to(dtype), mask=mask)


def rounds_weight_product(weight: torch.Tensor, x: torch.Tensor) -> bool:
    """gated_rms_norm_ref rounds weight * y to x's dtype when the weight's dtype promotes to it (ROUND_WY)."""
    return torch.promote_types(weight.dtype, x.dtype) == x.dtype


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xr = _rows(x)
    T, H, N = xr.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block, rows, warps = _config(N)
    _rms_norm_kernel[(triton.cdiv(T * H, rows),)](xr, weight, out, T * H, H, xr.stride(0), xr.stride(1), eps,
                                                   N=N, BLOCK=block, ROWS=rows, num_warps=warps,
                                                   **pdl.launch_args(x.device))
    return out


def add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    xr, rr = _rows(x), _rows(residual)
    T, H, N = xr.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block, rows, warps = _config(N)
    _add_rms_norm_kernel[(triton.cdiv(T * H, rows),)](
        xr, rr, weight, out, new_res, T * H, H, xr.stride(0), xr.stride(1), rr.stride(0), rr.stride(1), eps,
        N=N, BLOCK=block, ROWS=rows, num_warps=warps, **pdl.launch_args(x.device))
    return out, new_res


def gated_rms_norm_triton(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xr, gr = _rows(x), _rows(gate)
    T, H, N = xr.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block, rows, warps = _config(N)
    round_wy = rounds_weight_product(weight, x)
    _gated_rms_norm_kernel[(triton.cdiv(T * H, rows),)](
        xr, gr, weight, out, T * H, H, xr.stride(0), xr.stride(1), gr.stride(0), gr.stride(1), eps,
        N=N, BLOCK=block, ROWS=rows, ROUND_WY=round_wy, num_warps=warps,
        **pdl.launch_args(x.device))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N] (rows may be strided, last dim contiguous) -> new tensor, x's dtype."""
    return rms_norm_triton(x, weight, eps) if x.is_cuda else rms_norm_ref(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual): reads x and residual once, writes both outputs."""
    if x.is_cuda:
        return add_rms_norm_triton(x, residual, weight, eps)
    return add_rms_norm_ref(x, residual, weight, eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, gate [..., N] (e.g. [T, Hv, 128]; rows may be strided) -> new tensor, x's dtype."""
    if x.is_cuda:
        return gated_rms_norm_triton(x, gate, weight, eps)
    return gated_rms_norm_ref(x, gate, weight, eps)
