"""Paged attention for the gated full-attention layers (GQA, power-of-two head_dim on the GPU path).

KV pool per layer: k_cache, v_cache [num_pages, page_size, Hkv, D]. Token t of a sequence lives at
page block_table[t // page_size], offset t % page_size; `slot_mapping` [T] gives the flat slot
(page * page_size + offset) where each new token's K/V is written (negative = skip: padding rows).
Queries are packed (cu_seqlens_q [N+1]); seq_lens [N] count all tokens of each sequence including
the new ones, so query j of sequence i sits at absolute position seq_lens[i] - Lq_i + j and attends
causally to every cached and new key at or before it.

KV is stored in the activation dtype (bf16 / fp16 / fp32) or in int8 with one symmetric scale per
token per kv head: k_scale, v_scale [num_pages, page_size, Hkv] (fp32; fp16 also accepted) beside
the int8 pools, x ~= int8 * scale, scale = absmax / 127. Why per token-head and not group-64: with
one scale per key row the int8 tile goes straight into the dot (int8 -> bf16 is exact) and the scale
multiplies the score column (K) or the probability column (V) afterwards, so dequantisation is one
multiply per score instead of one per element; the scales cost 4 bytes per 256-byte row (1.6%)
instead of 16 (6%). Error measured on randn K/V with unit-scale scores: max |o_int8 - o_fp32| ~0.014,
mean ~0.002 (test_int8_kv_error_vs_full_precision). The kernel rounds halves away from zero, the
reference to even: stored int8 values may differ by 1 on exact halves.

GPU kernels:
- store_kv: one program per new token row, all kv heads; quantises in the int8 case.
- decode (1..8 query rows per sequence, uniform L per launch): flash-decoding. Grid (splits, Hkv, N)
  from Python ints; each program takes the G = Hq/Hkv query heads x L rows that share one kv head
  (K/V read once per kv head) over one slice of the context, writes a partial output + log-sum-exp,
  and a combine kernel merges the slices. Slice sizes are computed in the kernel from seq_lens, so a
  captured CUDA graph replays correctly for any lengths up to the max_seq_len it was built for.
  The same kernel runs a block drafter's attention (block_attention): each row seeing the whole block instead of
  the rows up to itself, and / or only the keys within a sliding window of its position.
- prefill (packed chunks, each causal over its cached pages + itself): flash-attention with online
  softmax and tl.dot, one program per (query block, q head, sequence), key blocks aligned to pages.
"""

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.runtime import INTERPRET, capability, sm_count, smem_per_block, smem_per_sm
LOG2E = 1.4426950408889634
MIN_SPLIT_TOKENS = 256      # fewest context tokens per decode split (at max_seq_len)


# ---------------------------------------------------------------------------------------------
# torch references (CPU path and test oracle)
# ---------------------------------------------------------------------------------------------

def quantize_int8_ref(x):
    """x [..., D] -> (int8 [..., D], fp32 scale [...]): symmetric, one scale per row."""
    absmax = x.float().abs().amax(-1)
    inv = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    return (x.float() * inv[..., None]).round().to(torch.int8), absmax / 127.0


