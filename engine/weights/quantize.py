"""Weight-only quantization to the engine's int4 / int8 formats, and the policy saying which tensor gets which.

Canonical forms (what pack_int4 / pack_int8 of qwendesk_kernels/quant_format.py take), groups of G along K (the input
dim):
  int4: q uint8 [N, K] in 0..15, scales and zeros [N, K/G], float zero points: W ~ (q - zeros) * scales
  int8: q int8 [N, K], scales [N, K/G], symmetric: W ~ q * scales

int4 methods, neither needs calibration data:
  "rtn": each group's min..max mapped onto 0..15.
  "als": alternating least squares. From a few clipped ranges (including RTN's), alternate assigning levels
         (round to nearest) and refitting the group's scale and zero by least squares; keep, per group, the
         candidate with the smallest error after scales/zeros are rounded to their stored dtype, so it is
         never worse than RTN. (HQQ's robust l_p<1, zero-only update was tried too: on synthetic LLM-like
         weights it gets about a third of this method's error reduction over RTN.)
Large tensors go in chunks of rows, so the temporaries stay a few hundred MB whatever the tensor's size.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

CHUNK_ELEMENTS = 1 << 24          # fp32 elements per chunk of rows
ALS_CLIP_RATIOS = (1.0, 0.9, 0.8)  # starting ranges, as fractions of the group's min..max span
ALS_ITERS = 10


class Int4(NamedTuple):
    q: torch.Tensor        # uint8 [N, K], 0..15
    scales: torch.Tensor   # [N, K // G]
    zeros: torch.Tensor    # [N, K // G]

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]


class Int8(NamedTuple):
    q: torch.Tensor        # int8 [N, K]
    scales: torch.Tensor   # [N, K // G]

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]


def _groups(W: torch.Tensor, group_size: int):
    """Yield (row slice, fp32 view [rows * K/G, G]) chunk by chunk."""
    N, K = W.shape
    if K % group_size:
        raise ValueError(f"K={K} is not a multiple of the group size {group_size}")
    rows = max(1, CHUNK_ELEMENTS // K)
    for r in range(0, N, rows):
        yield slice(r, min(r + rows, N)), W[r:r + rows].float().reshape(-1, group_size)


def _stored(s: torch.Tensor, z: torch.Tensor, floor: torch.Tensor,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) as they will read back from `dtype`; the scale floor keeps zeros (-min/scale) finite."""
    return s.clamp_min(floor).to(dtype).float(), z.to(dtype).float()


def _levels(w, s, z):
    return torch.round(w / s[:, None] + z[:, None]).clamp_(0, 15)


def _sq_error(w, s, z):
    return ((_levels(w, s, z) - z[:, None]) * s[:, None] - w).square_().sum(1)


def _clipped_start(w: torch.Tensor, ratio: float, floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero mapping the group's range, shrunk by `ratio` about its middle, onto 0..15."""
    lo, hi = w.amin(1), w.amax(1)
    mid = (lo + hi) / 2
    lo, hi = mid + (lo - mid) * ratio, mid + (hi - mid) * ratio
    s = ((hi - lo) / 15).clamp_min(floor)
    return s, -lo / s


def _refit(w: torch.Tensor, s: torch.Tensor, z: torch.Tensor, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Alternate level assignment and the least-squares (scale, zero) of each group."""
    n = w.shape[1]
    w_sum = w.sum(1)
    for _ in range(iters):
        q = _levels(w, s, z)
        q_sum = q.sum(1)
        var = q.square().sum(1) - q_sum.square() / n
        cov = (q * w).sum(1) - q_sum * w_sum / n
        fit = var > 0          # levels are monotone in w, so cov > 0 whenever var > 0
        a = torch.where(fit, cov / torch.where(fit, var, 1.0), s)
        b = (w_sum - a * q_sum) / n
        s, z = a, torch.where(fit, -b / a, z)
    return s, z


def _quantize_group_rows(w, method, dtype):
    floor = (w.abs().amax(1) / 2048).clamp_min(torch.finfo(dtype).tiny)
    s, z = _stored(*_clipped_start(w, 1.0, floor), floor, dtype)
    if method == "als":
        best = _sq_error(w, s, z)
        for ratio in ALS_CLIP_RATIOS:
            cs, cz = _stored(*_refit(w, *_clipped_start(w, ratio, floor), ALS_ITERS), floor, dtype)
            err = _sq_error(w, cs, cz)
            better = err < best
            best = torch.where(better, err, best)
            s, z = torch.where(better, cs, s), torch.where(better, cz, z)
    return _levels(w, s, z), s, z


def quantize_int4(W: torch.Tensor, group_size: int = 128, method: str = "als",
                  dtype: torch.dtype = torch.float16) -> Int4:
    """W [N, K] float -> Int4 (q, scales, zeros) on W's device; scales and zeros stored in `dtype`."""
    if method not in ("als", "rtn"):
        raise ValueError(f"unknown int4 method {method!r} (als or rtn)")
    N, K = W.shape
    q = torch.empty(N, K, dtype=torch.uint8, device=W.device)
    scales = torch.empty(N, K // group_size, dtype=dtype, device=W.device)
    zeros = torch.empty_like(scales)
    for rows, w in _groups(W, group_size):
        cq, cs, cz = _quantize_group_rows(w, method, dtype)
        q[rows] = cq.to(torch.uint8).view(-1, K)
        scales[rows] = cs.to(dtype).view(-1, K // group_size)
        zeros[rows] = cz.to(dtype).view(-1, K // group_size)
    return Int4(q, scales, zeros)


def quantize_int8(W: torch.Tensor, group_size: int = 128, dtype: torch.dtype = torch.float16) -> Int8:
    """W [N, K] float -> Int8 (q, scales), symmetric per group: scale = absmax / 127."""
    N, K = W.shape
    q = torch.empty(N, K, dtype=torch.int8, device=W.device)
    scales = torch.empty(N, K // group_size, dtype=dtype, device=W.device)
    for rows, w in _groups(W, group_size):
        s = (w.abs().amax(1) / 127).clamp_min(torch.finfo(dtype).tiny).to(dtype).float()
        q[rows] = torch.round(w / s[:, None]).clamp_(-127, 127).to(torch.int8).view(-1, K)
        scales[rows] = s.to(dtype).view(-1, K // group_size)
    return Int8(q, scales)


def dequantize(t: Int4 | Int8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float matrix a quantized weight stands for (reference; test oracle and 16-bit fallback)."""
    G = t.group_size
    scales = t.scales.float().repeat_interleave(G, dim=1)
    if isinstance(t, Int4):
        return ((t.q.float() - t.zeros.float().repeat_interleave(G, dim=1)) * scales).to(dtype)
    return (t.q.float() * scales).to(dtype)
