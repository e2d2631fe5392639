"""Paged attention over 4-bit V (K in 8 or 4 bits) stored in a rotated basis: the k8v4 and k4v4 KV formats.

Pools per layer (attention.py holds the bf16 and int8 ones):
- K, 8 bits: int8 [pages, page, Hkv, D] + fp32 k_scale [pages, page, Hkv], one scale per token and head (as int8 KV).
- K, 4 bits, and V: uint8 [pages, page, Hkv, D/2] + fp16 scale [pages, page, Hkv, D/G], one per group of G channels.
  Byte j holds channel j (low nibble) and channel j + D/2 (high nibble), each as code + 8 with code in -7..7,
  x ~= code * scale, scale = group absmax / 7. Halves rather than neighbours: a kernel unpacks a [N, D/2] byte tile
  into two [N, D/2] tiles, each going into a tl.dot with the matching half of q (K) or of the output (V).

Rotation: K and V are stored as x @ H, H the normalized Sylvester-Hadamard matrix of order D (orthogonal and
symmetric). A channel 10-50x larger than the rest (real models have a few) is spread over all D channels, so it no
longer sets the scale of its group while the others round to zero. Scores are unchanged when q is rotated too
((qH)(kH)^T = q k^T), and softmax @ (V H) = o H, so o = (o H) H. The rotations are torch matmuls around the kernels
(new K/V rows before the store; q before and o after attention: [T, Hq, D] @ [D, D] in the activation dtype), so
the kernels see plain quantized pools. docs/performance.md (KV formats) has the error measured with and without it.
"""

import functools

import torch
import triton
import triton.language as tl

from qwendesk_kernels import attention, pdl
from qwendesk_kernels.attention import (LOG2E, _dot_precision, _store_rows, decode_num_splits,
                                        gather_kv)
from qwendesk_kernels.runtime import INTERPRET, capability, smem_per_block, sm_count

INT4_MAX = 7
EMPTY_BYTE = 0x88               # both nibbles code 0


# ---------------------------------------------------------------------------------------------
# the rotation and the 4-bit codes (torch: CPU path and test oracle)
# ---------------------------------------------------------------------------------------------

@functools.cache
def _hadamard_cpu(d: int) -> torch.Tensor:
    assert d & (d - 1) == 0, "the Hadamard rotation needs a power-of-two head_dim"
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d ** 0.5


@functools.cache
def hadamard(d: int, device, dtype=torch.float32) -> torch.Tensor:
    """H [d, d], orthogonal and symmetric (H @ H = I); its entries +-1/sqrt(d) are exact in bf16 for d = 4^k."""
    return _hadamard_cpu(d).to(device, dtype)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x @ H over the last dim (its own inverse): a matmul in x's dtype, fp32 accumulation, no fp32 copy of x."""
    return x @ hadamard(x.shape[-1], x.device, x.dtype)