def store_kv_ref(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """k, v [T, Hkv, D] -> scatter into the pools at slot_mapping (negative slots are skipped).
    With k_scale / v_scale the pools are int8 and each row is quantised first."""
    page = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    pages, offs = slots // page, slots % page
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if scale is None:
            cache[pages, offs] = x[keep].to(cache.dtype)
        else:
            x8, x_scale = quantize_int8_ref(x[keep])
            cache[pages, offs] = x8
            scale[pages, offs] = x_scale.to(scale.dtype)


def gather_kv(cache, block_table, length):
    """The first `length` tokens of one sequence, [length, Hkv, D] (or [length, Hkv] for a scale pool)."""
    page = cache.shape[1]
    pages = block_table[: (length + page - 1) // page]
    return cache[pages].flatten(0, 1)[:length]


def paged_attention_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                        k_scale=None, v_scale=None, gate=None, causal=True, window=0):
    """q [T, Hq, D] -> o [T, Hq, D] (q's dtype; softmax in fp32). Scale pools given: int8 KV. gate [T, Hq, D]
    given: o * sigmoid(gate), in q's dtype (the output gate of Qwen3.5's attention). causal False: every query row
    sees all of its sequence's keys; window > 0: only keys less than `window` positions behind the row (and, not
    causal, ahead of it). A row that sees no key gives 0, as the kernels do."""
    out = torch.empty_like(q)
    rep = q.shape[1] // k_cache.shape[2]
    bounds = cu_seqlens_q.tolist()
    for i, total in enumerate(seq_lens.tolist()):
        s, e = bounds[i], bounds[i + 1]
        lq = e - s
        k = gather_kv(k_cache, block_tables[i], total).float()
        v = gather_kv(v_cache, block_tables[i], total).float()
        if k_scale is not None:
            k = k * gather_kv(k_scale, block_tables[i], total).float()[..., None]
            v = v * gather_kv(v_scale, block_tables[i], total).float()[..., None]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[s:e].float(), k) * scale
        qpos = torch.arange(total - lq, total, device=q.device)[:, None]
        keys = torch.arange(total, device=q.device)[None, :]
        hidden = keys > qpos if causal else keys >= total
        if window:
            hidden = hidden | (qpos - keys >= window)
            if not causal:
                hidden = hidden | (keys - qpos >= window)
        scores.masked_fill_(hidden, float("-inf"))
        out[s:e] = torch.einsum("hqk,khd->qhd", scores.softmax(-1).nan_to_num(0.0), v).to(q.dtype)
    return out if gate is None else out * torch.sigmoid(gate)


# ---------------------------------------------------------------------------------------------
# store_kv
# ---------------------------------------------------------------------------------------------

@triton.jit
def _store_rows(x, dst_ptrs, scale_ptrs, head_ok, QUANT: tl.constexpr):
    """Write one token's [BLOCK_H, D] rows; int8 pools get round(x * 127 / absmax) and absmax / 127."""
    if QUANT:
        x = x.to(tl.float32)
        absmax = tl.max(tl.abs(x), axis=1)
        inv = 127.0 / tl.where(absmax > 0, absmax, 1.0)   # all-zero rows stay 0
        y = x * inv[:, None]
        y = tl.where(y >= 0, y + 0.5, y - 0.5)          # round half away from zero (the cast truncates)
        tl.store(dst_ptrs, y.to(tl.int8), mask=head_ok[:, None])
        tl.store(scale_ptrs, (absmax / 127.0).to(scale_ptrs.dtype.element_ty), mask=head_ok)
    else:
        tl.store(dst_ptrs, x.to(dst_ptrs.dtype.element_ty), mask=head_ok[:, None])


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh,
                     HKV: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                     QUANT: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE
    off = slot % PAGE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    head_ok = h < HKV
    dst = page * stride_cp + off * stride_cs + h[:, None] * stride_ch + d[None, :]
    scale_dst = page * stride_sp + off * stride_ss + h * stride_sh
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=head_ok[:, None])
    _store_rows(k, k_cache_ptr + dst, k_scale_ptr + scale_dst, head_ok, QUANT)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=head_ok[:, None])
    _store_rows(v, v_cache_ptr + dst, v_scale_ptr + scale_dst, head_ok, QUANT)


def _check_pools(k_cache, v_cache, k_scale, v_scale):
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    d = k_cache.shape[-1]
    assert d >= 16 and d & (d - 1) == 0, "GPU kernels need a power-of-two head_dim >= 16"
    assert (k_scale is None) == (v_scale is None)
    if k_scale is not None:
        assert k_cache.dtype == torch.int8 and k_scale.shape == k_cache.shape[:3]
        assert k_scale.stride() == v_scale.stride()


