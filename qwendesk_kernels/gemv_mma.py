"""The mma GEMV (int4, M <= 32, 16-bit x, G = 64 or 128; the default there), one launch, no autotuner; the int4
layout and the code-to-float trick are in qwendesk_kernels/quant_format.py:
- tensor-core mma.sync.m16n8k16 issued by inline PTX on the packed words as they lie: a warp's two 512-byte loads
  of a tile's block are 16 rows x 128 k of A fragments once a lop3 (and a shift) turn each nibble pair into two
  16-bit floats B + c (B = 128 in bf16); x (padded to 8 rows) is the B operand, loaded 16 bytes per lane straight
  into fragments, and the mma's k order is a permutation of the block's that A and B share (kernel docstring).
  A second mma with A = 1 sums x per group; per group and output y += s D - (B + z) s sum x.
- the mma needs each lane to hold its fragment: every tensor is 1-D of 32 x warps elements, which Triton lays out
  one element per lane (checked by the GPU tests; the interpreter runs the mma written out in tl ops).
- program = a run of equal length of (row group of NW warps x R tiles, K block) units, row group after row group
  (stream-K): the grid is one wave of GEMV_MMA_PROGRAMS_PER_SM programs per SM whatever the shape; a row group
  shared by several programs is summed by the last of them to arrive, in order (deterministic). The next block's
  words, scales and x are loaded ahead (a barrier keeps them above the work); the loop is unrolled twice (no
  register copies) and capped at 128 registers (16 one-warp programs resident per SM).
- 9-32 rows (a speculative verify): 2 or 4 column tiles of 8 x rows, each its own warps doing the M <= 8 work on the
  same grid and runs, so a row's bits never depend on M (greedy speculation stays exact); the weight words are read
  from memory once and by the other tiles from L1; no register cap there (136-140 registers, no spills on sm_86-120).
- ~52 instructions per 1,024 weights (sm_90 SASS, 210 per 4,096 at R = 2: 16 + 8 HMMA, 64 LOP3, 48 SHF), against
  ~125 for an FMA kernel. On the H200 at 27B shapes, 64 GEMVs of 16 layers replayed in one graph take 16.8 µs
  each at M = 1 (3.0 TB/s; x loaded after the barrier: 18.7, the split-K grid before that: 20.6)
  (docs/performance.md, fifth and sixth sessions).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from qwendesk_kernels import pdl
from qwendesk_kernels.quant_format import Int4Weight, code_bits, group_param_offs, int4_row_words, shift
from qwendesk_kernels.runtime import INTERPRET, sm_count
from qwendesk_kernels.splitk import SPLITK_COUNTERS, SPLITK_FLOATS, arrive, splitk_scratch, store_tile

X_TILE = 8                        # x rows per column tile: the 8 columns of the mma's B operand
MMA_ROWS = 4 * X_TILE             # the kernel's limit: up to 4 column tiles
# the default's limit: every row a speculative verify sends (up to 4 column tiles), since a verify's rows must have
# the bits a plain step's rows have, and the dot GEMV's rows do not (another reduction order: greedy speculation would
# not be exact). The cost, measured on an H100 (docs/performance.md, 2026-12-07): at 12-16 rows the mma GEMV took
# 0.88-1.08x the dot GEMV's time, at 24-32 rows 1.17-1.48x.
GEMV_MMA_MAX_M = MMA_ROWS
# `engine.bench --gemv-rows dot` sets 16: the dot GEMV past it, to measure what exactness costs a round (its rounds'
# rows then differ from plain steps'; engine/spec/speculation.py still bounds them by GEMV_MMA_MAX_M).
DOT_PAST: int | None = None
# the default's config past 8 rows: None, GEMV_MMA_DEFAULT (a column tile's own warps); `engine.bench --gemv-rows xt`
# sets an XT config to measure one against the other.
ROWS_CONFIG: dict | None = None


@triton.jit
def _halves_f32(r, FP16: tl.constexpr):
    """int32 r holding two 16-bit floats -> (low, high) as fp32 (the interpreter's mma)."""
    if FP16:
        lo = (r & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = ((r >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        lo = (r << 16).to(tl.float32, bitcast=True)
        hi = (r & -65536).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _fragment(r, FP16: tl.constexpr, NW: tl.constexpr):
    """A register of every lane [32 NW] (lane 4 g + t: the pair at columns 2t, 2t + 1 of row g) -> [NW, 8, 8]."""
    lo, hi = _halves_f32(r, FP16)
    return tl.reshape(tl.join(tl.reshape(lo, (NW, 8, 4)), tl.reshape(hi, (NW, 8, 4))), (NW, 8, 8))


@triton.jit
def _mma_emulated(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, FP16: tl.constexpr):
    """mma.sync m16n8k16 of each warp's 32 lanes, written out for the interpreter: the same fragments in and out."""
    NW: tl.constexpr = a0.shape[0] // 32
    B0 = _fragment(b0, FP16, NW)[:, None, :, :]            # [w, 1, n, k]
    B1 = _fragment(b1, FP16, NW)[:, None, :, :]
    top = tl.sum(_fragment(a0, FP16, NW)[:, :, None, :] * B0 + _fragment(a2, FP16, NW)[:, :, None, :] * B1, axis=3)
    bottom = tl.sum(_fragment(a1, FP16, NW)[:, :, None, :] * B0 + _fragment(a3, FP16, NW)[:, :, None, :] * B1, axis=3)
    d0, d1 = tl.split(tl.reshape(top, (NW, 8, 4, 2)))       # [w, g, t]: columns 2t, 2t + 1 of row g
    d2, d3 = tl.split(tl.reshape(bottom, (NW, 8, 4, 2)))
    return (c0 + tl.reshape(d0, (32 * NW,)), c1 + tl.reshape(d1, (32 * NW,)),
            c2 + tl.reshape(d2, (32 * NW,)), c3 + tl.reshape(d3, (32 * NW,)))


@triton.jit
def _mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, FP16: tl.constexpr, EMULATE: tl.constexpr):
    """D = A B + C for each warp: mma.sync.m16n8k16 with A [16, 16] and B [16, 8] 16-bit, C and D fp32, in PTX's
    fragments (lane 4 g + t holds A rows g / g + 8 at columns 2t, 2t + 1 (a0 / a1) and 2t + 8, 2t + 9 (a2 / a3),
    B column g at rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1), C / D rows g / g + 8 at columns 2t, 2t + 1).
    Every tensor is [32 NW], element i in lane i % 32 of warp i // 32: Triton's layout of a 1-D tensor of that size."""
    if EMULATE:
        d0, d1, d2, d3 = _mma_emulated(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, FP16)
    else:
        ASM: tl.constexpr = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 " if FP16 else
                             "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ")
        d0, d1, d2, d3 = tl.inline_asm_elementwise(
            ASM + "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    return d0, d1, d2, d3


@triton.jit
def _pick(t0, t1, t2, t3, j: tl.constexpr):
    if j == 0:
        t = t0
    elif j == 1:
        t = t1
    elif j == 2:
        t = t2
    else:
        t = t3
    return t


@triton.jit
def _load_block_c(w_ptrs, s_ptrs, z_ptrs, blk, groups, G: tl.constexpr, L1: tl.constexpr = False):
    """Block blk of the lane's tile: words 4t..4t+3 of its rows g and g + 8 (16 bytes each; w_ptrs: row g's), and for
    h = 0, 1 the scales and zeros of the group of k = 128 blk + 64 h, each a 32-bit word holding rows g and g + 8
    (s_ptrs / z_ptrs: the rows' words at group 0). L1: the words are kept in L1, where other warps of the program
    read them too (x column tiles); else they go around it (each word is read once)."""
    if L1:
        wa = tl.load(w_ptrs + blk * 256)
        wb = tl.load(w_ptrs + blk * 256 + 128)
    else:
        wa = tl.load(w_ptrs + blk * 256, cache_modifier=".cg")
        wb = tl.load(w_ptrs + blk * 256 + 128, cache_modifier=".cg")
    g0 = tl.minimum(blk * 128 // G, groups - 1)                     # (K padding: x = 0 there)
    s0, z0 = tl.load(s_ptrs + g0 * 8), tl.load(z_ptrs + g0 * 8)
    if G == 64:
        g1 = tl.minimum(g0 + 1, groups - 1)
        s1, z1 = tl.load(s_ptrs + g1 * 8), tl.load(z_ptrs + g1 * 8)
    else:
        s1, z1 = s0, z0
    return wa, wb, s0, z0, s1, z1


@triton.jit
def _load_x_plane_c(x_ptrs, blk, p: tl.constexpr, K, EVEN_K: tl.constexpr):
    """The lane's x pairs of plane p of block blk, one 16-byte run: pairs 64 blk + 16 p + 4t + j (k = 2 pair,
    2 pair + 1), j = 0..3; 0 for k past K (the padding codes are not 0); kept in L1 for the other programs."""
    if EVEN_K:
        x = tl.load(x_ptrs + blk * 64 + 16 * p, eviction_policy="evict_last")
    else:
        mask = 2 * (blk * 64 + 16 * p + tl.arange(0, 4)[None, :]) < K
        x = tl.load(x_ptrs + blk * 64 + 16 * p, mask=mask, other=0, eviction_policy="evict_last")
    return x


@triton.jit
def _load_x_c(x_ptrs, blk, K, EVEN_K: tl.constexpr, X_BLOCKS, X_TWICE: tl.constexpr):
    """The lane's x pairs of the four planes of block blk (_load_x_plane_c); X_TWICE: x covers the first X_BLOCKS
    blocks of the weight and again the next X_BLOCKS (an int8 weight as two int4 planes)."""
    if X_TWICE:
        blk = tl.where(blk >= X_BLOCKS, blk - X_BLOCKS, blk)
    return (_load_x_plane_c(x_ptrs, blk, 0, K, EVEN_K), _load_x_plane_c(x_ptrs, blk, 1, K, EVEN_K),
            _load_x_plane_c(x_ptrs, blk, 2, K, EVEN_K), _load_x_plane_c(x_ptrs, blk, 3, K, EVEN_K))


@triton.jit
def _split_cols(t):
    """[R, 4] -> its four columns (each lane holds its row's 4: no data moves)."""
    even, odd = tl.split(tl.reshape(t, (t.shape[0], 2, 2)))
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def _code_pair_c(w, p: tl.constexpr, MAGIC: tl.constexpr, USE_ASM: tl.constexpr):
    """The codes in nibbles p and p + 4 of each word w as two 16-bit floats B + c (B = 128 in bf16, 1024 in fp16:
    MAGIC holds B in both halves, the code fills the low mantissa bits) in one int32, low half from nibble p: a lop3,
    after a shift for p > 0."""
    return code_bits(shift(w, -4 * p), 0x000F000F, MAGIC, USE_ASM)


@triton.jit
def _a_fragment(wa, wb, p: tl.constexpr, m: tl.constexpr, MAGIC: tl.constexpr, EMULATE: tl.constexpr):
    """The A fragment of mma (p, m) of a tile's block: the codes of plane p of the lane's words 4t + 2m and
    4t + 2m + 1 (wa, wb: the four words of rows g and g + 8, _split_cols) as 16-bit pairs (_code_pair_c)."""
    return (_code_pair_c(wa[2 * m], p, MAGIC, not EMULATE), _code_pair_c(wb[2 * m], p, MAGIC, not EMULATE),
            _code_pair_c(wa[2 * m + 1], p, MAGIC, not EMULATE), _code_pair_c(wb[2 * m + 1], p, MAGIC, not EMULATE))


@triton.jit
def _tile_block_c(f, h: tl.constexpr, xe0, xe1, xe2, xe3, xo0, xo1, xo2, xo3, d0, d1, d2, d3,
                  MAGIC: tl.constexpr, FP16: tl.constexpr, EMULATE: tl.constexpr):
    """d += the four mmas of half h of one tile's block f (_load_block_c): for plane p = 2h (x pairs xe) and 2h + 1
    (xo) and m = 0, 1, the codes of plane p of the lane's words 4t + 2m and 4t + 2m + 1 against the x pairs 2m and
    2m + 1 of the plane (adjacent in the lane's load: the B fragment as it is)."""
    wa, wb = _split_cols(f[0]), _split_cols(f[1])
    for p in tl.static_range(2 * h, 2 * h + 2):
        for m in tl.static_range(2):
            A0, A1, A2, A3 = _a_fragment(wa, wb, p, m, MAGIC, EMULATE)
            if p == 2 * h:
                x_lo, x_hi = _pick(xe0, xe1, xe2, xe3, 2 * m), _pick(xe0, xe1, xe2, xe3, 2 * m + 1)
            else:
                x_lo, x_hi = _pick(xo0, xo1, xo2, xo3, 2 * m), _pick(xo0, xo1, xo2, xo3, 2 * m + 1)
            d0, d1, d2, d3 = _mma(A0, A1, A2, A3, x_lo, x_hi, d0, d1, d2, d3, FP16, EMULATE)
    return d0, d1, d2, d3


@triton.jit
def _tile_group_c(acc0, acc1, acc2, acc3, d0, d1, d2, d3, e0, e1, f, h: tl.constexpr, BIAS: tl.constexpr,
                  FP16: tl.constexpr):
    """acc += s D - (B + z) s sum(x) for the group of half h of block f: D = sum (B + c) x (d0, d1: row g, columns
    2t, 2t + 1; d2, d3: row g + 8), e0 / e1: the sums of x of columns 2t / 2t + 1."""
    wa, wb, s0, z0, s1, z1 = f
    sa, sb = _halves_f32(s0 if h == 0 else s1, FP16)                 # rows g, g + 8
    za, zb = _halves_f32(z0 if h == 0 else z1, FP16)
    return (acc0 + sa * d0 - (BIAS + za) * sa * e0, acc1 + sa * d1 - (BIAS + za) * sa * e1,
            acc2 + sb * d2 - (BIAS + zb) * sb * e0, acc3 + sb * d3 - (BIAS + zb) * sb * e1)


@triton.jit
def _block_c(f0, f1, xs, a00, a01, a02, a03, a10, a11, a12, a13, zero, one, G: tl.constexpr, FP16: tl.constexpr,
             R: tl.constexpr, MAGIC: tl.constexpr, BIAS: tl.constexpr, EMULATE: tl.constexpr):
    """The work of one block (weights f0 / f1, x planes xs): the x-sum and weight mmas, and per group the scale and
    zero into the accumulators (tile 0: a0*, tile 1: a1* when R = 2)."""
    x0, x1, x2, x3 = xs
    for h in tl.static_range(2):
        if h == 0 or G == 64:
            d00, d01, d02, d03 = zero, zero, zero, zero
            d10, d11, d12, d13 = zero, zero, zero, zero
            e0, e1, e2, e3 = zero, zero, zero, zero
        if h == 0:                                                   # x pairs of planes 2h, 2h + 1
            xe0, xe1, xe2, xe3 = _split_cols(x0)
            xo0, xo1, xo2, xo3 = _split_cols(x1)
        else:
            xe0, xe1, xe2, xe3 = _split_cols(x2)
            xo0, xo1, xo2, xo3 = _split_cols(x3)
        e0, e1, e2, e3 = _x_sums((xe0, xe1, xe2, xe3), (xo0, xo1, xo2, xo3), (e0, e1, e2, e3), one, FP16, EMULATE)
        d00, d01, d02, d03 = _tile_block_c(f0, h, xe0, xe1, xe2, xe3, xo0, xo1, xo2, xo3, d00, d01, d02, d03,
                                           MAGIC, FP16, EMULATE)
        if R == 2:
            d10, d11, d12, d13 = _tile_block_c(f1, h, xe0, xe1, xe2, xe3, xo0, xo1, xo2, xo3, d10, d11, d12, d13,
                                               MAGIC, FP16, EMULATE)
        if h == 1 or G == 64:                   # e0 = e2: the sum of x of column 2t, e1 = e3: of 2t + 1
            a00, a01, a02, a03 = _tile_group_c(a00, a01, a02, a03, d00, d01, d02, d03, e0, e1, f0, h, BIAS, FP16)
            if R == 2:
                a10, a11, a12, a13 = _tile_group_c(a10, a11, a12, a13, d10, d11, d12, d13, e0, e1, f1, h, BIAS, FP16)
    return a00, a01, a02, a03, a10, a11, a12, a13


@triton.jit
def _tile_block_xt(f, h: tl.constexpr, xa_e, xa_o, xb_e, xb_o, da, db, MAGIC: tl.constexpr, FP16: tl.constexpr,
                   EMULATE: tl.constexpr):
    """_tile_block_c for two x column tiles in each lane (xa_*, xb_*: their columns of planes 2h / 2h + 1; da, db:
    their D quads): each A fragment is made once and used by one mma per column tile."""
    wa, wb = _split_cols(f[0]), _split_cols(f[1])
    for p in tl.static_range(2 * h, 2 * h + 2):
        for m in tl.static_range(2):
            A0, A1, A2, A3 = _a_fragment(wa, wb, p, m, MAGIC, EMULATE)
            xa, xb = (xa_e, xb_e) if p == 2 * h else (xa_o, xb_o)
            da = _mma(A0, A1, A2, A3, xa[2 * m], xa[2 * m + 1], da[0], da[1], da[2], da[3], FP16, EMULATE)
            db = _mma(A0, A1, A2, A3, xb[2 * m], xb[2 * m + 1], db[0], db[1], db[2], db[3], FP16, EMULATE)
    return da, db


@triton.jit
def _x_sums(xe, xo, e, one, FP16: tl.constexpr, EMULATE: tl.constexpr):
    """e += the sums of x of one column tile's planes (xe, xo: their four columns), by mmas with A = 1."""
    for m in tl.static_range(2):
        e = _mma(one, one, one, one, xe[2 * m], xe[2 * m + 1], e[0], e[1], e[2], e[3], FP16, EMULATE)
        e = _mma(one, one, one, one, xo[2 * m], xo[2 * m + 1], e[0], e[1], e[2], e[3], FP16, EMULATE)
    return e


@triton.jit
def _group_xt(acc, d, e, f, h: tl.constexpr, BIAS: tl.constexpr, FP16: tl.constexpr):
    return _tile_group_c(acc[0], acc[1], acc[2], acc[3], d[0], d[1], d[2], d[3], e[0], e[1], f, h, BIAS, FP16)


@triton.jit
def _block_xt(f0, f1, xsa, xsb, c0a, c0b, c1a, c1b, zero, one, G: tl.constexpr, FP16: tl.constexpr, R: tl.constexpr,
              MAGIC: tl.constexpr, BIAS: tl.constexpr, EMULATE: tl.constexpr):
    """_block_c with two x column tiles (xsa: rows 0-7 of x, xsb: rows 8-15) in each lane: the accumulator quads c0a /
    c0b of weight tile 0 and c1a / c1b of weight tile 1 (R = 2), each quad a tuple of 1-D tensors, so that every mma
    operand keeps the one layout of a [32 NW] tensor (one element per lane)."""
    zq = (zero, zero, zero, zero)
    for h in tl.static_range(2):
        if h == 0 or G == 64:
            d0a, d0b, d1a, d1b, ea, eb = zq, zq, zq, zq, zq, zq
        xa_e, xa_o = _split_cols(xsa[2 * h]), _split_cols(xsa[2 * h + 1])
        xb_e, xb_o = _split_cols(xsb[2 * h]), _split_cols(xsb[2 * h + 1])
        ea = _x_sums(xa_e, xa_o, ea, one, FP16, EMULATE)
        eb = _x_sums(xb_e, xb_o, eb, one, FP16, EMULATE)
        d0a, d0b = _tile_block_xt(f0, h, xa_e, xa_o, xb_e, xb_o, d0a, d0b, MAGIC, FP16, EMULATE)
        if R == 2:
            d1a, d1b = _tile_block_xt(f1, h, xa_e, xa_o, xb_e, xb_o, d1a, d1b, MAGIC, FP16, EMULATE)
        if h == 1 or G == 64:
            c0a, c0b = _group_xt(c0a, d0a, ea, f0, h, BIAS, FP16), _group_xt(c0b, d0b, eb, f0, h, BIAS, FP16)
            if R == 2:
                c1a, c1b = _group_xt(c1a, d1a, ea, f1, h, BIAS, FP16), _group_xt(c1b, d1b, eb, f1, h, BIAS, FP16)
    return c0a, c0b, c1a, c1b


@triton.jit
def _quad(c):
    """An accumulator quad (rows g / g + 8 x columns 2t / 2t + 1) as [32 NW, 2 (row g / g + 8), 2]."""
    return tl.join(tl.join(c[0], c[1]), tl.join(c[2], c[3]))


@triton.jit
def store_swiglu(total, rows, cols, y_ptr, M, N, stride_ym):
    """y [M, N] = silu(gate) * up from the fp32 sums [..., 2 (gate / up)], with the unfused path's roundings: both
    rounded to y's dtype as the projection's output, silu rounded before the product
    (qwendesk_kernels/activation.py)."""
    dtype = y_ptr.dtype.element_ty
    gate, up = tl.split(total)
    gate = gate.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    out = silu * up.to(dtype).to(tl.float32)
    tl.store(y_ptr + cols * stride_ym + rows, out.to(dtype), mask=(rows < N) & (cols < M))


@triton.jit(do_not_specialize=["per"])
def _gemv_mma_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_x, stride_ym, per,
                   G: tl.constexpr, FP16: tl.constexpr, NW: tl.constexpr, R: tl.constexpr, NT: tl.constexpr,
                   UNROLL: tl.constexpr, EVEN_K: tl.constexpr, X_TWICE: tl.constexpr, GLU: tl.constexpr,
                   L1: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr, XT: tl.constexpr = False):
    """y = x @ W^T for this program's run of work units; each warp R 16-row tiles, one mma.sync per 16 rows x 16 k.

    The words serve as A fragments as they lie: lane 4g + t loads words 4t..4t+3 of rows g and g + 8 (16 bytes
    each; the warp reads the tile's 1 KiB block in two 512-byte runs); word j's nibble plane p holds the codes at
    k = 32p + 2j + (0, 1), a lop3 (and a shift) make them a 16-bit pair B + c. The mma (p, m) takes plane p of
    words 4t + 2m and 4t + 2m + 1 as its columns (2t, 2t + 1) and (2t + 8, 2t + 9); its B fragment is x at the same
    k: x pairs 64 blk + 16p + 4t + 2m and the next, which sit side by side in the lane's 16-byte load of x. The
    mma's k order is thus a permutation of the block's that A and B share. x row n is B's column n (M <= 8). A
    second mma with A = 1 (one per (p, m), shared by the warp's tiles) sums x per group and hands every lane the
    sums of its D columns; then per group y += s D - (B + z) s sum(x).

    Work split (stream-K): a unit is one K block of one row group (NW warps x R tiles); the units, row group after
    row group, are cut into runs of `per`, one run per program, so that the grid is one wave of equal programs
    whatever N and K (with a fixed split-K, a second, part-filled wave or two-block programs made the 27B shapes
    up to a fifth slower on the H200). A run ends one row group, covers whole ones and starts another: for each
    row group it meets, the program sums its blocks and stores them (store_tile: directly when it had all of the
    row group's blocks, else as partial number pid - first of the group's programs, which the last to arrive adds in
    order).

    Rows of x past 8 (a speculative verify: M <= 32): NT x column tiles, each its own NW warps doing exactly what the
    M <= 8 kernel does for rows 8c..8c + 7 on the same row groups and runs (so each row of y has the same bits
    whatever M is); the program's NT copies of a weight word are read once from memory and then from L1. XT: a pair of
    column tiles in each warp instead (9-16 rows: one warp per NW; 17-32: two, sharing the words through L1), every A
    fragment made once and used by one mma per tile, in the same order per row as at M <= 8 (the same bits); the
    pair's x and accumulators are tuples of 1-D tensors.

    PDL (qwendesk_kernels/pdl.py): lets the next kernel start at once, loads its first weights, then waits for the
    kernel before it, before it reads x or writes anything. X_TWICE: x has K / 2 columns, read for each half of W."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    blocks = tl.cdiv(K, 128)
    groups = K // G
    x_blocks = blocks // 2                                   # (X_TWICE)
    u = pid * per
    if GLU:                         # a warp's tiles: a gate tile and the up tile N rows below (row groups of NW tiles)
        TILES: tl.constexpr = 1
        TILE1: tl.constexpr = 0
    else:                           # R tiles one after the other
        TILES: tl.constexpr = R  # type: ignore[no-redef]  # Triton: a constexpr per branch
        TILE1: tl.constexpr = 16  # type: ignore[no-redef]
    u_end = tl.minimum(u + per, tl.cdiv(N, 16 * TILES * NW) * blocks)
    if XT:                          # a pair of x column tiles in each warp
        LANES: tl.constexpr = 32 * NW * (NT // 2)
    else:
        LANES: tl.constexpr = 32 * NW * NT  # type: ignore[no-redef]  # Triton: a constexpr per branch
    i = tl.arange(0, LANES)
    lane = i % 32
    g = lane // 4
    t = lane % 4
    warp = (i // 32) % NW                                     # the lane's warp among its column tile's NW
    col0 = (i // 32 // NW) * (16 if XT else 8)                # the first row of x of its column tile (XT: pair)
    j4 = tl.arange(0, 4)[None, :]
    last_tile = (N - 1) // 16 * 16                             # a tile past N: the last one again (not stored)
    s32, z32 = s_ptr.to(tl.pointer_type(tl.int32)), z_ptr.to(tl.pointer_type(tl.int32))
    # x row col0 + g is B column g; lanes past M read row M - 1 again (their columns of y are not stored)
    x_ptrs = x_ptr.to(tl.pointer_type(tl.int32)) + (tl.minimum(col0 + g, M - 1) * stride_x + 4 * t)[:, None] + j4
    x_ptrs_b = x_ptr.to(tl.pointer_type(tl.int32)) + (tl.minimum(col0 + 8 + g, M - 1) * stride_x + 4 * t)[:, None] + j4
    MAGIC: tl.constexpr = 0x64006400 if FP16 else 0x43004300
    BIAS: tl.constexpr = 1024.0 if FP16 else 128.0
    one = tl.full((LANES,), 0x3C003C00 if FP16 else 0x3F803F80, tl.int32)
    zero = tl.zeros((LANES,), tl.float32)
    while u < u_end:
        row_group = u // blocks
        b0 = u % blocks
        b1 = tl.minimum(blocks, b0 + u_end - u)
        row0 = (row_group * NW + warp) * (16 * TILES) + g             # the lane's row g of its warp's first tile
        r0 = tl.minimum(row0 - g, last_tile) + g
        w0 = int4_row_words(w_ptr, r0, blocks)[:, None] + (4 * t)[:, None] + j4
        sz0 = group_param_offs(r0, 0, groups) // 2          # the word of rows g, g + 8 (r0 % 16 = g < 8)
        s0, z0 = s32 + sz0, z32 + sz0
        if R == 2:
            r1 = tl.minimum(row0 + TILE1 - g, last_tile) + g
            if GLU:
                r1 += N
            w1 = int4_row_words(w_ptr, r1, blocks)[:, None] + (4 * t)[:, None] + j4
            sz1 = group_param_offs(r1, 0, groups) // 2
            s1, z1 = s32 + sz1, z32 + sz1
        a00, a01, a02, a03 = zero, zero, zero, zero           # tile 0's y: rows g, g + 8 x columns 2t, 2t + 1
        a10, a11, a12, a13 = zero, zero, zero, zero           # tile 1's (R = 2)
        c0a, c0b, c1a, c1b = ((zero, zero, zero, zero),) * 4    # XT: (weight tile, x column tile)'s quads
        p0 = _load_block_c(w0, s0, z0, b0, groups, G, L1)   # one block in flight
        p1 = _load_block_c(w1, s1, z1, b0, groups, G, L1) if R == 2 else p0
        if PDL:
            tl.extra.cuda.gdc_wait()
        x0, x1, x2, x3 = _load_x_c(x_ptrs, b0, K, EVEN_K, x_blocks, X_TWICE)
        xb = _load_x_c(x_ptrs_b, b0, K, EVEN_K, x_blocks, X_TWICE) if XT else (x0, x1, x2, x3)
        for blk in tl.range(b0, b1, loop_unroll_factor=UNROLL):
            f0, f1, xs, xsb = p0, p1, (x0, x1, x2, x3), xb
            ahead = tl.minimum(blk + 1, b1 - 1)               # the last block again at the end: no masks to zero-fill
            p0 = _load_block_c(w0, s0, z0, ahead, groups, G, L1)
            p1 = _load_block_c(w1, s1, z1, ahead, groups, G, L1) if R == 2 else p0
            x0, x1, x2, x3 = _load_x_c(x_ptrs, ahead, K, EVEN_K, x_blocks, X_TWICE)
            if XT:
                xb = _load_x_c(x_ptrs_b, ahead, K, EVEN_K, x_blocks, X_TWICE)
            # a barrier between the loads ahead and this block's work: else they sink down to the loop's end, and no
            # block is in flight.
            tl.debug_barrier()
            if XT:
                c0a, c0b, c1a, c1b = _block_xt(f0, f1, xs, xsb, c0a, c0b, c1a, c1b, zero, one, G, FP16, R, MAGIC,
                                               BIAS, EMULATE)
            else:
                a00, a01, a02, a03, a10, a11, a12, a13 = _block_c(
                    f0, f1, xs, a00, a01, a02, a03, a10, a11, a12, a13, zero, one, G, FP16, R, MAGIC, BIAS, EMULATE)
        c0, c1 = col0 + 2 * t, col0 + 2 * t + 1
        cols = tl.join(tl.join(c0, c1), tl.join(c0, c1))            # [32 NW NT, 2 (row g / g + 8), 2]
        rows = tl.join(tl.join(row0, row0), tl.join(row0 + 8, row0 + 8))
        if XT:                                              # [32 NW NT / 2, 2, 2, 2 (x column tile of the pair)]
            cols = tl.join(cols, cols + 8)
            rows = tl.join(rows, rows)
            y, y1 = tl.join(_quad(c0a), _quad(c0b)), tl.join(_quad(c1a), _quad(c1b))
        else:
            y, y1 = _quad((a00, a01, a02, a03)), _quad((a10, a11, a12, a13))
        first = row_group * blocks // per                     # the programs with blocks of this row group
        last = ((row_group + 1) * blocks - 1) // per
        if GLU:                                             # [32 NW, 2, 2, 2 (gate / up)], the partials over 2N rows
            y = tl.join(y, y1)
            if first == last:
                store_swiglu(y, rows, cols, y_ptr, M, N, stride_ym)
            else:
                total, done = arrive(y, tl.join(rows, rows + N), tl.join(cols, cols), part_ptr, count_ptr, M, 2 * N,
                                     row_group, pid - first, last - first + 1)
                if done:
                    store_swiglu(total, rows, cols, y_ptr, M, N, stride_ym)
        else:
            if R == 2:                                                   # [32 NW, 2, 2, 2 (tile)]
                y = tl.join(y, y1)
                rows = tl.join(rows, rows + 16)
                cols = tl.join(cols, cols)
            store_tile(y, rows, cols, y_ptr, part_ptr, count_ptr, M, N, stride_ym, row_group, pid - first,
                       last - first + 1)
        u += b1 - b0


GEMV_MMA_PROGRAMS_PER_SM = 16     # one-warp programs resident per SM at 128 registers: the grid is one wave of them
GEMV_MMA_DEFAULT = dict(NW=1, R=2, UNROLL=2, MAXNREG=128, PER_SM=GEMV_MMA_PROGRAMS_PER_SM)
GEMV_MMA_XT = {**GEMV_MMA_DEFAULT, "XT": True}                   # past 8 rows: a pair of column tiles in each warp
GEMV_MMA_XT1 = dict(NW=1, R=1, UNROLL=2, MAXNREG=None, PER_SM=GEMV_MMA_PROGRAMS_PER_SM, XT=True)   # one weight tile


def gemv_mma_configs() -> list[dict]:
    """The mma GEMV's configs (NW warps per program, R 16-row tiles per warp, UNROLL, MAXNREG registers per thread,
    PER_SM programs per SM); the launcher uses the first. On the H200 (27B shapes, 64 GEMVs in one graph, M = 1):
    the loop unrolled twice issues ~10% fewer instructions (no register copies of the block loaded ahead), capped at
    128 registers it keeps 16 warps per SM (144 uncapped: 14), and the stream-K grid of one wave: 18.7 µs per GEMV
    against 20.6 for the split-K kernel before (docs/performance.md, fifth session); 16.8 with x loaded ahead.
    XT (past 8 rows: a pair of x column tiles in each warp, the weights unpacked once for both) is not measured yet:
    compiled for sm_90 / sm_86 at 16 rows it takes 185 / 247 registers at R = 2, 112 / 140 at R = 1, at 32 rows
    186 / 251 and 136 / 106, no spills (docs/performance.md, 2026-12-08)."""
    best = GEMV_MMA_DEFAULT
    return [best, {**best, "PER_SM": 2 * GEMV_MMA_PROGRAMS_PER_SM}, {**best, "UNROLL": 1, "MAXNREG": None},
            dict(NW=1, R=1, UNROLL=2, MAXNREG=None, PER_SM=GEMV_MMA_PROGRAMS_PER_SM), {**best, "NW": 2, "PER_SM": 8},
            GEMV_MMA_XT, GEMV_MMA_XT1]


def gemv_mma_takes(x2: torch.Tensor, w: Int4Weight) -> bool:
    """The mma GEMV takes M <= MMA_ROWS rows of 16-bit x, groups of 64 or 128, on the bf16 / fp16 mma of sm_80+."""
    return (x2.shape[0] <= MMA_ROWS and w.group_size in (64, 128) and x2.dtype in (torch.bfloat16, torch.float16)
            and (not x2.is_cuda or _capability(x2.device) >= (8, 0)))


def gemv_mma_supports(x2: torch.Tensor, w: Int4Weight) -> bool:
    """Whether the default takes the mma GEMV: it can, for at most GEMV_MMA_MAX_M rows (DOT_PAST where set)."""
    return x2.shape[0] <= (DOT_PAST or GEMV_MMA_MAX_M) and gemv_mma_takes(x2, w)


@functools.cache
def _capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def gemv_mma_grid(N: int, K: int, config: dict, sms: int) -> tuple[int, int]:
    """(programs, units per program) of the mma GEMV: config["PER"] units per program if given, else a run per
    resident program slot (PER_SM x SMs). A run longer than a row group is made whole row groups, so no partial
    sums are needed where N is large (an int4 LM head: 248,320 rows)."""
    nw, r, blocks = config.get("NW", 1), config.get("R", 2), triton.cdiv(K, 128)
    units = triton.cdiv(N, 16 * r * nw) * blocks
    per = config.get("PER") or triton.cdiv(units, config.get("PER_SM", GEMV_MMA_PROGRAMS_PER_SM) * sms)
    if per > blocks:
        per = triton.cdiv(per, blocks) * blocks
    return triton.cdiv(units, per), per


def gemv(x2: torch.Tensor, w: Int4Weight, y: torch.Tensor, config: dict | None, swiglu: bool = False):
    """y [M, N] = x2 [M, K / x_repeats] @ W^T for M <= 32 (the mma GEMV), one launch. config (gemv_mma_configs' keys,
    PER, PDL, L1, XT) forces one; None: GEMV_MMA_DEFAULT (the first of gemv_mma_configs; ROWS_CONFIG past 8 rows
    where set). Past 8 rows each program
    has a column tile of NW warps per 8 rows of x, on the grid of M <= 8 (L1, on by default there: the tiles share
    the weight words through L1); with XT, NW warps per pair of column tiles instead. PDL on
    (qwendesk_kernels/pdl.py) unless config says PDL=False. swiglu: W is gate | up stacked by rows and y [M, N / 2] =
    silu(x2 @ gate^T) * (x2 @ up^T), made in the epilogue (each warp's two tiles: a gate tile and the up tile N / 2
    rows below; R = 2)."""
    M, (N, K) = x2.shape[0], w.shape
    assert gemv_mma_takes(x2, w), "the mma GEMV: M <= 32, group 64 or 128, 16-bit x"
    assert w.x_repeats in (1, 2) and x2.shape[1] * w.x_repeats == K and (w.x_repeats == 1 or K % 256 == 0), \
        "x read twice needs whole blocks in each half of W"
    if x2.stride(0) % 2 or x2.data_ptr() % 16:
        x2 = x2.contiguous()                    # x is read as int32 pairs, 4 at a time
    config = config or (M > X_TILE and ROWS_CONFIG) or GEMV_MMA_DEFAULT
    nw, r, blocks = config.get("NW", 1), config.get("R", 2), triton.cdiv(K, 128)
    nt = triton.next_power_of_2(triton.cdiv(M, X_TILE))         # 1, 2 or 4 (tensors of 32 x warps, a power of 2)
    xt = bool(config.get("XT", False)) and nt > 1               # past 8 rows: a pair of column tiles in each warp
    assert not swiglu or (r == 2 and N % 32 == 0), "SwiGLU: two tiles per warp, gate and up in whole tiles"
    programs, per = gemv_mma_grid(N, K, config, sm_count(x2.device) if x2.is_cuda else 132)  # (the same with swiglu)
    launch = pdl.launch_args(x2.device) if config.get("PDL", True) else {"PDL": False}
    if x2.is_cuda and config.get("MAXNREG") and nt == 1:     # (column tiles at 128: 32-40 B of spills on sm_120)
        launch["maxnreg"] = config["MAXNREG"]
    part, count = splitk_scratch(x2.device)
    parts = 1 if per % blocks == 0 else triton.cdiv(blocks, per) + 1    # the most programs on one row group
    assert parts == 1 or (parts * M * N <= SPLITK_FLOATS and triton.cdiv(N, 16 * r * nw) <= SPLITK_COUNTERS), \
        "the partial sums must fit their scratch"
    _gemv_mma_kernel[(programs,)](x2, w.qweight, w.scales, w.zeros, y, part, count, M, N // 2 if swiglu else N, K,
                                x2.stride(0) // 2, y.stride(0), per, G=w.group_size, FP16=x2.dtype == torch.float16,
                                NW=nw, R=r, NT=nt, UNROLL=config.get("UNROLL", 1), EVEN_K=K % 128 == 0,
                                X_TWICE=w.x_repeats == 2, GLU=swiglu, L1=config.get("L1", nt > (2 if xt else 1)),
                                EMULATE=INTERPRET, XT=xt, num_warps=nw * nt // (2 if xt else 1), num_stages=1,
                                **launch)