def quantize_int4_ref(x: torch.Tensor, group: int):
    """x [..., D] -> (uint8 [..., D/2] channels j | j + D/2 << 4, fp16 scale [..., D/G]): symmetric, code in -7..7."""
    d = x.shape[-1]
    g = x.float().unflatten(-1, (d // group, group))
    scale = (g.abs().amax(-1) / INT4_MAX).half()
    inv = torch.where(scale > 0, 1.0 / scale.float(), torch.zeros_like(scale, dtype=torch.float32))
    codes = (g * inv[..., None]).round().clamp(-INT4_MAX, INT4_MAX).flatten(-2).to(torch.int16) + 8
    lo, hi = codes[..., : d // 2], codes[..., d // 2:]
    return (lo | (hi << 4)).to(torch.uint8), scale


def dequantize_int4_ref(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_int4_ref (up to rounding): fp32 [..., D]."""
    b = packed.to(torch.int16)
    codes = torch.cat([b & 15, b >> 4], dim=-1).float() - 8
    group = codes.shape[-1] // scale.shape[-1]
    return (codes.unflatten(-1, (scale.shape[-1], group)) * scale.float()[..., None]).flatten(-2)


def is_kv4(v_cache: torch.Tensor) -> bool:
    """Pools of this module: V packed two channels a byte."""
    return v_cache.dtype == torch.uint8


def _dequant(cache, scale):
    """Gathered rows of one pool -> fp32 [..., D]."""
    if cache.dtype == torch.uint8:
        return dequantize_int4_ref(cache, scale)
    return cache.float() * scale.float()[..., None]


def store_kv4_ref(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    """k, v [T, Hkv, D] (already rotated) -> the pools at slot_mapping (negative slots skipped)."""
    page = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    pages, offs = slots // page, slots % page
    group = v_cache.shape[-1] * 2 // v_scale.shape[-1]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if cache.dtype == torch.uint8:
            packed, s = quantize_int4_ref(x[keep], group)
        else:
            packed, s = attention.quantize_int8_ref(x[keep])
        cache[pages, offs] = packed
        scale[pages, offs] = s.to(scale.dtype)


def paged_attention4_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale):
    """q [T, Hq, D] (rotated) -> o [T, Hq, D] in the rotated basis, q's dtype; softmax in fp32."""
    out = torch.empty_like(q)
    rep = q.shape[1] // k_cache.shape[2]
    bounds = cu_seqlens_q.tolist()
    for i, total in enumerate(seq_lens.tolist()):
        s, e = bounds[i], bounds[i + 1]
        lq = e - s
        k = _dequant(gather_kv(k_cache, block_tables[i], total), gather_kv(k_scale, block_tables[i], total))
        v = _dequant(gather_kv(v_cache, block_tables[i], total), gather_kv(v_scale, block_tables[i], total))
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[s:e].float(), k) * scale
        qpos = torch.arange(total - lq, total, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] > qpos[:, None]
        scores.masked_fill_(mask, float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# store
# ---------------------------------------------------------------------------------------------

@triton.jit
def _quant4(x, G: tl.constexpr):
    """x [H, HALF] fp32 -> (codes + 8 as int32 [H, HALF], fp16-rounded scales fp32 [H, HALF // G])."""
    H: tl.constexpr = x.shape[0]
    HALF: tl.constexpr = x.shape[1]
    groups = tl.reshape(x, (H, HALF // G, G))
    scale = (tl.max(tl.abs(groups), axis=2) / 7.0).to(tl.float16).to(tl.float32)
    inv = tl.where(scale > 0, 1.0 / tl.where(scale > 0, scale, 1.0), 0.0)
    y = groups * inv[:, :, None]
    y = tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int32)          # round half away from zero
    y = tl.minimum(tl.maximum(y, -7), 7) + 8
    return tl.reshape(y, (H, HALF)), scale


@triton.jit
def _store4(x_ptrs_lo, x_ptrs_hi, dst_ptrs, scale_ptrs_lo, scale_ptrs_hi, head_ok, G: tl.constexpr):
    lo, s_lo = _quant4(tl.load(x_ptrs_lo, mask=head_ok[:, None], other=0).to(tl.float32), G)
    hi, s_hi = _quant4(tl.load(x_ptrs_hi, mask=head_ok[:, None], other=0).to(tl.float32), G)
    tl.store(dst_ptrs, (lo | (hi << 4)).to(tl.uint8), mask=head_ok[:, None])
    tl.store(scale_ptrs_lo, s_lo.to(tl.float16), mask=head_ok[:, None])
    tl.store(scale_ptrs_hi, s_hi.to(tl.float16), mask=head_ok[:, None])


@triton.jit
def _store_kv4_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
                      stride_kt, stride_kh, stride_vt, stride_vh,
                      skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh,
                      HKV: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                      BLOCK_H: tl.constexpr, K4: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE
    off = slot % PAGE
    HALF: tl.constexpr = D // 2
    h = tl.arange(0, BLOCK_H)
    head_ok = h < HKV
    c = tl.arange(0, HALF)
    cg = tl.arange(0, HALF // G)
    k_src = k_ptr + t * stride_kt + h[:, None] * stride_kh
    k_row = page * skp + off * sks + h * skh
    ks_row = page * sksp + off * skss + h * sksh
    if K4:
        _store4(k_src + c[None, :], k_src + HALF + c[None, :], k_cache_ptr + k_row[:, None] + c[None, :],
                k_scale_ptr + ks_row[:, None] + cg[None, :], k_scale_ptr + ks_row[:, None] + HALF // G + cg[None, :],
                head_ok, G)
    else:
        d = tl.arange(0, D)
        k = tl.load(k_src + d[None, :], mask=head_ok[:, None])
        _store_rows(k, k_cache_ptr + k_row[:, None] + d[None, :], k_scale_ptr + ks_row, head_ok, True)
    v_src = v_ptr + t * stride_vt + h[:, None] * stride_vh
    v_row = page * svp + off * svs + h * svh
    vs_row = page * svsp + off * svss + h * svsh
    _store4(v_src + c[None, :], v_src + HALF + c[None, :], v_cache_ptr + v_row[:, None] + c[None, :],
            v_scale_ptr + vs_row[:, None] + cg[None, :], v_scale_ptr + vs_row[:, None] + HALF // G + cg[None, :],
            head_ok, G)


def _group(v_cache, v_scale) -> int:
    return v_cache.shape[-1] * 2 // v_scale.shape[-1]


def _check_pools4(k_cache, v_cache, k_scale, v_scale):
    d = v_cache.shape[-1] * 2
    group = _group(v_cache, v_scale)
    assert d >= 32 and d & (d - 1) == 0 and (d // 2) % group == 0, "power-of-two head_dim, groups inside a half"
    assert v_cache.dtype == torch.uint8 and v_scale.shape == v_cache.shape[:3] + (d // group,)
    if k_cache.dtype == torch.uint8:
        assert k_cache.shape == v_cache.shape and k_scale.shape == v_scale.shape
    else:
        assert k_cache.dtype == torch.int8 and k_cache.shape[-1] == d and k_scale.shape == k_cache.shape[:3]
    for t in (k_cache, v_cache, k_scale, v_scale):
        assert t.stride(-1) == 1


def _pool_strides(k_cache, v_cache, k_scale, v_scale) -> list:
    return [*k_cache.stride()[:3], *v_cache.stride()[:3], *k_scale.stride()[:3], *v_scale.stride()[:3]]


def store_kv4_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    """Launcher: k, v [T, Hkv, D] (already rotated; unit stride in D) -> the pools at slot_mapping [T]."""
    _check_pools4(k_cache, v_cache, k_scale, v_scale)
    T, hkv, d = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    _store_kv4_kernel[(T,)](
        k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), *_pool_strides(k_cache, v_cache, k_scale, v_scale),
        HKV=hkv, PAGE=k_cache.shape[1], D=d, G=_group(v_cache, v_scale), BLOCK_H=triton.next_power_of_2(hkv),
        K4=k_cache.dtype == torch.uint8, **pdl.launch_args(k.device))


# ---------------------------------------------------------------------------------------------
# attention: one block of BLOCK_N keys (inside one page) against a tile of query rows
# ---------------------------------------------------------------------------------------------

@triton.jit
def _load4(cache_ptr, scale_ptr, row, scale_row, ok, G: tl.constexpr, HALF: tl.constexpr, MASK: tl.constexpr):
    """[N, D/2] bytes -> (channels 0..D/2-1, channels D/2..D-1) as fp32 code * scale; rows not ok read as 0."""
    c = tl.arange(0, HALF)
    if MASK:
        b = tl.load(cache_ptr + row[:, None] + c[None, :], mask=ok[:, None], other=0x88).to(tl.int32)
        s_lo = tl.load(scale_ptr + scale_row[:, None] + (c // G)[None, :], mask=ok[:, None], other=0).to(tl.float32)
        s_hi = tl.load(scale_ptr + scale_row[:, None] + ((c + HALF) // G)[None, :], mask=ok[:, None],
                       other=0).to(tl.float32)
    else:
        b = tl.load(cache_ptr + row[:, None] + c[None, :]).to(tl.int32)
        s_lo = tl.load(scale_ptr + scale_row[:, None] + (c // G)[None, :]).to(tl.float32)
        s_hi = tl.load(scale_ptr + scale_row[:, None] + ((c + HALF) // G)[None, :]).to(tl.float32)
    return ((b & 15) - 8).to(tl.float32) * s_lo, ((b >> 4) - 8).to(tl.float32) * s_hi


@triton.jit
def _attend_block4(acc_lo, acc_hi, l_i, m_i, q_lo, q_hi, n0, last_key, seq_len, table_ptr,
                   k_ptr, v_ptr, ks_ptr, vs_ptr, kv_head,
                   skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh, qk_scale,
                   PAGE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   K4: tl.constexpr, MASK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online-softmax update with keys n0 .. n0+BLOCK_N-1 (scores in log2 units), as attention._attend_block.
    MASK: keys past a row's last_key get -inf; rows past seq_len (stale slots) are not loaded."""
    HALF: tl.constexpr = D // 2
    page = tl.load(table_ptr + n0 // PAGE).to(tl.int64)
    keys = n0 + tl.arange(0, BLOCK_N)
    slots = n0 % PAGE + tl.arange(0, BLOCK_N)
    in_seq = keys < seq_len
    dt = q_lo.dtype
    k_row = page * skp + kv_head * skh + slots * sks
    ks_row = page * sksp + kv_head * sksh + slots * skss
    if K4:
        k_lo, k_hi = _load4(k_ptr, ks_ptr, k_row, ks_row, in_seq, G, HALF, MASK)
        s = tl.dot(q_lo, tl.trans(k_lo.to(dt)), input_precision=DOT_PRECISION)
        s += tl.dot(q_hi, tl.trans(k_hi.to(dt)), input_precision=DOT_PRECISION)
        s = s * qk_scale
    else:
        c = tl.arange(0, HALF)
        k_lo = tl.load(k_ptr + k_row[:, None] + c[None, :])
        k_hi = tl.load(k_ptr + k_row[:, None] + HALF + c[None, :])
        s = tl.dot(q_lo, tl.trans(k_lo.to(dt)), input_precision=DOT_PRECISION)
        s += tl.dot(q_hi, tl.trans(k_hi.to(dt)), input_precision=DOT_PRECISION)
        s = s * (tl.load(ks_ptr + ks_row).to(tl.float32) * qk_scale)[None, :]
    if MASK:
        s = tl.where(keys[None, :] <= last_key[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v_lo, v_hi = _load4(v_ptr, vs_ptr, page * svp + kv_head * svh + slots * svs,
                        page * svsp + kv_head * svsh + slots * svss, in_seq, G, HALF, MASK)
    p = p.to(dt)
    acc_lo = acc_lo * alpha[:, None] + tl.dot(p, v_lo.to(dt), input_precision=DOT_PRECISION)
    acc_hi = acc_hi * alpha[:, None] + tl.dot(p, v_hi.to(dt), input_precision=DOT_PRECISION)
    return acc_lo, acc_hi, l_i, m_new


@triton.jit
def _attend_range4(acc_lo, acc_hi, l_i, m_i, q_lo, q_hi, lo, mid, hi, last_key, seq_len, table_ptr,
                   k_ptr, v_ptr, ks_ptr, vs_ptr, kv_head,
                   skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh, qk_scale,
                   PAGE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   K4: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Keys lo .. hi in blocks: [lo, mid) visible to every query row (no masking), [mid, hi) masked."""
    for n0 in range(lo, mid, BLOCK_N):
        acc_lo, acc_hi, l_i, m_i = _attend_block4(
            acc_lo, acc_hi, l_i, m_i, q_lo, q_hi, n0, last_key, seq_len, table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
            kv_head, skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh, qk_scale,
            PAGE, BLOCK_N, D, G, K4, False, DOT_PRECISION)
    for n0 in range(mid, hi, BLOCK_N):
        acc_lo, acc_hi, l_i, m_i = _attend_block4(
            acc_lo, acc_hi, l_i, m_i, q_lo, q_hi, n0, last_key, seq_len, table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
            kv_head, skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh, qk_scale,
            PAGE, BLOCK_N, D, G, K4, True, DOT_PRECISION)
    return acc_lo, acc_hi, l_i, m_i


# ---------------------------------------------------------------------------------------------
# decode: split-K over the context; attention.combine_splits merges the splits
# ---------------------------------------------------------------------------------------------

@triton.jit
def _decode4_split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, table_ptr, seq_lens_ptr, o_part_ptr, lse_part_ptr,
                          qk_scale, stride_qt, stride_qh, stride_bt,
                          skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh,
                          L: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                          PAGE: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, K4: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """attention._decode_split_kernel over 8- / 4-bit pools: row tiles j0 .. j0 + ROWS - 1 of a sequence."""
    pdl.enter(PDL)
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2) // TILES
    j0 = tl.program_id(2) % TILES * ROWS
    num_splits = tl.num_programs(0)
    num_q_heads = tl.num_programs(1) * GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)
    HALF: tl.constexpr = D // 2

    r = tl.arange(0, BLOCK_M)            # tile row r = query row j x q head g of this kv head's group
    j = j0 + r // GROUP
    row_ok = (r < ROWS * GROUP) & (j < L)
    t = seq * L + j
    head = kv_head * GROUP + r % GROUP
    c = tl.arange(0, HALF)
    q_rows = q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh
    q_lo = tl.load(q_rows + c[None, :], mask=row_ok[:, None], other=0)
    q_hi = tl.load(q_rows + HALF + c[None, :], mask=row_ok[:, None], other=0)
    last_key = seq_len - L + j

    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    table_ptr += seq * stride_bt
    visible_to_all = tl.minimum(tl.maximum((seq_len - L + 1 + j0) // BLOCK_N * BLOCK_N, lo), hi)
    acc_lo, acc_hi, l_i, m_i = _attend_range4(
        acc_lo, acc_hi, l_i, m_i, q_lo, q_hi, lo, visible_to_all, hi, last_key, seq_len, table_ptr,
        k_ptr, v_ptr, ks_ptr, vs_ptr, kv_head, skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh,
        qk_scale, PAGE, BLOCK_N, D, G, K4, DOT_PRECISION)

    has_keys = l_i > 0
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    inv_l = 1.0 / tl.where(has_keys, l_i, 1.0)
    part = (t * num_q_heads + head) * num_splits + split
    tl.store(lse_part_ptr + part, lse, mask=row_ok)
    o_rows = o_part_ptr + part[:, None] * D
    tl.store(o_rows + c[None, :], acc_lo * inv_l[:, None], mask=row_ok[:, None])
    tl.store(o_rows + HALF + c[None, :], acc_hi * inv_l[:, None], mask=row_ok[:, None])


def decode_attention4(q, k_cache, v_cache, block_tables, seq_lens, scale, q_len, num_splits, k_scale, v_scale):
    """Launcher: q [N * q_len, Hq, D] (rotated; rows of sequence i together) -> o [N * q_len, Hq, D] in the rotated
    basis. No host syncs (graph-capturable), as attention.decode_attention."""
    _check_pools4(k_cache, v_cache, k_scale, v_scale)
    T, hq, d = q.shape
    _, page, hkv, _ = v_cache.shape
    n = seq_lens.shape[0]
    assert T == n * q_len and hq % hkv == 0 and q.stride(-1) == 1 and block_tables.stride(-1) == 1
    group = hq // hkv
    k4 = k_cache.dtype == torch.uint8
    # 4-bit K's 64-row tiles (a round of 5 drafts on the 27B) kept 8-24 B of stack on sm_86 / sm_89 and 48 B on sm_120
    # (make check-consumer-all): programs of at most 32 rows there; sm_90 keeps its 64
    cap = capability(q.device) if q.is_cuda else (9, 0)
    rows, tiles = attention.decode_row_tiles(q_len, group, 32 if k4 and cap[0] != 9 else attention.MAX_TILE_ROWS)
    block_m = max(16, triton.next_power_of_2(rows * group))
    # 64 keys at D = 256: 16 KB of int8 K, 8 KB of 4-bit V; half where two programs would not share an SM
    block_n = min(page, max(16, attention.decode_tile_bytes(q.device, block_m) // d))
    # verify rows (block_m 32+: L 3-5 x the 27B's group 6) spill at 4 warps on sm_86 (24-136 B of stack, make
    # check-consumer); 8 warps there, and tiles of 64 rows (5 drafts) take fewer keys per block: half (k8v4), a
    # quarter (k4v4: its K unpacks too) of 64 (at 64 keys: 8-80 B of stack at 8 warps, 88-536 B at 16)
    warps = 8 if block_m >= 32 else 4
    if block_m >= 64:
        block_n = max(16, block_n // (4 if k4 else 2))
    o_part = torch.empty((T, hq, num_splits, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((T, hq, num_splits), dtype=torch.float32, device=q.device)
    _decode4_split_kernel[(num_splits, hkv, n * tiles)](
        q, k_cache, v_cache, k_scale, v_scale, block_tables, seq_lens, o_part, lse_part, scale * LOG2E,
        q.stride(0), q.stride(1), block_tables.stride(0), *_pool_strides(k_cache, v_cache, k_scale, v_scale),
        L=q_len, GROUP=group, D=d, G=_group(v_cache, v_scale), PAGE=page, ROWS=rows, TILES=tiles, BLOCK_M=block_m,
        BLOCK_N=block_n, K4=k4, DOT_PRECISION=_dot_precision(q.dtype), num_warps=warps, num_stages=3,
        **pdl.launch_args(q.device))
    return attention.combine_splits(o_part, lse_part, q.dtype)


# ---------------------------------------------------------------------------------------------
# prefill: packed chunks, flash attention over the pages
# ---------------------------------------------------------------------------------------------

_PREFILL_TILES = [(16, 16, 4, 1)] if INTERPRET else attention.PREFILL_TILES


def prefill4_smem_bytes(block_m: int, block_n: int, d: int, q_size: int, k_bytes_per_row: int) -> int:
    """Shared memory of one prefill program, as attention.prefill_smem_bytes counts it: Q, a K and a V tile
    (bytes and scales), P."""
    v_row = d // 2 + d // 8            # 4-bit codes and fp16 group scales at the smallest group (16)
    return block_m * d * q_size + block_n * (k_bytes_per_row + v_row) + block_m * block_n * q_size + 16


def _prune_prefill4(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    q, d = args["q_ptr"], args["D"]
    k_row = d // 2 + d // 8 if args["K4"] else d + 4
    smem = smem_per_block(q.device)
    return [c for c in configs if c.kwargs["BLOCK_N"] <= args["PAGE"]
            and prefill4_smem_bytes(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], d, q.element_size(), k_row) <= smem]


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in _PREFILL_TILES],
    key=["D", "PAGE", "GROUP", "G", "K4"], prune_configs_by={"early_config_prune": _prune_prefill4})
@triton.jit
def _prefill4_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, table_ptr, cu_seqlens_ptr, seq_lens_ptr, o_ptr, qk_scale,
                     stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
                     skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh,
                     GROUP: tl.constexpr, D: tl.constexpr, G: tl.constexpr, PAGE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K4: tl.constexpr, DOT_PRECISION: tl.constexpr):
    block = tl.num_programs(0) - 1 - tl.program_id(0)      # last blocks (most keys) first, as attention's
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    if block * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    cached = seq_len - q_len
    kv_head = head // GROUP
    HALF: tl.constexpr = D // 2

    r = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < q_len
    c = tl.arange(0, HALF)
    t = q_start + r
    q_rows = q_ptr + t[:, None] * stride_qt + head * stride_qh
    q_lo = tl.load(q_rows + c[None, :], mask=row_ok[:, None], other=0)
    q_hi = tl.load(q_rows + HALF + c[None, :], mask=row_ok[:, None], other=0)
    last_key = cached + r

    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    table_ptr += seq * stride_bt
    visible_to_all = (cached + block * BLOCK_M + 1) // BLOCK_N * BLOCK_N
    hi = tl.minimum(seq_len, cached + (block + 1) * BLOCK_M)
    acc_lo, acc_hi, l_i, m_i = _attend_range4(
        acc_lo, acc_hi, l_i, m_i, q_lo, q_hi, 0, visible_to_all, hi, last_key, seq_len, table_ptr,
        k_ptr, v_ptr, ks_ptr, vs_ptr, kv_head, skp, sks, skh, svp, svs, svh, sksp, skss, sksh, svsp, svss, svsh,
        qk_scale, PAGE, BLOCK_N, D, G, K4, DOT_PRECISION)
    inv_l = 1.0 / l_i
    o_rows = o_ptr + t[:, None] * stride_ot + head * stride_oh
    tl.store(o_rows + c[None, :], (acc_lo * inv_l[:, None]).to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(o_rows + HALF + c[None, :], (acc_hi * inv_l[:, None]).to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def prefill_attention4(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale):
    """Launcher: packed q [T, Hq, D] (rotated; cu_seqlens_q [N+1]) -> o [T, Hq, D] in the rotated basis; each
    chunk's K/V already stored."""
    _check_pools4(k_cache, v_cache, k_scale, v_scale)
    T, hq, d = q.shape
    _, page, hkv, _ = v_cache.shape
    n = seq_lens.shape[0]
    assert hq % hkv == 0 and q.stride(-1) == 1 and block_tables.stride(-1) == 1
    o = torch.empty((T, hq, d), dtype=q.dtype, device=q.device)

    def grid(meta):
        return triton.cdiv(T, meta["BLOCK_M"]), hq, n

    _prefill4_kernel[grid](
        q, k_cache, v_cache, k_scale, v_scale, block_tables, cu_seqlens_q, seq_lens, o, scale * LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), block_tables.stride(0),
        *_pool_strides(k_cache, v_cache, k_scale, v_scale),
        GROUP=hq // hkv, D=d, G=_group(v_cache, v_scale), PAGE=page, K4=k_cache.dtype == torch.uint8,
        DOT_PRECISION=_dot_precision(q.dtype))
    return o


# ---------------------------------------------------------------------------------------------
# dispatch: what qwendesk_kernels.ops exports; bf16 and int8 pools go to attention.py
# ---------------------------------------------------------------------------------------------

def store_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Write new K/V rows into the paged pools: 4-bit pools get them rotated and quantised."""
    if not is_kv4(v_cache):
        return attention.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    k, v = rotate(k), rotate(v)
    if k.is_cuda:
        store_kv4_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    else:
        store_kv4_ref(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                    k_scale=None, v_scale=None, decode_q_len=None, max_seq_len=None, gate=None):
    """attention.paged_attention over any pools: 4-bit ones rotate q in, the output back, then gate it."""
    if not is_kv4(v_cache):
        return attention.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale,
                                         k_scale=k_scale, v_scale=v_scale, decode_q_len=decode_q_len,
                                         max_seq_len=max_seq_len, gate=gate)
    q = rotate(q)
    if not q.is_cuda:
        o = paged_attention4_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale)
    elif decode_q_len is None:
        o = prefill_attention4(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale)
    else:
        if max_seq_len is None:
            max_seq_len = block_tables.shape[1] * v_cache.shape[1]
        splits = decode_num_splits(seq_lens.shape[0], v_cache.shape[2], max_seq_len, sm_count(q.device))
        o = decode_attention4(q, k_cache, v_cache, block_tables, seq_lens, scale, decode_q_len, splits,
                              k_scale, v_scale)
    o = rotate(o)
    return o if gate is None else o * torch.sigmoid(gate)