def store_kv_triton(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Launcher: k, v [T, Hkv, D] (any float dtype, unit stride in D) -> pools at slot_mapping [T]."""
    _check_pools(k_cache, v_cache, k_scale, v_scale)
    T, hkv, d = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    quant = k_scale is not None
    scale_strides = k_scale.stride() if quant else (0, 0, 0)
    _store_kv_kernel[(T,)](
        k, v, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *scale_strides,
        HKV=hkv, PAGE=k_cache.shape[1], D=d, BLOCK_H=triton.next_power_of_2(hkv), QUANT=quant,
        **pdl.launch_args(k.device))


def store_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Write new K/V rows into the paged pools (int8 + scales when scale pools are given)."""
    if k.is_cuda:
        store_kv_triton(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    else:
        store_kv_ref(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)


# ---------------------------------------------------------------------------------------------
# shared inner step: one block of BLOCK_N keys (inside one page) against a tile of query rows
# ---------------------------------------------------------------------------------------------

@triton.jit
def _attend_block(acc, l_i, m_i, q, n0, last_key, first_key, seq_len, table_ptr,
                  k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_head,
                  stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh, qk_scale,
                  PAGE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  QUANT: tl.constexpr, MASK: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online-softmax update with keys n0 .. n0+BLOCK_N-1; scores in log2 units (qk_scale has log2 e).
    MASK: the block may hold keys past a row's last_key (score masked), before its first_key (WINDOW) or past
    seq_len (stale slots of the page: their scores are masked and their V rows are not loaded, so stale NaN cannot
    leak in)."""
    page = tl.load(table_ptr + n0 // PAGE).to(tl.int64)
    keys = n0 + tl.arange(0, BLOCK_N)
    slots = n0 % PAGE + tl.arange(0, BLOCK_N)
    kv_off = page * stride_cp + kv_head * stride_ch + slots[:, None] * stride_cs + tl.arange(0, D)[None, :]
    scale_off = page * stride_sp + kv_head * stride_sh + slots * stride_ss
    k = tl.load(k_cache_ptr + kv_off)
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
    if QUANT:
        s = s * (tl.load(k_scale_ptr + scale_off).to(tl.float32) * qk_scale)[None, :]
    else:
        s = s * qk_scale
    if MASK:
        visible = keys[None, :] <= last_key[:, None]
        if WINDOW:
            visible &= keys[None, :] >= first_key[:, None]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if MASK:
        in_seq = keys < seq_len
        v = tl.load(v_cache_ptr + kv_off, mask=in_seq[:, None], other=0)
    else:
        v = tl.load(v_cache_ptr + kv_off)
    if QUANT:
        if MASK:
            v_scale = tl.load(v_scale_ptr + scale_off, mask=in_seq, other=0)
        else:
            v_scale = tl.load(v_scale_ptr + scale_off)
        p = p * v_scale.to(tl.float32)[None, :]
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _gated(o, gate_ptrs, mask, dtype: tl.constexpr):
    """o * sigmoid(gate) (o fp32) as torch computes it in dtype: o, the sigmoid and the product each rounded."""
    g = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return o.to(dtype).to(tl.float32) * s


@triton.jit
def _attend_range(acc, l_i, m_i, q, lo, mid, hi, last_key, first_key, seq_len, table_ptr,
                  k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_head,
                  stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh, qk_scale,
                  PAGE: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  QUANT: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Keys lo .. hi in blocks: [lo, mid) visible to every query row (no masking), [mid, hi) masked."""
    for n0 in range(lo, mid, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, n0, last_key, first_key, seq_len, table_ptr,
                                      k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_head,
                                      stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh, qk_scale,
                                      PAGE, BLOCK_N, D, QUANT, False, WINDOW, DOT_PRECISION)
    for n0 in range(mid, hi, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, n0, last_key, first_key, seq_len, table_ptr,
                                      k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_head,
                                      stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh, qk_scale,
                                      PAGE, BLOCK_N, D, QUANT, True, WINDOW, DOT_PRECISION)
    return acc, l_i, m_i


# ---------------------------------------------------------------------------------------------
# decode: split-K over the context + combine
# ---------------------------------------------------------------------------------------------

@triton.jit
def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, table_ptr, seq_lens_ptr,
                         o_part_ptr, lse_part_ptr, qk_scale, window,
                         stride_qt, stride_qh, stride_bt,
                         stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh,
                         L: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         ROWS: tl.constexpr, TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         QUANT: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """Query rows j0 .. j0 + ROWS - 1 of a sequence (its TILES row tiles: program_id(2) = seq x TILES + tile) against
    one split of its keys (with WINDOW, of the keys the tile's rows' windows span)."""
    pdl.enter(PDL)
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2) // TILES
    j0 = tl.program_id(2) % TILES * ROWS
    num_splits = tl.num_programs(0)
    num_q_heads = tl.num_programs(1) * GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    start = 0
    if WINDOW:      # the tile's first row has the earliest window
        start = tl.maximum(seq_len - L + j0 - window + 1, 0) // BLOCK_N * BLOCK_N
    per_split = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    # tile row r = query row j of this sequence x q head g of this kv head's group
    r = tl.arange(0, BLOCK_M)
    j = j0 + r // GROUP
    row_ok = (r < ROWS * GROUP) & (j < L)
    t = seq * L + j
    head = kv_head * GROUP + r % GROUP
    d = tl.arange(0, D)
    q = tl.load(q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=row_ok[:, None], other=0)
    position = seq_len - L + j
    if CAUSAL:
        last_key = position
        visible_to_all = (seq_len - L + 1 + j0) // BLOCK_N * BLOCK_N
    else:           # every row sees the whole block (within its window)
        last_key = tl.zeros_like(position) + seq_len - 1
        if WINDOW:
            last_key = tl.minimum(last_key, position + window - 1)
        visible_to_all = seq_len // BLOCK_N * BLOCK_N
    first_key = position - window + 1
    if WINDOW:      # each row its own first key: every block masked
        visible_to_all = lo

    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)   # finite: a fully masked block leaves p = 0, not NaN
    table_ptr += seq * stride_bt
    visible_to_all = tl.minimum(tl.maximum(visible_to_all, lo), hi)
    acc, l_i, m_i = _attend_range(acc, l_i, m_i, q, lo, visible_to_all, hi, last_key, first_key, seq_len, table_ptr,
                                  k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_head,
                                  stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh, qk_scale,
                                  PAGE, BLOCK_N, D, QUANT, WINDOW, DOT_PRECISION)

    # partials [T, Hq, splits, D] and [T, Hq, splits]; an empty split has lse = -inf and o = 0
    has_keys = l_i > 0
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    part = (t * num_q_heads + head) * num_splits + split
    tl.store(lse_part_ptr + part, lse, mask=row_ok)
    tl.store(o_part_ptr + part[:, None] * D + d[None, :], o, mask=row_ok[:, None])


@triton.jit
def _decode_combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, gate_ptr, stride_ot, stride_oh, stride_gt, stride_gh,
                           NUM_SPLITS, D: tl.constexpr, BLOCK_D: tl.constexpr, ALL_SPLITS: tl.constexpr,
                           CHUNK: tl.constexpr, GATE: tl.constexpr, PDL: tl.constexpr):
    """o[t, head, d-block] = sum_s exp2(lse_s) * o_s / sum_s exp2(lse_s) (times sigmoid(gate) with GATE), one
    program per d-block."""
    pdl.enter(PDL)
    t = tl.program_id(0)
    head = tl.program_id(1)
    base = (t * tl.num_programs(1) + head) * NUM_SPLITS
    s = tl.arange(0, ALL_SPLITS)
    lse = tl.load(lse_part_ptr + base + s, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)             # no keys at all (padding row): output 0
    denom = tl.sum(tl.exp2(lse - m), axis=0)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, CHUNK):
        sc = s0 + tl.arange(0, CHUNK)
        ok = sc < NUM_SPLITS
        w = tl.exp2(tl.load(lse_part_ptr + base + sc, mask=ok, other=float("-inf")) - m)
        part = tl.load(o_part_ptr + (base + sc)[:, None] * D + d[None, :], mask=ok[:, None], other=0)
        acc += tl.sum(w[:, None] * part, axis=0)
    out = acc / tl.where(denom > 0, denom, 1.0)
    if GATE:
        out = _gated(out, gate_ptr + t * stride_gt + head * stride_gh + d, d < D, o_ptr.dtype.element_ty)
    tl.store(o_ptr + t * stride_ot + head * stride_oh + d, out.to(o_ptr.dtype.element_ty))


