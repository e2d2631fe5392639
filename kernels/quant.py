"""Weight-only int4 / int8 linear layers and the int8 embedding gather: formats, torch references, Triton kernels.

Formats (y = x @ W^T, W [N, K])
- Int4Weight: W ~= (q - zero) * scale per group of G (32, 64 or 128) along K, codes q in 0..15, float scales and
  zero points [N, K // G] in the activation dtype. Packed layout, qweight int32 [ceil(N / 16), ceil(K / 128), 16,
  16]: rows are cut into tiles of 16 and K into blocks of 128; qweight[tile, b, r, j], word j (0..15) of row
  16 tile + r in block b, holds the code of k = 128 b + 32 p + 2 j + t in nibble p + 4 t, i.e. bits 4p..4p+3
  (t = 0) and 16+4p..16+4p+3 (t = 1), p = 0..3. The two 16-bit halves of a word thus hold the codes of the
  neighbours k, k + 1 at the same place, and the 16 words' nibble pair p covers one run of 32 consecutive k inside
  one group. A tile's block is 1 KiB in one piece and its blocks follow each other: reading the words in a GEMV's
  pattern drew ~2.2 TB/s from the H200's HBM out of row-major rows (64 bytes per row and block), 3.2-3.7 out of
  the tiles (docs/performance.md). Rows and K past the shape are padded with zero codes.
  Scales and zeros lie in the same row tiles, [ceil(N / 16), K // G, 16], element 2 r + h of a tile's group
  holding row 8 h + r: the 16 rows' values of one group are 32 bytes in one piece (one memory transaction for a
  warp instead of one per row), and rows r and r + 8, which one lane of an mma fragment holds, are one 32-bit word.
- Int8Weight: W = q * scale per group of G (a multiple of 64), q int8 [N, K] as it is.

Dequantisation (decode is bound by the weight bytes; unpacking with int->float conversions runs out of ALU on an
H200 well before memory): a 4-bit code c ORed into the top mantissa bits of 1.0 is the float v = 1 + c/16, exact
in bf16 / fp16 / fp32, so one shift and one lop3 turn a 32-bit word into two bf16 values (a k-pair of the tensor
core operand). With a = 16 s and b = (16 + z) s per group,
    sum_k x_k (q_k - z) s = a * sum_k x_k v_k - b * sum_k x_k,
so the tensor cores multiply v as it is, and scale and zero apply once per group and output. An int8 byte is two
such codes: u = q + 128 = 16 h + l, the high one taken as 16 + h (exponent + 4, its top bit flipped in the same
lop3), so W = 16 s (v_l + v_h) - 400 s: the int8 kernel is the int4 one on 64-k blocks (z = 384). In an int8
word the pairs are bytes (0, 2) and (1, 3): k = 4j, 4j + 2 and 4j + 1, 4j + 3.

GEMV variant A (M <= 32 rows: decode, speculative verify), one launch, CUDA-graph capturable once autotuned:
- program = (BN weight rows, one K split); y^T tile [BN, BM] = sum of dots v [BN, 32] x x^T [32, BM] with BM
  = 8, 16 or 32 (M padded): the weights are the tensor-core A operand, so warps split weight rows and nothing
  is dequantised twice; sum_k x_k comes from a small dot with ones.
- split-K: each split writes an fp32 partial; the last split of a tile to arrive (atomic counter) sums them in
  split order, writes y and resets the counter. Deterministic, one launch.
- autotuned on (N, K, G, bits, M bucket) over (BN, warps, split-K, stages); the interpreter runs one fixed config.
GEMV variant C (int4, M <= 8, 16-bit x, G = 64 or 128; the default there), one launch, no autotuner:
- tensor-core mma.sync.m16n8k16 issued by inline PTX on the packed words as they lie: a warp's two 512-byte loads
  of a tile's block are 16 rows x 128 k of A fragments once a lop3 (and a shift) turn each nibble pair into two
  16-bit floats B + c (B = 128 in bf16); x (padded to 8 rows) is the B operand, loaded 16 bytes per lane straight
  into fragments, and the mma's k order is a permutation of the block's that A and B share (kernel docstring).
  A second mma with A = 1 sums x per group; per group and output y += s D - (B + z) s sum x.
- the mma needs each lane to hold its fragment: every tensor is 1-D of 32 x warps elements, which Triton lays out
  one element per lane (checked by the GPU tests; the interpreter runs the mma written out in tl ops).
- program = a run of equal length of (row group of NW warps x R tiles, K block) units, row group after row group
  (stream-K): the grid is one wave of GEMV_C_PROGRAMS_PER_SM programs per SM whatever the shape; a row group
  shared by several programs is summed by the last of them to arrive, in order (deterministic). The next block's
  words, scales and x are loaded ahead (a barrier keeps them above the work); the loop is unrolled twice (no
  register copies) and capped at 128 registers (16 one-warp programs resident per SM).
- ~52 instructions per 1,024 weights (sm_90 SASS, 210 per 4,096 at R = 2: 16 + 8 HMMA, 64 LOP3, 48 SHF), against
  ~125 for an FMA kernel. On the H200 at 27B shapes, 64 GEMVs of 16 layers replayed in one graph take 16.8 µs
  each at M = 1 (3.0 TB/s; x loaded after the barrier: 18.7, the split-K grid before that: 20.6)
  (docs/performance.md, fifth and sixth sessions).
Large M (prefill): the weight is dequantised in row chunks into a reusable scratch and multiplied by torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import pdl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GEMV_MAX_M = 32                 # above: dequantise + torch matmul
GEMV_C_MAX_M = 8                # variant C's limit (x rows are the 8 columns of the mma's B operand)
DEQUANT_SCRATCH = 1 << 25       # elements of the dequantised-weight scratch of the large-M path (64 MiB bf16)
SPLITK_FLOATS = 1 << 21         # fp32 split-K partials, one buffer per device (8 MiB)
SPLITK_COUNTERS = 1 << 14       # split-K arrival counters, one per output tile


# ---------------------------------------------------------------------------------------------------------------
# formats and torch references (CPU path, test oracle)

@dataclass
class Int4Weight:
    qweight: torch.Tensor       # int32 [ceil(N / 16), ceil(K / 128), 16, 16], layout above
    scales: torch.Tensor        # [ceil(N / 16), K // G, 16] (row tiles, layout above), activation dtype
    zeros: torch.Tensor         # the same layout and dtype (float zero points)
    group_size: int
    shape: tuple[int, int]      # (N, K)


@dataclass
class Int8Weight:
    qweight: torch.Tensor       # int8 [N, K]
    scales: torch.Tensor        # [N, K // G]
    group_size: int
    shape: tuple[int, int]


# bit offset of the code of k = 128 b + 32 p + 2 j + t inside its word j, as [1, 1, 1, p, 1, t]
_NIBBLE_SHIFTS = (4 * torch.arange(4, dtype=torch.int32).view(4, 1) + 16 * torch.arange(2, dtype=torch.int32)).view(
    1, 1, 1, 4, 1, 2)


def pack_int4_codes(q: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] (0..15) -> the int32 words [ceil(N / 16), ceil(K / 128), 16, 16] of the layout above (padding:
    code 0)."""
    N, K = q.shape
    tiles, blocks = -(-N // 16), -(-K // 128)
    codes = torch.zeros(tiles * 16, blocks * 128, dtype=torch.uint8, device=q.device)
    codes[:N, :K] = q & 0xF
    codes = codes.view(tiles, 16, blocks, 4, 16, 2)                            # [tile, r, b, p, j, t]
    words = torch.zeros(tiles, 16, blocks, 16, dtype=torch.int64, device=q.device)   # one slice at a time
    for p in range(4):
        for t in range(2):
            words |= codes[:, :, :, p, :, t].to(torch.int64) << (4 * p + 16 * t)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words.transpose(1, 2).contiguous()                                # [tile, b, r, j]


def unpack_int4_codes(qweight: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The words of pack_int4_codes -> codes uint8 [N, K]."""
    tiles, blocks = qweight.shape[:2]
    words = qweight.transpose(1, 2)[:, :, :, None, :, None]                 # [tile, r, b, 1, j, 1]
    codes = (words >> _NIBBLE_SHIFTS.to(words.device)) & 0xF                 # [tile, r, b, p, j, t]
    return codes.reshape(tiles * 16, blocks * 128)[:N, :K].to(torch.uint8)


def write_int4_rows(qweight: torch.Tensor, row: int, q: torch.Tensor) -> None:
    """Codes q [n, K] into rows row .. row + n - 1 of packed words, in place. Whole tiles are packed as they are; a
    part that starts or ends inside a tile (a fused projection's parts need not start on one) rewrites the tiles it
    touches: unpacked, overwritten, packed again."""
    n, K = q.shape
    t0, t1 = row // 16, -(-(row + n) // 16)
    if row % 16 == 0 and n % 16 == 0:
        qweight[t0:t1] = pack_int4_codes(q)
        return
    codes = unpack_int4_codes(qweight[t0:t1], 16 * (t1 - t0), K)
    codes[row - 16 * t0:row - 16 * t0 + n] = q
    qweight[t0:t1] = pack_int4_codes(codes)


def tile_group_params(t: torch.Tensor) -> torch.Tensor:
    """Per-group scales or zeros [N, groups] -> the row tiles [ceil(N / 16), groups, 16] (padding rows: 0)."""
    N, groups = t.shape
    tiles = -(-N // 16)
    padded = torch.zeros(tiles * 16, groups, dtype=t.dtype, device=t.device)
    padded[:N] = t
    return padded.view(tiles, 2, 8, groups).permute(0, 3, 2, 1).reshape(tiles, groups, 16)   # [tile, group, r, h]


def untile_group_params(t: torch.Tensor, N: int) -> torch.Tensor:
    """The row tiles of tile_group_params -> [N, groups]."""
    tiles, groups, _ = t.shape
    return t.view(tiles, groups, 8, 2).permute(0, 3, 2, 1).reshape(tiles * 16, groups)[:N]


def write_group_param_rows(t: torch.Tensor, row: int, rows: torch.Tensor) -> None:
    """rows [n, groups] into rows row .. row + n - 1 of row tiles t [tiles, groups, 16], in place."""
    r = torch.arange(row, row + rows.shape[0], device=t.device)
    t.view(t.shape[0], t.shape[1], 8, 2)[r // 16, :, r % 8, r % 16 // 8] = rows.to(t.device, t.dtype)


def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> Int4Weight:
    """q uint8 [N, K] (codes 0..15), scales / zeros [N, K // G] -> Int4Weight in the kernel layout."""
    N, K = q.shape
    assert group_size in (32, 64, 128), f"int4 group size {group_size}: 32, 64 or 128"
    assert K % 64 == 0 and K % group_size == 0, f"K = {K}: a multiple of 64 and of the group size"
    assert scales.shape == zeros.shape == (N, K // group_size) and scales.dtype == zeros.dtype
    return Int4Weight(pack_int4_codes(q), tile_group_params(scales), tile_group_params(zeros), group_size, (N, K))


def unpack_int4(w: Int4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (codes uint8 [N, K], scales [N, K // G], zeros [N, K // G])."""
    N, K = w.shape
    return (unpack_int4_codes(w.qweight, N, K), untile_group_params(w.scales, N), untile_group_params(w.zeros, N))


def _int4_dequantize_fp32(w: Int4Weight) -> torch.Tensor:
    q, s, z = unpack_int4(w)
    s = s.float().repeat_interleave(w.group_size, dim=1)
    z = z.float().repeat_interleave(w.group_size, dim=1)
    return (q.float() - z) * s


def dequantize_int4_ref(w: Int4Weight) -> torch.Tensor:
    """-> W [N, K] in the scales' dtype, computed in fp32."""
    return _int4_dequantize_fp32(w).to(w.scales.dtype)


def int4_linear_ref(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [..., K] -> [..., N]: dequantise and multiply in fp32, cast back to x's dtype."""
    return (x.float() @ _int4_dequantize_fp32(w).t()).to(x.dtype)


def pack_int8(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> Int8Weight:
    """q int8 [N, K], scales [N, K // G] -> Int8Weight (symmetric: W = q * scale)."""
    N, K = q.shape
    assert q.dtype == torch.int8 and group_size % 64 == 0 and K % group_size == 0, \
        f"int8 [N, K] with K = {K} a multiple of the group size {group_size}, itself a multiple of 64"
    assert scales.shape == (N, K // group_size)
    return Int8Weight(q.contiguous(), scales.contiguous(), group_size, (N, K))


def _int8_dequantize_fp32(w: Int8Weight) -> torch.Tensor:
    return w.qweight.float() * w.scales.float().repeat_interleave(w.group_size, dim=1)


def dequantize_int8_ref(w: Int8Weight) -> torch.Tensor:
    """-> W [N, K] in the scales' dtype, computed in fp32."""
    return _int8_dequantize_fp32(w).to(w.scales.dtype)


def int8_linear_ref(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    return (x.float() @ _int8_dequantize_fp32(w).t()).to(x.dtype)


def int8_embedding_ref(ids: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """ids [...] -> [..., K] in the scales' dtype: the rows, dequantised."""
    rows = w.qweight[ids].float() * w.scales[ids].float().repeat_interleave(w.group_size, dim=-1)
    return rows.to(w.scales.dtype)


# ---------------------------------------------------------------------------------------------------------------
# Triton: codes to floats

@triton.jit
def _code_bits(t, MASK: tl.constexpr, C: tl.constexpr, USE_ASM: tl.constexpr):
    """(t & MASK) ^ C. As inline PTX one of the two constants stays in a register, so this is one lop3 (ptxas
    splits the plain form into two: an instruction has one immediate)."""
    if USE_ASM:
        bits = tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0x6A;", "=r,r,r,r",
                                         [t, tl.full(t.shape, MASK, tl.int32), tl.full(t.shape, C, tl.int32)],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        bits = (t & MASK) ^ C
    return bits


@triton.jit
def _int4_row_words(w_ptr, rows, blocks):
    """Where the words of rows (any shape) start in the int4 layout: block b, word j of a row at + 256 b + j."""
    return w_ptr + (rows // 16).to(tl.int64) * (blocks * 256) + (rows % 16) * 16


@triton.jit
def _group_param_offs(rows, g, groups):
    """Where the scale / zero of rows (any shape) at group g lies in the int4 row tiles [tiles, groups, 16]."""
    return (rows // 16) * (groups * 16) + g * 16 + 2 * (rows % 8) + rows % 16 // 8


@triton.jit
def _shift(w, BY: tl.constexpr):
    """w << BY (BY >= 0) or w >> -BY; the caller masks the bits that matter."""
    if BY >= 0:
        r = w << BY
    else:
        r = w >> -BY
    return r


@triton.jit
def _code_as_f32(w, i: tl.constexpr, HIGH: tl.constexpr):
    """fp32 1 + c/16 for the code c in nibble i of each int32 word (HIGH: 16 + (c ^ 8), an int8 high nibble)."""
    C: tl.constexpr = (0x41800000 ^ 0x400000) if HIGH else 0x3F800000
    return ((_shift(w, 19 - 4 * i) & 0x780000) ^ C).to(tl.float32, bitcast=True)


@triton.jit
def _pair_as_float(w, p: tl.constexpr, HIGH: tl.constexpr, dtype: tl.constexpr, USE_ASM: tl.constexpr):
    """w [R, 16] int32 -> [R, 32] in dtype: column 2j + t = the code in nibble p + 4t of word j as 1 + c/16
    (HIGH: 16 + (c ^ 8)). In 16-bit dtypes one shift and one lop3 make both values of a word."""
    if dtype == tl.float32:
        v = tl.interleave(_code_as_f32(w, p, HIGH), _code_as_f32(w, p + 4, HIGH))
    else:
        MB: tl.constexpr = 6 if dtype == tl.float16 else 3                  # the code goes to bits MB..MB+3
        ONE: tl.constexpr = 0x3C003C00 if dtype == tl.float16 else 0x3F803F80  # 1.0 in both halves
        C: tl.constexpr = ((ONE + (4 << (MB + 4)) * 0x10001) ^ ((8 << MB) * 0x10001)) if HIGH else ONE
        bits = _code_bits(_shift(w, MB - 4 * p), 0xF000F << MB, C, USE_ASM)
        v = tl.interleave(bits.to(tl.int16), (bits >> 16).to(tl.int16)).to(dtype, bitcast=True)
    return v


# ---------------------------------------------------------------------------------------------------------------
# Triton: GEMV

@triton.jit
def _store_tile(y, rows, cols, y_ptr, part_ptr, count_ptr, M, N, stride_ym, tile, part, parts):
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
        tl.store(part_ptr + part * M * N + offs, y, mask=mask)
        tl.debug_barrier()                      # every thread's partial is written before the release below
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == parts - 1:
            total = tl.zeros_like(y)
            for s in range(parts):
                total += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0)


@triton.jit
def _int4_dots(w, blk, P0: tl.constexpr, RUNS: tl.constexpr, xt_cols, rm, M, K, ones,
               USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """Over nibble pairs P0 .. P0 + RUNS - 1 of the 16-word block blk: d [BN, BM] = sum_k v x^T and xs [16, BM]
    (every row sum_k x; a small dot with ones, on a load of its own so that its layout stays apart)."""
    dtype = xt_cols.dtype.element_ty
    c = tl.arange(0, 32)
    d = tl.zeros((BN, BM), tl.float32)
    xs = tl.zeros((16, BM), tl.float32)
    for p in tl.static_range(P0, P0 + RUNS):
        k = blk * 128 + p * 32 + c
        x_mask = (k[:, None] < K) & (rm[None, :] < M)
        xt = tl.load(xt_cols + k[:, None], mask=x_mask, other=0.0)
        d = tl.dot(_pair_as_float(w, p, False, dtype, USE_ASM), xt, d, input_precision=DOT_PRECISION)
        xt = tl.load(xt_cols + k[:, None], mask=x_mask, other=0.0, eviction_policy="evict_last")
        xs = tl.dot(ones, xt, xs, input_precision=DOT_PRECISION)
    return d, xs


@triton.jit
def _x_even_odd(xt_cols, k0, rm, M, EVICT: tl.constexpr):
    """x^T at k0 + 2c and at k0 + 2c + 1 (c < 32) as two [32, BM] tiles; 16-bit x: one 32-bit load per pair."""
    c = tl.arange(0, 32)
    x_mask = rm[None, :] < M
    dtype = xt_cols.dtype.element_ty
    if dtype == tl.float32:
        even = tl.load(xt_cols + k0 + 2 * c[:, None], mask=x_mask, other=0.0, eviction_policy=EVICT)
        odd = tl.load(xt_cols + k0 + 1 + 2 * c[:, None], mask=x_mask, other=0.0, eviction_policy=EVICT)
    else:
        pairs = tl.load((xt_cols + k0).to(tl.pointer_type(tl.int32)) + c[:, None], mask=x_mask, other=0,
                        eviction_policy=EVICT)
        even = pairs.to(tl.int16).to(dtype, bitcast=True)
        odd = (pairs >> 16).to(tl.int16).to(dtype, bitcast=True)
    return even, odd


@triton.jit
def _int8_dots(w, blk, xt_cols, rm, M, ones,
               USE_ASM: tl.constexpr, DOT_PRECISION: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr):
    """The 64-k block blk of int8 words: d [BN, BM] = sum_k (v_l + v_h) x^T, xs [16, BM] as in _int4_dots. Bytes
    (0, 2) of the words are k = 4j, 4j + 2: the even columns of x; bytes (1, 3) the odd ones."""
    dtype = xt_cols.dtype.element_ty
    even, odd = _x_even_odd(xt_cols, blk * 64, rm, M, "")
    d = tl.dot(_pair_as_float(w, 0, False, dtype, USE_ASM), even, input_precision=DOT_PRECISION)
    d = tl.dot(_pair_as_float(w, 1, True, dtype, USE_ASM), even, d, input_precision=DOT_PRECISION)
    d = tl.dot(_pair_as_float(w, 2, False, dtype, USE_ASM), odd, d, input_precision=DOT_PRECISION)
    d = tl.dot(_pair_as_float(w, 3, True, dtype, USE_ASM), odd, d, input_precision=DOT_PRECISION)
    even, odd = _x_even_odd(xt_cols, blk * 64, rm, M, "evict_last")
    xs = tl.dot(ones, even, input_precision=DOT_PRECISION)
    xs = tl.dot(ones, odd, xs, input_precision=DOT_PRECISION)
    return d, xs


@triton.jit(do_not_specialize=["M", "M_BUCKET", "SPLIT_K"])
def _gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_ym,
                 M_BUCKET, SPLIT_K, BITS: tl.constexpr, G: tl.constexpr, USE_ASM: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr):
    """y[:M, tile] (+)= x @ W^T over this program's K blocks. w_ptr: int32 words, 16 per row and block of
    128 k (int4) or 64 k (int8). M_BUCKET only keys the autotuner."""
    pdl.enter(PDL)
    BLOCK: tl.constexpr = 128 if BITS == 4 else 64
    GROUPS: tl.constexpr = BLOCK // G if G < BLOCK else 1        # groups per block
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    blocks = tl.cdiv(K, BLOCK)
    per_split = tl.cdiv(blocks, SPLIT_K)
    b0 = pid_k * per_split
    b1 = tl.minimum(b0 + per_split, blocks)
    rm = tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    row_ok = rn < N
    groups = K // G
    if BITS == 4:                                             # (int8 rows are row-major, 16 words per block)
        w_rows = _int4_row_words(w_ptr, rn, blocks)[:, None] + tl.arange(0, 16)[None, :]
    else:
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * (blocks * 16) + tl.arange(0, 16)[None, :]
    BLOCK_WORDS: tl.constexpr = 256 if BITS == 4 else 16
    xt_cols = x_ptr + rm[None, :] * stride_xm
    ones = tl.full((16, 32), 1.0, x_ptr.dtype.element_ty)
    y = tl.zeros((BN, BM), tl.float32)
    for blk in range(b0, b1):
        w = tl.load(w_rows + blk * BLOCK_WORDS, mask=row_ok[:, None], other=0)
        for h in tl.static_range(GROUPS):
            if BITS == 4:
                d, xs = _int4_dots(w, blk, h * (4 // GROUPS), 4 // GROUPS, xt_cols, rm, M, K, ones,
                                   USE_ASM, DOT_PRECISION, BN, BM)
                g = tl.minimum(blk * GROUPS + h, groups - 1)      # (K padding: x = 0 there)
                sz = _group_param_offs(rn, g, groups)
                z = tl.load(z_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
            else:
                d, xs = _int8_dots(w, blk, xt_cols, rm, M, ones, USE_ASM, DOT_PRECISION, BN, BM)
                sz = rn * groups + blk * 64 // G                  # (int8 scales are row-major)
                z = 384.0                                         # W = 16 s (v_l + v_h) - 400 s
            s = tl.load(s_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
            y += (16.0 * s)[:, None] * d
            y -= ((16.0 + z) * s)[:, None] * tl.max(xs, axis=0)[None, :]       # every row of xs is sum_k x
    _store_tile(y, rn[:, None], rm[None, :], y_ptr, part_ptr, count_ptr, M, N, stride_ym, pid_n, pid_k, SPLIT_K)


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def m_bucket(M: int) -> int:
    """GEMV rows are padded to 8, 16 or 32 (BM): the autotuning bucket."""
    return 8 if M <= 8 else 16 if M <= 16 else 32


def _prune_configs(configs, named_args, **kwargs):
    """Keep the configs with BM = the M bucket, split-K up to ~8 programs per SM and within the split-K scratch."""
    args = {**named_args, **kwargs}
    bucket, N = args["M_BUCKET"], args["N"]
    sms = _sm_count(args["y_ptr"].device)
    kept = []
    for cfg in configs:
        bm, bn, split = cfg.kwargs["BM"], cfg.kwargs["BN"], cfg.kwargs["SPLIT_K"]
        tiles = triton.cdiv(N, bn)
        if bm == bucket and (split == 1 or (tiles * split <= 8 * sms and split * bm * N <= SPLITK_FLOATS
                                            and tiles <= SPLITK_COUNTERS)):
            kept.append(cfg)
    return kept


def _bench_quick(fn, quantiles):
    """The autotuner's timer, shorter than Triton's default: one run tunes many shapes x configs."""
    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


# (BN, warps): 64 weight rows per warp balance the A-operand extraction, x^T reuse and registers; 4 warps x 64 rows
# run Hopper's warpgroup MMA. Two pipeline depths for the decode bucket (M <= 8), where latency hiding matters most.
_TILES = [(32, 1), (64, 1), (128, 2), (256, 4)]
_CONFIGS = [triton.Config(dict(BM=bm, BN=bn, SPLIT_K=sk), num_warps=nw, num_stages=st)
            for bm in (8, 16, 32) for bn, nw in _TILES for sk in (1, 2, 4, 8) for st in ((2, 3) if bm == 8 else (2,))]
# cache_results: the choices are kept in Triton's cache dir, so the app's next start does not tune again
_gemv_tuned = triton.autotune(_CONFIGS, key=["N", "K", "G", "BITS", "M_BUCKET"], do_bench=_bench_quick,
                              prune_configs_by={"early_config_prune": _prune_configs}, cache_results=True)(_gemv_kernel)

_splitk: dict = {}
_dequant: dict = {}


def _splitk_scratch(device: torch.device):
    """(fp32 partials, zeroed int32 counters) shared by all GEMV launches on the device. Allocated on the first
    call: warm up before capturing a CUDA graph (the autotuner needs that too)."""
    if device not in _splitk:
        _splitk[device] = (torch.empty(SPLITK_FLOATS, dtype=torch.float32, device=device),
                           torch.zeros(SPLITK_COUNTERS, dtype=torch.int32, device=device))
    return _splitk[device]


def _dequant_scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The reusable buffer the large-M path dequantises weight row chunks into."""
    key = (device, dtype)
    if key not in _dequant or _dequant[key].numel() < numel:
        _dequant[key] = torch.empty(numel, dtype=dtype, device=device)
    return _dequant[key]


def _gemv(x2, words, scales, zeros, y, bits: int, group_size: int, config: dict | None):
    """y [M, N] = x2 [M, K] @ W^T. config (BM, BN, SPLIT_K, optionally num_warps / num_stages) forces one
    config; None: the autotuner's (a fixed one under the interpreter)."""
    if bits == 8 and (x2.stride(0) % 2 or x2.data_ptr() % 4):
        x2 = x2.contiguous()                # 16-bit x is read as 32-bit pairs
    part, count = _splitk_scratch(x2.device)
    (M, K), N = x2.shape, y.shape[1]
    args = dict(M=M, N=N, K=K, stride_xm=x2.stride(0), stride_ym=y.stride(0), M_BUCKET=m_bucket(M), BITS=bits,
                G=group_size, USE_ASM=not INTERPRET, DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",
                **pdl.launch_args(x2.device))
    if config is None and INTERPRET:
        config = dict(BM=m_bucket(M), BN=32, SPLIT_K=1)
    assert config is None or config["BM"] >= M and (config["SPLIT_K"] == 1 or (
        config["SPLIT_K"] * config["BM"] * N <= SPLITK_FLOATS and triton.cdiv(N, config["BN"]) <= SPLITK_COUNTERS)), \
        "BM must cover all M rows, split-K must fit its scratch"
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), meta["SPLIT_K"])  # noqa: E731
    if config is None:
        _gemv_tuned[grid](x2, words, scales, zeros, y, part, count, **args)
    else:
        _gemv_kernel[grid](x2, words, scales, zeros, y, part, count, **args, **config)


# ---------------------------------------------------------------------------------------------------------------
# Triton: GEMV variant C (M <= 8, 16-bit x, G = 64 or 128): one mma.sync per 256 weights, on the words as they lie

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
def _load_block_c(w_ptrs, s_ptrs, z_ptrs, blk, groups, G: tl.constexpr):
    """Block blk of the lane's tile: words 4t..4t+3 of its rows g and g + 8 (16 bytes each; w_ptrs: row g's), and for
    h = 0, 1 the scales and zeros of the group of k = 128 blk + 64 h, each a 32-bit word holding rows g and g + 8
    (s_ptrs / z_ptrs: the rows' words at group 0)."""
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
def _load_x_c(x_ptrs, blk, K, EVEN_K: tl.constexpr):
    """The lane's x pairs of the four planes of block blk (_load_x_plane_c)."""
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
    return _code_bits(_shift(w, -4 * p), 0x000F000F, MAGIC, USE_ASM)


@triton.jit
def _tile_block_c(f, h: tl.constexpr, xe0, xe1, xe2, xe3, xo0, xo1, xo2, xo3, d0, d1, d2, d3,
                  MAGIC: tl.constexpr, FP16: tl.constexpr, EMULATE: tl.constexpr):
    """d += the four mmas of half h of one tile's block f (_load_block_c): for plane p = 2h (x pairs xe) and 2h + 1
    (xo) and m = 0, 1, the codes of plane p of the lane's words 4t + 2m and 4t + 2m + 1 against the x pairs 2m and
    2m + 1 of the plane (adjacent in the lane's load: the B fragment as it is)."""
    wa, wb, s0, z0, s1, z1 = f
    wa0, wa1, wa2, wa3 = _split_cols(wa)
    wb0, wb1, wb2, wb3 = _split_cols(wb)
    for p in tl.static_range(2 * h, 2 * h + 2):
        for m in tl.static_range(2):
            a_lo, a_hi = _pick(wa0, wa1, wa2, wa3, 2 * m), _pick(wa0, wa1, wa2, wa3, 2 * m + 1)
            b_lo, b_hi = _pick(wb0, wb1, wb2, wb3, 2 * m), _pick(wb0, wb1, wb2, wb3, 2 * m + 1)
            if p == 2 * h:
                x_lo, x_hi = _pick(xe0, xe1, xe2, xe3, 2 * m), _pick(xe0, xe1, xe2, xe3, 2 * m + 1)
            else:
                x_lo, x_hi = _pick(xo0, xo1, xo2, xo3, 2 * m), _pick(xo0, xo1, xo2, xo3, 2 * m + 1)
            d0, d1, d2, d3 = _mma(_code_pair_c(a_lo, p, MAGIC, not EMULATE), _code_pair_c(b_lo, p, MAGIC, not EMULATE),
                                  _code_pair_c(a_hi, p, MAGIC, not EMULATE), _code_pair_c(b_hi, p, MAGIC, not EMULATE),
                                  x_lo, x_hi, d0, d1, d2, d3, FP16, EMULATE)
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
        for m in tl.static_range(2):
            e0, e1, e2, e3 = _mma(one, one, one, one, _pick(xe0, xe1, xe2, xe3, 2 * m),
                                  _pick(xe0, xe1, xe2, xe3, 2 * m + 1), e0, e1, e2, e3, FP16, EMULATE)
            e0, e1, e2, e3 = _mma(one, one, one, one, _pick(xo0, xo1, xo2, xo3, 2 * m),
                                  _pick(xo0, xo1, xo2, xo3, 2 * m + 1), e0, e1, e2, e3, FP16, EMULATE)
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


@triton.jit(do_not_specialize=["per"])
def _gemv_c_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_x, stride_ym, per,
                   G: tl.constexpr, FP16: tl.constexpr, NW: tl.constexpr, R: tl.constexpr, UNROLL: tl.constexpr,
                   EVEN_K: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr):
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
    row group it meets, the program sums its blocks and stores them (_store_tile: directly when it had all of the
    row group's blocks, else as partial number pid - first of the group's programs, which the last to arrive adds in
    order).

    PDL (kernels/pdl.py): lets the next kernel start at once, loads its first weights, then waits for the kernel
    before it, before it reads x or writes anything."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    blocks = tl.cdiv(K, 128)
    groups = K // G
    u = pid * per
    u_end = tl.minimum(u + per, tl.cdiv(N, 16 * R * NW) * blocks)
    i = tl.arange(0, 32 * NW)
    lane = i % 32
    g = lane // 4
    t = lane % 4
    j4 = tl.arange(0, 4)[None, :]
    last_tile = (N - 1) // 16 * 16                             # a tile past N: the last one again (not stored)
    s32, z32 = s_ptr.to(tl.pointer_type(tl.int32)), z_ptr.to(tl.pointer_type(tl.int32))
    # x row g is B column g; lanes g >= M read row M - 1 again (their columns of y are not stored)
    x_ptrs = x_ptr.to(tl.pointer_type(tl.int32)) + (tl.minimum(g, M - 1) * stride_x + 4 * t)[:, None] + j4
    MAGIC: tl.constexpr = 0x64006400 if FP16 else 0x43004300
    BIAS: tl.constexpr = 1024.0 if FP16 else 128.0
    one = tl.full((32 * NW,), 0x3C003C00 if FP16 else 0x3F803F80, tl.int32)
    zero = tl.zeros((32 * NW,), tl.float32)
    while u < u_end:
        row_group = u // blocks
        b0 = u % blocks
        b1 = tl.minimum(blocks, b0 + u_end - u)
        row0 = (row_group * NW + i // 32) * (16 * R) + g              # the lane's row g of its warp's first tile
        r0 = tl.minimum(row0 - g, last_tile) + g
        w0 = _int4_row_words(w_ptr, r0, blocks)[:, None] + (4 * t)[:, None] + j4
        sz0 = _group_param_offs(r0, 0, groups) // 2          # the word of rows g, g + 8 (r0 % 16 = g < 8)
        s0, z0 = s32 + sz0, z32 + sz0
        if R == 2:
            r1 = tl.minimum(row0 + 16 - g, last_tile) + g
            w1 = _int4_row_words(w_ptr, r1, blocks)[:, None] + (4 * t)[:, None] + j4
            sz1 = _group_param_offs(r1, 0, groups) // 2
            s1, z1 = s32 + sz1, z32 + sz1
        a00, a01, a02, a03 = zero, zero, zero, zero           # tile 0's y: rows g, g + 8 x columns 2t, 2t + 1
        a10, a11, a12, a13 = zero, zero, zero, zero           # tile 1's (R = 2)
        p0 = _load_block_c(w0, s0, z0, b0, groups, G)       # one block in flight
        p1 = _load_block_c(w1, s1, z1, b0, groups, G) if R == 2 else p0
        if PDL:
            tl.extra.cuda.gdc_wait()
        x0, x1, x2, x3 = _load_x_c(x_ptrs, b0, K, EVEN_K)
        for blk in tl.range(b0, b1, loop_unroll_factor=UNROLL):
            f0, f1, xs = p0, p1, (x0, x1, x2, x3)
            ahead = tl.minimum(blk + 1, b1 - 1)               # the last block again at the end: no masks to zero-fill
            p0 = _load_block_c(w0, s0, z0, ahead, groups, G)
            p1 = _load_block_c(w1, s1, z1, ahead, groups, G) if R == 2 else p0
            x0, x1, x2, x3 = _load_x_c(x_ptrs, ahead, K, EVEN_K)
            # a barrier between the loads ahead and this block's work: else they sink down to the loop's end, and no
            # block is in flight.
            tl.debug_barrier()
            a00, a01, a02, a03, a10, a11, a12, a13 = _block_c(
                f0, f1, xs, a00, a01, a02, a03, a10, a11, a12, a13, zero, one, G, FP16, R, MAGIC, BIAS, EMULATE)
        cols = tl.join(tl.join(2 * t, 2 * t + 1), tl.join(2 * t, 2 * t + 1))     # [32 NW, 2 (row g / g + 8), 2]
        rows = tl.join(tl.join(row0, row0), tl.join(row0 + 8, row0 + 8))
        y = tl.join(tl.join(a00, a01), tl.join(a02, a03))
        if R == 2:                                                       # [32 NW, 2, 2, 2 (tile)]
            y = tl.join(y, tl.join(tl.join(a10, a11), tl.join(a12, a13)))
            rows = tl.join(rows, rows + 16)
            cols = tl.join(cols, cols)
        first = row_group * blocks // per                     # the programs with blocks of this row group
        last = ((row_group + 1) * blocks - 1) // per
        _store_tile(y, rows, cols, y_ptr, part_ptr, count_ptr, M, N, stride_ym, row_group, pid - first,
                    last - first + 1)
        u += b1 - b0


GEMV_C_PROGRAMS_PER_SM = 16     # one-warp programs resident per SM at 128 registers: the grid is one wave of them
GEMV_C_DEFAULT = dict(NW=1, R=2, UNROLL=2, MAXNREG=128, PER_SM=GEMV_C_PROGRAMS_PER_SM)


def gemv_c_configs() -> list[dict]:
    """Variant C's configs (NW warps per program, R 16-row tiles per warp, UNROLL, MAXNREG registers per thread,
    PER_SM programs per SM); the launcher uses the first. On the H200 (27B shapes, 64 GEMVs in one graph, M = 1):
    the loop unrolled twice issues ~10% fewer instructions (no register copies of the block loaded ahead), capped at
    128 registers it keeps 16 warps per SM (144 uncapped: 14), and the stream-K grid of one wave: 18.7 µs per GEMV
    against 20.6 for the split-K kernel before (docs/performance.md, fifth session); 16.8 with x loaded ahead."""
    best = GEMV_C_DEFAULT
    return [best, {**best, "PER_SM": 2 * GEMV_C_PROGRAMS_PER_SM}, {**best, "UNROLL": 1, "MAXNREG": None},
            dict(NW=1, R=1, UNROLL=2, MAXNREG=None, PER_SM=GEMV_C_PROGRAMS_PER_SM), {**best, "NW": 2, "PER_SM": 8}]


def gemv_c_supports(x2: torch.Tensor, w: Int4Weight) -> bool:
    """Variant C takes M <= 8 rows of 16-bit x, groups of 64 or 128, and needs the bf16 / fp16 mma of sm_80+."""
    return (x2.shape[0] <= GEMV_C_MAX_M and w.group_size in (64, 128) and x2.dtype in (torch.bfloat16, torch.float16)
            and (not x2.is_cuda or _capability(x2.device) >= (8, 0)))


@functools.lru_cache(maxsize=None)
def _capability(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def gemv_c_grid(N: int, K: int, config: dict, sms: int) -> tuple[int, int]:
    """(programs, units per program) of variant C: config["PER"] units per program if given, else a run per
    resident program slot (PER_SM x SMs). A run longer than a row group is made whole row groups, so no partial
    sums are needed where N is large (an int4 LM head: 248,320 rows)."""
    nw, r, blocks = config.get("NW", 1), config.get("R", 2), triton.cdiv(K, 128)
    units = triton.cdiv(N, 16 * r * nw) * blocks
    per = config.get("PER") or triton.cdiv(units, config.get("PER_SM", GEMV_C_PROGRAMS_PER_SM) * sms)
    if per > blocks:
        per = triton.cdiv(per, blocks) * blocks
    return triton.cdiv(units, per), per


def _gemv_c(x2: torch.Tensor, w: Int4Weight, y: torch.Tensor, config: dict | None):
    """y [M, N] = x2 [M, K] @ W^T for M <= 8 (variant C), one launch. config (gemv_c_configs' keys, PER, PDL) forces
    one; None: GEMV_C_DEFAULT (the first of gemv_c_configs). PDL on (kernels/pdl.py) unless config says PDL=False."""
    (M, K), N = x2.shape, y.shape[1]
    assert gemv_c_supports(x2, w), "variant C: M <= 8, group 64 or 128, 16-bit x"
    if x2.stride(0) % 2 or x2.data_ptr() % 16:
        x2 = x2.contiguous()                    # x is read as int32 pairs, 4 at a time
    config = config or GEMV_C_DEFAULT
    nw, r, blocks = config.get("NW", 1), config.get("R", 2), triton.cdiv(K, 128)
    programs, per = gemv_c_grid(N, K, config, _sm_count(x2.device) if x2.is_cuda else 132)
    launch = pdl.launch_args(x2.device) if config.get("PDL", True) else {"PDL": False}
    if x2.is_cuda and config.get("MAXNREG"):
        launch["maxnreg"] = config["MAXNREG"]
    part, count = _splitk_scratch(x2.device)
    parts = 1 if per % blocks == 0 else triton.cdiv(blocks, per) + 1    # the most programs on one row group
    assert parts == 1 or (parts * M * N <= SPLITK_FLOATS and triton.cdiv(N, 16 * r * nw) <= SPLITK_COUNTERS), \
        "the partial sums must fit their scratch"
    _gemv_c_kernel[(programs,)](x2, w.qweight, w.scales, w.zeros, y, part, count, M, N, K, x2.stride(0) // 2,
                                y.stride(0), per, G=w.group_size, FP16=x2.dtype == torch.float16, NW=nw, R=r,
                                UNROLL=config.get("UNROLL", 1), EVEN_K=K % 128 == 0, EMULATE=INTERPRET, num_warps=nw,
                                num_stages=1, **launch)


# ---------------------------------------------------------------------------------------------------------------
# Triton: dequantisation (large M) and the embedding gather

@triton.jit
def _int4_dequant_kernel(w_ptr, s_ptr, z_ptr, out_ptr, N, K, n0, G: tl.constexpr, BN: tl.constexpr):
    """out [rows, K] = W[n0 : n0 + rows] in out's dtype; program (row tile, 128-k block)."""
    blk = tl.program_id(1)
    r = tl.program_id(0) * BN + tl.arange(0, BN)
    rn = n0 + r
    row_ok = rn < N
    groups = K // G
    w = tl.load(_int4_row_words(w_ptr, rn, tl.cdiv(K, 128))[:, None] + blk * 256 + tl.arange(0, 16)[None, :],
                mask=row_ok[:, None], other=0)
    for p in tl.static_range(4):
        sz = _group_param_offs(rn, tl.minimum((blk * 128 + p * 32) // G, groups - 1), groups)
        s = tl.load(s_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + sz, mask=row_ok, other=0.0).to(tl.float32)
        v = (16.0 * s)[:, None] * _pair_as_float(w, p, False, tl.float32, False) - ((16.0 + z) * s)[:, None]
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
    """x [..., K] -> [..., N] in x's dtype: GEMV for M <= 32 rows, else dequantise + matmul. The GEMV is variant
    C where it applies (gemv_c_supports), else A; variant="A" / "C" forces one; config forces one config of the
    variant that runs (A: see _gemv, C: see _gemv_c)."""
    N, K = w.shape
    x2 = _rows(x, K)
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if variant is None:
        variant = "C" if gemv_c_supports(x2, w) else "A"
    if 0 < M <= GEMV_C_MAX_M and variant == "C":
        _gemv_c(x2, w, y, config)
    elif 0 < M <= GEMV_MAX_M:
        _gemv(x2, w.qweight, w.scales, w.zeros, y, 4, w.group_size, config)
    elif M > GEMV_MAX_M:
        def dequantize_rows(out, n0):
            _int4_dequant_kernel[(triton.cdiv(out.shape[0], 32), triton.cdiv(K, 128))](
                w.qweight, w.scales, w.zeros, out, N, K, n0, G=w.group_size, BN=32, num_warps=4)
        _dequant_matmul(x2, y, dequantize_rows)
    return y.view(*x.shape[:-1], N)


def int8_linear_triton(x: torch.Tensor, w: Int8Weight, config: dict | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype: GEMV for M <= 32 rows (config: see _gemv), else dequantise + matmul."""
    N, K = w.shape
    x2 = _rows(x, K)
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if 0 < M <= GEMV_MAX_M:
        _gemv(x2, w.qweight.view(torch.int32), w.scales, w.scales, y, 8, w.group_size, config)
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
            flat, w.qweight, w.scales, out, K, G=w.group_size, BLOCK=BLOCK, num_warps=4, **pdl.launch_args(ids.device))
    return out.view(*ids.shape, K)


def int4_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """y = x @ W^T. CUDA: Triton (graph-capturable for M <= 32 once warmed up); elsewhere the torch reference."""
    return int4_linear_triton(x, w) if x.is_cuda else int4_linear_ref(x, w)


def int8_linear(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """y = x @ W^T (e.g. the 8-bit LM head). CUDA: Triton; elsewhere the torch reference."""
    return int8_linear_triton(x, w) if x.is_cuda else int8_linear_ref(x, w)


def int8_embedding(ids: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """ids [T] -> [T, K] rows of the 8-bit table, dequantised to the scales' dtype."""
    return int8_embedding_triton(ids, w) if ids.is_cuda else int8_embedding_ref(ids, w)
