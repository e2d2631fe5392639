"""Partial NeoX rotary embedding with multi-axis (mRoPE) positions.

Only the first `rotary_dim` dims of each head rotate (halves [0, r/2) and [r/2, r)). Frequency j
takes its position from axis t, h or w, interleaved the way transformers' Qwen3.5 does it:
j % 3 == 1 and j < 3 * section[1] -> h; j % 3 == 2 and j < 3 * section[2] -> w; otherwise t.
For text, all three axes carry the same position.
"""

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.norm import rms_norm_ref


def inv_freq(rotary_dim: int, theta: float, device=None) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))


def mrope_axis(rotary_dim: int, section, device=None) -> torch.Tensor:
    """For each of the rotary_dim // 2 frequencies, which position axis (0=t, 1=h, 2=w) drives it."""
    j = torch.arange(rotary_dim // 2, device=device)
    axis = torch.zeros_like(j)
    axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
    return axis


def rope_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, axis: torch.Tensor):
    """positions [3, T] (or [T]) -> cos, sin [T, rotary_dim // 2] in fp32."""
    if positions.dim() == 1:
        positions = positions.unsqueeze(0).expand(3, -1)
    pos = positions.float().gather(0, axis.unsqueeze(1).expand(-1, positions.shape[1])).T  # [T, r/2]
    angles = pos * freqs
    return angles.cos(), angles.sin()


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; rotate the first 2 * cos.shape[-1] dims in the input dtype; returns a new tensor."""
    half = cos.shape[-1]
    c = cos.to(x.dtype).unsqueeze(1)
    s = sin.to(x.dtype).unsqueeze(1)
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


# ---------------------------------------------------------------------------------------------------
# Triton: rotate q [T, Hq, D] and k [T, Hkv, D] in place in one launch, optionally after their head
# RMSNorm (the model's q = rope(q_norm(q)), k = rope(k_norm(k))). cos/sin are computed in the kernel from
# positions [3, T], the per-frequency axis and inv_freq, so the model never materialises them. Every
# rounding step of the torch composition (normed value, cos/sin, both products, their sum, all in the
# activation dtype) is repeated, so the result agrees with the references up to fp32 rounding.

_HEADS_PER_PROGRAM = 4


@triton.jit
def _cos_sin(pos_ptr, sp_axis, sp_t, t, freqs_ptr, axis_ptr, j, mask):
    """cos, sin of position(axis[j], token t) * freqs[j] in fp32 (the same product as rope_cos_sin; tl.cos
    and tl.sin are libdevice's, accurate for large angles), for a vector of frequency indices j."""
    a = tl.load(axis_ptr + j, mask=mask, other=0)
    p = tl.load(pos_ptr + a * sp_axis + t * sp_t, mask=mask, other=0).to(tl.float32)
    angle = p * tl.load(freqs_ptr + j, mask=mask, other=0.0)
    return tl.cos(angle), tl.sin(angle)


@triton.jit
def _norm_rope_heads(base, stride_h, w_ptr, h0, H, d, partner, rot, cos, sin, eps,
                     D: tl.constexpr, HALF: tl.constexpr, HB: tl.constexpr, NORM: tl.constexpr):
    """Heads h0 .. h0 + HB of one token: [norm], rotate the first 2 * HALF dims, store in place."""
    dtype = base.dtype.element_ty
    h = h0 + tl.arange(0, HB)
    rows = base + (h.to(tl.int64) * stride_h)[:, None]
    mask = (h < H)[:, None] & (d < D)[None, :]
    pmask = (h < H)[:, None] & rot[None, :]
    x = tl.load(rows + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner[None, :], mask=pmask, other=0.0).to(tl.float32)   # rotation partner
    if NORM:
        r = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
        x = (x * r * (1.0 + w)[None, :]).to(dtype).to(tl.float32)
        xp = (xp * r * (1.0 + wp)[None, :]).to(dtype).to(tl.float32)
    c = cos.to(dtype).to(tl.float32)[None, :]
    s = sin.to(dtype).to(tl.float32)[None, :]
    a = (x * c).to(dtype).to(tl.float32)
    b = (xp * s).to(dtype).to(tl.float32)
    y = tl.where((d < HALF)[None, :], a - b, a + b)          # x1 c - x2 s | x2 c + x1 s
    y = tl.where(rot[None, :], y, x)
    tl.store(rows + d[None, :], y.to(dtype), mask=mask)


@triton.jit
def _qk_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, pos_ptr, freqs_ptr, axis_ptr,
                    sq_t, sq_h, sk_t, sk_h, sp_axis, sp_t, eps,
                    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                    BLOCK_D: tl.constexpr, HB: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    t = tl.program_id(0)
    hb = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    rot = d < 2 * HALF
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    cos, sin = _cos_sin(pos_ptr, sp_axis, sp_t, t, freqs_ptr, axis_ptr, d % HALF, rot)
    n_qb = (HQ + HB - 1) // HB
    if hb < n_qb:
        _norm_rope_heads(q_ptr + t.to(tl.int64) * sq_t, sq_h, qw_ptr, hb * HB, HQ, d, partner, rot, cos, sin,
                         eps, D, HALF, HB, NORM)
    else:
        _norm_rope_heads(k_ptr + t.to(tl.int64) * sk_t, sk_h, kw_ptr, (hb - n_qb) * HB, HK, d, partner, rot,
                         cos, sin, eps, D, HALF, HB, NORM)


def qk_rope_triton(q, k, positions, freqs, axis, q_weight=None, k_weight=None, eps=0.0):
    """In place on q [T, Hq, D] and k [T, Hkv, D] (last dim contiguous, any token/head strides);
    with weights, the head RMSNorm first. positions [3, T] or [T] int; freqs [r/2] fp32; axis [r/2] int."""
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and q.dtype == k.dtype
    T, HQ, D = q.shape
    HK = k.shape[1]
    if positions.dim() == 1:
        positions = positions.unsqueeze(0).expand(3, -1)
    norm = q_weight is not None
    hb = _HEADS_PER_PROGRAM
    grid = (T, triton.cdiv(HQ, hb) + triton.cdiv(HK, hb))
    _qk_rope_kernel[grid](q, k, q_weight if norm else q, k_weight if norm else k, positions, freqs, axis,
                          q.stride(0), q.stride(1), k.stride(0), k.stride(1), positions.stride(0),
                          positions.stride(1), eps, HQ=HQ, HK=HK, D=D, HALF=freqs.shape[0],
                          BLOCK_D=triton.next_power_of_2(D), HB=hb, NORM=norm, num_warps=4,
                          **pdl.launch_args(q.device))
    return q, k


def qk_rope(q, k, positions, freqs, axis):
    """Rotate q and k in place (one launch on CUDA); returns (q, k)."""
    if q.is_cuda:
        return qk_rope_triton(q, k, positions, freqs, axis)
    cos, sin = rope_cos_sin(positions, freqs, axis)
    q.copy_(apply_rope_ref(q, cos, sin))
    k.copy_(apply_rope_ref(k, cos, sin))
    return q, k


def qk_norm_rope(q, k, q_weight, k_weight, eps, positions, freqs, axis):
    """q = rope(rms_norm(q, q_weight)), k = rope(rms_norm(k, k_weight)), in place (one launch on CUDA)."""
    if q.is_cuda:
        return qk_rope_triton(q, k, positions, freqs, axis, q_weight, k_weight, eps)
    cos, sin = rope_cos_sin(positions, freqs, axis)
    q.copy_(apply_rope_ref(rms_norm_ref(q, q_weight, eps), cos, sin))
    k.copy_(apply_rope_ref(rms_norm_ref(k, k_weight, eps), cos, sin))
    return q, k