MAX_TILE_ROWS = 64     # query rows x heads of one decode program: a verify of more rows is split into row tiles


def decode_row_tiles(q_len: int, group: int, max_rows: int = MAX_TILE_ROWS) -> tuple[int, int]:
    """(query rows per program, programs per sequence and kv head): all q_len rows in one program while they and
    their group of q heads fit max_rows (they read the keys once), else as few tiles as fit (a block drafter's verify
    of 16 rows x the 27B's 6 heads: two tiles of 8 rows, each reading the keys)."""
    per_tile = max(1, max_rows // group)
    tiles = -(-q_len // per_tile)
    return -(-q_len // tiles), tiles


def decode_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, sm_count: int) -> int:
    """Context splits per (sequence, kv head): about two programs per SM, >= MIN_SPLIT_TOKENS each at
    max_seq_len. A Python int, fixed for a batch shape, so the grid can be captured in a CUDA graph."""
    want = triton.cdiv(2 * sm_count, batch * num_kv_heads)
    return max(1, min(want, triton.cdiv(max_seq_len, MIN_SPLIT_TOKENS)))


def decode_tile_bytes(device, block_m: int) -> int:
    """Bytes of the K tile (and of the V tile) each step of the decode kernel reads: 16 KB, or 8 KB where two programs
    of block_m query rows would not share an SM's shared memory with 16 KB (1 KB reserved per block). Compiled for
    sm_86, bf16 KV, D = 256: 42,000 / 51,204 / 69,636 B at 16 / 32 / 64 rows with 16 KB tiles, 25,092 / 33,796 /
    51,204 with 8 KB. So 8 KB on the RTX 3090 / 4090 (100 KB per SM), 8 KB for 64-row tiles on the 5090 (128 KB);
    the H100 / H200 (228 KB) keep 16 KB, and so does the interpreter. `make check-consumer` asserts two 4-warp
    programs fit."""
    if device.type == "cpu":
        return 16384
    smem = smem_per_sm(device)
    return 8192 if smem < 128 * 1024 or (smem < 160 * 1024 and block_m >= 64) else 16384


def _gate_args(gate, o):
    """(gate or a stand-in, its token and head strides) for a kernel's GATE epilogue."""
    if gate is None:
        return o, 0, 0
    assert gate.shape == o.shape and gate.stride(-1) == 1, "gate: shaped like the output, last dim contiguous"
    return gate, gate.stride(0), gate.stride(1)


def _dot_precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"    # fp32 KV is exact; the setting is unused for 16-bit


def decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, q_len, num_splits, *,
                     k_scale=None, v_scale=None, gate=None, causal=True, window=0):
    """Launcher: q [N * q_len, Hq, D] (rows i*q_len .. i*q_len+q_len-1 belong to sequence i; any token and head
    strides) -> o [N * q_len, Hq, D], times sigmoid(gate) (like q) if given. Reads seq_lens [N] and block_tables
    [N, max_pages] on the device; no host syncs (graph-capturable). causal / window: as paged_attention_ref's."""
    _check_pools(k_cache, v_cache, k_scale, v_scale)
    T, hq, d = q.shape
    _, page, hkv, _ = k_cache.shape
    n = seq_lens.shape[0]
    assert T == n * q_len and hq % hkv == 0 and q.stride(-1) == 1 and block_tables.stride(-1) == 1
    group = hq // hkv
    quant = k_scale is not None
    kv_bytes = k_cache.element_size()
    rows, tiles = decode_row_tiles(q_len, group)
    block_m = max(16, triton.next_power_of_2(rows * group))
    block_n = min(page, max(16, decode_tile_bytes(q.device, block_m) // (d * kv_bytes)))
    # 8 warps where 4 spill (make check-consumer found them; no consumer card ran either): sm_120's int8 tiles (255
    # registers and 32 B of stack, every L and group), and below sm_90 tiles of 64 query rows (a round of 5 drafts:
    # 6 rows x 6 heads of the 27B, 5 x 8 of the 35B-A3B; 255 registers and 8 B of stack on sm_86 and sm_89).
    cap = capability(q.device) if q.is_cuda else (9, 0)
    warps = 8 if (quant and cap >= (12, 0)) or (block_m >= 64 and cap < (9, 0)) else 4
    o_part = torch.empty((T, hq, num_splits, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((T, hq, num_splits), dtype=torch.float32, device=q.device)
    scale_strides = k_scale.stride() if quant else (0, 0, 0)
    _decode_split_kernel[(num_splits, hkv, n * tiles)](
        q, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache, block_tables, seq_lens,
        o_part, lse_part, scale * LOG2E, window,
        q.stride(0), q.stride(1), block_tables.stride(0), *k_cache.stride()[:3], *scale_strides,
        L=q_len, GROUP=group, D=d, PAGE=page, ROWS=rows, TILES=tiles, BLOCK_M=block_m,
        BLOCK_N=block_n, QUANT=quant, CAUSAL=causal, WINDOW=window > 0, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=warps, num_stages=3,
        **pdl.launch_args(q.device))
    return combine_splits(o_part, lse_part, q.dtype, gate)


def combine_splits(o_part, lse_part, dtype, gate=None):
    """The decode's splits [T, Hq, splits, D] (and their log-sum-exps) merged into o [T, Hq, D] of `dtype`, times
    sigmoid(gate) if given."""
    T, hq, num_splits, d = o_part.shape
    o = torch.empty((T, hq, d), dtype=dtype, device=o_part.device)
    gate_ptr, gate_t, gate_h = _gate_args(gate, o)
    block_d = min(d, 64)
    _decode_combine_kernel[(T, hq, d // block_d)](
        o_part, lse_part, o, gate_ptr, o.stride(0), o.stride(1), gate_t, gate_h, num_splits,
        D=d, BLOCK_D=block_d, ALL_SPLITS=triton.next_power_of_2(num_splits), CHUNK=16, GATE=gate is not None,
        num_warps=2,
        **pdl.launch_args(o_part.device))
    return o


# ---------------------------------------------------------------------------------------------
# prefill: packed chunks, flash attention over the pages
# ---------------------------------------------------------------------------------------------

# (BLOCK_M, BLOCK_N, warps, stages). Autotuned on the GPU, on the first call per (head_dim, page, group,
# dtypes) and card (Triton keys its tuning cache by the target): for head_dim 256 the 128 x 64 tiles need 144 KB of
# shared memory with bf16 KV (Hopper's 227 KB); the card's pruning keeps 64 x 32, 64 x 16 and 128 x 16 on an RTX 3090
# / 4090 / 5090 (99 KB per block), and 64 x 64 and 128 x 32 too with int8 KV.
PREFILL_TILES = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 8, 2),
                 (128, 32, 8, 2), (64, 32, 4, 2), (64, 32, 4, 3), (64, 16, 4, 2), (128, 16, 8, 2)]
_PREFILL_TILES = [(16, 16, 4, 1)] if INTERPRET else PREFILL_TILES


def prefill_smem_bytes(block_m: int, block_n: int, d: int, q_size: int, kv_size: int) -> int:
    """Shared memory of one prefill program as Triton 3.9 compiles it for sm_86 to sm_120 (one copy whatever
    num_stages): the Q tile, a K and a V tile (int8 KV: with a fp32 scale per key) and the P tile, plus a few bytes of
    barrier. make check-consumer holds the pruning to what it compiles."""
    scales = 4 if kv_size == 1 else 0
    return block_m * d * q_size + 2 * block_n * (d * kv_size + scales) + block_m * block_n * q_size + 16


def _prefill_configs_that_fit(configs, smem: int, D: int, PAGE: int, q_size: int, kv_size: int) -> list:
    """Key blocks inside one page, and tiles within the card's shared memory per block."""
    return [c for c in configs if c.kwargs["BLOCK_N"] <= PAGE
            and prefill_smem_bytes(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], D, q_size, kv_size) <= smem]


def _prune_prefill(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    q, k = args["q_ptr"], args["k_cache_ptr"]
    return _prefill_configs_that_fit(configs, smem_per_block(q.device), args["D"], args["PAGE"], q.element_size(),
                                     k.element_size())


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in _PREFILL_TILES],
    key=["D", "PAGE", "GROUP"], prune_configs_by={"early_config_prune": _prune_prefill})
@triton.jit
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, table_ptr, cu_seqlens_ptr, seq_lens_ptr,
                    o_ptr, gate_ptr, qk_scale,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh, stride_bt,
                    stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh,
                    GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    QUANT: tl.constexpr, DOT_PRECISION: tl.constexpr, GATE: tl.constexpr):
    # the grid covers the whole packed batch for every sequence; blocks past a sequence's rows exit.
    # Last blocks first: they hold the most keys (causal), so the long programs start early.
    block = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    if block * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    cached = seq_len - q_len
    kv_head = head // GROUP

    r = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < q_len
    d = tl.arange(0, D)
    t = q_start + r
    q = tl.load(q_ptr + t[:, None] * stride_qt + head * stride_qh + d[None, :], mask=row_ok[:, None], other=0)
    last_key = cached + r

    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    table_ptr += seq * stride_bt
    visible_to_all = (cached + block * BLOCK_M + 1) // BLOCK_N * BLOCK_N
    hi = tl.minimum(seq_len, cached + (block + 1) * BLOCK_M)
    acc, l_i, m_i = _attend_range(acc, l_i, m_i, q, 0, visible_to_all, hi, last_key, last_key, seq_len, table_ptr,
                                  k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, kv_head,
                                  stride_cp, stride_cs, stride_ch, stride_sp, stride_ss, stride_sh, qk_scale,
                                  PAGE, BLOCK_N, D, QUANT, False, DOT_PRECISION)
    o = acc / l_i[:, None]
    if GATE:
        o = _gated(o, gate_ptr + t[:, None] * stride_gt + head * stride_gh + d[None, :], row_ok[:, None],
                   o_ptr.dtype.element_ty)
    tl.store(o_ptr + t[:, None] * stride_ot + head * stride_oh + d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                      k_scale=None, v_scale=None, gate=None):
    """Launcher: packed q [T, Hq, D] (cu_seqlens_q [N+1]) -> o [T, Hq, D], times sigmoid(gate) if given; each
    chunk's K/V already stored."""
    _check_pools(k_cache, v_cache, k_scale, v_scale)
    T, hq, d = q.shape
    _, page, hkv, _ = k_cache.shape
    n = seq_lens.shape[0]
    assert hq % hkv == 0 and q.stride(-1) == 1 and block_tables.stride(-1) == 1
    quant = k_scale is not None
    o = torch.empty((T, hq, d), dtype=q.dtype, device=q.device)
    gate_ptr, gate_t, gate_h = _gate_args(gate, o)
    scale_strides = k_scale.stride() if quant else (0, 0, 0)

    def grid(meta):
        return triton.cdiv(T, meta["BLOCK_M"]), hq, n

    _prefill_kernel[grid](
        q, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache, block_tables,
        cu_seqlens_q, seq_lens, o, gate_ptr, scale * LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), gate_t, gate_h, block_tables.stride(0),
        *k_cache.stride()[:3], *scale_strides,
        GROUP=hq // hkv, D=d, PAGE=page, QUANT=quant, DOT_PRECISION=_dot_precision(q.dtype), GATE=gate is not None,
    )
    return o


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------

