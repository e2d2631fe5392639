"""The int4 / int8 weight formats: dataclasses, packing, torch references (the CPU path and the tests' oracle), and
the Triton helpers every kernel uses to address the packed words and turn codes into floats.

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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class Int4Weight:
    qweight: torch.Tensor       # int32 [ceil(N / 16), ceil(K / 128), 16, 16], layout above
    scales: torch.Tensor        # [ceil(N / 16), K // G, 16] (row tiles, layout above), activation dtype
    zeros: torch.Tensor         # the same layout and dtype (float zero points)
    group_size: int
    shape: tuple[int, int]      # (N, K)
    x_repeats: int = 1          # x [.., K / x_repeats] is read this many times along K (int8 as int4 planes: 2)


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
    """-> W [N, K / x_repeats] in fp32 (planes summed)."""
    q, s, z = unpack_int4(w)
    s = s.float().repeat_interleave(w.group_size, dim=1)
    z = z.float().repeat_interleave(w.group_size, dim=1)
    return ((q.float() - z) * s).view(w.shape[0], w.x_repeats, -1).sum(1)


def dequantize_int4_ref(w: Int4Weight) -> torch.Tensor:
    """-> W [N, K / x_repeats] in the scales' dtype, computed in fp32."""
    return _int4_dequantize_fp32(w).to(w.scales.dtype)


def int4_linear_ref(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [..., K / x_repeats] -> [..., N]: dequantise and multiply in fp32, cast back to x's dtype."""
    return (x.float() @ _int4_dequantize_fp32(w).t()).to(x.dtype)


def weight_rows(w: torch.Tensor | Int4Weight | Int8Weight, start: int, n: int):
    """Output rows [start, start + n) of a weight, a view of the same kind (int4: start and n multiples of 16, the row
    tile): one part of a stacked weight, e.g. one expert of an MoE layer's."""
    if isinstance(w, Int4Weight):
        assert start % 16 == 0 and n % 16 == 0, "int4 rows are taken in whole 16-row tiles"
        t = slice(start // 16, (start + n) // 16)
        return dataclasses.replace(w, qweight=w.qweight[t], scales=w.scales[t], zeros=w.zeros[t],
                                   shape=(n, w.shape[1]))
    if isinstance(w, Int8Weight):
        return Int8Weight(w.qweight[start:start + n], w.scales[start:start + n], w.group_size, (n, w.shape[1]))
    return w[start:start + n]


def pack_int8(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> Int8Weight:
    """q int8 [N, K], scales [N, K // G] -> Int8Weight (symmetric: W = q * scale)."""
    N, K = q.shape
    assert q.dtype == torch.int8 and group_size % 64 == 0 and K % group_size == 0, \
        f"int8 [N, K] with K = {K} a multiple of the group size {group_size}, itself a multiple of 64"
    assert scales.shape == (N, K // group_size)
    return Int8Weight(q.contiguous(), scales.contiguous(), group_size, (N, K))


def int8_as_int4_planes(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An int8 weight (q int8 [N, K], scales [N, K / G]) as an int4 one over 2K, exactly: with u = q + 128 =
    16 hi + lo, q s = 16 s (hi - 8) + s (lo - 0). -> (codes uint8 [N, 2K]: hi plane | lo plane, scales 16 s | s,
    zeros 8 | 0), for pack_int4 and x read twice (x_repeats = 2). The int4 GEMV streams these 4.6% more bytes (G = 128)
    faster than the int8 GEMV streams its own: 359 against 554 µs for the 27B's LM head on the H200 (M = 1)."""
    u = q.to(torch.int16) + 128
    codes = torch.cat([u >> 4, u & 15], dim=1).to(torch.uint8)
    planes_scales = torch.cat([16 * scales, scales], dim=1)
    zeros = torch.cat([torch.full_like(scales, 8), torch.zeros_like(scales)], dim=1)
    return codes, planes_scales, zeros


def pack_int8_as_int4(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> Int4Weight:
    """q int8 [N, K], scales [N, K / G] -> an Int4Weight over 2K with x_repeats = 2 (int8_as_int4_planes)."""
    return dataclasses.replace(pack_int4(*int8_as_int4_planes(q, scales), group_size), x_repeats=2)


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
# Triton: addressing and codes to floats

@triton.jit
def code_bits(t, MASK: tl.constexpr, C: tl.constexpr, USE_ASM: tl.constexpr):
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
def int4_row_words(w_ptr, rows, blocks):
    """Where the words of rows (any shape) start in the int4 layout: block b, word j of a row at + 256 b + j."""
    return w_ptr + (rows // 16).to(tl.int64) * (blocks * 256) + (rows % 16) * 16


@triton.jit
def group_param_offs(rows, g, groups):
    """Where the scale / zero of rows (any shape) at group g lies in the int4 row tiles [tiles, groups, 16]."""
    return (rows // 16) * (groups * 16) + g * 16 + 2 * (rows % 8) + rows % 16 // 8


@triton.jit
def shift(w, BY: tl.constexpr):
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
    return ((shift(w, 19 - 4 * i) & 0x780000) ^ C).to(tl.float32, bitcast=True)


@triton.jit
def pair_as_float(w, p: tl.constexpr, HIGH: tl.constexpr, dtype: tl.constexpr, USE_ASM: tl.constexpr):
    """w [R, 16] int32 -> [R, 32] in dtype: column 2j + t = the code in nibble p + 4t of word j as 1 + c/16
    (HIGH: 16 + (c ^ 8)). In 16-bit dtypes one shift and one lop3 make both values of a word."""
    if dtype == tl.float32:
        v = tl.interleave(_code_as_f32(w, p, HIGH), _code_as_f32(w, p + 4, HIGH))
    else:
        MB: tl.constexpr = 6 if dtype == tl.float16 else 3                  # the code goes to bits MB..MB+3
        ONE: tl.constexpr = 0x3C003C00 if dtype == tl.float16 else 0x3F803F80  # 1.0 in both halves
        C: tl.constexpr = ((ONE + (4 << (MB + 4)) * 0x10001) ^ ((8 << MB) * 0x10001)) if HIGH else ONE
        bits = code_bits(shift(w, MB - 4 * p), 0xF000F << MB, C, USE_ASM)
        v = tl.interleave(bits.to(tl.int16), (bits >> 16).to(tl.int16)).to(dtype, bitcast=True)
    return v

