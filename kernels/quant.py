"""Weight-only int4 / int8 linear layers and the int8 embedding gather: formats, torch references, Triton kernels.

Formats (y = x @ W^T, W [N, K])
- Int4Weight: W ~= (q - zero) * scale per group of G (32, 64 or 128) along K, codes q in 0..15, float scales and
  zero points [N, K // G] in the activation dtype. Packed layout, qweight int32 [N, ceil(K / 128) * 16]: K is cut
  into blocks of 128; word j (0..15) of block b holds the code of k = 128 b + 32 p + 2 j + t in nibble p + 4 t,
  i.e. bits 4p..4p+3 (t = 0) and 16+4p..16+4p+3 (t = 1), p = 0..3. The two 16-bit halves of a word thus hold
  the codes of the neighbours k, k + 1 at the same place, and the 16 words' nibble pair p covers one run of 32
  consecutive k inside one group. K that is not a multiple of 128 is padded with zero codes.
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
GEMV variant B (int4, M <= 8; the default for M <= GEMV_B_DEFAULT_M), no tensor cores, no autotuner:
- codes as exact fp32 in one lop3 + one add each: a nibble at bits 4i..4i+3 (i <= 4; one shift per word brings
  nibbles 5..7 down) ORed into the mantissa of 2^(23 - 4i) reads 2^(23 - 4i) + c. Per group and output,
  d = sum_k x_k c_k by FMA in fp32, then y += s (d - z sum_k x_k): scale and zero once per group.
- program = one warp, BN weight rows x a K range, stepping over 1024-k chunks (the next chunk's words loaded
  before this one is computed): lane q holds words 4q..4q+3 (one 16-byte load) of every row, the BM x rows'
  x at those k (16 bytes per row and nibble plane, from L1: the weights stream past it) and BM x BN
  accumulators; rows share each lane's x loads, conversions and sums. Lanes are summed once at the end.
- one warp per program keeps every warp's x private (Triton spreads warps over a tile, so a block of warps on
  different rows would pass x through shared memory); many small programs fill the SMs: N / BN of them, times a
  split-K where that is under ~12 per SM (N = 5120). Split-K partials go to an fp32 scratch and a second small
  kernel sums them in order (no atomics: results do not depend on arrival order, graph replays equal eager).
- config (BN, split-K) from a small table (gemv_b_configs), so the launch costs no more than the kernel call.
- the loads of the next chunk's words and of the scales sit above a barrier (one warp: nearly free), else ptxas
  sinks them down to their uses and the DRAM latency shows every chunk.
Cost per weight: ~1.75 instructions to dequantise (a lop3 each, an add for 6 codes of 8, a shift per word) + M
FMAs, so B is for small M: the sm_90 loop is ~3.9 instructions per weight at M = 1 (the H200's issue rate is then
~4.3 TB/s of int4) and ~16 at M = 8 (~1 TB/s).
Large M (prefill): the weight is dequantised in row chunks into a reusable scratch and multiplied by torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GEMV_MAX_M = 32                 # above: dequantise + torch matmul
GEMV_B_MAX_M = 8                # variant B's limit (its M buckets)
GEMV_B_DEFAULT_M = 1            # int4 GEMV default: B up to this M, A above (H200, 27B shapes: B ~10% faster at M = 1,
                                # ~2.5x slower at M = 8; docs/performance.md)
DEQUANT_SCRATCH = 1 << 25       # elements of the dequantised-weight scratch of the large-M path (64 MiB bf16)
SPLITK_FLOATS = 1 << 21         # fp32 split-K partials, one buffer per device (8 MiB)
SPLITK_COUNTERS = 1 << 14       # split-K arrival counters, one per output tile


# ---------------------------------------------------------------------------------------------------------------
# formats and torch references (CPU path, test oracle)

@dataclass
class Int4Weight:
    qweight: torch.Tensor       # int32 [N, ceil(K / 128) * 16], layout above
    scales: torch.Tensor        # [N, K // G], activation dtype
    zeros: torch.Tensor         # [N, K // G], same dtype (float zero points)
    group_size: int
    shape: tuple[int, int]      # (N, K)


@dataclass
class Int8Weight:
    qweight: torch.Tensor       # int8 [N, K]
    scales: torch.Tensor        # [N, K // G]
    group_size: int
    shape: tuple[int, int]


# bit offset of the code of k = 128 b + 32 p + 2 j + t inside word j of block b, as [1, 1, p, 1, t]
_NIBBLE_SHIFTS = (4 * torch.arange(4, dtype=torch.int32).view(4, 1) + 16 * torch.arange(2, dtype=torch.int32)).view(
    1, 1, 4, 1, 2)


def pack_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> Int4Weight:
    """q uint8 [N, K] (codes 0..15), scales / zeros [N, K // G] -> Int4Weight in the kernel layout."""
    N, K = q.shape
    assert group_size in (32, 64, 128), f"int4 group size {group_size}: 32, 64 or 128"
    assert K % 64 == 0 and K % group_size == 0, f"K = {K}: a multiple of 64 and of the group size"
    assert scales.shape == zeros.shape == (N, K // group_size) and scales.dtype == zeros.dtype
    blocks = -(-K // 128)
    codes = torch.zeros(N, blocks * 128, dtype=torch.uint8, device=q.device)
    codes[:, :K] = q & 0xF
    codes = codes.view(N, blocks, 4, 16, 2)                                  # [n, b, p, j, t]
    words = torch.zeros(N, blocks, 16, dtype=torch.int64, device=q.device)  # one slice at a time: little memory
    for p in range(4):
        for t in range(2):
            words |= codes[:, :, p, :, t].to(torch.int64) << (4 * p + 16 * t)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return Int4Weight(words.view(N, blocks * 16), scales.contiguous(), zeros.contiguous(), group_size, (N, K))


def unpack_int4(w: Int4Weight) -> torch.Tensor:
    """-> codes uint8 [N, K]."""
    N, K = w.shape
    words = w.qweight.view(N, -1, 1, 16, 1)
    return ((words >> _NIBBLE_SHIFTS.to(words.device)) & 0xF).view(N, -1)[:, :K].to(torch.uint8)


def _int4_dequantize_fp32(w: Int4Weight) -> torch.Tensor:
    s = w.scales.float().repeat_interleave(w.group_size, dim=1)
    z = w.zeros.float().repeat_interleave(w.group_size, dim=1)
    return (unpack_int4(w).float() - z) * s


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
def _store_tile(y, y_ptr, part_ptr, count_ptr, M, N, stride_ym, rm, rn, pid_n, pid_k, SPLIT_K):
    """Store the fp32 tile y [BN, BM] (weight rows rn, x rows rm) of split pid_k of SPLIT_K into y [M, N].

    With SPLIT_K > 1 each split writes its partial to part_ptr [SPLIT_K, M, N]; the last to arrive at the tile's
    counter sums the partials in split order, writes y and resets the counter for the next launch."""
    mask = (rn[:, None] < N) & (rm[None, :] < M)
    y_offs = rm[None, :] * stride_ym + rn[:, None]
    if SPLIT_K == 1:
        tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        offs = rm[None, :] * N + rn[:, None]
        tl.store(part_ptr + pid_k * M * N + offs, y, mask=mask)
        tl.debug_barrier()                      # every thread's partial is written before the release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(y)
            for s in range(SPLIT_K):
                total += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + pid_n, 0)


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
                 DOT_PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """y[:M, tile] (+)= x @ W^T over this program's K blocks. w_ptr: int32 words, 16 per row and block of
    128 k (int4) or 64 k (int8). M_BUCKET only keys the autotuner."""
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
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * (blocks * 16) + tl.arange(0, 16)[None, :]
    xt_cols = x_ptr + rm[None, :] * stride_xm
    ones = tl.full((16, 32), 1.0, x_ptr.dtype.element_ty)
    y = tl.zeros((BN, BM), tl.float32)
    for blk in range(b0, b1):
        w = tl.load(w_rows + blk * 16, mask=row_ok[:, None], other=0)
        for h in tl.static_range(GROUPS):
            if BITS == 4:
                d, xs = _int4_dots(w, blk, h * (4 // GROUPS), 4 // GROUPS, xt_cols, rm, M, K, ones,
                                   USE_ASM, DOT_PRECISION, BN, BM)
                g = tl.minimum(blk * GROUPS + h, groups - 1)      # (K padding: x = 0 there)
                z = tl.load(z_ptr + rn * groups + g, mask=row_ok, other=0.0).to(tl.float32)
            else:
                d, xs = _int8_dots(w, blk, xt_cols, rm, M, ones, USE_ASM, DOT_PRECISION, BN, BM)
                g = blk * 64 // G
                z = 384.0                                         # W = 16 s (v_l + v_h) - 400 s
            s = tl.load(s_ptr + rn * groups + g, mask=row_ok, other=0.0).to(tl.float32)
            y += (16.0 * s)[:, None] * d
            y -= ((16.0 + z) * s)[:, None] * tl.max(xs, axis=0)[None, :]       # every row of xs is sum_k x
    _store_tile(y, y_ptr, part_ptr, count_ptr, M, N, stride_ym, rm, rn, pid_n, pid_k, SPLIT_K)


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
                G=group_size, USE_ASM=not INTERPRET, DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32")
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
# Triton: GEMV variant B (M <= 8): exact fp32 codes and FMA, one warp per program

@triton.jit
def _split4(t, R: tl.constexpr):
    """t [R, 128] -> [R, 32] tiles t0..t3 with t_j[:, q] = t[:, 4q + j] (one lane holds the 4: no data moves)."""
    even, odd = tl.split(tl.reshape(t, (R, 32, 2, 2)))
    t0, t2 = tl.split(even)
    t1, t3 = tl.split(odd)
    return t0, t1, t2, t3


@triton.jit
def _code_f32(w, pos: tl.constexpr, EXACT: tl.constexpr, USE_ASM: tl.constexpr):
    """The code c in nibble pos (0..4) of each int32 of w as fp32: ORed into the mantissa of 2^(23 - 4 pos), where
    the nibble's unit is 1.0, it reads 2^(23 - 4 pos) + c (one lop3); EXACT subtracts the bias (one add). At pos 4
    the biased 128 + c is kept: the group's sum of x removes it."""
    BIAS: tl.constexpr = 1 << (23 - 4 * pos)
    v = _code_bits(w, 0xF << (4 * pos), (150 - 4 * pos) << 23, USE_ASM).to(tl.float32, bitcast=True)
    if EXACT:
        v -= BIAS
    return v


@triton.jit
def _plane_f32(w, hi, p: tl.constexpr, USE_ASM: tl.constexpr):
    """The codes of k = 32 p + 2 j + t of words w as fp32, t = 0 (nibble p, exact) and t = 1 (nibble p + 4; 128 + c
    for p = 0 and 3, whose nibbles 4 and 7 sit at bits 16..19 of w and hi, else exact). hi = w >> 12 brings
    nibbles 5..7 into the low 20 bits that _code_f32 reads."""
    even = _code_f32(w, p, True, USE_ASM)
    if p == 0:
        odd = _code_f32(w, 4, False, USE_ASM)
    else:
        odd = _code_f32(hi, p + 1, p != 3, USE_ASM)
    return even, odd


@triton.jit
def _fma_plane(d, w, hi, p: tl.constexpr, x_even, x_odd, USE_ASM: tl.constexpr):
    """d [BM, BN, 32] += the codes of plane p of words w [BN, 32] times x at their k (x_even: t = 0, x_odd: t = 1,
    [BM, 32])."""
    v_even, v_odd = _plane_f32(w, hi, p, USE_ASM)
    d += v_even[None, :, :] * x_even[:, None, :]
    d += v_odd[None, :, :] * x_odd[:, None, :]
    return d


@triton.jit
def _load_x(ptrs, pair, K, EVEN_K: tl.constexpr):
    """x at ptrs [BM, 128] (the k-pairs pair [128]), 0 from K on; kept in L1 for the next programs."""
    if EVEN_K:
        x = tl.load(ptrs, eviction_policy="evict_last")
    else:
        x = tl.load(ptrs, mask=(2 * pair < K)[None, :], other=0, eviction_policy="evict_last")
    return x


@triton.jit
def _x_run(x_ptr, x_rows, pair, K, BM: tl.constexpr, EVEN_K: tl.constexpr):
    """x at k = 2 pair + t of every x row, pair [128] (lane q's 4 pairs at 4q..4q+3) as eight [BM, 32] fp32 tiles:
    t = 0 ones for each of the lane's 4 pairs, then t = 1 ones; 0 from K on. x_rows [BM, 1] row offsets in loaded
    elements: 16-bit x is read as int32 pairs, one 16-byte load per lane and row."""
    dtype = x_ptr.dtype.element_ty
    if dtype == tl.float32:
        even = _load_x(x_ptr + x_rows + 2 * pair[None, :], pair, K, EVEN_K)
        odd = _load_x(x_ptr + x_rows + 2 * pair[None, :] + 1, pair, K, EVEN_K)
    else:
        pairs = _load_x(x_ptr.to(tl.pointer_type(tl.int32)) + x_rows + pair[None, :], pair, K, EVEN_K)
        if dtype == tl.bfloat16:
            even = (pairs << 16).to(tl.float32, bitcast=True)
            odd = (pairs & -65536).to(tl.float32, bitcast=True)
        else:
            even = pairs.to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
            odd = (pairs >> 16).to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
    e0, e1, e2, e3 = _split4(even, BM)
    o0, o1, o2, o3 = _split4(odd, BM)
    return e0, e1, e2, e3, o0, o1, o2, o3


@triton.jit
def _load_chunk(w_tile, c, end):
    """Words 128 c .. 128 c + 127 of each row [BN, 128], lane q getting 4q .. 4q + 3 (one 16-byte load per row);
    masked off from word end on (undefined there: finite codes once unpacked, met by x = 0 or never used). Streamed
    past L1, which keeps x."""
    return tl.load(w_tile + c * 128, mask=(c * 128 + tl.arange(0, 128) < end)[None, :], cache_modifier=".cg")


@triton.jit
def _gemv_b_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_x, stride_ym, stride_ys, CHUNKS,
                   G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EVEN_K: tl.constexpr,
                   USE_ASM: tl.constexpr):
    """y[pid_k] [M, tile] = x @ W^T over K chunks CHUNKS * pid_k .. (one warp; layout in the module docstring).

    A chunk is 128 words (1024 k) of each of the BN rows: lane q holds words 4q..4q+3 (16 bytes) of every row, i.e.
    32 k of one 128-k block, the x of all BM rows there (per nibble plane 8 consecutive k: one 16-byte load per x
    row) and BM x BN accumulators. Per group: d = sum_k x_k c_k and xs = sum_k x_k over the lane's k, then
    acc += s (d - z xs); the lanes are summed once at the end. The next chunk's words are loaded before this one
    is computed. Rows past N and M are clamped (computed again, not stored); x needs no mask for K % 1024 = 0."""
    GPB: tl.constexpr = 128 // G                # groups per 128-k block
    PPG: tl.constexpr = 4 // GPB                # nibble planes (runs of 32 k) per group
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    words = tl.cdiv(K, 128) * 16                # per row
    groups = K // G
    c0 = pid_k * CHUNKS
    c1 = tl.minimum(c0 + CHUNKS, tl.cdiv(words, 128))
    rn = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(rn, N - 1)
    w_tile = w_ptr + (rows.to(tl.int64) * words)[:, None] + tl.arange(0, 128)[None, :]
    i = tl.arange(0, 128)                       # word 4q + jj of a chunk: k-pair (k = 2 pair + t) in plane 0
    x_pairs = 64 * (i // 16) + i % 16
    rm = tl.arange(0, BM)
    x_rows = tl.minimum(rm, M - 1)[:, None] * stride_x
    # Scales and zeros load flat (element f = row * 32 + lane) and are viewed as [BN, 32]: lane q holds those of its
    # block for every row, as the word tiles have it. (The thread axis of a [rows, 128] tile is its contiguous one;
    # of a [BN, 32] one it would be the compiler's choice, and Triton 3.6 and 3.9 choose differently.)
    f = tl.arange(0, BN * 32)
    sz_rows = tl.minimum(pid_n * BN + f // 32, N - 1) * groups
    sz_blk = (f % 32) // 4
    acc = tl.zeros((BM, BN, 32), tl.float32)
    end = tl.minimum(c1 * 128, words)          # this split's words end here
    w_next = _load_chunk(w_tile, c0, end)
    for c in range(c0, c1):
        w = w_next
        w_next = _load_chunk(w_tile, c + 1, end)
        w0, w1, w2, w3 = _split4(w, BN)
        hi0, hi1, hi2, hi3 = w0 >> 12, w1 >> 12, w2 >> 12, w3 >> 12
        for h in tl.static_range(GPB):
            g = tl.minimum((c * 8 + sz_blk) * GPB + h, groups - 1)     # (K padding: codes and x are 0 there)
            s = tl.reshape(tl.load(s_ptr + sz_rows + g), (BN, 32))
            z = tl.reshape(tl.load(z_ptr + sz_rows + g), (BN, 32))
            tl.debug_barrier()                  # ptxas would sink these loads (and w_next's) down to their uses
            d = tl.zeros((BM, BN, 32), tl.float32)
            xs = tl.zeros((BM, 32), tl.float32)
            xs128 = tl.zeros((BM, 32), tl.float32)        # x of the codes read as 128 + c
            for p in tl.static_range(h * PPG, h * PPG + PPG):
                e0, e1, e2, e3, o0, o1, o2, o3 = _x_run(x_ptr, x_rows, c * 512 + 16 * p + x_pairs, K, BM, EVEN_K)
                odd = (o0 + o1) + (o2 + o3)
                xs += ((e0 + e1) + (e2 + e3)) + odd
                if p == 0 or p == 3:
                    xs128 += odd
                d = _fma_plane(d, w0, hi0, p, e0, o0, USE_ASM)
                d = _fma_plane(d, w1, hi1, p, e1, o1, USE_ASM)
                d = _fma_plane(d, w2, hi2, p, e2, o2, USE_ASM)
                d = _fma_plane(d, w3, hi3, p, e3, o3, USE_ASM)
            xs128 *= 128.0
            z_xs = z.to(tl.float32)[None, :, :] * xs[:, None, :] + xs128[:, None, :]
            acc += s.to(tl.float32)[None, :, :] * (d - z_xs)
    y = tl.sum(acc, axis=2)
    tl.store(y_ptr + pid_k * stride_ys + rm[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def _sum_splits_kernel(part_ptr, y_ptr, MN, SPLIT_K, BLOCK: tl.constexpr):
    """y (flat [M * N]) = sum of the split-K partials part [SPLIT_K, M * N] in split order, in y's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    total = tl.zeros((BLOCK,), tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=ok)


# BN (weight rows per program) by M bucket: a lane's rows share its x loads, conversions and sums, and its BM x BN
# accumulators (acc and the group's d) stay in registers. Compiled for sm_90 (Triton 3.6 and 3.9, one warp,
# G = 128): M 1 / BN 8 and M 4 / BN 4 take 168-180 registers (11-12 warps per SM), M 2 / BN 8 and M 8 / BN 4 255
# (8 per SM), none spills in the loop. M 1 takes 4 rows: on the H200 that beat 8 on three of the four 27B shapes and
# in sum (docs/performance.md).
GEMV_B_ROWS = {1: 4, 2: 8, 4: 4, 8: 4}
GEMV_B_CHUNK = 1024                             # k per loop step of a program
GEMV_B_PROGRAMS_PER_SM = 12                     # B1 / B2: what is resident at once, about


def gemv_b_configs(N: int, K: int, M: int, sms: int = 132) -> list[dict]:
    """Variant B's configs (BN, SPLIT_K) for y [M, N] = x [M, K] @ W^T, M <= 8; the launcher uses the first.
    B1: GEMV_B_ROWS rows per program; split-K only to fill one wave of ~12 one-warp programs per SM when N / BN
        programs are fewer (27B shapes: N = 5120 only): long programs, each prefetching its next chunk.
    B2: half the rows (fewer registers, more x loads per weight), same rule.
    B3: B1's rows, about 2 chunks per program (split-K everywhere): many short programs, small tail."""
    chunks = triton.cdiv(K, GEMV_B_CHUNK)

    def config(bn: int, split: int) -> dict:
        split = min(chunks, max(1, split))
        return dict(BN=bn, SPLIT_K=triton.cdiv(chunks, triton.cdiv(chunks, split)))   # no empty splits

    def one_wave(bn: int) -> int:
        return GEMV_B_PROGRAMS_PER_SM * sms // triton.cdiv(N, bn)

    bn = GEMV_B_ROWS[triton.next_power_of_2(M)]
    return [config(bn, one_wave(bn)), config(bn // 2, one_wave(bn // 2)), config(bn, triton.cdiv(chunks, 2))]


@functools.lru_cache(maxsize=None)
def _gemv_b_default(N: int, K: int, M: int, sms: int) -> dict:
    return gemv_b_configs(N, K, M, sms)[0]


def _gemv_b(x2: torch.Tensor, w: Int4Weight, y: torch.Tensor, config: dict | None):
    """y [M, N] = x2 [M, K] @ W^T for M <= 8 (variant B). config (BN, SPLIT_K) forces one; None: the default of
    gemv_b_configs. SPLIT_K > 1: each split stores fp32 partials into the shared scratch and a second small kernel
    sums them in split order (deterministic: CUDA-graph replays equal eager calls bit for bit)."""
    (M, K), N = x2.shape, y.shape[1]
    if x2.element_size() == 2 and (x2.stride(0) % 2 or x2.data_ptr() % 4):
        x2 = x2.contiguous()                    # 16-bit x is read as int32 pairs
    if config is None:
        config = _gemv_b_default(N, K, M, _sm_count(x2.device) if x2.is_cuda else 132)
    chunks = triton.cdiv(K, GEMV_B_CHUNK)
    per_split = triton.cdiv(chunks, config["SPLIT_K"])
    split = triton.cdiv(chunks, per_split)
    stride_x = x2.stride(0) // (2 if x2.element_size() == 2 else 1)
    grid = (triton.cdiv(N, config["BN"]), split)
    if split == 1:
        out, stride_ym, stride_ys = y, y.stride(0), 0
    else:
        out = _splitk_scratch(x2.device)[0]
        assert split * M * N <= SPLITK_FLOATS, "split-K partials must fit the scratch"
        stride_ym, stride_ys = N, M * N
    _gemv_b_kernel[grid](x2, w.qweight, w.scales, w.zeros, out, M, N, K, stride_x, stride_ym, stride_ys, per_split,
                         G=w.group_size, BM=triton.next_power_of_2(M), BN=config["BN"],
                         EVEN_K=K % GEMV_B_CHUNK == 0, USE_ASM=not INTERPRET, num_warps=1, num_stages=1)
    if split > 1:
        _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](out, y, M * N, split, BLOCK=1024, num_warps=4)


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
    w = tl.load(w_ptr + rn.to(tl.int64)[:, None] * (tl.cdiv(K, 128) * 16) + blk * 16 + tl.arange(0, 16)[None, :],
                mask=row_ok[:, None], other=0)
    for p in tl.static_range(4):
        g = tl.minimum((blk * 128 + p * 32) // G, groups - 1)
        s = tl.load(s_ptr + rn * groups + g, mask=row_ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rn * groups + g, mask=row_ok, other=0.0).to(tl.float32)
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
def _int8_embedding_kernel(ids_ptr, q_ptr, s_ptr, out_ptr, K, G: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, kb block] = row ids[t] of W, dequantised; program (token, k block)."""
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
    B for M <= GEMV_B_DEFAULT_M, A above; variant="A" / "B" forces one (B only runs M <= GEMV_B_MAX_M); config
    forces one config of the variant that runs (A: see _gemv, B: see _gemv_b)."""
    N, K = w.shape
    x2 = _rows(x, K)
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    use_b = variant == "B" if variant else M <= GEMV_B_DEFAULT_M
    if 0 < M <= GEMV_B_MAX_M and use_b:
        _gemv_b(x2, w, y, config)
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
            flat, w.qweight, w.scales, out, K, G=w.group_size, BLOCK=BLOCK, num_warps=4)
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