def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                    k_scale=None, v_scale=None, decode_q_len=None, max_seq_len=None, gate=None):
    """q [T, Hq, D] (last dim contiguous) -> o [T, Hq, D] in q's dtype; times sigmoid(gate) [T, Hq, D] if given
    (fused into the kernels' last step).

    decode_q_len=L: every sequence has exactly L query rows (decode / speculative verify; cu_seqlens_q is
    then not read); runs the graph-capturable split-K kernel with a grid sized for contexts up to
    max_seq_len (default: what the block table can hold; pass the same value when capturing and when
    replaying). Otherwise: the prefill kernel over packed chunks. CPU tensors: the reference.
    """
    if not q.is_cuda:
        return paged_attention_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale,
                                   k_scale=k_scale, v_scale=v_scale, gate=gate)
    if decode_q_len is None:
        return prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale,
                                 k_scale=k_scale, v_scale=v_scale, gate=gate)
    if max_seq_len is None:
        max_seq_len = block_tables.shape[1] * k_cache.shape[1]
    splits = decode_num_splits(seq_lens.shape[0], k_cache.shape[2], max_seq_len, sm_count(q.device))
    return decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, decode_q_len, splits,
                            k_scale=k_scale, v_scale=v_scale, gate=gate)


def block_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, block: int, *, causal: bool, window: int = 0,
                    k_scale=None, v_scale=None, max_seq_len=None):
    """A block drafter's attention: each sequence's `block` query rows q [N * block, Hq, D] sit at its last positions
    (seq_lens[i] - block ..); causal or every row seeing the whole block; window > 0: only keys within `window`
    positions of the row. The decode kernel (graph-capturable) on CUDA, the reference elsewhere."""
    if not q.is_cuda:
        cu = torch.arange(0, q.shape[0] + 1, block, dtype=torch.int32, device=q.device)
        return paged_attention_ref(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, k_scale=k_scale,
                                   v_scale=v_scale, causal=causal, window=window)
    if max_seq_len is None:
        max_seq_len = block_tables.shape[1] * k_cache.shape[1]
    if window:
        max_seq_len = min(max_seq_len, window + block)
    splits = decode_num_splits(seq_lens.shape[0], k_cache.shape[2], max_seq_len, sm_count(q.device))
    return decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, block, splits,
                            k_scale=k_scale, v_scale=v_scale, causal=causal, window=window)
